import Synchronization
import TesseraClient
import TesseraInterface
import TesseraTestSupport
import Testing

/// AsyncTesseraBroker against a scripted broker on a private bus: answers come back to tasks, a
/// sign-in waiting for the user holds no one else up, and cancelling its task ends it at the broker.
@Suite(.serialized)
struct AsyncClientTests {
  static let alice = AccountInfo(
    id: "alice-sub.0a1b2c", username: "alice@idp.test", name: "Alice", authority: "https://idp.test/t",
    environment: "idp.test", realm: "t", localAccountID: "alice-sub")

  static func token(_ secret: String) -> [BusValue] {
    [
      .dict(
        TokenInfo(
          accessToken: secret, tokenType: "Bearer", expiresOn: 1_900_000_000, scopes: ["read"], account: alice,
          idToken: nil, correlationID: "c"
        ).busValue)
    ]
  }

  @Test func aPendingSignInHoldsNoOneUpAndItsCancellationReachesTheBroker() async throws {
    // Sign-ins never finish (the user is away); silent calls answer at once.
    try await ScriptedBroker.with({ call in call.member == "AcquireToken" ? nil : .success(Self.token("at-async")) }) {
      broker in try await pendingSignIns(broker)
    }
  }

  func pendingSignIns(_ broker: ScriptedBroker) async throws {
    let client = AsyncTesseraBroker()
    let signIns = (0..<3).map { _ in
      Task { try await client.acquireToken(clientID: "app-async", scopes: ["read"]) }
    }
    // More sign-ins wait than the cooperative pool has threads here (2 cores): silent calls still go.
    for _ in 0..<5 {
      let token = try await client.acquireTokenSilent(clientID: "app-async")
      #expect(token.accessToken == "at-async")
    }
    // The three sign-ins reach the broker (30 s only bounds a hang).
    _ = await broker.waitForCalls { $0.filter { $0.member == "AcquireToken" }.count >= 3 }
    let waiting = broker.calls.filter { $0.member == "AcquireToken" }.map(\.caller.busName)
    #expect(waiting.count == 3)
    for task in signIns { task.cancel() }
    for task in signIns {
      do {
        _ = try await task.value
        Issue.record("a cancelled sign-in returned a token")
      } catch let error as TesseraClientError {
        guard case .broker(let e) = error else { return #expect(Bool(false), "\(error)") }
        #expect(e.code == .cancelled)
      }
    }
    // Each call's connection closed: the broker sees its callers leave, and so ends their sign-ins.
    _ = await broker.waitForCallersGone { Set(waiting).isSubset(of: $0) }
    #expect(Set(waiting).isSubset(of: broker.callersGone))
  }

  /// README.md's example ("The D-Bus API"), line by line: Tests/e2e/test_docs.py checks that these
  /// lines are the README's.
  @Test func theReadmeExampleRuns() async throws {
    try await ScriptedBroker.with({ _ in .success(Self.token("at-readme")) }) { _ in
      let broker = AsyncTesseraBroker()
      let token = try await broker.acquireTokenSilent(clientID: "YOUR-CLIENT-ID", scopes: ["User.Read"])
      print(token.accessToken.prefix(8), token.account.username)
      #expect(token.accessToken == "at-readme" && token.account.username == "alice@idp.test")
    }
  }

  @Test func aBrokerErrorKeepsItsCode() async throws {
    try await ScriptedBroker.with({ _ in .failure(.noSuchAccount("No account with id 'x' is signed in.")) }) { _ in
      await #expect {
        try await AsyncTesseraBroker().acquireTokenSilent(accountID: "x")
      } throws: { error in
        guard case .broker(let e) = error as? TesseraClientError else { return false }
        return e.code == .noSuchAccount && e.message == "No account with id 'x' is signed in."
      }
    }
  }

  /// What a desktop app updates from: first `.watching`, then each AccountsChanged and each change
  /// of AttentionNeeded, in order, from the broker alone.
  @Test func theBrokersNewsComesAsEvents() async throws {
    try await ScriptedBroker.with({ _ in .success([]) }) { broker in
      let client = AsyncTesseraBroker()
      var events = client.events().makeAsyncIterator()
      let event1 = try await events.next()
      #expect(event1 == .watching)
      broker.server.emit(BrokerInterface.description, BrokerInterface.accountsChanged, [])
      let event2 = try await events.next()
      #expect(event2 == .accountsChanged)
      broker.server.setProperty(BrokerInterface.description, BrokerInterface.attentionNeeded, .strings([Self.alice.id]))
      let event3 = try await events.next()
      #expect(event3 == .attentionNeeded([Self.alice.id]))
      let attention = try await client.attentionNeeded()
      #expect(attention == [Self.alice.id])
      broker.server.setProperty(BrokerInterface.description, BrokerInterface.attentionNeeded, .strings([]))
      let event4 = try await events.next()
      #expect(event4 == .attentionNeeded([]))
      broker.server.emit(BrokerInterface.description, BrokerInterface.accountsChanged, [])
      let event5 = try await events.next()
      #expect(event5 == .accountsChanged)
    }
  }
}
