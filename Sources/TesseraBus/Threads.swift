import Glibc
import SystemPackage

/// Starts a dedicated OS thread (not one of Swift's cooperative pool) running `body`. The one place
/// Tessera creates threads: the sd-bus loop, the loopback listener's connections, the browser
/// reaper, and blocking libsecret/libcurl work never run on the cooperative pool.
public func startThread(name: String, _ body: @escaping @Sendable () -> Void) throws(SystemCallError) {
  final class Box: @unchecked Sendable {  // handed to exactly one thread, which consumes it
    let body: @Sendable () -> Void
    let name: String
    init(_ body: @escaping @Sendable () -> Void, _ name: String) {
      self.body = body
      self.name = name
    }
  }
  let box = Unmanaged.passRetained(Box(body, name))
  var thread = pthread_t()
  let r = pthread_create(
    &thread, nil,
    { raw in
      let box = Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue()
      box.body()
      return nil
    }, box.toOpaque())
  guard r == 0 else {
    box.release()
    throw SystemCallError("pthread_create(\(name))", Errno(rawValue: r))
  }
  pthread_detach(thread)
}
