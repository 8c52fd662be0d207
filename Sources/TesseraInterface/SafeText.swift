/// Text from outside (an IdP's answer, whoever reached the redirect listener, a caller's option)
/// made safe to put in a message, a terminal or a log line: every control character (C0, DEL,
/// C1, line and paragraph separators) and every bidirectional override becomes a space, so it
/// cannot start a new line, move the cursor, recolour a terminal or reorder what is shown; and
/// the text is cut at `limit` characters with "…".
public enum SafeText {
  public static func clip(_ text: some StringProtocol, limit: Int) -> String {
    var result = String.UnicodeScalarView()
    var characters = 0
    for scalar in text.unicodeScalars {
      if characters == limit {
        result.append("…")
        break
      }
      result.append(isUnsafe(scalar) ? " " : scalar)
      // Counted by scalars: a combining sequence cannot stretch the limit.
      characters += 1
    }
    return String(result)
  }

  /// Whether the text would be changed by `clip` (for refusing instead of cleaning).
  public static func isClean(_ text: some StringProtocol) -> Bool {
    !text.unicodeScalars.contains(where: isUnsafe)
  }

  static func isUnsafe(_ scalar: Unicode.Scalar) -> Bool {
    switch scalar.value {
    case 0x00...0x1F, 0x7F...0x9F: true  // C0, DEL, C1 (ESC and CSI among them)
    case 0x2028, 0x2029: true  // line and paragraph separators
    case 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069, 0x061C: true  // bidirectional controls
    default: false
    }
  }
}
