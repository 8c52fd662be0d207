import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// GetProof: the DPoP proof an app sends with each request it makes with a key-bound access token
/// (RFC 9449 §7). The key never leaves the broker, so the app asks for a proof per request.
extension Broker {
  /// A key-bound access token as it was handed out: its key, account and client, until it
  /// expires, and the apps (AppIdentity keys) it was handed to. Kept by the token's hash (never
  /// the token), also after a refresh replaced it in the cache: the apps that hold it still send it.
  struct HandedOut: Sendable {
    var thumbprint: String
    var accountID: String
    var clientID: String
    var scopes: [String]
    var expiresOn: Int64
    var apps: Set<String>
  }

  /// The accounts whose refresh tokens are bound to a key of this machine.
  func boundAccountIDs() -> Set<String> {
    Set(cache.refreshTokens.filter { $0.proofKey != nil }.map(\.accountID))
  }

  /// Notes that `caller`'s app was handed `token`: only the apps a bound token was handed to get
  /// proofs for it.
  func noteRecipient(_ token: AccessTokenRecord, caller: CallerInfo?) {
    guard let thumbprint = token.proofKey, let app = caller?.app?.key else { return }
    let hash = DPoP.tokenHash(token.secret)
    if proofRecipients[hash] == nil, proofRecipients.count >= 4096 {
      // Bounded: expired tokens go first (their proofs are no use), then everything.
      let now = Int64(deps.clock.now().timeIntervalSince1970)
      proofRecipients = proofRecipients.filter { $0.value.expiresOn > now }
      if proofRecipients.count >= 4096 { proofRecipients.removeAll() }
    }
    proofRecipients[
      hash,
      default: HandedOut(
        thumbprint: thumbprint, accountID: token.accountID, clientID: token.clientID, scopes: token.scopes,
        expiresOn: token.expiresOn, apps: [])
    ].apps.insert(app)
  }

  /// A proof for `method` and `url` with the key `accessToken` is bound to, carrying its hash
  /// (`ath`) and the resource's `nonce` when it asked for one. Only for an app that was handed
  /// that token (after a restart of tesserad, which forgets who was handed what: an app the
  /// access policy lets use the token's account and client, which could ask for the same token),
  /// never for the identity provider's own endpoints (a proof for its token endpoint would let a
  /// copy of the refresh token be redeemed elsewhere), and only while the token is valid.
  public func proof(method: String, url: String, accessToken: String, nonce: String?, caller: CallerInfo) async throws
    -> String
  {
    try ProofRequest.check(method: method, url: url, nonce: nonce)
    guard !accessToken.isEmpty, accessToken.utf8.count <= RequestOptions.rejectedToken.maxBytes else {
      throw TesseraError.invalidArgument(
        "'token' must be the access token the request carries (1 to \(RequestOptions.rejectedToken.maxBytes) bytes).")
    }
    try await ensureLoaded()
    let hash = DPoP.tokenHash(accessToken)
    let cached = cache.accessTokens.first { $0.secret == accessToken }
    if let cached, cached.proofKey == nil {
      throw TesseraError.invalidArgument(
        "This access token is a bearer token: send it as `Authorization: Bearer`, with no DPoP proof.")
    }
    guard
      let issued = proofRecipients[hash]
        ?? cached.flatMap({ token in
          token.proofKey.map {
            HandedOut(
              thumbprint: $0, accountID: token.accountID, clientID: token.clientID, scopes: token.scopes,
              expiresOn: token.expiresOn, apps: [])
          }
        })
    else {
      throw TesseraError.invalidArgument(
        "This access token is not one the broker handed out (or its account was signed out). Ask for a token (AcquireTokenSilent) and ask for proofs for that one."
      )
    }
    guard issued.expiresOn > Int64(deps.clock.now().timeIntervalSince1970) else {
      throw TesseraError.invalidArgument("This access token has expired. Ask for a new one (AcquireTokenSilent).")
    }
    // Who may have it, before anything else is asked (a question to the user among them).
    guard let app = caller.app, issued.apps.isEmpty || issued.apps.contains(app.key) else {
      throw TesseraError.accessDenied(
        "\(caller.app?.display ?? "This caller") was not handed this token by the broker, so it gets no proof for it. Ask for a token yourself (AcquireTokenSilent) and ask for proofs for that one."
      )
    }
    guard let account = cache.accounts[issued.accountID] else {
      throw TesseraError.noSuchAccount("The account this token is for was signed out. Sign in again.")
    }
    try await refuseIdentityProviderEndpoint(url, authority: account.authority, clientID: issued.clientID)
    try await authorize(
      caller, clientID: issued.clientID, accountID: account.id, username: account.username, scopes: issued.scopes,
      authority: account.authority, operation: .token)
    // Looked up again after the waits above: signed out meanwhile, no proof.
    guard cache.accounts[issued.accountID] != nil, let key = cache.proofKeys[issued.thumbprint],
      let source = deps.proofKeys
    else {
      throw TesseraError.interactionRequired(
        "\(account.username) needs sign-in: the key this token is bound to is gone (signed out, or signed in again since). Ask for a new token."
      )
    }
    if issued.apps.isEmpty, let cached { noteRecipient(cached, caller: caller) }
    return try await ProofBuilder.proof(
      key: key, source: source, method: method, url: url, now: deps.clock.now(), nonce: nonce,
      accessToken: accessToken)
  }

  /// Refuses a proof for the identity provider's own token, device and revocation endpoints: an
  /// app has no use for one, and with it a copy of the refresh token could be redeemed elsewhere.
  /// An authority whose endpoints cannot be known now is refused too (fail closed).
  func refuseIdentityProviderEndpoint(_ url: String, authority: String, clientID: String) async throws {
    let target = DPoP.target(url).lowercased()
    let metadata: OIDCMetadata
    do {
      metadata = try await self.metadata(for: try Authority(parsing: authority), clientID: clientID)
    } catch {
      throw TesseraError(
        .network,
        "The identity provider's endpoints cannot be read now (\(TesseraError.wrap(error).message)), and a proof is never made for them; try again in a moment."
      )
    }
    let own = [metadata.tokenEndpoint, metadata.deviceAuthorizationEndpoint, metadata.revocationEndpoint]
      .compactMap { $0 }.filter { !$0.isEmpty }.map { DPoP.target($0).lowercased() }
    guard !own.contains(target) else {
      throw TesseraError.accessDenied(
        "No proof is made for the identity provider's own endpoint \(DPoP.target(url)): only tesserad talks to it (with a proof, a copy of the refresh token could be used elsewhere)."
      )
    }
  }
}

/// What GetProof takes, checked: an HTTP method, an absolute https URL (http only to this
/// machine), and a resource's nonce.
enum ProofRequest {
  static let maxURLBytes = 8192

  static func check(method: String, url: String, nonce: String?) throws {
    guard (1...16).contains(method.utf8.count), method.utf8.allSatisfy({ (0x41...0x5A).contains($0 & ~0x20) }) else {
      throw TesseraError.invalidArgument(
        "'method' must be the request's HTTP method, such as GET or POST (letters only, up to 16).")
    }
    let lower = url.lowercased()
    let loopback = ["http://127.0.0.1", "http://localhost", "http://[::1]"].contains {
      lower.hasPrefix($0 + "/") || lower.hasPrefix($0 + ":") || lower == $0
    }
    let authority = url.split(separator: "/", maxSplits: 3, omittingEmptySubsequences: false).dropFirst(2).first ?? ""
    guard url.utf8.count <= maxURLBytes, SafeText.isClean(url), !url.contains(" "), !authority.contains("@"),
      lower.hasPrefix("https://") || loopback, url.split(separator: "/", omittingEmptySubsequences: false).count >= 3,
      !(url.dropFirst(lower.hasPrefix("https://") ? 8 : 7).prefix { $0 != "/" && $0 != "?" && $0 != "#" }.isEmpty)
    else {
      throw TesseraError.invalidArgument(
        "'url' must be the request's absolute https URL (http only to this machine), up to \(maxURLBytes) bytes.")
    }
    if let nonce {
      guard Broker.isNonce(nonce) else {
        throw TesseraError.invalidArgument(
          "'nonce' must be the DPoP-Nonce header value the resource sent (visible ASCII, up to 1024 bytes).")
      }
    }
  }
}
