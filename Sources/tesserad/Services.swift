import Logging
import ServiceLifecycle
import TesseraBus
import TesseraCore
import TesseraInterface
import TesseraPlatform
import TesseraSystem

#if canImport(Glibc)
  import Glibc
#endif

/// tesserad's long-running jobs, each a swift-service-lifecycle `Service` in one group, so their
/// start and shutdown order is declared (Tesserad.run): they start in the group's order and stop
/// in reverse on SIGTERM or SIGINT. The bus stops first (calls still waiting are answered
/// Cancelled), the keyring's queue last (every write queued by then lands).

/// Keyring writes the keyring did not take (it was away or locked) are retried until it takes
/// them; at shutdown, every queued write is finished before the daemon exits.
struct StoreService: Service {
  let broker: Broker

  func run() async {
    await cancelWhenGracefulShutdown { await broker.runStoreRetries() }
    await broker.finishStoreWrites()
  }
}

/// Refresh-ahead: tokens in steady use are renewed before callers would have to wait, and
/// refreshes a killed run left in flight are checked. `afterEachPass` tidies up (see Tesserad).
struct MaintenanceService: Service {
  let broker: Broker
  let afterEachPass: @Sendable () -> Void

  func run() async {
    await cancelWhenGracefulShutdown { await broker.runMaintenance(afterEachPass: afterEachPass) }
  }
}

/// Events that start work without a caller: the machine waking from suspend or the network
/// coming back (the tokens in use are refreshed at once), and a notification's "Sign in" (the
/// sign-in it asks for). Each runs as a child task, so one event never waits for another.
struct EventsService: Service {
  let broker: Broker
  let logger: Logger
  private let events: AsyncStream<Event>

  enum Event {
    case resumed(String)
    case signInAsked(accountID: String)
  }

  /// Installs the watches at once, before the bus serves anyone: the notifier's watch also carries
  /// the answers to access questions (PortalAccessPrompter's fallback).
  init(broker: Broker, server: BusServer, notifier: DesktopNotifier, logger: Logger) {
    self.broker = broker
    self.logger = logger
    let (events, sink) = AsyncStream.makeStream(of: Event.self, bufferingPolicy: .bufferingNewest(64))
    self.events = events
    notifier.start { sink.yield(.signInAsked(accountID: $0)) }
    MachineEvents.watch(server: server, logger: logger) { sink.yield(.resumed($0)) }
  }

  func run() async {
    await cancelWhenGracefulShutdown { [broker, logger, events] in
      await withDiscardingTaskGroup { group in
        for await event in events {
          group.addTask { await Self.handle(event, broker: broker, logger: logger) }
        }
      }
    }
  }

  private static func handle(_ event: Event, broker: Broker, logger: Logger) async {
    switch event {
    case .resumed(let reason):
      await broker.machineResumed(reason: reason)
    case .signInAsked(let accountID):
      do { _ = try await broker.signInForNotification(accountID: accountID) } catch {
        logger.notice(
          "The sign-in started from the notification did not finish",
          metadata: ["account_id": "\(accountID)", "error": "\(TesseraError.wrap(error))"])
      }
    }
  }
}

/// The engine's forwards (`tessera forward`), as listeners of the bus server: by default in
/// `tessera/forward/` beside tesserad's own socket.
struct BusForwards: ForwardListeners {
  let server: BusServer
  /// `…/tessera/forward`, beside the socket tesserad serves; nil when it serves none.
  let directory: String?
  let clock: any BrokerClock

  func open(name: String, host: String, path: String, lasting: Bool, owner: CallerInfo) async throws -> String {
    var place = path
    if place.isEmpty {
      guard let directory else {
        throw TesseraError.invalidArgument(
          "tesserad serves no socket of its own here, so it has no place for a forward's socket; give one (`tessera forward --socket PATH`)."
        )
      }
      place = directory + "/" + name
    }
    return try await server.openForward(
      BusServer.ForwardRequest(
        name: name, host: host, path: place, makeDirectory: path.isEmpty, lasting: lasting, owner: owner),
      now: Int64(clock.now().timeIntervalSince1970))
  }

  func close(name: String, reason: String) async -> Bool { await server.closeForward(name, reason: reason) }

  func list() async -> [ForwardInfo] { await server.forwardList() }

  /// Removes the sockets a killed tesserad left in the forwards' directory (nothing serves them:
  /// the forwards of this run are made after).
  static func removeStale(in directory: String) {
    for name in (try? Files.names(in: directory)) ?? [] {
      var st = stat()
      let path = directory + "/" + name
      if lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFSOCK, st.st_uid == getuid() { unlink(path) }
    }
  }
}
