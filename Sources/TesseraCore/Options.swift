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
  public var domainHint: String?
  public var prompt: Prompt?
  public var flow: InteractiveFlow = .browser
  public var claims: String?
  public var extraQuery: [String: String] = [:]
  /// Given by the caller, else generated.
  public var correlationID: String
  public var forceRefresh = false
  /// Seconds an access token must still be valid to be served from the cache.
  public var minValidity: UInt32 = 300
  /// Seconds an interactive flow may take.
  public var timeout: UInt32?

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
  public init(clientID: String? = nil, authority: String? = nil, username: String? = nil) {
    self.clientID = clientID
    self.authority = authority
    self.username = username
  }
}

public struct SignOutRequest: Sendable, Equatable {
  public var accountID: String
  public var clientID: String?
  public var revoke = true
  public var correlationID: String
}

/// Validation of caller input: sizes, characters, option keys and their types.
public enum RequestParser {
  public static let maxIdentifierLength = 1024
  public static let maxScopes = 64
  public static let maxClaimsLength = 16 * 1024
  public static let maxExtraQuery = 32
  public static let maxTimeout: UInt32 = 3600

  enum Kind: String {
    case string = "s"
    case bool = "b"
    case uint32 = "u"
    case stringMap = "a{ss}"
  }

  static let tokenOptions: [String: Kind] = [
    "authority": .string, "account_id": .string, "login_hint": .string, "domain_hint": .string, "prompt": .string,
    "flow": .string,
    "claims": .string, "extra_query": .stringMap, "correlation_id": .string, "force_refresh": .bool,
    "min_validity": .uint32, "timeout": .uint32,
  ]
  static let signOutOptions: [String: Kind] = ["client_id": .string, "revoke": .bool, "correlation_id": .string]
  static let filterKeys: [String: Kind] = ["client_id": .string, "authority": .string, "username": .string]

  /// Parameters the broker sets itself and a caller may not override through `extra_query`.
  static let reservedQueryKeys: Set<String> = [
    "client_id", "redirect_uri", "response_type", "scope", "state", "nonce", "code_challenge",
    "code_challenge_method", "prompt", "login_hint", "domain_hint", "claims", "client_info", "response_mode",
  ]

  static func checkKeys(_ options: [String: BusValue], _ allowed: [String: Kind], what: String) throws {
    for (key, value) in options.sorted(by: { $0.key < $1.key }) {
      guard let kind = allowed[key] else {
        let known = allowed.keys.sorted().joined(separator: ", ")
        throw TesseraError.invalidArgument(
          "Unknown \(what) key '\(clip(key))'. Known keys: \(known). Remove it or check its spelling.")
      }
      guard value.signature == kind.rawValue else {
        throw TesseraError.invalidArgument(
          "The \(what) key '\(key)' must hold a value of D-Bus type '\(kind.rawValue)', not '\(value.signature)'. "
            + "Wrap it in a variant of the right type.")
      }
    }
  }

  static func clip(_ s: String) -> String { s.count > 64 ? String(s.prefix(64)) + "…" : s }

  /// Checks a caller-supplied text: bounded length, no control characters.
  public static func checkText(_ value: String, name: String, max: Int = maxIdentifierLength, allowSpaces: Bool = true)
    throws
  {
    guard value.utf8.count <= max else {
      throw TesseraError.invalidArgument(
        "'\(name)' is \(value.utf8.count) bytes long; the limit is \(max). Pass the real value, not a document.")
    }
    for scalar in value.unicodeScalars
    where scalar.value < 0x20 || scalar.value == 0x7f || (!allowSpaces && scalar == " ") {
      throw TesseraError.invalidArgument(
        "'\(name)' contains a control character\(allowSpaces ? "" : " or a space") (U+\(String(scalar.value, radix: 16, uppercase: true))). "
          + "Remove it.")
    }
  }

  static func string(_ options: [String: BusValue], _ key: String, max: Int = maxIdentifierLength) throws -> String? {
    guard case .string(let s)? = options[key] else { return nil }
    try checkText(s, name: key, max: max)
    return s.isEmpty ? nil : s
  }

  /// A random (version 4) UUID in lower case, as MSAL and Entra write correlation ids. Made from the
  /// system's random source directly: Foundation's `UUID()` opens and reads /dev/urandom on each
  /// call, which was a tenth of the bus thread's time on a cached silent answer.
  public static func newCorrelationID() -> String {
    var generator = SystemRandomNumberGenerator()
    let high = (generator.next() & ~0xF000) | 0x4000  // version 4
    let low = (generator.next() & ~(0xC << 60)) | (0x8 << 60)  // RFC 4122 variant
    return String(unsafeUninitializedCapacity: 36) { text in
      var position = 0
      for word in [high, low] {
        for nibble in 0..<16 {
          if position == 8 || position == 13 || position == 18 || position == 23 {
            text[position] = UInt8(ascii: "-")
            position += 1
          }
          let digit = UInt8((word >> UInt64(60 - 4 * nibble)) & 0xF)
          text[position] = digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10
          position += 1
        }
      }
      return position
    }
  }

  static func correlationID(_ options: [String: BusValue]) throws -> String {
    guard let given = try string(options, "correlation_id", max: 128) else { return newCorrelationID() }
    try checkText(given, name: "correlation_id", max: 128, allowSpaces: false)
    return given
  }

  static func scopes(_ scopes: [String]) throws -> [String] {
    guard scopes.count <= maxScopes else {
      throw TesseraError.invalidArgument("\(scopes.count) scopes were requested; the limit is \(maxScopes).")
    }
    for scope in scopes {
      guard !scope.isEmpty else {
        throw TesseraError.invalidArgument("A scope is empty. Remove empty strings from 'scopes'.")
      }
      try checkText(scope, name: "scope '\(clip(scope))'", max: 512, allowSpaces: false)
    }
    return scopes
  }

  /// Parses AcquireToken / AcquireTokenSilent arguments.
  public static func tokenRequest(
    clientID: String, scopes rawScopes: [String], accountID: String, options: [String: BusValue]
  ) throws -> TokenRequest {
    try checkKeys(options, tokenOptions, what: "option")
    try checkText(clientID, name: "client_id", max: 256, allowSpaces: false)
    try checkText(accountID, name: "account_id", max: 512, allowSpaces: false)
    var request = TokenRequest(
      clientID: clientID, scopes: try scopes(rawScopes), accountID: accountID, correlationID: try correlationID(options)
    )
    if let optionAccount = try string(options, "account_id", max: 512) {
      if !accountID.isEmpty && optionAccount != accountID {
        throw TesseraError.invalidArgument(
          "The account_id argument and the 'account_id' option name different accounts. Pass one of them.")
      }
      request.accountID = optionAccount
    }
    request.authority = try string(options, "authority", max: 2048)
    request.loginHint = try string(options, "login_hint", max: 512)
    if let prompt = try string(options, "prompt") {
      guard let value = Prompt(rawValue: prompt) else {
        throw TesseraError.invalidArgument(
          "Option 'prompt' is '\(clip(prompt))'; use one of: \(Prompt.allCases.map(\.rawValue).joined(separator: ", "))."
        )
      }
      request.prompt = value
    }
    if let flow = try string(options, "flow") {
      guard let value = InteractiveFlow(rawValue: flow) else {
        throw TesseraError.invalidArgument("Option 'flow' is '\(clip(flow))'; use 'browser' or 'device_code'.")
      }
      request.flow = value
    }
    request.domainHint = try string(options, "domain_hint", max: 256)
    request.claims = try string(options, "claims", max: maxClaimsLength)
    if let claims = request.claims { _ = try ClaimsRequest.parse(claims) }
    if case .stringMap(let extra)? = options["extra_query"] {
      guard extra.count <= maxExtraQuery else {
        throw TesseraError.invalidArgument(
          "Option 'extra_query' has \(extra.count) entries; the limit is \(maxExtraQuery).")
      }
      for (key, value) in extra {
        try checkText(key, name: "extra_query key", max: 256, allowSpaces: false)
        try checkText(value, name: "extra_query['\(clip(key))']", max: 2048)
        if reservedQueryKeys.contains(key) {
          throw TesseraError.invalidArgument(
            "Option 'extra_query' may not set '\(key)': the broker sets it. Use the matching option instead.")
        }
      }
      request.extraQuery = extra
    }
    if case .bool(let force)? = options["force_refresh"] { request.forceRefresh = force }
    if case .uint32(let minValidity)? = options["min_validity"] {
      guard minValidity <= 86_400 else {
        throw TesseraError.invalidArgument("Option 'min_validity' is \(minValidity) s; the limit is 86400 (one day).")
      }
      request.minValidity = minValidity
    }
    if case .uint32(let timeout)? = options["timeout"] {
      guard timeout > 0, timeout <= maxTimeout else {
        throw TesseraError.invalidArgument(
          "Option 'timeout' must be between 1 and \(maxTimeout) seconds, not \(timeout).")
      }
      request.timeout = timeout
    }
    return request
  }

  public static func accountFilter(_ filter: [String: BusValue]) throws -> AccountFilter {
    try checkKeys(filter, filterKeys, what: "filter")
    return AccountFilter(
      clientID: try string(filter, "client_id", max: 256), authority: try string(filter, "authority", max: 2048),
      username: try string(filter, "username", max: 512))
  }

  public static func signOutRequest(accountID: String, options: [String: BusValue]) throws -> SignOutRequest {
    try checkKeys(options, signOutOptions, what: "option")
    try checkText(accountID, name: "account_id", max: 512, allowSpaces: false)
    guard !accountID.isEmpty else {
      throw TesseraError.invalidArgument("SignOut needs an account id. Call GetAccounts to list them.")
    }
    var request = SignOutRequest(
      accountID: accountID, clientID: try string(options, "client_id", max: 256),
      correlationID: try correlationID(options))
    if case .bool(let revoke)? = options["revoke"] { request.revoke = revoke }
    return request
  }
}
