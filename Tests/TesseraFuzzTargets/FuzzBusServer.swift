import Glibc
import Logging
import TesseraBus
import TesseraCore
import TesseraEngineFakes
import TesseraInterface
import TesseraSystem

/// The doors of the real bus server, for FuzzBus (issue 37 §19): one BusServer per process, as
/// tesserad runs it, serving its own socket and one forward, with org.tessera.Broker1's front over
/// the engine's fakes (access mode `confirm`, nobody to ask). Each input is a connection: the
/// SASL handshake, a Hello (which the bus thread answers), then the fuzzed call; through the
/// socket as a program of the user's (identified by its executable), as a sandboxed app
/// (Flatpak), or through the forward. So `admitPeer`, Hello, the forward gate and the grant paths
/// run with every input, and the call's answer is read back.
final class FuzzBusServer: @unchecked Sendable {
  // Invariant for @unchecked Sendable: every stored property is set once in init.

  /// Which door a connection comes through, and so who the caller is.
  enum Door: Int, CaseIterable {
    case identified, sandboxed, forward
  }

  /// What came back for the fuzzed call.
  enum Answer: Equatable {
    /// A method return.
    case reply
    /// An error reply, by its D-Bus name.
    case error(String)
    /// The connection closed, or nothing came in time, without an answer.
    case none
  }

  let directory: String
  let socketPath: String
  let forwardPath: String
  let server: BusServer
  let interface: InterfaceDescription
  /// The app the next connection through the socket is identified as.
  let nextApp = Locked<AppIdentity?>(nil)

  /// Made at the first input (from a synchronous caller: libFuzzer's thread, an XCTest method).
  static let shared = try! FuzzBusServer()

  private init() throws {
    var template = Array("/tmp/tessera-fuzzbus-XXXXXX".utf8CString)
    directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    socketPath = directory + "/tessera/bus"
    forwardPath = directory + "/tessera/forward/fuzz"
    // A bus name of its own, so a session bus (if there is one) and a real broker are left alone.
    let broker = BrokerInterface.description
    interface = InterfaceDescription(
      busName: "org.tessera.Fuzz.P\(getpid())", objectPath: broker.objectPath, name: broker.name,
      methods: broker.methods, signals: broker.signals, properties: broker.properties)
    let listener = try DirectSocket.listen(at: socketPath)
    let front = Locked<TesseraFront?>(nil)
    let serverSlot = Locked<BusServer?>(nil)
    let nextApp = self.nextApp
    final class Fixed: CallerProcess {
      let app: AppIdentity?
      init(_ app: AppIdentity?) { self.app = app }
      func recheck() -> Bool { false }
    }
    server = BusServer(
      interfaces: [interface], log: { _, _ in },
      onCall: { call, token in
        guard let front = front.withLock({ $0 }), let server = serverSlot.withLock({ $0 }) else { return }
        Task {
          server.reply(token, await front.handle(method: call.member, arguments: call.arguments, caller: call.caller))
        }
      },
      onCallerGone: { name in
        guard let front = front.withLock({ $0 }) else { return }
        Task { await front.broker.callerLeft(name) }
      },
      answerAtOnce: { call in
        front.withLock { $0 }?.answerAtOnce(method: call.member, arguments: call.arguments, caller: call.caller)
      },
      identify: { _, _ in Fixed(nextApp.withLock { $0 }) },
      identifyPinned: { pidfd, _, _ in
        close(pidfd)
        return Fixed(nextApp.withLock { $0 })
      },
      listener: listener)
    let server = self.server
    serverSlot.withLock { $0 = server }
    let forwardPath = self.forwardPath
    blocking {
      let harness = await Harness(accessMode: .confirm, logger: quiet)
      front.withLock { $0 = TesseraFront(broker: harness.broker, logger: quiet, clock: harness.clock) }
      _ = try? await server.start(onExit: { _ in })
      _ = try? await server.openForward(
        BusServer.ForwardRequest(
          name: "fuzz", host: "fuzz.example", path: forwardPath, makeDirectory: true, lasting: true,
          owner: CallerInfo(busName: ":fuzz")), now: 1_800_000_000)
    }
  }

  /// Connects through `door`, sends the handshake, a Hello and `call` (a marshalled method call
  /// of serial 1), and reads until the call's answer comes (or the connection ends).
  func exchange(_ call: [UInt8], through door: Door) -> Answer {
    switch door {
    case .identified: nextApp.withLock { $0 = AppIdentity(kind: .executable, id: "/usr/bin/fuzz-client") }
    case .sandboxed: nextApp.withLock { $0 = AppIdentity(kind: .flatpak, id: "org.example.Fuzz") }
    case .forward: nextApp.withLock { $0 = nil }
    }
    guard let fd = try? DirectSocket.connect(door == .forward ? forwardPath : socketPath) else { return .none }
    defer { close(fd) }
    var timeout = timeval(tv_sec: 30, tv_usec: 0)  // bounds a hang only: the fakes answer at once
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    let uid = Array(String(getuid()).utf8).map { String($0, radix: 16) }.joined()
    let hello = FuzzBus.message(
      bigEndian: false, destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
      interface: "org.freedesktop.DBus", member: "Hello", signature: [], body: [], serial: 2)
    guard FuzzBus.writeAll(fd, Array("\0AUTH EXTERNAL \(uid)\r\nBEGIN\r\n".utf8) + hello + call) else { return .none }
    var buffer: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 64 * 1024)
    var handshakeDone = false
    while true {
      let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
      guard n > 0 else { return .none }
      buffer += chunk[0..<n]
      if !handshakeDone {
        // "OK <guid>\r\n" comes first.
        guard let end = buffer.firstIndex(of: UInt8(ascii: "\n")) else { continue }
        buffer.removeSubrange(...end)
        handshakeDone = true
      }
      while let (message, length) = Self.frame(buffer) {
        buffer.removeSubrange(0..<length)
        if message.replySerial == 1 { return message.answer }
      }
    }
  }

  struct Frame {
    var type: UInt8
    var replySerial: UInt32?
    var errorName: String?
    var answer: Answer { type == 3 ? .error(errorName ?? "") : .reply }
  }

  /// The first whole message in `bytes` (its type, reply serial and error name), and its length.
  static func frame(_ bytes: [UInt8]) -> (Frame, Int)? {
    guard bytes.count >= 16 else { return nil }
    let little = bytes[0] == UInt8(ascii: "l")
    func u32(_ at: Int) -> UInt32 {
      let b = bytes[at..<(at + 4)].map(UInt32.init)
      return little ? b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24 : b[3] | b[2] << 8 | b[1] << 16 | b[0] << 24
    }
    let bodyLength = Int(u32(4))
    let fieldsLength = Int(u32(12))
    let headerEnd = 16 + fieldsLength
    let total = (headerEnd + 7) / 8 * 8 + bodyLength
    guard bytes.count >= total else { return nil }
    var frame = Frame(type: bytes[1])
    // Header fields: (code, signature, value), each aligned to 8.
    var at = 16
    while at + 4 <= headerEnd {
      let code = bytes[at]
      let type = bytes[at + 2]
      at += 4
      switch type {
      case UInt8(ascii: "u"):
        if code == 5 { frame.replySerial = u32(at) }
        at += 4
      case UInt8(ascii: "s"), UInt8(ascii: "o"):
        let length = Int(u32(at))
        guard at + 4 + length <= headerEnd else { return (frame, total) }
        if code == 4 { frame.errorName = String(decoding: bytes[(at + 4)..<(at + 4 + length)], as: UTF8.self) }
        at += 4 + length + 1
      case UInt8(ascii: "g"):
        at += 1 + Int(bytes[at]) + 1
      default:
        at = headerEnd
      }
      at = (at + 7) / 8 * 8
    }
    return (frame, total)
  }
}
