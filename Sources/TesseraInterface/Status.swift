/// GetStatus's reply (and `tessera status --json`): a versioned schema. Keys are added, never
/// renamed or removed, within one `schema` number; a change of meaning gets a new number.
public enum StatusReport {
  /// The schema of this report. `tessera status --json` prints it as `schema`.
  public static let schema: UInt32 = 1

  public static let schemaKey = "schema"
  public static let versionKey = "version"
  public static let accountsKey = "accounts"
  public static let attentionKey = "attention_needed"
  /// {state: "ok" or "unavailable", message when unavailable}: the Secret Service as the broker
  /// found it. While it is unavailable (a locked keyring at login) the accounts are not known.
  public static let storeKey = "store"

  public enum Store {
    public static let state = "state"
    public static let message = "message"
    /// Which store: StoreKind's values. Absent from brokers older than this key (then the Secret
    /// Service).
    public static let kind = "kind"
    /// The file store's directory.
    public static let path = "path"
    /// Where the file store's key comes from: the key file, or the systemd credential.
    public static let key = "key"
    /// What the store set aside since the daemon started (damaged records), one line each.
    public static let notes = "notes"
  }

  /// {files, warnings, locked, loaded_at, reloads, at_next_start, refused: {problems, at}}: the
  /// configuration in force (issue 26). Absent from brokers older than this key.
  public static let configKey = "config"

  /// {state: "connected" or "missing", message when missing}: whether tesserad itself has a
  /// session bus (issue 23). Absent from brokers older than this key. A client that reached
  /// tesserad over its socket may see no bus where tesserad has one, or the other way round.
  public static let sessionBusKey = "session_bus"

  /// {kind: "tpm", "software" or "none", summary}: where the keys tokens are bound to (DPoP) are
  /// made and kept, in words. Absent from older brokers.
  public static let dpopKey = "dpop"

  /// Whether tesserad has a session bus: connected, or missing and why.
  public enum SessionBus: Sendable, Equatable {
    case connected
    case missing(String)
  }

  /// The configuration in force: the files it was read from (the administrator's first), the
  /// user's settings the administrator's policy ignored, the keys it locks, when it was read, the
  /// changes waiting for a restart, and the last reload that was refused (nil once one succeeds).
  public struct ConfigStatus: Sendable, Equatable, Encodable {
    public var files: [String] = []
    public var warnings: [String] = []
    public var locked: [String] = []
    public var loadedAt: Int64 = 0
    public var reloads: Int64 = 0
    public var atNextStart: [String] = []
    public var refused: Refusal?
    /// The identity providers config.toml names (`[[provider]]`), to sign in to by name.
    public var providers: [Provider] = []
    /// Where a sign-in that names no provider or authority goes (nil from older brokers).
    public var defaultAuthority: String?

    /// A provider as a sign-in names it: never its client secret.
    public struct Provider: Sendable, Equatable, Encodable {
      public var name: String
      public var issuer: String
      public var profile: String?
      public init(name: String, issuer: String, profile: String?) {
        self.name = name
        self.issuer = issuer
        self.profile = profile
      }
    }

    public struct Refusal: Sendable, Equatable, Encodable {
      public var problems: [String]
      public var at: Int64
      public init(problems: [String], at: Int64) {
        self.problems = problems
        self.at = at
      }
    }

    public init() {}

    enum CodingKeys: String, CodingKey {
      case files, warnings, locked, reloads, refused, providers
      case loadedAt = "loaded_at"
      case defaultAuthority = "default_authority"
      case atNextStart = "at_next_start"
    }

    public var busValue: [String: BusValue] {
      var d: [String: BusValue] = [
        "files": .strings(files), "warnings": .strings(warnings), "locked": .strings(locked),
        "loaded_at": .int64(loadedAt), "reloads": .int64(reloads), "at_next_start": .strings(atNextStart),
      ]
      if let refused { d["refused"] = .dict(["problems": .strings(refused.problems), "at": .int64(refused.at)]) }
      d["providers"] = .dicts(
        providers.map { provider in
          var entry: [String: BusValue] = ["name": .string(provider.name), "issuer": .string(provider.issuer)]
          if let profile = provider.profile { entry["profile"] = .string(profile) }
          return entry
        })
      if let defaultAuthority { d["default_authority"] = .string(defaultAuthority) }
      return d
    }

    public init(busValue d: [String: BusValue]) {
      func strings(_ key: String) -> [String] {
        if case .strings(let list)? = d[key] { return list }
        return []
      }
      func int(_ value: BusValue?) -> Int64 {
        if case .int64(let n)? = value { return n }
        return 0
      }
      files = strings("files")
      warnings = strings("warnings")
      locked = strings("locked")
      loadedAt = int(d["loaded_at"])
      reloads = int(d["reloads"])
      atNextStart = strings("at_next_start")
      if case .dicts(let list)? = d["providers"] {
        providers = list.map {
          Provider(
            name: $0["name"]?.stringValue ?? "", issuer: $0["issuer"]?.stringValue ?? "",
            profile: $0["profile"]?.stringValue)
        }
      }
      defaultAuthority = d["default_authority"]?.stringValue
      if case .dict(let r)? = d["refused"] {
        var problems: [String] = []
        if case .strings(let list)? = r["problems"] { problems = list }
        refused = Refusal(problems: problems, at: int(r["at"]))
      }
    }
  }

  public enum Account {
    /// "dpop" when the account's refresh tokens are bound to a key of this machine (RFC 9449),
    /// else "bearer"; absent from older brokers.
    public static let tokenBinding = "token_binding"
    public static let id = "id"
    public static let username = "username"
    public static let authority = "authority"
    /// ok, needs_sign_in, store_locked, idp_unreachable or blocked_by_policy.
    public static let state = "state"
    /// {code, message, at}: the last failure for this account since the daemon started.
    public static let lastError = "last_error"
    /// Unix seconds of the next refresh the daemon makes by itself (tokens in recent use); absent
    /// when none is planned.
    public static let nextRefresh = "next_refresh"
    /// The cached access tokens: {client_id, scopes, expires_on, refresh_on}; never their values.
    /// A token that does not expire has expires_on 253402300799 (TokenExpiry.never) and no refresh_on.
    public static let tokens = "tokens"
    /// The client ids holding a refresh token for the account (never the token).
    public static let refreshTokenClients = "refresh_token_clients"
    /// Unix seconds when the first of the account's refresh tokens with a lifetime of its own
    /// (`refresh_token_expires_in`) lapses; absent when none has one. AttentionNeeded lists the
    /// account from a day before.
    public static let refreshTokenExpiresOn = "refresh_token_expires_on"
    /// The account's display name from its ID token (absent when it has none).
    public static let name = "name"
    /// Whether it is the current account of its identity provider (absent from older brokers).
    public static let current = "current"
  }

  public enum LastError {
    public static let code = "code"
    public static let message = "message"
    public static let at = "at"
  }

  public enum Token {
    public static let clientID = "client_id"
    public static let scopes = "scopes"
    public static let expiresOn = "expires_on"
    public static let refreshOn = "refresh_on"
  }

  /// The states an account can be in, as the report spells them.
  public static let states = ["ok", "needs_sign_in", "store_locked", "idp_unreachable", blockedByPolicy]
  /// The configuration in force (trusted_authorities, the administrator's policy) no longer trusts
  /// the account's authority: no refresh token is sent there; the account is kept.
  public static let blockedByPolicy = "blocked_by_policy"

  /// Each state in a few words, for a list (the desktop app's rows); an unknown one is named, not
  /// hidden.
  public static func label(forState state: String) -> String {
    switch state {
    case "ok": "Signed in"
    case "needs_sign_in": "Needs sign-in"
    case "store_locked": "Keyring locked"
    case "idp_unreachable": "Offline, retrying"
    case blockedByPolicy: "Blocked by policy"
    default: "Unknown state (\(state))"
    }
  }

  /// One account's health as the client reads it from GetStatus.
  public struct AccountStatus: Sendable, Equatable, Encodable {
    public var id: String
    public var username: String
    public var authority: String
    public var state: String
    public var lastError: LastErrorInfo?
    public var nextRefresh: Int64?
    public var tokens: [TokenStatus]
    public var refreshTokenClients: [String]
    /// When the first of the account's refresh tokens that has a lifetime of its own lapses
    /// (`refresh_token_expires_in`); nil when none has one.
    public var refreshTokenExpiresOn: Int64?
    /// The display name (nil when the account has none, or the broker is older).
    public var name: String?
    /// Whether it is the current account of its identity provider (nil from older brokers).
    public var current: Bool?
    /// "dpop" or "bearer" (nil from older brokers).
    public var tokenBinding: String?

    public struct LastErrorInfo: Sendable, Equatable, Encodable {
      public var code: String
      public var message: String
      public var at: Int64
      public init(code: String, message: String, at: Int64) {
        self.code = code
        self.message = message
        self.at = at
      }
    }

    public struct TokenStatus: Sendable, Equatable, Encodable {
      public var clientID: String
      public var scopes: [String]
      public var expiresOn: Int64
      public var refreshOn: Int64?
      public init(clientID: String, scopes: [String], expiresOn: Int64, refreshOn: Int64?) {
        self.clientID = clientID
        self.scopes = scopes
        self.expiresOn = expiresOn
        self.refreshOn = refreshOn
      }
      enum CodingKeys: String, CodingKey {
        case clientID = "client_id"
        case scopes
        case expiresOn = "expires_on"
        case refreshOn = "refresh_on"
      }
    }

    enum CodingKeys: String, CodingKey {
      case id, username, authority, state, tokens
      case lastError = "last_error"
      case nextRefresh = "next_refresh"
      case refreshTokenClients = "refresh_token_clients"
      case refreshTokenExpiresOn = "refresh_token_expires_on"
      case name, current
      case tokenBinding = "token_binding"
    }

    public init(
      id: String, username: String, authority: String, state: String, lastError: LastErrorInfo? = nil,
      nextRefresh: Int64? = nil, tokens: [TokenStatus] = [], refreshTokenClients: [String] = [],
      refreshTokenExpiresOn: Int64? = nil, name: String? = nil, current: Bool? = nil
    ) {
      self.refreshTokenExpiresOn = refreshTokenExpiresOn
      self.name = name
      self.current = current
      self.id = id
      self.username = username
      self.authority = authority
      self.state = state
      self.lastError = lastError
      self.nextRefresh = nextRefresh
      self.tokens = tokens
      self.refreshTokenClients = refreshTokenClients
    }

    /// The account's entry in GetStatus's reply: optional keys only when they have a value.
    public var busValue: [String: BusValue] {
      var item: [String: BusValue] = [
        Account.id: .string(id), Account.username: .string(username), Account.authority: .string(authority),
        Account.state: .string(state),
      ]
      if let lastError {
        item[Account.lastError] = .dict([
          LastError.code: .string(lastError.code), LastError.message: .string(lastError.message),
          LastError.at: .int64(lastError.at),
        ])
      }
      if let nextRefresh { item[Account.nextRefresh] = .int64(nextRefresh) }
      item[Account.tokens] = .dicts(
        tokens.map { token in
          var t: [String: BusValue] = [
            Token.clientID: .string(token.clientID), Token.scopes: .strings(token.scopes),
            Token.expiresOn: .int64(token.expiresOn),
          ]
          if let refreshOn = token.refreshOn { t[Token.refreshOn] = .int64(refreshOn) }
          return t
        })
      item[Account.refreshTokenClients] = .strings(refreshTokenClients)
      if let refreshTokenExpiresOn { item[Account.refreshTokenExpiresOn] = .int64(refreshTokenExpiresOn) }
      if let name, !name.isEmpty { item[Account.name] = .string(name) }
      if let current { item[Account.current] = .bool(current) }
      if let tokenBinding { item[Account.tokenBinding] = .string(tokenBinding) }
      return item
    }

    public init(busValue d: [String: BusValue]) {
      func string(_ d: [String: BusValue], _ key: String) -> String { d[key]?.stringValue ?? "" }
      func int(_ d: [String: BusValue], _ key: String) -> Int64? {
        if case .int64(let n)? = d[key] { return n }
        return nil
      }
      id = string(d, Account.id)
      username = string(d, Account.username)
      authority = string(d, Account.authority)
      state = string(d, Account.state)
      if case .dict(let e)? = d[Account.lastError] {
        lastError = LastErrorInfo(
          code: string(e, LastError.code), message: string(e, LastError.message), at: int(e, LastError.at) ?? 0)
      }
      nextRefresh = int(d, Account.nextRefresh)
      if case .dicts(let list)? = d[Account.tokens] {
        tokens = list.map { t in
          var scopes: [String] = []
          if case .strings(let s)? = t[Token.scopes] { scopes = s }
          return TokenStatus(
            clientID: string(t, Token.clientID), scopes: scopes, expiresOn: int(t, Token.expiresOn) ?? 0,
            refreshOn: int(t, Token.refreshOn))
        }
      } else {
        tokens = []
      }
      if case .strings(let clients)? = d[Account.refreshTokenClients] {
        refreshTokenClients = clients
      } else {
        refreshTokenClients = []
      }
      refreshTokenExpiresOn = int(d, Account.refreshTokenExpiresOn)
      name = d[Account.name]?.stringValue
      if case .bool(let current)? = d[Account.current] { self.current = current }
      tokenBinding = d[Account.tokenBinding]?.stringValue
    }
  }

  /// The whole report, as the engine makes it and the client reads it.
  public struct Report: Sendable, Equatable {
    /// Why the Secret Service could not be read (a locked keyring); nil when it could.
    public var storeProblem: String?
    /// Which store the broker uses (StoreKind), its directory and key (file store), and what it
    /// set aside.
    public var storeKind: String
    public var storePath: String?
    public var storeKeyLocation: String?
    public var storeNotes: [String]
    public var accounts: [AccountStatus]
    /// The accounts (ids) that need a sign-in, sorted.
    public var attentionNeeded: [String]
    public var schema: UInt32
    public var version: String
    /// The configuration in force; nil from a broker older than the key.
    public var config: ConfigStatus?
    /// Whether tesserad has a session bus; nil when not known (an older broker).
    public var sessionBus: SessionBus?
    /// Where DPoP keys are made ("tpm", "software", "none") and that in words; nil from older brokers.
    public var dpopKind: String?
    public var dpopSummary: String?

    public init(
      storeProblem: String?, accounts: [AccountStatus], attentionNeeded: [String], schema: UInt32 = StatusReport.schema,
      version: String = BrokerInterface.version, storeKind: String = StoreKind.secretService.rawValue,
      storePath: String? = nil,
      storeKeyLocation: String? = nil, storeNotes: [String] = [], config: ConfigStatus? = nil
    ) {
      self.config = config
      self.storeProblem = storeProblem
      self.storeKind = storeKind
      self.storePath = storePath
      self.storeKeyLocation = storeKeyLocation
      self.storeNotes = storeNotes
      self.accounts = accounts
      self.attentionNeeded = attentionNeeded
      self.schema = schema
      self.version = version
    }

    public var busValue: [String: BusValue] {
      var store: [String: BusValue] = [Store.state: .string(storeProblem == nil ? "ok" : "unavailable")]
      if let storeProblem { store[Store.message] = .string(storeProblem) }
      store[Store.kind] = .string(storeKind)
      if let storePath { store[Store.path] = .string(storePath) }
      if let storeKeyLocation { store[Store.key] = .string(storeKeyLocation) }
      if !storeNotes.isEmpty { store[Store.notes] = .strings(storeNotes) }
      var report: [String: BusValue] = [
        storeKey: .dict(store), schemaKey: .uint32(schema), versionKey: .string(version),
        accountsKey: .dicts(accounts.map(\.busValue)), attentionKey: .strings(attentionNeeded),
      ]
      if let config { report[configKey] = .dict(config.busValue) }
      switch sessionBus {
      case .connected?: report[sessionBusKey] = .dict([Store.state: .string("connected")])
      case .missing(let why)?:
        report[sessionBusKey] = .dict([Store.state: .string("missing"), Store.message: .string(why)])
      case nil: break
      }
      if let dpopKind {
        report[StatusReport.dpopKey] = .dict([
          Store.kind: .string(dpopKind), "summary": .string(dpopSummary ?? ""),
        ])
      }
      return report
    }

    public init(busValue report: [String: BusValue]) {
      storeProblem = nil
      storeKind = StoreKind.secretService.rawValue
      storeNotes = []
      if case .dict(let store)? = report[storeKey] {
        if store[Store.state]?.stringValue == "unavailable" {
          storeProblem = store[Store.message]?.stringValue ?? "unavailable"
        }
        if let kind = store[Store.kind]?.stringValue { storeKind = kind }
        storePath = store[Store.path]?.stringValue
        storeKeyLocation = store[Store.key]?.stringValue
        if case .strings(let notes)? = store[Store.notes] { storeNotes = notes }
      }
      attentionNeeded = []
      if case .strings(let ids)? = report[attentionKey] { attentionNeeded = ids }
      accounts = []
      if case .dicts(let list)? = report[accountsKey] { accounts = list.map(AccountStatus.init(busValue:)) }
      schema = 0
      if case .uint32(let n)? = report[schemaKey] { schema = n }
      version = report[versionKey]?.stringValue ?? ""
      if case .dict(let config)? = report[configKey] { self.config = ConfigStatus(busValue: config) }
      if case .dict(let dpop)? = report[StatusReport.dpopKey] {
        dpopKind = dpop[Store.kind]?.stringValue
        dpopSummary = dpop["summary"]?.stringValue
      }
      if case .dict(let bus)? = report[sessionBusKey] {
        switch bus[Store.state]?.stringValue {
        case "connected": sessionBus = .connected
        case "missing": sessionBus = .missing(bus[Store.message]?.stringValue ?? "")
        default: break
        }
      }
    }
  }
}
