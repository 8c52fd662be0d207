import Synchronization

/// A reply body that a server sends many times with one entry changed (a cached token's reply,
/// whose correlation id differs per call). The bus layer encodes it once, on first use, and copies
/// the encoded body into each reply.
public final class ReplyTemplate: Sendable {
  private static let counter = Atomic<UInt64>(0)

  /// Unique for the life of the process: the bus layer keys its encoded copy by it.
  public let id: UInt64
  /// The body: one a{sv}.
  public let dict: [String: BusValue]

  public init(_ dict: [String: BusValue]) {
    id = Self.counter.wrappingAdd(1, ordering: .relaxed).newValue
    self.dict = dict
  }
}

/// What a server's bus thread answers by itself, without handing the call on.
public enum FastAnswer: Sendable {
  /// These values, or this error.
  case reply(Result<[BusValue], TesseraError>)
  /// One a{sv}: the template's entries plus `key` = `value` (which the template must not hold).
  case template(ReplyTemplate, key: String, value: BusValue)

  /// The reply as plain values (for servers and tests that do not use templates).
  public var values: Result<[BusValue], TesseraError> {
    switch self {
    case .reply(let result): result
    case .template(let template, let key, let value):
      .success([.dict(template.dict.merging([key: value]) { $1 })])
    }
  }
}
