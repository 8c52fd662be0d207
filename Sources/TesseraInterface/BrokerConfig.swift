/// config.toml, checked: the daemon's settings and the helpers' `[[git]]` entries.
///
/// The one check of the file. tesserad runs it before it starts (and refuses to start on any
/// problem, exit 78); `tessera config check`, `tessera git-credential` and the CLI's diagnosis of a
/// broker that would not start run the very same one. The rule, for every reader: anything the file
/// holds that Tessera does not know or cannot use (bad TOML, an unknown key or table, a wrong type,
/// a bad value, a mistake in a `[[git]]` entry) is an error naming the file, the line and the key.
public struct BrokerConfig: Sendable, Equatable {
  public var defaultAuthority: String = "https://login.microsoftonline.com/common"
  public var defaultClientID: String = ""
  public var defaultScopes: [String] = []
  public var trustedAuthorities: [String] = []
  public var caFile: String?
  /// Whether ca_file is also trusted for Microsoft's hosts (behind a TLS-inspecting proxy).
  public var caFileForMicrosoft = false
  public var browser: String?
  public var redirectPort: UInt16 = 0
  public var allowInsecureLoopback = false
  public var logLevel: String = "info"
  /// Client capabilities announced to Entra in every request's claims (e.g. "cp1" for CAE).
  public var clientCapabilities: [String] = []
  /// Whether tesserad also serves Microsoft's broker protocol as com.microsoft.identity.broker1.
  public var microsoftBroker = true
  /// Per-app access control (issue 11): open, confirm (the default) or strict.
  public var accessMode: AccessMode = .confirm
  /// Whether a desktop notification says so the first time an app uses an account.
  public var notifyFirstUse = true
  /// The `[[git]]` tables: which git hosts get tokens, for which client (tessera git-credential).
  public var gitRules: [GitCredentialRule] = []
  /// The `[[provider]]` tables: identity providers by name, from a profile or written out.
  public var providers: [ProviderConfig] = []
  /// Where accounts and tokens are kept (docs/storage.md): chosen once, when tesserad starts.
  public var store: StoreChoice = .auto
  /// DPoP for the authorities no `[[provider]]` names (the default authority among them).
  public var dpop: DPoPMode = .auto

  public init() {}

  /// The one table of config.toml's top-level keys: each case is a key, and `set` (an exhaustive
  /// switch) says what it takes.
  public enum Key: String, CaseIterable, Sendable {
    case defaultAuthority = "default_authority"
    case defaultClientID = "default_client_id"
    case defaultScopes = "default_scopes"
    case trustedAuthorities = "trusted_authorities"
    case caFile = "ca_file"
    case caFileForMicrosoft = "ca_file_for_microsoft"
    case browser
    case redirectPort = "redirect_port"
    case allowInsecureLoopback = "allow_insecure_loopback"
    case logLevel = "log_level"
    case clientCapabilities = "client_capabilities"
    case microsoftBroker = "microsoft_broker"
    case accessMode = "access_mode"
    case notifyFirstUse = "notify_first_use"
    case store
    case dpop
  }

  /// `store`: where tesserad keeps accounts and tokens: `auto`, or one store.
  public enum StoreChoice: Sendable, Equatable {
    /// The Secret Service when one answers at start with an unlocked default collection, else the
    /// file store (and the file store while it holds items: one store per start, never both).
    case auto
    /// This store and no other.
    case only(StoreKind)

    /// As config.toml writes it: "auto", or the store's name.
    public init?(rawValue: String) {
      if rawValue == "auto" {
        self = .auto
      } else if let kind = StoreKind(rawValue: rawValue) {
        self = .only(kind)
      } else {
        return nil
      }
    }

    public var rawValue: String { kind?.rawValue ?? "auto" }
    /// The store chosen; nil for `auto`.
    public var kind: StoreKind? {
      if case .only(let kind) = self { return kind }
      return nil
    }
    /// Every value config.toml may give `store`.
    public static let names = ["auto"] + StoreKind.allCases.map(\.rawValue)
  }

  /// The top-level keys, in the table's order.
  public static let keys: [String] = Key.allCases.map(\.rawValue)
  /// The `[[name]]` tables config.toml may hold.
  public static let tableNames = ["git", "provider"]
  /// The `[name]` tables: `[policy]`, in the administrator's files only.
  public static let sectionNames = ["policy"]
  public static let logLevels = ["trace", "debug", "info", "notice", "warning", "error", "critical"]
  /// tesserad reads at most this much of config.toml; a larger file is refused (never cut).
  public static let maxFileBytes = 16 << 20

  /// The default location, honouring XDG_CONFIG_HOME.
  public static func defaultPath(environment: [String: String]) -> String {
    ConfigLocation.defaultPath(environment: environment)
  }

  /// Checks a config file's text. Problems name the line and the key.
  public static func parse(_ text: String, path: String = "config.toml") throws(ConfigProblems) -> BrokerConfig {
    try parse(bytes: Array(text.utf8), path: path)
  }

  /// Checks a config file's bytes as read from disk (which must be UTF-8): every problem the file
  /// has, each with its line, or the settings when there is none. A TOML syntax error stops the
  /// reading, so it comes alone. The file is read as a user's file (no `[policy]`), on its own:
  /// `ConfigFiles` layers it over the administrator's files.
  public static func parse(bytes: [UInt8], path: String = "config.toml") throws(ConfigProblems) -> BrokerConfig {
    let layer = try ConfigLayer.parse(bytes: bytes, path: path, isSystem: false)
    return try EffectiveConfig.combine(system: [], user: layer).config
  }

  /// The value a key has, as config.toml writes it; nil for an optional key that is not set.
  public func value(of key: Key) -> ConfigFile.Value? {
    func strings(_ list: [String]) -> ConfigFile.Value { .array(list.map { .string($0) }) }
    return switch key {
    case .defaultAuthority: .string(defaultAuthority)
    case .defaultClientID: .string(defaultClientID)
    case .defaultScopes: strings(defaultScopes)
    case .trustedAuthorities: strings(trustedAuthorities)
    case .caFile: caFile.map { .string($0) }
    case .caFileForMicrosoft: .bool(caFileForMicrosoft)
    case .browser: browser.map { .string($0) }
    case .redirectPort: .integer(Int64(redirectPort))
    case .allowInsecureLoopback: .bool(allowInsecureLoopback)
    case .logLevel: .string(logLevel)
    case .clientCapabilities: strings(clientCapabilities)
    case .microsoftBroker: .bool(microsoftBroker)
    case .accessMode: .string(accessMode.rawValue)
    case .notifyFirstUse: .bool(notifyFirstUse)
    case .store: .string(store.rawValue)
    case .dpop: .string(dpop.rawValue)
    }
  }

  /// Why a value cannot be used for its key.
  struct Refusal: Error {
    var reason: String
  }

  /// Takes `value` for `key`, checked: the type, the allowed values and ranges, authority URLs.
  mutating func set(_ key: Key, _ value: ConfigFile.Value) throws(Refusal) {
    func fail(_ reason: String) -> Refusal { Refusal(reason: reason) }
    func flag() throws(Refusal) -> Bool {
      guard let b = value.bool else { throw fail("must be true or false") }
      return b
    }
    func strings() throws(Refusal) -> [String] {
      guard let strings = value.strings else { throw fail("must be an array of strings") }
      return strings
    }
    switch key {
    case .defaultAuthority:
      guard let s = value.string else { throw fail("must be a string URL") }
      if let why = AuthoritySyntax.problem(s) {
        throw fail("'\(SafeText.clip(s, limit: 200))' is not usable: \(why); use a URL like \(AuthoritySyntax.example)")
      }
      defaultAuthority = s
    case .defaultClientID:
      guard let s = value.string else { throw fail("must be a string") }
      defaultClientID = s
    case .defaultScopes: defaultScopes = try strings()
    case .clientCapabilities: clientCapabilities = try strings()
    case .trustedAuthorities:
      let list = try strings()
      for s in list {
        if let why = AuthoritySyntax.problem(s) {
          throw fail("'\(SafeText.clip(s, limit: 200))' is not usable: \(why); use a URL like https://idp.example.com/")
        }
      }
      trustedAuthorities = list
    case .caFile:
      guard let s = value.string, s.hasPrefix("/") else { throw fail("must be an absolute path") }
      caFile = s
    case .caFileForMicrosoft: caFileForMicrosoft = try flag()
    case .browser:
      guard let s = value.string, s.contains(where: { !$0.isWhitespace }) else {
        throw fail("must be a non-empty command")
      }
      browser = s
    case .redirectPort:
      guard let n = value.integer, (0...65535).contains(n) else { throw fail("must be a port number 0–65535") }
      redirectPort = UInt16(n)
    case .allowInsecureLoopback: allowInsecureLoopback = try flag()
    case .microsoftBroker: microsoftBroker = try flag()
    case .accessMode:
      guard let s = value.string, let mode = AccessMode(rawValue: s) else {
        throw fail("must be one of \(AccessMode.allCases.map(\.rawValue).joined(separator: ", "))")
      }
      accessMode = mode
    case .notifyFirstUse: notifyFirstUse = try flag()
    case .dpop:
      guard let s = value.string, let mode = DPoPMode(rawValue: s) else {
        throw fail("must be one of \(DPoPMode.allCases.map(\.rawValue).joined(separator: ", "))")
      }
      dpop = mode
    case .store:
      guard let s = value.string, let choice = StoreChoice(rawValue: s) else {
        throw fail("must be one of \(StoreChoice.names.joined(separator: ", "))")
      }
      store = choice
    case .logLevel:
      guard let s = value.string, Self.logLevels.contains(s) else {
        throw fail("must be one of \(Self.logLevels.joined(separator: ", "))")
      }
      logLevel = s
    }
  }
}

/// One thing config.toml gets wrong: where (the file, the line, the key or table) and why.
public struct ConfigProblem: Error, Equatable, Sendable, CustomStringConvertible {
  /// What `key` names.
  public enum Kind: Equatable, Sendable {
    /// A top-level key (or nothing, when `key` is nil: a TOML syntax error, an unreadable file).
    case topLevel
    /// A `[[name]]` table's header: `key` is the table's name.
    case table
    /// A key of a `[[name]]` entry (or the entry as a whole, when `key` is nil).
    case inTable(String)
    /// A `[name]` table's header: `key` is the table's name.
    case section
    /// A key of the `[name]` table.
    case inSection(String)
  }

  public var path: String
  /// nil when the problem is the file itself (unreadable, too large).
  public var line: Int?
  /// The key (or the table's name) as written in the file; nil for a syntax error.
  public var key: String?
  public var kind: Kind
  public var reason: String

  public init(path: String, line: Int?, key: String? = nil, kind: Kind = .topLevel, reason: String) {
    self.path = path
    self.line = line
    self.key = key
    self.kind = kind
    self.reason = reason
  }

  /// What is wrong, without the file and line: "key 'default_scope': unknown key; did you mean
  /// 'default_scopes'?", "table [[gti]]: unknown table; did you mean [[git]]?", "[[git]] key 'urll': …".
  public var message: String {
    // A quoted key may hold any character: shown safely, on one line.
    let key = key.map { SafeText.clip($0, limit: 200) }
    return switch kind {
    case .topLevel: (key.map { "key '\($0)': " } ?? "") + reason
    case .table: "table [[\(key ?? "")]]: " + reason
    case .inTable(let table): "[[\(table)]] " + (key.map { "key '\($0)': " } ?? "") + reason
    case .section: "table [\(key ?? "")]: " + reason
    case .inSection(let table): "[\(table)] " + (key.map { "key '\($0)': " } ?? "") + reason
    }
  }

  /// "PATH:LINE: message" (the form compilers use, so editors can jump to it).
  public var description: String { path + (line.map { ":\($0)" } ?? "") + ": " + message }
}

/// Every problem a config file has, in the order of their lines.
public struct ConfigProblems: Error, Equatable, Sendable, CustomStringConvertible {
  public var problems: [ConfigProblem]

  public init(_ problems: [ConfigProblem]) { self.problems = problems }

  /// One problem per line.
  public var description: String { problems.map(\.description).joined(separator: "\n") }
}

/// Where config.toml is: --config, else $TESSERA_CONFIG, else $XDG_CONFIG_HOME/tessera/config.toml
/// (~/.config when XDG_CONFIG_HOME is unset or relative).
public enum ConfigLocation {
  /// The administrator's files: config.toml and config.d/*.toml, read before the user's.
  public static let systemDirectory = "/etc/tessera"

  /// `systemDirectory`, or $TESSERA_SYSTEM_CONFIG_DIR when it is an absolute path (for tests and
  /// for trying a policy out before installing it; the policy is the administrator's guard for a
  /// user's own daemon, not a wall against that user: see docs/threat-model.md).
  public static func systemDirectory(environment: [String: String]) -> String {
    if let dir = environment["TESSERA_SYSTEM_CONFIG_DIR"], dir.hasPrefix("/") { return dir }
    return systemDirectory
  }

  public static func defaultPath(environment: [String: String]) -> String {
    if let xdg = environment["XDG_CONFIG_HOME"], xdg.hasPrefix("/") { return xdg + "/tessera/config.toml" }
    return (environment["HOME"] ?? "") + "/.config/tessera/config.toml"
  }

  public static func path(option: String?, environment: [String: String]) -> String {
    if let option, !option.isEmpty { return option }
    if let path = environment["TESSERA_CONFIG"], !path.isEmpty { return path }
    return defaultPath(environment: environment)
  }

  /// Whether the file was named (--config or $TESSERA_CONFIG): then it must exist. At the default
  /// path, no file means the defaults.
  public static func isNamed(option: String?, environment: [String: String]) -> Bool {
    !(option ?? "").isEmpty || !(environment["TESSERA_CONFIG"] ?? "").isEmpty
  }
}

/// `dpop`: whether tokens are bound to a key of this machine (RFC 9449), for an authority or a
/// `[[provider]]`.
public enum DPoPMode: String, CaseIterable, Sendable, Equatable, Codable {
  /// Bound where the server's metadata lists ES256 in `dpop_signing_alg_values_supported`;
  /// bearer tokens elsewhere.
  case auto
  /// Bound, or no token at all: a server that does not bind is refused, with a message that says so.
  case required
  /// Bearer tokens: for servers whose tokens go to helpers that cannot send proofs (git, kubectl,
  /// mail).
  case off
}
