import Synchronization

/// Silent answers the bus thread can give by itself, without a hop to the token actor.
///
/// The actor stays the owner of all token state. After it answers a silent request from a fresh
/// token, it publishes the reply that exact request (same client id, scopes, account and authority
/// as the caller wrote them) gets while the token stays fresh. The bus thread parses each
/// AcquireTokenSilent with the same parser as the full path (`RequestParser.tokenRequest`, over the
/// one option table), so it refuses exactly what the full path refuses, with the same error, and
/// serves repeats from here; anything it cannot answer (force_refresh, claims, a token past its
/// refresh time or too close to expiry, nothing published) takes the full path. Any change to
/// accounts or tokens clears it.
public final class SilentFastPath: Sendable {
  /// A request as the caller wrote it.
  struct Key: Hashable, Sendable {
    var clientID: String
    var scopes: [String]
    var accountID: String
    var authority: String?

    init(_ request: TokenRequest) {
      clientID = request.clientID
      scopes = request.scopes
      accountID = request.accountID
      authority = request.authority
    }
  }

  final class Entry: Sendable {
    /// The reply without its correlation id, which differs per call.
    let reply: ReplyTemplate
    let expiresOn: Double
    let refreshOn: Double
    /// The token's lifetime, for its serving margin (nil: unknown).
    let lifetime: Int64?
    /// Wall clock minus elapsed time when published: a wall clock set since then (until the
    /// engine has moved token times with it) leaves the answer to the full path.
    let clockOffset: Double?
    let target: SilentTarget
    /// `target.key`, computed once (it normalises the scopes).
    let targetKey: SilentTarget.Key
    /// The second of the last use recorded for refresh-ahead: uses are recorded once a second.
    let lastUse = Atomic<Int64>(0)

    init(reply: ReplyTemplate, token: AccessTokenRecord, target: SilentTarget, clockOffset: Double? = nil) {
      self.reply = reply
      self.clockOffset = clockOffset
      self.expiresOn = Double(token.expiresOn)
      self.refreshOn = Double(token.refreshOn ?? token.expiresOn)
      self.lifetime = token.cachedAt.map { token.expiresOn - $0 }
      self.target = target
      self.targetKey = target.key
    }
  }

  private let entries = Mutex<[Key: Entry]>([:])
  /// Fast-path answers since the actor last looked: what was used, and when (for refresh-ahead).
  private let uses = Mutex<[SilentTarget.Key: (SilentTarget, Double)]>([:])
  static let maxEntries = 4096

  public init() {}

  /// What the fast path makes of an AcquireTokenSilent call.
  public enum Answer: Sendable {
    /// The reply (the template plus this request's correlation id), and that id (for the log).
    case reply(ReplyTemplate, correlationID: String)
    /// The call is invalid: the error the full path would give too.
    case refused(TesseraError)
  }

  // MARK: Access (issue 11)

  /// Which app may use which client and account, as the full path decided for it: the bus thread
  /// answers only those, so a cache hit costs one more set lookup. Off in `access_mode = "open"` with
  /// `notify_first_use = false`.
  struct AllowKey: Hashable, Sendable {
    var app: String
    var clientID: String
    var accountID: String
    /// A grant may be narrowed to an authority and scopes: what was allowed is exactly these.
    var authority: String
    var scopes: [String]
  }
  private let allowed = Mutex<Set<AllowKey>>([])
  let enforcesAccess = Atomic<Bool>(false)

  func noteAllowed(app: String, clientID: String, accountID: String, authority: String, scopes: [String]) {
    allowed.withLock { set in
      if set.count >= Self.maxEntries { set.removeAll() }
      set.insert(
        AllowKey(app: app, clientID: clientID, accountID: accountID, authority: authority, scopes: scopes))
    }
  }

  func forgetAllowed() { allowed.withLock { $0.removeAll() } }

  func mayAnswer(app: String?, target: SilentTarget) -> Bool {
    guard enforcesAccess.load(ordering: .relaxed) else { return true }
    guard let app else { return false }
    return allowed.withLock {
      $0.contains(
        AllowKey(
          app: app, clientID: target.clientID, accountID: target.account.id, authority: target.authority.url,
          scopes: target.scopes))
    }
  }

  /// The answer for these AcquireTokenSilent arguments, or nil when the full path must answer.
  /// `app`: the caller's AppIdentity key; only an app the full path allowed is answered here.
  public func answer(_ arguments: [BusValue], now: Double, elapsed: Double? = nil, app: String? = nil) -> Answer? {
    guard arguments.count == 4, case .string(let clientID) = arguments[0], case .strings(let scopes) = arguments[1],
      case .string(let accountID) = arguments[2], case .dict(let options) = arguments[3]
    else { return nil }
    let request: TokenRequest
    do {
      request = try RequestParser.tokenRequest(
        clientID: clientID, scopes: scopes, accountID: accountID, options: options)
    } catch {
      return .refused(TesseraError.wrap(error))
    }
    guard !request.forceRefresh, request.claims == nil, request.accessTokenToRenew == nil,
      let entry = entries.withLock({ $0[Key(request)] }),
      entry.expiresOn - now >= TokenLifetimes.servingMargin(request.minValidity, lifetime: entry.lifetime),
      now < entry.refreshOn, Self.clockKept(entry.clockOffset, now: now, elapsed: elapsed),
      mayAnswer(app: app, target: entry.target)
    else { return nil }
    let second = Int64(now)
    if entry.lastUse.exchange(second, ordering: .relaxed) != second {
      uses.withLock { $0[entry.targetKey] = (entry.target, now) }
    }
    return .reply(entry.reply, correlationID: request.correlationID)
  }

  /// Has the wall clock kept pace with elapsed time since an entry was published (within
  /// Broker.clockJumpThreshold)? Unknown counts as yes.
  static func clockKept(_ offset: Double?, now: Double, elapsed: Double?) -> Bool {
    guard let offset, let elapsed else { return true }
    return abs(now - elapsed - offset) <= Broker.clockJumpThreshold
  }

  func publish(
    _ request: TokenRequest, target: SilentTarget, token: AccessTokenRecord, reply: [String: BusValue],
    clockOffset: Double? = nil
  ) {
    var body = reply
    body[TokenInfo.correlationIDKey] = nil
    let entry = Entry(reply: ReplyTemplate(body), token: token, target: target, clockOffset: clockOffset)
    entries.withLock {
      if $0.count >= Self.maxEntries { $0.removeAll() }
      $0[Key(request)] = entry
    }
  }

  // MARK: Microsoft's protocol

  /// A Microsoft-front answer: the whole JSON (it carries no correlation id), for one exact
  /// requestJson text. The same text parses to the same request, and any change to accounts or
  /// tokens clears the table, so the text is the key; the bus thread checks only the protocol
  /// version, the correlation id and the token's freshness.
  final class MicrosoftEntry: Sendable {
    let answer: String
    let expiresOn: Double
    let refreshOn: Double
    let lifetime: Int64?
    let clockOffset: Double?
    let target: SilentTarget
    let targetKey: SilentTarget.Key
    let lastUse = Atomic<Int64>(0)
    /// For the log.
    let clientID: String
    let scopes: String

    init(answer: String, token: AccessTokenRecord, target: SilentTarget, scopes: [String], clockOffset: Double? = nil) {
      self.answer = answer
      self.clockOffset = clockOffset
      expiresOn = Double(token.expiresOn)
      refreshOn = Double(token.refreshOn ?? token.expiresOn)
      lifetime = token.cachedAt.map { token.expiresOn - $0 }
      self.target = target
      targetKey = target.key
      clientID = target.clientID
      self.scopes = scopes.joined(separator: " ")
    }
  }

  /// Entries and the bytes their keys and answers hold: requestJson texts are the caller's (up to
  /// 64 KiB each), so the table is bounded by bytes, not only by count.
  private let microsoft = Mutex<(entries: [String: MicrosoftEntry], bytes: Int)>(([:], 0))
  static let maxMicrosoftBytes = 4 << 20

  /// The published answer to this acquireTokenSilently requestJson, or nil when the full path
  /// must answer (nothing published, the token past its refresh time or within the default
  /// min_validity of expiry).
  func microsoftAnswer(_ requestJSON: String, now: Double, elapsed: Double? = nil, app: String? = nil)
    -> MicrosoftEntry?
  {
    guard let entry = microsoft.withLock({ $0.entries[requestJSON] }),
      entry.expiresOn - now
        >= TokenLifetimes.servingMargin(nil, lifetime: entry.lifetime),
      now < entry.refreshOn, Self.clockKept(entry.clockOffset, now: now, elapsed: elapsed),
      mayAnswer(app: app, target: entry.target)
    else { return nil }
    let second = Int64(now)
    if entry.lastUse.exchange(second, ordering: .relaxed) != second {
      uses.withLock { $0[entry.targetKey] = (entry.target, now) }
    }
    return entry
  }

  func publishMicrosoft(_ requestJSON: String, entry: MicrosoftEntry) {
    let size = requestJSON.utf8.count + entry.answer.utf8.count
    microsoft.withLock { table in
      if table.entries.count >= Self.maxEntries || table.bytes + size > Self.maxMicrosoftBytes {
        table = ([:], 0)
      }
      if let old = table.entries.updateValue(entry, forKey: requestJSON) {
        table.bytes -= requestJSON.utf8.count + old.answer.utf8.count
      }
      table.bytes += size
    }
  }

  /// Bytes held by the Microsoft table (for tests).
  var microsoftBytes: Int { microsoft.withLock { $0.bytes } }

  func clear() {
    // Every change to accounts, tokens or grants: what the full path allowed is decided again.
    forgetAllowed()
    entries.withLock { $0.removeAll() }
    microsoft.withLock { $0 = ([:], 0) }
  }

  func takeUses() -> [(SilentTarget, Double)] {
    uses.withLock { uses in
      defer { uses.removeAll() }
      return Array(uses.values)
    }
  }
}
