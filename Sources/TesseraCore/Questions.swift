import Logging
import TesseraInterface

/// The desktop app as the way to ask the user (issue 39): it registers (RegisterPrompter), each
/// question goes to its connection alone (the Question signal), and an answer (AnswerQuestion) is
/// believed only from that app's own process, for a question it was asked and has not answered.
///
/// "That app's own process": the process of the connection that registered, as the broker
/// identified it (its pid and app key, from the kernel's credentials of the connection), while
/// that connection stays open; the app answers over connections of its own, one per call. Only an
/// unconfined program of the user whose executable is tessera-accounts may register: a sandboxed
/// app may not answer its own questions, and another connection, of any program, may not answer
/// the app's.
struct PromptDesk {
  struct Prompter: Equatable {
    var busName: String
    var pid: UInt32
    var appKey: String
    var display: String
  }

  struct Pending {
    var kind: Question.Kind
    var answers: Set<String>
    var done: CheckedContinuation<QuestionAnswer?, Never>
  }

  var prompter: Prompter?
  var pending: [String: Pending] = [:]
  /// Apps with a chooser on screen: one at a time per app (as consent questions), so an app
  /// cannot open a dialog per call.
  var choosing: Set<String> = []
}

/// The user's answer to a question asked through the app.
struct QuestionAnswer: Sendable, Equatable {
  var answer: String
  var remember: Bool
}

extension Broker {
  /// The executable the desktop app is: only a program by this name may take the questions.
  static let promptingAppName = "tessera-accounts"

  /// RegisterPrompter: the caller's connection gets the user's questions from now on.
  public func registerPrompter(_ caller: CallerInfo) throws {
    try AccessPolicy.checkMayManage(caller)
    guard let app = caller.app, let pid = caller.pid, app.kind == .executable,
      app.id.split(separator: "/").last.map(String.init) == Self.promptingAppName
    else {
      throw TesseraError.accessDenied(
        "Only Tessera Accounts (\(Self.promptingAppName)) may ask the user Tessera's questions; \(caller.app?.display ?? "this caller") may not."
      )
    }
    // Its connection closed before this call was handled (the two reach the broker in no set
    // order): it must not stay registered with nobody to ask.
    guard !signIns.hasDeparted(caller.busName) else {
      throw TesseraError.accessDenied("The connection that asked to take the questions has closed.")
    }
    if let current = prompts.prompter, current.busName != caller.busName {
      throw TesseraError.accessDenied(
        "Another Tessera Accounts (process \(current.pid)) answers the questions already; close it first.")
    }
    prompts.prompter = PromptDesk.Prompter(busName: caller.busName, pid: pid, appKey: app.key, display: app.display)
    logger.info(
      "Tessera Accounts asks the user's questions from now on",
      metadata: ["pid": "\(pid)", "app": "\(app.display)"])
  }

  /// AnswerQuestion: the user's answer, believed only from the registered app's process, for a
  /// question still waiting, with an answer that question takes.
  public func answerQuestion(id: String, answer: String, remember: Bool, caller: CallerInfo) throws {
    guard let prompter = prompts.prompter, caller.pid == prompter.pid, caller.app?.key == prompter.appKey else {
      logger.warning(
        "Refused an answer to a question from a program that was not asked",
        metadata: ["app": "\(caller.app?.display ?? "unidentified")", "pid": "\(caller.pid.map(String.init) ?? "?")"])
      throw TesseraError.accessDenied(
        "Only the Tessera Accounts window that was asked may answer Tessera's questions; \(caller.app?.display ?? "this caller") was not asked."
      )
    }
    guard let pending = prompts.pending[id] else {
      throw TesseraError.invalidArgument(
        "No question '\(RequestOptions.clip(id))' is waiting (answered already, or it timed out).")
    }
    guard pending.answers.contains(answer) else {
      throw TesseraError.invalidArgument(
        "'\(RequestOptions.clip(answer))' does not answer a \(pending.kind.rawValue) question; it takes \(pending.answers.sorted().joined(separator: ", "))."
      )
    }
    prompts.pending[id] = nil
    pending.done.resume(returning: QuestionAnswer(answer: answer, remember: remember))
  }

  /// Whether the app takes the questions now.
  var appPrompts: Bool { prompts.prompter != nil }

  /// Asks through the app; nil when it is not there, it closed, or the question timed out.
  func askApp(_ kind: Question.Kind, _ info: [String: BusValue], answers: Set<String>) async -> QuestionAnswer? {
    guard let prompter = prompts.prompter else { return nil }
    let id = CorrelationID.new()
    var info = info
    info[Question.kind] = .string(kind.rawValue)
    let wait = deps.questionTimeout
    info[Question.expiresIn] = .uint32(UInt32(clamping: wait.components.seconds))
    let timeout = Task {
      try await Task.sleep(for: wait)
      self.questionTimedOut(id)
    }
    defer { timeout.cancel() }
    // The id is no secret: an answer counts only from the app's process, whoever knows the id.
    logger.info(
      "Asking the user through Tessera Accounts",
      metadata: ["question": "\(id)", "kind": "\(kind.rawValue)", "app": "\(info[Question.app]?.stringValue ?? "")"])
    return await withCheckedContinuation { done in
      prompts.pending[id] = PromptDesk.Pending(kind: kind, answers: answers, done: done)
      deps.events.question(destination: prompter.busName, id: id, info: info)
    }
  }

  private func questionTimedOut(_ id: String) {
    prompts.pending.removeValue(forKey: id)?.done.resume(returning: nil)
  }

  /// The app's connection closed: its questions go unanswered, and it asks no more.
  func prompterLeft(_ busName: String) {
    guard prompts.prompter?.busName == busName else { return }
    prompts.prompter = nil
    let waiting = prompts.pending.values
    prompts.pending = [:]
    for question in waiting { question.done.resume(returning: nil) }
    logger.info("Tessera Accounts closed: the desktop's own dialogs ask again")
  }

  /// The consent question, as the app shows it.
  func consentInfo(_ question: AccessQuestion, authority: String) -> [String: BusValue] {
    [
      Question.app: .string(question.app.display), Question.appKey: .string(question.app.key),
      Question.assurance: .string(question.app.assurance), Question.clientID: .string(question.clientID),
      Question.account: .string(question.username), Question.provider: .string(Self.host(of: authority)),
      Question.scopes: .strings(question.scopes), Question.operation: .string(question.operation),
    ]
  }

  static func host(of authority: String) -> String {
    guard let rest = authority.split(separator: "://", maxSplits: 1).last else { return authority }
    return String(rest.prefix { $0 != "/" })
  }

  /// The account chooser (issue 39 §2): an interactive request that names no account, at an
  /// authority where several are signed in (or with prompt=select_account), asks the user which
  /// one, through the app only. The app's remembered choice answers without asking. nil: go on
  /// as before (no app, no answer, or "another account").
  func chooseAccount(_ request: TokenRequest, caller: CallerInfo, authority: Authority) async -> Account? {
    guard request.accountID.isEmpty, (request.loginHint ?? "").isEmpty, let app = caller.app else { return nil }
    let environment = authority.port.map { "\(authority.host):\($0)" } ?? authority.host
    let here = cache.accounts.values.filter { $0.authority == authority.url || $0.environment == environment }
      .sorted { $0.username < $1.username }
    let asked = request.prompt == Prompt.selectAccount
    guard here.count >= 2 || (asked && !here.isEmpty) else { return nil }
    if !asked, let id = cache.chosenAccount(app: app.key, authority: authority.url), let account = cache.accounts[id] {
      return account
    }
    guard prompts.choosing.insert(app.key).inserted else { return nil }
    defer { prompts.choosing.remove(app.key) }
    // The account this app was granted last (grants are kept in the order they were made, so
    // of two made in the same second the later one wins).
    var lastGrant: AccessGrant?
    for grant in cache.grants where grant.app == app.key && here.contains(where: { $0.id == grant.accountID }) {
      if lastGrant == nil || grant.grantedAt >= lastGrant!.grantedAt { lastGrant = grant }
    }
    let last = lastGrant?.accountID
    var answer: QuestionAnswer?
    if !appPrompts {
      // No app: the portal's access dialog, where the desktop draws choices; else no choice, and
      // the current-account rule answers as before.
      let choice = AccountChoice(
        app: app, clientID: request.clientID, provider: authority.host,
        accounts: here.map { .init(id: $0.id, username: $0.username, name: $0.name) }, preselected: last)
      guard let prompter = deps.prompter, let chosen = await prompter.chooseAccount(choice) else { return nil }
      answer = QuestionAnswer(answer: chosen.answer, remember: chosen.remember)
    }
    var info: [String: BusValue] = [
      Question.app: .string(app.display), Question.appKey: .string(app.key),
      Question.assurance: .string(app.assurance), Question.clientID: .string(request.clientID),
      Question.provider: .string(authority.host),
      Question.accounts: .dicts(
        here.map { ["id": .string($0.id), "username": .string($0.username), "name": .string($0.name)] }),
    ]
    if let last { info[Question.preselected] = .string(last) }
    if answer == nil {
      answer = await askApp(.chooseAccount, info, answers: Set(here.map(\.id) + [Question.another]))
    }
    guard let answer, answer.answer != Question.another, here.contains(where: { $0.id == answer.answer }),
      let account = cache.accounts[answer.answer]
    else { return nil }
    if answer.remember {
      // Kept in the store: the choice holds after a restart too. A store that cannot keep it now
      // loses nothing but the memory: the user is asked again.
      let choice = AccountChoiceRecord(
        app: app.key, authority: authority.url, accountID: account.id,
        chosenAt: Int64(deps.clock.now().timeIntervalSince1970))
      do { try await apply(cache.remember(choice: choice)) } catch {
        logger.warning(
          "Could not keep the account choice; the app's next sign-in asks again",
          metadata: ["error": "\(TesseraError.wrap(error))"])
      }
    }
    logger.info(
      "The user chose an account for the app", metadata: ["app": "\(app.display)", "account_id": "\(account.id)"])
    return account
  }
}
