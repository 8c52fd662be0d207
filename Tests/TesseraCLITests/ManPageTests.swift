import Foundation
import TesseraInterface
import Testing

/// The man pages in docs/man against what they describe, so that they cannot rot: each renders
/// through `man --warnings` without a warning; tessera(1) has an entry for every command and option
/// the built `tessera` shows in its `--help` (and no entry for a command it lacks), and lists
/// exactly the exit statuses of the one error table; the three pages carry one date and version.
/// tessera(1) is written by hand: this test, not a generator, keeps it true.
@Suite(.serialized)
struct ManPageTests {
  static let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()
  static let pages = [
    "docs/man/tessera.1", "docs/man/tesserad.8", "docs/man/tessera-config.5", "Desktop/data/tessera-accounts.1",
  ]

  struct Outcome {
    var status: Int32
    var stdout: String
    var stderr: String
  }

  struct SpawnError: Error, CustomStringConvertible {
    var description: String
  }

  /// Runs `program` with only `environment`; stdout is thrown away unless `keepOutput`. Spawned and
  /// waited for by its pid, its output in files: Foundation's Process, next to BinaryTests' own
  /// processes in this test process, may miss a child that ends at once and wait forever, and a
  /// pipe's write end inherited by another suite's child (a forked dbus-daemon lives on) would
  /// never let a read of the pipe end.
  static func run(_ program: String, _ arguments: [String], environment: [String: String], keepOutput: Bool = true)
    throws -> Outcome
  {
    let base = NSTemporaryDirectory() + "tessera-man-\(UUID().uuidString)"
    let (outPath, errPath) = (keepOutput ? base + ".out" : "/dev/null", base + ".err")
    defer { for path in [base + ".out", errPath] { try? FileManager.default.removeItem(atPath: path) } }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    posix_spawn_file_actions_addopen(&actions, 2, errPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    let argv = ([program] + arguments).map { strdup($0) } + [nil]
    let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer { for pointer in argv + envp { free(pointer) } }
    var pid = pid_t()
    let spawned = posix_spawn(&pid, program, &actions, nil, argv, envp)
    guard spawned == 0 else {
      throw SpawnError(description: "cannot run \(program): \(String(cString: strerror(spawned)))")
    }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 {
      guard errno == EINTR else {
        throw SpawnError(description: "waitpid \(program): \(String(cString: strerror(errno)))")
      }
    }
    // WIFEXITED / WEXITSTATUS, and 128 + the signal as a shell says.
    let exit = status & 0x7f == 0 ? (status >> 8) & 0xff : 128 + status & 0x7f
    func read(_ path: String) -> String {
      String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self)
    }
    return Outcome(status: exit, stdout: keepOutput ? read(outPath) : "", stderr: read(errPath))
  }

  /// man(1) of man-db, found as a shell would; nil when it is not installed.
  static let man: String? = {
    let path = (ProcessInfo.processInfo.environment["PATH"] ?? "") + ":/usr/bin:/bin"
    return path.split(separator: ":").map { $0 + "/man" }.first { FileManager.default.isExecutableFile(atPath: $0) }
  }()

  static let missingMan = """
    man(1) is not installed, so the man pages cannot be checked: install the Debian packages \
    man-db and groff-base (TESSERA_TEST_PACKAGES in scripts/lib/packages.sh; scripts/test and \
    scripts/setup install them)
    """

  static func source(_ page: String) throws -> String {
    try String(contentsOf: repo.appendingPathComponent(page), encoding: .utf8)
  }

  // MARK: man --warnings

  @Test(arguments: pages) func manShowsNoWarning(page: String) throws {
    guard let man = Self.man else {
      Issue.record(Comment(rawValue: Self.missingMan))
      return
    }
    // As a reader at 80 columns sees it; MAN_DISABLE_SECCOMP: man-db's sandbox of groff is
    // refused in some containers, which is not the page's fault.
    let outcome = try Self.run(
      man, ["--warnings", "-l", Self.repo.appendingPathComponent(page).path],
      environment: [
        "PATH": "/usr/bin:/bin", "MANWIDTH": "80", "LANG": "C.UTF-8", "MAN_DISABLE_SECCOMP": "1",
        "HOME": NSTemporaryDirectory(),
      ], keepOutput: false)
    #expect(outcome.status == 0, "man --warnings -l \(page) failed (exit \(outcome.status)): \(outcome.stderr)")
    #expect(outcome.stderr.isEmpty, "man --warnings -l \(page) warns:\n\(outcome.stderr)")
  }

  // MARK: One date, one version

  @Test func everyPageCarriesOneDateAndTheBrokersVersion() throws {
    var dates: [String: String] = [:]
    for page in Self.pages {
      let th = try #require(RoffPage(try Self.source(page)).title, "\(page) has no .TH line")
      try #require(th.count >= 4, "\(page): .TH needs a title, section, date and version: \(th)")
      dates[page] = th[2]
      #expect(th[3] == "Tessera \(BrokerInterface.version)", "\(page): .TH version '\(th[3])'")
    }
    #expect(Set(dates.values).count == 1, "the pages' .TH dates differ: \(dates)")
  }

  // MARK: tessera(1) against the table and the binary

  @Test func exitStatusListsExactlyTheErrorTable() throws {
    let page = RoffPage(try Self.source("docs/man/tessera.1"))
    let section = try #require(page.section("EXIT STATUS"), "tessera.1 has no EXIT STATUS section")
    let entries = RoffPage.taggedParagraphs(section)
    let listed = entries.compactMap { Int32($0.tag) }
    #expect(listed.count == entries.count, "EXIT STATUS tags that are not numbers: \(entries.map(\.tag))")
    let table = ClientExitStatus.all
    let missing = table.map(\.status).filter { !listed.contains($0) }
    let extra = listed.filter { status in !table.contains { $0.status == status } }
    #expect(missing.isEmpty, "tessera.1's EXIT STATUS lacks \(missing) (ClientExitStatus.all has them)")
    #expect(extra.isEmpty, "tessera.1's EXIT STATUS lists \(extra), which ClientExitStatus.all does not have")
    #expect(listed == listed.sorted(), "tessera.1's EXIT STATUS is not in order: \(listed)")
    for entry in table {
      guard let text = entries.first(where: { Int32($0.tag) == entry.status })?.text else { continue }
      let summary = RoffPage.folded(entry.summary.replacingOccurrences(of: "`", with: ""))
      #expect(
        RoffPage.folded(text).contains(summary),
        "tessera.1's exit status \(entry.status) says \"\(text)\", not the table's \"\(entry.summary)\"")
    }
  }

  /// A command of `tessera --help`: its path ("access grant") and the options its --help lists.
  struct Command {
    var path: [String]
    var options: [String]
    var subcommands: [String]
    var name: String { (["tessera"] + path).joined(separator: " ") }
  }

  /// Every command the built binary shows, read from the help of each at test time: commands other
  /// work adds appear here as soon as they are built. `tessera help COMMAND` prints what
  /// `tessera COMMAND --help` does, also for `exec`, which takes what follows it as the command's.
  static func commands() throws -> [Command] {
    let binary = BinaryTests.binary
    try #require(FileManager.default.isExecutableFile(atPath: binary), "build tessera first: swift build")
    var found: [Command] = []
    var pending: [[String]] = [[]]
    while let path = pending.popLast() {
      let outcome = try run(
        binary, ["help"] + path,
        environment: ["PATH": "/usr/bin:/bin", "HOME": NSTemporaryDirectory(), "LANG": "C.UTF-8"])
      try #require(outcome.status == 0, "tessera help \(path.joined(separator: " ")): \(outcome.stderr)")
      let help = HelpText(outcome.stdout)
      found.append(Command(path: path, options: help.options, subcommands: help.subcommands))
      pending += help.subcommands.reversed().map { path + [$0] }
    }
    return found
  }

  @Test func commandsHasAnEntryForEveryCommandAndOptionOfHelp() throws {
    let page = RoffPage(try Self.source("docs/man/tessera.1"))
    let section = try #require(page.section("COMMANDS"), "tessera.1 has no COMMANDS section")
    let entries = RoffPage.subsections(section)
    let common = RoffPage.plain(try #require(page.section("COMMON OPTIONS"), "tessera.1 has no COMMON OPTIONS"))
    let synopsis = (page.section("SYNOPSIS") ?? []).filter { $0.hasPrefix(".SY") }.map { RoffPage.plain([$0]) }
    let commands = try Self.commands()
    let known = Set(commands.map(\.name))
    for command in commands where !command.path.isEmpty {
      let name = command.name
      if command.subcommands.isEmpty {
        #expect(
          entries.contains { $0.heading == name },
          "tessera.1's COMMANDS has no entry (.SS \"\(name)\") for `\(name)`, which `tessera --help` lists")
        #expect(synopsis.contains(name), "tessera.1's SYNOPSIS has no .SY line for `\(name)`")
      } else {
        #expect(
          entries.contains { $0.heading == name || $0.heading.hasPrefix(name + " ") },
          "tessera.1's COMMANDS has no entry for `\(name)` or its commands, which `tessera --help` lists")
      }
      let entry = RoffPage.plain(entries.first { $0.heading == name }?.lines ?? [])
      for option in command.options where !["--help", "--version"].contains(option) {
        #expect(
          HelpText.mentions(entry, option) || HelpText.mentions(common, option),
          "tessera.1 describes no \(option) of `\(name)`: not in its COMMANDS entry, nor under COMMON OPTIONS")
      }
    }
    for entry in entries where !known.contains(entry.heading) {
      Issue.record(
        """
        tessera.1's COMMANDS documents `\(entry.heading)`, but the built tessera has no such command \
        (`tessera --help` and its commands' --help list: \(known.sorted().joined(separator: ", "))); \
        removed or renamed, or not merged yet?
        """)
    }
  }
}

/// What swift-argument-parser prints for --help: the SUBCOMMANDS and OPTIONS sections.
struct HelpText {
  var subcommands: [String] = []
  var options: [String] = []

  init(_ text: String) {
    var section = ""
    for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
      if let first = line.first, first != " " {
        section = String(line)
        continue
      }
      // Entries start two spaces in; their wrapped descriptions further.
      guard line.hasPrefix("  "), let first = line.dropFirst(2).first, first != " " else { continue }
      let word = line.dropFirst(2).prefix { $0 != " " && $0 != "," }
      switch section {
      case "SUBCOMMANDS:":
        if word.allSatisfy({ $0.isLowercase || $0.isNumber || $0 == "-" }) { subcommands.append(String(word)) }
      case "OPTIONS:":
        // "  --client-id <id>", "  -h, --help"
        if let long = line.split(separator: " ").first(where: { $0.hasPrefix("--") }) {
          options.append(String(long.prefix { $0 != "," && $0 != "=" }))
        }
      default: break
      }
    }
  }

  /// Whether `text` names `option` as a whole word ("--account", not "--accounts").
  static func mentions(_ text: String, _ option: String) -> Bool {
    var rest = text[...]
    while let range = rest.range(of: option) {
      let next = rest[range.upperBound...].first
      if next.map({ !($0.isLetter || $0.isNumber || $0 == "-") }) ?? true { return true }
      rest = rest[range.upperBound...]
    }
    return false
  }
}

/// A man(7) page's source, read as far as these tests need: .TH, sections, subsections, tagged
/// paragraphs, and the text of lines with fonts and escapes taken out.
struct RoffPage {
  var title: [String]?
  var sections: [(name: String, lines: [String])] = []

  init(_ source: String) {
    for line in source.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
      if line.hasPrefix(".TH ") {
        title = Self.arguments(line)
      } else if line.hasPrefix(".SH") {
        sections.append((Self.plain([line]), []))
      } else if !sections.isEmpty {
        sections[sections.count - 1].lines.append(line)
      }
    }
  }

  func section(_ name: String) -> [String]? { sections.first { $0.name == name }?.lines }

  /// The .SS subsections of a section: heading and lines.
  static func subsections(_ lines: [String]) -> [(heading: String, lines: [String])] {
    var result: [(heading: String, lines: [String])] = []
    for line in lines {
      if line.hasPrefix(".SS") {
        result.append((plain([line]), []))
      } else if !result.isEmpty {
        result[result.count - 1].lines.append(line)
      }
    }
    return result
  }

  /// The .TP paragraphs of a section: the tag (the line after .TP) and the text up to the next
  /// paragraph or heading.
  static func taggedParagraphs(_ lines: [String]) -> [(tag: String, text: String)] {
    var result: [(tag: String, text: String)] = []
    var index = 0
    while index < lines.count {
      guard lines[index].hasPrefix(".TP"), index + 1 < lines.count else {
        index += 1
        continue
      }
      let tag = plain([lines[index + 1]])
      var body: [String] = []
      index += 2
      while index < lines.count, !isParagraphBreak(lines[index]) {
        body.append(lines[index])
        index += 1
      }
      result.append((tag, plain(body)))
    }
    return result
  }

  static func isParagraphBreak(_ line: String) -> Bool {
    [".TP", ".PP", ".P ", ".LP", ".IP", ".SH", ".SS"].contains { line.hasPrefix($0) } || line == ".P"
  }

  /// A macro line's arguments, with roff's double quotes ("" inside quotes is one quote).
  static func arguments(_ line: String) -> [String] {
    var result: [String] = []
    var chars = Array(line.drop { $0 != " " })[...]
    while true {
      chars = chars.drop { $0 == " " }
      guard let first = chars.first else { return result }
      var argument = ""
      if first == "\"" {
        chars = chars.dropFirst()
        while let c = chars.first {
          chars = chars.dropFirst()
          if c == "\"" {
            if chars.first == "\"" {
              argument.append("\"")
              chars = chars.dropFirst()
            } else {
              break
            }
          } else {
            argument.append(c)
          }
        }
      } else {
        while let c = chars.first, c != " " {
          argument.append(c)
          chars = chars.dropFirst()
        }
      }
      result.append(argument)
    }
  }

  /// The text of source lines as a reader sees it, on one line: font macros joined as they set
  /// their words, escapes resolved, other requests dropped.
  static func plain(_ lines: [String]) -> String {
    var words: [String] = []
    for line in lines {
      var text: String
      if line.hasPrefix(".") || line.hasPrefix("'") {
        let name = String(line.dropFirst().prefix { $0 != " " })
        let args = arguments(line)
        switch name {
        case "B", "I", "SM", "SB", "SH", "SS", "SY": text = args.joined(separator: " ")
        case "BR", "RB", "BI", "IB", "IR", "RI": text = args.joined()
        default: continue  // comments, .TP, .PP, .RS, .EX, .nf, ...
        }
      } else {
        text = line
      }
      for (escape, value) in [
        ("\\fB", ""), ("\\fI", ""), ("\\fR", ""), ("\\fP", ""), ("\\-", "-"), ("\\~", " "), ("\\ ", " "),
        ("\\(dq", "\""), ("\\(en", "-"), ("\\(em", "-"), ("\\&", ""), ("\\%", ""), ("\\c", ""), ("\\e", "\\"),
      ] {
        text = text.replacingOccurrences(of: escape, with: value)
      }
      words.append(text)
    }
    return words.joined(separator: " ").split(separator: " ", omittingEmptySubsequences: true).joined(
      separator: " ")
  }

  /// Lowercased, with runs of white space as one space: what the wording compares as.
  static func folded(_ text: String) -> String {
    text.lowercased().split(whereSeparator: \.isWhitespace).joined(separator: " ")
  }
}
