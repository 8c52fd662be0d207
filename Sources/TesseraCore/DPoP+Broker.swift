import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// DPoP at the token endpoint (RFC 9449 §5): which requests carry a proof, with which key and
/// nonce, and what a server's answer means.
extension Broker {
  /// `dpop` for an authority: its `[[provider]]` table's, else the top-level key's.
  func dpopMode(for authority: Authority, clientID: String) -> DPoPMode {
    config.provider(for: authority, clientID: clientID)?.dpop ?? config.dpop
  }

  /// The key a sign-in's tokens will be bound to: a new one where the server takes proofs and the
  /// configuration does not say `off`; nil for bearer tokens. `required` at a server that does not
  /// bind fails here, before the browser opens or a code is shown.
  func signInProofKey(metadata: OIDCMetadata, authority: Authority, clientID: String) async throws -> ProofKeyRecord? {
    let mode = dpopMode(for: authority, clientID: clientID)
    guard mode != .off, let source = deps.proofKeys else { return nil }
    guard metadata.supportsDPoP else {
      guard mode == .required else { return nil }
      throw TesseraError.configuration(
        "dpop = \"required\" for \(authority.url), but its server does not bind tokens to a key (its metadata lists no \(DPoP.algorithm) in dpop_signing_alg_values_supported), so no token was asked for. Set dpop = \"auto\" or \"off\" for it in config.toml to take bearer tokens."
      )
    }
    let made = try await source.create()
    return ProofKeyRecord(
      accountID: "", kind: made.kind, jwk: made.jwk, blob: made.blob,
      createdAt: Int64(deps.clock.now().timeIntervalSince1970))
  }

  /// The key a refresh token is bound to; nil for a bearer token. A key this machine no longer
  /// has means the account must sign in again (and nothing else is lost).
  func refreshProofKey(_ record: RefreshTokenRecord, account: Account) throws -> ProofKeyRecord? {
    guard let thumbprint = record.proofKey else { return nil }
    guard let key = cache.proofKeys[thumbprint], deps.proofKeys != nil else {
      throw TesseraError.interactionRequired(
        "\(account.username) needs sign-in: this machine's key changed (the key its refresh token is bound to is gone). Sign in again."
      )
    }
    return key
  }

  /// The `DPoP` header for a request to `url` made with `key`, carrying the last nonce its server
  /// sent (returned too, to tell a retry from a repeat); no header without a key.
  func proofHeaders(_ key: ProofKeyRecord?, method: String = "POST", url: String, accessToken: String? = nil)
    async throws -> (headers: [(String, String)], nonce: String?)
  {
    guard let key else { return ([], nil) }
    guard let source = deps.proofKeys else {
      throw TesseraError.interactionRequired("This machine cannot use DPoP keys now. Sign in again.")
    }
    let nonce = dpopNonces[Self.origin(url)]
    let proof = try await ProofBuilder.proof(
      key: key, source: source, method: method, url: url, now: deps.clock.now(), nonce: nonce,
      accessToken: accessToken)
    return ([("DPoP", proof)], nonce)
  }

  /// Keeps the nonce a server sent (`DPoP-Nonce`, §8) for its next proof. Whether the request that
  /// got `response` goes once more with it: the server asked for its nonce (use_dpop_nonce), the
  /// proof did not carry that nonce (another request may have kept it meanwhile: what counts is
  /// what this proof carried), and this was not the retry already.
  func noteNonce(_ response: HTTPResponse, url: String, sent: String?, retried: Bool) -> Bool {
    guard let nonce = response.headers["dpop-nonce"], Self.isNonce(nonce) else { return false }
    let origin = Self.origin(url)
    if dpopNonces[origin] != nonce {
      if dpopNonces.count >= 64 { dpopNonces.removeAll() }  // bounded: nonces are only ever a hint
      dpopNonces[origin] = nonce
    }
    return !retried && nonce != sent && Self.asksForNonce(response)
  }

  /// NQCHAR (RFC 9449 §8.1): visible ASCII but `"` and `\`; 1 to 1024 of them.
  static func isNonce(_ value: String) -> Bool {
    !value.isEmpty && value.utf8.count <= 1024
      && value.utf8.allSatisfy { (0x21...0x7E).contains($0) && $0 != 0x22 && $0 != 0x5C }
  }

  /// Whether an answer asks for a proof with the nonce it carries (§8: `use_dpop_nonce`, in the
  /// body at a token endpoint, in WWW-Authenticate at a resource).
  static func asksForNonce(_ response: HTTPResponse) -> Bool {
    guard response.status == 400 || response.status == 401, response.headers["dpop-nonce"] != nil else {
      return false
    }
    return OAuthErrorResponse.decode(response.body)?.error == "use_dpop_nonce"
      || (response.headers["www-authenticate"]?.contains("use_dpop_nonce") ?? false)
  }

  /// `scheme://host[:port]` of a URL: nonces are a server's.
  static func origin(_ url: String) -> String {
    guard let colon = url.firstIndex(of: ":"), url[colon...].hasPrefix("://") else { return url }
    let rest = url[url.index(colon, offsetBy: 3)...]
    let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
    // Never credentials in it (it reaches the log): the host and port alone.
    let host = authority.lastIndex(of: "@").map { authority[authority.index(after: $0)...] } ?? authority
    return String(url[..<colon]).lowercased() + "://" + host.lowercased()
  }

  /// A token answer to a request that carried a proof: whether its access token is bound (its
  /// `token_type` says DPoP). A sign-in where dpop = "required" and the answer is not bound is
  /// refused; a refresh of a bound refresh token is not (that token stays bound whatever type
  /// the access token has: RFC 9449 §5 binds a public client's refresh token to the key).
  func checkBinding(
    _ response: TokenResponse, key: ProofKeyRecord?, authority: Authority, clientID: String,
    redeemed: RefreshTokenRecord?
  ) throws -> Bool {
    guard key != nil else { return false }
    if DPoP.isBound(tokenType: response.tokenType) { return true }
    if dpopMode(for: authority, clientID: clientID) == .required && redeemed?.proofKey == nil {
      throw TesseraError.provider(
        "\(authority.url) answered with a \(SafeText.clip(response.tokenType, limit: 32)) token, not one bound to this machine's key, though dpop = \"required\" for it; the token was not kept. Set dpop = \"auto\" for it in config.toml to take bearer tokens."
      )
    }
    return false
  }
}
