/// Reads config.toml: the part of TOML 1.0 that a file of settings uses.
///
/// Why not TOMLKit: it links full Foundation, ICU and libstdc++ into the daemon for this one read
/// at start-up, about 8 MiB of resident memory, a third of the daemon's idle budget. Tessera's
/// settings are top-level keys whose values are strings, integers, booleans or arrays of them, plus
/// arrays of tables (`[[git]]`) holding the same kind of keys, so this reader takes exactly that
/// part of TOML, to the letter, and refuses everything else with the line and a sentence saying
/// what to write instead; it never guesses.
///
/// Supported: comments; bare and quoted keys; basic strings with every TOML escape; literal
/// strings; decimal, hexadecimal, octal and binary integers with underscores; `true`/`false`;
/// arrays of these over several lines, with comments and a trailing comma; `[[name]]` headers
/// (arrays of tables) and `[name]` headers (a table, once per file: the administrator's
/// `[policy]`). Refused with a message: dotted keys and table names, inline tables, multi-line
/// strings, floats, dates, duplicate keys and tables.
///
/// It lives here, beside the interface, because the command-line helpers read their own tables
/// (`[[git]]`) from the same file without the engine.
public struct ConfigFile: Sendable {
  public enum Value: Equatable, Sendable {
    case string(String)
    case integer(Int64)
    case bool(Bool)
    case array([Value])

    public var string: String? { if case .string(let s) = self { s } else { nil } }
    public var integer: Int64? { if case .integer(let n) = self { n } else { nil } }
    public var bool: Bool? { if case .bool(let b) = self { b } else { nil } }
    public var array: [Value]? { if case .array(let a) = self { a } else { nil } }

    /// An array whose elements are all strings; nil for anything else.
    public var strings: [String]? {
      guard let array else { return nil }
      var out: [String] = []
      for element in array {
        guard let s = element.string else { return nil }
        out.append(s)
      }
      return out
    }
  }

  public struct Entry: Equatable, Sendable {
    public var key: String
    public var value: Value
    public var line: Int
  }

  /// One `[[name]]` table (an element of an array of tables) or `[name]` table: its entries, in
  /// the order written.
  public struct Table: Equatable, Sendable {
    public var name: String
    /// The line of its header.
    public var line: Int
    public var entries: [Entry]
    /// `[[name]]` (true) or `[name]` (false, which TOML allows once per name).
    public var isArray: Bool = true
  }

  public struct SyntaxError: Error, Equatable, Sendable {
    public var line: Int
    public var reason: String
  }

  /// The file's top-level settings in the order written.
  public private(set) var entries: [Entry] = []
  /// The file's `[[name]]` tables in the order written.
  public private(set) var tables: [Table] = []

  public init(parsing text: String) throws(SyntaxError) {
    try self.init(parsing: Array(text.utf8))
  }

  /// Parses the file's bytes. They must be UTF-8, as TOML requires: a file saved in another encoding
  /// is refused with the line of its first bad byte, never read with replacement characters.
  public init(parsing bytes: [UInt8]) throws(SyntaxError) {
    if String(validating: bytes, as: UTF8.self) == nil {
      var line = 1
      for text in bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
        if String(validating: text, as: UTF8.self) == nil { break }
        line += 1
      }
      throw SyntaxError(line: line, reason: "this line is not valid UTF-8; save config.toml as UTF-8")
    }
    var scanner = Scanner(bytes: bytes)
    // TOML keys are equal when their bytes are; Swift's String equality would also join
    // canonically equivalent spellings (precomposed and combining accents).
    var seen: Set<[UInt8]> = []
    var topLevelNames: Set<[UInt8]> = []
    while true {
      try scanner.skipBlankLinesAndComments()
      guard let byte = scanner.peek() else { break }
      let line = scanner.line
      if byte == UInt8(ascii: "[") {
        let isArray = scanner.peek(1) == UInt8(ascii: "[")
        let (open, close) = isArray ? ("[[", "]]") : ("[", "]")
        scanner.index += open.utf8.count
        scanner.skipSpaces()
        let name = try scanner.key()
        scanner.skipSpaces()
        guard scanner.take(UInt8(ascii: "]")), !isArray || scanner.take(UInt8(ascii: "]")) else {
          throw SyntaxError(
            line: line, reason: "expected '\(close)' after '\(open)\(name)'; dotted table names are not used")
        }
        try scanner.endOfLine()
        guard !topLevelNames.contains(Array(name.utf8)) else {
          throw SyntaxError(
            line: line, reason: "'\(name)' is already a setting above; it cannot also be a \(open)\(name)\(close) table"
          )
        }
        // TOML: a [name] table is defined once, and a name is either a table or an array of tables.
        if let earlier = tables.first(where: { Array($0.name.utf8) == Array(name.utf8) }),
          !(isArray && earlier.isArray)
        {
          throw SyntaxError(
            line: line,
            reason: isArray == earlier.isArray
              ? "the table [\(name)] is already written on line \(earlier.line); keep one"
              : "'\(name)' is already a table on line \(earlier.line), written another way; write [[\(name)]] for a list of entries, [\(name)] for one table"
          )
        }
        tables.append(Table(name: name, line: line, entries: [], isArray: isArray))
        seen = []
        continue
      }
      let key = try scanner.key()
      scanner.skipSpaces()
      if scanner.peek() == UInt8(ascii: ".") {
        throw SyntaxError(line: line, reason: "dotted keys are not used in config.toml: write the setting's own name")
      }
      guard scanner.take(UInt8(ascii: "=")) else {
        throw SyntaxError(line: scanner.line, reason: "expected '=' after the key '\(key)'")
      }
      scanner.skipSpaces()
      let value = try scanner.value(depth: 0)
      try scanner.endOfLine()
      guard seen.insert(Array(key.utf8)).inserted else {
        throw SyntaxError(line: line, reason: "the key '\(key)' is set twice; keep one")
      }
      let entry = Entry(key: key, value: value, line: line)
      if tables.isEmpty {
        topLevelNames.insert(Array(key.utf8))
        entries.append(entry)
      } else {
        tables[tables.count - 1].entries.append(entry)
      }
    }
  }

  /// The tables named `name`, in the order written.
  public func tables(named name: String) -> [Table] { tables.filter { $0.name == name } }
}

private struct Scanner {
  let bytes: [UInt8]
  var index = 0
  var line = 1

  init(bytes: [UInt8]) {
    self.bytes = bytes
    // A byte-order mark at the start is allowed by TOML.
    if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { index = 3 }
  }

  func peek(_ offset: Int = 0) -> UInt8? { index + offset < bytes.count ? bytes[index + offset] : nil }

  mutating func take(_ byte: UInt8) -> Bool {
    guard peek() == byte else { return false }
    index += 1
    return true
  }

  func fail(_ reason: String) -> ConfigFile.SyntaxError { ConfigFile.SyntaxError(line: line, reason: reason) }

  mutating func skipSpaces() {
    while let b = peek(), b == UInt8(ascii: " ") || b == UInt8(ascii: "\t") { index += 1 }
  }

  /// TOML allows tab but no other control character in a comment (a CR only before its LF).
  mutating func skipComment() throws(ConfigFile.SyntaxError) {
    guard peek() == UInt8(ascii: "#") else { return }
    while let b = peek(), b != UInt8(ascii: "\n") {
      if b == UInt8(ascii: "\r") && peek(1) == UInt8(ascii: "\n") { return }
      if (b < 0x20 && b != 0x09) || b == 0x7F { throw fail("a comment holds a control character; remove it") }
      index += 1
    }
  }

  /// Consumes a newline (LF or CRLF); false when there is none here.
  mutating func newline() -> Bool {
    if peek() == UInt8(ascii: "\r") && peek(1) == UInt8(ascii: "\n") { index += 1 }
    guard take(UInt8(ascii: "\n")) else { return false }
    line += 1
    return true
  }

  mutating func skipBlankLinesAndComments() throws(ConfigFile.SyntaxError) {
    while true {
      skipSpaces()
      try skipComment()
      if !newline() { return }
    }
  }

  /// After a value: spaces, an optional comment, then a newline or the end.
  mutating func endOfLine() throws(ConfigFile.SyntaxError) {
    skipSpaces()
    try skipComment()
    if peek() == nil || newline() { return }
    throw fail("unexpected text after the value; put one setting per line")
  }

  static func isBareKeyByte(_ b: UInt8) -> Bool {
    (b >= UInt8(ascii: "a") && b <= UInt8(ascii: "z")) || (b >= UInt8(ascii: "A") && b <= UInt8(ascii: "Z"))
      || (b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9")) || b == UInt8(ascii: "_") || b == UInt8(ascii: "-")
  }

  mutating func key() throws(ConfigFile.SyntaxError) -> String {
    switch peek() {
    case UInt8(ascii: "\""): return try basicString()
    case UInt8(ascii: "'"): return try literalString()
    default:
      let start = index
      while let b = peek(), Self.isBareKeyByte(b) { index += 1 }
      guard index > start else { throw fail("expected a setting name (key = value)") }
      return String(decoding: bytes[start..<index], as: UTF8.self)
    }
  }

  /// Arrays nest at most this deep (no setting nests them at all); deeper is refused, not recursed.
  static let maxDepth = 8

  mutating func value(depth: Int) throws(ConfigFile.SyntaxError) -> ConfigFile.Value {
    guard let b = peek(), b != UInt8(ascii: "\n"), b != UInt8(ascii: "\r"), b != UInt8(ascii: "#") else {
      throw fail("a value is missing after '='")
    }
    switch b {
    case UInt8(ascii: "\""): return .string(try basicString())
    case UInt8(ascii: "'"): return .string(try literalString())
    case UInt8(ascii: "["):
      guard depth < Self.maxDepth else { throw fail("arrays nest at most \(Self.maxDepth) deep in config.toml") }
      return try array(depth: depth + 1)
    case UInt8(ascii: "{"): throw fail("inline tables are not used in config.toml")
    default:
      let start = index
      while let c = peek(),
        !(c == UInt8(ascii: " ") || c == UInt8(ascii: "\t") || c == UInt8(ascii: "\n") || c == UInt8(ascii: "\r")
          || c == UInt8(ascii: "#") || c == UInt8(ascii: ",") || c == UInt8(ascii: "]"))
      {
        index += 1
      }
      let word = String(decoding: bytes[start..<index], as: UTF8.self)
      if word == "true" { return .bool(true) }
      if word == "false" { return .bool(false) }
      if let n = Self.integer(word) { return .integer(n) }
      if word.isEmpty { throw fail("a value is missing") }
      throw fail(
        "'\(word)' is not a value Tessera reads: write a \"string\" in quotes, an integer, true, false or [an, array]")
    }
  }

  /// TOML integers: decimal with an optional sign, or 0x / 0o / 0b; `_` only between digits.
  static func integer(_ word: String) -> Int64? {
    var text = Substring(word)
    var radix = 10
    var negative = false
    if text.hasPrefix("0x") || text.hasPrefix("0o") || text.hasPrefix("0b") {
      radix = text.hasPrefix("0x") ? 16 : text.hasPrefix("0o") ? 8 : 2
      text = text.dropFirst(2)
    } else {
      if text.first == "+" || text.first == "-" {
        negative = text.first == "-"
        text = text.dropFirst()
      }
      // No leading zeros in decimal ("007" is not TOML).
      if text.count > 1 && text.first == "0" { return nil }
    }
    guard !text.isEmpty, text.first != "_", text.last != "_", !text.contains("__") else { return nil }
    let digits = text.filter { $0 != "_" }
    guard digits.allSatisfy({ $0.isASCII && $0.isHexDigit }), let magnitude = UInt64(digits, radix: radix) else {
      return nil
    }
    if negative { return magnitude <= UInt64(Int64.max) + 1 ? Int64(truncatingIfNeeded: 0 &- magnitude) : nil }
    return magnitude <= UInt64(Int64.max) ? Int64(magnitude) : nil
  }

  mutating func array(depth: Int) throws(ConfigFile.SyntaxError) -> ConfigFile.Value {
    index += 1  // [
    var values: [ConfigFile.Value] = []
    while true {
      try skipBlankLinesAndComments()
      if take(UInt8(ascii: "]")) { return .array(values) }
      guard peek() != nil else { throw fail("the array is not closed with ']'") }
      values.append(try value(depth: depth))
      try skipBlankLinesAndComments()
      if take(UInt8(ascii: ",")) { continue }
      if take(UInt8(ascii: "]")) { return .array(values) }
      guard peek() != nil else { throw fail("the array is not closed with ']'") }
      throw fail("expected ',' or ']' in the array")
    }
  }

  mutating func literalString() throws(ConfigFile.SyntaxError) -> String {
    if peek(1) == UInt8(ascii: "'") && peek(2) == UInt8(ascii: "'") {
      throw fail("multi-line strings are not used in config.toml; write the value on one line")
    }
    index += 1
    let start = index
    while let b = peek(), b != UInt8(ascii: "'") {
      if b == UInt8(ascii: "\n") || b == UInt8(ascii: "\r") { break }
      try checkControl(b)
      index += 1
    }
    guard take(UInt8(ascii: "'")) else { throw fail("the string is not closed with ' on this line") }
    return try validUTF8(bytes[start..<(index - 1)])
  }

  mutating func basicString() throws(ConfigFile.SyntaxError) -> String {
    if peek(1) == UInt8(ascii: "\"") && peek(2) == UInt8(ascii: "\"") {
      throw fail("multi-line strings are not used in config.toml; write the value on one line")
    }
    index += 1
    var out: [UInt8] = []
    while let b = peek() {
      if b == UInt8(ascii: "\"") {
        index += 1
        return try validUTF8(out[...])
      }
      if b == UInt8(ascii: "\n") || b == UInt8(ascii: "\r") { break }
      if b != UInt8(ascii: "\\") {
        try checkControl(b)
        out.append(b)
        index += 1
        continue
      }
      index += 1
      guard let e = peek() else { break }
      index += 1
      switch e {
      case UInt8(ascii: "b"): out.append(0x08)
      case UInt8(ascii: "t"): out.append(0x09)
      case UInt8(ascii: "n"): out.append(0x0A)
      case UInt8(ascii: "f"): out.append(0x0C)
      case UInt8(ascii: "r"): out.append(0x0D)
      case UInt8(ascii: "\""): out.append(UInt8(ascii: "\""))
      case UInt8(ascii: "\\"): out.append(UInt8(ascii: "\\"))
      case UInt8(ascii: "u"), UInt8(ascii: "U"):
        let count = e == UInt8(ascii: "u") ? 4 : 8
        guard index + count <= bytes.count,
          bytes[index..<(index + count)].allSatisfy({ Character(Unicode.Scalar($0)).isHexDigit }),
          let code = UInt32(String(decoding: bytes[index..<(index + count)], as: UTF8.self), radix: 16),
          let scalar = Unicode.Scalar(code)
        else { throw fail("\\\(Character(Unicode.Scalar(e))) needs \(count) hex digits of a Unicode scalar") }
        out.append(contentsOf: Array(String(Character(scalar)).utf8))
        index += count
      default:
        let shown = (0x21...0x7E).contains(e) ? "\\\(Character(Unicode.Scalar(e)))" : "\\ followed by byte \(e)"
        throw fail("'\(shown)' is not a TOML escape; write '\\\\' for a backslash")
      }
    }
    throw fail("the string is not closed with \" on this line")
  }

  func checkControl(_ b: UInt8) throws(ConfigFile.SyntaxError) {
    if (b < 0x20 && b != 0x09) || b == 0x7F { throw fail("control characters must be escaped in a string") }
  }

  func validUTF8(_ slice: ArraySlice<UInt8>) throws(ConfigFile.SyntaxError) -> String {
    guard let text = String(validating: slice, as: UTF8.self) else { throw fail("the string is not valid UTF-8") }
    return text
  }
}
