#if canImport(Glibc)
  import Glibc
#endif

/// Rows for people and for scripts, from one list: on a terminal, aligned columns under a header;
/// piped, one tab-separated line per row and no header (the form scripts split with `cut -f`).
/// `--json` is the stable form for scripts; the tab form only ever gains columns at its end.
struct Table {
  var header: [String]
  var rows: [[String]] = []

  init(_ header: String...) { self.header = header }

  mutating func add(_ cells: String...) { rows.append(cells) }

  /// Whether standard output is a terminal (the aligned form) or a pipe or file (the tab form).
  static var toTerminal: Bool { isatty(1) == 1 }

  func print(aligned: Bool = Table.toTerminal) {
    for line in lines(aligned: aligned) { Swift.print(line) }
  }

  /// The lines `print` writes.
  func lines(aligned: Bool) -> [String] {
    guard aligned else { return rows.map { $0.joined(separator: "\t") } }
    var widths = header.map(\.count)
    for row in rows {
      for (i, cell) in row.enumerated() where i < widths.count { widths[i] = max(widths[i], cell.count) }
    }
    func line(_ cells: [String]) -> String {
      var text = ""
      for (i, cell) in cells.enumerated() {
        text += cell
        if i < cells.count - 1 { text += String(repeating: " ", count: widths[i] - cell.count + 2) }
      }
      return text
    }
    return [line(header)] + rows.map(line)
  }
}
