import TesseraAccountsUI
import TesseraInterface
import Testing

/// What the pages say, worked out from the broker's answers.
struct ModelTests {
  static let alice = AccountRowTests.account("a", "alice")
  static func grant(_ app: String, _ display: String, account: String, client: String = "c1", at: Int64 = 100)
    -> GrantInfo
  {
    GrantInfo(
      app: app, appDisplay: display, clientID: client, accountID: account, account: account == "*" ? "*" : "alice",
      grantedAt: at, via: "sign-in")
  }
  static func record(
    _ app: String, _ display: String, account: String = "alice", decision: String = "allowed", at: Int64,
    operation: String = "token", client: String = "c1"
  ) -> AccessRecord {
    AccessRecord(
      at: at, app: display, appKey: app, clientID: client, account: account, scopes: [], operation: operation,
      decision: decision, reason: decision == "allowed" ? "grant" : "strict", appDecisions: 1)
  }

  @Test func anAccountsAppsCarryTheirLastTokenAndTheGrantsForEveryAccount() {
    let grants = [
      Self.grant("exe:/usr/bin/git", "/usr/bin/git (unverified)", account: "a"),
      Self.grant("flatpak:org.example.Mail", "org.example.Mail (Flatpak)", account: "*"),
      Self.grant("exe:/usr/bin/kubectl", "/usr/bin/kubectl (unverified)", account: "b"),
    ]
    let log = [
      Self.record("exe:/usr/bin/git", "/usr/bin/git (unverified)", at: 500),
      Self.record("exe:/usr/bin/git", "/usr/bin/git (unverified)", decision: "refused", at: 900),
      Self.record("exe:/usr/bin/git", "/usr/bin/git (unverified)", account: "bob", at: 950),
    ]
    let rows = AccountAppRow.rows(account: Self.alice, grants: grants, log: log)
    #expect(rows.map(\.app) == ["exe:/usr/bin/git", "flatpak:org.example.Mail"], "bob's kubectl is not alice's")
    #expect(rows[0].lastToken == 500, "a refusal and bob's token are not alice's last token")
    #expect(rows[1].everyAccount && rows[1].lastToken == nil)
    #expect(rows[0].subtitle(now: 620).contains("last token 2 min ago"))
    #expect(rows[1].subtitle(now: 620).contains("for every account"))
    let use = LastUse.of(username: "alice", log: log)
    #expect(use?.app == "/usr/bin/git (unverified)" && use?.at == 500)
    #expect(LastUse.appCount(accountID: "a", grants: grants) == 2)
  }

  @Test func everyAppTheBrokerKnowsIsListedAndUnverifiedOnesAreMarked() {
    let apps = AppRow.rows(
      grants: [Self.grant("flatpak:org.example.Mail", "org.example.Mail (Flatpak)", account: "*")],
      log: [
        Self.record("exe:/tmp/x", "/tmp/x (unverified)", decision: "refused", at: 10),
        Self.record("flatpak:org.example.Mail", "org.example.Mail (Flatpak)", at: 20),
      ])
    #expect(apps.map(\.key) == ["exe:/tmp/x", "flatpak:org.example.Mail"])
    #expect(!apps[0].verified && apps[0].refusals == 1 && apps[0].grants == 0)
    #expect(apps[0].subtitle(now: 70).contains("unverified"))
    #expect(apps[1].verified && apps[1].accounts == ["every account"] && apps[1].lastSeen == 20)
    #expect(apps.map(\.iconName) == ["application-x-executable-symbolic", "org.example.Mail"])
  }

  @Test func eachKindOfAppIsLookedUpByTheDesktopFileItsPackagingWrites() {
    func app(_ key: String) -> AppRow {
      AppRow(key: key, display: key, verified: true, accounts: [], grants: 0, lastSeen: nil, refusals: 0)
    }
    #expect(app("flatpak:org.example.Mail").desktopFileID == "org.example.Mail.desktop")
    #expect(app("snap:firefox.firefox").desktopFileID == "firefox_firefox.desktop")
    #expect(app("snap:code.url-handler").desktopFileID == "code_url-handler.desktop")
    #expect(app("desktop:org.gnome.Evolution").desktopFileID == "org.gnome.Evolution.desktop")
    #expect(app("snap:no-app").desktopFileID == nil)
    #expect(app("snap:a.b/../../x").desktopFileID == nil)
    #expect(app("flatpak:../../../etc/x").desktopFileID == nil)
    #expect(app("exe:/usr/bin/git").desktopFileID == nil)
    #expect(app("forward:devbox").desktopFileID == nil)
  }

  @Test func activityIsFilteredByAppAccountAndDecisionNewestFirst() {
    let log = [
      Self.record("exe:/a", "/a", at: 1), Self.record("exe:/b", "/b", account: "bob", at: 2),
      Self.record("exe:/a", "/a", decision: "refused", at: 3),
    ]
    #expect(ActivityFilter().apply(log).map(\.at) == [3, 2, 1])
    #expect(ActivityFilter(app: "exe:/a").apply(log).map(\.at) == [3, 1])
    #expect(ActivityFilter(account: "bob").apply(log).map(\.at) == [2])
    #expect(ActivityFilter(app: "exe:/a", decision: "allowed").apply(log).map(\.at) == [1])
    let choices = ActivityFilter.choices(log)
    #expect(choices.apps.map(\.0) == ["exe:/a", "exe:/b"] && choices.accounts == ["alice", "bob"])
    #expect(ActivityFilter.subtitle(log[2], now: 63).hasPrefix("Refused (strict) · 1 min ago"))
  }

  @Test func statusSaysWhoManagesTheBrokerAndWhereThingsAre() {
    var status = StatusReport.Report(storeProblem: nil, accounts: [], attentionNeeded: [])
    status.storeKind = "file"
    status.storePath = "/home/u/.local/share/tessera"
    var config = StatusReport.ConfigStatus()
    config.files = ["/etc/tessera/config.toml", "/home/u/.config/tessera/config.toml"]
    config.locked = ["access_mode", "allowed_stores"]
    config.refused = .init(problems: ["line 3: unknown key 'acess_mode'"], at: 5)
    status.config = config
    let report = StatusLines.of(
      status, microsoft: .otherBroker(pid: 42, executable: "/usr/bin/microsoft-identity-broker"))
    #expect(report.managedKeys == ["access_mode", "allowed_stores"])
    let text = report.lines.map { "\($0.title): \($0.value)" }
    #expect(text.contains("Where accounts are kept: Tessera's own encrypted files in /home/u/.local/share/tessera"))
    #expect(text.contains { $0.hasPrefix("Last reload refused:") && $0.contains("acess_mode") })
    #expect(text.contains { $0.contains("another program (/usr/bin/microsoft-identity-broker)") })
    config.locked = []
    status.config = config
    #expect(StatusLines.of(status, microsoft: .served).managedKeys == nil)
  }

  @Test func timesAreWords() {
    #expect(When.ago(100, now: 130) == "just now")
    #expect(When.ago(100, now: 100 + 3 * 3600) == "3 h ago")
    #expect(When.ago(0, now: 86400) == "1 day ago")
    #expect(When.ago(200, now: 100) == "just now", "a clock that went back is not the future")
  }

  @Test func anAccountIsAddedAtTheDefaultOrAtAProviderByName() {
    var config = StatusReport.ConfigStatus()
    config.defaultAuthority = "https://login.microsoftonline.com/common"
    config.providers = [.init(name: "github", issuer: "https://github.com", profile: "github")]
    let targets = SignInTarget.targets(config)
    #expect(targets.map(\.label) == ["The default (login.microsoftonline.com)", "github (github, github.com)"])
    #expect(targets.map(\.provider) == [nil, "github"])
    #expect(SignInTarget.targets(nil).map(\.label) == ["The default provider"], "an older broker: the default only")
  }
}
