import CSystemd
import CTesseraBusShim
import Glibc
import SystemPackage
import TesseraInterface

/// Replies and signals out. A reply goes back on the connection its call came in on, so a server
/// with more than one connection (the session bus, a peer on a socket of its own) answers each
/// on its own.
extension BusServer {
  /// Answers a call with an error: a D-Bus error of the table's name, or what the interface's
  /// `refusal` makes of it (a protocol whose errors travel in its replies).
  @discardableResult
  func replyError(_ message: OpaquePointer, _ failure: TesseraError) -> Int32 {
    preconditionOnBusThread()
    if let refusal = exportedObject(of: message)?.description.refusal {
      let member = sd_bus_message_get_member(message).map { String(cString: $0) } ?? ""
      send(reply: .success(refusal(member, failure)), to: message)
      return 1
    }
    var error = sd_bus_error()
    sd_bus_error_set(&error, failure.code.dbusName, failure.message)
    let r = sd_bus_reply_method_error(message, &error)
    sd_bus_error_free(&error)
    return r < 0 ? r : 1
  }

  /// Sends a call's reply: the values, or the error.
  func send(reply result: Result<[BusValue], TesseraError>, to call: OpaquePointer) {
    switch result {
    case .failure(let failure):
      replyError(call, failure)
    case .success(let values):
      sendReply(to: call) { reply in
        for value in values { try BusCodec.append(reply, value) }
      }
    }
  }

  /// Sends the template's a{sv} plus one entry, encoded straight from the template's values (its
  /// strings are copied into the message without a second UTF-8 scan, see BusCodec.appendString).
  func send(_ template: ReplyTemplate, adding key: String, _ value: BusValue, to call: OpaquePointer) {
    sendReply(to: call) { reply in try BusCodec.append(reply, template.dict, adding: key, value) }
  }

  /// Builds a method return with `fill` and sends it; a reply that cannot be encoded is a bug,
  /// answered as Internal.
  private func sendReply(to call: OpaquePointer, _ fill: (OpaquePointer) throws -> Void) {
    preconditionOnBusThread()
    var reply: OpaquePointer?
    guard sd_bus_message_new_method_return(call, &reply) >= 0, let reply else { return }
    defer { sd_bus_message_unref(reply) }
    do {
      try fill(reply)
    } catch {
      log(.error, "Could not build a reply: \(error)")
      replyError(call, .internal("The broker could not encode its reply. Please report this with the daemon's log."))
      return
    }
    let r = sd_bus_send(sd_bus_message_get_bus(call), reply, nil)
    if r < 0 { log(.notice, "Could not send a reply (caller gone?): \(Errno(rawValue: -r))") }
    if let peer = directPeer(of: call) { checkBacklog(peer) }
  }

  func sendSignal(
    path: String, interface: String, member: String, arguments: [BusValue], to destination: String?
  ) {
    preconditionOnBusThread()
    // To one direct connection, to one bus name, or to everyone: the bus and every direct peer.
    var connections: [OpaquePointer] = []
    if let destination, let peer = peersByName[destination] {
      connections = [peer.bus]
    } else {
      if let bus { connections.append(bus) }
      // Broadcasts tell of the user's accounts: not to forwarded callers.
      if destination == nil && directInterfaces.contains(interface) { connections += localPeers }
    }
    for connection in connections {
      var signal: OpaquePointer?
      guard sd_bus_message_new_signal(connection, &signal, path, interface, member) >= 0, let signal else { continue }
      defer { sd_bus_message_unref(signal) }
      if let destination, connection == bus, sd_bus_message_set_destination(signal, destination) < 0 { continue }
      do {
        for argument in arguments { try BusCodec.append(signal, argument) }
      } catch {
        log(.error, "Could not build the signal \(member): \(error)")
        return
      }
      _ = sd_bus_send(connection, signal, nil)
      // A peer that reads nothing, not even its signals, is closed as one that leaves replies unread.
      if connection != bus, let peer = peers[connection] { checkBacklog(peer) }
    }
  }
}
