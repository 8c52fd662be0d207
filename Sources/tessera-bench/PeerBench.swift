import Foundation
import TesseraInterface
import TesseraTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// Tessera against the closest peer (issue 41): oidc-agent 4.2.6 from Debian, set up against the
/// same test IdP, answering a cached token with `oidc-token`; and `tessera --version` against a
/// floor: a Swift program linked as tessera is (the Swift runtime in, libsystemd loaded) that
/// prints one line, which scripts/bench builds.
extension Bench {
  struct PeerTimes {
    var tessera: Stats
    var oidcToken: Stats
    var version: Stats
    var floor: Stats?
    /// The agent's processes, per `oidc-token` (a new connection each): CPU (µs), system calls.
    var agentCPU: Double
    var agentSyscalls: Result<[(name: String, count: Double)], BenchError>
    /// The agent's PSS and its anonymous part (MB), its processes summed, holding its token.
    var agentPSS: (pss: Double, anonymous: Double)
    /// The instructions its processes execute per `oidc-token` (callgrind), or why not counted.
    var agentInstructions: Result<Double, BenchError>
  }

  /// measurePeer, or nil when the peer cannot be set up here (said in the log, the rows left out).
  func measurePeerOrSay(tessera: String, env: Environment) -> PeerTimes? {
    do { return try measurePeer(tessera: tessera, env: env) } catch {
      log("oidc-agent against tessera token: not measured: \(error)")
      return nil
    }
  }

  func measurePeer(tessera: String, env: Environment) throws -> PeerTimes {
    let agent = try OIDCAgent(env: env)
    defer { agent.stop() }
    var commands = [
      [tessera, "token", "--client-id", "tessera-test"], ["/usr/bin/oidc-token", OIDCAgent.account],
      [tessera, "--version"],
    ]
    if let swiftFloor { commands.append([swiftFloor]) }
    var times: [[Double]] = commands.map { _ in [] }
    for run in 0..<(cliRuns + 5) {
      let elapsed = try commands.map { try timeProcess($0) }
      if run >= 5 {  // the first runs warm the page cache
        for index in elapsed.indices { times[index].append(elapsed[index]) }
      }
    }
    let requests = env.idpRequests(since: agent.mark).filter { $0.grantType != nil }.count
    guard requests == 0 else {
      throw BenchError(
        "the IdP got \(requests) token request(s) during the cached rounds (oidc-agent's or tesserad's): the rows would not compare two caches"
      )
    }
    // What each request costs the agent (a new connection per `oidc-token`), as the new
    // connection rows measure tesserad.
    let agentProcesses = Processes.tree(agent.pid)
    let counted = smoke ? 5 : 100
    let cpuBefore = agentProcesses.map(CPUTime.wholeProcess).reduce(0, +)
    let oidcToken = ["/usr/bin/oidc-token", OIDCAgent.account]
    for _ in 0..<counted { _ = try timeProcess(oidcToken) }
    let agentCPU = (agentProcesses.map(CPUTime.wholeProcess).reduce(0, +) - cpuBefore) * 1e6 / Double(counted)
    let syscalls = reason {
      try Strace.count(agentProcesses, per: smoke ? 3 : 20) { _ = try timeProcess(oidcToken) }
    }
    let pss = Daemon.pssMB(of: agentProcesses)
    agent.stop()
    return PeerTimes(
      tessera: Stats(times[0]), oidcToken: Stats(times[1]), version: Stats(times[2]),
      floor: swiftFloor == nil ? nil : Stats(times[3]), agentCPU: agentCPU, agentSyscalls: syscalls,
      agentPSS: pss, agentInstructions: reason { try measureAgentInstructions(env: env) })
  }

  /// The instructions oidc-agent's processes execute per `oidc-token` answered from its cache.
  /// The agent it forks cannot be reached by callgrind_control, so two agents run whole under
  /// callgrind, set up alike, one answering `requests` more requests than the other: the
  /// difference of their totals (each process's, written as it ends) is what those requests cost.
  func measureAgentInstructions(env: Environment) throws -> Double {
    guard access(Callgrind.valgrind, X_OK) == 0 else { throw BenchError("valgrind is not installed") }
    let oidcToken = ["/usr/bin/oidc-token", OIDCAgent.account]
    let requests = smoke ? 3 : 50
    var totals: [Double] = []
    for (index, count) in [0, requests].enumerated() {
      let directory = env.sessionDir + "/callgrind-agent-\(index)"
      try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
      let agent = try OIDCAgent(
        env: env, directoryName: "oidc-agent-callgrind-\(index)",
        wrapper: Callgrind.wrapper(outFile: directory + "/agent.%p", preload: nil))
      let processes = Processes.tree(agent.pid)
      do {
        defer { agent.stop() }
        for _ in 0..<(3 + count) { _ = try timeProcess(oidcToken) }
      }
      // Each process writes its totals as it ends (the forked one after its parent).
      let deadline = monotonic() + 60
      var total = 0.0
      for pid in processes {
        while true {
          if let value = try? Callgrind.totals(in: directory + "/agent.\(pid)") {
            total += Double(value)
            break
          }
          guard monotonic() < deadline else { throw BenchError("oidc-agent \(pid) wrote no counts within 60 s") }
          usleep(10_000)
        }
      }
      totals.append(total)
    }
    return (totals[1] - totals[0]) / Double(requests)
  }
}

/// oidc-agent with one account, `bench`, made by its password flow (no browser) with the test
/// IdP's confidential client `tessera-oidc-agent`; its configuration in the session's directory.
/// `OIDC_SOCK` is set in this process, so that the `oidc-token` it spawns finds the agent.
final class OIDCAgent {
  static let account = "bench"
  private(set) var pid: pid_t = 0
  private var stopped = false
  /// The IdP's log line count once the agent has its token: it must ask nothing after.
  private(set) var mark = 0

  /// `wrapper` is a program the agent runs under (valgrind); `directoryName` its folder in the
  /// session's directory (each agent needs its own).
  init(env: Environment, directoryName: String = "oidc-agent", wrapper: [String] = []) throws {
    guard access("/usr/bin/oidc-agent", X_OK) == 0 else {
      throw BenchError("oidc-agent is not installed (apt-get install oidc-agent-cli; scripts/bench does)")
    }
    let directory = env.sessionDir + "/" + directoryName
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    setenv("OIDC_CONFIG_DIR", directory, 1)
    setenv("OIDC_ENCRYPTION_PW", "bench-password", 1)
    // The agent in the foreground, a child of ours, on a socket we name (started the usual way, it
    // forks a daemon that prints where it listens only after its parent has gone).
    let socket = directory + "/agent.sock"
    setenv("OIDC_SOCK", socket, 1)
    pid = try Child.spawn(
      wrapper + ["/usr/bin/oidc-agent", "--console", "--no-autoload", "--socket-path=\(socket)"],
      output: directory + "/agent.log"
    )
    var started = false
    defer { if !started { stop() } }
    let deadline = Date().addingTimeInterval(30)  // a bound against a hang only
    while !SoftwareTPM.accepts(socket) {
      var status: Int32 = 0
      guard waitpid(pid, &status, WNOHANG) == 0, Date() < deadline else {
        throw BenchError("oidc-agent did not start; see \(directory)/agent.log")
      }
      usleep(10_000)
    }
    let ca = ProcessInfo.processInfo.environment["TESSERA_IDP_CA"] ?? ""
    _ = try Child.run([
      "/usr/bin/oidc-gen", Self.account, "--iss=\(env.authority)/", "--client-id=tessera-oidc-agent",
      "--client-secret=agent-secret-1", "--flow=password", "--op-username=alice", "--op-password=alice-pw",
      "--scope=openid profile offline_access read", "--cp=\(ca)", "--pw-env=OIDC_ENCRYPTION_PW",
      "--confirm-default", "--redirect-uri=http://localhost:4242",
    ])
    _ = try Child.run(["/usr/bin/oidc-token", Self.account])  // its first token, from the IdP
    mark = env.idpLogLines()
    started = true
  }

  func stop() {
    guard !stopped else { return }
    stopped = true
    if pid > 0 {
      kill(pid, SIGTERM)
      var status: Int32 = 0
      while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    }
    unsetenv("OIDC_SOCK")
  }
}
