import TesseraClient
import TesseraInterface

/// What the pages show, worked out from the broker's answers without GTK (so it is unit-tested
/// without a display). Times are Unix seconds; `now` is passed in.
public enum When {
  /// "just now", "5 min ago", "3 h ago", "2 days ago": how long ago, in words.
  public static func ago(_ at: Int64, now: Int64) -> String {
    let seconds = max(0, now - at)
    switch seconds {
    case ..<60: return "just now"
    case ..<3600: return "\(seconds / 60) min ago"
    case ..<86400: return "\(seconds / 3600) h ago"
    default:
      let days = seconds / 86400
      return days == 1 ? "1 day ago" : "\(days) days ago"
    }
  }
}

/// How an app is named on the pages: as the broker identified it (never a name the app gave).
public enum AppName {
  /// The broker marks programs it could not tie to a package or sandbox as unverified.
  public static func isVerified(_ display: String) -> Bool { !display.contains("(unverified)") }
}

/// One app's access to one account, as the account's page lists it.
public struct AccountAppRow: Sendable, Equatable {
  public var app: String
  public var appDisplay: String
  public var clientID: String
  /// The grant is for every account ("*"): revoking it here takes it from every account.
  public var everyAccount: Bool
  public var scopes: String
  public var operations: String
  public var grantedAt: Int64
  public var via: String
  /// When the app last got a token of this account (since tesserad started), if it did.
  public var lastToken: Int64?

  /// An account's apps: its grants (and the grants for every account), each with the app's last
  /// token of it from the access log; the most recently used first.
  public static func rows(account: AccountInfo, grants: [GrantInfo], log: [AccessRecord]) -> [AccountAppRow] {
    grants.filter { $0.accountID == account.id || $0.accountID == "*" }.map { grant in
      let last = log.last {
        $0.appKey == grant.app && $0.account == account.username && $0.operation == "token"
          && $0.decision == "allowed" && (grant.clientID.isEmpty || $0.clientID == grant.clientID)
      }
      return AccountAppRow(
        app: grant.app, appDisplay: grant.appDisplay, clientID: grant.clientID, everyAccount: grant.accountID == "*",
        scopes: grant.scopes.map { $0.isEmpty ? "sign-in only" : $0.joined(separator: " ") } ?? "any scopes",
        operations: grant.operations.map { $0.joined(separator: ", ") } ?? "all operations",
        grantedAt: grant.grantedAt, via: grant.via, lastToken: last?.at)
    }.sorted { ($0.lastToken ?? -1, $1.appDisplay) > ($1.lastToken ?? -1, $0.appDisplay) }
  }

  /// Under the app's name: what it may do, when and how it was granted, its last token.
  public func subtitle(now: Int64) -> String {
    var parts = ["client \(clientID)", scopes, operations]
    parts.append("granted \(When.ago(grantedAt, now: now)) (\(Self.words(via: via)))")
    parts.append(lastToken.map { "last token \(When.ago($0, now: now))" } ?? "no token since the broker started")
    if everyAccount { parts.append("for every account") }
    return parts.joined(separator: " · ")
  }

  static func words(via: String) -> String {
    switch via {
    case "sign-in": "it signed in"
    case "command": "by a command"
    case "user": "you chose Always allow"
    default: via
    }
  }
}

/// When an account was last used and by which app (from the access log, since tesserad started).
public struct LastUse: Sendable, Equatable {
  public var app: String
  public var at: Int64

  public static func of(username: String, log: [AccessRecord]) -> LastUse? {
    log.last { $0.account == username && $0.operation == "token" && $0.decision == "allowed" }.map {
      LastUse(app: $0.app, at: $0.at)
    }
  }

  /// How many different apps may use the account (its grants and the grants for every account).
  public static func appCount(accountID: String, grants: [GrantInfo]) -> Int {
    Set(grants.filter { $0.accountID == accountID || $0.accountID == "*" }.map(\.app)).count
  }
}

/// One app on the Apps page: every app the broker knows, from its grants and the access log.
public struct AppRow: Sendable, Equatable {
  public var key: String
  public var display: String
  public var verified: Bool
  /// The usernames it holds grants for ("every account" for "*").
  public var accounts: [String]
  public var grants: Int
  /// Its last decision, if any since tesserad started.
  public var lastSeen: Int64?
  public var refusals: Int

  public init(
    key: String, display: String, verified: Bool, accounts: [String], grants: Int, lastSeen: Int64?, refusals: Int
  ) {
    (self.key, self.display, self.verified, self.accounts) = (key, display, verified, accounts)
    (self.grants, self.lastSeen, self.refusals) = (grants, lastSeen, refusals)
  }

  public static func rows(grants: [GrantInfo], log: [AccessRecord]) -> [AppRow] {
    var apps: [String: AppRow] = [:]
    for grant in grants {
      var row =
        apps[grant.app]
        ?? AppRow(
          key: grant.app, display: grant.appDisplay, verified: AppName.isVerified(grant.appDisplay), accounts: [],
          grants: 0, lastSeen: nil, refusals: 0)
      row.grants += 1
      let account =
        grant.accountID == "*" ? "every account" : (grant.account.isEmpty ? "a signed-out account" : grant.account)
      if !row.accounts.contains(account) { row.accounts.append(account) }
      apps[grant.app] = row
    }
    for record in log where !record.appKey.isEmpty {
      var row =
        apps[record.appKey]
        ?? AppRow(
          key: record.appKey, display: record.app, verified: AppName.isVerified(record.app), accounts: [], grants: 0,
          lastSeen: nil, refusals: 0)
      row.lastSeen = max(row.lastSeen ?? record.at, record.at)
      if record.decision == "refused" { row.refusals += 1 }
      apps[record.appKey] = row
    }
    return apps.values.sorted { ($0.display.lowercased(), $0.key) < ($1.display.lowercased(), $1.key) }
  }

  /// The desktop file that describes the app, by the name its packaging gives it: a Flatpak's
  /// `ID.desktop` (Flatpak exports it), a snap's `SNAP_APP.desktop` (snapd writes it to
  /// /var/lib/snapd/desktop/applications), a desktop app's own id. A program known by its
  /// executable alone has none. Only its icon is taken from it: the app's name stays the broker's.
  public var desktopFileID: String? {
    // A file name, never a path: "applications/" + the id is looked up under each data folder.
    guard !key.contains("/") else { return nil }
    if key.hasPrefix("flatpak:") { return "\(key.dropFirst("flatpak:".count)).desktop" }
    if key.hasPrefix("desktop:") { return "\(key.dropFirst("desktop:".count)).desktop" }
    if key.hasPrefix("snap:") {
      // The broker's snap id is `name.app`; snapd names the file `name_app.desktop`.
      let id = key.dropFirst("snap:".count)
      guard let dot = id.firstIndex(of: ".") else { return nil }
      return "\(id[..<dot])_\(id[id.index(after: dot)...]).desktop"
    }
    return nil
  }

  /// The icon the Apps page shows when the desktop file names none: a Flatpak app's own (the icon
  /// theme has it under the app's id), a generic one for every other program.
  public var iconName: String {
    if key.hasPrefix("flatpak:") { return String(key.dropFirst("flatpak:".count)) }
    if key.hasPrefix("forward:") { return "network-server-symbolic" }
    return "application-x-executable-symbolic"
  }

  public func subtitle(now: Int64) -> String {
    var parts: [String] = []
    parts.append(verified ? key : "\(key), unverified: identified by its executable only")
    parts.append(accounts.isEmpty ? "no grant" : "may use \(accounts.joined(separator: ", "))")
    if let lastSeen { parts.append("last asked \(When.ago(lastSeen, now: now))") }
    if refusals > 0 { parts.append("refused \(refusals) time\(refusals == 1 ? "" : "s")") }
    return parts.joined(separator: " · ")
  }
}

/// The Activity page's filters: by app (its key), account (username) and decision; nil is any.
public struct ActivityFilter: Sendable, Equatable {
  public var app: String?
  public var account: String?
  public var decision: String?

  public init(app: String? = nil, account: String? = nil, decision: String? = nil) {
    self.app = app
    self.account = account
    self.decision = decision
  }

  /// The records that pass, newest first.
  public func apply(_ log: [AccessRecord]) -> [AccessRecord] {
    log.filter { record in
      (app == nil || record.appKey == app) && (account == nil || record.account == account)
        && (decision == nil || record.decision == decision)
    }.reversed()
  }

  /// The choices each filter offers, from the log itself: (value, label), sorted.
  public static func choices(_ log: [AccessRecord]) -> (apps: [(String, String)], accounts: [String]) {
    var apps: [String: String] = [:]
    for record in log { apps[record.appKey] = record.app }
    let accounts = Set(log.map(\.account).filter { !$0.isEmpty })
    return (apps.map { ($0.key, $0.value) }.sorted { $0.1 < $1.1 }, accounts.sorted())
  }

  /// One record in a line: who, what, which account, the decision and why.
  public static func title(_ record: AccessRecord) -> String {
    "\(record.app): \(record.operation) for \(record.account.isEmpty ? "no account" : record.account)"
  }

  public static func subtitle(_ record: AccessRecord, now: Int64) -> String {
    let scopes = record.scopes.isEmpty ? "" : " · scopes \(record.scopes.joined(separator: " "))"
    return
      "\(record.decision.prefix(1).uppercased() + record.decision.dropFirst()) (\(record.reason)) · \(When.ago(record.at, now: now)) · client \(record.clientID)\(scopes)"
  }
}

/// The Status page's lines, in words.
public struct StatusLines: Sendable, Equatable {
  public struct Line: Sendable, Equatable {
    public var title: String
    public var value: String
  }
  public var lines: [Line]
  /// "Managed by your organisation": the keys the administrator's policy locks; nil when none.
  public var managedKeys: [String]?

  public static func of(_ status: StatusReport.Report, microsoft: TesseraBroker.MicrosoftFront?) -> StatusLines {
    var lines: [Line] = []
    let store =
      switch status.storeKind {
      case "file": "Tessera's own encrypted files" + (status.storePath.map { " in \($0)" } ?? "")
      case "memory": "Memory only: nothing is kept after tesserad stops"
      default: "The desktop keyring (Secret Service)"
      }
    lines.append(Line(title: "Where accounts are kept", value: store))
    if let problem = status.storeProblem { lines.append(Line(title: "Store problem", value: problem)) }
    if let config = status.config {
      lines.append(
        Line(
          title: "Configuration",
          value: config.files.isEmpty
            ? "Built-in defaults (no configuration file)" : config.files.joined(separator: ", ")))
      if let refused = config.refused {
        lines.append(
          Line(
            title: "Last reload refused",
            value: "The configuration in force stays. " + refused.problems.joined(separator: "; ")))
      }
      for warning in config.warnings { lines.append(Line(title: "Configuration warning", value: warning)) }
      if !config.atNextStart.isEmpty {
        lines.append(
          Line(title: "Waiting for a restart", value: config.atNextStart.joined(separator: ", ")))
      }
    }
    let served: String? =
      switch microsoft {
      case .served?: "Served by Tessera: MSAL apps (Azure CLI, Edge, Teams) use it"
      case .otherBroker(let pid, let executable)?:
        "Served by another program (\(executable ?? "process \(pid.map(String.init) ?? "?")")): MSAL apps use that one"
      case .off?: "Off (microsoft_broker = false)"
      case nil: nil
      }
    if let served { lines.append(Line(title: "Microsoft broker protocol", value: served)) }
    switch status.sessionBus {
    case .missing(let why)?: lines.append(Line(title: "Session bus", value: "None: \(why)"))
    default: break
    }
    lines.append(Line(title: "Version", value: status.version))
    let locked = status.config?.locked ?? []
    return StatusLines(lines: lines, managedKeys: locked.isEmpty ? nil : locked)
  }
}
