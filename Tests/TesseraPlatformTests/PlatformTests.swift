import Foundation
import Glibc
import TesseraCore
import XCTest

@testable import TesseraPlatform

final class LoopbackListenerTests: XCTestCase {
  /// Sends a raw HTTP request to the listener and returns the response text.
  static func get(_ port: UInt16, _ target: String, stall: Bool = false) -> String {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    // Bounded: a listener that never answers fails the test after 10 s instead of hanging it.
    var limit = timeval(tv_sec: 10, tv_usec: 0)
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
    // `stall`: a client that sends half a request and then nothing.
    let text = stall ? "GET /?code=x" : "GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    let request = Array(text.utf8)
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

  func testDeliversTheRedirectQueryAndShowsAPage() async throws {
    let listener = try LoopbackListenerFactory().listen(port: 0, hostName: "127.0.0.1")
    defer { listener.close() }
    let port = try XCTUnwrap(UInt16(listener.redirectURI.split(separator: ":").last!.dropLast()))
    XCTAssertTrue(listener.redirectURI.hasPrefix("http://127.0.0.1:"))
    let waiting = Task { try await listener.waitForRedirect(state: "s1", timeoutSeconds: 10) }
    let pages = await Task.detached {
      (
        LoopbackListenerTests.get(port, "/favicon.ico"),
        LoopbackListenerTests.get(port, "/", stall: true),  // held for at most 2 s, then dropped
        LoopbackListenerTests.get(port, "/?error=access_denied&state=forged"),  // any local user can try this
        LoopbackListenerTests.get(port, "/?code=abc%2Fd&state=s1")
      )
    }.value
    XCTAssertTrue(pages.0.hasPrefix("HTTP/1.1 404"))
    XCTAssertTrue(pages.1.hasPrefix("HTTP/1.1 400"), pages.1)
    XCTAssertTrue(pages.2.hasPrefix("HTTP/1.1 400"), "a redirect without this sign-in's state is ignored")
    XCTAssertTrue(pages.3.hasPrefix("HTTP/1.1 200"))
    XCTAssertTrue(pages.3.contains("You can close this window"))
    XCTAssertFalse(pages.3.contains("abc"), "the page does not echo the code")
    let received = try await waiting.value
    XCTAssertEqual(received, ["code": "abc/d", "state": "s1"])
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
}
