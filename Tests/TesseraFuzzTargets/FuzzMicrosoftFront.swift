import TesseraCore
import TesseraEngineFakes
import TesseraInterface

/// com.microsoft.identity.broker1's requests answered whole: the first byte chooses one of the
/// eight methods (or a name that is none of them) and the protocol version sent; the rest is the
/// requestJson. Each input meets a fresh engine wired to its fakes, holding alice's account (signed
/// in once, then copied), so a silent request can be served from the cache, refreshed at the fake
/// provider, or refused, and every answer must be the protocol's JSON.
enum FuzzMicrosoftFront {
  static let methods = MicrosoftBrokerInterface.MethodName.allCases.map(\.rawValue) + ["acquireTokenSilentlyy"]
  static let versions = ["0.0", "1.0", "", "9.9", "0.0\u{0}"]

  /// alice's stored items after one sign-in through the native front.
  static let signedIn = Locked<[StoredItem]?>(nil)

  static func items() async -> [StoredItem] {
    if let items = signedIn.withLock({ $0 }) { return items }
    let harness = await Harness(logger: quiet)
    _ = try? await harness.signIn()
    let items = harness.store.items.withLock { $0 }
    precondition(!items.isEmpty, "the fuzz target's sign-in stored nothing")
    signedIn.withLock { $0 = items }
    return items
  }

  /// The answer's JSON (the replay tests check what the seeds get).
  @discardableResult
  static func run(_ input: [UInt8]) async -> String {
    guard let (selector, bytes) = input.selector else { return "" }
    let stored = await items()
    let harness = await Harness(logger: quiet)
    harness.store.items.withLock { $0 = stored }
    let front = MicrosoftFront(broker: harness.broker, logger: quiet, clock: harness.clock)
    let method = methods[Int(selector) % methods.count]
    let version = versions[Int(selector) / methods.count % versions.count]
    let text = String(decoding: bytes, as: UTF8.self)
    let arguments: [BusValue] = [.string(version), .string("6f2a3c1e-0d4b-4e43-9a57-3d1f0e8c2b71"), .string(text)]
    let answer = await front.handle(method: method, arguments: arguments, caller: caller)
    // The same request again, as the bus thread answers a repeated silent request: from the reply
    // the first answer published, if it did.
    _ = front.answerAtOnce(method: method, arguments: arguments, caller: caller)
    _ = try? MicrosoftRequest.parse(text, allowEmpty: selector % 2 == 0)
    return answer
  }

  static let caller = CallerInfo(busName: ":1.77")
}
