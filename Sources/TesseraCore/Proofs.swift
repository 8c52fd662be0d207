import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// GetProof: the DPoP proof an app sends with each request it makes with a key-bound access token
/// (RFC 9449 §7). The key never leaves the broker, so the app asks for a proof per request.
extension Broker {
  /// The accounts whose refresh tokens are bound to a key of this machine.
  func boundAccountIDs() -> Set<String> {
    Set(cache.refreshTokens.filter { $0.proofKey != nil }.map(\.accountID))
  }

  /// Notes that `caller`'s app was handed `token`: only the apps a bound token was handed to get
  /// proofs for it.
  func noteRecipient(_ token: AccessTokenRecord, caller: CallerInfo?) {
    guard token.proofKey != nil, let app = caller?.app?.key else { return }
    if proofRecipients.count >= 4096 {
      // Bounded: the tokens no longer cached lose their entries (their proofs are no use).
      let live = Set(cache.accessTokens.filter { $0.proofKey != nil }.map { DPoP.tokenHash($0.secret) })
      proofRecipients = proofRecipients.filter { live.contains($0.key) }
      if proofRecipients.count >= 4096 { proofRecipients.removeAll() }
    }
    proofRecipients[DPoP.tokenHash(token.secret), default: []].insert(app)
  }

  /// A proof for `method` and `url` with the key `accessToken` is bound to, carrying its hash
  /// (`ath`) and the resource's `nonce` when it asked for one. Only for an app that was handed
  /// that token and may still use its account (the access policy of tokens), and only for a token
  /// the broker holds now.
  public func proof(method: String, url: String, accessToken: String, nonce: String?, caller: CallerInfo) async throws
    -> String
  {
    try ProofRequest.check(method: method, url: url, nonce: nonce)
    guard !accessToken.isEmpty, accessToken.utf8.count <= RequestOptions.rejectedToken.maxBytes else {
      throw TesseraError.invalidArgument(
        "'token' must be the access token the request carries (1 to \(RequestOptions.rejectedToken.maxBytes) bytes).")
    }
    try await ensureLoaded()
    guard let record = cache.accessTokens.first(where: { $0.secret == accessToken }),
      let account = cache.accounts[record.accountID]
    else {
      throw TesseraError.invalidArgument(
        "This access token is not one the broker holds now (replaced by a refresh, its account signed out, or never issued here). Ask for a token again (AcquireTokenSilent) and ask for the proof with that one."
      )
    }
    guard let thumbprint = record.proofKey, let key = cache.proofKeys[thumbprint], let source = deps.proofKeys else {
      throw TesseraError.invalidArgument(
        "This access token is a bearer token: send it as `Authorization: Bearer`, with no DPoP proof.")
    }
    try await authorize(
      caller, clientID: record.clientID, accountID: account.id, username: account.username, scopes: record.scopes,
      authority: account.authority, operation: .token)
    guard let app = caller.app, proofRecipients[DPoP.tokenHash(accessToken)]?.contains(app.key) == true else {
      throw TesseraError.accessDenied(
        "\(caller.app?.display ?? "This caller") was not handed this token by the broker, so it gets no proof for it. Ask for a token yourself (AcquireTokenSilent) and ask for proofs for that one."
      )
    }
    return try await ProofBuilder.proof(
      key: key, source: source, method: method, url: url, now: deps.clock.now(), nonce: nonce,
      accessToken: accessToken)
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
    guard url.utf8.count <= maxURLBytes, SafeText.isClean(url), !url.contains(" "),
      lower.hasPrefix("https://") || loopback, url.split(separator: "/", omittingEmptySubsequences: false).count >= 3,
      !(url.dropFirst(lower.hasPrefix("https://") ? 8 : 7).prefix { $0 != "/" && $0 != "?" && $0 != "#" }.isEmpty)
    else {
      throw TesseraError.invalidArgument(
        "'url' must be the request's absolute https URL (http only to this machine), up to \(maxURLBytes) bytes.")
    }
    if let nonce {
      guard !nonce.isEmpty, nonce.utf8.count <= 1024, nonce.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
        throw TesseraError.invalidArgument(
          "'nonce' must be the DPoP-Nonce header value the resource sent (visible ASCII, up to 1024 bytes).")
      }
    }
  }
}
