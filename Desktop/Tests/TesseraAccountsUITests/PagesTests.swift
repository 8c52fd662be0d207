import CAdwaita
import Glibc
import Testing

@testable import TesseraAccountsUI

/// Every page of the window is built, and the switcher shows each one (issue 39: a unit test
/// instantiates every page). GTK needs a display: scripts/test runs these tests under xvfb-run;
/// without one (a plain `swift test`) the test is skipped, and says why.
struct PagesTests {
  @Test(.enabled(if: getenv("DISPLAY") != nil, "needs a display: run under xvfb-run, as scripts/test does"))
  func everyPageIsBuiltAndShown() throws {
    // This test's thread becomes GTK's: it owns GLib's default context for the whole test, and
    // makes every GTK call itself (the body has no suspension point).
    #expect(g_main_context_acquire(g_main_context_default()) != 0)
    defer { g_main_context_release(g_main_context_default()) }
    gtk_init()
    adw_init()
    GtkActor.onGtkThread {
      let model = BrokerModel()
      let view = MainView(model: model)
      #expect(MainView.pages.map(\.0) == ["accounts", "apps", "activity", "forwards", "status"])
      for (name, _, _) in MainView.pages {
        view.show(page: name)
        #expect(view.visiblePage == name, "the switcher shows \(name)")
      }
      for widget in [
        view.accounts.widget, view.apps.widget, view.activity.widget, view.forwards.widget, view.status.widget,
      ] {
        #expect(gtk_widget_get_parent(widget) != nil, "each page is in the window's stack")
      }
      // An account's page for an account that is not there says so instead of failing.
      view.show(accountID: "no-such-account")
      #expect(view.visiblePage == "accounts")
    }
  }
}
