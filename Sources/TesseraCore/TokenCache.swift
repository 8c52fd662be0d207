/// The broker's accounts and tokens in memory, and their mapping to Secret Service items
/// (schema documented in docs/storage.md).
public struct TokenCache: Sendable {
  public static let schemaVersion = "1"

  public private(set) var accounts: [String: Account] = [:]
  public private(set) var refreshTokens: [RefreshTokenRecord] = []
  public private(set) var accessTokens: [AccessTokenRecord] = []

  public init() {}

  enum Kind: String {
    case account
    case refreshToken = "refresh_token"
    case accessToken = "access_token"
  }

  // MARK: Lookups

  public func refreshToken(accountID: String, environment: String, clientID: String) -> RefreshTokenRecord? {
    refreshTokens.first { $0.accountID == accountID && $0.environment == environment && $0.clientID == clientID }
  }

  /// The longest-lived access token that matches and covers `scopes`.
  public func accessToken(
    accountID: String, environment: String, realm: String?, clientID: String, scopes: [String]
  ) -> AccessTokenRecord? {
    accessTokens.filter {
      $0.accountID == accountID && $0.environment == environment && $0.clientID == clientID
        && (realm == nil || $0.realm == realm) && ScopeSet.covers(granted: $0.scopes, requested: scopes)
    }.max { $0.expiresOn < $1.expiresOn }
  }

  // MARK: Changes. Each returns the store operations that make the Secret Service match.

  public enum StoreOperation: Sendable, Equatable {
    case save(StoredItem)
    case delete([String: String])
  }

  public mutating func upsert(account: Account) -> [StoreOperation] {
    accounts[account.id] = account
    return [.save(Self.item(account))]
  }

  public mutating func upsert(refreshToken record: RefreshTokenRecord) -> [StoreOperation] {
    refreshTokens.removeAll {
      $0.accountID == record.accountID && $0.environment == record.environment && $0.clientID == record.clientID
    }
    refreshTokens.append(record)
    return [.save(Self.item(record))]
  }

  /// Adds an access token, replacing those of the same account/client/realm whose scopes overlap it.
  public mutating func insert(accessToken record: AccessTokenRecord) -> [StoreOperation] {
    let newScopes = ScopeSet.resourceScopes(record.scopes)
    var operations: [StoreOperation] = []
    accessTokens.removeAll { old in
      let replaced =
        old.accountID == record.accountID && old.environment == record.environment && old.clientID == record.clientID
        && old.realm == record.realm
        && (!ScopeSet.resourceScopes(old.scopes).isDisjoint(with: newScopes) || old.scopes == record.scopes)
      if replaced { operations.append(.delete(Self.attributes(old))) }
      return replaced
    }
    accessTokens.append(record)
    operations.append(.save(Self.item(record)))
    return operations
  }

  /// Removes an account's tokens (one client's when `clientID` is given), and the account itself otherwise.
  public mutating func remove(accountID: String, clientID: String?) -> [StoreOperation] {
    refreshTokens.removeAll { $0.accountID == accountID && (clientID == nil || $0.clientID == clientID) }
    accessTokens.removeAll { $0.accountID == accountID && (clientID == nil || $0.clientID == clientID) }
    var match = [Self.base: Self.schemaVersion, "account_id": accountID]
    if let clientID {
      match["client_id"] = clientID
      return [
        .delete(match.merging(["kind": Kind.refreshToken.rawValue]) { $1 }),
        .delete(match.merging(["kind": Kind.accessToken.rawValue]) { $1 }),
      ]
    }
    accounts[accountID] = nil
    return [.delete(match)]
  }

  // MARK: Secret Service items

  static let base = "tessera_schema"
  /// Attributes every Tessera item carries; deleting by these removes everything Tessera stored.
  public static let allItemsAttributes = [base: schemaVersion]

  static func attributes(_ a: Account) -> [String: String] {
    [base: schemaVersion, "kind": Kind.account.rawValue, "account_id": a.id, "environment": a.environment]
  }
  static func attributes(_ r: RefreshTokenRecord) -> [String: String] {
    [
      base: schemaVersion, "kind": Kind.refreshToken.rawValue, "account_id": r.accountID, "environment": r.environment,
      "client_id": r.clientID,
    ]
  }
  static func attributes(_ t: AccessTokenRecord) -> [String: String] {
    [
      base: schemaVersion, "kind": Kind.accessToken.rawValue, "account_id": t.accountID, "environment": t.environment,
      "realm": t.realm, "client_id": t.clientID, "scopes": t.scopes.joined(separator: " "),
    ]
  }

  static func json(_ value: some Encodable) -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    return String(decoding: (try? encoder.encode(value)) ?? Data(), as: UTF8.self)
  }

  static func item(_ a: Account) -> StoredItem {
    StoredItem(attributes: attributes(a), secret: json(a), label: "Tessera account \(a.username) (\(a.environment))")
  }
  static func item(_ r: RefreshTokenRecord) -> StoredItem {
    StoredItem(
      attributes: attributes(r), secret: json(r), label: "Tessera refresh token for \(r.clientID) (\(r.environment))")
  }
  static func item(_ t: AccessTokenRecord) -> StoredItem {
    StoredItem(
      attributes: attributes(t), secret: json(t), label: "Tessera access token for \(t.clientID) (\(t.environment))")
  }

  /// Rebuilds the cache from stored items; items of other schema versions or unreadable ones are skipped
  /// (and counted, so the caller can log them).
  public static func load(_ items: [StoredItem]) -> (TokenCache, skipped: Int) {
    var cache = TokenCache()
    var skipped = 0
    let decoder = JSONDecoder()
    for item in items {
      guard item.attributes[base] == schemaVersion, let kind = item.attributes["kind"].flatMap(Kind.init(rawValue:))
      else {
        skipped += 1
        continue
      }
      let data = Data(item.secret.utf8)
      switch kind {
      case .account:
        if let a = try? decoder.decode(Account.self, from: data) { cache.accounts[a.id] = a } else { skipped += 1 }
      case .refreshToken:
        if let r = try? decoder.decode(RefreshTokenRecord.self, from: data) {
          cache.refreshTokens.append(r)
        } else {
          skipped += 1
        }
      case .accessToken:
        if let t = try? decoder.decode(AccessTokenRecord.self, from: data) {
          cache.accessTokens.append(t)
        } else {
          skipped += 1
        }
      }
    }
    return (cache, skipped)
  }
}
