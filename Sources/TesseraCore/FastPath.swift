import Synchronization

/// Silent answers the bus thread can give by itself, without a hop to the token actor.
///
/// The actor stays the owner of all token state. After it answers a silent request from a fresh
/// token, it publishes the reply that exact request (same client id, scopes, account and authority
/// as the caller wrote them) gets while the token stays fresh. The bus thread serves repeats of it
/// from here; anything else (other options, a token past its refresh time or too close to expiry)
/// takes the full path. Any change to accounts or tokens clears it.
public final class SilentFastPath: Sendable {
  struct Entry: Sendable {
    var reply: [String: BusValue]
    var expiresOn: Double
    var refreshOn: Double
    var target: SilentTarget
  }

  private let entries = Mutex<[String: Entry]>([:])
  /// Fast-path answers since the actor last looked: key → (target, time), for refresh-ahead.
  private let uses = Mutex<[String: (SilentTarget, Double)]>([:])
  static let maxEntries = 4096

  public init() {}

  static func key(clientID: String, scopes: [String], accountID: String, authority: String?) -> String {
    ([clientID, accountID, authority ?? ""] + scopes).joined(separator: "\u{1F}")
  }

  /// The reply for these AcquireTokenSilent arguments, or nil when the full path must answer.
  /// Also returns the request's correlation id, for the log.
  public func answer(_ arguments: [BusValue], now: Double) -> (reply: [String: BusValue], correlationID: String)? {
    guard arguments.count == 4, case .string(let clientID) = arguments[0], case .strings(let scopes) = arguments[1],
      case .string(let accountID) = arguments[2], case .dict(let options) = arguments[3]
    else { return nil }
    var minValidity = 300.0
    var correlationID: String?
    var authority: String?
    for (key, value) in options {
      switch (key, value) {
      case ("min_validity", .uint32(let seconds)) where seconds <= 86_400: minValidity = Double(seconds)
      case ("authority", .string(let text)): authority = text
      case ("correlation_id", .string(let id)):
        guard (try? RequestParser.checkText(id, name: "correlation_id", max: 128, allowSpaces: false)) != nil else {
          return nil
        }
        correlationID = id.isEmpty ? nil : id
      default: return nil  // force_refresh, claims, account_id, a wrong type, an unknown key: the full path
      }
    }
    let key = Self.key(clientID: clientID, scopes: scopes, accountID: accountID, authority: authority)
    guard let entry = entries.withLock({ $0[key] }), entry.expiresOn - now >= minValidity, now < entry.refreshOn
    else { return nil }
    uses.withLock { $0[key] = (entry.target, now) }
    var reply = entry.reply
    let id = correlationID ?? RequestParser.newCorrelationID()
    reply["correlation_id"] = .string(id)
    return (reply, id)
  }

  func publish(_ request: TokenRequest, target: SilentTarget, token: AccessTokenRecord, reply: [String: BusValue]) {
    let key = Self.key(
      clientID: request.clientID, scopes: request.scopes, accountID: request.accountID, authority: request.authority)
    let entry = Entry(
      reply: reply, expiresOn: Double(token.expiresOn), refreshOn: Double(token.refreshOn ?? token.expiresOn),
      target: target)
    entries.withLock {
      if $0.count >= Self.maxEntries { $0.removeAll() }
      $0[key] = entry
    }
  }

  func clear() { entries.withLock { $0.removeAll() } }

  func takeUses() -> [(SilentTarget, Double)] {
    uses.withLock { uses in
      defer { uses.removeAll() }
      return Array(uses.values)
    }
  }
}
