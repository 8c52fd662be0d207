import CSystemd
import CTesseraBusShim
import Glibc
import Synchronization
import SystemPackage
import TesseraInterface

/// Serves one or more interfaces (each with its well-known name and object) on the session bus.
///
/// Threading: one dedicated thread owns the sd-bus connection and its sd-event loop; every sd-bus
/// object is touched only there. A method call is read on that thread, handed to `onCall` (which
/// runs the request as a Swift task), and answered later: the task posts the result to a mailbox
/// and wakes the loop through an eventfd, and the bus thread sends the reply. No caller ever waits
/// behind another's slow sign-in.
public final class BusServer: @unchecked Sendable {
  // Invariant for @unchecked Sendable: `bus`, `event`, `pending`, `nextID`, `callerCache`, the
  // refusal counters, `unownedNames` and the exported objects' sd-bus state are used only on the bus thread; `mailbox` is a Mutex; `eventFD`
  // is written from any thread (write(2) is safe).
  private var bus: OpaquePointer?
  private var event: OpaquePointer?
  private var pending: [UInt64: OpaquePointer] = [:]
  private var nextID: UInt64 = 0
  private var callerCache: [String: (info: CallerInfo, process: (any CallerProcess)?)] = [:]
  private let mailbox = Mutex<[Mail]>([])
  private let eventFD: Int32
  private let eventFDError: Int32
  private let log: BusLog
  private var objects: [ExportedObject] = []
  /// Current values of the properties that change (by interface, then name).
  private let propertyValues = Mutex<[String: [String: BusValue]]>([:])
  /// The system bus, opened on the bus thread at the first call or watch that needs it.
  private var systemBus: OpaquePointer?
  private var systemBusFailed = false
  /// Signal watches and calls under way; kept alive here while sd-bus holds their pointers.
  private var watches: [SignalWatch] = []
  private var outgoingCalls: [ObjectIdentifier: Outgoing] = [:]

  /// Which bus an outgoing call or a signal watch is on.
  public enum Bus: Sendable {
    case session
    /// The system bus ($DBUS_SYSTEM_BUS_ADDRESS, else the default socket): logind, NetworkManager.
    case system
  }

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

  /// A method call, as read off the bus.
  public struct Call: Sendable {
    public let interface: InterfaceDescription
    public let member: String
    public let arguments: [BusValue]
    public let caller: CallerInfo
  }

  public typealias CallHandler = @Sendable (_ call: Call, _ reply: ReplyToken) -> Void
  private let onCall: CallHandler
  /// Tried on the bus thread before `onCall`: an answer it returns is sent at once.
  private let answerAtOnce: (@Sendable (Call) -> FastAnswer?)?
  /// Called (on the bus thread) when a unique name leaves the bus.
  private let onCallerGone: @Sendable (String) -> Void
  /// Tells which app a caller is, from its pid and security label; once per connection.
  private let identify: (@Sendable (UInt32, String?) -> (any CallerProcess)?)?
  private let ownUID = getuid()
  /// How many callers are pinned at once: 4096, or fewer when the descriptor limit is low (256
  /// kept for sockets, the keyring and HTTP).
  private let pinLimit: Int = {
    var limit = rlimit()
    guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 512 }
    return max(64, min(4096, Int(clamping: limit.rlim_cur) - 256))
  }()

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
    case exit
  }

  public struct StartError: Error, CustomStringConvertible {
    public let description: String
  }

  public init(
    interfaces: [InterfaceDescription], log: @escaping BusLog = { _, _ in }, onCall: @escaping CallHandler,
    onCallerGone: @escaping @Sendable (String) -> Void = { _ in },
    answerAtOnce: (@Sendable (Call) -> FastAnswer?)? = nil,
    identify: (@Sendable (UInt32, String?) -> (any CallerProcess)?)? = nil
  ) {
    self.identify = identify
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

  /// Sets a changing property (see `InterfaceDescription.Property.emitsChange`) and emits
  /// PropertiesChanged when the value is new. Thread-safe.
  public func setProperty(_ interface: InterfaceDescription, _ name: String, _ value: BusValue) {
    let changed = propertyValues.withLock { values -> Bool in
      guard values[interface.name]?[name] != value else { return false }
      values[interface.name, default: [:]][name] = value
      return true
    }
    if changed { post(.property(path: interface.objectPath, interface: interface.name, name: name)) }
  }

  /// The current value of a changing property (its initial value until set).
  func propertyValue(_ interface: InterfaceDescription, _ name: String) -> BusValue? {
    propertyValues.withLock { $0[interface.name]?[name] }
      ?? interface.properties.first { $0.name == name }?.value
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

  private func post(_ mail: Mail) {
    mailbox.withLock { $0.append(mail) }
    var one: UInt64 = 1
    // Only EAGAIN can fail here (the counter is full), and then the loop is awake already.
    _ = try? Syscall.check("write(eventfd)") { write(eventFD, &one, 8) }
  }

  // MARK: - Bus thread

  /// Returns the optional names another program owns.
  private func connect() throws -> [String] {
    func check(_ r: Int32, _ what: String) throws {
      if r < 0 { throw StartError(description: "\(what): \(Errno(rawValue: -r))") }
    }
    try check(sd_bus_open_user(&bus), "Could not connect to the session bus (is DBUS_SESSION_BUS_ADDRESS set?)")
    try check(sd_bus_set_exit_on_disconnect(bus, 1), "sd_bus_set_exit_on_disconnect")
    try check(sd_event_new(&event), "sd_event_new")
    try check(sd_bus_attach_event(bus, event, 0), "sd_bus_attach_event")
    let me = Unmanaged.passUnretained(self).toOpaque()
    try check(sd_bus_add_filter(bus, nil, signatureFilter, me), "sd_bus_add_filter")
    for object in objects {
      let description = object.description
      try check(
        sd_bus_add_object_vtable(
          bus, nil, description.objectPath, description.name, object.vtable,
          Unmanaged.passUnretained(object).toOpaque()),
        "Could not export \(description.objectPath)")
    }
    try check(sd_event_add_io(event, nil, eventFD, UInt32(EPOLLIN.rawValue), mailboxReady, me), "sd_event_add_io")
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

  fileprivate func handleMethodCall(_ message: OpaquePointer, object: ExportedObject) -> Int32 {
    let member = sd_bus_message_get_member(message).map { String(cString: $0) } ?? ""
    let arguments: [BusValue]
    do {
      arguments = try BusCodec.readAll(message, limits: object.description.callLimits)
    } catch let over as BusCodec.OverLimit {
      let inputs = object.description.methods.first { $0.name == member }?.inputs ?? []
      var place = over.argument.flatMap { $0 < inputs.count ? "argument \(inputs[$0].name)" : nil } ?? "a value"
      if let key = over.key { place += ", key '\(RequestOptions.clip(key))'" }
      return refuse(
        message, member,
        .invalidArgument(
          "The call to \(member) was refused before being read whole: \(place) holds \(over). Send fewer or shorter values (the limits are annotated in \(object.description.name).xml)."
        ))
    } catch {
      return refuse(
        message, member,
        .invalidArgument("The arguments of \(member) could not be read (\(error)). Check their types."))
    }
    let caller = callerInfo(message)
    // A session bus serves one user; a bus that lets another user connect (or a peer that passed
    // its connection on) must not reach anyone's tokens through it. Refused before anything else.
    if let refusal = refusalForAnotherUser(message) { return refuse(message, member, .accessDenied(refusal)) }
    let call = Call(interface: object.description, member: member, arguments: arguments, caller: caller)
    switch answerAtOnce?(call) {
    case .reply(let result)?:
      send(reply: result, to: message)
      return 1
    case .template(let template, let key, let value)?:
      send(template, adding: key, value, to: message)
      return 1
    case nil: break
    }
    nextID &+= 1
    pending[nextID] = sd_bus_message_ref(message)
    onCall(call, ReplyToken(id: nextID))
    return 1
  }

  /// Rejects calls whose argument types do not match the contract with our own error name
  /// (sd-bus would answer org.freedesktop.DBus.Error.InvalidArgs). It sees every message, so the
  /// common case (a call to one of our methods with the right types, or a message for someone else)
  /// is decided on C strings without building Swift ones.
  fileprivate func filter(_ message: OpaquePointer) -> Int32 {
    guard sd_bus_message_is_method_call(message, nil, nil) > 0, let path = sd_bus_message_get_path(message),
      let member = sd_bus_message_get_member(message)
    else { return 0 }
    // Calls may omit the interface field; sd-bus then dispatches them by member name.
    let interface = sd_bus_message_get_interface(message)
    for object in objects where strcmp(object.path, path) == 0 {
      guard interface.map({ strcmp($0, object.interfaceName) == 0 }) ?? true,
        let index = object.methodNames.firstIndex(where: { strcmp($0, member) == 0 })
      else { continue }
      let method = object.description.methods[index]
      guard sd_bus_message_has_signature(message, object.inputSignatures[index]) == 0 else { return 0 }
      let given = sd_bus_message_get_signature(message, 1).map { String(cString: $0) } ?? ""
      let names = method.inputs.map { "\($0.name): \($0.signature)" }.joined(separator: ", ")
      return refuse(
        message, method.name,
        .invalidArgument(
          "\(method.name) takes (\(names)), but was called with arguments of type '\(given)'. Fix the argument types of the call."
        ))
    }
    return 0
  }

  /// Refuses a call the handler never sees, and logs it (as the fronts log the calls they answer):
  /// at most `refusalsLoggedPerSecond` lines a second, then one line counting the rest, so a flood
  /// of bad calls can neither flood the journal nor churn the bus thread's memory.
  private func refuse(_ message: OpaquePointer, _ member: String, _ failure: TesseraError) -> Int32 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    if now.tv_sec != refusalSecond {
      if refusalsSuppressed > 0 {
        log(.notice, "\(refusalsSuppressed) more calls were refused before being read (not logged one by one)")
      }
      refusalSecond = now.tv_sec
      refusalsLogged = 0
      refusalsSuppressed = 0
    }
    if refusalsLogged < Self.refusalsLoggedPerSecond {
      refusalsLogged += 1
      let caller = callerInfo(message)
      log(
        .notice,
        "\(member) refused before the request was read: \(failure.message) [caller \(caller.busName), pid \(caller.pid.map(String.init) ?? "?"), \(caller.exe ?? "?")]"
      )
    } else {
      refusalsSuppressed += 1
    }
    return replyError(message, failure)
  }
  static let refusalsLoggedPerSecond = 10
  /// Optional names another program owned at start; asked for again when that program lets go.
  private var unownedNames: Set<String> = []
  // Bus thread only (see the class's invariant).
  private var refusalSecond = 0
  private var refusalsLogged = 0
  private var refusalsSuppressed = 0

  /// Answers a call with an error: a D-Bus error of the table's name, or what the interface's
  /// `refusal` makes of it (a protocol whose errors travel in its replies).
  @discardableResult
  private func replyError(_ message: OpaquePointer, _ failure: TesseraError) -> Int32 {
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

  private func exportedObject(of message: OpaquePointer) -> ExportedObject? {
    guard let path = sd_bus_message_get_path(message) else { return nil }
    let interface = sd_bus_message_get_interface(message)
    return objects.first { object in
      strcmp(object.path, path) == 0 && (interface.map { strcmp($0, object.interfaceName) == 0 } ?? true)
    }
  }

  /// The AccessDenied text for a message from another user's connection; nil for our own user.
  fileprivate func refusalForAnotherUser(_ message: OpaquePointer) -> String? {
    let caller = callerInfo(message)
    guard caller.uid != ownUID else { return nil }
    return
      "This broker serves user \(ownUID) only; the caller runs as \(caller.uid.map { "user \($0)" } ?? "an unknown user")."
  }

  private func callerInfo(_ message: OpaquePointer) -> CallerInfo {
    let sender = sd_bus_message_get_sender(message).map { String(cString: $0) } ?? ""
    if var cached = callerCache[sender] {
      // The process that connected has ended, or now runs another program: identified anew.
      if let process = cached.process, process.recheck() {
        let before = cached.info.app?.display ?? "unidentified"
        cached.info.app = process.app
        callerCache[sender] = cached
        log(
          .notice,
          "Caller \(sender) (pid \(cached.info.pid.map(String.init) ?? "?")) is no longer \(before): \(process.app.map { "it now runs \($0.display)" } ?? "the process that connected has ended")"
        )
      }
      return cached.info
    }
    var info = CallerInfo(busName: sender)
    var process: (any CallerProcess)?
    var creds: OpaquePointer?
    let mask = UInt64(
      SD_BUS_CREDS_PID | SD_BUS_CREDS_EUID | SD_BUS_CREDS_EXE | SD_BUS_CREDS_SELINUX_CONTEXT | SD_BUS_CREDS_AUGMENT)
    if sd_bus_query_sender_creds(message, mask, &creds) >= 0, let creds {
      var pid: pid_t = 0
      if sd_bus_creds_get_pid(creds, &pid) >= 0 { info.pid = UInt32(pid) }
      var uid: uid_t = 0
      if sd_bus_creds_get_euid(creds, &uid) >= 0 { info.uid = uid }
      var exe: UnsafePointer<CChar>?
      if sd_bus_creds_get_exe(creds, &exe) >= 0, let exe { info.exe = String(cString: exe) }
      // The LSM label (AppArmor's for snaps): what the bus daemon saw at connect time.
      var label: UnsafePointer<CChar>?
      let hasLabel = sd_bus_creds_get_selinux_context(creds, &label) >= 0 && label != nil
      if let identify, let pid = info.pid {
        process = identify(pid, hasLabel ? String(cString: label!) : nil)
        info.app = process?.app
      }
      sd_bus_creds_unref(creds)
    }
    // Entries leave with their callers (NameOwnerChanged). Each pin holds a pidfd, so they are
    // bounded by the descriptors there are: a caller past that is not identified (it could not
    // be rechecked). A live caller's entry is never dropped: it would be identified again by a
    // pid that may by then name another process.
    if callerCache.count >= pinLimit {
      process = nil
      info.app = nil
    }
    callerCache[sender] = (info, process)
    return info
  }

  /// NameOwnerChanged(name, old, new): a unique name with no new owner has left the bus.
  fileprivate func nameOwnerChanged(_ message: OpaquePointer) {
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
    onCallerGone(name)
  }

  fileprivate func drainMailbox() {
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
        send(reply: result, to: message)
        sd_bus_message_unref(message)
      case .signal(let path, let interface, let destination, let member, let arguments):
        sendSignal(path: path, interface: interface, member: member, arguments: arguments, to: destination)
      case .property(let path, let interface, let name):
        let r = name.withCString { pointer -> Int32 in
          var names: [UnsafeMutablePointer<CChar>?] = [UnsafeMutablePointer(mutating: pointer), nil]
          return sd_bus_emit_properties_changed_strv(bus, path, interface, &names)
        }
        if r < 0 { log(.notice, "Could not emit PropertiesChanged for \(name): \(Errno(rawValue: -r))") }
      case .call(let outgoing):
        startCall(outgoing)
      case .watch(let watch):
        startWatch(watch)
      case .exit:
        // Callers still waiting (an interactive sign-in, say) get an answer, not a NoReply.
        for (_, message) in pending {
          replyError(message, .cancelled("The broker is shutting down, so this request was cancelled. Run it again."))
          sd_bus_message_unref(message)
        }
        pending.removeAll()
        _ = sd_bus_flush(bus)
        sd_event_exit(event, 0)
      }
    }
  }

  /// The connection for `bus`; the system bus is opened on first use and attached to this loop.
  private func connection(_ which: Bus) -> OpaquePointer? {
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

  private func startCall(_ outgoing: Outgoing) {
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

  fileprivate func finishCall(_ outgoing: Outgoing, _ message: OpaquePointer) {
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
  private func startWatch(_ watch: SignalWatch) {
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

  private func send(reply result: Result<[BusValue], TesseraError>, to call: OpaquePointer) {
    switch result {
    case .failure(let failure):
      replyError(call, failure)
    case .success(let values):
      var reply: OpaquePointer?
      guard sd_bus_message_new_method_return(call, &reply) >= 0, let reply else { return }
      defer { sd_bus_message_unref(reply) }
      do {
        for value in values { try BusCodec.append(reply, value) }
      } catch {
        log(.error, "Could not build a reply: \(error)")
        replyError(call, .internal("The broker could not encode its reply. Please report this with the daemon's log."))
        return
      }
      let r = sd_bus_send(bus, reply, nil)
      if r < 0 { log(.notice, "Could not send a reply (caller gone?): \(Errno(rawValue: -r))") }
    }
  }

  /// Sends the template's a{sv} plus one entry, encoded straight from the template's values (its
  /// strings are copied into the message without a second UTF-8 scan, see BusCodec.appendString).
  private func send(_ template: ReplyTemplate, adding key: String, _ value: BusValue, to call: OpaquePointer) {
    var reply: OpaquePointer?
    guard sd_bus_message_new_method_return(call, &reply) >= 0, let reply else { return }
    defer { sd_bus_message_unref(reply) }
    do {
      try BusCodec.append(reply, template.dict, adding: key, value)
    } catch {
      log(.error, "Could not build a reply: \(error)")
      replyError(call, .internal("The broker could not encode its reply. Please report this with the daemon's log."))
      return
    }
    let r = sd_bus_send(bus, reply, nil)
    if r < 0 { log(.notice, "Could not send a reply (caller gone?): \(Errno(rawValue: -r))") }
  }

  private func sendSignal(
    path: String, interface: String, member: String, arguments: [BusValue], to destination: String?
  ) {
    var signal: OpaquePointer?
    guard sd_bus_message_new_signal(bus, &signal, path, interface, member) >= 0, let signal else { return }
    defer { sd_bus_message_unref(signal) }
    if let destination, sd_bus_message_set_destination(signal, destination) < 0 { return }
    do {
      for argument in arguments { try BusCodec.append(signal, argument) }
    } catch {
      log(.error, "Could not build the signal \(member): \(error)")
      return
    }
    _ = sd_bus_send(bus, signal, nil)
  }
}

/// Levels of the bus layer's few log lines (the daemon maps them to its logger).
public enum BusLogLevel: Sendable {
  case info, notice, error
}
public typealias BusLog = @Sendable (BusLogLevel, String) -> Void

/// One exported interface: its description and the sd-bus vtable built from it. Lives as long as
/// the server (sd-bus keeps pointers to the vtable and its strings).
private final class ExportedObject: @unchecked Sendable {
  // Invariant: `server` is set once, before the bus thread starts; the rest is immutable.
  let description: InterfaceDescription
  let vtable: UnsafeMutablePointer<sd_bus_vtable>
  /// C strings for the signature filter, which sees every message.
  let path: UnsafePointer<CChar>
  let interfaceName: UnsafePointer<CChar>
  let methodNames: [UnsafePointer<CChar>]
  let inputSignatures: [UnsafePointer<CChar>]
  unowned(unsafe) var server: BusServer!

  init(description: InterfaceDescription) {
    self.description = description
    let count = 2 + description.methods.count + description.properties.count + description.signals.count
    let table = UnsafeMutablePointer<sd_bus_vtable>.allocate(capacity: count)
    func keep(_ s: String) -> UnsafePointer<CChar> { UnsafePointer(strdup(s)!) }
    func names(_ args: [InterfaceDescription.Argument]) -> UnsafePointer<CChar> {
      let bytes: [CChar] = args.flatMap { Array($0.name.utf8CString) } + [0]
      let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count)
      buffer.initialize(from: bytes, count: bytes.count)
      return UnsafePointer(buffer)
    }
    var i = 0
    tessera_vtable_start(table + i, 0)
    i += 1
    for method in description.methods {
      tessera_vtable_method(
        table + i, keep(method.name), keep(method.inputSignature), keep(method.outputSignature),
        names(method.inputs + method.outputs), methodHandler, 0)
      i += 1
    }
    for property in description.properties {
      tessera_vtable_property(
        table + i, keep(property.name), keep(property.signature), propertyGetter,
        property.emitsChange ? tessera_vtable_property_emits_change() : tessera_vtable_property_const())
      i += 1
    }
    for signal in description.signals {
      tessera_vtable_signal(table + i, keep(signal.name), keep(signal.signature), names(signal.arguments), 0)
      i += 1
    }
    tessera_vtable_end(table + i)
    vtable = table
    path = keep(description.objectPath)
    interfaceName = keep(description.name)
    methodNames = description.methods.map { keep($0.name) }
    inputSignatures = description.methods.map { keep($0.inputSignature) }
  }
}

private func server(_ userdata: UnsafeMutableRawPointer?) -> BusServer {
  Unmanaged<BusServer>.fromOpaque(userdata!).takeUnretainedValue()
}

private func object(_ userdata: UnsafeMutableRawPointer?) -> ExportedObject {
  Unmanaged<ExportedObject>.fromOpaque(userdata!).takeUnretainedValue()
}

private let methodHandler: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message else { return 0 }
  let exported = object(userdata)
  return exported.server.handleMethodCall(message, object: exported)
}

private let signatureFilter: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message else { return 0 }
  return server(userdata).filter(message)
}

private let propertyGetter: sd_bus_property_get_t = { bus, _, _, property, reply, userdata, error in
  guard let reply, let property else { return -EINVAL }
  let name = String(cString: property)
  let exported = object(userdata)
  // A property that changes carries the user's data (AttentionNeeded: account ids): like every
  // method, it is not for another user's connection.
  // No current message: the daemon itself builds PropertiesChanged.
  if exported.description.properties.first(where: { $0.name == name })?.emitsChange == true,
    let asking = sd_bus_get_current_message(bus), let refusal = exported.server.refusalForAnotherUser(asking)
  {
    return sd_bus_error_set(error, TesseraError.Code.accessDenied.dbusName, refusal)
  }
  guard let value = exported.server.propertyValue(exported.description, name) else { return -EINVAL }
  do {
    try BusCodec.append(reply, value)
    return 1
  } catch let failure as BusCodec.Failure {
    return -failure.errno
  } catch {
    return -EINVAL
  }
}

private let nameOwnerChangedHandler: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message else { return 0 }
  server(userdata).nameOwnerChanged(message)
  return 0
}

private let outgoingReplied: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message else { return 0 }
  let outgoing = Unmanaged<BusServer.Outgoing>.fromOpaque(userdata!).takeUnretainedValue()
  outgoing.server?.finishCall(outgoing, message)
  return 1
}

private let signalArrived: sd_bus_message_handler_t = { message, userdata, _ in
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
private let ownerChanged: sd_bus_message_handler_t = { message, userdata, _ in
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

private let mailboxReady: sd_event_io_handler_t = { _, _, _, userdata in
  server(userdata).drainMailbox()
  return 0
}

/// A caller's process as identified at its connection's first call (TesseraPlatform pins it with
/// a pidfd), rechecked at every later call.
public protocol CallerProcess: AnyObject, Sendable {
  /// Who the process is; nil when it could not be identified or has ended.
  var app: AppIdentity? { get }
  /// Looks again; true when `app` changed (the process ended, or exec'd another program).
  func recheck() -> Bool
}
