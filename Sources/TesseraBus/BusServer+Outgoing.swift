import CSystemd
import Glibc
import SystemPackage
import TesseraInterface

/// The daemon's own calls to other programs and its signal watches, on the session bus and on the
/// system bus (opened on first use and attached to the same sd-event loop, so one thread still
/// owns every connection).
extension BusServer {
  /// A method call the daemon makes (to the notification server, say), answered on the bus thread.
  final class Outgoing: @unchecked Sendable {
    let bus: Bus
    let destination: String
    let path: String
    let interface: String
    let member: String
    let arguments: [BusValue]
    let timeout: Double
    let autoStart: Bool
    let completion: @Sendable (Result<(sender: String, values: [BusValue]), BusCallError>) -> Void
    var slot: OpaquePointer?
    weak var server: BusServer?
    init(
      bus: Bus, destination: String, path: String, interface: String, member: String, arguments: [BusValue],
      timeout: Double, autoStart: Bool,
      completion: @escaping @Sendable (Result<(sender: String, values: [BusValue]), BusCallError>) -> Void
    ) {
      self.bus = bus
      self.destination = destination
      self.path = path
      self.interface = interface
      self.member = member
      self.arguments = arguments
      self.timeout = timeout
      self.autoStart = autoStart
      self.completion = completion
    }
  }

  /// A subscription to a signal; `handler` runs on the bus thread with the sender's unique name.
  /// Invariant for @unchecked Sendable: its mutable state is used on the bus thread only.
  final class SignalWatch: @unchecked Sendable {
    let bus: Bus
    let sender: String?
    let path: String?
    let interface: String
    let member: String
    let broadcastOnly: Bool
    let handler: @Sendable (_ sender: String, _ arguments: [BusValue]) -> Void
    var slot: OpaquePointer?
    var ownerSlot: OpaquePointer?
    /// The unique name that owns `sender` now (a well-known name), as the bus daemon says.
    var owner: String?
    init(
      bus: Bus, sender: String?, path: String?, interface: String, member: String, broadcastOnly: Bool,
      handler: @escaping @Sendable (String, [BusValue]) -> Void
    ) {
      self.bus = bus
      self.sender = sender
      self.path = path
      self.interface = interface
      self.member = member
      self.broadcastOnly = broadcastOnly
      self.handler = handler
    }

    /// Whether a signal from `sender` is from the name watched. sd-bus's own match lets any
    /// unique name through for a well-known-name rule (only the bus daemon's routing checks it),
    /// and the bus daemon delivers a signal addressed to us whatever our rules say: so the
    /// sender is compared here with the name's current owner.
    func accepts(sender unique: String) -> Bool {
      guard let sender else { return true }
      if sender.hasPrefix(":") { return unique == sender }
      return owner != nil && owner == unique
    }
  }

  /// Calls a method of another program, without waiting: `completion` gets the reply (with the
  /// replier's unique name) or the error, on the bus thread. `autoStart` false never starts a
  /// service through D-Bus activation. Thread-safe.
  public func call(
    on bus: Bus = .session, destination: String, path: String, interface: String, member: String,
    arguments: [BusValue], timeoutSeconds: Double = 25, autoStart: Bool = true,
    completion: @escaping @Sendable (Result<(sender: String, values: [BusValue]), BusCallError>) -> Void
  ) {
    post(
      .call(
        Outgoing(
          bus: bus, destination: destination, path: path, interface: interface, member: member, arguments: arguments,
          timeout: timeoutSeconds, autoStart: autoStart, completion: completion)))
  }

  /// Subscribes to a signal. Only signals from `sender` reach the handler: for a well-known
  /// name, from its current owner (tracked with GetNameOwner and NameOwnerChanged). With
  /// `broadcastOnly`, a signal addressed to this connection alone (which any peer the bus policy
  /// allows can send) is dropped too. The handler runs on the bus thread. Thread-safe.
  public func watchSignal(
    on bus: Bus = .session, sender: String?, path: String?, interface: String, member: String,
    broadcastOnly: Bool = false, handler: @escaping @Sendable (_ sender: String, _ arguments: [BusValue]) -> Void
  ) {
    post(
      .watch(
        SignalWatch(
          bus: bus, sender: sender, path: path, interface: interface, member: member, broadcastOnly: broadcastOnly,
          handler: handler)))
  }

  /// The connection for `bus`; the system bus is opened on first use and attached to this loop.
  func connection(_ which: Bus) -> OpaquePointer? {
    switch which {
    case .session: return bus
    case .system:
      if let systemBus { return systemBus }
      if systemBusFailed { return nil }
      var opened: OpaquePointer?
      var r = sd_bus_open_system(&opened)
      if r >= 0 { r = sd_bus_attach_event(opened, event, 0) }
      guard r >= 0 else {
        systemBusFailed = true
        sd_bus_flush_close_unref(opened)
        log(.notice, "No system bus (\(Errno(rawValue: -r))): suspend and network events are not watched")
        return nil
      }
      systemBus = opened
      return opened
    }
  }

  func startCall(_ outgoing: Outgoing) {
    preconditionOnBusThread()
    func fail(_ what: String, _ r: Int32) {
      outgoing.completion(
        .failure(
          BusCallError(name: "org.freedesktop.DBus.Error.Failed", message: "\(what): \(Errno(rawValue: -r))")))
    }
    guard let connection = connection(outgoing.bus) else {
      return outgoing.completion(
        .failure(BusCallError(name: "org.freedesktop.DBus.Error.NoServer", message: "The system bus is not available")))
    }
    var message: OpaquePointer?
    var r = sd_bus_message_new_method_call(
      connection, &message, outgoing.destination, outgoing.path, outgoing.interface, outgoing.member)
    guard r >= 0, let message else { return fail("create the call", r) }
    defer { sd_bus_message_unref(message) }
    if !outgoing.autoStart { _ = sd_bus_message_set_auto_start(message, 0) }
    do {
      for argument in outgoing.arguments { try BusCodec.append(message, argument) }
    } catch {
      return outgoing.completion(
        .failure(BusCallError(name: "org.freedesktop.DBus.Error.InvalidArgs", message: "Cannot encode: \(error)")))
    }
    let id = ObjectIdentifier(outgoing)
    outgoing.server = self
    r = sd_bus_call_async(
      connection, &outgoing.slot, message, outgoingReplied, Unmanaged.passUnretained(outgoing).toOpaque(),
      UInt64(outgoing.timeout * 1_000_000))
    guard r >= 0 else { return fail("send the call", r) }
    outgoingCalls[id] = outgoing
  }

  func finishCall(_ outgoing: Outgoing, _ message: OpaquePointer) {
    preconditionOnBusThread()
    outgoingCalls[ObjectIdentifier(outgoing)] = nil
    if let error = sd_bus_message_get_error(message), error.pointee.name != nil {
      outgoing.completion(
        .failure(
          BusCallError(
            name: String(cString: error.pointee.name), message: error.pointee.message.map { String(cString: $0) } ?? "")
        ))
    } else {
      let sender = sd_bus_message_get_sender(message).map { String(cString: $0) } ?? ""
      do {
        outgoing.completion(.success((sender, try BusCodec.readAll(message, limits: .replies))))
      } catch {
        outgoing.completion(
          .failure(BusCallError(name: "org.freedesktop.DBus.Error.InvalidArgs", message: "Unreadable reply: \(error)")))
      }
    }
    sd_bus_slot_unref(outgoing.slot)
    outgoing.slot = nil
  }

  /// Installs the match without waiting for the bus daemon's answer (a slow system bus must not
  /// hold the thread every caller is served on), and, for a well-known sender, follows its owner.
  func startWatch(_ watch: SignalWatch) {
    preconditionOnBusThread()
    guard let connection = connection(watch.bus) else { return }
    let me = Unmanaged.passUnretained(watch).toOpaque()
    var r = sd_bus_match_signal_async(
      connection, &watch.slot, watch.sender, watch.path, watch.interface, watch.member, signalArrived, nil, me)
    guard r >= 0 else {
      log(.notice, "Could not watch \(watch.interface).\(watch.member): \(Errno(rawValue: -r))")
      return
    }
    watches.append(watch)
    guard let name = watch.sender, !name.hasPrefix(":") else { return }
    let rule =
      "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='\(name)'"
    r = sd_bus_add_match_async(connection, &watch.ownerSlot, rule, ownerChanged, nil, me)
    if r < 0 { log(.notice, "Could not follow the owner of \(name): \(Errno(rawValue: -r))") }
    startCall(
      Outgoing(
        bus: watch.bus, destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
        interface: "org.freedesktop.DBus", member: "GetNameOwner", arguments: [.string(name)], timeout: 25,
        autoStart: false
      ) { [weak watch] result in
        // Runs on the bus thread. A NameOwnerChanged that came first is newer: keep it.
        if case .success(let reply) = result, case .string(let owner)? = reply.values.first, watch?.owner == nil {
          watch?.owner = owner
        }
      })
  }
}

let outgoingReplied: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message else { return 0 }
  let outgoing = Unmanaged<BusServer.Outgoing>.fromOpaque(userdata!).takeUnretainedValue()
  outgoing.server?.finishCall(outgoing, message)
  return 1
}

let signalArrived: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message else { return 0 }
  let watch = Unmanaged<BusServer.SignalWatch>.fromOpaque(userdata!).takeUnretainedValue()
  if watch.broadcastOnly && sd_bus_message_get_destination(message) != nil { return 0 }
  let sender = sd_bus_message_get_sender(message).map { String(cString: $0) } ?? ""
  guard watch.accepts(sender: sender) else { return 0 }
  if let values = try? BusCodec.readAll(message, limits: .replies) { watch.handler(sender, values) }
  return 0
}

/// NameOwnerChanged(name, old, new) for a watched well-known sender; the bus daemon itself is the
/// only sender the rule lets through, checked again here.
let ownerChanged: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message, let sender = sd_bus_message_get_sender(message),
    strcmp(sender, "org.freedesktop.DBus") == 0
  else { return 0 }
  let watch = Unmanaged<BusServer.SignalWatch>.fromOpaque(userdata!).takeUnretainedValue()
  guard let values = try? BusCodec.readAll(message, limits: .replies), values.count == 3,
    case .string(let name) = values[0], name == watch.sender, case .string(let newOwner) = values[2]
  else { return 0 }
  watch.owner = newOwner.isEmpty ? nil : newOwner
  return 0
}
