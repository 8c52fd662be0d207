import Logging
import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// The keyring away, locked, or refusing one item (issue 12): writes wait in order while it is
/// away, land in that order once it is back, and one item it refuses never holds back the rest.
final class StoreWriterTests: XCTestCase {
  func item(_ kind: String, _ n: Int) -> StoredItem {
    StoredItem(attributes: ["kind": kind, "n": "\(n)"], secret: "secret-\(kind)-\(n)", label: "\(kind) \(n)")
  }

  func savedNames(_ store: FakeStore) -> [String] {
    store.saved.withLock { $0.map { "\($0.attributes["kind"]!)\($0.attributes["n"]!)" } }
  }

  func testWritesQueuedWhileTheStoreIsAwayLandInOrderWhenItIsBack() async throws {
    let store = FakeStore()
    let pendings = Locked(0)
    let writer = StoreWriter(store: store, onPending: { pendings.withLock { $0 += 1 } })
    store.locked.withLock { $0 = true }
    for n in 1...3 {
      do {
        try await writer.enqueue([.save(item("refresh_token", n))]).value
        XCTFail("a locked store took a write")
      } catch {
        XCTAssertEqual(TesseraError.wrap(error).code, .storeUnavailable)
      }
    }
    XCTAssertEqual(writer.pendingCount, 3, "every write waits, however long the store is away")
    XCTAssertEqual(pendings.withLock { $0 }, 3)
    XCTAssertEqual(savedNames(store), [])
    store.locked.withLock { $0 = false }
    try await writer.enqueue([.save(item("account", 4))]).value
    XCTAssertEqual(savedNames(store), ["refresh_token1", "refresh_token2", "refresh_token3", "account4"])
    XCTAssertFalse(writer.hasPending)
  }

  func testAnItemTheStoreRefusesIsDroppedAtTheThirdRefusalAndTheRestLand() async throws {
    let store = FakeStore()
    store.refusedKind.withLock { $0 = "bad" }
    let dropped = Locked<[TokenCache.StoreOperation]>([])
    let seconds = Locked(0.0)
    let writer = StoreWriter(
      store: store, onDrop: { operation, _ in dropped.withLock { $0.append(operation) } },
      time: { seconds.withLock { $0 } })
    // The refused item's own caller hears of it; the good one behind it waits for the retries.
    do {
      try await writer.enqueue([.save(item("bad", 1)), .save(item("good", 2))]).value
      XCTFail("a refused write was reported as stored")
    } catch {}
    XCTAssertEqual(savedNames(store), [])
    XCTAssertEqual(writer.pendingCount, 2)
    // Refusals in the same second count once: a burst of calls cannot use the chances up.
    for _ in 0..<5 { do { try await writer.enqueue([]).value } catch {} }
    XCTAssertEqual(writer.pendingCount, 2)
    XCTAssertTrue(dropped.withLock { $0.isEmpty })
    // Second refusal, a second later: still kept (a keyring that failed once may take it next time).
    seconds.withLock { $0 += 1 }
    do { try await writer.enqueue([.save(item("good", 3))]).value } catch {}
    XCTAssertEqual(savedNames(store), [])
    XCTAssertEqual(writer.pendingCount, 3)
    // Third: dropped, and everything behind it lands, in order, and this caller's write succeeds.
    seconds.withLock { $0 += 1 }
    try await writer.enqueue([.save(item("good", 4))]).value
    XCTAssertEqual(savedNames(store), ["good2", "good3", "good4"])
    XCTAssertEqual(dropped.withLock { $0 }, [.save(item("bad", 1))])
    XCTAssertFalse(writer.hasPending)
    // Later writes go straight through.
    try await writer.enqueue([.save(item("good", 5))]).value
    XCTAssertEqual(savedNames(store).last, "good5")
  }

  func testAWriteThatRollsBackIsNeverRetried() async throws {
    let store = FakeStore()
    let writer = StoreWriter(store: store)
    store.refusedKind.withLock { $0 = "bad" }
    do {
      try await writer.enqueue([.save(item("bad", 1)), .save(item("good", 2))], retryLater: false).value
      XCTFail("a refused write was reported as stored")
    } catch {}
    XCTAssertFalse(writer.hasPending, "the caller rolled its change back: nothing of it may land later")
    store.refusedKind.withLock { $0 = nil }
    try await writer.enqueue([.save(item("good", 3))]).value
    XCTAssertEqual(savedNames(store), ["good3"])
  }

  func testTheBrokerStoresWhatWaitedOnceTheKeyringIsBackWithoutACaller() async throws {
    let h = await Harness()
    try await h.signIn()
    await h.broker.finishStoreWrites()
    let before = h.store.secrets(kind: "refresh_token")
    XCTAssertEqual(before.count, 1)
    h.store.locked.withLock { $0 = true }
    // A forced refresh rotates the refresh token; the locked keyring cannot take the new one.
    await XCTAssertThrowsTessera(.storeUnavailable) {
      _ = try await h.broker.acquireTokenSilent(h.request(options: ["force_refresh": .bool(true)]))
    }
    XCTAssertEqual(h.store.secrets(kind: "refresh_token"), before)
    h.store.locked.withLock { $0 = false }
    // No caller comes: the retry loop stores it.
    let retries = Task { await h.broker.runStoreRetries() }
    defer { retries.cancel() }
    // 30 s only bounds a hang.
    let deadline = ContinuousClock.now + .seconds(30)
    while h.store.secrets(kind: "refresh_token") == before && ContinuousClock.now < deadline {
      try await Task.sleep(nanoseconds: 2_000_000)
    }
    let after = h.store.secrets(kind: "refresh_token")
    XCTAssertEqual(after.count, 1)
    XCTAssertNotEqual(after, before, "the rotated refresh token reached the keyring without a caller")
    // And it is the one the IdP takes now.
    _ = try await h.broker.acquireTokenSilent(h.request(options: ["force_refresh": .bool(true)]))
  }
}
