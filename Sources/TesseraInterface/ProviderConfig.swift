/// The `[[provider]]` tables of config.toml: identity providers with a name of their own, each
/// from a built-in profile (ProviderProfiles.swift) or written out.
///
///     [[provider]]
///     name = "work-github"            # what `--provider` takes
///     profile = "github"              # a built-in profile; or discovery/issuer/endpoints below
///     host = "github.example.com"     # a self-managed server (default: the profile's host)
///     client_id = "Iv1.0123456789abcdef"
///     client_secret_file = "/home/me/.config/tessera/work-github.secret"  # 0600, yours
///     client_authentication = "client_secret_post"  # or client_secret_basic, none
///     scopes = ["repo"]
///     authorization_parameters = ["access_type=offline"]
///     dpop = "auto"                   # or "required", "off": tokens bound to this machine
///
/// Without a profile: `discovery = "openid"` or `"oauth"` (RFC 8414) with `issuer`, or
/// `discovery = "none"` with `authorization_endpoint` and `token_endpoint` (and, where the
/// provider has them, `device_authorization_endpoint`, `revocation_endpoint`,
/// `userinfo_endpoint`).
public struct ProviderConfig: Sendable, Equatable {
  public var name: String
  /// The built-in profile's name; nil when everything is written out.
  public var profile: String?
  /// The host of a self-managed server the profile is for; nil: the profile's own.
  public var host: String?
  public var discovery: ProviderDiscovery
  /// The issuer: discovery's base URL, and the identity provider accounts are kept under.
  public var issuer: String
  public var endpoints: ProviderEndpoints
  /// Where the account's id and username come from when there is no id_token or userinfo.
  public var userAPI: ProviderUserAPI?
  public var clientID: String
  /// A file only the user can read, with the client secret (tesserad alone reads it).
  public var clientSecretFile: String?
  /// The line of `client_secret_file`, for a problem with the file itself.
  public var clientSecretFileLine: Int = 0
  public var clientAuthentication: ClientAuthentication
  public var scopes: [String]
  public var authorizationParameters: [ProviderParameter]
  /// What git sends as the username (the profile's convention); nil: the account's.
  public var gitUsername: String?
  /// Where the user revokes the grant by hand, when there is no revocation endpoint.
  public var revokePage: String?
  /// Whether its tokens are bound to a key of this machine (RFC 9449).
  public var dpop: DPoPMode = .auto
  /// Where the table is.
  public var file: String = ""
  /// Whether it comes from the administrator's file (its secret file may be root's and shared).
  public var fromAdministrator = false
  public var line: Int = 0

  public static let keys = [
    "name", "profile", "host", "discovery", "issuer", "authorization_endpoint", "token_endpoint",
    "device_authorization_endpoint", "revocation_endpoint", "userinfo_endpoint", "client_id", "client_secret_file",
    "client_authentication", "scopes", "authorization_parameters", "dpop",
  ]
  /// The longest provider name.
  public static let maxNameBytes = 64

  /// Whether `name` can name a provider: 1 to 64 of A-Z a-z 0-9 . _ -, not starting with '.' or '-'.
  public static func isName(_ name: String) -> Bool {
    !name.isEmpty && name.utf8.count <= maxNameBytes && !name.hasPrefix(".") && !name.hasPrefix("-")
      && name.utf8.allSatisfy {
        $0 < 0x80
          && (isAlphanumeric($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: "-"))
      }
  }

  static func isAlphanumeric(_ byte: UInt8) -> Bool {
    (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
  }

  /// Whether the token request carries a client secret.
  public var hasSecret: Bool { clientSecretFile != nil && clientAuthentication != .none }

  public struct ParseError: Error, Equatable, Sendable {
    public var line: Int
    public var key: String?
    public var reason: String
  }

  /// The `[[provider]]` tables of a parsed file, each checked; a name given twice is a problem of
  /// the second table.
  public static func providers(in file: ConfigFile, path: String) -> ([ProviderConfig], [ParseError]) {
    var providers: [ProviderConfig] = []
    var problems: [ParseError] = []
    for table in file.tables(named: "provider") where table.isArray {
      do {
        var provider = try ProviderConfig(table: table)
        provider.file = path
        if let first = providers.first(where: { $0.name == provider.name }) {
          problems.append(
            ParseError(
              line: table.line, key: "name",
              reason: "'\(provider.name)' names the provider at line \(first.line) already; give each a name of its own"
            ))
          continue
        }
        providers.append(provider)
      } catch {
        problems.append(error)
      }
    }
    return (providers, problems)
  }

  /// What a table says, before a profile fills in the rest.
  struct Written {
    var name: String?
    var profile: ProviderProfile?
    var host: String?
    var discovery: ProviderDiscovery?
    var issuer: String?
    var endpoints = ProviderEndpoints()
    var clientID: String?
    var clientSecretFile: String?
    var clientSecretFileLine = 0
    var clientAuthentication: ClientAuthentication?
    var scopes: [String]?
    var parameters: [ProviderParameter] = []
    var dpop: DPoPMode?
  }

  /// One key of the table, checked on its own.
  static func take(_ entry: ConfigFile.Entry, into written: inout Written) throws(ParseError) {
    func fail(_ reason: String) -> ParseError { ParseError(line: entry.line, key: entry.key, reason: reason) }
    func text(_ limit: Int) throws(ParseError) -> String {
      guard let s = entry.value.string, !s.isEmpty, s.utf8.count <= limit, SafeText.isClean(s) else {
        throw fail("must be a non-empty string of printable characters (at most \(limit) bytes)")
      }
      return s
    }
    func url() throws(ParseError) -> String {
      let s = try text(2048)
      if let why = Self.endpointProblem(s) { throw fail("'\(SafeText.clip(s, limit: 200))' \(why)") }
      return s
    }
    switch entry.key {
    case "name":
      let s = try text(maxNameBytes)
      guard isName(s) else {
        throw fail("'\(s)' cannot name a provider: use the letters A-Z a-z, digits, '.', '_' and '-'")
      }
      written.name = s
    case "profile":
      let s = try text(64)
      guard let profile = ProviderProfile.named(s) else {
        throw fail(
          "unknown profile; "
            + NearestName.suggestion(for: s, among: ProviderProfile.names, known: "the profiles are"))
      }
      written.profile = profile
    case "host":
      let s = try text(255).lowercased()
      guard let (host, path) = GitCredentialRule.split(s), path.isEmpty, !s.contains("://") else {
        throw fail("'\(s)' is not a host name; write the server's name alone, e.g. \"git.example.com\"")
      }
      written.host = host
    case "discovery":
      guard let s = entry.value.string, let discovery = ProviderDiscovery(rawValue: s) else {
        throw fail("must be one of \(ProviderDiscovery.allCases.map(\.rawValue).joined(separator: ", "))")
      }
      written.discovery = discovery
    case "issuer": written.issuer = try url()
    case "authorization_endpoint": written.endpoints.authorization = try url()
    case "token_endpoint": written.endpoints.token = try url()
    case "device_authorization_endpoint": written.endpoints.deviceAuthorization = try url()
    case "revocation_endpoint": written.endpoints.revocation = try url()
    case "userinfo_endpoint": written.endpoints.userinfo = try url()
    case "client_id": written.clientID = try text(ArgumentLimits.clientIDBytes)
    case "client_secret_file":
      let s = try text(4096)
      guard s.hasPrefix("/") else { throw fail("must be an absolute path (tesserad reads it, from any directory)") }
      written.clientSecretFile = s
      written.clientSecretFileLine = entry.line
    case "client_authentication":
      guard let s = entry.value.string, let method = ClientAuthentication(rawValue: s) else {
        throw fail("must be one of \(ClientAuthentication.allCases.map(\.rawValue).joined(separator: ", "))")
      }
      written.clientAuthentication = method
    case "scopes":
      guard let scopes = entry.value.strings, scopes.allSatisfy({ !$0.isEmpty && !$0.contains(" ") }) else {
        throw fail("must be an array of scope strings without spaces")
      }
      written.scopes = scopes
    case "authorization_parameters":
      written.parameters = try parameters(entry.value, fail: fail)
    case "dpop":
      guard let s = entry.value.string, let mode = DPoPMode(rawValue: s) else {
        throw fail("must be one of \(DPoPMode.allCases.map(\.rawValue).joined(separator: ", "))")
      }
      written.dpop = mode
    default:
      throw fail(
        "unknown key; " + NearestName.suggestion(for: entry.key, among: keys, known: "a [[provider]] entry takes"))
    }
  }

  /// Parameters the broker sets itself may not be set here.
  static func parameters(_ value: ConfigFile.Value, fail: (String) -> ParseError) throws(ParseError)
    -> [ProviderParameter]
  {
    guard let list = value.strings else { throw fail("must be an array of \"name=value\" strings") }
    var parameters: [ProviderParameter] = []
    for item in list {
      guard let equals = item.firstIndex(of: "="), equals != item.startIndex, SafeText.isClean(item),
        item.utf8.count <= 1024
      else { throw fail("'\(SafeText.clip(item, limit: 200))' is not \"name=value\"") }
      let name = String(item[..<equals])
      guard !reservedParameters.contains(name) else {
        throw fail("'\(name)' is set by Tessera itself and cannot be set here")
      }
      parameters.append(ProviderParameter(name: name, value: String(item[item.index(after: equals)...])))
    }
    return parameters
  }

  /// What the authorization request's own parameters are (a table may not override them).
  static let reservedParameters: Set<String> = [
    "client_id", "redirect_uri", "response_type", "scope", "state", "nonce", "code_challenge",
    "code_challenge_method", "client_secret",
  ]

  /// Why `url` cannot be an endpoint, or nil: only https, with a host, no credentials or fragment.
  public static func endpointProblem(_ url: String) -> String? {
    guard let (scheme, rest) = GitCredentialRule.schemeSplit(Substring(url)) else {
      return "is not an absolute URL; write e.g. \"https://idp.example.com/oauth/token\""
    }
    guard scheme.lowercased() == "https" else {
      return "uses \(scheme.lowercased()):, and tokens and secrets go only over https; write the https URL"
    }
    let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
    guard !authority.isEmpty, !authority.contains("@") else {
      return "has no host (or has credentials in it); write e.g. \"https://idp.example.com/oauth/token\""
    }
    guard !url.contains("#"), !url.contains(" ") else { return "has a fragment or a space" }
    return nil
  }
}

extension ProviderConfig {
  init(table: ConfigFile.Table) throws(ParseError) {
    var written = Written()
    for entry in table.entries { try Self.take(entry, into: &written) }
    self = try Self.resolve(written, line: table.line)
  }

  /// The table's keys with its profile's filled in, checked as a whole: a name and a client id, an
  /// issuer for discovery, the authorization (or device) and token endpoints without it, a secret
  /// where the profile needs one.
  static func resolve(_ w: Written, line: Int) throws(ParseError) -> ProviderConfig {
    func fail(_ key: String?, _ reason: String) -> ParseError { ParseError(line: line, key: key, reason: reason) }
    guard let name = w.name else {
      throw fail(nil, "has no name; give it one, e.g. name = \"\(w.profile?.name ?? "my-provider")\"")
    }
    guard let clientID = w.clientID else {
      throw fail(
        nil,
        "'\(name)' has no client_id; register an app with the provider and write its client id here"
          + (w.profile.map { " (the README's section on \($0.name) says where)" } ?? ""))
    }
    let profile = w.profile
    if let host = w.host, let profile, !profile.takesHost {
      throw fail(
        "host", "the \(profile.name) profile has one host (\(profile.defaultHost ?? "")); remove host = \"\(host)\"")
    }
    guard let host = w.host ?? profile?.defaultHost ?? (profile == nil ? "" : nil) else {
      throw fail(
        nil, "'\(name)': the \(profile?.name ?? "") profile is for servers of your own; add host = \"git.example.com\"")
    }
    let expand = { (template: String) in profile?.expand(template, host: host) ?? template }
    let discovery = w.discovery ?? profile?.discovery ?? (w.issuer != nil ? .openID : .none)
    var endpoints = ProviderEndpoints()
    let fromProfile = profile?.endpoints ?? ProviderEndpoints()
    endpoints.authorization = w.endpoints.authorization ?? fromProfile.authorization.map(expand)
    endpoints.token = w.endpoints.token ?? fromProfile.token.map(expand)
    endpoints.deviceAuthorization = w.endpoints.deviceAuthorization ?? fromProfile.deviceAuthorization.map(expand)
    endpoints.revocation = w.endpoints.revocation ?? fromProfile.revocation.map(expand)
    endpoints.userinfo = w.endpoints.userinfo ?? fromProfile.userinfo.map(expand)
    let issuer = w.issuer ?? profile.map { expand($0.issuer) }
    if discovery != .none && issuer == nil {
      throw fail(
        "issuer",
        "'\(name)' uses \(discovery.rawValue) discovery and needs issuer = \"https://…\" (the URL its metadata hangs off)"
      )
    }
    if discovery == .none {
      guard endpoints.token != nil, endpoints.authorization != nil || endpoints.deviceAuthorization != nil else {
        let missing = [
          endpoints.authorization == nil && endpoints.deviceAuthorization == nil
            ? "authorization_endpoint (or device_authorization_endpoint)" : nil,
          endpoints.token == nil ? "token_endpoint" : nil,
        ].compactMap { $0 }
        throw fail(
          nil,
          "'\(name)' has no metadata document (discovery = \"none\") and lacks \(missing.joined(separator: " and ")); write them out, or set discovery = \"openid\" or \"oauth\" with issuer"
        )
      }
    }
    let authentication =
      w.clientAuthentication
      ?? (w.clientSecretFile == nil ? .none : profile?.clientAuthentication ?? .clientSecretBasic)
    if authentication != .none && w.clientSecretFile == nil {
      throw fail(
        "client_authentication",
        "'\(name)' authenticates with \(authentication.rawValue) but has no client_secret_file; add one, or set client_authentication = \"none\" for a public client"
      )
    }
    if let profile, profile.secretRequired, w.clientSecretFile == nil {
      throw fail(
        nil,
        "'\(name)': \(profile.name) signs in only with the app's client secret; write it to a file only you can read and add client_secret_file = \"/path/to/it\" (`tessera provider add` does both)"
      )
    }
    var provider = ProviderConfig(
      name: name, profile: profile?.name, host: w.host, discovery: discovery, issuer: issuer ?? "https://\(host)",
      endpoints: endpoints,
      userAPI: profile?.userAPI.map { api in
        ProviderUserAPI(url: expand(api.url), idField: api.idField, usernameField: api.usernameField)
      }, clientID: clientID, clientSecretFile: w.clientSecretFile, clientAuthentication: authentication,
      scopes: w.scopes ?? profile?.defaultScopes ?? [],
      authorizationParameters: (profile?.authorizationParameters ?? []).filter { p in
        !w.parameters.contains { $0.name == p.name }
      } + w.parameters,
      gitUsername: profile?.gitUsername, revokePage: profile?.revokePage.map(expand))
    provider.clientSecretFileLine = w.clientSecretFileLine
    provider.line = line
    provider.dpop = w.dpop ?? .auto
    if discovery == .none, let issuerURL = w.issuer ?? (profile == nil ? endpoints.token.map(Self.origin) : nil) {
      provider.issuer = issuerURL
    }
    return provider
  }

  /// `https://host[:port]` of an endpoint: the issuer of a provider written out without one.
  static func origin(_ url: String) -> String {
    guard let (scheme, rest) = GitCredentialRule.schemeSplit(Substring(url)) else { return url }
    return "\(scheme)://" + rest.prefix { $0 != "/" && $0 != "?" }
  }

  /// The git host a profile's provider serves (github.com, a GitLab server): nil for a provider
  /// with no git profile.
  public var gitHost: String? {
    guard let profile, let known = ProviderProfile.named(profile), known.userAPI != nil else { return nil }
    return host ?? known.defaultHost
  }
}
