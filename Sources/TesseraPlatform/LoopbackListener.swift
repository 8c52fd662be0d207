import CTesseraSystemShim
import Glibc
import SystemPackage
import TesseraCore
import TesseraInterface
import TesseraSystem

// About 450 lines on purpose: the redirect listener is one security boundary (who may connect,
// what one connection may send, how long it may take), kept in one file to be read whole.

/// Loopback redirect listeners (RFC 8252 §7.3): 127.0.0.1 (and ::1 when the redirect URI names
/// `localhost`), any free port unless a fixed one is configured.
public struct LoopbackListenerFactory: RedirectListenerFactory {
  public init() {}

  public func listen(port: UInt16, hostName: String) throws -> any RedirectListener {
    try LoopbackListener(port: port, hostName: hostName)
  }
}

/// The browser's side of a sign-in, served on one thread without blocking on any one peer:
/// - Only the daemon's own user is served. Every other user's connection is closed the moment it
///   is accepted (`LoopbackPeer.uid`), so nobody else can end, forge or stall the sign-in.
/// - `GET /start/TOKEN` answers 303 with the authorization URL, which therefore never appears in a
///   browser's command line (readable by every user in /proc).
/// - `GET /?state=…&code=…` (or `error=…`) with this sign-in's state ends the wait.
/// - The `Host` header must name the loopback address and port, so a web page that rebinds a DNS
///   name to 127.0.0.1 cannot use the user's own browser against the listener.
/// - Up to `maxConnections` connections are served at once, each for at most `connectionBudget`
///   seconds; when full, the oldest is dropped.
final class LoopbackListener: RedirectListener, @unchecked Sendable {
  // Invariant for @unchecked Sendable: the sockets are used by the one serving thread; `close()`
  // only flips `closed` and writes to the wake pipe; `startURL` sets `authorizationURL` under its
  // mutex; descriptors are closed in deinit.
  private let sockets: [Int32]
  private let wake: (read: Int32, write: Int32)
  private let closed = Locked(false)
  private let authorizationURL = Locked<String?>(nil)
  private let port: UInt16
  private let hostName: String
  private let startPath: String
  private let ownUID = geteuid()
  let redirectURI: String

  static let connectionBudget: Double = 10
  static let maxConnections = 32
  static let maxRequestHead = 16_384

  init(port requestedPort: UInt16, hostName: String) throws {
    var sockets: [Int32] = []
    // A free port on 127.0.0.1 may be taken on [::1]; then another free port is tried. A fixed
    // port that is taken on either address is the user's configuration to change.
    for attempt in 1...8 {
      let v4 = try Self.bind4(port: requestedPort)
      guard hostName == "localhost" else {
        sockets = [v4.fd]
        break
      }
      switch Self.bind6(port: v4.port) {
      case .success(let v6):
        sockets = [v4.fd, v6]
      case .failure(let failure) where failure.errno == .addressInUse:
        // Someone else holds [::1]:PORT and would receive the browser's redirect to localhost.
        Glibc.close(v4.fd)
        if requestedPort != 0 {
          throw TesseraError.configuration(
            "Port \(v4.port) on [::1] is used by another program, which would receive the sign-in redirect. Free it, or change redirect_port in config.toml."
          )
        }
        if attempt == 8 {
          throw TesseraError.environment(
            "Eight free ports on 127.0.0.1 were each taken on [::1] by another program. Retry, or set redirect_port in config.toml."
          )
        }
        continue
      case .failure:
        sockets = [v4.fd]  // no IPv6 loopback here: browsers fall back to 127.0.0.1
      }
      break
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
    self.port = Self.localPort(sockets[0])
    self.hostName = hostName
    redirectURI = "http://\(hostName):\(self.port)/"
    startPath = "/start/" + Self.randomToken()
  }

  deinit {
    sockets.forEach { Glibc.close($0) }
    Glibc.close(wake.read)
    Glibc.close(wake.write)
  }

  func startURL(opening authorizationURL: String) -> String {
    self.authorizationURL.withLock { $0 = authorizationURL }
    return "http://\(hostName):\(port)\(startPath)"
  }

  /// 128 random bits, hex: the start path cannot be guessed by a page in the user's browser.
  private static func randomToken() -> String {
    var generator = SystemRandomNumberGenerator()
    return (0..<2).map { _ in
      let value = generator.next() as UInt64
      let hex = String(value, radix: 16)
      return String(repeating: "0", count: 16 - hex.count) + hex
    }.joined()
  }

  // MARK: Sockets

  /// A listening, non-blocking loopback socket, with every step checked.
  private static func listeningSocket(
    family: Int32, configure: (Int32) throws(SystemCallError) -> Void, bind address: (Int32) -> Int32
  ) throws(SystemCallError) -> Int32 {
    let fd = try Syscall.check("socket") {
      socket(
        family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
    }
    do {
      var one: Int32 = 1
      try Syscall.check("setsockopt(SO_REUSEADDR)") {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
      }
      try configure(fd)
      try Syscall.check("bind") { address(fd) }
      try Syscall.check("listen") { listen(fd, 128) }
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
      fd = try listeningSocket(family: AF_INET, configure: { _ in }) { fd in
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
    return (fd, localPort(fd))
  }

  /// The port a bound IPv4 or IPv6 socket has (getsockname cannot fail on a socket we bound).
  private static func localPort(_ fd: Int32) -> UInt16 {
    var storage = sockaddr_in6()
    var length = socklen_t(MemoryLayout<sockaddr_in6>.size)
    _ = withUnsafeMutablePointer(to: &storage) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    // sin_port and sin6_port are at the same offset.
    return UInt16(bigEndian: storage.sin6_port)
  }

  private static func bind6(port: UInt16) -> Result<Int32, SystemCallError> {
    var address = sockaddr_in6()
    address.sin6_family = sa_family_t(AF_INET6)
    address.sin6_port = port.bigEndian
    address.sin6_addr = in6addr_loopback
    return Result { () throws(SystemCallError) -> Int32 in
      try listeningSocket(
        family: AF_INET6,
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
    try await serveOnThread(state: state, timeoutSeconds: timeoutSeconds)
  }

  func waitForStart(timeoutSeconds: Double) async throws {
    _ = try await serveOnThread(state: nil, timeoutSeconds: timeoutSeconds)
  }

  /// Serves on a thread of its own until the redirect carrying `state` comes, or, with no state,
  /// until the browser has come for the start URL.
  private func serveOnThread(state: String?, timeoutSeconds: Double) async throws -> RedirectParameters {
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

  // MARK: Serving

  private struct Connection {
    let fd: Int32
    let deadline: Double
    var head: [UInt8] = []
  }

  private func serve(state: String?, timeoutSeconds: Double) throws -> RedirectParameters {
    let end = Self.monotonicNow() + timeoutSeconds
    var connections: [Connection] = []
    defer { connections.forEach { Glibc.close($0.fd) } }
    while true {
      let remaining = try remainingTime(until: end, timeoutSeconds: timeoutSeconds)
      let now = Self.monotonicNow()
      // Connections past their budget are dropped without an answer.
      connections.removeAll { connection in
        guard connection.deadline <= now else { return false }
        Glibc.close(connection.fd)
        return true
      }
      let nearest = connections.map { $0.deadline - now }.min() ?? remaining
      var fds =
        sockets.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        + [pollfd(fd: wake.read, events: Int16(POLLIN), revents: 0)]
        + connections.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
      let waitMilliseconds = Int32(min(min(remaining, nearest) * 1000, 60_000)) + 1
      guard let ready = try? Syscall.check("poll", { poll(&fds, nfds_t(fds.count), waitMilliseconds) }), ready > 0
      else { continue }

      // Read what arrived on open connections first; an answer ends the wait.
      var finished: [Int] = []
      for (index, entry) in fds.suffix(connections.count).enumerated() where entry.revents != 0 {
        switch read(into: &connections[index]) {
        case .waiting: continue
        case .closed:
          finished.append(index)
        case .complete:
          finished.append(index)
          if let parameters = answer(connections[index], state: state) { return parameters }
        }
      }
      for index in finished.reversed() {
        Glibc.close(connections[index].fd)
        connections.remove(at: index)
      }

      for (index, entry) in fds.prefix(sockets.count).enumerated() where entry.revents & Int16(POLLIN) != 0 {
        acceptAll(from: sockets[index], into: &connections, now: now)
      }
    }
  }

  /// Accepts every pending connection; keeps only the daemon's own user's.
  private func acceptAll(from socket: Int32, into connections: inout [Connection], now: Double) {
    for _ in 0..<Self.maxConnections * 4 {
      let fd: Int32
      do throws(SystemCallError) {
        fd = try Syscall.check("accept4") {
          tessera_accept4(socket, nil, nil, Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue))
        }
      } catch {
        // EAGAIN: nothing more pending. Anything else (ECONNABORTED, out of descriptors) skips one.
        if error.errno == .wouldBlock || error.errno == .resourceTemporarilyUnavailable { return }
        continue
      }
      // First, before a byte is read: another user's connection is closed at once.
      guard LoopbackPeer.uid(of: fd) == ownUID else {
        Glibc.close(fd)
        continue
      }
      if connections.count >= Self.maxConnections {
        Glibc.close(connections.removeFirst().fd)
      }
      connections.append(Connection(fd: fd, deadline: now + Self.connectionBudget))
    }
  }

  private enum ReadState { case waiting, closed, complete }

  /// Reads what is there; `.complete` once the request head (up to the blank line) is in.
  private func read(into connection: inout Connection) -> ReadState {
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
      let received: Int
      do throws(SystemCallError) {
        received = try Syscall.check("recv") {
          buffer.withUnsafeMutableBytes { recv(connection.fd, $0.baseAddress, $0.count, 0) }
        }
      } catch {
        return error.errno == .wouldBlock || error.errno == .resourceTemporarilyUnavailable ? .waiting : .closed
      }
      if received == 0 { return .closed }
      connection.head += buffer[0..<received]
      if let end = Self.endOfHead(connection.head) {
        connection.head.removeSubrange(end...)
        return .complete
      }
      if connection.head.count > Self.maxRequestHead {
        respond(connection.fd, status: "431 Request Header Fields Too Large", page: nil)
        return .closed
      }
    }
  }

  private static func endOfHead(_ bytes: [UInt8]) -> Int? {
    guard bytes.count >= 4 else { return nil }
    for index in 0...(bytes.count - 4)
    where bytes[index] == 13 && bytes[index + 1] == 10 && bytes[index + 2] == 13 && bytes[index + 3] == 10 {
      return index
    }
    return nil
  }

  /// Answers one complete request head; returns the redirect's parameters when it ends the wait.
  private func answer(_ connection: Connection, state: String?) -> RedirectParameters? {
    guard let request = HTTPRequestHead(connection.head), request.method == "GET" else {
      respond(connection.fd, status: "400 Bad Request", page: nil)
      return nil
    }
    guard let host = request.host, isLoopbackHost(host) else {
      respond(connection.fd, status: "421 Misdirected Request", page: nil)
      return nil
    }
    if request.path == startPath, let target = authorizationURL.withLock({ $0 }) {
      respond(connection.fd, status: "303 See Other", page: nil, location: target)
      // A page that sends nothing back (a sign-out): the wait ends once the browser is on its way.
      return state == nil ? [:] : nil
    }
    guard let state, request.path == "/", let query = request.query else {
      respond(connection.fd, status: "404 Not Found", page: nil)
      return nil
    }
    let parameters = FormEncoding.decode(query)
    guard parameters["state"] == state, parameters["code"] != nil || parameters["error"] != nil else {
      respond(connection.fd, status: "400 Bad Request", page: nil)
      return nil
    }
    respond(connection.fd, status: "200 OK", page: parameters["error"] == nil ? Self.successPage : Self.failurePage)
    return parameters
  }

  /// `127.0.0.1:PORT`, `localhost:PORT` or `[::1]:PORT`, this listener's port only.
  private func isLoopbackHost(_ host: String) -> Bool {
    let lowered = host.lowercased()
    return ["127.0.0.1", "localhost", "[::1]"].contains { lowered == "\($0):\(port)" }
  }

  private func respond(_ connection: Int32, status: String, page: String?, location: String? = nil) {
    let body = page ?? status
    var head =
      "HTTP/1.1 \(status)\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\n"
      + "Cache-Control: no-store\r\nReferrer-Policy: no-referrer\r\nConnection: close\r\n"
    if let location { head += "Location: \(location)\r\n" }
    var bytes = Array((head + "\r\n" + body).utf8)
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

/// The request line and Host header of an HTTP/1.x request head.
package struct HTTPRequestHead {
  var method: Substring
  var path: Substring
  package var query: String?
  var host: String?

  package init?(_ head: [UInt8]) {
    let text = String(decoding: head, as: UTF8.self)
    var lines = text.split(separator: "\r\n", omittingEmptySubsequences: false)[...]
    guard let requestLine = lines.popFirst() else { return nil }
    let parts = requestLine.split(separator: " ", omittingEmptySubsequences: false)
    guard parts.count == 3, parts[2].hasPrefix("HTTP/1.") else { return nil }
    method = parts[0]
    let target = parts[1]
    if let mark = target.firstIndex(of: "?") {
      path = target[..<mark]
      query = String(target[target.index(after: mark)...])
    } else {
      path = target
    }
    for line in lines {
      guard let colon = line.firstIndex(of: ":"), line[..<colon].lowercased() == "host" else { continue }
      // Two Host headers: refused (RFC 9112 §3.2).
      if host != nil { return nil }
      let value = line[line.index(after: colon)...].drop { $0 == " " || $0 == "\t" }
      host = String(value.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
  }
}
