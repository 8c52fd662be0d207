import TesseraInterface

/// The interactive sign-ins under way: who started each, the caps on how many may run, Cancel, and
/// callers that left the bus. Owned by the token actor; every change happens without suspension, so
/// a sign-in is visible to the caps, to Cancel and to a caller leaving from its first moment.
///
/// Places are shared fairly between apps, not connections: an app is its executable (so several
/// connections or processes of one program count once), else its process, else its connection.
/// - An app holds at most `maxFlowsPerApp` places.
/// - When all `maxFlows` places are held, a newcomer that holds fewer than the biggest holder minus
///   one takes that app's oldest place: that sign-in ends with Cancelled. So no app can keep
///   another out for the length of its sign-ins' timeouts (up to an hour each).
struct SignInRegistry {
  struct Flow {
    var caller: String
    var app: String
    var sequence: UInt64
    var task: Task<Broker.TokenResult, any Error>
    /// Why the sign-in was ended by the broker, when it was (not by the caller).
    var endedBecause: String?
  }

  /// Each interactive sign-in holds a listener, a thread and a browser window: they are capped.
  static let maxFlows = 16
  static let maxFlowsPerApp = 4
  /// How many departed callers are remembered (for calls still on their way when the caller left).
  static let departedMemory = 1024

  /// By correlation id.
  private(set) var flows: [String: Flow] = [:]
  /// Sign-ins that have begun but are not registered yet (loading the store, asking the user about
  /// the app), by caller and correlation id: how many (a caller may reuse an id; all but one will
  /// be refused as duplicates), and whether Cancel asked to end them.
  private var announced: [AnnouncedKey: (count: Int, cancelled: Bool)] = [:]
  struct AnnouncedKey: Hashable {
    var caller: String
    var correlationID: String
  }
  private var departed: Set<String> = []
  private var departedOrder: [String] = []
  private var sequence: UInt64 = 0

  /// The key places are counted by.
  static func app(of caller: CallerInfo) -> String {
    if let exe = caller.exe, !exe.isEmpty { return "exe:" + exe }
    if let pid = caller.pid { return "pid:\(pid)" }
    return "bus:" + caller.busName
  }

  /// Makes room for a new sign-in with this correlation id, or throws Busy / InvalidArgument.
  /// Making room may end another app's oldest sign-in (see the type's comment): returned.
  mutating func makeRoom(correlationID: String, caller: CallerInfo) throws -> (
    correlationID: String, app: String, held: Int
  )? {
    guard flows[correlationID] == nil else {
      throw TesseraError.invalidArgument(
        "An interactive request with correlation id \(correlationID) is already running. Use a new correlation id.")
    }
    let app = Self.app(of: caller)
    var held: [String: Int] = [:]
    for flow in flows.values where flow.endedBecause == nil { held[flow.app, default: 0] += 1 }
    let mine = held[app] ?? 0
    guard mine < Self.maxFlowsPerApp else {
      throw TesseraError.busy(
        "This app already has \(mine) sign-ins in progress, the most one app may have. Finish or Cancel one, then retry."
      )
    }
    let active = held.values.reduce(0, +)
    guard active >= Self.maxFlows else { return nil }
    // Full: take the oldest place of the apps holding the most, if that is fairer.
    let count = held.values.max() ?? 0
    guard count > mine + 1,
      let (victimID, victim) = flows.filter({ held[$0.value.app] == count && $0.value.endedBecause == nil })
        .min(by: { $0.value.sequence < $1.value.sequence })
    else {
      throw TesseraError.busy(
        "All \(Self.maxFlows) sign-in places are in use by apps that hold no more than this one (\(mine)). Finish or Cancel a sign-in, then retry."
      )
    }
    flows[victimID]?.endedBecause =
      "The sign-in was ended to make room for another app's sign-in: this app held \(count) of the \(Self.maxFlows) places. Start it again once fewer are in progress."
    flows[victimID]?.task.cancel()
    return (victimID, victim.app, count)
  }

  /// Notes a sign-in from its first moment, before anything suspends, so a Cancel that comes while
  /// it is still being prepared ends it too.
  mutating func announce(correlationID: String, caller: String) {
    let key = AnnouncedKey(caller: caller, correlationID: correlationID)
    let earlier = announced[key]
    announced[key] = ((earlier?.count ?? 0) + 1, earlier?.cancelled ?? false)
  }

  /// Forgets an announcement; returns whether Cancel asked to end that sign-in meanwhile.
  @discardableResult
  /// Whether the caller has left the bus (as far as the last departedMemory callers go).
  func hasDeparted(_ busName: String) -> Bool { departed.contains(busName) }

  mutating func withdraw(correlationID: String, caller: String) -> Bool {
    let key = AnnouncedKey(caller: caller, correlationID: correlationID)
    guard let entry = announced[key] else { return false }
    announced[key] = entry.count > 1 ? (entry.count - 1, entry.cancelled) : nil
    return entry.cancelled
  }

  /// Registers a started sign-in; one whose caller already left the bus, or which its caller
  /// cancelled while it was being prepared, is cancelled at once.
  mutating func register(correlationID: String, caller: CallerInfo, task: Task<Broker.TokenResult, any Error>) {
    sequence &+= 1
    flows[correlationID] = Flow(
      caller: caller.busName, app: Self.app(of: caller), sequence: sequence, task: task, endedBecause: nil)
    let cancelledEarly = withdraw(correlationID: correlationID, caller: caller.busName)
    if departed.contains(caller.busName) || cancelledEarly { task.cancel() }
  }

  /// Is a sign-in with this id, from this caller, running or being prepared?
  func knows(correlationID: String, caller: String) -> Bool {
    flows[correlationID]?.caller == caller
      || announced[AnnouncedKey(caller: caller, correlationID: correlationID)] != nil
  }

  /// Removes a finished sign-in; returns why the broker ended it, if it did.
  @discardableResult
  mutating func remove(correlationID: String) -> String? {
    flows.removeValue(forKey: correlationID)?.endedBecause
  }

  /// Cancels the caller's own sign-in (running, or still being prepared); throws when it has none
  /// with that id.
  mutating func cancel(correlationID: String, caller: String) throws {
    if let flow = flows[correlationID], flow.caller == caller {
      flow.task.cancel()
      return
    }
    let key = AnnouncedKey(caller: caller, correlationID: correlationID)
    guard let entry = announced[key] else {
      throw TesseraError.invalidArgument(
        "No interactive sign-in with correlation id '\(RequestOptions.clip(correlationID))' is running for this caller. Only the caller that started a sign-in can cancel it."
      )
    }
    announced[key] = (entry.count, true)
  }

  /// Cancels every sign-in the caller started (Microsoft's cancelInteractiveFlow names none).
  /// Returns the correlation ids cancelled.
  mutating func cancelAll(caller: String) -> [String] {
    var cancelled: [String] = []
    for (correlationID, flow) in flows where flow.caller == caller {
      flow.task.cancel()
      cancelled.append(correlationID)
    }
    for (key, entry) in announced where key.caller == caller {
      announced[key] = (entry.count, true)
      cancelled.append(key.correlationID)
    }
    return cancelled
  }

  /// A caller left the bus: its sign-ins are cancelled (nobody would get the result). Returns the
  /// correlation ids cancelled.
  mutating func callerLeft(_ busName: String) -> [String] {
    // Unique names are never reused on a bus: remember the last few, for calls still on their way.
    if departed.insert(busName).inserted {
      departedOrder.append(busName)
      if departedOrder.count > Self.departedMemory { departed.remove(departedOrder.removeFirst()) }
    }
    return cancelAll(caller: busName)
  }
}
