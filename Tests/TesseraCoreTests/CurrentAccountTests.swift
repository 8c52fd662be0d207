import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// The current account (`tessera account use`): what a request naming no account gets when
/// several are signed in at one identity provider; and how long a person waits on the keyring.
/// (The fake IdP names every user alice@idp.test: accounts are told apart by their ids here.)
final class CurrentAccountTests: XCTestCase {
  func id(_ result: [String: BusValue]) -> String? { result["account"]?.dictValue?["id"]?.stringValue }

  /// Whose token a request naming no account gets (its account id).
  func user(_ broker: Broker) async throws -> String? {
    id(
      try await broker.acquireTokenSilent(
        try RequestParser.tokenRequest(clientID: "", scopes: [], accountID: "", options: [:])))
  }

  func expectUser(_ broker: Broker, _ name: String?, file: StaticString = #filePath, line: UInt = #line) async throws {
    let got = try await user(broker)
    XCTAssertEqual(got, name, file: file, line: line)
  }

  func restart(_ h: Harness) async -> Broker {
    await h.broker.finishStoreWrites()
    return Broker(
      config: await h.broker.config,
      dependencies: BrokerDependencies(
        http: h.idp, store: h.store, browser: NoBrowser(), listeners: h.listeners, events: h.events, clock: h.clock),
      logger: .init(label: "t"))
  }

  func testASecondAccountLeavesTheFirstCurrentAndUseSwitchesAndIsKept() async throws {
    let h = await Harness()
    let aliceResult = try await h.signIn()
    let alice = try XCTUnwrap(id(aliceResult))
    try await expectUser(h.broker, alice)
    XCTAssertTrue(h.store.secrets(kind: "current_account").isEmpty, "one account alone needs no choosing")
    h.idp.subject.withLock { $0 = "bob-sub" }
    let bobResult = try await h.signIn()
    let bob = try XCTUnwrap(id(bobResult))
    // What was set up for alice keeps working: she is current now.
    try await expectUser(h.broker, alice)
    XCTAssertEqual(h.store.secrets(kind: "current_account").count, 1)
    let chosen = try await h.broker.makeCurrent(bob, authority: nil, caller: nil)
    XCTAssertEqual(chosen.id, bob)
    try await expectUser(h.broker, bob)
    let current = await h.broker.currentAccountIDs()
    XCTAssertEqual(current, [bob])
    // GetAccounts says which one is current.
    let listed = try await h.broker.testFront.handle(
      method: "GetAccounts", arguments: [.dict([:])], caller: CallerInfo(busName: ":1.9")
    ).get()
    guard case .dicts(let accounts)? = listed.first else { return XCTFail("no accounts") }
    XCTAssertEqual(accounts.filter { $0["current"] == .bool(true) }.map { $0["id"]?.stringValue }, [bob])
    XCTAssertEqual(accounts.filter { $0["current"] == .bool(false) }.map { $0["id"]?.stringValue }, [alice])
    // A restart keeps the choice (it is in the keyring).
    let restarted = await restart(h)
    try await expectUser(restarted, bob)
    // Signed out, bob is current no more; alice alone is used again.
    try await restarted.signOut(SignOutRequest(accountID: bob, clientID: nil, revoke: false, correlationID: "c"))
    XCTAssertTrue(h.store.secrets(kind: "current_account").isEmpty)
    try await expectUser(restarted, alice)
  }

  func testAnUnknownOrAmbiguousChoiceIsRefusedAndChangesNothing() async throws {
    let h = await Harness()
    let aliceResult = try await h.signIn()
    let alice = try XCTUnwrap(id(aliceResult))
    h.idp.subject.withLock { $0 = "bob-sub" }
    try await h.signIn()
    await XCTAssertThrowsTessera(.noSuchAccount) {
      _ = try await h.broker.makeCurrent("carol@idp.test", authority: nil, caller: nil)
    }
    // Both are named alice@idp.test by the fake IdP: a username that names two chooses neither.
    await XCTAssertThrowsTessera(.invalidArgument) {
      _ = try await h.broker.makeCurrent("alice@idp.test", authority: nil, caller: nil)
    }
    try await expectUser(h.broker, alice)
  }

  func testAKeyringThatDoesNotAnswerIsSaidByStatusAndBeforeASignInOpensTheBrowser() async throws {
    let h = await Harness()
    h.store.hangLoads.withLock { $0 = true }
    let hung = try await h.broker.status()
    XCTAssertEqual(hung.storeProblem, "the fake keyring does not answer")
    await XCTAssertThrowsTessera(.storeUnavailable) { try await h.signIn() }
    XCTAssertNil(h.listeners.lastAuthorizationURL.withLock { $0 }, "no browser for a sign-in that cannot be kept")
    h.store.hangLoads.withLock { $0 = false }
    try await h.signIn()
  }

  func testAKeyringLockedSinceTheLoadIsSaidBeforeTheBrowserOpens() async throws {
    let h = await Harness()
    let aliceResult = try await h.signIn()
    let alice = try XCTUnwrap(id(aliceResult))
    h.store.locked.withLock { $0 = true }
    await XCTAssertThrowsTessera(.storeUnavailable) { try await h.signIn() }
    XCTAssertNil(h.listeners.lastAuthorizationURL.withLock { $0 })
    let report = try await h.broker.status()
    XCTAssertNotNil(report.storeProblem, "status says the keyring is locked")
    // The cached token still serves silent callers meanwhile.
    try await expectUser(h.broker, alice)
  }
}
