import ArgumentParser
import Foundation
import TesseraBus
import TesseraClient
import TesseraInterface
import TesseraSystem

#if canImport(Glibc)
  import Glibc
#endif

// Instruction counts (issue 41, goal 3): what one call costs tesserad and the client library, in
// instructions counted by callgrind, which CPU placement and other load cannot move (the same
// binary and input count the same, whatever else the machine does). Not shipped.

/// callgrind: a process run under it, its counters zeroed and dumped while it runs.
enum Callgrind {
  static let valgrind = "/usr/bin/valgrind"
  static let control = "/usr/bin/callgrind_control"

  /// Why instructions cannot be counted here, or nil when they can. callgrind_control reaches a
  /// process blocked in a system call through ptrace (vgdb): where Yama allows it only to root,
  /// another user's run would wait for nothing.
  static func unavailable(preload: String?) -> String? {
    for tool in [valgrind, control] where access(tool, X_OK) != 0 {
      return "\(tool) is missing (Debian's valgrind package)"
    }
    if preload == nil { return "no --valgrind-preload (scripts/bench builds it): valgrind 3.19 cannot run tesserad" }
    let scope =
      (try? String(contentsOfFile: "/proc/sys/kernel/yama/ptrace_scope", encoding: .utf8))
      .flatMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) } ?? 0
    if scope >= 1 && geteuid() != 0 {
      return "ptrace is limited (kernel.yama.ptrace_scope=\(scope)) and this is not root"
    }
    return nil
  }

  /// The arguments that run a program under callgrind, writing its counts to `outFile` (a dump
  /// made while it runs goes to `outFile.N`); `preload` is scripts/lib/valgrind-sigsuspend.c built,
  /// without which valgrind 3.19 cannot run an async-main Swift program.
  static func wrapper(outFile: String, preload: String?) -> [String] {
    (preload.map { ["/usr/bin/env", "LD_PRELOAD=\($0)"] } ?? [])
      + [valgrind, "--tool=callgrind", "--callgrind-out-file=\(outFile)", "--quiet"]
  }

  /// A copy of `binary` in `directory` without its DWARF (valgrind 3.19 cannot read the DWARF 5
  /// that Swift's clang writes, and gives up); its symbols stay.
  static func strippedCopy(of binary: String, in directory: String) throws -> String {
    let copy = directory + "/" + (binary as NSString).lastPathComponent
    _ = try Child.run(["/usr/bin/strip", "--strip-debug", "-o", copy, binary])
    return copy
  }

  /// The instructions `process` executes while `work` runs: its counters are zeroed before and
  /// dumped after (every thread's, through callgrind_control).
  static func count(process pid: pid_t, outFile: String, work: () throws -> Void) throws -> UInt64 {
    // Each bounded (Child.run): vgdb waits for a process it cannot wake (ptrace refused).
    _ = try Child.run([control, "-z", "\(pid)"])
    try work()
    let before = dumps(of: outFile)
    _ = try Child.run([control, "-d", "\(pid)"])
    let part = { (file: String) in Int(file.split(separator: ".").last ?? "") ?? 0 }
    guard let newest = dumps(of: outFile).subtracting(before).max(by: { part($0) < part($1) }) else {
      throw BenchError("callgrind made no dump for process \(pid) next to \(outFile)")
    }
    return try totals(in: newest)
  }

  /// The instructions a whole program run under callgrind executes, start to exit.
  static func count(argv: [String], outFile: String, preload: String?, environment: [String: String] = [:]) throws
    -> UInt64
  {
    unlink(outFile)
    _ = try Child.run(wrapper(outFile: outFile, preload: preload) + argv, environment: environment, timeout: 600)
    return try totals(in: outFile)
  }

  /// The dump files made so far for `outFile` (`outFile.1`, `outFile.2`, …).
  private static func dumps(of outFile: String) -> Set<String> {
    let directory = (outFile as NSString).deletingLastPathComponent
    let base = (outFile as NSString).lastPathComponent + "."
    let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
    return Set(names.filter { $0.hasPrefix(base) }.map { directory + "/" + $0 })
  }

  /// The `totals:` line of a callgrind output file: every instruction it counted (Ir).
  static func totals(in file: String) throws -> UInt64 {
    let text = try String(contentsOfFile: file, encoding: .utf8)
    guard let line = text.split(separator: "\n").last(where: { $0.hasPrefix("totals:") }),
      let value = UInt64(line.dropFirst("totals:".count).trimmingCharacters(in: .whitespaces))
    else { throw BenchError("no totals in callgrind's output \(file)") }
    return value
  }
}

/// `tessera-bench client-calls --socket PATH --count N --kind typed|raw`: N silent calls over a
/// direct socket, the way a client makes them. `typed` goes through the client library
/// (TesseraClient's `acquireTokenSilent`, the reply decoded into a `TesseraToken`); `raw` is the
/// shape floor's client (the bus layer's call, the reply left as bus values). Run under callgrind
/// twice with different counts, the difference is what the calls alone cost.
struct ClientCalls: ParsableCommand {
  static let configuration = CommandConfiguration(
    commandName: "client-calls",
    abstract: "Make --count silent calls over a direct socket (for the client's instruction count).",
    shouldDisplay: false)

  enum Kind: String, ExpressibleByArgument, CaseIterable { case typed, raw }

  @Option(help: "The socket of the server to call.") var socket: String
  @Option(help: "Calls to make.") var count: Int
  @Option(help: "typed (the client library) or raw (the bus layer alone).") var kind: Kind

  func run() throws {
    let silent = BrokerCall.silent(clientID: "tessera-test")
    switch kind {
    case .typed:
      let broker = try TesseraBroker(route: .socket(socket))
      for _ in 0..<count {
        let token = try broker.acquireTokenSilent(clientID: "tessera-test")
        guard !token.accessToken.isEmpty else { throw BenchError("client-calls: a reply with no access token") }
      }
    case .raw:
      let client = try BusClient(directSocket: socket)
      for _ in 0..<count {
        let reply = try client.call(
          destination: silent.destination, path: silent.path, interface: silent.interface, member: silent.member,
          arguments: silent.arguments)
        guard !reply.isEmpty else { throw BenchError("client-calls: an empty reply") }
      }
    }
  }
}

extension Bench {
  struct InstructionCounts {
    /// Per direct silent call on one connection, steady state.
    var tesserad: Double
    var shapeServer: Double
    /// Per new connection and its first (cached) token, closed after.
    var tesseradConnection: Double
    var shapeServerConnection: Double
    /// Per call, in the calling process: the client library (typed) and the bus layer alone.
    var typedClient: Double
    var rawClient: Double
  }

  /// Instructions per call, counted by callgrind: tesserad (run under it, restarted after) and the
  /// shape floor's server for the same silent call, steady on one connection and for a new
  /// connection; and the client library against the shape floor's client, both calling the shape
  /// floor's server, so the two read the same reply bytes.
  func measureInstructions(daemon: Daemon, env: Environment, silentReply: [BusValue]) throws -> InstructionCounts {
    if let why = Callgrind.unavailable(preload: valgrindPreload) { throw BenchError(why) }
    let calls = smoke ? 50 : 2000
    let connections = smoke ? 5 : 100
    let directory = env.sessionDir + "/callgrind"
    try? FileManager.default.removeItem(atPath: directory)
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    let silent = BrokerCall.silent(clientID: "tessera-test")
    let socketPath = try Direct.socketPath()

    // Silent calls, and new connections: `connect` names the server.
    func perCall(pid: pid_t, outFile: String, connect: () throws -> BusClient, call: BrokerCall) throws -> (
      Double, Double
    ) {
      let client = try connect()
      func once(_ client: BusClient) throws {
        _ = try client.call(
          destination: call.destination, path: call.path, interface: call.interface, member: call.member,
          arguments: call.arguments, timeoutSeconds: 60)
      }
      for _ in 0..<20 { try once(client) }  // warm-up: the cache and the code paths
      let steady = try Callgrind.count(process: pid, outFile: outFile) {
        for _ in 0..<calls { try once(client) }
      }
      let fresh = try Callgrind.count(process: pid, outFile: outFile) {
        for _ in 0..<connections { try once(try connect()) }
        try once(client)  // the server has seen the last one leave
      }
      return (Double(steady) / Double(calls), Double(fresh) / Double(connections))
    }

    let tesseradCopy = try Callgrind.strippedCopy(of: daemon.binary, in: directory)
    let benchCopy = try Callgrind.strippedCopy(of: try Syscall.readLink("/proc/self/exe"), in: directory)

    // tesserad, restarted under callgrind; the plain one is back after, whatever happens.
    daemon.stop()
    defer { if daemon.pid == 0 { try? daemon.start() } }
    let measured = Daemon(binary: tesseradCopy, log: daemon.log)
    measured.arguments = daemon.arguments
    measured.wrapper = Callgrind.wrapper(outFile: directory + "/tesserad.out", preload: valgrindPreload)
    measured.startTimeout = 180
    let tesserad: (Double, Double)
    do {
      defer { measured.stop() }
      try measured.start()
      tesserad = try perCall(
        pid: measured.pid, outFile: directory + "/tesserad.out", connect: { try Direct.connect(socketPath) },
        call: silent)
    }

    // The shape floor's server, under callgrind.
    let replyBytes = Marshalled.bodySize(silentReply)
    let shapeOut = directory + "/shape.out"
    let shape = try FloorServer(
      replyBytes: replyBytes, parent: env.sessionDir, shape: silentReply,
      wrapper: Callgrind.wrapper(outFile: shapeOut, preload: valgrindPreload), program: benchCopy)
    let server = try perCall(
      pid: shape.pid, outFile: shapeOut, connect: { try shape.connect() }, call: .shapeFloor(silent))
    shape.stop()

    // The clients, each run twice under callgrind against a plain shape floor server: the
    // difference between the two runs is `calls` calls.
    let target = try FloorServer(replyBytes: replyBytes, parent: env.sessionDir, shape: silentReply)
    defer { target.stop() }
    var client: [ClientCalls.Kind: Double] = [:]
    for kind in ClientCalls.Kind.allCases {
      var totals: [UInt64] = []
      for count in [20, 20 + calls] {
        totals.append(
          try Callgrind.count(
            argv: [
              benchCopy, "client-calls", "--socket", target.socket, "--count", "\(count)", "--kind", kind.rawValue,
            ],
            outFile: directory + "/client-\(kind.rawValue).out", preload: valgrindPreload,
            // The same hash seed in both runs, so only the calls differ.
            environment: ["SWIFT_DETERMINISTIC_HASHING": "1"]))
      }
      client[kind] = (Double(totals[1]) - Double(totals[0])) / Double(calls)
    }
    if let profile {  // the dumps are profiles too: callgrind_annotate FILE
      mkdir(profile, 0o755)
      for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] where name.contains(".out") {
        try? FileManager.default.removeItem(atPath: profile + "/callgrind-" + name)
        try? FileManager.default.copyItem(atPath: directory + "/" + name, toPath: profile + "/callgrind-" + name)
      }
    }
    try daemon.start()
    return InstructionCounts(
      tesserad: tesserad.0, shapeServer: server.0, tesseradConnection: tesserad.1, shapeServerConnection: server.1,
      typedClient: client[.typed] ?? .nan, rawClient: client[.raw] ?? .nan)
  }
}
