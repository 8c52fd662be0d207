import TesseraBus
import TesseraInterface
import TesseraSystem

/// org.tessera.Broker1 on the private bus, answering as each test scripts it, so the `tessera`
/// binary is tested against real D-Bus calls without the engine. One for the whole test run (the
/// bus name is exclusive): each test sets its script with `answer` and reads what was called.
public final class ScriptedBroker: Sendable {
  /// The reply to a call; nil leaves it unanswered (a sign-in the user never finishes).
  public typealias Script = @Sendable (BusServer.Call) -> Result<[BusValue], TesseraError>?
  private let script = Locked<Script>({ _ in .failure(.internal("No script.")) })
  private let received = Reports<BusServer.Call>()
  private let left = Reports<String>()
  public let server: BusServer

  private init(server: BusServer) { self.server = server }

  private static let instance = Locked<ScriptedBroker?>(nil)

  /// The broker, started on the shared private bus the first time.
  public static func shared() async throws -> ScriptedBroker {
    if let broker = instance.withLock({ $0 }) { return broker }
    _ = try PrivateBus.ensure()
    let slot = Locked<ScriptedBroker?>(nil)
    let server = BusServer(
      interfaces: [BrokerInterface.description],
      onCall: { call, token in
        guard let broker = slot.withLock({ $0 }) else { return }
        broker.received.append(call)
        if let reply = broker.script.withLock({ $0 })(call) { broker.server.reply(token, reply) }
      },
      onCallerGone: { name in slot.withLock { $0 }?.left.append(name) })
    let broker = ScriptedBroker(server: server)
    slot.withLock { $0 = broker }
    try await server.start(onExit: { _ in })
    instance.withLock { $0 = broker }
    return broker
  }

  /// Runs `body` with the broker answering with `script`, one test at a time across every suite
  /// and test target of the process (the broker is one, so its script is too).
  public static func with<T>(_ script: @escaping Script, _ body: (ScriptedBroker) async throws -> T) async throws -> T {
    let broker = try await shared()
    await turns.acquire()
    broker.answer(script)
    do {
      let result = try await body(broker)
      await turns.release()
      return result
    } catch {
      await turns.release()
      throw error
    }
  }

  private static let turns = Turns()

  /// One holder at a time, waiting without blocking a thread.
  private actor Turns {
    private var held = false
    private var waiting: [CheckedContinuation<Void, Never>] = []
    func acquire() async {
      guard held else {
        held = true
        return
      }
      await withCheckedContinuation { waiting.append($0) }
    }
    func release() {
      if waiting.isEmpty { held = false } else { waiting.removeFirst().resume() }
    }
  }

  /// Answers every call with `script` from now on, and forgets the calls before.
  func answer(_ script: @escaping Script) {
    received.removeAll()
    self.script.withLock { $0 = script }
  }

  /// The calls received since the last `answer`.
  public var calls: [BusServer.Call] { received.values }

  /// The callers (unique names) that have left the bus.
  public var callersGone: [String] { left.values }

  /// Waits until the calls received satisfy `condition` (true), or `seconds` pass (false: the
  /// bound only ends a hang).
  public func waitForCalls(seconds: Double = 30, until condition: @escaping @Sendable ([BusServer.Call]) -> Bool)
    async -> Bool
  {
    await received.wait(seconds: seconds, until: condition)
  }

  /// Waits until the callers gone satisfy `condition` (true), or `seconds` pass (false).
  public func waitForCallersGone(seconds: Double = 30, until condition: @escaping @Sendable ([String]) -> Bool)
    async -> Bool
  {
    await left.wait(seconds: seconds, until: condition)
  }
}
