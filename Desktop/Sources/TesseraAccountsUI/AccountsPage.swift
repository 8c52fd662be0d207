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
  public var state: String
  public var current: Bool
  /// Accounts that need the user come first.
  public var needsAttention: Bool

  /// What the page shows, from GetAccounts and GetStatus: the accounts that need attention
  /// first, then by username.
  public static func rows(accounts: [AccountInfo], status: StatusReport.Report) -> [AccountRow] {
    let states = Dictionary(status.accounts.map { ($0.id, $0.state) }, uniquingKeysWith: { a, _ in a })
    let attention = Set(status.attentionNeeded)
    return accounts.map { account in
      let state = states[account.id] ?? "ok"
      return AccountRow(
        id: account.id, username: account.username, name: account.name, environment: account.environment,
        state: StatusReport.label(forState: state), current: account.current == true,
        needsAttention: attention.contains(account.id) || state != "ok")
    }.sorted { ($0.needsAttention ? 0 : 1, $0.username, $0.id) < ($1.needsAttention ? 0 : 1, $1.username, $1.id) }
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

/// The Accounts page: a row per account, kept up to date from the broker's events.
@GtkActor
final class AccountsPage {
  let widget: Widget
  private let group: Widget
  private let message: Widget
  private var rows: [Widget] = []
  private let broker = AsyncTesseraBroker()
  /// The window the page's dialogs belong to.
  var window: Widget?

  init() {
    widget = adw_preferences_page_new()!
    group = adw_preferences_group_new()!
    adw_preferences_group_set_title(group.as(AdwPreferencesGroup.self), "Accounts")
    adw_preferences_page_add(widget.as(AdwPreferencesPage.self), group.as(AdwPreferencesGroup.self))
    message = Gtk.label("")
    gtk_widget_set_visible(message, 0)
    adw_preferences_group_add(group.as(AdwPreferencesGroup.self), message)
  }

  /// Shows the accounts now, then follows the broker: each event reads them again. When tesserad
  /// stops, says so and watches again after a pause.
  func follow() async {
    while !Task.isCancelled {
      do {
        for try await event in broker.events() {
          switch event {
          case .watching, .accountsChanged, .attentionNeeded: await reload()
          }
        }
      } catch {
        show(message: "Tessera's broker is not running (\(error)). Waiting for it to start…")
      }
      try? await Task.sleep(for: .seconds(2))
    }
  }

  func reload() async {
    do {
      async let accounts = broker.accounts()
      async let status = broker.status()
      show(AccountRow.rows(accounts: try await accounts, status: try await status))
    } catch {
      show(message: "Could not read the accounts: \(error)")
    }
  }

  private func show(message text: String) {
    gtk_label_set_text(message.opaque, text)
    gtk_widget_set_visible(message, 1)
  }

  private func show(_ accounts: [AccountRow]) {
    for row in rows { adw_preferences_group_remove(group.as(AdwPreferencesGroup.self), row) }
    rows = accounts.map(row)
    for row in rows { adw_preferences_group_add(group.as(AdwPreferencesGroup.self), row) }
    if accounts.isEmpty {
      show(message: "No account is signed in. Sign in with `tessera login`.")
    } else {
      gtk_widget_set_visible(message, 0)
    }
  }

  private func row(_ account: AccountRow) -> Widget {
    let row = adw_action_row_new()!
    // Usernames come from identity providers: shown as text, never as markup.
    adw_preferences_row_set_use_markup(row.as(AdwPreferencesRow.self), 0)
    adw_preferences_row_set_title(row.as(AdwPreferencesRow.self), account.username)
    adw_action_row_set_subtitle(row.as(AdwActionRow.self), account.subtitle)
    let state = Gtk.label(account.state, wrap: false)
    gtk_widget_set_valign(state, GTK_ALIGN_CENTER)
    adw_action_row_add_suffix(row.as(AdwActionRow.self), state)
    if !account.current {
      let use = Gtk.button("Make current", accessibleLabel: "Make \(account.username) the current account") {
        [unowned self] in
        self.run("make \(account.username) current") { broker in
          _ = try await broker.setCurrentAccount(account.id)
        }
      }
      gtk_widget_set_valign(use, GTK_ALIGN_CENTER)
      adw_action_row_add_suffix(row.as(AdwActionRow.self), use)
    }
    let signOut = Gtk.button("Sign out…", accessibleLabel: "Sign out \(account.username)") { [unowned self] in
      self.confirmSignOut(account)
    }
    gtk_widget_set_valign(signOut, GTK_ALIGN_CENTER)
    adw_action_row_add_suffix(row.as(AdwActionRow.self), signOut)
    row.setAccessibleLabel(account.accessibleLabel)
    return row
  }

  /// Runs a broker call for a button; a failure is shown on the page in words.
  private func run(_ what: String, _ body: @escaping @Sendable (AsyncTesseraBroker) async throws -> Void) {
    let broker = broker
    Task { @GtkActor in
      do { try await body(broker) } catch { self.show(message: "Could not \(what): \(error)") }
    }
  }

  /// Sign-out asks first, naming the apps that lose the account, and offers the browser too.
  private func confirmSignOut(_ account: AccountRow) {
    let broker = broker
    Task { @GtkActor in
      let grants = (try? await broker.grants()) ?? []
      let apps = Set(grants.filter { $0.accountID == account.id || $0.accountID == "*" }.map(\.appDisplay)).sorted()
      let body =
        (apps.isEmpty
          ? "No app has been granted this account by name."
          : "These apps lose access: \(apps.joined(separator: ", ")).")
        + " Signing out in the browser too ends your session at \(account.environment), so the next sign-in asks for your password."
      let dialog = adw_message_dialog_new(
        window.map { $0.as(GtkWindow.self) }, "Sign out \(account.username)?", body)!
      let message = dialog.as(AdwMessageDialog.self)
      adw_message_dialog_add_response(message, "cancel", "Cancel")
      adw_message_dialog_add_response(message, "browser", "Sign out here and in the browser")
      adw_message_dialog_add_response(message, "signout", "Sign out")
      adw_message_dialog_set_response_appearance(message, "signout", ADW_RESPONSE_DESTRUCTIVE)
      adw_message_dialog_set_default_response(message, "cancel")
      adw_message_dialog_set_close_response(message, "cancel")
      Signals.connectResponse(dialog.raw) { [unowned self] response in
        gtk_window_destroy(dialog.as(GtkWindow.self))
        guard response == "signout" || response == "browser" else { return }
        self.run("sign out \(account.username)") { broker in
          try await broker.signOut(accountID: account.id, browser: response == "browser")
        }
      }
      gtk_window_present(dialog.as(GtkWindow.self))
    }
  }
}
