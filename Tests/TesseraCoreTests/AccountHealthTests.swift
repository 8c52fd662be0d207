import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// Which accounts need attention, and when the user is told (one notification per account).
final class AccountHealthTests: XCTestCase {
  let need = SignInNeed(accountID: "a", username: "alice", clientID: "app", scopes: ["read"], authority: "https://i/t")
  var key: AccountHealth.NeedKey { .init(need) }

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
    // A refresh answers exactly its own need; a token for other scopes does not (a step-up or
    // consent for these scopes is still owed).
    XCTAssertFalse(
      health.succeeded(
        accountID: "a", key: .init(clientID: "app", authority: "https://i/t", scopes: ["write"]), interactive: false))
    XCTAssertFalse(health.succeeded(accountID: "a", key: key, interactive: false))
    XCTAssertEqual(health.attentionNeeded, ["a"], "the other app still needs it")
    // A sign-in of a family member answers the whole family's needs.
    XCTAssertTrue(
      health.succeeded(
        accountID: "a", key: .init(clientID: "family-app", authority: "https://i/t", scopes: []), interactive: true,
        sharing: ["other"]))
    XCTAssertEqual(health.attentionNeeded, [])
    XCTAssertEqual(health.entry("a").state, .ok)
  }

  func testANeedThatComesBackSoonIsToldOnceTheQuietPeriodIsOver() {
    var health = AccountHealth()
    let start = Date(timeIntervalSince1970: 1000)
    XCTAssertNotNil(health.failed(need, error: .interactionRequired("x"), now: start).notify)
    _ = health.succeeded(accountID: "a", key: key, interactive: false)
    // Back within the quiet period: not told yet...
    XCTAssertNil(health.failed(need, error: .interactionRequired("x"), now: start.addingTimeInterval(60)).notify)
    // ...but at the next failure after it, once.
    let later = start.addingTimeInterval(AccountHealth.renotifyAfter + 1)
    XCTAssertNotNil(health.failed(need, error: .interactionRequired("x"), now: later).notify)
    XCTAssertNil(health.failed(need, error: .interactionRequired("x"), now: later.addingTimeInterval(700)).notify)
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
    XCTAssertFalse(health.succeeded(accountID: "a", key: key, interactive: false))
    XCTAssertEqual(health.entry("a").state, .ok)
    XCTAssertFalse(health.forget("a"))
  }
}

/// The engine's side: which failures reach AttentionNeeded and the notification.
final class AttentionEventTests: XCTestCase {
  func testOnlyARefreshTokenTheProviderRefusedAsksTheUser() async throws {
    let h = await Harness()
    try await h.signIn()
    // An app that never signed in: InteractionRequired, but that app signs in by itself next.
    await XCTAssertThrowsTessera(.interactionRequired) {
      _ = try await h.broker.acquireTokenSilent(try h.request(clientID: "never-signed-in"))
    }
    XCTAssertEqual(h.events.needs.withLock { $0 }, [])
    let quiet = await h.broker.attentionNeeded
    XCTAssertEqual(quiet, [])

    // The provider refuses the refresh token, twenty times: one need, one change.
    h.idp.scriptedTokenAnswers.withLock {
      $0 = Array(
        repeating: HTTPResponse(
          status: 400, body: Array(#"{"error":"invalid_grant","error_description":"revoked"}"#.utf8)), count: 20)
    }
    for _ in 0..<20 {
      await XCTAssertThrowsTessera(.interactionRequired) {
        _ = try await h.broker.acquireTokenSilent(try h.request(options: ["force_refresh": .bool(true)]))
      }
    }
    let needs = h.events.needs.withLock { $0 }
    XCTAssertEqual(needs.count, 1)
    let accountID = try XCTUnwrap(needs.first?.accountID)
    XCTAssertEqual(h.events.attention.withLock { $0 }, [[accountID]])
    let status = try await h.broker.status().busValue
    guard case .dicts(let accounts)? = status[StatusReport.accountsKey] else { return XCTFail("no accounts") }
    XCTAssertEqual(accounts.first?[StatusReport.Account.state], .string("needs_sign_in"))

    // A new sign-in for that app clears it and withdraws the notification.
    try await h.signIn()
    XCTAssertEqual(h.events.attention.withLock { $0 }, [[accountID], []])
    XCTAssertEqual(h.events.resolved.withLock { $0 }, [accountID])
  }
}
