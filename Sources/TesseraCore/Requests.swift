import TesseraInterface

/// Requests as the core sees them, parsed and validated from D-Bus arguments.
public enum Prompt: String, Sendable, CaseIterable {
  case selectAccount = "select_account"
  case login
  case consent
  case none
}

public enum InteractiveFlow: String, Sendable, CaseIterable {
  case browser
  case deviceCode = "device_code"
}

public struct TokenRequest: Sendable, Equatable {
  public var clientID: String
  public var scopes: [String]
  public var accountID: String
  public var authority: String?
  public var loginHint: String?
  /// A `[[provider]]` of config.toml by name (Broker.applyingProvider fills in the rest).
  public var provider: String?
  public var domainHint: String?
  public var prompt: Prompt?
  public var flow: InteractiveFlow = .browser
  public var claims: String?
  public var extraQuery: [String: String] = [:]
  /// Given by the caller, else generated.
  public var correlationID: String
  public var forceRefresh = false
  /// An access token the caller found rejected: when it is the cached one, a new one is fetched.
  public var accessTokenToRenew: String?
  /// Seconds an access token must still be valid to be served from the cache.
  /// nil: not given, and then the default applies (see TokenLifetimes.servingMargin).
  public var minValidity: UInt32? = nil
  /// Seconds an interactive flow may take.
  public var timeout: UInt32?
  /// Who asks (both fronts set it); nil for the daemon's own requests. Access control decides
  /// with it (issue 11).
  public var caller: CallerInfo?

  public init(clientID: String, scopes: [String], accountID: String = "", correlationID: String) {
    self.clientID = clientID
    self.scopes = scopes
    self.accountID = accountID
    self.correlationID = correlationID
  }
}

public struct AccountFilter: Sendable, Equatable {
  public var clientID: String?
  public var authority: String?
  public var username: String?
  /// Who asks: an app sees only the accounts it holds a grant for (issue 11).
  public var caller: CallerInfo?
  public init(clientID: String? = nil, authority: String? = nil, username: String? = nil, caller: CallerInfo? = nil) {
    self.clientID = clientID
    self.authority = authority
    self.username = username
    self.caller = caller
  }
}

public struct SignOutRequest: Sendable, Equatable {
  public var accountID: String
  public var clientID: String?
  public var revoke = true
  /// End the provider's browser session too (RP-Initiated Logout): the option `browser`.
  public var browser = false
  public var correlationID: String
  /// Who asks: an app may sign out only what it may use (issue 11).
  public var caller: CallerInfo?
}

/// Turns a method's D-Bus arguments into a request, validating every option against the one option
/// table (`RequestOptions` in TesseraInterface) and every plain argument against `ArgumentLimits`.
/// The silent fast path parses with the same functions, so both paths accept and refuse the same.
public enum RequestParser {
  /// Parameters the broker sets itself and a caller may not override through `extra_query`.
  static let reservedQueryKeys: Set<String> = [
    "client_id", "redirect_uri", "response_type", "scope", "state", "nonce", "code_challenge",
    "code_challenge_method", "prompt", "login_hint", "domain_hint", "claims", "client_info", "response_mode",
  ]

  /// A validated string option, by its key; empty is the same as absent. (By key, not by
  /// RequestOption: each option passed whole was copied out of its global, retains and releases
  /// that were 4% of a silent call's instructions.)
  static func string(_ options: [String: BusValue], _ key: String) -> String? {
    guard case .string(let s)? = options[key], !s.isEmpty else { return nil }
    return s
  }

  static func scopes(_ scopes: [String]) throws -> [String] {
    guard scopes.count <= ArgumentLimits.scopes else {
      throw TesseraError.invalidArgument(
        "\(scopes.count) scopes were requested; the limit is \(ArgumentLimits.scopes).")
    }
    for scope in scopes {
      guard !scope.isEmpty else {
        throw TesseraError.invalidArgument("A scope is empty. Remove empty strings from 'scopes'.")
      }
      try RequestOptions.checkText(
        scope, name: "scope '\(RequestOptions.clip(scope))'", max: ArgumentLimits.scopeBytes, allowSpaces: false)
    }
    return scopes
  }

  /// Parses AcquireToken / AcquireTokenSilent arguments.
  public static func tokenRequest(
    clientID: String, scopes rawScopes: [String], accountID: String, options: [String: BusValue],
    method: OptionMethod = .acquireTokenSilent
  ) throws -> TokenRequest {
    try RequestOptions.validate(options, for: method)
    try RequestOptions.checkText(clientID, name: "client_id", max: ArgumentLimits.clientIDBytes, allowSpaces: false)
    try RequestOptions.checkText(
      accountID, name: "account_id", max: ArgumentLimits.accountIDBytes, allowSpaces: false)
    var request = TokenRequest(
      clientID: clientID, scopes: try scopes(rawScopes), accountID: accountID,
      correlationID: string(options, RequestOptions.correlationID.key) ?? CorrelationID.new())
    if let optionAccount = string(options, RequestOptions.accountID.key) {
      if !accountID.isEmpty && optionAccount != accountID {
        throw TesseraError.invalidArgument(
          "The account_id argument and the 'account_id' option name different accounts. Pass one of them.")
      }
      request.accountID = optionAccount
    }
    request.authority = string(options, RequestOptions.authority.key)
    request.loginHint = string(options, RequestOptions.loginHint.key)
    request.provider = string(options, RequestOptions.provider.key)
    request.prompt = string(options, RequestOptions.prompt.key).flatMap(Prompt.init(rawValue:))
    request.flow = string(options, RequestOptions.flow.key).flatMap(InteractiveFlow.init(rawValue:)) ?? .browser
    request.domainHint = string(options, RequestOptions.domainHint.key)
    request.claims = string(options, RequestOptions.claims.key)
    if let claims = request.claims { _ = try ClaimsRequest.parse(claims) }
    if case .stringMap(let extra)? = options[RequestOptions.extraQuery.key] {
      for key in extra.keys.sorted() where reservedQueryKeys.contains(key) {
        throw TesseraError.invalidArgument(
          "Option 'extra_query' may not set '\(key)': the broker sets it. Use the matching option instead.")
      }
      request.extraQuery = extra
    }
    if case .bool(let force)? = options[RequestOptions.forceRefresh.key] { request.forceRefresh = force }
    if case .uint32(let minValidity)? = options[RequestOptions.minValidity.key] { request.minValidity = minValidity }
    if case .uint32(let timeout)? = options[RequestOptions.timeout.key] { request.timeout = timeout }
    request.accessTokenToRenew = string(options, RequestOptions.rejectedToken.key)
    return request
  }

  /// Parses RejectToken's arguments: the request naming the account and client, and the token.
  public static func rejectTokenRequest(
    clientID: String, accountID: String, token: String, options: [String: BusValue]
  ) throws -> (TokenRequest, token: String) {
    let request = try tokenRequest(
      clientID: clientID, scopes: [], accountID: accountID, options: options, method: .rejectToken)
    guard !token.isEmpty else {
      throw TesseraError.invalidArgument("RejectToken needs the token the resource refused. Pass it as 'token'.")
    }
    try RequestOptions.checkText(
      token, name: "token", max: RequestOptions.rejectedToken.maxBytes, allowSpaces: false)
    return (request, token)
  }

  public static func accountFilter(_ filter: [String: BusValue]) throws -> AccountFilter {
    try RequestOptions.validate(filter, for: .getAccounts)
    return AccountFilter(
      clientID: string(filter, RequestOptions.clientID.key), authority: string(filter, RequestOptions.authority.key),
      username: string(filter, RequestOptions.username.key))
  }

  public static func signOutRequest(accountID: String, options: [String: BusValue]) throws -> SignOutRequest {
    try RequestOptions.validate(options, for: .signOut)
    try RequestOptions.checkText(
      accountID, name: "account_id", max: ArgumentLimits.accountIDBytes, allowSpaces: false)
    guard !accountID.isEmpty else {
      throw TesseraError.invalidArgument("SignOut needs an account id. Call GetAccounts to list them.")
    }
    var request = SignOutRequest(
      accountID: accountID, clientID: string(options, RequestOptions.clientID.key),
      correlationID: string(options, RequestOptions.correlationID.key) ?? CorrelationID.new())
    if case .bool(let revoke)? = options[RequestOptions.revoke.key] { request.revoke = revoke }
    if case .bool(let browser)? = options[RequestOptions.browser.key] { request.browser = browser }
    if request.browser, request.clientID != nil {
      throw TesseraError.invalidArgument(
        "A sign-out in the browser ends the account's session at the provider, for every app: leave out client_id, or leave out browser to remove one app's tokens."
      )
    }
    return request
  }
}
