import Glibc
import TesseraCLI
import TesseraCore
import TesseraInterface
import TesseraPlatform

/// The parsers that need no engine: each reads the input and, where the code promises a property
/// (a round trip, text made safe), checks it; a broken promise traps, and the fuzzer reports it.
enum FuzzParsers {
  /// config.toml as tesserad and the CLI read it. With TESSERA_FUZZ_CONFIG_DUMP naming a file,
  /// each input's reading is appended to it as a JSON line (what scripts/fuzz compares with
  /// Python's tomllib).
  static func config(_ bytes: [UInt8]) {
    let file = try? ConfigFile(parsing: bytes)
    if let file {
      _ = try? GitCredentialRule.rules(in: file)
    }
    _ = try? BrokerConfig.parse(bytes: bytes)
    // As an administrator's file too ([policy]), combined with itself as the user's.
    if let system = try? ConfigLayer.parse(bytes: bytes, path: "/etc/tessera/config.toml", isSystem: true) {
      let user = try? ConfigLayer.parse(bytes: bytes, path: "config.toml", isSystem: false)
      if let effective = try? EffectiveConfig.combine(system: [system], user: user) {
        // Every value in force reads back the same from the TOML `tessera config` prints.
        for key in BrokerConfig.Key.allCases {
          guard let value = effective.config.value(of: key) else { continue }
          guard (try? ConfigFile(parsing: "k = \(value.toml)\n"))?.entries.first?.value == value else {
            fatalError("the value of \(key.rawValue) does not read back from \(value.toml)")
          }
        }
      }
    }
    if let path = getenv("TESSERA_FUZZ_CONFIG_DUMP"), let out = fopen(path, "a") {
      fputs(file.map(json) ?? #"{"ok":false}"#, out)
      fputs("\n", out)
      fclose(out)
    }
  }

  /// A reading as JSON: `{"ok":true,"entries":[[key,value],…],"tables":[[name,[[key,value],…],isArray],…]}`.
  static func json(_ file: ConfigFile) -> String {
    func text(_ s: String) -> String {
      var out = "\""
      for scalar in s.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case _ where scalar.value < 0x20 || scalar.value == 0x7F:
          let hex = String(scalar.value, radix: 16)
          out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
        default: out.unicodeScalars.append(scalar)
        }
      }
      return out + "\""
    }
    func value(_ v: ConfigFile.Value) -> String {
      switch v {
      case .string(let s): text(s)
      case .integer(let n): String(n)
      case .bool(let b): b ? "true" : "false"
      case .array(let a): "[" + a.map(value).joined(separator: ",") + "]"
      }
    }
    func entries(_ list: [ConfigFile.Entry]) -> String {
      "[" + list.map { "[\(text($0.key)),\(value($0.value))]" }.joined(separator: ",") + "]"
    }
    let tables = file.tables.map { "[\(text($0.name)),\(entries($0.entries)),\($0.isArray)]" }.joined(separator: ",")
    return #"{"ok":true,"entries":"# + entries(file.entries) + #","tables":["# + tables + "]}"
  }

  /// What an identity provider sends back, read as the engine reads it, and the encodings around
  /// it. The first byte chooses the reader, so one corpus reaches all of them.
  static func oauth(_ input: [UInt8]) {
    guard let (selector, bytes) = input.selector else { return }
    let text = String(decoding: bytes, as: UTF8.self)
    switch selector % 8 {
    case 0:
      _ = try? TokenResponse.parse(bytes, endpoint: "https://idp.test/token")
      _ = TokenResponse.refreshToken(in: bytes)
    case 1: _ = ClientInfo.decode(text)
    case 2: _ = OAuthErrorResponse.retryAfterSeconds(text)
    case 3:
      if let decoded = Base64URL.decode(text) {
        precondition(Base64URL.decode(Base64URL.encode(decoded)) == decoded, "base64url does not round-trip")
      }
    case 4:
      _ = FormEncoding.decode(text)
      precondition(FormEncoding.unescape(FormEncoding.escape(text)) == text, "form escaping does not round-trip")
      // Pairs cut at the first '=' of each '&'-separated part: what encode then decode must give.
      var fields: [(String, String)] = []
      for part in text.split(separator: "&") {
        let kv = part.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
        fields.append((String(kv[0]), kv.count > 1 ? String(kv[1]) : ""))
      }
      var expected: [String: String] = [:]
      for (key, value) in fields { expected[key] = value }
      precondition(FormEncoding.decode(FormEncoding.encode(fields)) == expected, "form encoding does not round-trip")
    case 5:
      let status = Int(selector / 8) * 4 + 400
      _ = OAuthErrorResponse.map(status: status, body: bytes, endpoint: "https://idp.test/token", retryAfter: text)
    case 6:
      let limit = Int(selector / 8)
      let clipped = SafeText.clip(text, limit: limit)
      precondition(SafeText.isClean(clipped), "SafeText.clip left an unsafe character")
      precondition(clipped.unicodeScalars.count <= limit + 1, "SafeText.clip passed its limit")
      precondition(SafeText.isClean(text) == (SafeText.clip(text, limit: .max) == text), "isClean disagrees with clip")
      _ = RequestOptions.clip(text)
    default: _ = try? Authority(parsing: text)
    }
  }

  /// What git and kubectl hand the CLI's helpers: git's credential protocol on standard input, and
  /// the KUBERNETES_EXEC_INFO JSON. The first byte chooses the reader.
  static func gitCredential(_ input: [UInt8]) {
    guard let (selector, bytes) = input.selector else { return }
    let text = String(decoding: bytes, as: UTF8.self)
    if selector % 2 == 0 {
      _ = try? GitCredentialRequest(parsing: text)
    } else {
      _ = KubeExecInfo.parse(text)?.interactive
    }
  }

  /// What the browser's redirect brings to the loopback listener: the request head (request line,
  /// headers) and the redirect's query (code, state, error, iss); and /proc/net/tcp as
  /// LoopbackPeer reads it to tell which user connected. The first byte chooses the reader.
  static func loopback(_ input: [UInt8]) {
    guard let (selector, bytes) = input.selector else { return }
    if selector % 2 == 0 {
      if let head = HTTPRequestHead(bytes), let query = head.query {
        _ = FormEncoding.decode(query)
      }
    } else {
      let table = String(decoding: bytes, as: UTF8.self)
      _ = LoopbackPeer.uid(in: table, peerAddress: "0100007F:D431", ourAddress: "0100007F:8B3C")
    }
  }
}
