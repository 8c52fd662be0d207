import TesseraInterface
import XCTest

@testable import TesseraCLI

/// The [[git]] tables of config.toml and git-credential(1)'s lines, as git writes and reads them.
final class GitCredentialTests: XCTestCase {
  func rules(_ text: String) throws -> [GitCredentialRule] {
    try GitCredentialRule.rules(in: try ConfigFile(parsing: text))
  }

  func request(_ text: String) throws -> GitCredentialRequest { try GitCredentialRequest(parsing: text) }

  func testTablesAfterTopLevelSettingsAreRead() throws {
    let file = try ConfigFile(
      parsing: """
        default_client_id = "x"

        [[git]]
        url = "https://git.example.com/team/"
        client_id = "app"
        scopes = ["repo", "read"]

        [[git]]
        url = "gitea.example.org"
        username = "oauth2"
        """)
    XCTAssertEqual(file.entries.map(\.key), ["default_client_id"])
    let rules = try GitCredentialRule.rules(in: file)
    XCTAssertEqual(rules.count, 2)
    XCTAssertEqual(rules[0].host, "git.example.com")
    XCTAssertEqual(rules[0].pathPrefix, "team")
    XCTAssertEqual(rules[0].scopes, ["repo", "read"])
    XCTAssertEqual(rules[0].line, 3)
    XCTAssertEqual(rules[1].host, "gitea.example.org")
    XCTAssertEqual(rules[1].username, "oauth2")
    XCTAssertEqual(rules[1].clientID, "")
  }

  func testBadEntriesAreRefusedWithTheirLine() {
    let cases: [(String, Int, String)] = [
      ("[[git]]\nclient_id = \"a\"", 1, "has no url"),
      ("[[git]]\nurl = \"http://git.example.com\"", 1, "not an https URL"),
      ("[[git]]\nurl = \"https://user@git.example.com\"", 1, "not an https URL"),
      ("[[git]]\nurl = \"h\"\nscope = [\"a\"]", 3, "unknown key"),
      ("[[git]]\nurl = \"h\"\nscopes = \"a\"", 3, "array of scope strings"),
      ("[[git]]\nurl = \"h\"\nusername = \"a\\nb\"", 3, "printable"),
    ]
    for (text, line, reason) in cases {
      XCTAssertThrowsError(try rules(text), text) { error in
        guard let error = error as? GitCredentialRule.ParseError else { return XCTFail("\(error)") }
        XCTAssertEqual(error.line, line, text)
        XCTAssertTrue(error.reason.contains(reason), "\(text): \(error.reason)")
      }
    }
  }

  func testMatchingIsHttpsSameHostAndPortAndTheLongestPathPrefix() throws {
    let all = try rules(
      """
      [[git]]
      url = "https://git.example.com"
      client_id = "host"
      [[git]]
      url = "https://git.example.com/team/tools/"
      client_id = "team"
      [[git]]
      url = "https://git.example.com:8443/"
      client_id = "port"
      """)
    func best(_ text: String) throws -> String? {
      GitCredentialRule.best(for: try request(text), in: all)?.clientID
    }
    XCTAssertEqual(try best("protocol=https\nhost=git.example.com\n"), "host")
    XCTAssertEqual(try best("protocol=https\nhost=GIT.example.com\npath=team/tools.git\n"), "team")
    XCTAssertEqual(try best("protocol=https\nhost=git.example.com\npath=team/tools/sub\n"), "team")
    XCTAssertEqual(try best("protocol=https\nhost=git.example.com\npath=team/toolsx\n"), "host")
    XCTAssertEqual(try best("protocol=https\nhost=git.example.com:8443\n"), "port")
    XCTAssertNil(try best("protocol=http\nhost=git.example.com\n"), "a token never goes over plain HTTP")
    XCTAssertNil(try best("protocol=https\nhost=evil.example.com\n"))
    XCTAssertNil(try best("protocol=https\nhost=git.example.com.evil.test\n"))
    // Dot segments would walk out of a prefix once the URL is normalised: the narrower entry does
    // not match (the host-wide one covers every path anyway).
    XCTAssertEqual(try best("protocol=https\nhost=git.example.com\npath=team/tools/../../other\n"), "host")
    XCTAssertEqual(try best("protocol=https\nhost=git.example.com\npath=team/tools/%2E%2E/x\n"), "host")
  }

  /// Issue 38 §6: with no [[git]] entry, the provider whose git host it is answers, with the
  /// username its host takes; a [[git]] entry for the host still wins.
  func testAProvidersGitHostNeedsNoEntryAndAnEntryStillWins() throws {
    let providers = try ConfigLayer.parse(
      bytes: Array(
        """
        [[provider]]
        name = "gh"
        profile = "github"
        client_id = "Iv1.a"

        [[provider]]
        name = "work"
        profile = "gitlab"
        host = "git.corp.example"
        client_id = "gl"

        [[provider]]
        name = "bb"
        profile = "bitbucket"
        client_id = "b"
        client_secret_file = "/s"

        [[provider]]
        name = "mail"
        profile = "google"
        client_id = "g"
        client_secret_file = "/s"
        """.utf8), path: "/c.toml", isSystem: false
    ).providers
    func rule(_ host: String, _ scheme: String = "https") throws -> GitCredentialRule? {
      GitCredentialRule.fromProviders(for: try request("protocol=\(scheme)\nhost=\(host)\n"), in: providers)
    }
    let github = try XCTUnwrap(try rule("github.com"))
    XCTAssertEqual(github.authority, "https://github.com")
    XCTAssertEqual(github.clientID, "Iv1.a")
    XCTAssertEqual(github.scopes, ["repo"])
    XCTAssertNil(github.username, "GitHub takes any username: the account's")
    XCTAssertEqual(try rule("GIT.corp.example")?.username, "oauth2")
    XCTAssertEqual(try rule("git.corp.example")?.authority, "https://git.corp.example")
    XCTAssertEqual(try rule("bitbucket.org")?.username, "x-token-auth")
    XCTAssertNil(try rule("gitlab.com"), "the gitlab provider is for git.corp.example")
    XCTAssertNil(try rule("accounts.google.com"), "Google is no git host")
    XCTAssertNil(try rule("github.com", "http"), "never over plain http")
    let entries = try rules("[[git]]\nurl = \"github.com\"\nclient_id = \"mine\"\n")
    XCTAssertEqual(
      GitCredentialRule.best(for: try request("protocol=https\nhost=github.com\n"), in: entries)?.clientID, "mine")
  }

  func testAnswersAsGitReadsThem() throws {
    let answer = GitCredentialAnswer(username: "alice", accessToken: "at-1", expiresOn: 1_800_000_000)
    XCTAssertEqual(
      answer.lines(for: try request("protocol=https\nhost=h\n\n")),
      "username=alice\npassword=at-1\npassword_expiry_utc=1800000000\n")
    // git 2.46+ announces authtype: a Bearer credential it must not store, when the server
    // offers Bearer; a server offering Basic only gets the token as the password.
    XCTAssertEqual(
      answer.lines(for: try request("capability[]=authtype\nprotocol=https\nhost=h\nwwwauth[]=Basic realm=x\n")),
      "username=alice\npassword=at-1\npassword_expiry_utc=1800000000\n")
    XCTAssertEqual(
      answer.lines(
        for: try request("capability[]=authtype\nprotocol=https\nhost=h\nwwwauth[]=Bearer realm=\"x\"\n")),
      "capability[]=authtype\nauthtype=Bearer\ncredential=at-1\nephemeral=true\npassword_expiry_utc=1800000000\n")
    // A token with a line break would let the IdP add lines of its own: refused.
    XCTAssertNil(
      GitCredentialAnswer(username: "a", accessToken: "x\nurl=https://evil", expiresOn: 1).lines(for: .init()))
    XCTAssertNil(GitCredentialAnswer(username: "a\u{0}", accessToken: "x", expiresOn: 1).lines(for: .init()))
  }

  func testRequestsAreReadUpToTheBlankLine() throws {
    let r = try request(
      "protocol=https\nhost=h:1\npath=a/b\nusername=u\npassword=p\nwwwauth[]=Bearer x\n\nhost=other\n")
    XCTAssertEqual(r.protocol, "https")
    XCTAssertEqual(r.host, "h:1")
    XCTAssertEqual(r.path, "a/b")
    XCTAssertEqual(r.heldToken, "p")
    let url = try request("url=https://u@h.example/x/y\n")
    XCTAssertEqual(url.protocol, "https")
    XCTAssertEqual(url.host, "h.example")
    XCTAssertEqual(url.path, "x/y")
    XCTAssertThrowsError(try request("garbage\n"))
  }
}
