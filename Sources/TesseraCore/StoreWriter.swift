import Synchronization

/// Writes to the Secret Service, one batch after another in the order they were queued, with the
/// writes that failed earlier first. On failure the unwritten operations are kept and retried, still
/// in order, before the next write (`retryLater`); or dropped, for a caller that rolls its change
/// back instead. Queueing never suspends, so writes land in the order the token actor asks for them.
final class StoreWriter: Sendable {
  private struct State {
    /// Operations that failed, retried before the next write.
    var pending: [TokenCache.StoreOperation] = []
    /// The end of the last write queued.
    var lane: Task<Void, Never>?
  }

  private let store: any SecretStore
  private let state = Mutex(State())

  init(store: any SecretStore) { self.store = store }

  /// Are there failed operations waiting for a retry?
  var hasPending: Bool { state.withLock { !$0.pending.isEmpty } }

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
    let queue = older + operations
    guard !queue.isEmpty else { return }
    do {
      try await store.apply(queue)
    } catch {
      let done = (error as? StoreBatchError)?.completed ?? 0
      // Without retryLater only the older failed writes stay queued; this batch is dropped.
      let kept = retryLater ? Array(queue[done...]) : Array(queue[min(done, older.count)..<older.count])
      state.withLock { $0.pending = kept }
      throw (error as? StoreBatchError)?.error ?? error
    }
  }
}
