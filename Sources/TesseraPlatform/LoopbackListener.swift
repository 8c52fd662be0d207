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
    if hostName == "localhost" {
      switch Self.bind6(port: v4.port) {
      case .success(let v6): sockets.append(v6)
      case .failure(let failure) where failure.code == EADDRINUSE:
        // Someone else holds [::1]:PORT and would receive the browser's redirect to localhost.
        Glibc.close(v4.fd)
        throw TesseraError.internal(
          "Port \(v4.port) on [::1] is used by another program, which would receive the sign-in redirect. Free it, or change redirect_port in config.toml."
        )
      case .failure: break  // no IPv6 loopback here: browsers fall back to 127.0.0.1
      }
    }
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

  struct BindFailure: Error { let code: Int32 }

  private static func bind6(port: UInt16) -> Result<Int32, BindFailure> {
    let fd = socket(AF_INET6, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { return .failure(BindFailure(code: errno)) }
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
      let code = errno
      Glibc.close(fd)
      return .failure(BindFailure(code: code))
    }
    return .success(fd)
  }

  func close() {
    closed.withLock { $0 = true }
    var one: UInt8 = 1
    _ = write(wake.write, &one, 1)
  }

  func waitForRedirect(state: String, timeoutSeconds: Double) async throws -> RedirectParameters {
    try await withTaskCancellationHandler {
      try await withCheckedThrowingContinuation { continuation in
        startThread(name: "tessera-redirect") {
          continuation.resume(with: Result { try self.serve(state: state, timeoutSeconds: timeoutSeconds) })
        }
      }
    } onCancel: {
      self.close()
    }
  }

  static func monotonicNow() -> Double {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
  }

  /// Any local user can connect to the port, so only a request carrying this sign-in's `state` ends
  /// the wait; anything else is answered 400 and ignored. Each connection gets at most
  /// `connectionBudget` seconds, and the wait can always be cancelled.
  private func serve(state: String, timeoutSeconds: Double) throws -> RedirectParameters {
    let end = Self.monotonicNow() + timeoutSeconds
    while true {
      let remaining = try remainingTime(until: end, timeoutSeconds: timeoutSeconds)
      var fds =
        sockets.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) } + [
          pollfd(fd: wake.read, events: Int16(POLLIN), revents: 0)
        ]
      let ready = poll(&fds, nfds_t(fds.count), Int32(min(remaining * 1000, 60_000)) + 1)
      if ready <= 0 { continue }
      for entry in fds.dropLast() where entry.revents & Int16(POLLIN) != 0 {
        let connection = accept(entry.fd, nil, nil)
        guard connection >= 0 else { continue }
        defer { Glibc.close(connection) }
        _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
        _ = fcntl(connection, F_SETFL, O_NONBLOCK)
        let deadline = min(end, Self.monotonicNow() + Self.connectionBudget)
        guard let target = readRequestTarget(connection, deadline: deadline) else {
          respond(connection, status: "400 Bad Request", page: nil)
          continue
        }
        let parameters = target.query.map { FormEncoding.decode(String($0)) } ?? [:]
        guard parameters["state"] == state, parameters["code"] != nil || parameters["error"] != nil else {
          respond(connection, status: target.query == nil ? "404 Not Found" : "400 Bad Request", page: nil)
          continue
        }
        respond(connection, status: "200 OK", page: parameters["error"] == nil ? Self.successPage : Self.failurePage)
        return parameters
      }
    }
  }

  static let connectionBudget: Double = 2

  private func remainingTime(until end: Double, timeoutSeconds: Double) throws -> Double {
    if closed.withLock({ $0 }) {
      throw TesseraError.cancelled("The sign-in was cancelled before the browser came back.")
    }
    let remaining = end - Self.monotonicNow()
    guard remaining > 0 else {
      throw TesseraError.timedOut(
        "The browser sign-in did not finish within \(Int(timeoutSeconds)) s. Start it again, or pass a larger 'timeout'."
      )
    }
    return remaining
  }

  /// Reads a request's head within `deadline` (monotonic seconds) and returns its target's path and
  /// query; nil for anything that is not a timely, small `GET`.
  private func readRequestTarget(_ connection: Int32, deadline: Double) -> (path: Substring, query: Substring?)? {
    var request: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    while request.count < 16384, !request.suffix(4).elementsEqual([13, 10, 13, 10]) {
      let left = deadline - Self.monotonicNow()
      if left <= 0 || closed.withLock({ $0 }) { return nil }
      var fds = [
        pollfd(fd: connection, events: Int16(POLLIN), revents: 0),
        pollfd(fd: wake.read, events: Int16(POLLIN), revents: 0),
      ]
      guard poll(&fds, 2, Int32(left * 1000) + 1) > 0, fds[0].revents != 0 else { continue }
      let n = buffer.withUnsafeMutableBytes { recv(connection, $0.baseAddress, $0.count, 0) }
      if n < 0 && (errno == EAGAIN || errno == EINTR) { continue }
      if n <= 0 { break }
      request += buffer[0..<n]
    }
    let firstLine = String(decoding: request.prefix { $0 != 13 && $0 != 10 }, as: UTF8.self)
    let parts = firstLine.split(separator: " ")
    guard parts.count >= 2, parts[0] == "GET" else { return nil }
    let target = parts[1]
    guard let questionMark = target.firstIndex(of: "?") else { return (target, nil) }
    return (target[..<questionMark], target[target.index(after: questionMark)...])
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
