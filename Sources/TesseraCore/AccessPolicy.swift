import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// Per-application access control (issue 11) as a value: which app may use which client id and
/// account, what the user said recently, and the audit. The token actor holds one and asks it;
/// everything here is decided from a request, the cache's grants and the time, so it is
/// unit-tested without the actor (AccessPolicyTests).
///
/// - Trust on first use: the app that completes an interactive sign-in for a client id gets a
///   grant for it (that account).
/// - Another app asking for that client id, or any app asking for one it holds no grant for, is
///   refused (`strict`), asked about (`confirm`; with no desktop prompt available, refused with
///   the command that grants it), or let through (`open`). Every decision is audited.
/// - For unconfined apps this is consent, visibility and audit (they can read the keyring
///   themselves); for Flatpak and snap apps it is a boundary. docs/access-control.md says so.
struct AccessPolicy {
  /// The configured access_mode; a reload changes it (and keeps the answers and the audit).
  var mode: AccessMode
  /// Recent refusals by the user (app, client and account), until when they are not asked again.
  private(set) var declinedUntil: [String: Date] = [:]
  /// Apps whose last question got no answer, until when they are not asked again.
  private(set) var unansweredUntil: [String: Date] = [:]
  /// Decisions per app, for the audit, and the last ones for `tessera access log`.
  private(set) var counts = AuditCounts()
  private(set) var log = AuditLog()

  init(mode: AccessMode) { self.mode = mode }

  /// How long a "Deny" holds, and how long an unanswered app is not asked again.
  static let declineSeconds = 600.0
  static let unansweredSeconds = 60.0

  /// What the grants and the mode say, before anyone is asked.
  enum Decision: Equatable {
    /// Allowed, for this reason (audited as such). `noteUse`: a use the bus thread may repeat.
    case allow(reason: String, noteUse: Bool)
    /// Not covered: ask the user (confirm mode, an identified app).
    case ask
    /// Not covered, and nobody may be asked.
    case refuse
  }

  func decide(_ request: AccessRequest, grants cache: TokenCache, canAsk: Bool) -> Decision {
    let app = request.caller.app
    // A forward may only get tokens: never sign in (that opens a browser or shows a code here),
    // list or sign out, whatever its grants say.
    if let app, app.kind == .forward, request.operation != .token { return .refuse }
    if let app, cache.hasGrant(app: app.key, request) {
      return .allow(reason: "grant", noteUse: true)
    }
    // A sign-in is how an app gets its first grant: for a client id no other app holds, or one
    // this app holds without limits (for another account). An app whose grants for the client
    // are narrowed (scopes, authority, operations) signs in only within them (checked above).
    if request.operation == .signIn, let app {
      let mine = cache.grants.filter { $0.app == app.key && $0.clientID == request.clientID }
      let narrowed = mine.contains { $0.authority != nil || $0.scopes != nil || $0.operations != nil }
      if mine.isEmpty ? !cache.isHeld(request.clientID, byOtherThan: app.key) : !narrowed {
        return .allow(reason: "first use", noteUse: false)
      }
    }
    if mode == .open { return .allow(reason: "open mode", noteUse: app != nil) }
    if mode == .confirm, app != nil, canAsk { return .ask }
    return .refuse
  }

  /// Before a question: whether the user may be asked now. `.refuse` when they declined this app,
  /// client and account a moment ago (with what to do); `.skip` when the app is not asked again
  /// yet (its last question went unanswered); `.ask` otherwise.
  enum Gate: Equatable {
    case ask
    case skip
    case refuse(TesseraError)
  }

  func gate(_ request: AccessRequest, app: AppIdentity, now: Date) -> Gate {
    if let until = declinedUntil[Self.questionKey(request, app)], until > now {
      return .refuse(
        .accessDenied(
          "You declined \(app.display) the use of \(request.username)'s sign-in for client \(request.clientID) a moment ago; it is not asked again before 10 minutes have passed. To allow it: \(Self.grantCommand(app, request))"
        ))
    }
    // Its last question went unanswered (dismissed, timed out, or nobody to ask): an app calling
    // in a loop gets one question a minute, not one per call.
    if let quiet = unansweredUntil[app.key], quiet > now { return .skip }
    return .ask
  }

  /// What the user answered (nil: no answer): a denial is remembered for 10 minutes, no answer
  /// keeps the app from being asked again for a minute. Both tables stay bounded.
  mutating func answered(_ answer: AccessAnswer?, _ request: AccessRequest, app: AppIdentity, now: Date) {
    if answer == .deny { declinedUntil[Self.questionKey(request, app)] = now.addingTimeInterval(Self.declineSeconds) }
    if answer == nil {
      if unansweredUntil.count > 1024 { unansweredUntil = unansweredUntil.filter { $0.value > now } }
      unansweredUntil[app.key] = now.addingTimeInterval(Self.unansweredSeconds)
    }
    if declinedUntil.count > 1024 { declinedUntil = declinedUntil.filter { $0.value > now } }
  }

  /// The user said no, now.
  static func denied(_ request: AccessRequest, app: AppIdentity) -> TesseraError {
    .accessDenied(
      "You declined \(app.display) the use of \(request.username)'s sign-in for client \(request.clientID). It is not asked again for 10 minutes; to allow it later: \(grantCommand(app, request))"
    )
  }

  /// The refusal when the grants do not cover a request and nobody said yes: who, what, and the
  /// command that grants it.
  func refusal(_ request: AccessRequest, heldByOther: Bool, otherForwardHosts: [String] = []) -> TesseraError {
    let app = request.caller.app
    if let app, app.kind == .forward, request.operation != .token {
      return Self.forwardRefusal(
        app, request.operation == .signIn ? "sign in (do that here: `tessera login`)" : request.operation.rawValue)
    }
    let who = app?.display ?? "An app Tessera could not identify (its process may have ended)"
    var message =
      "\(who) has no grant to use \(request.username)'s sign-in for client \(request.clientID)"
      + (heldByOther ? ", which another app uses." : ".")
    if let app, !otherForwardHosts.isEmpty {
      message +=
        " The forward name \(app.id) was granted for \(otherForwardHosts.joined(separator: ", ")), not for \(app.forwardHost ?? "a container's socket"): a name used again for another host is not trusted on the first host's grants."
    }
    if let app { message += " To allow it, run: \(Self.grantCommand(app, request))" }
    if mode == .confirm { message += " (No desktop prompt could ask you, or it got no answer.)" }
    return .accessDenied(message)
  }

  static func grantCommand(_ app: AppIdentity, _ request: AccessRequest) -> String {
    "tessera access grant --app '\(app.key)' --client-id \(request.clientID) --account \(request.username)"
  }

  static func questionKey(_ request: AccessRequest, _ app: AppIdentity) -> String {
    "\(app.key)\u{0}\(request.clientID)\u{0}\(request.accountID)"
  }

  /// The wall clock was set: the user's answers keep their length.
  mutating func clockSet(by delta: Double) {
    for (key, until) in declinedUntil { declinedUntil[key] = until.addingTimeInterval(delta) }
    for (app, until) in unansweredUntil { unansweredUntil[app] = until.addingTimeInterval(delta) }
  }

  // MARK: Who may see and change what

  /// The accounts `caller` may see: those it holds a grant for (all of them in open mode, or for
  /// the daemon's own requests: nil).
  func visibleAccountIDs(_ caller: CallerInfo?, grants: [AccessGrant]) -> Set<String>? {
    // A forward (another machine, a container) sees only what it holds a grant for, in every mode.
    guard let caller, mode != .open || caller.app?.kind == .forward else { return nil }
    guard let app = caller.app else { return [] }
    let mine = grants.filter { $0.app == app.key && $0.allows(.listAccounts) }
    if mine.contains(where: { $0.accountID == AccessGrant.anyAccount }) { return nil }
    return Set(mine.map(\.accountID))
  }

  /// Whether `caller` may sign `account` out (of `clientID`, or of every client): an app only an
  /// account it holds a sign-out grant for, and of one client only one it holds.
  func checkSignOut(_ caller: CallerInfo?, account: Account, clientID: String?, grants: [AccessGrant]) throws {
    if let app = caller?.app, app.kind == .forward { throw Self.forwardRefusal(app, "sign accounts out") }
    guard let caller, mode != .open else { return }
    let allowed =
      caller.app.map { app in
        grants.contains {
          $0.covers(app: app.key, clientID: clientID ?? $0.clientID, accountID: account.id, operation: .signOut)
        }
      } ?? false
    guard !allowed else { return }
    let who = caller.app?.display ?? "This app"
    if let clientID {
      throw TesseraError.accessDenied(
        "\(who) holds no grant for client \(clientID), so it may not sign \(account.username) out of it.")
    }
    throw TesseraError.accessDenied(
      "\(who) holds no grant for \(account.username), so it may not sign it out. Use `tessera logout`.")
  }

  /// Only an identified, unconfined program of the user (the `tessera` command) may change grants
  /// or read who uses what: a sandboxed app must not grant itself, and one Tessera could not
  /// identify (its connecting process gone) might be one.
  static func checkMayManage(_ caller: CallerInfo?) throws {
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
    if app.kind == .forward { throw forwardRefusal(app, "see or change who gets tokens") }
  }

  /// A forwarded caller (another machine, a container) may only get tokens.
  static func forwardRefusal(_ app: AppIdentity, _ what: String) -> TesseraError {
    .accessDenied(
      "\(app.display) may only get tokens: it may not \(what). Do that on the machine tesserad runs on.")
  }

  // MARK: Audit

  enum AuditKind { case allowed, refused }

  /// Records a decision in the access log; returns the app's decision count (for the journal line).
  mutating func record(
    _ kind: AuditKind, _ request: AccessRequest, reason: String, at: Int64, operation: String? = nil
  ) -> Int {
    let caller = request.caller
    let key = caller.appKey ?? "unidentified"
    let count = counts.note(key, allowed: kind == .allowed)
    log.append(
      AuditRecord(
        at: at, app: caller.app, appKey: key, clientID: request.clientID, account: request.username,
        scopes: request.scopes, operation: operation ?? request.operation.rawValue,
        decision: kind == .allowed ? "allowed" : "refused", reason: reason, count: count))
    return count
  }
}

/// One request for access: who asks, for which client, account, authority and scopes, to do what.
struct AccessRequest: Sendable {
  var caller: CallerInfo
  var clientID: String
  /// The account's id, or `AccessGrant.anyAccount` for a sign-in of an account not known yet.
  var accountID: String
  /// What the user reads: the account's username (or the sign-in's login hint).
  var username: String
  var scopes: [String]
  var authority: String
  var operation: AccessGrant.Operation
}

extension TokenCache {
  /// Whether one of `app`'s grants covers this request: client, account, authority, operation
  /// and every requested scope (OpenID Connect's own scopes are always allowed).
  func hasGrant(app: String, _ request: AccessRequest) -> Bool {
    grants.contains { g in
      g.covers(
        app: app, clientID: request.clientID, accountID: request.accountID, authority: request.authority,
        operation: request.operation)
        && (g.scopes.map { ScopeSet.covers(granted: $0, requested: request.scopes) } ?? true)
    }
  }

  /// For a forward: the hosts that grants of the same forward name were made for, other than its
  /// own ("no host recorded" for a container's socket, or a grant made before hosts were part of
  /// a forward's key). A name used again for another host is asked about again, and these say why.
  func otherForwardHosts(of app: AppIdentity) -> [String] {
    guard app.kind == .forward else { return [] }
    let hosts = grants.compactMap { grant -> String? in
      guard let other = AppIdentity(key: grant.app), other.kind == .forward, other.id == app.id, other.key != app.key
      else { return nil }
      return other.forwardHost ?? "no host recorded"
    }
    return Set(hosts).sorted()
  }

  /// Whether another app holds `clientID`: a grant for it or for a member of its Microsoft family
  /// (whose family refresh token would serve it), or tokens stored before any grant existed (an
  /// upgraded install: the app that signed in then is unknown, so no app may claim it by a
  /// first sign-in).
  func isHeld(_ clientID: String, byOtherThan app: String) -> Bool {
    let others = grants.filter { $0.app != app }
    if others.contains(where: { $0.clientID == clientID }) { return true }
    let families = Set(appMetadata.values.compactMap { $0.clientID == clientID ? $0.familyID : nil })
    let knownOutside = appMetadata.values.contains { $0.clientID == clientID && $0.familyID == nil }
    if !knownOutside, refreshTokens.contains(where: { $0.familyID != nil }) {
      // In a family, or not known not to be: the family's members count.
      let members = Set(
        appMetadata.values.filter { m in m.familyID != nil && (families.isEmpty || families.contains(m.familyID!)) }
          .map(\.clientID))
      if others.contains(where: { members.contains($0.clientID) }) { return true }
    }
    return refreshTokens.contains { $0.slot == clientID } && !grants.contains { $0.clientID == clientID }
  }
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

  var info: AccessRecord {
    AccessRecord(
      at: at, app: app?.display ?? "unidentified", appKey: appKey, clientID: clientID, account: account,
      scopes: scopes, operation: operation, decision: decision, reason: reason,
      appDecisions: UInt32(clamping: count))
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
