/// The one table of request options: every key a method's `a{sv}` argument accepts, with its D-Bus
/// type, limits and default. The daemon's request parser and its silent fast path validate with it,
/// the client library encodes and pre-checks with it, and the contract XML
/// (`org.tessera.Broker1.Option.*` annotations) and the end-to-end tests are checked against it.

/// A method whose `a{sv}` argument takes keys from the table.
public enum OptionMethod: String, Sendable, CaseIterable {
  case acquireToken = "AcquireToken"
  case acquireTokenSilent = "AcquireTokenSilent"
  case getAccounts = "GetAccounts"
  case signOut = "SignOut"
  case rejectToken = "RejectToken"
  case addForward = "AddForward"
  case answerQuestion = "AnswerQuestion"
  case getProof = "GetProof"

  /// What its `a{sv}` argument is called, in messages: GetAccounts takes a filter.
  public var argumentWord: String { self == .getAccounts ? "filter" : "option" }
}

public struct RequestOption: Sendable, Equatable {
  /// The D-Bus types options use.
  public enum Kind: String, Sendable {
    case string = "s"
    case bool = "b"
    case uint32 = "u"
    case stringMap = "a{ss}"
  }

  public let key: String
  public let kind: Kind
  public let methods: Set<OptionMethod>
  /// Strings: the longest value, in bytes. String maps: the longest value of an entry.
  public let maxBytes: Int
  /// Strings: may it contain spaces? (Control characters are never allowed.)
  public let spaces: Bool
  /// uint32: the values allowed.
  public let range: ClosedRange<UInt32>?
  /// Strings: the only values allowed, when it is an enumeration.
  public let values: [String]?
  /// String maps: the most entries, and the longest key in bytes (keys never contain spaces).
  public let maxEntries: Int
  public let maxKeyBytes: Int
  /// What applies when the key is absent, as the contract documents it.
  public let defaultValue: String

  init(
    _ key: String, _ kind: Kind, _ methods: Set<OptionMethod>, maxBytes: Int = 0, spaces: Bool = true,
    range: ClosedRange<UInt32>? = nil, values: [String]? = nil, maxEntries: Int = 0, maxKeyBytes: Int = 0,
    default defaultValue: String
  ) {
    self.key = key
    self.kind = kind
    self.methods = methods
    self.maxBytes = maxBytes
    self.spaces = spaces
    self.range = range
    self.values = values
    self.maxEntries = maxEntries
    self.maxKeyBytes = maxKeyBytes
    self.defaultValue = defaultValue
  }

  /// Checks a value sent for this key: exactly its type, then its limits.
  public func check(_ value: BusValue, method: OptionMethod) throws(TesseraError) {
    let word = method.argumentWord
    switch (kind, value) {
    case (.string, .string(let text)):
      try RequestOptions.checkText(text, name: key, max: maxBytes, allowSpaces: spaces)
      if let values, !text.isEmpty, !values.contains(text) {
        throw .invalidArgument(
          "The \(word) '\(key)' is '\(RequestOptions.clip(text))'; use one of: \(values.joined(separator: ", ")).")
      }
    case (.bool, .bool): break
    case (.uint32, .uint32(let number)):
      if let range, !range.contains(number) {
        throw .invalidArgument(
          "The \(word) '\(key)' is \(number); it must be between \(range.lowerBound) and \(range.upperBound).")
      }
    case (.stringMap, .stringMap(let map)):
      guard map.count <= maxEntries else {
        throw .invalidArgument("The \(word) '\(key)' has \(map.count) entries; the limit is \(maxEntries).")
      }
      for (entryKey, entryValue) in map {
        try RequestOptions.checkText(entryKey, name: "\(key) key", max: maxKeyBytes, allowSpaces: false)
        try RequestOptions.checkText(entryValue, name: "\(key)['\(RequestOptions.clip(entryKey))']", max: maxBytes)
      }
    default:
      throw .invalidArgument(
        "The \(word) key '\(key)' must hold a value of D-Bus type '\(kind.rawValue)', not '\(value.signature)'. "
          + "Wrap it in a variant of the right type.")
    }
  }

  /// The contract's annotation value for this option, e.g. `type=u min=0 max=86400 default=300`.
  public var annotation: String {
    var parts = ["type=\(kind.rawValue)"]
    switch kind {
    case .string:
      parts.append("max_bytes=\(maxBytes)")
      if !spaces { parts.append("spaces=no") }
      if let values { parts.append("values=\(values.joined(separator: "|"))") }
    case .uint32:
      if let range { parts += ["min=\(range.lowerBound)", "max=\(range.upperBound)"] }
    case .stringMap:
      parts += ["max_entries=\(maxEntries)", "max_key_bytes=\(maxKeyBytes)", "max_bytes=\(maxBytes)"]
    case .bool: break
    }
    parts.append("default=\(defaultValue)")
    return parts.joined(separator: " ")
  }
}

public enum RequestOptions {
  static let tokenMethods: Set<OptionMethod> = [.acquireToken, .acquireTokenSilent]

  public static let authority = RequestOption(
    "authority", .string, [.acquireToken, .acquireTokenSilent, .getAccounts, .rejectToken], maxBytes: 2048,
    default: "default_authority")
  public static let accountID = RequestOption(
    "account_id", .string, tokenMethods, maxBytes: 512, spaces: false, default: "the account_id argument")
  public static let loginHint = RequestOption("login_hint", .string, tokenMethods, maxBytes: 512, default: "none")
  public static let domainHint = RequestOption("domain_hint", .string, tokenMethods, maxBytes: 256, default: "none")
  public static let prompt = RequestOption(
    "prompt", .string, tokenMethods, maxBytes: 64, values: ["select_account", "login", "consent", "none"],
    default: "none")
  public static let flow = RequestOption(
    "flow", .string, tokenMethods, maxBytes: 64, values: ["browser", "device_code"], default: "browser")
  public static let claims = RequestOption("claims", .string, tokenMethods, maxBytes: 16 * 1024, default: "none")
  public static let extraQuery = RequestOption(
    "extra_query", .stringMap, tokenMethods, maxBytes: 2048, maxEntries: 32, maxKeyBytes: 256, default: "none")
  public static let correlationID = RequestOption(
    "correlation_id", .string, [.acquireToken, .acquireTokenSilent, .signOut, .rejectToken], maxBytes: 128,
    spaces: false,
    default: "a new UUID")
  public static let forceRefresh = RequestOption("force_refresh", .bool, tokenMethods, default: "false")
  public static let minValidity = RequestOption(
    "min_validity", .uint32, tokenMethods, range: 0...86_400, default: "300")
  public static let timeout = RequestOption(
    "timeout", .uint32, tokenMethods, range: 1...3600, default: "300 (browser), 900 (device_code)")
  /// The access token a resource refused (git's `erase`, an HTTP 401): when it is the cached one, the
  /// call fetches a new one instead of returning it again.
  public static let rejectedToken = RequestOption(
    "rejected_token", .string, [.acquireTokenSilent], maxBytes: 16 * 1024, spaces: false, default: "none")
  /// A `[[provider]]` of config.toml by name: its issuer, client id, scopes and parameters
  /// unless the request gives its own.
  public static let provider = RequestOption(
    "provider", .string, tokenMethods.union([.rejectToken]), maxBytes: 64, spaces: false,
    default: "none (the authority's)")
  public static let clientID = RequestOption(
    "client_id", .string, [.getAccounts, .signOut], maxBytes: 256, spaces: false, default: "all clients")
  public static let username = RequestOption("username", .string, [.getAccounts], maxBytes: 512, default: "any")
  public static let revoke = RequestOption("revoke", .bool, [.signOut], default: "true")
  /// Also end the account's session at the provider in the user's browser (OpenID Connect
  /// RP-Initiated Logout), so the next sign-in asks for the password again.
  public static let browser = RequestOption("browser", .bool, [.signOut], default: "false")
  public static let lasting = RequestOption("lasting", .bool, [.addForward], default: "false")
  /// An account chooser's answer holds for that app (and identity provider) from now on.
  public static let remember = RequestOption("remember", .bool, [.answerQuestion], default: "false")
  /// The DPoP-Nonce a resource server sent (RFC 9449 §9): the proof carries it.
  public static let nonce = RequestOption("nonce", .string, [.getProof], maxBytes: 1024, spaces: false, default: "none")

  /// Every entry of the table.
  public static let all: [RequestOption] = [
    authority, accountID, loginHint, domainHint, prompt, flow, claims, extraQuery, correlationID, forceRefresh,
    minValidity, timeout, rejectedToken, provider, clientID, username, revoke, browser, lasting, remember, nonce,
  ]

  /// The default of `min_validity`, in seconds.
  public static let defaultMinValidity: UInt32 = 300

  private static let byMethod: [OptionMethod: [String: RequestOption]] = {
    var table: [OptionMethod: [String: RequestOption]] = [:]
    for option in all {
      for method in option.methods { table[method, default: [:]][option.key] = option }
    }
    return table
  }()

  /// The keys `method` accepts.
  public static func options(for method: OptionMethod) -> [String: RequestOption] { byMethod[method] ?? [:] }

  /// Checks every key and value of a method's `a{sv}` argument against the table. Keys are checked
  /// in sorted order only when one fails, so the message is the same whatever order they came in.
  public static func validate(_ options: [String: BusValue], for method: OptionMethod) throws(TesseraError) {
    let accepted = byMethod[method] ?? [:]
    var failed = false
    for (key, value) in options {
      guard let option = accepted[key] else {
        failed = true
        break
      }
      do { try option.check(value, method: method) } catch {
        failed = true
        break
      }
    }
    guard failed else { return }
    for (key, value) in options.sorted(by: { $0.key < $1.key }) {
      guard let option = accepted[key] else {
        throw .invalidArgument(
          "Unknown \(method.argumentWord) key '\(clip(key))' for \(method.rawValue). Known keys: "
            + "\(accepted.keys.sorted().joined(separator: ", ")). Remove it or check its spelling.")
      }
      try option.check(value, method: method)
    }
  }

  /// Checks a caller-supplied text: bounded length, no control characters (C0, DEL, C1, line
  /// separators, bidirectional overrides: what `SafeText` would neutralise), nor spaces when not
  /// allowed.
  public static func checkText(_ value: String, name: String, max: Int, allowSpaces: Bool = true) throws(TesseraError) {
    guard value.utf8.count <= max else {
      throw .invalidArgument(
        "'\(name)' is \(value.utf8.count) bytes long; the limit is \(max). Pass the real value, not a document.")
    }
    for scalar in value.unicodeScalars where SafeText.isUnsafe(scalar) || (!allowSpaces && scalar == " ") {
      throw .invalidArgument(
        "'\(name)' contains a control character\(allowSpaces ? "" : " or a space") "
          + "(U+\(String(scalar.value, radix: 16, uppercase: true))). Remove it.")
    }
  }

  /// A caller's text shortened for a message.
  public static func clip(_ s: String) -> String { SafeText.clip(s, limit: 64) }
}

/// Limits on the methods' plain arguments (the `a{sv}` ones are in `RequestOptions`).
public enum ArgumentLimits {
  public static let clientIDBytes = 256
  public static let accountIDBytes = 512
  public static let scopes = 64
  public static let scopeBytes = 512
}

/// Limits applied while a message's values are decoded, before any of them is looked at: a call
/// of 2 million option keys is refused after the 65th, on the bus thread, in microseconds, instead
/// of being built into a dictionary first. Generous against the tables above (ContractTests checks
/// that every valid call fits); the parser applies the exact limits afterwards.
public struct WireLimits: Sendable {
  /// Entries of one a{sv} or a{ss}.
  public var entries: Int
  /// Elements of one array.
  public var elements: Int
  /// Bytes of one string.
  public var stringBytes: Int
  /// Values in the whole message, containers included.
  public var values: Int
  /// Whether a variant may hold a variant (an option has exactly its documented type).
  public var nestedVariants: Bool

  public init(entries: Int, elements: Int, stringBytes: Int, values: Int, nestedVariants: Bool) {
    self.entries = entries
    self.elements = elements
    self.stringBytes = stringBytes
    self.values = values
    self.nestedVariants = nestedVariants
  }

  /// For calls a server receives.
  public static let calls = WireLimits(
    entries: 64, elements: 256, stringBytes: 16 * 1024, values: 4096, nestedVariants: false)
  /// For replies and signals a client receives from the broker (an account list can be long).
  public static let replies = WireLimits(
    entries: 4096, elements: 1 << 20, stringBytes: 1 << 24, values: 1 << 24, nestedVariants: false)
}

/// How long an interactive sign-in may take when the caller gives no `timeout`, in seconds.
public enum InteractiveTimeouts {
  public static let browser: UInt32 = 300
  public static let deviceCode: UInt32 = 900
}
