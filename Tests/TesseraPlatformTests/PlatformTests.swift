import Foundation
import Glibc
import TesseraCore
import TesseraInterface
import TesseraSystem
import XCTest

@testable import TesseraPlatform

final class LoopbackListenerTests: XCTestCase {
  /// A TCP connection to 127.0.0.1:`port` (with a 30 s receive timeout, so a listener that never
  /// answers fails the test instead of hanging it).
  static func connectTo(_ port: UInt16) -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var limit = timeval(tv_sec: 30, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
    _ = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
      }
    }
    return fd
  }

  /// Sends a raw HTTP request to the listener and returns the response text. `host` is the Host
  /// header (nil: none); by default the listener's own address.
  static func get(_ port: UInt16, _ target: String, host: String?? = .none) -> String {
    let fd = connectTo(port)
    defer { close(fd) }
    let hostLine = (host ?? "127.0.0.1:\(port)").map { "Host: \($0)\r\n" } ?? ""
    let request = Array("GET \(target) HTTP/1.1\r\n\(hostLine)\r\n".utf8)
    _ = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
    var response: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
      let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
      if n <= 0 { break }
      response += buffer[0..<n]
    }
    return String(decoding: response, as: UTF8.self)
  }

  static func port(_ listener: any RedirectListener) throws -> UInt16 {
    try XCTUnwrap(UInt16(listener.redirectURI.split(separator: ":").last!.dropLast()))
  }

  func testDeliversTheRedirectQueryAndShowsAPage() async throws {
    let listener = try LoopbackListenerFactory().listen(port: 0, hostName: "127.0.0.1")
    defer { listener.close() }
    let port = try Self.port(listener)
    XCTAssertTrue(listener.redirectURI.hasPrefix("http://127.0.0.1:"))
    let waiting = Task { try await listener.waitForRedirect(state: "s1", timeoutSeconds: 30) }
    let pages = await Task.detached {
      (
        LoopbackListenerTests.get(port, "/favicon.ico"),
        LoopbackListenerTests.get(port, "/?error=access_denied&state=forged"),  // not this sign-in's state
        LoopbackListenerTests.get(port, "/?code=abc%2Fd&state=s1")
      )
    }.value
    XCTAssertTrue(pages.0.hasPrefix("HTTP/1.1 404"))
    XCTAssertTrue(pages.1.hasPrefix("HTTP/1.1 400"), "a redirect without this sign-in's state is ignored")
    XCTAssertTrue(pages.2.hasPrefix("HTTP/1.1 200"))
    XCTAssertTrue(pages.2.contains("You can close this window"))
    XCTAssertFalse(pages.2.contains("abc"), "the page does not echo the code")
    let received = try await waiting.value
    XCTAssertEqual(received, ["code": "abc/d", "state": "s1"])
  }

  /// DNS rebinding: a web page whose name resolves to 127.0.0.1 sends its own Host header.
  func testOnlyTheLoopbackHostIsServed() async throws {
    let listener = try LoopbackListenerFactory().listen(port: 0, hostName: "localhost")
    defer { listener.close() }
    let port = try Self.port(listener)
    let waiting = Task { try await listener.waitForRedirect(state: "s1", timeoutSeconds: 30) }
    let pages = await Task.detached {
      (
        LoopbackListenerTests.get(port, "/?code=c&state=s1", host: "attacker.example:\(port)"),
        LoopbackListenerTests.get(port, "/?code=c&state=s1", host: "127.0.0.1:\(port &+ 1)"),
        LoopbackListenerTests.get(port, "/?code=c&state=s1", host: .some(nil)),
        LoopbackListenerTests.get(port, "/?code=c&state=s1", host: "LOCALHOST:\(port)")
      )
    }.value
    XCTAssertTrue(pages.0.hasPrefix("HTTP/1.1 421"), pages.0)
    XCTAssertTrue(pages.1.hasPrefix("HTTP/1.1 421"), pages.1)
    XCTAssertTrue(pages.2.hasPrefix("HTTP/1.1 421"), pages.2)
    XCTAssertTrue(pages.3.hasPrefix("HTTP/1.1 200"), pages.3)
    let received = try await waiting.value
    XCTAssertEqual(received["code"], "c")
  }

  /// The browser is given the start URL; the listener sends it on to the authorization URL.
  func testTheStartURLLeadsToTheAuthorizationURL() async throws {
    let listener = try LoopbackListenerFactory().listen(port: 0, hostName: "127.0.0.1")
    defer { listener.close() }
    let port = try Self.port(listener)
    let authorization = "https://idp.example/authorize?state=s1&nonce=n&code_challenge=c"
    let start = listener.startURL(opening: authorization)
    XCTAssertTrue(start.hasPrefix("http://127.0.0.1:\(port)/start/"), start)
    XCTAssertFalse(start.contains("s1") || start.contains("idp.example"), "nothing of the request in the start URL")
    let path = String(start.dropFirst("http://127.0.0.1:\(port)".count))
    XCTAssertEqual(path.count, "/start/".count + 32, "128 random bits")
    let waiting = Task { try await listener.waitForRedirect(state: "s1", timeoutSeconds: 30) }
    let pages = await Task.detached {
      (
        LoopbackListenerTests.get(port, path),
        LoopbackListenerTests.get(port, "/start/0000"),
        LoopbackListenerTests.get(port, "/?code=c&state=s1")
      )
    }.value
    XCTAssertTrue(pages.0.hasPrefix("HTTP/1.1 303"), pages.0)
    XCTAssertTrue(pages.0.contains("\r\nLocation: \(authorization)\r\n"), pages.0)
    XCTAssertTrue(pages.1.hasPrefix("HTTP/1.1 404"), "a guessed start path is not served")
    _ = try await waiting.value
  }

  /// A sign-out page sends nothing back: the wait ends when the browser has come for the start URL,
  /// and a redirect that looks like a sign-in's is not taken for it.
  func testASignOutPagesWaitEndsWhenTheBrowserComesForTheStartURL() async throws {
    let listener = try LoopbackListenerFactory().listen(port: 0, hostName: "127.0.0.1")
    defer { listener.close() }
    let port = try Self.port(listener)
    let signOut = "https://idp.example/logout?id_token_hint=eyJ.x.y&client_id=app"
    let path = String(listener.startURL(opening: signOut).dropFirst("http://127.0.0.1:\(port)".count))
    let waiting = Task { try await listener.waitForStart(timeoutSeconds: 30) }
    let pages = await Task.detached {
      (LoopbackListenerTests.get(port, "/?code=c&state=s1"), LoopbackListenerTests.get(port, path))
    }.value
    XCTAssertTrue(pages.0.hasPrefix("HTTP/1.1 404"), pages.0)
    XCTAssertTrue(pages.1.hasPrefix("HTTP/1.1 303"), pages.1)
    XCTAssertTrue(pages.1.contains("\r\nLocation: \(signOut)\r\n"), pages.1)
    try await waiting.value
  }

  func testASignOutPagesWaitEndsWithTimedOutWhenNoBrowserComes() async throws {
    let listener = try LoopbackListenerFactory().listen(port: 0, hostName: "127.0.0.1")
    defer { listener.close() }
    _ = listener.startURL(opening: "https://idp.example/logout")
    do {
      try await listener.waitForStart(timeoutSeconds: 0.2)
      XCTFail("nobody came for the start URL")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .timedOut)
    }
  }

  /// Connections that send nothing (more than the cap) do not hold up the browser's redirect.
  func testIdleConnectionsDoNotStarveTheRedirect() async throws {
    let listener = try LoopbackListenerFactory().listen(port: 0, hostName: "127.0.0.1")
    defer { listener.close() }
    let port = try Self.port(listener)
    let waiting = Task { try await listener.waitForRedirect(state: "s1", timeoutSeconds: 30) }
    let idle = (0..<(LoopbackListener.maxConnections + 8)).map { _ in Self.connectTo(port) }
    defer { idle.forEach { close($0) } }
    let half = Array("GET /?code=x".utf8)  // half a request, then nothing
    for fd in idle.prefix(8) { _ = half.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) } }
    let started = LoopbackListener.monotonicNow()
    let page = await Task.detached { LoopbackListenerTests.get(port, "/?code=c&state=s1") }.value
    XCTAssertTrue(page.hasPrefix("HTTP/1.1 200"), page)
    _ = try await waiting.value
    // Not a timing test: one connection's budget is 10 s, and the redirect must not wait for it.
    XCTAssertLessThan(LoopbackListener.monotonicNow() - started, LoopbackListener.connectionBudget)
  }

  /// The peer's uid is read from /proc/net/tcp: this process's own connection is found as ours.
  func testTheLoopbackPeerIsFoundAsThisUser() {
    // A plain listening socket of our own, to accept one connection and ask who is on the other end.
    let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(server) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
    _ = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        bind(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
      }
    }
    listen(server, 1)
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(server, $0, &length) }
    }
    let client = Self.connectTo(UInt16(bigEndian: address.sin_port))
    defer { close(client) }
    let accepted = accept(server, nil, nil)
    defer { close(accepted) }
    XCTAssertEqual(LoopbackPeer.uid(of: accepted), geteuid())
  }

  /// Whether this machine has an IPv6 loopback at all: a socket of the test's own binds [::1].
  static func hasIPv6Loopback() -> Bool {
    let fd = socket(AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var address = sockaddr_in6()
    address.sin6_family = sa_family_t(AF_INET6)
    address.sin6_addr = in6addr_loopback
    return withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) }
    } == 0
  }

  /// Browsers reach `localhost` over [::1] first: the peer is found in /proc/net/tcp6 too.
  func testTheRedirectArrivesOverIPv6Loopback() async throws {
    // Skipped only where there is no [::1]; where there is, a listener not reached there is a bug.
    try XCTSkipUnless(Self.hasIPv6Loopback(), "no IPv6 loopback on this machine")
    let listener = try LoopbackListenerFactory().listen(port: 0, hostName: "localhost")
    defer { listener.close() }
    let port = try Self.port(listener)
    let fd = socket(AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in6()
    address.sin6_family = sa_family_t(AF_INET6)
    address.sin6_port = port.bigEndian
    address.sin6_addr = in6addr_loopback
    let connected = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size))
      }
    }
    let connectError = errno
    guard connected == 0 else {
      return XCTFail("the listener for localhost is not reached over [::1]: \(String(cString: strerror(connectError)))")
    }
    // 30 s only bounds a hang: the answer comes at once.
    var limit = timeval(tv_sec: 30, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
    let waiting = Task { try await listener.waitForRedirect(state: "s6", timeoutSeconds: 30) }
    let request = Array("GET /?code=c6&state=s6 HTTP/1.1\r\nHost: [::1]:\(port)\r\n\r\n".utf8)
    _ = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
    var buffer = [UInt8](repeating: 0, count: 4096)
    let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
    XCTAssertTrue(String(decoding: buffer.prefix(max(n, 0)), as: UTF8.self).hasPrefix("HTTP/1.1 200"))
    let received = try await waiting.value
    XCTAssertEqual(received["code"], "c6")
  }

  func testThePeerTableIsReadAsTheKernelWritesIt() {
    let table = """
        sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
         0: 0100007F:A1B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000 65534        0 1 1 0
         1: 0100007F:1F90 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0
         2: 0100007F:C3D4 0100007F:1F90 06 00000000:00000000 03:00000F9A 00000000     0        0 0 3 0
      """
    XCTAssertEqual(LoopbackPeer.uid(in: table, peerAddress: "0100007F:A1B2", ourAddress: "0100007F:1F90"), 65534)
    XCTAssertNil(
      LoopbackPeer.uid(in: table, peerAddress: "0100007F:C3D4", ourAddress: "0100007F:1F90"),
      "TIME_WAIT lists uid 0 for everyone: not trusted")
    XCTAssertNil(LoopbackPeer.uid(in: table, peerAddress: "0100007F:0001", ourAddress: "0100007F:1F90"))
  }

  func testTimesOut() async throws {
    let listener = try LoopbackListenerFactory().listen(port: 0, hostName: "localhost")
    XCTAssertTrue(listener.redirectURI.hasPrefix("http://localhost:"))
    do {
      _ = try await listener.waitForRedirect(state: "s", timeoutSeconds: 0.3)
      XCTFail("expected a timeout")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .timedOut)
    }
  }

  func testCancellationEndsTheWait() async throws {
    let listener = try LoopbackListenerFactory().listen(port: 0, hostName: "127.0.0.1")
    let wait = Task { try await listener.waitForRedirect(state: "s", timeoutSeconds: 30) }
    wait.cancel()  // before or during the wait: either way it ends at once, not after 30 s
    do {
      _ = try await wait.value
      XCTFail("expected cancellation")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .cancelled)
    }
  }

  func testFixedPortInUseIsExplained() throws {
    let first = try LoopbackListenerFactory().listen(port: 0, hostName: "127.0.0.1")
    let port = UInt16(first.redirectURI.split(separator: ":").last!.dropLast())!
    XCTAssertThrowsError(try LoopbackListenerFactory().listen(port: port, hostName: "127.0.0.1")) {
      XCTAssertTrue(($0 as! TesseraError).message.contains("redirect_port"))
      XCTAssertEqual(($0 as! TesseraError).code, .configuration, "a taken redirect_port is configuration")
    }
  }
}

final class BrowserLauncherTests: XCTestCase {
  func testTheBrowserGetsTheSignalsTheDaemonIgnoresBackAtTheirDefault() throws {
    // As in tesserad, which takes SIGHUP and SIGTERM from a signal source and so ignores them.
    let previous = (signal(SIGHUP, SIG_IGN), signal(SIGTERM, SIG_IGN))
    defer {
      signal(SIGHUP, previous.0)
      signal(SIGTERM, previous.1)
    }
    let directory = NSTemporaryDirectory() + "tessera-browser-\(UUID().uuidString)"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let probe = directory + "/probe"
    // The shell reads its own status with builtins only: a command it runs (grep) would read it
    // while dash has every signal blocked around its vfork, until the child has exec'd.
    try """
    #!/bin/sh
    while IFS= read -r line; do
      case "$line" in SigIgn:*|SigBlk:*) printf '%s\\n' "$line" ;; esac
    done </proc/$$/status >\(directory)/out.tmp
    mv \(directory)/out.tmp \(directory)/out

    """.write(toFile: probe, atomically: true, encoding: .utf8)
    chmod(probe, 0o755)
    // And a thread of the daemon's that has signals blocked does not hand its mask on.
    var blocked = sigset_t()
    var before = sigset_t()
    sigemptyset(&blocked)
    sigaddset(&blocked, SIGUSR1)
    sigaddset(&blocked, SIGCHLD)
    pthread_sigmask(SIG_BLOCK, &blocked, &before)
    defer { pthread_sigmask(SIG_SETMASK, &before, nil) }
    try CommandBrowserLauncher(configured: probe, environment: [:]).open("https://idp.example.com/authorize")
    // The probe's file appears once it has run (30 s only bounds a hang).
    var text: String?
    let deadline = ContinuousClock.now + .seconds(30)
    while text == nil && ContinuousClock.now < deadline {
      text = try? String(contentsOfFile: directory + "/out", encoding: .utf8)
      if text == nil { usleep(20_000) }
    }
    let lines = try XCTUnwrap(text, "the probe did not run").split(separator: "\n")
    func mask(_ name: String) throws -> UInt64 {
      let line = try XCTUnwrap(lines.first { $0.hasPrefix(name + ":") })
      return try XCTUnwrap(UInt64(line.dropFirst(name.count + 1).trimmingCharacters(in: .whitespaces), radix: 16))
    }
    let ignored = try mask("SigIgn")
    XCTAssertEqual(ignored & (1 << UInt64(SIGHUP - 1)), 0, "the browser ignores SIGHUP")
    XCTAssertEqual(ignored & (1 << UInt64(SIGTERM - 1)), 0, "the browser ignores SIGTERM")
    XCTAssertEqual(try mask("SigBlk"), 0, "the browser starts with signals blocked")
  }

  func testCommandChoice() {
    XCTAssertEqual(
      CommandBrowserLauncher(configured: "firefox --new-window", environment: ["BROWSER": "x"]).command,
      ["firefox", "--new-window"])
    XCTAssertEqual(CommandBrowserLauncher(configured: nil, environment: ["BROWSER": "w3m:lynx"]).command, ["w3m"])
    XCTAssertEqual(CommandBrowserLauncher(configured: nil, environment: [:]).command, ["xdg-open"])
    XCTAssertEqual(CommandBrowserLauncher(configured: nil, environment: [:]).launcherPrefix, [])
    XCTAssertEqual(
      CommandBrowserLauncher(configured: nil, environment: ["INVOCATION_ID": "x"]).launcherPrefix.prefix(2),
      ["systemd-run", "--user"], "under systemd the browser runs outside the service's sandbox")
    XCTAssertTrue(
      CommandBrowserLauncher(configured: nil, environment: ["INVOCATION_ID": "x"]).launcherPrefix.contains {
        $0.hasPrefix("--description=")
      }, "the unit's description is ours, not the command line (which the journal would show)")
  }

  /// Reads what a child writes to the FIFO at `path` until it closes it, waiting at most 10 s.
  static func readFIFO(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var text: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    var wait = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
    while poll(&wait, 1, 10_000) > 0 {
      let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
      if n > 0 {
        text += buffer[0..<n]
      } else if n == 0 {
        break  // the writer closed it
      }
    }
    return String(decoding: text, as: UTF8.self)
  }

  func testLaunchesTheCommandWithTheURLAndNoneOfTheDaemonsDescriptors() throws {
    let dir = "/tmp/tessera-browser-test-\(getpid())"
    mkdir(dir, 0o700)
    defer { _ = try? FileManager.default.removeItem(atPath: dir) }
    let fifo = dir + "/out"
    XCTAssertEqual(mkfifo(fifo, 0o600), 0)
    // A descriptor the daemon holds without close-on-exec: the browser must not get it.
    var held: [Int32] = [0, 0]
    XCTAssertEqual(pipe(&held), 0)
    defer { held.forEach { close($0) } }
    let script = dir + "/browser.sh"
    let text = """
      #!/bin/sh
      { printf '%s\\n' "$1"; if [ -e /proc/$$/fd/\(held[0]) ]; then echo leaked; else echo closed; fi; } > \(fifo)

      """
    XCTAssertTrue(FileManager.default.createFile(atPath: script, contents: Data(text.utf8)))
    chmod(script, 0o700)
    try CommandBrowserLauncher(configured: script, environment: [:]).open("https://example.test/a?b=c&d=e")
    XCTAssertEqual(Self.readFIFO(fifo), "https://example.test/a?b=c&d=e\nclosed\n")
    XCTAssertThrowsError(
      try CommandBrowserLauncher(configured: "/nonexistent/browser", environment: [:]).open("https://x")
    ) {
      XCTAssertEqual(($0 as! TesseraError).code, .configuration, "a browser that cannot start is configuration")
    }
  }
}

final class CurlHTTPClientTests: XCTestCase {
  func testRefusedConnectionIsANetworkError() async throws {
    let client = try CurlHTTPClient(caFile: nil, allowInsecureLoopback: false)
    do {
      _ = try await client.send(HTTPRequest(method: "GET", url: "https://127.0.0.1:1/x", timeout: 5))
      XCTFail("expected an error")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .network)
      XCTAssertTrue(error.message.contains("127.0.0.1:1"))
    }
  }

  /// An internal CA (ca_file) cannot vouch for Microsoft's sign-in hosts unless configured to.
  func testCAFileIsNotTrustedForMicrosoftHostsUnlessConfigured() {
    let microsoft = "https://login.microsoftonline.com/common/oauth2/v2.0/token"
    XCTAssertFalse(CurlHTTPClient.trustsCAFile(for: microsoft, caFileForMicrosoft: false))
    XCTAssertTrue(CurlHTTPClient.trustsCAFile(for: microsoft, caFileForMicrosoft: true))
    XCTAssertTrue(CurlHTTPClient.trustsCAFile(for: "https://sso.example.com/realms/x/token", caFileForMicrosoft: false))
  }

  func testPlainHTTPIsRefusedUnlessAllowed() async throws {
    let client = try CurlHTTPClient(caFile: nil, allowInsecureLoopback: false)
    do {
      _ = try await client.send(HTTPRequest(method: "GET", url: "http://127.0.0.1:1/x", timeout: 5))
      XCTFail("expected an error")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .untrustedAuthority)
    }
  }

  func testAMissingLibcurlIsNamedWithWhatToInstall() {
    // libcurl is loaded on the first request; without it the error says what to do.
    XCTAssertThrowsError(try CurlLibrary.load("libcurl-tessera-missing.so.4")) {
      let error = $0 as! TesseraError
      XCTAssertEqual(error.code, .environment, "a missing library is not a bug in the broker")
      XCTAssertTrue(error.message.contains("libcurl-tessera-missing.so.4"), error.message)
      XCTAssertTrue(error.message.contains("Install the libcurl4 package"), error.message)
    }
    // A library without libcurl's symbols is refused by name, not called.
    XCTAssertThrowsError(try CurlLibrary.load("libz.so.1")) {
      XCTAssertTrue(($0 as! TesseraError).message.contains("curl_global_init"), "\($0)")
    }
  }

  func testUnreadableCAFileIsAConfigurationError() {
    XCTAssertThrowsError(try CurlHTTPClient(caFile: "/nonexistent/ca.pem", allowInsecureLoopback: false))
  }

  /// ca_file goes to libcurl with the system's bundle as one file it reads by path (so the parsed
  /// store is cached with the handle, not parsed again at each connection): a sealed file in
  /// memory that nothing can change.
  func testCAFileIsGivenAsASealedFileWithTheSystemBundle() throws {
    let extra = "-----BEGIN CERTIFICATE-----\nTESSERA-TEST\n-----END CERTIFICATE-----\n"
    let caFile = FileManager.default.temporaryDirectory.appendingPathComponent("tessera-ca-\(getpid()).pem").path
    try extra.write(toFile: caFile, atomically: true, encoding: .utf8)
    defer { unlink(caFile) }
    let client = try CurlHTTPClient(caFile: caFile, allowInsecureLoopback: false)
    let path = try XCTUnwrap(client.caPath)
    XCTAssertTrue(path.hasPrefix("/proc/self/fd/"), path)
    let system = CurlHTTPClient.systemBundles.lazy.compactMap { readFile($0) }.first ?? []
    XCTAssertEqual(readFile(path), system + Array("\n".utf8) + Array(extra.utf8))
    let fd = open(path, O_WRONLY)
    defer { if fd >= 0 { close(fd) } }
    XCTAssertTrue(fd < 0 || write(fd, "x", 1) < 0, "the bundle cannot be changed once made")
  }

  /// Requests in a burst share one connection; once idle past the limit, the connection is closed
  /// (the server sees it end) and the next request opens a new one. An idle daemon holds no TLS
  /// state: a burst of concurrent refreshes once left over 1 MiB held for the daemon's lifetime.
  func testIdleConnectionsAreReusedThenClosed() async throws {
    let server = try KeepAliveServer()
    let client = try CurlHTTPClient(caFile: nil, allowInsecureLoopback: true)
    let url = "http://127.0.0.1:\(server.port)/x"
    for _ in 0..<3 {
      let response = try await client.send(HTTPRequest(method: "GET", url: url, timeout: 30))
      XCTAssertEqual(response.status, 200)
    }
    XCTAssertEqual(server.counts.accepted, 1, "requests in a row reuse the connection")
    XCTAssertEqual(client.idleHandles, 1)

    XCTAssertEqual(client.closeIdleConnections(), 0, "a connection used just now is kept")
    XCTAssertEqual(server.counts.closed, 0)

    XCTAssertEqual(client.closeIdleConnections(olderThan: .zero), 1)
    XCTAssertEqual(client.idleHandles, 0)
    // 30 s only bounds a hang: the server sees the end at once.
    let deadline = ContinuousClock.now + .seconds(30)
    while server.counts.closed < 1, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
    XCTAssertEqual(server.counts.closed, 1, "the server saw the idle connection end")

    let again = try await client.send(HTTPRequest(method: "GET", url: url, timeout: 30))
    XCTAssertEqual(again.status, 200)
    XCTAssertEqual(server.counts.accepted, 2, "the next request opens a new connection")
  }
}

/// A plain-HTTP/1.1 server on 127.0.0.1 that keeps connections alive, answering every request
/// "200 ok", and counts connections accepted and ended by the client.
final class KeepAliveServer: @unchecked Sendable {
  // Invariant for @unchecked Sendable: `listener` and `port` are immutable; counts are under a lock.
  let port: UInt16
  private let listener: Int32
  private let lock = NSLock()
  private var accepted = 0
  private var closed = 0

  var counts: (accepted: Int, closed: Int) { lock.withLock { (accepted, closed) } }

  init() throws {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    listener = fd
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        bind(fd, $0, length) == 0 && listen(fd, 8) == 0 && getsockname(fd, $0, &length) == 0
      }
    }
    guard bound else { throw POSIXError(.EADDRNOTAVAIL) }
    port = UInt16(bigEndian: address.sin_port)
    Thread.detachNewThread { [self] in acceptLoop() }
  }

  deinit { shutdown(listener, Int32(SHUT_RDWR)) }

  private func acceptLoop() {
    while true {
      let fd = accept(listener, nil, nil)
      guard fd >= 0 else { return }
      lock.withLock { accepted += 1 }
      Thread.detachNewThread { [self] in serve(fd) }
    }
  }

  private func serve(_ fd: Int32) {
    defer { close(fd) }
    var pending: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
      let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
      guard n > 0 else {
        lock.withLock { closed += 1 }
        return
      }
      pending += buffer[0..<n]
      while let end = pending.firstRange(of: Array("\r\n\r\n".utf8)) {
        pending.removeSubrange(..<end.upperBound)
        let answer = Array("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".utf8)
        _ = answer.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
      }
    }
  }
}
