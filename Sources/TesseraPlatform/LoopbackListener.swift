import CTesseraShim
import Glibc
import Synchronization
import SystemPackage
import TesseraBus
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
      case .failure(let failure) where failure.errno == .addressInUse:
        // Someone else holds [::1]:PORT and would receive the browser's redirect to localhost.
        Glibc.close(v4.fd)
        throw TesseraError.configuration(
          "Port \(v4.port) on [::1] is used by another program, which would receive the sign-in redirect. Free it, or change redirect_port in config.toml."
        )
      case .failure: break  // no IPv6 loopback here: browsers fall back to 127.0.0.1
      }
    }
    self.sockets = sockets
    var fds: [Int32] = [0, 0]
    do {
      try Syscall.check("pipe2") { tessera_pipe2(&fds, O_CLOEXEC | O_NONBLOCK) }
    } catch {
      sockets.forEach { Glibc.close($0) }
      throw TesseraError.environment(
        "Could not create a pipe for the sign-in redirect (\(error)): the daemon is out of file descriptors. Retry.")
    }
    wake = (fds[0], fds[1])
    redirectURI = "http://\(hostName):\(v4.port)/"
  }

  deinit {
    sockets.forEach { Glibc.close($0) }
    Glibc.close(wake.read)
    Glibc.close(wake.write)
  }

  /// A listening loopback socket, with every step checked.
  private static func listeningSocket(
    family: Int32, port: UInt16, configure: (Int32) throws(SystemCallError) -> Void,
    bind address: (Int32) -> Int32
  ) throws(SystemCallError) -> Int32 {
    let fd = try Syscall.check("socket") {
      socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    }
    do {
      var one: Int32 = 1
      try Syscall.check("setsockopt(SO_REUSEADDR)") {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
      }
      try configure(fd)
      try Syscall.check("bind") { address(fd) }
      try Syscall.check("listen") { listen(fd, 16) }
      return fd
    } catch {
      Glibc.close(fd)
      throw error
    }
  }

  private static func bind4(port: UInt16) throws -> (fd: Int32, port: UInt16) {
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
    let fd: Int32
    do throws(SystemCallError) {
      fd = try listeningSocket(family: AF_INET, port: port, configure: { _ in }) { fd in
        withUnsafePointer(to: &address) {
          $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
          }
        }
      }
    } catch {
      if port != 0, error.errno == .addressInUse || error.errno == .permissionDenied {
        throw TesseraError.configuration(
          "Could not listen on 127.0.0.1:\(port) for the sign-in redirect (\(error)). Another program uses "
            + "redirect_port \(port); free it, or change redirect_port in config.toml (0 picks a free port).")
      }
      throw TesseraError.environment(
        "Could not listen on 127.0.0.1:\(port) for the sign-in redirect (\(error)). Check that the loopback "
          + "interface is up and the daemon has file descriptors left, then retry.")
    }
    var actual = sockaddr_in()
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    do {
      try Syscall.check("getsockname") {
        withUnsafeMutablePointer(to: &actual) {
          $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
      }
    } catch {
      Glibc.close(fd)
      throw TesseraError.environment("Could not read the redirect listener's port (\(error)). Retry.")
    }
    return (fd, UInt16(bigEndian: actual.sin_port))
  }

  private static func bind6(port: UInt16) -> Result<Int32, SystemCallError> {
    var address = sockaddr_in6()
    address.sin6_family = sa_family_t(AF_INET6)
    address.sin6_port = port.bigEndian
    address.sin6_addr = in6addr_loopback
    return Result { () throws(SystemCallError) -> Int32 in
      try listeningSocket(
        family: AF_INET6, port: port,
        configure: { fd throws(SystemCallError) in
          var one: Int32 = 1
          try Syscall.check("setsockopt(IPV6_V6ONLY)") {
            setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, socklen_t(MemoryLayout<Int32>.size))
          }
        }
      ) { fd in
        withUnsafePointer(to: &address) {
          $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size))
          }
        }
      }
    }
  }

  func close() {
    closed.withLock { $0 = true }
    var one: UInt8 = 1
    // Only EAGAIN can fail here (the pipe is full), and then the serving thread is awake already.
    _ = try? Syscall.check("write(wake)") { write(wake.write, &one, 1) }
  }

  func waitForRedirect(state: String, timeoutSeconds: Double) async throws -> RedirectParameters {
    try await withTaskCancellationHandler {
      try await withCheckedThrowingContinuation { continuation in
        do {
          try startThread(name: "tessera-redirect") {
            continuation.resume(with: Result { try self.serve(state: state, timeoutSeconds: timeoutSeconds) })
          }
        } catch {
          continuation.resume(
            throwing: TesseraError.environment(
              "Could not start a thread for the sign-in redirect (\(error)): the system is out of threads. Retry."))
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
      let waitMilliseconds = Int32(min(remaining * 1000, 60_000)) + 1
      let ready = try? Syscall.check("poll") { poll(&fds, nfds_t(fds.count), waitMilliseconds) }
      guard let ready, ready > 0 else { continue }
      for entry in fds.dropLast() where entry.revents & Int16(POLLIN) != 0 {
        // A connection that fails (ECONNABORTED, out of descriptors) is skipped; the wait goes on.
        guard
          let connection = try? Syscall.check(
            "accept4",
            {
              tessera_accept4(entry.fd, nil, nil, Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue))
            })
        else { continue }
        defer { Glibc.close(connection) }
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
      let waitMilliseconds = Int32(left * 1000) + 1
      let ready = try? Syscall.check("poll") { poll(&fds, 2, waitMilliseconds) }
      guard let ready, ready > 0, fds[0].revents != 0 else { continue }
      let received: Int
      do throws(SystemCallError) {
        received = try Syscall.check("recv") {
          buffer.withUnsafeMutableBytes { recv(connection, $0.baseAddress, $0.count, 0) }
        }
      } catch  where error.errno == .wouldBlock {
        continue
      } catch {
        break
      }
      if received == 0 { break }
      request += buffer[0..<received]
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
      // The connection is non-blocking and the answer small: a peer that does not read loses it.
      guard
        let n = try? Syscall.check(
          "send",
          {
            bytes.withUnsafeMutableBytes {
              send(connection, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL))
            }
          }), n > 0
      else { break }
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
