/// Unix seconds as RFC 3339 in UTC ("2026-11-23T10:00:00Z"), in pure Swift: the engine's messages
/// and the CLI's output write times the same way, with no C library and no locale.
public enum RFC3339 {
  public static func format(_ seconds: Int64) -> String {
    let days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
    let second = seconds - days * 86_400
    // Days to a civil date (proleptic Gregorian), after Howard Hinnant's `civil_from_days`.
    let z = days + 719_468
    let era = (z >= 0 ? z : z - 146_096) / 146_097
    let dayOfEra = z - era * 146_097
    let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
    let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
    let shiftedMonth = (5 * dayOfYear + 2) / 153
    let day = dayOfYear - (153 * shiftedMonth + 2) / 5 + 1
    let month = shiftedMonth < 10 ? shiftedMonth + 3 : shiftedMonth - 9
    let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
    func two(_ n: Int64) -> String { n < 10 ? "0\(n)" : "\(n)" }
    return
      "\(year)-\(two(month))-\(two(day))T\(two(second / 3600)):\(two(second % 3600 / 60)):\(two(second % 60))Z"
  }
}
