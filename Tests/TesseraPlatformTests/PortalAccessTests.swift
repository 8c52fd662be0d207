import TesseraInterface
import XCTest

@testable import TesseraCore
@testable import TesseraPlatform

/// Finding the desktop's access-dialog backend from its `*.portal` files, and what the dialog says.
final class PortalAccessTests: XCTestCase {
  let gnome = """
    [portal]
    DBusName=org.freedesktop.impl.portal.desktop.gnome
    Interfaces=org.freedesktop.impl.portal.Access;org.freedesktop.impl.portal.FileChooser;
    UseIn=gnome
    """
  let kde = """
    # KDE's
    [portal]
    DBusName=org.freedesktop.impl.portal.desktop.kde
    Interfaces=org.freedesktop.impl.portal.Access;org.freedesktop.impl.portal.Email
    UseIn=KDE
    """
  let wlr = """
    [portal]
    DBusName=org.freedesktop.impl.portal.desktop.wlr
    Interfaces=org.freedesktop.impl.portal.Screenshot;
    UseIn=wlroots;sway
    """

  func backends() throws -> [PortalAccessPrompter.Backend] {
    [
      try XCTUnwrap(PortalAccessPrompter.parse(gnome, file: "gnome.portal")),
      try XCTUnwrap(PortalAccessPrompter.parse(kde, file: "kde.portal")),
      try XCTUnwrap(PortalAccessPrompter.parse(wlr, file: "wlr.portal")),
    ]
  }

  func testTheBackendMeantForTheDesktopIsChosen() throws {
    let all = try backends()
    XCTAssertEqual(
      PortalAccessPrompter.choose(all, desktops: ["kde"])?.busName, "org.freedesktop.impl.portal.desktop.kde")
    XCTAssertEqual(
      PortalAccessPrompter.choose(all, desktops: ["ubuntu", "gnome"])?.busName,
      "org.freedesktop.impl.portal.desktop.gnome")
    // No backend for this desktop: any that shows access dialogs (never one that cannot).
    XCTAssertEqual(
      PortalAccessPrompter.choose(all, desktops: ["sway"])?.busName, "org.freedesktop.impl.portal.desktop.gnome")
    XCTAssertNil(PortalAccessPrompter.choose([all[2]], desktops: ["sway"]))
  }

  func testFilesThatAreNotPortalsAreIgnored() {
    XCTAssertNil(PortalAccessPrompter.parse("[other]\nDBusName=a.b\n", file: "x.portal"))
    XCTAssertNil(PortalAccessPrompter.parse("[portal]\nInterfaces=org.freedesktop.impl.portal.Access\n", file: "x"))
    XCTAssertNil(PortalAccessPrompter.parse("[portal]\nDBusName=:1.5\n", file: "x"), "a unique name is no service")
  }

  func testTheDialogNamesTheAppHowSureTesseraIsTheAccountClientAndScopes() {
    let question = AccessQuestion(
      app: AppIdentity(kind: .executable, id: "/usr/bin/tool"), clientID: "client-1", username: "alice@example.com",
      scopes: ["Mail.Send"], operation: "token")
    let texts = PortalAccessPrompter.texts(question)
    XCTAssertEqual(texts.title, "Allow /usr/bin/tool to use alice@example.com?")
    XCTAssertTrue(texts.subtitle.contains("/usr/bin/tool (unverified)"), texts.subtitle)
    XCTAssertTrue(texts.subtitle.contains("client-1"), texts.subtitle)
    XCTAssertTrue(texts.body.contains("cannot verify"), texts.body)
    XCTAssertTrue(texts.body.contains("Mail.Send"), texts.body)
    var sandboxed = question
    sandboxed.app = AppIdentity(kind: .flatpak, id: "org.example.App")
    XCTAssertTrue(PortalAccessPrompter.texts(sandboxed).body.contains("Flatpak sandbox"))
  }
}
