import Logging
import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// com.microsoft.identity.broker1 over the engine (issue #9): the JSON each client needs, one
/// cache with the native front, the status table, and bad input answered as the protocol's error.
final class MicrosoftFrontTests: XCTestCase {
  func front(_ h: Harness) -> MicrosoftFront {
    MicrosoftFront(broker: h.broker, logger: Logger(label: "test"), clock: h.clock)
  }

  func call(
    _ front: MicrosoftFront, _ method: String, _ request: String, version: String = "0.0", correlation: String = ""
  ) async throws -> [String: Any] {
    let answer = await front.handle(
      method: method, arguments: [.string(version), .string(correlation), .string(request)],
      caller: CallerInfo(busName: ":1.77"))
    let object = try JSONSerialization.jsonObject(with: Data(answer.utf8))
    return try XCTUnwrap(object as? [String: Any], answer)
  }

  func json(_ object: Any) -> String {
    String(decoding: try! JSONSerialization.data(withJSONObject: object), as: UTF8.self)
  }

  /// The error object of an answer (top level, or inside brokerTokenResponse).
  func error(_ answer: [String: Any]) -> [String: Any]? {
    (answer["error"] as? [String: Any])
      ?? ((answer["brokerTokenResponse"] as? [String: Any])?["error"] as? [String: Any])
  }

  func accounts(_ front: MicrosoftFront, clientID: String = "app1") async throws -> [[String: Any]] {
    let answer = try await call(front, "getAccounts", json(["clientId": clientID, "redirectUri": "urn:ietf:oob"]))
    return try XCTUnwrap(answer["accounts"] as? [[String: Any]], "\(answer)")
  }

  func testASignInThroughEitherFrontIsServedFromOneCacheWithTheFieldsClientsNeed() async throws {
    let h = await Harness()
    let native = try await h.signIn()
    let front = front(h)
    let listed = try await accounts(front)
    XCTAssertEqual(listed.count, 1)
    let account = listed[0]
    // Every field sso-mib and linux-entra-sso require, with its JSON type.
    for key in [
      "environment", "givenName", "familyName", "homeAccountId", "localAccountId", "name", "realm", "username",
    ] {
      XCTAssertTrue(account[key] is String, "\(key) in \(account)")
    }
    XCTAssertEqual(account["passwordExpiry"] as? Int, 0)
    XCTAssertNotNil(UUID(uuidString: account["realm"] as? String ?? ""), "realm must parse as a UUID")
    XCTAssertEqual(account["environment"] as? String, "idp.test")
    let home = try XCTUnwrap(account["homeAccountId"] as? String)
    let info = try XCTUnwrap(ClientInfo.decode(account["clientInfo"] as? String ?? ""))
    XCTAssertEqual("\(info.uid).\(info.utid)", home, "client_info names the same account as homeAccountId")

    // The account echoed back with extra empty keys, as clients do.
    var echoed = account
    echoed["extra"] = ""
    echoed["givenName"] = ""
    let answer = try await call(
      front, "acquireTokenSilently",
      json([
        "authParameters": [
          "account": echoed, "authority": FakeIdP.authority, "clientId": "app1", "requestedScopes": ["read"],
          "redirectUri": "x", "decodedClaims": "", "popParams": NSNull(), "uxContextHandle": -1,
        ]
      ]))
    let token = try XCTUnwrap(answer["brokerTokenResponse"] as? [String: Any], "\(answer)")
    XCTAssertEqual(token["accessToken"] as? String, native["access_token"]?.stringValue, "the native front's token")
    guard case .int64(let expiresOn)? = native["expires_on"] else { return XCTFail("no expires_on") }
    XCTAssertEqual(token["expiresOn"] as? Int64, expiresOn * 1000, "milliseconds")
    XCTAssertEqual(token["grantedScopes"] as? String, "read")
    XCTAssertEqual(token["accessTokenType"] as? Int, 0)
    XCTAssertTrue((token["idToken"] as? String ?? "").split(separator: ".").count == 3, "a real JWT")
    XCTAssertEqual((token["account"] as? [String: Any])?["homeAccountId"] as? String, home)
    XCTAssertEqual(h.idp.tokenRequests.count, 1, "served from the cache")

    // Matched by username alone too; an unknown account needs interaction.
    let byName = try await call(
      front, "acquireTokenSilently",
      json([
        "authParameters": [
          "account": ["username": account["username"]!], "clientId": "app1", "requestedScopes": ["read"],
        ]
      ]))
    XCTAssertNotNil((byName["brokerTokenResponse"] as? [String: Any])?["accessToken"], "\(byName)")
    let unknown = try await call(
      front, "acquireTokenSilently",
      json([
        "authParameters": [
          "account": ["homeAccountId": "nobody.nowhere"], "clientId": "app1", "requestedScopes": ["read"],
        ]
      ]))
    XCTAssertEqual(error(unknown)?["status"] as? Int, 2)
  }

  func testAnInteractiveSignInHereServesTheNativeFront() async throws {
    let h = await Harness()
    let front = front(h)
    let signedIn = try await call(
      front, "acquireTokenInteractively",
      json([
        "authParameters": [
          "account": NSNull(), "clientId": "app1", "requestedScopes": ["read"], "authorizationType": 6,
          "username": "alice@idp.test",
        ]
      ]))
    let token = try XCTUnwrap(signedIn["brokerTokenResponse"] as? [String: Any], "\(signedIn)")
    let native = try await h.broker.acquireTokenSilent(try h.request())
    XCTAssertEqual(native["access_token"]?.stringValue, token["accessToken"] as? String)
    XCTAssertEqual(h.idp.tokenRequests.count, 1)
    XCTAssertEqual(
      h.listeners.lastAuthorizationURL.withLock { $0 }.flatMap { URLComponents(string: $0) }?.queryItems?.first {
        $0.name == "login_hint"
      }?.value, "alice@idp.test", "username is the login hint")

    // Interactive again, with a token cached: no browser, the cached token (Edge calls this even
    // when silent would do; the OneDrive client sends its fields without authParameters).
    h.listeners.lastAuthorizationURL.withLock { $0 = nil }
    let again = try await call(
      front, "acquireTokenInteractively",
      json(["clientId": "app1", "requestedScopes": ["read"], "username": "alice@idp.test", "redirectUri": "x"]))
    XCTAssertEqual(
      (again["brokerTokenResponse"] as? [String: Any])?["accessToken"] as? String, token["accessToken"] as? String)
    XCTAssertNil(h.listeners.lastAuthorizationURL.withLock { $0 }, "no browser")
  }

  func testAccessTokenToRenewForcesARefreshOnlyWhenItIsTheCachedOne() async throws {
    let h = await Harness()
    try await h.signIn()
    let front = front(h)
    let account = try await accounts(front)[0]
    func silent(renewing: String) async throws -> String? {
      let answer = try await call(
        front, "acquireTokenSilently",
        json([
          "authParameters": [
            "account": account, "clientId": "app1", "requestedScopes": ["read"], "accessTokenToRenew": renewing,
          ]
        ]))
      return (answer["brokerTokenResponse"] as? [String: Any])?["accessToken"] as? String
    }
    let stale = try await silent(renewing: "some-older-token")
    XCTAssertEqual(stale, "at-1", "an older token than the cached one: the cached one serves")
    XCTAssertEqual(h.idp.tokenRequests.count, 1)
    let renewed = try await silent(renewing: "at-1")
    XCTAssertEqual(renewed, "at-2")
    XCTAssertEqual(h.idp.tokenRequests.count, 2)
  }

  func testProviderErrorsCarryStatusSubErrorAndCode() async throws {
    let h = await Harness()
    try await h.signIn()
    let front = front(h)
    let account = try await accounts(front)[0]
    let request = json([
      "authParameters": [
        "account": account, "clientId": "app1", "requestedScopes": ["read"], "accessTokenToRenew": "at-1",
      ]
    ])
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [
        HTTPResponse(
          status: 400,
          body: Array(
            #"{"error":"invalid_grant","error_description":"AADSTS50078: Presented multi-factor authentication has expired.","error_codes":[50078],"suberror":"basic_action"}"#
              .utf8))
      ]
    }
    let answer = try await call(front, "acquireTokenSilently", request)
    let response = try XCTUnwrap(answer["brokerTokenResponse"] as? [String: Any], "\(answer)")
    let failure = try XCTUnwrap(response["error"] as? [String: Any])
    XCTAssertEqual(failure["status"] as? Int, 2)
    XCTAssertEqual(failure["errorCode"] as? Int, 50078)
    XCTAssertEqual(response["subError"] as? String, "basic_action")
    XCTAssertTrue((failure["context"] as? String ?? "").contains("AADSTS50078"), "\(failure)")
    XCTAssertEqual(response["expiresOn"] as? Int, 0)
    XCTAssertTrue(failure["diagnostics"] is NSNull)

    h.idp.scriptedTokenAnswers.withLock { $0 = [HTTPResponse(status: 503, body: [])] }
    let unavailable = try await call(front, "acquireTokenSilently", request)
    XCTAssertEqual(error(unavailable)?["status"] as? Int, 5, "ServerTemporarilyUnavailable")
    let kept = try await accounts(front)
    XCTAssertEqual(kept.count, 1, "the account is kept")
  }

  func testTheStatusTable() {
    XCTAssertEqual(MicrosoftBrokerStatus.of(.interactionRequired("x")), .interactionRequired)
    XCTAssertEqual(MicrosoftBrokerStatus.of(.noSuchAccount("x")), .interactionRequired)
    XCTAssertEqual(MicrosoftBrokerStatus.of(.untrustedAuthority("x")), .authorityUntrusted)
    XCTAssertEqual(MicrosoftBrokerStatus.of(.cancelled("x")), .applicationCanceled)
    XCTAssertEqual(
      MicrosoftBrokerStatus.of(.accessDenied("x")), .unexpected, "a forged redirect is not the user's choice")
    XCTAssertEqual(
      MicrosoftBrokerStatus.of(TesseraError(.accessDenied, "x", detail: ErrorDetail(oauthError: "access_denied"))),
      .userCanceled)
    XCTAssertEqual(
      MicrosoftBrokerStatus.of(TesseraError(.network, "x", detail: ErrorDetail(providerAskedToWait: true))),
      .serverTemporarilyUnavailable)
    XCTAssertEqual(MicrosoftBrokerStatus.of(.network("x")), .networkTemporarilyUnavailable)
    XCTAssertEqual(
      MicrosoftBrokerStatus.of(TesseraError(.network, "x", detail: ErrorDetail(unreachable: true))), .noNetwork)
    XCTAssertEqual(
      MicrosoftBrokerStatus.of(TesseraError(.network, "x", detail: ErrorDetail(httpStatus: 429))),
      .serverTemporarilyUnavailable)
    XCTAssertEqual(MicrosoftBrokerStatus.of(.invalidArgument("x")), .apiContractViolation)
    XCTAssertEqual(
      MicrosoftBrokerStatus.of(TesseraError(.invalidArgument, "x", detail: ErrorDetail(oauthError: "invalid_client"))),
      .incorrectConfiguration, "the provider refused the app: not a broken call")
    // A message with quotes, a newline and a control character stays valid JSON.
    let text = MicrosoftBrokerInterface.errorJSON(.provider("a \"b\"\n\\c\u{1}"), tokenMethod: true)
    let parsed = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
    let context = ((parsed?["brokerTokenResponse"] as? [String: Any])?["error"] as? [String: Any])?["context"]
    XCTAssertEqual(context as? String, "a \"b\"\n\\c\u{1}")
  }

  func testBadInputIsApiContractViolationNamingTheField() async throws {
    let h = await Harness()
    try await h.signIn()
    let front = front(h)
    let cases: [(method: String, request: String, version: String, field: String)] = [
      ("getAccounts", "not json", "0.0", "requestJson"),
      ("getAccounts", "[1,2]", "0.0", "requestJson"),
      ("getAccounts", #"{"clientId":5}"#, "0.0", "clientId"),
      ("getAccounts", "{}", "0.0", "clientId"),
      ("getAccounts", #"{"clientId":"app1"}"#, "2.0", "protocolVersion"),
      ("getAccounts", #"{"clientId":"app1"}"#, "", "protocolVersion"),
      ("acquireTokenSilently", #"{"clientId":"app1"}"#, "0.0", "authParameters"),
      ("acquireTokenSilently", #"{"authParameters":[]}"#, "0.0", "authParameters"),
      (
        "acquireTokenSilently", #"{"authParameters":{"clientId":"app1","requestedScopes":"read"}}"#, "0.0",
        "authParameters.requestedScopes"
      ),
      (
        "acquireTokenSilently", #"{"authParameters":{"clientId":"app1","requestedScopes":[1]}}"#, "0.0",
        "authParameters.requestedScopes"
      ),
      (
        "acquireTokenSilently", #"{"authParameters":{"clientId":"app1","requestedScopes":["read"],"account":"x"}}"#,
        "0.0", "authParameters.account"
      ),
      (
        "acquireTokenSilently",
        #"{"authParameters":{"clientId":"app1","requestedScopes":["read"],"decodedClaims":"{not"}}"#, "0.0",
        "authParameters.decodedClaims"
      ),
      (
        "acquireTokenInteractively", #"{"authParameters":{"clientId":"app1","requestedScopes":["a b"]}}"#, "0.0",
        "authParameters.requestedScopes"
      ),
      ("removeAccount", #"{"clientId":"app1"}"#, "0.0", "account"),
      ("getAccounts", String(repeating: "[", count: 5000) + String(repeating: "]", count: 5000), "0.0", "nests"),
    ]
    for c in cases {
      let answer = try await call(front, c.method, c.request, version: c.version)
      let failure = try XCTUnwrap(error(answer), "\(c): \(answer)")
      XCTAssertEqual(failure["status"] as? Int, 6, "\(c): \(answer)")
      let context = failure["context"] as? String ?? ""
      XCTAssertTrue(context.contains(c.field), "\(c.method) \(c.request.prefix(80)): \(context)")
      if c.method.hasPrefix("acquireToken") {
        XCTAssertNotNil(answer["brokerTokenResponse"], "token methods wrap their errors")
      }
    }
    let after = try await accounts(front)
    XCTAssertEqual(after.count, 1, "nothing is lost")
  }

  func testRemoveAccountSignsOutOfThatClientAndDeviceBoundCallsSayWhatTesseraIsNot() async throws {
    let h = await Harness()
    try await h.signIn()
    try await h.signIn(clientID: "app2")
    let front = front(h)
    let account = try await accounts(front)[0]
    let removed = try await call(front, "removeAccount", json(["clientId": "app1", "account": account]))
    XCTAssertTrue(removed.isEmpty, "\(removed)")
    let left = try await accounts(front)
    XCTAssertEqual(left.count, 0)
    let other = try await accounts(front, clientID: "app2")
    XCTAssertEqual(other.count, 1, "other clients keep theirs")
    let again = try await call(front, "removeAccount", json(["clientId": "app1", "account": account]))
    XCTAssertTrue(again.isEmpty, "already removed is fine")

    for method in ["acquirePrtSsoCookie", "generateSignedHttpRequest"] {
      let answer = try await call(front, method, json(["ssoUrl": "https://login.microsoftonline.com/"]))
      let failure = try XCTUnwrap(answer["error"] as? [String: Any], "\(answer)")
      XCTAssertEqual(failure["status"] as? Int, 17, "DeviceNotRegistered")
      XCTAssertTrue((failure["context"] as? String ?? "").contains("Tessera"))
    }
    let version = try await call(front, "getLinuxBrokerVersion", "anything")
    XCTAssertEqual(version["linuxBrokerVersion"] as? String, BrokerInterface.version)
  }

  func testARepeatedSilentCallIsAnsweredOnTheBusThreadUntilAnythingChanges() async throws {
    let h = await Harness()
    try await h.signIn()
    let front = front(h)
    let account = try await accounts(front)[0]
    let request = json(["authParameters": ["account": account, "clientId": "app1", "requestedScopes": ["read"]]])
    func atOnce(_ text: String, version: String = "0.0") -> String? {
      front.answerAtOnce(
        method: "acquireTokenSilently", arguments: [.string(version), .string(""), .string(text)],
        caller: CallerInfo(busName: ":1.9"))
    }
    XCTAssertNil(atOnce(request), "nothing published yet")
    let full = await front.handle(
      method: "acquireTokenSilently", arguments: [.string("0.0"), .string(""), .string(request)],
      caller: CallerInfo(busName: ":1.9"))
    XCTAssertEqual(atOnce(request), full, "the same answer, without the actor")
    XCTAssertNil(atOnce(request, version: "9.0"), "a bad version takes the full path (which refuses it)")
    XCTAssertNil(atOnce(request.replacingOccurrences(of: "read", with: "write")), "another request")
    h.clock.advance(3600)
    XCTAssertNil(atOnce(request), "an expired token is not served from here")
    h.clock.advance(-3600)
    _ = try await call(front, "removeAccount", json(["clientId": "app1", "account": account]))
    XCTAssertNil(atOnce(request), "a sign-out clears what was published")
  }

  func testRemovingAnAccountFromAFamilyAppSticksAndLeavesTheOtherFamilyApps() async throws {
    let h = await Harness()
    h.idp.extraTokenFields.withLock { $0 = #","foci":"1""# }
    try await h.signIn()  // app1, a family member: the family token serves app2 too
    let front = front(h)
    let account = try await accounts(front, clientID: "app2")[0]
    let silent = json(["authParameters": ["account": account, "clientId": "app2", "requestedScopes": ["read"]]])
    let before = try await call(front, "acquireTokenSilently", silent)
    XCTAssertNotNil((before["brokerTokenResponse"] as? [String: Any])?["accessToken"], "\(before)")

    let removed = try await call(front, "removeAccount", json(["clientId": "app2", "account": account]))
    XCTAssertTrue(removed.isEmpty)
    let listed = try await accounts(front, clientID: "app2")
    XCTAssertEqual(listed.count, 0, "app2 no longer sees the account")
    let after = try await call(front, "acquireTokenSilently", silent)
    XCTAssertEqual(error(after)?["status"] as? Int, 2, "and gets no token for it: \(after)")
    let family = try await accounts(front, clientID: "app1")
    XCTAssertEqual(family.count, 1, "the family's other apps keep it")

    // Across a restart (the note is in the store) ...
    let config = await h.broker.config
    let reloaded = Broker(
      config: config,
      dependencies: BrokerDependencies(
        http: h.idp, store: h.store, browser: RecordingBrowser(listeners: h.listeners, idp: h.idp),
        listeners: h.listeners, events: h.events, clock: h.clock),
      logger: Logger(label: "test"))
    let reloadedFront = MicrosoftFront(broker: reloaded, logger: Logger(label: "test"), clock: h.clock)
    let stillGone = try await accounts(reloadedFront, clientID: "app2")
    XCTAssertEqual(stillGone.count, 0)
    // ... until app2 signs the account in again.
    _ = try await reloaded.signIn(
      try h.request(clientID: "app2"), caller: CallerInfo(busName: ":1.5"))
    let back = try await accounts(reloadedFront, clientID: "app2")
    XCTAssertEqual(back.count, 1)
  }

  func testAStaleHomeAccountIdNamesNoAccountEvenWhenTheUsernameMatchesOne() async throws {
    let h = await Harness()
    try await h.signIn()
    let front = front(h)
    let account = try await accounts(front)[0]
    for home in ["gone.account", (account["homeAccountId"] as! String).uppercased()] {
      let answer = try await call(
        front, "acquireTokenSilently",
        json([
          "authParameters": [
            "account": ["homeAccountId": home, "username": account["username"]!], "clientId": "app1",
            "requestedScopes": ["read"],
          ]
        ]))
      XCTAssertEqual(error(answer)?["status"] as? Int, 2, "\(home): \(answer)")
      let removed = try await call(
        front, "removeAccount",
        json(["clientId": "app1", "account": ["homeAccountId": home, "username": account["username"]!]]))
      XCTAssertTrue(removed.isEmpty)
    }
    let kept = try await accounts(front)
    XCTAssertEqual(kept.count, 1, "nothing was removed through a stale id")
  }

  func testAScopeTheProviderDidNotGrantIsReportedDeclined() async throws {
    let h = await Harness()  // the fake provider grants "read" whatever is asked
    let front = front(h)
    let answer = try await call(
      front, "acquireTokenInteractively",
      json(["authParameters": ["clientId": "app1", "requestedScopes": ["Read", "write", "openid"], "isSignIn": true]]))
    let token = try XCTUnwrap(answer["brokerTokenResponse"] as? [String: Any], "\(answer)")
    XCTAssertEqual(
      token["grantedScopes"] as? String, "Read openid", "write was not granted; Read as the app spelled it")
  }

  func testAnInteractiveSignInThatAsksToAddAnAccountOpensTheBrowser() async throws {
    let h = await Harness()
    try await h.signIn()
    let front = front(h)
    h.listeners.lastAuthorizationURL.withLock { $0 = nil }
    _ = try await call(
      front, "acquireTokenInteractively",
      json(["authParameters": ["account": NSNull(), "clientId": "app1", "requestedScopes": ["read"], "isSignIn": true]])
    )
    XCTAssertNotNil(h.listeners.lastAuthorizationURL.withLock { $0 }, "MSAL's sign-in without a hint shows the browser")
  }

  func testTheBusThreadTableIsBoundedByBytes() async throws {
    let h = await Harness()
    try await h.signIn()
    let front = front(h)
    let account = try await accounts(front)[0]
    for i in 0..<200 {  // 200 distinct padded requests of ~40 KiB each: 8 MB of keys if unbounded
      let request = json([
        "authParameters": [
          "account": account, "clientId": "app1", "requestedScopes": ["read"],
          "padding\(i)": String(repeating: "x", count: 40_000),
        ]
      ])
      _ = await front.handle(
        method: "acquireTokenSilently", arguments: [.string("0.0"), .string(""), .string(request)],
        caller: CallerInfo(busName: ":1.9"))
      XCTAssertLessThanOrEqual(h.broker.fastPath.microsoftBytes, SilentFastPath.maxMicrosoftBytes)
    }
    XCTAssertGreaterThan(h.broker.fastPath.microsoftBytes, 0, "it still publishes")
  }

  func testRealmIsAUUIDStableForTheAccount() {
    let account = Account(
      id: "sub.abc", username: "u", name: "Given Family Name", authority: "https://idp/t", environment: "idp",
      realm: "t", localAccountID: "sub")
    let realm = MicrosoftAccount.realmUUID(account)
    XCTAssertNotNil(UUID(uuidString: realm))
    XCTAssertEqual(realm, MicrosoftAccount.realmUUID(account))
    XCTAssertEqual(Array(realm)[14], "5", "a name-based (version 5) UUID")
    var entra = account
    entra.realm = "72F988BF-86F1-41AF-91AB-2D7CD011DB47"
    XCTAssertEqual(MicrosoftAccount.realmUUID(entra), "72f988bf-86f1-41af-91ab-2d7cd011db47")
    XCTAssertEqual(MicrosoftAccount.names(account.name).given, "Given")
    XCTAssertEqual(MicrosoftAccount.names(account.name).family, "Family Name")
  }
}
