/// A D-Bus value as the broker sees it: the subset of types its interface uses, plus a marker for
/// anything else a caller may send (so the broker can name the offending key).
public indirect enum BusValue: Sendable, Equatable {
  case string(String)
  case bool(Bool)
  case uint32(UInt32)
  case int32(Int32)
  case int64(Int64)
  case uint64(UInt64)
  case double(Double)
  case strings([String])
  case stringMap([String: String])
  case dict([String: BusValue])
  case dicts([[String: BusValue]])
  /// An object path ("o"): the handles of portal calls.
  case objectPath(String)
  /// An array of structs, each of `elementSignature` (like "(ss)"): the portal's choices.
  case structs(elementSignature: String, [[BusValue]])
  /// An array of variants ("av"): org.freedesktop.Application.ActivateAction's parameter. Sent only.
  case variants([BusValue])
  /// A value of a type the broker does not use; carries its D-Bus signature.
  case other(signature: String)

  /// The D-Bus type signature of this value.
  public var signature: String {
    if case .other(let signature) = self { return signature }
    if case .structs(let element, _) = self { return "a" + element }
    return fixedSignature.description
  }

  /// The signature of every type the broker sends, as a static string (no allocation on the reply
  /// path); `.other` has none and gives "v".
  public var fixedSignature: StaticString {
    switch self {
    case .string: "s"
    case .bool: "b"
    case .uint32: "u"
    case .int32: "i"
    case .int64: "x"
    case .uint64: "t"
    case .double: "d"
    case .strings: "as"
    case .stringMap: "a{ss}"
    case .dict: "a{sv}"
    case .dicts: "aa{sv}"
    case .objectPath: "o"
    case .variants: "av"
    case .structs, .other: "v"
    }
  }

  public var stringValue: String? { if case .string(let s) = self { s } else { nil } }
  public var dictValue: [String: BusValue]? { if case .dict(let d) = self { d } else { nil } }
}
