/// A reply body that a server sends many times with one entry changed (a cached token's reply,
/// whose correlation id differs per call). It is built once per token; the bus layer encodes it
/// into each reply straight from these values, adding the one changed entry, without first
/// merging the two into a new dictionary.
public final class ReplyTemplate: Sendable {
  /// The body: one a{sv}.
  public let dict: [String: BusValue]

  public init(_ dict: [String: BusValue]) {
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
