#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// What a silent request is for: one account, authority, realm, client and scope set.
struct SilentTarget: Sendable {
  var account: Account
  var authority: Authority
  var realm: String
  var clientID: String
  var scopes: [String]

  /// The cached token it is served from: equal keys are served by the same token.
  struct Key: Hashable, Sendable {
    var accountID: String
    var authority: String
    var realm: String
    var clientID: String
    /// Normalised (see ScopeSet).
    var scopes: [String]
  }

  var key: Key {
    Key(
      accountID: account.id, authority: authority.url, realm: realm, clientID: clientID,
      scopes: ScopeSet.normalize(scopes))
  }

  /// Refresh tokens are per account and environment (a family token serves several clients).
  var lane: RefreshScheduler.Lane { .init(accountID: account.id, environment: authority.environment) }
}

/// The refresh engine's bookkeeping, owned by the token actor: single flight (callers that need the
/// same refresh share one request), lanes (refreshes on one refresh token run one after another,
/// each with the latest rotated token), refresh-ahead of tokens in recent use, backoff after a
/// failed background refresh, and throttling after a Retry-After. Changes never suspend.
struct RefreshScheduler {
  /// One refresh: what it produces, and the claims it carries.
  struct RefreshKey: Hashable, Sendable {
    var target: SilentTarget.Key
    var claims: String?
  }

  /// The refresh tokens one sequence of refreshes uses: an account's at one identity provider.
  struct Lane: Hashable, Sendable {
    var accountID: String
    var environment: String
  }

  /// A refresh under way, and the end of its lane.
  struct Flight {
    let task: Task<Broker.TokenResult, any Error>
    let laneEnd: Task<Void, Never>
  }

  /// How long after its last use a token is still refreshed ahead of time.
  static let recentUseWindow: Double = 30 * 60
  /// Backoff after failed background refreshes: 30 s, doubling, at most 15 minutes.
  static let firstBackoff: Double = 30
  static let maxBackoff: Double = 900

  private var inFlight: [RefreshKey: Flight] = [:]
  private var lanes: [Lane: Task<Void, Never>] = [:]
  private var recentUse: [SilentTarget.Key: (target: SilentTarget, lastUsed: Date)] = [:]
  private var backoff: [SilentTarget.Key: (failures: Int, notBefore: Date)] = [:]
  private var background: [SilentTarget.Key: Task<Void, Never>] = [:]
  /// Token endpoints that answered 429/503 with Retry-After: no request before the date.
  private var throttledUntil: [String: Date] = [:]

  // MARK: Single flight and lanes

  /// The refresh under way for `key`, if any: a caller joins it.
  func running(_ key: RefreshKey) -> Task<Broker.TokenResult, any Error>? { inFlight[key]?.task }

  /// Starts a refresh behind the last one queued on its lane: `make` gets the task to wait for first.
  mutating func start(
    _ key: RefreshKey, lane: Lane, _ make: (_ previous: Task<Void, Never>?) -> Task<Broker.TokenResult, any Error>
  ) -> Flight {
    let task = make(lanes[lane])
    let laneEnd = Task { _ = await task.result }
    let flight = Flight(task: task, laneEnd: laneEnd)
    lanes[lane] = laneEnd
    inFlight[key] = flight
    return flight
  }

  /// A refresh ended: it is no longer joined, and its lane is free unless another queued behind it.
  mutating func finish(_ key: RefreshKey, lane: Lane, _ flight: Flight) {
    if inFlight[key]?.laneEnd == flight.laneEnd { inFlight[key] = nil }
    if lanes[lane] == flight.laneEnd { lanes[lane] = nil }
  }

  // MARK: Refresh-ahead

  mutating func noteUse(_ target: SilentTarget, at time: Date) { recentUse[target.key] = (target, time) }

  /// May a background refresh of `target` start now? Not while one runs (background or a caller's
  /// own), nor during its backoff.
  func mayRefreshInBackground(_ target: SilentTarget.Key, now: Date) -> Bool {
    guard background[target] == nil, inFlight[RefreshKey(target: target, claims: nil)] == nil else { return false }
    if let wait = backoff[target], wait.notBefore > now { return false }
    return true
  }

  mutating func backgroundStarted(_ target: SilentTarget.Key, _ task: Task<Void, Never>) { background[target] = task }

  /// A background refresh ended; on failure returns the backoff before the next try.
  mutating func backgroundEnded(_ target: SilentTarget.Key, failed: Bool, now: Date) -> Double? {
    background[target] = nil
    guard failed else {
      backoff[target] = nil
      return nil
    }
    let failures = (backoff[target]?.failures ?? 0) + 1
    let delay = min(Self.firstBackoff * Double(1 << min(failures - 1, 10)), Self.maxBackoff)
    backoff[target] = (failures, now.addingTimeInterval(delay))
    return delay
  }

  /// The wall clock jumped by `delta` seconds (suspend, or a clock set): every time kept here moves
  /// with it, so uses stay as recent, and backoffs and Retry-After pauses as long, as they were.
  /// (Set back an hour, a 30 s backoff would otherwise last an hour and a half.)
  mutating func clockSet(by delta: Double) {
    for (key, use) in recentUse { recentUse[key] = (use.target, use.lastUsed.addingTimeInterval(delta)) }
    for (key, wait) in backoff { backoff[key] = (wait.failures, wait.notBefore.addingTimeInterval(delta)) }
    for (endpoint, until) in throttledUntil { throttledUntil[endpoint] = until.addingTimeInterval(delta) }
  }

  /// Moves the recorded uses by `seconds` (a suspend: recent use is counted in time awake), none
  /// past `now` (uses recorded since the wake need no move).
  mutating func shiftUses(by seconds: Double, notPast now: Date) {
    for (key, use) in recentUse {
      recentUse[key] = (use.target, min(use.lastUsed.addingTimeInterval(seconds), now))
    }
  }

  /// Forgets every backoff (the machine woke up or the network came back: old failures say nothing).
  mutating func clearBackoff() { backoff.removeAll() }

  /// The targets used within the recent-use window whose account still exists; forgets the others.
  mutating func recentTargets(now: Date, accountExists: (String) -> Bool) -> [SilentTarget] {
    var targets: [SilentTarget] = []
    for (key, use) in recentUse {
      guard now.timeIntervalSince(use.lastUsed) <= Self.recentUseWindow, accountExists(use.target.account.id) else {
        recentUse[key] = nil
        continue
      }
      targets.append(use.target)
    }
    return targets
  }

  /// Is a cached token due for a refresh ahead of its expiry?
  static func isDue(_ token: AccessTokenRecord, now: Int64) -> Bool {
    (token.refreshOn.map { now >= $0 } ?? false)
      || Double(token.expiresOn - now)
        < min(Double(TokenLifetimes.refreshAheadMargin), token.servingMargin(nil) + 60)
  }

  /// A background refresh still running, if any.
  var anyBackground: Task<Void, Never>? { background.first?.value }

  // MARK: Throttling

  /// Seconds left before `endpoint` may be asked again, or nil when it may be asked now.
  mutating func throttleRemaining(_ endpoint: String, now: Date) -> Double? {
    guard let until = throttledUntil[endpoint] else { return nil }
    if until > now { return until.timeIntervalSince(now) }
    throttledUntil[endpoint] = nil
    return nil
  }

  mutating func throttle(_ endpoint: String, until: Date) { throttledUntil[endpoint] = until }
}
