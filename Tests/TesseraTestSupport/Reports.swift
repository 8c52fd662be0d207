import TesseraInterface

/// What a callback reports (a call received, a caller gone), in order, for a test to wait on: a
/// test awaits the report it expects, not a time. `wait` returns once the reports satisfy its
/// condition; its bound (30 s unless told) only ends a hang, the expected path never comes near
/// it. The wait blocks no thread: the cooperative pool has 2 threads on a 2-core machine, and a
/// blocking wait there starved the very work it waited for.
public final class Reports<Value: Sendable>: Sendable {
  private struct Waiter {
    let id: Int
    let condition: @Sendable ([Value]) -> Bool
    let continuation: CheckedContinuation<Bool, Never>
  }
  private struct State {
    var values: [Value] = []
    var waiters: [Waiter] = []
    var nextID = 0
    /// Waits whose bound passed before they were registered.
    var expired: Set<Int> = []
  }
  private let state = Locked(State())

  public init() {}

  /// Every report so far, in order.
  public var values: [Value] { state.withLock { $0.values } }

  /// Records a report, and ends each wait it satisfies. Any thread.
  public func append(_ value: Value) {
    let satisfied = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
      state.values.append(value)
      let values = state.values
      let due = state.waiters.filter { $0.condition(values) }
      state.waiters.removeAll { $0.condition(values) }
      return due.map(\.continuation)
    }
    for continuation in satisfied { continuation.resume(returning: true) }
  }

  /// Forgets every report (waits under way go on waiting).
  public func removeAll() { state.withLock { $0.values.removeAll() } }

  /// Returns true once the reports satisfy `condition` (at once when they do already), false when
  /// `seconds` pass first.
  public func wait(seconds: Double = 30, until condition: @escaping @Sendable ([Value]) -> Bool) async -> Bool {
    let id = state.withLock { state -> Int in
      state.nextID += 1
      return state.nextID
    }
    let timer = Task { [self] in
      guard (try? await Task.sleep(for: .seconds(seconds))) != nil else { return }  // cancelled: answered
      expire(id)
    }
    defer { timer.cancel() }
    return await withCheckedContinuation { continuation in
      let answer = state.withLock { state -> Bool? in
        if condition(state.values) { return true }
        if state.expired.remove(id) != nil { return false }
        state.waiters.append(Waiter(id: id, condition: condition, continuation: continuation))
        return nil
      }
      if let answer { continuation.resume(returning: answer) }
    }
  }

  private func expire(_ id: Int) {
    let waiter = state.withLock { state -> Waiter? in
      guard let index = state.waiters.firstIndex(where: { $0.id == id }) else {
        state.expired.insert(id)
        return nil
      }
      return state.waiters.remove(at: index)
    }
    waiter?.continuation.resume(returning: false)
  }
}
