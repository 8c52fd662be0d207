import Dispatch
import Glibc
import TesseraCore

/// Opens URLs with the configured command, else `$BROWSER`, else `xdg-open`. The URL is appended as
/// the last argument (or replaces `%s` in the command). The child runs detached and is reaped.
public struct CommandBrowserLauncher: BrowserLauncher {
  public let command: [String]

  public init(configured: String?, environment: [String: String]) {
    let chosen =
      configured
      ?? environment["BROWSER"].flatMap { $0.split(separator: ":").first.map(String.init) }
      ?? "xdg-open"
    command = chosen.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
  }

  public func open(_ url: String) throws {
    var arguments = command.contains("%s") ? command.map { $0 == "%s" ? url : $0 } : command + [url]
    if arguments.isEmpty { arguments = ["xdg-open", url] }
    var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    var pid: pid_t = 0
    let r = posix_spawnp(&pid, argv[0]!, nil, nil, &argv, environ)
    guard r == 0 else {
      throw TesseraError.internal(
        "Could not start the browser '\(arguments[0])' (\(String(cString: strerror(r)))). Set 'browser' in config.toml or $BROWSER.")
    }
    let child = pid
    DispatchQueue.global().async {
      var status: Int32 = 0
      while waitpid(child, &status, 0) < 0 && errno == EINTR {}
    }
  }
}
