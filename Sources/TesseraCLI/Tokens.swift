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
        """)
    /// The target, --account and --min-validity, as the helpers take them.
    @OptionGroup var request: TokenTarget
    @Flag(name: .long, help: "Skip the cache and redeem the refresh token.") var forceRefresh = false
    @OptionGroup var output: Output

    func run() throws {
      var options = TesseraTokenOptions()
      options.authority = request.target.authority
      options.provider = request.target.provider
      options.forceRefresh = forceRefresh
      options.minValidity = request.minValidity
      let token = try withBroker { broker throws(TesseraClientError) in
        let accountID = try resolveAccount(request.account, broker: broker, authority: request.target.authority)
        return try broker.acquireTokenSilent(
          clientID: request.target.clientId, scopes: request.target.scopes, accountID: accountID, options: options)
      }
      if output.json { printJSON(token) } else { print(token.accessToken) }
    }
  }
}
