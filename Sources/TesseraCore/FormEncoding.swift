/// `application/x-www-form-urlencoded` and URL query encoding (RFC 3986 unreserved set).
public enum FormEncoding {
  private static let unreserved = Set(Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~".utf8))

  public static func escape(_ s: String) -> String {
    var out = ""
    out.reserveCapacity(s.utf8.count)
    for byte in s.utf8 {
      if unreserved.contains(byte) {
        out.unicodeScalars.append(Unicode.Scalar(byte))
      } else {
        out += "%" + String(byte, radix: 16, uppercase: true).leftPadded(to: 2)
      }
    }
    return out
  }

  public static func encode(_ fields: [(String, String)]) -> String {
    fields.map { escape($0.0) + "=" + escape($0.1) }.joined(separator: "&")
  }

  /// Decodes `a=b&c=d` (with `+` as space). Later duplicates win.
  public static func decode(_ query: String) -> [String: String] {
    var result: [String: String] = [:]
    for pair in query.split(separator: "&", omittingEmptySubsequences: true) {
      let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
      let key = unescape(String(parts[0]))
      let value = parts.count > 1 ? unescape(String(parts[1])) : ""
      result[key] = value
    }
    return result
  }

  /// Percent-decoding with `+` as space. A `%` not followed by two hex digits stays as it is (as
  /// browsers and the WHATWG URL standard do): `%zz` and `%+1` are text, not a byte.
  public static func unescape(_ s: String) -> String {
    let input = Array(s.utf8)
    var bytes: [UInt8] = []
    bytes.reserveCapacity(input.count)
    var i = 0
    while i < input.count {
      let byte = input[i]
      if byte == UInt8(ascii: "+") {
        bytes.append(UInt8(ascii: " "))
      } else if byte == UInt8(ascii: "%"), i + 2 < input.count, let h = hexValue(input[i + 1]),
        let l = hexValue(input[i + 2])
      {
        bytes.append(h << 4 | l)
        i += 2
      } else {
        bytes.append(byte)
      }
      i += 1
    }
    return String(decoding: bytes, as: UTF8.self)
  }

  private static func hexValue(_ byte: UInt8) -> UInt8? {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
    default: nil
    }
  }
}

extension String {
  fileprivate func leftPadded(to width: Int) -> String {
    count >= width ? self : String(repeating: "0", count: width - count) + self
  }
}

extension StringProtocol {
  /// Without leading and trailing spaces, tabs and line breaks.
  public func trimmingSpaces() -> String {
    // On scalars: "\r\n" is one Character, which a Character comparison with "\r" or "\n" misses.
    let isSpace = { (c: Unicode.Scalar) in c == " " || c == "\t" || c == "\r" || c == "\n" }
    var scalars = Substring(self).unicodeScalars[...]
    while let first = scalars.first, isSpace(first) { scalars = scalars.dropFirst() }
    while let last = scalars.last, isSpace(last) { scalars = scalars.dropLast() }
    return String(String.UnicodeScalarView(scalars))
  }
}
