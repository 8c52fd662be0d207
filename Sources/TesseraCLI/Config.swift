import ArgumentParser
import SystemPackage
import TesseraBus
import TesseraClient

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif
#if canImport(Glibc)
  import Glibc
#endif

extension Tessera {
  struct Config: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "config",
      abstract: "Check config.toml.", subcommands: [Check.self])
  }
}

extension Tessera.Config {
  struct Check: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "check",
      abstract: "Check config.toml as tesserad would, without starting anything.",
      discussion: """
        Reads the file tesserad reads (--config, else $TESSERA_CONFIG, else \
        $XDG_CONFIG_HOME/tessera/config.toml) and checks it with tesserad's own check: the TOML, \
        every key, its type and value, the authority URLs and the [[git]] entries. Anything \
        config.toml does not know or cannot use is an error, with its file, line and key; a \
        mistyped name gets the nearest known one:

          $ tessera config check
          /home/ann/.config/tessera/config.toml:3: key 'default_scope': unknown key; did you mean 'default_scopes'?

        Each error goes to stderr and the exit status is 15; a good file prints "PATH: OK". No file \
        at the default path is not an error: tesserad then uses the defaults. It needs no bus and \
        starts nothing; restart tesserad to apply a change (systemctl --user restart tessera). \
        See tessera-config(5).
        """)

    @Option(name: .long, help: ArgumentHelp("Check this file instead of tesserad's.", valueName: "path"))
    var config: String?

    @Flag(
      name: .long,
      help: "Print the result as JSON: {\"path\", \"exists\", \"ok\", \"errors\": [{\"line\", \"key\", \"message\"}]}.")
    var json = false

    /// `tessera config check --json`.
    struct Report: Encodable {
      var path: String
      var exists: Bool
      var ok: Bool
      var errors: [Problem]

      struct Problem: Encodable {
        var line: Int?
        var key: String?
        var message: String

        func encode(to encoder: any Encoder) throws {
          var c = encoder.container(keyedBy: CodingKeys.self)
          try c.encode(line, forKey: .line)  // null, not absent, for the file as a whole
          try c.encode(key, forKey: .key)
          try c.encode(message, forKey: .message)
        }

        enum CodingKeys: String, CodingKey { case line, key, message }
      }
    }

    func run() throws {
      let environment = ProcessInfo.processInfo.environment
      let path = ConfigLocation.path(option: config, environment: environment)
      let result = checkConfig(option: config, environment: environment)
      let problems: [ConfigProblem]
      switch result {
      case .checked, .absent: problems = []
      case .problems(let list): problems = list
      }
      if json {
        printJSON(
          Report(
            path: path, exists: !(result.isAbsent), ok: problems.isEmpty,
            errors: problems.map { Report.Problem(line: $0.line, key: $0.key, message: $0.message) }))
      } else {
        switch result {
        case .checked: print("\(path): OK")
        case .absent: print("\(path): no such file; tesserad uses the defaults (see tessera-config(5)).")
        case .problems(let list): for problem in list { printError(problem.description) }
        }
      }
      if !problems.isEmpty { throw ExitCode(TesseraError.Code.configuration.exitCode) }
    }
  }
}

/// config.toml as tesserad would take it.
enum ConfigCheck {
  /// The file passed tesserad's check.
  case checked(BrokerConfig)
  /// No file at the default path: tesserad uses the defaults.
  case absent
  /// What is wrong, in the order of the lines (a file that cannot be read is one problem without a line).
  case problems([ConfigProblem])

  var isAbsent: Bool { if case .absent = self { true } else { false } }
}

/// Reads and checks config.toml exactly as tesserad does at start: the same file (`option`, else
/// $TESSERA_CONFIG, else the default path), the same size limit, the same check (BrokerConfig.parse).
/// A file named by `option` or $TESSERA_CONFIG must exist; at the default path, none means the
/// defaults.
func checkConfig(option: String?, environment: [String: String]) -> ConfigCheck {
  let path = ConfigLocation.path(option: option, environment: environment)
  let bytes: [UInt8]
  do {
    bytes = try Syscall.readFile(path, limit: BrokerConfig.maxFileBytes)
  } catch {
    if error.errno == .noSuchFileOrDirectory && !ConfigLocation.isNamed(option: option, environment: environment) {
      return .absent
    }
    let reason =
      error.errno == .fileTooLarge
      ? "is larger than \(BrokerConfig.maxFileBytes >> 20) MiB; tesserad refuses it"
      : "cannot be read: \(String(cString: strerror(error.errno.rawValue)))"
    return .problems([ConfigProblem(path: path, line: nil, reason: reason)])
  }
  do {
    return .checked(try BrokerConfig.parse(bytes: bytes, path: path))
  } catch {
    return .problems(error.problems)
  }
}

/// Why the broker could not be started, when it is config.toml: the message to print and the exit
/// status (15, Configuration), or nil for every other failure.
///
/// A command reaching the broker through D-Bus activation gets `brokerExited(status: 78)` when
/// tesserad refused its configuration (sysexits' EX_CONFIG), while its own message went to its
/// stderr or the journal. This runs the same check on the file tesserad reads and shows its
/// problems (file:line: key, and the nearest known name), a line saying the broker cannot start
/// until they are fixed, and how to check again. When the file here checks out (tesserad may read
/// another one, e.g. TESSERA_CONFIG in systemd's environment, or refuse one that other users can
/// write), it says tesserad stopped on a configuration error and where its message is. `fail()`
/// uses it for every command; `tessera status` may use it to explain "not running".
func startFailure(
  _ error: TesseraClientError, environment: [String: String] = ProcessInfo.processInfo.environment
) -> (message: String, status: Int32)? {
  let status = TesseraError.Code.configuration.exitCode
  let path = ConfigLocation.path(option: nil, environment: environment)
  let exited: Bool
  switch error {
  case .brokerExited(78, _): exited = true
  // Started by systemd (SystemdService=), a failed start reaches the bus as the unit's failure,
  // not as tesserad's exit status: a file with mistakes is then the cause to show.
  case .unreachable(let message) where message.hasPrefix(TesseraBroker.notRunning): exited = false
  default: return nil
  }
  guard case .problems(let problems) = checkConfig(option: nil, environment: environment) else {
    guard exited else { return nil }
    return (
      "tessera: tesserad stopped on a configuration error (exit status 78), but \(path) checks out here: tesserad may read another file (TESSERA_CONFIG in systemd's environment) or refuse this one for its permissions. Its message is in `journalctl --user -u tessera`.",
      status
    )
  }
  let last =
    exited
    ? "the Tessera broker cannot start until config.toml is fixed; `tessera config check` checks it again."
    : "the Tessera broker is not running, and config.toml has the mistakes above, which stop it from starting; fix them (`tessera config check` checks again), then retry."
  return ((problems.map { "tessera: \($0)" } + ["tessera: " + last]).joined(separator: "\n"), status)
}
