import ArgumentParser
import TesseraClient
import TesseraInterface
import TesseraSystem

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

extension Tessera {
  struct Login: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "login",
      abstract: "Sign in interactively (browser, or a device code with --device-code).",
      discussion: """
        Opens your browser at the identity provider. On a machine without a browser (SSH), use \
        --device-code: tessera prints a link and a code to enter on any other device.
        """)
    @OptionGroup var target: Target
    @Flag(name: .long, help: "Use the device code flow: sign in on another device.") var deviceCode = false
    @Option(
      name: .long,
      help: ArgumentHelp(
        "select_account, login, consent or none.", valueName: "prompt"),
      completion: .list(["select_account", "login", "consent", "none"]))
    var prompt: String?
    @Option(
      name: [.long, .customLong("username")],
      help: ArgumentHelp(
        "Pre-fill the username at the identity provider; at a provider that cannot say who signed in (no id_token, userinfo or user API), the account's name.",
        valueName: "username"))
    var loginHint: String?
    @Option(
      name: .long,
      help: ArgumentHelp("Seconds to wait for the sign-in (default 300, device code 900).", valueName: "seconds"))
    var timeout: UInt32?
    @OptionGroup var output: Output

    func run() throws {
      var options = TesseraTokenOptions()
      options.authority = target.authority
      options.provider = target.provider
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
      commandName: "token",
      abstract: "Print an access token (from the cache, or refreshed silently).",
      discussion: """
        Prints the bare token, for `Authorization: Bearer $(tessera token)`. Never prompts: when \
        a sign-in is needed it exits with status \(ErrorCode.interactionRequired.exitCode) \
        (\(ErrorCode.interactionRequired.entry.summary)), or \(ErrorCode.noSuchAccount.exitCode) \
        (\(ErrorCode.noSuchAccount.entry.summary)) when no account is signed in at all; run \
        `tessera login` then. With several accounts signed in, it uses the current one (see \
        `tessera account use`) unless --account names another.

        With --reject, reads a token a resource refused (an HTTP 401) from standard input and \
        drops it from the broker's cache, so the next `tessera token` gets a new one: by a \
        refresh, or, when the provider gave no refresh token (a GitHub OAuth app), by a sign-in. \
        Give the same --client-id, --provider, --authority and --account the token came with: \
        only the app that received a token can drop it. Prints nothing (with --json, whether a \
        token was dropped); says so on standard error when the token was not the cached one.
        """)
    /// The target, --account and --min-validity, as the helpers take them.
    @OptionGroup var request: TokenTarget
    @Flag(name: .long, help: "Skip the cache and redeem the refresh token.") var forceRefresh = false
    @Flag(
      name: .long,
      help: "Read a token a resource refused from standard input and drop it from the cache, instead of printing one.")
    var reject = false
    @OptionGroup var output: Output

    func validate() throws {
      if reject && (forceRefresh || request.minValidity != nil) {
        throw ValidationError("--reject takes no --force-refresh or --min-validity: it drops a token, it gets none.")
      }
    }

    func run() throws {
      if reject { return try rejectToken() }
      try Self.printToken(line)
    }

    /// The token `line` asks for, printed (the full parser's path and TokenLine's hot path).
    static func printToken(_ line: TokenLine) throws {
      var options = TesseraTokenOptions()
      options.authority = line.authority
      options.provider = line.provider
      options.forceRefresh = line.forceRefresh
      options.minValidity = line.minValidity
      let token = try withBroker { broker throws(TesseraClientError) in
        let accountID = try resolveAccount(line.account, broker: broker, authority: line.authority)
        return try broker.acquireTokenSilent(
          clientID: line.clientID, scopes: line.scopes, accountID: accountID, options: options)
      }
      if line.json { printJSON(token) } else { print(token.accessToken) }
    }

    /// `--reject`: the token from standard input, dropped when it is the cached one.
    func rejectToken() throws {
      let limit = RequestOptions.rejectedToken.maxBytes
      // A line break or two after it is not part of the token.
      let token = readStandardInput(limit: limit + 2).map { bytes in
        let blank: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D }
        return String(decoding: bytes.drop(while: blank).reversed().drop(while: blank).reversed(), as: UTF8.self)
      }
      guard let token, !token.isEmpty, token.utf8.count <= limit else {
        printError(
          token?.isEmpty == true
            ? "tessera token --reject: no token on standard input. Pipe in the token the resource refused."
            : "tessera token --reject: the token on standard input is longer than \(limit) bytes; no token is that long."
        )
        throw ExitCode(ClientExitStatus.usage.rawValue)
      }
      var options = TesseraTokenOptions()
      options.authority = request.target.authority
      options.provider = request.target.provider
      let dropped = try withBroker { broker throws(TesseraClientError) in
        let accountID = try resolveAccount(request.account, broker: broker, authority: request.target.authority)
        return try broker.rejectToken(token, clientID: request.target.clientId, accountID: accountID, options: options)
      }
      if output.json {
        printJSON(RejectAnswer(dropped: dropped))
      } else if !dropped {
        printError(
          "tessera token --reject: that token is not the cached one for this client and account (already replaced, or it came with other options); nothing was dropped."
        )
      }
    }

    struct RejectAnswer: Encodable { var dropped: Bool }
  }
}
