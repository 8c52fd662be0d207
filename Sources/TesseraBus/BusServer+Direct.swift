import CSystemd
import CTesseraSystemShim
import Glibc
import SystemPackage
import TesseraInterface
import TesseraSystem

/// The direct socket: peers that connect to tesserad's own socket (DirectSocket) and speak D-Bus
/// to it with no bus daemon in between. Each accepted connection is an sd-bus server connection
/// attached to the same sd-event loop, so the bus thread still owns every connection; it exports
/// the same objects with the same vtables, filter, limits and policy as the session bus, and its
/// caller is identified once, at accept, from the kernel's record of who connected.
extension BusServer {
  /// One accepted connection. Used on the bus thread only.
  final class DirectPeer {
    let bus: OpaquePointer
    /// The unique name it is known by (Hello's answer, CallerInfo.busName, signals' destination).
    let name: String
    /// Calls handed to the handler and not yet answered.
    var inFlight = 0
    /// Read until idle once its handshake is over (see `processFreshPeers`).
    var fresh = true
    /// The forward it came through (BusServer+Forwards.swift); nil on tesserad's own socket.
    let forward: String?
    init(bus: OpaquePointer, name: String, forward: String? = nil) {
      self.bus = bus
      self.name = name
      self.forward = forward
    }
  }

  /// The direct connections of this machine's own callers (not those that came through a forward).
  var localPeers: [OpaquePointer] { peers.compactMap { $0.value.forward == nil ? $0.key : nil } }

  /// At most this many direct connections of this machine's own callers at once: each holds a
  /// socket and a pidfd. Connections through forwards do not count here: they have a bound of
  /// their own, so a remote host can never take the local callers' slots.
  var directPeerLimit: Int { max(16, min(1024, pinLimit / 2)) }
  /// At most this many connections through one forward at once: well below the local bound (a
  /// remote user, or root on the remote host, chooses how many to open).
  var forwardPeerLimit: Int { max(4, directPeerLimit / 16) }
  /// At most this many calls of one direct connection wait for the engine at once (answers given
  /// on the bus thread do not count); more are answered Busy. The session bus bounds the same
  /// with its own per-connection limit.
  static let directCallsInFlight = 1024

  /// Adds the listening socket to the loop (bus thread, during `connect`).
  func attachListener(_ fd: Int32) throws {
    let me = Unmanaged.passUnretained(self).toOpaque()
    let r = sd_event_add_io(event, nil, fd, UInt32(EPOLLIN.rawValue), listenerReady, me)
    if r < 0 { throw StartError(description: "Could not watch the direct socket: \(Errno(rawValue: -r))") }
  }

  /// What every direct connection needs of the loop, tesserad's own socket's and forwards' alike
  /// (a forward may serve with no socket of tesserad's own): bus thread, during `connect`.
  func attachPeerSources() throws {
    let me = Unmanaged.passUnretained(self).toOpaque()
    // After each loop iteration: connections whose handshake just ended are read (a batch at a
    // time), and those that ended are closed.
    let p = sd_event_add_post(event, &postSource, postIteration, me)
    if p < 0 { throw StartError(description: "sd_event_add_post: \(Errno(rawValue: -p))") }
    _ = sd_event_source_set_enabled(postSource, Int32(SD_EVENT_ON))
    // Enabled once at a time, when a fresh connection has more to read: the loop then iterates
    // again even if nothing else happens.
    let d = sd_event_add_defer(event, &drainSource, drainFresh, me)
    if d < 0 { throw StartError(description: "sd_event_add_defer: \(Errno(rawValue: -d))") }
    _ = sd_event_source_set_enabled(drainSource, Int32(SD_EVENT_OFF))
  }

  /// Accepts every connection waiting on a listening socket: tesserad's own, or a forward's.
  func acceptPeers(from listenFD: Int32, forward: ForwardListener? = nil) {
    preconditionOnBusThread()
    while true {
      // Close-on-exec from the start: a program started by another thread between accept and a
      // later fcntl would inherit the connection. (Every program tesserad starts also closes
      // all inherited descriptors.)
      let fd = tessera_accept4(listenFD, nil, nil, Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue))
      if fd < 0 {
        let code = Errno(rawValue: errno)
        if code == .interrupted { continue }
        if code != .resourceTemporarilyUnavailable { noteRefusal("Could not accept a direct connection: \(code)") }
        return
      }
      admitPeer(fd, forward: forward)
    }
  }

  /// Checks who connected (another user's connection is closed before a byte is read from it)
  /// and makes it an sd-bus server connection on this loop.
  private func admitPeer(_ fd: Int32, forward: ForwardListener?) {
    preconditionOnBusThread()
    guard let credentials = try? DirectSocket.peerCredentials(fd) else {
      close(fd)
      return
    }
    if let refusal = refusal(of: credentials, forward: forward) {
      close(fd)
      noteRefusal(refusal)
      return
    }
    // Pinned now, at connect time: the process that connected, not whatever has its pid later.
    // Where the kernel has no SO_PEERPIDFD, pidfd_open at accept comes nearest: the peer is still
    // connected, so its pid is not free for reuse yet unless it has already exited. A forward's
    // caller is known by the listener it came through instead (its process is ssh, or one in a
    // container).
    let pidfd: Int32? =
      forward == nil
      ? (kernelPeerPidfd ? DirectSocket.peerPidfd(fd) : nil) ?? Self.openPidfd(credentials.pid) : nil
    let label = forward == nil ? DirectSocket.peerLabel(fd) : nil
    nextPeerNumber &+= 1
    let name = ":direct.\(nextPeerNumber)"
    guard let peerBus = makePeerBus(fd) else {
      if let pidfd { close(pidfd) }
      return
    }
    let peer = DirectPeer(bus: peerBus, name: name, forward: forward?.info.name)
    peers[peerBus] = peer
    peersByName[name] = peer
    var info = CallerInfo(busName: name, pid: credentials.pid, uid: credentials.uid)
    var process: (any CallerProcess)?
    if let forward {
      info.app = forward.info.identity
      forward.info.connections += 1
    } else if callerCache.count < pinLimit {
      if let pidfd, let identifyPinned {
        process = identifyPinned(pidfd, credentials.pid, label)
      } else {
        if let pidfd { close(pidfd) }
        process = identify?(credentials.pid, label)
      }
      info.app = process?.app
    } else if let pidfd {
      close(pidfd)
    }
    // The program, as identifying the caller read it (one read of /proc/PID/exe per connection).
    info.exe = process?.executable ?? Syscall.executable(of: credentials.pid)
    callerCache[name] = (info, process)
  }

  /// Why a connection is closed unread: another user's, or one past its door's bound (the local
  /// callers', or the forward's); nil to admit it.
  private func refusal(of credentials: DirectSocket.PeerCredentials, forward: ForwardListener?) -> String? {
    guard credentials.uid == ownUID else {
      return
        "Closed a direct connection from user \(credentials.uid) (pid \(credentials.pid)) unread: this broker serves user \(ownUID) only"
    }
    if let forward {
      guard forward.info.connections < UInt32(forwardPeerLimit) else {
        return
          "Closed a connection through forward \(forward.info.name): \(forwardPeerLimit) are open through it already (a forward's limit)"
      }
    } else {
      guard peers.values.lazy.filter({ $0.forward == nil }).count < directPeerLimit else {
        return "Closed a direct connection from pid \(credentials.pid): \(directPeerLimit) are open already (the limit)"
      }
    }
    return nil
  }

  /// An sd-bus server connection on `fd`, on this loop, with the direct interfaces' objects, the
  /// filter and the disconnect watch; nil (and `fd` closed) when it could not be set up.
  private func makePeerBus(_ fd: Int32) -> OpaquePointer? {
    var peerBus: OpaquePointer?
    func fail(_ what: String, _ r: Int32) -> OpaquePointer? {
      log(.notice, "Could not set up a direct connection (\(what)): \(Errno(rawValue: -r))")
      if let peerBus { sd_bus_close_unref(peerBus) } else { close(fd) }
      return nil
    }
    var r = sd_bus_new(&peerBus)
    guard r >= 0, let peerBus else { return fail("sd_bus_new", r) }
    r = sd_bus_set_fd(peerBus, fd, fd)
    guard r >= 0 else {
      sd_bus_unref(peerBus)
      close(fd)
      return nil
    }
    let me = Unmanaged.passUnretained(self).toOpaque()
    let steps: [(String, () -> Int32)] = [
      ("server", { sd_bus_set_server(peerBus, 1, self.serverID) }),
      // Nobody passes descriptors to the broker.
      ("fds", { sd_bus_negotiate_fds(peerBus, 0) }),
      ("filter", { sd_bus_add_filter(peerBus, nil, peerFilter, me) }),
      (
        "disconnect watch",
        {
          sd_bus_match_signal(
            peerBus, nil, nil, "/org/freedesktop/DBus/Local", "org.freedesktop.DBus.Local", "Disconnected",
            peerDisconnected, me)
        }
      ),
    ]
    for (what, step) in steps {
      let r = step()
      if r < 0 { return fail(what, r) }
    }
    for object in objects where directInterfaces.contains(object.description.name) {
      let r = sd_bus_add_object_vtable(
        peerBus, nil, object.description.objectPath, object.description.name, object.vtable,
        Unmanaged.passUnretained(object).toOpaque())
      if r < 0 { return fail("export", r) }
    }
    r = sd_bus_start(peerBus)
    if r < 0 { return fail("start", r) }
    r = sd_bus_attach_event(peerBus, event, 0)
    if r < 0 { return fail("attach", r) }
    return peerBus
  }

  /// pidfd_open(2) of `pid`; nil when the process is gone or the kernel has none.
  static func openPidfd(_ pid: UInt32) -> Int32? {
    guard pid > 0 else { return nil }
    let fd = tessera_pidfd_open(Int32(bitPattern: pid))
    return fd >= 0 ? fd : nil  // close-on-exec, as every pidfd is
  }

  /// The peer a message came from, when it came over the direct socket.
  func directPeer(of message: OpaquePointer) -> DirectPeer? {
    guard !peers.isEmpty, let messageBus = sd_bus_message_get_bus(message), messageBus != bus else { return nil }
    return peers[messageBus]
  }

  /// A direct connection ended: forgotten, and its caller's sign-ins are let go as when a
  /// caller leaves the bus.
  func peerGone(_ peerBus: OpaquePointer) {
    preconditionOnBusThread()
    guard let peer = peers.removeValue(forKey: peerBus) else { return }
    peersByName[peer.name] = nil
    callerCache[peer.name] = nil
    if let name = peer.forward, let forward = forwards[name] {
      forward.info.connections = forward.info.connections > 0 ? forward.info.connections - 1 : 0
    }
    ownerLeft(peer.name)
    // Closed after this iteration (processFreshPeers): this may run inside the connection's own
    // dispatch, which must not find it closed under it.
    closingPeers.append(peerBus)
    onCallerGone(peer.name)
  }

  /// sd-bus, attached to an event loop, leaves unread a call that came in the same read as the end
  /// of the authentication handshake (libdbus clients send both at once): each connection is
  /// read until idle once its handshake is over.
  func processFreshPeers() {
    preconditionOnBusThread()
    for closing in closingPeers {
      sd_bus_detach_event(closing)
      // Calls still pending hold their own references; the connection is freed with the last.
      sd_bus_close_unref(closing)
    }
    closingPeers.removeAll()
    var more = false
    for peer in peers.values where peer.fresh {
      guard sd_bus_is_ready(peer.bus) > 0 else { continue }
      // At most a batch per loop iteration: a peer that keeps writing must not hold the thread
      // every caller is served on. What is left is read at the next iteration (made to come).
      var handled = 0
      while handled < Self.freshBatch, peers[peer.bus] != nil, sd_bus_process(peer.bus, nil) > 0 { handled += 1 }
      if handled < Self.freshBatch || peers[peer.bus] == nil { peer.fresh = false } else { more = true }
    }
    if more, let drainSource { _ = sd_event_source_set_enabled(drainSource, Int32(SD_EVENT_ONESHOT)) }
  }

  /// How many messages of a connection whose handshake just ended are read in one loop iteration.
  static let freshBatch = 64

  /// A direct call about to go to the handler: counted, or refused when its connection has too
  /// many waiting. Returns false when refused (answered already).
  func admitDirectCall(_ message: OpaquePointer, member: String) -> Bool {
    preconditionOnBusThread()
    guard let peer = directPeer(of: message) else { return true }
    guard peer.inFlight < Self.directCallsInFlight else {
      _ = refuse(
        message, member,
        .busy(
          "This connection has \(Self.directCallsInFlight) calls waiting for the broker already. Wait for their answers before sending more."
        ))
      return false
    }
    peer.inFlight += 1
    return true
  }

  /// A pending call was answered.
  func directCallAnswered(_ message: OpaquePointer) {
    preconditionOnBusThread()
    if let peer = directPeer(of: message) { peer.inFlight -= 1 }
  }

  /// At most this many replies wait to be written to one direct connection: a peer that does not
  /// read them is closed, as the bus daemon drops a connection over its outgoing limit, so it
  /// cannot make tesserad hold its replies without bound.
  static let directRepliesQueued: UInt64 = 1024

  /// Closes a direct connection whose unread replies pile up.
  func checkBacklog(_ peer: DirectPeer) {
    preconditionOnBusThread()
    var queued: UInt64 = 0
    guard sd_bus_get_n_queued_write(peer.bus, &queued) >= 0, queued > Self.directRepliesQueued else { return }
    // Logged each time, not within the refusals' budget (the calls that filled the queue may have
    // spent it): it takes more than a thousand replies to come here.
    log(
      .notice,
      "Closed direct connection \(peer.name): it left \(queued) replies unread (at most \(Self.directRepliesQueued) may wait)"
    )
    peerGone(peer.bus)
  }

  /// Answers org.freedesktop.DBus.Hello, which busctl and gdbus send first even to a peer: with
  /// the connection's unique name. Returns 1 when handled.
  func answerHello(_ message: OpaquePointer) -> Int32 {
    preconditionOnBusThread()
    guard sd_bus_message_is_method_call(message, "org.freedesktop.DBus", "Hello") > 0,
      let peer = directPeer(of: message)
    else { return 0 }
    var reply: OpaquePointer?
    guard sd_bus_message_new_method_return(message, &reply) >= 0, let reply else { return 1 }
    defer { sd_bus_message_unref(reply) }
    var status = sd_bus_message_append_basic(reply, CChar(UInt8(ascii: "s")), peer.name)
    if status >= 0 { status = sd_bus_send(peer.bus, reply, nil) }
    return 1
  }

  /// Logs a refusal at the direct socket, as refusals of calls are: rate-limited.
  func noteRefusal(_ text: String) {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    let (logThis, suppressed) = refusals.admit(second: Int(now.tv_sec))
    if suppressed > 0 { log(.notice, "\(suppressed) more refusals were not logged one by one") }
    if logThis { log(.notice, text) }
  }

  /// Closes every direct connection (at exit). Not flushed: sd-bus writes a reply at once when
  /// the peer reads, and waiting for one that does not (or is still in its handshake) would hold
  /// the exit until systemd's SIGKILL.
  func closePeers() {
    preconditionOnBusThread()
    for peerBus in Array(peers.keys) { peerGone(peerBus) }
    processFreshPeers()
  }
}

private let listenerReady: sd_event_io_handler_t = { _, fd, _, userdata in
  server(userdata).acceptPeers(from: fd)
  return 0
}

private let postIteration: sd_event_handler_t = { _, userdata in
  server(userdata).processFreshPeers()
  return 0
}

/// Nothing to do itself: its dispatch makes the post-iteration source run again.
private let drainFresh: sd_event_handler_t = { _, _ in 0 }

private let peerDisconnected: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message, let peerBus = sd_bus_message_get_bus(message) else { return 0 }
  server(userdata).peerGone(peerBus)
  return 0
}

private let peerFilter: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message else { return 0 }
  let server = server(userdata)
  // Every reply counts toward the unread ones, error replies and those sd-bus writes by itself
  // (Ping, Introspect) included: checked as each message comes in. A peer closed here is read no
  // further.
  if let peerBus = sd_bus_message_get_bus(message), let peer = server.peers[peerBus] {
    server.checkBacklog(peer)
    if server.peers[peerBus] == nil { return 1 }
  }
  if server.answerHello(message) > 0 { return 1 }
  return server.filter(message)
}
