import XCTest

@testable import TesseraCore

/// config.toml's errors as the daemon reports them: the file, the line and the key.
final class BrokerConfigFileTests: XCTestCase {
  func testInvalidUTF8IsRefusedWithTheFileAndLine() {
    let bytes = Array("default_client_id = \"x\"\nbrowser = \"/opt/navig".utf8) + [0xE4] + Array("tor\"\n".utf8)
    XCTAssertThrowsError(try BrokerConfig.parse(bytes: bytes, path: "c.toml")) {
      XCTAssertTrue("\($0)".hasPrefix("c.toml:2: "), "\($0)")
    }
  }

  func testSettingErrorsInsideMultiLineArraysNameTheKeysLine() {
    XCTAssertThrowsError(
      try BrokerConfig.parse(
        "log_level = \"info\"\ntrusted_authorities = [\n  \"https://a.example\",\n  42,\n]\n", path: "c.toml")
    ) {
      XCTAssertEqual("\($0)", "c.toml:2: key 'trusted_authorities': must be an array of strings")
    }
  }

  func testGitTablesAreCheckedAtStartButOnlyWarnedAbout() throws {
    let config = try BrokerConfig.parse("default_client_id = \"x\"\n[[git]]\nurl = \"git.example.com\"\n")
    XCTAssertEqual(config.gitRules.map(\.host), ["git.example.com"])
    XCTAssertEqual(config.warnings, [])
    // A typo in a git entry must not take tokens away from every other app: a warning, with its line.
    let bad = try BrokerConfig.parse("default_client_id = \"x\"\n[[git]]\nclient_id = \"a\"\n", path: "c.toml")
    XCTAssertEqual(bad.defaultClientID, "x")
    XCTAssertEqual(bad.gitRules, [])
    XCTAssertEqual(bad.warnings.count, 1)
    XCTAssertTrue(bad.warnings[0].hasPrefix("line 2: "), bad.warnings[0])
    XCTAssertTrue(bad.warnings[0].contains("has no url"), bad.warnings[0])
    let unknown = try BrokerConfig.parse("[[mail]]\nurl = \"x\"\n", path: "c.toml")
    XCTAssertTrue(unknown.warnings.first?.contains("unknown table [[mail]]") == true, "\(unknown.warnings)")
    // The top-level settings stay strict.
    XCTAssertThrowsError(try BrokerConfig.parse("colour = 1\n[[git]]\nurl = \"h\"\n"))
  }
}
