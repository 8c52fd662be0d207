/// What the broker knows of each account's health: the state `tessera status` shows, the last
/// error and when, and which accounts need the user (a sign-in) — the AttentionNeeded property and
/// the desktop notification. Pure: the broker feeds it every refresh's outcome with the time.
public enum AccountState: String, Sendable, CaseIterable {
  case ok
  /// A refresh token was refused (revoked, expired, consent or MFA needed): only a sign-in helps.
  case needsSignIn = "needs_sign_in"
  /// The Secret Service is locked or gone: tokens cannot be read or saved.
  case storeLocked = "store_locked"
  /// The identity provider could not be reached (or asked to wait).
  case idpUnreachable = "idp_unreachable"
}

/// A sign-in the user should do: for this account, in this app (the first app that found it needed).
public struct SignInNeed: Sendable, Equatable {
  public var accountID: String
  public var username: String
  public var clientID: String
  public var scopes: [String]
  public var authority: String
}

struct AccountHealth {
  struct Entry {
    var state: AccountState = .ok
    var lastError: TesseraError?
    var lastErrorAt: Date?
    /// The apps that found a sign-in needed, by client id (merged: one notification per account).
    var needs: [String: SignInNeed] = [:]
    /// When the user was last told (a notification), to not tell again at once after a flap.
    var notifiedAt: Date?
  }

  /// A notification is not repeated for the same account within this many seconds, even when the
  /// need went away and came back.
  static let renotifyAfter: Double = 600

  private(set) var entries: [String: Entry] = [:]

  func entry(_ accountID: String) -> Entry { entries[accountID] ?? Entry() }

  /// The accounts that need a sign-in, sorted.
  var attentionNeeded: [String] { entries.filter { !$0.value.needs.isEmpty }.map(\.key).sorted() }

  /// A token came for the account in this app: it is healthy, and this app no longer needs a
  /// sign-in. Returns whether the account stopped needing attention.
  mutating func succeeded(accountID: String, clientID: String) -> Bool {
    guard var entry = entries[accountID] else { return false }
    let needed = !entry.needs.isEmpty
    entry.needs[clientID] = nil
    entry.state = entry.needs.isEmpty ? .ok : .needsSignIn
    entries[accountID] = entry
    return needed && entry.needs.isEmpty
  }

  struct Change {
    /// The set of accounts needing attention changed.
    var attentionChanged = false
    /// Tell the user (a notification): the account just started needing a sign-in.
    var notify: SignInNeed?
  }

  /// A refresh for the account failed with `error` at `now`.
  mutating func failed(_ need: SignInNeed, error: TesseraError, now: Date) -> Change {
    var entry = entries[need.accountID] ?? Entry()
    entry.lastError = error
    entry.lastErrorAt = now
    var change = Change()
    switch error.code {
    case .interactionRequired:
      let wasNeeded = !entry.needs.isEmpty
      entry.needs[need.clientID] = need
      entry.state = .needsSignIn
      if !wasNeeded {
        change.attentionChanged = true
        if entry.notifiedAt.map({ now.timeIntervalSince($0) >= Self.renotifyAfter }) ?? true {
          entry.notifiedAt = now
          change.notify = need
        }
      }
    case .storeUnavailable:
      if entry.needs.isEmpty { entry.state = .storeLocked }
    case .network, .timedOut:
      if entry.needs.isEmpty { entry.state = .idpUnreachable }
    default:
      break  // recorded as the last error; the state says what the user can act on
    }
    entries[need.accountID] = entry
    return change
  }

  /// The account was signed out: nothing is kept. Returns whether it needed attention.
  mutating func forget(_ accountID: String) -> Bool {
    entries.removeValue(forKey: accountID).map { !$0.needs.isEmpty } ?? false
  }

  /// The need to show when the user acts on a notification for the account.
  func need(for accountID: String) -> SignInNeed? {
    entries[accountID]?.needs.values.sorted { $0.clientID < $1.clientID }.first
  }
}
