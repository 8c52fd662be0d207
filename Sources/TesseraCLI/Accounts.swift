import ArgumentParser
import TesseraBus
import TesseraClient

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

extension Tessera {
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
}
