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

  /// The state words for a GetStatus account state.
  public static func words(forState state: String) -> String {
    switch state {
    case "ok": "Signed in"
    case "needs_sign_in": "Needs sign-in"
    case "store_locked": "Keyring locked"
    case "idp_unreachable": "Offline, retrying"
    default: "Unknown state (\(state))"
    }
  }

  /// What the page shows, from GetAccounts and GetStatus: the accounts that need attention
  /// first, then by username.
  public static func rows(accounts: [AccountInfo], status: StatusReport.Report) -> [AccountRow] {
    let states = Dictionary(status.accounts.map { ($0.id, $0.state) }, uniquingKeysWith: { a, _ in a })
    let attention = Set(status.attentionNeeded)
    return accounts.map { account in
      let state = states[account.id] ?? "ok"
      return AccountRow(
        id: account.id, username: account.username, name: account.name, environment: account.environment,
        state: words(forState: state), current: account.current == true,
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
    rows = accounts.map(Self.row)
    for row in rows { adw_preferences_group_add(group.as(AdwPreferencesGroup.self), row) }
    if accounts.isEmpty {
      show(message: "No account is signed in. Sign in with `tessera login`.")
    } else {
      gtk_widget_set_visible(message, 0)
    }
  }

  private static func row(_ account: AccountRow) -> Widget {
    let row = adw_action_row_new()!
    // Usernames come from identity providers: shown as text, never as markup.
    adw_preferences_row_set_use_markup(row.as(AdwPreferencesRow.self), 0)
    adw_preferences_row_set_title(row.as(AdwPreferencesRow.self), account.username)
    adw_action_row_set_subtitle(row.as(AdwActionRow.self), account.subtitle)
    let state = Gtk.label(account.state, wrap: false)
    gtk_widget_set_valign(state, GTK_ALIGN_CENTER)
    adw_action_row_add_suffix(row.as(AdwActionRow.self), state)
    row.setAccessibleLabel(account.accessibleLabel)
    return row
  }
}
