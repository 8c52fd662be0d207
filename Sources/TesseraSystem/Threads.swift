import CTesseraSystemShim
import Glibc
import SystemPackage

/// Starts a dedicated OS thread (not one of Swift's cooperative pool) running `body`. Every thread
/// Tessera makes itself comes from here: the sd-bus loop, each HTTP request (libcurl), each
/// redirect wait of the loopback listener, the browser reaper, the idle-connection tidy-up, and
/// each call of AsyncTesseraBroker. libsecret's calls run on a serial dispatch queue of their own
/// (SecretServiceStore). None of it blocks the cooperative pool.
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
      // Named for ps, gdb and crash reports (at most 15 bytes), not after the thread that made it.
      _ = tessera_name_this_thread(box.name)
      box.body()
      return nil
    }, box.toOpaque())
  guard r == 0 else {
    box.release()
    throw SystemCallError("pthread_create(\(name))", Errno(rawValue: r))
  }
  pthread_detach(thread)
}
