import Crypto
import Logging

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
    if logger.logLevel <= .info {
      var metadata = TesseraFront.callerMetadata(method, caller)
      metadata["front"] = "microsoft"
      metadata["correlation_id"] = "\(correlationID)"
      metadata["client_id"] = "\(published.target.clientID)"
      metadata["scopes"] = "\(published.reply.scopes)"
      metadata["outcome"] = "ok"
      metadata["cache"] = "hit"
      logger.info("\(method) succeeded", metadata: metadata)
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

// MARK: - Requests

/// A parsed requestJson, with accessors whose errors name the field (`authParameters.clientId`).
struct MicrosoftRequest {
  struct Object {
    let fields: [String: JSONValue]
    let prefix: String

    func path(_ key: String) -> String { prefix.isEmpty ? key : prefix + "." + key }

    func wrongType(_ key: String, _ expected: String) -> TesseraError {
      .invalidArgument(
        "'\(path(key))' must be \(expected), not \(MicrosoftRequest.kind(of: fields[key] ?? .null)). Fix the request's JSON."
      )
    }

    /// A string; nil when absent or null.
    func string(_ key: String) throws -> String? {
      switch fields[key] {
      case nil, .null?: return nil
      case .string(let s)?: return s
      default: throw wrongType(key, "a string")
      }
    }

    /// A non-empty string within `max` bytes and without control characters; nil when absent,
    /// null or empty.
    func text(_ key: String, max: Int) throws -> String? {
      guard let s = try string(key), !s.isEmpty else { return nil }
      try RequestOptions.checkText(s, name: path(key), max: max, allowSpaces: false)
      return s
    }

    func object(_ key: String) throws -> Object? {
      switch fields[key] {
      case nil, .null?: return nil
      case .object(let o)?: return Object(fields: o, prefix: path(key))
      default: throw wrongType(key, "an object")
      }
    }

    func strings(_ key: String, maxCount: Int) throws -> [String] {
      guard case .array(let values)? = fields[key] else {
        if fields[key] == nil || fields[key] == .null {
          throw TesseraError.invalidArgument("'\(path(key))' is missing: it must be an array of strings.")
        }
        throw wrongType(key, "an array of strings")
      }
      guard values.count <= maxCount else {
        throw TesseraError.invalidArgument("'\(path(key))' has \(values.count) entries; the limit is \(maxCount).")
      }
      return try values.map {
        guard case .string(let s) = $0 else {
          throw TesseraError.invalidArgument(
            "'\(path(key))' must be an array of strings; it holds \(MicrosoftRequest.kind(of: $0)). Fix the request's JSON."
          )
        }
        return s
      }
    }

    /// A claims request: "" or a JSON object's text (MSAL's decodedClaims), or the object itself.
    func claims(_ key: String) throws -> String? {
      switch fields[key] {
      case nil, .null?: return nil
      case .string(let s)?:
        guard !s.isEmpty else { return nil }
        do { _ = try ClaimsRequest.parse(s) } catch {
          throw TesseraError.invalidArgument(
            "'\(path(key))' is not a JSON object's text. Pass the claims challenge as received.")
        }
        return s
      case .object?:
        return JSONOut(fields[key]!).text
      default: throw wrongType(key, "a string")
      }
    }
  }

  let root: Object
  /// The requestJson as sent (the silent fast path's key).
  var text = ""

  static func parse(_ text: String, allowEmpty: Bool) throws -> MicrosoftRequest {
    if allowEmpty && text.allSatisfy({ $0 == " " || $0 == "\n" || $0 == "\t" || $0 == "\r" }) {
      return MicrosoftRequest(root: Object(fields: [:], prefix: ""))
    }
    guard text.utf8.count <= MicrosoftBrokerInterface.maxRequestBytes else {
      throw TesseraError.invalidArgument(
        "requestJson is \(text.utf8.count) bytes; the limit is \(MicrosoftBrokerInterface.maxRequestBytes).")
    }
    let depth = Self.depth(of: text)
    guard depth <= MicrosoftBrokerInterface.maxDepth else {
      throw TesseraError.invalidArgument(
        "requestJson nests \(depth) levels deep; the limit is \(MicrosoftBrokerInterface.maxDepth).")
    }
    guard let value = try? JSONDecoder().decode(JSONValue.self, from: Data(text.utf8)) else {
      throw TesseraError.invalidArgument("requestJson is not valid JSON. Send the request as a JSON object.")
    }
    guard case .object(let fields) = value else {
      throw TesseraError.invalidArgument("requestJson must be a JSON object, not \(kind(of: value)).")
    }
    return MicrosoftRequest(root: Object(fields: fields, prefix: ""), text: text)
  }

  func clientID(at object: Object, required: Bool) throws -> String {
    guard let clientID = try object.string("clientId"), !clientID.isEmpty else {
      throw TesseraError.invalidArgument("'\(object.path("clientId"))' is missing: name your app's client id.")
    }
    try RequestOptions.checkText(
      clientID, name: object.path("clientId"), max: ArgumentLimits.clientIDBytes, allowSpaces: false)
    return clientID
  }

  /// The deepest nesting of arrays and objects, counted on the text before it is decoded (so a
  /// hostile request of 60,000 brackets costs one pass, not a recursion).
  static func depth(of text: String) -> Int {
    var depth = 0
    var deepest = 0
    var inString = false
    var escaped = false
    for byte in text.utf8 {
      if inString {
        if escaped {
          escaped = false
        } else if byte == UInt8(ascii: "\\") {
          escaped = true
        } else if byte == UInt8(ascii: "\"") {
          inString = false
        }
        continue
      }
      switch byte {
      case UInt8(ascii: "\""): inString = true
      case UInt8(ascii: "{"), UInt8(ascii: "["):
        depth += 1
        deepest = max(deepest, depth)
      case UInt8(ascii: "}"), UInt8(ascii: "]"): depth -= 1
      default: break
      }
    }
    return deepest
  }

  static func kind(of value: JSONValue) -> String {
    switch value {
    case .object: "an object"
    case .array: "an array"
    case .string: "a string"
    case .number: "a number"
    case .bool: "a boolean"
    case .null: "null"
    }
  }
}

// MARK: - Answers

/// Accounts as Microsoft's protocol shows them (every field sso-mib and linux-entra-sso require).
enum MicrosoftAccount {
  /// `homeAccountId` is Tessera's account id: `<oid>.<tid>` at Entra, `<sub>.<issuer digest>`
  /// elsewhere; `clientInfo` is its two halves as Entra's client_info (uid, utid), so that what a
  /// client derives from it names the same account.
  static func json(_ account: Account) -> JSONOut {
    let (given, family) = names(account.name)
    return .object([
      ("authorityType", .string("MSSTS")),
      ("clientInfo", .string(clientInfo(account))),
      ("environment", .string(account.environment)),
      ("familyName", .string(family)),
      ("givenName", .string(given)),
      ("homeAccountId", .string(account.id)),
      ("localAccountId", .string(account.localAccountID)),
      ("name", .string(account.name)),
      ("passwordExpiry", .int(0)),
      ("realm", .string(realmUUID(account))),
      ("username", .string(account.username)),
    ])
  }

  /// The account a client echoes back, as the engine's rule reads it (AccountReference):
  /// homeAccountId is Tessera's account id, localAccountId the IdP's object id or subject; other
  /// keys are ignored.
  static func reference(_ wanted: MicrosoftRequest.Object) throws -> AccountReference {
    try AccountReference(
      id: wanted.string("homeAccountId"), localID: wanted.string("localAccountId"),
      username: wanted.string("username"))
  }

  /// First word and the rest of the display name (Tessera keeps only the display name).
  static func names(_ name: String) -> (given: String, family: String) {
    let trimmed = name.trimmingSpaces()
    guard let space = trimmed.firstIndex(of: " ") else { return (trimmed, "") }
    return (String(trimmed[..<space]), String(trimmed[trimmed.index(after: space)...]).trimmingSpaces())
  }

  static func clientInfo(_ account: Account) -> String {
    let (uid, utid): (String, String)
    if let dot = account.id.lastIndex(of: ".") {
      (uid, utid) = (String(account.id[..<dot]), String(account.id[account.id.index(after: dot)...]))
    } else {
      (uid, utid) = (account.id, "")
    }
    let json = JSONOut.object([("uid", .string(uid)), ("utid", .string(utid))]).text
    return Base64URL.encode(Array(json.utf8))
  }

  /// The tenant as a UUID: Entra's `tid` as it is; any other realm (an IdP with no tenants, or a
  /// tenant named by a word) as the name-based UUID (RFC 9562 version 5) of
  /// "<environment>/<realm>", stable for the account.
  static func realmUUID(_ account: Account) -> String {
    if isUUID(account.realm) { return account.realm.lowercased() }
    var bytes = Array(Insecure.SHA1.hash(data: Array((account.environment + "/" + account.realm).utf8)).prefix(16))
    bytes[6] = (bytes[6] & 0x0F) | 0x50
    bytes[8] = (bytes[8] & 0x3F) | 0x80
    let hex = bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    let h = Array(hex)
    return "\(String(h[0..<8]))-\(String(h[8..<12]))-\(String(h[12..<16]))-\(String(h[16..<20]))-\(String(h[20..<32]))"
  }

  static func isUUID(_ text: String) -> Bool {
    let bytes = Array(text.utf8)
    guard bytes.count == 36 else { return false }
    for (i, b) in bytes.enumerated() {
      if i == 8 || i == 13 || i == 18 || i == 23 {
        guard b == UInt8(ascii: "-") else { return false }
      } else {
        guard (b >= 48 && b <= 57) || (b >= 97 && b <= 102) || (b >= 65 && b <= 70) else { return false }
      }
    }
    return true
  }
}

enum MicrosoftToken {
  /// A token answer: `expiresOn` and `extendedExpiresOn` in epoch milliseconds, `grantedScopes` one
  /// string: the requested scopes the grant covers, as the caller spelled them (msalruntime
  /// compares them with what it asked), then what the IdP granted besides. A requested scope the
  /// IdP did not grant is left out, so the app sees it declined.
  static func json(_ result: Broker.TokenResult, requestedScopes: [String]) -> String {
    let token = result.accessToken
    let granted = Set(result.grantedScopes.map { $0.lowercased() })
    var scopes = requestedScopes.filter {
      let scope = $0.lowercased()
      return granted.contains(scope) || ScopeSet.oidcScopes.contains(scope) || scope.hasSuffix("/.default")
        || scope == ".default"
    }
    var seen = Set(scopes.map { $0.lowercased() })
    for scope in result.grantedScopes where seen.insert(scope.lowercased()).inserted { scopes.append(scope) }
    var fields: [(String, JSONOut)] = [
      ("accessToken", .string(token.secret)),
      ("accessTokenType", .int(0)),
      ("account", MicrosoftAccount.json(result.account)),
      ("clientInfo", .string(MicrosoftAccount.clientInfo(result.account))),
      ("expiresOn", .int(token.expiresOn * 1000)),
      ("extendedExpiresOn", .int((token.extExpiresOn ?? token.expiresOn) * 1000)),
      ("grantedScopes", .string(scopes.joined(separator: " "))),
      ("idToken", .string(token.idToken ?? "")),
    ]
    if let refreshOn = token.refreshOn { fields.append(("refreshOn", .int(refreshOn * 1000))) }
    return JSONOut.object([("brokerTokenResponse", .object(fields))]).text
  }
}

/// JSON written in a fixed key order, with integers as integers (epoch milliseconds must not
/// become 1.7e12).
indirect enum JSONOut {
  case object([(String, JSONOut)])
  case array([JSONOut])
  case string(String)
  case int(Int64)
  case double(Double)
  case bool(Bool)
  case null

  init(_ value: JSONValue) {
    switch value {
    case .object(let o): self = .object(o.keys.sorted().map { ($0, JSONOut(o[$0]!)) })
    case .array(let a): self = .array(a.map(JSONOut.init))
    case .string(let s): self = .string(s)
    case .number(let n): self = n == n.rounded() && abs(n) < 9e15 ? .int(Int64(n)) : .double(n)
    case .bool(let b): self = .bool(b)
    case .null: self = .null
    }
  }

  var text: String {
    var out = ""
    write(to: &out)
    return out
  }

  func write(to out: inout String) {
    switch self {
    case .object(let fields):
      out += "{"
      for (i, (key, value)) in fields.enumerated() {
        if i > 0 { out += "," }
        out += JSONText.quote(key) + ":"
        value.write(to: &out)
      }
      out += "}"
    case .array(let values):
      out += "["
      for (i, value) in values.enumerated() {
        if i > 0 { out += "," }
        value.write(to: &out)
      }
      out += "]"
    case .string(let s): out += JSONText.quote(s)
    case .int(let n): out += String(n)
    case .double(let d): out += d.isFinite ? "\(d)" : "null"
    case .bool(let b): out += b ? "true" : "false"
    case .null: out += "null"
    }
  }
}
