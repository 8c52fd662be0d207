import XCTest

@testable import TesseraCore

/// Which accounts need attention, and when the user is told (one notification per account).
final class AccountHealthTests: XCTestCase {
  let need = SignInNeed(accountID: "a", username: "alice", clientID: "app", scopes: ["read"], authority: "https://i/t")

  func testTwentyFailuresGiveOneNotificationAndSuccessClearsIt() {
    var health = AccountHealth()
    let start = Date(timeIntervalSince1970: 1000)
    var notified = 0
    var changes = 0
    for i in 0..<20 {
      let change = health.failed(
        need, error: .interactionRequired("revoked"), now: start.addingTimeInterval(Double(i)))
      if change.notify != nil { notified += 1 }
      if change.attentionChanged { changes += 1 }
    }
    XCTAssertEqual(notified, 1)
    XCTAssertEqual(changes, 1)
    XCTAssertEqual(health.attentionNeeded, ["a"])
    XCTAssertEqual(health.entry("a").state, .needsSignIn)
    // Another app of the same account is merged: no second notification.
    var other = need
    other.clientID = "other"
    XCTAssertNil(health.failed(other, error: .interactionRequired("x"), now: start).notify)
    XCTAssertFalse(health.succeeded(accountID: "a", clientID: "app"))
    XCTAssertTrue(health.succeeded(accountID: "a", clientID: "other"))
    XCTAssertEqual(health.attentionNeeded, [])
    XCTAssertEqual(health.entry("a").state, .ok)
    // Back again at once: no new notification within the quiet period; after it, one.
    XCTAssertNil(health.failed(need, error: .interactionRequired("x"), now: start.addingTimeInterval(60)).notify)
    _ = health.succeeded(accountID: "a", clientID: "app")
    XCTAssertNotNil(
      health.failed(
        need, error: .interactionRequired("x"), now: start.addingTimeInterval(AccountHealth.renotifyAfter + 1)
      )
      .notify)
  }

  func testTransientFailuresSetTheStateButNeverAskForASignIn() {
    var health = AccountHealth()
    let now = Date(timeIntervalSince1970: 1000)
    XCTAssertNil(health.failed(need, error: .network("down"), now: now).notify)
    XCTAssertEqual(health.entry("a").state, .idpUnreachable)
    XCTAssertEqual(health.entry("a").lastError?.code, .network)
    XCTAssertEqual(health.entry("a").lastErrorAt, now)
    XCTAssertEqual(health.attentionNeeded, [])
    _ = health.failed(need, error: .storeUnavailable("locked"), now: now)
    XCTAssertEqual(health.entry("a").state, .storeLocked)
    _ = health.failed(need, error: .provider("odd"), now: now)
    XCTAssertEqual(health.entry("a").state, .storeLocked, "an error the user cannot act on keeps the state")
    XCTAssertFalse(health.succeeded(accountID: "a", clientID: "app"))
    XCTAssertEqual(health.entry("a").state, .ok)
    XCTAssertTrue(health.forget("a") == false)
  }
}
