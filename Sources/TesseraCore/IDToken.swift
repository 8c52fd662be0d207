import JWTKit
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// The id_token claims the broker reads. Signature checks are JWTKit's; claim checks are below,
/// against the injected clock.
public struct IDTokenClaims: JWTPayload, Equatable {
  public var iss: String
  public var sub: String
  public var aud: AudienceClaim
  public var exp: Double
  public var iat: Double?
  public var nonce: String?
  public var tid: String?
  public var oid: String?
  public var preferred_username: String?
  public var upn: String?
  public var email: String?
  public var name: String?

  /// Claim checks need the broker's clock, so they run in `OIDCDirectory.validate`.
  public func verify(using algorithm: some JWTAlgorithm) async throws {}

  /// The name a person recognises.
  public var username: String { preferred_username ?? upn ?? email ?? sub }
}

/// Discovery documents and signing keys, fetched over HTTPS and cached per authority.
public actor OIDCDirectory {
  let http: any HTTPClient
  let clock: any BrokerClock
  /// Seconds of clock skew tolerated in exp/iat.
  public static let allowedSkew: Double = 300
  static let metadataLifetime: Double = 24 * 3600
  static let jwksMinRefetchInterval: Double = 60

  var metadata: [String: (OIDCMetadata, Date)] = [:]
  private var keys: [String: (JWTKeyCollection, Date)] = [:]

  public init(http: any HTTPClient, clock: any BrokerClock) {
    self.http = http
    self.clock = clock
  }

  /// The discovery document for `authority`: `{authority}/v2.0/.well-known/openid-configuration` (as Entra
  /// serves it) or `{authority}/.well-known/openid-configuration`.
  public func metadata(
    for authority: Authority, policy: AuthorityPolicy, anyHTTPSEndpoint: Bool = false
  ) async throws -> OIDCMetadata {
    if let (cached, fetched) = metadata[authority.url], clock.now().timeIntervalSince(fetched) < Self.metadataLifetime {
      // Checked again under today's policy: a reload may have stopped trusting a host it names.
      try Self.check(cached, of: authority, policy: policy, anyHTTPSEndpoint: anyHTTPSEndpoint)
      return cached
    }
    let suffixes = ["/v2.0/.well-known/openid-configuration", "/.well-known/openid-configuration"]
    let ordered = authority.isMicrosoft ? suffixes : suffixes.reversed()
    var lastStatus = 0
    for suffix in ordered {
      let url = authority.url + suffix
      let response = try await http.send(
        HTTPRequest(method: "GET", url: url, headers: [("Accept", "application/json")]))
      if response.status == 404 || response.status == 400 {
        lastStatus = response.status
        continue
      }
      guard response.status == 200 else {
        if response.status >= 500 || response.status == 429 {
          throw TesseraError.network(
            "The identity provider's discovery document at \(url) is unavailable (HTTP \(response.status)). Try again in a moment."
          )
        }
        throw TesseraError.provider(
          "The discovery document at \(url) answered HTTP \(response.status). Check the authority.")
      }
      guard let document = try? JSONDecoder().decode(OIDCMetadata.self, from: Data(response.body)) else {
        throw TesseraError.provider(
          "The discovery document at \(url) is not valid OpenID Connect metadata. Check the authority.")
      }
      try Self.check(document, of: authority, policy: policy, anyHTTPSEndpoint: anyHTTPSEndpoint)
      metadata[authority.url] = (document, clock.now())
      return document
    }
    throw TesseraError.provider(
      "No OpenID Connect discovery document at \(authority.url) (HTTP \(lastStatus)). Check the authority: it should be the issuer URL of your IdP."
    )
  }

  /// A discovery document may only send the broker to endpoints the trust policy allows: Microsoft
  /// endpoints on Microsoft hosts; otherwise the authority's own host or a trusted authority, over
  /// https (http only for a loopback authority with allow_insecure_loopback). Its issuer must be
  /// the authority (OIDC Discovery §4.3; Entra's multi-tenant issuer template excepted).
  /// A provider of config.toml (`anyHTTPSEndpoint`) may name https endpoints on any host (Google's
  /// token endpoint is not on accounts.google.com): the user named its issuer.
  static func check(
    _ document: OIDCMetadata, of authority: Authority, policy: AuthorityPolicy, anyHTTPSEndpoint: Bool = false
  ) throws {
    let refuse = { (why: String) in
      TesseraError.untrustedAuthority("The discovery document of \(authority.url) \(why); refusing to use it.")
    }
    guard let issuer = try? Authority(parsing: document.issuer.replacing("{tenantid}", with: "tenant"))
    else { throw refuse("has an unusable issuer") }
    if authority.isMicrosoft {
      guard issuer.isMicrosoft else { throw refuse("names a non-Microsoft issuer (\(issuer.environment))") }
    } else {
      let trimmed = { (s: String) in s.hasSuffix("/") ? String(s.dropLast()) : s }
      guard trimmed(issuer.url) == trimmed(authority.url) else {
        throw refuse("is for another issuer (\(RequestOptions.clip(document.issuer)))")
      }
    }
    let endpoints =
      // A provider of config.toml may lack keys and an authorization endpoint (RFC 8414); any
      // other authority's document names all three, or is refused as it always was.
      [document.authorizationEndpoint, document.tokenEndpoint, document.jwksURI].filter {
        !anyHTTPSEndpoint || !$0.isEmpty
      }
      // The end-session endpoint receives the account's id_token (from the user's browser).
      + [document.deviceAuthorizationEndpoint, document.revocationEndpoint, document.endSessionEndpoint].compactMap {
        $0
      }
      // userinfo is used for providers of config.toml alone (Entra's is on graph.microsoft.com).
      + (anyHTTPSEndpoint ? [document.userinfoEndpoint].compactMap { $0 } : [])
    for endpoint in endpoints {
      guard let target = try? Authority(parsing: endpoint) else { throw refuse("names an unusable endpoint") }
      let schemeAllowed =
        target.scheme == "https"
        || (target.isLoopback && authority.isLoopback && authority.scheme == "http" && policy.allowInsecureLoopback)
      let hostAllowed =
        (anyHTTPSEndpoint && target.scheme == "https")
        || (authority.isMicrosoft
          ? target.isMicrosoft
          : target.environment == authority.environment || policy.trusted.contains { target.isWithin($0) })
      guard schemeAllowed, hostAllowed else {
        throw refuse("names an endpoint outside the trusted authorities (\(target.scheme)://\(target.environment))")
      }
    }
  }

  private func keyCollection(_ jwksURI: String, refresh: Bool) async throws -> JWTKeyCollection {
    if let (cached, fetched) = keys[jwksURI] {
      let age = clock.now().timeIntervalSince(fetched)
      if !refresh || age < Self.jwksMinRefetchInterval { return cached }
    }
    let response = try await http.send(
      HTTPRequest(method: "GET", url: jwksURI, headers: [("Accept", "application/json")]))
    guard response.status == 200 else {
      throw TesseraError.network(
        "The identity provider's signing keys at \(jwksURI) are unavailable (HTTP \(response.status)). Try again.")
    }
    let collection = JWTKeyCollection()
    do {
      _ = try await collection.add(jwksJSON: String(decoding: response.body, as: UTF8.self))
    } catch {
      throw TesseraError.provider("The identity provider's signing keys at \(jwksURI) could not be read (\(error)).")
    }
    keys[jwksURI] = (collection, clock.now())
    return collection
  }

  /// Fetches the IdP's signing keys unless they are known. A refresh calls this before its refresh
  /// token leaves: keys the IdP cannot serve then fail the refresh before the IdP rotates the token,
  /// not after, when the answer carrying the new token could not be checked and would be dropped.
  public func prepareKeys(for metadata: OIDCMetadata) async throws {
    _ = try await keyCollection(metadata.jwksURI, refresh: false)
  }

  /// Validates an id_token: signature against the IdP's JWKS (refetched once on an unknown key),
  /// then iss, aud, exp, iat and nonce. Keys that cannot be fetched or read fail as such (Network,
  /// Provider), not as a bad signature.
  public func validate(
    idToken: String, metadata: OIDCMetadata, clientID: String, nonce: String?
  ) async throws -> IDTokenClaims {
    var claims: IDTokenClaims
    do {
      claims = try await keyCollection(metadata.jwksURI, refresh: false).verify(idToken, as: IDTokenClaims.self)
    } catch let error as TesseraError {
      throw error
    } catch {
      let keys = try await keyCollection(metadata.jwksURI, refresh: true)
      do {
        claims = try await keys.verify(idToken, as: IDTokenClaims.self)
      } catch {
        throw TesseraError.provider(
          "The id_token from the identity provider failed signature validation. Sign-in was refused; check the authority."
        )
      }
    }
    var expectedIssuer = metadata.issuer
    if expectedIssuer.firstRange(of: "{tenantid}") != nil, let tid = claims.tid {
      expectedIssuer = expectedIssuer.replacing("{tenantid}", with: tid)
    }
    func trimmed(_ s: String) -> String { s.hasSuffix("/") ? String(s.dropLast()) : s }
    guard trimmed(claims.iss) == trimmed(expectedIssuer) else {
      throw TesseraError.provider(
        "The id_token was issued by \(claims.iss), not by \(expectedIssuer). Sign-in was refused.")
    }
    guard claims.aud.value.contains(clientID) else {
      throw TesseraError.provider(
        "The id_token is for another client (aud does not contain \(clientID)). Sign-in was refused.")
    }
    let now = clock.now().timeIntervalSince1970
    guard claims.exp + Self.allowedSkew > now else {
      throw TesseraError.provider("The id_token has expired. Check this machine's clock, then sign in again.")
    }
    if let iat = claims.iat, iat - Self.allowedSkew > now {
      throw TesseraError.provider(
        "The id_token was issued in the future. Check this machine's clock, then sign in again.")
    }
    if let nonce, claims.nonce != nonce {
      throw TesseraError.provider("The id_token's nonce does not match this sign-in. Sign-in was refused; try again.")
    }
    return claims
  }
}
