import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// Tokens that do not behave like Entra's (issue 38, points 4 and 5): a provider's token with no
/// `expires_in` does not expire; a refresh token with a lifetime of its own is shown and warned
/// of a day ahead; a token a resource refused is dropped, and only by an app that may have it.
///
/// GitHub's answers as its documentation gives them: an OAuth app's token has no `expires_in` and
/// no refresh token; a GitHub App's user token has `expires_in` 28800 and a refresh token with
/// `refresh_token_expires_in` 15811200 (https://docs.github.com/en/apps/creating-github-apps/authenticating-with-a-github-app/refreshing-user-access-tokens).
final class ProviderTokenLifetimeTests: XCTestCase {
  struct FixedSecret: ClientSecretSource {
    func secret(at path: String, shared: Bool) throws -> String { "s3cr3t" }
  }

  let provider: [String: BusValue] = ["provider": .string("gh")]

  func harness(accessMode: AccessMode = .open) async throws -> Harness {
    var config = BrokerConfig.fakeIdP
    config.providers =
      try ConfigLayer.parse(
        bytes: Array(
          """
          [[provider]]
          name = "gh"
          profile = "github"
          host = "git.test"
          client_id = "Ov23.app"
          client_secret_file = "/secrets/app.secret"
          """.utf8), path: "/c.toml", isSystem: false
      ).providers
    let h = await Harness(config: config, accessMode: accessMode, secrets: FixedSecret())
    h.idp.scriptedGets.withLock {
      $0["https://git.test/api/v3/user"] = HTTPResponse(status: 200, body: Array(#"{"login":"octocat","id":1}"#.utf8))
    }
    return h
  }

  func answer(_ body: String) -> HTTPResponse { HTTPResponse(status: 200, body: Array(body.utf8)) }

  func testAnOAuthAppsTokenDoesNotExpireIsServedFromTheCacheAndNeverRefreshedAhead() async throws {
    let h = try await harness()
    h.idp.scriptedTokenAnswers.withLock { $0 = [answer("access_token=gho_1&token_type=bearer&scope=repo")] }
    let signedIn = try await h.signIn(options: provider)
    XCTAssertEqual(signedIn["expires_on"], .int64(TokenExpiry.never))

    h.clock.advance(400 * 86_400)  // longer than any token Tessera would keep for an authority
    let silent = try await h.broker.acquireTokenSilent(try h.request(options: provider))
    XCTAssertEqual(silent["access_token"], .string("gho_1"), "still served from the cache")
    await h.broker.refreshAhead()
    let exchanges = h.idp.requests.withLock { $0 }.filter { $0.url == "https://git.test/login/oauth/access_token" }
    XCTAssertEqual(exchanges.count, 1, "nothing refreshed: only the sign-in reached the token endpoint")

    let report = try await h.broker.status()
    let token = try XCTUnwrap(report.accounts.first?.tokens.first)
    XCTAssertEqual(token.expiresOn, TokenExpiry.never)
    XCTAssertNil(token.refreshOn, "no refresh planned")
    XCTAssertNil(report.accounts.first?.nextRefresh)
    XCTAssertNil(report.accounts.first?.refreshTokenExpiresOn)
  }

  func testAnAuthoritysTokenWithoutExpiresInStillLastsAnHour() async throws {
    let h = await Harness()
    try await h.signIn()
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [answer(#"{"access_token":"at-x","token_type":"Bearer","refresh_token":"rt-x"}"#)]
    }
    let now = Int64(h.clock.now().timeIntervalSince1970)
    let result = try await h.broker.acquireTokenSilent(try h.request(options: ["force_refresh": .bool(true)]))
    XCTAssertEqual(result["access_token"], .string("at-x"))
    XCTAssertEqual(result["expires_on"], .int64(now + 3600), "as before providers: an hour")
  }

  func testARejectedTokenWithoutARefreshTokenIsDroppedAndTheNextRequestAsksForASignIn() async throws {
    let h = try await harness()
    h.idp.scriptedTokenAnswers.withLock { $0 = [answer("access_token=gho_1&token_type=bearer&scope=repo")] }
    _ = try await h.signIn(options: provider)

    let wrong = try await h.broker.rejectToken(try h.request(options: provider), token: "gho_other")
    XCTAssertFalse(wrong, "a value that is not the cached token drops nothing")
    XCTAssertEqual(h.events.attention.withLock { $0 }, [])

    let dropped = try await h.broker.rejectToken(try h.request(options: provider), token: "gho_1")
    XCTAssertTrue(dropped)
    let cached = await h.broker.cache.accessTokens.count
    XCTAssertEqual(cached, 0)
    await h.broker.finishStoreWrites()
    XCTAssertEqual(h.store.secrets(kind: "access_token"), [], "gone from the store too")
    do {
      _ = try await h.broker.acquireTokenSilent(try h.request(options: provider))
      XCTFail("a token without a refresh token to get it")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .interactionRequired)
      XCTAssertTrue(
        error.message.contains("A resource refused octocat's token")
          && error.message.contains("tessera login --provider gh"),
        "says what happened and what to run: \(error.message)")
    }
    let ids = await h.broker.cache.accounts.keys
    let accountID = try XCTUnwrap(ids.first)
    XCTAssertEqual(h.events.attention.withLock { $0 }.last, [accountID], "AttentionNeeded lists the account")
    XCTAssertEqual(h.events.needs.withLock { $0 }.map(\.clientID), ["Ov23.app"], "one notification")
    let accounts = try await h.broker.accounts(matching: AccountFilter())
    XCTAssertEqual(accounts.count, 1, "the account stays: a sign-in brings its tokens back")

    // A sign-in answers the need.
    h.idp.scriptedTokenAnswers.withLock { $0 = [answer("access_token=gho_2&token_type=bearer&scope=repo")] }
    _ = try await h.signIn(options: provider)
    XCTAssertEqual(h.events.attention.withLock { $0 }.last, [])
    let silent = try await h.broker.acquireTokenSilent(try h.request(options: provider))
    XCTAssertEqual(silent["access_token"], .string("gho_2"))
  }

  func testARejectedTokenIsReplacedByARefreshAndTheSilentFastPathForgetsIt() async throws {
    let h = try await harness()
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [
        answer("access_token=ghu_1&token_type=bearer&expires_in=28800&refresh_token=ghr_1&scope=repo"),
        answer("access_token=ghu_2&token_type=bearer&expires_in=28800&refresh_token=ghr_2&scope=repo"),
      ]
    }
    _ = try await h.signIn(options: provider)
    _ = try await h.broker.acquireTokenSilent(try h.request(options: provider))  // published to the fast path
    let arguments: [BusValue] = [.string(""), .strings([]), .string(""), .dict(provider)]
    XCTAssertNotNil(h.broker.fastPath.answer(arguments, now: h.clock.now().timeIntervalSince1970, app: nil))
    let dropped = try await h.broker.rejectToken(try h.request(options: provider), token: "ghu_1")
    XCTAssertTrue(dropped)
    XCTAssertNil(
      h.broker.fastPath.answer(arguments, now: h.clock.now().timeIntervalSince1970, app: nil),
      "the bus thread no longer repeats the refused token")
    let next = try await h.broker.acquireTokenSilent(try h.request(options: provider))
    XCTAssertEqual(next["access_token"], .string("ghu_2"), "refreshed")
    XCTAssertEqual(h.events.attention.withLock { $0 }, [], "a refresh token was there: no sign-in needed")
  }

  func testOnlyAnAppThatMayHaveTheTokenCanRejectIt() async throws {
    let h = try await harness(accessMode: .strict)
    let owner = CallerInfo(
      busName: ":1.10", pid: 10, uid: 1000, app: AppIdentity(kind: .flatpak, id: "org.example.Git"))
    let other = CallerInfo(busName: ":1.11", pid: 11, uid: 1000, app: AppIdentity(kind: .executable, id: "/usr/bin/x"))
    h.idp.scriptedTokenAnswers.withLock { $0 = [answer("access_token=gho_1&token_type=bearer&scope=repo")] }
    var signIn = try h.request(options: provider)
    signIn.caller = owner
    _ = try await h.broker.acquireTokenInteractive(signIn, caller: owner)

    var byOther = try h.request(options: provider)
    byOther.caller = other
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await h.broker.rejectToken(byOther, token: "gho_1") }
    var silent = try h.request(options: provider)
    silent.caller = owner
    let still = try await h.broker.acquireTokenSilent(silent)
    XCTAssertEqual(still["access_token"], .string("gho_1"), "the other app's attempt changed nothing")

    var byOwner = try h.request(options: provider)
    byOwner.caller = owner
    let dropped = try await h.broker.rejectToken(byOwner, token: "gho_1")
    XCTAssertTrue(dropped)
  }

  func testARefreshTokensOwnLifetimeIsShownAndWarnedOfADayAhead() async throws {
    let h = try await harness()
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [
        answer(
          "access_token=ghu_1&token_type=bearer&expires_in=28800&refresh_token=ghr_1&refresh_token_expires_in=15811200&scope=repo"
        )
      ]
    }
    let start = Int64(h.clock.now().timeIntervalSince1970)
    _ = try await h.signIn(options: provider)
    var report = try await h.broker.status()
    XCTAssertEqual(report.accounts.first?.refreshTokenExpiresOn, start + 15_811_200)

    await h.broker.refreshAhead()
    XCTAssertEqual(h.events.attention.withLock { $0 }, [], "months ahead: nothing to say")
    h.clock.advance(Double(15_811_200 - 86_400 - 60))
    await h.broker.refreshAhead()
    XCTAssertEqual(h.events.attention.withLock { $0 }, [], "a day and a minute ahead: not yet")
    h.clock.advance(120)
    await h.broker.refreshAhead()
    let accountID = try XCTUnwrap(report.accounts.first?.id)
    XCTAssertEqual(h.events.attention.withLock { $0 }.last, [accountID])
    let needs = h.events.needs.withLock { $0 }
    XCTAssertEqual(needs.count, 1)
    await h.broker.refreshAhead()
    XCTAssertEqual(h.events.needs.withLock { $0 }.count, 1, "told once")
    report = try await h.broker.status()
    XCTAssertEqual(report.accounts.first?.state, "needs_sign_in")
    XCTAssertTrue(
      report.accounts.first?.lastError?.message.contains("when its refresh token expires") == true,
      "\(String(describing: report.accounts.first?.lastError))")
  }

  /// A wall clock set forward by an hour: an expiring token and a refresh token's lapse keep the
  /// real time they have left (both were counted on this clock); a token that does not expire
  /// stays so.
  func testAClockSetMovesLapsesButNotATokenThatDoesNotExpire() {
    var cache = TokenCache()
    _ = cache.upsert(
      refreshToken: RefreshTokenRecord(
        accountID: "a", environment: "github.com", clientID: "Iv1.app", authority: "https://github.com",
        secret: "ghr", expiresOn: 10_000))
    _ = cache.insert(
      accessToken: AccessTokenRecord(
        accountID: "a", environment: "github.com", realm: "", clientID: "Ov23", scopes: ["repo"], secret: "gho",
        tokenType: "bearer", expiresOn: TokenExpiry.never, idToken: nil, refreshOn: TokenExpiry.never, cachedAt: 1000))
    _ = cache.insert(
      accessToken: AccessTokenRecord(
        accountID: "a", environment: "github.com", realm: "", clientID: "Iv1.app", scopes: ["repo"], secret: "ghu",
        tokenType: "bearer", expiresOn: 5000, idToken: nil, refreshOn: 4000, cachedAt: 1000))
    let writes = cache.clockSet(by: 3600)
    XCTAssertEqual(cache.refreshTokens.first?.expiresOn, 13_600)
    XCTAssertEqual(cache.accessTokens.first { $0.secret == "gho" }?.expiresOn, TokenExpiry.never)
    XCTAssertEqual(cache.accessTokens.first { $0.secret == "ghu" }?.expiresOn, 8600)
    XCTAssertEqual(writes.count, 3, "each kept in step in the store")
  }

  /// RejectToken's bad input: each a named InvalidArgument saying what to pass, never echoing
  /// the token.
  func testRejectTokensBadInputIsNamedAndNeverEchoed() {
    func message(_ token: String, _ options: [String: BusValue] = [:]) -> String? {
      do {
        _ = try RequestParser.rejectTokenRequest(clientID: "", accountID: "", token: token, options: options)
        return nil
      } catch let error as TesseraError {
        XCTAssertEqual(error.code, .invalidArgument)
        return error.message
      } catch {
        return "\(error)"
      }
    }
    XCTAssertTrue(message("")?.contains("needs the token the resource refused") == true)
    let huge = String(repeating: "x", count: 20_000)
    XCTAssertTrue(message(huge)?.contains("'token' is 20000 bytes long; the limit is 16384") == true)
    XCTAssertFalse(message(huge)?.contains("xxxx") ?? true, "the token is not echoed")
    XCTAssertTrue(message("gho with space")?.contains("'token' contains a control character or a space") == true)
    XCTAssertTrue(
      message("gho_1", ["force_refresh": .bool(true)])?.contains("Unknown option key 'force_refresh' for RejectToken")
        == true, "only authority, provider and correlation_id")
    XCTAssertNil(message("gho_1", ["provider": .string("gh"), "correlation_id": .string("c-1")]))
  }
}
