import CSystemd
import Foundation
import Glibc

/// A dbus-daemon of the tests' own (`dbus-daemon --session`), started once for the whole test run
/// and stopped when the process exits, so the bus layer is tested against a real bus daemon with
/// nothing else on it. DBUS_SESSION_BUS_ADDRESS points at it, so BusServer and BusClient (which
/// open "the user's bus") both land there.
enum PrivateBus {
  struct Unavailable: Error, CustomStringConvertible {
    let description: String
  }

  /// The daemon's address; starting it the first time it is asked for.
  static let address: Result<String, Unavailable> = start()

  static func ensure() throws -> String { try address.get() }

  private static func start() -> Result<String, Unavailable> {
    // --fork: the daemon prints its address and pid, then runs on its own; killed at exit.
    guard let pipe = popen("dbus-daemon --session --fork --nopidfile --print-address=1 --print-pid=1", "r") else {
      return .failure(Unavailable(description: "cannot run dbus-daemon (apt-get install dbus)"))
    }
    defer { pclose(pipe) }
    func line() -> String? {
      var buffer = [CChar](repeating: 0, count: 4096)
      guard fgets(&buffer, Int32(buffer.count), pipe) != nil else { return nil }
      return String(cString: buffer).trimmingCharacters(in: .whitespacesAndNewlines)
    }
    guard let address = line(), !address.isEmpty, let pid = line().flatMap({ pid_t($0) }) else {
      return .failure(Unavailable(description: "dbus-daemon printed no address (is the dbus package installed?)"))
    }
    setenv("DBUS_SESSION_BUS_ADDRESS", address, 1)
    daemon = pid
    atexit { if PrivateBus.daemon > 0 { kill(PrivateBus.daemon, SIGTERM) } }
    return .success(address)
  }

  nonisolated(unsafe) static var daemon: pid_t = 0

  /// A plain connection to the private bus, for building messages the codec reads and writes.
  static func connection() throws -> OpaquePointer {
    _ = try ensure()
    var bus: OpaquePointer?
    let r = sd_bus_open_user(&bus)
    guard r >= 0, let bus else { throw Unavailable(description: "sd_bus_open_user: \(r)") }
    return bus
  }
}

/// A unique well-known name per server, so each test has a server of its own on the one bus.
enum TestNames {
  nonisolated(unsafe) private static var next = 0
  private static let lock = NSLock()
  static func make() -> String {
    lock.lock()
    defer { lock.unlock() }
    next += 1
    return "org.tessera.BusTest.Server\(next).P\(getpid())"
  }
}
