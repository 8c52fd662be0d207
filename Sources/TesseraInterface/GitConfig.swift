/// The `[[git]]` tables of config.toml: which hosts get a token from which app registration. Shared:
/// the CLI's git credential helper reads them; a mistake in one is a problem of the whole file
/// (BrokerConfig.parse), for tesserad as for the CLI.
/// git's own protocol is the CLI's (TesseraCLI/GitCredential.swift).

/// One `[[git]]` entry of config.toml.
///
///     [[git]]
///     url = "https://git.example.com/team/"   # or a bare host, "git.example.com"
///     client_id = "…"                          # default: default_client_id
///     authority = "https://…"                  # default: default_authority
///     scopes = ["…"]                           # default: default_scopes
///     username = "oauth2"                      # what git sends as the user; default: the account's
///     account = "alice@contoso.com"            # which signed-in account; default: the only one
public struct GitCredentialRule: Sendable, Equatable {
  public var host: String
  /// The path prefix ("team/repo"), without slashes at either end; empty for the whole host.
  public var pathPrefix: String
  public var clientID: String
  public var authority: String?
  public var scopes: [String]
  public var username: String?
  public var account: String?
  public var line: Int
  /// The file the entry is in (the administrator's or the user's); empty when not read from one.
  public var file: String = ""

  public static let keys = ["url", "client_id", "authority", "scopes", "username", "account"]

  public init(
    host: String, pathPrefix: String = "", clientID: String = "", authority: String? = nil, scopes: [String] = [],
    username: String? = nil, account: String? = nil, line: Int = 0
  ) {
    self.host = host.lowercased()
    self.pathPrefix = pathPrefix
    self.clientID = clientID
    self.authority = authority
    self.scopes = scopes
    self.username = username
    self.account = account
    self.line = line
  }

  public struct ParseError: Error, Equatable, Sendable, CustomStringConvertible {
    public var line: Int
    public var key: String?
    public var reason: String
    public var description: String { "line \(line): [[git]] " + (key.map { "key '\($0)': " } ?? "") + reason }
  }

  /// The `[[git]]` tables of a parsed config.toml, each checked.
  public static func rules(in file: ConfigFile) throws(ParseError) -> [GitCredentialRule] {
    var rules: [GitCredentialRule] = []
    for table in file.tables(named: "git") { rules.append(try GitCredentialRule(table: table)) }
    return rules
  }

  init(table: ConfigFile.Table) throws(ParseError) {
    var url: String?
    var rule = GitCredentialRule(host: "", line: table.line)
    for entry in table.entries {
      func fail(_ reason: String) -> ParseError { ParseError(line: entry.line, key: entry.key, reason: reason) }
      func text(_ limit: Int) throws(ParseError) -> String {
        guard let s = entry.value.string, !s.isEmpty, s.utf8.count <= limit, SafeText.isClean(s) else {
          throw fail("must be a non-empty string of printable characters (at most \(limit) bytes)")
        }
        return s
      }
      switch entry.key {
      case "url": url = try text(2048)
      case "client_id": rule.clientID = try text(ArgumentLimits.clientIDBytes)
      case "authority": rule.authority = try text(2048)
      case "username": rule.username = try text(512)
      case "account": rule.account = try text(ArgumentLimits.accountIDBytes)
      case "scopes":
        guard let scopes = entry.value.strings, scopes.allSatisfy({ !$0.isEmpty && !$0.contains(" ") }) else {
          throw fail("must be an array of scope strings without spaces")
        }
        rule.scopes = scopes
      default:
        throw fail(
          "unknown key; "
            + NearestName.suggestion(
              for: entry.key, among: Self.keys, known: "a [[git]] entry takes"))
      }
    }
    guard let url else {
      throw ParseError(
        line: table.line, key: nil,
        reason: "has no url; write the host or URL prefix it is for, e.g. url = \"https://git.example.com/\"")
    }
    guard let (host, path) = Self.split(url) else {
      throw ParseError(
        line: table.line, key: "url",
        reason:
          "'\(url)' is not an https URL or a host name; write e.g. \"https://git.example.com/team/\" or \"git.example.com\""
      )
    }
    rule.host = host
    rule.pathPrefix = path
    self = rule
  }

  /// "https://Host:443/a/b/" → ("host:443", "a/b"); "host" → ("host", ""). Only https: a token
  /// never goes to a plain-HTTP remote.
  static func split(_ url: String) -> (String, String)? {
    var rest = Substring(url)
    if let (scheme, after) = Self.schemeSplit(rest) {
      guard scheme.lowercased() == "https" else { return nil }
      rest = after
    }
    let host = rest.prefix { $0 != "/" }
    guard !host.isEmpty, !host.contains("@"), !host.contains("?"), !host.contains("#"),
      host.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-.:[]_".contains($0)) })
    else { return nil }
    let path = rest.dropFirst(host.count).split(separator: "/").joined(separator: "/")
    return (host.lowercased(), path)
  }

  /// "scheme://rest" → ("scheme", "rest"); nil without "://".
  public static func schemeSplit(_ text: Substring) -> (Substring, Substring)? {
    guard let colon = text.firstIndex(of: ":") else { return nil }
    let after = text[text.index(after: colon)...]
    guard after.hasPrefix("//") else { return nil }
    return (text[..<colon], after.dropFirst(2))
  }
}
