import Glibc
import TesseraInterface
import TesseraSystem
import TesseraTestSupport
import Testing

@testable import TesseraBus

/// BusServer's own socket with BusClient as its peer, no bus daemon between them: a call reaches
/// the handler with the caller the kernel reported and comes back, wrong types are refused as on
/// the bus, a signal goes to the one connection it is for, a connection that closes is reported
/// gone; listening replaces a stale socket and refuses a served one; the client refuses a socket
/// others may replace and says when there is none.
///
/// Part of ServerTests' serialized suite, not a suite of its own: no two servers' tests run at once
/// (a pending call of one was seen answered NoReply once while the other ran, not understood yet).
extension ServerTests {
  final class DirectHarness: Sendable {
    let directory: String
    let path: String
    let server: BusServer
    let calls = Locked<[BusServer.Call]>([])
    /// The callers the server reported gone, for a test to wait on.
    let gone = Reports<String>()

    init(
      reply: @escaping @Sendable (BusServer.Call) -> Result<[BusValue], TesseraError>? = { _ in .success([]) },
      identifyPinned: (@Sendable (Int32, UInt32, String?) -> (any CallerProcess)?)? = nil,
      kernelPeerPidfd: Bool = true
    ) async throws {
      _ = try PrivateBus.ensure()
      var template = Array("/tmp/tessera-direct-XXXXXX".utf8CString)
      directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
      path = directory + "/tessera/bus"
      let listener = try DirectSocket.listen(at: path)
      let calls = self.calls
      let gone = self.gone
      let box = Locked<BusServer?>(nil)
      // A well-known name of the test's own on the bus, so that tests run beside a real broker.
      let broker = BrokerInterface.description
      let description = InterfaceDescription(
        busName: TestNames.make(), objectPath: broker.objectPath, name: broker.name, methods: broker.methods,
        signals: broker.signals, properties: broker.properties)
      server = BusServer(
        interfaces: [description],
        onCall: { call, token in
          calls.withLock { $0.append(call) }
          if let result = reply(call) { box.withLock { $0 }?.reply(token, result) }
        },
        onCallerGone: { name in gone.append(name) }, identifyPinned: identifyPinned,
        listener: listener)
      server.kernelPeerPidfd = kernelPeerPidfd
      box.withLock { $0 = server }
      try await server.start(onExit: { _ in })
    }

    func call(_ client: BusClient, _ member: String, _ arguments: [BusValue]) throws(BusCallError) -> [BusValue] {
      // 30 s only bounds a hang: every call here is answered at once.
      try client.call(member: member, arguments: arguments, timeoutSeconds: 30)
    }

    deinit {
      server.stop()
      unlink(path)
    }
  }

  @Test func aCallReachesTheHandlerWithTheCallerTheKernelReportedAndComesBack() async throws {
    let h = try await DirectHarness(reply: { call in
      .success([.dict(["n": .strings(call.arguments.compactMap(\.stringValue))])])
    })
    let client = try BusClient(directSocket: h.path)
    #expect(client.directPeer?.pid == UInt32(getpid()))  // this process listens: the server is here
    let reply = try h.call(client, "AcquireTokenSilent", [.string("app"), .strings([]), .string("acct"), .dict([:])])
    #expect(reply == [.dict(["n": .strings(["app", "acct"])])])
    let call = try #require(h.calls.withLock { $0.first })
    #expect(call.caller.busName.hasPrefix(":direct."))
    #expect(call.caller.uid == getuid() && call.caller.pid == UInt32(getpid()))
  }

  @Test func wrongArgumentTypesAreRefusedAsOnTheBus() async throws {
    let h = try await DirectHarness()
    let client = try BusClient(directSocket: h.path)
    #expect {
      try h.call(client, "GetAccounts", [.string("x")])
    } throws: { error in
      let error = error as! BusCallError
      return error.name == "org.tessera.Broker1.Error.InvalidArgument" && error.message.contains("a{sv}")
    }
    #expect(h.calls.withLock { $0.isEmpty })
  }

  @Test func aSignalForOneConnectionReachesItAndAClosedConnectionIsReportedGone() async throws {
    // The sign-in never ends; the bus thread sends the caller its signal as the call arrives, and
    // the client ends its call once the signal is in: each step waits on the one before, not on a
    // time (a task polling beside the blocking call starved on the 2-thread pool, and the call
    // timed out with no signal).
    let server = Locked<BusServer?>(nil)
    let h = try await DirectHarness(reply: { call in
      server.withLock { $0 }?.emit(
        BrokerInterface.description, "InteractionPending", [.string("c1"), .dict(["flow": .string("device_code")])],
        to: call.caller.busName)
      return nil
    })
    server.withLock { $0 = h.server }
    let signalled = Locked<[String]>([])
    var client: BusClient? = try BusClient(directSocket: h.path)
    do throws(BusCallError) {
      // 30 s only bounds a hang: the call ends as soon as the signal is in.
      _ = try client!.call(
        member: "AcquireToken", arguments: [.string(""), .strings([]), .dict([:])], timeoutSeconds: 30,
        onSignal: { member, _ in signalled.withLock { $0.append(member) } },
        stopped: { !signalled.withLock { $0.isEmpty } })
      Issue.record("the sign-in that never ends was answered")
    } catch {
      #expect(error.name == BusClient.stoppedError, "the call ended on the signal, not \(error)")
    }
    let caller = try #require(h.calls.withLock { $0.first?.caller.busName })
    #expect(signalled.withLock { $0 } == ["InteractionPending"])
    #expect(!h.gone.values.contains(caller))
    client = nil  // closes the connection
    #expect(await h.gone.wait { $0.contains(caller) }, "the closed connection is reported gone")
  }

  @Test func listeningReplacesAStaleSocketAndRefusesAServedOne() async throws {
    let h = try await DirectHarness()
    #expect {
      _ = try DirectSocket.listen(at: h.path)
    } throws: { error in
      let error = error as! DirectSocket.ListenError
      return error.alreadyServed && error.description.contains("Another tesserad already serves")
    }
    // A socket file nobody answers on (a killed daemon's: its socket and its lock gone with it) is
    // replaced.
    let stale = h.directory + "/stale/bus"
    let first = try DirectSocket.listen(at: stale)
    #expect {
      _ = try DirectSocket.listen(at: stale)
    } throws: { error in
      (error as! DirectSocket.ListenError).description.contains("it holds \(stale).lock")
    }
    close(first.fd)
    close(first.lock)
    let second = try DirectSocket.listen(at: stale)
    close(second.fd)
    close(second.lock)
    unlink(stale)
  }

  @Test func theClientRefusesASocketOthersMayReplaceAndSaysWhenThereIsNone() async throws {
    let h = try await DirectHarness()
    let directory = h.directory + "/tessera"
    chmod(directory, 0o777)
    defer { chmod(directory, 0o700) }
    #expect {
      _ = try BusClient(directSocket: h.path)
    } throws: { error in
      let error = error as! BusCallError
      return error.name == BusClient.untrustedSocketError && error.message.contains("may be written by others")
    }
    #expect {
      _ = try BusClient(directSocket: h.directory + "/none/bus")
    } throws: { error in
      (error as! BusCallError).name == BusClient.noSocketError
    }
  }

  // MARK: Issue 37: the socket's own surfaces

  /// A caller pinned once, recording the pidfd it was pinned by.
  final class PinnedProcess: CallerProcess {
    let app: AppIdentity? = nil
    func recheck() -> Bool { false }
  }

  @Test func whereTheKernelGivesNoPeerPidfdTheCallerIsPinnedByPidfdOpenAtAccept() async throws {
    let pinned = Locked<[(pidfd: Int32, pid: UInt32, samePid: Bool)]>([])
    let h = try await DirectHarness(
      identifyPinned: { pidfd, pid, _ in
        // The pidfd names the process that connected: its fdinfo says which pid it is bound to.
        let info = (try? Syscall.readFile("/proc/self/fdinfo/\(pidfd)", limit: 4096)).map {
          String(decoding: $0, as: UTF8.self)
        }
        pinned.withLock { $0.append((pidfd, pid, info?.contains("Pid:\t\(pid)\n") == true)) }
        close(pidfd)
        return PinnedProcess()
      }, kernelPeerPidfd: false)
    let client = try BusClient(directSocket: h.path)
    _ = try h.call(client, "Cancel", [.string("none")])
    let got = try #require(pinned.withLock { $0.first })
    #expect(got.pid == UInt32(getpid()))
    #expect(got.samePid, "pidfd_open at accept pins the very process that connected")
  }

  @Test func theProcessUmaskIsNeverChangedWhileASocketIsMade() throws {
    // umask(2) is the whole process's: while it was 0177 for a bind, a directory another thread
    // made got mode 0600. A watcher reads the umask as the kernel reports it, while sockets are
    // made again and again.
    var template = Array("/tmp/tessera-umask-XXXXXX".utf8CString)
    let directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    defer { _ = system("rm -rf '\(directory)'") }
    let ownMask = umask(0o022)
    defer { umask(ownMask) }
    let done = Locked(false)
    let seen = Locked<Set<String>>([])
    let finished = Locked(false)
    try startThread(name: "umask-watch") {
      while !done.withLock({ $0 }) {
        guard let status = try? Syscall.readFile("/proc/self/status", limit: 1 << 16) else { continue }
        let text = String(decoding: status, as: UTF8.self)
        if let line = text.split(separator: "\n").first(where: { $0.hasPrefix("Umask:") }) {
          seen.withLock { _ = $0.insert(String(line.dropFirst(6)).trimmingCharacters(in: .whitespaces)) }
        }
      }
      finished.withLock { $0 = true }
    }
    for round in 0..<400 {
      let listener = try DirectSocket.listen(at: directory + "/s\(round)/bus")
      var st = stat()
      #expect(lstat(listener.path, &st) == 0 && st.st_mode & 0o777 == 0o600, "the socket is 0600")
      close(listener.fd)
      close(listener.lock)
    }
    done.withLock { $0 = true }
    while !finished.withLock({ $0 }) { usleep(1000) }
    #expect(seen.withLock { $0 } == ["0022"], "the umask seen while sockets were made")
  }

  @Test func anExistingSocketDirectoryOthersMayWriteIsRefusedAndLeftAsItIs() throws {
    // TESSERA_SOCKET=$HOME/t.sock names $HOME: it was chmod'ed 0700 without a word.
    var template = Array("/tmp/tessera-sockdir-XXXXXX".utf8CString)
    let directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    defer { _ = system("rm -rf '\(directory)'") }
    chmod(directory, 0o775)
    #expect {
      _ = try DirectSocket.listen(at: directory + "/t.sock")
    } throws: { error in
      let text = (error as! DirectSocket.ListenError).description
      return text.contains("Others may write to \(directory) (mode 775)") && text.contains("chmod go-w \(directory)")
    }
    var st = stat()
    #expect(stat(directory, &st) == 0 && st.st_mode & 0o777 == 0o775, "left as it was")
    // A home directory others may read is fine, and stays as it is too.
    chmod(directory, 0o755)
    let listener = try DirectSocket.listen(at: directory + "/t.sock")
    #expect(stat(directory, &st) == 0 && st.st_mode & 0o777 == 0o755)
    close(listener.fd)
    close(listener.lock)
  }

  @Test func aListenerWithAFullBacklogIsAskedWithoutBlocking() async throws {
    // AddForward asks, on the bus thread, whether something listens at the path: a blocking
    // connect to a listener whose backlog is full held every caller.
    var template = Array("/tmp/tessera-backlog-XXXXXX".utf8CString)
    let directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    defer { _ = system("rm -rf '\(directory)'") }
    chmod(directory, 0o700)
    let path = directory + "/busy"
    let busy = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    var address = try #require(DirectSocket.address(path))
    #expect(
      withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
          bind(busy, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
        }
      } == 0)
    #expect(Glibc.listen(busy, 0) == 0)
    // Fill the backlog: connect without blocking until the kernel says it would block.
    var filling: [Int32] = []
    while filling.count < 64 {
      let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
      let r = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
          Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
        }
      }
      filling.append(fd)
      if r != 0 && errno == EAGAIN { break }
    }
    defer { for fd in filling + [busy] { close(fd) } }
    // Asked on a thread of its own, so that a blocking probe fails this test instead of hanging
    // the run: the answer is waited for (30 s only bounds a hang; it comes at once).
    let outcome = Locked<String?>(nil)
    try startThread(name: "listen-probe") {
      do {
        let listener = try DirectSocket.listen(at: path, purpose: .forward(makeDirectory: false))
        close(listener.fd)
        outcome.withLock { $0 = "listened" }
      } catch let error as DirectSocket.ListenError {
        outcome.withLock { $0 = error.alreadyServed ? "served" : error.description }
      } catch {
        outcome.withLock { $0 = "\(error)" }
      }
    }
    let deadline = ContinuousClock.now + .seconds(30)
    while outcome.withLock({ $0 }) == nil && ContinuousClock.now < deadline {
      try await Task.sleep(for: .milliseconds(5))
    }
    #expect(outcome.withLock { $0 } == "served", "a busy listener is a live one, found without waiting for it")
  }

  @Test func aForwardHasABoundOfItsOwnAndLocalCallersKeepTheirs() async throws {
    let h = try await forwardHarness()
    let owner = try BusClient(directSocket: h.path)
    let path = h.directory + "/tessera/forward/crowd"
    _ = try await h.server.openForward(
      BusServer.ForwardRequest(
        name: "crowd", host: "crowd.example", path: path, makeDirectory: true, lasting: false,
        owner: try callerOf(owner, h)),
      now: 1_800_000_000)
    let limit = h.server.forwardPeerLimit
    #expect(limit < h.server.directPeerLimit / 4, "well below the local bound")
    // As a remote user would: open connections through the forward and never speak.
    var address = try #require(DirectSocket.address(path))
    var through: [Int32] = []
    defer { for fd in through { close(fd) } }
    for _ in 0..<(limit + 8) {
      let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
      let r = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
          Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
        }
      }
      #expect(r == 0)
      through.append(fd)
    }
    // Those past the bound are closed unread: each reads the end of the stream (the event,
    // bounded only against a hang).
    var timeout = timeval(tv_sec: 30, tv_usec: 0)
    for fd in through[limit...] {
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
      var byte: UInt8 = 0
      #expect(recv(fd, &byte, 1, 0) == 0, "a connection past the forward's bound is closed")
    }
    #expect(await h.server.forwardList().first?.connections == UInt32(limit))
    // Local callers are served meanwhile, on connections of their own.
    for _ in 0..<4 {
      let local = try BusClient(directSocket: h.path)
      #expect(
        try h.call(local, "AcquireTokenSilent", [.string("c"), .strings([]), .string(""), .dict([:])]) == [.dict([:])])
    }
  }
}
