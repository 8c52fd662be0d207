/// The interactive sign-ins under way: who started each, the caps on how many may run, Cancel, and
/// callers that left the bus. Owned by the token actor; every change happens without suspension, so
/// a sign-in is visible to the caps, to Cancel and to a caller leaving from its first moment.
struct SignInRegistry {
  struct Flow {
    var caller: String
    var task: Task<Broker.TokenResult, any Error>
  }

  /// Each interactive sign-in holds a listener, a thread and a browser window: they are capped.
  static let maxFlows = 16
  static let maxFlowsPerCaller = 4
  /// How many departed callers are remembered (for calls still on their way when the caller left).
  static let departedMemory = 1024

  /// By correlation id.
  private(set) var flows: [String: Flow] = [:]
  private var departed: Set<String> = []
  private var departedOrder: [String] = []

  /// Throws unless a new sign-in with this correlation id may start for this caller.
  func checkRoom(correlationID: String, caller: String) throws {
    let callerFlows = flows.values.filter { $0.caller == caller }.count
    guard flows.count < Self.maxFlows, callerFlows < Self.maxFlowsPerCaller else {
      throw TesseraError.invalidArgument(
        "Too many sign-ins are in progress (\(callerFlows) from this caller, \(flows.count) in all). Finish or Cancel one first."
      )
    }
    guard flows[correlationID] == nil else {
      throw TesseraError.invalidArgument(
        "An interactive request with correlation id \(correlationID) is already running. Use a new correlation id.")
    }
  }

  /// Registers a started sign-in; one whose caller already left the bus is cancelled at once.
  mutating func register(correlationID: String, caller: String, task: Task<Broker.TokenResult, any Error>) {
    flows[correlationID] = Flow(caller: caller, task: task)
    if departed.contains(caller) { task.cancel() }
  }

  mutating func remove(correlationID: String) { flows[correlationID] = nil }

  /// Cancels the caller's own sign-in; throws when it has none with that id.
  func cancel(correlationID: String, caller: String) throws {
    guard let flow = flows[correlationID], flow.caller == caller else {
      throw TesseraError.invalidArgument(
        "No interactive sign-in with correlation id '\(RequestOptions.clip(correlationID))' is running for this caller. Only the caller that started a sign-in can cancel it."
      )
    }
    flow.task.cancel()
  }

  /// A caller left the bus: its sign-ins are cancelled (nobody would get the result). Returns the
  /// correlation ids cancelled.
  mutating func callerLeft(_ busName: String) -> [String] {
    // Unique names are never reused on a bus: remember the last few, for calls still on their way.
    if departed.insert(busName).inserted {
      departedOrder.append(busName)
      if departedOrder.count > Self.departedMemory { departed.remove(departedOrder.removeFirst()) }
    }
    var cancelled: [String] = []
    for (correlationID, flow) in flows where flow.caller == busName {
      flow.task.cancel()
      cancelled.append(correlationID)
    }
    return cancelled
  }
}
