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
  struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "status",
      abstract: "Show whether the broker runs, its accounts, their tokens and what needs attention.",
      discussion: """
        Always answers, within about a second: also when the broker is not running (it says \
        why) or its store (the keyring, or the file store) does not answer. Per account: its state, the current account \
        (marked *), the cached tokens' expiry, the next refresh the broker makes by itself and \
        the last error.

        EXIT STATUS
          0   the broker runs and nothing needs attention
          4   an account needs a sign-in (run the `tessera login` command it shows)
          11  the store (the keyring, or the file store) is locked or does not answer
          14  the broker is not running and cannot be started
          15  the broker cannot start: config.toml has a mistake (shown)
        Other statuses are those of `tessera --help`. Scripts: `tessera status --json` has \
        "running", "needs_attention" and the reason.
        """)
    @OptionGroup var output: Output

    /// `tessera status --json`: schema StatusReport.schema (keys are only ever added within one).
    struct Report: Encodable {
      var schema = StatusReport.schema
      var running: Bool
      /// Why the broker is not running (or could not be asked); nil when it answered.
      var reason: String?
      var version: String
      var accounts: [AccountReport]
      /// Ids of the accounts that need a sign-in.
      var attentionNeeded: [String] = []
      /// Whether something needs the user: not running, an account to sign in, the keyring.
      var needsAttention = false
      /// The Secret Service: "ok" or "unavailable" (then `store_message` says why); nil when not running.
      var store: String?
      var storeMessage: String?
      /// Which store: "secret-service", "file" or "memory"; for "file" its directory and key. Nil
      /// when not running.
      var storeKind: String?
      var storePath: String?
      var storeKey: String?
      /// What the store set aside (damaged records), one line each.
      var storeNotes: [String]?
      /// The bus names this broker answers on.
      var fronts: [String]
      /// com.microsoft.identity.broker1: "served", "other_broker" or "off"; "no_session_bus" when
      /// tesserad has no session bus, "not_reachable_here" when it has one this program cannot
      /// reach; nil when not running.
      var microsoftBroker: String?
      /// Whether tesserad has a session bus: "connected" or "missing" (then `session_bus_message`
      /// says why); nil when not running or from an older broker.
      var sessionBus: String?
      var sessionBusMessage: String?
      var microsoftBrokerOwner: Owner?
      /// How the broker was reached: "socket" (its own, at `socket`) or "session_bus"; nil when
      /// not running.
      var connection: String?
      var socket: String?
      /// The configuration in force: its files, warnings, locked keys, a refused reload; nil when
      /// not running (or from an older broker).
      var config: StatusReport.ConfigStatus?
      /// Where the keys tokens are bound to are made: "tpm", "software" or "none", and that in
      /// words; nil when not running (or from an older broker).
      var dpop: DPoP?

      struct DPoP: Encodable {
        var kind: String
        var summary: String
      }

      struct Owner: Encodable {
        var pid: UInt32?
        var executable: String?
      }

      enum CodingKeys: String, CodingKey {
        case schema, running, reason, version, accounts, fronts
        case attentionNeeded = "attention_needed"
        case needsAttention = "needs_attention"
        case store
        case storeMessage = "store_message"
        case storeKind = "store_kind"
        case storePath = "store_path"
        case storeKey = "store_key"
        case storeNotes = "store_notes"
        case microsoftBroker = "microsoft_broker"
        case microsoftBrokerOwner = "microsoft_broker_owner"
        case connection, socket, config, dpop
        case sessionBus = "session_bus"
        case sessionBusMessage = "session_bus_message"
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
        try c.encodeIfPresent(health.refreshTokenExpiresOn, forKey: .refreshTokenExpiresOn)
      }

      enum Keys: String, CodingKey {
        case state, tokens
        case lastError = "last_error"
        case nextRefresh = "next_refresh"
        case refreshTokenClients = "refresh_token_clients"
        case refreshTokenExpiresOn = "refresh_token_expires_on"
      }
    }

    /// The report and the exit status it calls for.
    static func report() -> (Report, Int32) {
      func notRunning(_ error: TesseraClientError) -> (Report, Int32) {
        let (reason, status) = notAnswered(error)
        return (
          Report(running: false, reason: reason, version: "", accounts: [], needsAttention: true, fronts: []), status
        )
      }
      let report: Report
      let broker: TesseraBroker
      do { broker = try connectBroker() } catch { return notRunning(error) }
      do {
        report = try Self.ask(broker)
      } catch {
        // Reached, and it answered, but not to this program (a forward's callers, a sandboxed app
        // in strict mode): running, and why it said nothing more.
        if case .broker(let refusal) = error, refusal.code == .accessDenied {
          return (
            Report(
              running: true, reason: refusal.message, version: "", accounts: [], needsAttention: false, fronts: []),
            refusal.code.exitCode
          )
        }
        return notRunning(error)
      }
      var status = ClientExitStatus.success.rawValue
      if report.storeMessage != nil {
        status = ErrorCode.storeUnavailable.exitCode
      } else if !report.attentionNeeded.isEmpty {
        status = ErrorCode.interactionRequired.exitCode
      }
      return (report, status)
    }

    /// Why the broker could not be asked, and the exit status for it.
    static func notAnswered(_ error: TesseraClientError) -> (String, Int32) {
      if let failure = startFailure(error) {
        // The report's reason is the message without the "tessera: " each printed line has.
        let lines = failure.message.split(separator: "\n").map { $0.hasPrefix("tessera: ") ? $0.dropFirst(9) : $0 }
        return (lines.joined(separator: "\n"), failure.status)
      }
      return (error.description, error.exitCode)
    }

    static func ask(_ broker: TesseraBroker) throws(TesseraClientError) -> Report {
      let version = try broker.version()
      let health = try broker.status()
      // The accounts the broker knows (none when the keyring could not be read yet: the report
      // says why instead); asked only then, so a keyring that does not answer holds nothing up.
      let accounts = health.accounts.isEmpty ? [] : try broker.accounts()
      var report = Report(
        running: true, version: version,
        accounts: accounts.map { a in AccountReport(account: a, health: health.accounts.first { $0.id == a.id }) },
        attentionNeeded: health.attentionNeeded,
        needsAttention: health.storeProblem != nil || !health.attentionNeeded.isEmpty,
        store: health.storeProblem == nil ? "ok" : "unavailable", storeMessage: health.storeProblem,
        fronts: [BrokerInterface.busName], microsoftBroker: "off")
      report.storeKind = health.storeKind
      report.storePath = health.storePath
      report.storeKey = health.storeKeyLocation
      report.storeNotes = health.storeNotes.isEmpty ? nil : health.storeNotes
      // Shown, but no reason for a failing status: the broker serves (under the configuration
      // in force), and the configuration's own notes are in `config`.
      report.config = health.config
      if let kind = health.dpopKind { report.dpop = .init(kind: kind, summary: health.dpopSummary ?? "") }
      switch health.sessionBus {
      case .connected?: report.sessionBus = "connected"
      case .missing(let why)?:
        report.sessionBus = "missing"
        report.sessionBusMessage = why
      case nil: break
      }
      let front: TesseraBroker.MicrosoftFront
      switch broker.connection {
      case .socket(let path, _):
        report.connection = "socket"
        report.socket = path
        // Reached without the bus. What tesserad says of its own bus decides; a broker too old to
        // say is judged from here.
        if case .missing = health.sessionBus {
          report.microsoftBroker = "no_session_bus"
          return report
        }
        guard let answer = try? broker.microsoftFront() else {
          report.microsoftBroker = health.sessionBus == .connected ? "not_reachable_here" : "no_session_bus"
          return report
        }
        front = answer
      case .sessionBus:
        report.connection = "session_bus"
        front = try broker.microsoftFront()
      }
      switch front {
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

    func run() throws {
      let (report, status) = Self.report()
      if output.json {
        printJSON(report)
      } else {
        Self.show(report, now: Int64(Date().timeIntervalSince1970))
      }
      if status != 0 { throw ExitCode(status) }
    }

    static func show(_ report: Report, now: Int64) {
      if report.running, let reason = report.reason {
        print(
          "tesserad is running, but does not report its status to this program: \(SafeText.clip(reason, limit: 2000))")
        return
      }
      guard report.running else {
        let reason = (report.reason ?? "").split(separator: "\n").map { SafeText.clip(String($0), limit: 2000) }
        if reason.count > 1 {
          print("tesserad is not running:")
          for line in reason { print("  \(line)") }
        } else {
          print("tesserad is not running: \(reason.first ?? "")")
        }
        return
      }
      if let problem = report.storeMessage {
        let what =
          report.storeKind == StoreKind.file.rawValue
          ? StoreKind.name(report.storeKind, path: report.storePath) : "the keyring"
        print(
          "tesserad \(report.version) is running, but cannot read \(what): \(SafeText.clip(problem, limit: 1000))")
      } else {
        let n = report.accounts.count
        print("tesserad \(report.version) is running; \(n) account\(n == 1 ? "" : "s") signed in.")
      }
      let providers: [ProviderConfig] =
        if case .checked(let settings) = checkConfig(option: nil, environment: ProcessInfo.processInfo.environment) {
          settings.config.providers
        } else { [] }
      for a in report.accounts { showAccount(a, report, now: now, providers: providers) }
      if let socket = report.socket {
        print("Reached over its own socket \(socket).")
      } else if report.connection == "session_bus" {
        print("Reached over the session bus (\(BrokerInterface.busName)).")
      }
      switch report.storeKind.flatMap(StoreKind.init) {
      case .file:
        print(
          "Store: sealed files in \(SafeText.clip(report.storePath ?? "", limit: 500)) (key: \(SafeText.clip(report.storeKey ?? "", limit: 500)))."
        )
      case .memory:
        print("Store: memory only (store = \"memory\"): nothing is written; a restart of tesserad needs a new sign-in.")
      default:
        print("Store: the Secret Service (desktop keyring).")
      }
      for note in report.storeNotes ?? [] { print("  \(SafeText.clip(note, limit: 1000))") }
      switch report.dpop?.kind {
      case "tpm"?, "software"?:
        print(
          "Tokens bound to this machine (DPoP, where the provider binds them): \(SafeText.clip(report.dpop?.summary ?? "", limit: 500))."
        )
      case "none"?: print("Tokens are not bound to this machine (no DPoP keys).")
      default: break
      }
      if let config = report.config { Self.printConfig(config) }
      switch report.microsoftBroker {
      case "no_session_bus":
        if let why = report.sessionBusMessage {
          print("tesserad has no session bus: \(SafeText.clip(why, limit: 500))")
        }
        print(
          "No session bus: tesserad serves its own socket alone. Tokens, sign-in (browser or device code), accounts and the git, kubectl, SASL and exec helpers all work; the Microsoft broker protocol (MSAL apps), desktop notifications and the portal's access dialog need a session bus and are off."
        )
      case "not_reachable_here":
        print(
          "tesserad has a session bus, but this program cannot reach it: here, only Tessera's own socket works (MSAL apps in this environment cannot use the Microsoft broker protocol). Run `tessera status` where the desktop session is to see the Microsoft front."
        )
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

    /// One account's lines: its state, cached tokens, next refresh and last error.
    static func showAccount(_ a: AccountReport, _ report: Report, now: Int64, providers: [ProviderConfig] = []) {
      let username = SafeText.clip(a.account.username, limit: 200)
      var line =
        "\(a.account.current == true ? "*" : " ") \(username) (\(SafeText.clip(a.account.environment, limit: 200)))"
      guard let h = a.health else {
        print(line)
        return
      }
      switch h.state {
      case "needs_sign_in":
        // An account of a provider of config.toml signs in again through it.
        let provider = providers.first { $0.issuer == a.account.authority }
        line +=
          ": needs a sign-in: run `tessera login \(provider.map { "--provider \($0.name)" } ?? "--login-hint \(username)")`"
      case "store_locked":
        line +=
          report.storeKind == StoreKind.file.rawValue
          ? ": \(StoreKind.name(report.storeKind, path: report.storePath)) cannot be read (see above)"
          : ": the keyring is locked: unlock it"
      case "idp_unreachable": line += ": the identity provider cannot be reached"
      case StatusReport.blockedByPolicy:
        line +=
          ": blocked: the configuration no longer trusts \(SafeText.clip(a.account.authority, limit: 200)) (trusted_authorities, or the administrator's [policy]); add it again, or sign the account out"
      default: line += ": ok"
      }
      print(line)
      if h.tokenBinding == "dpop" {
        print("    bound to this machine's key (DPoP): its refresh token is refused anywhere else")
      }
      if h.tokens.isEmpty {
        print("    no access token cached")
      }
      for t in h.tokens {
        let scopes = t.scopes.isEmpty ? "" : " (\(SafeText.clip(t.scopes.joined(separator: " "), limit: 200)))"
        let life =
          TokenExpiry.isNever(t.expiresOn)
          ? "does not expire"
          : t.expiresOn > now ? "expires \(when(t.expiresOn, now: now))" : "expired \(rfc3339(t.expiresOn))"
        print("    token for \(SafeText.clip(t.clientID, limit: 200))\(scopes): \(life)")
      }
      if let next = h.nextRefresh {
        print("    next refresh \(next > now ? when(next, now: now) : "now (due)")")
      }
      if let lapses = h.refreshTokenExpiresOn {
        print(
          lapses > now
            ? "    the sign-in lapses when its refresh token expires, \(when(lapses, now: now))"
            : "    the sign-in lapsed \(rfc3339(lapses)) (its refresh token expired)")
      }
      if let error = h.lastError {
        print("    last error \(rfc3339(error.at)): \(error.code): \(SafeText.clip(error.message, limit: 300))")
      }
    }

    /// The configuration in force, what the policy ignored, and a reload that was refused.
    static func printConfig(_ config: StatusReport.ConfigStatus) {
      let files = config.files.map { SafeText.clip($0, limit: 500) }
      let read =
        config.reloads > 0 ? "reloaded \(rfc3339(config.loadedAt))" : "read at start, \(rfc3339(config.loadedAt))"
      print(
        "Configuration: \(files.isEmpty ? "the defaults (no file)" : files.joined(separator: ", ")) (\(read)). `tessera config` shows every setting and its file."
      )
      if !config.locked.isEmpty {
        print("  Locked by the administrator's [policy]: \(config.locked.joined(separator: ", ")).")
      }
      for warning in config.warnings { print("  warning: \(SafeText.clip(warning, limit: 1000))") }
      if !config.atNextStart.isEmpty {
        print(
          "  Changed, and applied at the next start (systemctl --user restart tessera): \(config.atNextStart.joined(separator: ", "))."
        )
      }
      if let refused = config.refused {
        print(
          "  The reload at \(rfc3339(refused.at)) was refused, and the configuration above stays in force. Fix these, then run `systemctl --user reload tessera`:"
        )
        for problem in refused.problems { print("    \(SafeText.clip(problem, limit: 1000))") }
      }
    }

    /// "at 2026-11-26T10:00:00Z (in 54 min)".
    static func when(_ time: Int64, now: Int64) -> String {
      let left = time - now
      let span =
        left < 90
        ? "\(left) s" : left < 90 * 60 ? "\((left + 30) / 60) min" : "\(left / 3600) h \((left % 3600) / 60) min"
      return "at \(rfc3339(time)) (in \(span))"
    }
  }
}
