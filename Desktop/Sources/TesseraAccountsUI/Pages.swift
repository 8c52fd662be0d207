import CAdwaita
import TesseraClient
import TesseraInterface

/// Apps: every app the broker knows (from its grants and the access log), named as the broker
/// identified it, unverified programs marked, each with the accounts it may use and Revoke.
@GtkActor
final class AppsPage {
  let widget: Widget
  private let model: BrokerModel
  private let apps: RowGroup

  init(model: BrokerModel) {
    self.model = model
    widget = Gtk.preferencesPage()
    apps = RowGroup(
      "Apps",
      description:
        "Programs are named as Tessera identified them: Flatpak and snap apps by their id, other programs by their executable (unverified: any program of yours could run it).",
      empty: "No app has used the broker yet.")
    adw_preferences_page_add(widget.as(AdwPreferencesPage.self), apps.group.as(AdwPreferencesGroup.self))
    model.onChange { [unowned self] in self.update() }
  }

  /// The icon its desktop file names (a theme name, or a file: snaps name theirs by path), found
  /// where the desktop looks for desktop files (XDG_DATA_DIRS, with snapd's folder on a system
  /// with snaps); else a Flatpak's icon by its id; else a generic one.
  static func icon(_ app: AppRow) -> UnsafeMutablePointer<GtkWidget> {
    if let id = app.desktopFileID {
      let file = g_key_file_new()!
      defer { g_key_file_unref(file) }
      if g_key_file_load_from_data_dirs(file, "applications/\(id)", nil, G_KEY_FILE_NONE, nil) != 0,
        let value = g_key_file_get_string(file, "Desktop Entry", "Icon", nil)
      {
        defer { g_free(value) }
        let named = String(cString: value)
        if named.hasPrefix("/") {
          if g_file_test(named, G_FILE_TEST_IS_REGULAR) != 0 { return gtk_image_new_from_file(named)! }
        } else if !named.isEmpty {
          return gtk_image_new_from_icon_name(named)!
        }
      }
    }
    return gtk_image_new_from_icon_name(app.iconName)!
  }

  private func update() {
    let now = BrokerModel.now
    apps.set(
      AppRow.rows(grants: model.grants, log: model.log).map { app in
        let row = Gtk.row(title: app.display, subtitle: app.subtitle(now: now))
        let icon = Self.icon(app)
        gtk_image_set_pixel_size(icon.opaque, 32)
        adw_action_row_add_prefix(row.as(AdwActionRow.self), icon)
        if app.grants > 0 {
          Gtk.suffix(
            row,
            Gtk.button("Revoke all", accessibleLabel: "Revoke every grant of \(app.display)") { [unowned self] in
              self.model.run("revoke \(app.display)'s grants") { broker in
                try await broker.revoke(app: app.key)
              }
            })
        }
        return row
      })
  }
}

/// Activity: the access log, newest first, filtered by app, account and decision.
@GtkActor
final class ActivityPage {
  let widget: Widget
  private let model: BrokerModel
  private let records: RowGroup
  private let appFilter: Widget
  private let accountFilter: Widget
  private let decisionFilter: Widget
  private var appChoices: [(String, String)] = []
  private var accountChoices: [String] = []
  private static let decisions = ["allowed", "refused"]
  /// Set while the filters' lists are replaced: their "selected" changes are ours, not the user's.
  private var refilling = false
  /// At most this many records are drawn (the log keeps 1000).
  static let shown = 200

  init(model: BrokerModel) {
    self.model = model
    widget = gtk_box_new(GTK_ORIENTATION_VERTICAL, 6)!
    let bar = gtk_box_new(GTK_ORIENTATION_HORIZONTAL, 6)!
    for margin in [gtk_widget_set_margin_start, gtk_widget_set_margin_end, gtk_widget_set_margin_top] {
      margin(bar, 12)
    }
    appFilter = Gtk.dropDown(["All apps"], accessibleLabel: "Show the decisions of")
    accountFilter = Gtk.dropDown(["All accounts"], accessibleLabel: "Show the decisions for")
    decisionFilter = Gtk.dropDown(["Allowed and refused", "Allowed", "Refused"], accessibleLabel: "Show decisions")
    for filter in [appFilter, accountFilter, decisionFilter] {
      gtk_box_append(bar.as(GtkBox.self), filter)
    }
    let refresh = Gtk.iconButton("view-refresh-symbolic", accessibleLabel: "Refresh the activity") {
      [unowned model] in
      Task { @GtkActor in await model.refreshLog() }
    }
    gtk_box_append(bar.as(GtkBox.self), refresh)
    gtk_box_append(widget.as(GtkBox.self), bar)
    let page = Gtk.preferencesPage()
    gtk_widget_set_vexpand(page, 1)
    records = RowGroup(
      "Activity", description: "What apps asked the broker for since it started, and what it answered.",
      empty: "Nothing yet.")
    adw_preferences_page_add(page.as(AdwPreferencesPage.self), records.group.as(AdwPreferencesGroup.self))
    gtk_box_append(widget.as(GtkBox.self), page)
    for filter in [appFilter, accountFilter, decisionFilter] {
      Signals.connectWithArgument(filter.raw, "notify::selected") { [unowned self] in
        if !self.refilling { self.update() }
      }
    }
    model.onChange { [unowned self] in self.update() }
  }

  private func selected(_ dropDown: Widget) -> Int { Int(gtk_drop_down_get_selected(dropDown.opaque)) }

  /// The filter as the drop-downs say (index 0 of each is "all").
  var filter: ActivityFilter {
    let app = selected(appFilter)
    let account = selected(accountFilter)
    let decision = selected(decisionFilter)
    return ActivityFilter(
      app: app > 0 && app <= appChoices.count ? appChoices[app - 1].0 : nil,
      account: account > 0 && account <= accountChoices.count ? accountChoices[account - 1] : nil,
      decision: decision > 0 ? Self.decisions[decision - 1] : nil)
  }

  private func update() {
    let before = filter
    let choices = ActivityFilter.choices(model.log)
    if choices.apps.map(\.0) != appChoices.map(\.0) || choices.accounts != accountChoices {
      // New apps or accounts in the log: the lists grow, and what was chosen stays chosen.
      refilling = true
      appChoices = choices.apps
      accountChoices = choices.accounts
      replace(
        appFilter, ["All apps"] + appChoices.map(\.1),
        selecting: before.app.flatMap { key in appChoices.firstIndex { $0.0 == key } })
      replace(
        accountFilter, ["All accounts"] + accountChoices,
        selecting: before.account.flatMap(accountChoices.firstIndex(of:)))
      refilling = false
    }
    let now = BrokerModel.now
    records.set(
      filter.apply(model.log).prefix(Self.shown).map { record in
        Gtk.row(title: ActivityFilter.title(record), subtitle: ActivityFilter.subtitle(record, now: now))
      })
  }

  private func replace(_ dropDown: Widget, _ labels: [String], selecting index: Int?) {
    // The drop-down takes its own reference to the list (set_model), so ours is dropped.
    guard let list = Gtk.withStrings(labels, { gtk_string_list_new($0) }) else { return }
    gtk_drop_down_set_model(dropDown.opaque, list)
    g_object_unref(UnsafeMutableRawPointer(list))
    gtk_drop_down_set_selected(dropDown.opaque, guint(truncatingIfNeeded: (index ?? -1) + 1))
  }
}

/// Forwards: the live forwards (to remote hosts and containers), each with Stop.
@GtkActor
final class ForwardsPage {
  let widget: Widget
  private let model: BrokerModel
  private let forwards: RowGroup

  init(model: BrokerModel) {
    self.model = model
    widget = Gtk.preferencesPage()
    forwards = RowGroup(
      "Forwards",
      description:
        "Remote hosts and containers that may ask this machine's broker for tokens, each through a socket of its own.",
      empty: "No forward is open. `tessera forward HOST` opens one for an SSH session.")
    adw_preferences_page_add(widget.as(AdwPreferencesPage.self), forwards.group.as(AdwPreferencesGroup.self))
    model.onChange { [unowned self] in self.update() }
  }

  private func update() {
    let now = BrokerModel.now
    forwards.set(
      model.forwards.map { forward in
        let target = forward.host.isEmpty ? "a container" : forward.host
        let lifetime = forward.lasting ? "until stopped" : "while its `tessera forward` runs"
        let subtitle =
          "to \(target) · socket \(forward.path) · opened \(When.ago(forward.since, now: now)) · \(forward.connections) connection\(forward.connections == 1 ? "" : "s") · \(lifetime)"
        let row = Gtk.row(
          title: forward.name, subtitle: subtitle, accessibleLabel: "Forward \(forward.name): \(subtitle)")
        Gtk.suffix(
          row,
          Gtk.button("Stop", accessibleLabel: "Stop forward \(forward.name)") { [unowned self] in
            self.model.run("stop forward \(forward.name)", then: { await $0.load(forwards: true) }) { broker in
              try await broker.removeForward(name: forward.name)
            }
          })
        return row
      })
  }
}

/// Status: the store, the configuration (and a refused reload), the administrator's policy,
/// Microsoft's broker protocol.
@GtkActor
final class StatusPage {
  let widget: Widget
  private let model: BrokerModel
  private let managed: RowGroup
  private let lines: RowGroup

  init(model: BrokerModel) {
    self.model = model
    widget = Gtk.preferencesPage()
    managed = RowGroup("Managed by your organisation", empty: "")
    lines = RowGroup("Broker", empty: "Reading the broker's status…")
    for group in [managed, lines] {
      adw_preferences_page_add(widget.as(AdwPreferencesPage.self), group.group.as(AdwPreferencesGroup.self))
    }
    gtk_widget_set_visible(managed.group, 0)
    model.onChange { [unowned self] in self.update() }
  }

  private func update() {
    guard let status = model.status else {
      lines.setEmptyText(model.problem ?? "Reading the broker's status…")
      lines.set([])
      return
    }
    let report = StatusLines.of(status, microsoft: model.microsoft)
    if let keys = report.managedKeys {
      managed.setTitle(
        "Managed by your organisation",
        description: "Your administrator's policy sets these; config.toml and this app cannot change them.")
      managed.set(keys.map { Gtk.row(title: $0, subtitle: "Locked by the administrator's [policy]") })
      gtk_widget_set_visible(managed.group, 1)
    } else {
      gtk_widget_set_visible(managed.group, 0)
    }
    lines.set(report.lines.map { Gtk.row(title: $0.title, subtitle: $0.value) })
  }
}
