import Foundation
import Testing

@testable import TesseraCLI

/// What `tessera forward HOST …` runs (issue 24): ssh with the socket forwarded, the user's ssh
/// options after HOST, and a remote command that hands the shell TESSERA_SOCKET; the words of a
/// command survive the remote shell as they were typed. The remote command runs here through a
/// real /bin/sh, as sshd runs it there.
@Suite struct ForwardPlanTests {
  @Test func theArgumentsSplitIntoHostSshOptionsAndCommand() throws {
    let plan = try ForwardPlan(["me@build01:22", "-F", "cfg", "-p", "2222", "--", "git", "pull", "--rebase"])
    #expect(plan.host == "me@build01:22")
    #expect(plan.sshOptions == ["-F", "cfg", "-p", "2222"])
    #expect(plan.command == ["git", "pull", "--rebase"])
    #expect(ForwardPlan.defaultName(for: plan.host) == "build01")
    #expect(ForwardPlan.defaultName(for: "build-01.example.com") == "build-01.example.com")
    #expect(ForwardPlan.defaultName(for: "@@@") == nil)
    let login = try ForwardPlan(["build01"])
    #expect(login.command.isEmpty && login.sshOptions.isEmpty)
  }

  @Test func optionsThatWouldOutliveTheForwardAreRefused() throws {
    for refused in [["-f"], ["-N"], ["-fN"], ["-W", "h:22"], ["-O", "exit"], ["-vf"]] {
      #expect(throws: (any Error).self, "\(refused)") { try ForwardPlan(["host"] + refused) }
    }
    // A value that merely contains those letters is fine: -F's file, -o's option, -i's key.
    _ = try ForwardPlan(["host", "-F", "/tmp/cfg-fN", "-oForwardAgent=no", "-i", "/k/idN", "-p22", "-v"])
    #expect(throws: (any Error).self) { try ForwardPlan(["-p", "22", "host"]) }
  }

  @Test func sshGetsTessera_sOptionsFirstAndATerminalOnlyForALoginShell() throws {
    let plan = try ForwardPlan(["build01", "-F", "cfg"])
    let argv = plan.sshArguments(program: "ssh", local: "/run/l", remote: "/tmp/r.sock", terminal: true)
    #expect(
      Array(argv.prefix(11)) == [
        "ssh", "-o", "ExitOnForwardFailure=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none", "-o",
        "StreamLocalBindUnlink=yes", "-R", "/tmp/r.sock:/run/l",
      ])
    #expect(Array(argv[11...13]) == ["-t", "build01", "-F"])
    let command = try ForwardPlan(["build01", "--", "true"])
    #expect(!command.sshArguments(program: "ssh", local: "l", remote: "r", terminal: true).contains("-t"))
    #expect(ForwardPlan.randomRemoteSocket().wholeMatch(of: /\/tmp\/tessera-fwd-[0-9a-f]{16}\.sock/) != nil)
    #expect(ForwardPlan.randomRemoteSocket() != ForwardPlan.randomRemoteSocket())
  }

  /// Runs the remote command as sshd would: the user's shell given it as one string. Its output
  /// goes to a file and its own pid is waited for (not Foundation's Process, whose waiting other
  /// tests' children can disturb).
  func runRemotely(_ plan: ForwardPlan, socket: String) throws -> (output: String, status: Int32) {
    let output = socket + ".out"
    defer { unlink(output) }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    let argv = ["/bin/sh", "-c", plan.remoteCommand(socket: socket)]
    var cArguments: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
    defer { cArguments.forEach { free($0) } }
    var pid: pid_t = 0
    guard posix_spawn(&pid, argv[0], &actions, nil, &cArguments, environ) == 0 else {
      throw CocoaError(.executableLoad)
    }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    let data = try Data(contentsOf: URL(fileURLWithPath: output))
    return (String(decoding: data, as: UTF8.self), ForwardPlan.exitStatus(status))
  }

  @Test func theRemoteCommandGetsTheSocketItsWordsAsTypedAndItsStatusBack() throws {
    let socket = NSTemporaryDirectory() + "tessera-fwd-test-\(getpid()).sock"
    FileManager.default.createFile(atPath: socket, contents: Data())
    let plan = try ForwardPlan([
      "host", "--", "sh", "-c", "printf '%s|' \"$TESSERA_SOCKET\" \"$@\"; exit 7", "sh", "it's $HOME", "a  b", "`id`",
    ])
    let (output, status) = try runRemotely(plan, socket: socket)
    #expect(output == "\(socket)|it's $HOME|a  b|`id`|")
    #expect(status == 7, "the command's status comes back")
    #expect(!FileManager.default.fileExists(atPath: socket), "the socket ssh leaves behind is removed")
  }
}
