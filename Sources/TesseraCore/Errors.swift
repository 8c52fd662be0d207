/// The one error type of Tessera. Every failure a caller can see is one of these codes; the
/// table below is the single place that maps a code to its D-Bus error name and CLI exit code.
public struct TesseraError: Error, Sendable, Equatable, CustomStringConvertible {
  public enum Code: String, CaseIterable, Sendable {
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

    /// Prefix shared by all Tessera D-Bus error names.
    public static let dbusPrefix = "org.tessera.Broker1.Error."

    /// The D-Bus error name, as listed in dbus/org.tessera.Broker1.xml.
    public var dbusName: String { Self.dbusPrefix + rawValue }

    /// The `tessera` CLI exit status for this code (documented in tessera(1)).
    public var exitCode: Int32 {
      switch self {
      case .invalidArgument: 3
      case .interactionRequired: 4
      case .noSuchAccount: 5
      case .untrustedAuthority: 6
      case .cancelled: 7
      case .timedOut: 8
      case .network: 9
      case .provider: 10
      case .storeUnavailable: 11
      case .accessDenied: 12
      case .internal: 13
      }
    }

    public init?(dbusName: String) {
      guard dbusName.hasPrefix(Self.dbusPrefix) else { return nil }
      self.init(rawValue: String(dbusName.dropFirst(Self.dbusPrefix.count)))
    }
  }

  public var code: Code
  /// What happened and what to do next. Never contains a token, code or secret.
  public var message: String

  public init(_ code: Code, _ message: String) {
    self.code = code
    self.message = message
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
  public static func `internal`(_ message: String) -> TesseraError { .init(.internal, message) }
}

extension TesseraError {
  /// Wraps any error as a TesseraError; unknown errors become `Internal`.
  public static func wrap(_ error: any Error) -> TesseraError {
    if let error = error as? TesseraError { return error }
    if error is CancellationError {
      return .cancelled("The request was cancelled before it finished. Run it again if you still need it.")
    }
    return .internal("Unexpected failure (\(type(of: error))). Please report it with the daemon's log.")
  }
}
