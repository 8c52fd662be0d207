import Glibc
import TesseraInterface
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
    let gone = Locked<[String]>([])

    init(reply: @escaping @Sendable (BusServer.Call) -> Result<[BusValue], TesseraError>? = { _ in .success([]) })
      async throws
    {
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
        onCallerGone: { name in gone.withLock { $0.append(name) } }, listener: listener)
      box.withLock { $0 = server }
      try await server.start(onExit: { _ in })
    }

    func call(_ client: BusClient, _ member: String, _ arguments: [BusValue]) throws(BusCallError) -> [BusValue] {
      try client.call(member: member, arguments: arguments, timeoutSeconds: 10)
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
    let h = try await DirectHarness(reply: { _ in nil })  // the sign-in never ends: the call times out
    let server = h.server
    let signalled = Locked<[String]>([])
    let sender = Task {
      while h.calls.withLock({ $0.isEmpty }) { try await Task.sleep(for: .milliseconds(10)) }
      let caller = h.calls.withLock { $0[0].caller.busName }
      server.emit(
        BrokerInterface.description, "InteractionPending", [.string("c1"), .dict(["flow": .string("device_code")])],
        to: caller)
      return caller
    }
    var client: BusClient? = try BusClient(directSocket: h.path)
    _ = try? client!.call(
      member: "AcquireToken", arguments: [.string(""), .strings([]), .dict([:])], timeoutSeconds: 2,
      onSignal: { member, _ in signalled.withLock { $0.append(member) } })
    let caller = try await sender.value
    #expect(signalled.withLock { $0 } == ["InteractionPending"])
    #expect(!h.gone.withLock { $0.contains(caller) })
    client = nil  // closes the connection
    for _ in 0..<200 where !h.gone.withLock({ $0.contains(caller) }) { try await Task.sleep(for: .milliseconds(10)) }
    #expect(h.gone.withLock { $0.contains(caller) })
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
}
