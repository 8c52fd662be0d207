import Foundation
import TesseraInterface
import TesseraPlatform
import XCTest

@testable import TesseraFuzzTargets

/// Every fuzz target's seeds (Fuzz/corpus/TARGET) and every input that once made a target fail
/// (Fuzz/regressions/TARGET, each named for what it found) run through the same functions libFuzzer
/// calls, in every `swift test`, and under the sanitizers in scripts/test: a fixed finding stays
/// fixed without the fuzzer. The seeds must also reach what they were written for, or the fuzzer
/// would start from nothing.
final class FuzzReplayTests: XCTestCase {
  static let fuzz = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().appendingPathComponent("Fuzz")

  func inputs(_ folder: String, _ target: FuzzTarget) -> [(String, [UInt8])] {
    let directory = Self.fuzz.appendingPathComponent(folder).appendingPathComponent(target.rawValue)
    let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
    return names.filter { !$0.hasPrefix(".") && $0 != "README.md" }.sorted().map { name in
      (name, Array((try? Data(contentsOf: directory.appendingPathComponent(name))) ?? Data()))
    }
  }

  func testEveryTargetHasSeedsAndADictionary() {
    for target in FuzzTarget.allCases {
      XCTAssertFalse(inputs("corpus", target).isEmpty, "\(target.rawValue) has no seeds in Fuzz/corpus")
      let dict = Self.fuzz.appendingPathComponent("dicts/\(target.rawValue).dict")
      XCTAssertTrue(FileManager.default.fileExists(atPath: dict.path), "\(target.rawValue) has no dictionary")
    }
  }

  func testEverySeedAndEveryPastFindingRunsToTheEnd() {
    var count = 0
    for target in FuzzTarget.allCases {
      for (_, bytes) in inputs("corpus", target) + inputs("regressions", target) {
        target.run(bytes)
        count += 1
      }
    }
    XCTAssertGreaterThan(count, 20)
  }

  /// The provider's seeds sign in (discovery, device code, token, id_token against the JWKS),
  /// except those written to fail; one that stopped reaching the id_token check would leave the
  /// fuzzer outside it.
  func testTheProviderSeedsSignIn() {
    for (name, bytes) in inputs("corpus", .provider) {
      let signedIn = LockedFlag()
      blocking { signedIn.set(await FuzzProvider.run(bytes)) }
      XCTAssertEqual(signedIn.value, !name.hasPrefix("refused-"), "\(name)")
    }
  }

  /// The bus seeds are well-formed calls of their methods: sd-bus reads them, the codec decodes
  /// them, and the front gets them.
  func testTheBusSeedsReachTheFront() {
    for (name, bytes) in inputs("corpus", .bus) {
      XCTAssertEqual(FuzzBus.run(bytes), !name.hasPrefix("refused-"), "\(name)")
    }
  }

  /// Issue 37 §19: the Broker1 seeds also go through the real bus server's doors (its socket as a
  /// program of the user's, as a sandboxed app, and through a forward), and each gets the answer
  /// its caller should: the forward gets AccessDenied for every method but the forwarded ones,
  /// a wrongly typed call InvalidArgument before the engine, and every other call an answer.
  func testTheBusSeedsAreAnsweredThroughEachDoorOfTheRealServer() {
    let denied = "org.tessera.Broker1.Error.AccessDenied"
    var answered = 0
    for (name, bytes) in inputs("corpus", .bus) {
      guard let (_, member, _) = FuzzBus.call(bytes) else { continue }
      for door in FuzzBusServer.Door.allCases {
        guard let answer = FuzzBus.answer(bytes, through: door) else { continue }
        answered += 1
        XCTAssertNotEqual(answer, .none, "\(name) through \(door): no answer")
        if name.hasPrefix("refused-") {
          if case .error(let errorName) = answer {
            XCTAssertTrue(
              errorName.hasSuffix("InvalidArgument") || errorName.contains("InvalidArgs"), "\(name): \(errorName)")
          } else {
            XCTFail("\(name) through \(door): \(answer)")
          }
        } else if door == .forward && !BrokerInterface.forwardedMethods.contains(member) {
          XCTAssertEqual(answer, .error(denied), "\(name) (\(member)) through the forward")
        } else if door != .forward {
          XCTAssertNotEqual(answer, .error("org.tessera.Broker1.Error.Internal"), "\(name) through \(door)")
        }
      }
    }
    XCTAssertGreaterThan(answered, 30, "the seeds reach the server's doors")
    // The fuzzer's own choice of door: seeds written for the sandboxed and forward doors go there,
    // and a sandboxed app may not manage grants.
    for (name, bytes) in inputs("corpus", .bus) {
      let door = FuzzBus.door(bytes)
      XCTAssertEqual(
        door, name.hasPrefix("forward-") ? .forward : name.hasPrefix("sandboxed-") ? .sandboxed : .identified, name)
    }
    let grant = try? XCTUnwrap(inputs("corpus", .bus).first { $0.0 == "sandboxed-grant" }?.1)
    XCTAssertEqual(grant.flatMap { FuzzBus.answer($0, through: FuzzBus.door($0)) }, .error(denied))
  }

  /// Issue 37 §19: FuzzStore reaches the file store's load and its key check: a directory sealed
  /// with the key loads its records, one whose key check does not open is refused (nothing
  /// opens), and a damaged record beside good ones is set aside.
  func testTheStoreDirectoryInputsReachTheLoadAndTheKeyCheck() throws {
    let keys = FuzzStore.keys
    let check = try FileStore.seal(
      FileStore.keyCheckText, aad: FileStore.aad(FileStore.keyCheckName), keys.seal)
    let attributes = ["tessera_schema": "1", "kind": "account", "account_id": "a"]
    let name = FileStore.name(attributes, keys)
    let plain = Array(
      #"{"attributes":{"account_id":"a","kind":"account","tessera_schema":"1"},"label":"l","secret":"{}"}"#.utf8)
    let record = try FileStore.seal(plain, aad: FileStore.aad(name), keys.seal)
    let separator = Array("\n--\n".utf8)
    let good = check + separator + Array((name + "\n").utf8) + record
    XCTAssertEqual(FuzzStore.load(good.sections()), "1 items")
    XCTAssertEqual(FuzzStore.load((good + separator + Array("damaged".utf8)).sections()), "1 items")
    XCTAssertEqual(
      FuzzStore.load((Array("not sealed".utf8) + separator + Array("x".utf8)).sections()), "StoreUnavailable")
    XCTAssertEqual(FuzzStore.load([]), "0 items", "a new store")
    XCTAssertEqual(FuzzStore.load([[]]), "StoreUnavailable", "an empty key check is one that does not open")
    // And the fuzzer's own entry reaches it: selector 4.
    FuzzStore.run([4] + good)
  }

  /// The Microsoft seeds are answered as MSAL expects: a silent request for alice from the cache.
  func testTheMicrosoftSilentSeedIsServedFromTheCache() throws {
    let bytes = try XCTUnwrap(inputs("corpus", .microsoft).first { $0.0 == "silent-alice" }?.1)
    let answer = LockedText()
    blocking { answer.set(await FuzzMicrosoftFront.run(bytes)) }
    XCTAssertTrue(answer.value.contains(#""accessToken":"at-1""#), answer.value)
  }
}

final class LockedFlag: @unchecked Sendable {
  private let lock = NSLock()
  private var flag = false
  func set(_ value: Bool) { lock.withLock { flag = value } }
  var value: Bool { lock.withLock { flag } }
}

final class LockedText: @unchecked Sendable {
  private let lock = NSLock()
  private var text = ""
  func set(_ value: String) { lock.withLock { text = value } }
  var value: String { lock.withLock { text } }
}
