import Glibc
import TesseraInterface
import TesseraTestSupport
import Testing

@testable import TesseraBus

/// BusServer and BusClient over a real dbus-daemon: calls reach the handler with the caller's
/// identity and come back, errors travel under the table's names, what the handler must not see
/// is refused before it, the bus thread's own answers, properties, callers leaving, and shutdown.
@Suite(.serialized)
struct ServerTests {
  /// org.tessera.Broker1's methods and signals, served under a name of the test's own.
  final class Harness: Sendable {
    let name = TestNames.make()
    let server: BusServer
    let calls = Locked<[BusServer.Call]>([])
    /// The callers the server reported gone, for a test to wait on.
    let gone = Reports<String>()
    /// What the bus layer logged.
    let logs = Locked<[String]>([])
    let description: InterfaceDescription

    init(
      answerAtOnce: (@Sendable (BusServer.Call) -> FastAnswer?)? = nil,
      reply: @escaping @Sendable (BusServer.Call) -> Result<[BusValue], TesseraError>? = { _ in .success([]) }
    ) async throws {
      _ = try PrivateBus.ensure()
      let broker = BrokerInterface.description
      description = InterfaceDescription(
        busName: name, objectPath: broker.objectPath, name: broker.name, methods: broker.methods,
        signals: broker.signals, properties: broker.properties)
      let calls = self.calls
      let gone = self.gone
      let logs = self.logs
      let box = Locked<BusServer?>(nil)
      server = BusServer(
        interfaces: [description], log: { _, line in logs.withLock { $0.append(line) } },
        onCall: { call, token in
          calls.withLock { $0.append(call) }
          // nil: leave the call pending (a sign-in that never ends).
          if let result = reply(call) { box.withLock { $0 }?.reply(token, result) }
        },
        onCallerGone: { name in gone.append(name) }, answerAtOnce: answerAtOnce)
      box.withLock { $0 = server }
      try await server.start(onExit: { _ in })
    }

    func client() throws -> BusClient { try BusClient() }

    func call(_ client: BusClient, _ member: String, _ arguments: [BusValue]) throws(BusCallError) -> [BusValue] {
      // 30 s only bounds a hang: every call here is answered at once.
      try client.call(destination: name, member: member, arguments: arguments, timeoutSeconds: 30)
    }

    deinit { server.stop() }
  }

  @Test func aCallReachesTheHandlerWithTheCallerAndItsReplyComesBack() async throws {
    let h = try await Harness(reply: { call in
      .success([.dict(["echo": .strings(call.arguments.compactMap(\.stringValue))])])
    })
    let client = try h.client()
    // A reply of the method's declared type (sd-bus sends no other).
    let reply = try h.call(client, "AcquireTokenSilent", [.string("app"), .strings([]), .string("acct"), .dict([:])])
    #expect(reply == [.dict(["echo": .strings(["app", "acct"])])])
    let call = try #require(h.calls.withLock { $0.first })
    #expect(call.member == "AcquireTokenSilent")
    #expect(call.caller.uid == getuid())
    #expect(call.caller.pid == UInt32(getpid()))
    #expect(call.caller.busName.hasPrefix(":"))
  }

  @Test func aHandlersErrorTravelsUnderTheTablesName() async throws {
    let h = try await Harness(reply: { _ in .failure(.noSuchAccount("No account with id 'x' is signed in.")) })
    let client = try h.client()
    #expect {
      try h.call(client, "SignOut", [.string("x"), .dict([:])])
    } throws: { error in
      let error = error as! BusCallError
      return error.name == "org.tessera.Broker1.Error.NoSuchAccount"
        && error.message == "No account with id 'x' is signed in."
    }
  }

  @Test func wrongArgumentTypesAreRefusedBeforeTheHandler() async throws {
    let h = try await Harness()
    let client = try h.client()
    #expect {
      try h.call(client, "Cancel", [.uint32(7)])
    } throws: { error in
      let error = error as! BusCallError
      return error.name == "org.tessera.Broker1.Error.InvalidArgument"
        && error.message.contains("Cancel takes (correlation_id: s), but was called with arguments of type 'u'")
    }
    #expect(h.calls.withLock { $0.isEmpty }, "the handler never saw it")
    #expect(h.logs.withLock { $0.contains { $0.hasPrefix("Cancel refused before the request was read") } })
  }

  @Test func aCallOverTheWireLimitsIsRefusedBeforeBeingReadWhole() async throws {
    let h = try await Harness()
    let client = try h.client()
    let huge = Dictionary(uniqueKeysWithValues: (0..<65).map { ("key\($0)", BusValue.bool(true)) })
    #expect {
      try h.call(client, "GetAccounts", [.dict(huge)])
    } throws: { error in
      let error = error as! BusCallError
      return error.name == "org.tessera.Broker1.Error.InvalidArgument"
        && error.message.contains(
          "refused before being read whole: argument filter holds a dictionary with more than 64 entries")
    }
    #expect(h.calls.withLock { $0.isEmpty })
  }

  @Test func theBusThreadAnswersWhatItCanWithoutTheHandler() async throws {
    let template = ReplyTemplate(["access_token": .string("cached"), "expires_on": .int64(9)])
    let h = try await Harness(answerAtOnce: { call in
      call.member == "AcquireTokenSilent" ? .template(template, key: "correlation_id", value: .string("c-7")) : nil
    })
    let client = try h.client()
    let reply = try h.call(client, "AcquireTokenSilent", [.string(""), .strings([]), .string(""), .dict([:])])
    #expect(
      reply == [.dict(["access_token": .string("cached"), "expires_on": .int64(9), "correlation_id": .string("c-7")])])
    #expect(h.calls.withLock { $0.isEmpty }, "answered on the bus thread")
    _ = try h.call(client, "Cancel", [.string("c")])
    #expect(h.calls.withLock { $0.count } == 1, "anything else goes to the handler")
  }

  @Test func aChangedPropertyIsReadBack() async throws {
    let h = try await Harness()
    let client = try h.client()
    func get() throws -> [BusValue] {
      try client.call(
        destination: h.name, interface: "org.freedesktop.DBus.Properties", member: "Get",
        arguments: [.string(BrokerInterface.interfaceName), .string(BrokerInterface.attentionNeeded)])
    }
    #expect(try get() == [.strings([])])
    h.server.setProperty(h.description, BrokerInterface.attentionNeeded, .strings(["acct-1"]))
    // The change is applied on the bus thread: asked again until it shows (30 s only bounds a hang).
    var value = try get()
    let deadline = ContinuousClock.now + .seconds(30)
    while value != [.strings(["acct-1"])] && ContinuousClock.now < deadline {
      try await Task.sleep(for: .milliseconds(10))
      value = try get()
    }
    #expect(value == [.strings(["acct-1"])])
  }

  @Test func aCallerLeavingTheBusIsReported() async throws {
    let h = try await Harness()
    var client: BusClient? = try h.client()
    _ = try h.call(client!, "Cancel", [.string("c")])
    let name = try #require(h.calls.withLock { $0.first?.caller.busName })
    client = nil  // closes the connection
    #expect(await h.gone.wait { $0.contains(name) }, "the caller that left is reported gone")
  }

  @Test func aPendingCallIsAnsweredCancelledWhenTheServerStops() async throws {
    // The bus thread stops the server as the call arrives, the call left pending: the stop waits
    // on the call, not a task polling beside the blocking call (which starved on the 2-thread pool
    // until the call timed out).
    let server = Locked<BusServer?>(nil)
    let h = try await Harness(reply: { _ in
      server.withLock { $0 }?.stop()
      return nil
    })
    server.withLock { $0 = h.server }
    let client = try h.client()
    #expect {
      try h.call(client, "AcquireToken", [.string(""), .strings([]), .dict([:])])
    } throws: { error in
      let error = error as! BusCallError
      return error.name == "org.tessera.Broker1.Error.Cancelled" && error.message.contains("shutting down")
    }
    #expect(h.calls.withLock { $0.count } == 1, "the call reached the handler before the stop")
  }
}
