import Glibc
import Synchronization
import TesseraCore

/// Loopback redirect listeners (RFC 8252 §7.3): 127.0.0.1 (and ::1 when the redirect URI names
/// `localhost`), any free port unless a fixed one is configured.
public struct LoopbackListenerFactory: RedirectListenerFactory {
  public init() {}

  public func listen(port: UInt16, hostName: String) throws -> any RedirectListener {
    try LoopbackListener(port: port, hostName: hostName)
  }
}

final class LoopbackListener: RedirectListener, @unchecked Sendable {
  // Invariant for @unchecked Sendable: the sockets are used by the one serving thread; `close()`
  // only flips `closed` and writes to the wake pipe; descriptors are closed in deinit.
  private let sockets: [Int32]
  private let wake: (read: Int32, write: Int32)
  private let closed = Mutex(false)
  let redirectURI: String

  init(port requestedPort: UInt16, hostName: String) throws {
    let v4 = try Self.bind4(port: requestedPort)
    var sockets = [v4.fd]
    if hostName == "localhost", let v6 = try? Self.bind6(port: v4.port) { sockets.append(v6) }
    self.sockets = sockets
    var fds: [Int32] = [0, 0]
    guard pipe(&fds) == 0 else {
      sockets.forEach { Glibc.close($0) }
      throw TesseraError.internal("Could not create a pipe: \(String(cString: strerror(errno))).")
    }
    for fd in fds {
      _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
      _ = fcntl(fd, F_SETFL, O_NONBLOCK)
    }
    wake = (fds[0], fds[1])
    redirectURI = "http://\(hostName):\(v4.port)/"
  }

  deinit {
    sockets.forEach { Glibc.close($0) }
    Glibc.close(wake.read)
    Glibc.close(wake.write)
  }

  private static func bind4(port: UInt16) throws -> (fd: Int32, port: UInt16) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else {
      throw TesseraError.internal("Could not create a socket: \(String(cString: strerror(errno))).")
    }
    var one: Int32 = 1
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
    let bound = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard bound == 0, listen(fd, 16) == 0 else {
      let reason = String(cString: strerror(errno))
      Glibc.close(fd)
      throw TesseraError.internal(
        "Could not listen on 127.0.0.1:\(port) for the sign-in redirect (\(reason))."
          + (port != 0
            ? " Another program uses redirect_port \(port); free it or change redirect_port in config.toml." : ""))
    }
    var actual = sockaddr_in()
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &actual) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    return (fd, UInt16(bigEndian: actual.sin_port))
  }

  private static func bind6(port: UInt16) throws -> Int32 {
    let fd = socket(AF_INET6, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw TesseraError.internal("no IPv6") }
    var one: Int32 = 1
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, socklen_t(MemoryLayout<Int32>.size))
    var address = sockaddr_in6()
    address.sin6_family = sa_family_t(AF_INET6)
    address.sin6_port = port.bigEndian
    address.sin6_addr = in6addr_loopback
    let bound = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) }
    }
    guard bound == 0, listen(fd, 16) == 0 else {
      Glibc.close(fd)
      throw TesseraError.internal("no IPv6 loopback")
    }
    return fd
  }

  func close() {
    closed.withLock { $0 = true }
    var one: UInt8 = 1
    _ = write(wake.write, &one, 1)
  }

  func waitForRedirect(timeoutSeconds: Double) async throws -> RedirectParameters {
    try await withTaskCancellationHandler {
      try await withCheckedThrowingContinuation { continuation in
        startThread(name: "tessera-redirect") {
          continuation.resume(with: Result { try self.serve(timeoutSeconds: timeoutSeconds) })
        }
      }
    } onCancel: {
      self.close()
    }
  }

  private func serve(timeoutSeconds: Double) throws -> RedirectParameters {
    var deadline = timespec()
    clock_gettime(CLOCK_MONOTONIC, &deadline)
    let end = Double(deadline.tv_sec) + Double(deadline.tv_nsec) / 1e9 + timeoutSeconds
    while true {
      if closed.withLock({ $0 }) {
        throw TesseraError.cancelled("The sign-in was cancelled before the browser came back.")
      }
      var now = timespec()
      clock_gettime(CLOCK_MONOTONIC, &now)
      let remaining = end - (Double(now.tv_sec) + Double(now.tv_nsec) / 1e9)
      guard remaining > 0 else {
        throw TesseraError.timedOut(
          "The browser sign-in did not finish within \(Int(timeoutSeconds)) s. Start it again, or pass a larger 'timeout'."
        )
      }
      var fds =
        sockets.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) } + [
          pollfd(fd: wake.read, events: Int16(POLLIN), revents: 0)
        ]
      let ready = poll(&fds, nfds_t(fds.count), Int32(min(remaining * 1000, 60_000)) + 1)
      if ready <= 0 { continue }
      for entry in fds.dropLast() where entry.revents & Int16(POLLIN) != 0 {
        let connection = accept(entry.fd, nil, nil)
        guard connection >= 0 else { continue }
        _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
        defer { Glibc.close(connection) }
        if let parameters = handle(connection) { return parameters }
      }
    }
  }

  /// Reads one request; answers and returns its query when it carries `code` or `error`.
  private func handle(_ connection: Int32) -> RedirectParameters? {
    var timeout = timeval(tv_sec: 5, tv_usec: 0)
    setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    var request: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    while request.count < 16384 {
      let n = buffer.withUnsafeMutableBytes { recv(connection, $0.baseAddress, $0.count, 0) }
      if n <= 0 { break }
      request += buffer[0..<n]
      if request.count >= 4, request.suffix(4) == [13, 10, 13, 10] { break }
    }
    let firstLine = String(decoding: request.prefix { $0 != 13 && $0 != 10 }, as: UTF8.self)
    let parts = firstLine.split(separator: " ")
    guard parts.count >= 2, parts[0] == "GET" else {
      respond(connection, status: "405 Method Not Allowed", page: nil)
      return nil
    }
    let target = parts[1]
    guard let questionMark = target.firstIndex(of: "?") else {
      respond(connection, status: "404 Not Found", page: nil)
      return nil
    }
    let parameters = FormEncoding.decode(String(target[target.index(after: questionMark)...]))
    guard parameters["code"] != nil || parameters["error"] != nil else {
      respond(connection, status: "404 Not Found", page: nil)
      return nil
    }
    respond(connection, status: "200 OK", page: parameters["error"] == nil ? Self.successPage : Self.failurePage)
    return parameters
  }

  private func respond(_ connection: Int32, status: String, page: String?) {
    let body = page ?? "Not found"
    let response =
      "HTTP/1.1 \(status)\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\n"
      + "Cache-Control: no-store\r\nReferrer-Policy: no-referrer\r\nConnection: close\r\n\r\n" + body
    var bytes = Array(response.utf8)
    var sent = 0
    while sent < bytes.count {
      let n = bytes.withUnsafeMutableBytes {
        send(connection, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL))
      }
      if n <= 0 { break }
      sent += n
    }
  }

  static func page(title: String, text: String) -> String {
    """
    <!doctype html><html lang="en"><head><meta charset="utf-8"><title>\(title)</title>
    <style>body{font-family:system-ui,sans-serif;max-width:32rem;margin:15vh auto;padding:0 1rem;color:#222}
    h1{font-size:1.4rem}</style></head><body><h1>\(title)</h1><p>\(text)</p></body></html>
    """
  }
  static let successPage = page(title: "Signed in to Tessera", text: "Sign-in is complete. You can close this window.")
  static let failurePage = page(
    title: "Sign-in did not complete",
    text: "The identity provider did not sign you in. Close this window and check the app that asked.")
}
