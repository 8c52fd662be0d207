import CSystemd
import Glibc
import TesseraInterface

/// Reads and writes `BusValue`s on sd-bus messages. Bus-thread only, like the messages themselves.
package enum BusCodec {
  struct Failure: Error {
    let errno: Int32
    let what: String
  }

  /// A message beyond `WireLimits`: `what` says which limit, for the caller's error message.
  struct OverLimit: Error, CustomStringConvertible {
    let description: String
    /// Which argument (0-based) and, inside a dictionary, which key, when known.
    var argument: Int? = nil
    var key: String? = nil
  }

  /// What is left of a message's limits while it is read.
  struct Budget {
    let limits: WireLimits
    var valuesLeft: Int
    /// The key of the dictionary entry being read (for the error message).
    var key: String? = nil
    init(_ limits: WireLimits) {
      self.limits = limits
      valuesLeft = limits.values
    }
    mutating func take() throws {
      valuesLeft -= 1
      if valuesLeft < 0 { throw OverLimit(description: "more than \(limits.values) values in one message") }
    }
  }

  static func check(_ r: Int32, _ what: @autoclosure () -> String) throws {
    if r < 0 { throw Failure(errno: -r, what: what()) }
  }

  // MARK: Reading

  /// Reads all remaining arguments of `m` within `limits` (throws `OverLimit` as soon as one is
  /// passed, without reading the rest).
  package static func readAll(_ m: OpaquePointer, limits: WireLimits) throws -> [BusValue] {
    var budget = Budget(limits)
    var values: [BusValue] = []
    while try hasMore(m) {
      do {
        values.append(try read(m, &budget))
      } catch var over as OverLimit {
        over.argument = values.count
        over.key = budget.key
        throw over
      }
      budget.key = nil
    }
    return values
  }

  static func hasMore(_ m: OpaquePointer) throws -> Bool {
    var type: CChar = 0
    var contents: UnsafePointer<CChar>?
    let r = sd_bus_message_peek_type(m, &type, &contents)
    try check(r, "peek")
    return r > 0
  }

  /// Reads the next complete value. Variants are unwrapped; types the broker never uses are skipped
  /// and reported as `.other(signature:)`.
  static func read(_ m: OpaquePointer, _ budget: inout Budget) throws -> BusValue {
    try budget.take()
    var type: CChar = 0
    var contents: UnsafePointer<CChar>?
    try check(sd_bus_message_peek_type(m, &type, &contents), "peek")
    // `contents` is compared in place: most values are basic types and need no String for it.
    func contentsAre(_ text: StaticString) -> Bool {
      guard let contents else { return false }
      return text.withUTF8Buffer { expected in
        expected.withMemoryRebound(to: CChar.self) { strncmp(contents, $0.baseAddress!, expected.count) == 0 }
      } && contents[text.utf8CodeUnitCount] == 0
    }
    switch UInt8(bitPattern: type) {
    case UInt8(ascii: "s"), UInt8(ascii: "o"), UInt8(ascii: "g"):
      var p: UnsafePointer<CChar>?
      try check(sd_bus_message_read_basic(m, type, &p), "read string")
      guard let p else { return .string("") }
      let length = strlen(p)
      if length > budget.limits.stringBytes {
        throw OverLimit(description: "a string of \(length) bytes (at most \(budget.limits.stringBytes))")
      }
      // Measured once already: no second strlen. sd-bus validated the UTF-8 as it read it.
      return .string(String(decoding: UnsafeRawBufferPointer(start: p, count: length), as: UTF8.self))
    case UInt8(ascii: "b"):
      var v: Int32 = 0
      try check(sd_bus_message_read_basic(m, type, &v), "read bool")
      return .bool(v != 0)
    case UInt8(ascii: "u"):
      var v: UInt32 = 0
      try check(sd_bus_message_read_basic(m, type, &v), "read u")
      return .uint32(v)
    case UInt8(ascii: "i"):
      var v: Int32 = 0
      try check(sd_bus_message_read_basic(m, type, &v), "read i")
      return .int32(v)
    case UInt8(ascii: "x"):
      var v: Int64 = 0
      try check(sd_bus_message_read_basic(m, type, &v), "read x")
      return .int64(v)
    case UInt8(ascii: "t"):
      var v: UInt64 = 0
      try check(sd_bus_message_read_basic(m, type, &v), "read t")
      return .uint64(v)
    case UInt8(ascii: "d"):
      var v: Double = 0
      try check(sd_bus_message_read_basic(m, type, &v), "read d")
      return .double(v)
    case UInt8(ascii: "v"):
      // Any variant whose content is itself a variant, the first one included (a caller's
      // <<"x">> in an a{sv} must not pass for the documented "s").
      if !budget.limits.nestedVariants, contentsAre("v") {
        throw OverLimit(description: "a variant holding a variant (each value has exactly its documented type)")
      }
      try check(sd_bus_message_enter_container(m, type, contents), "enter variant")
      let inner = try read(m, &budget)
      try check(sd_bus_message_exit_container(m), "exit variant")
      return inner
    case UInt8(ascii: "a") where contentsAre("s"):
      return try readStrings(m, type, contents, &budget)
    case UInt8(ascii: "a") where contentsAre("{ss}") || contentsAre("{sv}"):
      return try readDictionary(m, type, contents, isStringMap: contentsAre("{ss}"), &budget)
    case UInt8(ascii: "a") where contentsAre("a{sv}"):
      return try readDictionaries(m, type, contents, &budget)
    case UInt8(ascii: "a") where contents?.pointee == CChar(UInt8(ascii: "(")):
      return try readStructs(m, type, contents!, &budget)
    case UInt8(ascii: "a"):
      let signature = "a" + (contents.map { String(cString: $0) } ?? "")
      try check(sd_bus_message_skip(m, nil), "skip")
      return .other(signature: signature)
    default:
      let inner = contents.map { String(cString: $0) } ?? ""
      let signature = inner.isEmpty ? String(UnicodeScalar(UInt8(bitPattern: type))) : "(\(inner))"
      try check(sd_bus_message_skip(m, nil), "skip")
      return .other(signature: signature)
    }
  }

  /// An `as`.
  static func readStrings(_ m: OpaquePointer, _ type: CChar, _ contents: UnsafePointer<CChar>?, _ budget: inout Budget)
    throws -> BusValue
  {
    try check(sd_bus_message_enter_container(m, type, contents), "enter as")
    var strings: [String] = []
    while try hasMore(m) {
      if strings.count == budget.limits.elements {
        throw OverLimit(description: "an array with more than \(budget.limits.elements) elements")
      }
      if case .string(let s) = try read(m, &budget) { strings.append(s) }
    }
    try check(sd_bus_message_exit_container(m), "exit as")
    return .strings(strings)
  }

  /// An `a{ss}` or `a{sv}`, each entry's key kept in the budget for the over-limit message.
  static func readDictionary(
    _ m: OpaquePointer, _ type: CChar, _ contents: UnsafePointer<CChar>?, isStringMap: Bool, _ budget: inout Budget
  ) throws -> BusValue {
    try check(sd_bus_message_enter_container(m, type, contents), "enter dict")
    var dict: [String: BusValue] = [:]
    var stringMap: [String: String] = [:]
    let entry: StaticString = isStringMap ? "ss" : "sv"
    var entries = 0
    while try hasMore(m) {
      entries += 1
      if entries > budget.limits.entries {
        budget.key = nil
        throw OverLimit(description: "a dictionary with more than \(budget.limits.entries) entries")
      }
      try check(
        entry.withUTF8Buffer {
          $0.withMemoryRebound(to: CChar.self) {
            sd_bus_message_enter_container(m, CChar(UInt8(ascii: "e")), $0.baseAddress)
          }
        }, "enter entry")
      let key = try read(m, &budget).stringValue ?? ""
      budget.key = key
      let value = try read(m, &budget)
      try check(sd_bus_message_exit_container(m), "exit entry")
      if isStringMap { stringMap[key] = value.stringValue ?? "" } else { dict[key] = value }
    }
    try check(sd_bus_message_exit_container(m), "exit dict")
    return isStringMap ? .stringMap(stringMap) : .dict(dict)
  }

  /// An `aa{sv}`.
  static func readDictionaries(
    _ m: OpaquePointer, _ type: CChar, _ contents: UnsafePointer<CChar>?, _ budget: inout Budget
  ) throws -> BusValue {
    try check(sd_bus_message_enter_container(m, type, contents), "enter aa{sv}")
    var dicts: [[String: BusValue]] = []
    while try hasMore(m) {
      if dicts.count == budget.limits.elements {
        throw OverLimit(description: "an array with more than \(budget.limits.elements) elements")
      }
      if case .dict(let d) = try read(m, &budget) { dicts.append(d) }
    }
    try check(sd_bus_message_exit_container(m), "exit aa{sv}")
    return .dicts(dicts)
  }

  /// An array of structs (a portal's a(ss) choices): each member read as any value.
  static func readStructs(_ m: OpaquePointer, _ type: CChar, _ contents: UnsafePointer<CChar>, _ budget: inout Budget)
    throws -> BusValue
  {
    let element = String(cString: contents)
    try check(sd_bus_message_enter_container(m, type, contents), "enter a\(element)")
    var rows: [[BusValue]] = []
    while try hasMore(m) {
      if rows.count == budget.limits.elements {
        throw OverLimit(description: "an array with more than \(budget.limits.elements) elements")
      }
      var structType: CChar = 0
      var structContents: UnsafePointer<CChar>?
      try check(sd_bus_message_peek_type(m, &structType, &structContents), "peek struct")
      try check(sd_bus_message_enter_container(m, structType, structContents), "enter struct")
      var row: [BusValue] = []
      while try hasMore(m) { row.append(try read(m, &budget)) }
      try check(sd_bus_message_exit_container(m), "exit struct")
      rows.append(row)
    }
    try check(sd_bus_message_exit_container(m), "exit a\(element)")
    return .structs(elementSignature: element, rows)
  }

  // MARK: Writing

  package static func append(_ m: OpaquePointer, _ value: BusValue) throws {
    switch value {
    case .string(let s):
      try appendString(m, s)
    case .bool(let b):
      var v: Int32 = b ? 1 : 0
      try check(sd_bus_message_append_basic(m, CChar(UInt8(ascii: "b")), &v), "append b")
    case .uint32(var v): try check(sd_bus_message_append_basic(m, CChar(UInt8(ascii: "u")), &v), "append u")
    case .int32(var v): try check(sd_bus_message_append_basic(m, CChar(UInt8(ascii: "i")), &v), "append i")
    case .int64(var v): try check(sd_bus_message_append_basic(m, CChar(UInt8(ascii: "x")), &v), "append x")
    case .uint64(var v): try check(sd_bus_message_append_basic(m, CChar(UInt8(ascii: "t")), &v), "append t")
    case .double(var v): try check(sd_bus_message_append_basic(m, CChar(UInt8(ascii: "d")), &v), "append d")
    case .strings(let strings):
      try container(m, "a", "s") { for s in strings { try append(m, .string(s)) } }
    case .stringMap(let map):
      try container(m, "a", "{ss}") {
        for (k, v) in map {  // a dict's order carries no meaning on the bus
          try container(m, "e", "ss") {
            try append(m, .string(k))
            try append(m, .string(v))
          }
        }
      }
    case .dict(let dict):
      try append(m, dict, adding: nil, nil)
    case .dicts(let dicts):
      try container(m, "a", "a{sv}") { for d in dicts { try append(m, .dict(d)) } }
    case .objectPath(let path):
      try check(
        path.withCString { sd_bus_message_append_basic(m, CChar(UInt8(ascii: "o")), $0) }, "append o")
    case .variants(let values):
      try container(m, "a", "v") {
        for value in values {
          guard case .structs = value else {
            try container(m, "v", value.fixedSignature) { try append(m, value) }
            continue
          }
          try dynamicContainer(m, "v", value.signature) { try append(m, value) }
        }
      }
    case .structs(let element, let rows):
      guard element.hasPrefix("("), element.hasSuffix(")") else {
        throw Failure(errno: EINVAL, what: "cannot send an array of \(element)")
      }
      let inner = String(element.dropFirst().dropLast())
      try dynamicContainer(m, "a", element) {
        for row in rows { try dynamicContainer(m, "r", inner) { for value in row { try append(m, value) } } }
      }
    case .other(let signature):
      throw Failure(errno: EINVAL, what: "cannot send a value of type \(signature)")
    }
  }

  /// An a{sv}, with one more entry when `key` is given.
  static func append(_ m: OpaquePointer, _ dict: [String: BusValue], adding key: String?, _ value: BusValue?) throws {
    func entry(_ k: String, _ v: BusValue) throws {
      try container(m, "e", "sv") {
        try appendString(m, k)
        if case .structs = v {
          try dynamicContainer(m, "v", v.signature) { try append(m, v) }
        } else {
          try container(m, "v", v.fixedSignature) { try append(m, v) }
        }
      }
    }
    try container(m, "a", "{sv}") {
      for (k, v) in dict { try entry(k, v) }
      if let key, let value { try entry(key, value) }
    }
  }

  /// A Swift string is valid UTF-8 by construction, so it is copied into the message as is
  /// (`sd_bus_message_append_string_space`) instead of through `append_basic`, which scans it for
  /// UTF-8 validity again: a cached token's reply is mostly token text. A string with a NUL byte,
  /// which D-Bus strings may not hold, is refused.
  static func appendString(_ m: OpaquePointer, _ s: String) throws {
    var s = s
    try s.withUTF8 { bytes in
      if let base = bytes.baseAddress, memchr(base, 0, bytes.count) != nil {
        throw Failure(errno: EINVAL, what: "a D-Bus string cannot hold a NUL character")
      }
      var space: UnsafeMutablePointer<CChar>?
      try check(sd_bus_message_append_string_space(m, bytes.count, &space), "append s")
      if let space, let base = bytes.baseAddress { memcpy(space, base, bytes.count) }
    }
  }

  /// A container whose contents signature is built at run time (the rare struct arrays).
  private static func dynamicContainer(
    _ m: OpaquePointer, _ type: Unicode.Scalar, _ contents: String, _ body: () throws -> Void
  ) throws {
    try check(
      contents.withCString { sd_bus_message_open_container(m, CChar(UInt8(ascii: type)), $0) },
      "open \(type)\(contents)")
    try body()
    try check(sd_bus_message_close_container(m), "close \(type)\(contents)")
  }

  private static func container(
    _ m: OpaquePointer, _ type: Unicode.Scalar, _ contents: StaticString, _ body: () throws -> Void
  ) throws {
    let c = UnsafeRawPointer(contents.utf8Start).assumingMemoryBound(to: CChar.self)
    try check(sd_bus_message_open_container(m, CChar(UInt8(ascii: type)), c), "open \(type)\(contents)")
    try body()
    try check(sd_bus_message_close_container(m), "close \(type)\(contents)")
  }
}
