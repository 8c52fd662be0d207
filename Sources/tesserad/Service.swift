import Logging
import ServiceLifecycle
import TesseraBus
import TesseraCore
import TesseraInterface
import TesseraPlatform
import TesseraSystem

/// The fronts: hands each bus call to its front's handler (org.tessera.Broker1's TesseraFront or
/// com.microsoft.identity.broker1's MicrosoftFront, both over the one engine) as its own task, and
/// the result back to the bus.
final class RequestRouter: Sendable {
  private struct Fronts {
    let server: BusServer
    let native: TesseraFront
    let microsoft: MicrosoftFront
  }
  private let target = Locked<Fronts?>(nil)

  func install(server: BusServer, handler: TesseraFront, microsoft: MicrosoftFront) {
    target.withLock { $0 = Fronts(server: server, native: handler, microsoft: microsoft) }
  }

  func answerAtOnce(_ call: BusServer.Call) -> FastAnswer? {
    guard let fronts = target.withLock({ $0 }) else { return nil }
    if call.interfaceName == MicrosoftBrokerInterface.interfaceName {
      return fronts.microsoft.answerAtOnce(method: call.member, arguments: call.arguments, caller: call.caller).map {
        .reply(.success([.string($0)]))
      }
    }
    return fronts.native.answerAtOnce(method: call.member, arguments: call.arguments, caller: call.caller)
  }

  func callerGone(_ busName: String) {
    guard let fronts = target.withLock({ $0 }) else { return }
    Task { await fronts.native.broker.callerLeft(busName) }
  }

  func dispatch(_ call: BusServer.Call, _ token: BusServer.ReplyToken) {
    guard let fronts = target.withLock({ $0 }) else { return }
    Task {
      if call.interfaceName == MicrosoftBrokerInterface.interfaceName {
        let answer = await fronts.microsoft.handle(method: call.member, arguments: call.arguments, caller: call.caller)
        fronts.server.reply(token, .success([.string(answer)]))
      } else {
        let result = await fronts.native.handle(method: call.member, arguments: call.arguments, caller: call.caller)
        fronts.server.reply(token, result)
      }
    }
  }
}

/// The bus server as a swift-service-lifecycle service: runs until the bus goes away or a
/// graceful shutdown (SIGTERM/SIGINT) is asked for.
final class BusService: Service, Sendable {
  let server: BusServer
  let logger: Logger
  let configPath: String
  /// The optional names the server asks for (com.microsoft.identity.broker1 when that front is on).
  let microsoftNames: [String]
  let socketPath: String?
  let failure = Locked<String?>(nil)
  /// Told, once the server has started, whether it has a session bus (nil) or why not.
  let started: @Sendable (String?) async -> Void

  init(
    server: BusServer, logger: Logger, configPath: String, microsoftNames: [String], socketPath: String?,
    started: @escaping @Sendable (String?) async -> Void
  ) {
    self.started = started
    self.socketPath = socketPath
    self.server = server
    self.logger = logger
    self.configPath = configPath
    self.microsoftNames = microsoftNames
  }

  func run() async throws {
    let (ended, continuation) = AsyncStream<String?>.makeStream()
    let unowned: [String]
    do {
      unowned = try await server.start { reason in
        continuation.yield(reason)
        continuation.finish()
      }
    } catch {
      failure.withLock { $0 = "\(error)" }
      throw error
    }
    await started(server.sessionBusMissing)
    if let missing = server.sessionBusMissing {
      logger.notice(
        "tesserad \(BrokerInterface.version) is serving its own socket alone: there is no session bus, so the Microsoft front, desktop notifications and the portal dialog are off",
        metadata: ["config": "\(configPath)", "socket": "\(socketPath ?? "")", "bus": "\(missing)"])
    } else {
      let served = [BrokerInterface.busName] + microsoftNames.filter { !unowned.contains($0) }
      logger.info(
        "tesserad \(BrokerInterface.version) is serving \(served.joined(separator: " and "))\(socketPath.map { " and its own socket \($0)" } ?? "")",
        metadata: ["config": "\(configPath)"])
    }
    ServiceManager.notify("READY=1")
    for name in unowned where server.sessionBusMissing == nil {
      logger.notice(
        "\(name) is already owned by another program (another broker, such as Microsoft's identity broker), so MSAL apps keep using it; tesserad serves \(BrokerInterface.busName) and takes \(name) when that program lets go of it. To serve MSAL apps from Tessera, stop or uninstall the other broker; to silence this, set microsoft_broker = false in config.toml."
      )
    }
    await withGracefulShutdownHandler {
      for await reason in ended {
        if let reason { failure.withLock { $0 = reason } }
      }
    } onGracefulShutdown: {
      ServiceManager.notify("STOPPING=1")
      self.server.stop()
    }
    logger.info("tesserad stopped")
  }
}
