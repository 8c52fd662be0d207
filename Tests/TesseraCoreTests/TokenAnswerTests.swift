import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// Token endpoints that do not answer as Entra does (issue 38 §4): form-encoded answers (GitHub's,
/// unless asked for JSON), OAuth errors with HTTP 200, comma-separated scopes, and RFC 8628's
/// slow_down with the new interval in it. Every token request asks for JSON.
final class TokenAnswerTests: XCTestCase {
  let endpoint = "https://github.com/login/oauth/access_token"

  func parse(_ text: String) throws -> TokenResponse { try TokenResponse.parse(Array(text.utf8), endpoint: endpoint) }

  func refusal(_ text: String) -> TesseraError? {
    do {
      _ = try parse(text)
      return nil
    } catch {
      return error as? TesseraError
    }
  }

  func testAFormEncodedAnswerIsReadAsTheJSONOneAndItsCommaScopesAreSpaced() throws {
    let form = try parse("access_token=gho_16C7e42F292c6912E7710c838347Ae178B4a&scope=repo%2Cgist&token_type=bearer")
    XCTAssertEqual(form.accessToken, "gho_16C7e42F292c6912E7710c838347Ae178B4a")
    XCTAssertEqual(form.scope, "repo gist")
    XCTAssertEqual(form.tokenType, "bearer")
    XCTAssertNil(form.refreshToken)
    let app = try parse(
      "access_token=ghu_a&expires_in=28800&refresh_token=ghr_b&refresh_token_expires_in=15811200&scope=&token_type=bearer"
    )
    XCTAssertEqual(app.expiresIn, 28800)
    XCTAssertEqual(app.refreshToken, "ghr_b")
    let json = try parse(#"{"access_token":"gho_x","scope":"repo,gist","token_type":"bearer"}"#)
    XCTAssertEqual(json.scope, "repo gist")
    XCTAssertEqual(try parse(#"{"access_token":"a","scope":"read write"}"#).scope, "read write", "spaces stay")
  }

  func testAnErrorWithHTTP200IsTheErrorNotAMissingToken() {
    let github = refusal(
      #"{"error":"bad_verification_code","error_description":"The code passed is incorrect or expired.","error_uri":"https://docs.github.com/apps/managing-oauth-apps/troubleshooting-oauth-app-access-token-request-errors/#bad-verification-code"}"#
    )
    XCTAssertEqual(github?.code, .provider)
    XCTAssertTrue(
      github?.message.contains("bad_verification_code: The code passed is incorrect or expired.") == true,
      github?.message ?? "")
    XCTAssertEqual(github?.detail?.oauthError, "bad_verification_code")
    let form = refusal(
      "error=incorrect_client_credentials&error_description=The+client_id+and%2For+client_secret+passed+are+incorrect.")
    XCTAssertEqual(form?.code, .invalidArgument, "GitHub's name for invalid_client: the app registration or secret")
    XCTAssertTrue(form?.message.contains("client_secret_file") == true, form?.message ?? "")
    XCTAssertTrue(
      form?.message.contains("incorrect_client_credentials: The client_id and/or client_secret passed are incorrect.")
        == true, form?.message ?? "")
    XCTAssertEqual(refusal(#"{"error":"invalid_grant"}"#)?.code, .interactionRequired, "a dead refresh token")
    let html = refusal("<html><body>Sign in</body></html>")
    XCTAssertEqual(html?.code, .provider)
    XCTAssertTrue(html?.message.contains("not JSON, nor form-encoded") == true, html?.message ?? "")
    XCTAssertEqual(refusal("")?.code, .provider)
    // JSON that is not an object is no answer, even when its text reads as a form.
    XCTAssertEqual(refusal(#""x&access_token=AT&expires_in=3600""#)?.code, .provider)
    XCTAssertEqual(refusal(#"["access_token=AT"]"#)?.code, .provider)
    // An empty error is no error: the token is read.
    XCTAssertEqual(try parse(#"{"access_token":"a","error":""}"#).accessToken, "a")
    XCTAssertEqual(TokenResponse.refreshToken(in: Array("error=server_error&refresh_token=r2".utf8)), "r2")
  }

  func testAFormEncodedErrorAnswerIsMappedLikeAJSONOne() {
    let mapped = OAuthErrorResponse.map(
      status: 400, body: Array("error=invalid_scope&error_description=unknown+scope".utf8), endpoint: endpoint,
      retryAfter: nil)
    XCTAssertEqual(mapped.code, .invalidArgument)
    XCTAssertTrue(mapped.message.contains("invalid_scope: unknown scope"), mapped.message)
    XCTAssertEqual(OAuthErrorResponse.decode(Array("error=slow_down&interval=10".utf8))?.intervalSeconds, 10)
    XCTAssertNil(OAuthErrorResponse.decode(Array("access_token=a".utf8)), "no error in a token")
  }

  /// GitHub's device flow: pending and slow_down come with HTTP 200, slow_down with the new
  /// interval; the token form-encoded.
  func testTheDeviceFlowReadsErrorsWithHTTP200AndSlowsDownToTheIntervalGiven() async throws {
    let h = await Harness()
    let idToken = try await h.idp.idToken(nonce: nil, clientID: "app1")
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [
        HTTPResponse(status: 200, body: Array("error=authorization_pending".utf8)),
        HTTPResponse(
          status: 200,
          body: Array(#"{"error":"slow_down","error_description":"Too many requests.","interval":15}"#.utf8)),
        HTTPResponse(status: 200, body: Array("error=slow_down".utf8)),
        HTTPResponse(
          status: 200,
          body: Array("access_token=gho_device&token_type=bearer&scope=read%2Cwrite&id_token=\(idToken)".utf8)),
      ]
    }
    let result = try await h.broker.acquireTokenInteractive(
      try h.request(options: ["flow": .string("device_code")]), caller: CallerInfo(busName: ":1.7"))
    XCTAssertEqual(result["access_token"], .string("gho_device"))
    XCTAssertEqual(
      h.clock.sleeps.withLock { $0 }, [5, 5, 15, 20],
      "pending keeps 5 s; slow_down takes the 15 s given; a bare slow_down adds 5 s")
    let posts = h.idp.requests.withLock { $0 }.filter { $0.method == "POST" }
    XCTAssertFalse(posts.isEmpty)
    for post in posts {
      XCTAssertTrue(
        post.headers.contains { $0.0.lowercased() == "accept" && $0.1 == "application/json" },
        "\(post.url) asks for JSON")
    }
  }
}
