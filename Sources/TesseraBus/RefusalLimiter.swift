/// How many refusals (calls refused before any handler saw them) the bus layer logs: at most
/// `linesPerSecond` a second, then one line counting the rest, so a flood of bad calls can neither
/// flood the journal nor churn the bus thread's memory. A value: the bus thread owns one.
struct RefusalLimiter {
  static let linesPerSecond = 10
  private var second = 0
  private var logged = 0
  private var suppressed = 0

  /// For a refusal at `second` (any monotonic count of seconds): whether to log it, and how many
  /// refusals of an earlier second were not logged (to be said in one line, once, before it).
  mutating func admit(second now: Int) -> (log: Bool, suppressedBefore: Int) {
    var before = 0
    if now != second {
      before = suppressed
      second = now
      logged = 0
      suppressed = 0
    }
    guard logged < Self.linesPerSecond else {
      suppressed += 1
      return (false, before)
    }
    logged += 1
    return (true, before)
  }
}
