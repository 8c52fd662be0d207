import TesseraInterface

/// A gate that work (a token request at the fake IdP, a save to a fake store) waits at while it
/// is shut: a test holds the work in flight, waits until it is held there (the event, not a time),
/// acts meanwhile, then opens the gate. Nothing here blocks a thread.
package final class Gate: Sendable {
  private struct Watcher {
    let id: Int
    let count: Int
    let continuation: CheckedContinuation<Bool, Never>
  }
  private struct State {
    var shut = false
    /// How many arrived while it was shut (held, or let go since).
    var arrived = 0
    var held: [CheckedContinuation<Void, Never>] = []
    var watchers: [Watcher] = []
    var nextID = 0
    /// Waits whose bound passed before they were registered.
    var expired: Set<Int> = []
  }
  private let state = Locked(State())

  package init() {}

  /// From now on, work that comes waits here until `open`.
  package func shut() { state.withLock { $0.shut = true } }

  /// Lets every held work go on, and work that comes from now on pass.
  package func open() {
    let held = state.withLock { state -> [CheckedContinuation<Void, Never>] in
      state.shut = false
      defer { state.held.removeAll() }
      return state.held
    }
    for continuation in held { continuation.resume() }
  }

  /// The work's side: returns at once while the gate is open, else once it is opened.
  package func pass() async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
      let (passes, due) = state.withLock { state -> (Bool, [CheckedContinuation<Bool, Never>]) in
        guard state.shut else { return (true, []) }
        state.held.append(continuation)
        state.arrived += 1
        let arrived = state.arrived
        let due = state.watchers.filter { $0.count <= arrived }
        state.watchers.removeAll { $0.count <= arrived }
        return (false, due.map(\.continuation))
      }
      for watcher in due { watcher.resume(returning: true) }
      if passes { continuation.resume() }
    }
  }

  /// Returns true once `count` works have arrived at the shut gate (at once when they have), false
  /// when `seconds` pass first: the bound only ends a hang.
  package func held(_ count: Int = 1, seconds: Double = 30) async -> Bool {
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
        if state.arrived >= count { return true }
        if state.expired.remove(id) != nil { return false }
        state.watchers.append(Watcher(id: id, count: count, continuation: continuation))
        return nil
      }
      if let answer { continuation.resume(returning: answer) }
    }
  }

  private func expire(_ id: Int) {
    let watcher = state.withLock { state -> Watcher? in
      guard let index = state.watchers.firstIndex(where: { $0.id == id }) else {
        state.expired.insert(id)
        return nil
      }
      return state.watchers.remove(at: index)
    }
    watcher?.continuation.resume(returning: false)
  }
}
