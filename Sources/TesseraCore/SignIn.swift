import Logging
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

extension Broker {
  // MARK: - AcquireToken (interactive)

  /// An interactive sign-in (browser or device code), for any front.
  public func signIn(_ asked: TokenRequest, caller: CallerInfo) async throws -> TokenResult {
    let result = try await signInUnnoted(asked, caller: caller)
    noteRecipient(result.accessToken, caller: asked.caller ?? caller)
    return result
  }

  private func signInUnnoted(_ asked: TokenRequest, caller: CallerInfo) async throws -> TokenResult {
    // Visible to Cancel (and to the caller leaving) from here, before the first suspension.
    signIns.announce(correlationID: asked.correlationID, caller: caller.busName)
    var registered = false
    defer { if !registered { signIns.withdraw(correlationID: asked.correlationID, caller: caller.busName) } }
    var request = try applyingProvider(asked)
    let clientID = try resolveClientID(request.clientID)
    let scopes = try resolveScopes(request.scopes)
    let authority = try resolveAuthority(request.authority)
    if request.prompt == Prompt.none && request.flow == .deviceCode {
      throw TesseraError.invalidArgument(
        "prompt 'none' cannot be used with the device_code flow, which always needs the user.")
    }
    // A provider with its endpoints written out and nothing that says who signed in (no
    // userinfo endpoint, no user API, no id_token it could check): the user names the account,
    // or the sign-in is refused now, before the user signs in for nothing.
    if let provider = config.provider(for: authority, clientID: clientID), provider.discovery == .none,
      provider.endpoints.userinfo == nil, provider.userAPI == nil, (request.loginHint ?? "").isEmpty
    {
      throw TesseraError.invalidArgument(
        "The provider '\(provider.name)' cannot say who signs in (no userinfo endpoint, user API or id_token), so the account needs a name: sign in with `tessera login --provider \(provider.name) --username NAME` (the login_hint option)."
      )
    }
    // The keyring must be able to keep what the sign-in brings: a locked or absent one is said
    // before the browser opens, within storeAnswerSeconds, not after the user has signed in.
    try await ensureLoadedOrSayWhy()
    // An app without a grant for this client, which another app holds, is asked first (issue 11).
    let knownAccount = request.accountID.isEmpty ? nil : cache.accounts[request.accountID]
    try await authorize(
      request.caller ?? (caller.busName.isEmpty ? nil : caller), clientID: clientID,
      accountID: knownAccount?.id ?? AccessGrant.anyAccount,
      username: knownAccount?.username ?? request.loginHint ?? "an account", scopes: scopes,
      authority: authority.url, operation: .signIn)
    // Several accounts here and none named: the user chooses (through the desktop app), and a
    // chosen account that still has a good refresh token answers without a sign-in.
    // prompt=none shows nothing at all, the chooser included.
    if request.prompt != Prompt.none, let chosen = await chooseAccount(request, caller: caller, authority: authority) {
      request.accountID = chosen.id
      // Chosen here: the provider is not asked to show its own account picker as well.
      if request.prompt == Prompt.selectAccount { request.prompt = nil }
      // prompt=login and prompt=consent ask the provider to authenticate or consent again: no
      // cached answer for those.
      if request.prompt != Prompt.login && request.prompt != Prompt.consent {
        var silent = request
        silent.flow = .browser
        do {
          let result = try await silentToken(silent)
          // Cancelled (or its caller gone) while the user chose: nobody gets the token.
          if signIns.withdraw(correlationID: request.correlationID, caller: caller.busName) {
            throw TesseraError.cancelled(
              "The sign-in was cancelled (by Cancel, or because the caller left the bus).")
          }
          return result
        } catch let error as TesseraError where error.code == .interactionRequired {
          // That account needs the user: its sign-in follows, the account pre-filled. Any other
          // refusal (the user denied the app this account, a cancel) is the answer.
        }
      }
    }
    // Cancelled (or its caller gone) while the store loaded or the user was asked about the app.
    if signIns.withdraw(correlationID: request.correlationID, caller: caller.busName) {
      throw TesseraError.cancelled("The sign-in was cancelled (by Cancel, or because the caller left the bus).")
    }
    if let ended = try signIns.makeRoom(correlationID: request.correlationID, caller: caller) {
      logger.notice(
        "Ended the oldest sign-in of an app holding \(ended.held) places, to make room for another app's",
        metadata: ["correlation_id": "\(ended.correlationID)", "app": "\(ended.app)"])
    }
    // Registered before the first suspension, so the cap, duplicate ids, Cancel and callers leaving
    // the bus all see this sign-in from the start.
    let task = Task { () async throws -> TokenResult in
      try await self.ensureLoaded()
      var hints = (login: request.loginHint, domain: request.domainHint)
      if !request.accountID.isEmpty {
        // A known account (another app signed it in): pre-fill it, so the user sees at most a click.
        let account = try self.resolveAccount(request.accountID, authority: authority)
        if hints.login == nil { hints.login = account.username }
        if hints.domain == nil, let at = account.username.lastIndex(of: "@") {
          hints.domain = String(account.username[account.username.index(after: at)...])
        }
      }
      let metadata = try await self.metadata(for: authority, clientID: clientID)
      try Task.checkCancellation()
      switch request.flow {
      case .browser:
        return try await self.browserSignIn(
          request, clientID: clientID, scopes: scopes, authority: authority, metadata: metadata, hints: hints,
          caller: caller)
      case .deviceCode:
        return try await self.deviceCodeSignIn(
          request, clientID: clientID, scopes: scopes, authority: authority, metadata: metadata, caller: caller)
      }
    }
    signIns.register(correlationID: request.correlationID, caller: caller, task: task)
    registered = true
    do {
      let result = try await task.value
      signIns.remove(correlationID: request.correlationID)
      await grantAfterSignIn(caller.busName.isEmpty ? nil : caller, clientID: clientID, account: result.account)
      return result
    } catch {
      let endedBecause = signIns.remove(correlationID: request.correlationID)
      if task.isCancelled {
        throw TesseraError.cancelled(
          endedBecause ?? "The sign-in was cancelled (by Cancel, or because the caller left the bus).")
      }
      throw error
    }
  }

  /// Cancel(correlation_id): ends the caller's own interactive sign-in with `Cancelled`.
  ///
  /// A caller may send Cancel right behind its AcquireToken, and the two calls reach this actor in
  /// no set order: a Cancel for an id this caller has no sign-in with waits up to
  /// `cancelGraceSeconds` for one to begin before it is refused.
  public func cancel(correlationID: String, caller: CallerInfo) async throws {
    // Looked for again after 5, 10, 20 … ms: a handful of wake-ups, however many Cancels come.
    var waited = 0.0
    var pause = 0.005
    while !signIns.knows(correlationID: correlationID, caller: caller.busName), waited < Self.cancelGraceSeconds {
      let step = min(pause, Self.cancelGraceSeconds - waited)
      try await deps.clock.sleep(seconds: step)
      waited += step
      pause *= 2
    }
    try signIns.cancel(correlationID: correlationID, caller: caller.busName)
  }

  static let cancelGraceSeconds = 1.0

  /// Cancels the caller's interactive sign-ins: the one with `correlationID` when it has one by
  /// that id, else all of them. Returns the correlation ids cancelled.
  public func cancelSignIns(of caller: CallerInfo, correlationID: String?) -> [String] {
    if let correlationID, (try? signIns.cancel(correlationID: correlationID, caller: caller.busName)) != nil {
      return [correlationID]
    }
    return signIns.cancelAll(caller: caller.busName)
  }

  /// A caller left the bus: its interactive sign-ins are cancelled (nobody would get the result).
  public func callerLeft(_ busName: String) {
    prompterLeft(busName)
    for correlationID in signIns.callerLeft(busName) {
      logger.info("The caller left the bus; cancelling its sign-in", metadata: ["correlation_id": "\(correlationID)"])
    }
  }

  func browserSignIn(
    _ request: TokenRequest, clientID: String, scopes: [String], authority: Authority, metadata: OIDCMetadata,
    hints: (login: String?, domain: String?), caller: CallerInfo
  ) async throws -> TokenResult {
    let pkce = PKCE()
    let listener = try deps.listeners.listen(
      port: config.redirectPort, hostName: authority.isMicrosoft ? "localhost" : "127.0.0.1")
    defer { listener.close() }
    var query: [(String, String)] = [
      ("client_id", clientID), ("response_type", "code"), ("redirect_uri", listener.redirectURI),
      ("scope", scopeParameter(scopes, authority: authority, clientID: clientID)), ("state", pkce.state),
      ("nonce", pkce.nonce),
      ("code_challenge", pkce.challenge), ("code_challenge_method", "S256"), ("client_info", "1"),
      ("client-request-id", request.correlationID),
    ]
    if let prompt = request.prompt { query.append(("prompt", prompt.rawValue)) }
    if let login = hints.login { query.append(("login_hint", login)) }
    if let domain = hints.domain { query.append(("domain_hint", domain)) }
    if let claims = try claimsParameter(request.claims) { query.append(("claims", claims)) }
    query += providerParameters(for: authority, clientID: clientID, request: request)
    query += request.extraQuery.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    guard !metadata.authorizationEndpoint.isEmpty else {
      throw TesseraError.invalidArgument(
        "The identity provider at \(authority.url) has no authorization endpoint (browser sign-in). Use flow 'device_code'."
      )
    }
    // The key its tokens will be bound to, made now: `required` at a server that cannot bind
    // fails before the browser opens.
    let proofKey = try await signInProofKey(metadata: metadata, authority: authority, clientID: clientID)
    let separator = metadata.authorizationEndpoint.contains(Character("?")) ? "&" : "?"
    let url = metadata.authorizationEndpoint + separator + FormEncoding.encode(query)
    let timeout = request.timeout ?? InteractiveTimeouts.browser
    let startURL = listener.startURL(opening: url)

    deps.events.interactionPending(
      destination: caller.busName, correlationID: request.correlationID,
      info: InteractionInfo(
        flow: .browser, verificationURI: startURL, expiresIn: timeout,
        message: "Sign in in the browser window that opened. If none opened, open the verification_uri yourself."))
    do {
      try deps.browser.open(startURL)
    } catch {
      logger.warning(
        "Could not start the browser; the caller was given the sign-in URL",
        metadata: ["error": "\(TesseraError.wrap(error))", "correlation_id": "\(request.correlationID)"])
    }
    let parameters = try await listener.waitForRedirect(state: pkce.state, timeoutSeconds: Double(timeout))
    guard parameters["state"] == pkce.state else {
      throw TesseraError.accessDenied(
        "The sign-in redirect did not carry this request's state, so it was refused (a stale or forged redirect). Try again."
      )
    }
    try Self.checkIssuer(parameters["iss"], metadata: metadata)
    if let error = parameters["error"] {
      // Whoever reached the redirect wrote this text: it is made safe to print (no control
      // characters, bounded) before it reaches the caller, a terminal or the log.
      let code = SafeText.clip(error, limit: 64)
      let description = parameters["error_description"].map { ": " + SafeText.clip($0, limit: 300) } ?? ""
      var failure = OAuthErrorResponse.classify(error, detail: "\(code)\(description)")
      failure.detail = ErrorDetail(
        oauthError: code, suberror: parameters["suberror"].map { SafeText.clip($0, limit: 64) },
        providerCode: parameters["error_codes"].flatMap { Int($0.split(separator: ",").first ?? "") })
      throw failure
    }
    guard let code = parameters["code"], !code.isEmpty else {
      throw TesseraError.provider("The sign-in redirect carried neither a code nor an error. Try again.")
    }
    var fields = [
      ("grant_type", "authorization_code"), ("client_id", clientID), ("code", code),
      ("redirect_uri", listener.redirectURI), ("code_verifier", pkce.verifier), ("client_info", "1"),
      ("scope", scopeParameter(scopes, authority: authority, clientID: clientID)),
    ]
    if let claims = try claimsParameter(request.claims) { fields.append(("claims", claims)) }
    let response = try await postToken(
      metadata.tokenEndpoint, fields, correlationID: request.correlationID,
      client: try clientCredentials(for: authority, clientID: clientID), proof: proofKey)
    return try await accept(
      response, metadata: metadata, authority: authority, clientID: clientID, requestedScopes: scopes,
      nonce: pkce.nonce, knownAccount: nil, hint: hints.login, proofKey: proofKey)
  }

  /// RFC 9207: an authorization response's `iss` must be the issuer the request went to, and an
  /// IdP that promises to send it must send it (a mix-up attack swaps responses between IdPs).
  static func checkIssuer(_ iss: String?, metadata: OIDCMetadata) throws {
    if let iss {
      guard iss == metadata.issuer else {
        throw TesseraError.accessDenied(
          "The sign-in redirect came from another identity provider (iss \(SafeText.clip(iss, limit: 200)), expected \(metadata.issuer)), so it was refused. Try again."
        )
      }
    } else if metadata.authorizationResponseIssParameterSupported == true {
      throw TesseraError.accessDenied(
        "The sign-in redirect carried no iss, though \(metadata.issuer) promises one (RFC 9207), so it was refused. Try again."
      )
    }
  }

  struct DeviceAuthorization: Decodable {
    var device_code: String
    var user_code: String
    var verification_uri: String?
    var verification_url: String?
    var verification_uri_complete: String?
    var expires_in: TokenResponse.FlexibleInt
    var interval: TokenResponse.FlexibleInt?
    var message: String?

    /// A form-encoded answer (GitHub's, unless asked for JSON): nil without a code or lifetime.
    init(form fields: [String: String]) {
      device_code = fields["device_code"] ?? ""
      user_code = fields["user_code"] ?? ""
      verification_uri = fields["verification_uri"]
      verification_url = fields["verification_url"]
      verification_uri_complete = fields["verification_uri_complete"]
      expires_in = TokenResponse.FlexibleInt(fields["expires_in"].flatMap { Int64($0) } ?? 0)
      interval = fields["interval"].flatMap { Int64($0) }.map(TokenResponse.FlexibleInt.init)
      message = fields["message"]
    }
  }

  /// RFC 8628: show the code to the caller, then poll politely.
  func deviceCodeSignIn(
    _ request: TokenRequest, clientID: String, scopes: [String], authority: Authority, metadata: OIDCMetadata,
    caller: CallerInfo
  ) async throws -> TokenResult {
    guard let endpoint = metadata.deviceAuthorizationEndpoint else {
      throw TesseraError.invalidArgument(
        "The identity provider at \(authority.url) does not offer the device code flow. Use flow 'browser'.")
    }
    let client = try clientCredentials(for: authority, clientID: clientID)
    // The key its tokens will be bound to (the first proof at the token endpoint binds them).
    let proofKey = try await signInProofKey(metadata: metadata, authority: authority, clientID: clientID)
    let response = try await deps.http.send(
      .form(
        endpoint,
        [("client_id", clientID), ("scope", scopeParameter(scopes, authority: authority, clientID: clientID))]
          + ((try claimsParameter(request.claims)).map { [("claims", $0)] } ?? []) + client.fields,
        headers: [("client-request-id", request.correlationID), ("Accept", "application/json")] + client.headers))
    guard response.status == 200 else {
      throw OAuthErrorResponse.map(
        status: response.status, body: response.body, endpoint: endpoint, retryAfter: response.headers["retry-after"])
    }
    guard
      let device = TokenResponse.fields(
        response.body, as: DeviceAuthorization.self, form: DeviceAuthorization.init(form:)),
      !device.device_code.isEmpty, !device.user_code.isEmpty, device.expires_in.value > 0,
      let verificationURI = device.verification_uri ?? device.verification_url
    else {
      throw TesseraError.provider(
        "The device authorization endpoint \(endpoint) gave an answer without a code or link.")
    }
    // The caller shows these to the user, often on a terminal: links must be plain http(s) URLs
    // and the text is made safe to print.
    func isPlainLink(_ link: String) -> Bool {
      (link.hasPrefix("https://") || link.hasPrefix("http://")) && link.utf8.count <= 2048
        && SafeText.isClean(link) && !link.contains(" ")
    }
    guard isPlainLink(verificationURI), device.user_code.utf8.count <= 128, SafeText.isClean(device.user_code) else {
      throw TesseraError.provider(
        "The device authorization endpoint \(endpoint) gave a link or code that is not safe to show. Use flow 'browser'."
      )
    }
    let expiresIn = UInt32(clamping: max(1, device.expires_in.value))
    let message = SafeText.clip(
      device.message ?? "To sign in, open \(verificationURI) and enter the code \(device.user_code).", limit: 1000)
    let info = InteractionInfo(
      flow: .deviceCode, verificationURI: verificationURI, userCode: device.user_code, expiresIn: expiresIn,
      message: message, verificationURIComplete: device.verification_uri_complete.flatMap { isPlainLink($0) ? $0 : nil }
    )
    deps.events.interactionPending(destination: caller.busName, correlationID: request.correlationID, info: info)

    let deadline = deps.clock.now().addingTimeInterval(
      Double(min(expiresIn, request.timeout ?? InteractiveTimeouts.deviceCode)))
    var interval = Double(min(max(1, device.interval?.value ?? 5), 60))
    var nonceRetry = false
    while true {
      if !nonceRetry { try await deps.clock.sleep(seconds: interval) }
      guard deps.clock.now() < deadline else {
        throw TesseraError.timedOut("Nobody entered the device code in time. Start the sign-in again.")
      }
      let dpop = try await proofHeaders(proofKey, url: metadata.tokenEndpoint)
      let poll = try await deps.http.send(
        .form(
          metadata.tokenEndpoint,
          [
            ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"), ("client_id", clientID),
            ("device_code", device.device_code), ("client_info", "1"),
          ] + client.fields,
          headers: [("client-request-id", request.correlationID), ("Accept", "application/json")] + client.headers
            + dpop.headers))
      // A nonce the server asks for is sent at once, once (RFC 9449 §8); a later one waits its turn.
      nonceRetry =
        proofKey != nil && noteNonce(poll, url: metadata.tokenEndpoint, sent: dpop.nonce, retried: nonceRetry)
      if nonceRetry { continue }
      // Read whatever the status: GitHub answers authorization_pending and slow_down with HTTP 200.
      let error = OAuthErrorResponse.decode(poll.body)
      if poll.status == 200 && error == nil {
        let token = try TokenResponse.parse(poll.body, endpoint: metadata.tokenEndpoint)
        return try await accept(
          token, metadata: metadata, authority: authority, clientID: clientID, requestedScopes: scopes, nonce: nil,
          knownAccount: nil, hint: request.loginHint, proofKey: proofKey)
      }
      switch error?.error {
      case "authorization_pending": continue
      case "slow_down":
        // RFC 8628 §3.5: 5 s more for this and every later poll, or the new interval the answer
        // gives when that is longer; at most 2 minutes.
        interval = min(max(interval + 5, Double(error?.intervalSeconds ?? 0)), 120)
      case "expired_token": throw TesseraError.timedOut("The device code expired before sign-in finished. Start again.")
      default:
        throw OAuthErrorResponse.map(
          status: poll.status, body: poll.body, endpoint: metadata.tokenEndpoint,
          retryAfter: poll.headers["retry-after"])
      }
    }
  }
}
