import CCurl
import CTesseraShim
import CTesseraSystemShim
import Glibc
import SystemPackage
import TesseraCore
import TesseraInterface
import TesseraSystem

/// HTTPS through libcurl. `curl_easy_perform` blocks, so each request runs on an OS thread of its
/// own (not Swift's cooperative pool). Easy handles are pooled so connections are reused within a
/// burst (a sign-in's discovery, token and keys requests; a maintenance pass refreshing several
/// accounts), and closed once idle (`closeIdleConnections`).
public final class CurlHTTPClient: HTTPClient, @unchecked Sendable {
  // Invariant for @unchecked Sendable: a pooled handle is used by one request at a time (taken from
  // and returned to `idle` under its mutex); `caBundle` is immutable.
  private struct Handle: @unchecked Sendable { let pointer: UnsafeMutableRawPointer }
  /// Idle handles, the most recently used last, each with when it was returned.
  private let idle = Locked<[(handle: Handle, since: ContinuousClock.Instant)]>([])
  /// How long a pooled handle may sit unused before `closeIdleConnections` closes it. Each holds
  /// an open connection with its TLS state and its own copy of the trusted CAs (about 350 KiB
  /// with Debian's bundle): kept forever, a few handles from one burst of concurrent refreshes
  /// held over 1 MiB for the rest of the daemon's life. A minute covers a burst; curl itself
  /// stops reusing a connection idle for 118 s.
  public static let idleConnectionLimit: Duration = .seconds(60)
  /// The trusted CAs libcurl reads by path: ca_file with the system's bundle (a sealed file in
  /// memory), or the system's bundle alone. Given by path, libcurl parses it once per pooled
  /// handle and keeps it (CURLOPT_CA_CACHE_TIMEOUT), where a CA blob or a CA directory is parsed
  /// again at every new connection: about 300 KiB allocated and freed per refresh.
  let caPath: String?
  /// ca_file with the system's bundle as a blob, where a file in memory could not be made.
  private let caBundle: [UInt8]?
  /// The system's bundle, for hosts ca_file may not vouch for (nil: libcurl's defaults).
  private let systemCAPath: String?
  /// Whether ca_file also applies to Microsoft's hosts (else they are checked against the
  /// system's trust store only: an internal CA cannot vouch for login.microsoftonline.com).
  private let caFileForMicrosoft: Bool
  private let protocols: String
  /// Larger answers are refused: no IdP document is anywhere near this.
  public static let maxResponseBytes = 1 << 20
  static let userAgent = "tessera/\(BrokerInterface.version)"

  public struct SetupError: Error, CustomStringConvertible {
    public let description: String
  }

  /// `caFile` is added to the system's trusted CAs. Plain http is allowed only to loopback hosts,
  /// and only when `allowInsecureLoopback` is set (the broker checks hosts before calling).
  public init(caFile: String?, caFileForMicrosoft: Bool = false, allowInsecureLoopback: Bool) throws {
    self.caFileForMicrosoft = caFileForMicrosoft
    systemCAPath = Self.systemBundles.first { access($0, R_OK) == 0 }
    if let caFile {
      guard let extra = readFile(caFile) else {
        throw SetupError(description: "ca_file \(caFile) cannot be read. Fix the path in config.toml.")
      }
      let system = systemCAPath.flatMap { readFile($0) } ?? []
      let bundle = system + [UInt8(ascii: "\n")] + extra
      if let path = Self.sealedFile(bundle) {
        caPath = path
        caBundle = nil
      } else {
        caPath = nil
        caBundle = bundle
      }
    } else {
      caPath = nil
      caBundle = nil
    }
    protocols = allowInsecureLoopback ? "https,http" : "https"
  }

  /// A client replaced by a reload (ReloadableHTTPClient) goes once no request holds it: its
  /// pooled handles are closed on a thread of their own (a TLS close blocks), and the sealed CA
  /// file it made is closed.
  deinit {
    let handles = idle.withLock { pool in
      defer { pool.removeAll() }
      return pool.map(\.handle)
    }
    if !handles.isEmpty, let lib = try? CurlLibrary.shared() {
      try? startThread(name: "tessera-tidy") { for handle in handles { lib.easyCleanup(handle.pointer) } }
    }
    if let caPath, caPath.hasPrefix("/proc/self/fd/"), let fd = Int32(caPath.dropFirst("/proc/self/fd/".count)) {
      close(fd)
    }
  }

  /// Where distributions keep the system's CA bundle (Debian and derivatives; Fedora and RHEL).
  static let systemBundles = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"]

  /// `bytes` in a sealed file in memory (nothing on disk, no process can change it, closed on
  /// exec), as a path libcurl can open: /proc/self/fd/N. Nil when it cannot be made.
  static func sealedFile(_ bytes: [UInt8]) -> String? {
    let fd = tessera_memfd_create("tessera-ca-bundle")
    guard fd >= 0 else { return nil }
    let file = FileDescriptor(rawValue: fd)
    guard (try? file.writeAll(bytes)) == bytes.count, tessera_memfd_seal(fd) == 0,
      readFile("/proc/self/fd/\(fd)")?.count == bytes.count
    else {
      try? file.close()
      return nil
    }
    return "/proc/self/fd/\(fd)"
  }

  final class Exchange {
    var body: [UInt8] = []
    var headers: [String: String] = [:]
    var tooLarge = false
  }

  public func send(_ request: HTTPRequest) async throws -> HTTPResponse {
    // A thread of its own per request: a slow IdP never holds a shared pool's thread.
    try await withCheckedThrowingContinuation { continuation in
      do {
        try startThread(name: "tessera-http") { continuation.resume(with: Result { try self.perform(request) }) }
      } catch {
        continuation.resume(
          throwing: TesseraError.environment(
            "Could not start a thread for the request (\(error)): the system is out of threads or memory. Retry."))
      }
    }
  }

  private func perform(_ request: HTTPRequest) throws -> HTTPResponse {
    let lib = try CurlLibrary.shared()
    let handle = idle.withLock { $0.popLast()?.handle } ?? lib.easyInit().map { Handle(pointer: $0) }
    guard let handle else {
      throw TesseraError.environment("libcurl could not create a handle (out of memory?). Retry.")
    }
    let curl = handle.pointer
    lib.easyReset(curl)
    // The body (a refresh token, an authorization code) lives in a buffer of ours, handed to
    // libcurl without a copy, and is wiped once the request is done. The handle is reset before it
    // goes back to the pool, so an idle handle points at nothing of the request.
    let body = request.method == "POST" ? request.body ?? [] : []
    let bodyBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(body.count, 1), alignment: 1)
    bodyBuffer.copyBytes(from: body)
    defer {
      lib.easyReset(curl)
      explicit_bzero(bodyBuffer.baseAddress!, bodyBuffer.count)
      bodyBuffer.deallocate()
      let kept = idle.withLock {
        guard $0.count < 8 else { return false }
        $0.append((handle, .now))
        return true
      }
      if !kept { lib.easyCleanup(handle.pointer) }
    }

    var headerList: UnsafeMutablePointer<curl_slist>?
    for (name, value) in request.headers { headerList = lib.slistAppend(headerList, "\(name): \(value)") }
    headerList = lib.slistAppend(headerList, "Expect:")
    defer { lib.slistFreeAll(headerList) }

    let exchange = Exchange()
    let exchangePointer = Unmanaged.passUnretained(exchange).toOpaque()
    var errorBuffer = [CChar](repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)

    let setopt = lib.easySetopt
    let set = { (result: CURLcode, name: String) throws in try Self.check(lib, result, name) }
    let code: CURLcode = try withExtendedLifetime(exchange) {
      try errorBuffer.withUnsafeMutableBufferPointer { errorPointer in
        try setRequestOptions(
          lib, curl, request, headers: headerList, errors: errorPointer.baseAddress, exchange: exchangePointer,
          body: UnsafeRawBufferPointer(start: bodyBuffer.baseAddress, count: body.count))
        let trustsCAFile = Self.trustsCAFile(for: request.url, caFileForMicrosoft: caFileForMicrosoft)
        if let path = trustsCAFile ? caPath ?? (caBundle == nil ? systemCAPath : nil) : systemCAPath {
          // One bundle, no CA directory: the parsed store is cached with the handle.
          try set(tessera_curl_setopt_string(setopt, curl, CURLOPT_CAINFO, path), "CURLOPT_CAINFO")
          try set(tessera_curl_setopt_pointer(setopt, curl, CURLOPT_CAPATH, nil), "CURLOPT_CAPATH")
        }
        if let caBundle, trustsCAFile {
          return try caBundle.withUnsafeBytes { bytes in
            var blob = curl_blob(
              data: UnsafeMutableRawPointer(mutating: bytes.baseAddress), len: bytes.count,
              flags: UInt32(CURL_BLOB_NOCOPY))
            try set(tessera_curl_setopt_pointer(setopt, curl, CURLOPT_CAINFO_BLOB, &blob), "CURLOPT_CAINFO_BLOB")
            return lib.easyPerform(curl)
          }
        }
        return lib.easyPerform(curl)
      }
    }
    if exchange.tooLarge {
      throw TesseraError.provider(
        "\(Self.host(request.url)) sent an answer larger than \(Self.maxResponseBytes) bytes; it was refused.")
    }
    guard code == CURLE_OK else {
      let message = String(
        decoding: errorBuffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
      let detail =
        message.isEmpty ? lib.easyStrerror(code).map { String(cString: $0) } ?? "error \(code.rawValue)" : message
      throw Self.networkError(code, detail: detail, url: request.url)
    }
    var status = 0
    _ = tessera_curl_getinfo_long(lib.easyGetinfo, curl, CURLINFO_RESPONSE_CODE, &status)
    return HTTPResponse(status: status, headers: exchange.headers, body: exchange.body)
  }

  /// Every option is checked: on a libcurl that lacks one (CURLOPT_PROTOCOLS_STR needs 7.85, a CA
  /// blob needs a TLS back-end that takes one) the request is refused, never sent without it.
  private static func check(_ lib: CurlLibrary, _ result: CURLcode, _ name: String) throws {
    guard result == CURLE_OK else {
      throw TesseraError.environment(
        "The installed libcurl refused \(name) (\(lib.easyStrerror(result).map { String(cString: $0) } ?? "error \(result.rawValue)")). "
          + "Install libcurl 7.85 or later built with OpenSSL (Debian: libcurl4), then retry.")
    }
  }

  /// The request's own options (everything but its CA), each checked.
  private func setRequestOptions(
    _ lib: CurlLibrary, _ curl: UnsafeMutableRawPointer, _ request: HTTPRequest,
    headers: UnsafeMutablePointer<curl_slist>?,
    errors: UnsafeMutablePointer<CChar>?, exchange: UnsafeMutableRawPointer, body: UnsafeRawBufferPointer
  ) throws {
    let setopt = lib.easySetopt
    let set = { (result: CURLcode, name: String) throws in try Self.check(lib, result, name) }
    try set(tessera_curl_setopt_string(setopt, curl, CURLOPT_URL, request.url), "CURLOPT_URL")
    try set(tessera_curl_setopt_long(setopt, curl, CURLOPT_NOSIGNAL, 1), "CURLOPT_NOSIGNAL")
    try set(
      tessera_curl_setopt_long(setopt, curl, CURLOPT_TIMEOUT_MS, Int(request.timeout * 1000)), "CURLOPT_TIMEOUT_MS")
    try set(tessera_curl_setopt_long(setopt, curl, CURLOPT_CONNECTTIMEOUT_MS, 5_000), "CURLOPT_CONNECTTIMEOUT_MS")
    try set(tessera_curl_setopt_long(setopt, curl, CURLOPT_FOLLOWLOCATION, 0), "CURLOPT_FOLLOWLOCATION")
    try set(tessera_curl_setopt_string(setopt, curl, CURLOPT_PROTOCOLS_STR, protocols), "CURLOPT_PROTOCOLS_STR")
    // libcurl's defaults, set anyway: a build or an environment that changed them gets no say.
    try set(tessera_curl_setopt_long(setopt, curl, CURLOPT_SSL_VERIFYPEER, 1), "CURLOPT_SSL_VERIFYPEER")
    try set(tessera_curl_setopt_long(setopt, curl, CURLOPT_SSL_VERIFYHOST, 2), "CURLOPT_SSL_VERIFYHOST")
    try set(
      tessera_curl_setopt_long(setopt, curl, CURLOPT_SSLVERSION, CURL_SSLVERSION_TLSv1_2),
      "CURLOPT_SSLVERSION (TLS 1.2 at least)")
    try set(tessera_curl_setopt_string(setopt, curl, CURLOPT_USERAGENT, Self.userAgent), "CURLOPT_USERAGENT")
    try set(tessera_curl_setopt_pointer(setopt, curl, CURLOPT_HTTPHEADER, headers), "CURLOPT_HTTPHEADER")
    try set(
      tessera_curl_setopt_pointer(setopt, curl, CURLOPT_ERRORBUFFER, errors),
      "CURLOPT_ERRORBUFFER")
    try set(
      tessera_curl_setopt_data_callback(setopt, curl, CURLOPT_WRITEFUNCTION, writeBody), "CURLOPT_WRITEFUNCTION")
    try set(tessera_curl_setopt_pointer(setopt, curl, CURLOPT_WRITEDATA, exchange), "CURLOPT_WRITEDATA")
    try set(
      tessera_curl_setopt_data_callback(setopt, curl, CURLOPT_HEADERFUNCTION, writeHeader), "CURLOPT_HEADERFUNCTION"
    )
    try set(tessera_curl_setopt_pointer(setopt, curl, CURLOPT_HEADERDATA, exchange), "CURLOPT_HEADERDATA")
    if request.method == "POST" {
      try set(tessera_curl_setopt_long(setopt, curl, CURLOPT_POST, 1), "CURLOPT_POST")
      try set(tessera_curl_setopt_long(setopt, curl, CURLOPT_POSTFIELDSIZE, body.count), "CURLOPT_POSTFIELDSIZE")
      try set(
        tessera_curl_setopt_pointer(
          setopt, curl, CURLOPT_POSTFIELDS, UnsafeMutableRawPointer(mutating: body.baseAddress)),
        "CURLOPT_POSTFIELDS")
    }
  }

  /// Closes the pooled handles unused for longer than `limit`, with their connections: an idle
  /// daemon holds no TLS state. Returns how many were closed. Blocks (a TLS close), so it runs on
  /// a thread of its own, never on Swift's cooperative pool.
  @discardableResult
  public func closeIdleConnections(olderThan limit: Duration = idleConnectionLimit) -> Int {
    guard let lib = try? CurlLibrary.shared() else { return 0 }
    let now = ContinuousClock.now
    let stale = idle.withLock { pool in
      let stale = pool.filter { now - $0.since > limit }.map(\.handle)
      pool.removeAll { now - $0.since > limit }
      return stale
    }
    for handle in stale { lib.easyCleanup(handle.pointer) }
    return stale.count
  }

  /// Handles in the pool now (for tests).
  var idleHandles: Int { idle.withLock { $0.count } }

  /// Whether ca_file may vouch for this URL's host: any host but Microsoft's, unless configured.
  static func trustsCAFile(for url: String, caFileForMicrosoft: Bool) -> Bool {
    caFileForMicrosoft || !((try? Authority(parsing: url))?.isMicrosoft ?? false)
  }

  static func host(_ url: String) -> String {
    (try? Authority(parsing: url))?.environment ?? "the server"
  }

  static func networkError(_ code: CURLcode, detail: String, url: String) -> TesseraError {
    let host = host(url)
    switch code {
    case CURLE_COULDNT_RESOLVE_HOST:
      return .init(
        .network, "Cannot resolve \(host) (\(detail)). Check your network connection and DNS.",
        detail: ErrorDetail(unreachable: true))
    case CURLE_COULDNT_CONNECT:
      return .init(
        .network, "Cannot connect to \(host) (\(detail)). Check your network connection, proxy or firewall.",
        detail: ErrorDetail(unreachable: true))
    case CURLE_OPERATION_TIMEDOUT:
      return .network("\(host) did not answer in time (\(detail)). Try again; check your network if it persists.")
    case CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CACERT_BADFILE, CURLE_SSL_CONNECT_ERROR:
      return .network(
        "The TLS connection to \(host) failed (\(detail)). If the IdP uses a private CA, set ca_file in config.toml.")
    case CURLE_UNSUPPORTED_PROTOCOL:
      return .untrustedAuthority("\(host) would need a protocol other than https (\(detail)); refused.")
    default:
      return .network("The request to \(host) failed (\(detail)). Try again.")
    }
  }
}

private let writeBody: @convention(c) (UnsafeMutablePointer<CChar>?, Int, Int, UnsafeMutableRawPointer?) -> Int = {
  data, size, count, userdata in
  let exchange = Unmanaged<CurlHTTPClient.Exchange>.fromOpaque(userdata!).takeUnretainedValue()
  let length = size * count
  guard exchange.body.count + length <= CurlHTTPClient.maxResponseBytes else {
    exchange.tooLarge = true
    return 0
  }
  if let data, length > 0 {
    data.withMemoryRebound(to: UInt8.self, capacity: length) {
      exchange.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: length))
    }
  }
  return length
}

private let writeHeader: @convention(c) (UnsafeMutablePointer<CChar>?, Int, Int, UnsafeMutableRawPointer?) -> Int = {
  data, size, count, userdata in
  let exchange = Unmanaged<CurlHTTPClient.Exchange>.fromOpaque(userdata!).takeUnretainedValue()
  let length = size * count
  guard let data, length > 0 else { return length }
  let line = data.withMemoryRebound(to: UInt8.self, capacity: length) {
    String(decoding: UnsafeBufferPointer(start: $0, count: length), as: UTF8.self)
  }
  if line.hasPrefix("HTTP/") { exchange.headers.removeAll() }  // a new response (after 100-continue)
  if let colon = line.firstIndex(of: ":") {
    let name = line[..<colon].lowercased()
    let value = line[line.index(after: colon)...].trimmingSpaces()
    exchange.headers[name] = value
  }
  return length
}
