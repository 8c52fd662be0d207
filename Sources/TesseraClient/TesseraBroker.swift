import Glibc
import TesseraBus
import TesseraInterface
import TesseraSystem

/// An account the broker knows, as any app may see it.
public typealias TesseraAccount = AccountInfo
/// An access token handed out by the broker. There is never a refresh token here.
public typealias TesseraToken = TokenInfo
/// What the user must do to finish an interactive sign-in (InteractionPending).
public typealias TesseraInteraction = InteractionInfo

/// Options of AcquireToken / AcquireTokenSilent; nil means "not sent". Encoded and checked with the
/// broker's own option table, so a bad value fails here, with the broker's message, before the call.
public struct TesseraTokenOptions: Sendable {
  public var authority: String?
  /// A `[[provider]]` of config.toml by name: its issuer, client id and scopes by default.
  public var provider: String?
  public var loginHint: String?
  public var domainHint: String?
  public var prompt: String?
  public var deviceCode = false
  public var claims: String?
  public var extraQuery: [String: String] = [:]
  public var correlationID: String?
  public var forceRefresh = false
  public var minValidity: UInt32?
  public var timeout: UInt32?
  /// A token a resource refused: when it is the broker's cached one, a new one is fetched.
  public var rejectedToken: String?

  public init() {}

  func busValue(for method: OptionMethod) throws(TesseraError) -> [String: BusValue] {
    typealias O = RequestOptions
    var d: [String: BusValue] = [:]
    if let authority { d[O.authority.key] = .string(authority) }
    if let provider { d[O.provider.key] = .string(provider) }
    if let loginHint { d[O.loginHint.key] = .string(loginHint) }
    if let domainHint { d[O.domainHint.key] = .string(domainHint) }
    if let prompt { d[O.prompt.key] = .string(prompt) }
    if deviceCode { d[O.flow.key] = .string(InteractionInfo.Flow.deviceCode.rawValue) }
    if let claims { d[O.claims.key] = .string(claims) }
    if !extraQuery.isEmpty { d[O.extraQuery.key] = .stringMap(extraQuery) }
    if let correlationID { d[O.correlationID.key] = .string(correlationID) }
    if forceRefresh { d[O.forceRefresh.key] = .bool(true) }
    if let minValidity { d[O.minValidity.key] = .uint32(minValidity) }
    if let timeout { d[O.timeout.key] = .uint32(timeout) }
    if let rejectedToken { d[O.rejectedToken.key] = .string(rejectedToken) }
    try RequestOptions.validate(d, for: method)
    return d
  }
}

/// Errors from the client: the broker's own (`broker`), or the broker could not be reached.
public enum TesseraClientError: Error, Sendable, CustomStringConvertible {
  case broker(TesseraError)
  case unreachable(String)
  /// D-Bus activation started tesserad and it exited with `status` before taking its name (78:
  /// it refused its configuration). Not running, as `unreachable`; the status says why.
  case brokerExited(status: Int32, message: String)
  case bus(name: String, message: String)

  public var description: String {
    switch self {
    case .broker(let e): e.message
    case .unreachable(let m), .brokerExited(_, let m): m
    case .bus(let name, let message): "\(name): \(message)"
    }
  }

  /// Exit status for command-line tools (the one table: ErrorCode and ClientExitStatus).
  public var exitCode: Int32 {
    switch self {
    case .broker(let e): e.code.exitCode
    case .unreachable, .brokerExited: ClientExitStatus.brokerNotRunning.rawValue
    case .bus: ClientExitStatus.failure.rawValue
    }
  }
}

/// A connection to the Tessera broker on the session bus. Use one instance from one thread.
public final class TesseraBroker {
  /// How `unreachable` begins when the session bus answered but could not start the broker (as
  /// opposed to no session bus at all).
  public static let notRunning = "The Tessera broker is not running"
  private let client: BusClient
  /// Asked every 100 ms while a call waits for its reply: true gives the call up (it fails with
  /// Cancelled). AsyncTesseraBroker sets it from its task's cancellation.
  var stopped: (@Sendable () -> Bool)?
  /// Seconds added to an interactive flow's own timeout for the D-Bus call.
  static let interactiveSlack: UInt32 = 60
  /// A silent call may refresh (discovery, keys, token: each bounded at 10 s by the broker).
  static let silentTimeout: Double = 60

  /// How to reach the broker.
  public enum Route: Sendable, Equatable {
    /// Its own socket ($TESSERA_SOCKET, else $XDG_RUNTIME_DIR/tessera/bus) when it is there,
    /// else the session bus.
    case automatic
    /// The session bus only (`--bus`).
    case sessionBus
    /// This socket only.
    case socket(String)
  }

  /// How this connection reaches the broker.
  public enum Connection: Sendable, Equatable {
    case socket(path: String, pid: UInt32)
    case sessionBus
  }
  public let connection: Connection

  public init(route: Route = .automatic) throws(TesseraClientError) {
    var environment: [String: String] = [:]
    for key in [DirectSocket.environmentVariable, "XDG_RUNTIME_DIR"] {
      if let value = getenv(key) { environment[key] = String(cString: value) }
    }
    var socketPath: String?
    var explicit = false
    switch route {
    case .sessionBus: break
    case .socket(let path):
      socketPath = path
      explicit = true
    case .automatic:
      socketPath = DirectSocket.path(environment: environment)
      explicit = environment[DirectSocket.environmentVariable].map { !$0.isEmpty } ?? false
    }
    var noSocket: String?
    if let socketPath {
      do {
        let direct = try BusClient(directSocket: socketPath) { peer in
          Self.refusal(ofSocketPeer: peer, path: socketPath, environment: environment)
        }
        let peer = direct.directPeer!
        client = direct
        connection = .socket(path: socketPath, pid: peer.pid)
        return
      } catch {
        if error.name == BusClient.untrustedSocketError { throw .broker(.accessDenied(error.message)) }
        if error.name != BusClient.noSocketError || explicit {
          throw .unreachable(
            "\(Self.notRunning) (\(error.message)). Start it with `tesserad` or `systemctl --user start tessera`.")
        }
        noSocket = error.message
      }
    }
    do {
      client = try BusClient()
      connection = .sessionBus
    } catch {
      // Neither way: say both, so a user on an SSH box knows what to start.
      if let noSocket {
        throw .unreachable(
          "\(Self.notRunning): its socket \(noSocket), and there is no session bus either. Start it with `tesserad &`, or run `systemctl --user enable --now tessera.socket` once to have it started on demand."
        )
      }
      throw .unreachable(error.message)
    }
  }

  /// Why the process listening on the broker's socket is not the user's broker, or nil. When the
  /// user's service manager runs Tessera, the socket must be served from it:
  /// - while tessera.socket is active and lists this socket, by the manager itself (socket
  ///   activation: the kernel names whoever called listen(), the manager, whichever process
  ///   accepts), whether tessera.service runs or not;
  /// - else, while tessera.service runs, by its MainPID.
  /// Each is asked of the manager over its private socket, whose own peer the kernel names. A
  /// process's cgroup proves nothing here: the user may create and enter a cgroup named
  /// tessera.service. What cannot be asked (no manager, a manager that does not answer) is not
  /// held against the socket: a program of the user's own could fake the manager too
  /// (docs/threat-model.md).
  static func refusal(ofSocketPeer peer: DirectSocket.PeerCredentials, path: String, environment: [String: String])
    -> String?
  {
    // A forward's socket on a remote host (in /tmp, made by ssh): served by ssh, never by a
    // tessera.service there.
    if DirectSocket.isInSharedDirectory(path) { return nil }
    guard let runtime = environment["XDG_RUNTIME_DIR"],
      let manager = try? BusClient(directSocket: runtime + "/systemd/private"),
      let managerPID = manager.directPeer?.pid
    else { return nil }  // no user manager: nothing runs tessera.service
    // Whether tessera.socket is active and lists this socket (nil: the manager did not say).
    func socketUnitHoldsPath() -> Bool? {
      guard case .string(let state)? = unitProperty(manager, "tessera_2esocket", "Unit", "ActiveState") else {
        return nil
      }
      guard state == "active" else { return false }
      guard case .structs(_, let rows)? = unitProperty(manager, "tessera_2esocket", "Socket", "Listen") else {
        return nil
      }
      return rows.contains { row in
        if row.count == 2, case .string(let listed) = row[1] { return DirectSocket.sameFile(listed, path) }
        return false
      }
    }
    if peer.pid == managerPID {
      // The manager holds the socket: only tessera.socket's own is the broker's.
      guard socketUnitHoldsPath() == false else { return nil }
      return
        "The socket \(path) is held by your service manager (process \(peer.pid)), but not as tessera.socket's: another unit took the broker's socket. Nothing was sent to it; see `systemctl --user list-sockets`."
    }
    let mainPID: UInt32? = {
      guard case .uint32(let pid)? = unitProperty(manager, "tessera_2eservice", "Service", "MainPID") else {
        return nil
      }
      return pid == 0 ? nil : pid
    }()
    if mainPID == peer.pid { return nil }  // tesserad itself, which made its socket
    if socketUnitHoldsPath() == true {
      // tessera.socket holds this path: whoever listens there now replaced the manager's socket.
      return
        "The socket \(path) belongs to tessera.socket, but process \(peer.pid) listens there instead of your service manager (process \(managerPID)): another program took the broker's socket. Nothing was sent to it; stop process \(peer.pid), then run `systemctl --user restart tessera.socket`."
    }
    guard let mainPID else { return nil }
    return
      "The socket \(path) is served by process \(peer.pid), but tessera.service runs as process \(mainPID): another program took the broker's socket. Nothing was sent to it; stop process \(peer.pid)."
  }

  /// A property of one of the manager's units (`org.freedesktop.systemd1.KIND`), or nil.
  static func unitProperty(_ manager: BusClient, _ unit: String, _ kind: String, _ name: String) -> BusValue? {
    try? manager.call(
      destination: "org.freedesktop.systemd1", path: "/org/freedesktop/systemd1/unit/" + unit,
      interface: "org.freedesktop.DBus.Properties", member: "Get",
      arguments: [.string("org.freedesktop.systemd1." + kind), .string(name)], timeoutSeconds: 5
    ).first
  }

  private func call(
    _ member: String, _ arguments: [BusValue], timeout: Double = 25, signalSender: String? = nil,
    destination: String = BrokerInterface.busName, onSignal: ((String, [BusValue]) -> Void)? = nil,
    interface: String = BrokerInterface.interfaceName, path: String = BrokerInterface.objectPath
  ) throws(TesseraClientError) -> [BusValue] {
    do {
      return try client.call(
        destination: destination, path: path, interface: interface, member: member, arguments: arguments,
        timeoutSeconds: timeout, signalSender: signalSender, onSignal: onSignal, stopped: stopped)
    } catch {
      if error.name == BusClient.stoppedError {
        throw .broker(.cancelled("The call was cancelled before the broker answered."))
      }
      if let code = TesseraError.Code(dbusName: error.name) { throw .broker(TesseraError(code, error.message)) }
      switch error.name {
      case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner",
        "org.freedesktop.DBus.Error.NoServer", "org.freedesktop.DBus.Error.Spawn.ChildExited",
        "org.freedesktop.DBus.Error.Spawn.ExecFailed", "org.freedesktop.DBus.Error.Disconnected":
        let message =
          "\(Self.notRunning) (\(error.message)). Start it with `tesserad` or `systemctl --user start tessera`."
        if let status = Self.activationExitStatus(name: error.name, message: error.message) {
          throw .brokerExited(status: status, message: message)
        }
        throw .unreachable(message)
      case "org.freedesktop.DBus.Error.NoReply", "org.freedesktop.DBus.Error.Timeout":
        throw .broker(.timedOut("The broker did not answer in time (\(error.message)). Try again."))
      default:
        throw .bus(name: error.name, message: error.message)
      }
    }
  }

  /// The exit status of a tesserad that D-Bus activation ran (Exec= in the .service file): the bus
  /// daemon's error says "Process org.tessera.Broker1 exited with status N".
  static func activationExitStatus(name: String, message: String) -> Int32? {
    guard name == "org.freedesktop.DBus.Error.Spawn.ChildExited",
      let range = message.firstRange(of: "exited with status ")
    else { return nil }
    return Int32(message[range.upperBound...].prefix { $0.isASCII && $0.isNumber })
  }

  /// Calls a method of org.tessera.Broker1 (the one table of its names: BrokerInterface.MethodName).
  private func call(
    _ method: BrokerInterface.MethodName, _ arguments: [BusValue], timeout: Double = 25, signalSender: String? = nil,
    destination: String = BrokerInterface.busName, onSignal: ((String, [BusValue]) -> Void)? = nil
  ) throws(TesseraClientError) -> [BusValue] {
    try call(
      method.rawValue, arguments, timeout: timeout, signalSender: signalSender, destination: destination,
      onSignal: onSignal)
  }

  private func encode(_ options: TesseraTokenOptions, for method: OptionMethod) throws(TesseraClientError) -> [String:
    BusValue]
  {
    do { return try options.busValue(for: method) } catch { throw .broker(error) }
  }

  /// The connection that owns org.tessera.Broker1, started by activation if needed, once it is
  /// known to be the broker: a process of this user and, when the user's service manager runs
  /// tessera.service, that service's process. Only its signals are believed: any program on the bus
  /// can send an InteractionPending with a URL of its choosing.
  func verifiedBroker() throws(TesseraClientError) -> BusClient.NameOwner {
    // On the broker's own socket, the peer was checked before anything was sent (init).
    if case .socket(_, let pid) = connection {
      return BusClient.NameOwner(uniqueName: BrokerInterface.busName, pid: pid, uid: getuid())
    }
    // Peer.Ping starts the broker through D-Bus activation when it is not running.
    _ = try call("Ping", [], interface: "org.freedesktop.DBus.Peer")
    let owner: BusClient.NameOwner?
    do { owner = try client.owner(of: BrokerInterface.busName) } catch {
      throw .bus(name: error.name, message: error.message)
    }
    guard let owner else {
      throw .unreachable("The Tessera broker stopped while the sign-in was starting. Try again.")
    }
    guard owner.uid == getuid() else {
      throw .broker(
        .accessDenied(
          "\(BrokerInterface.busName) is owned by another user's process (uid \(owner.uid.map(String.init) ?? "unknown")), not by your broker. Refusing to sign in through it."
        ))
    }
    if let mainPID = serviceMainPID(), let pid = owner.pid, pid != mainPID {
      throw .broker(
        .accessDenied(
          "\(BrokerInterface.busName) is owned by process \(pid), but tessera.service runs as process \(mainPID): another program took the broker's name. Refusing to sign in through it; stop process \(pid)."
        ))
    }
    return owner
  }

  /// Who answers Microsoft's broker protocol (com.microsoft.identity.broker1) on this bus.
  public enum MicrosoftFront: Sendable, Equatable {
    /// This broker (the process owning org.tessera.Broker1) serves it.
    case served
    /// Another program owns the name (Microsoft's own broker, say): MSAL apps use that one.
    case otherBroker(pid: UInt32?, executable: String?)
    /// Nobody: tesserad runs with microsoft_broker = false.
    case off
  }

  /// Who serves com.microsoft.identity.broker1, as the bus daemon vouches for it.
  public func microsoftFront() throws(TesseraClientError) -> MicrosoftFront {
    var client = client
    if case .socket = connection {
      // Microsoft's front lives on the session bus only.
      do { client = try BusClient() } catch { throw .unreachable(error.message) }
    }
    do {
      let tessera = try client.owner(of: BrokerInterface.busName)
      guard let microsoft = try client.owner(of: MicrosoftBrokerInterface.busName) else { return .off }
      if let tessera, tessera.uniqueName == microsoft.uniqueName { return .served }
      return .otherBroker(pid: microsoft.pid, executable: microsoft.pid.flatMap(Syscall.executable(of:)))
    } catch {
      throw .bus(name: error.name, message: error.message)
    }
  }

  /// tessera.service's main process under the user's service manager; nil when the service manager
  /// is not on this bus, or tessera.service is not running there (tesserad started by hand).
  private func serviceMainPID() -> UInt32? {
    let manager = "org.freedesktop.systemd1"
    guard
      let unit = try? call(
        "GetUnit", [.string("tessera.service")], destination: manager, interface: manager + ".Manager",
        path: "/org/freedesktop/systemd1"
      ).first?.stringValue,
      let value = try? call(
        "Get", [.string(manager + ".Service"), .string("MainPID")], destination: manager,
        interface: "org.freedesktop.DBus.Properties", path: unit
      ).first, case .uint32(let pid) = value, pid != 0
    else { return nil }
    return pid
  }

  /// Interactive sign-in. `onInteraction` is called when the user must act (open a URL, enter a code).
  public func acquireToken(
    clientID: String = "", scopes: [String] = [], options: TesseraTokenOptions = .init(),
    onInteraction: ((TesseraInteraction) -> Void)? = nil
  ) throws(TesseraClientError) -> TesseraToken {
    let flowTimeout =
      options.timeout ?? (options.deviceCode ? InteractiveTimeouts.deviceCode : InteractiveTimeouts.browser)
    // Our own correlation id: only InteractionPending signals carrying it are for this call.
    var options = options
    let correlationID = options.correlationID ?? CorrelationID.new()
    options.correlationID = correlationID
    let encoded = try encode(options, for: .acquireToken)
    let broker = try verifiedBroker()
    let reply = try call(
      .acquireToken, [.string(clientID), .strings(scopes), .dict(encoded)],
      timeout: Double(flowTimeout + Self.interactiveSlack), signalSender: broker.uniqueName,
      destination: broker.uniqueName,
      onSignal: { member, values in
        guard member == "InteractionPending", values.count == 2, values[0] == .string(correlationID),
          case .dict(let info) = values[1], let interaction = InteractionInfo(busValue: info)
        else { return }
        onInteraction?(interaction)
      })
    return TokenInfo(busValue: reply.first?.dictValue ?? [:])
  }

  public func acquireTokenSilent(
    clientID: String = "", scopes: [String] = [], accountID: String = "", options: TesseraTokenOptions = .init()
  ) throws(TesseraClientError) -> TesseraToken {
    let reply = try call(
      .acquireTokenSilent,
      [.string(clientID), .strings(scopes), .string(accountID), .dict(encode(options, for: .acquireTokenSilent))],
      timeout: Self.silentTimeout)
    return TokenInfo(busValue: reply.first?.dictValue ?? [:])
  }

  /// Tells the broker a resource refused `token` (an HTTP 401): when it is the broker's cached
  /// token for this client and account, it is dropped, and the next request gets a new one (by a
  /// refresh, or a sign-in when the provider gave no refresh token). Only `authority`, `provider`
  /// and `correlationID` of `options` apply. Returns whether a cached token was dropped.
  @discardableResult
  public func rejectToken(
    _ token: String, clientID: String = "", accountID: String = "", options: TesseraTokenOptions = .init()
  ) throws(TesseraClientError) -> Bool {
    let reply = try call(
      .rejectToken,
      [.string(clientID), .string(accountID), .string(token), .dict(encode(options, for: .rejectToken))],
      timeout: Self.silentTimeout)
    guard case .bool(let dropped)? = reply.first else { return false }
    return dropped
  }

  /// The DPoP header value for one request with a key-bound access token (GetProof): `method` and
  /// `url` are the request's, `nonce` the DPoP-Nonce a resource server asked for. One per request.
  public func proof(method: String, url: String, token: String, nonce: String? = nil) throws(TesseraClientError)
    -> String
  {
    var options: [String: BusValue] = [:]
    if let nonce { options[RequestOptions.nonce.key] = .string(nonce) }
    guard
      case .string(let proof)? = try call(
        .getProof, [.string(method), .string(url), .string(token), .dict(options)], timeout: Self.silentTimeout
      ).first
    else { throw .broker(.internal("GetProof answered without a proof.")) }
    return proof
  }

  public func accounts(clientID: String? = nil, authority: String? = nil, username: String? = nil)
    throws(TesseraClientError) -> [TesseraAccount]
  {
    var filter: [String: BusValue] = [:]
    if let clientID { filter[RequestOptions.clientID.key] = .string(clientID) }
    if let authority { filter[RequestOptions.authority.key] = .string(authority) }
    if let username { filter[RequestOptions.username.key] = .string(username) }
    do { try RequestOptions.validate(filter, for: .getAccounts) } catch { throw .broker(error) }
    guard case .dicts(let accounts)? = try call(.getAccounts, [.dict(filter)]).first else { return [] }
    return accounts.map(AccountInfo.init(busValue:))
  }

  public func signOut(
    accountID: String, clientID: String? = nil, revoke: Bool = true, browser: Bool = false
  ) throws(TesseraClientError) {
    var options: [String: BusValue] = [:]
    if let clientID { options[RequestOptions.clientID.key] = .string(clientID) }
    if !revoke { options[RequestOptions.revoke.key] = .bool(false) }
    if browser { options[RequestOptions.browser.key] = .bool(true) }
    do { try RequestOptions.validate(options, for: .signOut) } catch { throw .broker(error) }
    _ = try call(.signOut, [.string(accountID), .dict(options)])
  }

  /// Makes an account (an id or a username) the current one of its identity provider: requests
  /// that name no account get it when several are signed in there. `authority` narrows the
  /// search when a username is signed in at several. Returns the account.
  public func setCurrentAccount(_ account: String, authority: String? = nil) throws(TesseraClientError)
    -> TesseraAccount
  {
    let reply = try call(.setCurrentAccount, [.string(account), .string(authority ?? "")])
    return AccountInfo(busValue: reply.first?.dictValue ?? [:])
  }

  /// What a store move did (MoveStore): the store kinds and how many items went across.
  public struct StoreMove: Sendable, Equatable, Encodable {
    public var from: String
    public var to: String
    public var items: Int
  }

  /// Moves every item to the store `to` ("file" or "secret-service") and makes tesserad use it
  /// (`tessera store migrate`). Safe to interrupt: tesserad finishes an interrupted move at start.
  public func moveStore(to: String) throws(TesseraClientError) -> StoreMove {
    // Moving many items through the keyring can take a while.
    let none: [String: BusValue] = [:]
    let reply = try call(BrokerInterface.MethodName.moveStore, [.string(to), .dict(none)], timeout: 300)
    let result = reply.first?.dictValue ?? [:]
    var items = 0
    if case .uint32(let count)? = result["items"] { items = Int(count) }
    return StoreMove(from: result["from"]?.stringValue ?? "", to: result["to"]?.stringValue ?? "", items: items)
  }

  /// Makes a forward of the broker's socket (`tessera forward`): a listener at `path` ("" for
  /// `$XDG_RUNTIME_DIR/tessera/forward/NAME`) whose callers are the app `forward:NAME` and may
  /// only get tokens. Not `lasting`: it ends when this connection closes. Returns its path.
  public func addForward(name: String, host: String, path: String = "", lasting: Bool) throws(TesseraClientError)
    -> String
  {
    let options: [String: BusValue] = lasting ? [RequestOptions.lasting.key: .bool(true)] : [:]
    let reply = try call(.addForward, [.string(name), .string(host), .string(path), .dict(options)])
    return reply.first?.stringValue ?? ""
  }

  /// Ends a forward; the `tessera forward` that made it is told (ForwardEnded) and ends its ssh.
  public func removeForward(name: String) throws(TesseraClientError) {
    _ = try call(.removeForward, [.string(name)])
  }

  /// The live forwards.
  public func forwards() throws(TesseraClientError) -> [ForwardInfo] {
    guard case .dicts(let list)? = try call(.listForwards, []).first else { return [] }
    return list.map(ForwardInfo.init(busValue:))
  }

  /// Waits until forward `name` is ended by someone else (ForwardEnded: `--stop`, tesserad
  /// stopping), returning why; or returns nil once `until` says so (asked every 200 ms).
  /// The connection closing (tesserad gone) counts as the forward ending.
  public func waitForForwardEnd(_ name: String, until: () -> Bool) throws(TesseraClientError) -> String? {
    let sender = try verifiedBroker().uniqueName
    do {
      while true {
        guard
          let values = try client.waitForSignal(
            BrokerInterface.forwardEnded, signalSender: connection == .sessionBus ? sender : nil, until: until)
        else { return nil }
        if values.first?.stringValue == name { return values.dropFirst().first?.stringValue ?? "ended" }
      }
    } catch {
      return "the connection to tesserad closed (\(error.message))"
    }
  }

  /// Cancels this connection's interactive sign-in with that correlation id (it ends with Cancelled).
  public func cancel(correlationID: String) throws(TesseraClientError) {
    _ = try call(.cancel, [.string(correlationID)])
  }

  /// The broker's health report (GetStatus): the accounts needing a sign-in, and each account's
  /// state, last error, next refresh and cached tokens (never their values).
  public func status() throws(TesseraClientError) -> StatusReport.Report {
    StatusReport.Report(busValue: try call(.getStatus, []).first?.dictValue ?? [:])
  }

  /// Per-application access control: the grants, as ListGrants returns them.
  public func grants() throws(TesseraClientError) -> [GrantInfo] {
    guard case .dicts(let list)? = try call(.listGrants, []).first else { return [] }
    return list.map(GrantInfo.init(busValue:))
  }

  /// Lets `app` use `clientID` for `accountID` (an id, a username, "*" or "" for the only one),
  /// narrowed to an authority, scopes and operations when they are given (empty: any).
  public func grant(
    app: String, clientID: String, accountID: String, authority: String = "", scopes: [String] = [],
    operations: [String] = []
  ) throws(TesseraClientError) {
    _ = try call(
      .grant,
      [.string(app), .string(clientID), .string(accountID), .string(authority), .strings(scopes), .strings(operations)])
  }

  /// How many signed-in accounts GetAccounts hides from this program (it holds no grant for them).
  public func hiddenAccountCount() throws(TesseraClientError) -> UInt32 {
    guard case .uint32(let n)? = try call(.countHiddenAccounts, []).first else { return 0 }
    return n
  }

  /// Removes the app's grants (for one client id, or all with nil); returns how many.
  public func revoke(app: String, clientID: String?) throws(TesseraClientError) -> UInt32 {
    guard case .uint32(let n)? = try call(.revoke, [.string(app), .string(clientID ?? "")]).first else { return 0 }
    return n
  }
  /// The user's answer to a Question (see Question's answers); only the app that registered may.
  public func answerQuestion(id: String, answer: String, remember: Bool = false) throws(TesseraClientError) {
    let options: [String: BusValue] = remember ? [RequestOptions.remember.key: .bool(true)] : [:]
    _ = try call(.answerQuestion, [.string(id), .string(answer), .dict(options)])
  }

  /// Takes away an app's grants for one account (an id, a username, or "*" for the grants that
  /// cover every account), for one client id or all; returns how many (RevokeGrant).
  public func revokeGrant(app: String, clientID: String?, account: String) throws(TesseraClientError) -> UInt32 {
    guard
      case .uint32(let n)? = try call(.revokeGrant, [.string(app), .string(clientID ?? ""), .string(account)]).first
    else { return 0 }
    return n
  }

  /// The last access decisions (GetAccessLog), oldest first.
  public func accessLog() throws(TesseraClientError) -> [AccessRecord] {
    guard case .dicts(let list)? = try call(.getAccessLog, []).first else { return [] }
    return list.map(AccessRecord.init(busValue:))
  }

  /// The broker's Version property.
  /// The accounts (ids) that need the user to sign in again: the AttentionNeeded property.
  public func attentionNeeded() throws(TesseraClientError) -> [String] {
    let reply = try call(
      "Get", [.string(BrokerInterface.interfaceName), .string(BrokerInterface.attentionNeeded)],
      interface: "org.freedesktop.DBus.Properties")
    if case .strings(let ids)? = reply.first { return ids }
    return []
  }

  /// Hands the broker's news to `onEvent` as it comes (accounts added, removed or made current;
  /// the accounts needing a sign-in), until `until` says stop (asked every 200 ms). Only the
  /// verified broker is heard. Throws `unreachable` when tesserad stops or the connection closes:
  /// a watcher then reads the state again and watches anew.
  public func watchEvents(
    answeringQuestions: Bool = false, until: () -> Bool, onEvent: @escaping (TesseraEvent) -> Void
  ) throws(TesseraClientError) {
    let sender = try verifiedBroker().uniqueName
    var refused: TesseraClientError?
    do {
      try client.watchSignals(
        signalSender: connection == .sessionBus ? sender : nil, until: { refused != nil || until() },
        onStart: {
          // The questions go to the connection that registers: this one, subscribed from now on,
          // so none is missed.
          if answeringQuestions {
            do throws(TesseraClientError) { _ = try self.call(.registerPrompter, []) } catch {
              refused = error
              return
            }
          }
          onEvent(.watching)
        }
      ) { member, values in
        if let event = TesseraEvent(member: member, values: values) { onEvent(event) }
      }
    } catch {
      throw .unreachable("The broker stopped (\(error.message)). Start it again to hear from it.")
    }
    if let refused { throw refused }
  }

  public func version() throws(TesseraClientError) -> String {
    let reply = try call(
      "Get", [.string(BrokerInterface.interfaceName), .string("Version")], interface: "org.freedesktop.DBus.Properties")
    return reply.first?.stringValue ?? ""
  }
}

/// What the broker announces to every app (watchEvents, AsyncTesseraBroker.events()).
public enum TesseraEvent: Sendable, Equatable {
  /// The watch is on: read the state now; every change from here on comes as an event.
  case watching
  /// An account was added, removed or made current (AccountsChanged): read GetAccounts again.
  case accountsChanged
  /// The accounts (ids) that need a sign-in changed (AttentionNeeded).
  case attentionNeeded([String])
  /// Grants, forwards or the configuration changed (ManagementChanged): read that part again.
  case managementChanged(BrokerInterface.ManagementPart)
  /// A question for the user (only to the app that registered: watchEvents(answeringQuestions:)):
  /// its id for answerQuestion, and what to show (Question's keys).
  case question(id: String, info: [String: BusValue])

  init?(member: String, values: [BusValue]) {
    switch member {
    case BrokerInterface.accountsChanged: self = .accountsChanged
    case BrokerInterface.question:
      guard values.count == 2, let id = values[0].stringValue, case .dict(let info) = values[1] else { return nil }
      self = .question(id: id, info: info)
    case BrokerInterface.managementChanged:
      guard let part = values.first?.stringValue.flatMap(BrokerInterface.ManagementPart.init(rawValue:)) else {
        return nil
      }
      self = .managementChanged(part)
    case "PropertiesChanged":
      guard values.first?.stringValue == BrokerInterface.interfaceName,
        case .dict(let changed)? = values.dropFirst().first,
        case .strings(let ids)? = changed[BrokerInterface.attentionNeeded]
      else { return nil }
      self = .attentionNeeded(ids)
    default: return nil
    }
  }
}
