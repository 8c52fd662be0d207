import Logging
import TesseraEngineFakes
import XCTest

@testable import TesseraCore
@testable import TesseraInterface

/// A reload puts a new configuration in force without dropping what the broker holds (issue 26).
final class ReloadTests: XCTestCase {
  func effective(_ change: (inout BrokerConfig) -> Void, policy: ConfigPolicy = ConfigPolicy()) -> EffectiveConfig {
    var config = BrokerConfig.fakeIdP
    config.accessMode = .open
    config.notifyFirstUse = false
    change(&config)
    return EffectiveConfig(config: config, policy: policy, files: ["/etc/tessera/config.toml"])
  }

  func testAReloadKeepsTheCachedTokenAndAppliesTheNewTrustAtTheNextRequest() async throws {
    let h = await Harness()
    try await h.signIn()
    let first = try await h.broker.acquireTokenSilent(try h.request())
    let requests = h.idp.tokenRequests.count
    let started = await h.broker.config
    // Still trusted, and the log level changes: the cached token answers, nothing is asked.
    let outcome = await h.broker.reload(effective { $0.logLevel = "debug" }, started: started)
    XCTAssertEqual(outcome.applied, [.logLevel])
    let again = try await h.broker.acquireTokenSilent(try h.request())
    XCTAssertEqual(again["access_token"], first["access_token"])
    XCTAssertEqual(h.idp.tokenRequests.count, requests)
    // No longer trusted: refused at once, although its token is cached; the account stays.
    await h.broker.reload(effective { $0.trustedAuthorities = ["https://other.test"] }, started: started)
    do {
      _ = try await h.broker.acquireTokenSilent(try h.request())
      XCTFail("served a token of an authority config.toml no longer trusts")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .untrustedAuthority)
    }
    let accounts = try await h.broker.accounts(matching: AccountFilter())
    XCTAssertEqual(accounts.count, 1)
    // Trusted again: the same cached token, still no request.
    await h.broker.reload(effective { _ in }, started: started)
    let back = try await h.broker.acquireTokenSilent(try h.request())
    XCTAssertEqual(back["access_token"], first["access_token"])
    XCTAssertEqual(h.idp.tokenRequests.count, requests)
  }

  func testStoreAndMicrosoftBrokerChangesWaitForTheNextStartAndStatusSaysSo() async throws {
    let h = await Harness()
    let started = await h.broker.config
    let outcome = await h.broker.reload(
      effective {
        $0.store = .only(.memory)
        $0.microsoftBroker = false
        $0.accessMode = .strict
      }, started: started)
    XCTAssertEqual(outcome.atNextStart, [.store, .microsoftBroker])
    XCTAssertEqual(outcome.applied, [.accessMode])
    let status = try await h.broker.status()
    XCTAssertEqual(status.config?.atNextStart, ["store", "microsoft_broker"])
    XCTAssertEqual(status.config?.reloads, 1)
    XCTAssertNil(status.config?.refused)
    // Through the bus value and back, as `tessera status` reads it.
    XCTAssertEqual(StatusReport.Report(busValue: status.busValue).config, status.config)
  }

  func testStatusSaysWhetherTesseradHasASessionBusAndWhyNot() async throws {
    let h = await Harness()
    var status = try await h.broker.status()
    XCTAssertNil(status.sessionBus, "not known until the bus server has started")
    XCTAssertNil(status.busValue[StatusReport.sessionBusKey])
    await h.broker.noteSessionBus(missing: "Could not connect to the session bus (ENOENT)")
    status = try await h.broker.status()
    XCTAssertEqual(status.sessionBus, .missing("Could not connect to the session bus (ENOENT)"))
    XCTAssertEqual(StatusReport.Report(busValue: status.busValue).sessionBus, status.sessionBus)
    await h.broker.noteSessionBus(missing: nil)
    status = try await h.broker.status()
    XCTAssertEqual(StatusReport.Report(busValue: status.busValue).sessionBus, .connected)
  }

  func testAStoreInUseThatANewPolicyForbidsIsReportedWithWhatToRun() async throws {
    let h = await Harness()
    var policy = ConfigPolicy()
    policy.allowedStores = [.file]
    policy.files = ["/etc/tessera/config.toml"]
    // The harness's store says it is the Secret Service.
    await h.broker.reload(effective({ _ in }, policy: policy), started: await h.broker.config)
    let warnings = try await h.broker.status().config?.warnings ?? []
    XCTAssertEqual(
      warnings,
      [
        "the store in use (secret-service) is not among the administrator's allowed_stores ([policy] in /etc/tessera/config.toml): `tessera store migrate --to file` moves everything to an allowed one"
      ])
  }

  func testARefusedReloadKeepsTheConfigurationAndIsReportedUntilOneSucceeds() async throws {
    let h = await Harness()
    let before = await h.broker.config
    await h.broker.refuseReload(["/home/ann/.config/tessera/config.toml:3: key 'log_levl': unknown key"])
    let config = await h.broker.config
    XCTAssertEqual(config, before)
    var status = try await h.broker.status()
    XCTAssertEqual(
      status.config?.refused?.problems, ["/home/ann/.config/tessera/config.toml:3: key 'log_levl': unknown key"])
    XCTAssertEqual(StatusReport.Report(busValue: status.busValue).config?.refused, status.config?.refused)
    await h.broker.reload(effective { _ in }, started: before)
    status = try await h.broker.status()
    XCTAssertNil(status.config?.refused)
  }

  func testAReloadClearsWhatTheBusThreadWouldAnswerAndDecidesAgainUnderTheNewMode() async throws {
    let h = await Harness()
    try await h.signIn()
    let handler = TesseraFront(broker: h.broker, logger: Logger(label: "test"), clock: h.clock)
    let caller = CallerInfo(busName: ":1.7", app: AppIdentity(kind: .executable, id: "/usr/bin/curl"))
    let arguments: [BusValue] = [.string(""), .strings([]), .string(""), .dict([:])]
    _ = await handler.handle(method: "AcquireTokenSilent", arguments: arguments, caller: caller)
    guard
      case .success? = handler.answerAtOnce(method: "AcquireTokenSilent", arguments: arguments, caller: caller)?.values
    else { return XCTFail("open mode: the repeat is answered on the bus thread") }
    // Strict now: the bus thread has nothing to answer, and the full path refuses the app.
    await h.broker.reload(effective { $0.accessMode = .strict }, started: await h.broker.config)
    XCTAssertNil(handler.answerAtOnce(method: "AcquireTokenSilent", arguments: arguments, caller: caller))
    guard
      case .failure(let error) = await handler.handle(
        method: "AcquireTokenSilent", arguments: arguments, caller: caller)
    else { return XCTFail("an app without a grant got a token in strict mode") }
    XCTAssertEqual(error.code, .accessDenied)
    XCTAssertNil(handler.answerAtOnce(method: "AcquireTokenSilent", arguments: arguments, caller: caller))
  }

  /// Forwards of the socket, recorded.
  final class FakeForwards: ForwardListeners, Sendable {
    let open = Locked<[String]>([])
    let closed = Locked<[String: String]>([:])

    func open(name: String, host: String, path: String, lasting: Bool, owner: CallerInfo) async throws -> String {
      open.withLock { $0.append(name) }
      return "/run/user/1000/tessera/forward/" + name
    }
    func close(name: String, reason: String) async -> Bool {
      let was = open.withLock { names -> Bool in
        guard let index = names.firstIndex(of: name) else { return false }
        names.remove(at: index)
        return true
      }
      if was { closed.withLock { $0[name] = reason } }
      return was
    }
    func list() async -> [ForwardInfo] {
      open.withLock { $0 }.map {
        ForwardInfo(name: $0, host: "build01", path: "/f/" + $0, lasting: true, since: 0, connections: 0, ownerPID: nil)
      }
    }
  }

  func testForwardsAreRefusedAndTheOpenOnesClosedWhenThePolicyForbidsThem() async throws {
    let h = await Harness()
    let forwards = FakeForwards()
    let broker = Broker(
      config: await h.broker.config,
      dependencies: BrokerDependencies(
        http: h.idp, store: h.store, browser: NoBrowser(), listeners: h.listeners, events: h.events, clock: h.clock,
        forwards: forwards),
      logger: Logger(label: "test"))
    let front = TesseraFront(broker: broker, logger: Logger(label: "test"), clock: h.clock)
    let me = CallerInfo(busName: ":1.9", uid: 1000, app: AppIdentity(kind: .executable, id: "/usr/bin/tessera"))
    let add: [BusValue] = [.string("build01"), .string("build01.example.com"), .string(""), .dict([:])]
    guard case .success = await front.handle(method: "AddForward", arguments: add, caller: me) else {
      return XCTFail("a forward was refused without a policy")
    }
    XCTAssertEqual(forwards.open.withLock { $0 }, ["build01"])
    var policy = ConfigPolicy()
    policy.allowForwarding = false
    policy.files = ["/etc/tessera/config.toml"]
    let outcome = await broker.reload(effective({ _ in }, policy: policy), started: await broker.config)
    XCTAssertEqual(outcome.closedForwards, 1)
    XCTAssertEqual(forwards.closed.withLock { $0 }["build01"], Broker.forwardsForbidden)
    let again: [BusValue] = [.string("build02"), .string("build02.example.com"), .string(""), .dict([:])]
    guard case .failure(let error) = await front.handle(method: "AddForward", arguments: again, caller: me) else {
      return XCTFail("a forward was made against the policy")
    }
    XCTAssertEqual(error.code, .accessDenied)
    XCTAssertTrue(error.message.contains("allow_forwarding = false in [policy] of /etc/tessera/config.toml"))
    XCTAssertEqual(forwards.open.withLock { $0 }, [])
  }
}
