/// When a token that does not expire "expires": an access token whose answer carried no
/// `expires_in` from a `[[provider]]` (a GitHub OAuth app's tokens are valid until revoked).
/// 9999-12-31T23:59:59Z, so `expires_on` stays a plain date for every client that compares it,
/// and the fronts, status and helpers say "does not expire" (git gets no password_expiry_utc,
/// kubectl no expirationTimestamp).
public enum TokenExpiry {
  public static let never: Int64 = 253_402_300_799

  public static func isNever(_ expiresOn: Int64) -> Bool { expiresOn >= never }
}
