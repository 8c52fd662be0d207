import Glibc
import TesseraCore

/// Opens URLs with the configured command, else `$BROWSER`, else `xdg-open`. The URL is appended as
/// the last argument (or replaces `%s` in the command). The child runs detached and is reaped.
///
/// Under systemd (INVOCATION_ID is set) the browser is started through `systemd-run --user` as a
/// unit of its own: otherwise it would inherit tessera.service's sandbox (seccomp filter, no W^X
/// memory, read-only home), which breaks browsers, and would die when the service stops.
public struct CommandBrowserLauncher: BrowserLauncher {
  public let command: [String]
  /// Prefix that hands the browser to the user's service manager, when running under systemd.
  public let launcherPrefix: [String]

  public init(configured: String?, environment: [String: String]) {
    let chosen =
      configured
      ?? environment["BROWSER"].flatMap { $0.split(separator: ":").first.map(String.init) }
      ?? "xdg-open"
    command = chosen.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
    launcherPrefix =
      environment["INVOCATION_ID"] != nil ? ["systemd-run", "--user", "--quiet", "--collect", "--"] : []
  }

  /// The browser gets stdin, stdout and stderr only, none of the daemon's sockets: every other
  /// descriptor is marked close-on-exec (the daemon itself never relies on inheriting any).
  static func closeOnExec() {
    guard let directory = opendir("/proc/self/fd") else { return }
    defer { closedir(directory) }
    let own = dirfd(directory)
    while let entry = readdir(directory) {
      let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
      if let fd = Int32(name), fd > 2, fd != own { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
    }
  }

  public func open(_ url: String) throws {
    var arguments = command.contains("%s") ? command.map { $0 == "%s" ? url : $0 } : command + [url]
    if arguments.isEmpty { arguments = ["xdg-open", url] }
    arguments = launcherPrefix + arguments
    var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    Self.closeOnExec()
    var pid: pid_t = 0
    let r = posix_spawnp(&pid, argv[0]!, nil, nil, &argv, environ)
    guard r == 0 else {
      throw TesseraError.internal(
        "Could not start the browser '\(arguments[0])' (\(String(cString: strerror(r)))). Set 'browser' in config.toml or $BROWSER."
      )
    }
    let child = pid
    // Reaped on a thread of its own: a browser may run for hours.
    startThread(name: "tessera-reaper") {
      var status: Int32 = 0
      while waitpid(child, &status, 0) < 0 && errno == EINTR {}
    }
  }
}
