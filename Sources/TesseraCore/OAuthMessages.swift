import Crypto
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// Base64url without padding (RFC 7515 §2).
public enum Base64URL {
  public static func encode(_ bytes: some Sequence<UInt8>) -> String {
    Data(bytes).base64EncodedString().replacing("+", with: "-").replacing("/", with: "_")
      .replacing("=", with: "")
  }

  public static func decode(_ text: String) -> Data? {
    var s = text.replacing("-", with: "+").replacing("_", with: "/")
    while s.count % 4 != 0 { s += "=" }
    return Data(base64Encoded: s)
  }
}

/// PKCE (RFC 7636, S256) plus `state` and `nonce`, all from the system's CSPRNG.
public struct PKCE: Sendable {
  public let verifier: String
  public let challenge: String
  public let state: String
  public let nonce: String

  public init() {
    var rng = SystemRandomNumberGenerator()
    func random(_ count: Int) -> String {
      Base64URL.encode((0..<count).map { _ in UInt8.random(in: .min ... .max, using: &rng) })
    }
    let verifier = random(32)
    self.init(verifier: verifier, state: random(16), nonce: random(16))
  }

  public init(verifier: String, state: String, nonce: String) {
    self.verifier = verifier
    self.challenge = Base64URL.encode(SHA256.hash(data: Array(verifier.utf8)))
    self.state = state
    self.nonce = nonce
  }
}

/// The parts of an OpenID Provider's discovery document the broker uses.
public struct OIDCMetadata: Codable, Sendable, Equatable {
  public var issuer: String
  public var authorizationEndpoint: String
  public var tokenEndpoint: String
  public var jwksURI: String
  public var deviceAuthorizationEndpoint: String?
  public var revocationEndpoint: String?
  /// RFC 9207: the IdP sends `iss` with every authorization response.
  public var authorizationResponseIssParameterSupported: Bool? = nil
  /// OpenID Connect's userinfo endpoint: who the token's user is, without an id_token.
  public var userinfoEndpoint: String? = nil
  /// OpenID Connect RP-Initiated Logout 1.0: where the browser ends the user's session there.
  public var endSessionEndpoint: String? = nil
  /// RFC 9449 §5.1: the algorithms the server takes DPoP proofs in; nil or empty: no DPoP.
  public var dpopSigningAlgValuesSupported: [String]? = nil

  /// Whether the server takes DPoP proofs made with the broker's keys (ES256).
  public var supportsDPoP: Bool { dpopSigningAlgValuesSupported?.contains(DPoP.algorithm) ?? false }

  /// Whether id_tokens can be checked: a provider without discovery, or with RFC 8414 metadata
  /// naming no keys, has none (its id_tokens are not trusted, and the account comes from userinfo
  /// or the provider's user API).
  public var hasSigningKeys: Bool { !jwksURI.isEmpty }

  public init(
    issuer: String, authorizationEndpoint: String, tokenEndpoint: String, jwksURI: String,
    deviceAuthorizationEndpoint: String? = nil, revocationEndpoint: String? = nil,
    authorizationResponseIssParameterSupported: Bool? = nil, userinfoEndpoint: String? = nil,
    endSessionEndpoint: String? = nil, dpopSigningAlgValuesSupported: [String]? = nil
  ) {
    self.dpopSigningAlgValuesSupported = dpopSigningAlgValuesSupported
    self.issuer = issuer
    self.authorizationEndpoint = authorizationEndpoint
    self.tokenEndpoint = tokenEndpoint
    self.jwksURI = jwksURI
    self.deviceAuthorizationEndpoint = deviceAuthorizationEndpoint
    self.revocationEndpoint = revocationEndpoint
    self.authorizationResponseIssParameterSupported = authorizationResponseIssParameterSupported
    self.userinfoEndpoint = userinfoEndpoint
    self.endSessionEndpoint = endSessionEndpoint
  }

  /// RFC 8414 metadata, where only the issuer and the token endpoint are required of a server
  /// (no keys without OpenID, no authorization endpoint for a device-only server).
  struct OAuthServer: Decodable {
    var issuer: String
    var authorization_endpoint: String?
    var token_endpoint: String
    var jwks_uri: String?
    var device_authorization_endpoint: String?
    var revocation_endpoint: String?
    var userinfo_endpoint: String?
    var end_session_endpoint: String?
    var authorization_response_iss_parameter_supported: Bool?
    var dpop_signing_alg_values_supported: [String]?

    var metadata: OIDCMetadata {
      OIDCMetadata(
        issuer: issuer, authorizationEndpoint: authorization_endpoint ?? "", tokenEndpoint: token_endpoint,
        jwksURI: jwks_uri ?? "", deviceAuthorizationEndpoint: device_authorization_endpoint,
        revocationEndpoint: revocation_endpoint,
        authorizationResponseIssParameterSupported: authorization_response_iss_parameter_supported,
        userinfoEndpoint: userinfo_endpoint, endSessionEndpoint: end_session_endpoint,
        dpopSigningAlgValuesSupported: dpop_signing_alg_values_supported)
    }
  }

  enum CodingKeys: String, CodingKey {
    case issuer
    case authorizationEndpoint = "authorization_endpoint"
    case tokenEndpoint = "token_endpoint"
    case jwksURI = "jwks_uri"
    case deviceAuthorizationEndpoint = "device_authorization_endpoint"
    case revocationEndpoint = "revocation_endpoint"
    case authorizationResponseIssParameterSupported = "authorization_response_iss_parameter_supported"
    case userinfoEndpoint = "userinfo_endpoint"
    case endSessionEndpoint = "end_session_endpoint"
    case dpopSigningAlgValuesSupported = "dpop_signing_alg_values_supported"
  }
}

/// A token endpoint answer (RFC 6749 §5.1, plus Entra's and OIDC's fields).
public struct TokenResponse: Sendable {
  public var accessToken: String
  public var tokenType: String
  /// nil when the answer has none (RFC 6749 §5.1 only recommends it): Broker decides what that means.
  public var expiresIn: Int64?
  public var scope: String?
  public var refreshToken: String?
  public var idToken: String?
  public var clientInfo: String?
  /// Entra: seconds the token stays usable when the IdP is down.
  public var extExpiresIn: Int64? = nil
  /// Entra: seconds after which the token should be refreshed ahead of expiry.
  public var refreshIn: Int64? = nil
  /// Entra: the family of client ids the refresh token belongs to ("1").
  public var foci: String? = nil
  /// Seconds the refresh token itself lasts (GitHub Apps: about 6 months); nil when unsaid.
  public var refreshTokenExpiresIn: Int64? = nil

  struct Wire: Decodable {
    var access_token: String?
    var token_type: String?
    var expires_in: FlexibleInt?
    var scope: String?
    var refresh_token: String?
    var id_token: String?
    var client_info: String?
    var ext_expires_in: FlexibleInt?
    var refresh_in: FlexibleInt?
    var foci: String?
    var refresh_token_expires_in: FlexibleInt?
    /// An OAuth error in a 200 answer (GitHub's token endpoint answers its errors so).
    var error: String?

    /// A form-encoded answer's fields, as the JSON form would carry them.
    init(form fields: [String: String]) {
      access_token = fields["access_token"]
      token_type = fields["token_type"]
      expires_in = fields["expires_in"].flatMap { Int64($0) }.map(FlexibleInt.init)
      scope = fields["scope"]
      refresh_token = fields["refresh_token"]
      id_token = fields["id_token"]
      client_info = fields["client_info"]
      ext_expires_in = fields["ext_expires_in"].flatMap { Int64($0) }.map(FlexibleInt.init)
      refresh_in = fields["refresh_in"].flatMap { Int64($0) }.map(FlexibleInt.init)
      foci = fields["foci"]
      refresh_token_expires_in = fields["refresh_token_expires_in"].flatMap { Int64($0) }.map(FlexibleInt.init)
      error = fields["error"]
    }
  }

  /// Entra sends some numbers as strings.
  struct FlexibleInt: Decodable {
    var value: Int64
    init(_ value: Int64) { self.value = value }
    init(from decoder: any Decoder) throws {
      let c = try decoder.singleValueContainer()
      if let n = try? c.decode(Int64.self) {
        value = n
      } else if let s = try? c.decode(String.self), let n = Int64(s) {
        value = n
      } else {
        throw DecodingError.dataCorruptedError(in: c, debugDescription: "not a number")
      }
    }
  }

  /// The `refresh_token` of a JSON object, whatever else it holds or lacks.
  public static func refreshToken(in body: [UInt8]) -> String? {
    struct Only: Decodable { var refresh_token: String? }
    let token = fields(body, as: Only.self) { Only(refresh_token: $0["refresh_token"]) }?.refresh_token
    return token.flatMap { $0.isEmpty ? nil : $0 }
  }

  /// The fields of a token endpoint's answer: a JSON object, or form-encoded (RFC 6749 §5.1 asks
  /// for JSON; GitHub answers form-encoded unless asked for JSON, and an answer is read either way).
  /// nil when it is neither.
  static func fields<T: Decodable>(_ body: [UInt8], as type: T.Type, form: ([String: String]) -> T) -> T? {
    let first = body.first { $0 != 0x20 && $0 != 0x09 && $0 != 0x0A && $0 != 0x0D }
    if first == UInt8(ascii: "{") { return try? JSONDecoder().decode(T.self, from: Data(body)) }
    // Any other JSON (a string, an array, a number) is no token answer, whatever it holds.
    if (try? JSONDecoder().decode(JSONValue.self, from: Data(body))) != nil { return nil }
    // Form-encoded: printable ASCII, with at least one name=value pair.
    guard !body.isEmpty, body.count <= 1 << 20, body.allSatisfy({ $0 > 0x20 && $0 < 0x7F }),
      body.contains(UInt8(ascii: "="))
    else { return nil }
    return form(FormEncoding.decode(String(decoding: body, as: UTF8.self)))
  }

  /// Scopes as RFC 6749 §3.3 writes them (space-separated), from an answer that may separate them
  /// with commas (GitHub: "repo,gist").
  static func normalizedScopes(_ scope: String?) -> String? {
    guard let scope, scope.contains(",") else { return scope }
    return scope.split(whereSeparator: { $0 == "," || $0 == " " }).joined(separator: " ")
  }

  public static func parse(_ body: [UInt8], endpoint: String) throws -> TokenResponse {
    guard let wire = fields(body, as: Wire.self, form: Wire.init(form:)) else {
      throw TesseraError.provider(
        "The token endpoint \(endpoint) answered with something that is not a token response (not JSON, nor form-encoded). Check the authority."
      )
    }
    if let error = wire.error, !error.isEmpty {
      // An error with HTTP 200: the same error as with 400.
      throw OAuthErrorResponse.map(status: 400, body: body, endpoint: endpoint, retryAfter: nil)
    }
    guard let token = wire.access_token, !token.isEmpty else {
      throw TesseraError.provider(
        "The token endpoint \(endpoint) answered without an access_token. Check the authority and client id.")
    }
    let expiresIn = wire.expires_in?.value
    if let expiresIn, expiresIn <= 0 || expiresIn > 366 * 86_400 {
      throw TesseraError.provider(
        "The token endpoint \(endpoint) answered with an invalid expires_in. Check the authority.")
    }
    // A refresh token's own lifetime is advice for the user (a warning before it lapses): a value
    // out of range is left out, not a reason to lose the answer's tokens.
    let refreshLifetime = wire.refresh_token_expires_in.map(\.value).flatMap {
      (1...(10 * 366 * 86_400)).contains($0) ? $0 : nil
    }
    return TokenResponse(
      accessToken: token, tokenType: wire.token_type ?? "Bearer", expiresIn: expiresIn,
      scope: normalizedScopes(wire.scope),
      refreshToken: wire.refresh_token, idToken: wire.id_token, clientInfo: wire.client_info,
      extExpiresIn: wire.ext_expires_in?.value, refreshIn: wire.refresh_in?.value,
      foci: wire.foci.flatMap { $0.isEmpty ? nil : $0 }, refreshTokenExpiresIn: refreshLifetime)
  }
}

/// An OAuth error answer (RFC 6749 §5.2, plus Entra's fields).
public struct OAuthErrorResponse: Decodable, Sendable {
  public var error: String
  public var error_description: String?
  public var error_codes: [Int]?
  public var suberror: String?
  /// Entra: a claims challenge to send with the next interactive request.
  public var claims: String?
  public var correlation_id: String?
  public var trace_id: String?
  /// RFC 8628 §3.5: a `slow_down` answer may give the new polling interval (GitHub's does).
  var interval: TokenResponse.FlexibleInt?
  /// The new polling interval a `slow_down` answer gave, in seconds.
  public var intervalSeconds: Int64? { interval?.value }

  public init(error: String) { self.error = error }

  /// A form-encoded error answer's fields.
  init(form fields: [String: String]) {
    error = fields["error"] ?? ""
    error_description = fields["error_description"]
    suberror = fields["suberror"]
    correlation_id = fields["correlation_id"]
    trace_id = fields["trace_id"]
    interval = fields["interval"].flatMap { Int64($0) }.map(TokenResponse.FlexibleInt.init)
  }

  /// The OAuth error of an answer, JSON or form-encoded; nil when it carries none.
  public static func decode(_ body: [UInt8]) -> OAuthErrorResponse? {
    guard let parsed = TokenResponse.fields(body, as: OAuthErrorResponse.self, form: OAuthErrorResponse.init(form:)),
      !parsed.error.isEmpty
    else { return nil }
    return parsed
  }

  static let interactionErrors: Set<String> = [
    "invalid_grant", "interaction_required", "consent_required", "login_required",
  ]

  /// What Entra's `suberror` values mean for the user (docs/errors.md).
  static let suberrorReasons: [String: String] = [
    "basic_action": "the user must complete a simple action at the identity provider, such as accepting terms of use",
    "additional_action":
      "the user must complete an additional step, such as registering for multi-factor authentication",
    "message_only": "the identity provider has a message for the user",
    "consent_required": "the user or an administrator must consent to the app's permissions",
    "user_password_expired": "the user's password has expired and must be changed",
    "bad_token": "the refresh token is no longer valid (revoked, or issued before a password change)",
    "token_expired": "the refresh token has expired",
    "protection_policy_required": "the organisation requires an app protection policy for this app",
    "client_mismatch": "the refresh token belongs to another app",
  ]

  /// Seconds from a Retry-After header (delta-seconds form), bounded to an hour.
  public static func retryAfterSeconds(_ header: String?) -> Int? {
    guard let header, let seconds = Int(header.trimmingSpaces()), seconds >= 0 else { return nil }
    return min(seconds, 3600)
  }

  /// Maps an error answer from a token endpoint to what the caller gets.
  public static func map(status: Int, body: [UInt8], endpoint: String, retryAfter: String?) -> TesseraError {
    if status >= 500 || status == 429 {
      let wait =
        retryAfterSeconds(retryAfter).map { " The IdP asked to wait \($0) s before retrying." }
        ?? " Try again in a moment."
      return .init(
        .network, "The identity provider at \(endpoint) is unavailable (HTTP \(status)).\(wait)",
        detail: ErrorDetail(httpStatus: status))
    }
    guard let parsed = decode(body) else {
      return .provider(
        "The token endpoint \(endpoint) answered HTTP \(status) with no OAuth error. Check the authority.")
    }
    // Everything below is the IdP's text: made safe to print and bounded before it reaches the
    // caller's terminal or the log.
    var detail = SafeText.clip(parsed.error, limit: 64)
    if let code = parsed.error_codes?.first { detail += " AADSTS\(code)" }
    if let description = parsed.error_description {
      var firstLine =
        description.split(whereSeparator: { $0 == "\n" || $0 == "\r\n" || $0 == "\r" }).first.map(String.init)
        ?? description
      if firstLine.hasPrefix("AADSTS"), let colon = firstLine.firstIndex(of: ":") {  // the code is there already
        firstLine = String(firstLine[firstLine.index(after: colon)...]).trimmingSpaces()
      }
      detail += ": " + SafeText.clip(firstLine, limit: 300)
    }
    if let suberror = parsed.suberror {
      detail += "; " + (suberrorReasons[suberror] ?? "suberror \(SafeText.clip(suberror, limit: 64))")
    }
    if let correlation = parsed.correlation_id {
      detail += " [IdP correlation id \(SafeText.clip(correlation, limit: 64))]"
    }
    if let trace = parsed.trace_id { detail += " [trace id \(SafeText.clip(trace, limit: 64))]" }
    var mapped = classify(parsed.error, detail: detail)
    mapped.detail = ErrorDetail(
      oauthError: SafeText.clip(parsed.error, limit: 64),
      suberror: parsed.suberror.map { SafeText.clip($0, limit: 64) },
      providerCode: parsed.error_codes?.first, httpStatus: status)
    if let claims = parsed.claims, !claims.isEmpty, mapped.code == .interactionRequired {
      mapped.message += " Retry AcquireToken with the option claims set to: \(SafeText.clip(claims, limit: 2048))"
    }
    return mapped
  }

  /// The one mapping from an OAuth error code (token endpoint or authorization redirect) to what
  /// the caller gets. `detail` is the code plus the IdP's description and ids; never a token.
  public static func classify(_ error: String, detail: String) -> TesseraError {
    if interactionErrors.contains(error) || redirectInteractionErrors.contains(error) {
      return .interactionRequired(
        "The identity provider needs you to sign in interactively (\(detail)). Run AcquireToken without prompt=none, or `tessera login`."
      )
    }
    switch error {
    case "access_denied", "authorization_declined":
      return .accessDenied("The identity provider denied the request (\(detail)).")
    case "authorization_pending", "slow_down":
      return .provider("Unexpected \(error) outside a device-code flow (\(detail)).")
    case "expired_token":
      return .timedOut("The device code expired before sign-in finished (\(detail)). Start again.")
    case "invalid_scope":
      return .invalidArgument(
        "The identity provider rejected the scopes (\(detail)). Check the scopes your app is allowed.")
    case "invalid_client", "unauthorized_client", "incorrect_client_credentials":  // the last: GitHub's
      return .invalidArgument(
        "The identity provider rejected the client id (\(detail)). Check the app registration (a public client with the needed redirect or grant), or the provider's client secret (its client_secret_file; GitHub's browser sign-in needs one)."
      )
    case "invalid_dpop_proof":
      // RFC 9449 §5: a proof the server would not take. The usual cause on a machine whose key is
      // fine is its clock: the proof's `iat` is outside the server's window.
      return .provider(
        "The identity provider refused this machine's DPoP proof (\(detail)). If this machine's clock is off, set it right (timedatectl set-ntp true) and try again; if the provider stopped taking proofs, set dpop = \"off\" for it in config.toml and sign in again."
      )
    case "use_dpop_nonce":
      return .provider(
        "The identity provider asked twice for a new DPoP nonce (\(detail)). Try again in a moment; if it keeps asking, set dpop = \"off\" for it in config.toml and sign in again."
      )
    case "temporarily_unavailable", "server_error":
      return .network("The identity provider is temporarily unavailable (\(detail)). Try again in a moment.")
    default:
      return .provider("The identity provider refused the request (\(detail)).")
    }
  }

  /// Errors only an authorization redirect carries (OIDC Core §3.1.2.6).
  static let redirectInteractionErrors: Set<String> = ["account_selection_required"]
}

/// Entra's `client_info`: base64url JSON {uid, utid}.
public struct ClientInfo: Decodable, Sendable {
  public var uid: String
  public var utid: String

  public static func decode(_ text: String) -> ClientInfo? {
    guard let data = Base64URL.decode(text) else { return nil }
    return try? JSONDecoder().decode(ClientInfo.self, from: data)
  }
}
