import ArgumentParser
import Foundation
import TesseraBus
import TesseraCore
import TesseraInterface
import TesseraPlatform
import TesseraSystem

#if canImport(Glibc)
  import Glibc
#endif

// Over 450 lines on purpose: everything the benchmark needs from its session (processes, the
// test IdP, D-Bus calls through libsystemd, statistics and the report) in one place, apart from
// the measurements themselves (Bench.swift). Not shipped.

/// What the test session provides (scripts/test-session, scripts/idp).
struct Environment {
  let sessionDir: String
  let idpLog: String
  let authority: String
  let idpPython: String
  let repo: String
  let activationAvailable: Bool

  init() throws {
    let env = ProcessInfo.processInfo.environment
    func need(_ key: String) throws -> String {
      guard let value = env[key], !value.isEmpty else {
        throw BenchError("$\(key) is not set: run the benchmark through scripts/bench (it sets up the session).")
      }
      return value
    }
    sessionDir = try need("TESSERA_SESSION_DIR")
    idpLog = try need("TESSERA_IDP_LOG")
    authority = try need("TESSERA_IDP_AUTHORITY")
    idpPython = try need("TESSERA_IDP_PYTHON")
    repo = try need("TESSERA_REPO")
    activationAvailable = env["TESSERA_BENCH_ACTIVATION"] == "1"
  }

  var idpEnvironment: String { (try? Authority(parsing: authority))?.environment ?? "" }

  struct IdPRequest: Decodable {
    let path: String
    let grant_type: String?
    var grantType: String? { grant_type }
  }

  func idpLogLines() -> Int {
    ((try? String(contentsOfFile: idpLog, encoding: .utf8)) ?? "").split(separator: "\n").count
  }

  func idpRequests(since mark: Int) -> [IdPRequest] {
    let lines = ((try? String(contentsOfFile: idpLog, encoding: .utf8)) ?? "").split(separator: "\n").dropFirst(mark)
    return lines.compactMap { try? JSONDecoder().decode(IdPRequest.self, from: Data($0.utf8)) }
  }

  /// Plays the user on another device: approves a device code at the test IdP.
  func approveDeviceCode(_ userCode: String) throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: idpPython)
    process.arguments = [repo + "/Tests/idp/approve_device.py", userCode, "--user", "alice"]
    process.standardOutput = FileHandle.nullDevice
    try process.run()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else {
      throw BenchError("approve_device.py failed (\(process.terminationStatus))")
    }
  }
}

/// The tesserad under test: started by exec, or adopted after D-Bus activation started it.
final class Daemon: @unchecked Sendable {
  let binary: String
  let log: String
  private(set) var pid: pid_t = 0
  /// More arguments for tesserad (e.g. --config for another access mode).
  var arguments: [String] = []
  /// A program tesserad runs under, with its arguments (valgrind, for the instruction counts).
  var wrapper: [String] = []
  /// How long to wait for its bus names (longer under a wrapper that slows it).
  var startTimeout = 10.0

  init(binary: String, log: String) {
    self.binary = binary
    self.log = log
  }

  /// Starts it and waits for its bus name.
  func start() throws {
    try launch()
    let client = try BusClient()
    let deadline = monotonic() + startTimeout
    // Both fronts: the Microsoft name is taken just after the native one.
    for name in [BrokerInterface.busName, MicrosoftBrokerInterface.busName] {
      while !(try client.nameHasOwner(name)) {
        var status: Int32 = 0
        if waitpid(pid, &status, WNOHANG) == pid {
          pid = 0
          throw BenchError("tesserad exited (wait status \(status)) before taking \(name); see \(log)")
        }
        guard monotonic() < deadline else {
          kill(pid, SIGKILL)
          while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
          pid = 0
          throw BenchError("tesserad did not take \(name) within \(Int(startTimeout)) s; see \(log)")
        }
        usleep(1000)
      }
    }
  }

  /// Execs it; returns at once.
  func launch() throws {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0o600)
    posix_spawn_file_actions_adddup2(&actions, 1, 2)
    var argv: [UnsafeMutablePointer<CChar>?] =
      (wrapper + [binary, "--log-level", "notice"] + arguments).map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    let program = wrapper.first ?? binary
    let r = posix_spawn(&pid, program, &actions, nil, &argv, environ)
    guard r == 0 else { throw BenchError("cannot start \(binary): \(String(cString: strerror(r)))") }
  }

  /// After D-Bus activation started it: find its pid through the bus.
  func adoptActivated() {
    guard let client = try? BusClient(),
      case .uint32(let owner)? = try? client.call(
        destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
        member: "GetConnectionUnixProcessID", arguments: [.string(BrokerInterface.busName)]
      ).first
    else { return }
    pid = pid_t(owner)
  }

  func stop() {
    guard pid > 0 else { return }
    kill(pid, SIGTERM)
    var status: Int32 = 0
    // Ours: reap it. Activated by the bus: wait until the process is gone.
    if waitpid(pid, &status, 0) < 0 {
      while kill(pid, 0) == 0, !isZombie(pid) { usleep(1000) }
    }
    pid = 0
    if let client = try? BusClient() {
      while (try? client.nameHasOwner(BrokerInterface.busName)) == true { usleep(1000) }
    }
  }

  private func isZombie(_ pid: pid_t) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
      let close = stat.range(of: ") ", options: .backwards)
    else { return true }
    return stat[close.upperBound...].hasPrefix("Z")
  }

  /// Anonymous (heap and stacks) part of the resident set, from /proc/PID/smaps_rollup.
  func anonymousMiB() -> Double {
    guard let rollup = try? String(contentsOfFile: "/proc/\(pid)/smaps_rollup", encoding: .utf8),
      let line = rollup.split(separator: "\n").first(where: { $0.hasPrefix("Anonymous:") }),
      let kib = Double(line.split(separator: " ").dropFirst().first ?? "")
    else { return .nan }
    return kib / 1024
  }

  /// Proportional set size (shared pages divided among the processes mapping them) and its
  /// anonymous part, in MB (10^6 bytes), from /proc/PID/smaps_rollup.
  func pssMB() -> (pss: Double, anonymous: Double) { Self.pssMB(of: [pid]) }

  /// The same for processes `pids`, summed.
  static func pssMB(of pids: [pid_t]) -> (pss: Double, anonymous: Double) {
    pids.map(pssMB(of:)).reduce((0, 0)) { ($0.0 + $1.0, $0.1 + $1.1) }
  }

  private static func pssMB(of pid: pid_t) -> (pss: Double, anonymous: Double) {
    guard let rollup = try? String(contentsOfFile: "/proc/\(pid)/smaps_rollup", encoding: .utf8) else {
      return (.nan, .nan)
    }
    func field(_ name: String) -> Double {
      guard let line = rollup.split(separator: "\n").first(where: { $0.hasPrefix(name + ":") }),
        let kib = Double(line.split(separator: " ").dropFirst().first ?? "")
      else { return .nan }
      return kib * 1024 / 1e6
    }
    return (field("Pss"), field("Pss_Anon"))
  }

  /// Resident set size, from /proc.
  func rssMiB() -> Double { Self.rssMiB(of: pid) }

  static func rssMiB(of pid: pid_t) -> Double {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
      let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
      let kib = Double(line.split(separator: " ").dropFirst().first ?? "")
    else { return .nan }
    return kib / 1024
  }
}

extension BusClient {
  func nameHasOwner(_ name: String) throws -> Bool {
    let reply = try call(
      destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
      member: "NameHasOwner", arguments: [.string(name)])
    return reply.first == .bool(true)
  }
}

/// The calls the benchmark makes.
struct BrokerCall: Sendable {
  var destination = BrokerInterface.busName
  var path = BrokerInterface.objectPath
  var interface = BrokerInterface.interfaceName
  var member: String
  var arguments: [BusValue]

  /// The floor: the bus daemon's own cheapest method, on the same connection.
  static let floor = BrokerCall(
    destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
    member: "GetId", arguments: [])

  /// The limit for any service on the bus: `org.freedesktop.DBus.Peer.Ping` answered by sd-bus on
  /// tesserad's own connection. Like a broker call it crosses the bus daemon twice (four message
  /// transfers), but tesserad does no work for it.
  static let ping = BrokerCall(interface: "org.freedesktop.DBus.Peer", member: "Ping", arguments: [])

  /// Microsoft's protocol: acquireTokenSilently as MSAL sends it, for the signed-in account.
  static func microsoftSilent(_ client: BusClient, clientID: String) throws -> BrokerCall {
    func call(_ member: String, _ request: Any) throws -> [String: Any] {
      let text = String(decoding: try JSONSerialization.data(withJSONObject: request), as: UTF8.self)
      let reply = try client.call(
        destination: MicrosoftBrokerInterface.busName, path: MicrosoftBrokerInterface.objectPath,
        interface: MicrosoftBrokerInterface.interfaceName, member: member,
        arguments: [.string("0.0"), .string(""), .string(text)])
      guard let answer = reply.first?.stringValue,
        let object = try JSONSerialization.jsonObject(with: Data(answer.utf8)) as? [String: Any]
      else { throw BenchError("\(member) gave no JSON object") }
      return object
    }
    guard let account = (try call("getAccounts", ["clientId": clientID])["accounts"] as? [[String: Any]])?.first
    else { throw BenchError("the Microsoft front lists no account for \(clientID)") }
    let request: [String: Any] = [
      "authParameters": [
        "account": account, "authority": NSNull(), "authorizationType": 1, "clientId": clientID,
        "requestedScopes": ["read"], "redirectUri": "http://localhost", "decodedClaims": "", "popParams": NSNull(),
      ]
    ]
    let text = String(decoding: try JSONSerialization.data(withJSONObject: request), as: UTF8.self)
    let check = try call("acquireTokenSilently", request)
    guard (check["brokerTokenResponse"] as? [String: Any])?["accessToken"] != nil else {
      throw BenchError("acquireTokenSilently through the Microsoft front failed: \(check)")
    }
    return BrokerCall(
      destination: MicrosoftBrokerInterface.busName, path: MicrosoftBrokerInterface.objectPath,
      interface: MicrosoftBrokerInterface.interfaceName, member: "acquireTokenSilently",
      arguments: [.string("0.0"), .string(""), .string(text)])
  }

  static func silent(clientID: String, minValidity: UInt32? = nil, forceRefresh: Bool = false) -> BrokerCall {
    var options: [String: BusValue] = [:]
    if let minValidity { options["min_validity"] = .uint32(minValidity) }
    if forceRefresh { options["force_refresh"] = .bool(true) }
    return BrokerCall(
      member: "AcquireTokenSilent", arguments: [.string(clientID), .strings([]), .string(""), .dict(options)])
  }
}

enum Broker {
  /// Interactive sign-in through the session's headless browser (Tests/idp/browser.py).
  static func signIn(_ client: BusClient, clientID: String) throws -> String {
    let reply = try client.call(
      member: "AcquireToken", arguments: [.string(clientID), .strings([]), .dict(["login_hint": .string("alice")])],
      timeoutSeconds: 120)
    return reply.first?.dictValue?["account"]?.dictValue?["username"]?.stringValue ?? "?"
  }

  /// Device-code sign-in through the broker, approved as the user on "another device".
  static func signInWithDeviceCode(_ client: BusClient, clientID: String, env: Environment) throws -> String {
    let box = UncheckedBox(env)
    let reply = try signInWithDeviceCode(client, clientID: clientID, approve: { try box.value.approveDeviceCode($0) })
    return reply["account"]?.dictValue?["username"]?.stringValue ?? "?"
  }

  /// Device-code sign-in through the broker (`options` beside the flow), with `approve` called
  /// with the user code it shows; the reply's token dictionary.
  static func signInWithDeviceCode(
    _ client: BusClient, clientID: String, options: [String: BusValue] = [:],
    approve: @escaping @Sendable (String) throws -> Void
  ) throws -> [String: BusValue] {
    let failure = Locked<(any Error)?>(nil)
    // Signals are taken from the broker's own connection only (the daemon the bench started).
    _ = try client.call(interface: "org.freedesktop.DBus.Peer", member: "Ping", arguments: [])
    guard let broker = try client.owner(of: BrokerInterface.busName) else {
      throw BusCallError(name: "org.freedesktop.DBus.Error.NameHasNoOwner", message: "the broker stopped")
    }
    var arguments = options
    arguments["flow"] = .string("device_code")
    let reply = try client.call(
      destination: broker.uniqueName, member: "AcquireToken",
      arguments: [.string(clientID), .strings([]), .dict(arguments)],
      timeoutSeconds: 120, signalSender: broker.uniqueName,
      onSignal: { member, values in
        guard member == "InteractionPending", values.count == 2,
          let code = values[1].dictValue?["user_code"]?.stringValue
        else { return }
        Thread.detachNewThread {
          do { try approve(code) } catch { failure.mutate { $0 = error } }
        }
      })
    if let error = failure.value { throw error }
    guard let token = reply.first?.dictValue else { throw BenchError("AcquireToken answered no token") }
    return token
  }
}

/// The benchmark's own OAuth client: a device-code sign-in, then refresh-token requests over one
/// reused libcurl connection, with nothing of the broker in between.
struct DirectClient {
  let http: CurlHTTPClient
  let tokenEndpoint: String
  var refreshToken: String

  init(env: Environment) throws {
    let caFile = ProcessInfo.processInfo.environment["TESSERA_IDP_CA"]
    http = try CurlHTTPClient(caFile: caFile, allowInsecureLoopback: false)
    let http = self.http
    let authority = env.authority
    struct Discovery: Decodable {
      let token_endpoint: String
      let device_authorization_endpoint: String
    }
    struct Device: Decodable {
      let device_code: String
      let user_code: String
    }
    struct Tokens: Decodable { let refresh_token: String? }
    let discovery = try JSONDecoder().decode(
      Discovery.self,
      from: Data(
        try blocking {
          try await http.send(HTTPRequest(method: "GET", url: authority + "/.well-known/openid-configuration"))
        }.body))
    tokenEndpoint = discovery.token_endpoint
    let device = try JSONDecoder().decode(
      Device.self,
      from: Data(
        try blocking {
          try await http.send(
            .form(discovery.device_authorization_endpoint, [("client_id", "tessera-device"), ("scope", "openid read")]))
        }.body))
    try env.approveDeviceCode(device.user_code)
    let endpoint = tokenEndpoint
    let answer = try blocking {
      try await http.send(
        .form(
          endpoint,
          [
            ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"), ("client_id", "tessera-device"),
            ("device_code", device.device_code),
          ]))
    }
    guard let token = try JSONDecoder().decode(Tokens.self, from: Data(answer.body)).refresh_token else {
      throw BenchError("the direct device-code sign-in returned no refresh token (HTTP \(answer.status))")
    }
    refreshToken = token
  }

  /// One refresh-token request; keeps the rotated token.
  mutating func refresh() throws {
    struct Tokens: Decodable { let refresh_token: String? }
    let (endpoint, token, http) = (tokenEndpoint, refreshToken, self.http)
    let answer = try blocking {
      try await http.send(
        .form(
          endpoint,
          [
            ("grant_type", "refresh_token"), ("client_id", "tessera-device"), ("refresh_token", token),
            ("scope", "openid read"),
          ]))
    }
    guard answer.status == 200, let next = try JSONDecoder().decode(Tokens.self, from: Data(answer.body)).refresh_token
    else {
      throw BenchError("a direct refresh failed (HTTP \(answer.status))")
    }
    refreshToken = next
  }
}

struct Stats {
  let p50: Double
  let p90: Double
  let p99: Double
  init(_ samples: [Double]) {
    let sorted = samples.sorted()
    func at(_ q: Double) -> Double {
      sorted.isEmpty ? .nan : sorted[min(sorted.count - 1, Int(Double(sorted.count) * q))]
    }
    p50 = at(0.5)
    p90 = at(0.9)
    p99 = at(0.99)
  }
}

enum Machine {
  static func describe() -> [String: String] {
    var info: [String: String] = [:]
    var name = utsname()
    uname(&name)
    info["kernel"] = withUnsafeBytes(of: name.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    info["cores"] = "\(ProcessInfo.processInfo.activeProcessorCount)"
    info["memory_gib"] = String(format: "%.0f", Double(ProcessInfo.processInfo.physicalMemory) / 1_073_741_824)
    if let cpu = try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8),
      let model = cpu.split(separator: "\n").first(where: { $0.hasPrefix("model name") })?.split(separator: ":").last
    {
      info["cpu"] = model.trimmingCharacters(in: .whitespaces)
    }
    info["date"] = ISO8601DateFormatter().string(from: Date())
    return info
  }
}

struct Measurement: Codable {
  var id: String
  var name: String
  var value: Double
  var unit: String
  var goal: Double?
  var lowerIsBetter = true
  var exact = false
  var strict = false
  var detail: String?

  init(
    id: String, name: String, value: Double, unit: String, goal: Double? = nil, lowerIsBetter: Bool = true,
    exact: Bool = false, strict: Bool = false, detail: String? = nil
  ) {
    self.id = id
    self.name = name
    self.value = value
    self.unit = unit
    self.goal = goal
    self.lowerIsBetter = lowerIsBetter
    self.exact = exact
    self.strict = strict
    self.detail = detail
  }

  var met: Bool? {
    guard let goal else { return nil }
    if exact { return value == goal }
    if strict { return lowerIsBetter ? value < goal : value > goal }
    return lowerIsBetter ? value <= goal : value >= goal
  }

  var goalText: String {
    guard let goal else { return "" }
    let op = exact ? "=" : strict ? (lowerIsBetter ? "<" : ">") : (lowerIsBetter ? "≤" : "≥")
    return "\(op) \(fmt(goal))"
  }
}

struct Report: Codable {
  var machine: [String: String]
  var tesserad: String
  var smoke: Bool
  var results: [Measurement] = []

  init(machine: [String: String], tesserad: String, smoke: Bool) {
    self.machine = machine
    self.tesserad = tesserad
    self.smoke = smoke
  }

  mutating func add(_ result: Measurement) {
    // A figure that could not be read (a process gone, /proc refused) is left out, said in the
    // log: JSON has no NaN, and a row of NaN would say nothing.
    guard result.value.isFinite else {
      log("\(result.name): not measured (no finite value)")
      return
    }
    results.append(result)
    log("\(result.name): \(fmt(result.value)) \(result.unit)")
  }

  func table() -> String {
    let header = ["measurement", "value", "goal", "verdict", "detail"]
    let rows = results.map { r in
      [r.name, "\(fmt(r.value)) \(r.unit)", r.goalText, r.met.map { $0 ? "met" : "MISSED" } ?? "", r.detail ?? ""]
    }
    let widths = header.indices.map { i in ([header[i]] + rows.map { $0[i] }).map(\.count).max() ?? 0 }
    func line(_ cells: [String]) -> String {
      zip(cells, widths).map { $0.padding(toLength: $1, withPad: " ", startingAt: 0) }.joined(separator: "  ")
    }
    var out = [line(header), widths.map { String(repeating: "-", count: $0) }.joined(separator: "  ")]
    out += rows.map(line)
    let missed = results.filter { $0.met == false }.map(\.name)
    out.append("")
    out.append(missed.isEmpty ? "All goals met." : "Goals missed: \(missed.joined(separator: "; ")).")
    if smoke { out.append("(smoke run: one quick round; the numbers are not meaningful)") }
    return out.joined(separator: "\n")
  }

  func markdown(commit: String) -> String {
    var out = """
      # Benchmarks

      Produced by `scripts/bench` (the whole file is rewritten by `scripts/bench --write-md`). It starts a
      private session bus, an unlocked gnome-keyring and the test identity provider, runs a release build
      of `tesserad`, and measures it with `tessera-bench`. Benchmarks report; they never fail the test
      suite on a number. CI runs `scripts/bench --smoke` (one quick round) so the benchmark cannot rot.

      ## How to read it

      - **The floor** is `org.freedesktop.DBus.GetId`, answered by the bus daemon itself, called by the same
        client on the same connection: one crossing of the bus daemon (two message transfers).
      - **Ping** is `org.freedesktop.DBus.Peer.Ping` sent to `tesserad`, answered by sd-bus on tesserad's
        own connection: two crossings (four transfers), like every broker call, with no work done by
        Tessera. It is the honest limit for any service on the bus, and the broker is judged by its
        ratio to Ping. Floor, Ping and broker calls alternate in rounds (latency) or phases
        (throughput), so machine noise hits all three.
      - **Direct socket** rows make the same calls over tesserad's own socket
        (`$XDG_RUNTIME_DIR/tessera/bus`, peer-to-peer D-Bus, no bus daemon). Their floor, the **p2p
        floor**, is a bare peer-to-peer sd-bus call to a child process (`tessera-bench p2p-floor`)
        that answers with one string making a reply body as large as the silent reply's: two
        wake-ups and the same bytes, no Tessera code. Direct calls, the p2p floor and Ping on the bus
        alternate in the same rounds (latency) and phases (throughput).
      - **The shape floor** is the same bare server answering with the silent reply itself (its
        `a{sv}`: the same values, types and nesting, written by the codec tesserad uses) to a request
        with the silent call's arguments, read by the same client code: what the contract's
        messages cost on the direct path with no Tessera server code, measured in the same rounds.
      - **New connection** rows open a connection, make one silent call answered from the cache
        and close it, to tesserad and to the shape floor's server, interleaved: the server's CPU
        for it (its CPU-time clock, every thread), and the system calls it makes (strace attached
        to it, `-c`, per connection). oidc-agent's figure beside it is its processes' CPU for one
        `oidc-token`, which opens a new connection to the agent every time.
      - **Instructions** are counted by callgrind (valgrind), so that CPU placement and other load
        cannot move them: the server runs under it, its counters zeroed before a run of calls and
        dumped after (every thread). The client library's count is the difference between two
        whole runs of `tessera-bench client-calls` that differ only in the number of calls, both
        against the shape floor's server; its floor is the bus layer's own call, the reply left as
        bus values. oidc-agent's figure per `oidc-token` is the difference between two agents run
        whole under callgrind, set up alike, one answering more requests than the other.
      - **CLI** compares `tessera --bus token` (the session bus) and `tessera token` (which takes the
        direct socket by itself) with `busctl --user call` of the same `AcquireTokenSilent` (whole
        processes, started alike, their median wall time over interleaved runs); start-up alone is
        `tessera --version` against `busctl --version`.
      - **Silent** calls are `AcquireTokenSilent` answered from the in-memory cache.
      - **Single-flight** counts the refresh requests at the identity provider for 64 concurrent silent
        calls on an expired token (separate connections).
      - **Refresh cost** compares a `force_refresh` silent call with a refresh-token request the benchmark
        makes itself with libcurl over a reused connection to the same IdP: the ratio is the broker's
        own overhead (bus, id_token validation, keyring writes of the rotated tokens).
      - **Memory** is `VmRSS` of `tesserad` from /proc: idle after start, with a large cache loaded from
        the keyring, and its growth over many silent calls. **PSS** (from /proc/PID/smaps_rollup,
        in MB of 10^6 bytes) divides shared pages among the processes that map them: what the
        daemon costs the machine, beside oidc-agent's processes holding their token.
      - **Start-up** is from exec (or from the first call, for D-Bus activation) to the first silent token
        answered from a cold cache, i.e. loaded from the Secret Service. The keyring's own time to hand
        over the items is measured apart and subtracted.
      - Numbers vary between runs on a shared 2-core machine by 10–20 %; compare medians across commits
        (the JSON from `scripts/bench --json FILE`), not single runs.
      - Why each missed goal is missed, with profiles and what would close it:
        [docs/performance.md](docs/performance.md).

      ## Latest run

      Commit `\(commit)`\(smoke ? " (smoke run: not meaningful)" : "")

      | measurement | value | goal | verdict | detail |
      |---|---|---|---|---|

      """
    for r in results {
      out +=
        "| \(r.name) | \(fmt(r.value)) \(r.unit) | \(r.goalText) | \(r.met.map { $0 ? "met" : "**missed**" } ?? "") | \(r.detail ?? "") |\n"
    }
    out += "\n## Machine\n\n"
    for key in machine.keys.sorted() { out += "- \(key): \(machine[key]!)\n" }
    return out
  }

  func json() throws -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
    return String(decoding: try encoder.encode(self), as: UTF8.self)
  }
}

/// An executable's size and the shared libraries it loads (from ldd).
struct Binary {
  var sizeMiB: Double
  var libraries: [String]

  static func describe(_ path: String) -> Binary {
    var info = stat()
    let size = stat(path, &info) == 0 ? Double(info.st_size) / 1_048_576 : 0
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/ldd")
    process.arguments = [path]
    let pipe = Pipe()
    process.standardOutput = pipe
    var libraries: [String] = []
    if (try? process.run()) != nil {
      let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
      process.waitUntilExit()
      libraries = output.split(separator: "\n").compactMap { line in
        let name = line.trimmingCharacters(in: .whitespaces).split(separator: " ").first.map(String.init) ?? ""
        return name.isEmpty || name.hasPrefix("linux-vdso") || name.hasPrefix("/lib64/ld-linux") ? nil : name
      }
    }
    return Binary(sizeMiB: size, libraries: libraries.sorted())
  }
}

/// A child process whose standard output is read line by line (Xvfb's display number, the desktop
/// app's report lines); stopped with SIGTERM and reaped.
final class Spawned {
  let pid: pid_t
  private let output: Int32
  private var buffer: [UInt8] = []

  init(_ argv: [String], environment extra: [String: String] = [:]) throws {
    var fds: [Int32] = [0, 0]
    guard pipe(&fds) == 0 else { throw BenchError("pipe: \(String(cString: strerror(errno)))") }
    // The read end stays here (the child gets the write end as its stdout, and closes the rest).
    _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)
    _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
    var env = ProcessInfo.processInfo.environment
    for (key, value) in extra { env[key] = value }
    var cEnv: [UnsafeMutablePointer<CChar>?] = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
    var cArgv: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
    defer {
      cEnv.forEach { free($0) }
      cArgv.forEach { free($0) }
    }
    var child: pid_t = 0
    let r = posix_spawn(&child, argv[0], &actions, nil, &cArgv, &cEnv)
    close(fds[1])
    guard r == 0 else {
      close(fds[0])
      throw BenchError("cannot start \(argv[0]): \(String(cString: strerror(r)))")
    }
    pid = child
    output = fds[0]
  }

  /// The next line of its output, or nil when none comes within `timeout` seconds or it closed.
  func readLine(timeout: Double) -> String? {
    let deadline = monotonic() + timeout
    while true {
      if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
        let line = String(decoding: buffer[..<newline], as: UTF8.self)
        buffer.removeSubrange(...newline)
        return line
      }
      let left = deadline - monotonic()
      guard left > 0 else { return nil }
      var polled = pollfd(fd: output, events: Int16(POLLIN), revents: 0)
      guard poll(&polled, 1, Int32(left * 1000) + 1) > 0 else { continue }
      var chunk = [UInt8](repeating: 0, count: 4096)
      let n = read(output, &chunk, chunk.count)
      guard n > 0 else { return nil }
      buffer += chunk[..<n]
    }
  }

  func stop() {
    kill(pid, SIGTERM)
    var status: Int32 = 0
    waitpid(pid, &status, 0)
    close(output)
  }
}

/// A child process of the benchmark's, waited for by its pid (not through Foundation's Process,
/// which watches a descriptor the child inherits: a daemon it forks would keep it open).
enum Child {
  /// Runs a command to its end (at most `timeout` seconds: a bound against a hang only); its
  /// output and errors, or an error with them. `environment` is added to the benchmark's own.
  static func run(_ argv: [String], environment: [String: String] = [:], timeout: Double = 120) throws -> String {
    let path = NSTemporaryDirectory() + "/tessera-bench-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
    defer { unlink(path) }
    let pid = try spawn(argv, output: path, environment: environment)
    var status: Int32 = 0
    let deadline = monotonic() + timeout
    while waitpid(pid, &status, WNOHANG) == 0 {
      guard monotonic() < deadline else {
        kill(pid, SIGKILL)
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        throw BenchError("\(argv.joined(separator: " ")) did not end within \(Int(timeout)) s")
      }
      usleep(2000)
    }
    let output = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    guard status == 0 else { throw BenchError("\(argv[0]) failed (wait status \(status)): \(output)") }
    return output
  }

  /// Starts a command, its output and errors in the file `output`; its pid.
  static func spawn(_ argv: [String], output path: String, environment: [String: String] = [:]) throws -> pid_t {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    posix_spawn_file_actions_adddup2(&actions, 1, 2)
    var merged = ProcessInfo.processInfo.environment
    for (key, value) in environment { merged[key] = value }
    var cArguments: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
    var envp: [UnsafeMutablePointer<CChar>?] = merged.map { strdup("\($0)=\($1)") } + [nil]
    defer {
      cArguments.forEach { free($0) }
      envp.forEach { free($0) }
    }
    var pid: pid_t = 0
    let spawned = posix_spawn(&pid, cArguments[0]!, &actions, nil, &cArguments, &envp)
    guard spawned == 0 else { throw BenchError("cannot run \(argv[0]): \(String(cString: strerror(spawned)))") }
    return pid
  }
}
