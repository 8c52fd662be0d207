import TesseraInterface

/// A signed-in identity, owned by the broker and shown to every caller.
public struct Account: Codable, Sendable, Equatable {
  /// Stable home account id: `uid.utid` from Entra's client_info, else derived from issuer and `sub`.
  public var id: String
  public var username: String
  public var name: String
  /// The authority the account signed in with.
  public var authority: String
  /// The identity provider's host (with port when not 443).
  public var environment: String
  /// The tenant: `tid` from the id_token, else the authority's first path segment.
  public var realm: String
  /// The IdP's id for the user in the realm (`oid`, else `sub`).
  public var localAccountID: String

  public init(
    id: String, username: String, name: String, authority: String, environment: String, realm: String,
    localAccountID: String
  ) {
    self.id = id
    self.username = username
    self.name = name
    self.authority = authority
    self.environment = environment
    self.realm = realm
    self.localAccountID = localAccountID
  }

  /// The account as the D-Bus API shows it.
  public var info: AccountInfo {
    AccountInfo(
      id: id, username: username, name: name, authority: authority, environment: environment, realm: realm,
      localAccountID: localAccountID)
  }
}

/// A refresh token, kept per (account, environment, client id), or per (account, environment,
/// family) for a family refresh token (FOCI) that every client of the family may use. Never leaves
/// the daemon.
public struct RefreshTokenRecord: Codable, Sendable, Equatable {
  public var accountID: String
  public var environment: String
  /// The client it was issued to (for a family token: the last one that redeemed it).
  public var clientID: String
  /// The token endpoint's authority that issued it: the token is only ever sent there.
  public var authority: String
  public var secret: String
  /// Microsoft's family of client ids ("1"), when the token is a family refresh token.
  public var familyID: String? = nil
  /// The resource scopes of the grant, for identity providers that bind a refresh token to the
  /// scopes first granted (every one but Entra): normalized, without OpenID scopes. Nil for Entra's
  /// tokens, which serve any scope, and for tokens stored before scopes were recorded.
  public var scopes: [String]? = nil
  /// When the token itself lapses (Unix seconds), from `refresh_token_expires_in` (a GitHub App's
  /// lasts about 6 months); nil when the identity provider did not say.
  public var expiresOn: Int64? = nil
  /// The thumbprint of the DPoP key it is bound to (RFC 9449): every refresh sends a proof made
  /// with that key, which never leaves this machine. Nil for a bearer token.
  public var proofKey: String? = nil

  public init(
    accountID: String, environment: String, clientID: String, authority: String, secret: String,
    familyID: String? = nil,
    scopes: [String]? = nil, expiresOn: Int64? = nil, proofKey: String? = nil
  ) {
    self.proofKey = proofKey
    self.expiresOn = expiresOn
    self.accountID = accountID
    self.environment = environment
    self.clientID = clientID
    self.authority = authority
    self.secret = secret
    self.familyID = familyID
    self.scopes = scopes
  }

  /// Where it is filed: the client id, or `family:<id>`.
  public var slot: String { familyID.map { "family:" + $0 } ?? clientID }

  /// Whether `other` is the same stored token (a newer secret of it replaces it).
  func isSameGrant(as other: RefreshTokenRecord) -> Bool {
    accountID == other.accountID && environment == other.environment && slot == other.slot && scopes == other.scopes
  }
}

/// What the broker learned about a client id (as MSAL's app metadata): is it in a family?
public struct AppMetadataRecord: Codable, Sendable, Equatable {
  public var environment: String
  public var clientID: String
  /// The family it belongs to; nil when it is known not to be in one.
  public var familyID: String?
  /// Accounts signed out of this client (SignOut with its client id, Microsoft's removeAccount)
  /// while the family's refresh token still serves the family's other apps: this client does not
  /// use that token for them until it signs them in again.
  public var signedOutAccounts: [String]? = nil
}

/// A cached access token.
public struct AccessTokenRecord: Codable, Sendable, Equatable {
  public var accountID: String
  public var environment: String
  public var realm: String
  public var clientID: String
  /// Granted scopes, normalised (see `ScopeSet`).
  public var scopes: [String]
  public var secret: String
  public var tokenType: String
  /// Unix seconds.
  public var expiresOn: Int64
  public var idToken: String?
  /// Entra's extended lifetime (`ext_expires_in`): usable while the IdP is unreachable.
  public var extExpiresOn: Int64? = nil
  /// When to refresh it ahead of expiry (`refresh_in`, else a default; see TokenLifetimes).
  public var refreshOn: Int64? = nil
  /// When it arrived (Unix seconds); nil in records stored before this was kept.
  public var cachedAt: Int64? = nil
  /// The thumbprint of the DPoP key it is bound to: the app that holds it asks the broker for a
  /// proof with every request it makes (GetProof). Nil for a bearer token.
  public var proofKey: String? = nil

  public init(
    accountID: String, environment: String, realm: String, clientID: String, scopes: [String], secret: String,
    tokenType: String, expiresOn: Int64, idToken: String?, extExpiresOn: Int64? = nil, refreshOn: Int64? = nil,
    cachedAt: Int64? = nil, proofKey: String? = nil
  ) {
    self.proofKey = proofKey
    self.cachedAt = cachedAt
    self.accountID = accountID
    self.environment = environment
    self.realm = realm
    self.clientID = clientID
    self.scopes = scopes
    self.secret = secret
    self.tokenType = tokenType
    self.expiresOn = expiresOn
    self.idToken = idToken
    self.extExpiresOn = extExpiresOn
    self.refreshOn = refreshOn
  }

  /// How long this token must still be valid to answer a request (TokenLifetimes.servingMargin).
  public func servingMargin(_ minValidity: UInt32?) -> Double {
    TokenLifetimes.servingMargin(minValidity, lifetime: cachedAt.map { expiresOn - $0 })
  }
}

/// Scope handling: comparisons are case-insensitive; OIDC scopes are not resource scopes.
public enum ScopeSet {
  public static let oidcScopes: Set<String> = ["openid", "profile", "offline_access", "email"]

  /// Lowercased, de-duplicated, sorted.
  public static func normalize(_ scopes: [String]) -> [String] {
    Array(Set(scopes.map { $0.lowercased() })).sorted()
  }

  /// The scopes that a cached access token must cover: resource scopes, without OIDC ones.
  public static func resourceScopes(_ scopes: [String]) -> Set<String> {
    Set(normalize(scopes)).subtracting(oidcScopes)
  }

  /// Does a token granted `granted` satisfy a request for `requested`? A `<resource>/.default`
  /// request is satisfied by a token for that resource's `.default` (as Entra treats it).
  public static func covers(granted: [String], requested: [String]) -> Bool {
    resourceScopes(requested).isSubset(of: Set(normalize(granted)))
  }

  /// What a cached token is filed under: the granted scopes, plus the `.default` scopes that were
  /// requested (Entra answers a `.default` request with the resource's individual scopes).
  public static func storedScopes(granted: [String], requested: [String]) -> [String] {
    normalize(granted + requested.filter { $0.lowercased().hasSuffix("/.default") || $0.lowercased() == ".default" })
  }
}
