import ArgumentParser
import TesseraClient
import TesseraInterface
import TesseraSystem

#if canImport(Glibc)
  import Glibc
#endif

extension Tessera {
  struct Forward: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "forward",
      abstract: "Lend this machine's sign-in to a remote host over ssh, or to a container.",
      discussion: """
        tessera forward HOST runs ssh to HOST with tesserad's socket forwarded (ssh -R): on \
        HOST, the same `tessera` program (no tesserad there) gets tokens through it: `tessera \
        token`, git's credential helper and kubectl's exec plugin work unchanged. The remote \
        shell finds the socket in TESSERA_SOCKET (a 0600 socket in /tmp, removed when the \
        session ends). Refresh tokens never leave this machine: only access tokens and id \
        tokens cross.

        Everything that comes through the forward is one app to tesserad, `forward:NAME@HOST` \
        (NAME is --name, else HOST), whatever program on HOST asks; the same name forwarded \
        to another host is another app, with grants of its own. access_mode applies to it \
        like to any app: in confirm mode you are asked here the first time ("build01 \
        (forwarded over ssh to build01.example.com) wants …"), in strict mode it is refused \
        until `tessera access grant --app forward:NAME@HOST …`. Whatever the mode, it may only get \
        tokens: it cannot sign in (do that here), sign out, list accounts it has no grant \
        for, change grants or read the access log.

        The forward lasts as long as ssh: when ssh ends, its listener here and its socket go \
        too. ssh options go after HOST; a command to run on HOST goes after `--`. -f, -N, -O \
        and -W are refused (they would outlive or bypass the forward); a running ControlMaster \
        is not used.

        Anything that runs as you on HOST, and HOST's administrator, can get tokens through a \
        live forward: forward to hosts you would type a password into, and prefer strict or \
        confirm mode.

        Containers: `tessera forward --socket PATH --name NAME` makes a lasting listener at \
        PATH to mount into a container (docker/podman -v PATH:/run/tessera.sock, with \
        TESSERA_SOCKET=/run/tessera.sock inside). The container must run as your own user: \
        tesserad closes any other user's connection.

        Examples:
          tessera forward build01
          tessera forward --name ci build01.example.com -p 2222 -- git pull
          tessera forward --socket ~/.local/share/devbox/tessera.sock --name devbox
          tessera forward --list
          tessera forward --stop devbox
        """)

    @Option(
      name: .long,
      help: ArgumentHelp(
        "The forward's name, and the app name its callers get (default: HOST without user@ and port).",
        valueName: "name"))
    var name: String?

    @Option(
      name: .long,
      help: ArgumentHelp(
        "Where the socket goes on HOST (default: /tmp/tessera-fwd-RANDOM.sock; its directory must exist).",
        valueName: "path"))
    var remoteSocket: String?

    @Option(
      name: .long,
      help: ArgumentHelp(
        "Make a lasting listener at this path (for a container) instead of running ssh; needs --name.",
        valueName: "path"))
    var socket: String?

    @Flag(name: .long, help: "List the live forwards.")
    var list = false

    @Option(name: .long, help: ArgumentHelp("End a forward (its ssh ends too).", valueName: "name"))
    var stop: String?

    @OptionGroup var output: Output

    @Argument(
      parsing: .captureForPassthrough,
      help: ArgumentHelp(
        "HOST, then ssh options, then `--` and a command to run on HOST.", valueName: "host [ssh options] [-- command]")
    )
    var rest: [String] = []

    func validate() throws {
      let modes = [socket != nil, list, stop != nil, !rest.isEmpty].filter { $0 }.count
      guard modes == 1 else {
        throw ValidationError(
          modes == 0
            ? "Name a HOST to forward to (or use --socket, --list or --stop). See `tessera forward --help`."
            : "Give one of HOST, --socket, --list or --stop.")
      }
      if let name, !AppIdentity.isForwardName(name) {
        throw ValidationError(
          "--name takes 1 to 64 of A-Z a-z 0-9 . _ - (not starting with '.'), not '\(SafeText.clip(name, limit: 64))'.")
      }
      if socket != nil && name == nil {
        throw ValidationError("--socket needs --name: the name the container's callers are known by.")
      }
      if let socket, !socket.hasPrefix("/") {
        throw ValidationError("--socket takes an absolute path, not '\(SafeText.clip(socket, limit: 200))'.")
      }
      if let remoteSocket, !remoteSocket.hasPrefix("/") || remoteSocket.contains("'") {
        throw ValidationError("--remote-socket takes an absolute path without quotes.")
      }
      if !rest.isEmpty {
        let plan = try ForwardPlan(rest)
        if name == nil, ForwardPlan.defaultName(for: plan.host) == nil {
          throw ValidationError(
            "Cannot make a forward name from '\(SafeText.clip(plan.host, limit: 64))': pass --name.")
        }
      }
    }

    func run() throws {
      if list { return try listForwards() }
      if let stop {
        try withBroker { broker throws(TesseraClientError) in try broker.removeForward(name: stop) }
        return printError("Ended forward \(stop).")
      }
      if let socket, let name {
        let path = try withBroker { broker throws(TesseraClientError) in
          let path = try broker.addForward(name: name, host: "", path: socket, lasting: true)
          // tesserad may see another /tmp than this command (PrivateTmp in tessera.service).
          var st = stat()
          guard lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFSOCK else {
            try? broker.removeForward(name: name)
            throw .broker(
              .invalidArgument(
                "tesserad made \(path) where this command cannot see it (tessera.service gives tesserad a /tmp of its own). Put the socket below $XDG_RUNTIME_DIR/tessera instead."
              ))
          }
          return path
        }
        print(path)
        printError(
          "Forward \(name) listens on \(path) until `tessera forward --stop \(name)`. Its callers are the app forward:\(name)."
        )
        return
      }
      try runSSH(try ForwardPlan(rest))
    }

    private func listForwards() throws {
      let forwards = try withBroker { broker throws(TesseraClientError) in try broker.forwards() }
      if output.json { return printJSON(forwards) }
      if forwards.isEmpty { return printError("No forwards. Start one with `tessera forward HOST`.") }
      var table = Table("NAME", "TO", "CONNECTIONS", "SINCE", "UNTIL", "SOCKET")
      for forward in forwards {
        table.add(
          forward.name, forward.host.isEmpty ? "(socket)" : forward.host, String(forward.connections),
          rfc3339(forward.since),
          forward.lasting ? "--stop" : "its ssh ends (pid \(forward.ownerPID.map(String.init) ?? "?"))",
          forward.path)
      }
      table.print()
    }

    /// Makes the forward, runs ssh with it, and ends with ssh's status.
    private func runSSH(_ plan: ForwardPlan) throws -> Never {
      let forwardName = name ?? ForwardPlan.defaultName(for: plan.host) ?? "forward"
      let broker: TesseraBroker
      let local: String
      do {
        broker = try connectBroker()
        local = try broker.addForward(name: forwardName, host: plan.host, lasting: false)
      } catch {
        fail(error)
      }
      let remote = remoteSocket ?? ForwardPlan.randomRemoteSocket()
      let argv = plan.sshArguments(
        program: ForwardPlan.sshProgram(), local: local, remote: remote, terminal: isatty(0) == 1)
      let pid: pid_t
      do { pid = try ForwardPlan.spawn(argv) } catch {
        printError("tessera: could not run \(argv[0]): \(error). Install OpenSSH's client, or set TESSERA_SSH.")
        Glibc.exit(ClientExitStatus.failure.rawValue)
      }
      // ssh has the terminal's signals; this process waits for it. Asked to end (SIGTERM, a
      // closed terminal's SIGHUP), it passes that on to ssh and ends with it.
      signal(SIGINT, SIG_IGN)
      signal(SIGQUIT, SIG_IGN)
      forwardedSSH = pid
      signal(SIGTERM) { number in _ = kill(forwardedSSH, number) }
      signal(SIGHUP) { number in _ = kill(forwardedSSH, number) }
      var status: Int32 = 0
      var exited = false
      let ended: String?
      do {
        ended = try broker.waitForForwardEnd(forwardName) {
          if waitpid(pid, &status, WNOHANG) == pid { exited = true }
          return exited
        }
      } catch {
        ended = "\(error)"
      }
      if let ended, !exited {
        printError("tessera: forward \(forwardName) ended: \(ended). Ending ssh.")
        kill(pid, SIGTERM)
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
      }
      Glibc.exit(ForwardPlan.exitStatus(status))
    }
  }
}

/// The ssh a `tessera forward` runs, for its signal handlers (set once, before they are).
nonisolated(unsafe) private var forwardedSSH: pid_t = 0

/// What `tessera forward HOST …` runs: ssh, with the socket forwarded and a wrapper that gives the
/// remote shell TESSERA_SOCKET. Pure, so its arguments are unit-tested.
struct ForwardPlan: Equatable {
  var host: String
  /// ssh's own options, after HOST.
  var sshOptions: [String]
  /// The command to run on HOST (after `--`); empty: a login shell.
  var command: [String]

  /// ssh options that would outlive the forward (-f, -N with a background ssh), or go around it.
  static let refusedOptions: Set<Character> = ["f", "N", "O", "W"]

  init(_ arguments: [String]) throws {
    guard let first = arguments.first, !first.hasPrefix("-") else {
      throw ValidationError("Name the HOST first, then ssh options: tessera forward HOST [ssh options] [-- command].")
    }
    host = first
    let rest = arguments.dropFirst()
    let end = rest.firstIndex(of: "--") ?? rest.endIndex
    sshOptions = Array(rest[..<end])
    command = end < rest.endIndex ? Array(rest[rest.index(after: end)...]) : []
    for option in sshOptions where option.hasPrefix("-") && !option.hasPrefix("--") && option.count >= 2 {
      // A cluster of flags (-fN) counts letter by letter, up to one that takes a value.
      for letter in option.dropFirst() {
        if Self.refusedOptions.contains(letter) {
          throw ValidationError(
            "ssh's -\(letter) is refused: `tessera forward` runs ssh in the foreground for as long as the forward lives. Run the command after `--` instead."
          )
        }
        if "bcDEeFIiJLlmOopQRSWw".contains(letter) { break }
      }
    }
  }

  /// HOST without `user@` and `:port`, reduced to the letters a forward's name may hold.
  static func defaultName(for host: String) -> String? {
    var name = Substring(host)
    if let at = name.lastIndex(of: "@") { name = name[name.index(after: at)...] }
    if let colon = name.firstIndex(of: ":") { name = name[..<colon] }
    let kept = String(name.filter { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "." || $0 == "_" || $0 == "-") })
    let trimmed = String(kept.drop { $0 == "." }.prefix(64))
    return AppIdentity.isForwardName(trimmed) ? trimmed : nil
  }

  /// `$TESSERA_SSH`, else ssh.
  static func sshProgram() -> String {
    if let named = getenv("TESSERA_SSH"), named.pointee != 0 { return String(cString: named) }
    return "ssh"
  }

  /// A fresh path in the remote /tmp: a stale socket of an earlier forward is never in the way
  /// (sshd's StreamLocalBindUnlink is off by default).
  static func randomRemoteSocket() -> String {
    var generator = SystemRandomNumberGenerator()
    let hex = (0..<8).map { _ in
      let byte = UInt8.random(in: 0...255, using: &generator)
      return String(byte, radix: 16).count == 1 ? "0" + String(byte, radix: 16) : String(byte, radix: 16)
    }.joined()
    return "/tmp/tessera-fwd-\(hex).sock"
  }

  /// Quotes a word for the remote user's shell (POSIX sh, bash, zsh, fish alike).
  static func quote(_ word: String) -> String {
    "'" + word.replacing("'", with: "'\\''") + "'"
  }

  /// The remote command: a shell that sets TESSERA_SOCKET, runs the command (or a login shell),
  /// removes the socket (ssh leaves it) and exits with the command's status.
  func remoteCommand(socket: String) -> String {
    let script =
      command.isEmpty
      ? "TESSERA_SOCKET=\"$1\"; export TESSERA_SOCKET; \"${SHELL:-/bin/sh}\" -l; s=$?; rm -f \"$1\"; exit $s"
      : "TESSERA_SOCKET=\"$1\"; export TESSERA_SOCKET; shift; \"$@\"; s=$?; rm -f \"$TESSERA_SOCKET\"; exit $s"
    return
      (["exec", "/bin/sh", "-c", Self.quote(script), "tessera-forward", Self.quote(socket)]
      + command.map(Self.quote)).joined(separator: " ")
  }

  /// ssh's whole command line. Tessera's own options come before HOST (ssh takes the first value
  /// of an option), the user's after it.
  func sshArguments(program: String, local: String, remote: String, terminal: Bool) -> [String] {
    [
      program, "-o", "ExitOnForwardFailure=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none", "-o",
      "StreamLocalBindUnlink=yes", "-R", "\(remote):\(local)",
    ] + (terminal && command.isEmpty ? ["-t"] : []) + [host] + sshOptions + [remoteCommand(socket: remote)]
  }

  /// Starts `argv` (searched in PATH) with this process's terminal and environment.
  static func spawn(_ argv: [String]) throws -> pid_t {
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var defaults = sigset_t()
    sigemptyset(&defaults)
    sigaddset(&defaults, SIGINT)
    sigaddset(&defaults, SIGQUIT)
    posix_spawnattr_setsigdefault(&attributes, &defaults)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF))
    var cArguments: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
    defer { cArguments.forEach { free($0) } }
    var pid: pid_t = 0
    let r = posix_spawnp(&pid, argv[0], nil, &attributes, &cArguments, environ)
    guard r == 0 else { throw SpawnError(code: r) }
    return pid
  }

  struct SpawnError: Error, CustomStringConvertible {
    let code: Int32
    var description: String { String(cString: strerror(code)) }
  }

  /// A shell's exit status for a wait status: the code, or 128 + the signal that ended it.
  static func exitStatus(_ status: Int32) -> Int32 {
    let signal = status & 0x7f
    return signal == 0 ? (status >> 8) & 0xff : 128 + signal
  }
}
