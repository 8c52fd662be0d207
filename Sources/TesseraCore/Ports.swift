// The ports through which the core reaches the outside world. TesseraPlatform implements them
// with sd-bus, libsecret, libcurl, sockets and processes; unit tests implement them with fakes.
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// Forwards of tesserad's socket (`tessera forward`, issue 24): listeners of their own that the
/// bus layer runs, each of whose callers is the app `forward:NAME`.
public protocol ForwardListeners: Sendable {
  /// Opens a listener for forward `name` to `host` at `path` ("" for the default place); returns
  /// the socket's path. Not lasting: it ends when `owner`'s connection closes.
  func open(name: String, host: String, path: String, lasting: Bool, owner: CallerInfo) async throws -> String
  /// Ends forward `name`; false when there is none.
  func close(name: String, reason: String) async -> Bool
  /// The live forwards.
  func list() async -> [ForwardInfo]
}

/// Wall-clock time and sleeping, injectable so tests control expiry and polling.
public protocol BrokerClock: Sendable {
  /// Current time (wall clock, which keeps counting while the machine is suspended).
  func now() -> Date
  /// Sleeps for `seconds`; throws CancellationError when the task is cancelled.
  func sleep(seconds: Double) async throws
  /// Seconds awake, and seconds elapsed (see the default implementations); fakes move them.
  func awake() -> Double
  func elapsed() -> Double
}

extension BrokerClock {
  /// Seconds the machine has been awake since the process started (CLOCK_MONOTONIC: stops while
  /// suspended). Setting the wall clock moves neither this nor `elapsed()`.
  public func awake() -> Double { Self.seconds(SuspendingClock.now - processOrigin.awake) }
  /// Seconds since the process started, suspended time included (CLOCK_BOOTTIME). Against
  /// `now()` it tells the wall clock being set; against `awake()`, a suspend.
  public func elapsed() -> Double { Self.seconds(ContinuousClock.now - processOrigin.elapsed) }

  private static func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
  }
}

private let processOrigin = (awake: SuspendingClock.now, elapsed: ContinuousClock.now)

public struct SystemClock: BrokerClock {
  public init() {}
  public func now() -> Date { Date() }
  public func sleep(seconds: Double) async throws {
    try await Task.sleep(nanoseconds: UInt64(min(max(0, seconds), 86_400) * 1_000_000_000))
  }
}

public struct HTTPRequest: Sendable {
  public var method: String
  public var url: String
  public var headers: [(String, String)]
  public var body: [UInt8]?
  /// Whole-request timeout in seconds.
  public var timeout: Double

  /// Short enough that a silent call's discovery, keys and token requests together finish well
  /// within a D-Bus caller's timeout, so an unreachable IdP surfaces as Network, not a timeout.
  public static let defaultTimeout: Double = 10

  public init(
    method: String, url: String, headers: [(String, String)] = [], body: [UInt8]? = nil,
    timeout: Double = HTTPRequest.defaultTimeout
  ) {
    self.method = method
    self.url = url
    self.headers = headers
    self.body = body
    self.timeout = timeout
  }

  /// A form POST (`application/x-www-form-urlencoded`).
  public static func form(_ url: String, _ fields: [(String, String)], headers: [(String, String)] = []) -> HTTPRequest
  {
    HTTPRequest(
      method: "POST", url: url,
      headers: [("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "application/json")] + headers,
      body: Array(FormEncoding.encode(fields).utf8))
  }
}

public struct HTTPResponse: Sendable {
  public var status: Int
  /// Header names lowercased.
  public var headers: [String: String]
  public var body: [UInt8]

  public init(status: Int, headers: [String: String] = [:], body: [UInt8]) {
    self.status = status
    self.headers = headers
    self.body = body
  }
}

/// HTTPS transport. Transport failures (DNS, TLS, connect, timeout) throw `TesseraError.network`.
public protocol HTTPClient: Sendable {
  func send(_ request: HTTPRequest) async throws -> HTTPResponse
}

/// One item in the secret store: searchable attributes plus a secret (JSON text).
public struct StoredItem: Sendable, Equatable {
  public var attributes: [String: String]
  public var secret: String
  public var label: String

  public init(attributes: [String: String], secret: String, label: String) {
    self.attributes = attributes
    self.secret = secret
    self.label = label
  }
}

/// The Secret Service. Unavailable or locked stores throw `TesseraError.storeUnavailable`;
/// a locked store is never reported as empty.
public protocol SecretStore: Sendable {
  func loadAll() async throws -> [StoredItem]
  /// Creates or replaces the item with exactly these attributes.
  func save(_ item: StoredItem) async throws
  /// Deletes every item whose attributes include all of `attributes`.
  func delete(matching attributes: [String: String]) async throws
  /// Saves and deletes in order. On failure throws `StoreBatchError` saying how many were done.
  func apply(_ operations: [TokenCache.StoreOperation]) async throws
  /// Whether the store can be used now (there, and unlocked), answered within about `seconds`:
  /// throws `TesseraError.storeUnavailable` naming the specific cause (locked, not running, being
  /// started and not answering, its owner not answering). Never queued behind the store's other
  /// calls, one of which may be the call that hangs.
  func probe(withinSeconds seconds: Double) async throws
  /// Which store this is, for `tessera status` (never a secret). Answered at once.
  var storeDescription: StoreDescription { get }
}

/// Which store tesserad uses, as `tessera status` shows it (GetStatus's `store`).
public struct StoreDescription: Sendable, Equatable {
  public var kind: StoreKind
  /// The file store's directory; nil for the others.
  public var path: String?
  /// Where the file store's key comes from (a file, or a systemd credential); nil for the others.
  public var key: String?
  /// What the store had to set aside (damaged records moved to NAME.corrupt), each said once.
  public var notes: [String]

  /// The store as a sentence names it (StoreKind.name): every message a user reads names the
  /// store in use, never the Secret Service when it is the file store.
  public var name: String { kind.name(path: path) }
  /// `name` at the start of a sentence.
  public var capitalizedName: String { name.prefix(1).uppercased() + name.dropFirst() }

  public init(kind: StoreKind, path: String? = nil, key: String? = nil, notes: [String] = []) {
    self.kind = kind
    self.path = path
    self.key = key
    self.notes = notes
  }

  public static let secretService = StoreDescription(kind: .secretService)
}

/// A batch of store operations stopped part-way.
public struct StoreBatchError: Error {
  public var completed: Int
  public var error: any Error
  /// The store was there and unlocked, and refused this one operation (its next operation
  /// may well succeed); false when the store itself went away or got locked.
  public var rejected: Bool
  public init(completed: Int, error: any Error, rejected: Bool = false) {
    self.completed = completed
    self.error = error
    self.rejected = rejected
  }
}

/// A store that is there and unlocked refused one operation (the Secret Service answered with an
/// error of its own, not "gone" or "locked").
public struct StoreRejectedError: Error, CustomStringConvertible {
  public var description: String
  public init(_ description: String) { self.description = description }
}

extension SecretStore {
  /// The Secret Service, unless the store says otherwise (test fakes stand in for it).
  public var storeDescription: StoreDescription { .secretService }

  public func apply(_ operations: [TokenCache.StoreOperation]) async throws {
    for (index, operation) in operations.enumerated() {
      do {
        switch operation {
        case .save(let item): try await save(item)
        case .delete(let attributes): try await delete(matching: attributes)
        }
      } catch {
        throw StoreBatchError(completed: index, error: error, rejected: error is StoreRejectedError)
      }
    }
  }
}

/// Reads a provider's client secret (its `client_secret_file`) when a request needs it: the
/// daemon's reads the file through its checked descriptor (the user's alone, no one else may read
/// it; `shared`: an administrator's provider, whose file root may own and the users it serves may
/// read, but no one else may write). Never logged, never returned to a caller.
public protocol ClientSecretSource: Sendable {
  func secret(at path: String, shared: Bool) throws -> String
}

/// Opens a URL in the user's browser.
public protocol BrowserLauncher: Sendable {
  func open(_ url: String) throws
}

/// What arrived at the loopback redirect URI: the query parameters.
public typealias RedirectParameters = [String: String]

/// A loopback HTTP listener for the authorization-code redirect (RFC 8252 §7.3).
public protocol RedirectListener: Sendable {
  /// `http://127.0.0.1:PORT/` (or `http://localhost:PORT/`).
  var redirectURI: String { get }
  /// Waits for the browser's redirect carrying `state` (requests without it are refused and
  /// ignored: any local user can reach the port); answers it with a small page. Throws
  /// TimedOut/Cancelled.
  func waitForRedirect(state: String, timeoutSeconds: Double) async throws -> RedirectParameters
  /// A loopback URL that sends the browser on to `authorizationURL` (served to the user's own
  /// processes only), so the authorization URL, with its state, nonce and PKCE challenge, never
  /// appears in a browser's command line, which every user can read.
  func startURL(opening authorizationURL: String) -> String
  /// Serves the start URL until the browser has come for it (a sign-out page, which sends nothing
  /// back); throws TimedOut after `timeoutSeconds`, Cancelled when closed.
  func waitForStart(timeoutSeconds: Double) async throws
  func close()
}

public protocol RedirectListenerFactory: Sendable {
  /// Listens on 127.0.0.1 at `port` (0 for any free port); `hostName` (`127.0.0.1` or `localhost`)
  /// is what the redirect URI names.
  func listen(port: UInt16, hostName: String) throws -> any RedirectListener
}

/// What the user is asked in access_mode "confirm" (issue 11).
public struct AccessQuestion: Sendable, Equatable {
  public var app: AppIdentity
  public var clientID: String
  public var username: String
  public var scopes: [String]
  public var operation: String
}

public enum AccessAnswer: Sendable, Equatable {
  case allowOnce, allowAlways, deny
}

/// The desktop's way of asking the user (a notification with actions). nil: nobody could be asked.
public protocol AccessPrompter: Sendable {
  func ask(_ question: AccessQuestion) async -> AccessAnswer?
  /// The account chooser, where the desktop can draw a choice (the portal's access dialog); nil
  /// when it cannot, or nobody answered.
  func chooseAccount(_ choice: AccountChoice) async -> ChoiceAnswer?
}

extension AccessPrompter {
  public func chooseAccount(_ choice: AccountChoice) async -> ChoiceAnswer? { nil }
}

/// Which account should the app use: the accounts at its provider, the one it was last granted.
public struct AccountChoice: Sendable, Equatable {
  public struct Option: Sendable, Equatable {
    public var id: String
    public var username: String
    public var name: String
  }
  public var app: AppIdentity
  public var clientID: String
  public var provider: String
  public var accounts: [Option]
  public var preselected: String?
}

/// The user's choice: an account id, or Question.another; and whether it holds from now on.
public struct ChoiceAnswer: Sendable, Equatable {
  public var answer: String
  public var remember: Bool
  public init(answer: String, remember: Bool) {
    self.answer = answer
    self.remember = remember
  }
}

/// Signals the broker emits.
public protocol BrokerEvents: Sendable {
  /// Sent only to `destination`, the unique bus name of the caller that started the flow.
  func interactionPending(destination: String, correlationID: String, info: InteractionInfo)
  func accountsChanged()
  /// The accounts that need a sign-in changed (the AttentionNeeded property).
  func attentionChanged(_ accountIDs: [String])
  /// An account just started needing a sign-in: tell the user (a desktop notification).
  func signInNeeded(_ need: SignInNeed)
  /// The account no longer needs a sign-in (withdraw what `signInNeeded` showed).
  func signInNoLongerNeeded(accountID: String)
  /// An app used an account for the first time (issue 11): tell the user (`notify_first_use`).
  func appFirstUsedAccount(_ use: FirstUse)
  /// Grants, forwards or the configuration changed (ManagementChanged): managers read them again.
  func managementChanged(_ part: BrokerInterface.ManagementPart)
  /// A question for the user, to the desktop app's connection only (the Question signal).
  func question(destination: String, id: String, info: [String: BusValue])
}

/// An app's first use of an account, for the notification that says so.
public struct FirstUse: Sendable, Equatable {
  public var app: AppIdentity
  public var accountID: String
  public var username: String
  public var clientID: String
}

extension BrokerEvents {
  public func attentionChanged(_ accountIDs: [String]) {}
  public func signInNeeded(_ need: SignInNeed) {}
  public func signInNoLongerNeeded(accountID: String) {}
  public func appFirstUsedAccount(_ use: FirstUse) {}
  public func managementChanged(_ part: BrokerInterface.ManagementPart) {}
  public func question(destination: String, id: String, info: [String: BusValue]) {}
}
