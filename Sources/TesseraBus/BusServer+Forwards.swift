import CSystemd
import Glibc
import SystemPackage
import TesseraInterface

/// Forwards of tesserad's socket (`tessera forward`, issue 24): each a listener of its own, on the
/// same loop, whose every connection is the caller `forward:NAME@HOST` (it may only get tokens:
/// the engine's front refuses every other method, TesseraFront's dispatch, and the bus thread
/// serves it no property but the version, BusServer+Properties). A forward made for ssh ends when the connection that made it
/// closes; a lasting one (a container's socket) when it is removed or tesserad stops.
extension BusServer {
  /// One forward's listener. Used on the bus thread only.
  final class ForwardListener {
    var info: ForwardInfo
    let listener: DirectSocket.Listener
    var fd: Int32 { listener.fd }
    /// The unique name of the connection that made it (nil when lasting).
    let owner: String?
    var source: OpaquePointer?
    weak var server: BusServer?
    init(info: ForwardInfo, listener: DirectSocket.Listener, owner: String?, server: BusServer) {
      self.info = info
      self.listener = listener
      self.owner = owner
      self.server = server
    }
  }

  /// What AddForward asks for, once the engine has allowed it.
  public struct ForwardRequest: Sendable {
    public var name: String
    public var host: String
    /// Where to listen (absolute).
    public var path: String
    /// Whether tesserad makes the socket's directory (its own `tessera/forward`, 0700); else
    /// the directory must exist, be the user's and not be writable by others.
    public var makeDirectory: Bool
    public var lasting: Bool
    /// The connection asking (its unique name, or `:direct.N`), which owns a forward that is not
    /// lasting.
    public var owner: CallerInfo
    public init(name: String, host: String, path: String, makeDirectory: Bool, lasting: Bool, owner: CallerInfo) {
      self.name = name
      self.host = host
      self.path = path
      self.makeDirectory = makeDirectory
      self.lasting = lasting
      self.owner = owner
    }
  }

  /// Opens a forward's listener; returns its path. Thread-safe.
  public func openForward(_ request: ForwardRequest, now: Int64) async throws(TesseraError) -> String {
    let result: Result<String, TesseraError> = await onBusThread { server in
      server.addForward(request, now: now)
    }
    return try result.get()
  }

  /// Ends a forward (its listener, its connections and its socket file); false when there is none
  /// of that name. Its owner is sent ForwardEnded with `reason`. Thread-safe.
  public func closeForward(_ name: String, reason: String) async -> Bool {
    await onBusThread { server in server.removeForward(name, reason: reason, tellOwner: true) }
  }

  /// The live forwards, by name. Thread-safe.
  public func forwardList() async -> [ForwardInfo] {
    await onBusThread { server in server.forwards.values.map(\.info).sorted { $0.name < $1.name } }
  }

  /// Runs `work` on the bus thread and returns what it returns.
  func onBusThread<T: Sendable>(_ work: @escaping @Sendable (BusServer) -> T) async -> T {
    await withCheckedContinuation { (done: CheckedContinuation<T, Never>) in
      post(.run { [self] in done.resume(returning: work(self)) })
    }
  }

  // MARK: Bus thread

  private func addForward(_ request: ForwardRequest, now: Int64) -> Result<String, TesseraError> {
    preconditionOnBusThread()
    // The same name again right after its `tessera forward` ended: that connection's end may be
    // waiting unread behind this call. Looked at now, so the name is free.
    if let existing = forwards[request.name], let owner = existing.owner, ownerHasLeft(owner) {
      removeForward(request.name, reason: "the `tessera forward` that made it ended", tellOwner: false)
    }
    if let existing = forwards[request.name] {
      let whose = existing.info.ownerPID.map { " (its `tessera forward` runs as process \($0))" } ?? ""
      return .failure(
        .invalidArgument(
          "A forward named \(request.name) exists already\(whose). Pick another --name, or end it with `tessera forward --stop \(request.name)`."
        ))
    }
    guard forwards.count < ForwardInfo.limit else {
      return .failure(
        .invalidArgument(
          "\(ForwardInfo.limit) forwards are open already (the limit). End one with `tessera forward --stop NAME`."))
    }
    let listener: DirectSocket.Listener
    do {
      listener = try DirectSocket.listen(at: request.path, purpose: .forward(makeDirectory: request.makeDirectory))
    } catch {
      return .failure(.invalidArgument(error.description))
    }
    let info = ForwardInfo(
      name: request.name, host: request.host, path: listener.path, lasting: request.lasting, since: now,
      connections: 0, ownerPID: request.lasting ? nil : request.owner.pid)
    let forward = ForwardListener(
      info: info, listener: listener, owner: request.lasting ? nil : request.owner.busName, server: self)
    let r = sd_event_add_io(
      event, &forward.source, listener.fd, UInt32(EPOLLIN.rawValue), forwardReady,
      Unmanaged.passUnretained(forward).toOpaque())
    guard r >= 0 else {
      close(listener.fd)
      listener.removeFile()
      return .failure(.invalidArgument("Could not watch the forward's socket: \(Errno(rawValue: -r))"))
    }
    forwards[request.name] = forward
    forwardsChanged()
    log(
      .notice,
      "Forward \(request.name) listens on \(listener.path) (\(info.identity.display); \(request.lasting ? "until removed" : "while \(request.owner.busName) stays connected"))"
    )
    return .success(listener.path)
  }

  /// Ends a forward. Bus thread.
  @discardableResult
  func removeForward(_ name: String, reason: String, tellOwner: Bool) -> Bool {
    preconditionOnBusThread()
    guard let forward = forwards.removeValue(forKey: name) else { return false }
    sd_event_source_disable_unref(forward.source)
    forward.source = nil
    close(forward.fd)
    forward.listener.removeFile()
    // Its connections end with it: a forward that is gone serves no one.
    // Not flushed: a peer that does not read (or never finished its handshake) would hold the
    // bus thread.
    for (peerBus, peer) in peers where peer.forward == name { peerGone(peerBus) }
    if tellOwner, let owner = forward.owner {
      sendSignal(
        path: BrokerInterface.objectPath, interface: BrokerInterface.interfaceName,
        member: BrokerInterface.forwardEnded, arguments: [.string(name), .string(reason)], to: owner)
    }
    forwardsChanged()
    log(.notice, "Forward \(name) ended: \(reason)")
    return true
  }

  /// ManagementChanged("forwards") to everyone but forwarded callers. Bus thread.
  private func forwardsChanged() {
    sendSignal(
      path: BrokerInterface.objectPath, interface: BrokerInterface.interfaceName,
      member: BrokerInterface.managementChanged,
      arguments: [.string(BrokerInterface.ManagementPart.forwards.rawValue)], to: nil)
  }

  /// Whether the direct connection `owner` has closed, though its end may not be read yet.
  private func ownerHasLeft(_ owner: String) -> Bool {
    guard owner.hasPrefix(":direct.") else { return false }
    guard let peer = peersByName[owner] else { return true }
    let fd = sd_bus_get_fd(peer.bus)
    guard fd >= 0 else { return true }
    // POLLHUP: a Unix stream socket whose peer has closed (POLLRDHUP, 0x2000, is GNU-only in C).
    let hangUp = Int16(POLLHUP) | 0x2000
    var polled = pollfd(fd: fd, events: hangUp, revents: 0)
    return poll(&polled, 1, 0) == 1 && polled.revents & hangUp != 0
  }

  /// A connection left: the forwards it made end with it.
  func ownerLeft(_ busName: String) {
    preconditionOnBusThread()
    guard !forwards.isEmpty else { return }
    for (name, forward) in forwards where forward.owner == busName {
      removeForward(name, reason: "the `tessera forward` that made it ended", tellOwner: false)
    }
  }

  /// Ends every forward (tesserad is stopping).
  func closeForwards(reason: String) {
    preconditionOnBusThread()
    for name in Array(forwards.keys) { removeForward(name, reason: reason, tellOwner: true) }
  }
}

private let forwardReady: sd_event_io_handler_t = { _, fd, _, userdata in
  let forward = Unmanaged<BusServer.ForwardListener>.fromOpaque(userdata!).takeUnretainedValue()
  forward.server?.acceptPeers(from: fd, forward: forward)
  return 0
}
