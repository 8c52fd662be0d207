import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// Places for interactive sign-ins are shared by apps (executables), not connections.
final class SignInRegistryTests: XCTestCase {
  func caller(_ exe: String, _ connection: Int) -> CallerInfo {
    CallerInfo(busName: ":1.\(connection)", pid: UInt32(connection), uid: 1000, exe: exe)
  }

  /// A sign-in task that waits until cancelled.
  func waiting() -> Task<Broker.TokenResult, any Error> {
    Task {
      try await Task.sleep(nanoseconds: 3_600_000_000_000)
      throw CancellationError()
    }
  }

  func testACancelThatOvertakesItsSignInEndsItWhenItRegisters() throws {
    var registry = SignInRegistry()
    let me = caller("/usr/bin/app", 1)
    // AcquireToken has begun (loading the store, asking about the app); Cancel comes first.
    registry.announce(correlationID: "c1", caller: me.busName)
    XCTAssertThrowsError(try registry.cancel(correlationID: "c1", caller: "someone-else"))
    try registry.cancel(correlationID: "c1", caller: me.busName)
    let task = waiting()
    registry.register(correlationID: "c1", caller: me, task: task)
    XCTAssertTrue(task.isCancelled, "the sign-in ends as soon as it starts")
    // An id nobody announced is still refused.
    XCTAssertThrowsError(try registry.cancel(correlationID: "never", caller: me.busName))
    // A withdrawn announcement (the sign-in failed before it started) is forgotten.
    registry.announce(correlationID: "c2", caller: me.busName)
    XCTAssertFalse(registry.withdraw(correlationID: "c2", caller: me.busName))
    XCTAssertThrowsError(try registry.cancel(correlationID: "c2", caller: me.busName))
  }

  func testOneAppManyConnectionsGetsFourPlaces() throws {
    var registry = SignInRegistry()
    for i in 0..<4 {
      XCTAssertNil(try registry.makeRoom(correlationID: "a\(i)", caller: caller("/usr/bin/attacker", i)))
      registry.register(correlationID: "a\(i)", caller: caller("/usr/bin/attacker", i), task: waiting())
    }
    XCTAssertThrowsError(try registry.makeRoom(correlationID: "a4", caller: caller("/usr/bin/attacker", 99))) {
      XCTAssertEqual(($0 as? TesseraError)?.code, .busy)
    }
    // Another app is not held back by it.
    XCTAssertNil(try registry.makeRoom(correlationID: "t0", caller: caller("/usr/bin/tessera", 100)))
    registry.flows.values.forEach { $0.task.cancel() }
  }

  func testWhenFullANewcomerTakesTheOldestPlaceOfTheBiggestHolder() throws {
    var registry = SignInRegistry()
    var n = 0
    for app in ["a", "b", "c", "d"] {
      for _ in 0..<4 {
        n += 1
        XCTAssertNil(try registry.makeRoom(correlationID: "\(app)\(n)", caller: caller("/\(app)", n)))
        registry.register(correlationID: "\(app)\(n)", caller: caller("/\(app)", n), task: waiting())
      }
    }
    let ended = try XCTUnwrap(try registry.makeRoom(correlationID: "t", caller: caller("/usr/bin/tessera", 100)))
    XCTAssertEqual(ended.correlationID, "a1", "the oldest sign-in of the apps holding the most")
    XCTAssertEqual(ended.held, 4)
    XCTAssertTrue(try XCTUnwrap(registry.remove(correlationID: "a1")).contains("to make room"))
    registry.register(correlationID: "t", caller: caller("/usr/bin/tessera", 100), task: waiting())
    // All 16 are held again. An app holding three cannot push out one holding four…
    XCTAssertThrowsError(try registry.makeRoom(correlationID: "a-again", caller: caller("/a", 1))) {
      XCTAssertEqual(($0 as? TesseraError)?.code, .busy)
      XCTAssertTrue(($0 as! TesseraError).message.contains("All 16"))
    }
    // …but one holding one can: the next oldest of the apps holding four.
    let next = try XCTUnwrap(try registry.makeRoom(correlationID: "t2", caller: caller("/usr/bin/tessera", 100)))
    XCTAssertEqual(next.correlationID, "b5")
    registry.flows.values.forEach { $0.task.cancel() }
  }
}
