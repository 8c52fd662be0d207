import Logging
import TesseraInterface

/// Writes to the Secret Service, one batch after another in the order they were queued, with the
/// writes that failed earlier first. On failure the unwritten operations are kept and retried, still
/// in order, before the next write (`retryLater`); or dropped, for a caller that rolls its change
/// back instead. Queueing never suspends, so writes land in the order the token actor asks for them.
///
/// A store that is away (gone, locked) keeps everything queued for as long as it takes. A store that
/// is there but refuses one operation (`StoreBatchError.rejected`) gets it again at later writes;
/// the third refusal, at least `refusalSpacing` seconds after the one before, drops it (`onDrop`
/// says which), so one bad item never holds back every later write, and a burst of calls (each
/// retries first) cannot use the three chances up in a moment.
final class StoreWriter: Sendable {
  /// Refusals by a store that is there before an operation is dropped.
  static let refusalsBeforeDropping = 3
  /// Refusals closer together than this count once.
  static let refusalSpacing = 1.0

  private struct Queued {
    var operation: TokenCache.StoreOperation
    /// Kept for a retry when it fails (false: the caller rolls its change back instead).
    var keep: Bool
    var refusals = 0
    /// When the last refusal counted (seconds on `time`).
    var lastRefusal: Double? = nil
  }

  private struct State {
    /// Operations that failed, retried before the next write.
    var pending: [Queued] = []
    /// The end of the last write queued.
    var lane: Task<Void, Never>?
  }

  private let store: any SecretStore
  private let onDrop: @Sendable (TokenCache.StoreOperation, any Error) -> Void
  private let onPending: @Sendable () -> Void
  /// Seconds on a steady clock, for the spacing of refusals.
  private let time: @Sendable () -> Double
  private let state = Locked(State())

  /// `onDrop` hears of each operation dropped after its last refusal; `onPending`, of each write
  /// that failed and left operations waiting for a retry.
  init(
    store: any SecretStore, onDrop: @escaping @Sendable (TokenCache.StoreOperation, any Error) -> Void = { _, _ in },
    onPending: @escaping @Sendable () -> Void = {}, time: @escaping @Sendable () -> Double = { SystemClock().awake() }
  ) {
    self.store = store
    self.onDrop = onDrop
    self.onPending = onPending
    self.time = time
  }

  /// Are there failed operations waiting for a retry?
  var hasPending: Bool { pendingCount > 0 }

  /// How many operations wait for a retry.
  var pendingCount: Int { state.withLock { $0.pending.count } }

  /// Queues a write behind every write queued before it; await the task for its outcome.
  @discardableResult
  func enqueue(_ operations: [TokenCache.StoreOperation], retryLater: Bool = true) -> Task<Void, any Error> {
    state.withLock { state in
      let previous = state.lane
      let write = Task { () async throws -> Void in
        await previous?.value
        try await self.write(operations, retryLater: retryLater)
      }
      state.lane = Task { _ = await write.result }
      return write
    }
  }

  /// Waits for every write queued so far (at shutdown, and in tests that read the store).
  func finish() async {
    await state.withLock { $0.lane }?.value
  }

  /// Runs `body` on the write lane: after every write queued before it (those that failed earlier
  /// are written first; when they still cannot be, this throws and `body` does not run), and
  /// before any queued after it.
  func exclusive<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
    let task: Task<T, any Error> = state.withLock { state in
      let previous = state.lane
      let run = Task { () async throws -> T in
        await previous?.value
        try await self.write([], retryLater: true)
        return try await body()
      }
      state.lane = Task { _ = await run.result }
      return run
    }
    return try await task.value
  }

  /// Runs on the lane: no other write runs meanwhile.
  private func write(_ operations: [TokenCache.StoreOperation], retryLater: Bool) async throws {
    let older = state.withLock { state in
      defer { state.pending = [] }
      return state.pending
    }
    var queue = older + operations.map { Queued(operation: $0, keep: retryLater) }
    while !queue.isEmpty {
      do {
        try await store.apply(queue.map(\.operation))
        queue = []
      } catch {
        let batch = error as? StoreBatchError
        let cause = batch?.error ?? error
        let done = min(batch?.completed ?? 0, queue.count)
        queue.removeFirst(done)
        if batch?.rejected == true, let first = queue.first, first.keep {
          let now = time()
          if first.lastRefusal.map({ now - $0 >= Self.refusalSpacing }) ?? true {
            queue[0].refusals += 1
            queue[0].lastRefusal = now
          }
          if queue[0].refusals >= Self.refusalsBeforeDropping {
            // Refused again by a store that is there: drop it and write the rest.
            onDrop(queue.removeFirst().operation, cause)
            continue
          }
        }
        // Away, or refused too few times yet: keep what may be retried, in order.
        // (An operation of a caller that rolls back is never retried.)
        let kept = queue.filter(\.keep)
        state.withLock { $0.pending = kept }
        if !kept.isEmpty { onPending() }
        throw cause
      }
    }
  }

  /// What the log may say of an operation: its item's kind and ids, never its secret or label.
  static func describe(_ operation: TokenCache.StoreOperation) -> [String: Logger.MetadataValue] {
    let (verb, attributes): (String, [String: String]) =
      switch operation {
      case .save(let item): ("save", item.attributes)
      case .delete(let attributes): ("delete", attributes)
      }
    var metadata: [String: Logger.MetadataValue] = ["operation": "\(verb)"]
    for key in ["kind", "account_id", "client_id", "app"] {
      if let value = attributes[key] { metadata[key] = "\(value)" }
    }
    return metadata
  }
}
