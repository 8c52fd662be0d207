import CSystemd
import CTesseraBusShim
import Glibc
import SystemPackage
import TesseraInterface
import TesseraSystem

/// Serves one or more interfaces (each with its well-known name and object) on the session bus.
///
/// Threading: one dedicated thread owns the sd-bus connection and its sd-event loop; every sd-bus
/// object is touched only there. A method call is read on that thread, handed to `onCall` (which
/// runs the request as a Swift task), and answered later: the task posts the result to a mailbox
/// and wakes the loop through an eventfd, and the bus thread sends the reply. No caller ever waits
/// behind another's slow sign-in.
public final class BusServer: @unchecked Sendable {
  // Invariant for @unchecked Sendable: `bus`, `event`, `pending`, `nextID`, `callerCache`,
  // `refusals`, `unownedNames`, the outgoing state and the exported objects' sd-bus state are used
  // only on the bus thread; `mailbox` and `propertyValues` are Locked values; `eventFD` is written from
  // any thread (write(2) is safe). The extensions in the other BusServer+*.swift files keep to it.
  var bus: OpaquePointer?
  var event: OpaquePointer?
  /// Calls handed to `onCall`, waiting for their reply, by the id of their ReplyToken.
  var pending: [UInt64: OpaquePointer] = [:]
  var nextID: UInt64 = 0
  private let mailbox = Locked<[Mail]>([])
  private let eventFD: Int32
  private let eventFDError: Int32
  let log: BusLog
  var objects: [ExportedObject] = []
  /// Optional names another program owned at start; asked for again when that program lets go.
  var unownedNames: Set<String> = []

  // Method calls in (BusServer+Dispatch.swift).
  let onCall: CallHandler
  /// Tried on the bus thread before `onCall`: an answer it returns is sent at once.
  let answerAtOnce: (@Sendable (Call) -> FastAnswer?)?
  /// Refusals before the handler, logged at most `RefusalLimiter.linesPerSecond` a second.
  var refusals = RefusalLimiter()

  // Callers (BusServer+Callers.swift).
  var callerCache: [String: (info: CallerInfo, process: (any CallerProcess)?)] = [:]
  /// Called (on the bus thread) when a unique name leaves the bus.
  let onCallerGone: @Sendable (String) -> Void
  /// Tells which app a caller is, from its pid and security label; once per connection.
  let identify: (@Sendable (UInt32, String?) -> (any CallerProcess)?)?
  let ownUID = getuid()
  /// How many callers are pinned at once: 4096, or fewer when the descriptor limit is low (256
  /// kept for sockets, the keyring and HTTP).
  let pinLimit: Int = {
    var limit = rlimit()
    guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 512 }
    return max(64, min(4096, Int(clamping: limit.rlim_cur) - 256))
  }()

  // Properties (BusServer+Properties.swift): current values of those that change, by interface, then name.
  let propertyValues = Locked<[String: [String: BusValue]]>([:])

  // Outgoing calls and signal watches (BusServer+Outgoing.swift).
  /// The system bus, opened on the bus thread at the first call or watch that needs it.
  var systemBus: OpaquePointer?
  var systemBusFailed = false
  /// Signal watches and calls under way; kept alive here while sd-bus holds their pointers.
  var watches: [SignalWatch] = []
  var outgoingCalls: [ObjectIdentifier: Outgoing] = [:]

  // The direct socket (BusServer+Direct.swift).
  /// The listening socket, when the server serves one.
  let listener: DirectSocket.Listener?
  /// The interfaces exported on direct connections (Tessera's own; not Microsoft's).
  let directInterfaces: Set<String>
  /// Pins a direct caller from the pidfd the kernel gave for it at connect time (SO_PEERPIDFD).
  let identifyPinned: (@Sendable (Int32, UInt32, String?) -> (any CallerProcess)?)?
  var peers: [OpaquePointer: DirectPeer] = [:]
  var peersByName: [String: DirectPeer] = [:]
  /// Connections that ended, closed after the loop iteration that saw them end.
  var closingPeers: [OpaquePointer] = []
  var nextPeerNumber: UInt64 = 0
  /// The thread that runs the loop, once it runs (`preconditionOnBusThread`).
  let busThread = Locked<pthread_t?>(nil)
  /// Whether the pidfd of a direct connection's process comes from the kernel (SO_PEERPIDFD,
  /// Linux 6.5) where it has it; false plays an older kernel, where pidfd_open at accept pins the
  /// process instead. Set before `start` (the tests of that path).
  package var kernelPeerPidfd = true
  /// Whether the server must have its session bus even with a socket of its own: a broker that
  /// bus started (D-Bus activation without systemd) exits when that bus is already gone, rather
  /// than serve its socket alone with nothing left to stop it. Set before `start`.
  public var sessionBusRequired = false
  var serverID = sd_id128_t()
  var postSource: OpaquePointer?
  /// Makes the loop iterate again while a fresh connection has more to read (processFreshPeers).
  var drainSource: OpaquePointer?
  /// Forwards of the socket (BusServer+Forwards.swift), by name.
  var forwards: [String: ForwardListener] = [:]
  /// Without a session bus, why not (set on the bus thread before `start` returns); the server
  /// then serves the direct socket alone.
  public private(set) var sessionBusMissing: String?

  /// Which bus an outgoing call or a signal watch is on.
  public enum Bus: Sendable {
    case session
    /// The system bus ($DBUS_SYSTEM_BUS_ADDRESS, else the default socket): logind, NetworkManager.
    case system
  }

  /// A method call, as read off the bus.
  public struct Call: Sendable {
    /// The interface called, held by reference: copied whole into each call (and out of it), its
    /// arrays, strings and closure cost 4% of a silent call's instructions in retains and releases.
    let exported: InterfaceBox
    public var interface: InterfaceDescription { exported.description }
    public var interfaceName: String { exported.description.name }
    public let member: String
    public let arguments: [BusValue]
    public let caller: CallerInfo
  }

  /// An interface's description, shared by reference.
  final class InterfaceBox: Sendable {
    let description: InterfaceDescription
    init(_ description: InterfaceDescription) { self.description = description }
  }

  public typealias CallHandler = @Sendable (_ call: Call, _ reply: ReplyToken) -> Void

  /// Identifies a pending call; pass it back to `reply`.
  public struct ReplyToken: Sendable {
    let id: UInt64
  }

  enum Mail {
    case reply(UInt64, Result<[BusValue], TesseraError>)
    case property(path: String, interface: String, name: String)
    case call(Outgoing)
    case watch(SignalWatch)
    case signal(path: String, interface: String, destination: String?, member: String, arguments: [BusValue])
    /// Work that touches the bus thread's state (forwards), run there.
    case run(@Sendable () -> Void)
    case exit
  }

  public struct StartError: Error, CustomStringConvertible {
    public let description: String
  }

  public init(
    interfaces: [InterfaceDescription], log: @escaping BusLog = { _, _ in }, onCall: @escaping CallHandler,
    onCallerGone: @escaping @Sendable (String) -> Void = { _ in },
    answerAtOnce: (@Sendable (Call) -> FastAnswer?)? = nil,
    identify: (@Sendable (UInt32, String?) -> (any CallerProcess)?)? = nil,
    identifyPinned: (@Sendable (Int32, UInt32, String?) -> (any CallerProcess)?)? = nil,
    listener: DirectSocket.Listener? = nil, directInterfaces: Set<String> = [BrokerInterface.interfaceName]
  ) {
    self.identify = identify
    self.identifyPinned = identifyPinned
    self.listener = listener
    self.directInterfaces = directInterfaces
    self.log = log
    self.onCall = onCall
    self.answerAtOnce = answerAtOnce
    self.onCallerGone = onCallerGone
    let fd = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
    self.eventFDError = fd < 0 ? errno : 0
    self.eventFD = fd
    self.objects = interfaces.map { ExportedObject(description: $0) }
    for object in objects { object.server = self }
  }

  /// Connects, exports the objects, takes the well-known names, and runs the loop on its own
  /// thread. Returns once the names are owned (or throws why not), with the optional names that
  /// another program owns (see `InterfaceDescription.nameIsOptional`). `onExit` runs when the
  /// loop ends.
  @discardableResult
  public func start(onExit: @escaping @Sendable (String?) -> Void) async throws -> [String] {
    guard eventFD >= 0 else {
      throw StartError(description: "Could not create an eventfd: \(Errno(rawValue: eventFDError))")
    }
    // The bus thread reports whether it got going; the caller's task waits without blocking a thread.
    return try await withCheckedThrowingContinuation { (ready: CheckedContinuation<[String], any Error>) in
      do {
        try startThread(name: "tessera-bus") { [self] in
          busThread.withLock { $0 = pthread_self() }
          let unowned: [String]
          do {
            unowned = try self.connect()
          } catch {
            ready.resume(throwing: error)
            return
          }
          ready.resume(returning: unowned)
          let r = sd_event_loop(self.event)
          self.log(.info, "Bus loop ended (\(r))")
          onExit(r < 0 ? "the bus loop failed: \(Errno(rawValue: -r))" : nil)
        }
      } catch {
        ready.resume(throwing: StartError(description: "Could not start the bus thread: \(error)"))
      }
    }
  }

  /// Asks the loop to finish; pending calls are answered with Cancelled first.
  public func stop() { post(.exit) }

  /// Sends the result of a call. Thread-safe.
  public func reply(_ token: ReplyToken, _ result: Result<[BusValue], TesseraError>) { post(.reply(token.id, result)) }

  /// Emits a signal of an exported interface, to one unique name or (nil) to everyone. Thread-safe.
  public func emit(
    _ interface: InterfaceDescription, _ member: String, _ arguments: [BusValue], to destination: String? = nil
  ) {
    post(
      .signal(
        path: interface.objectPath, interface: interface.name, destination: destination, member: member,
        arguments: arguments))
  }

  /// Traps, in debug and test builds, when code that only the bus thread may run (it touches
  /// sd-bus connections and the state this class confines to that thread) runs on another, as
  /// swift-nio's `preconditionInEventLoop` does: the invariant of `@unchecked Sendable`, checked.
  /// Release builds check nothing (the silent call's path runs through it).
  @inline(__always)
  func preconditionOnBusThread(_ function: StaticString = #function, file: StaticString = #fileID, line: UInt = #line) {
    #if DEBUG
      let owner = busThread.withLock { $0 }
      precondition(
        owner.map { pthread_equal($0, pthread_self()) != 0 } ?? false,
        "BusServer.\(function) runs on the bus thread only, and was called on another thread", file: file, line: line)
    #endif
  }

  func post(_ mail: Mail) {
    mailbox.withLock { $0.append(mail) }
    var one: UInt64 = 1
    // Only EAGAIN can fail here (the counter is full), and then the loop is awake already.
    _ = try? Syscall.check("write(eventfd)") { write(eventFD, &one, 8) }
  }

  // MARK: - Bus thread

  /// Returns the optional names another program owns.
  private func connect() throws -> [String] {
    preconditionOnBusThread()
    func check(_ r: Int32, _ what: String) throws {
      if r < 0 { throw StartError(description: "\(what): \(Errno(rawValue: -r))") }
    }
    try check(sd_event_new(&event), "sd_event_new")
    let me = Unmanaged.passUnretained(self).toOpaque()
    try check(sd_event_add_io(event, nil, eventFD, UInt32(EPOLLIN.rawValue), mailboxReady, me), "sd_event_add_io")
    try check(sd_id128_randomize(&serverID), "sd_id128_randomize")
    try attachPeerSources()
    if let listener { try attachListener(listener.fd) }
    let opened = sd_bus_open_user(&bus)
    if opened < 0 {
      bus = nil
      let why = "Could not connect to the session bus (\(Errno(rawValue: -opened))); is DBUS_SESSION_BUS_ADDRESS set?"
      // With a socket of its own the broker serves that alone; without one it has nothing to serve.
      guard listener != nil else { throw StartError(description: why) }
      guard !sessionBusRequired else {
        throw StartError(
          description:
            "The session bus that started tesserad is gone (\(Errno(rawValue: -opened))): its session has ended, so tesserad leaves too. The next program that asks starts it again."
        )
      }
      sessionBusMissing = why
      return objects.map(\.description.busName)
    }
    try check(sd_bus_set_exit_on_disconnect(bus, 1), "sd_bus_set_exit_on_disconnect")
    try check(sd_bus_attach_event(bus, event, 0), "sd_bus_attach_event")
    try check(sd_bus_add_filter(bus, nil, signatureFilter, me), "sd_bus_add_filter")
    for object in objects {
      let description = object.description
      try check(
        sd_bus_add_object_vtable(
          bus, nil, description.objectPath, description.name, object.vtable,
          Unmanaged.passUnretained(object).toOpaque()),
        "Could not export \(description.objectPath)")
    }
    try check(
      sd_bus_match_signal(
        bus, nil, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "NameOwnerChanged",
        nameOwnerChangedHandler, me), "Could not watch callers leaving the bus")
    var unowned: [String] = []
    for object in objects {
      let name = object.description.busName
      let r = sd_bus_request_name(bus, name, 0)
      if r == -EEXIST || r == -EALREADY {
        if object.description.nameIsOptional {
          unowned.append(name)
          continue
        }
        throw StartError(description: "\(name) is already owned on this bus: another broker is running. Stop it first.")
      }
      try check(r, "Could not own \(name)")
    }
    unownedNames = Set(unowned)
    return unowned
  }

  /// NameOwnerChanged(name, old, new): a unique name with no new owner has left the bus.
  func nameOwnerChanged(_ message: OpaquePointer) {
    preconditionOnBusThread()
    guard let values = try? BusCodec.readAll(message, limits: .replies), values.count == 3,
      case .string(let name) = values[0],
      case .string(let newOwner) = values[2], newOwner.isEmpty
    else { return }
    if unownedNames.contains(name) {
      // The other owner of an optional name (another broker) let go of it: serve it now.
      let r = sd_bus_request_name(bus, name, 0)
      if r >= 0 {
        unownedNames.remove(name)
        log(.notice, "\(name) was released by its other owner; tesserad serves it now")
      } else {
        log(.notice, "\(name) was released by its other owner, but could not be taken: \(Errno(rawValue: -r))")
      }
      return
    }
    guard name.hasPrefix(":") else { return }
    callerCache[name] = nil
    ownerLeft(name)
    onCallerGone(name)
  }

  func drainMailbox() {
    preconditionOnBusThread()
    var counter: UInt64 = 0
    _ = try? Syscall.check("read(eventfd)") { read(eventFD, &counter, 8) }
    let mails = mailbox.withLock { mails -> [Mail] in
      defer { mails.removeAll(keepingCapacity: true) }
      return mails
    }
    for mail in mails {
      switch mail {
      case .reply(let id, let result):
        guard let message = pending.removeValue(forKey: id) else { continue }
        directCallAnswered(message)
        send(reply: result, to: message)
        sd_bus_message_unref(message)
      case .signal(let path, let interface, let destination, let member, let arguments):
        sendSignal(path: path, interface: interface, member: member, arguments: arguments, to: destination)
      case .property(let path, let interface, let name):
        // Not to forwarded callers: a changing property carries the user's data (account ids).
        let connections =
          (bus.map { [$0] } ?? []) + (directInterfaces.contains(interface) ? localPeers : [])
        for connection in connections {
          let r = name.withCString { pointer -> Int32 in
            var names: [UnsafeMutablePointer<CChar>?] = [UnsafeMutablePointer(mutating: pointer), nil]
            return sd_bus_emit_properties_changed_strv(connection, path, interface, &names)
          }
          if r < 0 && connection == bus {
            log(.notice, "Could not emit PropertiesChanged for \(name): \(Errno(rawValue: -r))")
          }
          if connection != bus, let peer = peers[connection] { checkBacklog(peer) }
        }
      case .call(let outgoing):
        startCall(outgoing)
      case .watch(let watch):
        startWatch(watch)
      case .run(let work):
        work()
      case .exit:
        // Callers still waiting (an interactive sign-in, say) get an answer, not a NoReply.
        for (_, message) in pending {
          replyError(message, .cancelled("The broker is shutting down, so this request was cancelled. Run it again."))
          sd_bus_message_unref(message)
        }
        pending.removeAll()
        closeForwards(reason: "tesserad is stopping")
        closePeers()
        if let bus { _ = sd_bus_flush(bus) }
        sd_event_exit(event, 0)
      }
    }
  }

}

/// Levels of the bus layer's few log lines (the daemon maps them to its logger).
public enum BusLogLevel: Sendable {
  case info, notice, error
}
public typealias BusLog = @Sendable (BusLogLevel, String) -> Void

func server(_ userdata: UnsafeMutableRawPointer?) -> BusServer {
  Unmanaged<BusServer>.fromOpaque(userdata!).takeUnretainedValue()
}

private let nameOwnerChangedHandler: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message else { return 0 }
  server(userdata).nameOwnerChanged(message)
  return 0
}

private let mailboxReady: sd_event_io_handler_t = { _, _, _, userdata in
  server(userdata).drainMailbox()
  return 0
}
