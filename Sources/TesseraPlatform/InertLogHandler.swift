import Logging
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
