import Glibc

/// A value behind a lock, which the project uses where Synchronization's `Mutex` would do.
///
/// Why not `Mutex`: on Linux its lock is a futex driven from the prebuilt standard library, which
/// ThreadSanitizer cannot see, so under `swift test --sanitize=thread` every access a Mutex guards
/// was reported as a data race (issue 25), burying any real one. This is a pthread mutex, which
/// ThreadSanitizer intercepts and understands; uncontended, both cost a few dozen nanoseconds. The
/// value is only reached inside `withLock`, as with `Mutex`.
public final class Locked<Value: Sendable>: @unchecked Sendable {
  private let mutex: UnsafeMutablePointer<pthread_mutex_t>
  private var value: Value

  public init(_ value: Value) {
    mutex = .allocate(capacity: 1)
    mutex.initialize(to: pthread_mutex_t())
    pthread_mutex_init(mutex, nil)
    self.value = value
  }

  deinit {
    pthread_mutex_destroy(mutex)
    mutex.deallocate()
  }

  /// Runs `body` with the value while holding the lock. Not reentrant: `body` must not take it again.
  public func withLock<Result, Failure: Error>(_ body: (inout Value) throws(Failure) -> Result) throws(Failure)
    -> Result
  {
    pthread_mutex_lock(mutex)
    defer { pthread_mutex_unlock(mutex) }
    return try body(&value)
  }
}
