import Crypto
import Logging
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// Everything the broker needs from outside, so tests can pass fakes.
public struct BrokerDependencies: Sendable {
  public var http: any HTTPClient
  public var store: any SecretStore
  public var browser: any BrowserLauncher
  public var listeners: any RedirectListenerFactory
  public var events: any BrokerEvents
  public var clock: any BrokerClock
  /// Called after the store was loaded (the daemon returns the load's transient memory).
  public var afterLoad: @Sendable () -> Void = {}
  /// Asks the user about an app without a grant (access_mode "confirm"); nil: refuse instead.
  public var prompter: (any AccessPrompter)?
  /// Notes of refreshes in flight, which survive a kill (issue 12); nil: none kept.
  public var journal: (any RefreshJournal)?
  /// Opens the other store for a move (`tessera store migrate`); nil: stores cannot be moved.
  public var storeOpener: (any StoreOpener)?
  /// The note of a store move under way; nil: stores cannot be moved.
  public var moveJournal: (any StoreMoveJournal)?
  /// Forwards of the socket (`tessera forward`); nil: none can be made.
  public var forwards: (any ForwardListeners)?
  /// Providers' client secrets (`[[provider]]` client_secret_file); nil: none can be read.
  public var secrets: (any ClientSecretSource)?
  /// Where DPoP keys are made and used (a TPM, else software); nil: tokens are never bound.
  public var proofKeys: (any ProofKeySource)?
  /// How long a question waits in Tessera Accounts for a person's answer, on the wall clock (the
  /// injected clock stands for the IdP's and the tokens' time, which tests move at will).
  public var questionTimeout: Duration = .seconds(Int64(Question.seconds))

  public init(
    http: any HTTPClient, store: any SecretStore, browser: any BrowserLauncher, listeners: any RedirectListenerFactory,
    events: any BrokerEvents, clock: any BrokerClock,
    afterLoad: @escaping @Sendable () -> Void = {}, prompter: (any AccessPrompter)? = nil,
    journal: (any RefreshJournal)? = nil, storeOpener: (any StoreOpener)? = nil,
    moveJournal: (any StoreMoveJournal)? = nil, forwards: (any ForwardListeners)? = nil,
    secrets: (any ClientSecretSource)? = nil
  ) {
    self.secrets = secrets
    self.forwards = forwards
    self.storeOpener = storeOpener
    self.moveJournal = moveJournal
    self.prompter = prompter
    self.journal = journal
    self.http = http
    self.store = store
    self.browser = browser
    self.listeners = listeners
    self.events = events
    self.clock = clock
    self.afterLoad = afterLoad
  }
}

/// The token engine: owns accounts and tokens, serves silent requests from memory, refreshes with
/// single flight, and runs interactive sign-ins without blocking anyone else (actor reentrancy: every
/// network or store wait is a suspension point).
public actor Broker {
  /// The configuration in force; a reload (`reload(_:)`) replaces it.
  public internal(set) var config: BrokerConfig
  /// The administrator's policy (`[policy]` in /etc/tessera), beyond what it did to `config`.
  public internal(set) var adminPolicy = ConfigPolicy()
  /// What `tessera status` says of the configuration: its files, the warnings, a refused reload.
  var configNotes = StatusReport.ConfigStatus()
  /// Whether tesserad has a session bus, as its bus server found it at start (`noteSessionBus`).
  var sessionBus: StatusReport.SessionBus?
  /// Counts reloads: a request that waited across one is decided again (silentToken).
  var configGeneration = 0
  let deps: BrokerDependencies
  let logger: Logger
  var policy: AuthorityPolicy
  let directory: OIDCDirectory
  /// Silent replies the bus thread may give without a hop to this actor (see SilentFastPath).
  public nonisolated let fastPath = SilentFastPath()

  var cache = TokenCache()
  var loading: Task<Void, any Error>?
  var loaded = false
  /// Every write to the Secret Service, in order.
  let storeWriter: StoreWriter
  /// The store in use, which a move switches (`deps.store` is this slot).
  let storeSlot: StoreSlot
  /// A store move (`tessera store migrate`) is under way: a second one is refused until it ends.
  var storeMoveUnderWay = false
  /// A value each time a write failed and left operations for a retry (see runStoreRetries).
  let storeWriteFailures: AsyncStream<Void>
  /// Single flight, lanes, refresh-ahead, backoff and throttling.
  var scheduler = RefreshScheduler()
  /// Interactive sign-ins under way.
  var signIns = SignInRegistry()
  /// Each account's state and last error, and which need a sign-in.
  var health = AccountHealth()
  /// Per-application access control (issue 11): the rules, the user's recent answers, the audit.
  var access: AccessPolicy
  /// Questions to the user under way (one per app at a time).
  var pendingQuestions: [String: Task<AccessAnswer?, Never>] = [:]
  /// The desktop app when it takes the user's questions, and the questions it was asked.
  var prompts = PromptDesk()
  /// When tokens were last refreshed for each kind of machine event (see machineResumed).
  var lastMachineEvent: [String: Date] = [:]
  /// The clocks at the last look (see checkClock).
  var lastClock: ClockReading
  /// A tenant as callers name it (a domain, a GUID in any case) at one identity provider.
  struct TenantKey: Hashable {
    var environment: String
    var tenant: String
  }
  /// Tenant names to the realm (`tid`) the IdP answered with.
  var tenantRealms: [TenantKey: String] = [:]
  /// The last DPoP nonce each server sent (RFC 9449 §8), by origin: its next proof carries it.
  var dpopNonces: [String: String] = [:]
  /// Which apps (AppIdentity keys) were handed each key-bound access token (by its hash): only
  /// they get proofs for it (GetProof).
  var proofRecipients: [String: HandedOut] = [:]

  public init(config: BrokerConfig, dependencies: BrokerDependencies, logger: Logger) {
    self.config = config
    let slot = (dependencies.store as? StoreSlot) ?? StoreSlot(dependencies.store)
    var dependencies = dependencies
    dependencies.store = slot
    self.storeSlot = slot
    self.deps = dependencies
    self.logger = logger
    self.policy = config.authorityPolicy
    self.access = AccessPolicy(mode: config.accessMode)
    self.directory = OIDCDirectory(http: dependencies.http, clock: dependencies.clock)
    self.lastClock = ClockReading(dependencies.clock)
    self.configNotes.loadedAt = Int64(dependencies.clock.now().timeIntervalSince1970)
    let (failures, failed) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    self.storeWriteFailures = failures
    self.storeWriter = StoreWriter(
      store: dependencies.store,
      onDrop: { [logger] operation, error in
        logger.error(
          "\(slot.storeDescription.capitalizedName) refused a write three times while it answered; dropped it so later writes can land",
          metadata: StoreWriter.describe(operation).merging(["error": "\(error)"]) { $1 })
      },
      onPending: { failed.yield() }, time: { [clock = dependencies.clock] in clock.awake() })
    // The bus thread answers only apps the full path allowed: in open mode too when each app's
    // first use of an account is to be told (the full path sees every app once).
    fastPath.enforcesAccess.store(config.accessMode != .open || config.notifyFirstUse, ordering: .relaxed)
  }

  /// What a token request returns.
  public struct TokenResult: Sendable {
    public var accessToken: AccessTokenRecord
    public var grantedScopes: [String]
    public var account: Account

    /// The token as callers receive it (never a refresh token).
    public func tokenInfo(correlationID: String) -> TokenInfo {
      TokenInfo(
        accessToken: accessToken.secret, tokenType: accessToken.tokenType, expiresOn: accessToken.expiresOn,
        scopes: grantedScopes, account: account.info, idToken: accessToken.idToken, correlationID: correlationID)
    }
  }

  // MARK: - Store

  func ensureLoaded() async throws {
    checkClock()
    if loaded {
      // Earlier writes that failed are retried; a still-unavailable store must not fail a cache hit.
      do { try await flushPending() } catch {
        logger.warning(
          "\(storeSlot.storeDescription.capitalizedName) is still unavailable; keeping changes in memory",
          metadata: ["error": "\(error)"])
      }
      return
    }
    if let loading { return try await loading.value }
    let task = Task { [deps] in
      let items = try await deps.store.loadAll()
      self.finishLoading(items)
    }
    loading = task
    do {
      try await task.value
      deps.afterLoad()  // the load's transient copies (every item's secret) are gone by now
    } catch {
      loading = nil
      throw error
    }
  }

  /// How long `tessera status` and a sign-in wait for the Secret Service, twice at most (the
  /// load, then a probe of their own), before they answer with why it does not: a keyring that
  /// D-Bus is starting and that never comes (a nested session's), or one stuck behind a prompt,
  /// must not hold the user for D-Bus's 25 s.
  static let storeAnswerSeconds = 0.5

  /// `ensureLoaded`, for callers a person waits on: when the store does not answer within about
  /// twice `seconds`, throws StoreUnavailable with the specific cause (the load goes on, and the
  /// next request gets its result). A store that answers is waited for (its items may take a
  /// while to read). A store loaded before is asked again, so one locked since is said now.
  func ensureLoadedOrSayWhy(within seconds: Double = Broker.storeAnswerSeconds) async throws {
    if loaded { return try await deps.store.probe(withinSeconds: seconds) }
    let load = Task { try await self.ensureLoaded() }
    if try await firstOf(load, orAfter: seconds) { return }
    try await deps.store.probe(withinSeconds: seconds)
    try await load.value
  }

  private func finishLoading(_ items: [StoredItem]) {
    fastPath.clear()
    var (cache, skipped) = TokenCache.load(items)
    // What an interrupted sign-out (or a sign-in killed before its account was stored) left:
    // items of accounts that are not there. The sign-out is finished now.
    let leftovers = cache.removeOrphans()
    self.cache = cache
    loaded = true
    loading = nil
    if !leftovers.accountIDs.isEmpty {
      logger.notice(
        "Removing what an interrupted sign-out or sign-in left in \(storeSlot.storeDescription.name) (items of accounts that are not there)",
        metadata: [
          "accounts": "\(leftovers.accountIDs.count)", "refresh_tokens": "\(leftovers.refreshTokens.count)",
        ])
      enqueueWrite(leftovers.accountIDs.map { .delete([TokenCache.base: TokenCache.schemaVersion, "account_id": $0]) })
      let tokens = leftovers.refreshTokens
      Task { for record in tokens { await self.revoke(record, correlationID: CorrelationID.new()) } }
    }
    logger.info(
      "Loaded the token store",
      metadata: [
        "accounts": "\(cache.accounts.count)", "refresh_tokens": "\(cache.refreshTokens.count)",
        "access_tokens": "\(cache.accessTokens.count)", "skipped_items": "\(skipped)",
      ])
  }

  private func flushPending() async throws {
    guard storeWriter.hasPending else { return }
    try await apply([])
  }

  /// The longest wait between two retries of writes the keyring did not take.
  static let longestStoreRetryDelay = 10.0

  /// Until cancelled: once a write fails, retries what waits after 1, 2, 4 … 10 s until the keyring
  /// takes it, so changes made while it was away or locked land soon after it is back, in order,
  /// whether or not a caller comes (every call also retries first). Sleeps while nothing waits.
  public func runStoreRetries() async {
    for await _ in storeWriteFailures {
      var delay = 1.0
      while storeWriter.hasPending {
        do { try await deps.clock.sleep(seconds: delay) } catch { return }
        do {
          try await flushPending()
          if !storeWriter.hasPending {
            logger.notice(
              "\(storeSlot.storeDescription.capitalizedName) answers again: the changes kept in memory are stored now")
          }
        } catch {
          delay = min(delay * 2, Self.longestStoreRetryDelay)
        }
      }
    }
  }

  /// Writes to the Secret Service, in order behind every write queued before (see StoreWriter); with
  /// `retryLater` false a failed batch is dropped (the caller rolls its change back).
  func apply(_ operations: [TokenCache.StoreOperation], retryLater: Bool = true) async throws {
    try await enqueueWrite(operations, retryLater: retryLater).value
  }

  /// Queues a write without waiting for it.
  @discardableResult
  func enqueueWrite(_ operations: [TokenCache.StoreOperation], retryLater: Bool = true) -> Task<Void, any Error> {
    // Every change to accounts or tokens is followed by a write: published replies are stale now.
    fastPath.clear()
    return storeWriter.enqueue(operations, retryLater: retryLater)
  }

  /// Waits for every queued store write (at shutdown).
  public func finishStoreWrites() async {
    await storeWriter.finish()
  }

  // MARK: - Defaults and lookups

  func resolveClientID(_ clientID: String) throws -> String {
    if !clientID.isEmpty { return clientID }
    guard !config.defaultClientID.isEmpty else {
      throw TesseraError.invalidArgument(
        "No client id was given and no default_client_id is configured. Pass your app's client id, or set default_client_id in config.toml."
      )
    }
    return config.defaultClientID
  }

  func resolveScopes(_ scopes: [String]) throws -> [String] {
    if !scopes.isEmpty { return scopes }
    guard !config.defaultScopes.isEmpty else {
      throw TesseraError.invalidArgument(
        "No scopes were given and no default_scopes are configured. Pass the scopes you need (e.g. User.Read), or set default_scopes in config.toml."
      )
    }
    return config.defaultScopes
  }

  func resolveAuthority(_ authority: String?) throws -> Authority {
    try policy.validate(authority ?? config.defaultAuthority)
  }

  static let commonTenants: Set<String> = ["common", "organizations", "consumers"]

  /// The realm an authority's tokens are filed under: the account's home realm for common
  /// authorities, else the tenant's `tid` as the IdP answered it (a domain tenant maps to a GUID).
  func realm(for authority: Authority, account: Account) -> String {
    let tenant = authority.tenant.lowercased()
    if Self.commonTenants.contains(tenant) { return account.realm.lowercased() }
    return tenantRealms[TenantKey(environment: authority.environment, tenant: tenant)] ?? tenant
  }

  /// Can `authority` use this account's tokens? Entra tenants of one cloud share accounts (and
  /// refresh tokens); any other IdP only its own issuer: a refresh token is never sent elsewhere.
  static func serves(_ authority: Authority, _ account: Account) -> Bool {
    guard account.environment == authority.environment else { return false }
    guard authority.isMicrosoft else { return account.authority == authority.url }
    return commonTenants.contains(authority.tenant.lowercased()) || account.realm == authority.tenant
      || (try? Authority(parsing: account.authority))?.tenant == authority.tenant
  }

  func accounts(in authority: Authority) -> [Account] {
    cache.accounts.values.filter { Self.serves(authority, $0) }.sorted { $0.username < $1.username }
  }

  func resolveAccount(_ accountID: String, authority: Authority) throws -> Account {
    if !accountID.isEmpty {
      guard let account = cache.accounts[accountID] else {
        throw TesseraError.noSuchAccount(
          "No account with id '\(RequestOptions.clip(accountID))' is signed in. Call GetAccounts for the list, or sign in with AcquireToken."
        )
      }
      // Entra: a named account may be used in any tenant of its cloud (as a guest there).
      let usable =
        authority.isMicrosoft ? account.environment == authority.environment : Self.serves(authority, account)
      guard usable else {
        throw TesseraError.noSuchAccount(
          "Account '\(account.username)' signed in at \(account.authority), not at \(authority.url). Use its own authority."
        )
      }
      return account
    }
    var candidates = accounts(in: authority)
    if candidates.isEmpty && authority.isMicrosoft {
      candidates = cache.accounts.values.filter { $0.environment == authority.environment }.sorted {
        $0.username < $1.username
      }
    }
    guard let only = candidates.first else {
      throw TesseraError.noSuchAccount(
        "No account is signed in for \(authority.url). Sign in first with AcquireToken (or `tessera login`).")
    }
    guard candidates.count == 1 else {
      if let current = cache.current(among: candidates) { return current }
      throw TesseraError.invalidArgument(
        "\(candidates.count) accounts are signed in for \(authority.url) (\(candidates.map(\.username).joined(separator: ", "))) and none is the current one. Choose one for every request that names none with `tessera account use USERNAME`, or pass an account id."
      )
    }
    return only
  }

  /// The account a token response is for: its validated id_token's, which must be the account a
  /// refresh was for (or its home account, at Entra); else the refresh's own account. A sign-in
  /// without an id_token cannot say who signed in, and is refused.
  func identify(
    _ response: TokenResponse, metadata: OIDCMetadata, authority: Authority, clientID: String, nonce: String?,
    knownAccount: Account?, hint: String? = nil, proofKey: ProofKeyRecord? = nil
  ) async throws -> (Account, IDTokenClaims?) {
    var claims: IDTokenClaims?
    // Without signing keys (a provider written out, or RFC 8414 metadata naming none) an id_token
    // cannot be checked, and is not trusted to name anyone.
    if let idToken = response.idToken, metadata.hasSigningKeys {
      claims = try await directory.validate(idToken: idToken, metadata: metadata, clientID: clientID, nonce: nonce)
    }
    var account: Account
    if let claims {
      account = Self.account(
        from: claims, clientInfo: response.clientInfo, authority: authority, issuer: metadata.issuer)
      // A refresh in a guest tenant signs the guest object in: there the home account is the one
      // client_info names (the refresh token was that account's).
      let homeFromClientInfo =
        authority.isMicrosoft ? response.clientInfo.flatMap(ClientInfo.decode).map { "\($0.uid).\($0.utid)" } : nil
      if let knownAccount, knownAccount.id != account.id, knownAccount.id != homeFromClientInfo {
        throw TesseraError.provider(
          "The identity provider answered for a different user than \(knownAccount.username). Sign in again.")
      }
      // A refresh in another tenant (a guest realm) must not move the account's home.
      if let knownAccount { account = knownAccount }
    } else if let knownAccount {
      account = knownAccount
    } else if let named = try await accountWithoutIDToken(
      response, metadata: metadata, authority: authority, clientID: clientID, hint: hint, proofKey: proofKey)
    {
      account = named
    } else {
      throw TesseraError.provider(
        "The identity provider returned no id_token, so the account cannot be identified. Make sure the 'openid' scope is allowed for this client."
      )
    }
    return (account, claims)
  }

  /// Validates a token response, stores what it carries (the new refresh token first), and returns it.
  /// `knownAccount` is the account a refresh was for, `redeemed` the refresh token it used;
  /// `requestedScopes` what the caller asked.
  func accept(
    _ response: TokenResponse, metadata: OIDCMetadata, authority: Authority, clientID: String,
    requestedScopes scopes: [String], nonce: String?, knownAccount: Account?, redeemed: RefreshTokenRecord? = nil,
    hint: String? = nil, proofKey: ProofKeyRecord? = nil
  ) async throws -> TokenResult {
    let bound: Bool
    let identified: (Account, IDTokenClaims?)
    do {
      // Sent with a proof: bound to its key (or refused where dpop = "required" and it is not).
      bound = try checkBinding(
        response, key: proofKey, authority: authority, clientID: clientID, redeemed: redeemed)
      identified = try await identify(
        response, metadata: metadata, authority: authority, clientID: clientID, nonce: nonce,
        knownAccount: knownAccount, hint: hint, proofKey: bound ? proofKey : nil)
    } catch {
      // A sign-in whose answer is refused (its account cannot be named, or it is not bound where it
      // must be) keeps nothing, and leaves no live grant at the provider either: the refresh token
      // it was just given is revoked.
      if knownAccount == nil, let issued = response.refreshToken {
        await revoke(
          RefreshTokenRecord(
            accountID: "", environment: authority.environment, clientID: clientID, authority: authority.url,
            secret: issued),
          correlationID: CorrelationID.new())
      }
      throw error
    }
    let (account, claims) = identified
    // A refresh that finishes after the account was signed out must not bring it back.
    if let knownAccount, cache.accounts[knownAccount.id] == nil {
      if let issued = response.refreshToken {  // the IdP just rotated it: revoke, do not keep
        await revoke(
          RefreshTokenRecord(
            accountID: knownAccount.id, environment: authority.environment, clientID: clientID,
            authority: authority.url, secret: issued),
          correlationID: CorrelationID.new())
      }
      throw TesseraError.noSuchAccount("\(knownAccount.username) was signed out while this request ran. Sign in again.")
    }
    var operations: [TokenCache.StoreOperation] = []
    let isNewAccount = cache.accounts[account.id] == nil
    // The account item is written after its refresh token (appended below): a kill between the
    // two leaves a token without an account, which the next start removes and revokes (the
    // sign-in never finished), never an account without its token.
    let accountWrites = cache.accounts[account.id] != account ? cache.upsert(account: account) : []
    let granted = response.scope.map { $0.split(separator: " ").map(String.init) } ?? scopes
    // The key goes into the store before the first token bound to it. A refresh token stays
    // bound once it is (a refresh answered with a bearer access token included).
    var boundKey: String?
    var refreshBoundKey: String?
    if var key = proofKey, bound || redeemed?.proofKey != nil {
      key.accountID = account.id
      operations += cache.keep(proofKey: key)
      refreshBoundKey = key.thumbprint
      if bound { boundKey = key.thumbprint }
    }
    if let newRefreshToken = response.refreshToken {
      // A rotated token is the same grant (RFC 6749 §6: the same scopes); a sign-in's token is
      // bound to what it granted, except at Entra, whose refresh tokens serve any scope.
      let grantScopes =
        redeemed.map { $0.scopes } ?? (authority.isMicrosoft ? nil : ScopeSet.resourceScopes(granted).sorted())
      operations += cache.upsert(
        refreshToken: RefreshTokenRecord(
          accountID: account.id, environment: authority.environment, clientID: clientID, authority: authority.url,
          secret: newRefreshToken, familyID: response.foci, scopes: grantScopes,
          expiresOn: response.refreshTokenExpiresIn.map { Int64(deps.clock.now().timeIntervalSince1970) + $0 },
          proofKey: refreshBoundKey),
        replacing: redeemed)
    }
    // Family membership is remembered only where families exist (Entra answers `foci`).
    // A token for this account from this client signs it back in to this client.
    if let known = cache.appMetadata(environment: authority.environment, clientID: clientID) {
      let signedOut = known.signedOutAccounts?.filter { $0 != account.id }
      operations += cache.upsert(
        appMetadata: AppMetadataRecord(
          environment: authority.environment, clientID: clientID, familyID: response.foci,
          signedOutAccounts: signedOut?.isEmpty == true ? nil : signedOut))
    } else if response.foci != nil {
      operations += cache.upsert(
        appMetadata: AppMetadataRecord(environment: authority.environment, clientID: clientID, familyID: response.foci))
    }
    operations += accountWrites
    // A second account beside the only one of its identity provider: the first stays the one that
    // requests naming no account get (helpers set up for it keep working) until the user says
    // otherwise with `tessera account use`.
    if isNewAccount {
      let others = cache.accounts.values.filter { $0.id != account.id && $0.environment == account.environment }
      if others.count == 1, cache.current(among: others) == nil {
        operations += cache.makeCurrent(accountID: others[0].id)
      }
    }
    let realm = (claims?.tid ?? realm(for: authority, account: account)).lowercased()
    if let tid = claims?.tid, !Self.commonTenants.contains(authority.tenant.lowercased()) {
      tenantRealms[TenantKey(environment: authority.environment, tenant: authority.tenant.lowercased())] =
        tid.lowercased()
    }
    let now = Int64(deps.clock.now().timeIntervalSince1970)
    // No expires_in: a provider's token is valid until revoked (GitHub OAuth apps); an authority's
    // is taken to last an hour, as before providers existed (Entra always says).
    let expiresIn = response.expiresIn ?? (config.provider(for: authority, clientID: clientID) == nil ? 3600 : nil)
    let lifetimes = TokenLifetimes(
      now: now, expiresIn: expiresIn, extExpiresIn: response.extExpiresIn, refreshIn: response.refreshIn)
    let accessToken = AccessTokenRecord(
      accountID: account.id, environment: authority.environment, realm: realm, clientID: clientID,
      scopes: ScopeSet.storedScopes(granted: granted, requested: scopes), secret: response.accessToken,
      tokenType: response.tokenType, expiresOn: lifetimes.expiresOn,
      idToken: response.idToken
        ?? cache.accessToken(
          accountID: account.id, environment: authority.environment, realm: nil, clientID: clientID, scopes: [])?
        .idToken,
      extExpiresOn: lifetimes.extExpiresOn, refreshOn: lifetimes.refreshOn, cachedAt: now, proofKey: boundKey)
    let accessTokenWrites = cache.insert(accessToken: accessToken)
    // A key no token of the account is bound to any more (a new sign-in's replaced it) goes.
    operations += cache.dropUnusedProofKeys(accountID: account.id)
    if isNewAccount { deps.events.accountsChanged() }
    noteSuccess(
      accountID: account.id, clientID: clientID, authority: authority.url, scopes: scopes,
      interactive: redeemed == nil, familyID: response.foci)
    // The account and the refresh token are stored before the reply: a crash after this costs at most
    // that one rotation. The access token is written behind the reply (in order, retried on failure):
    // losing it costs one refresh, never a sign-in.
    let storedFirst = enqueueWrite(operations)
    enqueueWrite(accessTokenWrites)  // queued now, so a sign-out queued later still deletes it
    try await storedFirst.value
    return TokenResult(accessToken: accessToken, grantedScopes: granted, account: account)
  }

  static func account(from claims: IDTokenClaims, clientInfo: String?, authority: Authority, issuer: String) -> Account
  {
    let id: String
    // client_info is not signed: it names the home account only when the authority is Microsoft's
    // and it agrees with the signed id_token (the user's object id in the tenant that signed it
    // in). Otherwise, or for a guest sign-in, issuer and subject do.
    if authority.isMicrosoft, let info = clientInfo.flatMap(ClientInfo.decode), let oid = claims.oid,
      let tid = claims.tid, info.uid.lowercased() == oid.lowercased(), info.utid.lowercased() == tid.lowercased()
    {
      id = "\(info.uid).\(info.utid)"
    } else {
      // Stable across sign-ins and unique across issuers: sub plus a short digest of the issuer.
      let digest = SHA256.hash(data: Array(claims.iss.utf8)).prefix(6).map {
        ($0 < 16 ? "0" : "") + String($0, radix: 16)
      }.joined()
      id = "\(claims.sub).\(digest)"
    }
    return Account(
      id: id, username: claims.username, name: claims.name ?? claims.username, authority: authority.url,
      environment: authority.environment, realm: claims.tid ?? authority.tenant,
      localAccountID: claims.oid ?? claims.sub)
  }
}
