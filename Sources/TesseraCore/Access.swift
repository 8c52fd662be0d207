import Logging

/// Per-application access control (issue 11): which app may use which client id and account.
///
/// - Trust on first use: the app that completes an interactive sign-in for a client id gets a
///   grant for it (that account).
/// - Another app asking for that client id, or any app asking for one it holds no grant for, is
///   refused (`strict`), asked about (`confirm`; with no desktop prompt available, refused with
///   the command that grants it), or let through (`open`). Every decision is audited.
/// - For unconfined apps this is consent, visibility and audit (they can read the keyring
///   themselves); for Flatpak and snap apps it is a boundary. docs/access-control.md says so.
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

  /// Whether `caller` may get tokens of `clientID` for `accountID`. Throws AccessDenied with what
  /// to do. `nil` callers are the daemon's own requests.
  func authorize(
    _ caller: CallerInfo?, clientID: String, accountID: String, username: String, scopes: [String],
    authority: String, operation: AccessOperation
  ) async throws {
    guard let caller else { return }
    let app = caller.app
    if let app,
      hasGrant(
        app: app.key, clientID: clientID, accountID: accountID, authority: authority, scopes: scopes,
        operation: operation)
    {
      audit(.allowed, caller, clientID: clientID, username: username, scopes: scopes, operation, reason: "grant")
      noteAllowedUse(
        app, clientID: clientID, accountID: accountID, username: username, authority: authority, scopes: scopes,
        operation: operation)
      return
    }
    // A sign-in is how an app gets its first grant: for a client id no other app holds, or one
    // this app holds without limits (for another account). An app whose grants for the client
    // are narrowed (scopes, authority, operations) signs in only within them (checked above).
    if operation == .signIn, let app {
      let mine = cache.grants.filter { $0.app == app.key && $0.clientID == clientID }
      let narrowed = mine.contains { $0.authority != nil || $0.scopes != nil || $0.operations != nil }
      if mine.isEmpty ? !isHeld(clientID, byOtherThan: app.key) : !narrowed {
        audit(.allowed, caller, clientID: clientID, username: username, scopes: scopes, operation, reason: "first use")
        return
      }
    }
    if accessMode == .open {
      audit(.allowed, caller, clientID: clientID, username: username, scopes: scopes, operation, reason: "open mode")
      if let app {
        noteAllowedUse(
          app, clientID: clientID, accountID: accountID, username: username, authority: authority, scopes: scopes,
          operation: operation)
      }
      return
    }
    if accessMode == .confirm, let app, let prompter = deps.prompter {
      switch try await ask(
        prompter, app: app, caller: caller, clientID: clientID, accountID: accountID, username: username,
        scopes: scopes, operation: operation)
      {
      case .allowOnce?:
        audit(.allowed, caller, clientID: clientID, username: username, scopes: scopes, operation, reason: "user, once")
        // The user just said yes to this: it is no news to them, but later uses are not new either
        // (unless the account was signed out while the question was up).
        if operation == .token, cache.accounts[accountID] != nil {
          noteFirstUse(app, accountID: accountID, username: username, clientID: clientID, notify: false)
        }
        return
      case .allowAlways?:
        audit(
          .allowed, caller, clientID: clientID, username: username, scopes: scopes, operation, reason: "user, always")
        // The grant is for that account, at that authority, for the scopes the user saw, added to
        // what the app was granted before; a sign-in's grant comes when it completes. Nothing is
        // written for an account signed out while the question was up.
        if accountID != AccessGrant.anyAccount, cache.accounts[accountID] != nil {
          try await grant(
            userGrant(
              app: app, clientID: clientID, accountID: accountID, authority: authority, scopes: scopes,
              operation: operation), caller: nil)
          noteAllowedUse(
            app, clientID: clientID, accountID: accountID, username: username, authority: authority, scopes: scopes,
            operation: operation, notify: false)
        }
        return
      case .deny?:
        audit(.refused, caller, clientID: clientID, username: username, scopes: scopes, operation, reason: "user")
        throw TesseraError.accessDenied(
          "You declined \(app.display) the use of \(username)'s sign-in for client \(clientID). It is not asked again for 10 minutes; to allow it later: tessera access grant --app '\(app.key)' --client-id \(clientID) --account \(username)"
        )
      case nil:
        break  // nobody could be asked, or no answer: refused below, with the command
      }
    }
    let who = app?.display ?? "An app Tessera could not identify (its process may have ended)"
    let heldByOther = isHeld(clientID, byOtherThan: app?.key ?? "")
    var message =
      "\(who) has no grant to use \(username)'s sign-in for client \(clientID)"
      + (heldByOther ? ", which another app uses." : ".")
    if let app {
      message +=
        " To allow it, run: tessera access grant --app '\(app.key)' --client-id \(clientID) --account \(username)"
    }
    if accessMode == .confirm { message += " (No desktop prompt could ask you, or it got no answer.)" }
    audit(
      .refused, caller, clientID: clientID, username: username, scopes: scopes, operation, reason: accessMode.rawValue)
    throw TesseraError.accessDenied(message)
  }

  /// After an allowed token call: the bus thread may answer this app the same request from now
  /// on, and its first use of the account is noted. Nothing for sign-ins and the other operations
  /// (the bus thread answers only tokens; a sign-in's use is no news to the user).
  func noteAllowedUse(
    _ app: AppIdentity, clientID: String, accountID: String, username: String, authority: String,
    scopes: [String], operation: AccessOperation, notify: Bool = true
  ) {
    guard operation == .token else { return }
    fastPath.noteAllowed(app: app.key, clientID: clientID, accountID: accountID, authority: authority, scopes: scopes)
    noteFirstUse(app, accountID: accountID, username: username, clientID: clientID, notify: notify)
  }

  /// The grant "Always allow" gives: these resource scopes (none: OpenID Connect's only) at this
  /// authority, merged into the app's grant for the client and account when it has one (scopes
  /// and operations added, never taken away; two different authorities make it any authority).
  func userGrant(
    app: AppIdentity, clientID: String, accountID: String, authority: String, scopes: [String],
    operation: AccessOperation
  ) -> AccessGrant {
    let resources = ScopeSet.resourceScopes(scopes)
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

  /// Whether one of `app`'s grants covers this use: client, account, authority, operation and
  /// every requested scope (OpenID Connect's own scopes are always allowed).
  func hasGrant(
    app: String, clientID: String, accountID: String, authority: String?, scopes: [String],
    operation: AccessOperation
  ) -> Bool {
    cache.grants.contains { g in
      g.covers(app: app, clientID: clientID, accountID: accountID, authority: authority, operation: operation)
        && (g.scopes.map { ScopeSet.covers(granted: $0, requested: scopes) } ?? true)
    }
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

  /// Whether another app holds `clientID`: a grant for it or for a member of its Microsoft family
  /// (whose family refresh token would serve it), or tokens stored before any grant existed (an
  /// upgraded install: the app that signed in then is unknown, so no app may claim it by a
  /// first sign-in).
  func isHeld(_ clientID: String, byOtherThan app: String) -> Bool {
    let others = cache.grants.filter { $0.app != app }
    if others.contains(where: { $0.clientID == clientID }) { return true }
    let families = Set(cache.appMetadata.values.compactMap { $0.clientID == clientID ? $0.familyID : nil })
    let knownOutside = cache.appMetadata.values.contains { $0.clientID == clientID && $0.familyID == nil }
    if !knownOutside, cache.refreshTokens.contains(where: { $0.familyID != nil }) {
      // In a family, or not known not to be: the family's members count.
      let members = Set(
        cache.appMetadata.values.filter { m in m.familyID != nil && (families.isEmpty || families.contains(m.familyID!))
        }
        .map(\.clientID))
      if others.contains(where: { members.contains($0.clientID) }) { return true }
    }
    let ungranted =
      cache.refreshTokens.contains { $0.slot == clientID } && !cache.grants.contains { $0.clientID == clientID }
    return ungranted
  }

  /// Asks the user, once per app at a time: another question from the same app while one waits is
  /// not asked (refused), and an app the user declined is not asked again for 10 minutes. The
  /// question waits as a task of its own, so other callers go on meanwhile (actor reentrancy).
  func ask(
    _ prompter: any AccessPrompter, app: AppIdentity, caller: CallerInfo, clientID: String, accountID: String,
    username: String, scopes: [String], operation: AccessOperation
  ) async throws -> AccessAnswer? {
    let key = "\(app.key)\u{0}\(clientID)\u{0}\(accountID)"
    if let until = declinedUntil[key], until > deps.clock.now() {
      audit(
        .refused, caller, clientID: clientID, username: username, scopes: scopes, operation, reason: "user, earlier")
      throw TesseraError.accessDenied(
        "You declined \(app.display) the use of \(username)'s sign-in for client \(clientID) a moment ago; it is not asked again before 10 minutes have passed. To allow it: tessera access grant --app '\(app.key)' --client-id \(clientID) --account \(username)"
      )
    }
    if let waiting = pendingQuestions[app.key] {
      // The same app's question is on screen: one at a time (a question per call would flood).
      _ = waiting
      return nil
    }
    if let quiet = unansweredUntil[app.key], quiet > deps.clock.now() {
      // Its last question went unanswered (dismissed, timed out, or nobody to ask): an app
      // calling in a loop gets one question a minute, not one per call.
      return nil
    }
    let question = AccessQuestion(
      app: app, clientID: clientID, username: username, scopes: scopes, operation: operation.rawValue)
    let task = Task { await prompter.ask(question) }
    pendingQuestions[app.key] = task
    let answer = await task.value
    pendingQuestions[app.key] = nil
    if answer == .deny { declinedUntil[key] = deps.clock.now().addingTimeInterval(600) }
    if answer == nil {
      if unansweredUntil.count > 1024 { unansweredUntil = unansweredUntil.filter { $0.value > deps.clock.now() } }
      unansweredUntil[app.key] = deps.clock.now().addingTimeInterval(60)
    }
    if declinedUntil.count > 1024 { declinedUntil = declinedUntil.filter { $0.value > deps.clock.now() } }
    return answer
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

  /// The accounts `caller` may see: those it holds a grant for (all of them in open mode, or for
  /// the daemon's own requests).
  func visibleAccountIDs(_ caller: CallerInfo?) -> Set<String>? {
    guard let caller, accessMode != .open else { return nil }
    guard let app = caller.app else { return [] }
    let mine = cache.grants.filter { $0.app == app.key && $0.allows(.listAccounts) }
    if mine.contains(where: { $0.accountID == AccessGrant.anyAccount }) { return nil }
    return Set(mine.map(\.accountID))
  }

  // MARK: Managing grants (tessera access)

  public func grants() async throws -> [AccessGrant] {
    try await ensureLoaded()
    return cache.grants.sorted { ($0.app, $0.clientID, $0.accountID) < ($1.app, $1.clientID, $1.accountID) }
  }

  /// Only an identified, unconfined program of the user (the `tessera` command) may change grants
  /// or read who uses what: a sandboxed app must not grant itself, and one Tessera could not
  /// identify (its connecting process gone) might be one.
  func checkMayManage(_ caller: CallerInfo?) throws {
    guard let caller else { return }
    guard let app = caller.app else {
      throw TesseraError.accessDenied(
        "Tessera could not tell which app is calling (the process that connected has ended), so it may not see or change who gets tokens."
      )
    }
    if app.isVerified {
      throw TesseraError.accessDenied(
        "\(app.display) runs in a sandbox and may not see or change who gets tokens. Run `tessera access` outside it.")
    }
  }

  public func grant(_ grant: AccessGrant, caller: CallerInfo?) async throws {
    try checkMayManage(caller)
    try await ensureLoaded()
    try await apply(cache.upsert(grant: grant))
    fastPath.forgetAllowed()
    logger.notice(
      "Access granted",
      metadata: [
        "by_app": "\(caller?.app?.display ?? "tesserad")", "by_pid": "\(caller?.pid.map(String.init) ?? "?")",
        "MESSAGE_ID": "\(AuditMessage.granted)", "app_key": "\(grant.app)", "client_id": "\(grant.clientID)",
        "account_id": "\(grant.accountID)", "via": "\(grant.via)",
      ])
  }

  /// Removes the grants of `app` (for one client id, or all); returns how many.
  public func revoke(app: String, clientID: String?, caller: CallerInfo?) async throws -> Int {
    try checkMayManage(caller)
    guard AppIdentity(key: app) != nil else { throw Self.notAnAppKey(app) }
    try await ensureLoaded()
    let before = cache.grants.count
    try await apply(cache.removeGrants { $0.app == app && (clientID == nil || $0.clientID == clientID) })
    fastPath.forgetAllowed()
    let removed = before - cache.grants.count
    logger.notice(
      "Access revoked",
      metadata: [
        "app_key": "\(app)", "client_id": "\(clientID ?? "*")", "grants": "\(removed)",
        "by_app": "\(caller?.app?.display ?? "tesserad")", "by_pid": "\(caller?.pid.map(String.init) ?? "?")",
      ])
    return removed
  }

  // MARK: Audit

  func audit(
    _ kind: AuditKind, _ caller: CallerInfo, clientID: String, username: String, scopes: [String],
    _ operation: AccessOperation, reason: String
  ) {
    let key = caller.appKey ?? "unidentified"
    let count = auditCounts.note(key, allowed: kind == .allowed)
    auditLog.append(
      AuditRecord(
        at: Int64(deps.clock.now().timeIntervalSince1970), app: caller.app, appKey: key,
        clientID: clientID, account: username, scopes: scopes, operation: operation.rawValue,
        decision: kind == .allowed ? "allowed" : "refused", reason: reason, count: count))
    let metadata: Logger.Metadata = [
      "MESSAGE_ID": "\(kind == .allowed ? AuditMessage.allowed : AuditMessage.refused)",
      "app": "\(caller.app?.display ?? "unidentified")", "app_key": "\(key)",
      "caller_pid": "\(caller.pid.map(String.init) ?? "?")", "client_id": "\(clientID)", "account": "\(username)",
      "scopes": "\(scopes.joined(separator: " "))", "operation": "\(operation.rawValue)", "reason": "\(reason)",
      // A count per app that journald's rate limit cannot hide: a gap in it shows lines were dropped.
      "app_decisions": "\(count)",
    ]
    if kind == .allowed {
      logger.info("Access allowed", metadata: metadata)
    } else {
      logger.notice("Access refused", metadata: metadata)
    }
  }

  enum AuditKind { case allowed, refused }
}

/// Per-app decision counters for the audit (bounded: the oldest apps are dropped past 4096).
struct AuditCounts {
  private(set) var counts: [String: (allowed: Int, refused: Int)] = [:]

  mutating func note(_ app: String, allowed: Bool) -> Int {
    if counts[app] == nil && counts.count >= 4096 { counts.removeAll() }
    var c = counts[app] ?? (0, 0)
    if allowed { c.allowed += 1 } else { c.refused += 1 }
    counts[app] = c
    return c.allowed + c.refused
  }
}

/// One audited decision, as GetAccessLog returns it (never a token). It keeps the caller's own
/// values (its pinned identity and key) rather than text built for it, so the strings of a
/// thousand records from a few apps are stored a few times, not a thousand.
struct AuditRecord: Sendable {
  var at: Int64
  var app: AppIdentity?
  var appKey: String
  var clientID: String
  var account: String
  var scopes: [String]
  var operation: String
  var decision: String
  var reason: String
  var count: Int

  var busValue: [String: BusValue] {
    [
      "at": .int64(at), "app": .string(app?.display ?? "unidentified"), "app_key": .string(appKey),
      "client_id": .string(clientID),
      "account": .string(account), "scopes": .strings(scopes), "operation": .string(operation),
      "decision": .string(decision), "reason": .string(reason), "app_decisions": .uint32(UInt32(clamping: count)),
    ]
  }
}

/// The last decisions, newest last, bounded.
struct AuditLog {
  static let capacity = 1000
  private(set) var records: [AuditRecord] = []

  mutating func append(_ record: AuditRecord) {
    if records.count >= Self.capacity { records.removeFirst(records.count - Self.capacity + 1) }
    var record = record
    // A caller's calls repeat their scopes: the array the record before holds serves again.
    if let last = records.last, last.scopes == record.scopes { record.scopes = last.scopes }
    records.append(record)
  }
}

extension Broker {
  static func notAnAppKey(_ app: String) -> TesseraError {
    .invalidArgument(
      "'\(RequestOptions.clip(app))' is not an app key. Keys look like flatpak:org.example.App, snap:name.app, desktop:org.gnome.Evolution or exe:/usr/bin/program; `tessera access list` and `tessera access log` show them."
    )
  }

  public func accessLog(caller: CallerInfo? = nil) throws -> [[String: BusValue]] {
    if accessMode != .open { try checkMayManage(caller) }
    return auditLog.records.map(\.busValue)
  }

  public func grantList(caller: CallerInfo? = nil) async throws -> [[String: BusValue]] {
    if accessMode != .open { try checkMayManage(caller) }
    return try await grants().map { g in
      [
        "app": .string(g.app), "app_display": .string(AppIdentity(key: g.app)?.display ?? g.app),
        "client_id": .string(g.clientID), "account_id": .string(g.accountID),
        "account": .string(cache.accounts[g.accountID]?.username ?? (g.accountID == AccessGrant.anyAccount ? "*" : "")),
        "granted_at": .int64(g.grantedAt), "via": .string(g.via),
      ]
      // Each limit only when there is one: absent means any, and an empty scope list means
      // OpenID Connect's own scopes only.
      .merging(
        [
          "authority": g.authority.map(BusValue.string), "scopes": g.scopes.map(BusValue.strings),
          "operations": g.operations.map { .strings($0.map(\.rawValue)) },
        ].compactMapValues { $0 }
      ) { $1 }
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
    // An id, a username (the caller may not see the accounts it grants), "*", or "" for the only one.
    var resolved = accountID
    if accountID.isEmpty {
      guard cache.accounts.count == 1, let only = cache.accounts.keys.first else {
        throw TesseraError.invalidArgument(
          "\(cache.accounts.count) accounts are signed in; name one (an id or username), or * for every account.")
      }
      resolved = only
    } else if accountID != AccessGrant.anyAccount && cache.accounts[accountID] == nil {
      let named = cache.accounts.values.filter { $0.username.lowercased() == accountID.lowercased() }
      guard named.count == 1 else {
        throw TesseraError.noSuchAccount(
          "No single signed-in account is '\(RequestOptions.clip(accountID))'; pass an account id, a username, or * for every account."
        )
      }
      resolved = named[0].id
    }
    try await grant(
      AccessGrant(
        app: app, clientID: clientID, accountID: resolved, grantedAt: Int64(deps.clock.now().timeIntervalSince1970),
        via: "command", authority: canonicalAuthority,
        scopes: grantedScopes.map { ScopeSet.resourceScopes($0).sorted() },
        operations: ops), caller: caller)
  }
}
