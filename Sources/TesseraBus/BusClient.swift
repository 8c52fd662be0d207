import CSystemd
import Glibc
import TesseraInterface
import TesseraSystem

/// A D-Bus error reply, as received.
public struct BusCallError: Error, Sendable, CustomStringConvertible {
  public let name: String
  public let message: String
  public var description: String { "\(name): \(message)" }
  public init(name: String, message: String) {
    self.name = name
    self.message = message
  }
}

/// A session-bus client connection for calling org.tessera.Broker1. Not thread-safe: use it from
/// one thread. While a call is pending, signals from the broker are delivered to `onSignal`.
public final class BusClient {
  private var bus: OpaquePointer?
  /// Who listens on the direct socket (nil on the session bus): the kernel's record of the
  /// process that made the socket listen, read before any byte is sent.
  public private(set) var directPeer: DirectSocket.PeerCredentials?

  /// The error names of a direct socket that is not there (no broker) or not to be trusted.
  public static let noSocketError = "org.tessera.Client.Error.NoSocket"
  public static let untrustedSocketError = "org.tessera.Client.Error.UntrustedSocket"

  /// Connects to tesserad's own socket at `path` (peer-to-peer D-Bus): only when the socket and
  /// its directory are the user's own, the process listening runs as the user, and `vet` (given
  /// who listens) says nothing against it: all before a byte is sent. Throws `noSocketError`
  /// when nothing listens there, `untrustedSocketError` when something not the user's does.
  public init(directSocket path: String, vet: (DirectSocket.PeerCredentials) -> String? = { _ in nil })
    throws(BusCallError)
  {
    do {
      if let problem = try DirectSocket.checkOwnership(path) {
        throw BusCallError(
          name: Self.untrustedSocketError,
          message:
            "Refusing to use the socket \(path): \(problem). Remove it (or unset TESSERA_SOCKET) and start tesserad again."
        )
      }
    } catch let error as SystemCallError {
      throw BusCallError(name: Self.noSocketError, message: "\(path) is not there (\(error.errno))")
    } catch let error as BusCallError {
      throw error
    } catch {
      throw BusCallError(name: Self.noSocketError, message: "\(path): \(error)")
    }
    let fd: Int32
    do { fd = try DirectSocket.connect(path) } catch {
      throw BusCallError(name: Self.noSocketError, message: "nothing answers on \(path) (\(error.errno))")
    }
    let peer: DirectSocket.PeerCredentials
    do { peer = try DirectSocket.peerCredentials(fd) } catch {
      close(fd)
      throw BusCallError(name: Self.untrustedSocketError, message: "Cannot tell who listens on \(path): \(error)")
    }
    guard peer.uid == getuid() else {
      close(fd)
      throw BusCallError(
        name: Self.untrustedSocketError,
        message:
          "Refusing to use the socket \(path): the process listening on it (pid \(peer.pid)) runs as user \(peer.uid), not as you (user \(getuid())). Nothing was sent to it; find out who started it."
      )
    }
    if let refusal = vet(peer) {
      close(fd)
      throw BusCallError(name: Self.untrustedSocketError, message: refusal)
    }
    var r = sd_bus_new(&bus)
    if r >= 0 { r = sd_bus_set_fd(bus, fd, fd) } else { close(fd) }
    if r >= 0 { r = sd_bus_negotiate_fds(bus, 0) }
    if r >= 0 { r = sd_bus_start(bus) }
    guard r >= 0 else {
      throw BusCallError(
        name: "org.freedesktop.DBus.Error.Failed",
        message: "Could not speak D-Bus on \(path): \(Syscall.describe(negative: r))")
    }
    directPeer = peer
  }

  public init() throws(BusCallError) {
    let r = sd_bus_open_user(&bus)
    guard r >= 0 else {
      throw BusCallError(
        name: "org.freedesktop.DBus.Error.NoServer",
        message:
          "Cannot connect to the session bus (\(Syscall.describe(negative: r))). Run inside a desktop or `dbus-run-session` session."
      )
    }
  }

  deinit { sd_bus_flush_close_unref(bus) }

  final class CallState {
    var reply: Result<[BusValue], BusCallError>?
    var onSignal: ((String, [BusValue]) -> Void)?
    /// The only connection whose signals are delivered to `onSignal`.
    var signalSender: String?
    /// A direct connection: its one peer (checked at connect) sends every signal, with no sender.
    var direct = false
    /// The broker's name lost its owner, or changed it (watchSignals).
    var ownerChanged = false
  }

  /// Who owns a bus name, as the bus daemon vouches for it (GetConnectionCredentials).
  public struct NameOwner: Sendable, Equatable {
    public let uniqueName: String
    public let pid: UInt32?
    public let uid: UInt32?
    public init(uniqueName: String, pid: UInt32?, uid: UInt32?) {
      self.uniqueName = uniqueName
      self.pid = pid
      self.uid = uid
    }
  }

  /// The current owner of `name` (its unique name, process and user), or nil when it has none.
  public func owner(of name: String) throws(BusCallError) -> NameOwner? {
    var creds: OpaquePointer?
    let mask = UInt64(SD_BUS_CREDS_UNIQUE_NAME | SD_BUS_CREDS_PID | SD_BUS_CREDS_EUID)
    let r = sd_bus_get_name_creds(bus, name, mask, &creds)
    if r == -ENXIO || r == -ESRCH { return nil }  // no owner
    try check(r, "GetConnectionCredentials(\(name))")
    defer { sd_bus_creds_unref(creds) }
    var unique: UnsafePointer<CChar>?
    try check(sd_bus_creds_get_unique_name(creds, &unique), "read the owner's unique name")
    var pid: pid_t = 0
    var uid: uid_t = 0
    return NameOwner(
      uniqueName: unique.map { String(cString: $0) } ?? "",
      pid: sd_bus_creds_get_pid(creds, &pid) >= 0 ? UInt32(pid) : nil,
      uid: sd_bus_creds_get_euid(creds, &uid) >= 0 ? uid : nil)
  }

  /// Calls a method and waits for the reply, dispatching the broker's signals meanwhile: only those
  /// sent by `signalSender` (a unique name), when `onSignal` is given. Signals from any other
  /// connection, broadcast or sent to this one, are dropped.
  public func call(
    destination: String = BrokerInterface.busName, path: String = BrokerInterface.objectPath,
    interface: String = BrokerInterface.interfaceName, member: String, arguments: [BusValue],
    timeoutSeconds: Double = 25, signalSender: String? = nil, onSignal: ((String, [BusValue]) -> Void)? = nil,
    stopped: (() -> Bool)? = nil
  ) throws(BusCallError) -> [BusValue] {
    guard onSignal == nil || signalSender != nil || directPeer != nil else {
      throw BusCallError(
        name: "org.freedesktop.DBus.Error.InvalidArgs",
        message: "Signals are accepted from a known sender only: pass signalSender (the broker's unique name).")
    }
    var message: OpaquePointer?
    try check(sd_bus_message_new_method_call(bus, &message, destination, path, interface, member), "create call")
    defer { sd_bus_message_unref(message) }
    do {
      for argument in arguments { try BusCodec.append(message!, argument) }
    } catch {
      throw BusCallError(name: "org.freedesktop.DBus.Error.InvalidArgs", message: "Cannot encode the call: \(error)")
    }

    let state = CallState()
    state.onSignal = onSignal
    state.signalSender = signalSender
    state.direct = directPeer != nil
    let userdata = Unmanaged.passUnretained(state).toOpaque()
    var matchSlot: OpaquePointer?
    if onSignal != nil {
      try check(
        sd_bus_match_signal(
          bus, &matchSlot, directPeer == nil ? signalSender : nil, BrokerInterface.objectPath,
          BrokerInterface.interfaceName, nil, signalReceived,
          userdata),
        "subscribe to signals")
    }
    defer { sd_bus_slot_unref(matchSlot) }
    var callSlot: OpaquePointer?
    try check(
      sd_bus_call_async(bus, &callSlot, message, replyReceived, userdata, UInt64(timeoutSeconds * 1_000_000)),
      "send call")
    defer { sd_bus_slot_unref(callSlot) }
    while state.reply == nil {
      let r = sd_bus_process(bus, nil)
      try check(r, "process")
      if r > 0 { continue }
      // With `stopped`, it is asked every 100 ms while the reply is awaited.
      if let stopped, stopped() {
        throw BusCallError(name: Self.stoppedError, message: "The call was abandoned before its reply came.")
      }
      try check(sd_bus_wait(bus, stopped == nil ? UInt64.max : 100_000), "wait")
    }
    return try withExtendedLifetime(state) { () throws(BusCallError) -> [BusValue] in try state.reply!.get() }
  }

  /// Waits for the broker's signal `member` (sent by `signalSender`, a unique name, on the bus;
  /// by the one peer on a direct connection) and returns its values; or returns nil once `until`
  /// says so (asked every `interval` seconds). Throws when the connection closes.
  public func waitForSignal(
    _ member: String, signalSender: String?, interval: Double = 0.2, until: () -> Bool
  ) throws(BusCallError) -> [BusValue]? {
    let state = try signalState(signalSender)
    var received: [BusValue]?
    state.onSignal = { name, values in if name == member { received = values } }
    var matchSlot: OpaquePointer?
    try check(
      sd_bus_match_signal(
        bus, &matchSlot, directPeer == nil ? signalSender : nil, BrokerInterface.objectPath,
        BrokerInterface.interfaceName, member, signalReceived, Unmanaged.passUnretained(state).toOpaque()),
      "subscribe to \(member)")
    defer { sd_bus_slot_unref(matchSlot) }
    return try withExtendedLifetime(state) { () throws(BusCallError) -> [BusValue]? in
      while true {
        let r = sd_bus_process(bus, nil)
        if r < 0 || sd_bus_is_open(bus) <= 0 {
          throw BusCallError(
            name: "org.freedesktop.DBus.Error.Disconnected", message: "The connection to the broker closed.")
        }
        if let received { return received }
        if r > 0 { continue }
        if until() { return nil }
        try check(sd_bus_wait(bus, UInt64(interval * 1_000_000)), "wait")
      }
    }
  }

  /// Hands every signal of the broker's interface, and its PropertiesChanged, to `onSignal`
  /// (member, values) until `until` says stop (asked every `interval` seconds); only the broker
  /// (`signalSender` on the bus, the one peer of a direct connection) is heard. Throws when the
  /// connection closes, or on the bus when org.tessera.Broker1 changes owner (tesserad stopped
  /// or restarted: `brokerLeftError`).
  public func watchSignals(
    signalSender: String?, interval: Double = 0.2, until: () -> Bool, onStart: () -> Void = {},
    onSignal: @escaping (String, [BusValue]) -> Void
  ) throws(BusCallError) {
    let state = try signalState(signalSender)
    state.onSignal = onSignal
    let sender = directPeer == nil ? signalSender : nil
    let userdata = Unmanaged.passUnretained(state).toOpaque()
    var broker: OpaquePointer?
    try check(
      sd_bus_match_signal(
        bus, &broker, sender, BrokerInterface.objectPath, BrokerInterface.interfaceName, nil, signalReceived, userdata),
      "subscribe to the broker's signals")
    defer { sd_bus_slot_unref(broker) }
    var properties: OpaquePointer?
    try check(
      sd_bus_match_signal(
        bus, &properties, sender, BrokerInterface.objectPath, "org.freedesktop.DBus.Properties", "PropertiesChanged",
        signalReceived, userdata),
      "subscribe to the broker's property changes")
    defer { sd_bus_slot_unref(properties) }
    var owner: OpaquePointer?
    if directPeer == nil {
      try check(
        sd_bus_match_signal(
          bus, &owner, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "NameOwnerChanged",
          nameOwnerChanged, userdata),
        "subscribe to the broker's name")
    }
    defer { sd_bus_slot_unref(owner) }
    // The bus daemon has the matches (each AddMatch was answered): nothing from here on is missed.
    onStart()
    try withExtendedLifetime(state) { () throws(BusCallError) in
      while !until() {
        let r = sd_bus_process(bus, nil)
        if r < 0 || sd_bus_is_open(bus) <= 0 {
          throw BusCallError(
            name: "org.freedesktop.DBus.Error.Disconnected", message: "The connection to the broker closed.")
        }
        if state.ownerChanged {
          throw BusCallError(name: Self.brokerLeftError, message: "The broker left the bus (tesserad stopped).")
        }
        if r > 0 { continue }
        try check(sd_bus_wait(bus, UInt64(interval * 1_000_000)), "wait")
      }
    }
  }

  /// watchSignals: org.tessera.Broker1 changed owner.
  public static let brokerLeftError = "org.tessera.Client.Error.BrokerLeft"

  /// The state signals are checked against: from `signalSender` on the bus, from the one peer of a
  /// direct connection; a bus connection that names no sender hears nobody.
  private func signalState(_ signalSender: String?) throws(BusCallError) -> CallState {
    guard signalSender != nil || directPeer != nil else {
      throw BusCallError(
        name: "org.freedesktop.DBus.Error.InvalidArgs",
        message: "Signals are accepted from a known sender only: pass signalSender (the broker's unique name).")
    }
    let state = CallState()
    state.signalSender = signalSender
    state.direct = directPeer != nil
    return state
  }

  /// The error of a call given up through `stopped`.
  public static let stoppedError = "org.tessera.Client.Error.Stopped"

  private func check(_ r: Int32, _ what: String) throws(BusCallError) {
    if r < 0 {
      throw BusCallError(
        name: "org.freedesktop.DBus.Error.Failed", message: "D-Bus \(what) failed: \(Syscall.describe(negative: r))")
    }
  }
}

private let replyReceived: sd_bus_message_handler_t = { message, userdata, _ in
  let state = Unmanaged<BusClient.CallState>.fromOpaque(userdata!).takeUnretainedValue()
  guard let message else { return 0 }
  if let error = sd_bus_message_get_error(message), error.pointee.name != nil {
    state.reply = .failure(
      BusCallError(
        name: String(cString: error.pointee.name), message: error.pointee.message.map { String(cString: $0) } ?? ""))
  } else {
    do {
      state.reply = .success(try BusCodec.readAll(message, limits: .replies))
    } catch {
      state.reply = .failure(
        BusCallError(name: "org.freedesktop.DBus.Error.InvalidArgs", message: "Unreadable reply: \(error)"))
    }
  }
  return 1
}

private let signalReceived: sd_bus_message_handler_t = { message, userdata, _ in
  let state = Unmanaged<BusClient.CallState>.fromOpaque(userdata!).takeUnretainedValue()
  guard let message, let member = sd_bus_message_get_member(message) else { return 0 }
  // The match names the sender already; checked again here, where it is decided. A direct
  // connection has one peer, the broker checked at connect, and no sender field.
  if !state.direct {
    guard let expected = state.signalSender, let sender = sd_bus_message_get_sender(message),
      strcmp(sender, expected) == 0
    else { return 0 }
  }
  if let values = try? BusCodec.readAll(message, limits: .replies) { state.onSignal?(String(cString: member), values) }
  return 0
}

/// NameOwnerChanged from the bus daemon (the match names it as sender): the broker's name
/// (arg0) changed hands.
private let nameOwnerChanged: sd_bus_message_handler_t = { message, userdata, _ in
  let state = Unmanaged<BusClient.CallState>.fromOpaque(userdata!).takeUnretainedValue()
  guard let message, let values = try? BusCodec.readAll(message, limits: .replies),
    values.first?.stringValue == BrokerInterface.busName
  else { return 0 }
  state.ownerChanged = true
  return 0
}
