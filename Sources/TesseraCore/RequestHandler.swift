import Logging

/// Turns a D-Bus method call into a broker operation and its reply, and logs every request:
/// correlation id, caller, client id, scopes and outcome. Never a token.
public struct RequestHandler: Sendable {
  public let broker: Broker
  let logger: Logger
  let clock: any BrokerClock

  public init(broker: Broker, logger: Logger, clock: any BrokerClock = SystemClock()) {
    self.broker = broker
    self.logger = logger
    self.clock = clock
  }

  /// Answers a silent request on the calling (bus) thread when the token actor has published its
  /// reply, or refuses it when its arguments are invalid (with the full path's error); nil when the
  /// full path must answer. Logged like any other request.
  public func answerAtOnce(method: String, arguments: [BusValue], caller: CallerInfo) -> FastAnswer? {
    guard method == "AcquireTokenSilent",
      let answer = broker.fastPath.answer(
        arguments, now: clock.now().timeIntervalSince1970, elapsed: clock.elapsed(), app: caller.appKey)
    else { return nil }
    switch answer {
    case .reply(let template, let correlationID):
      if logger.logLevel <= .info {
        var metadata = Self.callerMetadata(method, caller)
        metadata["correlation_id"] = "\(correlationID)"
        metadata["outcome"] = "ok"
        metadata["cache"] = "hit"
        if case .string(let clientID) = arguments[0] {
          metadata["client_id"] = "\(clientID.isEmpty ? "(default)" : clientID)"
        }
        if case .strings(let scopes) = arguments[1] {
          metadata["scopes"] = "\(scopes.isEmpty ? "(default)" : scopes.joined(separator: " "))"
        }
        logger.info("\(method) succeeded", metadata: metadata)
      }
      return .template(template, key: TokenInfo.correlationIDKey, value: .string(correlationID))
    case .refused(let error):
      var metadata = Self.callerMetadata(method, caller)
      metadata["outcome"] = "\(error.code.rawValue)"
      logger.notice("\(method) failed: \(error.message)", metadata: metadata)
      return .reply(.failure(error))
    }
  }

  static func callerMetadata(_ method: String, _ caller: CallerInfo) -> Logger.Metadata {
    [
      "method": "\(method)", "caller_pid": "\(caller.pid.map(String.init) ?? "?")",
      "caller_exe": "\(caller.exe ?? "?")", "caller_bus_name": "\(caller.busName)",
    ]
  }

  public func handle(method: String, arguments: [BusValue], caller: CallerInfo) async -> Result<
    [BusValue], TesseraError
  > {
    let started = ContinuousClock.now
    var metadata = Self.callerMetadata(method, caller)
    let result: Result<[BusValue], TesseraError>
    do {
      result = .success(try await dispatch(method, arguments, caller, &metadata))
    } catch {
      result = .failure(TesseraError.wrap(error))
    }
    let elapsed = ContinuousClock.now - started
    metadata["duration_ms"] =
      "\(Double(elapsed.components.attoseconds / 1_000_000_000_000) / 1000 + Double(elapsed.components.seconds) * 1000)"
    switch result {
    case .success:
      metadata["outcome"] = "ok"
      logger.info("\(method) succeeded", metadata: metadata)
    case .failure(let error):
      metadata["outcome"] = "\(error.code.rawValue)"
      logger.notice("\(method) failed: \(error.message)", metadata: metadata)
    }
    return result
  }

  private func dispatch(_ method: String, _ args: [BusValue], _ caller: CallerInfo, _ metadata: inout Logger.Metadata)
    async throws -> [BusValue]
  {
    let signature = args.map(\.signature).joined()
    guard let spec = BrokerInterface.method(named: method), spec.inputSignature == signature else {
      let expected =
        BrokerInterface.method(named: method).map { "(\($0.inputSignature))" }
        ?? "nothing: it is not a method of org.tessera.Broker1"
      throw TesseraError.invalidArgument(
        "\(method) was called with arguments of type (\(signature)); it takes \(expected). Fix the call's argument types."
      )
    }
    func string(_ i: Int) -> String { args[i].stringValue ?? "" }
    func strings(_ i: Int) -> [String] { if case .strings(let v) = args[i] { v } else { [] } }
    func dict(_ i: Int) -> [String: BusValue] { args[i].dictValue ?? [:] }
    switch method {
    case "AcquireToken":
      var request = try RequestParser.tokenRequest(
        clientID: string(0), scopes: strings(1), accountID: "", options: dict(2), method: .acquireToken)
      request.caller = caller
      describe(request, into: &metadata)
      return [.dict(try await broker.acquireTokenInteractive(request, caller: caller))]
    case "AcquireTokenSilent":
      var request = try RequestParser.tokenRequest(
        clientID: string(0), scopes: strings(1), accountID: string(2), options: dict(3))
      request.caller = caller
      describe(request, into: &metadata)
      return [.dict(try await broker.acquireTokenSilent(request))]
    case "GetAccounts":
      var parsed = try RequestParser.accountFilter(dict(0))
      parsed.caller = caller
      if let clientID = parsed.clientID { metadata["client_id"] = "\(clientID)" }
      let accounts = try await broker.accounts(matching: parsed)
      metadata["accounts"] = "\(accounts.count)"
      return [.dicts(accounts)]
    case "CountHiddenAccounts":
      return [.uint32(UInt32(clamping: try await broker.hiddenAccountCount(caller)))]
    case "SignOut":
      var request = try RequestParser.signOutRequest(accountID: string(0), options: dict(1))
      request.caller = caller
      metadata["correlation_id"] = "\(request.correlationID)"
      metadata["account_id"] = "\(request.accountID)"
      if let clientID = request.clientID { metadata["client_id"] = "\(clientID)" }
      try await broker.signOut(request)
      return []
    case "GetStatus":
      // Every account and client by name: for the user's own tools, not for sandboxed apps.
      if await broker.accessMode != .open { try await broker.checkMayManage(caller) }
      return [.dict(try await broker.status())]
    case "ListGrants":
      return [.dicts(try await broker.grantList(caller: caller))]
    case "Grant":
      metadata["app_key"] = "\(SafeText.clip(string(0), limit: 300))"
      metadata["client_id"] = "\(SafeText.clip(string(1), limit: 300))"
      try await broker.grant(
        app: string(0), clientID: string(1), accountID: string(2), authority: string(3), scopes: strings(4),
        operations: strings(5), caller: caller)
      return []
    case "Revoke":
      metadata["app_key"] = "\(SafeText.clip(string(0), limit: 300))"
      let removed = try await broker.revoke(
        app: string(0), clientID: string(1).isEmpty ? nil : string(1), caller: caller)
      return [.uint32(UInt32(clamping: removed))]
    case "GetAccessLog":
      return [.dicts(try await broker.accessLog(caller: caller))]
    case "Cancel":
      metadata["correlation_id"] = "\(string(0))"
      try await broker.cancel(correlationID: string(0), caller: caller)
      return []
    default:
      throw TesseraError.internal("\(method) is declared but not implemented. Please report this.")
    }
  }

  private func describe(_ request: TokenRequest, into metadata: inout Logger.Metadata) {
    metadata["correlation_id"] = "\(request.correlationID)"
    metadata["client_id"] = "\(request.clientID.isEmpty ? "(default)" : request.clientID)"
    metadata["scopes"] = "\(request.scopes.isEmpty ? "(default)" : request.scopes.joined(separator: " "))"
    if !request.accountID.isEmpty { metadata["account_id"] = "\(request.accountID)" }
    if request.forceRefresh { metadata["force_refresh"] = "true" }
    // Whether a rejected token came, never the token.
    if request.accessTokenToRenew != nil { metadata["rejected_token"] = "given" }
    if request.flow == .deviceCode { metadata["flow"] = "device_code" }
  }
}
