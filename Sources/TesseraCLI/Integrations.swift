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

// The helpers other programs run: git's credential helper, kubectl's exec plugin, the SASL initial
// response for mail clients, and `tessera exec`. Each writes only its protocol's output to stdout;
// prompts, links and errors go to stderr, so nothing stray reaches the program reading stdout.

/// Where the account and token come from, for the helpers that take the usual token options.
struct TokenTarget: ParsableArguments {
  @OptionGroup var target: Target
  @Option(
    name: .long,
    help: ArgumentHelp(
      "Account id or username (default: the only or current account).", valueName: "account"),
    completion: accountCompletion)
  var account: String?
  @Option(
    name: .long,
    help: ArgumentHelp(
      "Seconds the token must still be valid (default 300, or a quarter of the token's lifetime when shorter).",
      valueName: "seconds"))
  var minValidity: UInt32?

  /// A token for these options (see helperToken).
  func token(broker: TesseraBroker, interactive: Bool, deviceCode: Bool = false) throws(TesseraClientError)
    -> TesseraToken
  {
    try helperToken(
      broker: broker, clientID: target.clientId, scopes: target.scopes, authority: target.authority,
      provider: target.provider, account: account, minValidity: minValidity, interactive: interactive,
      deviceCode: deviceCode)
  }

  /// Never prompting: for helpers run by other programs (sasl, exec).
  func silentToken() throws -> TesseraToken {
    try withBroker { broker throws(TesseraClientError) in try token(broker: broker, interactive: false) }
  }
}

/// Prints what the user must do to finish a sign-in, on stderr. What the broker relays may come
/// from the IdP: made inert before it reaches the terminal.
func showInteraction(_ interaction: TesseraInteraction) {
  if interaction.flow == .deviceCode {
    printError(SafeText.clip(interaction.message, limit: 1000))
  } else {
    printError(
      "Opening your browser to sign in. If it does not open, visit:\n  "
        + SafeText.clip(interaction.verificationURI, limit: 2048))
  }
}

/// A token for a helper: silently, and, when `interactive` and the broker says the user must sign
/// in, through the browser (or a device code). Never a prompt otherwise: a helper run by a
/// background program must not open browser tabs.
func helperToken(
  broker: TesseraBroker, clientID: String, scopes: [String], authority: String?, provider: String? = nil,
  account: String?, minValidity: UInt32? = nil, rejectedToken: String? = nil, interactive: Bool,
  deviceCode: Bool = false
) throws(TesseraClientError) -> TesseraToken {
  var options = TesseraTokenOptions()
  options.authority = authority
  options.provider = provider
  options.minValidity = minValidity
  options.rejectedToken = rejectedToken
  let accountID: String
  do {
    accountID = try resolveAccount(account, broker: broker, authority: authority)
  } catch .broker(let e) where interactive && e.code == .noSuchAccount {
    accountID = ""
  }
  do {
    return try broker.acquireTokenSilent(clientID: clientID, scopes: scopes, accountID: accountID, options: options)
  } catch .broker(let e) where interactive && (e.code == .interactionRequired || e.code == .noSuchAccount) {
    var sign = TesseraTokenOptions()
    sign.authority = authority
    sign.provider = provider
    sign.deviceCode = deviceCode
    if let account, !account.isEmpty, account.contains("@") || accountID.isEmpty { sign.loginHint = account }
    return try broker.acquireToken(clientID: clientID, scopes: scopes, options: sign, onInteraction: showInteraction)
  }
}

/// Whether a person can answer here: a controlling terminal exists.
func haveTerminal() -> Bool {
  let fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC)
  guard fd >= 0 else { return false }
  close(fd)
  return true
}

/// Reads stdin to its end, at most `limit` bytes; nil when there was more. A read error ends the
/// input there, as end of file would.
func readStandardInput(limit: Int) -> [UInt8]? {
  do { return try Syscall.readAll(.standardInput, limit: limit) } catch {
    return error.errno == .fileTooLarge ? nil : []
  }
}

/// Writes to stdout whole; a reader that went away (EPIPE) is not an error worth a message.
func writeStandardOutput(_ text: String) {
  try? Syscall.writeAll(.standardOutput, text.utf8)
}

extension Tessera {
  struct GitCredential: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "git-credential",
      abstract: "git's credential helper: access tokens for the hosts in config.toml's [[git]] entries.",
      discussion: """
        Set it up once:

          git config --global credential.helper tessera

        and say which hosts get tokens, in ~/.config/tessera/config.toml:

          [[git]]
          url = "https://git.example.com/"
          client_id = "CLIENT_ID"
          scopes = ["SCOPE"]

        git runs `git-credential-tessera get|store|erase` (installed beside tessera) and reads the \
        answer: the access token as the password (or, for git 2.46 and later, a Bearer \
        credential that git does not store), with its expiry. Hosts without a [[git]] entry get no \
        answer, so git asks its next helper. `store` does nothing: Tessera keeps the refresh \
        token itself. `erase` (git found the token refused) makes the broker fetch a new one. \
        A sign-in opens the browser only when git runs in a terminal; otherwise the helper fails \
        at once with one line on stderr. See tessera-config(5) for the [[git]] keys.
        """)

    @Option(name: .long, help: ArgumentHelp("config.toml to read [[git]] from.", valueName: "path"))
    var config: String?

    @Argument(help: ArgumentHelp("get, store or erase (git passes it).", valueName: "action"))
    var action: String

    func run() throws {
      guard let input = readStandardInput(limit: GitCredentialRequest.maxBytes) else {
        printError("tessera git-credential: more than \(GitCredentialRequest.maxBytes) bytes on stdin; ignored.")
        throw ExitCode(ClientExitStatus.usage.rawValue)
      }
      // Unknown actions are ignored, as git-credential(1) asks of helpers.
      guard action == "get" || action == "erase" else { return }
      let request: GitCredentialRequest
      do { request = try GitCredentialRequest(parsing: String(decoding: input, as: UTF8.self)) } catch {
        printError("tessera git-credential: git's input is malformed: \(error.reason).")
        throw ExitCode(ClientExitStatus.usage.rawValue)
      }
      guard let rule = try Self.rule(for: request, config: config) else {
        if action == "get", let hint = Self.pathHint(for: request, config: config) { printError(hint) }
        return
      }
      if action == "erase" {
        // git found this token refused: have the broker replace it, so the next get has a new one.
        guard let held = request.heldToken, !held.isEmpty else { return }
        _ = try withBroker { broker throws(TesseraClientError) in
          try helperToken(
            broker: broker, clientID: rule.clientID, scopes: rule.scopes, authority: rule.authority,
            account: rule.account, rejectedToken: held, interactive: false)
        }
        return
      }
      let environment = ProcessInfo.processInfo.environment
      let interactive = environment["GIT_TERMINAL_PROMPT"] != "0" && haveTerminal()
      let token = try withBroker { broker throws(TesseraClientError) in
        try helperToken(
          broker: broker, clientID: rule.clientID, scopes: rule.scopes, authority: rule.authority,
          account: rule.account, interactive: interactive)
      }
      let answer = GitCredentialAnswer(
        username: rule.username ?? token.account.username, accessToken: token.accessToken,
        expiresOn: token.expiresOn)
      guard let lines = answer.lines(for: request) else {
        printError(
          "tessera git-credential: the identity provider's token or username holds a line break; not passed to git.")
        throw ExitCode(TesseraError.Code.provider.exitCode)
      }
      writeStandardOutput(lines)
    }

    /// One line for git's user when git sent a host without a path and that host's [[git]] entries
    /// all have one: git sends no path unless credential.useHttpPath is set, so they cannot match
    /// (issue 22). nil otherwise, and when the file cannot be read or parsed (`rule(for:config:)`
    /// says why). git still gets no answer and asks its next helper.
    static func pathHint(for request: GitCredentialRequest, config: String?) -> String? {
      guard request.protocol == "https", (request.path ?? "").isEmpty else { return nil }
      let environment = ProcessInfo.processInfo.environment
      guard case .checked(let settings) = checkConfig(option: config, environment: environment) else { return nil }
      let host = request.host.lowercased()
      let forHost = settings.config.gitRules.filter { $0.host == host }
      guard !forHost.isEmpty, forHost.allSatisfy({ !$0.pathPrefix.isEmpty }) else { return nil }
      var files: [String] = []
      for rule in forHost where !files.contains(rule.file) { files.append(rule.file) }
      return
        "tessera git-credential: the [[git]] entries for \(host) in \(files.joined(separator: ", ")) have a path, and git sent none; "
        + "run `git config --global credential.https://\(host).useHttpPath true` so that git sends it."
    }

    /// The [[git]] entry for git's request; nil when the host has none (or there is no config file).
    /// The whole file is checked as tesserad checks it: any problem in it fails the helper (15) with
    /// one line naming the file and the line.
    static func rule(for request: GitCredentialRequest, config: String?) throws -> GitCredentialRule? {
      switch checkConfig(option: config, environment: ProcessInfo.processInfo.environment) {
      case .checked(let settings):
        // A [[git]] entry first; else the provider whose git host it is (no configuration).
        return GitCredentialRule.best(for: request, in: settings.config.gitRules)
          ?? GitCredentialRule.fromProviders(for: request, in: settings.config.providers)
      case .problems(let problems):
        let more = problems.count > 1 ? " (and \(problems.count - 1) more: see `tessera config check`)" : ""
        printError("tessera git-credential: \(problems[0])\(more)")
        throw ExitCode(TesseraError.Code.configuration.exitCode)
      }
    }
  }

  struct KubeCredential: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "kube-credential",
      abstract: "kubectl's exec credential plugin: prints an ExecCredential with an access token.",
      discussion: """
        In a kubeconfig user:

          users:
          - name: me
            user:
              exec:
                apiVersion: client.authentication.k8s.io/v1
                command: tessera
                args: [kube-credential, --client-id, CLIENT_ID, --scope, SCOPE]
                interactiveMode: IfAvailable

        Answers in the apiVersion kubectl asks for (v1 or v1beta1, from KUBERNETES_EXEC_INFO). \
        When kubectl says the session is not interactive (spec.interactive false), it never opens \
        a browser: a needed sign-in fails at once with one line on stderr (exit status 4), and \
        the broker shows one desktop notification. Interactive sessions sign in through the \
        browser, or with --device-code on another device.
        """)
    @OptionGroup var token: TokenTarget
    @Flag(name: .long, help: "Sign in with a device code (on another device) when a sign-in is needed.")
    var deviceCode = false
    @Option(
      name: .long,
      help: ArgumentHelp(
        "The ExecCredential apiVersion when KUBERNETES_EXEC_INFO is not set (default client.authentication.k8s.io/v1).",
        valueName: "version"), completion: .list(KubeCredential.versions))
    var apiVersion: String?

    static let versions = ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"]

    struct ExecCredential: Encodable {
      var apiVersion: String
      var kind = "ExecCredential"
      var status: Status
      struct Status: Encodable {
        var token: String
        /// Left out for a token that does not expire: kubectl then keeps it until a 401.
        var expirationTimestamp: String?
      }
    }

    func run() throws {
      var info: KubeExecInfo?
      if let text = ProcessInfo.processInfo.environment["KUBERNETES_EXEC_INFO"], !text.isEmpty {
        guard let decoded = KubeExecInfo.parse(text) else {
          printError("tessera kube-credential: KUBERNETES_EXEC_INFO is not an ExecCredential JSON object.")
          throw ExitCode(ClientExitStatus.usage.rawValue)
        }
        info = decoded
      }
      let version = info?.apiVersion ?? apiVersion ?? Self.versions[0]
      guard Self.versions.contains(version) else {
        printError(
          "tessera kube-credential: apiVersion \(SafeText.clip(version, limit: 100)) is not supported; use \(Self.versions.joined(separator: " or "))."
        )
        throw ExitCode(ClientExitStatus.usage.rawValue)
      }
      // kubectl before 1.22 does not say: a terminal on stdin is what it would have meant.
      let interactive = info?.interactive ?? (isatty(0) == 1)
      let t = try withBroker { broker throws(TesseraClientError) -> TesseraToken in
        do throws(TesseraClientError) {
          return try token.token(broker: broker, interactive: interactive, deviceCode: deviceCode)
        } catch .broker(let e) where !interactive && (e.code == .interactionRequired || e.code == .noSuchAccount) {
          // Both mean the same to kubectl's user: sign in (exit status 4, as the help says).
          throw .broker(
            TesseraError(
              .interactionRequired,
              "Sign-in needed, and kubectl runs non-interactively: run `tessera login\(token.target.clientId.isEmpty ? "" : " --client-id \(token.target.clientId)")` in a terminal, then retry. (\(SafeText.clip(e.message, limit: 300)))"
            ))
        }
      }
      let credential = ExecCredential(
        apiVersion: version,
        status: .init(
          token: t.accessToken,
          expirationTimestamp: TokenExpiry.isNever(t.expiresOn) ? nil : rfc3339(t.expiresOn)))
      let encoder = JSONEncoder()
      encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
      let data = try encoder.encode(credential)
      writeStandardOutput(String(decoding: data, as: UTF8.self) + "\n")
    }
  }

  struct Sasl: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "sasl",
      abstract: "Print a SASL XOAUTH2 or OAUTHBEARER initial response (for mail clients).",
      discussion: """
        Prints the base64 initial response of RFC 7628 OAUTHBEARER, or of XOAUTH2 \
        (user=U^Aauth=Bearer T^A^A), for the account's access token. --user defaults to the \
        account's username; --host and --port go into OAUTHBEARER's response. Mail clients that \
        build the response themselves (msmtp, mbsync, neomutt) take the bare token instead: \
        passwordeval "tessera token --client-id CLIENT_ID --scope SCOPE". Never prompts.
        """)
    @OptionGroup var token: TokenTarget
    @Option(
      name: .long,
      help: ArgumentHelp("xoauth2 or oauthbearer.", valueName: "mechanism"),
      completion: .list(["xoauth2", "oauthbearer"]))
    var mech: String
    @Option(name: .long, help: ArgumentHelp("The mail user (default: the account's username).", valueName: "user"))
    var user: String?
    @Option(name: .long, help: ArgumentHelp("The server's host name (OAUTHBEARER).", valueName: "host")) var host:
      String?
    @Option(name: .long, help: ArgumentHelp("The server's port (OAUTHBEARER).", valueName: "port")) var port: UInt16?

    func validate() throws {
      guard ["xoauth2", "oauthbearer"].contains(mech.lowercased()) else {
        throw ValidationError("--mech must be xoauth2 or oauthbearer.")
      }
      for (name, value) in [("--user", user), ("--host", host)] {
        if let value, value.isEmpty || !SafeText.isClean(value) || value.contains(",") && name == "--host" {
          throw ValidationError("\(name) must be non-empty printable text.")
        }
      }
    }

    func run() throws {
      let t = try token.silentToken()
      let name = user ?? t.account.username
      guard SafeText.isClean(name), SafeText.isClean(t.accessToken) else {
        printError("tessera sasl: the username or token holds control characters; not usable in SASL.")
        throw ExitCode(TesseraError.Code.provider.exitCode)
      }
      let message: String
      if mech.lowercased() == "xoauth2" {
        message = "user=\(name)\u{1}auth=Bearer \(t.accessToken)\u{1}\u{1}"
      } else {
        // RFC 7628 §3.1: the GS2 header names the user (',' and '=' escaped as =2C and =3D).
        let authzid = name.map { $0 == "=" ? "=3D" : $0 == "," ? "=2C" : String($0) }.joined()
        var fields = "n,a=\(authzid),\u{1}"
        if let host { fields += "host=\(host)\u{1}" }
        if let port { fields += "port=\(port)\u{1}" }
        message = fields + "auth=Bearer \(t.accessToken)\u{1}\u{1}"
      }
      writeStandardOutput(Data(message.utf8).base64EncodedString() + "\n")
    }
  }

  struct Exec: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "exec",
      abstract: "Run a command with an access token in its environment (never in its arguments).",
      discussion: """
        tessera exec --client-id CLIENT_ID --scope SCOPE ./deploy.sh  gets a token silently, puts it \
        in $ACCESS_TOKEN (or --env NAME) and runs the command in tessera's place: the exit status \
        is the command's. As with env(1), tessera's options come first and everything from the \
        command on is the command's; `--` before it is accepted too. The token is fetched once, before the command starts; nothing renews it \
        behind the command's back, so a long job should run `tessera token` itself when it needs \
        a fresh one. Never prompts: sign in first with `tessera login`.
        """)
    @OptionGroup var token: TokenTarget
    @Option(name: .long, help: ArgumentHelp("The variable to set (default ACCESS_TOKEN).", valueName: "name"))
    var env: String = "ACCESS_TOKEN"
    @Argument(
      parsing: .captureForPassthrough,
      help: ArgumentHelp("The command and its arguments (after tessera's options, or after --).", valueName: "command"))
    var command: [String] = []

    /// The command without the `--` that may come before it.
    var commandLine: [String] { command.first == "--" ? Array(command.dropFirst()) : command }

    func validate() throws {
      guard let first = commandLine.first else {
        throw ValidationError("Give the command to run, e.g. tessera exec ./deploy.sh")
      }
      // The options are tessera's up to the command: --help before it is a request for help.
      if command.first == "-h" || command.first == "--help" { throw CleanExit.helpRequest(Self.self) }
      // Everything from the first word tessera does not know is the command's; an unknown option
      // there is a typo of tessera's, not a command.
      if first.hasPrefix("-") && command.first != "--" {
        throw ValidationError(
          "Unknown option '\(first)'. tessera exec's options come before the command; put -- before a command that starts with -."
        )
      }
      let valid =
        env.first.map { $0 == "_" || ($0.isASCII && $0.isLetter) } == true
        && env.allSatisfy { $0 == "_" || ($0.isASCII && ($0.isLetter || $0.isNumber)) }
      guard valid else { throw ValidationError("--env must be a variable name: letters, digits and _.") }
      guard env != "PATH" else {
        throw ValidationError(
          "--env PATH would replace the search path the command is found with; choose another name.")
      }
    }

    func run() throws {
      let t = try token.silentToken()
      setenv(env, t.accessToken, 1)
      let command = commandLine
      var argv: [UnsafeMutablePointer<CChar>?] = command.map { strdup($0) }
      argv.append(nil)
      execvp(command[0], &argv)
      let reason = errno
      printError("tessera exec: cannot run \(command[0]): \(String(cString: strerror(reason))).")
      throw ExitCode(
        reason == ENOENT ? ClientExitStatus.commandNotFound.rawValue : ClientExitStatus.commandNotExecutable.rawValue)
    }
  }
}

/// Unix seconds as RFC 3339 in UTC ("2026-11-23T10:00:00Z").
func rfc3339(_ seconds: Int64) -> String { RFC3339.format(seconds) }

/// KUBERNETES_EXEC_INFO, as kubectl sets it for `tessera kube-credential`: the ExecCredential
/// apiVersion to answer with, and whether it may prompt.
package struct KubeExecInfo: Decodable {
  package var apiVersion: String?
  var spec: Spec?
  struct Spec: Decodable { var interactive: Bool? }
  /// Whether kubectl may prompt; nil when it does not say (before 1.22).
  package var interactive: Bool? { spec?.interactive }

  /// Nil when the text is not an ExecCredential object.
  package static func parse(_ text: String) -> KubeExecInfo? {
    try? JSONDecoder().decode(KubeExecInfo.self, from: Data(text.utf8))
  }
}
