import Logging
import TesseraBus
import TesseraCore
import TesseraInterface
import TesseraSystem

/// The engine's events on the session bus: org.tessera.Broker1's signals and AttentionNeeded
/// property, and the desktop notification when an account needs a sign-in.
public struct BrokerSignals: BrokerEvents {
  let server: BusServer
  let notifier: DesktopNotifier?

  public init(server: BusServer, notifier: DesktopNotifier? = nil) {
    self.server = server
    self.notifier = notifier
  }

  public func interactionPending(destination: String, correlationID: String, info: InteractionInfo) {
    guard !destination.isEmpty else { return }  // the daemon's own sign-in (a notification's action)
    server.emit(
      BrokerInterface.description, "InteractionPending", [.string(correlationID), .dict(info.busValue)],
      to: destination)
  }

  public func accountsChanged() { server.emit(BrokerInterface.description, BrokerInterface.accountsChanged, []) }

  public func attentionChanged(_ accountIDs: [String]) {
    server.setProperty(BrokerInterface.description, BrokerInterface.attentionNeeded, .strings(accountIDs))
  }

  public func managementChanged(_ part: BrokerInterface.ManagementPart) {
    server.emit(BrokerInterface.description, BrokerInterface.managementChanged, [.string(part.rawValue)])
  }

  public func question(destination: String, id: String, info: [String: BusValue]) {
    server.emit(BrokerInterface.description, BrokerInterface.question, [.string(id), .dict(info)], to: destination)
  }

  public func signInNeeded(_ need: SignInNeed) { notifier?.show(need) }

  public func signInNoLongerNeeded(accountID: String) { notifier?.withdraw(accountID: accountID) }

  public func appFirstUsedAccount(_ use: FirstUse) { notifier?.showFirstUse(use) }
}

/// Desktop notifications through org.freedesktop.Notifications: "Sign in again to alice@contoso for
/// <app>", with a "Sign in" action. Never starts a notification server (no D-Bus activation): with
/// none on the bus, nothing is shown and the log says so. Actions are believed only from the
/// connection that answered our Notify, for a notification we showed.
public final class DesktopNotifier: Sendable {
  static let service = "org.freedesktop.Notifications"
  static let path = "/org/freedesktop/Notifications"
  static let signInAction = "sign-in"
  static let allowOnce = "allow-once"
  static let allowAlways = "allow-always"
  static let deny = "deny"
  /// How long a question waits for the user.
  static let questionSeconds: UInt64 = 120

  private struct State {
    /// Notification ids we showed, to the account each is for.
    var shown: [UInt32: String] = [:]
    /// Notifications whose action was taken: a second click starts no second sign-in.
    var acted: Set<UInt32> = []
    /// Access questions on screen, by notification id, with who waits for the answer.
    var questions: [UInt32: CheckedContinuation<AccessAnswer?, Never>] = [:]
    /// Bumped by every show and withdraw of an account: a Notify answered after a withdraw (or a
    /// newer show) is closed at once instead of kept.
    var generation: [String: UInt64] = [:]
    /// The notification server's unique name (the sender of Notify's reply).
    var serverName: String?
    var onAction: (@Sendable (String) -> Void)?
  }

  private let server: BusServer
  private let logger: Logger
  private let state = Locked(State())

  public init(server: BusServer, logger: Logger) {
    self.server = server
    self.logger = logger
  }

  /// Starts listening for the user's answers; `onAction` gets the account id of a notification
  /// whose "Sign in" action (or body) the user clicked.
  public func start(onAction: @escaping @Sendable (String) -> Void) {
    state.withLock { $0.onAction = onAction }
    server.watchSignal(
      sender: Self.service, path: Self.path, interface: Self.service, member: "ActionInvoked"
    ) { [weak self] sender, arguments in
      guard let self, arguments.count == 2, case .uint32(let id) = arguments[0],
        case .string(let action) = arguments[1]
      else { return }
      // An access question's answer.
      let question = self.state.withLock { state -> CheckedContinuation<AccessAnswer?, Never>? in
        guard state.serverName == sender else { return nil }
        return state.questions.removeValue(forKey: id)
      }
      if let question {
        let answer: AccessAnswer? =
          switch action {
          case Self.allowOnce: .allowOnce
          case Self.allowAlways: .allowAlways
          case Self.deny: .deny
          default: nil
          }
        question.resume(returning: answer)
        self.close(id)
        return
      }
      guard action == Self.signInAction || action == "default" else { return }
      // The first action on a notification counts; it is ours no more (clicking the body and then
      // the button must not start two sign-ins).
      let (account, handler) = self.state.withLock { state -> (String?, (@Sendable (String) -> Void)?) in
        guard state.serverName == sender, let account = state.shown[id], state.acted.insert(id).inserted else {
          return (nil, nil)
        }
        return (account, state.onAction)
      }
      guard let account else { return }
      // A click on the notification itself opens Tessera Accounts at the account when it is
      // installed (D-Bus activation starts it); its "Sign in" button, or no app, signs in.
      guard action == "default" else {
        self.logger.info("The user asked to sign in from the notification", metadata: ["account_id": "\(account)"])
        handler?(account)
        return
      }
      self.openAccountsApp(at: account) { opened in
        guard !opened else { return }
        self.logger.info("The user asked to sign in from the notification", metadata: ["account_id": "\(account)"])
        handler?(account)
      }
    }
    server.watchSignal(
      sender: Self.service, path: Self.path, interface: Self.service, member: "NotificationClosed"
    ) { [weak self] sender, arguments in
      guard let self, arguments.count >= 1, case .uint32(let id) = arguments[0] else { return }
      let question = self.state.withLock { state -> CheckedContinuation<AccessAnswer?, Never>? in
        guard state.serverName == sender else { return nil }
        state.shown[id] = nil
        state.acted.remove(id)
        return state.questions.removeValue(forKey: id)
      }
      question?.resume(returning: nil)  // dismissed without an answer
    }
  }

  static let accountsApp = "org.tessera.Accounts"

  /// Asks Tessera Accounts (started by D-Bus activation when it is installed and not running) to
  /// show the account's page: its GApplication action app.show-account. `done(false)` when there is
  /// no such app, or it did not answer.
  func openAccountsApp(at accountID: String, done: @escaping @Sendable (Bool) -> Void) {
    server.call(
      destination: Self.accountsApp, path: "/org/tessera/Accounts", interface: "org.freedesktop.Application",
      member: "ActivateAction", arguments: [.string("show-account"), .variants([.string(accountID)]), .dict([:])],
      timeoutSeconds: 25, autoStart: true
    ) { [logger] result in
      switch result {
      case .success:
        logger.info(
          "Opened Tessera Accounts at the account from the notification", metadata: ["account_id": "\(accountID)"])
        done(true)
      case .failure(let error):
        logger.info("Tessera Accounts could not be opened; signing in instead", metadata: ["error": "\(error.name)"])
        done(false)
      }
    }
  }

  /// Body text may be rendered as markup by the notification server (the spec's body-markup): what
  /// came from the IdP or a caller is escaped, so it cannot add links or formatting.
  static func escapeMarkup(_ text: String) -> String {
    var out = ""
    for c in text {
      switch c {
      case "&": out += "&amp;"
      case "<": out += "&lt;"
      case ">": out += "&gt;"
      default: out.append(c)
      }
    }
    return out
  }

  func show(_ need: SignInNeed) {
    let app = KnownApps.name(of: need.clientID)
    let summary = "Sign in again to \(SafeText.clip(need.username, limit: 200))"
    let body = Self.escapeMarkup(
      "\(SafeText.clip(app, limit: 200)) needs you to sign in again to \(SafeText.clip(need.username, limit: 200)). Until then it gets no new tokens."
    )
    let generation = state.withLock { state -> UInt64 in
      state.generation[need.accountID, default: 0] += 1
      return state.generation[need.accountID]!
    }
    let arguments: [BusValue] = [
      .string("Tessera"), .uint32(0), .string("dialog-password"), .string(summary), .string(body),
      .strings(["default", "Sign in", Self.signInAction, "Sign in"]),
      .dict(["desktop-entry": .string("tessera"), "category": .string("network")]),
      .int32(-1),
    ]
    server.call(
      destination: Self.service, path: Self.path, interface: Self.service, member: "Notify", arguments: arguments,
      timeoutSeconds: 10, autoStart: false
    ) { [self] result in
      switch result {
      case .success(let reply):
        guard case .uint32(let id)? = reply.values.first else { return }
        let current = self.state.withLock { state -> Bool in
          state.serverName = reply.sender
          guard state.generation[need.accountID] == generation else { return false }
          state.shown[id] = need.accountID
          return true
        }
        guard current else {
          // Withdrawn (or replaced) while the server was answering: take it down now.
          self.close(id)
          return
        }
        self.logger.info(
          "Showed a notification: the account needs a sign-in",
          metadata: ["account_id": "\(need.accountID)", "client_id": "\(need.clientID)"])
      case .failure(let error):
        self.logger.info(
          "No notification shown (no notification server on the bus?)",
          metadata: ["account_id": "\(need.accountID)", "error": "\(error.name)"])
      }
    }
  }

  /// "org.example.App used alice@example.com": the first time an app uses an account (issue 11),
  /// with the command that takes it back. Informational: no action, no answer awaited.
  func showFirstUse(_ use: FirstUse) {
    let summary =
      "\(SafeText.clip(use.app.id, limit: 120)) used \(SafeText.clip(use.username, limit: 120)) for the first time"
    let body = Self.escapeMarkup(
      "\(SafeText.clip(use.app.display, limit: 300)) asked for a token of \(SafeText.clip(use.username, limit: 200)) for client \(SafeText.clip(use.clientID, limit: 200)). If that was not you: tessera access revoke --app '\(SafeText.clip(use.app.key, limit: 300))'"
    )
    let arguments: [BusValue] = [
      .string("Tessera"), .uint32(0), .string("dialog-password"), .string(summary), .string(body), .strings([]),
      .dict(["desktop-entry": .string("tessera"), "category": .string("network")]), .int32(-1),
    ]
    server.call(
      destination: Self.service, path: Self.path, interface: Self.service, member: "Notify", arguments: arguments,
      timeoutSeconds: 10, autoStart: false
    ) { [self] result in
      if case .failure(let error) = result {
        self.logger.info(
          "No first-use notification shown (no notification server on the bus?)", metadata: ["error": "\(error.name)"])
      }
    }
  }

  func withdraw(accountID: String) {
    let ids = state.withLock { state -> [UInt32] in
      state.generation[accountID, default: 0] += 1
      let ids = state.shown.filter { $0.value == accountID }.map(\.key)
      for id in ids {
        state.shown[id] = nil
        state.acted.remove(id)
      }
      return ids
    }
    for id in ids { close(id) }
  }

  private func close(_ id: UInt32) {
    server.call(
      destination: Self.service, path: Self.path, interface: Self.service, member: "CloseNotification",
      arguments: [.uint32(id)], timeoutSeconds: 10, autoStart: false
    ) { _ in }
  }
}

extension DesktopNotifier: AccessPrompter {
  /// Asks through a notification with three actions: "Allow once", "Always allow", "Deny". nil
  /// when no notification server answers, the user dismisses it, or 2 minutes pass.
  public func ask(_ question: AccessQuestion) async -> AccessAnswer? {
    let sure = question.app.assurance
    let scopes =
      question.scopes.isEmpty ? "" : " (scopes: \(SafeText.clip(question.scopes.joined(separator: " "), limit: 300)))"
    let body = Self.escapeMarkup(
      "\(SafeText.clip(question.app.display, limit: 300)) asks to use the sign-in of \(SafeText.clip(question.username, limit: 200)) for client \(SafeText.clip(question.clientID, limit: 200))\(scopes). \(sure)"
    )
    let arguments: [BusValue] = [
      .string("Tessera"), .uint32(0), .string("dialog-password"),
      .string(
        "Allow \(SafeText.clip(question.app.id, limit: 120)) to use \(SafeText.clip(question.username, limit: 120))?"),
      .string(body),
      .strings([Self.allowOnce, "Allow once", Self.allowAlways, "Always allow", Self.deny, "Deny"]),
      .dict(["desktop-entry": .string("tessera"), "resident": .bool(true)]), .int32(0),
    ]
    let shown = Locked<UInt32?>(nil)
    let answer: AccessAnswer? = await withCheckedContinuation { (done: CheckedContinuation<AccessAnswer?, Never>) in
      server.call(
        destination: Self.service, path: Self.path, interface: Self.service, member: "Notify", arguments: arguments,
        timeoutSeconds: 10, autoStart: false
      ) { [self] result in
        guard case .success(let reply) = result, case .uint32(let id)? = reply.values.first else {
          self.logger.info("No access question shown (no notification server on the bus?)")
          return done.resume(returning: nil)
        }
        self.state.withLock {
          $0.serverName = reply.sender
          $0.questions[id] = done
        }
        shown.withLock { $0 = id }
        // Unanswered after a while: taken down, and nobody said yes.
        Task {
          try? await Task.sleep(nanoseconds: Self.questionSeconds * 1_000_000_000)
          if let waiting = self.state.withLock({ $0.questions.removeValue(forKey: id) }) {
            waiting.resume(returning: nil)
            self.close(id)
          }
        }
      }
    }
    _ = shown
    return answer
  }
}

/// Machine events on the system bus: logind's PrepareForSleep(false) (the machine woke up) and
/// NetworkManager reaching full connectivity again. Each makes the broker refresh the tokens in
/// recent use at once. Only broadcasts from the current owners of those names are heard (the
/// system bus's policy lets only logind and NetworkManager own them; a signal sent to tesserad
/// alone, which any local user may send, is dropped); without a system bus nothing is watched.
public enum MachineEvents {
  public static func watch(server: BusServer, logger: Logger, onResume: @escaping @Sendable (String) -> Void) {
    server.watchSignal(
      on: .system, sender: "org.freedesktop.login1", path: "/org/freedesktop/login1",
      interface: "org.freedesktop.login1.Manager", member: "PrepareForSleep", broadcastOnly: true
    ) { _, arguments in
      guard case .bool(false)? = arguments.first else { return }
      onResume("resume")
    }
    // NM_STATE_CONNECTED_GLOBAL: connected with full access; any other state arms it again. Armed
    // at start, so a daemon started offline hears the first connection.
    let connected: UInt32 = 70
    let armed = Locked(true)
    server.watchSignal(
      on: .system, sender: "org.freedesktop.NetworkManager", path: "/org/freedesktop/NetworkManager",
      interface: "org.freedesktop.NetworkManager", member: "StateChanged", broadcastOnly: true
    ) { _, arguments in
      guard case .uint32(let state)? = arguments.first else { return }
      let fire = armed.withLock { wasDown -> Bool in
        defer { wasDown = state != connected }
        return wasDown && state == connected
      }
      if fire { onResume("network") }
    }
  }
}
