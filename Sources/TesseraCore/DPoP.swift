import Crypto
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// DPoP (RFC 9449): tokens bound to a key of this machine. Each sign-in makes a key of its own
/// (in the TPM when there is one the user may use, else in software); the refresh token and access
/// tokens it brings, and every refresh of them, are bound to that key, and the key goes with the
/// last token bound to it. One key per sign-in rather than per provider: no identity provider can
/// tell that two accounts (or one account signed in twice) live on one machine by their key
/// (docs/dpop.md says more).
public enum DPoP {
  /// The one algorithm the broker's keys sign with: ECDSA P-256 with SHA-256, which every TPM 2.0
  /// has and every DPoP server takes.
  public static let algorithm = "ES256"
  /// A proof's `typ` (§4.2).
  static let type = "dpop+jwt"
  /// The token type of a bound token (§5), compared without case.
  public static let tokenType = "DPoP"

  /// `htu`: the target URI without its query and fragment (§4.2).
  static func target(_ url: String) -> String {
    String(url.prefix { $0 != "?" && $0 != "#" })
  }

  /// `ath`: base64url of the SHA-256 of the access token (§4.2).
  static func tokenHash(_ accessToken: String) -> String {
    Base64URL.encode(SHA256.hash(data: Array(accessToken.utf8)))
  }

  /// Whether a token response's `token_type` says the token is bound.
  public static func isBound(tokenType: String) -> Bool { tokenType.lowercased() == "dpop" }
}

/// A P-256 public key as the JWK a proof carries (RFC 7518 §6.2.1).
public struct ProofJWK: Codable, Sendable, Hashable {
  public var kty: String
  public var crv: String
  public var x: String
  public var y: String

  /// From the key's uncompressed point (0x04, then X and Y, 32 bytes each) or X and Y alone.
  public init(point: [UInt8]) throws {
    let xy = point.count == 65 && point.first == 4 ? Array(point.dropFirst()) : point
    guard xy.count == 64 else {
      throw TesseraError.internal("A P-256 public key is 64 bytes, not \(xy.count).")
    }
    (kty, crv) = ("EC", "P-256")
    x = Base64URL.encode(xy[0..<32])
    y = Base64URL.encode(xy[32..<64])
  }

  /// RFC 7638: SHA-256 over the required members in lexicographic order, base64url. The server
  /// binds tokens to this (`cnf.jkt`).
  public var thumbprint: String {
    Base64URL.encode(SHA256.hash(data: Array(#"{"crv":"\#(crv)","kty":"\#(kty)","x":"\#(x)","y":"\#(y)"}"#.utf8)))
  }
}

/// Where a proof key lives.
public enum ProofKeyKind: String, Codable, Sendable {
  /// Made by the TPM and never out of it: the store keeps only the TPM's wrapped copy, which no
  /// other TPM can load.
  case tpm
  /// Made in software: its private part is kept in the store as a refresh token is.
  case software
}

/// A key tokens are bound to, as the store keeps it: its public key, what kind it is, and the
/// blob its source signs with (software: the private scalar; TPM: the TPM's wrapped key).
public struct ProofKeyRecord: Codable, Sendable, Equatable {
  public var accountID: String
  public var kind: ProofKeyKind
  public var jwk: ProofJWK
  public var blob: String
  /// Unix seconds.
  public var createdAt: Int64

  public init(accountID: String, kind: ProofKeyKind, jwk: ProofJWK, blob: String, createdAt: Int64) {
    self.accountID = accountID
    self.kind = kind
    self.jwk = jwk
    self.blob = blob
    self.createdAt = createdAt
  }

  /// The key's RFC 7638 thumbprint: what refresh and access tokens name as theirs.
  public var thumbprint: String { jwk.thumbprint }
}

/// Where proof keys are made and used: the TPM when there is one the user may use, else
/// software. Creating and signing may block (a TPM round trip): implementations do it on a thread
/// of their own, never on the caller's.
public protocol ProofKeySource: Sendable {
  /// The kind of key `create` makes.
  var kind: ProofKeyKind { get }
  /// What `tessera status` says of it, in words: where the keys are, and why not in a TPM.
  var summary: String { get }
  /// A new key: where it is (a TPM that fails makes it in software instead), its public key and
  /// the blob `sign` needs.
  func create() async throws -> (kind: ProofKeyKind, jwk: ProofJWK, blob: String)
  /// ES256 over `input`: the signature as R and S, 32 bytes each (RFC 7518 §3.4). A blob this
  /// source can no longer use (a TPM that was cleared) throws `TesseraError.interactionRequired`.
  func sign(_ input: [UInt8], kind: ProofKeyKind, blob: String) async throws -> [UInt8]
}

/// Keys made in software with swift-crypto (P-256); signing takes microseconds, so it runs where
/// it is called. A key once read from its blob is kept read (a few dozen at most): reading one
/// derives its public key, which costs as much as a signature.
public struct SoftwareProofKeys: ProofKeySource {
  public let summary: String
  /// By the blob's bytes (not String equality, which is Unicode's canonical equivalence).
  private let read = Locked<[[UInt8]: P256.Signing.PrivateKey]>([:])
  private static let readLimit = 64

  public init(summary: String = "software keys, kept in the store with the refresh tokens") {
    self.summary = summary
  }

  public var kind: ProofKeyKind { .software }

  public func create() async throws -> (kind: ProofKeyKind, jwk: ProofJWK, blob: String) {
    let key = P256.Signing.PrivateKey()
    return (
      .software, try ProofJWK(point: Array(key.publicKey.x963Representation)), Base64URL.encode(key.rawRepresentation)
    )
  }

  public func sign(_ input: [UInt8], kind: ProofKeyKind, blob: String) async throws -> [UInt8] {
    guard kind == .software, let key = key(blob) else {
      throw TesseraError.interactionRequired(
        "needs sign-in: this machine's key changed (the key its tokens are bound to cannot be used here). Sign in again."
      )
    }
    return Array(try key.signature(for: input).rawRepresentation)
  }

  private func key(_ blob: String) -> P256.Signing.PrivateKey? {
    let bytes = Array(blob.utf8)
    if let key = read.withLock({ $0[bytes] }) { return key }
    guard let raw = Base64URL.decode(blob), let key = try? P256.Signing.PrivateKey(rawRepresentation: raw) else {
      return nil
    }
    read.withLock {
      if $0.count >= Self.readLimit { $0.removeAll() }
      $0[bytes] = key
    }
    return key
  }
}

/// A DPoP proof (RFC 9449 §4.2): a JWS whose header carries the public key. jwt-kit signs only
/// with keys it holds, and a TPM's key never leaves the TPM, so the two JSON parts are encoded
/// here and the signature comes from the key's source; the tests check every proof with jwt-kit.
public enum ProofBuilder {
  struct Header: Encodable {
    var typ = DPoP.type
    var alg = DPoP.algorithm
    var jwk: ProofJWK
  }

  struct Claims: Codable {
    var jti: String
    var htm: String
    var htu: String
    var iat: Int64
    var nonce: String?
    var ath: String?
  }

  /// A key's header part is the same in each of its proofs: encoded once (for a few dozen keys).
  private static let headers = Locked<[ProofJWK: String]>([:])

  static func header(_ jwk: ProofJWK, encoder: JSONEncoder) throws -> String {
    if let part = headers.withLock({ $0[jwk] }) { return part }
    let part = Base64URL.encode(try encoder.encode(Header(jwk: jwk)))
    headers.withLock {
      if $0.count >= 64 { $0.removeAll() }
      $0[jwk] = part
    }
    return part
  }

  public static func proof(
    key: ProofKeyRecord, source: any ProofKeySource, method: String, url: String, now: Date, nonce: String?,
    accessToken: String? = nil
  ) async throws -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    let claims = Claims(
      jti: UUID().uuidString.lowercased(), htm: method.uppercased(), htu: DPoP.target(url),
      iat: Int64(now.timeIntervalSince1970), nonce: nonce, ath: accessToken.map(DPoP.tokenHash))
    let input = try header(key.jwk, encoder: encoder) + "." + Base64URL.encode(try encoder.encode(claims))
    let signature = try await source.sign(Array(input.utf8), kind: key.kind, blob: key.blob)
    guard signature.count == 64 else {
      throw TesseraError.internal("An ES256 signature is 64 bytes; the key's source gave \(signature.count).")
    }
    return input + "." + Base64URL.encode(signature)
  }
}
