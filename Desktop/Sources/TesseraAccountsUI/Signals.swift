import CAdwaita

/// GObject signals with Swift closures: the closure goes in as the handler's data (retained), and
/// GLib releases it when the handler is disconnected or the object finalized.
@GtkActor
enum Signals {
  private final class Handler {
    let body: @GtkActor () -> Void
    init(_ body: @escaping @GtkActor () -> Void) { self.body = body }
  }

  /// Connects `body` to a signal whose handler takes the instance and the data only
  /// ("clicked", "activate", "close-request" ...).
  static func connect(_ instance: UnsafeMutableRawPointer, _ signal: String, _ body: @escaping @GtkActor () -> Void) {
    let data = Unmanaged.passRetained(Handler(body)).toOpaque()
    let thunk: @convention(c) (UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) -> Void = { _, data in
      let handler = Unmanaged<Handler>.fromOpaque(data!).takeUnretainedValue()
      GtkActor.onGtkThread { handler.body() }
    }
    let release: @convention(c) (UnsafeMutableRawPointer?, UnsafeMutablePointer<GClosure>?) -> Void = { data, _ in
      Unmanaged<Handler>.fromOpaque(data!).release()
    }
    g_signal_connect_data(instance, signal, unsafeBitCast(thunk, to: GCallback.self), data, release, GConnectFlags(0))
  }
}
