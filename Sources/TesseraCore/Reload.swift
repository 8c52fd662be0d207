import Logging
import TesseraInterface

/// The configuration in force, and its reload without a restart (issue 26): tesserad reads the
/// files again on SIGHUP (`systemctl --user reload tessera`) and hands the result here. Cached
/// tokens, accounts, connections and sign-ins under way are kept; what the configuration decides
/// for each request (trust, access mode, defaults, client capabilities) applies from the next
/// request on. `store` and `microsoft_broker` are chosen at start: a change to them is reported
/// as taking effect at the next start.
extension Broker {
  /// The keys a running broker cannot change: chosen once, when tesserad starts.
  public static let keysAppliedAtStart: [BrokerConfig.Key] = [.store, .microsoftBroker]

  /// The configuration tesserad started with: its files and warnings for `tessera status`.
  public func noteConfiguration(_ effective: EffectiveConfig) {
    adminPolicy = effective.policy
    configNotes.files = effective.files
    configNotes.warnings = effective.warnings
    configNotes.locked = effective.policy.locked.map(\.rawValue)
    for warning in effective.warnings { logger.warning("\(warning)") }
  }

  /// Whether tesserad has a session bus (nil: connected), for `tessera status`: a client that
  /// reached it over its socket cannot tell from where it runs.
  public func noteSessionBus(missing: String?) {
    sessionBus = missing.map { .missing($0) } ?? .connected
  }

  /// What a reload changed.
  public struct ReloadOutcome: Sendable, Equatable {
    /// The keys whose values changed, applied now.
    public var applied: [BrokerConfig.Key]
    /// The keys whose values changed, which take effect at the next start.
    public var atNextStart: [BrokerConfig.Key]
    /// Forwards closed because the policy no longer allows them.
    public var closedForwards: Int
  }

  /// Puts `effective` in force. Nothing cached is dropped; the silent fast path is cleared so that
  /// the next request is decided under the new trust and access settings.
  @discardableResult
  public func reload(_ effective: EffectiveConfig, started: BrokerConfig) async -> ReloadOutcome {
    let old = config
    let changed = BrokerConfig.Key.allCases.filter { old.value(of: $0) != effective.config.value(of: $0) }
    config = effective.config
    configGeneration += 1
    policy = config.authorityPolicy
    access.mode = config.accessMode
    adminPolicy = effective.policy
    fastPath.clear()
    fastPath.enforcesAccess.store(config.accessMode != .open || config.notifyFirstUse, ordering: .relaxed)
    var closed = 0
    if !adminPolicy.allowForwarding, let forwards = deps.forwards {
      for forward in await forwards.list() {
        if await forwards.close(name: forward.name, reason: Self.forwardsForbidden) {
          closed += 1
        }
      }
    }
    let atStart = Self.keysAppliedAtStart.filter { started.value(of: $0) != effective.config.value(of: $0) }
    configNotes.files = effective.files
    configNotes.warnings = effective.warnings + storeNotAllowed(by: effective.policy)
    configNotes.locked = effective.policy.locked.map(\.rawValue)
    configNotes.refused = nil
    configNotes.atNextStart = atStart.map(\.rawValue)
    configNotes.loadedAt = Int64(deps.clock.now().timeIntervalSince1970)
    configNotes.reloads += 1
    deps.events.managementChanged(.config)
    let outcome = ReloadOutcome(
      applied: changed.filter { !Self.keysAppliedAtStart.contains($0) }, atNextStart: atStart, closedForwards: closed)
    logger.notice(
      "Reloaded the configuration",
      metadata: [
        "files": "\(effective.files.joined(separator: ", "))",
        "changed": "\(outcome.applied.map(\.rawValue).joined(separator: ", "))",
        "at_next_start": "\(atStart.map(\.rawValue).joined(separator: ", "))",
        "closed_forwards": "\(closed)",
      ])
    for warning in configNotes.warnings { logger.warning("\(warning)") }
    return outcome
  }

  /// A warning when the store in use is one the policy no longer allows (chosen at start, it
  /// stays until moved): what to run to move everything to an allowed one.
  func storeNotAllowed(by policy: ConfigPolicy) -> [String] {
    let kind = storeSlot.current.storeDescription.kind
    guard !policy.allows(kind) else { return [] }
    let movable = (policy.allowedStores ?? []).filter { $0 != .memory }.map(\.rawValue)
    let next =
      movable.first.map { "`tessera store migrate --to \($0)` moves everything to an allowed one" }
      ?? "a restart of tesserad uses an allowed one (and needs a new sign-in)"
    return [
      "the store in use (\(kind)) is not among the administrator's allowed_stores ([policy] in \(policy.files.joined(separator: ", "))): \(next)"
    ]
  }

  /// A reload that was refused: the configuration in force stays, and `tessera status` says why.
  public func refuseReload(_ problems: [String]) {
    configNotes.refused = StatusReport.ConfigStatus.Refusal(
      problems: problems.map { SafeText.clip($0, limit: 1000) }, at: Int64(deps.clock.now().timeIntervalSince1970))
    deps.events.managementChanged(.config)
    logger.error(
      "Refused to reload the configuration: the one in force stays. Fix the files (`tessera config check`) and reload again",
      metadata: ["problems": "\(problems.joined(separator: "; "))"])
  }

  /// Why a forward was closed at a reload.
  static let forwardsForbidden = "closed: the administrator's policy no longer allows forwards (allow_forwarding)"

  /// Refuses a forward when the administrator's policy does not allow them.
  func checkForwardingAllowed() throws {
    guard !adminPolicy.allowForwarding else { return }
    throw TesseraError(
      .accessDenied,
      "The administrator's policy does not allow forwards on this machine (allow_forwarding = false in [policy] of \(adminPolicy.files.joined(separator: ", "))). Ask them, or sign in on the remote host itself (`tessera login --device-code`)."
    )
  }
}
