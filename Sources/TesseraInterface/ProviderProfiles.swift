/// The built-in provider profiles: each provider's endpoints and quirks, as its public documentation
/// gives them, so that a user supplies only what only they can have (their app's client id, and its
/// secret where the provider demands one). One table: `ProviderProfile.all`.
public struct ProviderProfile: Sendable, Equatable {
  /// `profile = "…"` in a `[[provider]]` table.
  public var name: String
  /// The host when `host` is not given; nil when the profile is for self-managed servers only.
  public var defaultHost: String?
  /// Where the endpoints come from, with `{host}` for the host.
  public var discovery: ProviderDiscovery
  /// The issuer for discovery, or the base the endpoints below hang off: `https://{host}…`.
  public var issuer: String
  /// The endpoints written out, for a provider without a metadata document (with `{host}` and
  /// `{api}` for its API host).
  public var endpoints: ProviderEndpoints
  /// The API host, when the provider's API is on a host of its own (`api.github.com`); `{host}`
  /// for a self-managed server's API under its own host.
  public var apiHost: String?
  /// How the client authenticates at the token endpoint when it has a secret.
  public var clientAuthentication: ClientAuthentication
  /// Whether a sign-in needs the client secret (Google's desktop clients, Bitbucket's consumers).
  public var secretRequired: Bool
  /// The scopes asked for when neither the caller nor the table names any: what git needs.
  public var defaultScopes: [String]
  /// Parameters the authorization request always carries (Google: `access_type=offline`).
  public var authorizationParameters: [ProviderParameter]
  /// Where the account's stable id and name come from when there is no id_token.
  public var userAPI: ProviderUserAPI?
  /// What git sends as the username with the token as its password (nil: any name will do, and
  /// the account's username is sent).
  public var gitUsername: String?
  /// Where a user revokes the grant by hand, for a provider with no revocation endpoint
  /// (`{client_id}`: the app's client id; `tessera logout` fills it in).
  public var revokePage: String?
  /// Whether the profile works with a host the user names (self-managed servers).
  public var takesHost: Bool

  public static let github = ProviderProfile(
    name: "github", defaultHost: "github.com", discovery: .none, issuer: "https://{host}",
    endpoints: ProviderEndpoints(
      authorization: "https://{host}/login/oauth/authorize", token: "https://{host}/login/oauth/access_token",
      deviceAuthorization: "https://{host}/login/device/code"),
    apiHost: "{api}", clientAuthentication: .clientSecretPost, secretRequired: false, defaultScopes: ["repo"],
    authorizationParameters: [],
    userAPI: ProviderUserAPI(url: "https://{api}/user", idField: "id", usernameField: "login"), gitUsername: nil,
    revokePage: "https://{host}/settings/connections/applications/{client_id}", takesHost: true)

  public static let gitlab = ProviderProfile(
    name: "gitlab", defaultHost: "gitlab.com", discovery: .openID, issuer: "https://{host}",
    endpoints: ProviderEndpoints(), apiHost: nil, clientAuthentication: .clientSecretPost, secretRequired: false,
    defaultScopes: ["openid", "read_repository", "write_repository"], authorizationParameters: [],
    userAPI: ProviderUserAPI(url: "https://{host}/api/v4/user", idField: "id", usernameField: "username"),
    gitUsername: "oauth2", revokePage: nil, takesHost: true)

  public static let google = ProviderProfile(
    name: "google", defaultHost: "accounts.google.com", discovery: .openID, issuer: "https://accounts.google.com",
    endpoints: ProviderEndpoints(), apiHost: nil, clientAuthentication: .clientSecretPost, secretRequired: true,
    defaultScopes: ["openid", "email", "profile"],
    authorizationParameters: [ProviderParameter(name: "access_type", value: "offline")], userAPI: nil,
    gitUsername: nil, revokePage: nil, takesHost: false)

  public static let bitbucket = ProviderProfile(
    name: "bitbucket", defaultHost: "bitbucket.org", discovery: .none, issuer: "https://bitbucket.org",
    endpoints: ProviderEndpoints(
      authorization: "https://bitbucket.org/site/oauth2/authorize",
      token: "https://bitbucket.org/site/oauth2/access_token"),
    apiHost: "api.bitbucket.org", clientAuthentication: .clientSecretBasic, secretRequired: true,
    defaultScopes: ["repository", "repository:write"], authorizationParameters: [],
    userAPI: ProviderUserAPI(url: "https://api.bitbucket.org/2.0/user", idField: "uuid", usernameField: "nickname"),
    gitUsername: "x-token-auth", revokePage: "https://bitbucket.org/account/settings/app-authorizations/",
    takesHost: false)

  /// Gitea, and Forgejo (its fork) and Codeberg (a Forgejo): OpenID Connect with discovery.
  static func gitea(_ name: String, host: String?) -> ProviderProfile {
    ProviderProfile(
      name: name, defaultHost: host, discovery: .openID, issuer: "https://{host}", endpoints: ProviderEndpoints(),
      apiHost: nil, clientAuthentication: .clientSecretPost, secretRequired: false,
      defaultScopes: ["openid", "profile", "read:repository", "write:repository"], authorizationParameters: [],
      userAPI: ProviderUserAPI(url: "https://{host}/api/v1/user", idField: "id", usernameField: "login"),
      gitUsername: nil, revokePage: "https://{host}/user/settings/applications", takesHost: true)
  }

  public static let microsoft = ProviderProfile(
    name: "microsoft", defaultHost: "login.microsoftonline.com", discovery: .openID,
    issuer: "https://login.microsoftonline.com/organizations", endpoints: ProviderEndpoints(), apiHost: nil,
    clientAuthentication: .clientSecretPost, secretRequired: false, defaultScopes: [], authorizationParameters: [],
    userAPI: nil, gitUsername: nil, revokePage: nil, takesHost: false)

  /// Every profile, in the order `tessera provider` lists them.
  public static let all: [ProviderProfile] = [
    github, gitlab, google, bitbucket, gitea("gitea", host: "gitea.com"), gitea("forgejo", host: nil),
    gitea("codeberg", host: "codeberg.org"), microsoft,
  ]

  public static func named(_ name: String) -> ProviderProfile? { all.first { $0.name == name } }
  public static var names: [String] { all.map(\.name) }

  /// The API host of `host` for this profile: api.github.com for github.com, HOST/api/v3 for a
  /// GitHub Enterprise Server.
  func apiBase(host: String) -> String {
    guard name == "github" else { return host }
    return host == "github.com" ? "api.github.com" : host + "/api/v3"
  }

  /// `template` with `{host}` and `{api}` filled in.
  func expand(_ template: String, host: String) -> String {
    template.replacing("{host}", with: host).replacing("{api}", with: apiBase(host: host))
  }
}

/// Where a provider's endpoints come from.
public enum ProviderDiscovery: String, CaseIterable, Sendable, Equatable {
  /// OpenID Connect discovery: `{issuer}/.well-known/openid-configuration`.
  case openID = "openid"
  /// RFC 8414 metadata: `{issuer}/.well-known/oauth-authorization-server`.
  case oauth
  /// The endpoints written out.
  case none
}

/// How the client authenticates at the token endpoint (RFC 6749 §2.3).
public enum ClientAuthentication: String, CaseIterable, Sendable, Equatable {
  /// A public client: its id alone.
  case none
  /// The id and secret as HTTP Basic.
  case clientSecretBasic = "client_secret_basic"
  /// The id and secret in the request's body.
  case clientSecretPost = "client_secret_post"
}

/// A provider's endpoints, written out; nil where it has none.
public struct ProviderEndpoints: Sendable, Equatable {
  public var authorization: String?
  public var token: String?
  public var deviceAuthorization: String?
  public var revocation: String?
  public var userinfo: String?

  public init(
    authorization: String? = nil, token: String? = nil, deviceAuthorization: String? = nil, revocation: String? = nil,
    userinfo: String? = nil
  ) {
    self.authorization = authorization
    self.token = token
    self.deviceAuthorization = deviceAuthorization
    self.revocation = revocation
    self.userinfo = userinfo
  }

  /// Each endpoint with its config.toml key, in the table's order.
  public var all: [(key: String, url: String?)] {
    [
      ("authorization_endpoint", authorization), ("token_endpoint", token),
      ("device_authorization_endpoint", deviceAuthorization), ("revocation_endpoint", revocation),
      ("userinfo_endpoint", userinfo),
    ]
  }
}

/// A parameter every authorization request of a provider carries.
public struct ProviderParameter: Sendable, Equatable {
  public var name: String
  public var value: String
  public init(name: String, value: String) {
    self.name = name
    self.value = value
  }
}

/// A provider's API that says who the token's user is, for providers with no id_token: GitHub's
/// `GET /user` (`id`, `login`), GitLab's, Bitbucket's (`uuid`, `username`).
public struct ProviderUserAPI: Sendable, Equatable {
  public var url: String
  /// The field with the user's stable id (a number or a string).
  public var idField: String
  /// The field with the name the user signs in with.
  public var usernameField: String
  public init(url: String, idField: String, usernameField: String) {
    self.url = url
    self.idField = idField
    self.usernameField = usernameField
  }
}
