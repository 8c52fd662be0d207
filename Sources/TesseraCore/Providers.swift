import Crypto
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// The providers of config.toml (`[[provider]]`, issue 38) in the engine. A provider is an
/// authority like any other (its issuer, which config.toml thereby trusts), with what an OpenID
/// Connect provider of the default kind does not need: endpoints from RFC 8414 metadata or written
/// out, a client secret (HTTP Basic or in the body), authorization parameters, and an account
/// named by userinfo, the provider's user API or the user when there is no id_token.
extension BrokerConfig {
  /// The provider named `name`, or InvalidArgument naming the ones there are (`listingOthers`:
  /// never to a caller on another machine, which is not told what this one is set up with).
  public func provider(named name: String, listingOthers: Bool = true) throws -> ProviderConfig {
    guard let provider = providers.first(where: { $0.name == name }) else {
      guard listingOthers else {
        throw TesseraError.invalidArgument(
          "There is no provider '\(RequestOptions.clip(name))' on the machine this forward leads to. Ask its user for the name (`tessera provider list` there)."
        )
      }
      throw TesseraError.invalidArgument(
        "There is no provider '\(RequestOptions.clip(name))'; "
          + NearestName.suggestion(for: name, among: providers.map(\.name), known: "the providers are")
          + " (`tessera provider list`; `tessera provider add` adds one).")
    }
    return provider
  }

  /// The provider whose issuer is `authority` (the one of `clientID` first, when several are).
  public func provider(for authority: Authority, clientID: String? = nil) -> ProviderConfig? {
    let matching = providers.filter { (try? Authority(parsing: $0.issuer))?.url == authority.url }
    return matching.first { $0.clientID == clientID } ?? matching.first
  }
}

/// How a client proves itself at a provider's token endpoint: nothing (a public client), its
/// secret in the body, or HTTP Basic (RFC 6749 §2.3.1: id and secret form-encoded first).
struct ClientCredentials: Sendable {
  var fields: [(String, String)] = []
  var headers: [(String, String)] = []

  static let none = ClientCredentials()
}

extension Broker {
  /// The metadata of `authority`: a provider's as its table says (discovery, RFC 8414, or its
  /// endpoints written out, its own endpoints overriding what a document says), else OpenID
  /// discovery as always.
  func metadata(for authority: Authority, clientID: String? = nil) async throws -> OIDCMetadata {
    guard let provider = config.provider(for: authority, clientID: clientID) else {
      return try await directory.metadata(for: authority, policy: policy)
    }
    var metadata: OIDCMetadata
    switch provider.discovery {
    case .openID: metadata = try await directory.metadata(for: authority, policy: policy, anyHTTPSEndpoint: true)
    case .oauth: metadata = try await directory.serverMetadata(for: authority, policy: policy)
    case .none:
      metadata = OIDCMetadata(
        issuer: authority.url, authorizationEndpoint: "", tokenEndpoint: "", jwksURI: "")
    }
    let written = provider.endpoints
    if let url = written.authorization { metadata.authorizationEndpoint = url }
    if let url = written.token { metadata.tokenEndpoint = url }
    if let url = written.deviceAuthorization { metadata.deviceAuthorizationEndpoint = url }
    if let url = written.revocation { metadata.revocationEndpoint = url }
    if let url = written.userinfo { metadata.userinfoEndpoint = url }
    guard !metadata.tokenEndpoint.isEmpty else {
      throw TesseraError(
        .configuration,
        "The provider '\(provider.name)' has no token endpoint (its metadata names none); set token_endpoint in its [[provider]] table."
      )
    }
    return metadata
  }

  /// The client's credentials for `authority`'s token endpoint: a provider's secret, read now
  /// (so a secret changed in its file takes effect at once), else none.
  func clientCredentials(for authority: Authority, clientID: String) throws -> ClientCredentials {
    guard let provider = config.provider(for: authority, clientID: clientID), provider.clientID == clientID,
      provider.hasSecret, let path = provider.clientSecretFile
    else { return .none }
    guard let source = deps.secrets else {
      throw TesseraError(.environment, "This tesserad cannot read client secrets (the provider '\(provider.name)').")
    }
    let secret: String
    do { secret = try source.secret(at: path, shared: provider.fromAdministrator) } catch {
      // Where the file is and what is wrong with it goes to the log, not to the caller.
      logger.warning(
        "A provider's client secret cannot be read",
        metadata: ["provider": "\(provider.name)", "error": "\(TesseraError.wrap(error).message)"])
      throw TesseraError(
        .configuration,
        "The client secret of the provider '\(provider.name)' cannot be read. `tessera config check` says what to fix, and tesserad's log why."
      )
    }
    switch provider.clientAuthentication {
    case .none: return .none
    case .clientSecretPost: return ClientCredentials(fields: [("client_secret", secret)])
    case .clientSecretBasic:
      let pair = FormEncoding.escape(clientID) + ":" + FormEncoding.escape(secret)
      return ClientCredentials(headers: [("Authorization", "Basic " + Data(pair.utf8).base64EncodedString())])
    }
  }

  /// The account a token is for when the answer carries no id_token that can be checked: the
  /// userinfo endpoint's `sub`, else the provider's user API, else the name the user gave
  /// (`login_hint`). Only for a provider of config.toml: an OpenID provider of the default kind
  /// must send an id_token.
  func accountWithoutIDToken(
    _ response: TokenResponse, metadata: OIDCMetadata, authority: Authority, clientID: String, hint: String?,
    proofKey: ProofKeyRecord? = nil
  ) async throws -> Account? {
    guard let provider = config.provider(for: authority, clientID: clientID) else { return nil }
    func account(id: String, username: String, name: String?) -> Account {
      // Unique across providers: the user's id there plus a short digest of the issuer.
      let digest = SHA256.hash(data: Array(authority.url.utf8)).prefix(6).map {
        ($0 < 16 ? "0" : "") + String($0, radix: 16)
      }.joined()
      return Account(
        id: "\(id).\(digest)", username: username, name: name ?? username, authority: authority.url,
        environment: authority.environment, realm: "", localAccountID: id)
    }
    if let userinfo = metadata.userinfoEndpoint {
      do {
        let fields = try await userFields(
          userinfo, token: response.accessToken, provider: provider, proofKey: proofKey)
        guard let sub = fields["sub"] else {
          throw TesseraError.provider(
            "The userinfo endpoint \(userinfo) answered without a sub, so the account cannot be named.")
        }
        let username = fields["preferred_username"] ?? fields["email"] ?? fields["name"] ?? sub
        return account(id: sub, username: username, name: fields["name"])
      } catch {
        // userinfo wants the openid scope (GitLab's, Gitea's): the profile's user API may still answer.
        guard provider.userAPI != nil else { throw error }
      }
    }
    if let api = provider.userAPI {
      let fields = try await userFields(api.url, token: response.accessToken, provider: provider, proofKey: proofKey)
      guard let id = fields[api.idField], let username = fields[api.usernameField] else {
        throw TesseraError.provider(
          "\(api.url) answered without \(api.idField) and \(api.usernameField), so the account cannot be named.")
      }
      return account(id: id, username: username, name: fields["name"])
    }
    if let hint, !hint.isEmpty {
      // Named by the user, not by the provider: an id space of its own, so that it can never
      // take the place of an account the provider named.
      return account(id: "named-" + hint, username: hint, name: nil)
    }
    throw TesseraError.invalidArgument(
      "The provider '\(provider.name)' sent no id_token and has no userinfo endpoint or user API, so it cannot say who signed in. Sign in again naming the account: `tessera login --provider \(provider.name) --username NAME`."
    )
  }

  /// A user API's (or userinfo's) JSON object, its strings and numbers as text (GitHub's `id` is
  /// a number), each clipped and made safe to show. A token bound to `proofKey` goes with the
  /// DPoP scheme and a proof (RFC 9449 §7), once more with the server's nonce when it asks.
  func userFields(_ url: String, token: String, provider: ProviderConfig, proofKey: ProofKeyRecord? = nil)
    async throws -> [String: String]
  {
    var response: HTTPResponse
    var retried = false
    while true {
      let dpop = try await proofHeaders(proofKey, method: "GET", url: url, accessToken: token)
      response = try await deps.http.send(
        HTTPRequest(
          method: "GET", url: url,
          headers: [
            ("Authorization", "\(proofKey == nil ? "Bearer" : DPoP.tokenType) \(token)"),
            ("Accept", "application/json"),
          ] + dpop.headers))
      guard proofKey != nil, noteNonce(response, url: url, sent: dpop.nonce, retried: retried) else { break }
      retried = true
    }
    guard response.status == 200 else {
      if response.status >= 500 || response.status == 429 {
        throw TesseraError.network(
          "\(url) is unavailable (HTTP \(response.status)), so the account cannot be named yet. Try again in a moment.")
      }
      throw TesseraError.provider(
        "\(url) answered HTTP \(response.status) to the new token, so the account cannot be named. Check the provider '\(provider.name)' and its scopes."
      )
    }
    guard let object = try? JSONDecoder().decode([String: JSONValue].self, from: Data(response.body)) else {
      throw TesseraError.provider("\(url) answered with something that is not a JSON object.")
    }
    var fields: [String: String] = [:]
    for (key, value) in object {
      switch value {
      case .string(let s) where !s.isEmpty && s.utf8.count <= 512 && SafeText.isClean(s): fields[key] = s
      case .number(let n) where n.rounded() == n && abs(n) < 1e15: fields[key] = String(Int64(n))
      default: break
      }
    }
    return fields
  }
}

extension OIDCDirectory {
  /// RFC 8414 metadata: `/.well-known/oauth-authorization-server` inserted between the host and
  /// the issuer's path (§3.1), its issuer the authority, its endpoints https.
  public func serverMetadata(for authority: Authority, policy: AuthorityPolicy) async throws -> OIDCMetadata {
    let key = "rfc8414 " + authority.url  // never the OpenID document of the same authority
    if let (cached, fetched) = metadata[key], clock.now().timeIntervalSince(fetched) < Self.metadataLifetime {
      try Self.check(cached, of: authority, policy: policy, anyHTTPSEndpoint: true)
      return cached
    }
    let url =
      "\(authority.scheme)://\(authority.environment)/.well-known/oauth-authorization-server"
      + authority.pathSegments.map { "/" + $0 }.joined()
    let response = try await http.send(HTTPRequest(method: "GET", url: url, headers: [("Accept", "application/json")]))
    guard response.status == 200 else {
      if response.status >= 500 || response.status == 429 {
        throw TesseraError.network(
          "The authorization server metadata at \(url) is unavailable (HTTP \(response.status)). Try again in a moment."
        )
      }
      throw TesseraError.provider(
        "The authorization server metadata at \(url) answered HTTP \(response.status). Check the provider's issuer, or write its endpoints out (discovery = \"none\")."
      )
    }
    guard let server = try? JSONDecoder().decode(OIDCMetadata.OAuthServer.self, from: Data(response.body)) else {
      throw TesseraError.provider("The document at \(url) is not RFC 8414 authorization server metadata.")
    }
    let document = server.metadata
    try Self.check(document, of: authority, policy: policy, anyHTTPSEndpoint: true)
    metadata[key] = (document, clock.now())
    return document
  }
}

extension Broker {
  /// `request` with its `provider` filled in: the provider's issuer as the authority, and its
  /// client id, scopes and authorization parameters where the request gives none of its own.
  func applyingProvider(_ request: TokenRequest) throws -> TokenRequest {
    guard let name = request.provider else { return request }
    let provider = try config.provider(named: name, listingOthers: request.caller?.app?.kind != .forward)
    if let authority = request.authority,
      (try? Authority(parsing: authority))?.url != (try? Authority(parsing: provider.issuer))?.url
    {
      throw TesseraError.invalidArgument(
        "The provider '\(name)' is \(provider.issuer), not \(RequestOptions.clip(authority)): give one or the other.")
    }
    var applied = request
    applied.provider = nil
    applied.authority = provider.issuer
    if applied.clientID.isEmpty { applied.clientID = provider.clientID }
    if applied.scopes.isEmpty { applied.scopes = provider.scopes }
    return applied
  }

  /// The authorization request's parameters of a provider (its table's `authorization_parameters`,
  /// Google's `access_type=offline`); the request's own extra_query wins.
  func providerParameters(for authority: Authority, clientID: String, request: TokenRequest) -> [(String, String)] {
    guard let provider = config.provider(for: authority, clientID: clientID) else { return [] }
    return provider.authorizationParameters.filter { request.extraQuery[$0.name] == nil }.map { ($0.name, $0.value) }
  }

  /// The `scope` parameter. Entra, and an authority that is no provider of config.toml, get the
  /// OpenID Connect scopes added (`openid profile offline_access`). A provider gets its scopes as
  /// they are, with `openid` added only where it speaks OpenID Connect: GitHub and Bitbucket know no
  /// `openid`, and providers refuse scopes they do not know, such as `offline_access` (Google gives
  /// refresh tokens for `access_type=offline` instead).
  func scopeParameter(_ scopes: [String], authority: Authority, clientID: String) -> String {
    if let provider = config.provider(for: authority, clientID: clientID), !authority.isMicrosoft {
      let openID = provider.discovery == .openID && !scopes.contains { $0.lowercased() == "openid" }
      return (scopes + (openID ? ["openid"] : [])).joined(separator: " ")
    }
    return Self.requestScopes(scopes)
  }
}
