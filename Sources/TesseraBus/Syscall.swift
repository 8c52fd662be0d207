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
/// else can change it), EINTR is retried here and nowhere else, and every result is checked.
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
