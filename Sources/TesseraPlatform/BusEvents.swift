import TesseraBus
import TesseraCore

/// The engine's events as org.tessera.Broker1 signals.
public struct BrokerSignals: BrokerEvents {
  let server: BusServer

  public init(server: BusServer) { self.server = server }

  public func interactionPending(destination: String, correlationID: String, info: InteractionInfo) {
    server.emit(
      BrokerInterface.description, "InteractionPending", [.string(correlationID), .dict(info.busValue)],
      to: destination)
  }

  public func accountsChanged() { server.emit(BrokerInterface.description, "AccountsChanged", []) }
}
