import TesseraInterface

/// Account health (AccountHealth) as the broker records it, and the status report
/// (org.tessera.Broker1.GetStatus, `tessera status --json`).
extension Broker {
  /// A token came: for a refresh (`interactive` false) of exactly these scopes, or from a sign-in.
  /// `familyID`: the family the answer says the app is in (its refresh token serves them all).
  func noteSuccess(
    accountID: String, clientID: String, authority: String, scopes: [String], interactive: Bool, familyID: String?
  ) {
    var sharing: Set<String> = []
    if let familyID {
      sharing = Set(cache.appMetadata.values.filter { $0.familyID == familyID }.map(\.clientID))
    }
    guard
      health.succeeded(
        accountID: accountID, key: .init(clientID: clientID, authority: authority, scopes: scopes),
        interactive: interactive, sharing: sharing)
    else { return }
    logger.notice("The account no longer needs a sign-in", metadata: ["account_id": "\(accountID)"])
    deps.events.signInNoLongerNeeded(accountID: accountID)
    deps.events.attentionChanged(health.attentionNeeded)
  }

  func noteFailure(_ target: SilentTarget, _ error: TesseraError) {
    // A refresh that raced a sign-out: nothing to track.
    guard cache.accounts[target.account.id] != nil else { return }
    // An app that never signed in to this account (no refresh token of its own, or refused the
    // family's by the broker's own record) is the normal first step of every MSAL app: it signs in
    // next by itself. Only a refresh token the identity provider refused means the user must act.
    if error.code == .interactionRequired && error.detail?.oauthError == nil { return }
    noteNeed(
      SignInNeed(
        accountID: target.account.id, username: target.account.username, clientID: target.clientID,
        scopes: target.scopes, authority: target.authority.url), error)
  }

  /// `need` is a sign-in only the user can do (`error` says why): AttentionNeeded, and a
  /// notification unless the user was just told.
  func noteNeed(_ need: SignInNeed, _ error: TesseraError) {
    let change = health.failed(need, error: error, now: deps.clock.now())
    if change.attentionChanged {
      logger.notice(
        "The account needs a sign-in",
        metadata: [
          "account_id": "\(need.accountID)", "client_id": "\(need.clientID)", "error": "\(error.code.rawValue)",
        ])
      deps.events.attentionChanged(health.attentionNeeded)
    }
    if let notify = change.notify { deps.events.signInNeeded(notify) }
  }

  /// The accounts that need a sign-in (the AttentionNeeded property), sorted.
  public var attentionNeeded: [String] { health.attentionNeeded }

  /// The app that last found `accountID` needing a sign-in, for the notification's action.
  public func signInNeed(for accountID: String) -> SignInNeed? { health.need(for: accountID) }

  /// Starts the sign-in a notification's action asks for: interactive, for that app and account,
  /// with the account's username as the login hint. The result goes to the cache, as any sign-in's.
  public func signInForNotification(accountID: String) async throws -> TokenResult {
    try await ensureLoaded()
    guard let need = health.need(for: accountID) else {
      throw TesseraError.noSuchAccount("The account \(accountID) does not need a sign-in any more.")
    }
    var request = TokenRequest(
      clientID: need.clientID, scopes: need.scopes, accountID: need.accountID, correlationID: CorrelationID.new())
    request.authority = need.authority
    request.loginHint = need.username
    // No bus caller: nobody gets InteractionPending; the browser opens (or the user follows the log).
    let caller = CallerInfo(busName: "")
    logger.info(
      "Starting a sign-in from the notification",
      metadata: [
        "account_id": "\(accountID)", "client_id": "\(need.clientID)", "correlation_id": "\(request.correlationID)",
      ])
    return try await signIn(request, caller: caller)
  }

  /// The configuration in force no longer trusts the account's authority (trusted_authorities, or
  /// the administrator's policy): its refresh token is not sent there until it does again.
  func isBlockedByPolicy(_ account: Account) -> Bool {
    do {
      _ = try policy.validate(account.authority)
      return false
    } catch let error as TesseraError where error.code == .untrustedAuthority {
      return true
    } catch {
      return false
    }
  }

  /// The report `tessera status --json` prints: per account its state, last error, next refresh and
  /// the tokens cached per client (their expiry, never their values). Schema: StatusReport.
  public func status() async throws -> StatusReport.Report {
    // A locked keyring is a state to report, not a reason to fail: until it is unlocked the
    // accounts are not known, and the report says so.
    // Answered within storeAnswerSeconds whatever the keyring does: its state is what is reported.
    var storeError: TesseraError?
    do { try await ensureLoadedOrSayWhy() } catch { storeError = TesseraError.wrap(error) }
    let now = deps.clock.now()
    let recent = scheduler.recentTargets(now: now, accountExists: { cache.accounts[$0] != nil })
    var accounts = cache.accounts.values.sorted(by: { ($0.username, $0.id) < ($1.username, $1.id) }).map {
      account in
      let entry = health.entry(account.id)
      var lastError: StatusReport.AccountStatus.LastErrorInfo?
      if let error = entry.lastError, let at = entry.lastErrorAt {
        lastError = .init(
          code: error.code.rawValue, message: SafeText.clip(error.message, limit: 1000),
          at: Int64(at.timeIntervalSince1970))
      }
      // The next refresh the daemon will make by itself: of the tokens in recent use, the earliest
      // refresh time (refresh-ahead), or expiry less the margin.
      let due = recent.filter { $0.account.id == account.id }.compactMap { target -> Int64? in
        guard let token = cachedToken(target), !TokenExpiry.isNever(token.expiresOn) else { return nil }
        return token.refreshOn ?? (token.expiresOn - Int64(RequestOptions.defaultMinValidity))
      }
      let tokens = cache.accessTokens.filter { $0.accountID == account.id }.sorted {
        ($0.clientID, $0.scopes.joined(separator: " ")) < ($1.clientID, $1.scopes.joined(separator: " "))
      }
      return StatusReport.AccountStatus(
        id: account.id, username: account.username, authority: account.authority,
        state: isBlockedByPolicy(account) ? StatusReport.blockedByPolicy : entry.state.rawValue,
        lastError: lastError, nextRefresh: due.min(),
        tokens: tokens.map {
          .init(
            clientID: $0.clientID, scopes: $0.scopes, expiresOn: $0.expiresOn,
            refreshOn: TokenExpiry.isNever($0.expiresOn) ? nil : $0.refreshOn)
        },
        refreshTokenClients: Array(Set(cache.refreshTokens.filter { $0.accountID == account.id }.map(\.clientID)))
          .sorted(),
        refreshTokenExpiresOn: cache.refreshTokens.filter { $0.accountID == account.id }.compactMap(\.expiresOn).min(),
        name: account.name, current: cache.currentAccounts.contains(account.id))
    }
    let bound = boundAccountIDs()
    for index in accounts.indices {
      accounts[index].tokenBinding = bound.contains(accounts[index].id) ? "dpop" : "bearer"
    }
    let store = deps.store.storeDescription
    var notes = configNotes
    notes.providers = config.providers.map {
      .init(name: $0.name, issuer: $0.issuer, profile: $0.profile)
    }
    notes.defaultAuthority = config.defaultAuthority
    var report = StatusReport.Report(
      storeProblem: storeError.map { SafeText.clip($0.message, limit: 1000) }, accounts: accounts,
      attentionNeeded: health.attentionNeeded, storeKind: store.kind.rawValue, storePath: store.path,
      storeKeyLocation: store.key,
      storeNotes: store.notes.suffix(20).map { SafeText.clip($0, limit: 1000) }, config: notes)
    report.sessionBus = sessionBus
    report.dpopKind = deps.proofKeys?.kind.rawValue ?? "none"
    report.dpopSummary = deps.proofKeys?.summary ?? "tokens are not bound to this machine"
    return report
  }
}
