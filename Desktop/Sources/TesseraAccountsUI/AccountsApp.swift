import CAdwaita
import Glibc

/// Tessera Accounts: one window (a GApplication: a second start raises the first one's window).
@GtkActor
public final class AccountsApp {
  public static let applicationID = "org.tessera.Accounts"
  private let application: UnsafeMutablePointer<AdwApplication>
  private var window: Widget?
  private var pages: MainView?
  private let model = BrokerModel()
  private var following: Task<Void, Never>?

  public init() {
    application = adw_application_new(Self.applicationID, G_APPLICATION_DEFAULT_FLAGS)
    Signals.connect(UnsafeMutableRawPointer(application), "activate") { [unowned self] in self.activate() }
    // app.show-account(ACCOUNT_ID): what tesserad's "needs sign-in" notification activates (over
    // D-Bus, org.freedesktop.Application.ActivateAction): the window, at that account's page.
    let show = g_simple_action_new(Self.showAccountAction, g_variant_type_checked_("s"))!
    Signals.connectStringAction(UnsafeMutableRawPointer(show)) { [unowned self] accountID in
      self.activate()
      self.pages?.show(accountID: accountID)
    }
    g_action_map_add_action(OpaquePointer(application), show)
    g_object_unref(UnsafeMutableRawPointer(show))
  }

  /// The action tesserad's notification activates, with the account id.
  public static let showAccountAction = "show-account"

  /// Makes the app on this thread, which becomes GTK's, and runs it until its window closes;
  /// returns the exit status.
  public nonisolated static func main() -> Int32 {
    // Owning GLib's default context is what makes a thread GTK's (GtkActor checks it): from now,
    // and through g_application_run, which acquires it again.
    _ = g_main_context_acquire(g_main_context_default())
    defer { g_main_context_release(g_main_context_default()) }
    return GtkActor.onGtkThread { AccountsApp().run() }
  }

  /// Runs the GTK main loop until the window closes; returns the exit status.
  public func run() -> Int32 {
    g_application_run(
      UnsafeMutableRawPointer(application).assumingMemoryBound(to: GApplication.self), CommandLine.argc,
      CommandLine.unsafeArgv)
  }

  private func activate() {
    if let window {
      gtk_window_present(window.as(GtkWindow.self))
      return
    }
    let window = adw_application_window_new(
      UnsafeMutableRawPointer(application).assumingMemoryBound(to: GtkApplication.self))!
    gtk_window_set_title(window.as(GtkWindow.self), "Tessera Accounts")
    gtk_window_set_default_size(window.as(GtkWindow.self), 760, 600)
    let pages = MainView(model: model)
    pages.window = window
    adw_application_window_set_content(window.as(AdwApplicationWindow.self), pages.widget)
    self.window = window
    self.pages = pages
    gtk_window_present(window.as(GtkWindow.self))
    if Report.enabled, let clock = gtk_widget_get_frame_clock(window) {
      // The benchmark's start-to-first-frame: once, after the window's first paint.
      var painted = false
      Signals.connect(UnsafeMutableRawPointer(clock), "after-paint") {
        guard !painted else { return }
        painted = true
        Report.line("first-frame \(g_get_monotonic_time())")
      }
    }
    following = Task { [model] in await model.follow() }
  }
}

/// The window's content: a header bar whose switcher picks the page, a banner for what the user
/// must know now (a failed action, a sign-in to finish), and the pages.
@GtkActor
final class MainView {
  let widget: Widget
  let accounts: AccountsPage
  let apps: AppsPage
  let activity: ActivityPage
  let forwards: ForwardsPage
  let status: StatusPage
  private let stack: Widget
  private let banner: Widget
  private let bannerText: Widget
  private let model: BrokerModel
  var window: Widget? {
    didSet {
      accounts.window = window
      model.window = window
    }
  }

  /// The pages by name, title and icon, in the switcher's order.
  static let pages = [
    ("accounts", "Accounts", "avatar-default-symbolic"), ("apps", "Apps", "view-grid-symbolic"),
    ("activity", "Activity", "document-open-recent-symbolic"), ("forwards", "Forwards", "network-server-symbolic"),
    ("status", "Status", "emblem-system-symbolic"),
  ]

  init(model: BrokerModel) {
    self.model = model
    accounts = AccountsPage(model: model)
    apps = AppsPage(model: model)
    activity = ActivityPage(model: model)
    forwards = ForwardsPage(model: model)
    status = StatusPage(model: model)
    widget = gtk_box_new(GTK_ORIENTATION_VERTICAL, 0)!
    stack = adw_view_stack_new()!
    for ((name, title, icon), page) in zip(
      Self.pages, [accounts.widget, apps.widget, activity.widget, forwards.widget, status.widget])
    {
      let added = adw_view_stack_add_titled(stack.opaque, page, name, title)
      adw_view_stack_page_set_icon_name(added, icon)
    }
    let header = adw_header_bar_new()!
    let switcher = adw_view_switcher_title_new()!
    adw_view_switcher_title_set_stack(switcher.opaque, stack.opaque)
    adw_view_switcher_title_set_title(switcher.opaque, "Tessera Accounts")
    adw_header_bar_set_title_widget(header.opaque, switcher)
    gtk_box_append(widget.as(GtkBox.self), header)
    // libadwaita 1.2 has no AdwBanner: a revealer with a label and a close button does its job.
    banner = gtk_revealer_new()!
    let bannerBox = gtk_box_new(GTK_ORIENTATION_HORIZONTAL, 6)!
    gtk_widget_add_css_class(bannerBox, "toolbar")
    bannerText = Gtk.label("")
    gtk_label_set_selectable(bannerText.opaque, 1)
    gtk_widget_set_hexpand(bannerText, 1)
    gtk_label_set_xalign(bannerText.opaque, 0)
    gtk_box_append(bannerBox.as(GtkBox.self), bannerText)
    gtk_revealer_set_child(banner.opaque, bannerBox)
    gtk_box_append(widget.as(GtkBox.self), banner)
    gtk_widget_set_vexpand(stack, 1)
    gtk_box_append(widget.as(GtkBox.self), stack)
    let close = Gtk.iconButton("window-close-symbolic", accessibleLabel: "Dismiss the message") {}
    gtk_box_append(bannerBox.as(GtkBox.self), close)
    Signals.connect(close.raw, "clicked") { [unowned self] in self.say(nil) }
    model.say = { [unowned self] text in self.say(text) }
    model.onQuestion = { [unowned model] id, info in QuestionDialog.show(id: id, info: info, model: model) }
    // The access log has no signal: it is read when its page (or an account's) is shown.
    Signals.connectWithArgument(stack.raw, "notify::visible-child") { [unowned self, unowned model] in
      if self.visiblePage == "activity" || self.visiblePage == "apps" {
        Task { @GtkActor in await model.refreshLog() }
      }
    }
  }

  var visiblePage: String? {
    adw_view_stack_get_visible_child_name(stack.opaque).map { String(cString: $0) }
  }

  func show(page: String) { adw_view_stack_set_visible_child_name(stack.opaque, page) }

  /// The Accounts page, at one account's own page.
  func show(accountID: String) {
    show(page: "accounts")
    accounts.show(accountID: accountID)
  }

  /// Shows `text` in the banner (nil hides it).
  func say(_ text: String?) {
    gtk_label_set_text(bannerText.opaque, text ?? "")
    gtk_revealer_set_reveal_child(banner.opaque, text == nil ? 0 : 1)
  }
}

/// What the benchmark reads (TESSERA_ACCOUNTS_REPORT=1): lines on standard output with
/// CLOCK_MONOTONIC microseconds, "first-frame T" and "accounts-shown N T".
enum Report {
  static let enabled = getenv("TESSERA_ACCOUNTS_REPORT").map { String(cString: $0) == "1" } ?? false

  static func line(_ text: String) {
    guard enabled else { return }
    // One write(2) per line: nothing buffered in stdio waits for an exit.
    let bytes = Array((text + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(STDOUT_FILENO, $0.baseAddress, $0.count) }
  }
}
