import XCTest

@testable import TesseraInterface

/// config.toml's one check, which tesserad and the CLI share: every mistake is an error with the
/// file, the line and the key, and a mistyped name gets the nearest known one.
final class BrokerConfigTests: XCTestCase {
  func problems(_ text: String, file: StaticString = #filePath, line: UInt = #line) -> [String] {
    do {
      let config = try BrokerConfig.parse(text, path: "c.toml")
      XCTFail("expected problems, got \(config)", file: file, line: line)
      return []
    } catch {
      return error.problems.map(\.description)
    }
  }

  func testEveryKeyIsReadIntoItsSetting() throws {
    let config = try BrokerConfig.parse(
      """
      default_authority = "https://idp.example.com/realms/acme"
      default_client_id = "app"
      default_scopes = ["read", "write"]
      trusted_authorities = ["https://idp.example.com/", "http://127.0.0.1:8080"]
      ca_file = "/etc/ca.pem"
      ca_file_for_microsoft = true
      browser = "firefox --new-window"
      redirect_port = 8400
      allow_insecure_loopback = true
      log_level = "debug"
      client_capabilities = ["cp1"]
      microsoft_broker = false
      access_mode = "strict"
      notify_first_use = false
      store = "file"

      [[git]]
      url = "https://git.example.com/team/"
      """)
    var expected = BrokerConfig()
    expected.defaultAuthority = "https://idp.example.com/realms/acme"
    expected.defaultClientID = "app"
    expected.defaultScopes = ["read", "write"]
    expected.trustedAuthorities = ["https://idp.example.com/", "http://127.0.0.1:8080"]
    expected.caFile = "/etc/ca.pem"
    expected.caFileForMicrosoft = true
    expected.browser = "firefox --new-window"
    expected.redirectPort = 8400
    expected.allowInsecureLoopback = true
    expected.logLevel = "debug"
    expected.clientCapabilities = ["cp1"]
    expected.microsoftBroker = false
    expected.accessMode = .strict
    expected.notifyFirstUse = false
    expected.store = .only(.file)
    var rule = GitCredentialRule(host: "git.example.com", pathPrefix: "team", line: 17)
    rule.file = "config.toml"
    expected.gitRules = [rule]
    XCTAssertEqual(config, expected)
    // The key table is the enum: every key above is in it, and nothing else.
    XCTAssertEqual(Set(BrokerConfig.keys).count, 16)
  }

  func testAnEmptyFileIsTheDefaults() throws {
    XCTAssertEqual(try BrokerConfig.parse("# nothing\n"), BrokerConfig())
  }

  func testAMistypedKeyGetsTheNearestKnownOne() {
    XCTAssertEqual(
      problems("default_client_id = \"x\"\ndefault_scope = [\"read\"]\n"),
      ["c.toml:2: key 'default_scope': unknown key; did you mean 'default_scopes'?"])
    XCTAssertEqual(
      problems("Log_Levle = \"debug\"\n"), ["c.toml:1: key 'Log_Levle': unknown key; did you mean 'log_level'?"])
    XCTAssertEqual(problems("stor = \"file\"\n"), ["c.toml:1: key 'stor': unknown key; did you mean 'store'?"])
    XCTAssertEqual(
      problems("client-id = \"x\"\n"),
      [
        "c.toml:1: key 'client-id': unknown key; known keys are "
          + BrokerConfig.keys.joined(separator: ", ")
      ])
  }

  func testAnUnknownTableIsAnErrorWithASuggestion() {
    XCTAssertEqual(
      problems("log_level = \"info\"\n\n[[gti]]\nurl = \"git.example.com\"\n"),
      ["c.toml:3: table [[gti]]: unknown table; did you mean [[git]]?"])
    XCTAssertEqual(
      problems("[[kubernetes]]\nserver = \"x\"\n"),
      ["c.toml:1: table [[kubernetes]]: unknown table; the only tables are [[git]], [[provider]]"])
  }

  func testMistakesInGitEntriesAreErrorsNamingTheirLine() {
    XCTAssertEqual(
      problems("[[git]]\nurl = \"git.example.com\"\nscope = [\"repo\"]\n"),
      ["c.toml:3: [[git]] key 'scope': unknown key; did you mean 'scopes'?"])
    XCTAssertEqual(
      problems("[[git]]\nurl = \"h\"\nclientid = \"a\"\n"),
      ["c.toml:3: [[git]] key 'clientid': unknown key; did you mean 'client_id'?"])
    XCTAssertEqual(
      problems("[[git]]\nurl = \"h\"\ncolour = 1\n"),
      [
        "c.toml:3: [[git]] key 'colour': unknown key; a [[git]] entry takes url, client_id, authority, scopes, username, account"
      ])
    XCTAssertEqual(
      problems("[[git]]\nclient_id = \"a\"\n"),
      [
        "c.toml:1: [[git]] has no url; write the host or URL prefix it is for, e.g. url = \"https://git.example.com/\""
      ])
    XCTAssertEqual(
      problems("[[git]]\nurl = \"http://git.example.com/\"\n")[0].prefix(28), "c.toml:1: [[git]] key 'url':")
  }

  func testEveryProblemIsReportedInTheOrderOfItsLines() {
    XCTAssertEqual(
      problems(
        """
        default_scope = ["a"]
        redirect_port = 70000
        [[gti]]
        [[git]]
        urll = "x"
        """),
      [
        "c.toml:1: key 'default_scope': unknown key; did you mean 'default_scopes'?",
        "c.toml:2: key 'redirect_port': must be a port number 0–65535",
        "c.toml:3: table [[gti]]: unknown table; did you mean [[git]]?",
        "c.toml:5: [[git]] key 'urll': unknown key; did you mean 'url'?",
      ])
  }

  func testTypesValuesAndRanges() {
    let cases: [(String, String)] = [
      ("default_authority = 1", "key 'default_authority': must be a string URL"),
      ("default_authority = \"login.microsoftonline.com/common\"", "is not an absolute URL"),
      ("default_authority = \"https://h/t?x=1\"", "must not have a query or fragment"),
      ("default_client_id = true", "key 'default_client_id': must be a string"),
      ("default_scopes = \"read\"", "key 'default_scopes': must be an array of strings"),
      ("client_capabilities = [1]", "key 'client_capabilities': must be an array of strings"),
      ("trusted_authorities = [\"ftp://h/\"]", "the scheme must be https"),
      ("trusted_authorities = [\"https://u:p@h/\"]", "must not contain credentials"),
      ("ca_file = \"ca.pem\"", "key 'ca_file': must be an absolute path"),
      ("ca_file_for_microsoft = \"yes\"", "must be true or false"),
      ("browser = \"  \"", "key 'browser': must be a non-empty command"),
      ("redirect_port = -1", "must be a port number 0–65535"),
      ("redirect_port = \"8400\"", "must be a port number 0–65535"),
      ("allow_insecure_loopback = 1", "must be true or false"),
      ("log_level = \"verbose\"", "must be one of trace, debug, info, notice, warning, error, critical"),
      ("microsoft_broker = \"no\"", "must be true or false"),
      ("access_mode = \"closed\"", "must be one of open, confirm, strict"),
      ("notify_first_use = 0", "must be true or false"),
      ("store = \"keyring\"", "key 'store': must be one of auto, secret-service, file, memory"),
      ("store = true", "key 'store': must be one of auto, secret-service, file, memory"),
    ]
    for (text, expected) in cases {
      let found = problems("\n" + text + "\n")
      XCTAssertEqual(found.count, 1, text)
      XCTAssertTrue(found.first?.hasPrefix("c.toml:2: ") == true, "\(text): \(found)")
      XCTAssertTrue(found.first?.contains(expected) == true, "\(text): \(found)")
    }
  }

  func testASyntaxErrorComesAloneWithItsLine() {
    XCTAssertEqual(problems("default_scope = [\"a\"]\nlog_level = = 1\n").count, 1)
    XCTAssertTrue(problems("default_scope = [\"a\"]\nlog_level = = 1\n")[0].hasPrefix("c.toml:2: "))
  }

  func testAKeyWithControlCharactersIsShownOnOneLine() {
    let found = problems("\"evil\\nline\" = 1\n")
    XCTAssertEqual(found.count, 1)
    XCTAssertFalse(found[0].contains("\n"), found[0])
  }

  func testNearestNames() {
    let keys = BrokerConfig.keys
    XCTAssertEqual(NearestName.nearest(to: "default_scope", among: keys), "default_scopes")
    XCTAssertEqual(NearestName.nearest(to: "defualt_authority", among: keys), "default_authority")  // a swap
    XCTAssertEqual(NearestName.nearest(to: "LOG_LEVEL", among: keys), "log_level")
    XCTAssertEqual(NearestName.nearest(to: "gti", among: ["git"]), "git")
    XCTAssertEqual(NearestName.nearest(to: "gt", among: ["git"]), "git")
    // Too far to be a typo: no guess.
    XCTAssertNil(NearestName.nearest(to: "colour", among: keys))
    XCTAssertNil(NearestName.nearest(to: "mail", among: ["git"]))
    XCTAssertNil(NearestName.nearest(to: "gx", among: ["git"]))
    XCTAssertNil(NearestName.nearest(to: String(repeating: "x", count: 100_000), among: keys))
    XCTAssertEqual(NearestName.editDistance(Array("ca"), Array("abc")), 3)
    XCTAssertEqual(NearestName.editDistance(Array("abcd"), Array("acbd")), 1)
    XCTAssertEqual(NearestName.editDistance(Array(""), Array("abc")), 3)
  }

  func testAuthoritySyntax() {
    for good in [
      "https://login.microsoftonline.com/common", "http://127.0.0.1:8080/t", "https://[::1]:8443/r",
      "https://idp.example.com", "https://idp.example.com/realms/a%20b/",
    ] {
      XCTAssertNil(AuthoritySyntax.problem(good), good)
    }
    let bad: [(String, String)] = [
      ("", "it is not an absolute URL"), ("idp.example.com/t", "it is not an absolute URL"),
      ("https:///t", "it is not an absolute URL"), ("https://h:65536/t", "it is not an absolute URL"),
      ("https://exa mple.com/t", "it is not an absolute URL"), ("https://h/%zz", "it is not an absolute URL"),
      ("ftp://h/t", "the scheme must be https"), ("https://h/t#x", "it must not have a query or fragment"),
      ("https://u@h/t", "it must not contain credentials"), ("https://h/a/../b", "'.' or '..' segments"),
      ("https://h/%2E%2e/b", "'.' or '..' segments"), ("https://h/a%2F..%2Fb", "'.' or '..' segments"),
    ]
    for (text, why) in bad {
      XCTAssertTrue(
        AuthoritySyntax.problem(text)?.contains(why) == true,
        "\(text): \(String(describing: AuthoritySyntax.problem(text)))")
    }
  }

  func testTheLocationIsTesseradsAndOnlyANamedFileMustExist() {
    let env = ["HOME": "/h", "XDG_CONFIG_HOME": "/x"]
    XCTAssertEqual(ConfigLocation.path(option: nil, environment: env), "/x/tessera/config.toml")
    XCTAssertEqual(
      ConfigLocation.path(option: nil, environment: ["HOME": "/h", "XDG_CONFIG_HOME": "rel"]),
      "/h/.config/tessera/config.toml")
    XCTAssertEqual(
      ConfigLocation.path(option: nil, environment: env.merging(["TESSERA_CONFIG": "/t.toml"]) { $1 }), "/t.toml")
    XCTAssertEqual(
      ConfigLocation.path(option: "/o.toml", environment: env.merging(["TESSERA_CONFIG": "/t.toml"]) { $1 }), "/o.toml")
    XCTAssertFalse(ConfigLocation.isNamed(option: nil, environment: env))
    XCTAssertTrue(ConfigLocation.isNamed(option: "/o.toml", environment: env))
    XCTAssertTrue(ConfigLocation.isNamed(option: nil, environment: ["TESSERA_CONFIG": "/t.toml"]))
  }
}
