import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// DPoP at the token endpoint (RFC 9449) against FakeDPoPServer, which checks every proof with
/// jwt-kit: which requests carry a proof, with which key and nonce; what is bound and kept; and
/// what each configuration does with a server that binds and one that does not.
final class DPoPTests: XCTestCase {
  func harness(_ mode: DPoPMode = .auto, server: FakeDPoPServer? = FakeDPoPServer()) async -> Harness {
    var config = BrokerConfig.fakeIdP
    config.dpop = mode
    let h = await Harness(config: config, proofKeys: SoftwareProofKeys())
    h.idp.dpop.withLock { $0 = server }
    return h
  }

  func proofs(_ h: Harness) -> [String?] {
    h.idp.tokenRequests.map { request in request.headers.first { $0.0 == "DPoP" }?.1 }
  }

  func testASignInBindsItsTokensToANewKeyAndEveryRefreshProvesThatKey() async throws {
    let h = await harness()
    let server = try XCTUnwrap(h.idp.dpop.withLock { $0 })
    let result = try await h.signIn()
    XCTAssertEqual(result["token_type"], .string("DPoP"))
    // The first proof had no nonce: the server asked for one, and the code went once more with it.
    XCTAssertEqual(h.idp.tokenRequests.count, 2)
    XCTAssertEqual(h.idp.tokenRequests.map { h.idp.form($0)["code"] }, ["the-code", "the-code"])
    let first = try XCTUnwrap(server.accepted.withLock { $0.first })
    XCTAssertEqual(first.claims.htm, "POST")
    XCTAssertEqual(first.claims.htu, FakeIdP.authority + "/token")
    XCTAssertEqual(first.claims.nonce, "nonce-1")
    XCTAssertNil(first.claims.ath, "no access token at the token endpoint")
    await h.broker.finishStoreWrites()
    let keys = h.store.secrets(kind: "dpop_key")
    XCTAssertEqual(keys.count, 1, "the key is kept, in the store")
    XCTAssertTrue(h.store.secrets(kind: "refresh_token")[0].contains(#""proofKey":"\#(first.jkt)""#))

    // A refresh: a proof with the same key and the nonce the server last sent, at once.
    server.nonce.withLock { $0 = "nonce-2" }
    h.clock.advance(3600)
    let refreshed = try await h.broker.acquireTokenSilent(try h.request())
    XCTAssertEqual(refreshed["token_type"], .string("DPoP"))
    XCTAssertEqual(server.accepted.withLock { $0.map(\.jkt) }, [first.jkt, first.jkt])
    XCTAssertEqual(server.accepted.withLock { $0.last?.claims.nonce }, "nonce-2")
    XCTAssertEqual(server.bound.withLock { $0["rt-2"] }, first.jkt, "the rotated token is bound to the same key")
    await h.broker.finishStoreWrites()
    XCTAssertEqual(h.store.secrets(kind: "dpop_key"), keys, "still the one key")

    // Signed out: the key goes with the account, as every other item does.
    let id = try XCTUnwrap(result["account"]?.dictValue?["id"]?.stringValue)
    try await h.broker.signOut(SignOutRequest(accountID: id, clientID: nil, revoke: true, correlationID: "c"))
    await h.broker.finishStoreWrites()
    XCTAssertTrue(h.store.items.withLock { $0.isEmpty })
  }

  func testEachSignInHasAKeyOfItsOwnAndAKeyNoTokenUsesGoes() async throws {
    let h = await harness()
    let server = try XCTUnwrap(h.idp.dpop.withLock { $0 })
    try await h.signIn()
    try await h.signIn(clientID: "app2")
    let keys = Set(server.accepted.withLock { $0.map(\.jkt) })
    XCTAssertEqual(keys.count, 2, "two sign-ins, two keys: nothing links them at the provider")
    await h.broker.finishStoreWrites()
    XCTAssertEqual(h.store.secrets(kind: "dpop_key").count, 2)
    // app1 signs in again: its new key replaces the old one, which no token uses any more.
    try await h.signIn()
    await h.broker.finishStoreWrites()
    XCTAssertEqual(h.store.secrets(kind: "dpop_key").count, 2)
  }

  func testARequestGoesOnceMoreWithTheNonceItsProofLackedEvenWhenAnotherKeptItFirst() async throws {
    // Two requests left with the nonce the server sent last; it rotated meanwhile and both were
    // asked for the new one. The first kept it; the second, whose proof did not carry it either,
    // must still go once more: what counts is what each proof carried.
    let h = await harness()
    let url = FakeIdP.authority + "/token"
    let asked = HTTPResponse(
      status: 400, headers: ["dpop-nonce": "n2"], body: Array(#"{"error":"use_dpop_nonce"}"#.utf8))
    let firstRetries = await h.broker.noteNonce(asked, url: url, sent: "n1", retried: false)
    XCTAssertTrue(firstRetries)
    let secondRetries = await h.broker.noteNonce(asked, url: url, sent: "n1", retried: false)
    XCTAssertTrue(secondRetries, "the nonce already kept by the first does not stop the second")
    let repeatRetries = await h.broker.noteNonce(asked, url: url, sent: "n2", retried: false)
    XCTAssertFalse(repeatRetries, "a proof that carried it is not sent again")
    let afterRetry = await h.broker.noteNonce(asked, url: url, sent: "n1", retried: true)
    XCTAssertFalse(afterRetry, "once only")
    let quoted = HTTPResponse(
      status: 400, headers: ["dpop-nonce": "n\"3"], body: Array(#"{"error":"use_dpop_nonce"}"#.utf8))
    let badNonce = await h.broker.noteNonce(quoted, url: url, sent: nil, retried: false)
    XCTAssertFalse(badNonce, "a nonce outside NQCHAR is not taken")
  }

  func testARefreshAnsweredWithABearerAccessTokenKeepsTheRefreshTokenBound() async throws {
    // RFC 9449 §5: a public client's refresh token is bound to the key; an access token may still
    // be a bearer one (a resource that takes no DPoP). The rotated refresh token stays bound, and
    // the next refresh proves the same key.
    let h = await harness(.required)
    let server = try XCTUnwrap(h.idp.dpop.withLock { $0 })
    try await h.signIn()
    server.binds.withLock { $0 = false }
    h.clock.advance(3600)
    let bearer = try await h.broker.acquireTokenSilent(try h.request())
    XCTAssertEqual(bearer["token_type"], .string("Bearer"), "required, yet a refresh of a bound token is kept")
    await h.broker.finishStoreWrites()
    let refresh = h.store.secrets(kind: "refresh_token")[0]
    XCTAssertTrue(refresh.contains(#""proofKey""#), "the rotated refresh token is still bound: \(refresh)")
    XCTAssertEqual(h.store.secrets(kind: "dpop_key").count, 1, "its key kept")
    h.clock.advance(3600)
    _ = try await h.broker.acquireTokenSilent(try h.request())
    let keys = Set(server.accepted.withLock { $0.map(\.jkt) })
    XCTAssertEqual(keys.count, 1, "every refresh proved the one key")
  }

  func testAProofIsForTheAppThatWasHandedTheTokenAndNeverForTheProvidersOwnEndpoints() async throws {
    var config = BrokerConfig.fakeIdP
    config.accessMode = .open
    let h = await Harness(config: config, proofKeys: SoftwareProofKeys())
    h.idp.dpop.withLock { $0 = FakeDPoPServer() }
    let app = CallerInfo(busName: ":1.60", pid: 60, uid: 1000, app: AppIdentity(kind: .flatpak, id: "org.example.A"))
    let other = CallerInfo(busName: ":1.61", pid: 61, uid: 1000, app: AppIdentity(kind: .flatpak, id: "org.example.B"))
    var request = try h.request()
    request.caller = app
    _ = try await h.broker.acquireTokenInteractive(request, caller: app)
    let silent = try await h.broker.acquireTokenSilent(request)
    let token = try XCTUnwrap(silent["access_token"]?.stringValue)
    let url = "https://api.idp.test/me?x=1"
    let proof = try await h.broker.proof(method: "GET", url: url, accessToken: token, nonce: nil, caller: app)
    let (_, claims) = try await FakeDPoPServer.verify(proof)
    XCTAssertEqual(claims.htu, "https://api.idp.test/me")
    XCTAssertEqual(claims.ath, DPoP.tokenHash(token))
    // Not handed the token: no proof, whatever the policy would let it do.
    await XCTAssertThrowsTessera(.accessDenied) {
      _ = try await h.broker.proof(method: "GET", url: url, accessToken: token, nonce: nil, caller: other)
    }
    // The provider's token endpoint: never (a copy of the refresh token would redeem elsewhere).
    await XCTAssertThrowsTessera(.accessDenied) {
      _ = try await h.broker.proof(
        method: "POST", url: FakeIdP.authority + "/token", accessToken: token, nonce: nil, caller: app)
    }
    // A refresh replaced the token in the cache: the app still holds it, and still gets proofs.
    h.clock.advance(3600 - 200)
    var forced = request
    forced.forceRefresh = true
    let refreshed = try await h.broker.acquireTokenSilent(forced)
    let newer = try XCTUnwrap(refreshed["access_token"]?.stringValue)
    XCTAssertNotEqual(newer, token)
    _ = try await h.broker.proof(method: "GET", url: url, accessToken: token, nonce: nil, caller: app)
    // Expired: none.
    h.clock.advance(400)
    await XCTAssertThrowsTessera(.invalidArgument) {
      _ = try await h.broker.proof(method: "GET", url: url, accessToken: token, nonce: nil, caller: app)
    }
    // Credentials in the URL, a stray nonce: refused as arguments.
    for (badURL, badNonce) in [("http://127.0.0.1:80@evil.test/", nil), (url, "a\"b")] as [(String, String?)] {
      await XCTAssertThrowsTessera(.invalidArgument) {
        _ = try await h.broker.proof(method: "GET", url: badURL, accessToken: newer, nonce: badNonce, caller: app)
      }
    }
  }

  func testTheDeviceCodeFlowBindsToo() async throws {
    let h = await harness()
    let result = try await h.broker.acquireTokenInteractive(
      try h.request(options: ["flow": .string("device_code")]), caller: CallerInfo(busName: ":1.7"))
    XCTAssertEqual(result["token_type"], .string("DPoP"))
    XCTAssertEqual(h.clock.sleeps.withLock { $0 }, [5], "the nonce was sent at once, not after another interval")
    XCTAssertEqual(proofs(h).compactMap { $0 }.count, 2)
  }

  func testAKeyThisMachineNoLongerHasMeansSignInAgainAndNothingElseIsLost() async throws {
    let h = await harness()
    try await h.signIn()
    await h.broker.finishStoreWrites()
    // The key's item is gone (a store restored without it; a TPM cleared is the same to the engine).
    h.store.items.withLock { $0.removeAll { $0.attributes["kind"] == "dpop_key" } }
    let restarted = Broker(
      config: await h.broker.config,
      dependencies: {
        var d = BrokerDependencies(
          http: h.idp, store: h.store, browser: NoBrowser(), listeners: h.listeners, events: h.events, clock: h.clock)
        d.proofKeys = SoftwareProofKeys()
        return d
      }(),
      logger: .init(label: "t"))
    h.clock.advance(3600)
    let before = h.idp.tokenRequests.count
    await XCTAssertThrowsTessera(.interactionRequired) {
      _ = try await restarted.acquireTokenSilent(try h.request())
    }
    do {
      _ = try await restarted.acquireTokenSilent(try h.request())
      XCTFail("refreshed without the key")
    } catch let error as TesseraError {
      XCTAssertTrue(error.message.contains("this machine's key changed"), error.message)
    }
    XCTAssertEqual(h.idp.tokenRequests.count, before, "the bound refresh token is not sent without its key")
    let accounts = try await restarted.knownAccounts(matching: AccountFilter())
    XCTAssertEqual(accounts.count, 1, "the account stays")
    XCTAssertEqual(h.store.secrets(kind: "refresh_token").count, 1, "its refresh token stays too")
  }

  func testRequiredRefusesAServerThatCannotBindBeforeTheBrowserOpens() async throws {
    let h = await harness(.required, server: nil)
    await XCTAssertThrowsTessera(.configuration) { try await h.signIn() }
    XCTAssertNil(h.listeners.lastAuthorizationURL.withLock { $0 }, "no browser opened")
    XCTAssertTrue(h.idp.tokenRequests.isEmpty)
  }

  func testRequiredRefusesABearerAnswerAndRevokesWhatItBrought() async throws {
    let server = FakeDPoPServer()
    server.binds.withLock { $0 = false }
    let h = await harness(.required, server: server)
    await XCTAssertThrowsTessera(.provider) { try await h.signIn() }
    await h.broker.finishStoreWrites()
    XCTAssertTrue(h.store.items.withLock { $0.isEmpty }, "nothing kept")
    XCTAssertTrue(h.idp.requests.withLock { $0.contains { $0.url.hasSuffix("/revoke") } }, "its refresh token revoked")
  }

  func testAutoTakesBearerTokensWhereTheServerDoesNotBindAndOffSendsNoProof() async throws {
    let server = FakeDPoPServer()
    server.binds.withLock { $0 = false }
    let auto = await harness(.auto, server: server)
    let result = try await auto.signIn()
    XCTAssertEqual(result["token_type"], .string("Bearer"))
    await auto.broker.finishStoreWrites()
    XCTAssertTrue(auto.store.secrets(kind: "dpop_key").isEmpty, "no key kept for a bearer token")

    let off = await harness(.off)
    let offResult = try await off.signIn()
    XCTAssertEqual(offResult["token_type"], .string("Bearer"))
    XCTAssertEqual(proofs(off), [nil], "no proof sent")

    let noDiscovery = await harness(.auto, server: nil)
    let plain = try await noDiscovery.signIn()
    XCTAssertEqual(plain["token_type"], .string("Bearer"))
    XCTAssertEqual(proofs(noDiscovery), [nil], "a server whose metadata lists no ES256 gets no proof")
  }

  func testAProofTheServerRefusesForItsTimeSaysToSetTheClock() async throws {
    let server = FakeDPoPServer()
    server.clockSkew.withLock { $0 = 600 }  // the server's clock is ten minutes ahead of ours
    let h = await harness(.auto, server: server)
    do {
      try await h.signIn()
      XCTFail("signed in")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .provider)
      XCTAssertTrue(error.message.contains("iat out of range"), error.message)
      XCTAssertTrue(error.message.contains("clock"), error.message)
    }
  }

  func testAProofIsAJWSOfTheKeyAndItsThumbprintIsRFC7638s() async throws {
    // RFC 7638 §3.1's example key and thumbprint are RSA; this one is checked against a thumbprint
    // computed by hand from the canonical JSON.
    let jwk = try ProofJWK(point: [4] + Array(repeating: 1, count: 32) + Array(repeating: 2, count: 32))
    XCTAssertEqual(jwk.x, "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE")
    XCTAssertEqual(jwk.y, "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI")
    XCTAssertEqual(jwk.thumbprint, "kOFKxjJdOqJD5G4Yuw-cxHe64VGyxKEO_hoV83QfGj0")
    let source = SoftwareProofKeys()
    let made = try await source.create()
    let key = ProofKeyRecord(accountID: "a", kind: .software, jwk: made.jwk, blob: made.blob, createdAt: 0)
    let proof = try await ProofBuilder.proof(
      key: key, source: source, method: "get", url: "https://api.test/r?x=1#f", now: Date(timeIntervalSince1970: 1000),
      nonce: nil, accessToken: "at-1")
    let (jkt, claims) = try await FakeDPoPServer.verify(proof)
    XCTAssertEqual(jkt, made.jwk.thumbprint)
    XCTAssertEqual(claims.htm, "GET")
    XCTAssertEqual(claims.htu, "https://api.test/r", "no query, no fragment")
    XCTAssertEqual(claims.iat, 1000)
    XCTAssertEqual(claims.ath, "R8PYaIQdcYEdkSc9TeGyiUqSAedmCQuOQImPRh1E3HI")
    XCTAssertNil(claims.nonce)
  }
}
