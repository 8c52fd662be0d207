/// "Did you mean …?": the known name nearest to a mistyped one, for config.toml's keys and tables.
public enum NearestName {
  /// The known name nearest to `name`, when it is near enough to be what was meant: at most one
  /// edit away for names of up to four characters, at most two for longer ones (an edit: a
  /// character added, dropped or changed, or two neighbours swapped; case is ignored). The first
  /// known name wins a tie.
  public static func nearest(to name: String, among known: [String]) -> String? {
    let wanted = Array(name.lowercased().unicodeScalars)
    var best: (name: String, distance: Int)?
    for candidate in known {
      let other = Array(candidate.lowercased().unicodeScalars)
      let allowed = min(wanted.count, other.count) <= 4 ? 1 : 2
      // The lengths alone bound the distance from below (and keep a huge quoted key cheap).
      guard abs(wanted.count - other.count) <= allowed else { continue }
      let distance = editDistance(wanted, other)
      guard distance <= allowed, distance < (best?.distance ?? .max) else { continue }
      best = (candidate, distance)
    }
    return best?.name
  }

  /// "did you mean 'x'?" when a known name is near; else "known keys are a, b, c" (or `known`).
  /// `quoted` writes the suggested name, `listed` each name of the list.
  public static func suggestion(
    for name: String, among names: [String], quoted: (String) -> String = { "'\($0)'" },
    listed: (String) -> String = { $0 }, known: String = "known keys are"
  ) -> String {
    if let near = nearest(to: name, among: names) { return "did you mean \(quoted(near))?" }
    return "\(known) " + names.map(listed).joined(separator: ", ")
  }

  /// Damerau–Levenshtein distance (optimal string alignment: a swap of neighbours is one edit).
  static func editDistance<T: Equatable>(_ a: [T], _ b: [T]) -> Int {
    if a.isEmpty { return b.count }
    if b.isEmpty { return a.count }
    // Rows i-2, i-1 and i of the usual table.
    var before = [Int](repeating: 0, count: b.count + 1)
    var previous = Array(0...b.count)
    var current = [Int](repeating: 0, count: b.count + 1)
    for i in 1...a.count {
      current[0] = i
      for j in 1...b.count {
        let cost = a[i - 1] == b[j - 1] ? 0 : 1
        current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
        if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] {
          current[j] = min(current[j], before[j - 2] + 1)
        }
      }
      (before, previous, current) = (previous, current, before)
    }
    return previous[b.count]
  }
}
