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
        $0.store = .memory
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

  func testAReloadThatStrictensAccessRefusesAnAppTheFastPathServedBefore() async throws {
    let h = await Harness()
    try await h.signIn()
    let caller = CallerInfo(busName: ":1.7", app: AppIdentity(kind: .executable, id: "/usr/bin/curl"))
    var request = try h.request()
    request.caller = caller
    _ = try await h.broker.silentToken(request)
    await h.broker.reload(effective { $0.accessMode = .strict }, started: await h.broker.config)
    do {
      _ = try await h.broker.silentToken(request)
      XCTFail("an app without a grant got a token in strict mode")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .accessDenied)
    }
  }

  func testForwardsAreRefusedAndClosedWhenThePolicyForbidsThem() async throws {
    let h = await Harness()
    var policy = ConfigPolicy()
    policy.allowForwarding = false
    policy.files = ["/etc/tessera/config.toml"]
    await h.broker.reload(effective({ _ in }, policy: policy), started: await h.broker.config)
    do {
      try await h.broker.checkForwardingAllowed()
      XCTFail("a forward was allowed against the policy")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .accessDenied)
      XCTAssertTrue(error.message.contains("allow_forwarding = false"))
    }
  }
}
