import Foundation
import TesseraBus
import TesseraInterface
import TesseraSystem

#if canImport(Glibc)
  import Glibc
#endif

// A new connection's first cached token (issue 41, goal 2): connect, authenticate, identify the
// caller, answer, and the close; what it costs tesserad against the shape floor's server, in CPU
// time and in system calls. Not shipped.

extension CPUTime {
  /// Every thread process `pid` ever ran, those that ended included (its CPU-time clock).
  static func wholeProcess(_ pid: pid_t) -> Double {
    var clock = clockid_t()
    var now = timespec()
    guard pid > 0, clock_getcpuclockid(pid, &clock) == 0, clock_gettime(clock, &now) == 0 else { return .nan }
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
  }
}

extension Bench {
  struct ConnectionCosts {
    /// Server CPU per new connection (µs): tesserad, the shape floor's server.
    var tesserad: Double
    var shape: Double
    /// This client's CPU per new connection (µs), to each.
    var tesseradClient: Double
    var shapeClient: Double
    /// System calls per new connection, by name, most first; or why they were not counted.
    var tesseradSyscalls: Result<[(name: String, count: Double)], BenchError>
    var shapeSyscalls: Result<[(name: String, count: Double)], BenchError>
  }

  /// New connections, each making one silent call answered from the cache and closing: to
  /// tesserad's socket and to the shape floor's server, interleaved in rounds. Then the system
  /// calls each server makes for them, counted by strace attached to it.
  func measureNewConnections(daemonPID: pid_t, socketPath: String, shape: FloorServer) throws -> ConnectionCosts {
    let silent = BrokerCall.silent(clientID: "tessera-test")
    let sides: [(pid: pid_t, connect: () throws -> BusClient, call: BrokerCall)] = [
      (daemonPID, { try Direct.connect(socketPath) }, silent),
      (shape.pid, { try shape.connect() }, .shapeFloor(silent)),
    ]
    func connectAndCall(_ side: Int) throws {
      let (_, connect, call) = sides[side]
      let client = try connect()
      _ = try client.call(
        destination: call.destination, path: call.path, interface: call.interface, member: call.member,
        arguments: call.arguments)
    }
    let perRound = smoke ? 5 : 50
    let rounds = smoke ? 2 : 20
    for side in sides.indices { for _ in 0..<perRound { try connectAndCall(side) } }  // warm-up
    var server = [0.0, 0.0]
    var client = [0.0, 0.0]
    for _ in 0..<rounds {
      for side in sides.indices {
        let before = CPUTime.wholeProcess(sides[side].pid)
        let threadBefore = CPUTime.thread()
        for _ in 0..<perRound { try connectAndCall(side) }
        client[side] += CPUTime.thread() - threadBefore
        server[side] += CPUTime.wholeProcess(sides[side].pid) - before
      }
    }
    let perConnection = 1e6 / Double(rounds * perRound)
    let counted = smoke ? 5 : 50
    return ConnectionCosts(
      tesserad: server[0] * perConnection, shape: server[1] * perConnection,
      tesseradClient: client[0] * perConnection, shapeClient: client[1] * perConnection,
      tesseradSyscalls: reason { try Strace.count([sides[0].pid], per: counted) { try connectAndCall(0) } },
      shapeSyscalls: reason { try Strace.count([sides[1].pid], per: counted) { try connectAndCall(1) } })
  }
}

/// `body`'s value, or the error it threw as a reason.
func reason<T>(_ body: () throws -> T) -> Result<T, BenchError> {
  do { return .success(try body()) } catch let error as BenchError { return .failure(error) } catch {
    return .failure(BenchError("\(error)"))
  }
}

/// strace attached to a running process, counting its system calls (`-c`) in every thread.
enum Strace {
  static let program = "/usr/bin/strace"

  /// The system calls processes `pids` make while `work` runs `times` times, per run, by name.
  static func count(_ pids: [pid_t], per times: Int, work: () throws -> Void) throws -> [(name: String, count: Double)]
  {
    guard access(program, X_OK) == 0 else { throw BenchError("\(program) is missing (Debian's strace package)") }
    var template = Array("/tmp/tessera-bench-strace.XXXXXX".utf8CString)
    let fd = mkstemp(&template)
    guard fd >= 0 else { throw BenchError("mkstemp failed: \(String(cString: strerror(errno)))") }
    close(fd)
    let output = template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    defer { unlink(output) }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
    let arguments: [String] = [program, "-f", "-c", "-q", "-o", output] + pids.flatMap { ["-p", String($0)] }
    var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    var tracer: pid_t = 0
    let r = posix_spawn(&tracer, program, &actions, nil, &argv, environ)
    guard r == 0 else { throw BenchError("cannot start strace: \(String(cString: strerror(r)))") }
    var status: Int32 = 0
    // Attached once every thread names a tracer; strace gone first means it could not attach.
    let deadline = monotonic() + 30
    while !pids.allSatisfy(attached) {
      if waitpid(tracer, &status, WNOHANG) == tracer {
        throw BenchError("strace could not attach to \(pids) (ptrace refused; the benchmark runs as root in CI)")
      }
      guard monotonic() < deadline else {
        kill(tracer, SIGKILL)
        waitpid(tracer, &status, 0)
        throw BenchError("strace did not attach to \(pids) within 30 s")
      }
      usleep(1000)
    }
    do {
      for _ in 0..<times { try work() }
    } catch {
      kill(tracer, SIGINT)
      waitpid(tracer, &status, 0)
      throw error
    }
    kill(tracer, SIGINT)
    while waitpid(tracer, &status, 0) < 0 && errno == EINTR {}
    // strace writes its table on SIGINT and then ends by that signal (or exits 0); anything
    // else, or an empty table, is no count.
    let rows = parse((try? String(contentsOfFile: output, encoding: .utf8)) ?? "")
    guard status == 0 || status & 0x7f == SIGINT, !rows.isEmpty else {
      throw BenchError("strace ended with wait status \(status) and \(rows.count) rows: no count")
    }
    return rows.map { ($0.name, Double($0.calls) / Double(times)) }
  }

  /// The calls as a list for the report: "getsockopt 11, setsockopt 4, …" (per connection).
  static func describe(_ calls: [(name: String, count: Double)]) -> String {
    calls.map { "\($0.name) \(fmt($0.count))" }.joined(separator: ", ")
  }

  /// Whether every thread of `pid` is traced now.
  private static func attached(_ pid: pid_t) -> Bool {
    guard let tasks = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task"), !tasks.isEmpty else {
      return false
    }
    return tasks.allSatisfy { task in
      guard let status = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("TracerPid:") })
      else { return true }  // ended meanwhile
      return line.split(separator: "\t").last.map { $0 != "0" } ?? false
    }
  }

  /// strace's `-c` table: one row per system call (`% time, seconds, usecs/call, calls, [errors,]
  /// name`), most calls first; the total row left out.
  static func parse(_ table: String) -> [(name: String, calls: Int)] {
    var rows: [(name: String, calls: Int)] = []
    for line in table.split(separator: "\n") {
      let fields = line.split(separator: " ", omittingEmptySubsequences: true)
      guard fields.count >= 5, let name = fields.last, name != "total", Double(fields[0]) != nil,
        let calls = Int(fields[3])
      else { continue }
      rows.append((String(name), calls))
    }
    return rows.sorted { $0.calls > $1.calls || ($0.calls == $1.calls && $0.name < $1.name) }
  }
}

enum Processes {
  /// `pid` and every process below it.
  static func tree(_ pid: pid_t) -> [pid_t] {
    var parents: [pid_t: [pid_t]] = [:]
    for name in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
      guard let child = pid_t(name),
        let stat = try? String(contentsOfFile: "/proc/\(name)/stat", encoding: .utf8),
        let close = stat.range(of: ") ", options: .backwards)
      else { continue }
      // After the name: state, then the parent's pid.
      let fields = stat[close.upperBound...].split(separator: " ")
      if fields.count > 1, let parent = pid_t(fields[1]) { parents[parent, default: []].append(child) }
    }
    var found = [pid]
    var index = 0
    while index < found.count {
      found += parents[found[index]] ?? []
      index += 1
    }
    return found
  }
}
