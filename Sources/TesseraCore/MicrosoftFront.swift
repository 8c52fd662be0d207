import Logging
import TesseraInterface

/// com.microsoft.identity.broker1: Microsoft's Linux broker protocol as one more front of the same
/// engine. MSAL (through msalruntime), Edge, Teams, OneDrive and the SSO extensions get their
/// tokens from the same cache, accounts, single-flight refresh and keyring as org.tessera.Broker1's
/// callers. Every answer is JSON; errors travel inside it with the protocol's `status`
/// (MicrosoftBrokerStatus, from the one error table). Logged like the native front: method,
/// correlation id, caller, client id, scopes and outcome; never a token.
public struct MicrosoftFront: Sendable {
  public let broker: Broker
  let logger: Logger
  let clock: any BrokerClock

  public init(broker: Broker, logger: Logger, clock: any BrokerClock = SystemClock()) {
    self.broker = broker
    self.logger = logger
    self.clock = clock
  }

  typealias Method = MicrosoftBrokerInterface.MethodName

  /// Answers a repeated acquireTokenSilently on the calling (bus) thread from what the token
  /// actor published (see SilentFastPath); nil when the full path must answer. Logged like any
  /// other call.
  public func answerAtOnce(method: String, arguments: [BusValue], caller: CallerInfo) -> String? {
    guard method == Method.acquireTokenSilently.rawValue, arguments.count == 3,
      case .string(let version) = arguments[0], case .string(let correlation) = arguments[1],
      case .string(let requestText) = arguments[2],
      (try? Self.checkProtocolVersion(version)) != nil, let correlationID = try? Self.correlationID(correlation),
      let published = broker.fastPath.serve(
        requestText, from: broker.fastPath.microsoft, now: clock.now().timeIntervalSince1970,
        elapsed: clock.elapsed(), app: caller.appKey)
    else { return nil }
    // A cache hit is logged at debug: the access log audits each app's decision, and an info
    // line per cached token cost the daemon a journal write per call (issue 41).
    if logger.logLevel <= .debug {
      var metadata = TesseraFront.callerMetadata(method, caller)
      metadata["front"] = "microsoft"
      metadata["correlation_id"] = "\(correlationID)"
      metadata["client_id"] = "\(published.target.clientID)"
      metadata["scopes"] = "\(published.reply.scopes)"
      metadata["outcome"] = "ok"
      metadata["cache"] = "hit"
      logger.debug("\(method) succeeded", metadata: metadata)
    }
    return published.reply.answer
  }

  /// A published acquireTokenSilently answer: the whole JSON, for one exact requestJson text. The
  /// same text parses to the same request, and any change to accounts or tokens clears the table,
  /// so the text is the key; the bus thread checks only the protocol version, the correlation id
  /// and the token's freshness. The scopes as the caller wrote them, for the log.
  struct Published: Sendable {
    let answer: String
    let scopes: String
  }

  /// A failure whose status is not the error table's: what only this protocol can say.
  struct WithStatus: Error {
    let status: MicrosoftBrokerStatus
    let error: TesseraError
    init(_ status: MicrosoftBrokerStatus, _ message: String) {
      self.status = status
      self.error = TesseraError(.configuration, message)
    }
  }

  /// Answers one call. Never throws: every failure is the protocol's JSON error.
  public func handle(method name: String, arguments: [BusValue], caller: CallerInfo) async -> String {
    let started = ContinuousClock.now
    var metadata = TesseraFront.callerMetadata(name, caller)
    metadata["front"] = "microsoft"
    let method = Method(rawValue: name)
    let answer: String
    var outcome = "ok"
    do {
      guard let method else {
        throw TesseraError.invalidArgument("\(name) is not a method of \(MicrosoftBrokerInterface.interfaceName).")
      }
      answer = try await dispatch(method, arguments, caller, &metadata)
    } catch {
      let failure = (error as? WithStatus)?.error ?? TesseraError.wrap(error)
      let status = (error as? WithStatus)?.status ?? MicrosoftBrokerStatus.of(failure)
      outcome = "\(failure.code.rawValue)"
      metadata["status"] = "\(status.rawValue) \(status.name)"
      answer = MicrosoftBrokerInterface.errorJSON(
        failure, status: status, tokenMethod: method?.answersWithTokenResponse ?? false)
      metadata["outcome"] = "\(outcome)"
      metadata["duration_ms"] = "\(Self.milliseconds(since: started))"
      logger.notice("\(name) failed: \(failure.message)", metadata: metadata)
      return answer
    }
    metadata["outcome"] = "\(outcome)"
    metadata["duration_ms"] = "\(Self.milliseconds(since: started))"
    logger.info("\(name) succeeded", metadata: metadata)
    return answer
  }

  static func milliseconds(since start: ContinuousClock.Instant) -> Double {
    let elapsed = ContinuousClock.now - start
    return Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds / 1_000_000_000_000) / 1000
  }

  private func dispatch(
    _ method: Method, _ arguments: [BusValue], _ caller: CallerInfo, _ metadata: inout Logger.Metadata
  ) async throws -> String {
    guard arguments.count == 3, case .string(let version) = arguments[0], case .string(let correlation) = arguments[1],
      case .string(let requestText) = arguments[2]
    else {
      throw TesseraError.invalidArgument(
        "\(method.rawValue) takes three strings (protocolVersion, correlationId, requestJson). Fix the call's argument types."
      )
    }
    try Self.checkProtocolVersion(version)
    let correlationID = try Self.correlationID(correlation)
    metadata["correlation_id"] = "\(correlationID)"
    switch method {
    case .getLinuxBrokerVersion:
      return JSONOut.object([("linuxBrokerVersion", .string(MicrosoftBrokerInterface.version))]).text
    case .acquirePrtSsoCookie:
      throw WithStatus(
        .deviceNotRegistered,
        "Tessera holds no Primary Refresh Token: it does not register this device with Microsoft Entra ID, so it cannot make the x-ms-RefreshTokenCredential SSO cookie. Sign in on the web page as usual; apps get tokens from Tessera with acquireTokenSilently and acquireTokenInteractively."
      )
    case .generateSignedHttpRequest:
      throw WithStatus(
        .deviceNotRegistered,
        "Tessera holds no device-bound key: it does not register this device with Microsoft Entra ID, so it cannot sign HTTP requests (proof of possession). Ask for a bearer token with acquireTokenSilently instead."
      )
    default: break
    }
    let request = try MicrosoftRequest.parse(requestText, allowEmpty: method == .cancelInteractiveFlow)
    switch method {
    case .getAccounts:
      let clientID = try request.clientID(at: request.root, required: true)
      metadata["client_id"] = "\(clientID)"
      let accounts = try await broker.knownAccounts(matching: AccountFilter(clientID: clientID, caller: caller))
      metadata["accounts"] = "\(accounts.count)"
      return JSONOut.object([("accounts", .array(accounts.map(MicrosoftAccount.json)))]).text
    case .acquireTokenSilently:
      return try await acquireToken(request, interactive: false, correlationID, caller, &metadata)
    case .acquireTokenInteractively:
      return try await acquireToken(request, interactive: true, correlationID, caller, &metadata)
    case .removeAccount:
      let clientID = try request.clientID(at: request.root, required: true)
      metadata["client_id"] = "\(clientID)"
      guard let wanted = try request.root.object("account") else {
        throw TesseraError.invalidArgument("'account' is missing: removeAccount needs the account to remove.")
      }
      let accounts = try await broker.knownAccounts(matching: AccountFilter(caller: caller))
      guard let account = try MicrosoftAccount.reference(wanted).match(in: accounts) else {
        metadata["account"] = "not signed in"
        return "{}"  // nothing to remove: already gone
      }
      metadata["account_id"] = "\(account.id)"
      try await broker.signOut(
        SignOutRequest(accountID: account.id, clientID: clientID, correlationID: correlationID, caller: caller))
      return "{}"
    case .cancelInteractiveFlow:
      let cancelled = await broker.cancelSignIns(of: caller, correlationID: correlation.isEmpty ? nil : correlation)
      metadata["cancelled"] = "\(cancelled.count)"
      return "{}"
    case .getLinuxBrokerVersion, .acquirePrtSsoCookie, .generateSignedHttpRequest:
      return "{}"  // answered above
    }
  }

  // MARK: - Tokens

  private func acquireToken(
    _ request: MicrosoftRequest, interactive: Bool, _ correlationID: String, _ caller: CallerInfo,
    _ metadata: inout Logger.Metadata
  ) async throws -> String {
    // MSAL, Edge and sso-mib send authParameters; the OneDrive client sends its few fields at the top.
    let params: MicrosoftRequest.Object
    if let given = try request.root.object("authParameters") {
      params = given
    } else if interactive, request.root.fields["clientId"] != nil {
      params = request.root
    } else {
      throw TesseraError.invalidArgument("'authParameters' is missing: it must be an object with the request.")
    }
    let clientID = try request.clientID(at: params, required: true)
    let scopes = try Self.requestedScopes(params)
    var token = TokenRequest(clientID: clientID, scopes: scopes, correlationID: correlationID)
    token.caller = caller
    token.authority = try params.text("authority", max: RequestOptions.authority.maxBytes)
    if let authority = token.authority { _ = try Authority(parsing: authority) }
    token.loginHint = try params.text("username", max: RequestOptions.loginHint.maxBytes)
    token.accessTokenToRenew = try params.string("accessTokenToRenew").flatMap { $0.isEmpty ? nil : $0 }
    token.claims = try params.claims("decodedClaims")
    if let prompt = try params.text("prompt", max: 32) ?? request.root.text("prompt", max: 32) {
      token.prompt = Prompt(rawValue: prompt.lowercased())
    }
    if let pop = params.fields["popParams"], pop != .null {
      throw TesseraError(
        .configuration,
        "Tessera issues bearer tokens only, not proof-of-possession tokens ('\(params.path("popParams"))' was given). Ask for a bearer token."
      )
    }
    metadata["client_id"] = "\(clientID)"
    metadata["scopes"] = "\(scopes.joined(separator: " "))"

    let accounts = try await broker.knownAccounts(matching: AccountFilter(caller: caller))
    let wanted = try params.object("account")
    var account = try wanted.flatMap { try MicrosoftAccount.reference($0).match(in: accounts) }
    if account == nil, interactive, wanted == nil {
      if let hint = token.loginHint {
        // An app that passes only a login hint: a signed-in account of that name needs no browser.
        account = AccountReference(username: hint).match(in: accounts)
      } else if params.fields["isSignIn"] != .bool(true) {
        // An app that names no account at all and does not ask to add one (MSAL marks that
        // `isSignIn`; the OneDrive client sends neither): when exactly one account can serve this
        // client id silently, that one answers without a browser, as on every later start of the app.
        let usable = try await broker.knownAccounts(matching: AccountFilter(clientID: clientID, caller: caller))
        if usable.count == 1 { account = usable[0] }
      }
    }
    if let account {
      token.accountID = account.id
      metadata["account_id"] = "\(account.id)"
      if token.loginHint == nil { token.loginHint = account.username }
    }
    if token.forceRefresh || token.accessTokenToRenew != nil { metadata["renew"] = "true" }

    let silentAllowed = token.prompt == nil || token.prompt == Prompt.none
    if account != nil && silentAllowed {
      do {
        // A silent call served from a fresh cached token is published for the bus thread to
        // repeat (the same requestJson gets the same answer while the token stays fresh).
        let publish = !interactive && token.claims == nil
        let (result, answer) = try await broker.silentAnswer(token) { result, target in
          let answer = MicrosoftToken.json(result, requestedScopes: scopes)
          if publish {
            broker.fastPath.microsoft.publish(
              request.text,
              PublishedReply(
                reply: Published(answer: answer, scopes: scopes.joined(separator: " ")), token: result.accessToken,
                target: target, clockOffset: broker.clockOffset, size: request.text.utf8.count + answer.utf8.count))
          }
          return answer
        }
        metadata["served"] = "silent"
        return answer ?? MicrosoftToken.json(result, requestedScopes: scopes)
      } catch let error as TesseraError
        where interactive && token.prompt == nil
        && (error.code == .interactionRequired || error.code == .noSuchAccount)
      {
        metadata["silent"] = "\(error.code.rawValue)"
      }
    }
    guard interactive else {
      throw TesseraError.interactionRequired(
        wanted == nil
          ? "No account was named, so a token cannot be given silently. Sign in with acquireTokenInteractively."
          : "That account is not signed in to Tessera. Sign in with acquireTokenInteractively (or `tessera login`).")
    }
    metadata["served"] = "sign-in"
    let result = try await broker.signIn(token, caller: caller)
    return MicrosoftToken.json(result, requestedScopes: scopes)
  }

  // MARK: - Arguments

  /// authParameters' requestedScopes: at least one, none empty, each within the option table's
  /// limits.
  static func requestedScopes(_ params: MicrosoftRequest.Object) throws -> [String] {
    let scopes = try params.strings("requestedScopes", maxCount: ArgumentLimits.scopes)
    guard !scopes.isEmpty else {
      throw TesseraError.invalidArgument("'\(params.path("requestedScopes"))' is empty: name the scopes you need.")
    }
    for scope in scopes {
      guard !scope.isEmpty else {
        throw TesseraError.invalidArgument("'\(params.path("requestedScopes"))' holds an empty scope.")
      }
      try RequestOptions.checkText(
        scope, name: params.path("requestedScopes"), max: ArgumentLimits.scopeBytes, allowSpaces: false)
    }
    return scopes
  }

  static func checkProtocolVersion(_ version: String) throws {
    let parts = version.split(separator: ".", omittingEmptySubsequences: false)
    guard parts.count == 2, parts[0] == "0" || parts[0] == "1", !parts[1].isEmpty, parts[1].count <= 4,
      parts[1].allSatisfy({ $0.isASCII && $0.isNumber })
    else {
      throw TesseraError.invalidArgument(
        "protocolVersion '\(RequestOptions.clip(version))' is not one Tessera speaks: send \"0.0\" or \"1.0\".")
    }
  }

  /// The caller's correlation id (a UUID, or any short printable text), else a new one.
  static func correlationID(_ given: String) throws -> String {
    if given.isEmpty { return CorrelationID.new() }
    try RequestOptions.checkText(given, name: "correlationId", max: 128, allowSpaces: false)
    return given
  }
}
