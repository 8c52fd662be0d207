import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

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
  /// What needs a sign-in: an app, at an authority, for a set of scopes (a step-up or consent for
  /// some scopes is not answered by a token for others).
  struct NeedKey: Hashable {
    var clientID: String
    var authority: String
    var scopes: [String]

    init(_ need: SignInNeed) {
      self.init(clientID: need.clientID, authority: need.authority, scopes: need.scopes)
    }

    init(clientID: String, authority: String, scopes: [String]) {
      self.clientID = clientID
      self.authority = authority
      self.scopes = Array(Set(scopes.map { $0.lowercased() })).sorted()
    }
  }

  struct Entry {
    var state: AccountState = .ok
    var lastError: TesseraError?
    var lastErrorAt: Date?
    /// The apps that found a sign-in needed (merged: one notification per account).
    var needs: [NeedKey: SignInNeed] = [:]
    /// When the user was last told (a notification), to not tell again at once after a flap.
    var notifiedAt: Date?
    /// Whether the user was told of the current need (it started, and nothing cleared it since).
    var toldOfThisNeed = false
  }

  /// A notification is not repeated for the same account within this many seconds; a need that
  /// comes back sooner is told at its next failure after that.
  static let renotifyAfter: Double = 600

  private(set) var entries: [String: Entry] = [:]

  func entry(_ accountID: String) -> Entry { entries[accountID] ?? Entry() }

  /// The accounts that need a sign-in, sorted.
  var attentionNeeded: [String] { entries.filter { !$0.value.needs.isEmpty }.map(\.key).sorted() }

  /// A token came for the account. A refresh answers the need of exactly that app, authority and
  /// scopes; an interactive sign-in (a new refresh token) answers every need of that app, and of
  /// the apps of its family (`sharing`), which use the same refresh token. Returns whether the
  /// account stopped needing attention.
  mutating func succeeded(
    accountID: String, key: NeedKey, interactive: Bool, sharing: Set<String> = []
  ) -> Bool {
    guard var entry = entries[accountID] else { return false }
    let needed = !entry.needs.isEmpty
    entry.needs[key] = nil
    if interactive {
      entry.needs = entry.needs.filter { $0.key.clientID != key.clientID && !sharing.contains($0.key.clientID) }
    }
    if entry.needs.isEmpty {
      entry.state = .ok
      entry.toldOfThisNeed = false
    } else {
      entry.state = .needsSignIn
    }
    entries[accountID] = entry
    return needed && entry.needs.isEmpty
  }

  struct Change {
    /// The set of accounts needing attention changed.
    var attentionChanged = false
    /// Tell the user (a notification): the account needs a sign-in and was not told yet.
    var notify: SignInNeed?
  }

  /// A refresh for the account failed with `error` at `now`. Only an InteractionRequired from the
  /// identity provider should come here as such (the broker filters the app-never-signed-in case).
  mutating func failed(_ need: SignInNeed, error: TesseraError, now: Date) -> Change {
    var entry = entries[need.accountID] ?? Entry()
    entry.lastError = error
    entry.lastErrorAt = now
    var change = Change()
    switch error.code {
    case .interactionRequired:
      change.attentionChanged = entry.needs.isEmpty
      entry.needs[NeedKey(need)] = need
      entry.state = .needsSignIn
      if !entry.toldOfThisNeed, entry.notifiedAt.map({ now.timeIntervalSince($0) >= Self.renotifyAfter }) ?? true {
        entry.toldOfThisNeed = true
        entry.notifiedAt = now
        change.notify = need
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

  /// The need to act on when the user clicks a notification for the account.
  func need(for accountID: String) -> SignInNeed? {
    entries[accountID]?.needs.values.sorted {
      ($0.clientID, $0.scopes.joined(separator: " ")) < ($1.clientID, $1.scopes.joined(separator: " "))
    }.first
  }
}
