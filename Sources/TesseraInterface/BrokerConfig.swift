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
  /// Where accounts and tokens are kept (docs/storage.md): chosen once, when tesserad starts.
  public var store: StoreChoice = .auto

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
  }

  /// `store`: where tesserad keeps accounts and tokens.
  public enum StoreChoice: String, CaseIterable, Sendable, Equatable {
    /// The Secret Service when one answers at start with an unlocked default collection, else the
    /// file store (and the file store while it holds items: one store per start, never both).
    case auto
    case secretService = "secret-service"
    /// Sealed files under $XDG_STATE_HOME/tessera/store (FileStore).
    case file
    /// Nothing written: a restart needs a new sign-in.
    case memory
  }

  /// The top-level keys, in the table's order.
  public static let keys: [String] = Key.allCases.map(\.rawValue)
  /// The `[[name]]` tables config.toml may hold.
  public static let tableNames = ["git"]
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
  /// reading, so it comes alone.
  public static func parse(bytes: [UInt8], path: String = "config.toml") throws(ConfigProblems) -> BrokerConfig {
    let file: ConfigFile
    do {
      file = try ConfigFile(parsing: bytes)
    } catch {
      throw ConfigProblems([ConfigProblem(path: path, line: error.line, reason: error.reason)])
    }
    var config = BrokerConfig()
    var problems: [ConfigProblem] = []
    for entry in file.entries {
      guard let key = Key(rawValue: entry.key) else {
        problems.append(
          ConfigProblem(
            path: path, line: entry.line, key: entry.key,
            reason: "unknown key; " + NearestName.suggestion(for: entry.key, among: keys)))
        continue
      }
      do { try config.set(key, entry.value) } catch {
        problems.append(ConfigProblem(path: path, line: entry.line, key: entry.key, reason: error.reason))
      }
    }
    for table in file.tables where !tableNames.contains(table.name) {
      problems.append(
        ConfigProblem(
          path: path, line: table.line, key: table.name, kind: .table,
          reason: "unknown table; "
            + NearestName.suggestion(
              for: table.name, among: tableNames, quoted: { "[[\($0)]]" }, listed: { "[[\($0)]]" },
              known: tableNames.count == 1 ? "the only table is" : "the only tables are")))
    }
    for table in file.tables(named: "git") {
      do { config.gitRules.append(try GitCredentialRule(table: table)) } catch {
        problems.append(
          ConfigProblem(path: path, line: error.line, key: error.key, kind: .inTable("git"), reason: error.reason))
      }
    }
    guard problems.isEmpty else { throw ConfigProblems(problems.sorted { ($0.line ?? 0) < ($1.line ?? 0) }) }
    return config
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
    case .store:
      guard let s = value.string, let choice = StoreChoice(rawValue: s) else {
        throw fail("must be one of \(StoreChoice.allCases.map(\.rawValue).joined(separator: ", "))")
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
