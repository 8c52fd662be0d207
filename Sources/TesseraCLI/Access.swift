import ArgumentParser
import TesseraClient
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

extension Tessera {
  struct Access: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "access",
      abstract: "See and change which app may use which account and client (per-application access control).",
      discussion: """
        Tessera tells apps apart: Flatpak and snap apps by their sandbox (reliable), other programs \
        by their desktop unit or executable (shown as "unverified": any program of yours could \
        claim it). The app that completes a sign-in may use that client id and account; another \
        app is refused (access_mode = "strict"), asked about ("confirm", the default), or let \
        through and logged ("open"). See tessera-config(5) and docs/access-control.md.
        """,
      subcommands: [List.self, Grant.self, Revoke.self, Log.self])

    struct List: ParsableCommand {
      static let configuration = CommandConfiguration(
        commandName: "list", abstract: "List the grants: which app may use what.")
      @OptionGroup var output: Output

      func run() throws {
        let grants = try withBroker { broker throws(TesseraClientError) in try broker.grants() }
        if output.json { return printJSON(grants) }
        if grants.isEmpty { return printError("No grants yet: an app gets one when it completes a sign-in.") }
        var table = Table("APP", "CLIENT ID", "ACCOUNT", "LIMITS", "GRANTED", "APP KEY")
        for g in grants {
          // What the grant is narrowed to, when it is: "scopes Mail.Send; token only".
          var limits: [String] = []
          if let authority = g.authority, !authority.isEmpty { limits.append("at \(authority)") }
          if let scopes = g.scopes {
            limits.append(scopes.isEmpty ? "sign-in scopes only" : "scopes \(scopes.joined(separator: " "))")
          }
          if let ops = g.operations { limits.append("only \(ops.joined(separator: ", "))") }
          table.add(
            SafeText.clip(g.appDisplay, limit: 300), SafeText.clip(g.clientID, limit: 300),
            SafeText.clip(g.account, limit: 200),
            limits.isEmpty ? "any scope" : SafeText.clip(limits.joined(separator: "; "), limit: 400),
            "\(g.via) \(rfc3339(g.grantedAt))", SafeText.clip(g.app, limit: 300))
        }
        table.print()
      }
    }

    struct Grant: ParsableCommand {
      static let configuration = CommandConfiguration(
        commandName: "grant",
        abstract: "Let an app use a client id for an account.",
        discussion: """
          The app key is what `tessera access log` and refusals show, e.g. \
          exe:/usr/bin/python3.11, desktop:org.gnome.Evolution or flatpak:org.example.App. \
          Without --authority, --scope or --operation the app may use the client for anything; \
          with them, only for that: e.g. --scope Mail.Send --operation token lets a mail \
          program get tokens to send mail and nothing else. Granting the same app, client and \
          account again replaces the grant.

          Example:
            tessera access grant --app flatpak:org.example.Mail --client-id 04b07795-8ddb-461a-bbee-02f9e1bf7b46 \\
              --account alice@example.com --scope Mail.Send --operation token
          """)
      @Option(name: .long, help: ArgumentHelp("The app's key.", valueName: "key")) var app: String
      @Option(name: .long, help: ArgumentHelp("The client id it may use.", valueName: "id")) var clientId: String
      @Option(
        name: .long,
        help: ArgumentHelp(
          "Account id or username, or * for every account (default: the only one).", valueName: "account"),
        completion: accountCompletion)
      var account: String?
      @Option(
        name: .long,
        help: ArgumentHelp("Only at this authority (an https URL, as the app passes it).", valueName: "url"))
      var authority: String?
      @Option(
        name: .customLong("scope"),
        help: ArgumentHelp(
          "Only these scopes (repeat the option for more; openid, profile, email and offline_access are always allowed).",
          valueName: "scope"))
      var scopes: [String] = []
      @Option(
        name: .customLong("operation"),
        help: ArgumentHelp(
          "Only these operations: token, sign-in, list-accounts, sign-out (repeat for more; default: all).",
          valueName: "operation"), completion: .list(["token", "sign-in", "list-accounts", "sign-out"]))
      var operations: [String] = []

      func run() throws {
        // The broker resolves the account: this command may not see the accounts it grants.
        try withBroker { broker throws(TesseraClientError) in
          try broker.grant(
            app: app, clientID: clientId, accountID: account ?? "", authority: authority ?? "", scopes: scopes,
            operations: operations)
        }
        let who = account == AccessGrant.anyAccount ? "every account" : (account ?? "the signed-in account")
        print("\(app) may now use \(clientId) for \(who).")
      }
    }

    struct Revoke: ParsableCommand {
      static let configuration = CommandConfiguration(
        commandName: "revoke", abstract: "Take an app's grants away (one client id or all; one account or all).")
      @Option(name: .long, help: ArgumentHelp("The app's key.", valueName: "key")) var app: String
      @Option(name: .long, help: ArgumentHelp("Only this client id (default: all).", valueName: "id")) var clientId:
        String?
      @Option(
        name: .long,
        help: ArgumentHelp(
          "Only the grants for this account: an id, a username, or * for the grants that cover every account (default: all).",
          valueName: "account")) var account: String?

      func run() throws {
        let removed = try withBroker { broker throws(TesseraClientError) in
          if let account {
            try broker.revokeGrant(app: app, clientID: clientId, account: account)
          } else {
            try broker.revoke(app: app, clientID: clientId)
          }
        }
        print("Removed \(removed) grant(s) of \(app)\(account.map { " for \($0)" } ?? "").")
      }
    }

    struct Log: ParsableCommand {
      static let configuration = CommandConfiguration(
        commandName: "log",
        abstract: "Show the last access decisions (allowed, refused) since the broker started.",
        discussion: """
          Every decision is also in the journal: journalctl --user MESSAGE_ID=7f1e2d3c4b5a49688776a5b4c3d2e1f0 \
          shows the refusals.
          """)
      @OptionGroup var output: Output

      func run() throws {
        let records = try withBroker { broker throws(TesseraClientError) in try broker.accessLog() }
        if output.json { return printJSON(records) }
        if records.isEmpty {
          return printError(
            "No access decisions since tesserad started: no app has asked for a token, account or sign-in yet.")
        }
        var table = Table("TIME", "DECISION", "REASON", "APP", "OPERATION", "CLIENT ID", "ACCOUNT")
        for r in records {
          table.add(
            rfc3339(r.at), r.decision, r.reason, SafeText.clip(r.app, limit: 300), r.operation,
            SafeText.clip(r.clientID, limit: 300), SafeText.clip(r.account, limit: 200))
        }
        table.print()
      }
    }
  }
}
