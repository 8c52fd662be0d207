import Logging
import Synchronization
import TesseraBus
import TesseraCore

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

  public func accountsChanged() { server.emit(BrokerInterface.description, "AccountsChanged", []) }

  public func attentionChanged(_ accountIDs: [String]) {
    server.setProperty(BrokerInterface.description, BrokerInterface.attentionNeeded, .strings(accountIDs))
  }

  public func signInNeeded(_ need: SignInNeed) { notifier?.show(need) }

  public func signInNoLongerNeeded(accountID: String) { notifier?.withdraw(accountID: accountID) }
}

/// Desktop notifications through org.freedesktop.Notifications: "Sign in again to alice@contoso for
/// <app>", with a "Sign in" action. Never starts a notification server (no D-Bus activation): with
/// none on the bus, nothing is shown and the log says so. Actions are believed only from the
/// connection that answered our Notify, for a notification we showed.
public final class DesktopNotifier: Sendable {
  static let service = "org.freedesktop.Notifications"
  static let path = "/org/freedesktop/Notifications"
  static let signInAction = "sign-in"

  private struct State {
    /// Notification ids we showed, to the account each is for.
    var shown: [UInt32: String] = [:]
    /// The notification server's unique name (the sender of Notify's reply).
    var serverName: String?
    var onAction: (@Sendable (String) -> Void)?
  }

  private let server: BusServer
  private let logger: Logger
  private let state = Mutex(State())

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
      let (account, handler) = self.state.withLock { state -> (String?, (@Sendable (String) -> Void)?) in
        guard state.serverName == sender, let account = state.shown[id] else { return (nil, nil) }
        return (account, state.onAction)
      }
      guard let account, action == Self.signInAction || action == "default" else { return }
      self.logger.info("The user asked to sign in from the notification", metadata: ["account_id": "\(account)"])
      handler?(account)
    }
    server.watchSignal(
      sender: Self.service, path: Self.path, interface: Self.service, member: "NotificationClosed"
    ) { [weak self] sender, arguments in
      guard let self, arguments.count >= 1, case .uint32(let id) = arguments[0] else { return }
      self.state.withLock { state in
        if state.serverName == sender { state.shown[id] = nil }
      }
    }
  }

  func show(_ need: SignInNeed) {
    let app = KnownApps.name(of: need.clientID)
    let summary = "Sign in again to \(SafeText.clip(need.username, limit: 200))"
    let body =
      "\(SafeText.clip(app, limit: 200)) needs you to sign in again to \(SafeText.clip(need.username, limit: 200)). Until then it gets no new tokens."
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
        self.state.withLock {
          $0.serverName = reply.sender
          $0.shown[id] = need.accountID
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

  func withdraw(accountID: String) {
    let ids = state.withLock { state -> [UInt32] in
      let ids = state.shown.filter { $0.value == accountID }.map(\.key)
      for id in ids { state.shown[id] = nil }
      return ids
    }
    for id in ids {
      server.call(
        destination: Self.service, path: Self.path, interface: Self.service, member: "CloseNotification",
        arguments: [.uint32(id)], timeoutSeconds: 10, autoStart: false
      ) { _ in }
    }
  }
}

/// Machine events on the system bus: logind's PrepareForSleep(false) (the machine woke up) and
/// NetworkManager reaching full connectivity again. Each makes the broker refresh the tokens in
/// recent use at once. Only the owners of those names are heard (the system bus lets no one else
/// own them); without a system bus nothing is watched.
public enum MachineEvents {
  public static func watch(server: BusServer, logger: Logger, onResume: @escaping @Sendable (String) -> Void) {
    server.watchSignal(
      on: .system, sender: "org.freedesktop.login1", path: "/org/freedesktop/login1",
      interface: "org.freedesktop.login1.Manager", member: "PrepareForSleep"
    ) { _, arguments in
      guard case .bool(false)? = arguments.first else { return }
      onResume("resume")
    }
    // NM_STATE_CONNECTED_GLOBAL: connected with full access; any other state first arms it.
    let connected: UInt32 = 70
    let armed = Mutex(false)
    server.watchSignal(
      on: .system, sender: "org.freedesktop.NetworkManager", path: "/org/freedesktop/NetworkManager",
      interface: "org.freedesktop.NetworkManager", member: "StateChanged"
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
