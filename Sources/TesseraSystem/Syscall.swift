import Glibc
import SystemPackage

/// A C library call that failed, with its errno (swift-system's `Errno`, whose description is
/// strerror's text).
public struct SystemCallError: Error, Sendable, CustomStringConvertible {
  public let call: String
  public let errno: Errno
  public init(_ call: String, _ errno: Errno) {
    self.call = call
    self.errno = errno
  }
  public var description: String { "\(call): \(errno)" }
}

/// The one way Tessera calls the C library: errno is read the moment a call fails (before anything
/// else can change it), EINTR is retried (here, or by swift-system's FileDescriptor that these
/// helpers use: never by hand at a call site), and every result is checked.
public enum Syscall {
  /// Runs a call that returns -1 and sets errno on failure, retrying while it is interrupted.
  @discardableResult
  public static func check<T: FixedWidthInteger>(_ call: @autoclosure () -> String, _ body: () -> T)
    throws(SystemCallError) -> T
  {
    while true {
      let result = body()
      guard result == -1 else { return result }
      let code = Errno(rawValue: Glibc.errno)
      if code == .interrupted { continue }
      throw SystemCallError(call(), code)
    }
  }

  /// The text for a negative errno as sd-bus returns it.
  public static func describe(negative result: Int32) -> String { Errno(rawValue: -result).description }
}

/// Files, through swift-system's FileDescriptor (which retries EINTR): the one way Tessera reads a
/// whole file or writes one, in the daemon and in the CLI alike.
extension Syscall {
  /// What is left to read of `fd`; more than `limit` bytes is an error (EFBIG), never a silent cut.
  /// Read straight into the array returned, with no buffer in between: a caller that wipes a
  /// secret it read wipes the only copy (with `limit` at most 64 KiB the array is never moved).
  public static func readAll(_ fd: FileDescriptor, limit: Int) throws(SystemCallError) -> [UInt8] {
    // Read into storage left unfilled: only the bytes read become the array's. (Zeroing the
    // 64 KiB first cost more than reading a small /proc file: 65,000 instructions a connection.)
    var capacity = min(limit, 64 * 1024) + 1
    var failure: Errno?
    var data = [UInt8](unsafeUninitializedCapacity: capacity) { buffer, initialized in
      initialized = fill(fd, buffer, &failure)
    }
    while failure == nil, data.count == capacity, capacity <= limit {
      // Full, and the limit not reached: a file over 64 KiB (never a secret), doubled, the bytes
      // so far copied once (an element-wise append took seconds for a 15 MiB CA bundle in a
      // debug build).
      capacity = min(capacity * 2, limit + 1)
      let sofar = data
      data = [UInt8](unsafeUninitializedCapacity: capacity) { buffer, initialized in
        _ = buffer.initialize(from: sofar)
        initialized = sofar.count + fill(fd, UnsafeMutableBufferPointer(rebasing: buffer[sofar.count...]), &failure)
      }
    }
    if let failure { throw SystemCallError("read", failure) }
    if data.count > limit { throw SystemCallError("read", .fileTooLarge) }
    return data
  }

  /// Reads `fd` into `buffer` until it is full or the end; how many bytes it read. A failed read
  /// ends it, its error in `failure`.
  private static func fill(_ fd: FileDescriptor, _ buffer: UnsafeMutableBufferPointer<UInt8>, _ failure: inout Errno?)
    -> Int
  {
    var count = 0
    while count < buffer.count {
      do {
        let n = try fd.read(into: UnsafeMutableRawBufferPointer(UnsafeMutableBufferPointer(rebasing: buffer[count...])))
        if n == 0 { break }
        count += n
      } catch {
        failure = error as? Errno ?? .ioError
        break
      }
    }
    return count
  }

  /// The whole file at `path` (opened close-on-exec; without following a final symbolic link when
  /// `followLinks` is false), at most `limit` bytes.
  public static func readFile(_ path: String, limit: Int, followLinks: Bool = true) throws(SystemCallError)
    -> [UInt8]
  {
    let fd: FileDescriptor
    do {
      fd = try FileDescriptor.open(
        FilePath(path), .readOnly, options: followLinks ? [.closeOnExec] : [.closeOnExec, .noFollow])
    } catch {
      throw SystemCallError("open(\(path))", error as? Errno ?? .ioError)
    }
    defer { try? fd.close() }
    return try readAll(fd, limit: limit)
  }

  /// Writes all of `bytes` to `fd` (short writes continued, EINTR retried).
  public static func writeAll(_ fd: FileDescriptor, _ bytes: some Sequence<UInt8>) throws(SystemCallError) {
    do { _ = try fd.writeAll(bytes) } catch { throw SystemCallError("write", error as? Errno ?? .ioError) }
  }
}

extension Syscall {
  /// The program a process runs (readlink of /proc/PID/exe); nil when it cannot be read. A
  /// logging hint for callers, and what `tessera status` shows of another broker.
  public static func executable(of pid: UInt32) -> String? {
    var buffer = [CChar](repeating: 0, count: 4096)
    let n = readlink("/proc/\(pid)/exe", &buffer, buffer.count - 1)
    guard n > 0 else { return nil }
    return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
  }
}
/// Reads a whole file (at most `limit` bytes); nil when it cannot be opened or read, or is larger.
public func readFile(_ path: String, limit: Int = 16 << 20) -> [UInt8]? {
  try? Syscall.readFile(path, limit: limit)
}

/// Reads a UTF-8 text file; nil when it cannot be opened.
public func readTextFile(_ path: String) -> String? {
  readFile(path).map { String(decoding: $0, as: UTF8.self) }
}
