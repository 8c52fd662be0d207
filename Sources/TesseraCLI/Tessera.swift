import ArgumentParser
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

struct Tessera: ParsableCommand {
  static let configuration = CommandConfiguration(
    commandName: "tessera",
    abstract: "Get OAuth 2.0 / OpenID Connect access tokens from the Tessera broker.",
    discussion: """
      Sign in once with `tessera login`; after that any program can get a fresh access token \
      without a prompt:

        curl -H "Authorization: Bearer $(tessera token)" https://graph.microsoft.com/v1.0/me

      Without --client-id, --authority or --scope, the broker's defaults from config.toml apply \
      (see tessera-config(5)). Refresh tokens never leave the broker.

      EXIT STATUS
      \(exitStatusHelp)
      """,
    version: BrokerInterface.version,
    subcommands: [
      Login.self, Token.self, Accounts.self, Logout.self, Status.self, GitCredential.self, KubeCredential.self,
      Sasl.self, Exec.self, Access.self,
    ])
}

/// The EXIT STATUS section of --help, from the one error table.
let exitStatusHelp = ClientExitStatus.all.map { "  \($0.status)  \($0.summary)" }.joined(separator: "\n")

struct Target: ParsableArguments {
  @Option(name: .long, help: ArgumentHelp("The app's client id (default: default_client_id).", valueName: "id"))
  var clientId: String = ""

  @Option(
    name: .long, help: ArgumentHelp("The authority, e.g. https://login.microsoftonline.com/<tenant>.", valueName: "url")
  )
  var authority: String?

  @Option(
    name: .customLong("scope"),
    help: ArgumentHelp("A scope to request; repeat for several (default: default_scopes).", valueName: "scope"))
  var scopes: [String] = []
}

struct Output: ParsableArguments {
  @Flag(name: .long, help: "Print the result as JSON.")
  var json = false
}

/// Runs a client call and turns its failure into a message and the documented exit status.
func withBroker<T>(_ body: (TesseraBroker) throws(TesseraClientError) -> T) throws -> T {
  do {
    let broker = try TesseraBroker()
    return try body(broker)
  } catch {
    fail(error)
  }
}

func fail(_ error: TesseraClientError) -> Never {
  var line = "tessera: \(error.description)"
  if case .broker(let e) = error { line = "tessera: \(e.code.rawValue): \(SafeText.clip(e.message, limit: 4096))" }
  printError(line)
  exit(error.exitCode)
}

func printError(_ text: String) {
  try? Syscall.writeAll(.standardError, (text + "\n").utf8)
}

func printJSON(_ value: some Encodable) {
  let encoder = JSONEncoder()
  encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
  print(String(decoding: (try? encoder.encode(value)) ?? Data(), as: UTF8.self))
}

/// Resolves --account: an account id, or a username (case-insensitive).
func resolveAccount(_ value: String?, broker: TesseraBroker, authority: String?) throws(TesseraClientError) -> String {
  guard let value, !value.isEmpty else { return "" }
  let accounts = try broker.accounts(authority: authority)
  if accounts.contains(where: { $0.id == value }) { return value }
  let matches = accounts.filter { $0.username.lowercased() == value.lowercased() }
  if matches.count == 1 { return matches[0].id }
  if matches.isEmpty {
    // Accounts this program has no grant for are hidden from it: an id goes to the broker as
    // given, so its answer says why (not signed in, or not this program's to use).
    if !value.contains("@"), (try? broker.hiddenAccountCount()) ?? 0 > 0 { return value }
    throw .broker(
      TesseraError(
        .noSuchAccount, "No signed-in account is '\(value)'. Run `tessera accounts` to list them, or `tessera login`."))
  }
  throw .broker(
    TesseraError(
      .invalidArgument, "Several accounts are named '\(value)'. Pass an account id (see `tessera accounts`)."))
}

extension Tessera {
  struct Login: ParsableCommand {
    static let configuration = CommandConfiguration(
      abstract: "Sign in interactively (browser, or a device code with --device-code).",
      discussion: """
        Opens your browser at the identity provider. On a machine without a browser (SSH), use \
        --device-code: tessera prints a link and a code to enter on any other device.
        """)
    @OptionGroup var target: Target
    @Flag(name: .long, help: "Use the device code flow: sign in on another device.") var deviceCode = false
    @Option(name: .long, help: ArgumentHelp("select_account, login, consent or none.", valueName: "prompt")) var prompt:
      String?
    @Option(name: .long, help: ArgumentHelp("Pre-fill the username at the identity provider.", valueName: "username"))
    var loginHint: String?
    @Option(
      name: .long,
      help: ArgumentHelp("Seconds to wait for the sign-in (default 300, device code 900).", valueName: "seconds"))
    var timeout: UInt32?
    @OptionGroup var output: Output

    func run() throws {
      var options = TesseraTokenOptions()
      options.authority = target.authority
      options.deviceCode = deviceCode
      options.prompt = prompt
      options.loginHint = loginHint
      options.timeout = timeout
      let token = try withBroker { broker throws(TesseraClientError) in
        try broker.acquireToken(
          clientID: target.clientId, scopes: target.scopes, options: options, onInteraction: showInteraction)
      }
      if output.json {
        printJSON(token.account)
      } else {
        print("Signed in as \(token.account.username) (\(token.account.name)); account id \(token.account.id)")
      }
    }
  }

  struct Token: ParsableCommand {
    static let configuration = CommandConfiguration(
      abstract: "Print an access token (from the cache, or refreshed silently).",
      discussion: """
        Prints the bare token, for `Authorization: Bearer $(tessera token)`. Never prompts: when \
        a sign-in is needed it exits with status 4; run `tessera login` then.
        """)
    @OptionGroup var target: Target
    @Option(
      name: .long, help: ArgumentHelp("Account id or username (default: the only account).", valueName: "account"))
    var account: String?
    @Flag(name: .long, help: "Skip the cache and redeem the refresh token.") var forceRefresh = false
    @Option(
      name: .long,
      help: ArgumentHelp(
        "Seconds the token must still be valid (default 300, or a quarter of the token's lifetime when shorter).",
        valueName: "seconds"))
    var minValidity: UInt32?
    @OptionGroup var output: Output

    func run() throws {
      var options = TesseraTokenOptions()
      options.authority = target.authority
      options.forceRefresh = forceRefresh
      options.minValidity = minValidity
      let token = try withBroker { broker throws(TesseraClientError) in
        let accountID = try resolveAccount(account, broker: broker, authority: target.authority)
        return try broker.acquireTokenSilent(
          clientID: target.clientId, scopes: target.scopes, accountID: accountID, options: options)
      }
      if output.json { printJSON(token) } else { print(token.accessToken) }
    }
  }

  struct Accounts: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List the signed-in accounts.")
    @Option(name: .long, help: ArgumentHelp("Only accounts signed in to this client id.", valueName: "id"))
    var clientId: String?
    @Option(name: .long, help: ArgumentHelp("Only accounts of this authority.", valueName: "url")) var authority:
      String?
    @OptionGroup var output: Output

    func run() throws {
      let (accounts, hidden) = try withBroker { broker throws(TesseraClientError) in
        (try broker.accounts(clientID: clientId, authority: authority), try broker.hiddenAccountCount())
      }
      if output.json {
        printJSON(accounts)
      } else if accounts.isEmpty && hidden == 0 {
        printError("No accounts. Sign in with `tessera login`.")
      } else {
        for a in accounts { print("\(a.username)\t\(a.name)\t\(a.environment)\t\(a.id)") }
      }
      // Accounts this program holds no grant for are not listed; say that they exist.
      if hidden > 0 && !output.json {
        printError(
          "\(hidden) more signed-in account\(hidden == 1 ? " is" : "s are") hidden from this program (no grant for \(hidden == 1 ? "it" : "them")). `tessera access list` shows the grants; `tessera access grant --app … ` adds one."
        )
      }
    }
  }

  struct Logout: ParsableCommand {
    static let configuration = CommandConfiguration(
      abstract: "Sign out: forget an account and revoke its refresh tokens.",
      discussion: "With --client-id only that app's tokens are removed and the account stays.")
    @Option(
      name: .long, help: ArgumentHelp("Account id or username (default: the only account).", valueName: "account"))
    var account: String?
    @Option(name: .long, help: ArgumentHelp("Remove only this app's tokens.", valueName: "id")) var clientId: String?
    @Flag(name: .long, help: "Do not revoke the refresh tokens at the identity provider.") var noRevoke = false

    func run() throws {
      let username = try withBroker { broker throws(TesseraClientError) -> String in
        var accountID = try resolveAccount(account, broker: broker, authority: nil)
        let all = try broker.accounts()
        if accountID.isEmpty {
          guard all.count == 1 else {
            throw .broker(
              TesseraError(
                all.isEmpty ? .noSuchAccount : .invalidArgument,
                all.isEmpty
                  ? "No account is signed in."
                  : "Several accounts are signed in; pass --account (see `tessera accounts`)."))
          }
          accountID = all[0].id
        }
        try broker.signOut(accountID: accountID, clientID: clientId, revoke: !noRevoke)
        return all.first { $0.id == accountID }?.username ?? accountID
      }
      print(clientId == nil ? "Signed out \(username)." : "Removed the tokens of \(clientId!) for \(username).")
    }
  }

  struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show whether the broker runs, its version and accounts.")
    @OptionGroup var output: Output

    /// `tessera status --json`: schema StatusReport.schema (keys are only ever added within one).
    struct Report: Encodable {
      var schema = StatusReport.schema
      var running: Bool
      var version: String
      var accounts: [AccountReport]
      /// Ids of the accounts that need a sign-in.
      var attentionNeeded: [String] = []
      /// The Secret Service: "ok" or "unavailable" (then `store_message` says why).
      var store: String
      var storeMessage: String?
      /// The bus names this broker answers on.
      var fronts: [String]
      /// com.microsoft.identity.broker1: "served", "other_broker" or "off".
      var microsoftBroker: String
      var microsoftBrokerOwner: Owner?

      struct Owner: Encodable {
        var pid: UInt32?
        var executable: String?
      }

      enum CodingKeys: String, CodingKey {
        case schema, running, version, accounts, fronts
        case attentionNeeded = "attention_needed"
        case store
        case storeMessage = "store_message"
        case microsoftBroker = "microsoft_broker"
        case microsoftBrokerOwner = "microsoft_broker_owner"
      }
    }

    /// An account as GetAccounts shows it, with its health from GetStatus.
    struct AccountReport: Encodable {
      var account: TesseraAccount
      var health: StatusReport.AccountStatus?

      func encode(to encoder: any Encoder) throws {
        try account.encode(to: encoder)
        guard let health else { return }
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(health.state, forKey: .state)
        try c.encodeIfPresent(health.lastError, forKey: .lastError)
        try c.encodeIfPresent(health.nextRefresh, forKey: .nextRefresh)
        try c.encode(health.tokens, forKey: .tokens)
        try c.encode(health.refreshTokenClients, forKey: .refreshTokenClients)
      }

      enum Keys: String, CodingKey {
        case state, tokens
        case lastError = "last_error"
        case nextRefresh = "next_refresh"
        case refreshTokenClients = "refresh_token_clients"
      }
    }

    func run() throws {
      let report = try withBroker { broker throws(TesseraClientError) in
        let version = try broker.version()
        let health = try broker.status()
        // With the keyring locked the accounts are not known: the report says why instead.
        let accounts = health.storeProblem == nil ? try broker.accounts() : []
        var report = Report(
          running: true, version: version,
          accounts: accounts.map { a in AccountReport(account: a, health: health.accounts.first { $0.id == a.id }) },
          attentionNeeded: health.attentionNeeded, store: health.storeProblem == nil ? "ok" : "unavailable",
          storeMessage: health.storeProblem, fronts: [BrokerInterface.busName], microsoftBroker: "off")
        switch try broker.microsoftFront() {
        case .served:
          report.fronts.append(MicrosoftBrokerInterface.busName)
          report.microsoftBroker = "served"
        case .otherBroker(let pid, let executable):
          report.microsoftBroker = "other_broker"
          report.microsoftBrokerOwner = .init(pid: pid, executable: executable)
        case .off: break
        }
        return report
      }
      if output.json {
        printJSON(report)
        return
      }
      if let problem = report.storeMessage {
        print(
          "tesserad \(report.version) is running, but cannot read the keyring: \(SafeText.clip(problem, limit: 500))")
      } else {
        print("tesserad \(report.version) is running; \(report.accounts.count) account(s) signed in.")
      }
      for a in report.accounts {
        var line =
          "  \(SafeText.clip(a.account.username, limit: 200)) (\(SafeText.clip(a.account.environment, limit: 200)))"
        if let h = a.health {
          switch h.state {
          case "needs_sign_in":
            line +=
              ": needs a sign-in: run `tessera login --login-hint \(SafeText.clip(a.account.username, limit: 200))`"
          case "store_locked": line += ": the keyring is locked: unlock it"
          case "idp_unreachable": line += ": the identity provider cannot be reached"
          default: line += ": ok"
          }
          line += "; \(h.tokens.count) token(s) cached"
          if let error = h.lastError {
            line += "\n    last error \(rfc3339(error.at)): \(error.code): \(SafeText.clip(error.message, limit: 300))"
          }
        }
        print(line)
      }
      switch report.microsoftBroker {
      case "served":
        print("Microsoft broker protocol: served (MSAL apps, Edge and Teams get their tokens from Tessera).")
      case "other_broker":
        let owner = report.microsoftBrokerOwner
        let who = [owner?.executable, owner?.pid.map { "pid \($0)" }].compactMap { $0 }.joined(separator: ", ")
        print(
          "Microsoft broker protocol: not served: com.microsoft.identity.broker1 is owned by another broker (\(who.isEmpty ? "unknown process" : who)). Stop it to serve MSAL apps from Tessera: tesserad then takes the name."
        )
      default:
        print("Microsoft broker protocol: off (microsoft_broker = false in config.toml).")
      }
    }
  }
}

/// The `tessera` command: runs the subcommand `arguments` name (the program's own, first one
/// included) and exits with its status. Installed as git-credential-tessera too, so
/// `git config credential.helper tessera` finds it: git runs it as
/// `git-credential-tessera [ARGS] get|store|erase`.
public func runTessera(_ arguments: [String] = CommandLine.arguments) -> Never {
  if arguments.first.map({ $0.split(separator: "/").last == "git-credential-tessera" }) == true {
    Tessera.GitCredential.main(Array(arguments.dropFirst()))
  } else {
    Tessera.main(Array(arguments.dropFirst()))
  }
  exit(0)
}
