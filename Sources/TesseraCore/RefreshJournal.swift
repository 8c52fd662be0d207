import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// What tesserad notes before a refresh token goes to the identity provider, and forgets once the
/// answer is stored (issue 12). With refresh-token rotation, a daemon killed between the IdP's
/// rotation and the keyring write has lost the refresh token; the note survives the kill (a
/// file, no secret in it), so the next start checks that account first: with the IdP's grace
/// period the old token still works and nothing is lost; without, the account is reported as
/// needing a sign-in at once instead of at some later refresh.
public protocol RefreshJournal: Sendable {
  func begin(_ entry: RefreshJournalEntry)
  func end(_ entry: RefreshJournalEntry)
  /// The notes left by an earlier run (refreshes that never ended).
  func pending() -> [RefreshJournalEntry]
}

/// A refresh in flight: enough to run it again, no token.
public struct RefreshJournalEntry: Codable, Sendable, Hashable {
  public var accountID: String
  public var environment: String
  public var authority: String
  public var clientID: String
  public var scopes: [String]
  public var startedAt: Int64

  public init(
    accountID: String, environment: String, authority: String, clientID: String, scopes: [String], startedAt: Int64
  ) {
    self.accountID = accountID
    self.environment = environment
    self.authority = authority
    self.clientID = clientID
    self.scopes = scopes
    self.startedAt = startedAt
  }

  /// One note per account, environment, client and scope set (a file name's worth).
  public var key: String {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325  // FNV-1a, 64 bits: a name, not a secret
    for byte in "\(accountID)\u{0}\(environment)\u{0}\(clientID)\u{0}\(scopes.joined(separator: " "))".utf8 {
      hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3
    }
    let hex = String(hash, radix: 16)
    return String(repeating: "0", count: 16 - hex.count) + hex
  }

  public var encoded: [UInt8] {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    return Array((try? encoder.encode(self)) ?? Data())
  }

  public init?(decoding bytes: [UInt8]) {
    guard let entry = try? JSONDecoder().decode(Self.self, from: Data(bytes)) else { return nil }
    self = entry
  }
}

extension Broker {
  /// At start (and each maintenance pass until it worked): the refreshes an earlier run left in
  /// flight are run again first. Success: the IdP's grace period let the old token through (or
  /// the exchange had not happened). Refused: the account is reported as needing a sign-in now.
  func recoverInterruptedRefreshes() async {
    guard let journal = deps.journal else { return }
    let entries = journal.pending()
    guard !entries.isEmpty else { return }
    do { try await ensureLoaded() } catch {
      logger.notice(
        "Refreshes were in flight when tesserad last stopped; they are checked once \(storeSlot.storeDescription.name) answers",
        metadata: ["refreshes": "\(entries.count)", "error": "\(TesseraError.wrap(error))"])
      return
    }
    for entry in entries {
      guard let account = cache.accounts[entry.accountID], let authority = try? Authority(parsing: entry.authority)
      else {
        journal.end(entry)  // signed out since: nothing to check
        continue
      }
      let target = SilentTarget(
        account: account, authority: authority, realm: realm(for: authority, account: account),
        clientID: entry.clientID, scopes: entry.scopes)
      let correlationID = CorrelationID.new()
      logger.notice(
        "A refresh was in flight when tesserad last stopped; checking its refresh token first",
        metadata: [
          "account": "\(account.username)", "client_id": "\(entry.clientID)", "correlation_id": "\(correlationID)",
          "started_at": "\(entry.startedAt)",
        ])
      do {
        _ = try await refresh(target, claims: nil, correlationID: correlationID)
        logger.notice(
          "The interrupted refresh was redone; nothing was lost",
          metadata: ["account": "\(account.username)", "client_id": "\(entry.clientID)"])
        journal.end(entry)
      } catch let error as TesseraError where error.code == .interactionRequired {
        // refresh() noted the failure: the account is in AttentionNeeded, and the user is told.
        logger.warning(
          "The refresh token was lost with the interrupted refresh (the identity provider rotated it and has no grace period); the account needs a sign-in",
          metadata: ["account": "\(account.username)", "client_id": "\(entry.clientID)", "error": "\(error)"])
        journal.end(entry)
      } catch {
        // The network or the IdP is down: the note stays, and the next pass tries again.
        logger.notice(
          "Could not check the interrupted refresh yet; trying again later",
          metadata: ["account": "\(account.username)", "error": "\(TesseraError.wrap(error))"])
      }
    }
  }
}
