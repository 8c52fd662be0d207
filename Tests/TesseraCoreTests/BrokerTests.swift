import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

final class BrokerTests: XCTestCase {
  func testInteractiveSignInStoresAccountAndTokensAndAnnouncesIt() async throws {
    let h = await Harness()
    let result = try await h.signIn()
    XCTAssertEqual(result["access_token"], .string("at-1"))
    XCTAssertEqual(result["account"]?.dictValue?["username"], .string("alice@idp.test"))
    XCTAssertEqual(h.events.accountsChangedCount.withLock { $0 }, 1)
    XCTAssertEqual(h.events.pending.withLock { $0.first?.0 }, ":1.42", "InteractionPending goes to the caller only")
    XCTAssertEqual(h.store.secrets(kind: "refresh_token").count, 1)
    XCTAssertTrue(h.store.secrets(kind: "refresh_token")[0].contains("rt-1"))
    XCTAssertEqual(h.store.secrets(kind: "account").count, 1)
    // PKCE and state are sent.
    let url = try XCTUnwrap(h.listeners.lastAuthorizationURL.withLock { $0 })
    XCTAssertTrue(url.contains("code_challenge_method=S256"))
    XCTAssertTrue(url.contains("client_info=1"))
    let redeem = try XCTUnwrap(h.idp.tokenRequests.last)
    XCTAssertEqual(h.idp.form(redeem)["grant_type"], "authorization_code")
    XCTAssertNotNil(h.idp.form(redeem)["code_verifier"])
  }

  func testSilentIsServedFromCacheWithoutNetwork() async throws {
    let h = await Harness()
    try await h.signIn()
    let before = h.idp.requests.withLock { $0.count }
    let result = try await h.broker.acquireTokenSilent(try h.request())
    XCTAssertEqual(result["access_token"], .string("at-1"))
    XCTAssertEqual(h.idp.requests.withLock { $0.count }, before)
  }

  func testSilentRefreshesWhenLessThanMinValidityIsLeftAndStoresTheRotatedToken() async throws {
    let h = await Harness()
    try await h.signIn()
    h.clock.advance(3600 - 200)  // 200 s left, default min_validity is 300
    let result = try await h.broker.acquireTokenSilent(try h.request())
    XCTAssertEqual(result["access_token"], .string("at-2"))
    let refresh = try XCTUnwrap(h.idp.tokenRequests.last)
    XCTAssertEqual(h.idp.form(refresh)["grant_type"], "refresh_token")
    XCTAssertEqual(h.idp.form(refresh)["refresh_token"], "rt-1")
    XCTAssertTrue(h.store.secrets(kind: "refresh_token")[0].contains("rt-2"), "the rotated refresh token is stored")
    // With min_validity 100 the 200 s left on the new token's predecessor would have sufficed.
    let h2 = await Harness()
    try await h2.signIn()
    h2.clock.advance(3600 - 200)
    let cached = try await h2.broker.acquireTokenSilent(try h2.request(options: ["min_validity": .uint32(100)]))
    XCTAssertEqual(cached["access_token"], .string("at-1"))
  }

  func testForceRefreshSkipsTheCache() async throws {
    let h = await Harness()
    try await h.signIn()
    let result = try await h.broker.acquireTokenSilent(try h.request(options: ["force_refresh": .bool(true)]))
    XCTAssertEqual(result["access_token"], .string("at-2"))
  }

  func testConcurrentRefreshesAreSingleFlight() async throws {
    let h = await Harness()
    try await h.signIn()
    h.clock.advance(4000)
    h.idp.tokenDelay.withLock { $0 = 0.2 }
    let request = try h.request()
    let tokens = try await withThrowingTaskGroup(of: BusValue?.self) { group in
      for _ in 0..<20 { group.addTask { try await h.broker.acquireTokenSilent(request)["access_token"] } }
      return try await group.reduce(into: [BusValue?]()) { $0.append($1) }
    }
    XCTAssertEqual(Set(tokens.compactMap { $0?.stringValue }), ["at-2"])
    XCTAssertEqual(h.idp.tokenRequests.count, 2, "one sign-in and exactly one refresh")
  }

  func testInvalidGrantIsInteractionRequiredAndKeepsTheAccount() async throws {
    let h = await Harness()
    try await h.signIn()
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [HTTPResponse(status: 400, body: Array(#"{"error":"invalid_grant","error_description":"revoked"}"#.utf8))]
    }
    await XCTAssertThrowsTessera(.interactionRequired) {
      _ = try await h.broker.acquireTokenSilent(try h.request(options: ["force_refresh": .bool(true)]))
    }
    let accounts = try await h.broker.accounts(matching: AccountFilter())
    XCTAssertEqual(accounts.count, 1)
  }

  func testServerErrorsAreNetworkErrorsAndKeepTheRefreshToken() async throws {
    let h = await Harness()
    try await h.signIn()
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [HTTPResponse(status: 503, headers: ["retry-after": "30"], body: Array("busy".utf8))]
    }
    do {
      _ = try await h.broker.acquireTokenSilent(try h.request(options: ["force_refresh": .bool(true)]))
      XCTFail("expected an error")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .network)
      XCTAssertTrue(error.message.contains("30"), "the wait the IdP asked for is in the message")
    }
    // After the wait the IdP asked for, the refresh token is still there and works.
    h.clock.advance(31)
    let result = try await h.broker.acquireTokenSilent(try h.request(options: ["force_refresh": .bool(true)]))
    XCTAssertEqual(result["access_token"], .string("at-2"))
  }

  func testMalformedTokenAnswerIsProviderError() async throws {
    let h = await Harness()
    try await h.signIn()
    h.idp.scriptedTokenAnswers.withLock { $0 = [HTTPResponse(status: 200, body: Array("<html>".utf8))] }
    await XCTAssertThrowsTessera(.provider) {
      _ = try await h.broker.acquireTokenSilent(try h.request(options: ["force_refresh": .bool(true)]))
    }
  }

  func testLockedStoreIsUnavailableNotSignedOutAndRecovers() async throws {
    let h = await Harness()
    try await h.signIn()
    // The access token is written behind the reply; a clean shutdown waits for that write.
    await h.broker.finishStoreWrites()
    // A new broker (daemon restart) over the same store, which is now locked.
    let restarted = Broker(
      config: await h.broker.config,
      dependencies: BrokerDependencies(
        http: h.idp, store: h.store, browser: NoBrowser(), listeners: h.listeners, events: h.events, clock: h.clock),
      logger: .init(label: "t"))
    h.store.locked.withLock { $0 = true }
    await XCTAssertThrowsTessera(.storeUnavailable) { _ = try await restarted.acquireTokenSilent(try h.request()) }
    await XCTAssertThrowsTessera(.storeUnavailable) { _ = try await restarted.accounts(matching: AccountFilter()) }
    h.store.locked.withLock { $0 = false }
    let requestsBefore = h.idp.requests.withLock { $0.count }
    let result = try await restarted.acquireTokenSilent(try h.request())
    XCTAssertEqual(result["access_token"], .string("at-1"), "served from the stored cache after unlock")
    XCTAssertEqual(h.idp.requests.withLock { $0.count }, requestsBefore)
  }

  func testStateMismatchIsRefused() async throws {
    let h = await Harness(redirect: { _ in ["code": "c", "state": "forged"] })
    await XCTAssertThrowsTessera(.accessDenied) { try await h.signIn() }
    XCTAssertTrue(h.store.items.withLock { $0.isEmpty })
  }

  func testDeniedSignInIsAccessDenied() async throws {
    let h = await Harness(redirect: { state in ["error": "access_denied", "state": state] })
    await XCTAssertThrowsTessera(.accessDenied) { try await h.signIn() }
  }

  func testIDTokenForAnotherAudienceIsRefused() async throws {
    let h = await Harness()
    h.idp.audienceOverride.withLock { $0 = "someone-else" }
    await XCTAssertThrowsTessera(.provider) { try await h.signIn() }
    XCTAssertTrue(h.store.items.withLock { $0.isEmpty }, "nothing is stored from a refused sign-in")
  }

  func testSeveralAccountsAndNoneCurrentNeedAnAccountID() async throws {
    let h = await Harness()
    try await h.signIn()
    h.idp.subject.withLock { $0 = "bob-sub" }
    try await h.signIn()
    await h.broker.finishStoreWrites()
    // Accounts stored before there was a current account: none is.
    h.store.items.withLock { $0.removeAll { $0.attributes["kind"] == "current_account" } }
    let restarted = Broker(
      config: await h.broker.config,
      dependencies: BrokerDependencies(
        http: h.idp, store: h.store, browser: NoBrowser(), listeners: h.listeners, events: h.events, clock: h.clock),
      logger: .init(label: "t"))
    do {
      _ = try await restarted.acquireTokenSilent(try h.request())
      XCTFail("two accounts, none current: which one is not guessed")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .invalidArgument)
      XCTAssertTrue(error.message.contains("tessera account use"), error.message)
    }
    await XCTAssertThrowsTessera(.noSuchAccount) {
      _ = try await restarted.acquireTokenSilent(
        try RequestParser.tokenRequest(clientID: "", scopes: [], accountID: "nobody", options: [:]))
    }
  }

  func testAnotherClientWithoutItsOwnRefreshTokenNeedsInteraction() async throws {
    let h = await Harness()
    try await h.signIn()
    await XCTAssertThrowsTessera(.interactionRequired) {
      _ = try await h.broker.acquireTokenSilent(try h.request(clientID: "app2"))
    }
  }

  func testSignOutRevokesAndRemovesEverything() async throws {
    let h = await Harness()
    let result = try await h.signIn()
    let id = try XCTUnwrap(result["account"]?.dictValue?["id"]?.stringValue)
    try await h.broker.signOut(SignOutRequest(accountID: id, clientID: nil, revoke: true, correlationID: "c"))
    XCTAssertTrue(h.store.items.withLock { $0.isEmpty })
    let revoke = try XCTUnwrap(h.idp.requests.withLock { $0.last { $0.url.hasSuffix("/revoke") } })
    XCTAssertEqual(h.idp.form(revoke)["token"], "rt-1")
    XCTAssertEqual(h.events.accountsChangedCount.withLock { $0 }, 2)
  }

  func testSignOutInTheBrowserOpensTheEndSessionPageWithTheIDTokenAsHint() async throws {
    let h = await Harness()
    h.idp.endSessionEndpoint.withLock { $0 = FakeIdP.authority + "/logout" }
    let result = try await h.signIn()
    let id = try XCTUnwrap(result["account"]?.dictValue?["id"]?.stringValue)
    let idToken = try XCTUnwrap(result["id_token"]?.stringValue)
    h.listeners.lastAuthorizationURL.withLock { $0 = nil }
    try await h.broker.signOut(
      SignOutRequest(accountID: id, clientID: nil, revoke: true, browser: true, correlationID: "c"))
    // The browser was given the listener's start URL, which leads to the end-session page.
    let url = try XCTUnwrap(h.listeners.lastAuthorizationURL.withLock { $0 })
    XCTAssertTrue(url.hasPrefix(FakeIdP.authority + "/logout?"), url)
    let query = FormEncoding.decode(String(url.split(separator: "?", maxSplits: 1)[1]))
    XCTAssertEqual(query["id_token_hint"], idToken)
    XCTAssertEqual(query["client_id"], "app1")
    XCTAssertEqual(query["logout_hint"], "alice@idp.test")
    // And the account is signed out here as without the browser: removed and revoked.
    XCTAssertTrue(h.store.items.withLock { $0.isEmpty })
    XCTAssertTrue(h.idp.requests.withLock { $0.contains { $0.url.hasSuffix("/revoke") } })
  }

  func testSignOutInTheBrowserWithoutAnEndSessionEndpointSaysSoAndChangesNothing() async throws {
    let h = await Harness()
    let result = try await h.signIn()
    let id = try XCTUnwrap(result["account"]?.dictValue?["id"]?.stringValue)
    await h.broker.finishStoreWrites()
    let stored = h.store.items.withLock { $0.count }
    do {
      try await h.broker.signOut(
        SignOutRequest(accountID: id, clientID: nil, revoke: true, browser: true, correlationID: "c"))
      XCTFail("a provider without end_session_endpoint cannot sign out in the browser")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .invalidArgument)
      XCTAssertTrue(error.message.contains("end_session_endpoint"), error.message)
      XCTAssertTrue(error.message.contains("Nothing was signed out"), error.message)
    }
    XCTAssertEqual(h.store.items.withLock { $0.count }, stored)
    XCTAssertFalse(h.idp.requests.withLock { $0.contains { $0.url.hasSuffix("/revoke") } })
    let remaining = try await h.broker.knownAccounts(matching: AccountFilter())
    XCTAssertEqual(remaining.map(\.id), [id])
  }

  func testSignOutInTheBrowserIsForTheWholeAccount() throws {
    XCTAssertThrowsError(
      try RequestParser.signOutRequest(
        accountID: "a", options: [RequestOptions.browser.key: .bool(true), RequestOptions.clientID.key: .string("x")])
    ) { XCTAssertEqual(($0 as! TesseraError).code, .invalidArgument) }
    XCTAssertEqual(
      try RequestParser.signOutRequest(accountID: "a", options: [RequestOptions.browser.key: .bool(true)]).browser,
      true)
  }

  func testSignOutOfOneClientKeepsTheAccount() async throws {
    let h = await Harness()
    let result = try await h.signIn()
    try await h.signIn(clientID: "app2")
    let id = try XCTUnwrap(result["account"]?.dictValue?["id"]?.stringValue)
    try await h.broker.signOut(SignOutRequest(accountID: id, clientID: "app2", revoke: false, correlationID: "c"))
    XCTAssertFalse(h.idp.requests.withLock { $0.contains { $0.url.hasSuffix("/revoke") } })
    let remaining = try await h.broker.accounts(matching: AccountFilter())
    XCTAssertEqual(remaining.count, 1)
    _ = try await h.broker.acquireTokenSilent(try h.request())
    await XCTAssertThrowsTessera(.interactionRequired) {
      _ = try await h.broker.acquireTokenSilent(try h.request(clientID: "app2"))
    }
  }

  func testDeviceCodeFlowPollsPolitely() async throws {
    let h = await Harness()
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [
        HTTPResponse(status: 400, body: Array(#"{"error":"authorization_pending"}"#.utf8)),
        HTTPResponse(status: 400, body: Array(#"{"error":"slow_down"}"#.utf8)),
      ]
    }
    let result = try await h.broker.acquireTokenInteractive(
      try h.request(options: ["flow": .string("device_code")]), caller: CallerInfo(busName: ":1.7"))
    XCTAssertEqual(result["access_token"], .string("at-1"))
    XCTAssertEqual(h.clock.sleeps.withLock { $0 }, [5, 5, 10], "interval, then +5 after slow_down")
    let info = try XCTUnwrap(h.events.pending.withLock { $0.first })
    XCTAssertEqual(info.0, ":1.7")
    XCTAssertEqual(info.1["user_code"], .string("ABCD-EFGH"))
    XCTAssertEqual(info.1["verification_uri"], .string("https://idp.test/device"))
  }

  func testDeviceCodeThatNobodyEntersTimesOut() async throws {
    let h = await Harness()
    h.idp.scriptedTokenAnswers.withLock {
      $0 = Array(
        repeating: HTTPResponse(status: 400, body: Array(#"{"error":"authorization_pending"}"#.utf8)), count: 200)
    }
    await XCTAssertThrowsTessera(.timedOut) {
      _ = try await h.broker.acquireTokenInteractive(
        try h.request(options: ["flow": .string("device_code"), "timeout": .uint32(30)]),
        caller: CallerInfo(busName: ":1.7"))
    }
  }

  func testDefaultsAreRequiredWhenNothingIsGiven() async throws {
    var config = BrokerConfig()
    config.defaultAuthority = FakeIdP.authority
    config.trustedAuthorities = ["https://idp.test"]
    let h = await Harness(config: config)
    await XCTAssertThrowsTessera(.invalidArgument) {
      _ = try await h.broker.acquireTokenSilent(try h.request(scopes: ["read"]))
    }
    await XCTAssertThrowsTessera(.invalidArgument) {
      _ = try await h.broker.acquireTokenSilent(try h.request(clientID: "app"))
    }
  }

  func testUntrustedAuthorityIsRefusedBeforeAnyNetwork() async throws {
    let h = await Harness()
    await XCTAssertThrowsTessera(.untrustedAuthority) {
      _ = try await h.broker.acquireTokenSilent(try h.request(options: ["authority": .string("https://evil.test/t")]))
    }
    XCTAssertTrue(h.idp.requests.withLock { $0.isEmpty })
  }

  func testARefreshTokenIsNeverSentToAnotherIssuerOnTheSameHost() async throws {
    let h = await Harness()
    let result = try await h.signIn()
    let id = try XCTUnwrap(result["account"]?.dictValue?["id"]?.stringValue)
    let before = h.idp.requests.withLock { $0.count }
    await XCTAssertThrowsTessera(.noSuchAccount) {
      _ = try await h.broker.acquireTokenSilent(
        try RequestParser.tokenRequest(
          clientID: "", scopes: [], accountID: id,
          options: ["authority": .string("https://idp.test/tenant2"), "force_refresh": .bool(true)]))
    }
    XCTAssertEqual(h.idp.requests.withLock { $0.count }, before)
  }
}

/// Items of an account whose account record is missing are what an interrupted sign-out leaves:
/// its sign-out is finished at load (deleted, refresh tokens revoked).
final class InterruptedSignOutTests: XCTestCase {
  func testAnInterruptedSignOutIsFinishedAtLoad() async throws {
    let h = await Harness()
    try await h.signIn()
    await h.broker.finishStoreWrites()
    h.store.items.withLock { $0.removeAll { $0.attributes["kind"] == "account" } }
    let broker = Broker(
      config: .fakeIdP,
      dependencies: BrokerDependencies(
        http: h.idp, store: h.store, browser: NoBrowser(), listeners: h.listeners, events: h.events, clock: h.clock),
      logger: .init(label: "t"))
    _ = try await broker.knownAccounts(matching: AccountFilter())
    await broker.finishStoreWrites()
    func revocations() -> Int { h.idp.requests.withLock { $0 }.filter { $0.url.hasSuffix("/revoke") }.count }
    // The revocation is sent in the background (30 s only bounds a hang).
    let deadline = ContinuousClock.now + .seconds(30)
    while revocations() == 0 && ContinuousClock.now < deadline { try await Task.sleep(nanoseconds: 10_000_000) }
    XCTAssertEqual(
      h.store.items.withLock { $0 }.filter { $0.attributes["kind"] == "refresh_token" }.count, 0,
      "the sign-out is finished")
    XCTAssertEqual(revocations(), 1, "its refresh token revoked")
  }
}
