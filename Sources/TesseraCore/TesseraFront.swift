import Logging
import TesseraInterface

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
    var provider: String?

    init(_ request: TokenRequest) {
      clientID = request.clientID
      scopes = request.scopes
      accountID = request.accountID
      authority = request.authority
      provider = request.provider
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
    // A cache hit is logged at debug: the access log audits each app's decision, and an info
    // line per cached token cost the daemon a journal write per call (issue 41).
    if logger.logLevel <= .debug {
      var metadata = Self.callerMetadata(method, caller)
      metadata["correlation_id"] = "\(request.correlationID)"
      metadata["outcome"] = "ok"
      metadata["cache"] = "hit"
      metadata["client_id"] = "\(clientID.isEmpty ? "(default)" : clientID)"
      metadata["scopes"] = "\(scopes.isEmpty ? "(default)" : scopes.joined(separator: " "))"
      logger.debug("\(method) succeeded", metadata: metadata)
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
    let a = Arguments(values: args)
    switch method {
    case .acquireToken:
      var request = try RequestParser.tokenRequest(
        clientID: a.string(0), scopes: a.strings(1), accountID: "", options: a.dict(2), method: .acquireToken)
      request.caller = caller
      describe(request, into: &metadata)
      return [.dict(try await signIn(request, caller: caller))]
    case .acquireTokenSilent:
      var request = try RequestParser.tokenRequest(
        clientID: a.string(0), scopes: a.strings(1), accountID: a.string(2), options: a.dict(3))
      request.caller = caller
      describe(request, into: &metadata)
      return [.dict(try await silentToken(request))]
    case .getAccounts:
      return try await accounts(a, caller, &metadata)
    case .countHiddenAccounts:
      return [.uint32(UInt32(clamping: try await broker.hiddenAccountCount(caller)))]
    case .signOut:
      var request = try RequestParser.signOutRequest(accountID: a.string(0), options: a.dict(1))
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
      metadata["app_key"] = "\(SafeText.clip(a.string(0), limit: 300))"
      metadata["client_id"] = "\(SafeText.clip(a.string(1), limit: 300))"
      try await broker.grant(
        app: a.string(0), clientID: a.string(1), accountID: a.string(2), authority: a.string(3), scopes: a.strings(4),
        operations: a.strings(5), caller: caller)
      return []
    case .revoke:
      metadata["app_key"] = "\(SafeText.clip(a.string(0), limit: 300))"
      let removed = try await broker.revoke(
        app: a.string(0), clientID: a.string(1).isEmpty ? nil : a.string(1), caller: caller)
      return [.uint32(UInt32(clamping: removed))]
    case .registerPrompter:
      try await broker.registerPrompter(caller)
      return []
    case .answerQuestion:
      let options = a.dict(2)
      let known = RequestOptions.options(for: .answerQuestion)
      for (key, value) in options {
        guard let option = known[key], option.kind.rawValue == value.signature else {
          throw TesseraError.invalidArgument(
            "AnswerQuestion takes the option \(RequestOptions.remember.key) (b); '\(RequestOptions.clip(key))' (\(value.signature)) is not one."
          )
        }
      }
      var remember = false
      if case .bool(let value)? = options[RequestOptions.remember.key] { remember = value }
      try await broker.answerQuestion(id: a.string(0), answer: a.string(1), remember: remember, caller: caller)
      return []
    case .revokeGrant:
      metadata["app_key"] = "\(SafeText.clip(a.string(0), limit: 300))"
      metadata["account_id"] = "\(SafeText.clip(a.string(2), limit: 300))"
      let removed = try await broker.revoke(
        app: a.string(0), clientID: a.string(1).isEmpty ? nil : a.string(1), accountID: a.string(2), caller: caller)
      return [.uint32(UInt32(clamping: removed))]
    case .getAccessLog:
      return [.dicts(try await broker.accessLog(caller: caller).map(\.busValue))]
    case .setCurrentAccount:
      return try await setCurrentAccount(a, caller, &metadata)
    case .moveStore:
      return try await moveStore(a, caller, &metadata)
    case .addForward:
      return try await addForward(a, caller, &metadata)
    case .removeForward:
      return try await removeForward(a, caller, &metadata)
    case .listForwards:
      try await broker.checkMayManage(caller)
      let list = await broker.deps.forwards?.list() ?? []
      return [.dicts(list.map(\.busValue))]
    case .rejectToken:
      var (request, token) = try RequestParser.rejectTokenRequest(
        clientID: a.string(0), accountID: a.string(1), token: a.string(2), options: a.dict(3))
      request.caller = caller
      describe(request, into: &metadata)
      let dropped = try await broker.rejectToken(request, token: token)
      metadata["dropped"] = "\(dropped)"
      return [.bool(dropped)]
    case .getProof:
      try RequestOptions.validate(a.dict(3), for: .getProof)
      // Where the proof is for, by origin: a URL's path and query may carry what is not the log's.
      metadata["proof_for"] = "\(Broker.origin(SafeText.clip(a.string(1), limit: 300)))"
      let proof = try await broker.proof(
        method: a.string(0), url: a.string(1), accessToken: a.string(2),
        nonce: RequestParser.string(a.dict(3), RequestOptions.nonce.key), caller: caller)
      return [.string(proof)]
    case .cancel:
      metadata["correlation_id"] = "\(a.string(0))"
      try await broker.cancel(correlationID: a.string(0), caller: caller)
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
