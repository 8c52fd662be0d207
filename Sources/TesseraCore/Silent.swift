import Logging

/// When an access token expires, may still be used, and should be refreshed (docs/token-cache.md).
public struct TokenLifetimes: Sendable, Equatable {
  public var expiresOn: Int64
  public var extExpiresOn: Int64?
  public var refreshOn: Int64

  /// Tokens refreshed ahead this long before they would stop being served with the default
  /// min_validity (300 s), when the IdP gives no `refresh_in`.
  public static let refreshAheadMargin: Int64 = 360

  public init(now: Int64, expiresIn: Int64, extExpiresIn: Int64?, refreshIn: Int64?) {
    expiresOn = now + expiresIn
    extExpiresOn = extExpiresIn.map { now + min(max($0, expiresIn), 366 * 86_400) }
    if let refreshIn, refreshIn > 0, refreshIn < expiresIn {
      refreshOn = now + refreshIn
    } else if expiresIn >= 2 * 3600 {
      refreshOn = now + expiresIn / 2  // as MSAL does for long-lived tokens
    } else {
      // Ahead of the default min_validity, but never in a short-lived token's first half.
      refreshOn = now + expiresIn - min(Self.refreshAheadMargin, expiresIn / 2)
    }
  }
}

/// What a silent request is for: one account, authority, realm, client and scope set.
struct SilentTarget: Sendable {
  var account: Account
  var authority: Authority
  var realm: String
  var clientID: String
  var scopes: [String]

  var key: String {
    [account.id, authority.url, realm, clientID, ScopeSet.normalize(scopes).joined(separator: " ")]
      .joined(separator: "\u{1F}")
  }
  /// Refresh tokens are per account and environment (a family token serves several clients).
  var lane: String { account.id + "\u{1F}" + authority.environment }
}

extension Broker {
  /// How long after its last use a token is still refreshed ahead of time.
  public static let recentUseWindow: Double = 30 * 60

  // MARK: - AcquireTokenSilent

  public func acquireTokenSilent(_ request: TokenRequest) async throws -> [String: BusValue] {
    let clientID = try resolveClientID(request.clientID)
    let scopes = try resolveScopes(request.scopes)
    let authority = try resolveAuthority(request.authority)
    try await ensureLoaded()
    let account = try resolveAccount(request.accountID, authority: authority)
    let realm = realm(for: authority, account: account)
    let target = SilentTarget(account: account, authority: authority, realm: realm, clientID: clientID, scopes: scopes)
    let now = deps.clock.now()
    let usesCache = !request.forceRefresh && request.claims == nil

    if usesCache, let cached = cachedToken(target) {
      let remaining = Double(cached.expiresOn) - now.timeIntervalSince1970
      // Expiry was computed from expires_in by this machine's clock when the token arrived, so the
      // IdP's clock plays no part; min_validity (default 300 s) is the whole margin.
      if remaining >= Double(request.minValidity) {
        recentUse[target.key] = (target, now)
        if let refreshOn = cached.refreshOn, now.timeIntervalSince1970 >= Double(refreshOn) {
          startBackgroundRefresh(target)
        }
        var reply = TokenResult(accessToken: cached, grantedScopes: cached.scopes, account: account)
          .busValue(correlationID: request.correlationID)
        fastPath.publish(request, target: target, token: cached, reply: reply)
        reply["correlation_id"] = .string(request.correlationID)
        return reply
      }
    }
    do {
      let result = try await refresh(target, claims: request.claims, correlationID: request.correlationID)
      recentUse[target.key] = (target, deps.clock.now())
      return result.busValue(correlationID: request.correlationID)
    } catch let error as TesseraError where error.code == .network && usesCache {
      // Entra's extended lifetime: while the IdP is unreachable, a token within ext_expires_in still serves.
      let nowSeconds = deps.clock.now().timeIntervalSince1970
      if let cached = cachedToken(target), let extended = cached.extExpiresOn, Double(extended) > nowSeconds {
        logger.notice(
          "The identity provider is unreachable; serving a token within its extended lifetime",
          metadata: ["correlation_id": "\(request.correlationID)", "error": "\(error.message)"])
        return TokenResult(accessToken: cached, grantedScopes: cached.scopes, account: account)
          .busValue(correlationID: request.correlationID)
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
    let key = target.key + "\u{1F}" + (claims ?? "")
    if let running = refreshes[key] { return try await running.value }
    let previous = refreshLanes[target.lane]
    let task = Task { () async throws -> TokenResult in
      // Wait for the refresh before this one on the same refresh token: it may rotate it.
      await previous?.value
      return try await self.redeemRefreshToken(for: target, claims: claims, correlationID: correlationID)
    }
    let laneEnd = Task { _ = await task.result }
    refreshLanes[target.lane] = laneEnd
    refreshes[key] = task
    defer {
      refreshes[key] = nil
      if refreshLanes[target.lane] == laneEnd { refreshLanes[target.lane] = nil }
    }
    return try await task.value
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
    guard let record = cache.refreshToken(accountID: account.id, environment: environment, clientID: target.clientID)
    else {
      throw TesseraError.interactionRequired(
        "\(account.username) has not signed in to client \(target.clientID) yet. Run an interactive sign-in (AcquireToken with this account, or `tessera login --client-id \(target.clientID)`): at most a click is needed."
      )
    }
    // resolveAccount checked that the authority may use this account (same issuer, or an Entra tenant
    // of the same cloud): only then does the refresh token go to its token endpoint.
    let tokenAuthority =
      target.authority.isMicrosoft && target.authority.environment == record.environment
      ? target.authority : try Authority(parsing: record.authority)
    let metadata = try await directory.metadata(for: tokenAuthority, policy: policy)
    var fields = [
      ("grant_type", "refresh_token"), ("client_id", target.clientID), ("refresh_token", record.secret),
      ("scope", Self.requestScopes(target.scopes)), ("client_info", "1"),
    ]
    if let merged = try claimsParameter(claims) { fields.append(("claims", merged)) }
    let knownInFamily = cache.appMetadata(environment: environment, clientID: target.clientID)?.familyID != nil
    do {
      let response = try await postToken(metadata.tokenEndpoint, fields, correlationID: correlationID)
      return try await accept(
        response, metadata: metadata, authority: tokenAuthority, clientID: target.clientID,
        requestedScopes: target.scopes, nonce: nil, knownAccount: account)
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

  /// POSTs to a token endpoint, honouring Retry-After from earlier answers.
  func postToken(_ endpoint: String, _ fields: [(String, String)], correlationID: String) async throws
    -> TokenResponse
  {
    let now = deps.clock.now()
    if let until = throttledUntil[endpoint] {
      if until > now {
        throw TesseraError.network(
          "The identity provider asked for a pause; retry in \(Int(until.timeIntervalSince(now).rounded(.up))) s.")
      }
      throttledUntil[endpoint] = nil
    }
    // No cancellation check after this: a refresh token the IdP has rotated must be stored.
    let response = try await deps.http.send(
      .form(endpoint, fields, headers: [("client-request-id", correlationID), ("return-client-request-id", "true")]))
    guard response.status == 200 else {
      if response.status == 429 || response.status == 503,
        let seconds = OAuthErrorResponse.retryAfterSeconds(response.headers["retry-after"]), seconds > 0
      {
        throttledUntil[endpoint] = deps.clock.now().addingTimeInterval(Double(seconds))
      }
      throw OAuthErrorResponse.map(
        status: response.status, body: response.body, endpoint: endpoint, retryAfter: response.headers["retry-after"])
    }
    return try TokenResponse.parse(response.body, endpoint: endpoint)
  }

  // MARK: - Refresh-ahead

  /// Refreshes a token in the background (joining a refresh already under way), unless it failed
  /// recently. Failures are quiet and retried with backoff; they never drop an account.
  func startBackgroundRefresh(_ target: SilentTarget) {
    let key = target.key
    guard backgroundRefreshes[key] == nil, refreshes[key + "\u{1F}"] == nil else { return }
    if let wait = backoff[key], wait.notBefore > deps.clock.now() { return }
    backgroundRefreshes[key] = Task {
      await self.backgroundRefresh(target)
    }
  }

  private func backgroundRefresh(_ target: SilentTarget) async {
    let correlationID = RequestParser.newCorrelationID()
    do {
      _ = try await refresh(target, claims: nil, correlationID: correlationID)
      backoff[target.key] = nil
      logger.debug("Refreshed a token ahead of expiry", metadata: ["correlation_id": "\(correlationID)"])
    } catch {
      let failures = (backoff[target.key]?.failures ?? 0) + 1
      let delay = min(30 * pow2(failures - 1), 900)
      backoff[target.key] = (failures, deps.clock.now().addingTimeInterval(delay))
      logger.notice(
        "A background refresh failed; the cached token still serves and the refresh is retried",
        metadata: [
          "correlation_id": "\(correlationID)", "error": "\(TesseraError.wrap(error))",
          "retry_in_s": "\(Int(delay))",
        ])
    }
    backgroundRefreshes[target.key] = nil
  }

  private func pow2(_ n: Int) -> Double { Double(1 << min(max(n, 0), 10)) }

  /// One pass of refresh-ahead: tokens used in the last 30 minutes whose refresh time has come (or
  /// that are close to expiry) are refreshed now, so callers in steady use never wait on the network.
  public func refreshAhead() async {
    for (target, time) in fastPath.takeUses() {  // answers the bus thread gave by itself count as use
      recentUse[target.key] = (target, Date(timeIntervalSince1970: time))
    }
    let now = deps.clock.now()
    for (key, use) in recentUse {
      guard now.timeIntervalSince(use.lastUsed) <= Self.recentUseWindow, cache.accounts[use.target.account.id] != nil
      else {
        recentUse[key] = nil
        continue
      }
      guard let cached = cachedToken(use.target) else { continue }
      let nowSeconds = Int64(now.timeIntervalSince1970)
      let due =
        (cached.refreshOn.map { nowSeconds >= $0 } ?? false)
        || cached.expiresOn - nowSeconds < TokenLifetimes.refreshAheadMargin
      if due { startBackgroundRefresh(use.target) }
    }
    await waitForBackgroundRefreshes()
  }

  /// Waits until no background refresh is running (for the maintenance loop and tests).
  public func waitForBackgroundRefreshes() async {
    while let (_, task) = backgroundRefreshes.first { await task.value }
  }

  /// Runs refresh-ahead every `interval` seconds until the task is cancelled.
  public func runMaintenance(interval: Double = 30) async {
    while !Task.isCancelled {
      do { try await deps.clock.sleep(seconds: interval) } catch { return }
      await refreshAhead()
    }
  }
}
