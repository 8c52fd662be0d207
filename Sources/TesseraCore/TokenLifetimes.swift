import TesseraInterface

/// When an access token expires, may still be used, and should be refreshed (docs/token-cache.md).
public struct TokenLifetimes: Sendable, Equatable {
  public var expiresOn: Int64
  public var extExpiresOn: Int64?
  public var refreshOn: Int64

  /// Tokens refreshed ahead this long before they would stop being served with the default
  /// min_validity (300 s), when the IdP gives no `refresh_in`.
  public static let refreshAheadMargin: Int64 = 360

  /// How long a cached token must still be valid to answer a request: its `min_validity` when the
  /// caller gave one; by default 300 s, or a quarter of the token's own lifetime when that is
  /// shorter (tokens that live under 20 minutes). Without that cap an IdP whose tokens live 5
  /// minutes or less (Keycloak's default is 5) would be asked for a new token at every call, each
  /// no better than the one cached; refresh-ahead renews such tokens at half their life.
  /// `lifetime` is nil when unknown (records stored before it was kept).
  public static func servingMargin(_ minValidity: UInt32?, lifetime: Int64?) -> Double {
    if let minValidity { return Double(minValidity) }
    let standard = Double(RequestOptions.defaultMinValidity)
    guard let lifetime, lifetime > 0 else { return standard }
    return min(standard, Double(lifetime) / 4)
  }

  /// `expiresIn` nil: the token does not expire (TokenExpiry.never); it is never refreshed ahead.
  public init(now: Int64, expiresIn: Int64?, extExpiresIn: Int64?, refreshIn: Int64?) {
    guard let expiresIn else {
      expiresOn = TokenExpiry.never
      extExpiresOn = nil
      refreshOn = TokenExpiry.never
      return
    }
    expiresOn = now + expiresIn
    extExpiresOn = extExpiresIn.map { now + min(max($0, expiresIn), 366 * 86_400) }
    if let refreshIn, refreshIn > 0, refreshIn < expiresIn {
      refreshOn = now + refreshIn
    } else if expiresIn >= 2 * 3600 {
      refreshOn = now + expiresIn / 2  // as MSAL does for long-lived tokens
    } else {
      // Ahead of the default min_validity, but never in a short-lived token's first half.
      refreshOn = now + expiresIn - min(Self.refreshAheadMargin, expiresIn / 2)
    }
  }
}
