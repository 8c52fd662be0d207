import CSystemd
import PropertyBased
import TesseraInterface
import TesseraTestSupport
import Testing

@testable import TesseraBus

/// BusCodec: what is written is read back the same, over generated values; and a message past the
/// wire limits is refused as soon as a limit is passed, saying which one and where.
@Suite(.serialized)
struct CodecTests {
  /// Text as callers send it: letters, digits, spaces and punctuation, other scripts and emoji (no
  /// NUL, which D-Bus strings cannot hold).
  static let text = Gen<Character?>.element(of: Array("aZ09 _-./@:{}\"\\é中𝄞🙂\u{7F}\u{1}") as [Character])
    .map { $0! }.string(of: 0...24)

  typealias AnyGenerator = Generator<BusValue, AnySequence<Any>>

  static let leaf: AnyGenerator = Gen<BusValue>.oneOf(
    text.map { BusValue.string($0) }.eraseToAny(),
    Gen.bool.map { BusValue.bool($0) }.eraseToAny(),
    Gen.uint32().map { BusValue.uint32($0) }.eraseToAny(),
    Gen.int32().map { BusValue.int32($0) }.eraseToAny(),
    Gen.int64().map { BusValue.int64($0) }.eraseToAny(),
    Gen.uint64().map { BusValue.uint64($0) }.eraseToAny(),
    Gen.int(in: -1_000_000...1_000_000).map { BusValue.double(Double($0) / 64) }.eraseToAny(),
    text.array(of: 0...6).map { BusValue.strings($0) }.eraseToAny(),
    zip(text, text).array(of: 0...6).map { (pairs: [(String, String)]) in
      BusValue.stringMap(Dictionary(pairs, uniquingKeysWith: { $1 }))
    }.eraseToAny()
  ).eraseToAny()

  static let dict = zip(text, leaf).array(of: 0...8).map { (pairs: [(String, BusValue)]) in
    Dictionary(pairs, uniquingKeysWith: { $1 })
  }

  /// A call's arguments: leaves, a{sv} (with a{sv} inside), aa{sv}.
  static let argument: AnyGenerator = Gen<BusValue>.oneOf(
    leaf,
    dict.map { BusValue.dict($0) }.eraseToAny(),
    zip(text, dict).array(of: 0...3).map { (pairs: [(String, [String: BusValue])]) in
      BusValue.dict(Dictionary(pairs.map { ($0.0, BusValue.dict($0.1)) }, uniquingKeysWith: { $1 }))
    }.eraseToAny(),
    dict.array(of: 0...4).map { BusValue.dicts($0) }.eraseToAny()
  ).eraseToAny()

  /// Writes `values` into a method call, seals it as if sent, and reads it back.
  static func roundTrip(_ values: [BusValue], limits: WireLimits = .replies) throws -> [BusValue] {
    try sealed { message in
      for value in values { try BusCodec.append(message, value) }
    } read: { message in
      try BusCodec.readAll(message, limits: limits)
    }
  }

  /// A method call that `fill` writes, sealed as if sent and rewound, given to `read`.
  static func sealed<T>(_ fill: (OpaquePointer) throws -> Void, read: (OpaquePointer) throws -> T) throws -> T {
    let bus = try PrivateBus.connection()
    defer { sd_bus_flush_close_unref(bus) }
    var created: OpaquePointer?
    try #require(sd_bus_message_new_method_call(bus, &created, "org.example.Peer", "/", "org.example.Peer", "M") >= 0)
    let message = try #require(created)
    defer { sd_bus_message_unref(message) }
    try fill(message)
    try #require(sd_bus_message_seal(message, 1, 0) >= 0)
    try #require(sd_bus_message_rewind(message, 1) >= 0)
    return try read(message)
  }

  @Test func generatedValuesComeBackTheSame() async throws {
    _ = try PrivateBus.ensure()
    await propertyCheck(count: 300, input: Self.argument.array(of: 1...4)) { (values: [BusValue]) throws in
      #expect(try Self.roundTrip(values) == values)
    }
  }

  @Test func aReplyTemplateIsEncodedWithItsAddedEntry() throws {
    let template: [String: BusValue] = ["access_token": .string("t"), "expires_on": .int64(7)]
    let read = try Self.sealed { message in
      try BusCodec.append(message, template, adding: "correlation_id", .string("c-1"))
    } read: { message in
      try BusCodec.readAll(message, limits: .calls)
    }
    #expect(read == [.dict(template.merging(["correlation_id": .string("c-1")]) { $1 })])
  }

  // MARK: The wire limits

  static let small = WireLimits(entries: 4, elements: 5, stringBytes: 10, values: 40, nestedVariants: false)

  func refusal(_ values: [BusValue], _ limits: WireLimits = small) throws -> BusCodec.OverLimit? {
    do {
      _ = try Self.roundTrip(values, limits: limits)
      return nil
    } catch let over as BusCodec.OverLimit {
      return over
    }
  }

  @Test func eachLimitIsEnforcedAndNamed() throws {
    let fiveEntries = BusValue.dict(Dictionary(uniqueKeysWithValues: (0..<5).map { ("k\($0)", .bool(true)) }))
    let entries = try #require(try refusal([.string("x"), fiveEntries]))
    #expect(entries.description == "a dictionary with more than 4 entries")
    #expect(entries.argument == 1)

    let elements = try #require(try refusal([.strings(Array(repeating: "e", count: 6))]))
    #expect(elements.description == "an array with more than 5 elements")

    let long = try #require(try refusal([.dict(["key": .string(String(repeating: "x", count: 11))])]))
    #expect(long.description == "a string of 11 bytes (at most 10)")
    #expect(long.key == "key", "the dictionary key whose value was too long is named")

    let many = try #require(try refusal(Array(repeating: .uint32(1), count: 41)))
    #expect(many.description == "more than 40 values in one message")

    // Exactly at the limits: read whole.
    let atLimits: [BusValue] = [
      .dict(Dictionary(uniqueKeysWithValues: (0..<4).map { ("k\($0)", .string("0123456789")) })),
      .strings(Array(repeating: "e", count: 5)),
    ]
    #expect(try refusal(atLimits) == nil)
  }

  @Test func aVariantHoldingAVariantIsRefusedWhereTheLimitsSaySo() throws {
    // a{sv} with {"k": <<"v">>}: a variant inside a variant, which no option of the table has.
    func write(_ message: OpaquePointer) throws {
      try #require(sd_bus_message_open_container(message, CChar(UInt8(ascii: "a")), "{sv}") >= 0)
      try #require(sd_bus_message_open_container(message, CChar(UInt8(ascii: "e")), "sv") >= 0)
      try BusCodec.appendString(message, "k")
      try #require(sd_bus_message_open_container(message, CChar(UInt8(ascii: "v")), "v") >= 0)
      try #require(sd_bus_message_open_container(message, CChar(UInt8(ascii: "v")), "s") >= 0)
      try BusCodec.appendString(message, "inner")
      for _ in 0..<4 { try #require(sd_bus_message_close_container(message) >= 0) }
    }
    try Self.sealed(write) { message in
      #expect(throws: BusCodec.OverLimit.self) { try BusCodec.readAll(message, limits: .calls) }
    }
    let allowed = WireLimits(entries: 64, elements: 64, stringBytes: 64, values: 64, nestedVariants: true)
    let read = try Self.sealed(write) { message in try BusCodec.readAll(message, limits: allowed) }
    #expect(read == [.dict(["k": .string("inner")])])
  }
}

/// The refusal log's rate: ten lines a second, then one line counting the rest.
@Test func refusalsAreLoggedTenASecondAndTheRestCounted() {
  var limiter = RefusalLimiter()
  var logged = 0
  for _ in 0..<25 where limiter.admit(second: 100).log { logged += 1 }
  #expect(logged == RefusalLimiter.linesPerSecond)
  let next = limiter.admit(second: 101)
  #expect(next.log)
  #expect(next.suppressedBefore == 15, "the second before's suppressed refusals are counted once")
  #expect(limiter.admit(second: 101).suppressedBefore == 0)
}
