import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

final class RequestParserTests: XCTestCase {
  func testUnknownOptionNamesTheKey() {
    XCTAssertThrowsError(
      try RequestParser.tokenRequest(clientID: "c", scopes: [], accountID: "", options: ["colour": .string("x")])
    ) {
      let e = $0 as! TesseraError
      XCTAssertEqual(e.code, .invalidArgument)
      XCTAssertTrue(e.message.contains("'colour'"))
    }
  }

  func testWrongOptionTypeNamesKeyAndType() {
    XCTAssertThrowsError(
      try RequestParser.tokenRequest(
        clientID: "c", scopes: [], accountID: "", options: ["force_refresh": .string("yes")])
    ) {
      let e = $0 as! TesseraError
      XCTAssertEqual(e.code, .invalidArgument)
      XCTAssertTrue(e.message.contains("force_refresh") && e.message.contains("'b'"))
    }
  }

  func testHugeStringsAreRefused() {
    let huge = String(repeating: "a", count: 1 << 20)
    XCTAssertThrowsError(try RequestParser.tokenRequest(clientID: huge, scopes: [], accountID: "", options: [:]))
    XCTAssertThrowsError(try RequestParser.tokenRequest(clientID: "c", scopes: [huge], accountID: "", options: [:]))
    XCTAssertThrowsError(
      try RequestParser.tokenRequest(clientID: "c", scopes: [], accountID: "", options: ["claims": .string(huge)]))
  }

  func testOptionsAreParsed() throws {
    let r = try RequestParser.tokenRequest(
      clientID: "c", scopes: ["User.Read"], accountID: "",
      options: [
        "prompt": .string("login"), "flow": .string("device_code"), "force_refresh": .bool(true),
        "min_validity": .uint32(60), "timeout": .uint32(30), "correlation_id": .string("abc"),
        "extra_query": .stringMap(["msafed": "0"]), "domain_hint": .string("contoso.com"), "login_hint": .string("a@b"),
      ])
    XCTAssertEqual(r.prompt, .login)
    XCTAssertEqual(r.flow, .deviceCode)
    XCTAssertTrue(r.forceRefresh)
    XCTAssertEqual(r.minValidity, 60)
    XCTAssertEqual(r.timeout, 30)
    XCTAssertEqual(r.correlationID, "abc")
    XCTAssertEqual(r.extraQuery, ["msafed": "0"])
    XCTAssertEqual(r.domainHint, "contoso.com")
    XCTAssertEqual(r.loginHint, "a@b")
  }

  func testCorrelationIDIsGeneratedWhenMissing() throws {
    let a = try RequestParser.tokenRequest(clientID: "c", scopes: [], accountID: "", options: [:])
    let b = try RequestParser.tokenRequest(clientID: "c", scopes: [], accountID: "", options: [:])
    XCTAssertEqual(a.correlationID.count, 36)
    XCTAssertNotEqual(a.correlationID, b.correlationID)
    // A lower-case version-4 UUID, as Entra and MSAL write them, so IdP logs can be searched for it.
    var seen = Set<String>()
    for _ in 0..<2000 {
      let id = CorrelationID.new()
      let groups = id.split(separator: "-", omittingEmptySubsequences: false).map(String.init)
      XCTAssertEqual(groups.map(\.count), [8, 4, 4, 4, 12], id)
      XCTAssertTrue(id.allSatisfy { "0123456789abcdef-".contains($0) }, id)
      XCTAssertEqual(groups[2].first, "4", id)
      XCTAssertTrue("89ab".contains(groups[3].first!), id)
      XCTAssertNotNil(UUID(uuidString: id), id)
      seen.insert(id)
    }
    XCTAssertEqual(seen.count, 2000)
  }

  func testBadEnumValuesAndReservedQueryKeys() {
    XCTAssertThrowsError(
      try RequestParser.tokenRequest(clientID: "c", scopes: [], accountID: "", options: ["prompt": .string("always")]))
    XCTAssertThrowsError(
      try RequestParser.tokenRequest(clientID: "c", scopes: [], accountID: "", options: ["flow": .string("magic")]))
    XCTAssertThrowsError(
      try RequestParser.tokenRequest(
        clientID: "c", scopes: [], accountID: "", options: ["extra_query": .stringMap(["state": "x"])]))
    XCTAssertThrowsError(try RequestParser.tokenRequest(clientID: "c\n", scopes: [], accountID: "", options: [:]))
    XCTAssertThrowsError(try RequestParser.tokenRequest(clientID: "c", scopes: ["a b"], accountID: "", options: [:]))
  }

  func testSignOutAndFilter() throws {
    XCTAssertThrowsError(try RequestParser.signOutRequest(accountID: "", options: [:]))
    let r = try RequestParser.signOutRequest(
      accountID: "id", options: ["revoke": .bool(false), "client_id": .string("x")])
    XCTAssertFalse(r.revoke)
    XCTAssertEqual(r.clientID, "x")
    XCTAssertThrowsError(try RequestParser.accountFilter(["tenant": .string("x")]))
    XCTAssertEqual(try RequestParser.accountFilter(["username": .string("a")]).username, "a")
  }
}

final class AuthorityTests: XCTestCase {
  let policy = AuthorityPolicy(
    trusted: [try! Authority(parsing: "https://idp.example.com/realms/x")], allowInsecureLoopback: false)

  func testMicrosoftIsTrustedByDefault() throws {
    let a = try policy.validate("https://login.microsoftonline.com/Common/")
    XCTAssertEqual(a.url, "https://login.microsoftonline.com/Common")
    XCTAssertEqual(a.environment, "login.microsoftonline.com")
    XCTAssertThrowsError(try policy.validate("https://login.microsoftonline.com/")) {
      XCTAssertEqual(($0 as! TesseraError).code, .invalidArgument)
    }
  }

  func testTrustedPrefixOnly() throws {
    XCTAssertNoThrow(try policy.validate("https://idp.example.com/realms/x"))
    XCTAssertThrowsError(try policy.validate("https://idp.example.com/realms/y")) {
      XCTAssertEqual(($0 as! TesseraError).code, .untrustedAuthority)
    }
    XCTAssertThrowsError(try policy.validate("https://idp.example.com.evil.test/realms/x")) {
      XCTAssertEqual(($0 as! TesseraError).code, .untrustedAuthority)
    }
  }

  func testHTTPOnlyForLoopbackWhenAllowed() throws {
    let loopback = try Authority(parsing: "http://127.0.0.1:8080/t")
    XCTAssertThrowsError(
      try AuthorityPolicy(trusted: [loopback], allowInsecureLoopback: false).validate("http://127.0.0.1:8080/t")
    ) {
      XCTAssertEqual(($0 as! TesseraError).code, .untrustedAuthority)
    }
    XCTAssertNoThrow(
      try AuthorityPolicy(trusted: [loopback], allowInsecureLoopback: true).validate("http://127.0.0.1:8080/t"))
    XCTAssertThrowsError(
      try AuthorityPolicy(trusted: [], allowInsecureLoopback: true).validate("http://login.microsoftonline.com/common"))
    XCTAssertEqual(loopback.environment, "127.0.0.1:8080")
  }

  func testMalformedAuthorities() {
    for bad in [
      "", "login.microsoftonline.com/common", "ftp://x/y", "https://x/y?q=1", "https://u:p@x/y", "https://x/../y",
    ] {
      XCTAssertThrowsError(try Authority(parsing: bad), bad)
    }
  }
}

final class ConfigTests: XCTestCase {
  func testFullConfig() throws {
    let config = try BrokerConfig.parse(
      """
      default_authority = "https://login.microsoftonline.com/organizations"
      default_client_id = "abc"
      default_scopes = ["User.Read"]
      trusted_authorities = ["https://idp.example.com"]
      ca_file = "/etc/ca.pem"
      browser = "firefox --new-window"
      redirect_port = 8400
      allow_insecure_loopback = true
      log_level = "debug"
      """)
    XCTAssertEqual(config.defaultClientID, "abc")
    XCTAssertEqual(config.defaultScopes, ["User.Read"])
    XCTAssertEqual(config.redirectPort, 8400)
    XCTAssertTrue(config.allowInsecureLoopback)
    XCTAssertEqual(config.browser, "firefox --new-window")
  }

  func testErrorsNameLineAndKey() {
    XCTAssertThrowsError(try BrokerConfig.parse("log_level = \"info\"\nredirect_port = \"eighty\"\n", path: "c.toml")) {
      XCTAssertEqual("\($0)", "c.toml:2: key 'redirect_port': must be a port number 0–65535")
    }
    XCTAssertThrowsError(try BrokerConfig.parse("\n\ncolour = 1\n", path: "c.toml")) {
      let e = ($0 as! ConfigProblems).problems
      XCTAssertEqual(e.map(\.line), [3])
      XCTAssertEqual(e.map(\.key), ["colour"])
    }
    XCTAssertThrowsError(try BrokerConfig.parse("a = = 1", path: "c.toml")) {
      XCTAssertEqual(($0 as! ConfigProblems).problems.map(\.line), [1])
    }
    XCTAssertThrowsError(try BrokerConfig.parse("default_authority = \"not a url\"", path: "c.toml"))
  }

  func testDefaultPathHonoursXDG() {
    XCTAssertEqual(
      BrokerConfig.defaultPath(environment: ["XDG_CONFIG_HOME": "/x", "HOME": "/h"]), "/x/tessera/config.toml")
    XCTAssertEqual(BrokerConfig.defaultPath(environment: ["HOME": "/h"]), "/h/.config/tessera/config.toml")
  }
}

final class CacheAndScopeTests: XCTestCase {
  func testScopeCoverageIgnoresCaseAndOIDCScopes() {
    XCTAssertTrue(
      ScopeSet.covers(granted: ["user.read", "mail.read"], requested: ["User.Read", "openid", "offline_access"]))
    XCTAssertFalse(ScopeSet.covers(granted: ["user.read"], requested: ["Mail.Send"]))
  }

  func testCacheRoundTripsThroughStoredItemsAndReplacesOverlappingTokens() {
    var cache = TokenCache()
    let account = Account(
      id: "u.t", username: "a", name: "A", authority: "https://x/t", environment: "x", realm: "t", localAccountID: "u")
    var ops = cache.upsert(account: account)
    ops += cache.upsert(
      refreshToken: RefreshTokenRecord(
        accountID: "u.t", environment: "x", clientID: "c", authority: "https://x/t", secret: "rt"))
    let token = AccessTokenRecord(
      accountID: "u.t", environment: "x", realm: "t", clientID: "c", scopes: ["a", "b"], secret: "at",
      tokenType: "Bearer", expiresOn: 10,
      idToken: nil)
    ops += cache.insert(accessToken: token)
    var replacement = token
    replacement.scopes = ["b", "c"]
    replacement.secret = "at2"
    ops += cache.insert(accessToken: replacement)
    XCTAssertEqual(cache.accessTokens.map(\.secret), ["at2"], "overlapping scopes replace the older token")
    var items: [StoredItem] = []
    for op in ops {
      switch op {
      case .save(let item): items.removeAll { $0.attributes == item.attributes }; items.append(item)
      case .delete(let attrs): items.removeAll { i in attrs.allSatisfy { i.attributes[$0.key] == $0.value } }
      }
    }
    let (loaded, skipped) = TokenCache.load(
      items + [StoredItem(attributes: ["tessera_schema": "9"], secret: "{}", label: "")])
    XCTAssertEqual(skipped, 1)
    XCTAssertEqual(loaded.accounts, cache.accounts)
    XCTAssertEqual(loaded.refreshTokens, cache.refreshTokens)
    XCTAssertEqual(loaded.accessTokens, cache.accessTokens)
    XCTAssertFalse(items.contains { $0.label.contains("rt") || $0.label.contains("at2") }, "labels hold no secrets")
  }
}

final class ErrorMappingTests: XCTestCase {
  func testOAuthErrorMapping() {
    func map(_ status: Int, _ body: String) -> TesseraError.Code {
      OAuthErrorResponse.map(status: status, body: Array(body.utf8), endpoint: "e", retryAfter: nil).code
    }
    XCTAssertEqual(map(400, #"{"error":"invalid_grant"}"#), .interactionRequired)
    XCTAssertEqual(map(400, #"{"error":"interaction_required","suberror":"basic_action"}"#), .interactionRequired)
    XCTAssertEqual(map(400, #"{"error":"consent_required"}"#), .interactionRequired)
    XCTAssertEqual(map(500, "oops"), .network)
    XCTAssertEqual(map(429, ""), .network)
    XCTAssertEqual(map(400, "not json"), .provider)
    XCTAssertEqual(map(400, #"{"error":"invalid_client"}"#), .invalidArgument)
  }
}

final class WireTextTests: XCTestCase {
  func testHeaderValuesWithCRLFAreTrimmed() {
    XCTAssertEqual(" 30\r\n".trimmingSpaces(), "30")
    XCTAssertEqual(OAuthErrorResponse.retryAfterSeconds("30\r\n"), 30)
  }

  func testOnlyTheFirstLineOfAnEntraDescriptionIsQuoted() {
    let body =
      #"{"error":"invalid_grant","error_description":"AADSTS700082: The refresh token has expired.\r\nTrace ID: abc\r\nCorrelation ID: def"}"#
    let error = OAuthErrorResponse.map(status: 400, body: Array(body.utf8), endpoint: "e", retryAfter: nil)
    XCTAssertTrue(error.message.contains("The refresh token has expired."))
    XCTAssertFalse(error.message.contains("Trace ID"), error.message)
  }

  /// A `%` without two hex digits after it is text (found by reading for issue 25's fuzz target:
  /// `%+1` used to decode to the byte 0x01, as Swift's integer parser takes a sign, and `%zz`
  /// vanished with the two characters after it).
  func testAPercentSignWithoutTwoHexDigitsStaysAsItIs() {
    XCTAssertEqual(FormEncoding.unescape("a%+1b"), "a% 1b", "the % is text, the + a space")
    XCTAssertEqual(FormEncoding.unescape("a%-0"), "a%-0")
    XCTAssertEqual(FormEncoding.unescape("100%zz"), "100%zz")
    XCTAssertEqual(FormEncoding.unescape("50%"), "50%")
    XCTAssertEqual(FormEncoding.unescape("%4"), "%4")
    XCTAssertEqual(FormEncoding.unescape("%41%4a%4A+%e2%82%AC"), "AJJ €")
    XCTAssertEqual(FormEncoding.decode("state=%+1&code=c%zz"), ["state": "% 1", "code": "c%zz"])
  }
}

/// Text from the IdP or from whoever reached the redirect listener cannot drive a terminal or
/// forge a log line.
final class HostileTextTests: XCTestCase {
  func testControlCharactersAndOverridesAreNeutralisedAndTextIsBounded() {
    let hostile = "denied\n\u{1B}[31mYOUR ACCOUNT IS LOCKED\u{1B}[0m\r\u{202E}txt.exe\u{9B}2J\u{2028}x"
    let clean = SafeText.clip(hostile, limit: 300)
    XCTAssertFalse(clean.unicodeScalars.contains { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) }, clean)
    XCTAssertFalse(clean.contains("\u{202E}") || clean.contains("\u{2028}"))
    XCTAssertTrue(clean.contains("YOUR ACCOUNT IS LOCKED"), "the text itself is kept, only made inert")
    XCTAssertEqual(SafeText.clip(String(repeating: "a", count: 1000), limit: 300).count, 301)
    XCTAssertTrue(SafeText.isClean("https://idp.example/device"))
    XCTAssertFalse(SafeText.isClean("https://idp.example/\u{1B}]8;;"))
  }

  func testAnIdPsErrorAnswerIsMadeSafe() {
    let body =
      #"{"error":"invalid_grant\u001b[2J","error_description":"bad\u001b[31m red\u0007","correlation_id":"c\u001bd"}"#
    let error = OAuthErrorResponse.map(status: 400, body: Array(body.utf8), endpoint: "e", retryAfter: nil)
    XCTAssertFalse(error.message.contains("\u{1B}") || error.message.contains("\u{07}"), error.message)
    XCTAssertTrue(error.message.contains("bad"))
  }

  /// RFC 9207: a redirect naming another issuer is refused; a promised iss must be there.
  func testTheRedirectsIssuerIsChecked() throws {
    var metadata = OIDCMetadata(
      issuer: "https://idp.example", authorizationEndpoint: "https://idp.example/a",
      tokenEndpoint: "https://idp.example/t",
      jwksURI: "https://idp.example/k")
    XCTAssertNoThrow(try Broker.checkIssuer(nil, metadata: metadata))
    XCTAssertNoThrow(try Broker.checkIssuer("https://idp.example", metadata: metadata))
    XCTAssertThrowsError(try Broker.checkIssuer("https://evil.example", metadata: metadata)) {
      XCTAssertEqual(($0 as? TesseraError)?.code, .accessDenied)
    }
    metadata.authorizationResponseIssParameterSupported = true
    XCTAssertThrowsError(try Broker.checkIssuer(nil, metadata: metadata)) {
      XCTAssertTrue(($0 as! TesseraError).message.contains("RFC 9207"))
    }
    let decoded = try JSONDecoder().decode(
      OIDCMetadata.self,
      from: Data(
        #"{"issuer":"i","authorization_endpoint":"a","token_endpoint":"t","jwks_uri":"k","authorization_response_iss_parameter_supported":true}"#
          .utf8))
    XCTAssertEqual(decoded.authorizationResponseIssParameterSupported, true)
  }
}

final class OptionTableUseTests: XCTestCase {
  /// The core's enumerations accept exactly the values the option table documents.
  func testEnumerationsMatchTheTable() {
    XCTAssertEqual(Prompt.allCases.map(\.rawValue), RequestOptions.prompt.values)
    XCTAssertEqual(InteractiveFlow.allCases.map(\.rawValue), RequestOptions.flow.values)
    // min_validity not given: the documented default, for tokens that live 20 minutes or more.
    XCTAssertNil(TokenRequest(clientID: "", scopes: [], correlationID: "c").minValidity)
    XCTAssertEqual(TokenLifetimes.servingMargin(nil, lifetime: 3600), Double(RequestOptions.defaultMinValidity))
    XCTAssertEqual(TokenLifetimes.servingMargin(nil, lifetime: 120), 30)
    XCTAssertEqual(TokenLifetimes.servingMargin(60, lifetime: 120), 60)
  }
}
