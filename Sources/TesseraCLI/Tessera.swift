import ArgumentParser
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

      Every command reaches tesserad over its own socket, $XDG_RUNTIME_DIR/tessera/bus (or \
      $TESSERA_SOCKET), when it is there, and over the session bus otherwise; --bus, given to \
      any command, forces the session bus. `tessera status` says which way it went.

      EXIT STATUS
      \(exitStatusHelp)
      """,
    version: BrokerInterface.version,
    subcommands: [
      Login.self, Token.self, Accounts.self, Account.self, Logout.self, Status.self, GitCredential.self,
      KubeCredential.self, Sasl.self, Exec.self, Access.self, Config.self, Store.self, Forward.self, Provider.self,
      Proof.self,
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
    name: .long,
    help: ArgumentHelp(
      "A provider of config.toml by name (`tessera provider list`): its issuer, client id and scopes.",
      valueName: "name"))
  var provider: String?

  @Option(
    name: .customLong("scope"),
    help: ArgumentHelp("A scope to request; repeat for several (default: default_scopes).", valueName: "scope"))
  var scopes: [String] = []

  func validate() throws {
    for scope in scopes where scope.contains(" ") {
      let each = scope.split(separator: " ").map { "--scope \($0)" }.joined(separator: " ")
      throw ValidationError("--scope takes one scope; repeat it for each: \(each)")
    }
  }
}

struct Output: ParsableArguments {
  @Flag(name: .long, help: "Print the result as JSON.")
  var json = false
}

/// Runs a client call and turns its failure into a message and the documented exit status.
func withBroker<T>(_ body: (TesseraBroker) throws(TesseraClientError) -> T) throws -> T {
  do {
    let broker = try connectBroker()
    return try body(broker)
  } catch {
    fail(error)
  }
}

func fail(_ error: TesseraClientError) -> Never {
  if let failure = startFailure(error) {
    printError(failure.message)
    exit(failure.status)
  }
  var line = "tessera: \(CLIWords.rewrite(error.description))"
  if case .broker(let e) = error {
    line = "tessera: \(e.code.rawValue): \(SafeText.clip(CLIWords.rewrite(e.message), limit: 4096))"
  }
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

/// How every command reaches the broker: its own socket when it is there, else the session bus;
/// `--bus` (any command, anywhere before `--`) forces the session bus.
let brokerRoute = Locked<TesseraBroker.Route>(.automatic)

/// A connection to the broker by `brokerRoute`.
func connectBroker() throws(TesseraClientError) -> TesseraBroker {
  try TesseraBroker(route: brokerRoute.withLock { $0 })
}

/// Takes `--bus` out of the arguments (up to `--`, after which they belong to another program).
func takeBusFlag(_ arguments: [String]) -> [String] {
  let end = arguments.firstIndex(of: "--") ?? arguments.endIndex
  guard arguments[..<end].contains("--bus") else { return arguments }
  brokerRoute.withLock { $0 = .sessionBus }
  return arguments[..<end].filter { $0 != "--bus" } + arguments[end...]
}

/// The `tessera` command: runs the subcommand `arguments` name (the program's own, first one
/// included) and exits with its status. Installed as git-credential-tessera too, so
/// `git config credential.helper tessera` finds it: git runs it as
/// `git-credential-tessera [ARGS] get|store|erase`.
public func runTessera(_ arguments: [String] = CommandLine.arguments) -> Never {
  if arguments.first.map({ $0.split(separator: "/").last == "git-credential-tessera" }) == true {
    Tessera.GitCredential.main(takeBusFlag(Array(arguments.dropFirst())))
  } else {
    let rest = takeBusFlag(Array(arguments.dropFirst()))
    // `tessera --version` alone: what the parser would print, without its reflection over the
    // root command's options (a fifth of the start; BinaryTests checks the two agree).
    if rest == ["--version"] {
      print(Tessera.configuration.version)
      exit(0)
    }
    // The hot path: a plain `tessera token` skips the full parser's reflection (TokenLine).
    if rest.first == "token", let line = TokenLine.parse(rest.dropFirst()) {
      do { try Tessera.Token.printToken(line) } catch { Tessera.exit(withError: error) }
      exit(0)
    }
    if let word = rest.first, let message = unknownCommand(word) {
      printError(message)
      exit(ClientExitStatus.usage.rawValue)
    }
    Tessera.main(rest)
  }
  exit(0)
}

/// "tessera logn": which command was meant, as options already get (swift-argument-parser only
/// says "Unexpected argument"). Nil for a known command, an option, or help.
func unknownCommand(_ word: String) -> String? {
  let names = Tessera.configuration.subcommands.map { $0._commandName } + ["help"]
  guard !word.hasPrefix("-"), !names.contains(word) else { return nil }
  let commands = Tessera.configuration.subcommands.map { $0._commandName }
  let hint =
    NearestName.nearest(to: word, among: commands).map { "Did you mean '\($0)'?" }
    ?? "The commands are \(commands.joined(separator: ", "))."
  return "tessera: '\(SafeText.clip(word, limit: 100))' is not a tessera command. \(hint) See `tessera --help`."
}

/// Completes --account with the signed-in accounts' usernames (nothing when the broker does not answer).
let accountCompletion = CompletionKind.custom { _, _, prefix in
  guard let broker = try? connectBroker(), let accounts = try? broker.accounts() else { return [] }
  return accounts.map(\.username).filter { $0.hasPrefix(prefix) }
}
