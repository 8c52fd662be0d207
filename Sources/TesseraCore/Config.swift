/// The daemon's configuration: `$XDG_CONFIG_HOME/tessera/config.toml`.
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
  /// What the file got wrong that does not stop the daemon (the helpers' tables), with the line.
  public var warnings: [String] = []

  public init() {}

  public static let keys: [String] = [
    "default_authority", "default_client_id", "default_scopes", "trusted_authorities", "ca_file",
    "ca_file_for_microsoft",
    "browser", "redirect_port", "allow_insecure_loopback", "log_level", "client_capabilities",
    "microsoft_broker", "access_mode", "notify_first_use",
  ]
  public static let tableNames = ["git"]
  public static let logLevels = ["trace", "debug", "info", "notice", "warning", "error", "critical"]

  public struct ParseError: Error, CustomStringConvertible, Equatable {
    public var path: String
    public var line: Int?
    public var key: String?
    public var reason: String
    /// "line N: key 'K': reason", for a warning logged with the path in front.
    public var located: String {
      (line.map { "line \($0): " } ?? "") + (key.map { "key '\($0)': " } ?? "") + reason
    }
    public var description: String {
      var where_ = path
      if let line { where_ += ":\(line)" }
      return "\(where_): " + (key.map { "key '\($0)': " } ?? "") + reason
    }
  }

  /// The default location, honouring XDG_CONFIG_HOME.
  public static func defaultPath(environment: [String: String]) -> String {
    ConfigLocation.defaultPath(environment: environment)
  }

  /// Parses a config file's text. Errors name the line and the key.
  public static func parse(_ text: String, path: String = "config.toml") throws(ParseError) -> BrokerConfig {
    try parse(bytes: Array(text.utf8), path: path)
  }

  /// Parses a config file's bytes as read from disk (which must be UTF-8).
  public static func parse(bytes: [UInt8], path: String = "config.toml") throws(ParseError) -> BrokerConfig {
    let file: ConfigFile
    do {
      file = try ConfigFile(parsing: bytes)
    } catch {
      throw ParseError(path: path, line: error.line, key: nil, reason: error.reason)
    }
    var config = BrokerConfig()
    for entry in file.entries {
      let key = entry.key
      let value = entry.value
      func fail(_ reason: String) -> ParseError { ParseError(path: path, line: entry.line, key: key, reason: reason) }
      switch key {
      case "default_authority":
        guard let s = value.string else { throw fail("must be a string URL") }
        do { _ = try Authority(parsing: s) } catch { throw fail((error as? TesseraError)?.message ?? "\(error)") }
        config.defaultAuthority = s
      case "default_client_id":
        guard let s = value.string else { throw fail("must be a string") }
        config.defaultClientID = s
      case "default_scopes", "trusted_authorities", "client_capabilities":
        guard let array = value.array else { throw fail("must be an array of strings") }
        var strings: [String] = []
        for element in array {
          guard let s = element.string else { throw fail("must be an array of strings") }
          strings.append(s)
        }
        if key == "default_scopes" {
          config.defaultScopes = strings
        } else if key == "client_capabilities" {
          config.clientCapabilities = strings
        } else {
          for s in strings {
            do { _ = try Authority(parsing: s) } catch { throw fail("'\(s)' is not an https URL") }
          }
          config.trustedAuthorities = strings
        }
      case "ca_file":
        guard let s = value.string, s.hasPrefix("/") else { throw fail("must be an absolute path") }
        config.caFile = s
      case "ca_file_for_microsoft":
        guard let b = value.bool else { throw fail("must be true or false") }
        config.caFileForMicrosoft = b
      case "browser":
        guard let s = value.string, s.contains(where: { !$0.isWhitespace }) else {
          throw fail("must be a non-empty command")
        }
        config.browser = s
      case "redirect_port":
        guard let n = value.integer, (0...65535).contains(n) else { throw fail("must be a port number 0–65535") }
        config.redirectPort = UInt16(n)
      case "allow_insecure_loopback":
        guard let b = value.bool else { throw fail("must be true or false") }
        config.allowInsecureLoopback = b
      case "microsoft_broker":
        guard let b = value.bool else { throw fail("must be true or false") }
        config.microsoftBroker = b
      case "access_mode":
        guard let s = value.string, let mode = AccessMode(rawValue: s) else {
          throw fail("must be one of \(AccessMode.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        config.accessMode = mode
      case "notify_first_use":
        guard let b = value.bool else { throw fail("must be true or false") }
        config.notifyFirstUse = b
      case "log_level":
        guard let s = value.string, logLevels.contains(s) else {
          throw fail("must be one of \(logLevels.joined(separator: ", "))")
        }
        config.logLevel = s
      default:
        throw fail("unknown key; known keys are \(keys.joined(separator: ", "))")
      }
    }
    // The [[git]] tables are the git credential helper's (tessera git-credential reads them). The
    // daemon checks them too, so a mistake shows at start with its line, but only as a warning:
    // a typo in a git entry must not take tokens away from every other app.
    for table in file.tables where !tableNames.contains(table.name) {
      config.warnings.append(
        ParseError(
          path: path, line: table.line, key: nil,
          reason:
            "unknown table [[\(table.name)]], ignored; the only tables are \(tableNames.map { "[[\($0)]]" }.joined(separator: ", "))"
        ).located)
    }
    do { config.gitRules = try GitCredentialRule.rules(in: file) } catch {
      config.warnings.append(
        ParseError(
          path: path, line: error.line, key: error.key,
          reason: "[[git]] entries ignored (tessera git-credential reports this too): " + error.reason
        ).located)
    }
    return config
  }

  public var authorityPolicy: AuthorityPolicy {
    AuthorityPolicy(
      trusted: trustedAuthorities.compactMap { try? Authority(parsing: $0) },
      allowInsecureLoopback: allowInsecureLoopback)
  }
}
