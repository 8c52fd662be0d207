import Logging
import ServiceLifecycle
import Synchronization
import TesseraBus
import TesseraCore
import TesseraPlatform

/// The org.tessera.Broker1 front: hands each bus call to the request handler as its own task, and its
/// result back to the bus.
final class RequestRouter: Sendable {
  private let target = Mutex<(BusServer, RequestHandler)?>(nil)

  func install(server: BusServer, handler: RequestHandler) { target.withLock { $0 = (server, handler) } }

  func answerAtOnce(_ call: BusServer.Call) -> FastAnswer? {
    target.withLock { $0 }?.1.answerAtOnce(method: call.member, arguments: call.arguments, caller: call.caller)
  }

  func callerGone(_ busName: String) {
    guard let (_, handler) = target.withLock({ $0 }) else { return }
    Task { await handler.broker.callerLeft(busName) }
  }

  func dispatch(_ call: BusServer.Call, _ token: BusServer.ReplyToken) {
    guard let (server, handler) = target.withLock({ $0 }) else { return }
    Task {
      let result = await handler.handle(method: call.member, arguments: call.arguments, caller: call.caller)
      server.reply(token, result)
    }
  }
}

/// The bus server as a swift-service-lifecycle service: runs until the bus goes away or a
/// graceful shutdown (SIGTERM/SIGINT) is asked for.
final class BusService: Service, Sendable {
  let server: BusServer
  let logger: Logger
  let configPath: String
  let failure = Mutex<String?>(nil)

  init(server: BusServer, logger: Logger, configPath: String) {
    self.server = server
    self.logger = logger
    self.configPath = configPath
  }

  func run() async throws {
    let (ended, continuation) = AsyncStream<String?>.makeStream()
    do {
      try await server.start { reason in
        continuation.yield(reason)
        continuation.finish()
      }
    } catch {
      failure.withLock { $0 = "\(error)" }
      throw error
    }
    logger.info(
      "tesserad \(BrokerInterface.version) is serving \(BrokerInterface.busName)", metadata: ["config": "\(configPath)"]
    )
    await withGracefulShutdownHandler {
      for await reason in ended {
        if let reason { failure.withLock { $0 = reason } }
      }
    } onGracefulShutdown: {
      self.server.stop()
    }
    logger.info("tesserad stopped")
  }
}
