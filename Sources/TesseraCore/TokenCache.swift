import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// The broker's accounts and tokens in memory, and their mapping to Secret Service items
/// (schema documented in docs/storage.md).
public struct TokenCache: Sendable {
  public static let schemaVersion = "1"

  public private(set) var accounts: [String: Account] = [:]
  public private(set) var refreshTokens: [RefreshTokenRecord] = []
  public private(set) var accessTokens: [AccessTokenRecord] = []

  /// The wall clock was set by `delta` seconds: access tokens' times (and refresh tokens' own
  /// lapse) move with it, so each keeps
  /// the real time it has left (their expiry was counted on the clock before it was set). Returns
  /// the writes that keep the keyring's copies in step.
  public mutating func clockSet(by delta: Double) -> [StoreOperation] {
    let shift = Int64(delta.rounded())
    for index in accessTokens.indices where !TokenExpiry.isNever(accessTokens[index].expiresOn) {
      accessTokens[index].expiresOn += shift
      accessTokens[index].refreshOn = accessTokens[index].refreshOn.map { $0 + shift }
      accessTokens[index].extExpiresOn = accessTokens[index].extExpiresOn.map { $0 + shift }
      accessTokens[index].cachedAt = accessTokens[index].cachedAt.map { $0 + shift }
    }
    // A refresh token's own lapse was counted from this clock too (refresh_token_expires_in).
    var lapsing: [StoreOperation] = []
    for index in refreshTokens.indices where refreshTokens[index].expiresOn != nil {
      refreshTokens[index].expiresOn! += shift
      lapsing.append(.save(Self.item(refreshTokens[index])))
    }
    return accessTokens.map { .save(Self.item($0)) } + lapsing
  }
  /// A client id at one identity provider.
  public struct AppKey: Hashable, Sendable {
    public var environment: String
    public var clientID: String
  }
  public private(set) var appMetadata: [AppKey: AppMetadataRecord] = [:]
  /// Which app may use which client and account (issue 11).
  public private(set) var grants: [AccessGrant] = []
  /// Which app has used which account (for the first-use notification), as "APP\0ACCOUNT_ID".
  public private(set) var uses: Set<String> = []
  /// The account choices the user asked to keep (the chooser's Always): app and authority to the
  /// account id.
  public private(set) var choices: [String: String] = [:]
  /// The accounts the user made current (`tessera account use`): at most one per identity
  /// provider (environment). A request that names no account gets it when several are signed in.
  public private(set) var currentAccounts: Set<String> = []
  /// The DPoP keys tokens are bound to, by thumbprint (docs/dpop.md).
  public private(set) var proofKeys: [String: ProofKeyRecord] = [:]

  public init() {}

  enum Kind: String {
    case account
    case refreshToken = "refresh_token"
    case accessToken = "access_token"
    case appMetadata = "app_metadata"
    case grant = "access_grant"
    case use = "app_use"
    case current = "current_account"
    case choice = "account_choice"
    case proofKey = "dpop_key"
  }

  // MARK: Lookups

  /// The refresh token a client should use for `scopes`: its own, else its family's (when it is in
  /// a family, or not yet known not to be). Of a client's scope-bound tokens, the narrowest grant
  /// that covers the scopes; else one stored without scopes; else the broadest (the IdP decides).
  public func refreshToken(accountID: String, environment: String, clientID: String, scopes: [String] = [])
    -> RefreshTokenRecord?
  {
    let own = refreshTokens.filter {
      $0.accountID == accountID && $0.environment == environment && $0.slot == clientID
    }
    let wanted = ScopeSet.resourceScopes(scopes)
    if let covering = own.filter({ $0.scopes.map { wanted.isSubset(of: Set($0)) } ?? false })
      .min(by: { $0.scopes!.count < $1.scopes!.count })
    {
      return covering
    }
    if let unscoped = own.first(where: { $0.scopes == nil }) { return unscoped }
    if let broadest = own.max(by: { ($0.scopes?.count ?? 0) < ($1.scopes?.count ?? 0) }) { return broadest }
    let metadata = appMetadata(environment: environment, clientID: clientID)
    if let metadata, metadata.familyID == nil { return nil }
    if metadata?.signedOutAccounts?.contains(accountID) == true { return nil }
    return refreshTokens.first {
      $0.accountID == accountID && $0.environment == environment && $0.familyID != nil
        && (metadata == nil || $0.familyID == metadata?.familyID)
    }
  }

  public func refreshToken(accountID: String, environment: String, slot: String) -> RefreshTokenRecord? {
    refreshTokens.first { $0.accountID == accountID && $0.environment == environment && $0.slot == slot }
  }

  public func appMetadata(environment: String, clientID: String) -> AppMetadataRecord? {
    appMetadata[AppKey(environment: environment, clientID: clientID)]
  }

  /// The longest-lived access token that matches and covers `scopes`.
  public func accessToken(
    accountID: String, environment: String, realm: String?, clientID: String, scopes: [String]
  ) -> AccessTokenRecord? {
    accessTokens.filter {
      $0.accountID == accountID && $0.environment == environment && $0.clientID == clientID
        && (realm == nil || $0.realm.lowercased() == realm?.lowercased())
        && ScopeSet.covers(granted: $0.scopes, requested: scopes)
    }.max { $0.expiresOn < $1.expiresOn }
  }

  // MARK: Changes. Each returns the store operations that make the Secret Service match.

  public enum StoreOperation: Sendable, Equatable {
    case save(StoredItem)
    case delete([String: String])
  }

  /// Adds (or renews) a grant; one item per app, client and account.
  public mutating func upsert(grant: AccessGrant) -> [StoreOperation] {
    grants.removeAll { $0.app == grant.app && $0.clientID == grant.clientID && $0.accountID == grant.accountID }
    grants.append(grant)
    return [.save(Self.item(grant))]
  }

  /// Notes that `app` has used `accountID`; nil when it had before.
  public mutating func noteUse(app: String, accountID: String, at: Int64) -> [StoreOperation]? {
    guard uses.insert(Self.useKey(app: app, accountID: accountID)).inserted else { return nil }
    return [.save(Self.item(.use(AppUseRecord(app: app, accountID: accountID, firstUsedAt: at))))]
  }

  /// Keeps the chooser's answer for an app at an authority (one item per app and authority: a
  /// new choice replaces the one before).
  public mutating func remember(choice: AccountChoiceRecord) -> [StoreOperation] {
    let key = Self.choiceKey(app: choice.app, authority: choice.authority)
    var operations: [StoreOperation] = []
    if let old = choices[key], old != choice.accountID {
      operations.append(.delete(Self.choiceAttributes(app: choice.app, authority: choice.authority, accountID: old)))
    }
    choices[key] = choice.accountID
    return operations + [.save(Self.item(.choice(choice)))]
  }

  /// Forgets `app`'s kept choices (those naming `accountID`, or all): revoking an app's access
  /// takes its standing choice of account with it.
  public mutating func forgetChoices(app: String, accountID: String?) -> [StoreOperation] {
    var operations: [StoreOperation] = []
    for (key, chosen) in choices where key.hasPrefix(app + "\u{0}") && (accountID == nil || chosen == accountID) {
      choices[key] = nil
      let authority = String(key.dropFirst(app.count + 1))
      operations.append(.delete(Self.choiceAttributes(app: app, authority: authority, accountID: chosen)))
    }
    return operations
  }

  /// The account the user chose for `app` at `authority`, when it is still signed in.
  public func chosenAccount(app: String, authority: String) -> String? {
    choices[Self.choiceKey(app: app, authority: authority)].flatMap { accounts[$0] == nil ? nil : $0 }
  }

  static func choiceKey(app: String, authority: String) -> String { "\(app)\u{0}\(authority)" }

  static func choiceAttributes(app: String, authority: String, accountID: String) -> [String: String] {
    [base: schemaVersion, "kind": Kind.choice.rawValue, "app": app, "authority": authority, "account_id": accountID]
  }

  static func proofKeyAttributes(_ k: ProofKeyRecord) -> [String: String] {
    [base: schemaVersion, "kind": Kind.proofKey.rawValue, "account_id": k.accountID, "jkt": k.thumbprint]
  }

  /// Keeps a DPoP key that tokens of its account are now bound to.
  public mutating func keep(proofKey: ProofKeyRecord) -> [StoreOperation] {
    guard proofKeys[proofKey.thumbprint] != proofKey else { return [] }
    proofKeys[proofKey.thumbprint] = proofKey
    return [.save(Self.item(.proofKey(proofKey)))]
  }

  /// Deletes the DPoP keys of `accountID` that no refresh or access token is bound to any more
  /// (a sign-in that brought a new key replaced the last token bound to the old one).
  public mutating func dropUnusedProofKeys(accountID: String) -> [StoreOperation] {
    let used = Set(refreshTokens.compactMap(\.proofKey) + accessTokens.compactMap(\.proofKey))
    var operations: [StoreOperation] = []
    for (thumbprint, key) in proofKeys where key.accountID == accountID && !used.contains(thumbprint) {
      proofKeys[thumbprint] = nil
      operations.append(.delete(Self.proofKeyAttributes(key)))
    }
    return operations
  }

  public func hasUsed(app: String, accountID: String) -> Bool {
    uses.contains(Self.useKey(app: app, accountID: accountID))
  }

  static func useKey(app: String, accountID: String) -> String { "\(app)\u{0}\(accountID)" }

  /// Makes `accountID` the current account of its identity provider (the one before it there is
  /// current no more); no store write when it already is.
  public mutating func makeCurrent(accountID: String) -> [StoreOperation] {
    guard let account = accounts[accountID] else { return [] }
    var operations: [StoreOperation] = []
    for other in currentAccounts
    where other != accountID && (accounts[other]?.environment ?? account.environment) == account.environment {
      currentAccounts.remove(other)
      operations.append(.delete(Self.currentAttributes(other)))
    }
    if currentAccounts.insert(accountID).inserted {
      operations.append(
        .save(Self.item(.current(CurrentAccountRecord(accountID: accountID), environment: account.environment))))
    }
    return operations
  }

  /// The current account among `candidates` (the accounts that could serve a request), if one is.
  public func current(among candidates: [Account]) -> Account? {
    let marked = candidates.filter { currentAccounts.contains($0.id) }
    return marked.count == 1 ? marked[0] : nil
  }

  static func currentAttributes(_ accountID: String) -> [String: String] {
    [base: schemaVersion, "kind": Kind.current.rawValue, "account_id": accountID]
  }

  /// Removes the grants `matching` selects.
  public mutating func removeGrants(where matching: (AccessGrant) -> Bool) -> [StoreOperation] {
    let gone = grants.filter(matching)
    grants.removeAll(where: matching)
    return gone.map { .delete(Self.item(.grant($0)).attributes) }
  }

  public mutating func upsert(account: Account) -> [StoreOperation] {
    accounts[account.id] = account
    return [.save(Self.item(account))]
  }

  /// Stores a refresh token without ever making a stored grant worse:
  /// - `replacing`: the token a refresh redeemed; the new one (same grant, rotated) takes its place.
  /// - otherwise a new grant (a sign-in). Entra's tokens (no scopes) replace the client's or family's
  ///   token. A scope-bound token replaces only the client's tokens whose scopes it covers; a
  ///   narrower sign-in (one app asking for `write` only) keeps the broader grant beside it.
  public mutating func upsert(refreshToken record: RefreshTokenRecord, replacing old: RefreshTokenRecord? = nil)
    -> [StoreOperation]
  {
    var operations: [StoreOperation] = []
    refreshTokens.removeAll { existing in
      let replaced: Bool
      if let old {
        // (A family token redeemed for a token of the client's own stays for the family.)
        replaced = existing.isSameGrant(as: record) || (existing.isSameGrant(as: old) && old.slot == record.slot)
      } else if let newScopes = record.scopes {
        replaced =
          existing.accountID == record.accountID && existing.environment == record.environment
          && existing.slot == record.slot && existing.scopes.map { Set($0).isSubset(of: Set(newScopes)) } ?? false
      } else {
        replaced =
          existing.accountID == record.accountID && existing.environment == record.environment
          && existing.slot == record.slot && existing.scopes == nil
      }
      // An item with the very same attributes is replaced by the save below: no delete needed.
      if replaced && Self.attributes(existing) != Self.attributes(record) {
        operations.append(.delete(Self.attributes(existing)))
      }
      return replaced
    }
    refreshTokens.append(record)
    operations.append(.save(Self.item(record)))
    return operations
  }

  /// Records whether a client is in a family; no store write when nothing changed.
  public mutating func upsert(appMetadata record: AppMetadataRecord) -> [StoreOperation] {
    let key = AppKey(environment: record.environment, clientID: record.clientID)
    guard appMetadata[key] != record else { return [] }
    appMetadata[key] = record
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
      // An item with the very same attributes is replaced by the save below: no delete needed.
      if replaced && Self.attributes(old) != Self.attributes(record) {
        operations.append(.delete(Self.attributes(old)))
      }
      return replaced
    }
    accessTokens.append(record)
    operations.append(.save(Self.item(record)))
    return operations
  }

  /// Removes the cached access tokens of one account and client whose value is `secret`: a
  /// resource refused that token, so it is not served again. Returns the deletes (none when no
  /// cached token has that value).
  public mutating func removeAccessTokens(
    accountID: String, environment: String, clientID: String, secret: String
  ) -> [StoreOperation] {
    var operations: [StoreOperation] = []
    accessTokens.removeAll { record in
      let rejected =
        record.accountID == accountID && record.environment == environment && record.clientID == clientID
        && record.secret == secret
      if rejected { operations.append(.delete(Self.attributes(record))) }
      return rejected
    }
    return operations
  }

  /// Removes an account's tokens (one client's when `clientID` is given), and the account itself otherwise.
  public mutating func remove(accountID: String, clientID: String?) -> [StoreOperation] {
    // With a client id: that client's own refresh token; a family token stays for the other apps.
    refreshTokens.removeAll { $0.accountID == accountID && (clientID == nil || $0.slot == clientID) }
    accessTokens.removeAll { $0.accountID == accountID && (clientID == nil || $0.clientID == clientID) }
    var match = [Self.base: Self.schemaVersion, "account_id": accountID]
    if let clientID {
      match["client_id"] = clientID
      var operations: [StoreOperation] = [
        .delete(match.merging(["kind": Kind.refreshToken.rawValue]) { $1 }),
        .delete(match.merging(["kind": Kind.accessToken.rawValue]) { $1 }),
      ]
      // The apps' grants for this client and account go too: signing in again grants anew.
      operations += removeGrants { $0.accountID == accountID && $0.clientID == clientID }
      // The key of that client's sign-in, unless another token of the account is bound to it.
      operations += dropUnusedProofKeys(accountID: accountID)
      // The family's token still serves the other apps: this one is told not to use it.
      if let environment = accounts[accountID]?.environment,
        let family = refreshToken(accountID: accountID, environment: environment, clientID: clientID)
      {
        var record =
          appMetadata(environment: environment, clientID: clientID)
          ?? AppMetadataRecord(environment: environment, clientID: clientID, familyID: family.familyID)
        record.signedOutAccounts = (record.signedOutAccounts ?? []) + [accountID]
        operations += upsert(appMetadata: record)
      }
      return operations
    }
    // Signed out everywhere: no client keeps a note about the account.
    var operations: [StoreOperation] = []
    for (key, var record) in appMetadata where record.signedOutAccounts?.contains(accountID) == true {
      record.signedOutAccounts = record.signedOutAccounts?.filter { $0 != accountID }
      if record.signedOutAccounts?.isEmpty == true { record.signedOutAccounts = nil }
      appMetadata[key] = record
      operations.append(.save(Self.item(record)))
    }
    accounts[accountID] = nil
    currentAccounts.remove(accountID)  // its item carries its account_id: the delete below takes it
    // Its grants go with it (their items carry its account_id, so the delete below takes them).
    grants.removeAll { $0.accountID == accountID }
    uses = uses.filter { !$0.hasSuffix("\u{0}\(accountID)") }
    // The choices that named it (their items carry its account_id too).
    choices = choices.filter { $0.value != accountID }
    // Its DPoP keys (their items carry its account_id too): its tokens are worthless anywhere now.
    proofKeys = proofKeys.filter { $0.value.accountID != accountID }
    // The account item goes first: a kill after it leaves items without their account, which the
    // next start removes (the sign-out is finished), never an account missing its tokens.
    let accountItem = [Self.base: Self.schemaVersion, "kind": Kind.account.rawValue, "account_id": accountID]
    guard accounts.isEmpty, !appMetadata.isEmpty else { return [.delete(accountItem)] + operations + [.delete(match)] }
    // The last account is gone: what was learned about clients goes too, leaving no Tessera item.
    appMetadata.removeAll()
    return [
      .delete(accountItem), .delete(match),
      .delete([Self.base: Self.schemaVersion, "kind": Kind.appMetadata.rawValue]),
    ]
  }

  /// Drops the items of accounts that are not stored (an interrupted sign-out, or a sign-in
  /// killed between its refresh token and its account); returns those account ids and the
  /// refresh tokens dropped (to be revoked).
  public mutating func removeOrphans() -> (accountIDs: Set<String>, refreshTokens: [RefreshTokenRecord]) {
    var gone = Set<String>()
    for id in refreshTokens.map(\.accountID) + accessTokens.map(\.accountID) where accounts[id] == nil {
      gone.insert(id)
    }
    for grant in grants where grant.accountID != AccessGrant.anyAccount && accounts[grant.accountID] == nil {
      gone.insert(grant.accountID)
    }
    for id in currentAccounts where accounts[id] == nil { gone.insert(id) }
    for key in proofKeys.values where accounts[key.accountID] == nil { gone.insert(key.accountID) }
    for use in uses {
      if let id = use.split(separator: "\u{0}", omittingEmptySubsequences: false).last.map(String.init),
        accounts[id] == nil
      {
        gone.insert(id)
      }
    }
    guard !gone.isEmpty else { return ([], []) }
    let dropped = refreshTokens.filter { gone.contains($0.accountID) }
    refreshTokens.removeAll { gone.contains($0.accountID) }
    accessTokens.removeAll { gone.contains($0.accountID) }
    grants.removeAll { gone.contains($0.accountID) }
    uses = uses.filter { use in !gone.contains { use.hasSuffix("\u{0}\($0)") } }
    currentAccounts.subtract(gone)
    proofKeys = proofKeys.filter { !gone.contains($0.value.accountID) }
    return (gone, dropped)
  }

  /// Puts back what `remove(accountID:clientID:)` took of one account (a sign-out the store refused).
  public mutating func restore(from before: TokenCache, accountID: String) {
    if let account = before.accounts[accountID] { accounts[accountID] = account }
    for record in before.refreshTokens where record.accountID == accountID {
      if !refreshTokens.contains(where: { $0.isSameGrant(as: record) }) { refreshTokens.append(record) }
    }
    for token in before.accessTokens where token.accountID == accountID && !accessTokens.contains(token) {
      accessTokens.append(token)
    }
    for grant in before.grants where grant.accountID == accountID && !grants.contains(grant) { grants.append(grant) }
    uses.formUnion(before.uses.filter { $0.hasSuffix("\u{0}\(accountID)") })
    if before.currentAccounts.contains(accountID) { currentAccounts.insert(accountID) }
    for (thumbprint, key) in before.proofKeys where key.accountID == accountID { proofKeys[thumbprint] = key }
    // What the sign-out noted about clients goes back to what it was.
    appMetadata.merge(before.appMetadata) { _, old in old }
  }

  // MARK: Stored items

  static let base = "tessera_schema"
  /// The `kind` attribute of every item type, for stores that load by kind.
  public static let itemKinds = [
    Kind.account.rawValue, Kind.refreshToken.rawValue, Kind.accessToken.rawValue, Kind.appMetadata.rawValue,
    Kind.grant.rawValue, Kind.use.rawValue, Kind.current.rawValue, Kind.choice.rawValue, Kind.proofKey.rawValue,
  ]
  /// Attributes every Tessera item carries; deleting by these removes everything Tessera stored.
  public static let allItemsAttributes = [base: schemaVersion]

  // One schema: each kind's attributes (its identity in a store), label and secret are written
  // here alone, and read back by `record(_:)` alone. The cache writes with it, a load reads with
  // it, and a store move rebuilds items with it (the file store names a record by a keyed hash of
  // its attributes, so two copies that drifted would double records at a move).

  /// What one stored item holds.
  enum Record {
    case account(Account)
    case refreshToken(RefreshTokenRecord)
    case accessToken(AccessTokenRecord)
    case appMetadata(AppMetadataRecord)
    case grant(AccessGrant)
    case use(AppUseRecord)
    /// The current account; `environment` (its identity provider's host) names it in the label.
    case current(CurrentAccountRecord, environment: String?)
    case choice(AccountChoiceRecord)
    case proofKey(ProofKeyRecord)
  }

  /// The item a record is stored as.
  static func item(_ record: Record) -> StoredItem {
    switch record {
    case .account(let a):
      StoredItem(
        attributes: [
          base: schemaVersion, "kind": Kind.account.rawValue, "account_id": a.id, "environment": a.environment,
        ],
        secret: json(a), label: "Tessera account \(a.username) (\(a.environment))")
    case .refreshToken(let r):
      StoredItem(
        attributes: attributes(r), secret: json(r), label: "Tessera refresh token for \(r.slot) (\(r.environment))")
    case .accessToken(let t):
      StoredItem(
        attributes: attributes(t), secret: json(t), label: "Tessera access token for \(t.clientID) (\(t.environment))")
    case .appMetadata(let m):
      StoredItem(
        attributes: [
          base: schemaVersion, "kind": Kind.appMetadata.rawValue, "environment": m.environment, "client_id": m.clientID,
        ],
        secret: json(m), label: "Tessera app metadata for \(m.clientID) (\(m.environment))")
    case .grant(let g):
      StoredItem(
        attributes: [
          base: schemaVersion, "kind": Kind.grant.rawValue, "app": g.app, "client_id": g.clientID,
          "account_id": g.accountID,
        ], secret: json(g), label: "Tessera: \(g.app) may use \(g.clientID)")
    case .use(let u):
      StoredItem(
        attributes: [base: schemaVersion, "kind": Kind.use.rawValue, "app": u.app, "account_id": u.accountID],
        secret: json(u), label: "Tessera: \(u.app) has used an account")
    case .current(let c, let environment):
      StoredItem(
        attributes: currentAttributes(c.accountID), secret: json(c),
        label: "Tessera: the current account at \(environment ?? "its identity provider")")
    case .choice(let c):
      StoredItem(
        attributes: choiceAttributes(app: c.app, authority: c.authority, accountID: c.accountID), secret: json(c),
        label: "Tessera: the account \(c.app) uses")
    case .proofKey(let k):
      StoredItem(
        attributes: proofKeyAttributes(k), secret: json(k),
        label: "Tessera: the key \(k.kind == .tpm ? "in this machine's TPM " : "")this machine's tokens are bound to")
    }
  }

  /// The record an item holds; nil for an item of another schema version, of a kind this
  /// version does not know, or whose secret does not decode.
  static func record(_ item: StoredItem) -> Record? {
    guard item.attributes[base] == schemaVersion, let kind = item.attributes["kind"].flatMap(Kind.init(rawValue:))
    else { return nil }
    let data = Data(item.secret.utf8)
    let decoder = JSONDecoder()
    func decode<T: Decodable>(_ type: T.Type) -> T? { try? decoder.decode(type, from: data) }
    return switch kind {
    case .account: decode(Account.self).map(Record.account)
    case .refreshToken: decode(RefreshTokenRecord.self).map(Record.refreshToken)
    case .accessToken: decode(AccessTokenRecord.self).map(Record.accessToken)
    case .appMetadata: decode(AppMetadataRecord.self).map(Record.appMetadata)
    case .grant: decode(AccessGrant.self).map(Record.grant)
    case .use: decode(AppUseRecord.self).map(Record.use)
    case .current: decode(CurrentAccountRecord.self).map { Record.current($0, environment: nil) }
    case .choice: decode(AccountChoiceRecord.self).map(Record.choice)
    case .proofKey: decode(ProofKeyRecord.self).map(Record.proofKey)
    }
  }

  /// The attributes that tell refresh tokens apart (their identity in a store).
  static func attributes(_ r: RefreshTokenRecord) -> [String: String] {
    var attributes = [
      base: schemaVersion, "kind": Kind.refreshToken.rawValue, "account_id": r.accountID, "environment": r.environment,
      "client_id": r.slot,
    ]
    // Scope-bound grants of one client are items of their own.
    if let scopes = r.scopes { attributes["scopes"] = scopes.joined(separator: " ") }
    return attributes
  }
  /// The attributes that tell access tokens apart.
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

  static func item(_ a: Account) -> StoredItem { item(.account(a)) }
  static func item(_ r: RefreshTokenRecord) -> StoredItem { item(.refreshToken(r)) }
  static func item(_ m: AppMetadataRecord) -> StoredItem { item(.appMetadata(m)) }
  static func item(_ t: AccessTokenRecord) -> StoredItem { item(.accessToken(t)) }
  static func item(_ g: AccessGrant) -> StoredItem { item(.grant(g)) }

  /// Rebuilds the cache from stored items; items of other schema versions or unreadable ones are skipped
  /// (and counted, so the caller can log them).
  public static func load(_ items: [StoredItem]) -> (TokenCache, skipped: Int) {
    var cache = TokenCache()
    var skipped = 0
    for item in items {
      switch record(item) {
      case nil: skipped += 1
      case .account(let a)?: cache.accounts[a.id] = a
      case .refreshToken(let r)?: cache.refreshTokens.append(r)
      case .appMetadata(let m)?: cache.appMetadata[AppKey(environment: m.environment, clientID: m.clientID)] = m
      case .accessToken(let t)?: cache.accessTokens.append(t)
      case .grant(let g)?: cache.grants.append(g)
      case .current(let c, _)?: cache.currentAccounts.insert(c.accountID)
      case .use(let u)?: cache.uses.insert(useKey(app: u.app, accountID: u.accountID))
      case .choice(let c)?: cache.choices[choiceKey(app: c.app, authority: c.authority)] = c.accountID
      case .proofKey(let k)?: cache.proofKeys[k.thumbprint] = k
      }
    }
    return (cache, skipped)
  }
}

/// The account the user chose for an app at an authority, to be used from then on (the
/// chooser's Always).
public struct AccountChoiceRecord: Codable, Sendable, Hashable {
  public var app: String
  public var authority: String
  public var accountID: String
  public var chosenAt: Int64
}

/// That an app has used an account, and since when (the first-use notification's memory).
public struct AppUseRecord: Codable, Sendable, Hashable {
  public var app: String
  public var accountID: String
  public var firstUsedAt: Int64
}

/// That the user made an account current (`tessera account use`).
public struct CurrentAccountRecord: Codable, Sendable, Hashable {
  public var accountID: String
}
