import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// A JSON value, for the one place the broker edits JSON: the OIDC `claims` request parameter.
public indirect enum JSONValue: Codable, Sendable, Equatable {
  case object([String: JSONValue])
  case array([JSONValue])
  case string(String)
  case number(Double)
  case bool(Bool)
  case null

  public init(from decoder: any Decoder) throws {
    let container = try decoder.singleValueContainer()
    if container.decodeNil() {
      self = .null
    } else if let b = try? container.decode(Bool.self) {
      self = .bool(b)
    } else if let n = try? container.decode(Double.self) {
      self = .number(n)
    } else if let s = try? container.decode(String.self) {
      self = .string(s)
    } else if let a = try? container.decode([JSONValue].self) {
      self = .array(a)
    } else {
      self = .object(try container.decode([String: JSONValue].self))
    }
  }

  public func encode(to encoder: any Encoder) throws {
    var container = encoder.singleValueContainer()
    switch self {
    case .object(let o): try container.encode(o)
    case .array(let a): try container.encode(a)
    case .string(let s): try container.encode(s)
    case .number(let n): try container.encode(n)
    case .bool(let b): try container.encode(b)
    case .null: try container.encodeNil()
    }
  }

  /// Deep merge: objects merge key by key, anything else from `other` wins.
  func merged(with other: JSONValue) -> JSONValue {
    guard case .object(let mine) = self, case .object(let theirs) = other else { return other }
    return .object(mine.merging(theirs) { $0.merged(with: $1) })
  }
}

/// The OIDC `claims` request parameter (OIDC Core §5.5), with client capabilities (`xms_cc`).
public enum ClaimsRequest {
  /// Parses a caller's claims; InvalidArgument when it is not a JSON object.
  public static func parse(_ text: String) throws -> JSONValue {
    guard let value = try? JSONDecoder().decode(JSONValue.self, from: Data(text.utf8)), case .object = value else {
      throw TesseraError.invalidArgument(
        "Option 'claims' is not a JSON object. Pass the claims challenge exactly as the API returned it (e.g. from WWW-Authenticate)."
      )
    }
    return value
  }

  /// The caller's claims merged with `{"access_token":{"xms_cc":{"values":[capabilities]}}}`.
  public static func merge(claims: String?, capabilities: [String]) throws -> String? {
    guard !capabilities.isEmpty else { return claims }
    let capabilityClaims = JSONValue.object([
      "access_token": .object(["xms_cc": .object(["values": .array(capabilities.map(JSONValue.string))])])
    ])
    let merged = try claims.map { try parse($0).merged(with: capabilityClaims) } ?? capabilityClaims
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    return String(decoding: try encoder.encode(merged), as: UTF8.self)
  }
}
