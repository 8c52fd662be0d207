import Crypto
import TesseraInterface

/// What the Microsoft front answers with: accounts and token responses in the protocol's JSON (every
/// field sso-mib, linux-entra-sso and msalruntime read), written by a small JSON writer of its own.
/// Accounts as Microsoft's protocol shows them (every field sso-mib and linux-entra-sso require).
enum MicrosoftAccount {
  /// `homeAccountId` is Tessera's account id: `<oid>.<tid>` at Entra, `<sub>.<issuer digest>`
  /// elsewhere; `clientInfo` is its two halves as Entra's client_info (uid, utid), so that what a
  /// client derives from it names the same account.
  static func json(_ account: Account) -> JSONOut {
    let (given, family) = names(account.name)
    return .object([
      ("authorityType", .string("MSSTS")),
      ("clientInfo", .string(clientInfo(account))),
      ("environment", .string(account.environment)),
      ("familyName", .string(family)),
      ("givenName", .string(given)),
      ("homeAccountId", .string(account.id)),
      ("localAccountId", .string(account.localAccountID)),
      ("name", .string(account.name)),
      ("passwordExpiry", .int(0)),
      ("realm", .string(realmUUID(account))),
      ("username", .string(account.username)),
    ])
  }

  /// The account a client echoes back, as the engine's rule reads it (AccountReference):
  /// homeAccountId is Tessera's account id, localAccountId the IdP's object id or subject; other
  /// keys are ignored.
  static func reference(_ wanted: MicrosoftRequest.Object) throws -> AccountReference {
    try AccountReference(
      id: wanted.string("homeAccountId"), localID: wanted.string("localAccountId"),
      username: wanted.string("username"))
  }

  /// First word and the rest of the display name (Tessera keeps only the display name).
  static func names(_ name: String) -> (given: String, family: String) {
    let trimmed = name.trimmingSpaces()
    guard let space = trimmed.firstIndex(of: " ") else { return (trimmed, "") }
    return (String(trimmed[..<space]), String(trimmed[trimmed.index(after: space)...]).trimmingSpaces())
  }

  static func clientInfo(_ account: Account) -> String {
    let (uid, utid): (String, String)
    if let dot = account.id.lastIndex(of: ".") {
      (uid, utid) = (String(account.id[..<dot]), String(account.id[account.id.index(after: dot)...]))
    } else {
      (uid, utid) = (account.id, "")
    }
    let json = JSONOut.object([("uid", .string(uid)), ("utid", .string(utid))]).text
    return Base64URL.encode(Array(json.utf8))
  }

  /// The tenant as a UUID: Entra's `tid` as it is; any other realm (an IdP with no tenants, or a
  /// tenant named by a word) as the name-based UUID (RFC 9562 version 5) of
  /// "<environment>/<realm>", stable for the account.
  static func realmUUID(_ account: Account) -> String {
    if isUUID(account.realm) { return account.realm.lowercased() }
    var bytes = Array(Insecure.SHA1.hash(data: Array((account.environment + "/" + account.realm).utf8)).prefix(16))
    bytes[6] = (bytes[6] & 0x0F) | 0x50
    bytes[8] = (bytes[8] & 0x3F) | 0x80
    let hex = bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    let h = Array(hex)
    return "\(String(h[0..<8]))-\(String(h[8..<12]))-\(String(h[12..<16]))-\(String(h[16..<20]))-\(String(h[20..<32]))"
  }

  static func isUUID(_ text: String) -> Bool {
    let bytes = Array(text.utf8)
    guard bytes.count == 36 else { return false }
    for (i, b) in bytes.enumerated() {
      if i == 8 || i == 13 || i == 18 || i == 23 {
        guard b == UInt8(ascii: "-") else { return false }
      } else {
        guard (b >= 48 && b <= 57) || (b >= 97 && b <= 102) || (b >= 65 && b <= 70) else { return false }
      }
    }
    return true
  }
}

enum MicrosoftToken {
  /// A token answer: `expiresOn` and `extendedExpiresOn` in epoch milliseconds, `grantedScopes` one
  /// string: the requested scopes the grant covers, as the caller spelled them (msalruntime
  /// compares them with what it asked), then what the IdP granted besides. A requested scope the
  /// IdP did not grant is left out, so the app sees it declined.
  static func json(_ result: Broker.TokenResult, requestedScopes: [String]) -> String {
    let token = result.accessToken
    let granted = Set(result.grantedScopes.map { $0.lowercased() })
    var scopes = requestedScopes.filter {
      let scope = $0.lowercased()
      return granted.contains(scope) || ScopeSet.oidcScopes.contains(scope) || scope.hasSuffix("/.default")
        || scope == ".default"
    }
    var seen = Set(scopes.map { $0.lowercased() })
    for scope in result.grantedScopes where seen.insert(scope.lowercased()).inserted { scopes.append(scope) }
    var fields: [(String, JSONOut)] = [
      ("accessToken", .string(token.secret)),
      ("accessTokenType", .int(0)),
      ("account", MicrosoftAccount.json(result.account)),
      ("clientInfo", .string(MicrosoftAccount.clientInfo(result.account))),
      ("expiresOn", .int(token.expiresOn * 1000)),
      ("extendedExpiresOn", .int((token.extExpiresOn ?? token.expiresOn) * 1000)),
      ("grantedScopes", .string(scopes.joined(separator: " "))),
      ("idToken", .string(token.idToken ?? "")),
    ]
    if let refreshOn = token.refreshOn { fields.append(("refreshOn", .int(refreshOn * 1000))) }
    return JSONOut.object([("brokerTokenResponse", .object(fields))]).text
  }
}

/// JSON written in a fixed key order, with integers as integers (epoch milliseconds must not
/// become 1.7e12).
indirect enum JSONOut {
  case object([(String, JSONOut)])
  case array([JSONOut])
  case string(String)
  case int(Int64)
  case double(Double)
  case bool(Bool)
  case null

  init(_ value: JSONValue) {
    switch value {
    case .object(let o): self = .object(o.keys.sorted().map { ($0, JSONOut(o[$0]!)) })
    case .array(let a): self = .array(a.map(JSONOut.init))
    case .string(let s): self = .string(s)
    case .number(let n): self = n == n.rounded() && abs(n) < 9e15 ? .int(Int64(n)) : .double(n)
    case .bool(let b): self = .bool(b)
    case .null: self = .null
    }
  }

  var text: String {
    var out = ""
    write(to: &out)
    return out
  }

  func write(to out: inout String) {
    switch self {
    case .object(let fields):
      out += "{"
      for (i, (key, value)) in fields.enumerated() {
        if i > 0 { out += "," }
        out += JSONText.quote(key) + ":"
        value.write(to: &out)
      }
      out += "}"
    case .array(let values):
      out += "["
      for (i, value) in values.enumerated() {
        if i > 0 { out += "," }
        value.write(to: &out)
      }
      out += "]"
    case .string(let s): out += JSONText.quote(s)
    case .int(let n): out += String(n)
    case .double(let d): out += d.isFinite ? "\(d)" : "null"
    case .bool(let b): out += b ? "true" : "false"
    case .null: out += "null"
    }
  }
}
