import XCTest

@testable import TesseraInterface

/// The config.toml reader: the TOML a file of top-level settings uses, to the letter, and a
/// line-numbered refusal of everything else.
final class ConfigFileTests: XCTestCase {
  func values(_ text: String) throws -> [String: ConfigFile.Value] {
    Dictionary(uniqueKeysWithValues: try ConfigFile(parsing: text).entries.map { ($0.key, $0.value) })
  }

  func refusal(_ text: String, file: StaticString = #filePath, line: UInt = #line) -> ConfigFile.SyntaxError? {
    do {
      let parsed = try ConfigFile(parsing: text)
      XCTFail("expected a refusal, got \(parsed.entries)", file: file, line: line)
      return nil
    } catch {
      return error
    }
  }

  func testStringsIntegersBooleansAndArrays() throws {
    let v = try values(
      #"""
      # Tessera
      plain = "a \"quoted\" \\ word\tand\u00E9\U0001F511"   # comment after a value
      literal = 'C:\no\escapes "here"'
      "quoted key" = ''
      bare-key_2 = 1_000
      hex = 0xDEAD_beef
      oct = 0o755
      bin = 0b1010
      negative = -42
      plus = +7
      zero = 0
      yes = true
      no = false
      scopes = [
        "User.Read",  # one
        'Mail.Read',
        # a comment line inside
      ]
      nested = [[1, 2], ["x"]]
      empty = [ ]

      """#)
    XCTAssertEqual(v["plain"], .string("a \"quoted\" \\ word\tand\u{E9}\u{1F511}"))
    XCTAssertEqual(v["literal"], .string(#"C:\no\escapes "here""#))
    XCTAssertEqual(v["quoted key"], .string(""))
    XCTAssertEqual(v["bare-key_2"], .integer(1000))
    XCTAssertEqual(v["hex"], .integer(0xDEAD_BEEF))
    XCTAssertEqual(v["oct"], .integer(0o755))
    XCTAssertEqual(v["bin"], .integer(10))
    XCTAssertEqual(v["negative"], .integer(-42))
    XCTAssertEqual(v["plus"], .integer(7))
    XCTAssertEqual(v["zero"], .integer(0))
    XCTAssertEqual(v["yes"], .bool(true))
    XCTAssertEqual(v["no"], .bool(false))
    XCTAssertEqual(v["scopes"], .array([.string("User.Read"), .string("Mail.Read")]))
    XCTAssertEqual(v["nested"], .array([.array([.integer(1), .integer(2)]), .array([.string("x")])]))
    XCTAssertEqual(v["empty"], .array([]))
  }

  func testLineEndingsByteOrderMarkAndLineNumbers() throws {
    let file = try ConfigFile(parsing: "\u{FEFF}a = 1\r\n\r\n# c\r\nb = [\r\n 2,\r\n]\r\nc = 'x'")
    XCTAssertEqual(file.entries.map(\.key), ["a", "b", "c"])
    XCTAssertEqual(file.entries.map(\.line), [1, 4, 7])
  }

  func testRefusalsNameTheLineAndSayWhatToWrite() {
    let cases: [(String, Int, String)] = [
      ("a = 1\n[section]\nb = 2\n[section]", 4, "already written on line 2"),
      ("[[list]]\n[list]", 2, "already a table on line 1, written another way"),
      ("[section.x]", 1, "expected ']'"),
      ("a = 1\n\n[[list]]\nb = 1\nb = 2", 5, "set twice"),
      ("[[git.x]]", 1, "expected ']]'"),
      ("git = 1\n[[git]]", 2, "already a setting"),
      ("server.port = 1", 1, "dotted keys"),
      ("a = { b = 1 }", 1, "inline tables"),
      ("a = \"\"\"\nx\"\"\"", 1, "multi-line strings"),
      ("a = '''x'''", 1, "multi-line strings"),
      ("a = 1.5", 1, "'1.5' is not a value"),
      ("a = 1979-05-27", 1, "'1979-05-27' is not a value"),
      ("a = yes", 1, "'yes' is not a value"),
      ("a = 007", 1, "'007' is not a value"),
      ("a = 1__0", 1, "'1__0' is not a value"),
      ("a = _1", 1, "'_1' is not a value"),
      ("a = 0x", 1, "'0x' is not a value"),
      ("a = -0x1", 1, "'-0x1' is not a value"),
      ("a = 99999999999999999999", 1, "is not a value"),
      ("a = \"open", 1, "not closed"),
      ("a = 'open\nb = 1", 1, "not closed"),
      ("a = \"bad \\q escape\"", 1, "not a TOML escape"),
      ("a = \"\\uD800\"", 1, "hex digits of a Unicode scalar"),
      ("a = \"\\u12\"", 1, "hex digits"),
      ("a = \"tab\u{01}\"", 1, "control characters"),
      ("a = 1 b = 2", 1, "one setting per line"),
      ("a = 1\na = 2", 2, "set twice"),
      ("a =", 1, "value is missing"),
      ("a = # nothing", 1, "value is missing"),
      ("= 1", 1, "expected a setting name"),
      ("a 1", 1, "expected '='"),
      ("a = [1, 2", 1, "not closed with ']'"),
      ("a = [1 2]", 1, "expected ',' or ']'"),
      ("\n\na = [\n1,\n,]", 5, "value is missing"),
      ("a = [\n1,\n2", 3, "not closed with ']'"),
      ("a = [,]", 1, "value is missing"),
      ("a = +0x1", 1, "'+0x1' is not a value"),
      ("a = -9223372036854775809", 1, "is not a value"),
      ("a = \"\\U00110000\"", 1, "hex digits of a Unicode scalar"),
      ("a = 1\r\nb = 2 # x\ry", 2, "control character"),
      ("# \u{7F}", 1, "control character"),
      ("a = 1\rb = 2", 1, "one setting per line"),
      ("a = 1\r\n\r\nb = 'x\r\n", 3, "not closed"),
      ("a = " + String(repeating: "[", count: 5000), 1, "nest at most 8 deep"),
    ]
    for (text, line, reason) in cases {
      guard let error = refusal(text) else { continue }
      XCTAssertEqual(error.line, line, text)
      XCTAssertTrue(error.reason.contains(reason), "\(text): \(error.reason)")
    }
  }

  func testKeysAreComparedByTheirBytes() throws {
    // Precomposed and combining spellings are different TOML keys (Swift's == would join them).
    let v = try ConfigFile(parsing: "\"\u{E9}\" = 1\n\"e\u{301}\" = 2").entries
    XCTAssertEqual(v.map(\.value), [.integer(1), .integer(2)])
  }

  func testInvalidUTF8IsRefusedWithItsLine() {
    // A Latin-1 file: "ä" as the single byte 0xE4.
    let bytes = Array("default_client_id = \"x\"\nbrowser = \"/opt/navig".utf8) + [0xE4] + Array("tor\"\n".utf8)
    XCTAssertThrowsError(try ConfigFile(parsing: bytes)) {
      let error = $0 as! ConfigFile.SyntaxError
      XCTAssertEqual(error.line, 2)
      XCTAssertTrue(error.reason.contains("not valid UTF-8"), error.reason)
    }
  }

  func testIntegerLimits() throws {
    XCTAssertEqual(try values("a = 9223372036854775807")["a"], .integer(Int64.max))
    XCTAssertEqual(try values("a = -9223372036854775808")["a"], .integer(Int64.min))
    XCTAssertNotNil(refusal("a = 9223372036854775808"))
  }
}
