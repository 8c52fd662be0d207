/// Microsoft's Linux identity broker protocol, as MSAL (through msalruntime), Edge, Teams, the
/// OneDrive client and the Microsoft SSO browser extensions call it: every method takes
/// `(protocolVersion, correlationId, requestJson)` and answers one JSON string; errors travel
/// inside that JSON, never as D-Bus errors. dbus/com.microsoft.identity.broker1.xml is the
/// contract; docs/microsoft-broker.md says what Tessera answers.
public enum MicrosoftBrokerInterface {
  public static let busName = "com.microsoft.identity.broker1"
  public static let objectPath = "/com/microsoft/identity/broker1"
  public static let interfaceName = "com.microsoft.identity.Broker1"
  /// What getLinuxBrokerVersion answers: Tessera's own version (clients only display it).
  public static let version = BrokerInterface.version

  /// The longest requestJson (or any other argument) read, in bytes. MSAL's largest requests
  /// (an interactive call with its onboarding blob and claims) are a few KiB.
  public static let maxRequestBytes = 64 * 1024
  /// The deepest nesting of arrays and objects in a request.
  public static let maxDepth = 32

  public enum MethodName: String, CaseIterable, Sendable {
    case acquireTokenInteractively, acquireTokenSilently, getAccounts, removeAccount, acquirePrtSsoCookie
    case generateSignedHttpRequest, cancelInteractiveFlow, getLinuxBrokerVersion

    /// Whether an error is wrapped in `brokerTokenResponse` (token methods) or sent at the top level.
    public var answersWithTokenResponse: Bool {
      self == .acquireTokenInteractively || self == .acquireTokenSilently
    }
  }

  private typealias Arg = InterfaceDescription.Argument

  public static func description(
    refusal: @escaping @Sendable (_ method: String, _ error: TesseraError) -> [BusValue]
  ) -> InterfaceDescription {
    InterfaceDescription(
      busName: busName, objectPath: objectPath, name: interfaceName,
      methods: MethodName.allCases.map {
        .init(
          $0.rawValue, inputs: [Arg("protocolVersion", "s"), Arg("correlationId", "s"), Arg("requestJson", "s")],
          outputs: [Arg("responseJson", "s")])
      },
      callLimits: WireLimits(
        entries: 0, elements: 0, stringBytes: maxRequestBytes, values: 8, nestedVariants: false),
      refusal: refusal, nameIsOptional: true)
  }

  /// The description with the protocol's own answer to calls the bus layer refuses or cannot
  /// finish: a JSON error (wrong argument types and over-long strings are ApiContractViolation; a
  /// call pending when the daemon stops, ApplicationCanceled).
  public static let served = description { method, error in
    let name = MethodName(rawValue: method)
    return [.string(errorJSON(error, tokenMethod: name?.answersWithTokenResponse ?? false))]
  }

  /// The protocol's error answer. `status` overrides the table's (see MicrosoftBrokerStatus.of).
  public static func errorJSON(_ error: TesseraError, status: MicrosoftBrokerStatus? = nil, tokenMethod: Bool)
    -> String
  {
    let status = status ?? MicrosoftBrokerStatus.of(error)
    let object =
      "{\"context\":\(JSONText.quote(error.message)),\"diagnostics\":null,\"errorCode\":\(error.detail?.providerCode ?? 0),\"status\":\(status.rawValue),\"subStatus\":0,\"tag\":0}"
    guard tokenMethod else { return "{\"error\":\(object)}" }
    let subError = JSONText.quote(error.detail?.suberror ?? "")
    return
      "{\"brokerTokenResponse\":{\"accessTokenType\":0,\"error\":\(object),\"expiresOn\":0,\"extendedExpiresOn\":0,\"subError\":\(subError)}}"
  }
}

/// The `status` of an error answer, as msalruntime reads it on the wire (measured; its own
/// enum numbers the values from 12 on differently).
public enum MicrosoftBrokerStatus: Int, CaseIterable, Sendable {
  case unexpected = 0
  case reserved = 1
  case interactionRequired = 2
  case noNetwork = 3
  case networkTemporarilyUnavailable = 4
  case serverTemporarilyUnavailable = 5
  case apiContractViolation = 6
  case userCanceled = 7
  case applicationCanceled = 8
  case incorrectConfiguration = 9
  case insufficientBuffer = 10
  case authorityUntrusted = 11
  case accountUnusable = 13
  case userDataRemovalRequired = 14
  case transientError = 15
  case accountSwitch = 16
  case deviceNotRegistered = 17
  case keyNotFound = 18
  case accountNotFound = 19
  case requiredBrokerMissing = 20
  case fallbackToNativeMsal = 21

  /// The name as docs/errors.md and the logs show it.
  public var name: String {
    let raw = String(describing: self)
    return raw.prefix(1).uppercased() + raw.dropFirst()
  }

  /// The status for an engine error: the error table's (ErrorCode.entry.microsoftStatus), told
  /// apart for network failures by what the detail says: no connection at all is NoNetwork, an
  /// identity provider that answered 5xx or 429 (or `temporarily_unavailable`) is
  /// ServerTemporarilyUnavailable, as is its asking for a pause; a client id or scope the
  /// provider refused is IncorrectConfiguration rather than a broken call; and a refusal is
  /// UserCanceled only when the user declined at the provider (not for a forged or stale
  /// redirect, which stays Unexpected).
  public static func of(_ error: TesseraError) -> MicrosoftBrokerStatus {
    let status = error.code.entry.microsoftStatus
    switch error.code {
    case .network:
      if error.detail?.unreachable == true { return .noNetwork }
      if error.detail?.providerAskedToWait == true { return .serverTemporarilyUnavailable }
      if let http = error.detail?.httpStatus, http >= 500 || http == 429 { return .serverTemporarilyUnavailable }
      if let oauth = error.detail?.oauthError, oauth == "temporarily_unavailable" || oauth == "server_error" {
        return .serverTemporarilyUnavailable
      }
      return status
    case .invalidArgument where error.detail?.oauthError != nil:
      return .incorrectConfiguration
    case .accessDenied:
      let declined: Set<String> = ["access_denied", "authorization_declined"]
      return error.detail?.oauthError.map(declined.contains) == true ? .userCanceled : status
    default:
      return status
    }
  }
}

/// JSON text for the few answers built without an encoder (the bus layer's refusals).
public enum JSONText {
  /// A JSON string literal: quotes, backslashes and control characters escaped.
  public static func quote(_ text: String) -> String {
    var out = "\""
    out.reserveCapacity(text.utf8.count + 2)
    for scalar in text.unicodeScalars {
      switch scalar {
      case "\"": out += "\\\""
      case "\\": out += "\\\\"
      case "\n": out += "\\n"
      case "\r": out += "\\r"
      case "\t": out += "\\t"
      // DEL too: JSON allows it raw, but TOML (ConfigFile.Value.toml, which uses this) does not.
      case _ where scalar.value < 0x20 || scalar.value == 0x7F || scalar.value == 0x2028 || scalar.value == 0x2029:
        let hex = String(scalar.value, radix: 16)
        out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
      default: out.unicodeScalars.append(scalar)
      }
    }
    return out + "\""
  }
}
