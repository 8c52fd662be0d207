import CAdwaita

/// Tessera Accounts: one window (a GApplication: a second start raises the first one's window).
@GtkActor
public final class AccountsApp {
  public static let applicationID = "org.tessera.Accounts"
  private let application: UnsafeMutablePointer<AdwApplication>
  private var window: Widget?
  private var accounts: AccountsPage?
  private var following: Task<Void, Never>?

  public init() {
    application = adw_application_new(Self.applicationID, G_APPLICATION_DEFAULT_FLAGS)
    Signals.connect(UnsafeMutableRawPointer(application), "activate") { [unowned self] in self.activate() }
  }

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
    gtk_window_set_default_size(window.as(GtkWindow.self), 560, 520)
    let box = gtk_box_new(GTK_ORIENTATION_VERTICAL, 0)!
    gtk_box_append(box.as(GtkBox.self), adw_header_bar_new())
    let accounts = AccountsPage()
    gtk_widget_set_vexpand(accounts.widget, 1)
    gtk_box_append(box.as(GtkBox.self), accounts.widget)
    adw_application_window_set_content(window.as(AdwApplicationWindow.self), box)
    self.window = window
    self.accounts = accounts
    accounts.window = window
    gtk_window_present(window.as(GtkWindow.self))
    following = Task { await accounts.follow() }
  }
}
