import Logging
import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// The note of a refresh in flight (issue 12): kept while the token is at the IdP, gone once the
/// answer is stored, and acted on first at the next start when a kill left it.
final class RefreshJournalTests: XCTestCase {
  final class MemoryJournal: RefreshJournal {
    let notes = Locked<[String: RefreshJournalEntry]>([:])
    let begun = Locked(0)
    func begin(_ entry: RefreshJournalEntry) {
      begun.withLock { $0 += 1 }
      notes.withLock { $0[entry.key] = entry }
    }
    func end(_ entry: RefreshJournalEntry) { _ = notes.withLock { $0.removeValue(forKey: entry.key) } }
    func pending() -> [RefreshJournalEntry] { notes.withLock { Array($0.values) } }
  }

  func note(for account: String, _ h: Harness) -> RefreshJournalEntry {
    RefreshJournalEntry(
      accountID: account, environment: "idp.test", authority: FakeIdP.authority, clientID: "app1", scopes: ["read"],
      startedAt: Int64(h.clock.now().timeIntervalSince1970))
  }

  /// The signed-in account's id; a result without one fails the test (a sign-in that returned no
  /// account is a bug, not a reason to skip).
  func accountID(_ result: [String: BusValue], file: StaticString = #filePath, line: UInt = #line) throws -> String {
    try XCTUnwrap(
      result["account"]?.dictValue?["id"]?.stringValue, "no account in the result: \(result)", file: file, line: line)
  }

  func testARefreshIsNotedWhileInFlightAndForgottenOnceStored() async throws {
    let journal = MemoryJournal()
    let h = await Harness(journal: journal)
    try await h.signIn()
    XCTAssertEqual(journal.begun.withLock { $0 }, 0, "a sign-in redeems no refresh token")
    _ = try await h.broker.acquireTokenSilent(h.request(options: ["force_refresh": .bool(true)]))
    XCTAssertEqual(journal.begun.withLock { $0 }, 1)
    XCTAssertEqual(journal.pending(), [])
    // Refused by the IdP: a definite answer, so the note goes too.
    h.idp.refusedClients.withLock { $0 = ["app1"] }
    await XCTAssertThrowsTessera(.interactionRequired) {
      _ = try await h.broker.acquireTokenSilent(h.request(options: ["force_refresh": .bool(true)]))
    }
    XCTAssertEqual(journal.pending(), [])
  }

  func testAnInterruptedRefreshIsRedoneFirstAndNothingIsLostWithAGracePeriod() async throws {
    let journal = MemoryJournal()
    let h = await Harness(journal: journal)
    let id = try accountID(try await h.signIn())
    journal.begin(note(for: id, h))  // what a kill inside the exchange leaves behind
    let before = h.idp.tokenRequests.count
    await h.broker.recoverInterruptedRefreshes()
    XCTAssertEqual(h.idp.tokenRequests.count, before + 1, "the interrupted refresh is redone at once")
    XCTAssertEqual(journal.pending(), [])
    XCTAssertEqual(h.events.attention.withLock { $0.last ?? [] }, [])
  }

  func testARefreshTokenLostInTheKillIsReportedAtOnce() async throws {
    let journal = MemoryJournal()
    let h = await Harness(journal: journal)
    let id = try accountID(try await h.signIn())
    journal.begin(note(for: id, h))
    // No grace period: the IdP rotated the token the killed daemon never stored.
    h.idp.refusedClients.withLock { $0 = ["app1"] }
    await h.broker.recoverInterruptedRefreshes()
    XCTAssertEqual(h.events.attention.withLock { $0.last }, [id], "reported at start, not at a later refresh")
    XCTAssertEqual(h.events.needs.withLock { $0.map(\.accountID) }, [id], "and the user is told")
    XCTAssertEqual(journal.pending(), [])
    let accounts = try await h.broker.knownAccounts(matching: AccountFilter())
    XCTAssertEqual(accounts.map(\.id), [id], "the account stays, waiting for a sign-in")
  }

  func testANoteOfASignedOutAccountIsDropped() async throws {
    let journal = MemoryJournal()
    let h = await Harness(journal: journal)
    try await h.signIn()
    journal.begin(note(for: "gone", h))
    let before = h.idp.tokenRequests.count
    await h.broker.recoverInterruptedRefreshes()
    XCTAssertEqual(h.idp.tokenRequests.count, before)
    XCTAssertEqual(journal.pending(), [])
  }
}

/// What a kill in the middle of a sign-in or sign-out leaves is finished at the next start.
final class InterruptedWriteTests: XCTestCase {
  func testItemsOfAnAccountThatIsNotStoredAreRemovedAndRevokedAtLoad() async throws {
    let h = await Harness()
    let signedIn = try await h.signIn()
    guard case .dict(let account)? = signedIn["account"], case .string(let id)? = account["id"] else {
      return XCTFail("no account")
    }
    await h.broker.finishStoreWrites()
    // A sign-out killed after its first delete (the account item goes first).
    let items = h.store.items.withLock { $0 }
    XCTAssertTrue(items.contains { $0.attributes["kind"] == "refresh_token" })
    h.store.items.withLock { $0.removeAll { $0.attributes["kind"] == "account" } }
    let restarted = Broker(
      config: await h.broker.config,
      dependencies: BrokerDependencies(
        http: h.idp, store: h.store, browser: RecordingBrowser(listeners: h.listeners, idp: h.idp),
        listeners: h.listeners, events: RecordingEvents(), clock: h.clock),
      logger: Logger(label: "test"))
    let accounts = try await restarted.knownAccounts(matching: AccountFilter())
    XCTAssertEqual(accounts, [])
    await restarted.finishStoreWrites()
    XCTAssertEqual(
      h.store.items.withLock { $0.filter { $0.attributes["account_id"] == id } }.count, 0,
      "the sign-out is finished: nothing of the account is left")
    // Its refresh token is revoked at the IdP, as the sign-out would have (30 s only bounds a hang).
    let deadline = ContinuousClock.now + .seconds(30)
    while !h.idp.requests.withLock({ $0.contains { $0.url.hasSuffix("/revoke") } }) && ContinuousClock.now < deadline {
      try await Task.sleep(nanoseconds: 10_000_000)
    }
    XCTAssertTrue(h.idp.requests.withLock { $0.contains { $0.url.hasSuffix("/revoke") } })
  }

  func testASignInStoresItsAccountAfterItsRefreshToken() async throws {
    let h = await Harness()
    try await h.signIn()
    await h.broker.finishStoreWrites()
    let kinds = h.store.saved.withLock { $0.map { $0.attributes["kind"] ?? "" } }
    let token = try XCTUnwrap(kinds.firstIndex(of: "refresh_token"))
    let account = try XCTUnwrap(kinds.firstIndex(of: "account"))
    XCTAssertLessThan(token, account, "a kill between them must leave a token to clean up, not a hollow account")
  }
}
