import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// com.microsoft.identity.broker1's requestJson as the Microsoft front reads it: bounded in size and
/// depth, with accessors whose errors name the field the caller got wrong.
/// A parsed requestJson, with accessors whose errors name the field (`authParameters.clientId`).
package struct MicrosoftRequest {
  struct Object {
    let fields: [String: JSONValue]
    let prefix: String

    func path(_ key: String) -> String { prefix.isEmpty ? key : prefix + "." + key }

    func wrongType(_ key: String, _ expected: String) -> TesseraError {
      .invalidArgument(
        "'\(path(key))' must be \(expected), not \(MicrosoftRequest.kind(of: fields[key] ?? .null)). Fix the request's JSON."
      )
    }

    /// A string; nil when absent or null.
    func string(_ key: String) throws -> String? {
      switch fields[key] {
      case nil, .null?: return nil
      case .string(let s)?: return s
      default: throw wrongType(key, "a string")
      }
    }

    /// A non-empty string within `max` bytes and without control characters; nil when absent,
    /// null or empty.
    func text(_ key: String, max: Int) throws -> String? {
      guard let s = try string(key), !s.isEmpty else { return nil }
      try RequestOptions.checkText(s, name: path(key), max: max, allowSpaces: false)
      return s
    }

    func object(_ key: String) throws -> Object? {
      switch fields[key] {
      case nil, .null?: return nil
      case .object(let o)?: return Object(fields: o, prefix: path(key))
      default: throw wrongType(key, "an object")
      }
    }

    func strings(_ key: String, maxCount: Int) throws -> [String] {
      guard case .array(let values)? = fields[key] else {
        if fields[key] == nil || fields[key] == .null {
          throw TesseraError.invalidArgument("'\(path(key))' is missing: it must be an array of strings.")
        }
        throw wrongType(key, "an array of strings")
      }
      guard values.count <= maxCount else {
        throw TesseraError.invalidArgument("'\(path(key))' has \(values.count) entries; the limit is \(maxCount).")
      }
      return try values.map {
        guard case .string(let s) = $0 else {
          throw TesseraError.invalidArgument(
            "'\(path(key))' must be an array of strings; it holds \(MicrosoftRequest.kind(of: $0)). Fix the request's JSON."
          )
        }
        return s
      }
    }

    /// A claims request: "" or a JSON object's text (MSAL's decodedClaims), or the object itself.
    func claims(_ key: String) throws -> String? {
      switch fields[key] {
      case nil, .null?: return nil
      case .string(let s)?:
        guard !s.isEmpty else { return nil }
        do { _ = try ClaimsRequest.parse(s) } catch {
          throw TesseraError.invalidArgument(
            "'\(path(key))' is not a JSON object's text. Pass the claims challenge as received.")
        }
        return s
      case .object?:
        return JSONOut(fields[key]!).text
      default: throw wrongType(key, "a string")
      }
    }
  }

  let root: Object
  /// The requestJson as sent (the silent fast path's key).
  var text = ""

  package static func parse(_ text: String, allowEmpty: Bool) throws -> MicrosoftRequest {
    if allowEmpty && text.allSatisfy({ $0 == " " || $0 == "\n" || $0 == "\t" || $0 == "\r" }) {
      return MicrosoftRequest(root: Object(fields: [:], prefix: ""))
    }
    guard text.utf8.count <= MicrosoftBrokerInterface.maxRequestBytes else {
      throw TesseraError.invalidArgument(
        "requestJson is \(text.utf8.count) bytes; the limit is \(MicrosoftBrokerInterface.maxRequestBytes).")
    }
    let depth = Self.depth(of: text)
    guard depth <= MicrosoftBrokerInterface.maxDepth else {
      throw TesseraError.invalidArgument(
        "requestJson nests \(depth) levels deep; the limit is \(MicrosoftBrokerInterface.maxDepth).")
    }
    guard let value = try? JSONDecoder().decode(JSONValue.self, from: Data(text.utf8)) else {
      throw TesseraError.invalidArgument("requestJson is not valid JSON. Send the request as a JSON object.")
    }
    guard case .object(let fields) = value else {
      throw TesseraError.invalidArgument("requestJson must be a JSON object, not \(kind(of: value)).")
    }
    return MicrosoftRequest(root: Object(fields: fields, prefix: ""), text: text)
  }

  func clientID(at object: Object, required: Bool) throws -> String {
    guard let clientID = try object.string("clientId"), !clientID.isEmpty else {
      throw TesseraError.invalidArgument("'\(object.path("clientId"))' is missing: name your app's client id.")
    }
    try RequestOptions.checkText(
      clientID, name: object.path("clientId"), max: ArgumentLimits.clientIDBytes, allowSpaces: false)
    return clientID
  }

  /// The deepest nesting of arrays and objects, counted on the text before it is decoded (so a
  /// hostile request of 60,000 brackets costs one pass, not a recursion).
  static func depth(of text: String) -> Int {
    var depth = 0
    var deepest = 0
    var inString = false
    var escaped = false
    for byte in text.utf8 {
      if inString {
        if escaped {
          escaped = false
        } else if byte == UInt8(ascii: "\\") {
          escaped = true
        } else if byte == UInt8(ascii: "\"") {
          inString = false
        }
        continue
      }
      switch byte {
      case UInt8(ascii: "\""): inString = true
      case UInt8(ascii: "{"), UInt8(ascii: "["):
        depth += 1
        deepest = max(deepest, depth)
      case UInt8(ascii: "}"), UInt8(ascii: "]"): depth -= 1
      default: break
      }
    }
    return deepest
  }

  static func kind(of value: JSONValue) -> String {
    switch value {
    case .object: "an object"
    case .array: "an array"
    case .string: "a string"
    case .number: "a number"
    case .bool: "a boolean"
    case .null: "null"
    }
  }
}
