import CAdwaita
import Glibc
import TesseraClient
import TesseraInterface

/// What the broker told the app last, read again part by part as its signals say what changed:
/// AccountsChanged and AttentionNeeded (accounts, status, log), ManagementChanged (grants,
/// forwards, the configuration). The access log has no signal (it would announce every token to
/// the bus): it is read with the accounts, when the Activity page is shown, and by Refresh.
@GtkActor
final class BrokerModel {
  let broker = AsyncTesseraBroker()
  private(set) var accounts: [AccountInfo] = []
  private(set) var status: StatusReport.Report?
  private(set) var grants: [GrantInfo] = []
  private(set) var log: [AccessRecord] = []
  private(set) var forwards: [ForwardInfo] = []
  private(set) var microsoft: TesseraBroker.MicrosoftFront?
  /// Why the broker could not be read, in words (nil when it was).
  private(set) var problem: String?
  private var listeners: [@GtkActor () -> Void] = []
  /// The window dialogs belong to.
  var window: Widget?
  /// Tells the user of a failed action or a pending sign-in (the window's banner).
  var say: @GtkActor (String?) -> Void = { _ in }

  var rows: [AccountRow] { status.map { AccountRow.rows(accounts: accounts, status: $0) } ?? [] }

  static var now: Int64 { Int64(time(nil)) }

  /// Calls `listener` after every change (the pages redraw from the model).
  func onChange(_ listener: @escaping @GtkActor () -> Void) { listeners.append(listener) }

  private func changed() { for listener in listeners { listener() } }

  /// Reads everything, then follows the broker's signals. When tesserad stops, says so and
  /// watches again after a pause (D-Bus activation may start it again).
  func follow() async {
    var answering = true
    while !Task.isCancelled {
      let events = broker.events(answeringQuestions: answering)
      let watch = Task { @GtkActor in
        for try await event in events {
          switch event {
          case .watching: await self.loadAll()
          case .accountsChanged, .attentionNeeded: await self.loadAccounts()
          case .managementChanged(.grants): await self.load(grants: true)
          case .managementChanged(.forwards): await self.load(forwards: true)
          case .managementChanged(.config): await self.load(status: true)
          case .question(let id, let info): self.onQuestion(id, info)
          }
        }
      }
      // Watching without the questions (the broker refused them): try to take them again in a
      // while, as the other window (or a connection that had not closed yet) may be gone by then.
      let retry =
        answering
        ? nil
        : Task { @GtkActor in
          try await Task.sleep(for: .seconds(30))
          watch.cancel()
        }
      do {
        try await watch.value
        if !answering, watch.isCancelled {
          answering = true
          continue
        }
      } catch TesseraClientError.broker(let error) where error.code == .accessDenied && answering {
        // The broker would not let this app take its questions (another window of it does, say):
        // it shows the accounts all the same, and the desktop's own dialogs ask.
        say("Tessera's questions are asked elsewhere for now: \(error.message)")
        answering = false
        continue
      } catch {
        retry?.cancel()
        problem = "Tessera's broker is not running (\(error)). Waiting for it to start…"
        changed()
      }
      retry?.cancel()
      try? await Task.sleep(for: .seconds(2))
    }
  }

  /// Shows a question from the broker (QuestionDialog).
  var onQuestion: @GtkActor (String, [String: BusValue]) -> Void = { _, _ in }

  func loadAll() async {
    await load(accounts: true, status: true, grants: true, log: true, forwards: true, microsoft: true)
  }

  func loadAccounts() async { await load(accounts: true, status: true, log: true) }

  func refreshLog() async { await load(log: true) }

  /// Reads the parts asked for, side by side; a part that fails keeps its last value and the
  /// failure is shown.
  func load(
    accounts readAccounts: Bool = false, status readStatus: Bool = false, grants readGrants: Bool = false,
    log readLog: Bool = false, forwards readForwards: Bool = false, microsoft readMicrosoft: Bool = false
  ) async {
    let broker = broker
    async let accounts = Self.read(readAccounts) { () async throws(TesseraClientError) in try await broker.accounts() }
    async let status = Self.read(readStatus) { () async throws(TesseraClientError) in try await broker.status() }
    async let grants = Self.read(readGrants) { () async throws(TesseraClientError) in try await broker.grants() }
    async let log = Self.read(readLog) { () async throws(TesseraClientError) in try await broker.accessLog() }
    async let forwards = Self.read(readForwards) { () async throws(TesseraClientError) in try await broker.forwards() }
    async let microsoft = Self.read(readMicrosoft) { () async throws(TesseraClientError) in
      try await broker.microsoftFront()
    }
    var failures: [String] = []
    func take<T>(_ result: Result<T, TesseraClientError>?, _ what: String, _ store: (T) -> Void) {
      switch result {
      case .success(let value)?: store(value)
      case .failure(let error)?: failures.append("Could not read \(what): \(error)")
      case nil: break
      }
    }
    take(await accounts, "the accounts") { self.accounts = $0 }
    take(await status, "the broker's status") { self.status = $0 }
    take(await grants, "the apps' grants") { self.grants = $0 }
    take(await log, "the access log") { self.log = $0 }
    take(await forwards, "the forwards") { self.forwards = $0 }
    // Microsoft's front is on the session bus only: without one, there is nothing to show.
    if case .success(let front)? = await microsoft { self.microsoft = front }
    problem = failures.isEmpty ? nil : failures.joined(separator: " ")
    changed()
  }

  /// `body`'s result when `wanted`, nil when not asked for.
  private nonisolated static func read<T: Sendable>(
    _ wanted: Bool, _ body: @Sendable () async throws(TesseraClientError) -> T
  ) async -> Result<T, TesseraClientError>? {
    guard wanted else { return nil }
    do { return .success(try await body()) } catch { return .failure(error) }
  }

  /// Runs a broker call for a button; a failure is said in words, and the parts it changes are
  /// read again (their signals would do it too, a moment later).
  @discardableResult
  func run(
    _ what: String, then reload: @escaping @GtkActor (BrokerModel) async -> Void = { await $0.loadAll() },
    _ body: @escaping @Sendable (AsyncTesseraBroker) async throws -> Void
  ) -> Task<Void, Never> {
    let broker = broker
    return Task { @GtkActor in
      do {
        try await body(broker)
      } catch {
        // A cancelled call was the user's choice, said by whoever cancelled it.
        if !Task.isCancelled { self.say("Could not \(what): \(error)") }
      }
      await reload(self)
    }
  }
}
