import ArgumentParser
import TesseraBus
import TesseraClient

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

extension Tessera {
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
