import CAdwaita
import TesseraClient
import TesseraInterface

/// One account as the Accounts page shows it: who, where, and its state in words (never by
/// colour alone).
public struct AccountRow: Sendable, Equatable {
  public var id: String
  public var username: String
  public var name: String
  public var environment: String
  public var authority: String
  public var state: String
  public var current: Bool
  /// Accounts that need the user come first.
  public var needsAttention: Bool

  /// What the page shows, from GetStatus (every account, whatever the app's own grants) and
  /// GetAccounts (the names and current marks of the accounts this app may see, for brokers whose
  /// status has none): the accounts that need attention first, then by username.
  public static func rows(accounts: [AccountInfo], status: StatusReport.Report) -> [AccountRow] {
    let visible = Dictionary(accounts.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
    let attention = Set(status.attentionNeeded)
    var listed = status.accounts.map { entry in
      let info = visible[entry.id]
      return AccountRow(
        id: entry.id, username: entry.username, name: entry.name ?? info?.name ?? "",
        environment: info?.environment ?? host(of: entry.authority), authority: entry.authority,
        state: StatusReport.label(forState: entry.state), current: entry.current ?? info?.current ?? false,
        needsAttention: attention.contains(entry.id) || entry.state != "ok")
    }
    let inStatus = Set(status.accounts.map(\.id))
    for account in accounts where !inStatus.contains(account.id) {
      listed.append(
        AccountRow(
          id: account.id, username: account.username, name: account.name, environment: account.environment,
          authority: account.authority, state: StatusReport.label(forState: "ok"), current: account.current == true,
          needsAttention: attention.contains(account.id)))
    }
    return listed.sorted {
      ($0.needsAttention ? 0 : 1, $0.username, $0.id) < ($1.needsAttention ? 0 : 1, $1.username, $1.id)
    }
  }

  /// An authority's host ("login.microsoftonline.com"), as GetAccounts' environment names it.
  static func host(of authority: String) -> String {
    guard let rest = authority.split(separator: "://", maxSplits: 1).last else { return authority }
    return String(rest.prefix { $0 != "/" && $0 != ":" })
  }

  /// The row's accessible name: everything a screen reader user needs, in one phrase.
  public var accessibleLabel: String {
    "\(username) at \(environment), \(state.lowercased())\(current ? ", current account" : "")"
  }

  /// Under the username: the name, where, and whether it is the current account (the state is
  /// the row's suffix).
  public var subtitle: String {
    var parts = [environment]
    if current { parts.append("Current account") }
    if !name.isEmpty && name != username { parts.insert(name, at: 0) }
    return parts.joined(separator: " · ")
  }
}

/// The Accounts page: a row per account, and one account's own page (its apps, tokens and
/// actions) in place of the list when the row's Open button is pressed.
@GtkActor
final class AccountsPage {
  let widget: Widget
  private let model: BrokerModel
  private let list: RowGroup
  private let detail: AccountDetail
  /// The first accounts drawn were reported (the benchmark's TESSERA_ACCOUNTS_REPORT).
  private var reported = false
  /// The window the page's dialogs belong to.
  var window: Widget? {
    didSet { detail.window = window }
  }

  init(model: BrokerModel) {
    self.model = model
    widget = gtk_stack_new()!
    let listPage = Gtk.preferencesPage()
    list = RowGroup("Accounts", empty: "No account is signed in yet.")
    let add = Gtk.button("Add account…", accessibleLabel: "Add an account") { [unowned model] in
      AddAccount.ask(model: model, window: model.window)
    }
    adw_preferences_group_set_header_suffix(list.group.as(AdwPreferencesGroup.self), add)
    adw_preferences_page_add(listPage.as(AdwPreferencesPage.self), list.group.as(AdwPreferencesGroup.self))
    detail = AccountDetail(model: model)
    gtk_stack_add_named(widget.opaque, listPage, "list")
    gtk_stack_add_named(widget.opaque, detail.widget, "account")
    detail.onBack = { [unowned self] in self.showList() }
    model.onChange { [unowned self] in self.update() }
  }

  func showList() {
    detail.accountID = nil
    gtk_stack_set_visible_child_name(widget.opaque, "list")
  }

  func show(accountID: String) {
    detail.accountID = accountID
    detail.update()
    gtk_stack_set_visible_child_name(widget.opaque, "account")
  }

  private func update() {
    let rows = model.rows
    list.setEmptyText(
      model.status == nil
        ? (model.problem ?? "Reading the accounts…")
        : "No account is signed in yet. Sign in with Add account, or `tessera login`.")
    list.set(rows.map(row))
    detail.update()
    if model.status != nil && !reported {
      reported = true
      Report.line("accounts-shown \(rows.count) \(g_get_monotonic_time())")
    }
  }

  private func row(_ account: AccountRow) -> Widget {
    let now = BrokerModel.now
    var subtitle = account.subtitle
    let apps = LastUse.appCount(accountID: account.id, grants: model.grants)
    subtitle += " · \(apps == 1 ? "1 app" : "\(apps) apps") may use it"
    if let use = LastUse.of(username: account.username, log: model.log) {
      subtitle += " · last used \(When.ago(use.at, now: now)) by \(use.app)"
    }
    let row = Gtk.row(title: account.username, subtitle: subtitle, accessibleLabel: account.accessibleLabel)
    let state = Gtk.label(account.state, wrap: false)
    Gtk.suffix(row, state)
    if !account.current {
      Gtk.suffix(
        row,
        Gtk.button("Make current", accessibleLabel: "Make \(account.username) the current account") {
          [unowned self] in
          AccountActions.makeCurrent(account, model: self.model)
        })
    }
    Gtk.suffix(
      row,
      Gtk.button("Sign out…", accessibleLabel: "Sign out \(account.username)") { [unowned self] in
        AccountActions.confirmSignOut(account, model: self.model, window: self.window)
      })
    Gtk.suffix(
      row,
      Gtk.iconButton("go-next-symbolic", accessibleLabel: "Open \(account.username)'s account") { [unowned self] in
        self.show(accountID: account.id)
      })
    return row
  }
}

/// What a button can do to an account, the same from the list and from the account's page.
@GtkActor
enum AccountActions {
  static func makeCurrent(_ account: AccountRow, model: BrokerModel) {
    model.run("make \(account.username) current") { broker in
      _ = try await broker.setCurrentAccount(account.id)
    }
  }

  /// Sign-out asks first, naming the apps that lose the account, and offers the browser too.
  static func confirmSignOut(_ account: AccountRow, model: BrokerModel, window: Widget?) {
    let apps = Set(
      model.grants.filter { $0.accountID == account.id || $0.accountID == "*" }.map(\.appDisplay)
    ).sorted()
    let body =
      (apps.isEmpty
        ? "No app has been granted this account by name."
        : "These apps lose access: \(apps.joined(separator: ", ")).")
      + " Signing out in the browser too ends your session at \(account.environment), so the next sign-in asks for your password."
    Gtk.confirm(
      window: window, heading: "Sign out \(account.username)?", body: body,
      actions: [("browser", "Sign out here and in the browser"), ("signout", "Sign out")], destructive: "signout"
    ) { response in
      model.run("sign out \(account.username)") { broker in
        try await broker.signOut(accountID: account.id, browser: response == "browser")
      }
    }
  }

  /// Signs the account in again through the broker (its browser, or a device code it shows).
  static func signInAgain(_ account: AccountRow, model: BrokerModel) {
    var options = TesseraTokenOptions()
    options.authority = account.authority
    options.loginHint = account.username
    let request = options
    model.say("Signing in to \(account.username): finish in the browser window that opens.")
    model.run("sign in to \(account.username) again") { broker in
      _ = try await broker.acquireToken(options: request) { interaction in
        let text = SignInWords.text(interaction, username: account.username)
        Task { @GtkActor in model.say(text) }
      }
      Task { @GtkActor in model.say(nil) }
    }
  }
}

/// One account's page: who it is, its actions, the apps that may use it (each with Revoke) and
/// its cached tokens.
@GtkActor
final class AccountDetail {
  let widget: Widget
  private let model: BrokerModel
  private let about: RowGroup
  private let apps: RowGroup
  private let tokens: RowGroup
  var accountID: String?
  var window: Widget?
  var onBack: @GtkActor () -> Void = {}

  init(model: BrokerModel) {
    self.model = model
    widget = gtk_box_new(GTK_ORIENTATION_VERTICAL, 0)!
    let back = Gtk.iconButton("go-previous-symbolic", accessibleLabel: "Back to all accounts") {}
    gtk_widget_set_halign(back, GTK_ALIGN_START)
    gtk_widget_set_margin_start(back, 12)
    gtk_widget_set_margin_top(back, 6)
    gtk_box_append(widget.as(GtkBox.self), back)
    let page = Gtk.preferencesPage()
    gtk_widget_set_vexpand(page, 1)
    about = RowGroup("Account", empty: "This account is no longer signed in.")
    apps = RowGroup("Apps", empty: "No app has a grant for this account.")
    tokens = RowGroup("Tokens", empty: "No access token is cached for this account.")
    for group in [about, apps, tokens] {
      adw_preferences_page_add(page.as(AdwPreferencesPage.self), group.group.as(AdwPreferencesGroup.self))
    }
    gtk_box_append(widget.as(GtkBox.self), page)
    Signals.connect(back.raw, "clicked") { [unowned self] in self.onBack() }
  }

  func update() {
    guard let accountID else { return }
    guard let account = model.rows.first(where: { $0.id == accountID }) else {
      about.setTitle("Account")
      about.set([])
      apps.set([])
      tokens.set([])
      return
    }
    let now = BrokerModel.now
    about.setTitle(account.username, description: account.subtitle)
    let state = Gtk.row(
      title: "State", subtitle: account.state, accessibleLabel: "\(account.username): \(account.state.lowercased())")
    let actions = gtk_box_new(GTK_ORIENTATION_HORIZONTAL, 6)!
    gtk_box_append(
      actions.as(GtkBox.self),
      Gtk.button("Sign in again", accessibleLabel: "Sign in to \(account.username) again") { [unowned self] in
        AccountActions.signInAgain(account, model: self.model)
      })
    if !account.current {
      gtk_box_append(
        actions.as(GtkBox.self),
        Gtk.button("Make current", accessibleLabel: "Make \(account.username) the current account") {
          [unowned self] in
          AccountActions.makeCurrent(account, model: self.model)
        })
    }
    gtk_box_append(
      actions.as(GtkBox.self),
      Gtk.button("Sign out…", accessibleLabel: "Sign out \(account.username)") { [unowned self] in
        AccountActions.confirmSignOut(account, model: self.model, window: self.window)
      })
    Gtk.suffix(state, actions)
    about.set([state])

    let info = AccountInfo(
      id: account.id, username: account.username, name: account.name, authority: account.authority,
      environment: account.environment, realm: "", localAccountID: "")
    apps.setTitle("Apps that may use \(account.username)")
    apps.set(
      AccountAppRow.rows(account: info, grants: model.grants, log: model.log).map { app in
        let row = Gtk.row(title: app.appDisplay, subtitle: app.subtitle(now: now))
        Gtk.suffix(
          row,
          Gtk.button("Revoke", accessibleLabel: "Revoke \(app.appDisplay)'s access to \(account.username)") {
            [unowned self] in
            self.revoke(app, account: account)
          })
        return row
      })
    let cached = model.status?.accounts.first { $0.id == account.id }?.tokens ?? []
    tokens.set(
      cached.map { token in
        let expiry =
          TokenExpiry.isNever(token.expiresOn)
          ? "does not expire"
          : (token.expiresOn > now ? "expires in \((token.expiresOn - now + 59) / 60) min" : "expired")
        return Gtk.row(
          title: "client \(token.clientID)",
          subtitle: (token.scopes.isEmpty ? "sign-in scopes" : token.scopes.joined(separator: " ")) + " · " + expiry)
      })
  }

  /// Revokes the app's grant for this account; a grant for every account goes whole, so that
  /// one asks first.
  private func revoke(_ app: AccountAppRow, account: AccountRow) {
    let go: @GtkActor () -> Void = { [model] in
      model.run("revoke \(app.appDisplay)'s access to \(account.username)") { broker in
        try await broker.revokeGrant(
          app: app.app, clientID: app.clientID, account: app.everyAccount ? "*" : account.id)
      }
    }
    guard app.everyAccount else { return go() }
    Gtk.confirm(
      window: window, heading: "Revoke \(app.appDisplay)'s access to every account?",
      body:
        "\(app.appDisplay) was granted every account for client \(app.clientID). Revoking it here takes all of them away; grant the ones to keep again with `tessera access grant`.",
      actions: [("revoke", "Revoke for every account")], destructive: "revoke"
    ) { _ in go() }
  }
}

/// What to tell the user while the broker waits for a sign-in.
public enum SignInWords {
  public static func text(_ interaction: TesseraInteraction, username: String) -> String {
    if let code = interaction.userCode {
      return "To sign in to \(username), open \(interaction.verificationURI) on any device and enter the code \(code)."
    }
    return
      "Signing in to \(username): finish in your browser. If no window opened, open \(interaction.verificationURI)."
  }
}
