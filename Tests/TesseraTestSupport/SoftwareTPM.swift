import Foundation

#if canImport(Glibc)
  import Glibc
#endif

/// A swtpm (a software TPM 2.0 that speaks the real protocol) on a Unix socket of its own, with its
/// state in a directory: for the TPM key tests and the benchmark's proof rows. `tcti` is what
/// tpm2-tss's TCTI loader takes (TESSERA_TPM_TCTI). Stopped by `stop()`.
public final class SoftwareTPM: @unchecked Sendable {
  /// swtpm is not installed (scripts/test installs it: apt-get install swtpm).
  public struct NotInstalled: Error, CustomStringConvertible {
    public var description: String { "swtpm is not installed here (scripts/test installs it: apt-get install swtpm)" }
  }

  public struct DidNotStart: Error, CustomStringConvertible {
    public var description: String { "swtpm did not start" }
  }

  public let directory: String
  private let process = Process()

  public static var binary: String? {
    ["/usr/bin/swtpm", "/usr/local/bin/swtpm"].first { access($0, X_OK) == 0 }
  }

  public init(state: String) throws {
    directory = state
    let socket = state + "/swtpm.sock"
    unlink(socket)
    guard let swtpm = Self.binary else { throw NotInstalled() }
    process.executableURL = URL(fileURLWithPath: swtpm)
    process.arguments = [
      "socket", "--tpm2", "--server", "type=unixio,path=\(socket)", "--ctrl", "type=unixio,path=\(socket).ctrl",
      "--tpmstate", "dir=\(state)", "--flags", "not-need-init,startup-clear",
    ]
    // Never the caller's output: a swtpm left behind would hold `swift test`'s pipes open.
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    try process.run()
    // Ready when its socket answers a connect (bounded against a hang only).
    let deadline = Date().addingTimeInterval(30)
    while !Self.accepts(socket) {
      guard process.isRunning, Date() < deadline else {
        stop()
        throw DidNotStart()
      }
      usleep(10_000)
    }
  }

  public var tcti: String { "swtpm:path=\(directory)/swtpm.sock" }

  public static func accepts(_ path: String) -> Bool {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { buffer in
      buffer.copyBytes(from: Array(path.utf8.prefix(buffer.count - 1)))
    }
    return withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
      }
    }
  }

  /// SIGKILL: swtpm waits for its client to hang up before it honours SIGTERM, and what a TPM
  /// keeps across a restart (its seeds) is written when it changes, not at exit.
  public func stop() {
    guard process.isRunning else { return }
    kill(process.processIdentifier, SIGKILL)
    process.waitUntilExit()
  }
}
