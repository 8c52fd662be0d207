import CAdwaita

/// GTK's thread as a Swift actor. GTK may be called only from the thread running GLib's default
/// main context; code marked `@GtkActor` runs there, as idle callbacks of that context. A broker
/// call is awaited from it like any other, and the rest of the function runs on GTK's thread again.
@globalActor public actor GtkActor {
  public static let shared = GtkActor()
  private static let executor = GLibMainContextExecutor()
  public nonisolated var unownedExecutor: UnownedSerialExecutor { Self.executor.asUnownedSerialExecutor() }

  /// Runs `body` as GtkActor code when the caller is GTK's own thread (a signal handler), and
  /// traps otherwise: GTK must never be called from another thread.
  public static func onGtkThread<T>(_ body: @GtkActor () throws -> T) rethrows -> T {
    GtkActor.shared.preconditionIsolated("GTK called from a thread that is not GTK's own")
    // As MainActor.assumeIsolated does: the check above is what makes the isolation true.
    return try withoutActuallyEscaping(body) { body in
      try unsafeBitCast(body, to: (() throws -> T).self)()
    }
  }
}

/// Jobs queued into GLib's default main context (g_idle_add_full, which is thread-safe and never
/// runs the job at once, so two jobs never nest).
final class GLibMainContextExecutor: SerialExecutor {
  func enqueue(_ job: consuming ExecutorJob) {
    let box = Unmanaged.passRetained(JobBox(job: UnownedJob(job), executor: self)).toOpaque()
    g_idle_add_full(
      G_PRIORITY_DEFAULT,
      { data in
        let box = Unmanaged<JobBox>.fromOpaque(data!).takeRetainedValue()
        box.job.runSynchronously(on: box.executor.asUnownedSerialExecutor())
        return 0  // G_SOURCE_REMOVE: once
      }, box, nil)
  }

  func checkIsolated() {
    precondition(
      g_main_context_is_owner(g_main_context_default()) != 0, "GTK called from a thread that is not GTK's own")
  }

  private final class JobBox {
    let job: UnownedJob
    let executor: GLibMainContextExecutor
    init(job: UnownedJob, executor: GLibMainContextExecutor) {
      self.job = job
      self.executor = executor
    }
  }
}
