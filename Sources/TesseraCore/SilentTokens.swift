import Logging
import TesseraInterface

/// AcquireTokenSilent: served from the cache, or by redeeming the account's refresh token through
/// the refresh scheduler (single flight, lanes, refresh-ahead, backoff, throttling).
extension Broker {
  // MARK: - AcquireTokenSilent

  /// A silent token and, when a fresh cached token answered, what `onCacheHit` made of it: a front
  /// encodes its reply there and publishes it to the silent fast path, for the bus thread to repeat
  /// while the token stays fresh (on this actor, so no change to the cache can come in between).
  func silentAnswer<Answer: Sendable>(
    _ request: TokenRequest, onCacheHit: (TokenResult, SilentTarget) -> Answer
  ) async throws -> (TokenResult, Answer?) {
    var answer: Answer?
    let result = try await silentToken(request) { result, target in answer = onCacheHit(result, target) }
    return (result, answer)
  }

  /// A token without user interaction, for any front: from the cache, else by a refresh.
  public func silentToken(_ request: TokenRequest) async throws -> TokenResult {
    try await silentToken(request) { _, _ in }
  }

  /// `onCacheHit` runs when a fresh cached token answers: a front publishes its reply to the
  /// silent fast path there, for the bus thread to repeat while the token stays fresh. A token
  /// bound to a key is never published: each hand-out is noted (who may ask for its proofs).
  func silentToken(_ asked: TokenRequest, onCacheHit: (TokenResult, SilentTarget) -> Void) async throws
    -> TokenResult
  {
    let result = try await silentTokenUnnoted(asked) { result, target in
      if result.accessToken.proofKey == nil { onCacheHit(result, target) }
    }
    noteRecipient(result.accessToken, caller: asked.caller)
    return result
  }

  private func silentTokenUnnoted(_ asked: TokenRequest, onCacheHit: (TokenResult, SilentTarget) -> Void)
    async throws -> TokenResult
  {
    // The configuration this request is decided under: the defaults, the trust, the access mode.
    let generation = configGeneration
    let request = try applyingProvider(asked)
    let clientID = try resolveClientID(request.clientID)
    let scopes = try resolveScopes(request.scopes)
    let authority = try resolveAuthority(request.authority)
    try await ensureLoaded()
    let account = try resolveAccount(request.accountID, authority: authority)
    let realm = realm(for: authority, account: account)
    let target = SilentTarget(account: account, authority: authority, realm: realm, clientID: clientID, scopes: scopes)
    try await authorize(
      request.caller, clientID: clientID, accountID: account.id, username: account.username, scopes: scopes,
      authority: authority.url, operation: .token)
    // A reload while this request waited (for the store, for the user's answer): decided again
    // under the new configuration, so nothing the old one allowed is answered or published.
    guard generation == configGeneration else { return try await silentTokenUnnoted(asked, onCacheHit: onCacheHit) }
    let now = deps.clock.now()
    var usesCache = !request.forceRefresh && request.claims == nil
    // The caller found the token it holds rejected (accessTokenToRenew): it is dropped, and a new
    // one fetched, not the same (without a refresh token, the next request asks for a sign-in).
    if let renewing = request.accessTokenToRenew, cachedToken(target)?.secret == renewing {
      usesCache = false
      _ = dropRejected(
        renewing, account: account, authority: authority, clientID: clientID, correlationID: request.correlationID)
    }

    if usesCache, let cached = cachedToken(target) {
      let remaining = Double(cached.expiresOn) - now.timeIntervalSince1970
      // Expiry was computed from expires_in by this machine's clock when the token arrived, so the
      // IdP's clock plays no part; min_validity (by default 300 s, less for short-lived tokens:
      // TokenLifetimes.servingMargin) is the whole margin.
      if remaining >= cached.servingMargin(request.minValidity) {
        scheduler.noteUse(target, at: now)
        if let refreshOn = cached.refreshOn, now.timeIntervalSince1970 >= Double(refreshOn) {
          startBackgroundRefresh(target)
        }
        let result = TokenResult(accessToken: cached, grantedScopes: cached.scopes, account: account)
        onCacheHit(result, target)
        return result
      }
    }
    do {
      let result = try await refresh(target, claims: request.claims, correlationID: request.correlationID)
      scheduler.noteUse(target, at: deps.clock.now())
      return result
    } catch let error as TesseraError where error.code == .network && usesCache {
      // Entra's extended lifetime: while the IdP is unreachable, a token within ext_expires_in still serves.
      let nowSeconds = deps.clock.now().timeIntervalSince1970
      if let cached = cachedToken(target), let extended = cached.extExpiresOn, Double(extended) > nowSeconds {
        logger.notice(
          "The identity provider is unreachable; serving a token within its extended lifetime",
          metadata: ["correlation_id": "\(request.correlationID)", "error": "\(error.message)"])
        return TokenResult(accessToken: cached, grantedScopes: cached.scopes, account: account)
      }
      throw error
    }
  }

  func cachedToken(_ target: SilentTarget) -> AccessTokenRecord? {
    cache.accessToken(
      accountID: target.account.id, environment: target.authority.environment, realm: target.realm,
      clientID: target.clientID, scopes: target.scopes)
  }

  // MARK: - Refresh: single flight

  /// Any number of concurrent callers that need the same refresh share one request and its result.
  func refresh(_ target: SilentTarget, claims: String?, correlationID: String) async throws -> TokenResult {
    let key = RefreshScheduler.RefreshKey(target: target.key, claims: claims)
    if let running = scheduler.running(key) { return try await running.value }
    let flight = scheduler.start(key, lane: target.lane) { previous in
      Task { () async throws -> TokenResult in
        // Wait for the refresh before this one on the same refresh token: it may rotate it.
        await previous?.value
        return try await self.redeemRefreshToken(for: target, claims: claims, correlationID: correlationID)
      }
    }
    defer { scheduler.finish(key, lane: target.lane, flight) }
    do {
      return try await flight.task.value
    } catch {
      noteFailure(target, TesseraError.wrap(error))
      throw error
    }
  }

  /// One refresh-token request, with the refresh token as it is now (after any rotation).
  func redeemRefreshToken(for target: SilentTarget, claims: String?, correlationID: String) async throws
    -> TokenResult
  {
    let account = target.account
    let environment = target.authority.environment
    guard cache.accounts[account.id] != nil else {
      throw TesseraError.noSuchAccount("\(account.username) was signed out. Sign in again with AcquireToken.")
    }
    guard
      let record = cache.refreshToken(
        accountID: account.id, environment: environment, clientID: target.clientID, scopes: target.scopes)
    else {
      if let refused = rejectionNeed(target) { throw refused }
      throw TesseraError.interactionRequired(
        "\(account.username) has not signed in to client \(target.clientID) yet. Run an interactive sign-in (AcquireToken with this account, or `tessera login --client-id \(target.clientID)`): at most a click is needed."
      )
    }
    // resolveAccount checked that the authority may use this account (same issuer, or an Entra tenant
    // of the same cloud): only then does the refresh token go to its token endpoint.
    let tokenAuthority =
      target.authority.isMicrosoft && target.authority.environment == record.environment
      ? target.authority : try Authority(parsing: record.authority)
    try checkStillTrusted(tokenAuthority, account: account)
    let proofKey = try refreshProofKey(record, account: account)
    let metadata = try await self.metadata(for: tokenAuthority, clientID: target.clientID)
    // The keys that check the answer's id_token, fetched now if unknown: keys the IdP cannot serve
    // must fail the refresh before the token endpoint rotates the refresh token, not after.
    if metadata.hasSigningKeys { try await directory.prepareKeys(for: metadata) }
    var fields = [
      ("grant_type", "refresh_token"), ("client_id", target.clientID), ("refresh_token", record.secret),
      ("scope", scopeParameter(target.scopes, authority: tokenAuthority, clientID: target.clientID)),
      ("client_info", "1"),
    ]
    if let merged = try claimsParameter(claims) { fields.append(("claims", merged)) }
    let knownInFamily = cache.appMetadata(environment: environment, clientID: target.clientID)?.familyID != nil
    // Noted before the token leaves, forgotten once the answer is stored or the IdP answered: a
    // kill in between, or an exchange whose answer never arrived (the IdP may have rotated the
    // token all the same), leaves the note, and the next start or maintenance pass checks it.
    let note = RefreshJournalEntry(
      accountID: account.id, environment: environment, authority: target.authority.url, clientID: target.clientID,
      scopes: target.scopes, startedAt: Int64(deps.clock.now().timeIntervalSince1970))
    deps.journal?.begin(note)
    do {
      let result = try await exchange(
        fields, metadata: metadata, tokenAuthority: tokenAuthority, target: target, record: record,
        knownInFamily: knownInFamily, correlationID: correlationID, proofKey: proofKey)
      deps.journal?.end(note)
      return result
    } catch {
      if TesseraError.wrap(error).code != .network { deps.journal?.end(note) }
      throw error
    }
  }

  /// The refresh request itself, and what a family member refused by the IdP means.
  private func exchange(
    _ fields: [(String, String)], metadata: OIDCMetadata, tokenAuthority: Authority, target: SilentTarget,
    record: RefreshTokenRecord, knownInFamily: Bool, correlationID: String, proofKey: ProofKeyRecord?
  ) async throws -> TokenResult {
    let account = target.account
    let environment = target.authority.environment
    do {
      // An answer that cannot be read as a token response (no access_token, a bad expires_in) may
      // still carry the refresh token the IdP rotated to; the one sent is dead then, so the new one
      // is kept (it continues this account's own grant, and nothing in the answer says otherwise).
      var rotated: String?
      do {
        let response = try await postToken(
          metadata.tokenEndpoint, fields, correlationID: correlationID,
          client: try clientCredentials(for: tokenAuthority, clientID: target.clientID), proof: proofKey,
          unreadableAnswer: { rotated = TokenResponse.refreshToken(in: $0) })
        do {
          return try await accept(
            response, metadata: metadata, authority: tokenAuthority, clientID: target.clientID,
            requestedScopes: target.scopes, nonce: nil, knownAccount: account, redeemed: record, proofKey: proofKey)
        } catch {
          // Read, but refused: its id_token failed validation or names another user. Its refresh
          // token is not trusted with this account (an IdP that sends no id_token on later refreshes
          // would never be checked again): it is revoked, so no live token is left behind.
          if let new = response.refreshToken, new != record.secret, cache.refreshTokens.contains(record) {
            var refused = record
            refused.secret = new
            Task { await self.revoke(refused, correlationID: correlationID) }
          }
          throw error
        }
      } catch {
        if let rotated { await keepRotatedRefreshToken(rotated, replacing: record, correlationID: correlationID) }
        throw error
      }
    } catch let error as TesseraError
      where record.familyID != nil && !knownInFamily
      && (error.code == .interactionRequired || error.code == .invalidArgument)
    {
      // A client not known to be in the family tried the family token and was refused: remember it,
      // so it is not tried again, and ask for a sign-in for this client.
      try? await apply(
        cache.upsert(appMetadata: AppMetadataRecord(environment: environment, clientID: target.clientID, familyID: nil))
      )
      throw TesseraError.interactionRequired(
        "Client \(target.clientID) cannot use the family sign-in of \(account.username) (\(error.message)). Run an interactive sign-in for it."
      )
    }
  }

  /// After an answer that was refused: stores the refresh token it carried in place of the one
  /// redeemed, unless the answer was stored after all or the account has gone meanwhile.
  func keepRotatedRefreshToken(_ secret: String, replacing old: RefreshTokenRecord, correlationID: String) async {
    guard !secret.isEmpty, secret != old.secret, cache.accounts[old.accountID] != nil,
      cache.refreshTokens.contains(old)
    else { return }
    var record = old
    record.secret = secret
    logger.notice(
      "The identity provider's answer was refused, but the new refresh token it carried is kept",
      metadata: ["correlation_id": "\(correlationID)", "account_id": "\(old.accountID)"])
    try? await apply(cache.upsert(refreshToken: record, replacing: old))
  }

  /// The trust policy is the configuration's, which may have changed since the account signed in:
  /// a refresh token is sent (or revoked) only where the policy allows today. The account stays.
  func checkStillTrusted(_ authority: Authority, account: Account) throws {
    do {
      _ = try policy.validate(authority.url)
    } catch let error as TesseraError where error.code == .untrustedAuthority {
      throw TesseraError.untrustedAuthority(
        "\(account.username) signed in at \(authority.url), which config.toml no longer trusts, so its refresh token is not sent there. Add it to trusted_authorities again, or sign the account out."
      )
    }
  }

  static func requestScopes(_ scopes: [String]) -> String {
    var all = scopes
    for oidc in ["openid", "profile", "offline_access"] where !all.contains(where: { $0.lowercased() == oidc }) {
      all.append(oidc)
    }
    return all.joined(separator: " ")
  }

  /// The `claims` parameter: the caller's claims challenge merged with the configured client capabilities.
  func claimsParameter(_ claims: String?) throws -> String? {
    try ClaimsRequest.merge(claims: claims, capabilities: config.clientCapabilities)
  }

  /// POSTs to a token endpoint, honouring Retry-After from earlier answers. With `proof`, the
  /// request carries a DPoP proof made with that key, and is sent once more when the server asks
  /// for its nonce (RFC 9449 §8; the refused request used nothing up).
  func postToken(
    _ endpoint: String, _ fields: [(String, String)], correlationID: String, client: ClientCredentials = .none,
    proof: ProofKeyRecord? = nil, unreadableAnswer: (([UInt8]) -> Void)? = nil
  ) async throws -> TokenResponse {
    if let wait = scheduler.throttleRemaining(endpoint, now: deps.clock.now()) {
      throw TesseraError(
        .network, "The identity provider asked for a pause; retry in \(Int(wait.rounded(.up))) s.",
        detail: ErrorDetail(providerAskedToWait: true))
    }
    var response: HTTPResponse
    var retried = false
    while true {
      let dpop = try await proofHeaders(proof, url: endpoint)
      // No cancellation check after this: a refresh token the IdP has rotated must be stored.
      response = try await deps.http.send(
        .form(
          endpoint, fields + client.fields,
          headers: [
            ("client-request-id", correlationID), ("return-client-request-id", "true"), ("Accept", "application/json"),
          ] + client.headers + dpop.headers))
      guard proof != nil, noteNonce(response, url: endpoint, sent: dpop.nonce, retried: retried) else { break }
      retried = true
    }
    guard response.status == 200 else {
      if response.status == 429 || response.status == 503,
        let seconds = OAuthErrorResponse.retryAfterSeconds(response.headers["retry-after"]), seconds > 0
      {
        scheduler.throttle(endpoint, until: deps.clock.now().addingTimeInterval(Double(seconds)))
      }
      throw OAuthErrorResponse.map(
        status: response.status, body: response.body, endpoint: endpoint, retryAfter: response.headers["retry-after"])
    }
    do {
      return try TokenResponse.parse(response.body, endpoint: endpoint)
    } catch {
      // A 200 that is not a usable token response may still carry a rotated refresh token.
      unreadableAnswer?(response.body)
      throw error
    }
  }

  // MARK: - Refresh-ahead

  /// Refreshes a token in the background, unless a refresh of it runs already or failed recently.
  /// Failures are quiet and retried with backoff; they never drop an account.
  func startBackgroundRefresh(_ target: SilentTarget) {
    guard scheduler.mayRefreshInBackground(target.key, now: deps.clock.now()) else { return }
    scheduler.backgroundStarted(target.key, Task { await self.backgroundRefresh(target) })
  }

  private func backgroundRefresh(_ target: SilentTarget) async {
    let correlationID = CorrelationID.new()
    do {
      _ = try await refresh(target, claims: nil, correlationID: correlationID)
      _ = scheduler.backgroundEnded(target.key, failed: false, now: deps.clock.now())
      logger.debug("Refreshed a token ahead of expiry", metadata: ["correlation_id": "\(correlationID)"])
    } catch {
      let delay = scheduler.backgroundEnded(target.key, failed: true, now: deps.clock.now()) ?? 0
      logger.notice(
        "A background refresh failed; the cached token still serves and the refresh is retried",
        metadata: [
          "correlation_id": "\(correlationID)", "error": "\(TesseraError.wrap(error))",
          "retry_in_s": "\(Int(delay))",
        ])
    }
  }
}
