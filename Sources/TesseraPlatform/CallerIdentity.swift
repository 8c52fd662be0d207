import CTesseraSystemShim
import Glibc
import SystemPackage
import TesseraBus
import TesseraCore
import TesseraInterface
import TesseraSystem

/// Tells which app a bus caller is (issue 11), from its process, as xdg-desktop-portal does:
///
/// 1. The process is pinned with a pidfd first. Everything is read through `/proc/PID/…`, and the
///    pidfd is checked afterwards: if the process ended meanwhile (its pid may now name another),
///    nothing read counts and the caller is not identified.
/// 2. Flatpak: `.flatpak-info` read from the process's own root (`/proc/PID/root`, opened once,
///    then openat with O_NOFOLLOW, so the sandbox cannot point it elsewhere with a link), and the
///    app id must agree with the `app-flatpak-<id>-N.scope` cgroup flatpak puts it in.
/// 3. snap: the AppArmor label `snap.<name>.<app>` the bus daemon reports.
/// 4. Host apps: the desktop-file id of the `app-…` scope or service it runs in, else the
///    executable (with its device and inode when the file is not root's).
public enum CallerIdentity {
  /// Identifies the process `pid` and keeps it pinned, so later calls on the same connection
  /// notice when it has ended or become another program (`PinnedCaller.recheck`).
  public static func pin(pid: UInt32, label: String?) -> PinnedCaller? {
    let pidfd = tessera_pidfd_open(Int32(bitPattern: pid))
    guard pidfd >= 0 else { return nil }  // already gone
    return PinnedCaller(pidfd: pidfd, pid: pid, label: label)
  }

  /// Identifies and keeps the process behind `pidfd`, which the kernel gave for the peer of a
  /// direct connection (SO_PEERPIDFD): the process that connected, whatever has its pid now. The
  /// pidfd is the caller's to keep from here on.
  public static func pin(pidfd: Int32, pid: UInt32, label: String?) -> PinnedCaller? {
    PinnedCaller(pidfd: pidfd, pid: pid, label: label)
  }

  /// Identifies the process `pid`; `label` is the security label from the bus credentials.
  public static func identify(pid: UInt32, label: String?) -> AppIdentity? {
    pin(pid: pid, label: label)?.app
  }

  /// Identifies the process behind `pidfd` (whose pid is `pid`); nil when it ended meanwhile.
  /// `program` is what PinnedCaller read of /proc/PID/exe just before (its path and stat), so
  /// that each /proc file is read once per identification.
  static func identify(pidfd: Int32, pid: UInt32, label: String?, program: Program?) -> AppIdentity? {
    let proc = "/proc/\(pid)"
    let unit = readText(proc + "/cgroup", limit: 64 * 1024).flatMap { CallerIdentity.unit(cgroup: $0) }
    var identity: AppIdentity?
    // A sandbox's own file is looked for first, wherever the process runs: a Flatpak app outside
    // its scope must not pass for the runtime's /usr/bin/python3.
    let info = readFlatpakInfo(proc: proc)
    let scopeApp = unit.flatMap(flatpakAppID(unit:))
    if info != nil || scopeApp != nil {
      // Both must be there and agree; anything else is not identified.
      guard let info, let scopeApp, flatpakAppID(info: info) == scopeApp else { return nil }
      identity = AppIdentity(kind: .flatpak, id: scopeApp)
    } else if let label, let snap = snapApp(label: label) {
      // The kernel's label, which the snap cannot change; snaps run in a mount namespace of
      // their own, so this comes before the check below.
      identity = AppIdentity(kind: .snap, id: snap)
    } else if !sameMountNamespace(proc: proc) {
      // Another mount namespace (a container, a user namespace with its own mounts) could show
      // any path as its executable: not identified.
      return nil
    } else if let desktop = unit.flatMap(desktopID(unit:)) {
      identity = AppIdentity(kind: .desktop, id: desktop)
    } else if let program, let exe = executable(program) {
      identity = exe
    }
    // Everything above was read while the pidfd's process was alive: not a recycled pid.
    guard !CallerIdentity.hasEnded(pidfd) else { return nil }
    return identity
  }

  /// Whether the pidfd's process has ended (a zombie counts: it runs nothing any more). A pidfd
  /// turns readable when its process exits.
  static func hasEnded(_ pidfd: Int32) -> Bool {
    var entry = pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0)
    return poll(&entry, 1, 0) != 0
  }

  /// The program a process runs: its path (`/proc/PID/exe`) and its file's device, inode and
  /// owner. The device and inode change when the process execs another program.
  struct Program: Equatable {
    var path: String?
    var dev: UInt64
    var ino: UInt64
    var uid: UInt32
  }

  /// Its program's file (one stat), and with `path` its path too (one readlink).
  static func program(proc: String, path: Bool) -> Program? {
    var info = stat()
    guard stat(proc + "/exe", &info) == 0 else { return nil }
    var program = Program(path: nil, dev: UInt64(info.st_dev), ino: UInt64(info.st_ino), uid: info.st_uid)
    if path { program.path = readLink(proc + "/exe") }
    return program
  }

  // MARK: Readers

  static func sameMountNamespace(proc: String) -> Bool {
    guard let theirs = readLink(proc + "/ns/mnt"), let ours = ownMountNamespace else { return false }
    return theirs == ours
  }

  /// tesserad's own mount namespace: read once (it never joins another).
  static let ownMountNamespace = readLink("/proc/self/ns/mnt")

  /// Where a link points; nil when it cannot be read.
  static func readLink(_ path: String) -> String? {
    var buffer = [CChar](repeating: 0, count: 4096)
    let n = readlink(path, &buffer, buffer.count - 1)
    return n > 0 ? String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : nil
  }

  static func readText(_ path: String, limit: Int) -> String? {
    (try? Syscall.readFile(path, limit: limit, followLinks: false)).map { String(decoding: $0, as: UTF8.self) }
  }

  static func readAll(_ fd: Int32, limit: Int) -> String? {
    (try? Syscall.readAll(FileDescriptor(rawValue: fd), limit: limit)).map { String(decoding: $0, as: UTF8.self) }
  }

  /// `.flatpak-info` at the root of the process's mount namespace, never through a link.
  static func readFlatpakInfo(proc: String) -> String? {
    let root = open(proc + "/root", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard root >= 0 else { return nil }
    defer { close(root) }
    let fd = openat(root, ".flatpak-info", O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var info = stat()
    guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { return nil }
    return readAll(fd, limit: 64 * 1024)
  }

  static func executable(_ program: Program) -> AppIdentity? {
    guard var path = program.path else { return nil }
    // A program replaced while it runs shows as "PATH (deleted)": still that path's program.
    if path.hasSuffix(" (deleted)") { path.removeLast(" (deleted)".count) }
    let fileID = program.uid == 0 ? nil : "\(program.dev):\(program.ino)"
    return AppIdentity(kind: .executable, id: path, fileID: fileID)
  }

  // MARK: Parsers (pure)

  /// The unit a process runs in, from /proc/PID/cgroup (the unified hierarchy's "0::/…" line).
  /// The path's last component that is not empty, split at its bytes as the kernel does (a
  /// cgroup path is bytes; a character-wise split cost 77,000 instructions a connection).
  static func unit(cgroup: String) -> String? {
    for line in cgroup.utf8.split(separator: UInt8(ascii: "\n")) where line.starts(with: "0::".utf8) {
      return line.split(separator: UInt8(ascii: "/")).last.map { String(Substring($0)) }
    }
    return nil
  }

  /// The app id of the Flatpak scope a process's cgroup names (see `flatpakAppID(unit:)`).
  static func flatpakAppID(cgroup: String) -> String? { unit(cgroup: cgroup).flatMap(flatpakAppID(unit:)) }

  /// `app-flatpak-org.example.App-123.scope` → `org.example.App`.
  static func flatpakAppID(unit: String) -> String? {
    guard unit.hasPrefix("app-flatpak-"), unit.hasSuffix(".scope") else {
      return nil
    }
    let body = unit.dropFirst("app-flatpak-".count).dropLast(".scope".count)
    guard let dash = body.lastIndex(of: "-"), body[body.index(after: dash)...].allSatisfy(\.isNumber) else {
      return nil
    }
    let id = String(body[..<dash])
    return isAppID(id) ? id : nil
  }

  /// The `name=` of the `[Application]` group of a `.flatpak-info` (a GKeyFile).
  static func flatpakAppID(info: String) -> String? {
    var group = ""
    for raw in info.split(separator: "\n") {
      let line = raw.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" || $0 == "\r" }
        .reversed().map(String.init).joined()
      if line.hasPrefix("[") && line.hasSuffix("]") {
        group = String(line.dropFirst().dropLast())
      } else if group == "Application", line.hasPrefix("name=") {
        let id = String(line.dropFirst("name=".count))
        return isAppID(id) ? id : nil
      }
    }
    return nil
  }

  /// `snap.firefox.firefox (enforce)` → `firefox.firefox`; any other label, or a profile in
  /// complain mode (which confines nothing), → nil.
  static func snapApp(label: String) -> String? {
    let parts = label.split(separator: " ")
    guard parts.count == 2, parts[1] == "(enforce)" else { return nil }
    let name = String(parts[0])
    guard name.hasPrefix("snap."), name.split(separator: ".").count >= 3 else { return nil }
    let app = String(name.dropFirst("snap.".count))
    return app.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-._".contains($0)) }) ? app : nil
  }

  /// The desktop-file id of an app's unit, as systemd's desktop-launch convention names it:
  /// `app-[<launcher>-]<id>-<random>.scope` or `app-[<launcher>-]<id>@<random>.service`
  /// (launchers: gnome, kde, flatpak, …). Escaped `\x2d` is a dash in the id.
  static func desktopID(cgroup: String) -> String? { unit(cgroup: cgroup).flatMap(desktopID(unit:)) }

  /// The desktop-file id of a unit named as `desktopID(cgroup:)` says.
  static func desktopID(unit: String) -> String? {
    guard unit.hasPrefix("app-") else { return nil }
    var body: Substring
    if unit.hasSuffix(".scope") {
      body = unit.dropFirst(4).dropLast(6)
      guard let dash = body.lastIndex(of: "-") else { return nil }
      body = body[..<dash]
    } else if unit.hasSuffix(".service") {
      body = unit.dropFirst(4).dropLast(8)
      if let at = body.firstIndex(of: "@") { body = body[..<at] }
    } else {
      return nil
    }
    // The launcher prefix, when there is one, has no dot; a desktop-file id usually has some.
    let parts = body.split(separator: "-", maxSplits: 1)
    if parts.count == 2, !parts[0].contains("."), parts[1].contains(".") { body = parts[1] }
    let id = body.split(separator: "\\x2d", omittingEmptySubsequences: false).joined(separator: "-")
    return id.isEmpty || !SafeText.isClean(id) || id.count > 255 ? nil : id
  }

  /// A D-Bus-style app id: dot-separated elements of letters, digits, `_` and `-`.
  static func isAppID(_ id: String) -> Bool {
    let elements = id.split(separator: ".", omittingEmptySubsequences: false)
    return id.count <= 255 && elements.count >= 2
      && elements.allSatisfy { e in
        !e.isEmpty && e.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_" || $0 == "-") }
      }
  }
}

/// A caller's process, pinned by a pidfd from its connection's first call on (the session bus) or
/// from its accept (tesserad's own socket). Each later call rechecks it (one poll(2) of the pidfd
/// and one stat): a process that ended leaves the connection
/// unidentified for good (whoever holds it now, a child or an heir, is not what connected, and
/// its pid may name another process), and one that exec'd another program is identified again,
/// as what it now runs. Used on the bus thread only.
public final class PinnedCaller: CallerProcess, @unchecked Sendable {
  private let pidfd: Int32
  private let pid: UInt32
  private let label: String?
  private var stamp: CallerIdentity.Program?
  private var gone = false
  public private(set) var app: AppIdentity?
  public var executable: String? { stamp?.path }

  init(pidfd: Int32, pid: UInt32, label: String?) {
    self.pidfd = pidfd
    self.pid = pid
    self.label = label
    stamp = CallerIdentity.program(proc: "/proc/\(pid)", path: true)
    app = CallerIdentity.identify(pidfd: pidfd, pid: pid, label: label, program: stamp)
    if CallerIdentity.hasEnded(pidfd) { gone = true }
  }

  deinit { close(pidfd) }

  public func recheck() -> Bool {
    if gone { return false }
    guard !CallerIdentity.hasEnded(pidfd) else {
      gone = true
      let changed = app != nil
      app = nil
      return changed
    }
    let now = CallerIdentity.program(proc: "/proc/\(pid)", path: false)
    if now?.dev == stamp?.dev && now?.ino == stamp?.ino { return false }
    stamp = CallerIdentity.program(proc: "/proc/\(pid)", path: true)
    let before = app
    app = CallerIdentity.identify(pidfd: pidfd, pid: pid, label: label, program: stamp)
    if CallerIdentity.hasEnded(pidfd) {
      gone = true
      app = nil
    }
    return app != before
  }
}
