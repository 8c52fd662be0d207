import ArgumentParser
import Testing

@testable import TesseraCLI

/// Every command names itself. A command without `commandName` is named at each start from its
/// type's name (`String(describing:)`), which scans every protocol conformance in the binary: that
/// cost 15% of `tessera --version`'s time (issue 41). So each command, at every depth, says its
/// name, and the names are what the help, the man page and the completions show.
@Suite struct CommandNameTests {
  func commands(_ root: any ParsableCommand.Type, path: String = "tessera") -> [(String, any ParsableCommand.Type)] {
    [(path, root)]
      + root.configuration.subcommands.flatMap { sub in
        commands(sub, path: path + " " + (sub.configuration.commandName ?? "<\(sub)>"))
      }
  }

  @Test func everyCommandSaysItsName() {
    let all = commands(Tessera.self).dropFirst()
    #expect(all.count >= 25, "the walk reaches the nested commands")
    let unnamed = all.filter { $0.1.configuration.commandName == nil }.map(\.0)
    #expect(unnamed.isEmpty, "commands named from their type at each start: \(unnamed)")
    #expect(all.contains { $0.0 == "tessera provider profiles" })
  }
}
