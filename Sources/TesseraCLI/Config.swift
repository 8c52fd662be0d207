import ArgumentParser
import SystemPackage
import TesseraClient
import TesseraInterface
import TesseraSystem

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
      abstract: "Show the configuration in force, with each setting's file; check it.",
      discussion: """
        tesserad reads the administrator's files first (/etc/tessera/config.toml, then \
        /etc/tessera/config.d/*.toml in name order), then yours (--config, else $TESSERA_CONFIG, \
        else $XDG_CONFIG_HOME/tessera/config.toml). A later file's setting replaces an earlier \
        one's, except where the administrator's [policy] locks it. See tessera-config(5).
        """,
      subcommands: [Show.self, Check.self], defaultSubcommand: Show.self)
  }
}

extension Tessera.Config {
  struct Show: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "show",
      abstract: "Print the configuration tesserad would use, and the file each setting comes from.",
      discussion: """
        Reads the files tesserad reads, combines them as tesserad does, and prints every setting \
        as config.toml would write it, with its source: the file and line, or "default". Keys \
        the administrator's [policy] locks are marked, and a setting of yours the policy ignores \
        is a warning on stderr:

          $ tessera config
          # Read in this order: /etc/tessera/config.toml, /home/ann/.config/tessera/config.toml
          default_authority = "https://login.microsoftonline.com/common"  # default
          trusted_authorities = ["https://idp.example.com/"]  # /etc/tessera/config.toml:2, locked
          log_level = "debug"  # /home/ann/.config/tessera/config.toml:1
          ...

        This is what the files say now: tesserad applies a change when it is reloaded \
        (systemctl --user reload tessera) or restarted; `tessera status` shows what it has in \
        force. A problem in any file is printed as `tessera config check` prints it (exit 15).
        """)

    @Option(name: .long, help: ArgumentHelp("Read this file as yours instead of the default.", valueName: "path"))
    var config: String?

    @Flag(
      name: .long,
      help:
        "Print JSON: {\"files\", \"settings\": {KEY: {\"value\", \"source\", \"locked\"}}, \"git\", \"providers\", \"policy\", \"warnings\"}."
    )
    var json = false

    struct Report: Encodable {
      var files: [String]
      var settings: [String: Setting]
      var git: [GitEntry]
      var providers: [Tessera.Provider.Entry]
      var policy: [String: JSONValue]
      var warnings: [String]

      struct Setting: Encodable {
        var value: JSONValue?
        /// "PATH:LINE", or nil for the default.
        var source: String?
        var locked: Bool

        func encode(to encoder: any Encoder) throws {
          var c = encoder.container(keyedBy: CodingKeys.self)
          try c.encode(value, forKey: .value)  // null, not absent, for an optional key not set
          try c.encode(source, forKey: .source)
          try c.encode(locked, forKey: .locked)
        }
        enum CodingKeys: String, CodingKey { case value, source, locked }
      }

      struct GitEntry: Encodable {
        var url: String
        var clientID: String
        /// "PATH:LINE" of its [[git]] header.
        var source: String
        enum CodingKeys: String, CodingKey {
          case url, source
          case clientID = "client_id"
        }
      }
    }

    func run() throws {
      let environment = ProcessInfo.processInfo.environment
      let effective: EffectiveConfig
      switch checkConfig(option: config, environment: environment) {
      case .checked(let loaded): effective = loaded
      case .problems(let problems):
        for problem in problems { printError(problem.description) }
        throw ExitCode(TesseraError.Code.configuration.exitCode)
      }
      let locked = Set(effective.policy.locked)
      if json {
        var settings: [String: Report.Setting] = [:]
        for key in BrokerConfig.Key.allCases {
          settings[key.rawValue] = Report.Setting(
            value: effective.config.value(of: key).map(JSONValue.init), source: effective.sources[key]?.description,
            locked: locked.contains(key))
        }
        var policy: [String: JSONValue] = [:]
        for key in ConfigPolicy.Key.allCases {
          if let value = effective.policy.value(of: key) { policy[key.rawValue] = JSONValue(value) }
        }
        printJSON(
          Report(
            files: effective.files, settings: settings,
            git: effective.config.gitRules.map {
              .init(
                url: $0.host + ($0.pathPrefix.isEmpty ? "" : "/" + $0.pathPrefix), clientID: $0.clientID,
                source: "\($0.file):\($0.line)")
            }, providers: effective.config.providers.map(Tessera.Provider.Entry.init), policy: policy,
            warnings: effective.warnings))
      } else {
        print(Self.text(effective))
      }
      for warning in effective.warnings { printError("tessera: warning: \(warning)") }
    }

    /// The configuration as TOML with a comment per line saying where it came from; valid as a
    /// user's config.toml (the policy is shown in comments).
    static func text(_ effective: EffectiveConfig) -> String {
      var lines: [String] = []
      lines.append(
        effective.files.isEmpty
          ? "# No configuration file: these are the defaults."
          : "# Read in this order: " + effective.files.map { SafeText.clip($0, limit: 500) }.joined(separator: ", "))
      let locked = Set(effective.policy.locked)
      for key in BrokerConfig.Key.allCases {
        let source = effective.sources[key]?.description ?? "default"
        let mark = locked.contains(key) ? ", locked" : ""
        guard let value = effective.config.value(of: key) else {
          lines.append("# \(key.rawValue) is not set  # \(source)\(mark)")
          continue
        }
        lines.append("\(key.rawValue) = \(value.toml)  # \(SafeText.clip(source, limit: 500))\(mark)")
      }
      for rule in effective.config.gitRules {
        lines.append("")
        lines.append("[[git]]  # \(SafeText.clip(rule.file, limit: 500)):\(rule.line)")
        lines.append(
          "url = \(ConfigFile.Value.string(rule.host + (rule.pathPrefix.isEmpty ? "" : "/" + rule.pathPrefix)).toml)")
        if !rule.clientID.isEmpty { lines.append("client_id = \(ConfigFile.Value.string(rule.clientID).toml)") }
        if let authority = rule.authority { lines.append("authority = \(ConfigFile.Value.string(authority).toml)") }
        if !rule.scopes.isEmpty {
          lines.append("scopes = \(ConfigFile.Value.array(rule.scopes.map { .string($0) }).toml)")
        }
        if let username = rule.username { lines.append("username = \(ConfigFile.Value.string(username).toml)") }
        if let account = rule.account { lines.append("account = \(ConfigFile.Value.string(account).toml)") }
      }
      for provider in effective.config.providers {
        lines.append("")
        lines += Tessera.Provider.tableLines(provider)
      }
      if !effective.policy.isEmpty {
        lines.append("")
        lines.append(
          "# The administrator's [policy], from "
            + effective.policy.files.map { SafeText.clip($0, limit: 500) }.joined(separator: ", ") + ":")
        for key in ConfigPolicy.Key.allCases {
          if let value = effective.policy.value(of: key) { lines.append("#   \(key.rawValue) = \(value.toml)") }
        }
      }
      return lines.joined(separator: "\n")
    }
  }

  struct Check: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "check",
      abstract: "Check the configuration's files as tesserad would, without starting anything.",
      discussion: """
        Reads the files tesserad reads (the administrator's /etc/tessera/config.toml and \
        config.d/*.toml, then yours: --config, else $TESSERA_CONFIG, else \
        $XDG_CONFIG_HOME/tessera/config.toml) and checks them with tesserad's own check: the \
        TOML, every key, its type and value, the authority URLs, the [[git]] entries, the \
        administrator's [policy], and who may write each file. Anything tesserad does not know \
        or cannot use is an error, with its file, line and key; a mistyped name gets the \
        nearest known one:

          $ tessera config check
          /home/ann/.config/tessera/config.toml:3: key 'default_scope': unknown key; did you mean 'default_scopes'?

        Each error goes to stderr and the exit status is 15; good files print "PATH: OK", and a \
        setting of yours that the administrator's policy ignores is a warning (exit 0). No file \
        at the default path is not an error: tesserad then uses the defaults. It needs no bus and \
        starts nothing; reload tesserad to apply a change (systemctl --user reload tessera). See \
        tessera-config(5).
        """)

    @Option(name: .long, help: ArgumentHelp("Check this file as yours instead of the default.", valueName: "path"))
    var config: String?

    @Flag(
      name: .long,
      help:
        "Print the result as JSON: {\"path\", \"exists\", \"files\", \"ok\", \"errors\": [{\"path\", \"line\", \"key\", \"message\"}], \"warnings\"}."
    )
    var json = false

    /// `tessera config check --json`.
    struct Report: Encodable {
      /// The user's file.
      var path: String
      var exists: Bool
      /// Every file read, in order.
      var files: [String]
      var ok: Bool
      var errors: [Problem]
      var warnings: [String]

      struct Problem: Encodable {
        var path: String
        var line: Int?
        var key: String?
        var message: String

        func encode(to encoder: any Encoder) throws {
          var c = encoder.container(keyedBy: CodingKeys.self)
          try c.encode(path, forKey: .path)
          try c.encode(line, forKey: .line)  // null, not absent, for the file as a whole
          try c.encode(key, forKey: .key)
          try c.encode(message, forKey: .message)
        }

        enum CodingKeys: String, CodingKey { case path, line, key, message }
      }
    }

    func run() throws {
      let environment = ProcessInfo.processInfo.environment
      let path = ConfigLocation.path(option: config, environment: environment)
      let result = checkConfig(option: config, environment: environment)
      var problems: [ConfigProblem] = []
      var effective = EffectiveConfig()
      switch result {
      case .checked(let loaded): effective = loaded
      case .problems(let list): problems = list
      }
      let exists = access(path, F_OK) == 0
      if json {
        printJSON(
          Report(
            path: path, exists: exists, files: effective.files, ok: problems.isEmpty,
            errors: problems.map { Report.Problem(path: $0.path, line: $0.line, key: $0.key, message: $0.message) },
            warnings: effective.warnings))
      } else if problems.isEmpty {
        for file in effective.files { print("\(SafeText.clip(file, limit: 500)): OK") }
        if !exists {
          print(
            effective.files.isEmpty
              ? "\(path): no such file; tesserad uses the defaults (see tessera-config(5))."
              : "\(path): no such file; tesserad uses the administrator's files above and the defaults (see tessera-config(5))."
          )
        }
        for warning in effective.warnings { printError("tessera: warning: \(warning)") }
      } else {
        for problem in problems { printError(problem.description) }
      }
      if !problems.isEmpty { throw ExitCode(TesseraError.Code.configuration.exitCode) }
    }
  }
}

/// A config value as JSON.
enum JSONValue: Encodable {
  case string(String)
  case integer(Int64)
  case bool(Bool)
  case array([JSONValue])

  init(_ value: ConfigFile.Value) {
    switch value {
    case .string(let s): self = .string(s)
    case .integer(let n): self = .integer(n)
    case .bool(let b): self = .bool(b)
    case .array(let list): self = .array(list.map(JSONValue.init))
    }
  }

  func encode(to encoder: any Encoder) throws {
    var c = encoder.singleValueContainer()
    switch self {
    case .string(let s): try c.encode(s)
    case .integer(let n): try c.encode(n)
    case .bool(let b): try c.encode(b)
    case .array(let list): try c.encode(list)
    }
  }
}

/// The configuration as tesserad would take it.
enum ConfigCheck {
  /// Every file passed tesserad's check (none at all: the defaults).
  case checked(EffectiveConfig)
  /// What is wrong, file by file in the order of the lines (a file that cannot be read is one
  /// problem without a line).
  case problems([ConfigProblem])
}

/// Reads and checks the configuration exactly as tesserad does at start (ConfigFiles.load): the
/// administrator's files, then the user's (`option`, else $TESSERA_CONFIG, else the default
/// path), with the same size limit, the same check and the same policy. A file named by `option`
/// or $TESSERA_CONFIG must exist; at the default path, none means the defaults.
func checkConfig(option: String?, environment: [String: String]) -> ConfigCheck {
  switch ConfigFiles.load(option: option, environment: environment) {
  case .loaded(let effective): .checked(effective)
  case .problems(let problems): .problems(problems)
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
  // A mistake in the administrator's files is theirs to fix.
  let system = ConfigLocation.systemDirectory(environment: environment)
  if problems.contains(where: { $0.path.hasPrefix(system + "/") }) {
    let last =
      "the Tessera broker cannot start until the administrator fixes the files in \(system) (the mistakes above); `tessera config check` checks them again."
    return ((problems.map { "tessera: \($0)" } + ["tessera: " + last]).joined(separator: "\n"), status)
  }
  let last =
    exited
    ? "the Tessera broker cannot start until config.toml is fixed; `tessera config check` checks it again."
    : "the Tessera broker is not running, and config.toml has the mistakes above, which stop it from starting; fix them (`tessera config check` checks again), then retry."
  return ((problems.map { "tessera: \($0)" } + ["tessera: " + last]).joined(separator: "\n"), status)
}
