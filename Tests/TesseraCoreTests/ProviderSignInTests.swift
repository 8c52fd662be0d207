import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// Signing in through a `[[provider]]` of config.toml (issue 38): its endpoints, its client
/// secret (in the body or as HTTP Basic), exactly its scopes, and an account named by its user
/// API, its userinfo endpoint or the user when there is no id_token to check.
///
/// The scripted answers follow the providers' published documentation:
/// - GitHub's token answer (form-encoded unless asked for JSON; `scope` comma-separated) and
///   `GET /user` (`id`, `login`): https://docs.github.com/en/apps/oauth-apps/building-oauth-apps/authorizing-oauth-apps
///   and https://docs.github.com/en/rest/users/users#get-the-authenticated-user
/// - Bitbucket's client credentials as HTTP Basic and `GET /2.0/user` (`uuid`, `nickname`; no `username` since 2019):
///   https://developer.atlassian.com/cloud/bitbucket/oauth-2/
/// - GitLab's `GET /api/v4/user` (`id`, `username`): https://docs.gitlab.com/ee/api/users.html
final class ProviderSignInTests: XCTestCase {
  struct FixedSecret: ClientSecretSource {
    func secret(at path: String, shared: Bool) throws -> String {
      guard path == "/secrets/app.secret" else { throw TesseraError(.configuration, "\(path) does not exist") }
      return "s3cr3t/+="
    }
  }

  func harness(_ table: String) async throws -> Harness {
    var config = BrokerConfig.fakeIdP
    config.providers = try ConfigLayer.parse(bytes: Array(table.utf8), path: "/c.toml", isSystem: false).providers
    return await Harness(config: config, secrets: FixedSecret())
  }

  static let github = """
    [[provider]]
    name = "gh"
    profile = "github"
    host = "git.test"
    client_id = "Iv1.app"
    client_secret_file = "/secrets/app.secret"
    """

  func form(_ request: HTTPRequest) -> [String: String] {
    FormEncoding.decode(String(decoding: request.body ?? [], as: UTF8.self))
  }

  func testAGitHubSignInSendsTheSecretAsksForItsScopesAndNamesTheAccountByTheUserAPI() async throws {
    let h = try await harness(Self.github)
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [
        HTTPResponse(
          status: 200,
          body: Array(
            "access_token=ghu_1&token_type=bearer&scope=repo%2Cread%3Auser&expires_in=28800&refresh_token=ghr_1&refresh_token_expires_in=15811200"
              .utf8)),
        HTTPResponse(
          status: 200,
          body: Array(
            #"{"access_token":"ghu_2","token_type":"bearer","expires_in":28800,"refresh_token":"ghr_2","scope":"repo"}"#
              .utf8)),
      ]
    }
    h.idp.scriptedGets.withLock {
      $0["https://git.test/api/v3/user"] = HTTPResponse(
        status: 200, body: Array(#"{"login":"octocat","id":583231,"name":"The Octocat","site_admin":false}"#.utf8))
    }
    let result = try await h.signIn(options: ["provider": .string("gh")])
    XCTAssertEqual(result["access_token"], .string("ghu_1"))
    let account = try XCTUnwrap(result["account"]?.dictValue)
    XCTAssertEqual(account["username"], .string("octocat"))
    XCTAssertEqual(account["authority"], .string("https://git.test"))
    XCTAssertTrue(account["id"]?.stringValue?.hasPrefix("583231.") == true, "\(account)")
    XCTAssertEqual(result["scopes"], .strings(["repo", "read:user"]), "GitHub's commas read as spaces")

    let url = try XCTUnwrap(h.listeners.lastAuthorizationURL.withLock { $0 })
    XCTAssertTrue(url.hasPrefix("https://git.test/login/oauth/authorize?"), url)
    XCTAssertTrue(url.contains("client_id=Iv1.app") && url.contains("scope=repo&"), "exactly its scopes: \(url)")
    XCTAssertFalse(url.contains("openid"), "GitHub knows no OpenID scopes: \(url)")
    let requests = h.idp.requests.withLock { $0 }
    let exchange = try XCTUnwrap(requests.first { $0.url == "https://git.test/login/oauth/access_token" })
    XCTAssertEqual(form(exchange)["client_secret"], "s3cr3t/+=", "client_secret_post")
    XCTAssertEqual(form(exchange)["grant_type"], "authorization_code")
    XCTAssertEqual(form(exchange)["scope"], "repo")
    let user = try XCTUnwrap(requests.first { $0.url == "https://git.test/api/v3/user" })
    XCTAssertTrue(user.headers.contains { $0.0 == "Authorization" && $0.1 == "Bearer ghu_1" })

    // The same provider serves silent calls from the cache, and refreshes with the secret.
    let silent = try await h.broker.acquireTokenSilent(try h.request(options: ["provider": .string("gh")]))
    XCTAssertEqual(silent["access_token"], .string("ghu_1"))
    let refreshed = try await h.broker.acquireTokenSilent(
      try h.request(options: ["provider": .string("gh"), "force_refresh": .bool(true)]))
    XCTAssertEqual(refreshed["access_token"], .string("ghu_2"))
    XCTAssertEqual(refreshed["account"]?.dictValue?["username"], .string("octocat"), "the refresh keeps the account")
    let refresh = try XCTUnwrap(h.idp.requests.withLock { $0 }.last { form($0)["grant_type"] == "refresh_token" })
    XCTAssertEqual(form(refresh)["refresh_token"], "ghr_1")
    XCTAssertEqual(form(refresh)["client_secret"], "s3cr3t/+=")
    let stored = await h.broker.cache.refreshTokens.map(\.secret)
    XCTAssertEqual(stored, ["ghr_2"], "the rotated refresh token replaces the first")
  }

  /// An OpenID provider of config.toml is asked for its scopes and `openid`, never Entra's
  /// `offline_access` (Google and GitLab do not know it); its id_token names the account.
  func testAnOpenIDProviderIsAskedForItsScopesAndOpenIDOnly() async throws {
    let h = try await harness(
      """
      [[provider]]
      name = "oidc"
      issuer = "https://idp.test/tenant1"
      client_id = "app1"
      scopes = ["email"]
      authorization_parameters = ["access_type=offline"]
      """)
    let result = try await h.signIn(options: ["provider": .string("oidc")])
    XCTAssertEqual(result["account"]?.dictValue?["username"], .string("alice@idp.test"), "from the id_token")
    let url = try XCTUnwrap(h.listeners.lastAuthorizationURL.withLock { $0 })
    XCTAssertTrue(url.contains("scope=email%20openid&"), url)
    XCTAssertTrue(url.contains("access_type=offline"), url)
    XCTAssertFalse(url.contains("offline_access"), url)
  }

  /// GitLab's userinfo wants the openid scope; a token without it is named by the user API.
  func testAUserinfoEndpointThatRefusesTheTokenLeavesItToTheUserAPI() async throws {
    let h = try await harness(
      """
      [[provider]]
      name = "gl"
      profile = "gitlab"
      host = "gitlab.test"
      client_id = "app1"
      scopes = ["read_repository"]
      """)
    let jwks = h.idp.jwks.withLock { $0 }
    h.idp.scriptedGets.withLock {
      $0["https://gitlab.test/.well-known/openid-configuration"] = HTTPResponse(
        status: 200,
        body: Array(
          #"{"issuer":"https://gitlab.test","authorization_endpoint":"https://gitlab.test/oauth/authorize","token_endpoint":"https://gitlab.test/oauth/token","jwks_uri":"https://gitlab.test/oauth/discovery/keys","userinfo_endpoint":"https://gitlab.test/oauth/userinfo"}"#
            .utf8))
      $0["https://gitlab.test/oauth/discovery/keys"] = HTTPResponse(status: 200, body: Array(jwks.utf8))
      $0["https://gitlab.test/oauth/userinfo"] = HTTPResponse(
        status: 403, body: Array(#"{"error":"insufficient_scope"}"#.utf8))
      $0["https://gitlab.test/api/v4/user"] = HTTPResponse(
        status: 200, body: Array(#"{"id":7,"username":"ann","name":"Ann"}"#.utf8))
    }
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [
        HTTPResponse(
          status: 200,
          body: Array(#"{"access_token":"glpat","token_type":"Bearer","expires_in":7200,"refresh_token":"glr"}"#.utf8))
      ]
    }
    let result = try await h.signIn(options: ["provider": .string("gl")])
    XCTAssertEqual(result["account"]?.dictValue?["username"], .string("ann"))
    XCTAssertTrue(result["account"]?.dictValue?["id"]?.stringValue?.hasPrefix("7.") == true)
    XCTAssertTrue(h.idp.requests.withLock { $0 }.contains { $0.url == "https://gitlab.test/oauth/userinfo" })
  }

  func testBitbucketSendsTheSecretAsHTTPBasic() async throws {
    let h = try await harness(
      """
      [[provider]]
      name = "bb"
      profile = "bitbucket"
      client_id = "key 1"
      client_secret_file = "/secrets/app.secret"
      discovery = "none"
      authorization_endpoint = "https://bitbucket.test/site/oauth2/authorize"
      token_endpoint = "https://bitbucket.test/site/oauth2/access_token"
      """)
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [
        HTTPResponse(
          status: 200,
          body: Array(
            #"{"access_token":"bb_1","token_type":"bearer","expires_in":7200,"refresh_token":"bbr_1","scopes":"repository"}"#
              .utf8))
      ]
    }
    h.idp.scriptedGets.withLock {
      $0["https://api.bitbucket.org/2.0/user"] = HTTPResponse(
        status: 200,
        body: Array(
          #"{"uuid":"{d301aafa-d676-4ee0-88be-962be7417567}","nickname":"evzijst","account_id":"557058:c0b72ad0"}"#.utf8
        ))
    }
    let result = try await h.signIn(options: ["provider": .string("bb")])
    XCTAssertEqual(result["account"]?.dictValue?["username"], .string("evzijst"))
    let exchange = try XCTUnwrap(h.idp.requests.withLock { $0 }.first { $0.url.hasSuffix("/access_token") })
    // RFC 6749 §2.3.1: the id and the secret are form-encoded, then joined by ':' and base64-encoded.
    let expected = "Basic " + Data("key%201:s3cr3t%2F%2B%3D".utf8).base64EncodedString()
    XCTAssertTrue(exchange.headers.contains { $0.0 == "Authorization" && $0.1 == expected }, "\(exchange.headers)")
    XCTAssertNil(form(exchange)["client_secret"], "not in the body too")
  }

  func testAnAccountWithoutIDTokenOrUserAPIIsNamedByTheUserOrRefused() async throws {
    let h = try await harness(
      """
      [[provider]]
      name = "plain"
      authorization_endpoint = "https://oauth.test/auth"
      token_endpoint = "https://oauth.test/token"
      client_id = "public"
      scopes = ["mail"]
      """)
    let token = HTTPResponse(
      status: 200,
      body: Array(#"{"access_token":"p_1","token_type":"Bearer","expires_in":3600,"refresh_token":"pr_1"}"#.utf8))
    h.idp.scriptedTokenAnswers.withLock { $0 = [token, token] }
    do {
      _ = try await h.signIn(options: ["provider": .string("plain")])
      XCTFail("an account no one named")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .invalidArgument)
      XCTAssertTrue(error.message.contains("tessera login --provider plain --username NAME"), error.message)
    }
    XCTAssertNil(h.listeners.lastAuthorizationURL.withLock { $0 }, "refused before the user signs in for nothing")
    XCTAssertEqual(h.idp.requests.withLock { $0 }.filter { $0.url == "https://oauth.test/token" }.count, 0)
    let accounts = try await h.broker.accounts(matching: AccountFilter())
    XCTAssertEqual(accounts.count, 0, "nothing kept of a sign-in that named no one")
    let named = try await h.signIn(options: ["provider": .string("plain"), "login_hint": .string("ann@mail.test")])
    XCTAssertEqual(named["account"]?.dictValue?["username"], .string("ann@mail.test"))
    let exchange = try XCTUnwrap(h.idp.requests.withLock { $0 }.last { $0.url == "https://oauth.test/token" })
    XCTAssertNil(form(exchange)["client_secret"], "a public client sends no secret")
    XCTAssertFalse(exchange.headers.contains { $0.0 == "Authorization" })
  }

  func testRFC8414MetadataGivesTheEndpointsAndAnUnknownProviderIsNamed() async throws {
    let h = try await harness(
      """
      [[provider]]
      name = "mail"
      discovery = "oauth"
      issuer = "https://auth.test/realm"
      client_id = "desk"
      scopes = ["mail.read"]
      """)
    h.idp.scriptedGets.withLock {
      $0["https://auth.test/.well-known/oauth-authorization-server/realm"] = HTTPResponse(
        status: 200,
        body: Array(
          #"{"issuer":"https://auth.test/realm","authorization_endpoint":"https://auth.test/realm/authorize","token_endpoint":"https://tokens.auth.test/realm/token","userinfo_endpoint":"https://auth.test/realm/me"}"#
            .utf8))
      $0["https://auth.test/realm/me"] = HTTPResponse(
        status: 200, body: Array(#"{"sub":"u-42","preferred_username":"ann","name":"Ann"}"#.utf8))
    }
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [
        HTTPResponse(status: 200, body: Array(#"{"access_token":"m_1","token_type":"Bearer","expires_in":3600}"#.utf8))
      ]
    }
    let result = try await h.signIn(options: ["provider": .string("mail")])
    XCTAssertEqual(result["account"]?.dictValue?["username"], .string("ann"))
    XCTAssertTrue(h.idp.requests.withLock { $0 }.contains { $0.url == "https://tokens.auth.test/realm/token" })

    await XCTAssertThrowsTessera(.invalidArgument) {
      _ = try await h.signIn(options: ["provider": .string("mial")])
    }
    do {
      _ = try await h.broker.acquireTokenSilent(try h.request(options: ["provider": .string("mial")]))
    } catch let error as TesseraError {
      XCTAssertTrue(error.message.contains("There is no provider 'mial'; did you mean 'mail'?"), error.message)
    }
  }

  /// A caller through a forward (a remote host) is not told which providers this machine has,
  /// and no caller is told where a provider's secret file is or what is wrong with it: that goes
  /// to the log.
  func testForwardsAreNotToldTheProvidersAndNoCallerTheSecretFilesPath() async throws {
    struct Unreadable: ClientSecretSource {
      func secret(at path: String, shared: Bool) throws -> String {
        throw TesseraError(.configuration, "\(path) can be read by other users (mode 644)")
      }
    }
    var config = BrokerConfig.fakeIdP
    config.providers = try ConfigLayer.parse(bytes: Array(Self.github.utf8), path: "/c.toml", isSystem: false).providers
    let h = await Harness(config: config, secrets: Unreadable())
    var remote = try h.request(options: ["provider": .string("gj")])
    remote.caller = CallerInfo(
      busName: ":1.7", app: AppIdentity.forward("build01", host: "ann@build01.example", path: "/run/f/build01"))
    do {
      _ = try await h.broker.acquireTokenSilent(remote)
      XCTFail("an unknown provider answered")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .invalidArgument)
      XCTAssertFalse(error.message.contains("gh"), "no provider named to the forward: \(error.message)")
    }
    do {
      _ = try await h.signIn(options: ["provider": .string("gh")])
      XCTFail("signed in without the secret")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .configuration)
      XCTAssertTrue(error.message.contains("client secret of the provider 'gh' cannot be read"), error.message)
      XCTAssertFalse(error.message.contains("/secrets/"), "the path stays in the log: \(error.message)")
    }
  }

  /// A sign-in whose account cannot be named (the userinfo endpoint answers without a `sub`)
  /// keeps nothing and leaves no live grant: the refresh token it was given is revoked.
  func testASignInThatCannotBeNamedRevokesTheGrantItGot() async throws {
    let h = try await harness(
      """
      [[provider]]
      name = "plain"
      authorization_endpoint = "https://oauth.test/auth"
      token_endpoint = "https://oauth.test/token"
      userinfo_endpoint = "https://oauth.test/profile"
      revocation_endpoint = "https://oauth.test/revoke"
      client_id = "public"
      """)
    h.idp.scriptedTokenAnswers.withLock {
      $0 = [
        HTTPResponse(
          status: 200,
          body: Array(#"{"access_token":"p_1","token_type":"Bearer","expires_in":3600,"refresh_token":"pr_1"}"#.utf8))
      ]
    }
    h.idp.scriptedGets.withLock {
      $0["https://oauth.test/profile"] = HTTPResponse(status: 200, body: Array(#"{"username":"ann"}"#.utf8))
    }
    await XCTAssertThrowsTessera(.provider) { _ = try await h.signIn(options: ["provider": .string("plain")]) }
    let revoked = h.idp.requests.withLock { $0 }.filter { $0.url == "https://oauth.test/revoke" }
    XCTAssertEqual(revoked.map { form($0)["token"] }, ["pr_1"])
    let kept = await h.broker.cache.refreshTokens.count
    XCTAssertEqual(kept, 0)
  }
}
