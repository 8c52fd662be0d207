import Logging
import Synchronization

/// Writes to the Secret Service, one batch after another in the order they were queued, with the
/// writes that failed earlier first. On failure the unwritten operations are kept and retried, still
/// in order, before the next write (`retryLater`); or dropped, for a caller that rolls its change
/// back instead. Queueing never suspends, so writes land in the order the token actor asks for them.
///
/// A store that is away (gone, locked) keeps everything queued for as long as it takes. A store that
/// is there but refuses one operation (`StoreBatchError.rejected`) gets it again at the next two
/// writes; the third refusal drops it (`onDrop` says which), so one bad item never holds back every
/// later write.
final class StoreWriter: Sendable {
  /// Refusals by a store that is there before an operation is dropped.
  static let refusalsBeforeDropping = 3

  private struct Queued {
    var operation: TokenCache.StoreOperation
    /// Kept for a retry when it fails (false: the caller rolls its change back instead).
    var keep: Bool
    /// Queued by this write (not left over from an earlier one).
    var own = false
    var refusals = 0
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
  private let state = Mutex(State())

  /// `onDrop` hears of each operation dropped after its last refusal; `onPending`, of each write
  /// that failed and left operations waiting for a retry.
  init(
    store: any SecretStore, onDrop: @escaping @Sendable (TokenCache.StoreOperation, any Error) -> Void = { _, _ in },
    onPending: @escaping @Sendable () -> Void = {}
  ) {
    self.store = store
    self.onDrop = onDrop
    self.onPending = onPending
  }

  /// Are there failed operations waiting for a retry?
  var hasPending: Bool { state.withLock { !$0.pending.isEmpty } }

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

  /// Runs on the lane: no other write runs meanwhile.
  private func write(_ operations: [TokenCache.StoreOperation], retryLater: Bool) async throws {
    let older = state.withLock { state in
      defer { state.pending = [] }
      return state.pending
    }
    var queue = older + operations.map { Queued(operation: $0, keep: retryLater, own: true) }
    // The error of an operation of this write that was dropped: the caller hears of it.
    var ownFailure: (any Error)?
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
          queue[0].refusals += 1
          if queue[0].refusals >= Self.refusalsBeforeDropping {
            // Refused again by a store that is there: drop it and write the rest.
            let dropped = queue.removeFirst()
            onDrop(dropped.operation, cause)
            if dropped.own { ownFailure = cause }
            continue
          }
        }
        // Away, or refused too few times yet: keep what may be retried, in order.
        // (An operation of a caller that rolls back is never retried.)
        let kept = queue.filter(\.keep).map { Queued(operation: $0.operation, keep: true, refusals: $0.refusals) }
        state.withLock { $0.pending = kept }
        if !kept.isEmpty { onPending() }
        throw cause
      }
    }
    if let ownFailure { throw ownFailure }
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
