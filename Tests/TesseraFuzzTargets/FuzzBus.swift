import CSystemd
import Glibc
import Logging
import TesseraBus
import TesseraCore
import TesseraEngineFakes
import TesseraInterface
import TesseraSystem

/// A D-Bus method call as bytes on a socket, read as tesserad reads a direct connection's: sd-bus
/// (in server mode, after EXTERNAL authentication on a socketpair) reads the message; the bus
/// codec decodes its body under the interface's wire limits; a body of the method's signature goes
/// to org.tessera.Broker1's front, which parses the request with the option table and answers it
/// over the engine wired to its fakes (a sign-in completes at the fake provider).
///
/// Input: byte 0 chooses the member (a Broker1 method, a Microsoft one, or none) and, in its top
/// bit, big-endian; byte 1 is the signature's length, then the signature, then the body.
enum FuzzBus {
  static let tessera = BrokerInterface.description
  static let microsoft = MicrosoftBrokerInterface.description(refusal: { _, _ in [] })
  /// The members byte 0 chose when the seeds were written: Broker1's methods up to RejectToken,
  /// Microsoft's, and none. Frozen, so that every seed keeps its member and its door.
  static let seedMembers =
    BrokerInterface.MethodName.allCases.prefix { $0 != .rejectToken }.map { (tessera, $0.rawValue) }
    + [(tessera, BrokerInterface.MethodName.rejectToken.rawValue)]
    + MicrosoftBrokerInterface.MethodName.allCases.map { (microsoft, $0.rawValue) } + [(tessera, "Nothing")]
  /// Broker1's methods added since (RevokeGrant, RegisterPrompter, AnswerQuestion, ...): byte 0's
  /// values past every seed member at every door choose them, and a door, as the seed members do.
  static let laterMembers = BrokerInterface.MethodName.allCases.drop { $0 != .rejectToken }.dropFirst().map {
    (tessera, $0.rawValue)
  }
  static let members = seedMembers + laterMembers
  /// Byte 0 (low seven bits) below this chooses a seed member and a door; from it on, a later one.
  static let seedRange = seedMembers.count * FuzzBusServer.Door.allCases.count

  /// The largest input sent: the socket's buffer holds it, so the write never blocks.
  static let maxInput = 128 * 1024

  /// The door a Broker1 call comes through to the real bus server: byte 0's low seven bits past
  /// the member's choice (a seed's first byte below the member count comes as an identified
  /// program of the user's).
  static func door(_ input: [UInt8]) -> FuzzBusServer.Door {
    let choice = Int(input[0] & 0x7F)
    guard choice < seedRange else {
      // Past the seed members: each later member at each door in turn, the same way.
      let round = (choice - seedRange) / max(1, laterMembers.count)
      return FuzzBusServer.Door(rawValue: round % FuzzBusServer.Door.allCases.count)!
    }
    return FuzzBusServer.Door(rawValue: choice / seedMembers.count)!
  }

  /// A Broker1 call of the input through the real bus server (its own socket or its forward), and
  /// what came back; nil for another interface's member, or an input too short to be a call.
  static func answer(_ input: [UInt8], through door: FuzzBusServer.Door) -> FuzzBusServer.Answer? {
    guard let (interface, member, bytes) = call(input), interface.name == tessera.name, member != "Nothing" else {
      return nil
    }
    return FuzzBusServer.shared.exchange(bytes, through: door)
  }

  /// The member the input names, and the call marshalled.
  static func call(_ input: [UInt8]) -> (InterfaceDescription, String, [UInt8])? {
    guard input.count >= 2, input.count <= maxInput else { return nil }
    let choice = Int(input[0] & 0x7F)
    let (interface, member) =
      choice < seedRange || laterMembers.isEmpty
      ? seedMembers[choice % seedMembers.count] : laterMembers[(choice - seedRange) % laterMembers.count]
    let signatureLength = Int(input[1])
    guard input.count >= 2 + signatureLength else { return nil }
    let signature = Array(input[2..<(2 + signatureLength)])
    let body = Array(input[(2 + signatureLength)...])
    return (
      interface, member,
      message(bigEndian: input[0] & 0x80 != 0, interface: interface, member: member, signature: signature, body: body)
    )
  }

  /// Whether the call reached the front (the replay tests check that the seeds get that far).
  /// Broker1's calls also go through the real bus server's door the input chooses.
  @discardableResult
  static func run(_ input: [UInt8]) -> Bool {
    guard let (interface, member, bytes) = call(input) else { return false }
    _ = answer(input, through: door(input))
    guard let decoded = receive(bytes, limits: interface.callLimits),
      let method = interface.method(named: member), decoded.signature == method.inputs.map(\.signature).joined()
    else { return false }
    blocking { await answer(interface, member, decoded.values) }
    return true
  }

  /// What sd-bus and the codec made of the bytes: the body's values and its signature, or nil
  /// when either refused them.
  struct Decoded {
    var values: [BusValue]
    var signature: String
  }

  final class Received {
    var decoded: Decoded?
    var limits: WireLimits
    init(limits: WireLimits) { self.limits = limits }
  }

  /// Authenticates on a socketpair as a client would, sends `bytes`, and lets a server connection
  /// read them; its filter decodes the first method call.
  static func receive(_ bytes: [UInt8], limits: WireLimits) -> Decoded? {
    var fds: [Int32] = [-1, -1]
    guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else {
      return nil
    }
    defer { close(fds[1]) }
    var bus: OpaquePointer?
    guard sd_bus_new(&bus) >= 0, let bus else {
      close(fds[0])
      return nil
    }
    defer { sd_bus_unref(bus) }
    var id = sd_id128_t()
    id.bytes.0 = 1
    let received = Received(limits: limits)
    let box = Unmanaged.passRetained(received)
    defer { box.release() }
    guard sd_bus_set_fd(bus, fds[0], fds[0]) >= 0, sd_bus_set_server(bus, 1, id) >= 0,
      sd_bus_negotiate_fds(bus, 0) >= 0, sd_bus_add_filter(bus, nil, filter, box.toOpaque()) >= 0,
      sd_bus_start(bus) >= 0
    else { return nil }
    let uid = Array(String(getuid()).utf8).map { String($0, radix: 16) }.joined()
    let handshake = Array("\0AUTH EXTERNAL \(uid)\r\nBEGIN\r\n".utf8)
    guard writeAll(fds[1], handshake + bytes) else { return nil }
    shutdown(fds[1], Int32(SHUT_WR))
    // Each step reads or dispatches; the message has arrived whole, so this ends when it is read
    // (or refused, or the connection closed).
    for _ in 0..<64 {
      if received.decoded != nil { break }
      let r = sd_bus_process(bus, nil)
      if r <= 0 { break }
    }
    return received.decoded
  }

  static let filter: sd_bus_message_handler_t = { message, userdata, _ in
    guard let message, let userdata, sd_bus_message_is_method_call(message, nil, nil) > 0 else { return 0 }
    let received = Unmanaged<Received>.fromOpaque(userdata).takeUnretainedValue()
    let signature = sd_bus_message_get_signature(message, 1).map { String(cString: $0) } ?? ""
    if let values = try? BusCodec.readAll(message, limits: received.limits) {
      received.decoded = Decoded(values: values, signature: signature)
    } else {
      received.decoded = Decoded(values: [], signature: "\u{0}refused")
    }
    return 1
  }

  static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
    var offset = 0
    while offset < bytes.count {
      let n = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
      if n < 0 && errno == EINTR { continue }
      guard n > 0 else { return false }
      offset += n
    }
    return true
  }

  /// One method call, marshalled by hand: the fixed header, the header fields (path, interface,
  /// member, and the signature when there is one), padding to 8, the body as given.
  static func message(
    bigEndian: Bool, interface: InterfaceDescription, member: String, signature: [UInt8], body: [UInt8]
  ) -> [UInt8] {
    message(
      bigEndian: bigEndian, destination: nil, path: interface.objectPath, interface: interface.name, member: member,
      signature: signature, body: body, serial: 1)
  }

  /// The same, with every header given.
  static func message(
    bigEndian: Bool, destination: String?, path: String, interface: String, member: String, signature: [UInt8],
    body: [UInt8], serial: UInt32
  ) -> [UInt8] {
    var out: [UInt8] = []
    func pad(_ n: Int) { while out.count % n != 0 { out.append(0) } }
    func u32(_ v: UInt32) {
      withUnsafeBytes(of: bigEndian ? v.bigEndian : v.littleEndian) { out += $0 }
    }
    func field(_ code: UInt8, _ type: Character, _ value: [UInt8]) {
      pad(8)
      out += [code, 1, UInt8(type.asciiValue!), 0]
      if type == "g" {
        out.append(UInt8(truncatingIfNeeded: value.count))
      } else {
        u32(UInt32(value.count))
      }
      out += value + [0]
    }
    out += [bigEndian ? UInt8(ascii: "B") : UInt8(ascii: "l"), 1, 0, 1]
    u32(UInt32(body.count))
    u32(serial)
    u32(0)  // the fields' length, written below
    let fieldsStart = out.count
    field(1, "o", Array(path.utf8))
    field(2, "s", Array(interface.utf8))
    field(3, "s", Array(member.utf8))
    if let destination { field(6, "s", Array(destination.utf8)) }
    if !signature.isEmpty { field(8, "g", signature) }
    let length = UInt32(out.count - fieldsStart)
    withUnsafeBytes(of: bigEndian ? length.bigEndian : length.littleEndian) {
      for (i, byte) in $0.enumerated() { out[fieldsStart - 4 + i] = byte }
    }
    pad(8)
    return out + body
  }

  /// The call as the daemon's handler gets it: the bus thread's own answer first, then the
  /// interface's front.
  static func answer(_ interface: InterfaceDescription, _ member: String, _ values: [BusValue]) async {
    let harness = await Harness(logger: quiet)
    let caller = CallerInfo(busName: ":1.42")
    if interface.name == tessera.name {
      let front = TesseraFront(broker: harness.broker, logger: quiet, clock: harness.clock)
      if front.answerAtOnce(method: member, arguments: values, caller: caller) == nil {
        _ = await front.handle(method: member, arguments: values, caller: caller)
      }
    } else {
      let front = MicrosoftFront(broker: harness.broker, logger: quiet, clock: harness.clock)
      if front.answerAtOnce(method: member, arguments: values, caller: caller) == nil {
        _ = await front.handle(method: member, arguments: values, caller: caller)
      }
    }
  }
}
