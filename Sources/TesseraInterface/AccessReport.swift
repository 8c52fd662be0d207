/// What `tessera access` reads: ListGrants' entries and GetAccessLog's records, with their one
/// mapping to and from D-Bus dicts (the daemon encodes, the client decodes, with the same keys).
/// `tessera access … --json` prints them with the same keys.

/// One grant as ListGrants shows it: the grant plus what the user reads (the app's display name,
/// the account's username).
public struct GrantInfo: Sendable, Equatable, Encodable {
  public var app: String
  public var appDisplay: String
  public var clientID: String
  public var accountID: String
  /// The account's username; "*" for every account; "" for an account no longer signed in.
  public var account: String
  public var grantedAt: Int64
  public var via: String
  /// Each limit only when there is one: nil means any, and an empty scope list means OpenID
  /// Connect's own scopes only.
  public var authority: String?
  public var scopes: [String]?
  public var operations: [String]?
  /// For a forward's grant: the host it was made for (the forward's ssh destination), from the
  /// app key; nil for any other app, and for a container's socket.
  public var host: String? { AppIdentity(key: app)?.forwardHost }

  public init(
    app: String, appDisplay: String, clientID: String, accountID: String, account: String, grantedAt: Int64,
    via: String, authority: String? = nil, scopes: [String]? = nil, operations: [String]? = nil
  ) {
    self.app = app
    self.appDisplay = appDisplay
    self.clientID = clientID
    self.accountID = accountID
    self.account = account
    self.grantedAt = grantedAt
    self.via = via
    self.authority = authority
    self.scopes = scopes
    self.operations = operations
  }

  enum CodingKeys: String, CodingKey {
    case app, account, via, authority, scopes, operations, host
    case appDisplay = "app_display"
    case clientID = "client_id"
    case accountID = "account_id"
    case grantedAt = "granted_at"
  }

  public func encode(to encoder: any Encoder) throws {
    var c = encoder.container(keyedBy: CodingKeys.self)
    try c.encode(app, forKey: .app)
    try c.encode(appDisplay, forKey: .appDisplay)
    try c.encodeIfPresent(host, forKey: .host)
    try c.encode(clientID, forKey: .clientID)
    try c.encode(accountID, forKey: .accountID)
    try c.encode(account, forKey: .account)
    try c.encode(grantedAt, forKey: .grantedAt)
    try c.encode(via, forKey: .via)
    try c.encodeIfPresent(authority, forKey: .authority)
    try c.encodeIfPresent(scopes, forKey: .scopes)
    try c.encodeIfPresent(operations, forKey: .operations)
  }

  public var busValue: [String: BusValue] {
    var d: [String: BusValue] = [
      CodingKeys.app.rawValue: .string(app), CodingKeys.appDisplay.rawValue: .string(appDisplay),
      CodingKeys.clientID.rawValue: .string(clientID), CodingKeys.accountID.rawValue: .string(accountID),
      CodingKeys.account.rawValue: .string(account), CodingKeys.grantedAt.rawValue: .int64(grantedAt),
      CodingKeys.via.rawValue: .string(via),
    ]
    if let authority { d[CodingKeys.authority.rawValue] = .string(authority) }
    if let scopes { d[CodingKeys.scopes.rawValue] = .strings(scopes) }
    if let operations { d[CodingKeys.operations.rawValue] = .strings(operations) }
    return d
  }

  public init(busValue d: [String: BusValue]) {
    func s(_ key: CodingKeys) -> String { d[key.rawValue]?.stringValue ?? "" }
    func list(_ key: CodingKeys) -> [String]? {
      if case .strings(let v)? = d[key.rawValue] { return v }
      return nil
    }
    var grantedAt: Int64 = 0
    if case .int64(let n)? = d[CodingKeys.grantedAt.rawValue] { grantedAt = n }
    self.init(
      app: s(.app), appDisplay: s(.appDisplay), clientID: s(.clientID), accountID: s(.accountID), account: s(.account),
      grantedAt: grantedAt, via: s(.via), authority: d[CodingKeys.authority.rawValue]?.stringValue,
      scopes: list(.scopes), operations: list(.operations))
  }
}

/// One audited access decision, as GetAccessLog returns it (never a token).
public struct AccessRecord: Sendable, Equatable, Encodable {
  /// Unix seconds.
  public var at: Int64
  /// The app's display name ("unidentified" when it could not be told), and its key.
  public var app: String
  public var appKey: String
  public var clientID: String
  /// The account's username (or what the request named).
  public var account: String
  public var scopes: [String]
  public var operation: String
  /// "allowed" or "refused", and why.
  public var decision: String
  public var reason: String
  /// The app's decisions so far: a gap between two records of one app shows lines were dropped.
  public var appDecisions: UInt32

  public init(
    at: Int64, app: String, appKey: String, clientID: String, account: String, scopes: [String], operation: String,
    decision: String, reason: String, appDecisions: UInt32
  ) {
    self.at = at
    self.app = app
    self.appKey = appKey
    self.clientID = clientID
    self.account = account
    self.scopes = scopes
    self.operation = operation
    self.decision = decision
    self.reason = reason
    self.appDecisions = appDecisions
  }

  enum CodingKeys: String, CodingKey {
    case at, app, account, scopes, operation, decision, reason
    case appKey = "app_key"
    case clientID = "client_id"
    case appDecisions = "app_decisions"
  }

  public var busValue: [String: BusValue] {
    [
      CodingKeys.at.rawValue: .int64(at), CodingKeys.app.rawValue: .string(app),
      CodingKeys.appKey.rawValue: .string(appKey), CodingKeys.clientID.rawValue: .string(clientID),
      CodingKeys.account.rawValue: .string(account), CodingKeys.scopes.rawValue: .strings(scopes),
      CodingKeys.operation.rawValue: .string(operation), CodingKeys.decision.rawValue: .string(decision),
      CodingKeys.reason.rawValue: .string(reason), CodingKeys.appDecisions.rawValue: .uint32(appDecisions),
    ]
  }

  public init(busValue d: [String: BusValue]) {
    func s(_ key: CodingKeys) -> String { d[key.rawValue]?.stringValue ?? "" }
    var at: Int64 = 0
    if case .int64(let n)? = d[CodingKeys.at.rawValue] { at = n }
    var scopes: [String] = []
    if case .strings(let v)? = d[CodingKeys.scopes.rawValue] { scopes = v }
    var count: UInt32 = 0
    if case .uint32(let n)? = d[CodingKeys.appDecisions.rawValue] { count = n }
    self.init(
      at: at, app: s(.app), appKey: s(.appKey), clientID: s(.clientID), account: s(.account), scopes: scopes,
      operation: s(.operation), decision: s(.decision), reason: s(.reason), appDecisions: count)
  }
}
