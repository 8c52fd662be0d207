import Logging
import TesseraEngineFakes
import TesseraInterface
import TesseraTestSupport
import XCTest

@testable import TesseraCore

/// The bus thread's fast path and the token actor's full path must answer every AcquireTokenSilent
/// alike: the same reply, or the same error. Requests are generated over every option of the one
/// table, valid and invalid, with wrong types, out-of-range numbers, long strings and control
/// characters, and asked of both paths back to back.
final class FastPathTests: XCTestCase {
  func value(for option: RequestOption, accountID: String, _ rng: inout SeededGenerator) -> BusValue {
    let valid = Int.random(in: 0..<10, using: &rng) < 7
    if !valid {
      switch Int.random(in: 0..<4, using: &rng) {
      case 0: return option.kind == .string ? .uint32(5) : .string("5")  // wrong type
      case 1: return .int32(1)
      case 2 where option.kind == .string: return .string("bad\u{1}value")
      case 3 where option.kind == .string: return .string(String(repeating: "x", count: option.maxBytes + 1))
      default:
        if let range = option.range, range.upperBound < .max { return .uint32(range.upperBound + 1) }
        return .strings(["x"])
      }
    }
    switch option.kind {
    case .bool: return .bool(Bool.random(using: &rng))
    case .uint32:
      let range = option.range!
      let picks: [UInt32] = [range.lowerBound, range.upperBound, 60, 300, 1000, 3000]
      return .uint32(picks.filter(range.contains).randomElement(using: &rng)!)
    case .stringMap: return .stringMap(["msafed": "0"])
    case .string:
      if let values = option.values { return .string(values.randomElement(using: &rng)!) }
      switch option.key {
      case "account_id": return .string([accountID, "nobody"].randomElement(using: &rng)!)
      case "authority": return .string([FakeIdP.authority, "https://elsewhere.test/x"].randomElement(using: &rng)!)
      case "claims": return .string(#"{"access_token":{"nbf":{"essential":true}}}"#)
      case "correlation_id": return .string(["", "fixed-id-1", CorrelationID.new()].randomElement(using: &rng)!)
      default: return .string(["", "alice@idp.test"].randomElement(using: &rng)!)
      }
    }
  }

  func testFastAndFullPathsAgreeOverGeneratedRequests() async throws {
    let h = await Harness()
    let signedIn = try await h.signIn()
    let accountID = signedIn["account"]!.dictValue!["id"]!.stringValue!
    let handler = TesseraFront(broker: h.broker, logger: Logger(label: "test"), clock: h.clock)
    let caller = CallerInfo(busName: ":1.7")
    let options = RequestOptions.options(for: .acquireTokenSilent)
    var rng = SeededGenerator(state: 20_261_123)
    var fastReplies = 0
    var fastRefusals = 0
    for round in 0..<3000 {
      let clientID = ["", "app1", "bad id"].randomElement(using: &rng)!
      let scopes = [[], ["read"], ["READ"], ["a b"]].randomElement(using: &rng)!
      let account = ["", accountID, "nobody"].randomElement(using: &rng)!
      var sent: [String: BusValue] = [:]
      for (key, option) in options where Int.random(in: 0..<10, using: &rng) < 2 {
        sent[key] = value(for: option, accountID: accountID, &rng)
      }
      if Int.random(in: 0..<30, using: &rng) == 0 { sent["bogus"] = .bool(true) }
      // Often just a repeat with a different correlation id: what the fast path is for.
      if Int.random(in: 0..<2, using: &rng) == 0 { sent = sent.filter { $0.key == "correlation_id" } }
      let arguments: [BusValue] = [.string(clientID), .strings(scopes), .string(account), .dict(sent)]

      guard let fast = handler.answerAtOnce(method: "AcquireTokenSilent", arguments: arguments, caller: caller)?.values
      else {
        _ = await handler.handle(method: "AcquireTokenSilent", arguments: arguments, caller: caller)
        continue
      }
      let full = await handler.handle(method: "AcquireTokenSilent", arguments: arguments, caller: caller)
      let context = "round \(round): \(arguments)"
      switch (fast, full) {
      case (.success(let fastValues), .success(let fullValues)):
        fastReplies += 1
        var fastReply = fastValues.first!.dictValue!
        var fullReply = fullValues.first!.dictValue!
        if case .string(let given)? = sent["correlation_id"], !given.isEmpty {
          XCTAssertEqual(fastReply["correlation_id"], .string(given), context)
        }
        fastReply["correlation_id"] = nil
        fullReply["correlation_id"] = nil
        XCTAssertEqual(fastReply, fullReply, context)
      case (.failure(let fastError), .failure(let fullError)):
        fastRefusals += 1
        XCTAssertEqual(fastError, fullError, context)
      default:
        XCTFail("the paths disagree: fast \(fast), full \(full); \(context)")
      }
    }
    // Not vacuous: both kinds of fast answer were compared many times.
    XCTAssertGreaterThan(fastReplies, 200)
    XCTAssertGreaterThan(fastRefusals, 200)
  }

  func testAPublishedAnswerIsNotServedPastItsRefreshTimeOrBelowMinValidity() async throws {
    let h = await Harness()
    try await h.signIn()
    let handler = TesseraFront(broker: h.broker, logger: Logger(label: "test"), clock: h.clock)
    let caller = CallerInfo(busName: ":1.7")
    func arguments(_ options: [String: BusValue] = [:]) -> [BusValue] {
      [.string(""), .strings([]), .string(""), .dict(options)]
    }
    XCTAssertNil(handler.answerAtOnce(method: "AcquireTokenSilent", arguments: arguments(), caller: caller))
    _ = await handler.handle(method: "AcquireTokenSilent", arguments: arguments(), caller: caller)
    guard
      case .success? = handler.answerAtOnce(method: "AcquireTokenSilent", arguments: arguments(), caller: caller)?
        .values
    else { return XCTFail("a repeat is answered by the fast path") }
    // The token lives 3600 s: with 3700 s of validity asked for, only the full path may answer.
    XCTAssertNil(
      handler.answerAtOnce(
        method: "AcquireTokenSilent", arguments: arguments(["min_validity": .uint32(3700)]), caller: caller))
    XCTAssertNil(
      handler.answerAtOnce(
        method: "AcquireTokenSilent", arguments: arguments(["force_refresh": .bool(true)]), caller: caller))
    h.clock.advance(3600 - 300)  // past the refresh time
    XCTAssertNil(handler.answerAtOnce(method: "AcquireTokenSilent", arguments: arguments(), caller: caller))
  }

  /// What a log handler was given: each line's level and message.
  struct RecordingLog: LogHandler {
    let lines: Locked<[(Logger.Level, String)]>
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
      get { metadata[key] }
      set { metadata[key] = newValue }
    }
    func log(event: LogEvent) { lines.withLock { $0.append((event.level, "\(event.message)")) } }
  }

  /// A token answered from the cache costs the daemon no info line (a journal write per call,
  /// issue 41); at log_level "debug" it is there, marked as a hit.
  func testACacheHitIsLoggedAtDebugOnly() async throws {
    let h = await Harness()
    try await h.signIn()
    let caller = CallerInfo(busName: ":1.7")
    let arguments: [BusValue] = [.string(""), .strings([]), .string(""), .dict([:])]
    for level in [Logger.Level.info, .debug] {
      let lines = Locked<[(Logger.Level, String)]>([])
      var logger = Logger(label: "test") { _ in RecordingLog(lines: lines, logLevel: level) }
      logger.logLevel = level
      let handler = TesseraFront(broker: h.broker, logger: logger, clock: h.clock)
      _ = await handler.handle(method: "AcquireTokenSilent", arguments: arguments, caller: caller)
      XCTAssertEqual(lines.withLock { $0.map(\.1) }, ["AcquireTokenSilent succeeded"], "the full path's line")
      lines.withLock { $0.removeAll() }
      for _ in 0..<3 {
        guard
          case .success? = handler.answerAtOnce(method: "AcquireTokenSilent", arguments: arguments, caller: caller)?
            .values
        else { return XCTFail("a repeat is answered from the cache") }
      }
      let hits = lines.withLock { $0 }
      if level == .info {
        XCTAssertTrue(hits.isEmpty, "cache hits at info: \(hits.map(\.1))")
      } else {
        XCTAssertEqual(hits.map(\.0), [.debug, .debug, .debug])
      }
    }
  }
}
