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

  func testGitTablesAreCheckedAtStartAndUnknownTablesRefused() throws {
    let config = try BrokerConfig.parse("default_client_id = \"x\"\n[[git]]\nurl = \"git.example.com\"\n")
    XCTAssertEqual(config.gitRules.map(\.host), ["git.example.com"])
    XCTAssertThrowsError(try BrokerConfig.parse("[[git]]\nclient_id = \"a\"\n", path: "c.toml")) {
      XCTAssertTrue("\($0)".hasPrefix("c.toml:1: "), "\($0)")
      XCTAssertTrue("\($0)".contains("has no url"), "\($0)")
    }
    XCTAssertThrowsError(try BrokerConfig.parse("[[mail]]\nurl = \"x\"\n", path: "c.toml")) {
      XCTAssertTrue("\($0)".contains("unknown table [[mail]]"), "\($0)")
    }
  }
}
