import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

/// The desktop app as the way to ask the user: who may take the questions, who may answer them,
/// consent through it, and the account chooser.
final class QuestionTests: XCTestCase {
  let accountsApp = CallerInfo(
    busName: ":1.50", pid: 50, uid: 1000,
    app: AppIdentity(kind: .executable, id: "/usr/bin/tessera-accounts"))
  /// Another connection of the same process (the app answers over a connection per call).
  let accountsAppAgain = CallerInfo(
    busName: ":1.51", pid: 50, uid: 1000,
    app: AppIdentity(kind: .executable, id: "/usr/bin/tessera-accounts"))
  let flatpak = CallerInfo(
    busName: ":1.60", pid: 60, uid: 1000, app: AppIdentity(kind: .flatpak, id: "org.example.Mail"))
  let other = CallerInfo(
    busName: ":1.70", pid: 70, uid: 1000, app: AppIdentity(kind: .executable, id: "/usr/bin/python3"))

  func waitForQuestion(_ h: Harness, count: Int = 1) async throws -> (id: String, info: [String: BusValue]) {
    for _ in 0..<2000 {
      let questions = h.events.questions.withLock { $0 }
      if questions.count >= count {
        XCTAssertEqual(questions[count - 1].destination, accountsApp.busName, "only the app's connection is told")
        return (questions[count - 1].id, questions[count - 1].info)
      }
      try await Task.sleep(nanoseconds: 1_000_000)
    }
    throw TesseraError.timedOut("no question was asked")
  }

  func testOnlyTheAccountsAppMayTakeTheQuestions() async throws {
    let h = await Harness(accessMode: .confirm)
    for caller in [flatpak, other] {
      await XCTAssertThrowsTessera(.accessDenied) { try await h.broker.registerPrompter(caller) }
    }
    try await h.broker.registerPrompter(accountsApp)
    let second = CallerInfo(
      busName: ":1.80", pid: 80, uid: 1000, app: AppIdentity(kind: .executable, id: "/opt/x/tessera-accounts"))
    await XCTAssertThrowsTessera(.accessDenied) { try await h.broker.registerPrompter(second) }
  }

  func testConsentIsAskedThroughTheAppAndAnswersFromAnyoneElseAreRefused() async throws {
    let (h, asking) = try await otherAppAsksForAlice()
    let (id, info) = try await waitForQuestion(h)
    XCTAssertEqual(info[Question.kind]?.stringValue, "consent")
    XCTAssertEqual(info[Question.app]?.stringValue, "/usr/bin/python3 (unverified)", "named as identified")
    XCTAssertEqual(info[Question.account]?.stringValue, "alice@idp.test")

    // Forged answers: the asking app itself, a sandboxed app, the right pid under another app key.
    let impostor = CallerInfo(
      busName: ":1.90", pid: 50, uid: 1000, app: AppIdentity(kind: .executable, id: "/usr/bin/python3"))
    for caller in [other, flatpak, impostor] {
      await XCTAssertThrowsTessera(.accessDenied) {
        try await h.broker.answerQuestion(id: id, answer: Question.allowAlways, remember: false, caller: caller)
      }
    }
    await XCTAssertThrowsTessera(.invalidArgument) {
      try await h.broker.answerQuestion(id: id, answer: "yes", remember: false, caller: self.accountsAppAgain)
    }
    try await h.broker.answerQuestion(id: id, answer: Question.allowAlways, remember: false, caller: accountsAppAgain)
    let token = try await asking.value
    XCTAssertNotNil(token["access_token"])
    let grants = try await h.broker.grants()
    XCTAssertTrue(grants.contains { $0.app == "exe:/usr/bin/python3" && $0.via == "user" })
    // Answered once: a second answer finds no question.
    await XCTAssertThrowsTessera(.invalidArgument) {
      try await h.broker.answerQuestion(id: id, answer: Question.deny, remember: false, caller: self.accountsAppAgain)
    }
  }

  func testAQuestionNobodyAnswersEndsInARefusalAndALateAnswerFindsNothing() async throws {
    // Nobody is at the screen: the question waits its time (here a tenth of a second, 120 s in
    // tesserad), then the app is refused as on Deny, and is not granted anything.
    let (h, asking) = try await otherAppAsksForAlice(questionTimeout: .milliseconds(100))
    let (id, _) = try await waitForQuestion(h)
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await asking.value }
    await XCTAssertThrowsTessera(.invalidArgument) {
      try await h.broker.answerQuestion(
        id: id, answer: Question.allowAlways, remember: false, caller: self.accountsAppAgain)
    }
    let grants = try await h.broker.grants()
    XCTAssertFalse(grants.contains { $0.app == "exe:/usr/bin/python3" }, "no grant from a question nobody answered")
    // An app calling in a loop is not asked again at once (no answer keeps it quiet a minute,
    // as a dismissed dialog does): refused without a question. After that minute it is asked.
    var again = try h.request()
    again.caller = other
    let request = again
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await h.broker.acquireTokenSilent(request) }
    XCTAssertEqual(h.events.questions.withLock { $0.count }, 1, "not asked again at once")
    h.clock.advance(61)
    let second = Task { try await h.broker.acquireTokenSilent(request) }
    let (next, _) = try await waitForQuestion(h, count: 2)
    try await h.broker.answerQuestion(id: next, answer: Question.allowOnce, remember: false, caller: accountsAppAgain)
    let token = try await second.value
    XCTAssertNotNil(token["access_token"])
  }

  func testTheAppLeavingEndsItsQuestions() async throws {
    let (h, asking) = try await otherAppAsksForAlice()
    _ = try await waitForQuestion(h)
    await h.broker.callerLeft(accountsApp.busName)
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await asking.value }
    // Gone: its process may not answer, and another app may register.
    let again = CallerInfo(
      busName: ":1.99", pid: 99, uid: 1000, app: AppIdentity(kind: .executable, id: "/usr/bin/tessera-accounts"))
    try await h.broker.registerPrompter(again)
  }

  func testTheChooserPicksTheAccountAndRemembersItForTheApp() async throws {
    let h = await Harness(accessMode: .open)
    _ = try await h.signIn()
    h.idp.subject.withLock { $0 = "bob-sub" }
    let bobResult = try await h.signIn()
    let bob = try XCTUnwrap(bobResult["account"]?.dictValue?["id"]?.stringValue)
    try await h.broker.registerPrompter(accountsApp)
    var request = try h.request()
    request.caller = other
    let browserSignIns = h.listeners.lastAuthorizationURL.withLock { $0 }
    let chooser = request
    let caller = other
    let asking = Task { try await h.broker.acquireTokenInteractive(chooser, caller: caller) }
    let (id, info) = try await waitForQuestion(h)
    XCTAssertEqual(info[Question.kind]?.stringValue, "choose_account")
    guard case .dicts(let accounts)? = info[Question.accounts] else { return XCTFail("no accounts offered") }
    XCTAssertEqual(accounts.count, 2)
    try await h.broker.answerQuestion(id: id, answer: bob, remember: true, caller: accountsAppAgain)
    let result = try await asking.value
    XCTAssertEqual(result["account"]?.dictValue?["id"]?.stringValue, bob)
    XCTAssertEqual(
      h.listeners.lastAuthorizationURL.withLock { $0 }, browserSignIns, "bob's refresh token answered: no browser")

    // Remembered: the next interactive request of that app gets bob without a question.
    let again = try await h.broker.acquireTokenInteractive(request, caller: other)
    XCTAssertEqual(again["account"]?.dictValue?["id"]?.stringValue, bob)
    XCTAssertEqual(h.events.questions.withLock { $0.count }, 1)

    // Kept in the store: after a restart too (a broker with no app to ask).
    await h.broker.finishStoreWrites()
    XCTAssertEqual(h.store.secrets(kind: "account_choice").count, 1)
    let restarted = Broker(
      config: await h.broker.config,
      dependencies: BrokerDependencies(
        http: h.idp, store: h.store, browser: NoBrowser(), listeners: h.listeners, events: h.events, clock: h.clock),
      logger: .init(label: "t"))
    let afterRestart = try await restarted.testFront.signIn(request, caller: other)
    XCTAssertEqual(afterRestart["account"]?.dictValue?["id"]?.stringValue, bob)

    // bob signed out: his choice goes with him (its item too).
    try await restarted.signOut(SignOutRequest(accountID: bob, clientID: nil, correlationID: "c", caller: nil))
    await restarted.finishStoreWrites()
    XCTAssertEqual(h.store.secrets(kind: "account_choice").count, 0)
  }

  /// confirm mode: the Flatpak app signed alice in, the Accounts app takes the questions, and
  /// another program (python3) asks for alice's token: a consent question is on its way.
  func otherAppAsksForAlice(questionTimeout: Duration? = nil) async throws -> (
    Harness, Task<[String: BusValue], any Error>
  ) {
    let h = await Harness(accessMode: .confirm, questionTimeout: questionTimeout)
    _ = try await signInAsFlatpak(h)
    try await h.broker.registerPrompter(accountsApp)
    var silent = try h.request()
    silent.caller = other
    let request = silent
    return (h, Task { try await h.broker.acquireTokenSilent(request) })
  }

  /// Signs alice and bob in (by the Flatpak app), returns bob's id.
  func twoAccounts(_ h: Harness) async throws -> String {
    _ = try await signInAsFlatpak(h)
    h.idp.subject.withLock { $0 = "bob-sub" }
    let bob = try await signInAsFlatpak(h)
    return try XCTUnwrap(bob["account"]?.dictValue?["id"]?.stringValue)
  }

  /// A sign-in by the Flatpak app (its first: allowed, and granted to it), as the harness's IdP's
  /// current subject.
  func signInAsFlatpak(_ h: Harness) async throws -> [String: BusValue] {
    var signIn = try h.request()
    signIn.caller = flatpak
    return try await h.broker.acquireTokenInteractive(signIn, caller: flatpak)
  }

  func testADenyAfterTheChoiceIsTheAnswerNotABrowserSignIn() async throws {
    let h = await Harness(accessMode: .confirm)
    let bob = try await twoAccounts(h)
    try await h.broker.registerPrompter(accountsApp)
    var request = try h.request()
    request.caller = other
    let (chooser, caller) = (request, other)
    let browser = h.listeners.lastAuthorizationURL.withLock { $0 }
    let asking = Task { try await h.broker.acquireTokenInteractive(chooser, caller: caller) }
    // The app may sign in (once), chooses bob, and is then asked about bob's token: Deny.
    var (id, info) = try await waitForQuestion(h, count: 1)
    XCTAssertEqual(info[Question.kind]?.stringValue, "consent")
    try await h.broker.answerQuestion(id: id, answer: Question.allowOnce, remember: false, caller: accountsAppAgain)
    (id, info) = try await waitForQuestion(h, count: 2)
    XCTAssertEqual(info[Question.kind]?.stringValue, "choose_account")
    try await h.broker.answerQuestion(id: id, answer: bob, remember: false, caller: accountsAppAgain)
    (id, info) = try await waitForQuestion(h, count: 3)
    XCTAssertEqual(info[Question.kind]?.stringValue, "consent")
    XCTAssertEqual(info[Question.account]?.stringValue, "alice@idp.test")
    try await h.broker.answerQuestion(id: id, answer: Question.deny, remember: false, caller: accountsAppAgain)
    await XCTAssertThrowsTessera(.accessDenied) { _ = try await asking.value }
    XCTAssertEqual(h.listeners.lastAuthorizationURL.withLock { $0 }, browser, "the Deny stands: no browser sign-in")
  }

  func testPromptNoneShowsNoChooserAndARevokeForgetsTheKeptChoice() async throws {
    let h = await Harness(accessMode: .open)
    let bob = try await twoAccounts(h)
    try await h.broker.registerPrompter(accountsApp)
    var quiet = try h.request(options: ["prompt": .string("none")])
    quiet.caller = other
    _ = try? await h.broker.acquireTokenInteractive(quiet, caller: other)
    XCTAssertEqual(h.events.questions.withLock { $0.count }, 0, "prompt=none asks nothing")

    var request = try h.request()
    request.caller = other
    let (chooser, caller) = (request, other)
    let asking = Task { try await h.broker.acquireTokenInteractive(chooser, caller: caller) }
    let (id, _) = try await waitForQuestion(h)
    try await h.broker.answerQuestion(id: id, answer: bob, remember: true, caller: accountsAppAgain)
    _ = try await asking.value
    let kept = await h.broker.cache.choices
    XCTAssertEqual(Array(kept.values), [bob])
    _ = try await h.broker.revoke(app: "exe:/usr/bin/python3", clientID: nil, accountID: bob, caller: nil)
    let afterRevoke = await h.broker.cache.choices
    XCTAssertTrue(afterRevoke.isEmpty, "the revoke took the kept choice with it")
  }
}
