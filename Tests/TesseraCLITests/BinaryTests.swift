import Foundation
import TesseraInterface
import TesseraTestSupport
import Testing

/// The `tessera` binary as a user (or git, kubectl, a mail client, a script) runs it: its stdout,
/// stderr and exit status, against a scripted org.tessera.Broker1 on a private dbus-daemon. Like
/// swift-argument-parser's tests of its examples, these run the built program, not its functions.
@Suite(.serialized)
struct BinaryTests {
  struct Outcome {
    var status: Int32
    var stdout: String
    var stderr: String
  }

  /// The built binary beside this test bundle (`swift build` makes it; `swift test` builds it too).
  static let binary: String = {
    var buffer = [CChar](repeating: 0, count: 4096)
    let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    let bundle = String(decoding: buffer[0..<max(n, 0)].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    return (bundle as NSString).deletingLastPathComponent + "/tessera"
  }()

  static let alice = AccountInfo(
    id: "alice-sub.0a1b2c", username: "alice@idp.test", name: "Alice Liddell", authority: "https://idp.test/tenant",
    environment: "idp.test", realm: "tenant", localAccountID: "alice-sub")

  static func token(_ secret: String = "at-cli-1", expiresOn: Int64 = 1_900_000_000) -> [BusValue] {
    [
      .dict(
        TokenInfo(
          accessToken: secret, tokenType: "Bearer", expiresOn: expiresOn, scopes: ["read"], account: alice,
          idToken: nil, correlationID: "c-1"
        ).busValue)
    ]
  }

  /// A home of the test's own: no config.toml unless the test writes one.
  let home: String = {
    let path = NSTemporaryDirectory() + "tessera-cli-\(UUID().uuidString)"
    try? FileManager.default.createDirectory(atPath: path + "/.config/tessera", withIntermediateDirectories: true)
    return path
  }()

  func run(
    _ arguments: [String], stdin: String = "", environment extra: [String: String] = [:],
    program: String = BinaryTests.binary
  ) throws -> Outcome {
    #expect(FileManager.default.isExecutableFile(atPath: Self.binary), "build tessera first: swift build")
    let process = Process()
    process.executableURL = URL(fileURLWithPath: program)
    process.arguments = arguments
    var environment = [
      "PATH": "/usr/bin:/bin", "HOME": home, "XDG_CONFIG_HOME": home + "/.config",
      "DBUS_SESSION_BUS_ADDRESS": try PrivateBus.ensure(), "LANG": "C.UTF-8",
      // No tesserad socket there: the CLI takes the private bus, whatever runs in the session.
      "XDG_RUNTIME_DIR": home + "/run",
      // The administrator's files: none unless a test writes them (the machine's /etc/tessera
      // plays no part).
      "TESSERA_SYSTEM_CONFIG_DIR": home + "/etc-tessera",
    ]
    // The sanitizer runs of the test command (scripts/test) set these; the binary is built with the
    // same sanitizer and reads its options from them.
    for key in ["ASAN_OPTIONS", "TSAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS"] {
      if let value = ProcessInfo.processInfo.environment[key] { environment[key] = value }
    }
    environment.merge(extra) { $1 }
    process.environment = environment
    let (input, output, errors) = (Pipe(), Pipe(), Pipe())
    process.standardInput = input
    process.standardOutput = output
    process.standardError = errors
    try process.run()
    input.fileHandleForWriting.write(Data(stdin.utf8))
    try input.fileHandleForWriting.close()
    let out = output.fileHandleForReading.readDataToEndOfFile()
    let err = errors.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return Outcome(
      status: process.terminationStatus, stdout: String(decoding: out, as: UTF8.self),
      stderr: String(decoding: err, as: UTF8.self))
  }

  // MARK: Help, version, usage

  @Test func helpTeachesTheSubcommandsAndListsEveryExitStatus() throws {
    let help = try run(["--help"])
    #expect(help.status == 0)
    for subcommand in ["login", "token", "accounts", "logout", "status", "git-credential", "kube-credential", "sasl"] {
      #expect(help.stdout.contains("  \(subcommand)"), "subcommand \(subcommand)")
    }
    #expect(help.stdout.contains("Authorization: Bearer $(tessera token)"))
    #expect(help.stdout.contains("EXIT STATUS"))
    for (status, _, summary) in ClientExitStatus.all {
      #expect(help.stdout.contains("\(status)  \(summary)"), "exit status \(status)")
    }
    #expect(help.stderr.isEmpty)
  }

  @Test func versionIsTheBrokersInterfaceVersion() throws {
    let version = try run(["--version"])
    #expect(version.status == 0)
    #expect(version.stdout == BrokerInterface.version + "\n")
    // The same through the full parser: `--version` given twice is not the fast path's line.
    let parsed = try run(["--version", "--version"])
    #expect(parsed.status == 0)
    #expect(parsed.stdout == version.stdout)
  }

  @Test func aMistypedSubcommandIsAUsageError() throws {
    let wrong = try run(["tokn"])
    #expect(wrong.status == ClientExitStatus.usage.rawValue)
    #expect(wrong.stderr == "tessera: 'tokn' is not a tessera command. Did you mean 'token'? See `tessera --help`.\n")
    #expect(wrong.stdout.isEmpty)
    let login = try run(["logn"])
    #expect(login.stderr.contains("Did you mean 'login'?"))
    let far = try run(["frobnicate"])
    #expect(far.status == ClientExitStatus.usage.rawValue)
    #expect(far.stderr.contains("The commands are login, token, accounts, account,"))
    #expect(try run(["help", "token"]).status == 0, "help is a command too")
    let exec = try run(["exec", "--env", "PATH", "--", "true"])
    #expect(exec.status == ClientExitStatus.usage.rawValue)
    #expect(exec.stderr.contains("--env PATH would replace the search path"))
  }

  // MARK: No broker

  @Test func withoutASessionBusOrASocketTheBrokerIsNotRunningAndItSaysHowToStartIt() throws {
    let outcome = try run(["token"], environment: ["DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent/tessera-bus"])
    #expect(outcome.status == ClientExitStatus.brokerNotRunning.rawValue)
    #expect(outcome.stderr.contains("its socket \(home)/run/tessera/bus is not there"))
    #expect(outcome.stderr.contains("there is no session bus either"))
    #expect(outcome.stderr.contains("systemctl --user enable --now tessera.socket"))
    #expect(outcome.stdout.isEmpty)
    // With --bus only the bus is tried, and that is what it says.
    let bus = try run(
      ["--bus", "token"], environment: ["DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent/tessera-bus"])
    #expect(bus.status == ClientExitStatus.brokerNotRunning.rawValue)
    #expect(bus.stderr.contains("Cannot connect to the session bus"))
  }

  @Test func onABusWithoutTheBrokerItSaysHowToStartIt() throws {
    let outcome = try run(["accounts"], environment: ["DBUS_SESSION_BUS_ADDRESS": try PrivateBus.another()])
    #expect(outcome.status == ClientExitStatus.brokerNotRunning.rawValue)
    #expect(outcome.stderr.contains("The Tessera broker is not running"))
    #expect(outcome.stderr.contains("systemctl --user start tessera"))
  }

  @Test func aBrokerThatCannotStartWithAConfigMistakeShowsTheMistake() throws {
    // As under systemd activation, where the bus reports the unit's failure and no exit status:
    // with a mistake in config.toml, the mistake is what is shown, with the configuration status.
    try writeConfig("default_scope = [\"a\"]\n")
    let outcome = try run(["token"], environment: ["DBUS_SESSION_BUS_ADDRESS": try PrivateBus.another()])
    #expect(outcome.status == TesseraError.Code.configuration.exitCode)
    #expect(outcome.stderr.contains(":1: key 'default_scope': unknown key; did you mean 'default_scopes'?"))
    #expect(outcome.stderr.contains("the Tessera broker is not running, and config.toml has the mistakes above"))
  }

  // MARK: Tokens

  @Test func tokenPrintsTheBareTokenAndSendsTheTarget() async throws {
    try await ScriptedBroker.with({ _ in .success(Self.token()) }) { broker in
      let outcome = try run(["token", "--client-id", "app-1", "--scope", "read", "--scope", "write"])
      #expect(outcome.status == 0)
      #expect(outcome.stdout == "at-cli-1\n")
      #expect(outcome.stderr.isEmpty)
      let call = try #require(broker.calls.last)
      #expect(call.member == BrokerInterface.MethodName.acquireTokenSilent.rawValue)
      #expect(Array(call.arguments.prefix(3)) == [.string("app-1"), .strings(["read", "write"]), .string("")])
    }
  }

  @Test func tokenJSONCarriesTheAccountButNeverARefreshToken() async throws {
    try await ScriptedBroker.with({ _ in .success(Self.token()) }) { _ in
      let outcome = try run(["token", "--json"])
      #expect(outcome.status == 0)
      let json = try #require(try JSONSerialization.jsonObject(with: Data(outcome.stdout.utf8)) as? [String: Any])
      #expect(json["access_token"] as? String == "at-cli-1")
      #expect((json["account"] as? [String: Any])?["username"] as? String == "alice@idp.test")
      #expect(!outcome.stdout.contains("refresh"))
    }
  }

  @Test func aBrokerErrorIsItsNameItsMessageAndItsExitStatus() async throws {
    try await ScriptedBroker.with({ _ in
      .failure(.interactionRequired("alice@idp.test has not signed in to client app-1 yet. Run `tessera login`."))
    }) { _ in
      let outcome = try run(["token", "--client-id", "app-1"])
      #expect(outcome.status == TesseraError.Code.interactionRequired.exitCode)
      #expect(
        outcome.stderr
          == "tessera: InteractionRequired: alice@idp.test has not signed in to client app-1 yet. Run `tessera login`.\n"
      )
      #expect(outcome.stdout.isEmpty)
    }
  }

  @Test func accountsByUsernameResolveToTheirId() async throws {
    try await ScriptedBroker.with({ call in
      call.member == "GetAccounts" ? .success([.dicts([Self.alice.busValue])]) : .success(Self.token())
    }) { broker in
      let outcome = try run(["token", "--account", "ALICE@idp.test"])
      #expect(outcome.status == 0)
      #expect(broker.calls.last?.arguments[2] == .string(Self.alice.id))
      let unknown = try run(["token", "--account", "bob@idp.test"])
      #expect(unknown.status == TesseraError.Code.noSuchAccount.exitCode)
      #expect(unknown.stderr.contains("No signed-in account is 'bob@idp.test'"))
    }
  }

  // MARK: config.toml

  var configPath: String { home + "/.config/tessera/config.toml" }

  @Test func configCheckSaysOKForAGoodFileAndNothingForNone() throws {
    let none = try run(["config", "check"])
    #expect(none.status == 0)
    #expect(none.stdout == "\(configPath): no such file; tesserad uses the defaults (see tessera-config(5)).\n")
    #expect(none.stderr.isEmpty)
    try writeConfig("default_client_id = \"app\"\ndefault_scopes = [\"read\"]\n\n[[git]]\nurl = \"git.example.com\"\n")
    let good = try run(["config", "check"])
    #expect(good.status == 0)
    #expect(good.stdout == "\(configPath): OK\n")
    #expect(good.stderr.isEmpty)
    // TESSERA_CONFIG, as tesserad reads it, and --config before it.
    let other = home + "/other.toml"
    try "colour = 1\n".write(toFile: other, atomically: true, encoding: .utf8)
    let named = try run(["config", "check"], environment: ["TESSERA_CONFIG": other])
    #expect(named.status == 15)
    #expect(named.stderr.hasPrefix("\(other):1: key 'colour': unknown key; known keys are default_authority, "))
    #expect(try run(["config", "check", "--config", configPath], environment: ["TESSERA_CONFIG": other]).status == 0)
  }

  @Test func configCheckNamesTheLineAndKeyAndSuggestsTheNearestName() throws {
    try writeConfig("default_client_id = \"app\"\ndefault_scope = [\"read\"]\n")
    let typo = try run(["config", "check"])
    #expect(typo.status == 15)
    #expect(typo.stdout.isEmpty)
    #expect(typo.stderr == "\(configPath):2: key 'default_scope': unknown key; did you mean 'default_scopes'?\n")

    try writeConfig("log_level = \"info\"\n\n[[gti]]\nurl = \"git.example.com\"\n")
    let table = try run(["config", "check"])
    #expect(table.status == 15)
    #expect(table.stderr == "\(configPath):3: table [[gti]]: unknown table; did you mean [[git]]?\n")

    try writeConfig("[[git]]\nurl = \"git.example.com\"\n\n[[git]]\nclient_id = \"a\"\nscope = [\"repo\"]\n")
    let git = try run(["config", "check"])
    #expect(git.status == 15)
    #expect(
      git.stderr
        == "\(configPath):6: [[git]] key 'scope': unknown key; did you mean 'scopes'?\n")
  }

  @Test func configCheckJSON() throws {
    try writeConfig("default_scope = [\"read\"]\nredirect_port = 99999\n")
    let bad = try run(["config", "check", "--json"])
    #expect(bad.status == 15)
    let report = try #require(try JSONSerialization.jsonObject(with: Data(bad.stdout.utf8)) as? [String: Any])
    #expect(report["path"] as? String == configPath)
    #expect(report["ok"] as? Bool == false)
    #expect(report["exists"] as? Bool == true)
    let errors = try #require(report["errors"] as? [[String: Any]])
    #expect(errors.count == 2)
    #expect(errors.first?["line"] as? Int == 1)
    #expect(errors.first?["key"] as? String == "default_scope")
    #expect(errors.first?["message"] as? String == "key 'default_scope': unknown key; did you mean 'default_scopes'?")
    #expect(errors.last?["message"] as? String == "key 'redirect_port': must be a port number 0–65535")

    try writeConfig("log_level = \"debug\"\n")
    let good = try run(["config", "check", "--json"])
    #expect(good.status == 0)
    let ok = try #require(try JSONSerialization.jsonObject(with: Data(good.stdout.utf8)) as? [String: Any])
    #expect(ok["ok"] as? Bool == true)
    #expect((ok["errors"] as? [Any])?.isEmpty == true)
  }

  @Test func configCheckOfAMissingOrHugeNamedFileIsAnError() throws {
    let missing = try run(["config", "check", "--config", home + "/nope.toml"])
    #expect(missing.status == 15)
    #expect(missing.stderr == "\(home)/nope.toml: cannot be read: No such file or directory; check the path\n")
    let json = try run(["config", "check", "--json", "--config", home + "/nope.toml"])
    #expect(json.status == 15)
    let report = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
    let errors = try #require(report["errors"] as? [[String: Any]])
    #expect(errors.count == 1 && errors[0]["line"] is NSNull)

    let huge = Data(repeating: UInt8(ascii: "#"), count: (16 << 20) + 1)
    try huge.write(to: URL(fileURLWithPath: configPath))
    let big = try run(["config", "check"])
    #expect(big.status == 15)
    #expect(big.stderr == "\(configPath): is larger than 16 MiB, and is refused; point --config at the right file\n")
  }

  /// The administrator's files under the test's home (TESSERA_SYSTEM_CONFIG_DIR).
  func writeSystemConfig(_ name: String, _ text: String) throws {
    let directory = home + "/etc-tessera" + (name.contains("/") ? "/config.d" : "")
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    try text.write(toFile: home + "/etc-tessera/" + name, atomically: true, encoding: .utf8)
  }

  @Test func configShowsEachSettingsFileTheLocksAndWarnsOfAnIgnoredSetting() throws {
    try writeSystemConfig(
      "config.toml",
      "trusted_authorities = [\"https://idp.example.com/\"]\n[policy]\nlocked = [\"trusted_authorities\"]\n")
    try writeSystemConfig("config.d/20-site.toml", "log_level = \"notice\"\ndefault_client_id = \"site\"\n")
    try writeConfig("log_level = \"debug\"\ntrusted_authorities = [\"https://evil.example.com/\"]\n")
    let system = home + "/etc-tessera/config.toml"
    let shown = try run(["config"])
    #expect(shown.status == 0)
    let lines = shown.stdout.split(separator: "\n").map(String.init)
    #expect(lines.first == "# Read in this order: \(system), \(home)/etc-tessera/config.d/20-site.toml, \(configPath)")
    #expect(lines.contains("trusted_authorities = [\"https://idp.example.com/\"]  # \(system):1, locked"))
    #expect(lines.contains("log_level = \"debug\"  # \(configPath):1"))
    #expect(lines.contains("default_client_id = \"site\"  # \(home)/etc-tessera/config.d/20-site.toml:2"))
    #expect(lines.contains("store = \"auto\"  # default"))
    #expect(
      shown.stderr
        == "tessera: warning: \(configPath):2: key 'trusted_authorities' is locked by the administrator's [policy] (\(system)), so this setting is ignored; the administrator's value (\(system):1) stays\n"
    )
    let json = try run(["config", "show", "--json"])
    let report = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
    let settings = try #require(report["settings"] as? [String: [String: Any]])
    #expect(settings["trusted_authorities"]?["locked"] as? Bool == true)
    #expect(settings["trusted_authorities"]?["value"] as? [String] == ["https://idp.example.com/"])
    #expect(settings["log_level"]?["source"] as? String == "\(configPath):1")
    #expect(settings["ca_file"]?["value"] is NSNull)
    #expect((report["warnings"] as? [String])?.count == 1)
    // The check agrees: every file OK, the warning on stderr, exit 0.
    let check = try run(["config", "check"])
    #expect(check.status == 0)
    #expect(check.stdout == "\(system): OK\n\(home)/etc-tessera/config.d/20-site.toml: OK\n\(configPath): OK\n")
    #expect(check.stderr.contains("is locked by the administrator's [policy]"))
    // A mistake in the administrator's file is a mistake of the whole configuration.
    try writeSystemConfig("config.d/30-bad.toml", "[policy]\nallow_forwarding = \"no\"\n")
    let bad = try run(["config"])
    #expect(bad.status == 15)
    #expect(
      bad.stderr
        == "\(home)/etc-tessera/config.d/30-bad.toml:2: [policy] key 'allow_forwarding': must be true or false\n")
  }

  @Test func configCheckWithOnlyTheAdministratorsFileSaysTheyApply() throws {
    try writeSystemConfig("config.toml", "log_level = \"notice\"\n")
    let check = try run(["config", "check"])
    #expect(check.status == 0)
    #expect(
      check.stdout
        == "\(home)/etc-tessera/config.toml: OK\n\(configPath): no such file; tesserad uses the administrator's files above and the defaults (see tessera-config(5)).\n"
    )
    #expect(try run(["config"]).stdout.contains("log_level = \"notice\"  # \(home)/etc-tessera/config.toml:1"))
  }

  @Test func configCheckHelpHasAnExample() throws {
    let help = try run(["config", "check", "--help"])
    #expect(help.status == 0)
    #expect(help.stdout.contains("did you mean 'default_scopes'?"))
    #expect(help.stdout.contains("--json"))
    #expect(try run(["--help"]).stdout.contains("  config"))
  }

  /// A bus that "activates" the broker by running `script`, as the session bus runs tesserad.
  func activatingBus(exitStatus: Int32) throws -> String {
    let services = home + "/services"
    try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
    let script = services + "/fake-tesserad"
    try "#!/bin/sh\necho 'tesserad: bad configuration' >&2\nexit \(exitStatus)\n".write(
      toFile: script, atomically: true, encoding: .utf8)
    chmod(script, 0o755)
    try "[D-BUS Service]\nName=\(BrokerInterface.busName)\nExec=\(script)\n".write(
      toFile: services + "/\(BrokerInterface.busName).service", atomically: true, encoding: .utf8)
    return try PrivateBus.activating(serviceDirectory: services)
  }

  @Test func aBrokerThatRefusedItsConfigurationIsExplainedWithTheFilesProblem() throws {
    let bus = try activatingBus(exitStatus: 78)
    try writeConfig("default_client_id = \"app\"\ndefault_scope = [\"read\"]\n")
    let status = try run(["status"], environment: ["DBUS_SESSION_BUS_ADDRESS": bus])
    #expect(status.status == 15)
    #expect(
      status.stdout
        == """
        tesserad is not running:
          \(configPath):2: key 'default_scope': unknown key; did you mean 'default_scopes'?
          the Tessera broker cannot start until config.toml is fixed; `tessera config check` checks it again.

        """)
    for command in [["token"], ["accounts"]] {
      let outcome = try run(command, environment: ["DBUS_SESSION_BUS_ADDRESS": bus])
      #expect(outcome.status == 15, "\(command)")
      #expect(outcome.stdout.isEmpty)
      #expect(
        outcome.stderr
          == """
          tessera: \(configPath):2: key 'default_scope': unknown key; did you mean 'default_scopes'?
          tessera: the Tessera broker cannot start until config.toml is fixed; `tessera config check` checks it again.

          """, "\(command)")
    }
    // The file checks out here: tesserad read another one (or refused this one's permissions).
    try writeConfig("default_client_id = \"app\"\n")
    let elsewhere = try run(["token"], environment: ["DBUS_SESSION_BUS_ADDRESS": bus])
    #expect(elsewhere.status == 15)
    #expect(elsewhere.stderr.contains("tesserad stopped on a configuration error (exit status 78)"))
    #expect(elsewhere.stderr.contains("journalctl --user -u tessera"))
  }

  @Test func aBrokerThatFailedForAnotherReasonIsStillNotRunning() throws {
    let bus = try activatingBus(exitStatus: 1)
    try writeConfig("default_scope = [\"read\"]\n")
    let outcome = try run(["token"], environment: ["DBUS_SESSION_BUS_ADDRESS": bus])
    #expect(outcome.status == ClientExitStatus.brokerNotRunning.rawValue)
    #expect(outcome.stderr.contains("The Tessera broker is not running"))
    #expect(!outcome.stderr.contains("default_scope"))
  }

  // MARK: The helpers' protocols

  func writeConfig(_ text: String) throws {
    try text.write(toFile: home + "/.config/tessera/config.toml", atomically: true, encoding: .utf8)
  }

  @Test func gitCredentialAnswersItsHostAndLetsOthersThrough() async throws {
    try await ScriptedBroker.with({ _ in .success(Self.token("at-git")) }) { _ in
      try writeConfig(
        """
        [[git]]
        url = "https://git.example.com/team/"
        client_id = "app-git"
        scopes = ["repo"]
        username = "oauth2"
        """)
      let request = "protocol=https\nhost=git.example.com\npath=team/tool.git\n\n"
      let outcome = try run(["git-credential", "get"], stdin: request)
      #expect(outcome.status == 0)
      #expect(outcome.stdout.contains("username=oauth2\n"))
      #expect(outcome.stdout.contains("password=at-git\n"))
      // As git runs it: `credential.helper tessera` is git-credential-tessera.
      let link = home + "/git-credential-tessera"
      try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: Self.binary)
      let asGit = try run(["get"], stdin: request, program: link)
      #expect(asGit.stdout == outcome.stdout)
      // Another host, or another path: nothing, so git asks its next helper.
      for other in [
        "protocol=https\nhost=elsewhere.example\n\n", "protocol=https\nhost=git.example.com\npath=other/x\n\n",
      ] {
        let passed = try run(["git-credential", "get"], stdin: other)
        #expect(passed.status == 0)
        #expect(passed.stdout.isEmpty)
      }
    }
  }

  @Test func gitCredentialSaysWhenGitSendsNoPathForAnEntryWithOne() async throws {
    try await ScriptedBroker.with({ _ in .success(Self.token("at-git")) }) { broker in
      try writeConfig(
        """
        [[git]]
        url = "https://dev.azure.com/contoso/"
        client_id = "app-git"
        """)
      // git without credential.useHttpPath: the host only. No answer (git asks its next helper),
      // one line saying what to run, and no call to the broker.
      let hinted = try run(["git-credential", "get"], stdin: "protocol=https\nhost=dev.azure.com\n\n")
      #expect(hinted.status == 0)
      #expect(hinted.stdout.isEmpty)
      #expect(hinted.stderr.split(separator: "\n").count == 1)
      #expect(hinted.stderr.contains("git config --global credential.https://dev.azure.com.useHttpPath true"))
      #expect(broker.calls.isEmpty)
      // Another host, another path of the host, and erase: no hint.
      for quiet in [
        ["get", "protocol=https\nhost=elsewhere.example\n\n"],
        ["get", "protocol=https\nhost=dev.azure.com\npath=other/x\n\n"],
        ["erase", "protocol=https\nhost=dev.azure.com\npassword=x\n\n"],
      ] {
        let passed = try run(["git-credential", quiet[0]], stdin: quiet[1])
        #expect(passed.status == 0 && passed.stdout.isEmpty && passed.stderr.isEmpty, "\(quiet)")
      }
    }
  }

  @Test func gitCredentialFailsOnAnyMistakeInConfigToml() throws {
    let request = "protocol=https\nhost=git.example.com\n\n"
    try writeConfig("[[git]]\nurl = \"git.example.com\"\n\n[[gti]]\nurl = \"other.example.com\"\n")
    let table = try run(["git-credential", "get"], stdin: request)
    #expect(table.status == 15)
    #expect(table.stdout.isEmpty)
    #expect(
      table.stderr == "tessera git-credential: \(configPath):4: table [[gti]]: unknown table; did you mean [[git]]?\n")
    try writeConfig("default_scope = [\"a\"]\n[[git]]\nurl = \"git.example.com\"\nclientid = \"x\"\n")
    let two = try run(["git-credential", "get"], stdin: request)
    #expect(two.status == 15)
    #expect(
      two.stderr
        == "tessera git-credential: \(configPath):1: key 'default_scope': unknown key; did you mean 'default_scopes'? (and 1 more: see `tessera config check`)\n"
    )
  }

  @Test func kubeCredentialAnswersInTheVersionKubectlAsksFor() async throws {
    try await ScriptedBroker.with({ _ in .success(Self.token("at-kube", expiresOn: 1_900_000_000)) }) { _ in
      let info =
        #"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","spec":{"interactive":false}}"#
      let outcome = try run(["kube-credential", "--client-id", "app-k"], environment: ["KUBERNETES_EXEC_INFO": info])
      #expect(outcome.status == 0)
      #expect(
        outcome.stdout
          == #"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"expirationTimestamp":"2030-03-17T17:46:40Z","token":"at-kube"}}"#
          + "\n")
      let bad = try run(["kube-credential"], environment: ["KUBERNETES_EXEC_INFO": "not json"])
      #expect(bad.status == ClientExitStatus.usage.rawValue)
      #expect(bad.stderr.contains("KUBERNETES_EXEC_INFO is not an ExecCredential JSON object"))
    }
  }

  @Test func kubeCredentialNeverPromptsWhenKubectlIsNotInteractive() async throws {
    try await ScriptedBroker.with({ _ in .failure(.interactionRequired("Sign in first.")) }) { _ in
      let info = #"{"apiVersion":"client.authentication.k8s.io/v1","spec":{"interactive":false}}"#
      let outcome = try run(["kube-credential", "--client-id", "app-k"], environment: ["KUBERNETES_EXEC_INFO": info])
      #expect(outcome.status == TesseraError.Code.interactionRequired.exitCode)
      #expect(outcome.stderr.contains("run `tessera login --client-id app-k` in a terminal"))
      #expect(outcome.stdout.isEmpty, "kubectl reads stdout: nothing but a credential goes there")
    }
  }

  @Test func saslPrintsTheInitialResponseOfEachMechanism() async throws {
    try await ScriptedBroker.with({ _ in .success(Self.token("at-mail")) }) { _ in
      let xoauth2 = try run(["sasl", "--mech", "xoauth2"])
      #expect(xoauth2.status == 0)
      let decoded = Data(base64Encoded: xoauth2.stdout.trimmingCharacters(in: .newlines)).map {
        String(decoding: $0, as: UTF8.self)
      }
      #expect(decoded == "user=alice@idp.test\u{1}auth=Bearer at-mail\u{1}\u{1}")
      let bearer = try run(["sasl", "--mech", "oauthbearer", "--user", "a,b=c", "--host", "imap.test", "--port", "993"])
      let fields = Data(base64Encoded: bearer.stdout.trimmingCharacters(in: .newlines)).map {
        String(decoding: $0, as: UTF8.self)
      }
      #expect(fields == "n,a=a=2Cb=3Dc,\u{1}host=imap.test\u{1}port=993\u{1}auth=Bearer at-mail\u{1}\u{1}")
    }
  }

  @Test func execRunsTheCommandWithTheTokenInItsEnvironmentOnly() async throws {
    try await ScriptedBroker.with({ _ in .success(Self.token("at-exec")) }) { _ in
      let outcome = try run(["exec", "--env", "API_TOKEN", "--", "/bin/sh", "-c", #"printf '%s|%s' "$API_TOKEN" "$0""#])
      #expect(outcome.status == 0)
      #expect(outcome.stdout == "at-exec|/bin/sh")
      #expect(try run(["exec", "--", "/bin/sh", "-c", "exit 3"]).status == 3, "the command's own status")
      let missing = try run(["exec", "--", "no-such-command-here"])
      #expect(missing.status == ClientExitStatus.commandNotFound.rawValue)
      #expect(missing.stderr.contains("cannot run no-such-command-here"))
    }
  }

  // MARK: Management

  @Test func accessListAndStatusPrintTheBrokersTypedAnswers() async throws {
    let grant = GrantInfo(
      app: "exe:/usr/bin/mutt", appDisplay: "/usr/bin/mutt (unverified)", clientID: "app-m", accountID: Self.alice.id,
      account: "alice@idp.test", grantedAt: 1_900_000_000, via: "command", scopes: ["Mail.Send"], operations: ["token"])
    let report = StatusReport.Report(
      storeProblem: "The login keyring is locked.", accounts: [], attentionNeeded: [Self.alice.id])
    try await ScriptedBroker.with({ call in
      switch call.member {
      case "ListGrants": .success([.dicts([grant.busValue])])
      case "GetStatus": .success([.dict(report.busValue)])
      case "GetAccounts": .success([.dicts([])])
      default: .failure(.internal("unexpected \(call.member)"))
      }
    }) { _ in
      let list = try run(["access", "list"])
      #expect(list.status == 0)
      #expect(
        list.stdout
          == "/usr/bin/mutt (unverified)\tapp-m\talice@idp.test\tscopes Mail.Send; only token\tcommand 2030-03-17T17:46:40Z\texe:/usr/bin/mutt\n"
      )
      let json = try run(["access", "list", "--json"])
      let grants = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [[String: Any]])
      #expect(grants.first?["app_display"] as? String == "/usr/bin/mutt (unverified)")
      #expect(grants.first?["granted_at"] as? Int == 1_900_000_000)
      #expect(grants.first?["authority"] == nil, "a limit that is not there is not printed")

      let status = try run(["status"])
      #expect(status.status == TesseraError.Code.storeUnavailable.exitCode, "status says so when attention is needed")
      #expect(status.stdout.contains("is running, but cannot read the keyring: The login keyring is locked."))
    }
  }
}
