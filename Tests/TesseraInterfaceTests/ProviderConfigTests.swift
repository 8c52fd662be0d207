import XCTest

@testable import TesseraInterface

/// The `[[provider]]` tables of config.toml (issue 38): each built-in profile resolved to the
/// endpoints its provider documents, a table written out, and each mistake a problem naming its
/// line and what to do. The administrator's [policy] over providers.
final class ProviderConfigTests: XCTestCase {
  let path = "/home/ann/.config/tessera/config.toml"

  func providers(_ text: String) throws -> [ProviderConfig] {
    try ConfigLayer.parse(bytes: Array(text.utf8), path: path, isSystem: false).providers
  }

  func one(_ text: String) throws -> ProviderConfig {
    let all = try providers(text)
    XCTAssertEqual(all.count, 1)
    return try XCTUnwrap(all.first)
  }

  /// The problems of a file, as `tessera config check` prints them.
  func problems(_ text: String) -> [String] {
    do {
      _ = try providers(text)
      XCTFail("expected problems in:\n\(text)")
      return []
    } catch let error as ConfigProblems {
      return error.problems.map(\.description)
    } catch {
      XCTFail("\(error)")
      return []
    }
  }

  func testGitHubIsOAuthWithItsEndpointsItsUserAPIAndNoDiscovery() throws {
    let github = try one("[[provider]]\nname = \"gh\"\nprofile = \"github\"\nclient_id = \"Iv1.abc\"\n")
    XCTAssertEqual(github.discovery, .none)
    XCTAssertEqual(github.endpoints.authorization, "https://github.com/login/oauth/authorize")
    XCTAssertEqual(github.endpoints.token, "https://github.com/login/oauth/access_token")
    XCTAssertEqual(github.endpoints.deviceAuthorization, "https://github.com/login/device/code")
    XCTAssertNil(github.endpoints.revocation, "GitHub has no RFC 7009 endpoint")
    XCTAssertEqual(github.revokePage, "https://github.com/settings/connections/applications/{client_id}")
    XCTAssertEqual(
      github.userAPI, ProviderUserAPI(url: "https://api.github.com/user", idField: "id", usernameField: "login"))
    XCTAssertEqual(github.clientAuthentication, .none, "no secret: a public client (the device flow needs none)")
    XCTAssertEqual(github.scopes, ["repo"])
    XCTAssertEqual(github.gitHost, "github.com")
    XCTAssertEqual(github.line, 1)
    XCTAssertEqual(github.file, path)

    let enterprise = try one(
      "[[provider]]\nname = \"corp\"\nprofile = \"github\"\nhost = \"GitHub.Example.com\"\nclient_id = \"x\"\nclient_secret_file = \"/s\"\n"
    )
    XCTAssertEqual(enterprise.endpoints.token, "https://github.example.com/login/oauth/access_token")
    XCTAssertEqual(enterprise.userAPI?.url, "https://github.example.com/api/v3/user", "Enterprise Server's API")
    XCTAssertEqual(enterprise.clientAuthentication, .clientSecretPost, "GitHub takes the secret in the body")
    XCTAssertEqual(enterprise.gitHost, "github.example.com")
  }

  func testEveryProfileResolvesAndSaysWhatItNeeds() throws {
    let gitlab = try one("[[provider]]\nname = \"gl\"\nprofile = \"gitlab\"\nclient_id = \"x\"\n")
    XCTAssertEqual(gitlab.discovery, .openID)
    XCTAssertEqual(gitlab.issuer, "https://gitlab.com")
    XCTAssertEqual(gitlab.gitUsername, "oauth2")
    XCTAssertEqual(gitlab.userAPI?.url, "https://gitlab.com/api/v4/user")
    let selfManaged = try one(
      "[[provider]]\nname = \"gl\"\nprofile = \"gitlab\"\nhost = \"git.corp.example\"\nclient_id = \"x\"\n")
    XCTAssertEqual(selfManaged.issuer, "https://git.corp.example")

    let google = try one(
      "[[provider]]\nname = \"g\"\nprofile = \"google\"\nclient_id = \"x\"\nclient_secret_file = \"/s\"\n")
    XCTAssertEqual(google.issuer, "https://accounts.google.com")
    XCTAssertEqual(google.authorizationParameters, [ProviderParameter(name: "access_type", value: "offline")])
    XCTAssertEqual(google.clientAuthentication, .clientSecretPost)
    XCTAssertNil(google.gitHost, "Google is no git host")

    let bitbucket = try one(
      "[[provider]]\nname = \"bb\"\nprofile = \"bitbucket\"\nclient_id = \"x\"\nclient_secret_file = \"/s\"\n")
    XCTAssertEqual(bitbucket.clientAuthentication, .clientSecretBasic, "Bitbucket takes the secret as HTTP Basic")
    XCTAssertEqual(bitbucket.endpoints.token, "https://bitbucket.org/site/oauth2/access_token")
    XCTAssertEqual(bitbucket.gitUsername, "x-token-auth")
    XCTAssertEqual(bitbucket.userAPI?.idField, "uuid")

    let codeberg = try one("[[provider]]\nname = \"cb\"\nprofile = \"codeberg\"\nclient_id = \"x\"\n")
    XCTAssertEqual(codeberg.issuer, "https://codeberg.org")
    XCTAssertEqual(codeberg.userAPI?.url, "https://codeberg.org/api/v1/user")
    let forgejo = try one(
      "[[provider]]\nname = \"fj\"\nprofile = \"forgejo\"\nhost = \"code.example.org\"\nclient_id = \"x\"\n")
    XCTAssertEqual(forgejo.gitHost, "code.example.org")

    let microsoft = try one("[[provider]]\nname = \"work\"\nprofile = \"microsoft\"\nclient_id = \"x\"\n")
    XCTAssertEqual(microsoft.issuer, "https://login.microsoftonline.com/organizations")
    let tenant = try one(
      "[[provider]]\nname = \"work\"\nprofile = \"microsoft\"\nissuer = \"https://login.microsoftonline.com/contoso.com\"\nclient_id = \"x\"\n"
    )
    XCTAssertEqual(tenant.issuer, "https://login.microsoftonline.com/contoso.com", "issuer names the tenant")
    XCTAssertEqual(
      ProviderProfile.names, ["github", "gitlab", "google", "bitbucket", "gitea", "forgejo", "codeberg", "microsoft"])
  }

  func testAProviderWrittenOutKeepsItsEndpointsSecretMethodAndParameters() throws {
    let plain = try one(
      """
      [[provider]]
      name = "glewlwyd"
      discovery = "none"
      authorization_endpoint = "https://idp.example.com/api/glwd/auth"
      token_endpoint = "https://idp.example.com/api/glwd/token"
      device_authorization_endpoint = "https://idp.example.com/api/glwd/device_authorization"
      revocation_endpoint = "https://idp.example.com/api/glwd/revoke"
      client_id = "client1"
      client_secret_file = "/home/ann/.config/tessera/secrets/glewlwyd.secret"
      client_authentication = "client_secret_post"
      scopes = ["g_profile", "openid"]
      authorization_parameters = ["prompt=consent", "resource=https://api.example.com/"]

      """)
    XCTAssertNil(plain.profile)
    XCTAssertEqual(plain.issuer, "https://idp.example.com", "the token endpoint's origin, without an issuer")
    XCTAssertEqual(plain.endpoints.revocation, "https://idp.example.com/api/glwd/revoke")
    XCTAssertEqual(plain.clientAuthentication, .clientSecretPost)
    XCTAssertTrue(plain.hasSecret)
    XCTAssertEqual(plain.clientSecretFileLine, 9)
    XCTAssertEqual(
      plain.authorizationParameters,
      [
        ProviderParameter(name: "prompt", value: "consent"),
        ProviderParameter(name: "resource", value: "https://api.example.com/"),
      ])
    let metadata = try one(
      "[[provider]]\nname = \"mail\"\ndiscovery = \"oauth\"\nissuer = \"https://auth.mail.example\"\nclient_id = \"x\"\nclient_secret_file = \"/s\"\n"
    )
    XCTAssertEqual(metadata.discovery, .oauth)
    XCTAssertEqual(metadata.clientAuthentication, .clientSecretBasic, "RFC 6749 §2.3.1's default")
    let oidc = try one("[[provider]]\nname = \"idp\"\nissuer = \"https://idp.example.com/realm\"\nclient_id = \"x\"\n")
    XCTAssertEqual(oidc.discovery, .openID, "an issuer alone means OpenID discovery")
    XCTAssertEqual(oidc.clientAuthentication, .none)
  }

  func testEachMistakeIsAProblemWithItsLineAndWhatToDo() {
    let cases: [(String, String)] = [
      (
        "[[provider]]\nname = \"a\"\nprofile = \"githib\"\nclient_id = \"x\"\n",
        ":3: [[provider]] key 'profile': unknown profile; did you mean 'github'?"
      ),
      (
        "[[provider]]\nname = \"a\"\nprofile = \"github\"\nclient_idd = \"x\"\n",
        ":4: [[provider]] key 'client_idd': unknown key; did you mean 'client_id'?"
      ),
      ("[[provider]]\nprofile = \"github\"\nclient_id = \"x\"\n", ":1: [[provider]] has no name"),
      ("[[provider]]\nname = \"a\"\nprofile = \"github\"\n", "'a' has no client_id"),
      ("[[provider]]\nname = \"a b\"\nclient_id = \"x\"\n", "key 'name': 'a b' cannot name a provider"),
      (
        "[[provider]]\nname = \"a\"\ndiscovery = \"none\"\ntoken_endpoint = \"https://x/t\"\nclient_id = \"x\"\n",
        "lacks authorization_endpoint (or device_authorization_endpoint); write them out"
      ),
      (
        "[[provider]]\nname = \"a\"\nauthorization_endpoint = \"https://x/a\"\nclient_id = \"x\"\n",
        "lacks token_endpoint"
      ),
      (
        "[[provider]]\nname = \"a\"\nauthorization_endpoint = \"https://x/a\"\ntoken_endpoint = \"http://x/t\"\nclient_id = \"x\"\n",
        ":4: [[provider]] key 'token_endpoint': 'http://x/t' uses http:, and tokens and secrets go only over https"
      ),
      ("[[provider]]\nname = \"a\"\ndiscovery = \"oauth\"\nclient_id = \"x\"\n", "needs issuer = \"https://…\""),
      (
        "[[provider]]\nname = \"a\"\nprofile = \"google\"\nclient_id = \"x\"\n",
        "google signs in only with the app's client secret"
      ),
      (
        "[[provider]]\nname = \"a\"\nprofile = \"bitbucket\"\nclient_id = \"x\"\n",
        "bitbucket signs in only with the app's client secret"
      ),
      (
        "[[provider]]\nname = \"a\"\nprofile = \"forgejo\"\nclient_id = \"x\"\n",
        "the forgejo profile is for servers of your own; add host"
      ),
      (
        "[[provider]]\nname = \"a\"\nprofile = \"google\"\nhost = \"x.example\"\nclient_id = \"x\"\nclient_secret_file = \"/s\"\n",
        "the google profile has one host"
      ),
      (
        "[[provider]]\nname = \"a\"\nprofile = \"github\"\nclient_id = \"x\"\nclient_authentication = \"client_secret_basic\"\n",
        "has no client_secret_file"
      ),
      (
        "[[provider]]\nname = \"a\"\nprofile = \"github\"\nclient_id = \"x\"\nclient_secret_file = \"s.txt\"\n",
        "must be an absolute path"
      ),
      (
        "[[provider]]\nname = \"a\"\nprofile = \"github\"\nclient_id = \"x\"\nauthorization_parameters = [\"state=1\"]\n",
        "'state' is set by Tessera itself"
      ),
      (
        "[[provider]]\nname = \"a\"\nprofile = \"github\"\nclient_id = \"x\"\nauthorization_parameters = [\"=1\"]\n",
        "is not \"name=value\""
      ),
      (
        "[[provider]]\nname = \"a\"\nprofile = \"github\"\nhost = \"https://x/\"\nclient_id = \"x\"\n",
        "is not a host name"
      ),
      (
        "[[provider]]\nname = \"a\"\nprofile = \"github\"\nclient_id = \"x\"\n\n[[provider]]\nname = \"a\"\nprofile = \"gitlab\"\nclient_id = \"y\"\n",
        ":6: [[provider]] key 'name': 'a' names the provider at line 1 already"
      ),
      ("[provider]\nname = \"a\"\n", "write [[provider]]: each entry is a [[provider]] of its own"),
    ]
    for (text, expected) in cases {
      let found = problems(text)
      XCTAssertTrue(found.contains { $0.contains(expected) }, "expected '\(expected)' in \(found) for:\n\(text)")
      XCTAssertTrue(found.allSatisfy { $0.hasPrefix(path + ":") }, "\(found)")
    }
  }

  func testThePolicyLocksProvidersAndLimitsWhichAreAllowed() throws {
    let admin = try ConfigLayer.parse(
      bytes: Array(
        """
        [[provider]]
        name = "corp"
        profile = "gitlab"
        host = "git.corp.example"
        client_id = "site"

        [policy]
        allowed_providers = ["corp", "gh"]

        """.utf8), path: "/etc/tessera/config.toml", isSystem: true)
    let mine = try ConfigLayer.parse(
      bytes: Array(
        """
        [[provider]]
        name = "corp"
        profile = "github"
        client_id = "mine"

        [[provider]]
        name = "gh"
        profile = "github"
        client_id = "mine"

        [[provider]]
        name = "other"
        profile = "gitlab"
        client_id = "mine"

        """.utf8), path: path, isSystem: false)
    let effective = try EffectiveConfig.combine(system: [admin], user: mine)
    XCTAssertEqual(effective.config.providers.map(\.name), ["corp", "gh"])
    XCTAssertEqual(effective.config.providers.first?.clientID, "site", "the administrator's provider of the name")
    XCTAssertEqual(effective.warnings.count, 2, "\(effective.warnings)")
    XCTAssertTrue(
      effective.warnings[0].hasPrefix(path + ":1: [[provider]] 'corp' is ignored: the administrator's provider"))
    XCTAssertTrue(
      effective.warnings[1].contains("'other' is ignored: it is not among the administrator's allowed_providers"))

    // With the trust locked, a user's provider names only an issuer the administrator trusts.
    let trust = try ConfigLayer.parse(
      bytes: Array(
        "trusted_authorities = [\"https://sso.corp.example/\"]\n\n[policy]\nlocked = [\"trusted_authorities\"]\n".utf8),
      path: "/etc/tessera/config.toml", isSystem: true)
    let users = try ConfigLayer.parse(
      bytes: Array(
        """
        [[provider]]
        name = "evil"
        issuer = "https://evil.example"
        client_id = "x"

        [[provider]]
        name = "sso"
        issuer = "https://SSO.corp.example/realms/dev"
        client_id = "x"

        [[provider]]
        name = "sso-elsewhere"
        discovery = "none"
        issuer = "https://sso.corp.example/realms/dev"
        authorization_endpoint = "https://sso.corp.example/realms/dev/auth"
        token_endpoint = "https://collector.example/token"
        client_id = "x"

        """.utf8), path: path, isSystem: false)
    let trusted = try EffectiveConfig.combine(system: [trust], user: users)
    XCTAssertEqual(trusted.config.providers.map(\.name), ["sso"])
    XCTAssertTrue(
      trusted.warnings.contains { $0.contains("'evil' is ignored: its issuer https://evil.example is not among") })
    XCTAssertTrue(
      trusted.warnings.contains {
        $0.contains("'sso-elsewhere' is ignored: its endpoint https://collector.example/token is not among")
      }, "a trusted issuer does not carry a token endpoint elsewhere: \(trusted.warnings)")

    let locking = try ConfigLayer.parse(
      bytes: Array("[policy]\nlocked = [\"provider\"]\n".utf8), path: "/etc/tessera/config.toml", isSystem: true)
    let locked = try EffectiveConfig.combine(system: [locking], user: mine)
    XCTAssertEqual(locked.config.providers, [])
    XCTAssertEqual(locked.warnings.count, 3)
    XCTAssertTrue(locked.warnings.allSatisfy { $0.contains("locks providers") }, "\(locked.warnings)")
  }
}
