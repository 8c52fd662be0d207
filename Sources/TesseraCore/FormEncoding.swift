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

  public static func unescape(_ s: String) -> String {
    var bytes: [UInt8] = []
    bytes.reserveCapacity(s.utf8.count)
    var iterator = Array(s.utf8).makeIterator()
    while let byte = iterator.next() {
      switch byte {
      case UInt8(ascii: "+"): bytes.append(UInt8(ascii: " "))
      case UInt8(ascii: "%"):
        if let h = iterator.next(), let l = iterator.next(),
          let v = UInt8(String(decoding: [h, l], as: UTF8.self), radix: 16)
        {
          bytes.append(v)
        }
      default: bytes.append(byte)
      }
    }
    return String(decoding: bytes, as: UTF8.self)
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
