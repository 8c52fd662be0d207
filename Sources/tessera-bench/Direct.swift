import ArgumentParser
import CSystemd
import Foundation
import TesseraBus
import TesseraCore
import TesseraInterface
import TesseraPlatform
import TesseraSystem

#if canImport(Glibc)
  import Glibc
#endif

// tesserad's own socket ($XDG_RUNTIME_DIR/tessera/bus, issue 23) in the benchmark: the floor for
// that path (a bare peer-to-peer sd-bus server in a child process, `tessera-bench p2p-floor`),
// and the direct connections the measurements use. Not shipped.

/// `tessera-bench p2p-floor --socket PATH --length N`: the floor for the direct path. Listens on
/// a Unix socket and answers every method call on every connection with one string of N bytes,
/// as sd-bus alone would: a server connection per peer, EXTERNAL authentication, a filter that
/// replies, one thread per connection waiting in `sd_bus_wait`. No Tessera code on the path.
/// Exits when its standard input closes (the benchmark that started it is gone).
struct P2PFloor: ParsableCommand {
  static let configuration = CommandConfiguration(
    commandName: "p2p-floor",
    abstract: "Answer every call on a Unix socket with a string of --length bytes (the direct path's floor).",
    shouldDisplay: false)

  @Option(help: "The Unix socket to listen on (its directory is made 0700).") var socket: String
  @Option(help: "The length of the string every reply carries.") var length: Int = 0
  @Option(help: "Answer with this reply instead (a file FloorShape wrote): the contract's shape, no Tessera code.")
  var shape: String?

  func run() throws {
    let listener: DirectSocket.Listener
    do { listener = try DirectSocket.listen(at: socket) } catch { throw BenchError("p2p-floor: \(error)") }
    _ = fcntl(listener.fd, F_SETFL, fcntl(listener.fd, F_GETFL) & ~O_NONBLOCK)
    let text = strdup(String(repeating: "x", count: max(0, length)))!
    let values = try shape.map { try FloorShape.read($0) }
    let reply = UncheckedBox(FloorReply(text: text, length: strlen(text), values: values))
    Thread.detachNewThread {
      var byte: UInt8 = 0
      while read(0, &byte, 1) > 0 {}
      unlink(listener.path)
      Glibc.exit(0)
    }
    while true {
      let fd = accept(listener.fd, nil, nil)
      if fd < 0 {
        if errno == EINTR || errno == ECONNABORTED { continue }
        throw BenchError("p2p-floor: accept failed: \(String(cString: strerror(errno)))")
      }
      _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
      Thread.detachNewThread { P2PFloor.serve(fd, reply.value) }
    }
  }

  /// One peer-to-peer connection: sd-bus in server mode, until the peer leaves.
  static func serve(_ fd: Int32, _ reply: FloorReply) {
    var bus: OpaquePointer?
    guard sd_bus_new(&bus) >= 0, let bus else {
      close(fd)
      return
    }
    defer { sd_bus_flush_close_unref(bus) }
    var id = sd_id128_t()
    let userdata = Unmanaged.passRetained(reply).toOpaque()
    defer { Unmanaged<FloorReply>.fromOpaque(userdata).release() }
    guard sd_bus_set_fd(bus, fd, fd) >= 0, sd_id128_randomize(&id) >= 0, sd_bus_set_server(bus, 1, id) >= 0,
      sd_bus_negotiate_fds(bus, 0) >= 0, sd_bus_add_filter(bus, nil, floorAnswer, userdata) >= 0,
      sd_bus_start(bus) >= 0
    else { return }
    while true {
      let r = sd_bus_process(bus, nil)
      if r < 0 { return }
      if r > 0 { continue }
      if sd_bus_wait(bus, UInt64.max) < 0 { return }
    }
  }
}

/// The one reply the floor server sends: one string, as bytes ready to copy, or (the shape floor)
/// the values of a silent reply.
final class FloorReply {
  let text: UnsafeMutablePointer<CChar>
  let length: Int
  let values: [BusValue]?
  init(text: UnsafeMutablePointer<CChar>, length: Int, values: [BusValue]?) {
    self.text = text
    self.length = length
    self.values = values
  }
}

/// Answers any method call, reading nothing of it: with the string, copied into the message as
/// tesserad copies its own strings (`append_string_space`, no second UTF-8 scan), the cheapest
/// sd-bus can do; or with the silent reply's values, written by the codec tesserad uses.
private let floorAnswer: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message, sd_bus_message_is_method_call(message, nil, nil) > 0 else { return 0 }
  let reply = Unmanaged<FloorReply>.fromOpaque(userdata!).takeUnretainedValue()
  var answer: OpaquePointer?
  var r = sd_bus_message_new_method_return(message, &answer)
  guard r >= 0, let answer else { return r }
  defer { sd_bus_message_unref(answer) }
  if let values = reply.values {
    do { for value in values { try BusCodec.append(answer, value) } } catch { return -EINVAL }
  } else {
    var space: UnsafeMutablePointer<CChar>?
    r = sd_bus_message_append_string_space(answer, reply.length, &space)
    guard r >= 0, let space else { return r }
    memcpy(space, reply.text, reply.length)
  }
  r = sd_bus_send(nil, answer, nil)
  return r < 0 ? r : 1
}

/// A reply's values in a file, for the shape floor's server: JSON, each value tagged with its
/// D-Bus type (the types a silent reply holds).
enum FloorShape {
  static func write(_ values: [BusValue], to path: String) throws {
    let data = try JSONSerialization.data(withJSONObject: values.map(tagged))
    guard FileManager.default.createFile(atPath: path, contents: data) else {
      throw BenchError("cannot write \(path)")
    }
  }

  static func read(_ path: String) throws -> [BusValue] {
    guard let data = FileManager.default.contents(atPath: path),
      let list = try JSONSerialization.jsonObject(with: data) as? [Any]
    else { throw BenchError("p2p-floor: cannot read the reply in \(path)") }
    return try list.map(untagged)
  }

  private static func tagged(_ value: BusValue) -> Any {
    switch value {
    case .string(let s): ["s": s]
    case .int64(let x): ["x": x]
    case .uint32(let u): ["u": u]
    case .bool(let b): ["b": b]
    case .strings(let list): ["as": list]
    case .dict(let dict): ["a{sv}": dict.mapValues(tagged)]
    default: ["?": value.signature]
    }
  }

  private static func untagged(_ any: Any) throws -> BusValue {
    guard let object = any as? [String: Any], let (tag, inner) = object.first else {
      throw BenchError("p2p-floor: a value without its type")
    }
    switch (tag, inner) {
    case ("s", let s as String): return .string(s)
    case ("x", let x as NSNumber): return .int64(x.int64Value)
    case ("u", let u as NSNumber): return .uint32(u.uint32Value)
    case ("b", let b as Bool): return .bool(b)
    case ("as", let list as [String]): return .strings(list)
    case ("a{sv}", let dict as [String: Any]): return .dict(try dict.mapValues(untagged))
    default: throw BenchError("p2p-floor: a value of type \(tag) is not in a silent reply")
    }
  }
}

/// The floor server, run by the benchmark as a child process (`tessera-bench p2p-floor`).
final class FloorServer {
  let socket: String
  let replyBytes: Int
  private(set) var pid: pid_t = 0
  private var lifeline: Int32 = -1
  private let directory: String

  /// Starts it on a fresh socket under `parent`, answering with a body of `replyBytes` bytes
  /// (one string, so `replyBytes - 5` characters: its length and its NUL take the rest); or, with
  /// `shape`, with those values (the shape floor).
  /// `wrapper` is a program it runs under (valgrind, for the instruction counts).
  /// `program` is the tessera-bench to run (this one by default).
  init(replyBytes: Int, parent: String, shape: [BusValue]? = nil, wrapper: [String] = [], program: String? = nil)
    throws
  {
    self.replyBytes = replyBytes
    var template = Array((parent + "/bench-floor.XXXXXX").utf8CString)
    guard let made = mkdtemp(&template) else { throw BenchError("mkdtemp under \(parent) failed") }
    directory = String(cString: made)
    socket = directory + "/bus"
    var pipeEnds: [Int32] = [-1, -1]
    try Syscall.check("pipe") { pipe(&pipeEnds) }
    for end in pipeEnds { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
    lifeline = pipeEnds[1]
    defer { close(pipeEnds[0]) }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_adddup2(&actions, pipeEnds[0], 0)
    let exe = try program ?? Syscall.readLink("/proc/self/exe")
    var argv = [exe, "p2p-floor", "--socket", socket, "--length", "\(max(0, replyBytes - 5))"]
    if let shape {
      try FloorShape.write(shape, to: directory + "/reply.json")
      argv += ["--shape", directory + "/reply.json"]
    }
    var cArguments: [UnsafeMutablePointer<CChar>?] = (wrapper + argv).map { strdup($0) } + [nil]
    defer { cArguments.forEach { free($0) } }
    let r = posix_spawn(&pid, wrapper.first ?? exe, &actions, nil, &cArguments, environ)
    guard r == 0 else { throw BenchError("cannot start the p2p floor server: error \(r)") }
    let deadline = monotonic() + (wrapper.isEmpty ? 10 : 120)
    while (try? connect()) == nil {
      guard monotonic() < deadline else { throw BenchError("the p2p floor server did not listen on \(socket)") }
      usleep(2000)
    }
  }

  func connect() throws -> BusClient { try BusClient(directSocket: socket) }

  func stop() {
    guard pid > 0 else { return }
    close(lifeline)
    kill(pid, SIGTERM)
    var status: Int32 = 0
    waitpid(pid, &status, 0)
    pid = 0
    unlink(socket)
    unlink(socket + ".lock")
    unlink(directory + "/reply.json")
    rmdir(directory)
  }

  deinit { stop() }
}

extension Syscall {
  /// The target of a symbolic link.
  static func readLink(_ path: String) throws -> String {
    var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
    let n = readlink(path, &buffer, buffer.count - 1)
    guard n > 0 else { throw BenchError("readlink(\(path)) failed: \(String(cString: strerror(errno)))") }
    return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
  }
}

extension BrokerCall {
  /// The one method of the p2p floor server (any call is answered the same way).
  static let p2pFloor = BrokerCall(
    destination: "org.tessera.BenchFloor", path: "/org/tessera/BenchFloor", interface: "org.tessera.BenchFloor",
    member: "Answer", arguments: [])

  /// The shape floor's call: a silent call's arguments, so the client encodes the same request.
  static func shapeFloor(_ silent: BrokerCall) -> BrokerCall {
    var call = p2pFloor
    call.member = silent.member
    call.arguments = silent.arguments
    return call
  }
}

/// The size of a message body holding `values`, marshalled as D-Bus does (little-endian,
/// alignment from the start of the body): what the floor's reply is made as large as.
enum Marshalled {
  static func bodySize(_ values: [BusValue]) -> Int {
    var offset = 0
    for value in values { add(value, &offset) }
    return offset
  }

  private static func align(_ offset: inout Int, _ boundary: Int) {
    offset = (offset + boundary - 1) / boundary * boundary
  }

  private static func add(_ value: BusValue, _ offset: inout Int) {
    func string(_ s: String) {
      align(&offset, 4)
      offset += 4 + s.utf8.count + 1
    }
    func array(elementAlignment: Int, _ body: () -> Void) {
      align(&offset, 4)
      offset += 4
      align(&offset, elementAlignment)
      body()
    }
    switch value {
    case .string(let s), .objectPath(let s): string(s)
    case .bool, .uint32, .int32:
      align(&offset, 4)
      offset += 4
    case .int64, .uint64, .double:
      align(&offset, 8)
      offset += 8
    case .strings(let list): array(elementAlignment: 4) { list.forEach(string) }
    case .stringMap(let map):
      array(elementAlignment: 8) {
        for (key, item) in map {
          align(&offset, 8)
          string(key)
          string(item)
        }
      }
    case .dict(let dict):
      array(elementAlignment: 8) {
        for (key, item) in dict {
          align(&offset, 8)
          string(key)
          let signature = item.signature
          offset += 1 + signature.utf8.count + 1  // the variant's signature
          add(item, &offset)
        }
      }
    case .dicts(let dicts): array(elementAlignment: 4) { dicts.forEach { add(.dict($0), &offset) } }
    case .structs(_, let rows):
      array(elementAlignment: 8) {
        for row in rows {
          align(&offset, 8)
          row.forEach { add($0, &offset) }
        }
      }
    case .variants(let values):
      array(elementAlignment: 1) {
        for item in values {
          offset += 1 + item.signature.utf8.count + 1  // the variant's signature
          add(item, &offset)
        }
      }
    case .other: break  // not in a silent reply; counted as nothing
    }
  }
}

/// The direct socket the benchmark's tesserad serves, and connections to it.
enum Direct {
  /// Where tesserad listens in this session (as the clients find it).
  static func socketPath() throws -> String {
    guard let path = DirectSocket.path(environment: ProcessInfo.processInfo.environment) else {
      throw BenchError("no runtime directory: tesserad has no socket of its own here")
    }
    return path
  }

  /// A connection to tesserad's socket, waiting (up to 10 s) for a tesserad just started.
  static func connect(_ path: String) throws -> BusClient {
    let deadline = monotonic() + 10
    while true {
      do { return try BusClient(directSocket: path) } catch {
        guard error.name == BusClient.noSocketError, monotonic() < deadline else {
          throw BenchError("cannot reach tesserad's socket \(path): \(error)")
        }
        usleep(2000)
      }
    }
  }
}

extension Bench {
  /// With --profile DIR: `perf record -a -g` (the whole machine, so tesserad, dbus-daemon, this
  /// client and the floor server each show under their own command) over `count` calls of each
  /// path, one connection, one after another: DIR/direct-silent.data, bus-silent.data,
  /// bus-ping.data, p2p-floor.data. Read them with `perf report -i FILE --sort comm,dso`.
  func recordProfiles(into directory: String, count: Int, _ paths: [(String, BusClient, BrokerCall)]) throws {
    mkdir(directory, 0o755)
    for (name, client, call) in paths {
      let output = directory + "/" + name + ".data"
      var actions = posix_spawn_file_actions_t()
      posix_spawn_file_actions_init(&actions)
      defer { posix_spawn_file_actions_destroy(&actions) }
      posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
      posix_spawn_file_actions_addopen(&actions, 2, directory + "/" + name + ".log", O_WRONLY | O_CREAT, 0o644)
      let argv = ["/usr/bin/perf", "record", "-a", "-g", "-e", "cpu-clock", "-F", "4999", "-o", output]
      var cArguments: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
      defer { cArguments.forEach { free($0) } }
      var pid: pid_t = 0
      let r = posix_spawn(&pid, argv[0], &actions, nil, &cArguments, environ)
      guard r == 0 else { throw BenchError("cannot run perf: error \(r)") }
      usleep(1_000_000)  // perf is recording by then
      let start = monotonic()
      _ = try timeCalls(client, call, count: count)
      let elapsed = monotonic() - start
      kill(pid, SIGINT)
      var status: Int32 = 0
      waitpid(pid, &status, 0)
      log("profile \(name): \(count) calls in \(fmt(elapsed * 1000)) ms, \(output)")
    }
  }
}

/// CPU time from the kernel's accounting, in seconds.
enum CPUTime {
  /// The calling thread's.
  static func thread() -> Double {
    var now = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
  }

  /// Every thread of process `pid`, from /proc/PID/task/*/schedstat (nanoseconds on the CPU);
  /// threads that ended since are not counted, so measure across spans where none end.
  static func process(_ pid: pid_t) -> Double {
    guard pid > 0, let tasks = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else {
      return 0
    }
    var total = 0.0
    for task in tasks {
      guard let text = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/schedstat", encoding: .utf8),
        let first = text.split(separator: " ").first, let ns = Double(first)
      else { continue }
      total += ns / 1e9
    }
    return total
  }
}
