import Foundation
import Glibc
import TesseraTestSupport
import XCTest

@testable import TesseraPlatform

/// Which app a caller is: the parsers for cgroups, .flatpak-info and snap labels, and the real
/// thing for this test process.
final class CallerIdentityTests: XCTestCase {
  func testFlatpakScopeAndInfoMustAgree() {
    let cgroup = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-flatpak-org.example.App-1234.scope\n"
    XCTAssertEqual(CallerIdentity.flatpakAppID(cgroup: cgroup), "org.example.App")
    XCTAssertNil(CallerIdentity.flatpakAppID(cgroup: "0::/user.slice/app-flatpak-org.example.App-x1.scope\n"))
    XCTAssertNil(CallerIdentity.flatpakAppID(cgroup: "0::/user.slice/app-flatpak-..-1.scope\n"))
    let info = "[Application]\nname=org.example.App\nruntime=runtime/org.gnome.Platform/x86_64/46\n\n[Instance]\n"
    XCTAssertEqual(CallerIdentity.flatpakAppID(info: info), "org.example.App")
    XCTAssertNil(CallerIdentity.flatpakAppID(info: "[Runtime]\nname=org.example.App\n"))
    XCTAssertNil(CallerIdentity.flatpakAppID(info: "[Application]\nname=../../etc\n"))
  }

  func testDesktopUnitsName() {
    func id(_ unit: String) -> String? { CallerIdentity.desktopID(cgroup: "0::/user.slice/app.slice/\(unit)\n") }
    XCTAssertEqual(id("app-gnome-org.gnome.Evolution-4242.scope"), "org.gnome.Evolution")
    XCTAssertEqual(id("app-org.kde.kmail2@0d3f.service"), "org.kde.kmail2")
    XCTAssertEqual(id("app-gnome-org.gnome.Terminal\\x2dPreview-11.scope"), "org.gnome.Terminal-Preview")
    XCTAssertNil(id("session-2.scope"))
    XCTAssertNil(id("tessera.service"))
  }

  /// The unit is read from the cgroup file's bytes; for the text a kernel writes there (no
  /// combining marks, no CR), that is what a character-wise reading finds: checked against one
  /// over generated files (other hierarchies' lines, empty and repeated slashes, no 0:: line).
  func testTheUnitIsWhatACharacterWiseReadingFinds() {
    func characterWise(_ cgroup: String) -> String? {
      for line in cgroup.split(separator: "\n") where line.hasPrefix("0::") {
        return line.split(separator: "/").last.map(String.init)
      }
      return nil
    }
    var random = SeededGenerator(state: 41)
    let parts = [
      "user.slice", "user-1000.slice", "user@1000.service", "app.slice", "app-gnome-org.gnome.Evolution-4242.scope",
      "app-flatpak-org.example.App-12.scope", "", "session-2.scope", "init.scope", "é.scope", "x\\x2dy",
    ]
    for _ in 0..<2000 {
      var lines: [String] = []
      for _ in 0..<Int.random(in: 0...4, using: &random) {
        let prefix = ["0::", "1:name=systemd:", "4:memory:", "0:", "10::"].randomElement(using: &random)!
        let path = (0..<Int.random(in: 0...5, using: &random)).map { _ in parts.randomElement(using: &random)! }
        lines.append(prefix + (Bool.random(using: &random) ? "/" : "") + path.joined(separator: "/"))
      }
      let text = lines.joined(separator: "\n") + (Bool.random(using: &random) ? "\n" : "")
      XCTAssertEqual(CallerIdentity.unit(cgroup: text), characterWise(text), text.debugDescription)
    }
  }

  func testSnapLabels() {
    XCTAssertEqual(CallerIdentity.snapApp(label: "snap.firefox.firefox (enforce)"), "firefox.firefox")
    XCTAssertNil(CallerIdentity.snapApp(label: "unconfined"))
    XCTAssertNil(CallerIdentity.snapApp(label: "snap.firefox"))
    XCTAssertNil(CallerIdentity.snapApp(label: "snap.firefox.firefox (complain)"), "complain mode confines nothing")
  }

  func testThisProcessIsItsExecutableAndAGonePidIsNobody() throws {
    let me = try XCTUnwrap(CallerIdentity.identify(pid: UInt32(getpid()), label: nil))
    // In a desktop session the test runner may sit in an app scope; elsewhere it is its executable.
    if me.kind == .executable { XCTAssertTrue(me.id.hasSuffix(".xctest") || me.id.contains("xctest"), me.id) }
    XCTAssertFalse(me.isVerified)
    XCTAssertNil(CallerIdentity.identify(pid: 999_999_999, label: nil), "no such process")
  }

  /// A pinned process that execs another program is seen as that program at the next recheck, and
  /// one that ended is nobody from then on (the recheck's one fstatat, and the pidfd when it fails).
  func testARecheckSeesAnExecAndAnEnd() throws {
    let child = Process()
    child.executableURL = URL(fileURLWithPath: "/bin/sh")
    // sh waits for the go-ahead file, then becomes sleep.
    let go = NSTemporaryDirectory() + "tessera-recheck-\(getpid())"
    unlink(go)
    child.arguments = ["-c", "while [ ! -e \(go) ]; do sleep 0.01; done; exec /bin/sleep 30"]
    try child.run()
    defer { if child.isRunning { child.terminate() } }
    let pinned = try XCTUnwrap(CallerIdentity.pin(pid: UInt32(child.processIdentifier), label: nil))
    let before = try XCTUnwrap(pinned.app)
    XCTAssertFalse(pinned.recheck(), "nothing changed yet")
    XCTAssertTrue(FileManager.default.createFile(atPath: go, contents: nil))
    defer { unlink(go) }
    // sh sees the file within its next 10 ms turn and execs (30 s only bounds a hang).
    var changed = false
    let deadline = ContinuousClock.now + .seconds(30)
    while !changed && ContinuousClock.now < deadline {
      usleep(10_000)
      changed = pinned.recheck()
    }
    XCTAssertTrue(changed, "the exec was not seen")
    XCTAssertNotEqual(pinned.app, before)
    XCTAssertTrue(pinned.app?.id.contains("sleep") ?? false, "\(String(describing: pinned.app))")
    child.terminate()
    child.waitUntilExit()
    XCTAssertTrue(pinned.recheck(), "the end was not seen")
    XCTAssertNil(pinned.app)
    XCTAssertFalse(pinned.recheck(), "an ended process stays nobody")
  }
}
