import Glibc

/// Starts a dedicated OS thread (not one of Swift's cooperative pool) running `body`.
/// Used for the sd-bus loop and the loopback listener, whose work blocks.
func startThread(name: String, _ body: @escaping @Sendable () -> Void) {
  final class Box: @unchecked Sendable {  // handed to exactly one thread, which consumes it
    let body: @Sendable () -> Void
    let name: String
    init(_ body: @escaping @Sendable () -> Void, _ name: String) {
      self.body = body
      self.name = name
    }
  }
  let box = Unmanaged.passRetained(Box(body, name)).toOpaque()
  var thread = pthread_t()
  let r = pthread_create(
    &thread, nil,
    { raw in
      let box = Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue()
      box.body()
      return nil
    }, box)
  precondition(r == 0, "pthread_create failed: \(r)")
  pthread_detach(thread)
}
