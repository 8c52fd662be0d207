/// The syntax of an authority URL in config.toml (`default_authority`, `trusted_authorities`),
/// checked without Foundation so that the CLI checks the file exactly as tesserad does:
/// `http` or `https`, `://`, a host (a name, an IPv4 address or a bracketed IPv6 address) with an
/// optional port, then path segments; no credentials, query or fragment, no "." or ".." segment
/// (also when percent-encoded). Only RFC 3986's characters are allowed, so whatever passes is also
/// a URL TesseraCore's `Authority` parses (Tests/TesseraCoreTests holds both to that).
public enum AuthoritySyntax {
  public static let example = "https://login.microsoftonline.com/<tenant>"

  /// Why `text` is not a usable authority URL, as the end of a sentence ("it must not have a
  /// query or fragment"); nil when it is one.
  public static func problem(_ text: String) -> String? {
    let notAbsolute = "it is not an absolute URL"
    guard let separator = text.firstRange(of: "://") else { return notAbsolute }
    let scheme = text[..<separator.lowerBound]
    guard let first = scheme.first, first.isASCII, first.isLetter,
      scheme.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "+-.".contains($0)) })
    else { return notAbsolute }
    let rest = text[separator.upperBound...]
    let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
    let afterAuthority = rest.dropFirst(authority.count)
    let path = afterAuthority.prefix { $0 != "?" && $0 != "#" }
    guard !authority.isEmpty else { return notAbsolute }
    guard ["https", "http"].contains(scheme.lowercased()) else { return "the scheme must be https" }
    guard path.count == afterAuthority.count else { return "it must not have a query or fragment" }
    guard !authority.contains("@") else { return "it must not contain credentials" }
    guard hostAndPortAreValid(authority) else { return notAbsolute }
    guard let decoded = percentDecoded(path) else { return notAbsolute }
    if decoded.split(separator: "/").contains(where: { $0 == "." || $0 == ".." }) {
      return "it must not contain '.' or '..' segments"
    }
    return nil
  }

  static let unreserved = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~")
  static let subDelimiters = Set("!$&'()*+,;=")

  /// host[:port]: a registered name or IPv4 address of unreserved characters, or [IPv6]; a port of
  /// digits up to 65535.
  static func hostAndPortAreValid(_ authority: Substring) -> Bool {
    var host = authority
    var port: Substring = ""
    if authority.hasPrefix("[") {
      guard let close = authority.firstIndex(of: "]") else { return false }
      host = authority[...close]
      let inside = host.dropFirst().dropLast()
      guard !inside.isEmpty, inside.allSatisfy({ $0.isASCII && ($0.isHexDigit || $0 == ":" || $0 == ".") }) else {
        return false
      }
      let after = authority[authority.index(after: close)...]
      if !after.isEmpty {
        guard after.first == ":" else { return false }
        port = after.dropFirst()
      }
    } else {
      if let colon = authority.firstIndex(of: ":") {
        host = authority[..<colon]
        port = authority[authority.index(after: colon)...]
      }
      guard !host.isEmpty, host.allSatisfy({ unreserved.contains($0) }) else { return false }
    }
    guard port.count <= 5, port.allSatisfy({ $0.isASCII && $0.isNumber }) else { return false }
    return port.isEmpty || Int(port)! <= 65535
  }

  /// The path with its %XX escapes decoded; nil when it holds a character RFC 3986 does not allow
  /// in a path, or a bad escape.
  static func percentDecoded(_ path: Substring) -> String? {
    var bytes: [UInt8] = []
    var index = path.startIndex
    while index < path.endIndex {
      let c = path[index]
      if c == "%" {
        let hex = path[path.index(after: index)...].prefix(2)
        guard hex.count == 2, hex.allSatisfy({ $0.isASCII && $0.isHexDigit }), let byte = UInt8(hex, radix: 16) else {
          return nil
        }
        bytes.append(byte)
        index = hex.endIndex
        continue
      }
      guard unreserved.contains(c) || subDelimiters.contains(c) || c == ":" || c == "@" || c == "/" else { return nil }
      bytes.append(contentsOf: c.utf8)
      index = path.index(after: index)
    }
    return String(decoding: bytes, as: UTF8.self)
  }
}
