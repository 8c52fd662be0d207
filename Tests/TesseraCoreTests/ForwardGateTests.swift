import Logging
import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// Issue 37 §18: the real gate in TesseraFront, over every method of the contract: a caller that
/// came through a forward may call only the forwarded methods; every other one (MoveStore and
/// AddForward included) is refused before the engine looks at it, and audited.
final class ForwardGateTests: XCTestCase {
  let forward = AppIdentity.forward("build01", host: "build01.example", path: "/run/user/0/tessera/forward/build01")

  /// Well-typed arguments for a method: the gate, not the type check, is what answers.
  static func arguments(_ method: BrokerInterface.MethodName) -> [BusValue] {
    method.spec.inputs.map { argument in
      switch argument.signature {
      case "s": .string("x")
      case "as": .strings([])
      case "a{sv}": .dict([:])
      case "u": .uint32(0)
      case "b": .bool(false)
      default: .other(signature: argument.signature)
      }
    }
  }

  func testEveryMethodButTheForwardedOnesIsRefusedToAForwardAndAudited() async throws {
    let h = await Harness(accessMode: .open)
    try await h.signIn()
    let front = TesseraFront(broker: h.broker, logger: Logger(label: "test"), clock: h.clock)
    let caller = CallerInfo(busName: ":direct.7", pid: 4242, uid: getuid(), app: forward)
    var refused: [String] = []
    for method in BrokerInterface.MethodName.allCases {
      let arguments = Self.arguments(method)
      XCTAssertEqual(arguments.map(\.signature).joined(), method.spec.inputSignature, method.rawValue)
      let result = await front.handle(method: method.rawValue, arguments: arguments, caller: caller)
      let gated: Bool
      if case .failure(let error) = result, error.code == .accessDenied, error.message.contains("may only get tokens") {
        gated = true
        XCTAssertTrue(error.message.contains("build01"), error.message)
      } else {
        gated = false
      }
      XCTAssertEqual(
        gated, !BrokerInterface.forwardedMethods.contains(method.rawValue),
        "\(method.rawValue) through a forward: \(result)")
      if gated { refused.append(method.rawValue) }
    }
    XCTAssertTrue(refused.contains("MoveStore") && refused.contains("AddForward"), "\(refused)")
    // Each refusal is in the access log, as the forward with its host, and the method.
    let log = try await h.broker.accessLog()
    let audited = log.filter { $0.appKey == forward.key && $0.decision == "refused" }.map(\.operation)
    XCTAssertEqual(Set(audited), Set(refused))
    // Nothing the refused calls asked for happened: still signed in, no forward, no grant.
    let accounts = try await h.broker.accounts(matching: AccountFilter())
    XCTAssertEqual(accounts.count, 1)
    let grants = try await h.broker.grantList()
    XCTAssertEqual(grants, [])
  }
}
