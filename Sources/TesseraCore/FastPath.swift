import Synchronization
import TesseraInterface

/// Silent answers the bus thread can give by itself, without a hop to the token actor.
///
/// The actor stays the owner of all token state. After it answers a silent request from a fresh
/// token, the front that asked publishes its reply (encoded its own way) under its key for the
/// request as the caller wrote it, for as long as the token stays fresh. The bus thread asks the
/// front, the front looks its key up here, and one check for every front decides whether the
/// published reply may still be given (fresh enough for the margin asked, before its refresh time,
/// the wall clock not set since, the app allowed); anything else takes the full path. Any change to
/// accounts, tokens or grants clears every front's replies.
public final class SilentFastPath: Sendable {
  /// org.tessera.Broker1's replies, keyed by AcquireTokenSilent's arguments: the a{sv} without its
  /// correlation id, which differs per call.
  let tessera = PublishedReplies<TesseraFront.Key, ReplyTemplate>(maxBytes: nil)
  /// com.microsoft.identity.broker1's answers, keyed by the exact requestJson text: the whole JSON
  /// (it carries no correlation id). requestJson texts are the caller's (up to 64 KiB each), so
  /// this table is bounded by bytes, not only by count.
  let microsoft = PublishedReplies<String, MicrosoftFront.Published>(maxBytes: maxMicrosoftBytes)
  static let maxEntries = 4096
  static let maxMicrosoftBytes = 4 << 20

  /// Fast-path answers since the actor last looked: what was used, and when (for refresh-ahead).
  private let uses = Locked<[SilentTarget.Key: (SilentTarget, Double)]>([:])

  public init() {}

  /// The published reply for `key` if it may be given now, its use recorded; nil when the full
  /// path must answer. `minValidity` is the caller's (nil: the default margin); `app` the caller's
  /// AppIdentity key: only an app the full path allowed is answered here.
  func serve<Key, Reply>(
    _ key: Key, from table: PublishedReplies<Key, Reply>, minValidity: UInt32? = nil, now: Double,
    elapsed: Double? = nil, app: String? = nil
  ) -> PublishedReply<Reply>? {
    guard let entry = table.entry(key),
      entry.expiresOn - now >= TokenLifetimes.servingMargin(minValidity, lifetime: entry.lifetime),
      now < entry.refreshOn, Self.clockKept(entry.clockOffset, now: now, elapsed: elapsed),
      mayAnswer(app: app, target: entry.target)
    else { return nil }
    let second = Int64(now)
    if entry.lastUse.exchange(second, ordering: .relaxed) != second {
      uses.withLock { $0[entry.targetKey] = (entry.target, now) }
    }
    return entry
  }

  /// Has the wall clock kept pace with elapsed time since an entry was published (within
  /// Broker.clockJumpThreshold)? Unknown counts as yes.
  static func clockKept(_ offset: Double?, now: Double, elapsed: Double?) -> Bool {
    guard let offset, let elapsed else { return true }
    return abs(now - elapsed - offset) <= Broker.clockJumpThreshold
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
  private let allowed = Locked<Set<AllowKey>>([])
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

  /// Bytes held by the Microsoft table (for tests).
  var microsoftBytes: Int { microsoft.bytes }

  func clear() {
    // Every change to accounts, tokens or grants: what the full path allowed is decided again.
    forgetAllowed()
    tessera.clear()
    microsoft.clear()
  }

  func takeUses() -> [(SilentTarget, Double)] {
    uses.withLock { uses in
      defer { uses.removeAll() }
      return Array(uses.values)
    }
  }
}

/// A reply a front published for one cached token, with what decides whether it may still be given.
final class PublishedReply<Reply: Sendable>: Sendable {
  let reply: Reply
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
  /// Bytes it holds, for a table bounded by bytes.
  let size: Int

  init(reply: Reply, token: AccessTokenRecord, target: SilentTarget, clockOffset: Double?, size: Int = 0) {
    self.reply = reply
    self.clockOffset = clockOffset
    expiresOn = Double(token.expiresOn)
    refreshOn = Double(token.refreshOn ?? token.expiresOn)
    lifetime = token.cachedAt.map { token.expiresOn - $0 }
    self.target = target
    targetKey = target.key
    self.size = size
  }
}

/// One front's published replies: at most `SilentFastPath.maxEntries`, and at most `maxBytes`
/// when set (past either the table starts again empty: the full path refills it).
final class PublishedReplies<Key: Hashable & Sendable, Reply: Sendable>: Sendable {
  private let table = Locked<(entries: [Key: PublishedReply<Reply>], bytes: Int)>(([:], 0))
  let maxBytes: Int?

  init(maxBytes: Int?) { self.maxBytes = maxBytes }

  func entry(_ key: Key) -> PublishedReply<Reply>? { table.withLock { $0.entries[key] } }

  func publish(_ key: Key, _ entry: PublishedReply<Reply>) {
    table.withLock { table in
      if table.entries.count >= SilentFastPath.maxEntries || maxBytes.map({ table.bytes + entry.size > $0 }) == true {
        table = ([:], 0)
      }
      if let old = table.entries.updateValue(entry, forKey: key) { table.bytes -= old.size }
      table.bytes += entry.size
    }
  }

  func clear() { table.withLock { $0 = ([:], 0) } }

  var bytes: Int { table.withLock { $0.bytes } }
}
