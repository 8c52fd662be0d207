import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// The access rules as a value, without the token actor: what the grants and the mode decide,
/// what the user's recent answers hold back, who may see and sign out what, and the audit.
final class AccessPolicyTests: XCTestCase {
  let mail = AppIdentity(kind: .flatpak, id: "org.example.Mail")
  let tool = AppIdentity(kind: .executable, id: "/usr/bin/tool")
  let now = Date(timeIntervalSince1970: 1_800_000_000)

  func request(
    _ app: AppIdentity?, clientID: String = "app1", accountID: String = "acct1", scopes: [String] = ["read"],
    operation: AccessGrant.Operation = .token
  ) -> AccessRequest {
    AccessRequest(
      caller: CallerInfo(busName: ":1.5", pid: 5, uid: 1000, app: app), clientID: clientID, accountID: accountID,
      username: "alice@idp.test", scopes: scopes, authority: "https://idp.test", operation: operation)
  }

  func cache(grants: [AccessGrant]) -> TokenCache {
    var cache = TokenCache()
    for grant in grants { _ = cache.upsert(grant: grant) }
    return cache
  }

  func grant(_ app: AppIdentity, clientID: String = "app1", scopes: [String]? = nil) -> AccessGrant {
    AccessGrant(app: app.key, clientID: clientID, accountID: "acct1", grantedAt: 0, via: "sign-in", scopes: scopes)
  }

  func testAGrantAllowsInEveryModeAndOnlyWithinItsScopes() {
    let granted = cache(grants: [grant(mail, scopes: ["read"])])
    for mode in AccessMode.allCases {
      let policy = AccessPolicy(mode: mode)
      XCTAssertEqual(
        policy.decide(request(mail), grants: granted, canAsk: true), .allow(reason: "grant", noteUse: true), "\(mode)")
    }
    // A scope the grant does not name is not covered; OpenID Connect's own always are.
    let wider = request(mail, scopes: ["read", "write"])
    XCTAssertEqual(AccessPolicy(mode: .strict).decide(wider, grants: granted, canAsk: true), .refuse)
    XCTAssertEqual(
      AccessPolicy(mode: .strict).decide(request(mail, scopes: ["read", "openid"]), grants: granted, canAsk: true),
      .allow(reason: "grant", noteUse: true))
  }

  func testWithoutAGrantEachModeDecidesItsOwnWay() {
    let empty = cache(grants: [grant(mail)])
    XCTAssertEqual(
      AccessPolicy(mode: .open).decide(request(tool), grants: empty, canAsk: true),
      .allow(reason: "open mode", noteUse: true))
    XCTAssertEqual(
      AccessPolicy(mode: .open).decide(request(nil), grants: empty, canAsk: true),
      .allow(reason: "open mode", noteUse: false), "an unidentified caller's use is not repeated by the bus thread")
    XCTAssertEqual(AccessPolicy(mode: .confirm).decide(request(tool), grants: empty, canAsk: true), .ask)
    XCTAssertEqual(AccessPolicy(mode: .confirm).decide(request(tool), grants: empty, canAsk: false), .refuse)
    XCTAssertEqual(
      AccessPolicy(mode: .confirm).decide(request(nil), grants: empty, canAsk: true), .refuse,
      "nobody is asked about an app Tessera could not identify")
    XCTAssertEqual(AccessPolicy(mode: .strict).decide(request(tool), grants: empty, canAsk: true), .refuse)
  }

  func testAFirstSignInIsAllowedOnlyForAClientNoOtherAppHolds() {
    let policy = AccessPolicy(mode: .strict)
    let signIn = request(tool, clientID: "free", accountID: AccessGrant.anyAccount, operation: .signIn)
    XCTAssertEqual(
      policy.decide(signIn, grants: cache(grants: [grant(mail)]), canAsk: false),
      .allow(reason: "first use", noteUse: false))
    let held = request(tool, clientID: "app1", accountID: AccessGrant.anyAccount, operation: .signIn)
    XCTAssertEqual(policy.decide(held, grants: cache(grants: [grant(mail)]), canAsk: false), .refuse)
    // An app whose own grant for the client is narrowed signs in only within it.
    let narrowed = cache(grants: [grant(tool, clientID: "app1", scopes: ["read"])])
    XCTAssertEqual(
      policy.decide(request(tool, scopes: ["write"], operation: .signIn), grants: narrowed, canAsk: false), .refuse)
  }

  func testADenialHoldsForTenMinutesAndNoAnswerForOne() {
    var policy = AccessPolicy(mode: .confirm)
    let asked = request(tool)
    XCTAssertEqual(policy.gate(asked, app: tool, now: now), .ask)
    policy.answered(.deny, asked, app: tool, now: now)
    guard case .refuse(let error) = policy.gate(asked, app: tool, now: now.addingTimeInterval(599)) else {
      return XCTFail("a denial is remembered")
    }
    XCTAssertEqual(error.code, .accessDenied)
    XCTAssertTrue(error.message.contains("tessera access grant --app 'exe:/usr/bin/tool' --client-id app1"))
    XCTAssertEqual(policy.gate(asked, app: tool, now: now.addingTimeInterval(601)), .ask)
    // The denial is for that client and account: the same app asking for another is asked.
    XCTAssertEqual(policy.gate(request(tool, clientID: "app2"), app: tool, now: now), .ask)

    policy.answered(nil, request(mail), app: mail, now: now)
    XCTAssertEqual(policy.gate(request(mail), app: mail, now: now.addingTimeInterval(59)), .skip)
    XCTAssertEqual(policy.gate(request(mail), app: mail, now: now.addingTimeInterval(61)), .ask)
  }

  func testTheUsersAnswersKeepTheirLengthWhenTheClockIsSet() {
    var policy = AccessPolicy(mode: .confirm)
    policy.answered(.deny, request(tool), app: tool, now: now)
    policy.clockSet(by: -3600)
    let later = now.addingTimeInterval(-3600 + 300)
    guard case .refuse = policy.gate(request(tool), app: tool, now: later) else {
      return XCTFail("five minutes after the denial, by the set clock, it still holds")
    }
  }

  func testTheRefusalNamesTheAppAndTheCommandThatGrantsIt() {
    let refusal = AccessPolicy(mode: .confirm).refusal(request(tool), heldByOther: true)
    XCTAssertEqual(refusal.code, .accessDenied)
    XCTAssertTrue(refusal.message.hasPrefix("/usr/bin/tool (unverified) has no grant"), refusal.message)
    XCTAssertTrue(refusal.message.contains("which another app uses"))
    XCTAssertTrue(refusal.message.contains("To allow it, run: tessera access grant --app 'exe:/usr/bin/tool'"))
    XCTAssertTrue(refusal.message.contains("No desktop prompt could ask you"))
    let unidentified = AccessPolicy(mode: .strict).refusal(request(nil), heldByOther: false)
    XCTAssertFalse(unidentified.message.contains("tessera access grant"), "no key to grant")
  }

  func testWhoMaySeeSignOutAndManage() throws {
    let grants = [grant(mail)]
    let account = Account(
      id: "acct1", username: "alice@idp.test", name: "Alice", authority: "https://idp.test", environment: "idp.test",
      realm: "r", localAccountID: "sub")
    let strict = AccessPolicy(mode: .strict)
    XCTAssertEqual(strict.visibleAccountIDs(request(mail).caller, grants: grants), ["acct1"])
    XCTAssertEqual(strict.visibleAccountIDs(request(tool).caller, grants: grants), [])
    XCTAssertNil(AccessPolicy(mode: .open).visibleAccountIDs(request(tool).caller, grants: grants))
    XCTAssertNil(strict.visibleAccountIDs(nil, grants: grants), "the daemon's own requests see everything")

    XCTAssertNoThrow(try strict.checkSignOut(request(mail).caller, account: account, clientID: nil, grants: grants))
    XCTAssertThrowsError(
      try strict.checkSignOut(request(tool).caller, account: account, clientID: "app1", grants: grants))
    XCTAssertThrowsError(try strict.checkSignOut(request(tool).caller, account: account, clientID: nil, grants: grants))

    XCTAssertNoThrow(try AccessPolicy.checkMayManage(request(tool).caller))
    XCTAssertThrowsError(try AccessPolicy.checkMayManage(request(mail).caller), "a sandboxed app may not grant itself")
    XCTAssertThrowsError(try AccessPolicy.checkMayManage(request(nil).caller))
  }

  func testTheAuditCountsPerAppAndKeepsTheLastThousand() {
    var policy = AccessPolicy(mode: .open)
    for i in 0..<1005 {
      _ = policy.record(i.isMultiple(of: 2) ? .allowed : .refused, request(tool), reason: "open mode", at: Int64(i))
    }
    XCTAssertEqual(policy.record(.allowed, request(mail), reason: "grant", at: 2000), 1)
    XCTAssertEqual(policy.log.records.count, AuditLog.capacity)
    let last = try! XCTUnwrap(policy.log.records.last?.info)
    XCTAssertEqual(last.appKey, mail.key)
    XCTAssertEqual(last.decision, "allowed")
    XCTAssertEqual(policy.log.records.dropLast().last?.count, 1005, "the tool's count went on past the log's size")
  }
}

/// A forward's callers (`tessera forward`, issue 24): tokens by the mode's rules, nothing else
/// whatever the mode or the grants say.
final class ForwardAccessPolicyTests: XCTestCase {
  let forward = AppIdentity.forward("build01", host: "build01.example", path: "/run/user/0/tessera/forward/build01")

  func request(_ operation: AccessGrant.Operation) -> AccessRequest {
    AccessRequest(
      caller: CallerInfo(busName: ":direct.3", pid: 5, uid: 1000, app: forward), clientID: "app1", accountID: "acct1",
      username: "alice@idp.test", scopes: [], authority: "https://idp.test", operation: operation)
  }

  func testAForwardGetsTokensByTheModeAndNeverSignsInEvenWithAGrant() {
    var granted = TokenCache()
    _ = granted.upsert(
      grant: AccessGrant(app: forward.key, clientID: "app1", accountID: "*", grantedAt: 0, via: "user"))
    XCTAssertEqual(
      AccessPolicy(mode: .open).decide(request(.token), grants: TokenCache(), canAsk: true),
      .allow(reason: "open mode", noteUse: true))
    XCTAssertEqual(AccessPolicy(mode: .confirm).decide(request(.token), grants: TokenCache(), canAsk: true), .ask)
    XCTAssertEqual(AccessPolicy(mode: .strict).decide(request(.token), grants: TokenCache(), canAsk: true), .refuse)
    XCTAssertEqual(
      AccessPolicy(mode: .strict).decide(request(.token), grants: granted, canAsk: true),
      .allow(reason: "grant", noteUse: true))
    for mode in AccessMode.allCases {
      for operation in [AccessGrant.Operation.signIn, .listAccounts, .signOut] {
        XCTAssertEqual(
          AccessPolicy(mode: mode).decide(request(operation), grants: granted, canAsk: true), .refuse,
          "\(mode) \(operation)")
      }
    }
    let refusal = AccessPolicy(mode: .open).refusal(request(.signIn), heldByOther: false)
    XCTAssertTrue(refusal.message.contains("may only get tokens"), refusal.message)
    XCTAssertTrue(refusal.message.contains("tessera login"), refusal.message)
  }

  /// Issue 37 §8: `tessera forward other-host --name build01` does not inherit build01's grants:
  /// confirm mode asks again, strict mode refuses and says the name was granted for another host.
  func testANameForwardedToAnotherHostIsAskedAboutAgainAndRefusedInStrictMode() {
    var granted = TokenCache()
    _ = granted.upsert(
      grant: AccessGrant(app: forward.key, clientID: "app1", accountID: "*", grantedAt: 0, via: "user"))
    let elsewhere = AppIdentity.forward("build01", host: "other-host", path: "/run/user/0/tessera/forward/build01")
    var request = request(.token)
    request.caller.app = elsewhere
    XCTAssertEqual(AccessPolicy(mode: .confirm).decide(request, grants: granted, canAsk: true), .ask)
    XCTAssertEqual(AccessPolicy(mode: .strict).decide(request, grants: granted, canAsk: true), .refuse)
    XCTAssertEqual(granted.otherForwardHosts(of: elsewhere), ["build01.example"])
    XCTAssertEqual(granted.otherForwardHosts(of: forward), [])
    let refusal = AccessPolicy(mode: .strict).refusal(
      request, heldByOther: false, otherForwardHosts: granted.otherForwardHosts(of: elsewhere))
    XCTAssertTrue(
      refusal.message.contains("The forward name build01 was granted for build01.example, not for other-host"),
      refusal.message)
    XCTAssertTrue(refusal.message.contains("--app 'forward:build01@other-host'"), refusal.message)
    // A grant made before hosts were recorded (`forward:build01`) serves no ssh forward either.
    var old = TokenCache()
    _ = old.upsert(
      grant: AccessGrant(app: "forward:build01", clientID: "app1", accountID: "*", grantedAt: 0, via: "user"))
    XCTAssertEqual(AccessPolicy(mode: .strict).decide(self.request(.token), grants: old, canAsk: true), .refuse)
    XCTAssertEqual(old.otherForwardHosts(of: forward), ["no host recorded"])
  }

  func testAForwardSeesOnlyGrantedAccountsInOpenModeToo() throws {
    let caller = CallerInfo(busName: ":direct.3", app: forward)
    let grants = [AccessGrant(app: forward.key, clientID: "app1", accountID: "acct1", grantedAt: 0, via: "user")]
    XCTAssertEqual(AccessPolicy(mode: .open).visibleAccountIDs(caller, grants: grants), ["acct1"])
    XCTAssertEqual(AccessPolicy(mode: .open).visibleAccountIDs(caller, grants: []), [])
    // Other apps in open mode still see every account.
    XCTAssertNil(
      AccessPolicy(mode: .open).visibleAccountIDs(
        CallerInfo(busName: ":1.4", app: AppIdentity(kind: .executable, id: "/usr/bin/tool")), grants: []))
    XCTAssertThrowsError(try AccessPolicy.checkMayManage(caller)) { error in
      XCTAssertTrue("\(error)".contains("may only get tokens"), "\(error)")
    }
    let account = Account(
      id: "acct1", username: "alice@idp.test", name: "Alice", authority: "https://idp.test", environment: "idp.test",
      realm: "r", localAccountID: "sub")
    XCTAssertThrowsError(
      try AccessPolicy(mode: .open).checkSignOut(caller, account: account, clientID: nil, grants: grants))
  }
}
