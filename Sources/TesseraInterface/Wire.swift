/// The values both sides of the bus exchange, and their one mapping to and from D-Bus dicts: the
/// daemon builds replies with these, the client library reads them with the same code.

/// Correlation ids: the caller's, or a new random (version 4) UUID in lower case, as MSAL and Entra
/// write them.
public enum CorrelationID {
  /// A correlation id only has to be unique, not unpredictable (it is written to logs and sent to
  /// the identity provider in the clear), so it comes from a fast generator (xoshiro256**) seeded
  /// once from the system's random source, not from a getrandom(2) system call per id (a tenth of
  /// the bus thread's time on a cached answer; Foundation's `UUID()` even opened /dev/urandom).
  private static let generator = Locked(Xoshiro256StarStar())

  public static func new() -> String {
    let (high, low) = generator.withLock { ($0.next(), $0.next()) }
    return format(high: (high & ~0xF000) | 0x4000, low: (low & ~(0xC << 60)) | (0x8 << 60))  // v4, RFC 4122
  }

  static func format(high: UInt64, low: UInt64) -> String {
    String(unsafeUninitializedCapacity: 36) { text in
      var position = 0
      for word in [high, low] {
        for nibble in 0..<16 {
          if position == 8 || position == 13 || position == 18 || position == 23 {
            text[position] = UInt8(ascii: "-")
            position += 1
          }
          let digit = UInt8((word >> UInt64(60 - 4 * nibble)) & 0xF)
          text[position] = digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10
          position += 1
        }
      }
      return position
    }
  }
}

/// xoshiro256** (Blackman and Vigna), seeded from SystemRandomNumberGenerator. Not for secrets.
struct Xoshiro256StarStar: RandomNumberGenerator {
  private var s: (UInt64, UInt64, UInt64, UInt64)

  init() {
    var seed = SystemRandomNumberGenerator()
    s = (seed.next(), seed.next(), seed.next(), seed.next())
    if s == (0, 0, 0, 0) { s.0 = 1 }
  }

  mutating func next() -> UInt64 {
    let result = ((s.1 &* 5) << 7 | (s.1 &* 5) >> 57) &* 9
    let t = s.1 << 17
    s.2 ^= s.0
    s.3 ^= s.1
    s.1 ^= s.2
    s.0 ^= s.3
    s.2 ^= t
    s.3 = s.3 << 45 | s.3 >> 19
    return result
  }
}

/// Who is calling, as the bus daemon reports it. `exe` comes from /proc and is a hint, not proof.
public struct CallerInfo: Sendable, Equatable {
  public var busName: String
  public var pid: UInt32?
  public var uid: UInt32?
  public var exe: String?
  /// Which app it is (see AppIdentity); nil when it could not be told (the process is gone).
  public var app: AppIdentity? { didSet { appKey = app?.key } }
  /// `app?.key`, built once: the bus thread's cached answers look it up on every call.
  public private(set) var appKey: String?
  public init(busName: String, pid: UInt32? = nil, uid: UInt32? = nil, exe: String? = nil, app: AppIdentity? = nil) {
    self.busName = busName
    self.pid = pid
    self.uid = uid
    self.exe = exe
    self.app = app
    self.appKey = app?.key
  }
}

/// An account as the D-Bus API shows it (every key of type s present; GetAccounts adds `current`).
public struct AccountInfo: Sendable, Equatable, Codable {
  public var id: String
  public var username: String
  public var name: String
  public var authority: String
  public var environment: String
  public var realm: String
  public var localAccountID: String
  /// Whether it is the current account of its identity provider (`tessera account use`): the one
  /// requests that name no account get when several are signed in there. GetAccounts and
  /// SetCurrentAccount say; nil elsewhere.
  public var current: Bool?
  /// GetAccounts only: "dpop" when its refresh tokens are bound to a key of this machine (RFC
  /// 9449), else "bearer"; nil elsewhere.
  public var tokenBinding: String?

  public init(
    id: String, username: String, name: String, authority: String, environment: String, realm: String,
    localAccountID: String
  ) {
    self.id = id
    self.username = username
    self.name = name
    self.authority = authority
    self.environment = environment
    self.realm = realm
    self.localAccountID = localAccountID
  }

  /// Keys are as on the bus; `--json` output uses the same.
  enum CodingKeys: String, CodingKey {
    case id, username, name, authority, environment, realm, current
    case localAccountID = "local_account_id"
    case tokenBinding = "token_binding"
  }

  public init(busValue d: [String: BusValue]) {
    func s(_ key: CodingKeys) -> String { d[key.rawValue]?.stringValue ?? "" }
    self.init(
      id: s(.id), username: s(.username), name: s(.name), authority: s(.authority), environment: s(.environment),
      realm: s(.realm), localAccountID: s(.localAccountID))
    if case .bool(let current)? = d[CodingKeys.current.rawValue] { self.current = current }
    tokenBinding = d[CodingKeys.tokenBinding.rawValue]?.stringValue
  }

  public var busValue: [String: BusValue] {
    var d: [String: BusValue] = [
      CodingKeys.id.rawValue: .string(id), CodingKeys.username.rawValue: .string(username),
      CodingKeys.name.rawValue: .string(name), CodingKeys.authority.rawValue: .string(authority),
      CodingKeys.environment.rawValue: .string(environment), CodingKeys.realm.rawValue: .string(realm),
      CodingKeys.localAccountID.rawValue: .string(localAccountID),
    ]
    if let current { d[CodingKeys.current.rawValue] = .bool(current) }
    if let tokenBinding { d[CodingKeys.tokenBinding.rawValue] = .string(tokenBinding) }
    return d
  }
}

/// The result of AcquireToken and AcquireTokenSilent. There is never a refresh token here.
public struct TokenInfo: Sendable, Equatable, Codable {
  public var accessToken: String
  public var tokenType: String
  /// Unix seconds.
  public var expiresOn: Int64
  public var scopes: [String]
  public var account: AccountInfo
  public var idToken: String?
  public var correlationID: String

  public init(
    accessToken: String, tokenType: String, expiresOn: Int64, scopes: [String], account: AccountInfo,
    idToken: String?, correlationID: String
  ) {
    self.accessToken = accessToken
    self.tokenType = tokenType
    self.expiresOn = expiresOn
    self.scopes = scopes
    self.account = account
    self.idToken = idToken
    self.correlationID = correlationID
  }

  enum CodingKeys: String, CodingKey {
    case accessToken = "access_token"
    case tokenType = "token_type"
    case expiresOn = "expires_on"
    case scopes, account
    case idToken = "id_token"
    case correlationID = "correlation_id"
  }

  public static let correlationIDKey = CodingKeys.correlationID.rawValue

  public init(busValue d: [String: BusValue]) {
    var expiresOn: Int64 = 0
    if case .int64(let e)? = d[CodingKeys.expiresOn.rawValue] { expiresOn = e }
    var scopes: [String] = []
    if case .strings(let s)? = d[CodingKeys.scopes.rawValue] { scopes = s }
    self.init(
      accessToken: d[CodingKeys.accessToken.rawValue]?.stringValue ?? "",
      tokenType: d[CodingKeys.tokenType.rawValue]?.stringValue ?? "Bearer", expiresOn: expiresOn, scopes: scopes,
      account: AccountInfo(busValue: d[CodingKeys.account.rawValue]?.dictValue ?? [:]),
      idToken: d[CodingKeys.idToken.rawValue]?.stringValue,
      correlationID: d[CodingKeys.correlationID.rawValue]?.stringValue ?? "")
  }

  public var busValue: [String: BusValue] {
    var result: [String: BusValue] = [
      CodingKeys.accessToken.rawValue: .string(accessToken), CodingKeys.tokenType.rawValue: .string(tokenType),
      CodingKeys.expiresOn.rawValue: .int64(expiresOn), CodingKeys.scopes.rawValue: .strings(scopes),
      CodingKeys.account.rawValue: .dict(account.busValue),
      CodingKeys.correlationID.rawValue: .string(correlationID),
    ]
    if let idToken { result[CodingKeys.idToken.rawValue] = .string(idToken) }
    return result
  }
}

/// What the user must do to finish an interactive sign-in: the InteractionPending signal's info.
public struct InteractionInfo: Sendable, Equatable {
  public enum Flow: String, Sendable {
    case browser
    case deviceCode = "device_code"
  }
  public var flow: Flow
  public var verificationURI: String
  public var userCode: String?
  public var expiresIn: UInt32
  public var message: String
  public var verificationURIComplete: String?

  public init(
    flow: Flow, verificationURI: String, userCode: String? = nil, expiresIn: UInt32, message: String,
    verificationURIComplete: String? = nil
  ) {
    self.flow = flow
    self.verificationURI = verificationURI
    self.userCode = userCode
    self.expiresIn = expiresIn
    self.message = message
    self.verificationURIComplete = verificationURIComplete
  }

  /// Reads an interaction signal's dictionary. A flow this client does not know (a newer broker)
  /// still gives the user its URL and message: it is read as a device code flow when a user code
  /// is present, else as a browser flow. Nil only when there is nothing to show.
  public init?(busValue info: [String: BusValue]) {
    let userCode = info["user_code"]?.stringValue
    guard info["verification_uri"]?.stringValue != nil || info["message"]?.stringValue != nil else { return nil }
    let flow = info["flow"]?.stringValue.flatMap(Flow.init(rawValue:)) ?? (userCode == nil ? .browser : .deviceCode)
    var expires: UInt32 = 0
    if case .uint32(let e)? = info["expires_in"] { expires = e }
    self.init(
      flow: flow, verificationURI: info["verification_uri"]?.stringValue ?? "",
      userCode: userCode, expiresIn: expires, message: info["message"]?.stringValue ?? "",
      verificationURIComplete: info["verification_uri_complete"]?.stringValue)
  }

  public var busValue: [String: BusValue] {
    var info: [String: BusValue] = [
      "flow": .string(flow.rawValue), "verification_uri": .string(verificationURI), "expires_in": .uint32(expiresIn),
      "message": .string(message),
    ]
    if let userCode { info["user_code"] = .string(userCode) }
    if let verificationURIComplete { info["verification_uri_complete"] = .string(verificationURIComplete) }
    return info
  }
}
