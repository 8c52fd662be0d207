import Logging
import Synchronization
import TesseraInterface

/// Wraps the daemon's log handler so that no line can be forged or drive a terminal: the message,
/// every metadata value and the error are made inert (`SafeText`: control characters and
/// bidirectional overrides become spaces) and bounded before the wrapped handler writes them.
/// Much of what is logged comes from outside: correlation ids and option keys from callers, error
/// descriptions from identity providers.
public struct InertLogHandler<Wrapped: LogHandler>: LogHandler {
  public var wrapped: Wrapped
  static var messageLimit: Int { 4096 }
  static var valueLimit: Int { 1024 }

  public init(_ wrapped: Wrapped) { self.wrapped = wrapped }

  public var logLevel: Logger.Level {
    get { wrapped.logLevel }
    set { wrapped.logLevel = newValue }
  }

  public var metadata: Logger.Metadata {
    get { wrapped.metadata }
    set { wrapped.metadata = newValue }
  }

  public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
    get { wrapped[metadataKey: key] }
    set { wrapped[metadataKey: key] = newValue }
  }

  public func log(event: LogEvent) {
    var event = event
    event.message = "\(SafeText.clip(event.message.description, limit: Self.messageLimit))"
    event.metadata = event.metadata.map { metadata in
      Dictionary(
        uniqueKeysWithValues: metadata.map {
          (SafeText.clip($0.key, limit: 64), Logger.Metadata.Value.string(Self.inert($0.value)))
        })
    }
    if let error = event.error { event.error = InertError(description: Self.inert(.string("\(error)"))) }
    wrapped.log(event: event)
  }

  static func inert(_ value: Logger.Metadata.Value) -> String {
    SafeText.clip(value.description, limit: valueLimit)
  }

  struct InertError: Error, CustomStringConvertible {
    let description: String
  }
}

/// The daemon's log level, which every logger reads at each call and a reload of the configuration
/// changes (`log_level`) for all of them at once.
public final class LogLevelSwitch: Sendable {
  private let raw: Atomic<UInt8>

  public init(_ level: Logger.Level) { raw = Atomic(Self.index(level)) }

  public var level: Logger.Level {
    get { Logger.Level.allCases[Int(raw.load(ordering: .relaxed))] }
    set { raw.store(Self.index(newValue), ordering: .relaxed) }
  }

  static func index(_ level: Logger.Level) -> UInt8 { UInt8(Logger.Level.allCases.firstIndex(of: level) ?? 2) }
}

/// A handler whose level is the shared switch's: the wrapped handler lets everything through and
/// the switch decides.
public struct SwitchedLogHandler<Wrapped: LogHandler>: LogHandler {
  public var wrapped: Wrapped
  public let levels: LogLevelSwitch

  public init(_ wrapped: Wrapped, levels: LogLevelSwitch) {
    var wrapped = wrapped
    wrapped.logLevel = .trace
    self.wrapped = wrapped
    self.levels = levels
  }

  /// The switch's level. Setting it on one logger changes nothing: the level is the daemon's
  /// (log_level, --log-level), changed by a reload through the switch, never by a logger's copy.
  public var logLevel: Logger.Level {
    get { levels.level }
    set {}
  }

  public var metadata: Logger.Metadata {
    get { wrapped.metadata }
    set { wrapped.metadata = newValue }
  }

  public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
    get { wrapped[metadataKey: key] }
    set { wrapped[metadataKey: key] = newValue }
  }

  public func log(event: LogEvent) { wrapped.log(event: event) }
}
