import Synchronization
import TesseraInterface
import TesseraSystem

/// The Tessera broker for Swift concurrency. sd-bus's client calls block, so each call runs on a
/// thread of its own (never on the cooperative pool) with a connection of its own: an interactive
/// sign-in that waits minutes for the user holds no task thread, and other calls go on meanwhile.
/// Cancelling the calling task gives the call up within 100 ms and closes its connection; the
/// broker then ends that caller's sign-in (a caller that leaves the bus gets nothing).
public struct AsyncTesseraBroker: Sendable {
  public init() {}

  /// Interactive sign-in. `onInteraction` is called (on the call's thread) when the user must act:
  /// open a URL, or enter a code on another device.
  public func acquireToken(
    clientID: String = "", scopes: [String] = [], options: TesseraTokenOptions = .init(),
    onInteraction: (@Sendable (TesseraInteraction) -> Void)? = nil
  ) async throws(TesseraClientError) -> TesseraToken {
    try await run { broker throws(TesseraClientError) in
      try broker.acquireToken(clientID: clientID, scopes: scopes, options: options, onInteraction: onInteraction)
    }
  }

  public func acquireTokenSilent(
    clientID: String = "", scopes: [String] = [], accountID: String = "", options: TesseraTokenOptions = .init()
  ) async throws(TesseraClientError) -> TesseraToken {
    try await run { broker throws(TesseraClientError) in
      try broker.acquireTokenSilent(clientID: clientID, scopes: scopes, accountID: accountID, options: options)
    }
  }

  /// Drops `token` when it is the broker's cached one (see TesseraBroker.rejectToken).
  @discardableResult
  public func rejectToken(
    _ token: String, clientID: String = "", accountID: String = "", options: TesseraTokenOptions = .init()
  ) async throws(TesseraClientError) -> Bool {
    try await run { broker throws(TesseraClientError) in
      try broker.rejectToken(token, clientID: clientID, accountID: accountID, options: options)
    }
  }

  public func accounts(clientID: String? = nil, authority: String? = nil, username: String? = nil)
    async throws(TesseraClientError) -> [TesseraAccount]
  {
    try await run { broker throws(TesseraClientError) in
      try broker.accounts(clientID: clientID, authority: authority, username: username)
    }
  }

  public func signOut(
    accountID: String, clientID: String? = nil, revoke: Bool = true, browser: Bool = false
  ) async throws(TesseraClientError) {
    try await run { broker throws(TesseraClientError) in
      try broker.signOut(accountID: accountID, clientID: clientID, revoke: revoke, browser: browser)
    }
  }

  /// Makes an account the current one of its identity provider (see TesseraBroker).
  public func setCurrentAccount(_ account: String, authority: String? = nil) async throws(TesseraClientError)
    -> TesseraAccount
  {
    try await run { broker throws(TesseraClientError) in try broker.setCurrentAccount(account, authority: authority) }
  }

  /// Moves every item to another store and makes tesserad use it (see TesseraBroker).
  public func moveStore(to: String) async throws(TesseraClientError) -> TesseraBroker.StoreMove {
    try await run { broker throws(TesseraClientError) in try broker.moveStore(to: to) }
  }

  /// The broker's health report (GetStatus).
  public func status() async throws(TesseraClientError) -> StatusReport.Report {
    try await run { broker throws(TesseraClientError) in try broker.status() }
  }

  /// The broker's news as it comes (see TesseraBroker.watchEvents), on a connection and a thread
  /// of its own: first `.watching` (read the state then), then each change. The stream ends with
  /// an error when tesserad stops; ending the iteration (or cancelling its task) stops the watch
  /// within 200 ms and closes the connection.
  public func events(answeringQuestions: Bool = false) -> AsyncThrowingStream<TesseraEvent, any Error> {
    AsyncThrowingStream { continuation in
      let stop = Flag()
      continuation.onTermination = { _ in stop.set() }
      do {
        try startThread(name: "tessera-events") {
          do throws(TesseraClientError) {
            let broker = try TesseraBroker()
            try broker.watchEvents(answeringQuestions: answeringQuestions, until: { stop.isSet }) {
              continuation.yield($0)
            }
            continuation.finish()
          } catch {
            continuation.finish(throwing: error)
          }
        }
      } catch {
        continuation.finish(
          throwing: TesseraClientError.unreachable("Could not start a thread for the broker's events: \(error)"))
      }
    }
  }

  /// The accounts (ids) that need a sign-in (the AttentionNeeded property).
  public func attentionNeeded() async throws(TesseraClientError) -> [String] {
    try await run { broker throws(TesseraClientError) in try broker.attentionNeeded() }
  }

  /// Per-app access control: the grants (ListGrants; see TesseraBroker).
  public func grants() async throws(TesseraClientError) -> [GrantInfo] {
    try await run { broker throws(TesseraClientError) in try broker.grants() }
  }

  /// Takes an app's grants away (all its clients', or one client's); returns how many.
  @discardableResult
  public func revoke(app: String, clientID: String? = nil) async throws(TesseraClientError) -> UInt32 {
    try await run { broker throws(TesseraClientError) in try broker.revoke(app: app, clientID: clientID) }
  }

  /// The DPoP header value for one request with a key-bound access token (see TesseraBroker.proof).
  public func proof(method: String, url: String, token: String, nonce: String? = nil) async throws(TesseraClientError)
    -> String
  {
    try await run { broker throws(TesseraClientError) in
      try broker.proof(method: method, url: url, token: token, nonce: nonce)
    }
  }

  /// Takes an app's grants for one account away (see TesseraBroker.revokeGrant); returns how many.
  @discardableResult
  public func revokeGrant(app: String, clientID: String? = nil, account: String) async throws(TesseraClientError)
    -> UInt32
  {
    try await run { broker throws(TesseraClientError) in
      try broker.revokeGrant(app: app, clientID: clientID, account: account)
    }
  }

  /// The user's answer to a question the broker asked (see TesseraBroker.answerQuestion).
  public func answerQuestion(id: String, answer: String, remember: Bool = false) async throws(TesseraClientError) {
    try await run { broker throws(TesseraClientError) in
      try broker.answerQuestion(id: id, answer: answer, remember: remember)
    }
  }

  /// Who serves Microsoft's broker protocol on the session bus (see TesseraBroker.microsoftFront).
  public func microsoftFront() async throws(TesseraClientError) -> TesseraBroker.MicrosoftFront {
    try await run { broker throws(TesseraClientError) in try broker.microsoftFront() }
  }

  /// The access decisions since tesserad started (GetAccessLog).
  public func accessLog() async throws(TesseraClientError) -> [AccessRecord] {
    try await run { broker throws(TesseraClientError) in try broker.accessLog() }
  }

  /// The live forwards (ListForwards).
  public func forwards() async throws(TesseraClientError) -> [ForwardInfo] {
    try await run { broker throws(TesseraClientError) in try broker.forwards() }
  }

  /// Stops a forward (RemoveForward).
  public func removeForward(name: String) async throws(TesseraClientError) {
    try await run { broker throws(TesseraClientError) in try broker.removeForward(name: name) }
  }

  /// Runs `body` with a connection of its own on a thread of its own; the task's cancellation
  /// gives it up.
  private func run<T: Sendable>(_ body: @escaping @Sendable (TesseraBroker) throws(TesseraClientError) -> T)
    async throws(TesseraClientError) -> T
  {
    let cancelled = Flag()
    let result: Result<T, TesseraClientError> = await withTaskCancellationHandler {
      await withCheckedContinuation { (done: CheckedContinuation<Result<T, TesseraClientError>, Never>) in
        do {
          try startThread(name: "tessera-client") {
            done.resume(
              returning: Result { () throws(TesseraClientError) -> T in
                let broker = try TesseraBroker()
                broker.stopped = { cancelled.isSet }
                return try body(broker)
              })
          }
        } catch {
          done.resume(returning: .failure(.unreachable("Could not start a thread for the call: \(error)")))
        }
      }
    } onCancel: {
      cancelled.set()
    }
    return try result.get()
  }

  private final class Flag: Sendable {
    private let value = Atomic<Bool>(false)
    var isSet: Bool { value.load(ordering: .acquiring) }
    func set() { value.store(true, ordering: .releasing) }
  }
}
