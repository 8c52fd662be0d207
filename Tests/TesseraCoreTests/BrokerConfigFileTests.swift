import TesseraEngineFakes
import TesseraInterface
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

  func testGitTablesAndUnknownTablesStopTheDaemonLikeAnyOtherMistake() throws {
    let config = try BrokerConfig.parse("default_client_id = \"x\"\n[[git]]\nurl = \"git.example.com\"\n")
    XCTAssertEqual(config.gitRules.map(\.host), ["git.example.com"])
    // One rule for the whole file: a mistake in a [[git]] entry, or an unknown table, is an error
    // with its line, as an unknown top-level key is.
    XCTAssertThrowsError(
      try BrokerConfig.parse("default_client_id = \"x\"\n[[git]]\nclient_id = \"a\"\n", path: "c.toml")
    ) {
      XCTAssertTrue("\($0)".hasPrefix("c.toml:2: [[git]] has no url"), "\($0)")
    }
    XCTAssertThrowsError(try BrokerConfig.parse("[[mail]]\nurl = \"x\"\n", path: "c.toml")) {
      XCTAssertEqual("\($0)", "c.toml:1: table [[mail]]: unknown table; the only tables are [[git]], [[provider]]")
    }
    XCTAssertThrowsError(try BrokerConfig.parse("colour = 1\n[[git]]\nurl = \"h\"\n"))
  }

  /// The CLI checks authority URLs without Foundation; whatever that check lets through, the
  /// engine's Authority must parse, and what it refuses, Authority refuses too (so the CLI never
  /// says OK to a file tesserad stops on, nor the other way round).
  func testTheSharedAuthoritySyntaxAgreesWithAuthority() {
    let texts = [
      "https://login.microsoftonline.com/common", "https://LOGIN.microsoftonline.com/Common/",
      "http://127.0.0.1:8080/t",
      "https://[::1]:8443/realm", "https://idp.example.com", "https://idp.example.com/", "https://host:443/a/b/c",
      "https://idp.example.com/realms/a%20b", "https://h/t%2e%2e/x", "https://h/%2e%2e/x", "https://h/a/../b",
      "https://h/./b", "https://u:p@h/t", "https://u@h/t", "https://h/t?x=1", "https://h/t#f", "ftp://h/t",
      "login.microsoftonline.com/common", "", "https://", "https:///t", "https://h:99999/t", "https://h:x/t",
      "https://exa mple.com/t", "https://h/t t", "https://h/t\"", "https://[zz]/t", "//h/t", "https:h/t",
    ]
    for text in texts {
      let shared = AuthoritySyntax.problem(text)
      let engine = Result { try Authority(parsing: text) }
      if shared == nil {
        XCTAssertNoThrow(try engine.get(), "the CLI accepts \(text), the engine does not")
      } else if case .success = engine {
        // The shared check may only be stricter for text no identity provider uses (spaces, quotes).
        XCTAssertTrue(
          text.contains(" ") || text.contains("\"") || text.contains("[zz]") || text.contains(":99999"),
          "the engine accepts \(text), the CLI says: \(shared!)")
      }
    }
  }
}
