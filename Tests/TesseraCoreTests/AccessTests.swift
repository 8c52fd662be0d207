import Logging
import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// Per-application access control in the engine: trust on first sign-in, the three modes, what an
/// app sees and may sign out, and the bus-thread path answering only allowed apps.
final class AccessTests: XCTestCase {
  let first = CallerInfo(
    busName: ":1.10", pid: 10, uid: 1000, app: AppIdentity(kind: .flatpak, id: "org.example.First"))
  let second = CallerInfo(
    busName: ":1.11", pid: 11, uid: 1000, app: AppIdentity(kind: .executable, id: "/usr/bin/second"))

  func signIn(_ h: Harness, as caller: CallerInfo, clientID: String = "") async throws -> [String: BusValue] {
    var request = try h.request(clientID: clientID)
    request.caller = caller
    return try await h.broker.acquireTokenInteractive(request, caller: caller)
  }

  func silent(_ h: Harness, as caller: CallerInfo, clientID: String = "") async throws -> [String: BusValue] {
    var request = try h.request(clientID: clientID)
    request.caller = caller
    return try await h.broker.acquireTokenSilent(request)
  }

  func testStrictModeKeepsASecondAppFromTheFirstAppsTokens() async throws {
    let h = await Harness(accessMode: .strict)
    _ = try await signIn(h, as: first)
    let grants = try await h.broker.grants()
    XCTAssertEqual(grants.map(\.app), ["flatpak:org.example.First"])
    XCTAssertEqual(grants.map(\.via), ["sign-in"])
    _ = try await silent(h, as: first)

    do {
      _ = try await silent(h, as: second)
      XCTFail("the second app got the first app's token")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .accessDenied)
      XCTAssertTrue(error.message.contains("/usr/bin/second (unverified)"), error.message)
      XCTAssertTrue(error.message.contains("tessera access grant --app 'exe:/usr/bin/second'"), error.message)
      XCTAssertFalse(error.message.contains("prompt"), "strict never asks")
    }
    // Its sign-in for the same client is refused too; it sees no account and cannot sign one out.
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.signIn(h, as: self.second) }
    let seen = try await h.broker.knownAccounts(matching: AccountFilter(caller: second))
    XCTAssertEqual(seen, [])
    let accountID = try XCTUnwrap(grants.first?.accountID)
    await XCTAssertThrowsTessera(.accessDenied) {
      try await h.broker.signOut(
        SignOutRequest(accountID: accountID, clientID: nil, correlationID: "c", caller: self.second))
    }

    // Granted by the user: allowed, and answered on the bus thread from then on.
    try await h.broker.grant(app: "exe:/usr/bin/second", clientID: "app1", accountID: "*", caller: nil)
    let token = try await silent(h, as: second)
    XCTAssertNotNil(token["access_token"])
    let arguments: [BusValue] = [.string(""), .strings([]), .string(""), .dict([:])]
    XCTAssertNotNil(h.broker.fastPath.answer(arguments, now: h.clock.now().timeIntervalSince1970, app: second.app?.key))
    XCTAssertNil(
      h.broker.fastPath.answer(arguments, now: h.clock.now().timeIntervalSince1970, app: "exe:/usr/bin/third"),
      "another app is never answered from the bus thread's cache")
    // Revoked: refused again, also on the bus thread.
    let removed = try await h.broker.revoke(app: "exe:/usr/bin/second", clientID: nil, caller: nil)
    XCTAssertEqual(removed, 1)
    XCTAssertNil(h.broker.fastPath.answer(arguments, now: h.clock.now().timeIntervalSince1970, app: second.app?.key))
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.silent(h, as: self.second) }
  }

  func testRevokingOneAccountKeepsTheAppsOtherAccounts() async throws {
    let h = await Harness(accessMode: .open)
    let aliceResult = try await h.signIn()
    h.idp.subject.withLock { $0 = "bob-sub" }
    let bobResult = try await h.signIn()
    let alice = try XCTUnwrap(aliceResult["account"]?.dictValue?["id"]?.stringValue)
    let bob = try XCTUnwrap(bobResult["account"]?.dictValue?["id"]?.stringValue)
    XCTAssertNotEqual(alice, bob)
    for account in [alice, bob, "*"] {
      try await h.broker.grant(app: "exe:/usr/bin/second", clientID: "app1", accountID: account, caller: nil)
    }
    XCTAssertEqual(h.events.management.withLock { $0 }, [.grants, .grants, .grants])

    let removed = try await h.broker.revoke(app: "exe:/usr/bin/second", clientID: nil, accountID: bob, caller: nil)
    XCTAssertEqual(removed, 1)
    let left = try await h.broker.grants().filter { $0.app == "exe:/usr/bin/second" }.map(\.accountID)
    XCTAssertEqual(Set(left), [alice, "*"], "bob's grant went; alice's and the every-account grant stay")
    XCTAssertEqual(h.events.management.withLock { $0 }.count, 4, "the revoke is announced")

    // Nothing to revoke: no announcement; a name that is no account: named error.
    let none = try await h.broker.revoke(app: "exe:/usr/bin/second", clientID: nil, accountID: bob, caller: nil)
    XCTAssertEqual(none, 0)
    XCTAssertEqual(h.events.management.withLock { $0 }.count, 4)
    await XCTAssertThrowsTessera(.noSuchAccount) {
      _ = try await h.broker.revoke(app: "exe:/usr/bin/second", clientID: nil, accountID: "carol", caller: nil)
    }
    // A sandboxed app may not revoke, for one account either.
    await XCTAssertThrowsTessera(.accessDenied) {
      _ = try await h.broker.revoke(app: "exe:/usr/bin/second", clientID: nil, accountID: alice, caller: self.first)
    }
  }

  func testASandboxedAppMayNotGrantItself() async throws {
    let h = await Harness(accessMode: .strict)
    _ = try await signIn(h, as: first)
    await XCTAssertThrowsTessera(.accessDenied) {
      try await h.broker.grant(app: "flatpak:org.example.First", clientID: "other", accountID: "*", caller: self.first)
    }
    await XCTAssertThrowsTessera(.invalidArgument) {
      try await h.broker.grant(app: "not a key", clientID: "app1", accountID: "*", caller: nil)
    }
  }

  func testOpenModeAllowsAndAuditsAndConfirmModeSaysHowToGrant() async throws {
    let open = await Harness(accessMode: .open)
    _ = try await signIn(open, as: first)
    _ = try await silent(open, as: second)
    let log = try await open.broker.accessLog().map(\.busValue)
    XCTAssertTrue(
      log.contains { $0["reason"] == .string("open mode") && $0["app_key"] == .string("exe:/usr/bin/second") })
    XCTAssertFalse(log.contains { record in record.values.contains { "\($0)".contains("at-") } }, "no token in the log")

    let confirm = await Harness(accessMode: .confirm)
    _ = try await signIn(confirm, as: first)
    do {
      _ = try await silent(confirm, as: second)
      XCTFail("confirm mode let an app through without asking")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .accessDenied)
      XCTAssertTrue(error.message.contains("No desktop prompt"), error.message)
    }
  }

  func testTokensFromBeforeAnyGrantCannotBeClaimedByAFirstSignIn() async throws {
    // An upgraded install: tokens exist, no app holds a grant (the daemon's own sign-in stands
    // for the one made before access control existed).
    let h = await Harness(accessMode: .strict)
    _ = try await h.broker.signIn(try h.request(), caller: CallerInfo(busName: ""))
    let grants = try await h.broker.grants()
    XCTAssertEqual(grants, [])
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.signIn(h, as: self.second) }
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.silent(h, as: self.second) }
    // The user grants it; its own later sign-ins for that client are then allowed.
    try await h.broker.grant(app: "exe:/usr/bin/second", clientID: "app1", accountID: "*", caller: nil)
    _ = try await signIn(h, as: second)
  }

  func testAnUnidentifiedOrSandboxedCallerCannotReadOrChangeGrants() async throws {
    let h = await Harness(accessMode: .confirm)
    let nobody = CallerInfo(busName: ":1.99", pid: 99, uid: 1000, app: nil)
    await XCTAssertThrowsTessera(.accessDenied) {
      try await h.broker.grant(app: "exe:/usr/bin/x", clientID: "app1", accountID: "*", caller: nobody)
    }
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await h.broker.grantList(caller: self.first) }
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await h.broker.accessLog(caller: nobody) }
    _ = try await h.broker.grantList(caller: second)
  }

  /// The user's answers, scripted; `hold` keeps a question on screen until released.
  final class FakePrompter: AccessPrompter, @unchecked Sendable {
    let answers = Locked<[AccessAnswer?]>([])
    let asked = Locked<[AccessQuestion]>([])
    let hold = Locked<CheckedContinuation<Void, Never>?>(nil)
    let holding: Bool
    init(_ answers: [AccessAnswer?], holding: Bool = false) {
      self.answers.withLock { $0 = answers }
      self.holding = holding
    }
    func ask(_ question: AccessQuestion) async -> AccessAnswer? {
      asked.withLock { $0.append(question) }
      if holding { await withCheckedContinuation { c in hold.withLock { $0 = c } } }
      return answers.withLock { $0.isEmpty ? nil : $0.removeFirst() }
    }
    func release() {
      hold.withLock {
        $0?.resume(); $0 = nil
      }
    }
  }

  func testConfirmModeAsksOnceAndRemembersTheAnswer() async throws {
    let prompter = FakePrompter([.allowAlways, .deny])
    let h = await Harness(accessMode: .confirm, prompter: prompter)
    _ = try await signIn(h, as: first)
    _ = try await silent(h, as: second)  // asked: Always allow
    _ = try await silent(h, as: second)  // granted now: not asked again
    XCTAssertEqual(prompter.asked.withLock { $0.count }, 1)
    XCTAssertEqual(prompter.asked.withLock { $0.first?.app }, second.app)
    let grants = try await h.broker.grants()
    XCTAssertTrue(grants.contains { $0.app == "exe:/usr/bin/second" && $0.via == "user" })

    let third = CallerInfo(
      busName: ":1.12", pid: 12, uid: 1000, app: AppIdentity(kind: .desktop, id: "org.example.Third"))
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.silent(h, as: third) }  // Deny
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.silent(h, as: third) }  // not asked again
    XCTAssertEqual(prompter.asked.withLock { $0.count }, 2)
    h.clock.advance(601)
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.silent(h, as: third) }  // asked: no answer
    XCTAssertEqual(prompter.asked.withLock { $0.count }, 3)
    // Unanswered: an app calling in a loop is asked once a minute, not once per call.
    for _ in 0..<5 { await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.silent(h, as: third) } }
    XCTAssertEqual(prompter.asked.withLock { $0.count }, 3)
    h.clock.advance(61)
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.silent(h, as: third) }
    XCTAssertEqual(prompter.asked.withLock { $0.count }, 4)
  }

  func testAQuestionOnScreenBlocksNobodyElse() async throws {
    let prompter = FakePrompter([.allowOnce], holding: true)
    let h = await Harness(accessMode: .confirm, prompter: prompter)
    _ = try await signIn(h, as: first)
    var asking = try h.request()
    asking.caller = second
    let request2 = asking
    let waiting = Task { try await h.broker.acquireTokenSilent(request2) }
    while prompter.asked.withLock({ $0.isEmpty }) { await Task.yield() }
    // The first app goes on while the second app's question waits.
    var request = try h.request(options: ["force_refresh": .bool(true)])
    request.caller = first
    _ = try await h.broker.acquireTokenSilent(request)
    prompter.release()
    _ = try await waiting.value  // Allow once
    let grants = try await h.broker.grants()
    XCTAssertFalse(grants.contains { $0.app == "exe:/usr/bin/second" }, "once is not always")
  }

  func testAppKeysRoundTrip() {
    for app in [
      AppIdentity(kind: .flatpak, id: "org.example.App"), AppIdentity(kind: .snap, id: "firefox.firefox"),
      AppIdentity(kind: .desktop, id: "org.gnome.Evolution"),
      AppIdentity(kind: .executable, id: "/home/a/bin/tool", fileID: "2049:131"),
      AppIdentity(kind: .executable, id: "/usr/bin/git"),
    ] {
      XCTAssertEqual(AppIdentity(key: app.key), app, app.key)
    }
    XCTAssertNil(AppIdentity(key: "exe:relative"))
    XCTAssertNil(AppIdentity(key: "other:x"))
    XCTAssertNil(AppIdentity(key: "flatpak:a\nb"))
    // A forward is its name and the host it leads to (issue 37): the same name forwarded to
    // another host is another app. A container's socket has no host.
    let forward = AppIdentity.forward(
      "build01", host: "ann@build01.example", path: "/run/user/0/tessera/forward/build01")
    XCTAssertEqual(forward.key, "forward:build01@ann@build01.example")
    XCTAssertEqual(AppIdentity(key: forward.key), forward)
    XCTAssertEqual(AppIdentity(key: forward.key)?.display, "build01 (forwarded over ssh to ann@build01.example)")
    XCTAssertNotEqual(AppIdentity.forward("build01", host: "other-host", path: "/p").key, forward.key)
    let container = AppIdentity.forward("devbox", host: nil, path: "/run/devbox.sock")
    XCTAssertEqual(container.key, "forward:devbox")
    XCTAssertEqual(AppIdentity(key: container.key)?.forwardHost, nil)
    XCTAssertEqual(AppIdentity(key: "forward:b@[::1]:22")?.forwardHost, "[::1]:22")
    for bad in [
      "forward:", "forward:.hidden", "forward:a b", "forward:a/b", "forward:" + String(repeating: "x", count: 65),
      "forward:b@", "forward:b@-oProxyCommand=x", "forward:b@host name", "forward:b@h'q", "forward:@host",
    ] {
      XCTAssertNil(AppIdentity(key: bad), bad)
    }
  }

  // MARK: Narrowed grants, first use, hidden accounts

  func testAGrantNarrowedToScopesAndOperationsCoversOnlyThose() async throws {
    let h = await Harness(accessMode: .strict)
    let signedIn = try await signIn(h, as: first)
    guard case .dict(let account)? = signedIn["account"], case .string(let accountID)? = account["id"] else {
      return XCTFail("no account in \(signedIn)")
    }
    // Another scope than the one asked for: not covered.
    try await h.broker.grant(
      app: "exe:/usr/bin/second", clientID: "app1", accountID: "*", scopes: ["write"], caller: nil)
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.silent(h, as: self.second) }
    // Another authority: not covered either.
    try await h.broker.grant(
      app: "exe:/usr/bin/second", clientID: "app1", accountID: "*", authority: "https://idp.test/another-tenant",
      scopes: ["read"], caller: nil)
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.silent(h, as: self.second) }
    // That scope, tokens only: it gets tokens, but sees no account and may not sign one out.
    try await h.broker.grant(
      app: "exe:/usr/bin/second", clientID: "app1", accountID: "*", authority: FakeIdP.authority, scopes: ["read"],
      operations: ["token"], caller: nil)
    let grants = try await h.broker.grants().filter { $0.app == "exe:/usr/bin/second" }
    XCTAssertEqual(grants.count, 1, "a grant for the same app, client and account replaces the earlier one")
    XCTAssertEqual(grants.first?.scopes, ["read"])
    XCTAssertEqual(grants.first?.operations, [.token])
    let narrowed = try await silent(h, as: second)
    XCTAssertNotNil(narrowed["access_token"])
    let seen = try await h.broker.knownAccounts(matching: AccountFilter(caller: second))
    XCTAssertEqual(seen, [])
    let hidden = try await h.broker.hiddenAccountCount(second)
    XCTAssertEqual(hidden, 1)
    let hiddenFromFirst = try await h.broker.hiddenAccountCount(first)
    XCTAssertEqual(hiddenFromFirst, 0)
    await XCTAssertThrowsTessera(.accessDenied) {
      try await h.broker.signOut(
        SignOutRequest(accountID: accountID, clientID: nil, correlationID: "c", caller: self.second))
    }
    // Bad narrowing is named.
    await XCTAssertThrowsTessera(.invalidArgument) {
      try await h.broker.grant(
        app: "exe:/usr/bin/second", clientID: "app1", accountID: "*", operations: ["steal"], caller: nil)
    }
    await XCTAssertThrowsTessera(.invalidArgument) {
      try await h.broker.grant(
        app: "exe:/usr/bin/second", clientID: "app1", accountID: "*", authority: "http://x", caller: nil)
    }
  }

  func testAnAlwaysAllowFromThePromptCoversTheScopesTheUserSaw() async throws {
    let prompter = FakePrompter([.allowAlways])
    let h = await Harness(accessMode: .confirm, prompter: prompter)
    _ = try await signIn(h, as: first)
    let allowed = try await silent(h, as: second)
    XCTAssertNotNil(allowed["access_token"])
    let all = try await h.broker.grants()
    let grant = try XCTUnwrap(all.first { $0.app == "exe:/usr/bin/second" })
    XCTAssertEqual(grant.scopes, ["read"])
    XCTAssertEqual(grant.authority, FakeIdP.authority)
    XCTAssertEqual(grant.via, "user")
  }

  func testTheFirstUseOfAnAccountByAnAppIsToldOnceAcrossRestarts() async throws {
    let h = await Harness(accessMode: .open, notifyFirstUse: true)
    _ = try await signIn(h, as: first)
    _ = try await silent(h, as: first)
    XCTAssertEqual(h.events.firstUses.withLock { $0 }, [], "the app that signed in is no news")
    _ = try await silent(h, as: second)
    _ = try await silent(h, as: second)
    let uses = h.events.firstUses.withLock { $0 }
    XCTAssertEqual(uses.map(\.app.key), ["exe:/usr/bin/second"], "told once, not per call")
    XCTAssertEqual(uses.first?.username, "alice@idp.test")
    await h.broker.finishStoreWrites()
    // A restarted daemon (same keyring) remembers it.
    let events = RecordingEvents()
    var config = BrokerConfig.fakeIdP
    config.accessMode = .open
    config.notifyFirstUse = true
    let restarted = Broker(
      config: config,
      dependencies: BrokerDependencies(
        http: h.idp, store: h.store, browser: RecordingBrowser(listeners: h.listeners, idp: h.idp),
        listeners: h.listeners, events: events, clock: h.clock),
      logger: Logger(label: "test"))
    var request = try h.request()
    request.caller = second
    _ = try await restarted.acquireTokenSilent(request)
    XCTAssertEqual(events.firstUses.withLock { $0 }, [])
    // Turned off (notify_first_use = false): not told.
    var quiet = config
    quiet.notifyFirstUse = false
    let q = await Harness(config: quiet, accessMode: .open, notifyFirstUse: false)
    _ = try await signIn(q, as: first)
    _ = try await silent(q, as: second)
    XCTAssertEqual(q.events.firstUses.withLock { $0 }, [])
  }

  func testAnAppWithANarrowedGrantSignsInOnlyWithinIt() async throws {
    let h = await Harness(accessMode: .strict)
    _ = try await signIn(h, as: first)
    try await h.broker.grant(
      app: "exe:/usr/bin/second", clientID: "app1", accountID: "*", scopes: ["write"], caller: nil)
    // Holding a grant for the client is not enough: its sign-in asks for "read", outside it.
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.signIn(h, as: self.second) }
    // A grant for sign-ins only: it may sign in, but a sign-in never opens the bus thread's cache
    // to it, and tokens are still refused.
    try await h.broker.grant(
      app: "exe:/usr/bin/second", clientID: "app1", accountID: "*", operations: ["sign-in"], caller: nil)
    _ = try await signIn(h, as: second)
    let arguments: [BusValue] = [.string(""), .strings([]), .string(""), .dict([:])]
    XCTAssertNil(h.broker.fastPath.answer(arguments, now: h.clock.now().timeIntervalSince1970, app: second.app?.key))
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await self.silent(h, as: self.second) }
  }

  func testAlwaysAllowAddsToTheGrantTheAppHad() async throws {
    let h = await Harness(accessMode: .confirm)
    let signedIn = try await signIn(h, as: first)
    guard case .dict(let account)? = signedIn["account"], case .string(let accountID)? = account["id"] else {
      return XCTFail("no account")
    }
    let app = try XCTUnwrap(second.app)
    // OpenID Connect's scopes only: an empty list (only those), not "any scope".
    func request(_ scopes: [String]) -> AccessRequest {
      AccessRequest(
        caller: second, clientID: "app1", accountID: accountID, username: "", scopes: scopes,
        authority: FakeIdP.authority, operation: .token)
    }
    let oidcOnly = await h.broker.userGrant(app: app, request(["openid", "offline_access"]))
    XCTAssertEqual(oidcOnly.scopes, [])
    XCTAssertNil(oidcOnly.operations)
    // Added to a narrowed grant: its scopes and operations grow, none is taken away.
    try await h.broker.grant(
      app: app.key, clientID: "app1", accountID: accountID, authority: FakeIdP.authority, scopes: ["Mail.Send"],
      operations: ["token"], caller: nil)
    let merged = await h.broker.userGrant(app: app, request(["Calendars.Read"]))
    XCTAssertEqual(merged.scopes, ["calendars.read", "mail.send"], "kept as the engine compares them")
    XCTAssertEqual(merged.operations, [.token])
    XCTAssertEqual(merged.authority, FakeIdP.authority)
  }
}
