import CSystemd
import Foundation
import Glibc
import TesseraInterface

/// A dbus-daemon of the tests' own (`dbus-daemon --session`), started once for the whole test run
/// and stopped when the process exits, so the bus layer is tested against a real bus daemon with
/// nothing else on it. DBUS_SESSION_BUS_ADDRESS points at it, so BusServer and BusClient (which
/// open "the user's bus") both land there.
public enum PrivateBus {
  public struct Unavailable: Error, CustomStringConvertible {
    public let description: String
  }

  /// The daemon's address; starting it the first time it is asked for.
  static let address: Result<String, Unavailable> = start().map { address in
    setenv("DBUS_SESSION_BUS_ADDRESS", address, 1)
    return address
  }

  /// The shared private bus's address (DBUS_SESSION_BUS_ADDRESS is set to it).
  public static func ensure() throws -> String { try address.get() }

  /// Another private bus, with nothing on it, for the tests that need an empty one.
  public static func another() throws -> String { try start().get() }

  /// Another private bus that starts the services described in `serviceDirectory` (D-Bus
  /// activation files, `[D-BUS Service]` with Name= and Exec=) when they are called.
  public static func activating(serviceDirectory: String) throws -> String {
    let config = serviceDirectory + "/bus.conf"
    let text = """
      <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
       "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
      <busconfig>
        <type>session</type>
        <listen>unix:tmpdir=/tmp</listen>
        <auth>EXTERNAL</auth>
        <servicedir>\(serviceDirectory)</servicedir>
        <policy context="default">
          <allow send_destination="*" eavesdrop="true"/>
          <allow eavesdrop="true"/>
          <allow own="*"/>
        </policy>
      </busconfig>
      """
    try text.write(toFile: config, atomically: true, encoding: .utf8)
    return try start(arguments: "--config-file=\(config)").get()
  }

  private static func start(arguments: String = "--session") -> Result<String, Unavailable> {
    // --fork: the daemon prints its address and pid, then runs on its own; killed at exit.
    guard let pipe = popen("dbus-daemon \(arguments) --fork --nopidfile --print-address=1 --print-pid=1", "r") else {
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
    daemons.withLock { $0.append(pid) }
    _ = reaper
    return .success(address)
  }

  static let daemons = Locked<[pid_t]>([])
  /// Stops every daemon started here when the test process exits.
  static let reaper: Void = { atexit { for pid in PrivateBus.daemons.withLock({ $0 }) { kill(pid, SIGTERM) } } }()

  /// A plain connection to the private bus, for building messages the codec reads and writes.
  public static func connection() throws -> OpaquePointer {
    _ = try ensure()
    var bus: OpaquePointer?
    let r = sd_bus_open_user(&bus)
    guard r >= 0, let bus else { throw Unavailable(description: "sd_bus_open_user: \(r)") }
    return bus
  }
}

/// A unique well-known name per server, so each test has a server of its own on the one bus.
public enum TestNames {
  private static let next = Locked(0)
  public static func make() -> String {
    let n = next.withLock {
      $0 += 1
      return $0
    }
    return "org.tessera.BusTest.Server\(n).P\(getpid())"
  }
}
