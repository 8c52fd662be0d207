import CTesseraSystemShim
import Glibc
import SystemPackage
import TesseraCore
import TesseraInterface
import TesseraSystem

/// Opens URLs with the configured command, else `$BROWSER`, else `xdg-open`. The URL is appended as
/// the last argument (or replaces `%s` in the command). The child runs detached and is reaped.
///
/// Under systemd (INVOCATION_ID is set) the browser is started through `systemd-run --user` as a
/// unit of its own: otherwise it would inherit tessera.service's sandbox (seccomp filter, no W^X
/// memory, read-only home), which breaks browsers, and would die when the service stops. The unit
/// gets a description of its own, so its command line is not what the journal shows.
///
/// What is opened is the redirect listener's start URL: the authorization URL (with the sign-in's
/// state, nonce and PKCE challenge) never appears in a command line, which every user can read.
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
      environment["INVOCATION_ID"] != nil
      ? [
        "systemd-run", "--user", "--quiet", "--collect", "--description=Web browser for a Tessera sign-in", "--",
      ] : []
  }

  public func open(_ url: String) throws {
    var arguments = command.contains("%s") ? command.map { $0 == "%s" ? url : $0 } : command + [url]
    if arguments.isEmpty { arguments = ["xdg-open", url] }
    arguments = launcherPrefix + arguments
    var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    // The browser gets stdin, stdout and stderr only, none of the daemon's descriptors (sockets,
    // the bus connection): the child closes everything from 3 up before exec.
    var actions = posix_spawn_file_actions_t()
    try check(posix_spawn_file_actions_init(&actions), "posix_spawn_file_actions_init", arguments[0])
    defer { posix_spawn_file_actions_destroy(&actions) }
    try check(
      tessera_spawn_file_actions_addclosefrom(&actions, 3), "posix_spawn_file_actions_addclosefrom_np", arguments[0])
    // Nor the daemon's signal handling: tesserad ignores SIGHUP, SIGTERM and SIGINT to take them
    // from a signal source (reload, shutdown), and an ignored signal stays ignored across exec. A
    // browser started here gets every signal back at its default and an empty signal mask.
    var attributes = posix_spawnattr_t()
    try check(posix_spawnattr_init(&attributes), "posix_spawnattr_init", arguments[0])
    defer { posix_spawnattr_destroy(&attributes) }
    var defaults = sigset_t()
    sigemptyset(&defaults)
    for signal in [SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE, SIGUSR1, SIGUSR2, SIGCHLD, SIGALRM] {
      sigaddset(&defaults, signal)
    }
    var mask = sigset_t()
    sigemptyset(&mask)
    try check(posix_spawnattr_setsigdefault(&attributes, &defaults), "posix_spawnattr_setsigdefault", arguments[0])
    try check(posix_spawnattr_setsigmask(&attributes, &mask), "posix_spawnattr_setsigmask", arguments[0])
    try check(
      posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK)),
      "posix_spawnattr_setflags", arguments[0])
    var pid: pid_t = 0
    try check(posix_spawnp(&pid, argv[0]!, &actions, &attributes, &argv, environ), "posix_spawnp", arguments[0])
    let child = pid
    // Reaped on a thread of its own: a browser may run for hours.
    try? startThread(name: "tessera-reaper") {
      var status: Int32 = 0
      _ = try? Syscall.check("waitpid") { waitpid(child, &status, 0) }
    }
  }

  /// posix_spawn's functions return an error number instead of setting errno.
  private func check(_ result: Int32, _ call: String, _ program: String) throws {
    guard result != 0 else { return }
    throw TesseraError.configuration(
      "Could not start the browser '\(program)' (\(call): \(Errno(rawValue: result))). Set 'browser' in config.toml or $BROWSER."
    )
  }
}
