import Synchronization
import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// The identity provider's signing keys failing (issue 12, part 3): reported as what happened
/// (Network when unavailable, Provider when unreadable; not as a bad signature), and before a
/// refresh token leaves, so the IdP never rotates a refresh token into an answer that cannot be
/// checked and would be dropped.
final class SigningKeyFaultTests: XCTestCase {
  /// Answers every request with one status and body.
  struct FixedAnswer: HTTPClient {
    let status: Int
    let body: String
    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
      HTTPResponse(status: status, body: Array(body.utf8))
    }
  }

  let metadata = OIDCMetadata(
    issuer: "https://idp.test/t", authorizationEndpoint: "https://idp.test/t/authorize",
    tokenEndpoint: "https://idp.test/t/token", jwksURI: "https://idp.test/t/jwks", deviceAuthorizationEndpoint: nil,
    revocationEndpoint: nil)

  func testUnavailableKeysAreANetworkErrorAndUnreadableKeysAProviderError() async throws {
    let cases: [(Int, String, TesseraError.Code)] = [
      (503, "", .network), (500, "<html>down</html>", .network), (200, "<html>not a key set</html>", .provider),
    ]
    for (status, body, code) in cases {
      let directory = OIDCDirectory(http: FixedAnswer(status: status, body: body), clock: FakeClock())
      do {
        _ = try await directory.validate(idToken: "a.b.c", metadata: metadata, clientID: "app1", nonce: nil)
        XCTFail("an id_token validated without keys")
      } catch let error as TesseraError {
        XCTAssertEqual(error.code, code, "HTTP \(status): \(error.message)")
        XCTAssertTrue(error.message.contains("signing keys"), error.message)
      }
    }
  }

  func testARefreshWhoseSigningKeysCannotBeReadSendsNoRefreshToken() async throws {
    let first = await Harness()
    try await first.signIn()
    // A restarted daemon: the same keyring, no keys fetched yet, and an IdP whose key set is unreadable.
    let h = await Harness()
    let stored = first.store.items.withLock { $0 }
    h.store.items.withLock { $0 = stored }
    let refreshToken = h.store.secrets(kind: "refresh_token")
    let keys = h.idp.jwks.withLock { $0 }
    h.idp.jwks.withLock { $0 = "<html>not a key set</html>" }
    await XCTAssertThrowsTessera(.provider) {
      _ = try await h.broker.acquireTokenSilent(try h.request(options: ["force_refresh": .bool(true)]))
    }
    XCTAssertEqual(h.idp.tokenRequests.count, 0, "the refresh token never left")
    XCTAssertEqual(h.store.secrets(kind: "refresh_token"), refreshToken)
    // The keys are back: the same refresh token works.
    h.idp.jwks.withLock { $0 = keys }
    _ = try await h.broker.acquireTokenSilent(try h.request(options: ["force_refresh": .bool(true)]))
    XCTAssertEqual(h.idp.tokenRequests.count, 1)
    XCTAssertEqual(h.idp.jwksFetches, 2, "the failed fetch and the good one")
  }
}
