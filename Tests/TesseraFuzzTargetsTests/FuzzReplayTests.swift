import Foundation
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
