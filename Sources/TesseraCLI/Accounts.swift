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
  struct Accounts: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "accounts",
      abstract: "List the signed-in accounts; * marks the current one.",
      discussion: """
        On a terminal: a table with a header. Piped: one line per account, tab-separated \
        (username, name, identity provider, account id, "current" or "-"), no header. --json for \
        scripts. The current account (`tessera account use`) is the one commands use when \
        several accounts are signed in at one identity provider and none is named.
        """)
    @Option(name: .long, help: ArgumentHelp("Only accounts signed in to this client id.", valueName: "id"))
    var clientId: String?
    @Option(name: .long, help: ArgumentHelp("Only accounts of this authority.", valueName: "url")) var authority:
      String?
    @OptionGroup var output: Output

    func run() throws {
      let (accounts, hidden, all) = try withBroker { broker throws(TesseraClientError) in
        let accounts = try broker.accounts(clientID: clientId, authority: authority)
        let filtered = clientId != nil || authority != nil
        // An empty filtered list must not read as "nobody is signed in".
        let all = filtered && accounts.isEmpty ? try broker.accounts().count : accounts.count
        return (accounts, try broker.hiddenAccountCount(), all)
      }
      if output.json {
        printJSON(accounts)
      } else if accounts.isEmpty && all > 0 {
        let filter = [clientId.map { "client \($0)" }, authority.map { "authority \($0)" }].compactMap { $0 }
        printError(
          "No account is signed in to \(filter.joined(separator: " at ")); \(all) account\(all == 1 ? " is" : "s are") signed in elsewhere (`tessera accounts` lists \(all == 1 ? "it" : "them")). `tessera login\(clientId.map { " --client-id \($0)" } ?? "")` signs one in to it."
        )
      } else if accounts.isEmpty && hidden == 0 {
        printError("No account is signed in. Sign in with `tessera login` (or `tessera login --device-code` over SSH).")
      } else {
        var table = Table("", "USERNAME", "NAME", "PROVIDER", "ACCOUNT ID")
        for a in accounts {
          table.add(
            a.current == true ? "*" : "", SafeText.clip(a.username, limit: 200), SafeText.clip(a.name, limit: 200),
            SafeText.clip(a.environment, limit: 200), a.id)
        }
        if Table.toTerminal {
          table.print(aligned: true)
        } else {
          // The tab form keeps its first four columns where scripts have them.
          for row in table.rows { print((row.dropFirst() + [row[0] == "*" ? "current" : "-"]).joined(separator: "\t")) }
        }
      }
      // Accounts this program holds no grant for are not listed; say that they exist.
      if hidden > 0 && !output.json {
        printError(
          "\(hidden) more signed-in account\(hidden == 1 ? " is" : "s are") hidden from this program (no grant for \(hidden == 1 ? "it" : "them")). `tessera access list` shows the grants; `tessera access grant --app … ` adds one."
        )
      }
    }
  }

  struct Account: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "account",
      abstract: "Choose the current account: the one used when several are signed in and none is named.",
      subcommands: [Use.self])

    struct Use: ParsableCommand {
      static let configuration = CommandConfiguration(
        commandName: "use",
        abstract: "Make an account the current one of its identity provider.",
        discussion: """
          With several accounts signed in at one identity provider, a request that names no \
          account (`tessera token`, the git, kubectl and mail helpers without an account, D-Bus \
          callers passing "" as the account) gets the current one. One account alone needs no \
          choosing; when a second signs in beside it, the first stays current, so what was set \
          up for it keeps working. `tessera accounts` and `tessera status` mark it with *.

          Example:
            tessera account use bob@example.com
          """)
      @Argument(help: ArgumentHelp("Account id or username.", valueName: "account"))
      var account: String
      @Option(
        name: .long,
        help: ArgumentHelp(
          "Only among the accounts of this authority (a username signed in at several).", valueName: "url"))
      var authority: String?
      @OptionGroup var output: Output

      func run() throws {
        let chosen = try withBroker { broker throws(TesseraClientError) in
          try broker.setCurrentAccount(account, authority: authority)
        }
        if output.json { return printJSON(chosen) }
        print(
          "\(SafeText.clip(chosen.username, limit: 200)) is now the current account at \(SafeText.clip(chosen.environment, limit: 200))."
        )
      }
    }
  }

  struct Logout: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "logout",
      abstract: "Sign out: forget an account and revoke its refresh tokens.",
      discussion: """
        Without --account: the only account, or with several, the current one (see `tessera \
        account use`). With --client-id only that app's tokens (and apps' grants for it) are \
        removed and the account stays.

        Signing out forgets the account here, but the provider's web session in your browser \
        lives on: the next sign-in goes through without a password. --browser ends that session \
        too: the browser opens the provider's sign-out page (OpenID Connect RP-Initiated Logout), \
        and the next sign-in asks for the password again. A provider without one (GitHub, \
        Bitbucket) is named, and nothing is signed out.
        """)
    @Option(
      name: .long,
      help: ArgumentHelp("Account id or username (default: the only or current account).", valueName: "account"))
    var account: String?
    @Option(name: .long, help: ArgumentHelp("Remove only this app's tokens.", valueName: "id")) var clientId: String?
    @Flag(name: .long, help: "Do not revoke the refresh tokens at the identity provider.") var noRevoke = false
    @Flag(
      name: .long,
      help: "Also sign out at the provider in the browser, so the next sign-in asks for the password.")
    var browser = false

    func validate() throws {
      if browser, clientId != nil {
        throw ValidationError(
          "--browser ends the account's session at the provider for every app: leave out --client-id, or --browser.")
      }
    }

    func run() throws {
      let (signedOut, held) = try withBroker { broker throws(TesseraClientError) -> (TesseraAccount?, Bool) in
        var accountID = try resolveAccount(account, broker: broker, authority: nil)
        let all = try broker.accounts()
        if accountID.isEmpty {
          let current = all.filter { $0.current == true }
          if all.count == 1 {
            accountID = all[0].id
          } else if all.isEmpty {
            throw .broker(TesseraError(.noSuchAccount, "No account is signed in: there is nothing to sign out."))
          } else if current.count == 1 {
            accountID = current[0].id
          } else {
            throw .broker(
              TesseraError(
                .invalidArgument,
                "\(all.count) accounts are signed in (\(all.map(\.username).joined(separator: ", "))) and none is current: pass --account USERNAME."
              ))
          }
        }
        // Whether the client held anything, so the answer says what really happened.
        var held = true
        if let clientId, let health = try? broker.status().accounts.first(where: { $0.id == accountID }) {
          held = health.refreshTokenClients.contains(clientId) || health.tokens.contains { $0.clientID == clientId }
        }
        try broker.signOut(accountID: accountID, clientID: clientId, revoke: !noRevoke, browser: browser)
        return (all.first { $0.id == accountID }, held)
      }
      let who = SafeText.clip(signedOut?.username ?? account ?? "the account", limit: 200)
      if let clientId {
        print(
          held
            ? "Removed the tokens of \(clientId) for \(who); the account stays signed in."
            : "\(who) held no tokens of \(clientId): nothing to remove (`tessera status` lists each account's clients)."
        )
      } else if browser {
        print(
          "Signed out \(who), and opened the provider's sign-out page in your browser: finish there if it asks you to confirm."
        )
      } else {
        print("Signed out \(who).")
      }
      if held, let signedOut, let hint = Self.revocationHint(for: signedOut, clientID: clientId) { print(hint) }
    }

    /// Where to revoke the grant by hand, for an account of a provider that has no revocation
    /// endpoint (GitHub, Bitbucket, Gitea): signing out forgets the tokens here, but the provider
    /// keeps the grant (and an OAuth app's token stays valid) until the user revokes it there.
    static func revocationHint(for account: TesseraAccount, clientID: String?) -> String? {
      guard case .checked(let settings) = checkConfig(option: nil, environment: ProcessInfo.processInfo.environment)
      else { return nil }
      let providers = settings.config.providers.filter {
        $0.issuer == account.authority && (clientID == nil || $0.clientID == clientID)
      }
      return providers.compactMap { provider -> String? in
        guard provider.endpoints.revocation == nil, let page = provider.revokePage else { return nil }
        let url = page.replacing("{client_id}", with: provider.clientID)
        return
          "\(account.environment) keeps the grant to \(provider.clientID) (provider '\(provider.name)', which has no revocation endpoint) until you revoke it: \(url)"
      }.first
    }
  }
}
