import Logging

/// org.tessera.Broker1: turns a D-Bus method call into an engine operation and its typed result
/// into the reply's values (the wire mapping of TesseraInterface), and logs every request:
/// correlation id, caller, client id, scopes and outcome. Never a token.
public struct TesseraFront: Sendable {
  public let broker: Broker
  let logger: Logger
  let clock: any BrokerClock

  public init(broker: Broker, logger: Logger, clock: any BrokerClock = SystemClock()) {
    self.broker = broker
    self.logger = logger
    self.clock = clock
  }

  typealias Method = BrokerInterface.MethodName

  /// An AcquireTokenSilent request as the caller wrote it: the key of its published reply.
  struct Key: Hashable, Sendable {
    var clientID: String
    var scopes: [String]
    var accountID: String
    var authority: String?

    init(_ request: TokenRequest) {
      clientID = request.clientID
      scopes = request.scopes
      accountID = request.accountID
      authority = request.authority
    }
  }

  /// Answers a silent request on the calling (bus) thread when this front published its reply, or
  /// refuses it when its arguments are invalid (with the full path's error: the bus thread parses
  /// with the same parser over the one option table); nil when the full path must answer
  /// (force_refresh, claims, a token past its refresh time or too close to expiry, nothing
  /// published). Logged like any other request.
  public func answerAtOnce(method: String, arguments: [BusValue], caller: CallerInfo) -> FastAnswer? {
    guard method == Method.acquireTokenSilent.rawValue, arguments.count == 4,
      case .string(let clientID) = arguments[0], case .strings(let scopes) = arguments[1],
      case .string(let accountID) = arguments[2], case .dict(let options) = arguments[3]
    else { return nil }
    let request: TokenRequest
    do {
      request = try RequestParser.tokenRequest(
        clientID: clientID, scopes: scopes, accountID: accountID, options: options)
    } catch {
      let failure = TesseraError.wrap(error)
      var metadata = Self.callerMetadata(method, caller)
      metadata["outcome"] = "\(failure.code.rawValue)"
      logger.notice("\(method) failed: \(failure.message)", metadata: metadata)
      return .reply(.failure(failure))
    }
    guard !request.forceRefresh, request.claims == nil, request.accessTokenToRenew == nil,
      let published = broker.fastPath.serve(
        Key(request), from: broker.fastPath.tessera, minValidity: request.minValidity,
        now: clock.now().timeIntervalSince1970, elapsed: clock.elapsed(), app: caller.appKey)
    else { return nil }
    if logger.logLevel <= .info {
      var metadata = Self.callerMetadata(method, caller)
      metadata["correlation_id"] = "\(request.correlationID)"
      metadata["outcome"] = "ok"
      metadata["cache"] = "hit"
      metadata["client_id"] = "\(clientID.isEmpty ? "(default)" : clientID)"
      metadata["scopes"] = "\(scopes.isEmpty ? "(default)" : scopes.joined(separator: " "))"
      logger.info("\(method) succeeded", metadata: metadata)
    }
    return .template(published.reply, key: TokenInfo.correlationIDKey, value: .string(request.correlationID))
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
    metadata["duration_ms"] = "\(MicrosoftFront.milliseconds(since: started))"
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

  private func dispatch(_ name: String, _ args: [BusValue], _ caller: CallerInfo, _ metadata: inout Logger.Metadata)
    async throws -> [BusValue]
  {
    let signature = args.map(\.signature).joined()
    guard let method = Method(rawValue: name), method.spec.inputSignature == signature else {
      let expected =
        Method(rawValue: name).map { "(\($0.spec.inputSignature))" }
        ?? "nothing: it is not a method of org.tessera.Broker1"
      throw TesseraError.invalidArgument(
        "\(name) was called with arguments of type (\(signature)); it takes \(expected). Fix the call's argument types."
      )
    }
    // A caller that came through a forward (a remote host, a container) may only get tokens:
    // anything else is refused before it is looked at, and audited.
    if let app = caller.app, app.kind == .forward, !BrokerInterface.forwardedMethods.contains(name) {
      await broker.auditForwardRefusal(caller, method: name)
      throw AccessPolicy.forwardRefusal(app, "call \(name)")
    }
    func string(_ i: Int) -> String { args[i].stringValue ?? "" }
    func strings(_ i: Int) -> [String] { if case .strings(let v) = args[i] { v } else { [] } }
    func dict(_ i: Int) -> [String: BusValue] { args[i].dictValue ?? [:] }
    switch method {
    case .acquireToken:
      var request = try RequestParser.tokenRequest(
        clientID: string(0), scopes: strings(1), accountID: "", options: dict(2), method: .acquireToken)
      request.caller = caller
      describe(request, into: &metadata)
      return [.dict(try await signIn(request, caller: caller))]
    case .acquireTokenSilent:
      var request = try RequestParser.tokenRequest(
        clientID: string(0), scopes: strings(1), accountID: string(2), options: dict(3))
      request.caller = caller
      describe(request, into: &metadata)
      return [.dict(try await silentToken(request))]
    case .getAccounts:
      var parsed = try RequestParser.accountFilter(dict(0))
      parsed.caller = caller
      if let clientID = parsed.clientID { metadata["client_id"] = "\(clientID)" }
      let accounts = try await broker.knownAccounts(matching: parsed)
      metadata["accounts"] = "\(accounts.count)"
      let current = await broker.currentAccountIDs()
      return [
        .dicts(
          accounts.map { account in
            var info = account.info
            info.current = current.contains(account.id)
            return info.busValue
          })
      ]
    case .countHiddenAccounts:
      return [.uint32(UInt32(clamping: try await broker.hiddenAccountCount(caller)))]
    case .signOut:
      var request = try RequestParser.signOutRequest(accountID: string(0), options: dict(1))
      request.caller = caller
      metadata["correlation_id"] = "\(request.correlationID)"
      metadata["account_id"] = "\(request.accountID)"
      if let clientID = request.clientID { metadata["client_id"] = "\(clientID)" }
      try await broker.signOut(request)
      return []
    case .getStatus:
      // Every account and client by name: for the user's own tools, not for sandboxed apps.
      if await broker.accessMode != .open { try await broker.checkMayManage(caller) }
      return [.dict(try await broker.status().busValue)]
    case .listGrants:
      return [.dicts(try await broker.grantList(caller: caller).map(\.busValue))]
    case .grant:
      metadata["app_key"] = "\(SafeText.clip(string(0), limit: 300))"
      metadata["client_id"] = "\(SafeText.clip(string(1), limit: 300))"
      try await broker.grant(
        app: string(0), clientID: string(1), accountID: string(2), authority: string(3), scopes: strings(4),
        operations: strings(5), caller: caller)
      return []
    case .revoke:
      metadata["app_key"] = "\(SafeText.clip(string(0), limit: 300))"
      let removed = try await broker.revoke(
        app: string(0), clientID: string(1).isEmpty ? nil : string(1), caller: caller)
      return [.uint32(UInt32(clamping: removed))]
    case .getAccessLog:
      return [.dicts(try await broker.accessLog(caller: caller).map(\.busValue))]
    case .setCurrentAccount:
      try RequestOptions.checkText(string(0), name: "account", max: ArgumentLimits.accountIDBytes)
      try RequestOptions.checkText(string(1), name: "authority", max: 2048, allowSpaces: false)
      guard !string(0).isEmpty else {
        throw TesseraError.invalidArgument(
          "SetCurrentAccount needs an account id or username. Call GetAccounts to list them.")
      }
      let account = try await broker.makeCurrent(string(0), authority: string(1), caller: caller)
      metadata["account_id"] = "\(account.id)"
      var info = account.info
      info.current = true
      return [.dict(info.busValue)]
    case .moveStore:
      try RequestOptions.checkText(string(0), name: "to", max: 64, allowSpaces: false)
      if let key = dict(1).keys.sorted().first {
        throw TesseraError.invalidArgument(
          "MoveStore takes no option '\(RequestOptions.clip(key))': its options must be empty.")
      }
      metadata["to"] = "\(string(0))"
      let result = try await broker.moveStore(to: string(0), caller: caller)
      metadata["from"] = "\(result.from)"
      metadata["items"] = "\(result.items)"
      return [.dict(result.busValue)]
    case .addForward:
      try await broker.checkMayManage(caller)
      try await broker.checkForwardingAllowed()
      let (name, host, path) = (string(0), string(1), string(2))
      guard AppIdentity.isForwardName(name) else {
        throw TesseraError.invalidArgument(
          "'\(RequestOptions.clip(name))' cannot name a forward: use 1 to 64 of the letters A-Z a-z, digits, '.', '_' and '-', not starting with '.'."
        )
      }
      try RequestOptions.checkText(host, name: "host", max: 255)
      guard host.isEmpty || AppIdentity.isForwardHost(host) else {
        throw TesseraError.invalidArgument(
          "'\(RequestOptions.clip(host))' cannot be a forward's host: give the ssh destination as `host` or `user@host` (letters, digits and . _ - @ : [ ] %)."
        )
      }
      try RequestOptions.checkText(path, name: "path", max: 107)
      guard path.isEmpty || path.hasPrefix("/") else {
        throw TesseraError.invalidArgument(
          "The forward's path '\(RequestOptions.clip(path))' must be absolute (or empty for the default place).")
      }
      try RequestOptions.validate(dict(3), for: .addForward)
      var lasting = false
      if case .bool(let value)? = dict(3)[RequestOptions.lasting.key] { lasting = value }
      guard let forwards = broker.deps.forwards else {
        throw TesseraError.invalidArgument("This tesserad cannot make forwards (it serves no socket of its own).")
      }
      metadata["forward"] = "\(name)"
      metadata["host"] = "\(host)"
      let made = try await forwards.open(name: name, host: host, path: path, lasting: lasting, owner: caller)
      // A reload that forbade forwards while this one was being opened: it goes too.
      do { try await broker.checkForwardingAllowed() } catch {
        _ = await forwards.close(name: name, reason: Broker.forwardsForbidden)
        throw error
      }
      metadata["path"] = "\(made)"
      return [.string(made)]
    case .removeForward:
      try await broker.checkMayManage(caller)
      try RequestOptions.checkText(string(0), name: "name", max: 64)
      metadata["forward"] = "\(string(0))"
      guard let forwards = broker.deps.forwards,
        await forwards.close(name: string(0), reason: "ended by RemoveForward (`tessera forward --stop`)")
      else {
        throw TesseraError.invalidArgument(
          "There is no forward named '\(RequestOptions.clip(string(0)))'. `tessera forward --list` shows the live ones."
        )
      }
      return []
    case .listForwards:
      try await broker.checkMayManage(caller)
      let list = await broker.deps.forwards?.list() ?? []
      return [.dicts(list.map(\.busValue))]
    case .cancel:
      metadata["correlation_id"] = "\(string(0))"
      try await broker.cancel(correlationID: string(0), caller: caller)
      return []
    }
  }

  // MARK: - Tokens, as this front encodes them

  /// AcquireTokenSilent's reply. A reply served from a fresh cached token is published (without
  /// its correlation id) for the bus thread to repeat while the token stays fresh.
  package func silentToken(_ request: TokenRequest) async throws -> [String: BusValue] {
    let fastPath = broker.fastPath
    let clockOffset = broker.clockOffset
    let (result, published) = try await broker.silentAnswer(request) { result, target in
      var body = Self.reply(result, correlationID: "")
      body[TokenInfo.correlationIDKey] = nil
      fastPath.tessera.publish(
        Key(request),
        PublishedReply(
          reply: ReplyTemplate(body), token: result.accessToken, target: target, clockOffset: clockOffset))
      return body
    }
    guard var reply = published else { return Self.reply(result, correlationID: request.correlationID) }
    reply[TokenInfo.correlationIDKey] = .string(request.correlationID)
    return reply
  }

  /// AcquireToken's reply: an interactive sign-in's token.
  package func signIn(_ request: TokenRequest, caller: CallerInfo) async throws -> [String: BusValue] {
    Self.reply(try await broker.signIn(request, caller: caller), correlationID: request.correlationID)
  }

  static func reply(_ result: Broker.TokenResult, correlationID: String) -> [String: BusValue] {
    result.tokenInfo(correlationID: correlationID).busValue
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
