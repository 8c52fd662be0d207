import Logging
import TesseraInterface

/// Per-application access control in the token actor: it asks the policy (AccessPolicy, a value
/// with the rules), puts the user's question (one per app at a time, as a task of its own, so
/// other callers go on meanwhile), writes grants, and audits every decision to the journal.
extension Broker {
  /// Journal MESSAGE_IDs of the audit records (`journalctl MESSAGE_ID=…`).
  public enum AuditMessage {
    public static let allowed = "0e7c3a4b5d2f4a1e9b6c8d7e1f2a3b4c"
    public static let refused = "7f1e2d3c4b5a49688776a5b4c3d2e1f0"
    public static let granted = "3a9d8c7b6e5f4a3b9c2d1e0f8a7b6c5d"
    public static let firstUse = "5b8e2f1a9c3d4e7f8a6b5c4d3e2f1a0b"
  }

  /// The operation an app asks for (what grants name), for the audit and the messages.
  public typealias AccessOperation = AccessGrant.Operation

  var accessMode: AccessMode { config.accessMode }

  /// Whether the request's caller may do what it asks. Throws AccessDenied with what to do. A
  /// request without a caller is the daemon's own.
  func authorize(
    _ caller: CallerInfo?, clientID: String, accountID: String, username: String, scopes: [String],
    authority: String, operation: AccessOperation
  ) async throws {
    guard let caller else { return }
    let request = AccessRequest(
      caller: caller, clientID: clientID, accountID: accountID, username: username, scopes: scopes,
      authority: authority, operation: operation)
    switch access.decide(request, grants: cache, canAsk: deps.prompter != nil || appPrompts) {
    case .allow(let reason, let noteUse):
      audit(.allowed, request, reason: reason)
      if noteUse, let app = caller.app { noteAllowedUse(app, request) }
      return
    case .ask:
      if let app = caller.app, deps.prompter != nil || appPrompts, try await ask(deps.prompter, app: app, request) {
        return
      }
    case .refuse:
      break
    }
    let otherHosts = caller.app.map { cache.otherForwardHosts(of: $0) } ?? []
    audit(
      .refused, request,
      reason: otherHosts.isEmpty ? accessMode.rawValue : "\(accessMode.rawValue), forward name granted for another host"
    )
    throw access.refusal(
      request, heldByOther: cache.isHeld(clientID, byOtherThan: caller.app?.key ?? ""), otherForwardHosts: otherHosts)
  }

  /// Asks the user, once per app at a time: another question from the same app while one waits is
  /// not asked (refused), and an app the user declined is not asked again for 10 minutes. True when
  /// the user allowed it; false when nobody answered (refused by the caller, with the command).
  private func ask(_ prompter: (any AccessPrompter)?, app: AppIdentity, _ request: AccessRequest) async throws -> Bool {
    switch access.gate(request, app: app, now: deps.clock.now()) {
    case .refuse(let error):
      audit(.refused, request, reason: "user, earlier")
      throw error
    case .skip:
      return false
    case .ask:
      // The same app's question is on screen: one at a time (a question per call would flood).
      guard pendingQuestions[app.key] == nil else { return false }
    }
    let question = AccessQuestion(
      app: app, clientID: request.clientID, username: request.username, scopes: request.scopes,
      operation: request.operation.rawValue)
    // The desktop app asks when it runs (its answer is final: a dismissed question is not asked
    // again elsewhere); else the portal's dialog or a notification.
    let info = consentInfo(question, authority: request.authority)
    let task = Task { () -> AccessAnswer? in
      if await self.appPrompts {
        let answer = await self.askApp(
          .consent, info, answers: [Question.allowOnce, Question.allowAlways, Question.deny])
        switch answer?.answer {
        case Question.allowOnce?: return .allowOnce
        case Question.allowAlways?: return .allowAlways
        case Question.deny?: return .deny
        default: return nil
        }
      }
      return await prompter?.ask(question)
    }
    pendingQuestions[app.key] = task
    let answer = await task.value
    pendingQuestions[app.key] = nil
    access.answered(answer, request, app: app, now: deps.clock.now())
    switch answer {
    case .allowOnce?:
      audit(.allowed, request, reason: "user, once")
      // The user just said yes to this: it is no news to them, but later uses are not new either
      // (unless the account was signed out while the question was up).
      if request.operation == .token, cache.accounts[request.accountID] != nil {
        noteFirstUse(
          app, accountID: request.accountID, username: request.username, clientID: request.clientID, notify: false)
      }
      return true
    case .allowAlways?:
      audit(.allowed, request, reason: "user, always")
      // The grant is for that account, at that authority, for the scopes the user saw, added to
      // what the app was granted before; a sign-in's grant comes when it completes. Nothing is
      // written for an account signed out while the question was up.
      if request.accountID != AccessGrant.anyAccount, cache.accounts[request.accountID] != nil {
        try await grant(userGrant(app: app, request), caller: nil)
        noteAllowedUse(app, request, notify: false)
      }
      return true
    case .deny?:
      audit(.refused, request, reason: "user")
      throw AccessPolicy.denied(request, app: app)
    case nil:
      return false  // nobody could be asked, or no answer
    }
  }

  /// After an allowed token call: the bus thread may answer this app the same request from now
  /// on, and its first use of the account is noted. Nothing for sign-ins and the other operations
  /// (the bus thread answers only tokens; a sign-in's use is no news to the user).
  func noteAllowedUse(_ app: AppIdentity, _ request: AccessRequest, notify: Bool = true) {
    guard request.operation == .token else { return }
    fastPath.noteAllowed(
      app: app.key, clientID: request.clientID, accountID: request.accountID, authority: request.authority,
      scopes: request.scopes)
    noteFirstUse(
      app, accountID: request.accountID, username: request.username, clientID: request.clientID, notify: notify)
  }

  /// The grant "Always allow" gives: these resource scopes (none: OpenID Connect's only) at this
  /// authority, merged into the app's grant for the client and account when it has one (scopes
  /// and operations added, never taken away; two different authorities make it any authority).
  func userGrant(app: AppIdentity, _ request: AccessRequest) -> AccessGrant {
    let (clientID, accountID, authority, operation) = (
      request.clientID, request.accountID, request.authority, request.operation
    )
    let resources = ScopeSet.resourceScopes(request.scopes)
    var grant = AccessGrant(
      app: app.key, clientID: clientID, accountID: accountID,
      grantedAt: Int64(deps.clock.now().timeIntervalSince1970), via: "user", authority: authority,
      scopes: resources.sorted())
    if let old = cache.grants.first(where: { $0.app == app.key && $0.clientID == clientID && $0.accountID == accountID }
    ) {
      grant.scopes = old.scopes.map { resources.union($0).sorted() }
      grant.operations = old.operations.map { ops in
        Set(ops + [operation]).sorted { $0.rawValue < $1.rawValue }
      }
      grant.authority = old.authority == authority ? authority : nil
    }
    return grant
  }

  /// The first time an app uses an account, a notification says so (`notify_first_use`); the
  /// memory of it is kept in the keyring, so it is said once, not once per daemon start.
  func noteFirstUse(
    _ app: AppIdentity, accountID: String, username: String, clientID: String, notify: Bool = true
  ) {
    // Off: nothing is noted either (no item per app and account to keep).
    guard config.notifyFirstUse, accountID != AccessGrant.anyAccount,
      !cache.hasUsed(app: app.key, accountID: accountID),
      let operations = cache.noteUse(
        app: app.key, accountID: accountID, at: Int64(deps.clock.now().timeIntervalSince1970))
    else { return }
    if notify {
      deps.events.appFirstUsedAccount(
        FirstUse(app: app, accountID: accountID, username: username, clientID: clientID))
      logger.notice(
        "An app used an account for the first time",
        metadata: [
          "MESSAGE_ID": "\(AuditMessage.firstUse)", "app": "\(app.display)", "app_key": "\(app.key)",
          "account": "\(username)", "client_id": "\(clientID)",
        ])
    }
    // Queued behind earlier writes, not awaited: the token is not kept waiting for the keyring,
    // and nothing a caller is served changes, so the bus thread's answers stay published.
    _ = storeWriter.enqueue(operations, retryLater: true)
  }

  /// After an interactive sign-in: the app that completed it may use that client and account.
  func grantAfterSignIn(_ caller: CallerInfo?, clientID: String, account: Account) async {
    guard let app = caller?.app else { return }
    // The user just signed this app in: its use of the account is no news.
    noteFirstUse(app, accountID: account.id, username: account.username, clientID: clientID, notify: false)
    guard !cache.grants.contains(where: { $0.covers(app: app.key, clientID: clientID, accountID: account.id) })
    else { return }
    let grant = AccessGrant(
      app: app.key, clientID: clientID, accountID: account.id,
      grantedAt: Int64(deps.clock.now().timeIntervalSince1970), via: "sign-in")
    do {
      try await apply(cache.upsert(grant: grant))
      deps.events.managementChanged(.grants)
      logger.notice(
        "Access granted: the app that signed in may use this client and account",
        metadata: [
          "MESSAGE_ID": "\(AuditMessage.granted)", "app": "\(app.display)", "app_key": "\(app.key)",
          "client_id": "\(clientID)", "account": "\(account.username)", "via": "sign-in",
        ])
    } catch {
      logger.warning(
        "Could not save the grant of the app that signed in; it is asked again next time",
        metadata: ["app": "\(app.display)", "error": "\(TesseraError.wrap(error))"])
    }
  }

  /// The accounts `caller` may see: those it holds a grant for (nil: all of them).
  func visibleAccountIDs(_ caller: CallerInfo?) -> Set<String>? {
    access.visibleAccountIDs(caller, grants: cache.grants)
  }

  // MARK: Managing grants (tessera access)

  public func grants() async throws -> [AccessGrant] {
    try await ensureLoaded()
    return cache.grants.sorted { ($0.app, $0.clientID, $0.accountID) < ($1.app, $1.clientID, $1.accountID) }
  }

  /// Only an identified, unconfined program of the user may see or change grants (see AccessPolicy).
  func checkMayManage(_ caller: CallerInfo?) throws { try AccessPolicy.checkMayManage(caller) }

  public func grant(_ grant: AccessGrant, caller: CallerInfo?) async throws {
    try checkMayManage(caller)
    try await ensureLoaded()
    try await apply(cache.upsert(grant: grant))
    fastPath.forgetAllowed()
    deps.events.managementChanged(.grants)
    logger.notice(
      "Access granted",
      metadata: [
        "by_app": "\(caller?.app?.display ?? "tesserad")", "by_pid": "\(caller?.pid.map(String.init) ?? "?")",
        "MESSAGE_ID": "\(AuditMessage.granted)", "app_key": "\(grant.app)", "client_id": "\(grant.clientID)",
        "account_id": "\(grant.accountID)", "via": "\(grant.via)",
      ])
  }

  /// Removes the grants of `app` (for one client id, or all; for one account, or all); returns how
  /// many. `accountID` is an account id, a username, or "*" for the grants that cover every
  /// account (those are not cut down to the other accounts: they go whole, or stay).
  public func revoke(app: String, clientID: String?, accountID: String? = nil, caller: CallerInfo?) async throws -> Int
  {
    try checkMayManage(caller)
    guard AppIdentity(key: app) != nil else { throw Self.notAnAppKey(app) }
    try await ensureLoaded()
    let account = try accountID.map { try grantAccount($0, what: "revoke") }
    let before = cache.grants.count
    // `forward:NAME` without a host revokes the name's grants for every host it was forwarded to.
    let everyHost = AppIdentity(key: app).map { $0.kind == .forward && $0.forwardHost == nil } ?? false
    try await apply(
      cache.removeGrants { grant in
        (grant.app == app || (everyHost && grant.app.hasPrefix(app + "@")))
          && (clientID == nil || grant.clientID == clientID) && (account == nil || grant.accountID == account)
      })
    fastPath.forgetAllowed()
    let removed = before - cache.grants.count
    // Its standing choice of account goes too (for that account, or all): the next sign-in asks.
    if clientID == nil || account != nil {
      try await apply(cache.forgetChoices(app: app, accountID: account == AccessGrant.anyAccount ? nil : account))
    }
    if removed > 0 { deps.events.managementChanged(.grants) }
    logger.notice(
      "Access revoked",
      metadata: [
        "app_key": "\(app)", "client_id": "\(clientID ?? "*")", "account_id": "\(account ?? "*")",
        "grants": "\(removed)", "by_app": "\(caller?.app?.display ?? "tesserad")",
        "by_pid": "\(caller?.pid.map(String.init) ?? "?")",
      ])
    return removed
  }

  /// The account a grant names, as Grant and RevokeGrant take it: an id, a username (the caller
  /// may not see the accounts it grants), "*" for every account, or "" for the only one signed in.
  func grantAccount(_ accountID: String, what: String) throws -> String {
    if accountID.isEmpty {
      guard cache.accounts.count == 1, let only = cache.accounts.keys.first else {
        throw TesseraError.invalidArgument(
          "\(cache.accounts.count) accounts are signed in; name the one to \(what) (an id or username), or * for every account."
        )
      }
      return only
    }
    if accountID == AccessGrant.anyAccount || cache.accounts[accountID] != nil { return accountID }
    // A grant can outlive its account (signed out since): its id still names it.
    if cache.grants.contains(where: { $0.accountID == accountID }) { return accountID }
    let named = cache.accounts.values.filter { $0.username.lowercased() == accountID.lowercased() }
    guard named.count == 1 else {
      throw TesseraError.noSuchAccount(
        "No single signed-in account is '\(RequestOptions.clip(accountID))'; pass an account id, a username, or * for every account."
      )
    }
    return named[0].id
  }

  // MARK: Audit

  /// A forwarded caller asked for something other than a token: refused, and audited with the
  /// method it called as the operation.
  public func auditForwardRefusal(_ caller: CallerInfo, method: String) {
    let request = AccessRequest(
      caller: caller, clientID: "", accountID: "", username: "", scopes: [], authority: "", operation: .token)
    audit(.refused, request, reason: "forwarded callers may only get tokens", operation: method)
  }

  func audit(_ kind: AccessPolicy.AuditKind, _ request: AccessRequest, reason: String, operation: String? = nil) {
    let caller = request.caller
    let count = access.record(
      kind, request, reason: reason, at: Int64(deps.clock.now().timeIntervalSince1970), operation: operation)
    let metadata: Logger.Metadata = [
      "MESSAGE_ID": "\(kind == .allowed ? AuditMessage.allowed : AuditMessage.refused)",
      "app": "\(caller.app?.display ?? "unidentified")", "app_key": "\(caller.appKey ?? "unidentified")",
      "caller_pid": "\(caller.pid.map(String.init) ?? "?")", "client_id": "\(request.clientID)",
      "account": "\(request.username)", "scopes": "\(request.scopes.joined(separator: " "))",
      "operation": "\(operation ?? request.operation.rawValue)", "reason": "\(reason)",
      // A count per app that journald's rate limit cannot hide: a gap in it shows lines were dropped.
      "app_decisions": "\(count)",
    ]
    if kind == .allowed {
      logger.info("Access allowed", metadata: metadata)
    } else {
      logger.notice("Access refused", metadata: metadata)
    }
  }
}

extension Broker {
  static func notAnAppKey(_ app: String) -> TesseraError {
    .invalidArgument(
      "'\(RequestOptions.clip(app))' is not an app key. Keys look like flatpak:org.example.App, snap:name.app, desktop:org.gnome.Evolution or exe:/usr/bin/program; `tessera access list` and `tessera access log` show them."
    )
  }

  public func accessLog(caller: CallerInfo? = nil) throws -> [AccessRecord] {
    if accessMode != .open { try checkMayManage(caller) }
    return access.log.records.map(\.info)
  }

  public func grantList(caller: CallerInfo? = nil) async throws -> [GrantInfo] {
    if accessMode != .open { try checkMayManage(caller) }
    return try await grants().map { g in
      GrantInfo(
        app: g.app, appDisplay: AppIdentity(key: g.app)?.display ?? g.app, clientID: g.clientID,
        accountID: g.accountID,
        account: cache.accounts[g.accountID]?.username ?? (g.accountID == AccessGrant.anyAccount ? "*" : ""),
        grantedAt: g.grantedAt, via: g.via, authority: g.authority, scopes: g.scopes,
        operations: g.operations.map { $0.map(\.rawValue) })
    }
  }

  /// How many signed-in accounts GetAccounts hides from `caller`.
  public func hiddenAccountCount(_ caller: CallerInfo?) async throws -> Int {
    try await ensureLoaded()
    guard let visible = visibleAccountIDs(caller) else { return 0 }
    return cache.accounts.keys.filter { !visible.contains($0) }.count
  }

  /// Grant(app, client_id, account_id, authority, scopes, operations) from `tessera access
  /// grant`: checked, then stored. Empty authority, scopes or operations: any.
  public func grant(
    app: String, clientID: String, accountID: String, authority: String = "", scopes: [String] = [],
    operations: [String] = [], caller: CallerInfo?
  ) async throws {
    guard AppIdentity(key: app) != nil else { throw Self.notAnAppKey(app) }
    try RequestOptions.checkText(clientID, name: "client_id", max: ArgumentLimits.clientIDBytes, allowSpaces: false)
    guard !clientID.isEmpty else { throw TesseraError.invalidArgument("Grant needs a client id.") }
    var canonicalAuthority: String?
    if !authority.isEmpty {
      do { canonicalAuthority = try resolveAuthority(authority).url } catch {
        throw TesseraError.invalidArgument(
          "The grant's authority '\(RequestOptions.clip(authority))' cannot be used: \(TesseraError.wrap(error).message)"
        )
      }
    }
    let grantedScopes = scopes.isEmpty ? nil : try RequestParser.scopes(scopes)
    var ops: [AccessOperation]?
    if !operations.isEmpty {
      ops = try operations.map { name in
        guard let op = AccessOperation(rawValue: name) else {
          throw TesseraError.invalidArgument(
            "'\(RequestOptions.clip(name))' is not an operation; operations are \(AccessOperation.allCases.map(\.rawValue).joined(separator: ", "))."
          )
        }
        return op
      }
    }
    try await ensureLoaded()
    let resolved = try grantAccount(accountID, what: "grant")
    try await grant(
      AccessGrant(
        app: app, clientID: clientID, accountID: resolved, grantedAt: Int64(deps.clock.now().timeIntervalSince1970),
        via: "command", authority: canonicalAuthority,
        scopes: grantedScopes.map { ScopeSet.resourceScopes($0).sorted() },
        operations: ops), caller: caller)
  }
}
