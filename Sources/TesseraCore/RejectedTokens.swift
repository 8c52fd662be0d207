import Logging
import TesseraInterface

/// A token a resource refused (issue 38, point 5): git's `erase`, `tessera token --reject` and the
/// RejectToken method drop it from the cache, so it is not served again. The next request
/// refreshes it, or asks for a sign-in when the provider gave no refresh token.
extension Broker {
  /// Drops `token` when it is the cached access token of the request's account and client.
  /// The caller must be one that may get that account's tokens from that client: an app that was
  /// never given the token cannot make it go away for the others. Returns whether a token was
  /// dropped (false: it was not cached, or was already replaced).
  public func rejectToken(_ asked: TokenRequest, token: String) async throws -> Bool {
    let request = try applyingProvider(asked)
    let clientID = try resolveClientID(request.clientID)
    let authority = try resolveAuthority(request.authority)
    try await ensureLoaded()
    let account = try resolveAccount(request.accountID, authority: authority)
    try await authorize(
      request.caller, clientID: clientID, accountID: account.id, username: account.username, scopes: [],
      authority: authority.url, operation: .token)
    return dropRejected(
      token, account: account, authority: authority, clientID: clientID, correlationID: request.correlationID)
  }

  /// Removes the cached tokens with that value, and tells the user when nothing can replace them.
  func dropRejected(
    _ token: String, account: Account, authority: Authority, clientID: String, correlationID: String
  ) -> Bool {
    let deletes = cache.removeAccessTokens(
      accountID: account.id, environment: authority.environment, clientID: clientID, secret: token)
    guard !deletes.isEmpty else { return false }
    enqueueWrite(deletes)  // and the bus thread's published replies, which may carry it, are cleared
    let refreshable =
      cache.refreshToken(accountID: account.id, environment: authority.environment, clientID: clientID, scopes: [])
      != nil
    logger.notice(
      "A resource refused an access token; it is dropped from the cache",
      metadata: [
        "correlation_id": "\(correlationID)", "account_id": "\(account.id)", "client_id": "\(clientID)",
        "next": "\(refreshable ? "refresh" : "sign-in")",
      ])
    if !refreshable {
      // No refresh token (a GitHub OAuth app's tokens): only a sign-in gives a new token.
      let login = config.provider(for: authority, clientID: clientID).map { "tessera login --provider \($0.name)" }
      noteNeed(
        SignInNeed(
          accountID: account.id, username: account.username, clientID: clientID, scopes: [],
          authority: authority.url),
        TesseraError.interactionRequired(
          "A resource refused \(account.username)'s token from client \(clientID), and the identity provider gave no refresh token to get another. Sign in again (`\(login ?? "tessera login --client-id \(clientID)")`)."
        ))
    }
    return true
  }

  /// Why a request for `target` needs a sign-in when a refused token was dropped and there was
  /// no refresh token to replace it: the error noted then (nil when that is not the case).
  func rejectionNeed(_ target: SilentTarget) -> TesseraError? {
    let entry = health.entry(target.account.id)
    let key = AccountHealth.NeedKey(clientID: target.clientID, authority: target.authority.url, scopes: [])
    guard entry.needs[key] != nil, let error = entry.lastError, error.code == .interactionRequired else { return nil }
    return error
  }
}
