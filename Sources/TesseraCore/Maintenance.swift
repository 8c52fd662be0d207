import Logging
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// What the engine does by itself, between callers: the maintenance loop (refresh-ahead, and
/// refreshes a killed run left in flight), machine events (resume, network back), and following
/// the clocks (a wall clock set, a suspend). The daemon runs `runMaintenance` as a service of its own.
extension Broker {
  /// One pass of refresh-ahead: tokens used in the last 30 minutes whose refresh time has come (or
  /// that are close to expiry) are refreshed now, so callers in steady use never wait on the network.
  public func refreshAhead() async {
    for (target, time) in fastPath.takeUses() {  // answers the bus thread gave by itself count as use
      scheduler.noteUse(target, at: Date(timeIntervalSince1970: time))
    }
    let now = deps.clock.now()
    for target in scheduler.recentTargets(now: now, accountExists: { cache.accounts[$0] != nil }) {
      guard let cached = cachedToken(target),
        RefreshScheduler.isDue(cached, now: Int64(now.timeIntervalSince1970))
      else { continue }
      startBackgroundRefresh(target)
    }
    await waitForBackgroundRefreshes()
    noteLapsingRefreshTokens(now: now)
  }

  /// How long before a refresh token lapses the user is told (AttentionNeeded, a notification).
  static let lapseWarning: Int64 = 86_400

  /// Refresh tokens with a lifetime of their own (`refresh_token_expires_in`: a GitHub App's lasts
  /// about 6 months) that lapse within a day: the account needs a sign-in before then, or its
  /// apps stop getting tokens. Told once per need; a sign-in (a new refresh token) clears it.
  func noteLapsingRefreshTokens(now: Date) {
    let seconds = Int64(now.timeIntervalSince1970)
    for record in cache.refreshTokens {
      guard let lapses = record.expiresOn, lapses - seconds <= Self.lapseWarning,
        let account = cache.accounts[record.accountID]
      else { continue }
      let need = SignInNeed(
        accountID: account.id, username: account.username, clientID: record.clientID, scopes: record.scopes ?? [],
        authority: record.authority)
      guard health.entry(account.id).needs[AccountHealth.NeedKey(need)] == nil else { continue }
      let when = lapses > seconds ? "lapses at" : "lapsed at"
      noteNeed(
        need,
        TesseraError.interactionRequired(
          "\(account.username)'s sign-in at \(record.authority) \(when) \(RFC3339.format(lapses)), when its refresh token expires. Sign in again (`tessera login`) to keep tokens coming."
        ))
    }
  }

  /// The machine woke from suspend, or the network came back: every token in recent use is
  /// refreshed now (its expiry may have passed while asleep, and the IdP may have revoked it),
  /// instead of at the next maintenance pass. At most once a minute per kind of event, however
  /// often it comes: a resume that finds the network still down must not hold back the refresh
  /// when the network comes back a few seconds later.
  public func machineResumed(reason: String) async {
    // logind's resume signal comes before the next maintenance pass: the uses from before the
    // sleep are moved now, or they would look too old to refresh.
    checkClock()
    let now = deps.clock.now()
    if let last = lastMachineEvent[reason], now.timeIntervalSince(last) < 60, now >= last {
      logger.debug(
        "Ignoring a machine event: tokens were refreshed for it less than a minute ago",
        metadata: ["event": "\(reason)"])
      return
    }
    lastMachineEvent[reason] = now
    for (target, time) in fastPath.takeUses() {
      scheduler.noteUse(target, at: Date(timeIntervalSince1970: time))
    }
    scheduler.clearBackoff()
    let targets = scheduler.recentTargets(now: now, accountExists: { cache.accounts[$0] != nil })
    logger.info(
      "Refreshing the tokens in recent use after a machine event",
      metadata: ["event": "\(reason)", "tokens": "\(targets.count)"])
    for target in targets { startBackgroundRefresh(target) }
    await waitForBackgroundRefreshes()
  }

  /// Waits until no background refresh is running (for the maintenance loop and tests).
  public func waitForBackgroundRefreshes() async {
    while let task = scheduler.anyBackground { await task.value }
  }

  /// Runs refresh-ahead every `interval` seconds until the task is cancelled; `afterEachPass`
  /// runs after each (the daemon hands freed memory back to the system there).
  public func runMaintenance(interval: Double = 30, afterEachPass: @Sendable () -> Void = {}) async {
    // First of all: refreshes a killed run left in flight (their accounts are checked now).
    await recoverInterruptedRefreshes()
    while !Task.isCancelled {
      do { try await deps.clock.sleep(seconds: interval) } catch { return }
      if checkClock() > Self.clockJumpThreshold { await machineResumed(reason: "resume") }
      await recoverInterruptedRefreshes()
      await refreshAhead()
      afterEachPass()
    }
  }

  /// A wall-clock move larger than this between two maintenance passes, beyond the time that
  /// passed, is the clock being set; a gap this long between time awake and time passed is a
  /// suspend. NTP's slewing never comes near.
  static let clockJumpThreshold = 60.0

  /// The three clocks at one moment (see BrokerClock).
  struct ClockReading {
    var wall: Date
    var awake: Double
    var elapsed: Double
    init(_ clock: any BrokerClock) {
      wall = clock.now()
      awake = clock.awake()
      elapsed = clock.elapsed()
    }
    /// Since `earlier`: how far the wall clock was set, and how long the machine slept.
    func since(_ earlier: ClockReading) -> (set: Double, slept: Double) {
      let passed = elapsed - earlier.elapsed
      return (wall.timeIntervalSince(earlier.wall) - passed, passed - (awake - earlier.awake))
    }
  }

  /// The wall clock was set by `delta` seconds (by hand, or NTP stepping a wrong clock): the times
  /// kept on it move with it. Access tokens keep the real time they have left (in memory and in the
  /// keyring), so none is served past its real expiry after the clock is set back; backoffs,
  /// Retry-After pauses and the pauses after the user's answers about apps keep their length; uses
  /// stay as recent as they were. (Account health dates and the IdP metadata cache do not move:
  /// they only say when something happened, or when to fetch again.)
  func clockSet(by delta: Double) {
    logger.notice(
      "The wall clock was set; token times follow it",
      metadata: ["seconds": "\(Int(delta.rounded()))", "direction": "\(delta > 0 ? "forward" : "backward")"])
    // Uses the bus thread recorded are on the old clock too: counted before everything moves.
    for (target, time) in fastPath.takeUses() {
      scheduler.noteUse(target, at: Date(timeIntervalSince1970: time))
    }
    scheduler.clockSet(by: delta)
    // Written back too, so a restart keeps the real expiries.
    enqueueWrite(cache.clockSet(by: delta))
    // The user's answers about apps keep their length as well.
    access.clockSet(by: delta)
  }

  /// Wall clock minus elapsed time: what the bus thread's answers are published with (FastPath).
  nonisolated var clockOffset: Double { deps.clock.now().timeIntervalSince1970 - deps.clock.elapsed() }

  /// Compares the clocks with their last reading (each request, each maintenance pass, each
  /// resume): a wall clock set is followed at once (clockSet), before any token is looked at; a
  /// suspend moves the uses recorded before it by the time slept (recent use counts time awake).
  /// Returns how long the machine slept (0 when it did not, or when that was seen already).
  @discardableResult
  func checkClock() -> Double {
    let now = ClockReading(deps.clock)
    let (set, slept) = now.since(lastClock)
    lastClock = now
    if abs(set) > Self.clockJumpThreshold { clockSet(by: set) }
    guard slept > Self.clockJumpThreshold else { return 0 }
    for (target, time) in fastPath.takeUses() {
      scheduler.noteUse(target, at: Date(timeIntervalSince1970: time))
    }
    scheduler.shiftUses(by: slept, notPast: now.wall)
    return slept
  }
}

/// Waits for `task` at most `seconds`: true when it finished in time, false when the time ran out
/// first (the task goes on); its error when it failed in time. Unlike a task group, it does not
/// wait for the task once the time is up. Real time, not the broker's clock: it bounds how long a
/// person waits, and is no event of the engine's own (whose sleeps the tests' fake clock counts).
func firstOf(_ task: Task<Void, any Error>, orAfter seconds: Double) async throws -> Bool {
  let race = Race()
  return try await withCheckedThrowingContinuation { continuation in
    race.start(continuation)
    Task {
      do {
        try await task.value
        race.finish(.success(true))
      } catch {
        race.finish(.failure(error))
      }
    }
    Task {
      try? await Task.sleep(for: .seconds(seconds))
      race.finish(.success(false))
    }
  }
}

/// The continuation of `firstOf`, resumed by whichever side finishes first.
private final class Race: Sendable {
  private let continuation = Locked<CheckedContinuation<Bool, any Error>?>(nil)
  func start(_ c: CheckedContinuation<Bool, any Error>) { continuation.withLock { $0 = c } }
  func finish(_ result: Result<Bool, any Error>) {
    continuation.withLock { c in
      c?.resume(with: result)
      c = nil
    }
  }
}
