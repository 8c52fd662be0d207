import TesseraCore
import TesseraPlatform

@_exported import struct TesseraCore.TesseraError

/// An account the broker knows, as any app may see it.
public struct TesseraAccount: Sendable, Equatable, Codable {
  public var id: String
  public var username: String
  public var name: String
  public var authority: String
  public var environment: String
  public var realm: String
  public var localAccountID: String

  init(_ d: [String: BusValue]) {
    func s(_ k: String) -> String { d[k]?.stringValue ?? "" }
    id = s("id")
    username = s("username")
    name = s("name")
    authority = s("authority")
    environment = s("environment")
    realm = s("realm")
    localAccountID = s("local_account_id")
  }

  enum CodingKeys: String, CodingKey {
    case id, username, name, authority, environment, realm
    case localAccountID = "local_account_id"
  }
}

/// An access token handed out by the broker. There is never a refresh token here.
public struct TesseraToken: Sendable, Equatable, Codable {
  public var accessToken: String
  public var tokenType: String
  /// Unix seconds.
  public var expiresOn: Int64
  public var scopes: [String]
  public var account: TesseraAccount
  public var idToken: String?
  public var correlationID: String

  init(_ d: [String: BusValue]) {
    accessToken = d["access_token"]?.stringValue ?? ""
    tokenType = d["token_type"]?.stringValue ?? "Bearer"
    if case .int64(let e)? = d["expires_on"] { expiresOn = e } else { expiresOn = 0 }
    if case .strings(let s)? = d["scopes"] { scopes = s } else { scopes = [] }
    account = TesseraAccount(d["account"]?.dictValue ?? [:])
    idToken = d["id_token"]?.stringValue
    correlationID = d["correlation_id"]?.stringValue ?? ""
  }

  enum CodingKeys: String, CodingKey {
    case accessToken = "access_token"
    case tokenType = "token_type"
    case expiresOn = "expires_on"
    case scopes, account
    case idToken = "id_token"
    case correlationID = "correlation_id"
  }
}

/// What the user must do to finish an interactive sign-in (InteractionPending).
public struct TesseraInteraction: Sendable, Equatable {
  public var flow: String
  public var verificationURI: String
  public var userCode: String?
  public var expiresIn: UInt32
  public var message: String
}

/// Options of AcquireToken / AcquireTokenSilent; nil means "not sent".
public struct TesseraTokenOptions: Sendable {
  public var authority: String?
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

  public init() {}

  var busValue: [String: BusValue] {
    var d: [String: BusValue] = [:]
    if let authority { d["authority"] = .string(authority) }
    if let loginHint { d["login_hint"] = .string(loginHint) }
    if let domainHint { d["domain_hint"] = .string(domainHint) }
    if let prompt { d["prompt"] = .string(prompt) }
    if deviceCode { d["flow"] = .string("device_code") }
    if let claims { d["claims"] = .string(claims) }
    if !extraQuery.isEmpty { d["extra_query"] = .stringMap(extraQuery) }
    if let correlationID { d["correlation_id"] = .string(correlationID) }
    if forceRefresh { d["force_refresh"] = .bool(true) }
    if let minValidity { d["min_validity"] = .uint32(minValidity) }
    if let timeout { d["timeout"] = .uint32(timeout) }
    return d
  }
}

/// Errors from the client: the broker's own (`broker`), or the broker could not be reached.
public enum TesseraClientError: Error, Sendable, CustomStringConvertible {
  case broker(TesseraError)
  case unreachable(String)
  case bus(name: String, message: String)

  public var description: String {
    switch self {
    case .broker(let e): e.message
    case .unreachable(let m): m
    case .bus(let name, let message): "\(name): \(message)"
    }
  }

  /// Exit status for command-line tools (documented in tessera(1)).
  public var exitCode: Int32 {
    switch self {
    case .broker(let e): e.code.exitCode
    case .unreachable: 14
    case .bus: 1
    }
  }
}

/// A connection to the Tessera broker on the session bus. Use one instance from one thread.
public final class TesseraBroker {
  private let client: BusClient
  /// Seconds added to an interactive flow's own timeout for the D-Bus call.
  static let interactiveSlack: UInt32 = 60
  /// A silent call may refresh (discovery, keys, token: each bounded at 10 s by the broker).
  static let silentTimeout: Double = 60

  public init() throws(TesseraClientError) {
    do {
      client = try BusClient()
    } catch {
      throw .unreachable((error as? BusCallError)?.message ?? "\(error)")
    }
  }

  private func call(
    _ member: String, _ arguments: [BusValue], timeout: Double = 25, onSignal: ((String, [BusValue]) -> Void)? = nil,
    interface: String = BrokerInterface.interfaceName
  ) throws(TesseraClientError) -> [BusValue] {
    do {
      return try client.call(
        interface: interface, member: member, arguments: arguments, timeoutSeconds: timeout, onSignal: onSignal)
    } catch let error as BusCallError {
      if let code = TesseraError.Code(dbusName: error.name) { throw .broker(TesseraError(code, error.message)) }
      switch error.name {
      case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner",
        "org.freedesktop.DBus.Error.NoServer", "org.freedesktop.DBus.Error.Spawn.ChildExited",
        "org.freedesktop.DBus.Error.Spawn.ExecFailed", "org.freedesktop.DBus.Error.Disconnected":
        throw .unreachable(
          "The Tessera broker is not running (\(error.message)). Start it with `tesserad` or `systemctl --user start tessera`."
        )
      case "org.freedesktop.DBus.Error.NoReply", "org.freedesktop.DBus.Error.Timeout":
        throw .broker(.timedOut("The broker did not answer in time (\(error.message)). Try again."))
      default:
        throw .bus(name: error.name, message: error.message)
      }
    } catch {
      throw .bus(name: "org.freedesktop.DBus.Error.Failed", message: "\(error)")
    }
  }

  /// Interactive sign-in. `onInteraction` is called when the user must act (open a URL, enter a code).
  public func acquireToken(
    clientID: String = "", scopes: [String] = [], options: TesseraTokenOptions = .init(),
    onInteraction: ((TesseraInteraction) -> Void)? = nil
  ) throws(TesseraClientError) -> TesseraToken {
    let flowTimeout =
      options.timeout ?? (options.deviceCode ? Broker.defaultDeviceCodeTimeout : Broker.defaultBrowserTimeout)
    // Our own correlation id: only InteractionPending signals carrying it are for this call.
    var options = options
    let correlationID = options.correlationID ?? RequestParser.newCorrelationID()
    options.correlationID = correlationID
    let reply = try call(
      "AcquireToken", [.string(clientID), .strings(scopes), .dict(options.busValue)],
      timeout: Double(flowTimeout + Self.interactiveSlack),
      onSignal: { member, values in
        guard member == "InteractionPending", values.count == 2, values[0] == .string(correlationID),
          case .dict(let info) = values[1]
        else { return }
        var expires: UInt32 = 0
        if case .uint32(let e)? = info["expires_in"] { expires = e }
        onInteraction?(
          TesseraInteraction(
            flow: info["flow"]?.stringValue ?? "", verificationURI: info["verification_uri"]?.stringValue ?? "",
            userCode: info["user_code"]?.stringValue, expiresIn: expires, message: info["message"]?.stringValue ?? ""))
      })
    return TesseraToken(reply.first?.dictValue ?? [:])
  }

  public func acquireTokenSilent(
    clientID: String = "", scopes: [String] = [], accountID: String = "", options: TesseraTokenOptions = .init()
  ) throws(TesseraClientError) -> TesseraToken {
    let reply = try call(
      "AcquireTokenSilent", [.string(clientID), .strings(scopes), .string(accountID), .dict(options.busValue)],
      timeout: Self.silentTimeout)
    return TesseraToken(reply.first?.dictValue ?? [:])
  }

  public func accounts(clientID: String? = nil, authority: String? = nil, username: String? = nil)
    throws(TesseraClientError) -> [TesseraAccount]
  {
    var filter: [String: BusValue] = [:]
    if let clientID { filter["client_id"] = .string(clientID) }
    if let authority { filter["authority"] = .string(authority) }
    if let username { filter["username"] = .string(username) }
    guard case .dicts(let accounts)? = try call("GetAccounts", [.dict(filter)]).first else { return [] }
    return accounts.map(TesseraAccount.init)
  }

  public func signOut(accountID: String, clientID: String? = nil, revoke: Bool = true) throws(TesseraClientError) {
    var options: [String: BusValue] = [:]
    if let clientID { options["client_id"] = .string(clientID) }
    if !revoke { options["revoke"] = .bool(false) }
    _ = try call("SignOut", [.string(accountID), .dict(options)])
  }

  /// Cancels this connection's interactive sign-in with that correlation id (it ends with Cancelled).
  public func cancel(correlationID: String) throws(TesseraClientError) {
    _ = try call("Cancel", [.string(correlationID)])
  }

  /// The broker's Version property.
  public func version() throws(TesseraClientError) -> String {
    let reply = try call(
      "Get", [.string(BrokerInterface.interfaceName), .string("Version")], interface: "org.freedesktop.DBus.Properties")
    return reply.first?.stringValue ?? ""
  }
}
