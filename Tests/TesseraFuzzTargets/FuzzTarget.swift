import Dispatch
import Logging

/// Tessera's fuzz targets (issue 25): each reads one kind of untrusted input with the project's own
/// code, and must end in a value or a named error, never a crash, a leak or a hang. Fuzz/Sources
/// (built by scripts/fuzz) wraps each in a libFuzzer executable of the same name; the unit tests
/// (TesseraFuzzTargetsTests) replay every seed and every input that once failed through the same
/// functions, so a fixed finding stays fixed without the fuzzer.
public enum FuzzTarget: String, CaseIterable, Sendable {
  /// config.toml: the TOML subset reader, the broker's settings and the `[[git]]` rules.
  case config = "FuzzConfig"
  /// The identity provider's token and error bodies, client_info, Retry-After, base64url, form
  /// encoding, authorities and SafeText.
  case oauth = "FuzzOAuth"
  /// git's credential protocol and kubectl's KUBERNETES_EXEC_INFO.
  case gitCredential = "FuzzGitCredential"
  /// The loopback listener: the browser's request head and redirect query, and /proc/net/tcp.
  case loopback = "FuzzLoopback"
  /// com.microsoft.identity.broker1: each of its eight methods answered by the Microsoft front
  /// over the engine wired to its fakes, with a signed-in account.
  case microsoft = "FuzzMicrosoft"
  /// A hostile identity provider: discovery, JWKS, device authorization, token and error answers,
  /// id_tokens (claims signed with a fixed key, or raw) and revocation, through a device-code
  /// sign-in, a silent token and a sign-out of the engine.
  case provider = "FuzzProvider"
  /// D-Bus calls as bytes on a socket: sd-bus reads the message, the bus codec decodes its body
  /// under the wire limits, then org.tessera.Broker1's front parses the request with the option
  /// table and answers it over the engine's fakes; and the same call through a door of the real
  /// bus server (its own socket as an identified or a sandboxed caller, or a forward), whose
  /// accept, Hello, gates and dispatch answer it.
  case bus = "FuzzBus"
  /// What the stores hold: file-store records (sealed with a fixed key), keyring items of every
  /// schema version as the token cache loads them, the store move journal, and whole file-store
  /// directories loaded with their key check.
  case store = "FuzzStore"

  /// Runs one input.
  public func run(_ bytes: [UInt8]) {
    switch self {
    case .config: FuzzParsers.config(bytes)
    case .oauth: FuzzParsers.oauth(bytes)
    case .gitCredential: FuzzParsers.gitCredential(bytes)
    case .loopback: FuzzParsers.loopback(bytes)
    case .microsoft: blocking { _ = await FuzzMicrosoftFront.run(bytes) }
    case .provider: blocking { _ = await FuzzProvider.run(bytes) }
    case .bus: _ = FuzzBus.run(bytes)
    case .store: FuzzStore.run(bytes)
    }
  }

  /// Runs one input handed over by libFuzzer.
  public func run(_ data: UnsafePointer<UInt8>, _ size: Int) {
    run(Array(UnsafeBufferPointer(start: data, count: size)))
  }
}

/// Waits for async work from a synchronous caller (libFuzzer's callback, an XCTest method): the
/// engine is async, the fuzzer's entry point is not.
func blocking(_ body: @escaping @Sendable () async -> Void) {
  let done = DispatchSemaphore(value: 0)
  Task {
    await body()
    done.signal()
  }
  done.wait()
}

/// The engine's logs go nowhere: millions of inputs would otherwise fill the terminal.
let quiet = Logger(label: "fuzz", factory: { _ in SwiftLogNoOpLogHandler() })

extension Array where Element == UInt8 {
  /// The input cut at each `separator` (the dictionaries name it, so the fuzzer keeps the parts).
  func sections(_ separator: [UInt8] = Array("\n--\n".utf8)) -> [[UInt8]] {
    var parts: [[UInt8]] = []
    var start = 0
    var i = 0
    while i + separator.count <= count {
      if self[i..<(i + separator.count)].elementsEqual(separator) {
        parts.append(Array(self[start..<i]))
        i += separator.count
        start = i
      } else {
        i += 1
      }
    }
    parts.append(Array(self[start...]))
    return parts
  }

  /// The first byte (choosing a reader) and the rest.
  var selector: (UInt8, [UInt8])? { isEmpty ? nil : (self[0], Array(self[1...])) }
}
