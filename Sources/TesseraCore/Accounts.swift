import Logging
import TesseraInterface

/// How a request names an account, for every front: by its id, by the identity provider's own id
/// for the user (`oid` or `sub`), or by username. The rule is one: an id given names that account
/// exactly and nothing else (another IdP's `sub` is case-sensitive, and an account no longer signed
/// in names none, never another of the same name); else the local id, else the username, each
/// case-insensitive and only when exactly one account has it. Empty parts count as not given.
public struct AccountReference: Sendable, Equatable {
  public var id: String?
  public var localID: String?
  public var username: String?

  public init(id: String? = nil, localID: String? = nil, username: String? = nil) {
    self.id = id
    self.localID = localID
    self.username = username
  }

  /// The account this names among `accounts`; nil when none (or more than one) does.
  public func match(in accounts: [Account]) -> Account? {
    if let id, !id.isEmpty { return accounts.first { $0.id == id } }
    func only(_ value: String?, _ key: (Account) -> String) -> Account? {
      guard let value = value?.lowercased(), !value.isEmpty else { return nil }
      let found = accounts.filter { key($0).lowercased() == value }
      return found.count == 1 ? found[0] : nil
    }
    return only(localID, \.localAccountID) ?? only(username, \.username)
  }
}

/// GetAccounts and SignOut, and revocation of refresh tokens at the identity provider.
extension Broker {
  // MARK: - The current account

  /// Makes an account (an id, or a username) the current one of its identity provider: requests
  /// that name no account get it when several are signed in there. Only a program that may manage
  /// access may choose (the user's own CLI); returns the account.
  public func makeCurrent(_ reference: String, authority: String?, caller: CallerInfo?) async throws -> Account {
    try checkMayManage(caller)
    try await ensureLoaded()
    var candidates = Array(cache.accounts.values)
    if let authority, !authority.isEmpty {
      let wanted = try resolveAuthority(authority)
      candidates = candidates.filter {
        Self.serves(wanted, $0) || (wanted.isMicrosoft && $0.environment == wanted.environment)
      }
    }
    let account =
      cache.accounts[reference].flatMap { a in candidates.contains { $0.id == a.id } ? a : nil }
      ?? AccountReference(username: reference).match(in: candidates)
    guard let account else {
      let named = candidates.filter { $0.username.lowercased() == reference.lowercased() }.count
      throw named > 1
        ? TesseraError.invalidArgument(
          "\(named) accounts are named '\(RequestOptions.clip(reference))'. Pass its account id (see `tessera accounts`), or --authority."
        )
        : TesseraError.noSuchAccount(
          "No signed-in account is '\(RequestOptions.clip(reference))'. `tessera accounts` lists them; `tessera login` signs one in."
        )
    }
    let operations = cache.makeCurrent(accountID: account.id)
    if !operations.isEmpty {
      try await apply(operations)
      fastPath.clear()  // answers published for "no account named" may have been another account's
      deps.events.accountsChanged()
      logger.notice(
        "Current account chosen",
        metadata: [
          "account_id": "\(account.id)", "environment": "\(account.environment)",
          "by_app": "\(caller?.app?.display ?? "tesserad")",
        ])
    }
    return account
  }

  /// The accounts the user made current, one at most per identity provider.
  public func currentAccountIDs() -> Set<String> { cache.currentAccounts }

  // MARK: - GetAccounts

  /// The signed-in accounts a filter selects, sorted by username, for any front.
  public func knownAccounts(matching filter: AccountFilter) async throws -> [Account] {
    try await ensureLoaded()
    var accounts = Array(cache.accounts.values)
    // An app sees the accounts it holds a grant for (all of them in open mode).
    if let visible = visibleAccountIDs(filter.caller) {
      let hidden = accounts.filter { !visible.contains($0.id) }.count
      accounts = accounts.filter { visible.contains($0.id) }
      if hidden > 0, let caller = filter.caller {
        logger.info(
          "Accounts hidden from an app without a grant for them",
          metadata: ["app": "\(caller.app?.display ?? "unidentified")", "hidden_accounts": "\(hidden)"])
      }
    }
    if let authority = filter.authority {
      let wanted = try Authority(parsing: authority)
      accounts = accounts.filter { Self.serves(wanted, $0) }
    }
    if let clientID = filter.clientID {
      // Accounts this client can use silently: its own refresh token, or its family's.
      accounts = accounts.filter {
        cache.refreshToken(accountID: $0.id, environment: $0.environment, clientID: clientID) != nil
      }
    }
    if let username = filter.username?.lowercased() {
      accounts = accounts.filter { $0.username.lowercased() == username }
    }
    return accounts.sorted { ($0.username, $0.id) < ($1.username, $1.id) }
  }

  // MARK: - SignOut

  public func signOut(_ request: SignOutRequest) async throws {
    try await ensureLoaded()
    guard let account = cache.accounts[request.accountID] else {
      throw TesseraError.noSuchAccount(
        "No account with id '\(RequestOptions.clip(request.accountID))' is signed in. Call GetAccounts for the list.")
    }
    // An app may sign out only an account it may use, and of one client only one it holds.
    try access.checkSignOut(request.caller, account: account, clientID: request.clientID, grants: cache.grants)
    // The browser first: a provider that cannot end its session there, or a browser that cannot
    // start, is said before anything is removed, so the user can choose a plain sign-out.
    if request.browser { try await openEndSession(of: account, correlationID: request.correlationID) }
    // Memory first: a refresh finishing meanwhile sees the account gone and stores nothing.
    let before = cache
    let targets = cache.refreshTokens.filter {
      $0.accountID == account.id && (request.clientID == nil || $0.slot == request.clientID)
    }
    let operations = cache.remove(accountID: account.id, clientID: request.clientID)
    do {
      try await apply(operations, retryLater: false)
    } catch {
      // The keyring is unavailable: nothing is signed out, and the caller is told.
      cache.restore(from: before, accountID: account.id)
      throw error
    }
    if request.clientID == nil {
      deps.events.accountsChanged()
      if health.forget(account.id) {
        deps.events.signInNoLongerNeeded(accountID: account.id)
        deps.events.attentionChanged(health.attentionNeeded)
      }
    }
    if request.revoke {
      for record in targets { await revoke(record, correlationID: request.correlationID) }
    }
  }

  /// Opens the account's provider's end_session_endpoint (OpenID Connect RP-Initiated Logout 1.0)
  /// in the user's browser, with the newest id_token the broker holds for the account as
  /// `id_token_hint` and the client it was issued to. The browser is given a loopback URL that
  /// sends it on, as for a sign-in: the id_token never appears in a command line. The listener
  /// stays for `endSessionStartSeconds`, or until the browser has come for the URL.
  func openEndSession(of account: Account, correlationID: String) async throws {
    let authority = try Authority(parsing: account.authority)
    let newest = cache.accessTokens.filter { $0.accountID == account.id && $0.idToken != nil }
      .max { ($0.cachedAt ?? 0, $0.expiresOn) < ($1.cachedAt ?? 0, $1.expiresOn) }
    let clientID =
      newest?.clientID
      ?? cache.refreshTokens.first { $0.accountID == account.id }?.clientID
    let metadata = try await metadata(for: authority, clientID: clientID)
    guard let endpoint = metadata.endSessionEndpoint, !endpoint.isEmpty else {
      throw TesseraError.invalidArgument(
        "\(account.environment) names no end_session_endpoint (OpenID Connect RP-Initiated Logout), so Tessera cannot end your session there from the browser: sign out on the provider's web site yourself. Nothing was signed out here; leave out browser (`tessera logout` without --browser) to sign out of Tessera."
      )
    }
    var query: [(String, String)] = []
    if let hint = newest?.idToken { query.append(("id_token_hint", hint)) }
    if let clientID { query.append(("client_id", clientID)) }
    query.append(("logout_hint", account.username))
    let separator = endpoint.contains(Character("?")) ? "&" : "?"
    let url = endpoint + separator + FormEncoding.encode(query)
    let listener = try deps.listeners.listen(port: 0, hostName: "127.0.0.1")
    let start = listener.startURL(opening: url)
    do {
      try deps.browser.open(start)
    } catch {
      listener.close()
      throw TesseraError.environment(
        "Could not start the browser to end the session at \(account.environment) (\(TesseraError.wrap(error).message)). Nothing was signed out: set `browser` in config.toml, or sign out without the browser."
      )
    }
    logger.info(
      "Opened the provider's sign-out page in the browser",
      metadata: [
        "correlation_id": "\(correlationID)", "authority": "\(authority.url)", "account_id": "\(account.id)",
        "id_token_hint": "\(newest != nil)",
      ])
    let seconds = Self.endSessionStartSeconds
    Task.detached {
      _ = try? await listener.waitForStart(timeoutSeconds: seconds)
      listener.close()
    }
  }

  /// How long the loopback URL that sends the browser to the sign-out page is served.
  static let endSessionStartSeconds = 120.0

  /// RFC 7009 revocation; failures are logged, never fatal to a sign-out.
  func revoke(_ record: RefreshTokenRecord, correlationID: String) async {
    do {
      let authority = try Authority(parsing: record.authority)
      guard (try? policy.validate(authority.url)) != nil else {
        logger.notice(
          "The account's authority is no longer trusted (config.toml); its refresh token was removed here but not sent there to be revoked",
          metadata: ["correlation_id": "\(correlationID)", "authority": "\(authority.url)"])
        return
      }
      guard let endpoint = try await metadata(for: authority, clientID: record.clientID).revocationEndpoint else {
        logger.info(
          "The identity provider has no revocation endpoint; removing the token locally",
          metadata: ["correlation_id": "\(correlationID)"])
        return
      }
      let client = try clientCredentials(for: authority, clientID: record.clientID)
      let response = try await deps.http.send(
        .form(
          endpoint,
          [("token", record.secret), ("token_type_hint", "refresh_token"), ("client_id", record.clientID)]
            + client.fields,
          headers: [("client-request-id", correlationID)] + client.headers))
      if response.status != 200 {
        logger.warning(
          "The identity provider refused to revoke a refresh token: it stays valid there until it expires or the user revokes the app there",
          metadata: [
            "status": "\(response.status)", "correlation_id": "\(correlationID)", "authority": "\(authority.url)",
            "client_id": "\(record.clientID)", "account_id": "\(record.accountID)",
          ])
      }
    } catch {
      logger.warning(
        "Could not revoke a refresh token at the identity provider",
        metadata: ["error": "\(TesseraError.wrap(error))", "correlation_id": "\(correlationID)"])
    }
  }
}
