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

  private final class ResponseHandler {
    let body: @GtkActor (String) -> Void
    init(_ body: @escaping @GtkActor (String) -> Void) { self.body = body }
  }

  /// Connects `body` to AdwMessageDialog's "response" (the instance, the response id, the data).
  static func connectResponse(_ instance: UnsafeMutableRawPointer, _ body: @escaping @GtkActor (String) -> Void) {
    let data = Unmanaged.passRetained(ResponseHandler(body)).toOpaque()
    let thunk: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void = {
      _, response, data in
      let handler = Unmanaged<ResponseHandler>.fromOpaque(data!).takeUnretainedValue()
      let id = response.map { String(cString: $0) } ?? ""
      GtkActor.onGtkThread { handler.body(id) }
    }
    let release: @convention(c) (UnsafeMutableRawPointer?, UnsafeMutablePointer<GClosure>?) -> Void = { data, _ in
      Unmanaged<ResponseHandler>.fromOpaque(data!).release()
    }
    g_signal_connect_data(
      instance, "response", unsafeBitCast(thunk, to: GCallback.self), data, release, GConnectFlags(0))
  }

  /// Connects `body` to a signal whose handler takes one pointer argument between the instance and
  /// the data ("notify::PROPERTY" with its GParamSpec, "row-activated" with its row).
  static func connectWithArgument(
    _ instance: UnsafeMutableRawPointer, _ signal: String, _ body: @escaping @GtkActor () -> Void
  ) {
    let data = Unmanaged.passRetained(Handler(body)).toOpaque()
    let thunk: @convention(c) (UnsafeMutableRawPointer?, UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) -> Void = {
      _, _, data in
      let handler = Unmanaged<Handler>.fromOpaque(data!).takeUnretainedValue()
      GtkActor.onGtkThread { handler.body() }
    }
    let release: @convention(c) (UnsafeMutableRawPointer?, UnsafeMutablePointer<GClosure>?) -> Void = { data, _ in
      Unmanaged<Handler>.fromOpaque(data!).release()
    }
    g_signal_connect_data(instance, signal, unsafeBitCast(thunk, to: GCallback.self), data, release, GConnectFlags(0))
  }

  private final class StringHandler {
    let body: @GtkActor (String) -> Void
    init(_ body: @escaping @GtkActor (String) -> Void) { self.body = body }
  }

  /// Connects `body` to a GSimpleAction's "activate" with a string parameter (the instance, the
  /// GVariant, the data); a parameter that is not a string is ignored.
  static func connectStringAction(_ action: UnsafeMutableRawPointer, _ body: @escaping @GtkActor (String) -> Void) {
    let data = Unmanaged.passRetained(StringHandler(body)).toOpaque()
    let thunk: @convention(c) (UnsafeMutableRawPointer?, OpaquePointer?, UnsafeMutableRawPointer?) -> Void = {
      _, parameter, data in
      let handler = Unmanaged<StringHandler>.fromOpaque(data!).takeUnretainedValue()
      guard let parameter, g_variant_is_of_type(parameter, g_variant_type_checked_("s")) != 0,
        let text = g_variant_get_string(parameter, nil)
      else { return }
      let value = String(cString: text)
      GtkActor.onGtkThread { handler.body(value) }
    }
    let release: @convention(c) (UnsafeMutableRawPointer?, UnsafeMutablePointer<GClosure>?) -> Void = { data, _ in
      Unmanaged<StringHandler>.fromOpaque(data!).release()
    }
    g_signal_connect_data(action, "activate", unsafeBitCast(thunk, to: GCallback.self), data, release, GConnectFlags(0))
  }
}
