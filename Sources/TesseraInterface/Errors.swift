/// The one error type of Tessera, and the one table of its codes. Every failure a caller can see is
/// one of these codes; `ErrorCode.entry` (one exhaustive switch) is the single place that gives each
/// code its D-Bus error name's suffix, its `tessera` exit status, its one-line meaning and the
/// Microsoft front's `status`. The contract XML, docs/errors.md,
/// tessera(1) and the CLI's `--help` are checked against (or printed from) this table.
public struct TesseraError: Error, Sendable, Equatable, CustomStringConvertible {
  public typealias Code = ErrorCode

  public var code: Code
  /// What happened and what to do next. Never contains a token, code or secret.
  public var message: String
  /// What the identity provider or the network said, for fronts whose protocol carries it (the
  /// Microsoft front's `errorCode`, `subError` and network statuses). Never a token.
  public var detail: ErrorDetail?

  public init(_ code: Code, _ message: String, detail: ErrorDetail? = nil) {
    self.code = code
    self.message = message
    self.detail = detail
  }

  public var description: String { "\(code.rawValue): \(message)" }

  public static func invalidArgument(_ message: String) -> TesseraError { .init(.invalidArgument, message) }
  public static func interactionRequired(_ message: String) -> TesseraError { .init(.interactionRequired, message) }
  public static func noSuchAccount(_ message: String) -> TesseraError { .init(.noSuchAccount, message) }
  public static func untrustedAuthority(_ message: String) -> TesseraError { .init(.untrustedAuthority, message) }
  public static func cancelled(_ message: String) -> TesseraError { .init(.cancelled, message) }
  public static func timedOut(_ message: String) -> TesseraError { .init(.timedOut, message) }
  public static func network(_ message: String) -> TesseraError { .init(.network, message) }
  public static func provider(_ message: String) -> TesseraError { .init(.provider, message) }
  public static func storeUnavailable(_ message: String) -> TesseraError { .init(.storeUnavailable, message) }
  public static func accessDenied(_ message: String) -> TesseraError { .init(.accessDenied, message) }
  public static func configuration(_ message: String) -> TesseraError { .init(.configuration, message) }
  public static func environment(_ message: String) -> TesseraError { .init(.environment, message) }
  public static func busy(_ message: String) -> TesseraError { .init(.busy, message) }
  /// A bug in the broker, and nothing else: never a problem of the user's configuration or machine.
  public static func `internal`(_ message: String) -> TesseraError { .init(.internal, message) }

  /// Wraps any error as a TesseraError; errors of no known kind are bugs, so `Internal`.
  public static func wrap(_ error: any Error) -> TesseraError {
    if let error = error as? TesseraError { return error }
    if error is CancellationError {
      return .cancelled("The request was cancelled before it finished. Run it again if you still need it.")
    }
    return .internal("Unexpected failure (\(type(of: error))). Please report it with the daemon's log.")
  }
}

/// The parts of a failure other protocols than Tessera's own carry as fields.
public struct ErrorDetail: Sendable, Equatable {
  /// The OAuth `error` (`invalid_grant`, `interaction_required`, …).
  public var oauthError: String?
  /// Entra's `suberror` (`basic_action`, `consent_required`, …).
  public var suberror: String?
  /// Entra's first `error_codes` entry (the AADSTS number).
  public var providerCode: Int?
  /// The HTTP status of the identity provider's answer, when there was one.
  public var httpStatus: Int?
  /// No connection could be made at all (name resolution, refused, no route).
  public var unreachable: Bool
  /// The identity provider asked for a pause (Retry-After) that has not passed yet.
  public var providerAskedToWait: Bool

  public init(
    oauthError: String? = nil, suberror: String? = nil, providerCode: Int? = nil, httpStatus: Int? = nil,
    unreachable: Bool = false, providerAskedToWait: Bool = false
  ) {
    self.oauthError = oauthError
    self.suberror = suberror
    self.providerCode = providerCode
    self.httpStatus = httpStatus
    self.unreachable = unreachable
    self.providerAskedToWait = providerAskedToWait
  }
}

/// Every error a caller of the broker can get.
public enum ErrorCode: String, CaseIterable, Sendable {
  case invalidArgument = "InvalidArgument"
  case interactionRequired = "InteractionRequired"
  case noSuchAccount = "NoSuchAccount"
  case untrustedAuthority = "UntrustedAuthority"
  case cancelled = "Cancelled"
  case timedOut = "TimedOut"
  case network = "Network"
  case provider = "Provider"
  case storeUnavailable = "StoreUnavailable"
  case accessDenied = "AccessDenied"
  case `internal` = "Internal"
  case configuration = "Configuration"
  case environment = "Environment"
  case busy = "Busy"

  /// What the table holds for each code.
  public struct Entry: Sendable {
    /// The `tessera` command's exit status.
    public let exitStatus: Int32
    /// One line: when a caller gets it (used in `tessera --help` and checked against docs).
    public let summary: String
    /// The `status` the Microsoft front (com.microsoft.identity.broker1) answers with.
    public let microsoftStatus: MicrosoftBrokerStatus
  }

  /// The table. Exit statuses are stable: scripts depend on them.
  public var entry: Entry {
    switch self {
    case .invalidArgument:
      Entry(exitStatus: 3, summary: "invalid argument or option", microsoftStatus: .apiContractViolation)
    case .interactionRequired:
      Entry(exitStatus: 4, summary: "interaction required: run `tessera login`", microsoftStatus: .interactionRequired)
    case .noSuchAccount: Entry(exitStatus: 5, summary: "no such account", microsoftStatus: .interactionRequired)
    case .untrustedAuthority: Entry(exitStatus: 6, summary: "untrusted authority", microsoftStatus: .authorityUntrusted)
    case .cancelled: Entry(exitStatus: 7, summary: "cancelled", microsoftStatus: .applicationCanceled)
    case .timedOut: Entry(exitStatus: 8, summary: "timed out", microsoftStatus: .userCanceled)
    case .network:
      Entry(
        exitStatus: 9, summary: "network: the identity provider cannot be reached",
        microsoftStatus: .networkTemporarilyUnavailable)
    case .provider:
      Entry(exitStatus: 10, summary: "the identity provider answered with an error", microsoftStatus: .unexpected)
    case .storeUnavailable:
      Entry(
        exitStatus: 11, summary: "token store (keyring or file store) unavailable or locked",
        microsoftStatus: .transientError)
    case .accessDenied: Entry(exitStatus: 12, summary: "access denied", microsoftStatus: .unexpected)
    case .internal: Entry(exitStatus: 13, summary: "a bug in the broker: report it", microsoftStatus: .unexpected)
    case .configuration:
      Entry(
        exitStatus: 15, summary: "the broker's configuration cannot serve the request: fix config.toml",
        microsoftStatus: .incorrectConfiguration)
    case .environment:
      Entry(
        exitStatus: 16, summary: "something the broker needs on this machine is missing or exhausted",
        microsoftStatus: .incorrectConfiguration)
    case .busy:
      Entry(
        exitStatus: 17, summary: "too many sign-ins are in progress: finish or cancel one",
        microsoftStatus: .transientError)
    }
  }

  /// Prefix shared by all Tessera D-Bus error names.
  public static let dbusPrefix = "org.tessera.Broker1.Error."

  /// The D-Bus error name, as listed in dbus/org.tessera.Broker1.xml.
  public var dbusName: String { Self.dbusPrefix + rawValue }

  /// The `tessera` CLI exit status for this code (documented in tessera(1) and docs/errors.md).
  public var exitCode: Int32 { entry.exitStatus }

  public init?(dbusName: String) {
    guard dbusName.hasPrefix(Self.dbusPrefix) else { return nil }
    self.init(rawValue: String(dbusName.dropFirst(Self.dbusPrefix.count)))
  }
}

/// Exit statuses of the `tessera` command that are not broker errors.
public enum ClientExitStatus: Int32, CaseIterable, Sendable {
  case success = 0
  /// An unexpected D-Bus error (not from the broker), or a failure of the command itself.
  case failure = 1
  /// The broker cannot be reached: no session bus, or the name has no owner and cannot be activated.
  case brokerNotRunning = 14
  /// Unknown option or subcommand, missing or malformed argument (swift-argument-parser's own).
  case usage = 64
  /// `tessera exec`: the command was found but could not be run (as a shell says).
  case commandNotExecutable = 126
  /// `tessera exec`: no such command (as a shell says).
  case commandNotFound = 127

  public var summary: String {
    switch self {
    case .success: "success"
    case .failure: "unexpected failure"
    case .brokerNotRunning: "the broker is not running and cannot be started"
    case .usage: "usage error"
    case .commandNotExecutable: "tessera exec: the command cannot be run"
    case .commandNotFound: "tessera exec: the command was not found"
    }
  }

  /// Every exit status of `tessera`, in order: these and the broker's error codes.
  public static var all: [(status: Int32, name: String?, summary: String)] {
    (allCases.map { ($0.rawValue, nil as String?, $0.summary) }
      + ErrorCode.allCases.map { ($0.exitCode, $0.rawValue as String?, $0.entry.summary) })
      .sorted { $0.0 < $1.0 }
  }
}
