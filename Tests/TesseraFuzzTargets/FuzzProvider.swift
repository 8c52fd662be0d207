import Foundation
import JWTKit
import TesseraCore
import TesseraEngineFakes
import TesseraInterface

/// A hostile identity provider, driven through the engine as a user drives it: a device-code
/// sign-in (discovery, the device authorization, the token endpoint's answers while polling, the
/// id_token checked against the JWKS), then a silent token, a forced refresh and a sign-out that
/// revokes. Every answer comes from the input, cut at "\n--\n" into:
///
/// 0. the discovery document; 1. the JWKS (empty: the fixed key's); 2. the device authorization;
/// 3. the token endpoint's answer, where `ID_TOKEN` stands for the id_token; 4. the id_token: a
/// JSON object of claims, signed with the fixed key (so that the claim checks are reached), or
/// anything else, sent as it is; 5. the revocation endpoint's answer; 6. when present, the
/// answer of a provider's user API: the sign-in then goes through a `[[provider]]` (the github
/// profile on a server of its own: endpoints written out, no id_token trusted, the account named
/// by the user API, form-encoded answers read), issue 38; 7. when it is `rfc8414`, the provider
/// is instead a plain OAuth 2.0 server with RFC 8414 metadata (part 0, served at
/// `/.well-known/oauth-authorization-server/as`), whose userinfo endpoint answers part 6.
///
/// A part that starts with `HTTP 429\n` (any three digits) is sent with that status, else 200;
/// a `DPoP-Nonce: VALUE\n` line after it is sent as that header (RFC 9449's server nonce). The
/// engine has DPoP keys (software): discovery that lists ES256 in
/// `dpop_signing_alg_values_supported` sends proofs, and the answers' nonces, `use_dpop_nonce` and
/// `invalid_dpop_proof` errors and token types are read as from a server that binds tokens; after
/// the sign-in, a proof for the access token is asked for (GetProof). Each input meets a fresh
/// engine (fake clock, fake keyring), so inputs do not depend on each other.
enum FuzzProvider {
  /// A P-256 key made for these tests only (it signs nothing anywhere else).
  static let pem = """
    -----BEGIN PRIVATE KEY-----
    MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg2W7KLlr1yIQ5m5CV
    uOqlf2lK0ez22Df+4DIEEokOiBmhRANCAAQ+7dChaQAPZrxSPA2DPpUUJhnVrJ/3
    u9ryDXqT/EbgYt5LCp5lSRwp128kCNL8Lj0dwvwWzF+PEmpncU1OGXc7
    -----END PRIVATE KEY-----
    """
  static let key = try! ES256PrivateKey(pem: pem)
  static let kid = "fuzz"
  static let jwks = #"{"keys":[\#(FakeIdP.jwk(key.parameters!, kid: kid))]}"#

  /// Claims the fuzzer wrote, signed as they are.
  struct RawClaims: JWTPayload {
    var value: JSONValue
    init(_ value: JSONValue) { self.value = value }
    init(from decoder: any Decoder) throws { value = try JSONValue(from: decoder) }
    func encode(to encoder: any Encoder) throws { try value.encode(to: encoder) }
    func verify(using algorithm: some JWTAlgorithm) async throws {}
  }

  static func response(_ part: [UInt8]) -> HTTPResponse {
    let prefix = Array("HTTP ".utf8)
    if part.count >= 9, Array(part[0..<5]) == prefix, part[8] == UInt8(ascii: "\n"),
      let status = Int(String(decoding: part[5..<8], as: UTF8.self))
    {
      var headers = ["retry-after": "1"]
      var body = Array(part[9...])
      let nonce = Array("DPoP-Nonce: ".utf8)
      if body.starts(with: nonce), let end = body.firstIndex(of: UInt8(ascii: "\n")) {
        headers["dpop-nonce"] = String(decoding: body[nonce.count..<end], as: UTF8.self)
        body = Array(body[(end + 1)...])
      }
      return HTTPResponse(status: status, headers: headers, body: body)
    }
    return HTTPResponse(status: 200, body: part)
  }

  final class HostileIdP: HTTPClient, Sendable {
    let discovery: HTTPResponse
    let jwks: HTTPResponse
    let device: HTTPResponse
    let token: HTTPResponse
    let revocation: HTTPResponse
    let userAPI: HTTPResponse

    init(_ parts: [[UInt8]], idToken: String) {
      func part(_ i: Int) -> [UInt8] { i < parts.count ? parts[i] : [] }
      discovery = response(part(0))
      jwks = part(1).isEmpty ? HTTPResponse(status: 200, body: Array(FuzzProvider.jwks.utf8)) : response(part(1))
      device = response(part(2))
      var answer = response(part(3))
      answer.body = Array(String(decoding: answer.body, as: UTF8.self).replacing("ID_TOKEN", with: idToken).utf8)
      token = answer
      revocation = response(part(5))
      userAPI = response(part(6))
    }

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
      if request.method == "GET" {
        if request.url.hasSuffix("/user") || request.url.hasSuffix("/userinfo") { return userAPI }
        let metadata =
          request.url.hasSuffix("/.well-known/openid-configuration")
          || request.url.contains("/.well-known/oauth-authorization-server")
        return metadata ? discovery : jwks
      }
      let form = FormEncoding.decode(String(decoding: request.body ?? [], as: UTF8.self))
      if form["token"] != nil { return revocation }
      if form["grant_type"] != nil { return token }
      return device
    }
  }

  static func idToken(_ part: [UInt8]) async -> String {
    guard part.first == UInt8(ascii: "{"), let claims = try? JSONDecoder().decode(JSONValue.self, from: Data(part))
    else { return String(decoding: part, as: UTF8.self) }
    let keys = JWTKeyCollection()
    await keys.add(ecdsa: key, kid: JWKIdentifier(string: kid))
    return (try? await keys.sign(RawClaims(claims), kid: JWKIdentifier(string: kid))) ?? ""
  }

  /// The provider inputs with a user API sign in through: GitHub's profile on a server of its own.
  static let provider: [ProviderConfig] =
    (try? ConfigLayer.parse(
      bytes: Array(
        "[[provider]]\nname = \"fuzz\"\nprofile = \"github\"\nhost = \"idp.test\"\nclient_id = \"app1\"\n".utf8),
      path: "fuzz.toml", isSystem: false
    ).providers) ?? []

  /// The provider of inputs whose part 7 is `rfc8414`: endpoints from RFC 8414 metadata.
  static let rfc8414: [ProviderConfig] =
    (try? ConfigLayer.parse(
      bytes: Array(
        "[[provider]]\nname = \"fuzz\"\ndiscovery = \"oauth\"\nissuer = \"https://idp.test/as\"\nclient_id = \"app1\"\n"
          .utf8),
      path: "fuzz.toml", isSystem: false
    ).providers) ?? []

  /// Whether the sign-in succeeded (the replay tests check that the seeds get that far).
  @discardableResult
  static func run(_ input: [UInt8]) async -> Bool {
    let parts = input.sections()
    let idp = HostileIdP(parts, idToken: await idToken(parts.count > 4 ? parts[4] : []))
    let clock = FakeClock()
    var config = BrokerConfig.fakeIdP
    config.accessMode = .open
    config.notifyFirstUse = false
    let throughProvider = parts.count > 6 && !parts[6].isEmpty
    var options: [String: BusValue] = [:]
    if throughProvider {
      config.providers = parts.count > 7 && parts[7] == Array("rfc8414".utf8) ? rfc8414 : provider
      options[RequestOptions.provider.key] = .string("fuzz")
    }
    var dependencies = BrokerDependencies(
      http: idp, store: FakeStore(), browser: NoBrowser(),
      listeners: FakeListeners(answer: { ["code": "c", "state": $0] }), events: RecordingEvents(), clock: clock)
    dependencies.proofKeys = SoftwareProofKeys()
    let broker = Broker(config: config, dependencies: dependencies, logger: quiet)
    let front = TesseraFront(broker: broker, logger: quiet, clock: clock)
    // An app the broker identified: it may ask for proofs for the tokens it is handed.
    let caller = CallerInfo(
      busName: ":1.42", pid: 42, uid: 1000, app: AppIdentity(kind: .executable, id: "/usr/bin/fuzz"))
    guard
      let signIn = try? RequestParser.tokenRequest(
        clientID: "", scopes: [], accountID: "",
        options: options.merging([RequestOptions.flow.key: .string("device_code")]) { $1 }),
      let result = try? await front.signIn(signIn, caller: caller),
      let accountID = result["account"]?.dictValue?["id"]?.stringValue
    else { return false }
    if let token = result["access_token"]?.stringValue {
      _ = try? await broker.proof(
        method: "GET", url: "https://api.idp.test/r?q=1", accessToken: token, nonce: "n", caller: caller)
    }
    for more: [String: BusValue] in [[:], [RequestOptions.forceRefresh.key: .bool(true)]] {
      if let silent = try? RequestParser.tokenRequest(
        clientID: "", scopes: [], accountID: accountID, options: options.merging(more) { $1 })
      {
        _ = try? await front.silentToken(silent)
      }
    }
    if let signOut = try? RequestParser.signOutRequest(accountID: accountID, options: [:]) {
      try? await broker.signOut(signOut)
    }
    return true
  }
}
