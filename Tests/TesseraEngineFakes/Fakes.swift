import JWTKit
import Logging
import TesseraCore
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// The engine's fakes (the unit tests of TesseraCore and the fuzz targets use them): a clock,
/// a keyring, signals, a redirect listener, a browser and a scripted identity provider, wired into
/// a broker by Harness. For pure logic only: the e2e tests run the real parts.

/// A clock the test moves; `sleep` advances it instead of waiting.
package final class FakeClock: BrokerClock, Sendable {
  package init() {}
  package let current = Locked<Date>(Date(timeIntervalSince1970: 1_800_000_000))
  package let sleeps = Locked<[Double]>([])
  /// Seconds awake, and elapsed: both move with `advance` and `sleep`; `suspend` moves the wall
  /// clock and elapsed time only, `jump` (the clock set) the wall clock only.
  package let awakeSeconds = Locked<Double>(0)
  package let elapsedSeconds = Locked<Double>(0)
  package func now() -> Date { current.withLock { $0 } }
  package func awake() -> Double { awakeSeconds.withLock { $0 } }
  package func elapsed() -> Double { elapsedSeconds.withLock { $0 } }
  package func advance(_ seconds: Double) {
    current.withLock { $0 = $0.addingTimeInterval(seconds) }
    awakeSeconds.withLock { $0 += seconds }
    elapsedSeconds.withLock { $0 += seconds }
  }
  package func suspend(_ seconds: Double) {
    current.withLock { $0 = $0.addingTimeInterval(seconds) }
    elapsedSeconds.withLock { $0 += seconds }
  }
  package func jump(_ seconds: Double) { current.withLock { $0 = $0.addingTimeInterval(seconds) } }
  package func sleep(seconds: Double) async throws {
    try Task.checkCancellation()
    sleeps.withLock { $0.append(seconds) }
    advance(seconds)
    await Task.yield()
  }
}

/// An in-memory Secret Service that can be "locked".
package final class FakeStore: SecretStore, Sendable {
  package init() {}
  package let items = Locked<[StoredItem]>([])
  package let locked = Locked(false)
  /// Every item saved, in order.
  package let saved = Locked<[StoredItem]>([])

  /// When set, loads wait until it is cleared (a keyring that does not answer).
  package let hangLoads = Locked(false)
  package func loadAll() async throws -> [StoredItem] {
    while hangLoads.withLock({ $0 }) { try await Task.sleep(nanoseconds: 1_000_000) }
    if locked.withLock({ $0 }) { throw TesseraError.storeUnavailable("locked") }
    return items.withLock { $0 }
  }
  package func probe(withinSeconds seconds: Double) async throws {
    if hangLoads.withLock({ $0 }) { throw TesseraError.storeUnavailable("the fake keyring does not answer") }
    if locked.withLock({ $0 }) { throw TesseraError.storeUnavailable("locked") }
  }
  /// Items of this kind are refused while the store is unlocked (as a keyring refuses a bad item).
  package let refusedKind = Locked<String?>(nil)
  package func save(_ item: StoredItem) async throws {
    if locked.withLock({ $0 }) { throw TesseraError.storeUnavailable("locked") }
    if let kind = refusedKind.withLock({ $0 }), item.attributes["kind"] == kind {
      throw StoreRejectedError("the keyring refused the \(kind) item")
    }
    items.withLock { items in
      items.removeAll { $0.attributes == item.attributes }
      items.append(item)
    }
    saved.withLock { $0.append(item) }
  }
  package func delete(matching attributes: [String: String]) async throws {
    if locked.withLock({ $0 }) { throw TesseraError.storeUnavailable("locked") }
    items.withLock { items in items.removeAll { item in attributes.allSatisfy { item.attributes[$0.key] == $0.value } }
    }
  }
  package func secrets(kind: String) -> [String] {
    items.withLock { $0.filter { $0.attributes["kind"] == kind }.map(\.secret) }
  }
}

package struct NoBrowser: BrowserLauncher {
  package init() {}
  package func open(_ url: String) throws {}
}

/// Records signals.
package final class RecordingEvents: BrokerEvents, Sendable {
  package init() {}
  package let pending = Locked<[(String, [String: BusValue])]>([])
  package let accountsChangedCount = Locked(0)
  package let attention = Locked<[[String]]>([])
  package let needs = Locked<[SignInNeed]>([])
  package let resolved = Locked<[String]>([])
  package func attentionChanged(_ accountIDs: [String]) { attention.withLock { $0.append(accountIDs) } }
  package func signInNeeded(_ need: SignInNeed) { needs.withLock { $0.append(need) } }
  package func signInNoLongerNeeded(accountID: String) { resolved.withLock { $0.append(accountID) } }
  package func interactionPending(destination: String, correlationID: String, info: InteractionInfo) {
    pending.withLock { $0.append((destination, info.busValue)) }
  }
  package func accountsChanged() { accountsChangedCount.withLock { $0 += 1 } }
  package let firstUses = Locked<[FirstUse]>([])
  package func appFirstUsedAccount(_ use: FirstUse) { firstUses.withLock { $0.append(use) } }
  package let management = Locked<[BrokerInterface.ManagementPart]>([])
  package func managementChanged(_ part: BrokerInterface.ManagementPart) { management.withLock { $0.append(part) } }
  package let questions = Locked<[(destination: String, id: String, info: [String: BusValue])]>([])
  package func question(destination: String, id: String, info: [String: BusValue]) {
    questions.withLock { $0.append((destination, id, info)) }
  }
}

/// A redirect listener that answers with what the test says, given the authorization URL.
package final class FakeListeners: RedirectListenerFactory, Sendable {
  package let lastAuthorizationURL = Locked<String?>(nil)
  package let answer: @Sendable (_ state: String) -> RedirectParameters
  /// When set, the listener waits until cancelled (a user who never finishes signing in).
  package let hang = Locked(false)
  /// How many start URLs a browser came for without a redirect back (a sign-out page).
  package let startsServed = Locked(0)
  package init(answer: @escaping @Sendable (_ state: String) -> RedirectParameters) { self.answer = answer }

  package struct Listener: RedirectListener {
    package let redirectURI = "http://127.0.0.1:4711/"
    package let owner: FakeListeners
    package func waitForRedirect(state: String, timeoutSeconds: Double) async throws -> RedirectParameters {
      if owner.hang.withLock({ $0 }) {
        try await Task.sleep(nanoseconds: 60_000_000_000)
      }
      // The broker has announced the URL (InteractionPending) before waiting; the test's IdP reads state from it.
      guard let url = owner.lastAuthorizationURL.withLock({ $0 }) else { throw TesseraError.timedOut("no url") }
      let query = FormEncoding.decode(String(url.split(separator: "?", maxSplits: 1)[1]))
      return owner.answer(query["state"] ?? "")
    }
    package func startURL(opening authorizationURL: String) -> String {
      owner.lastAuthorizationURL.withLock { $0 = authorizationURL }
      return "http://127.0.0.1:4711/start/0123"
    }
    package func waitForStart(timeoutSeconds: Double) async throws {
      owner.startsServed.withLock { $0 += 1 }
    }
    package func close() {}
  }
  package func listen(port: UInt16, hostName: String) throws -> any RedirectListener { Listener(owner: self) }
}

/// Browser that records the URL, so the fake listener can echo `state`.
package struct RecordingBrowser: BrowserLauncher {
  package let listeners: FakeListeners
  package let idp: FakeIdP
  package init(listeners: FakeListeners, idp: FakeIdP) {
    self.listeners = listeners
    self.idp = idp
  }
  package func open(_ url: String) throws {
    // The broker opens the listener's start URL, which leads to the authorization URL.
    guard url.hasPrefix("http://127.0.0.1:4711/start/"), let url = listeners.lastAuthorizationURL.withLock({ $0 })
    else { throw TesseraError.internal("the browser was given \(url), not the listener's start URL") }
    let query = FormEncoding.decode(String(url.split(separator: "?", maxSplits: 1)[1]))
    idp.lastNonce.withLock { $0 = query["nonce"] }
  }
}

/// A scripted OpenID provider: discovery, JWKS, token endpoint; id_tokens signed with ES256.
package final class FakeIdP: HTTPClient, Sendable {
  package static let authority = "https://idp.test/tenant1"
  package let keys: JWTKeyCollection
  package let jwks: Locked<String>
  /// The key id id_tokens are signed with.
  package let signingKid = Locked("k1")
  package let clock: FakeClock
  package let requests = Locked<[HTTPRequest]>([])
  /// Answers for token-endpoint POSTs, in order; when empty, a fresh token is issued.
  package let scriptedTokenAnswers = Locked<[HTTPResponse]>([])
  package let tokenCounter = Locked(0)
  /// expires_in of every access token issued.
  package let accessTokenSeconds = Locked(3600)
  /// Awaited before answering a token request (to hold concurrent requests in flight).
  package let tokenDelay = Locked<Double>(0)
  /// Token requests wait here while it is shut: a test holds one in flight until it opens it.
  package let tokenGate = Gate()
  package let subject = Locked("alice-sub")
  /// Appended to every issued token response, e.g. `,"refresh_in":600`.
  package let extraTokenFields = Locked("")
  /// When set, a token answer grants the scopes the request asked for (else always "read"), as a
  /// provider that binds refresh tokens to their scopes does.
  package let echoScopes = Locked(false)
  /// Clients whose refresh requests are refused with invalid_grant.
  package let refusedClients = Locked<Set<String>>([])
  package let audienceOverride = Locked<String?>(nil)
  /// The discovery document's end_session_endpoint (RP-Initiated Logout); none when nil.
  package let endSessionEndpoint = Locked<String?>(nil)
  /// A DPoP server (RFC 9449) when set: see FakeDPoPServer.
  package let dpop = Locked<FakeDPoPServer?>(nil)

  package init(clock: FakeClock) async {
    let key = ES256PrivateKey()
    keys = JWTKeyCollection()
    await keys.add(ecdsa: key, kid: "k1")
    let p = key.parameters!
    jwks = Locked(#"{"keys":[\#(Self.jwk(p, kid: "k1"))]}"#)
    self.clock = clock
  }

  package static func jwk(_ p: ECDSAParameters, kid: String) -> String {
    #"{"kty":"EC","crv":"P-256","use":"sig","alg":"ES256","kid":"\#(kid)","x":"\#(p.x)","y":"\#(p.y)"}"#
  }

  /// Signs from now on with a new key `kid`; `publish` puts it in the JWKS (else the IdP "forgot").
  package func rotateKey(to kid: String, publish: Bool = true) async {
    let key = ES256PrivateKey()
    await keys.add(ecdsa: key, kid: JWKIdentifier(string: kid))
    signingKid.withLock { $0 = kid }
    if publish {
      jwks.withLock { $0 = #"{"keys":[\#(Self.jwk(key.parameters!, kid: kid))]}"# }
    }
  }

  package var jwksFetches: Int { requests.withLock { $0.filter { $0.url.hasSuffix("/jwks") }.count } }

  package var tokenRequests: [HTTPRequest] { requests.withLock { $0.filter { $0.url.hasSuffix("/token") } } }
  package func form(_ r: HTTPRequest) -> [String: String] {
    FormEncoding.decode(String(decoding: r.body ?? [], as: UTF8.self))
  }

  package struct Claims: JWTPayload {
    package var iss: String
    package var sub: String
    package var aud: String
    package var exp: Double
    package var iat: Double
    package var nonce: String?
    package var preferred_username: String
    package var name: String
    package var tid: String?
    package var oid: String?
    package func verify(using algorithm: some JWTAlgorithm) async throws {}
  }

  /// Entra mode: the client_info the token endpoint sends (default: uid1 in the home tenant).
  package let clientInfoJSON = Locked(#"{"uid":"uid1","utid":"home-tid"}"#)

  /// Entra mode: the tenant (realm) of the account's home.
  package static let homeTenant = "home-tid"

  /// Tenant of a login.microsoftonline.com URL, with common/organizations mapped to the home tenant.
  package static func entraTenant(_ url: String) -> String? {
    guard url.hasPrefix("https://login.microsoftonline.com/") else { return nil }
    let tenant = String(url.dropFirst("https://login.microsoftonline.com/".count).prefix { $0 != "/" })
    return ["common", "organizations"].contains(tenant) ? homeTenant : tenant
  }

  package func idToken(nonce: String?, clientID: String, tenant: String? = nil) async throws -> String {
    let now = clock.now().timeIntervalSince1970
    return try await keys.sign(
      Claims(
        iss: tenant.map { "https://login.microsoftonline.com/\($0)/v2.0" } ?? Self.authority,
        sub: subject.withLock { $0 }, aud: audienceOverride.withLock { $0 } ?? clientID,
        exp: now + 3600,
        iat: now, nonce: nonce, preferred_username: "alice@idp.test", name: "Alice", tid: tenant,
        oid: tenant.map { $0 == Self.homeTenant ? "uid1" : "guest-object-id" }),
      kid: JWKIdentifier(string: signingKid.withLock { $0 }))
  }

  /// Nonce of the last authorization request (set by tests that drive the browser flow).
  package let lastNonce = Locked<String?>(nil)

  /// Answers to GET requests by URL (a provider's user API, userinfo, RFC 8414 metadata).
  package let scriptedGets = Locked<[String: HTTPResponse]>([:])

  package func send(_ request: HTTPRequest) async throws -> HTTPResponse {
    requests.withLock { $0.append(request) }
    let url = request.url
    if request.method == "GET", let scripted = scriptedGets.withLock({ $0[url] }) { return scripted }
    if url.hasSuffix("/.well-known/openid-configuration"), url.hasPrefix("https://login.microsoftonline.com/") {
      let base = String(url.dropLast("/v2.0/.well-known/openid-configuration".count))
      return HTTPResponse(
        status: 200,
        body: Array(
          #"{"issuer":"https://login.microsoftonline.com/{tenantid}/v2.0","authorization_endpoint":"\#(base)/oauth2/v2.0/authorize","token_endpoint":"\#(base)/oauth2/v2.0/token","jwks_uri":"\#(base)/discovery/v2.0/keys"}"#
            .utf8))
    }
    if url.hasSuffix("/discovery/v2.0/keys") {
      return HTTPResponse(status: 200, body: Array(jwks.withLock { $0 }.utf8))
    }
    if url.hasSuffix("/.well-known/openid-configuration") {
      let endSession =
        (endSessionEndpoint.withLock { $0 }.map { #","end_session_endpoint":"\#($0)""# } ?? "")
        + (dpop.withLock { $0 } == nil ? "" : #","dpop_signing_alg_values_supported":["ES256","RS256"]"#)
      return HTTPResponse(
        status: 200,
        body: Array(
          #"{"issuer":"\#(Self.authority)","authorization_endpoint":"\#(Self.authority)/authorize","token_endpoint":"\#(Self.authority)/token","jwks_uri":"\#(Self.authority)/jwks","device_authorization_endpoint":"\#(Self.authority)/device","revocation_endpoint":"\#(Self.authority)/revoke"\#(endSession)}"#
            .utf8))
    }
    if url.hasSuffix("/jwks") { return HTTPResponse(status: 200, body: Array(jwks.withLock { $0 }.utf8)) }
    if url.hasSuffix("/revoke") { return HTTPResponse(status: 200, body: []) }
    if url.hasSuffix("/device") {
      return HTTPResponse(
        status: 200,
        body: Array(
          #"{"device_code":"dc","user_code":"ABCD-EFGH","verification_uri":"https://idp.test/device","expires_in":600,"interval":5}"#
            .utf8))
    }
    if url.hasSuffix("/token") || url.hasSuffix("/access_token") {
      await tokenGate.pass()
      let delay = tokenDelay.withLock { $0 }
      if delay > 0 { try await Task.sleep(nanoseconds: UInt64(delay * 1e9)) }
      if let scripted = scriptedTokenAnswers.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) { return scripted }
      let fields = form(request)
      if fields["grant_type"] == "refresh_token", refusedClients.withLock({ $0.contains(fields["client_id"] ?? "") }) {
        return HTTPResponse(
          status: 400, body: Array(#"{"error":"invalid_grant","error_description":"not in family"}"#.utf8))
      }
      var tokenType = "Bearer"
      if let server = dpop.withLock({ $0 }) {
        switch await server.check(request, now: clock.now(), fields: fields) {
        case .refuse(let answer): return answer
        case .bound(let jkt) where server.binds.withLock({ $0 }):
          tokenType = "DPoP"
          server.pendingBinding.withLock { $0 = jkt }
        case .bound, .bearer: server.pendingBinding.withLock { $0 = nil }
        }
      }
      let n = tokenCounter.withLock {
        $0 += 1; return $0
      }
      if let server = dpop.withLock({ $0 }), let jkt = server.pendingBinding.withLock({ $0 }) {
        server.bound.withLock { $0["rt-\(n)"] = jkt }
      }
      let nonce = fields["grant_type"] == "authorization_code" ? lastNonce.withLock { $0 } : nil
      let tenant = Self.entraTenant(url)
      let idToken = try await idToken(nonce: nonce, clientID: fields["client_id"] ?? "", tenant: tenant)
      let clientInfo =
        tenant == nil
        ? "" : #","client_info":"\#(Base64URL.encode(Array(clientInfoJSON.withLock { $0 }.utf8)))""#
      let body =
        #"{"access_token":"at-\#(n)","token_type":"\#(tokenType)","expires_in":\#(accessTokenSeconds.withLock { $0 }),"refresh_token":"rt-\#(n)","scope":"\#(echoScopes.withLock { $0 } ? fields["scope"] ?? "" : "read")","id_token":"\#(idToken)"\#(clientInfo)\#(extraTokenFields.withLock { $0 })}"#
      return HTTPResponse(status: 200, body: Array(body.utf8))
    }
    return HTTPResponse(status: 404, body: [])
  }
}

/// The DPoP side of FakeIdP (RFC 9449), as glewlwyd behaves (docs measured in
/// ../shared/notes/identity-providers.md): every proof checked with jwt-kit (signature, typ, alg,
/// htm, htu, iat within 60 s, a fresh jti), the server's nonce asked for with use_dpop_nonce and a
/// DPoP-Nonce header, refresh tokens bound to the proof's key (a refresh without that key's proof is
/// refused, and uses nothing up), and bound tokens answered as token_type DPoP.
package final class FakeDPoPServer: Sendable {
  /// The nonce proofs must carry; nil: none asked for.
  package let nonce = Locked<String?>("nonce-1")
  /// Refresh token to the thumbprint of the key it is bound to.
  package let bound = Locked<[String: String]>([:])
  /// Every proof accepted, with its key's thumbprint.
  package let accepted = Locked<[(jkt: String, claims: ProofClaims)]>([])
  /// Whether tokens asked for with a proof are bound (false: proofs are taken, Bearer answered).
  package let binds = Locked(true)
  /// How far the server's clock is ahead of the broker's (seconds), for its iat window.
  package let clockSkew = Locked<Double>(0)
  let jtis = Locked<Set<String>>([])
  let pendingBinding = Locked<String?>(nil)

  package init() {}

  package struct ProofClaims: JWTPayload {
    package var jti: String
    package var htm: String
    package var htu: String
    package var iat: Int64
    package var nonce: String?
    package var ath: String?
    package func verify(using algorithm: some JWTAlgorithm) async throws {}
  }

  struct ProofHeader: Decodable {
    var typ: String
    var alg: String
    var jwk: ProofJWK
  }

  /// A proof's key thumbprint and claims, its signature checked by jwt-kit with the key it carries.
  package static func verify(_ proof: String) async throws -> (jkt: String, claims: ProofClaims) {
    let parts = proof.split(separator: ".", omittingEmptySubsequences: false)
    guard parts.count == 3, let headerBytes = Base64URL.decode(String(parts[0])) else {
      throw TesseraError.invalidArgument("not a JWS")
    }
    let header = try JSONDecoder().decode(ProofHeader.self, from: headerBytes)
    guard header.typ == "dpop+jwt", header.alg == "ES256", header.jwk.kty == "EC", header.jwk.crv == "P-256" else {
      throw TesseraError.invalidArgument("typ \(header.typ), alg \(header.alg)")
    }
    let keys = JWTKeyCollection()
    await keys.add(ecdsa: try ES256PublicKey(parameters: (x: header.jwk.x, y: header.jwk.y)))
    return (header.jwk.thumbprint, try await keys.verify(proof, as: ProofClaims.self))
  }

  enum Outcome {
    case refuse(HTTPResponse)
    case bound(String)
    case bearer
  }

  static func error(_ status: Int, _ code: String, _ description: String, nonce: String? = nil) -> Outcome {
    .refuse(
      HTTPResponse(
        status: status, headers: nonce.map { ["dpop-nonce": $0] } ?? [:],
        body: Array(#"{"error":"\#(code)","error_description":"\#(description)"}"#.utf8)))
  }

  func check(_ request: HTTPRequest, now: Date, fields: [String: String]) async -> Outcome {
    let proof = request.headers.first { $0.0.lowercased() == "dpop" }?.1
    var jkt: String?
    if let proof {
      guard let (key, claims) = try? await Self.verify(proof) else {
        return Self.error(400, "invalid_dpop_proof", "bad proof")
      }
      guard claims.htm == "POST", claims.htu == request.url else {
        return Self.error(400, "invalid_dpop_proof", "htm or htu")
      }
      guard abs(Double(claims.iat) - now.timeIntervalSince1970 - clockSkew.withLock({ $0 })) <= 60 else {
        return Self.error(400, "invalid_dpop_proof", "iat out of range")
      }
      if let nonce = nonce.withLock({ $0 }), claims.nonce != nonce {
        return Self.error(400, "use_dpop_nonce", "nonce", nonce: nonce)
      }
      guard jtis.withLock({ $0.insert(claims.jti).inserted }) else {
        return Self.error(400, "invalid_dpop_proof", "jti replayed")
      }
      accepted.withLock { $0.append((key, claims)) }
      jkt = key
    }
    if fields["grant_type"] == "refresh_token", let boundTo = bound.withLock({ $0[fields["refresh_token"] ?? ""] }),
      boundTo != jkt
    {
      return Self.error(400, "invalid_dpop_proof", "the refresh token is bound to another key")
    }
    return jkt.map(Outcome.bound) ?? .bearer
  }
}

/// A broker wired to fakes, with helpers to sign in.
package struct Harness {
  package let clock = FakeClock()
  package let store = FakeStore()
  package let events = RecordingEvents()
  package let idp: FakeIdP
  package let listeners: FakeListeners
  package let broker: Broker

  package init(
    config: BrokerConfig? = nil, accessMode: AccessMode = .open, notifyFirstUse: Bool = false,
    prompter: (any AccessPrompter)? = nil, journal: (any RefreshJournal)? = nil,
    redirect: (@Sendable (String) -> RedirectParameters)? = nil, logger: Logger = Logger(label: "test"),
    secrets: (any ClientSecretSource)? = nil, questionTimeout: Duration? = nil,
    proofKeys: (any ProofKeySource)? = nil
  ) async {
    idp = await FakeIdP(clock: clock)
    let answer = redirect ?? { state in ["code": "the-code", "state": state] }
    listeners = FakeListeners(answer: answer)
    var cfg = config ?? .fakeIdP
    // The engine's tests call without an identified app; access control has its own (AccessTests).
    cfg.accessMode = accessMode
    // Off unless a test is about it: it makes the bus thread answer only apps it has seen.
    cfg.notifyFirstUse = notifyFirstUse
    var dependencies = BrokerDependencies(
      http: idp, store: store, browser: RecordingBrowser(listeners: listeners, idp: idp), listeners: listeners,
      events: events,
      clock: clock, prompter: prompter, journal: journal, secrets: secrets)
    if let questionTimeout { dependencies.questionTimeout = questionTimeout }
    dependencies.proofKeys = proofKeys
    broker = Broker(config: cfg, dependencies: dependencies, logger: logger)
  }

  package func request(clientID: String = "", scopes: [String] = [], options: [String: BusValue] = [:]) throws
    -> TokenRequest
  {
    try RequestParser.tokenRequest(clientID: clientID, scopes: scopes, accountID: "", options: options)
  }

  /// Interactive sign-in through the fake browser and listener; returns the result dictionary.
  @discardableResult
  package func signIn(clientID: String = "", options: [String: BusValue] = [:]) async throws -> [String: BusValue] {
    listeners.lastAuthorizationURL.withLock { $0 = nil }
    return try await broker.acquireTokenInteractive(
      request(clientID: clientID, options: options), caller: CallerInfo(busName: ":1.42"))
  }
}

/// The engine's results as org.tessera.Broker1 sends them (through TesseraFront, which also
/// publishes silent replies for the bus thread), for the tests written against the wire's dicts.
extension Broker {
  package nonisolated var testFront: TesseraFront { TesseraFront(broker: self, logger: Logger(label: "test")) }

  package nonisolated func acquireTokenSilent(_ request: TokenRequest) async throws -> [String: BusValue] {
    try await testFront.silentToken(request)
  }

  package nonisolated func acquireTokenInteractive(_ request: TokenRequest, caller: CallerInfo) async throws -> [String:
    BusValue]
  {
    try await testFront.signIn(request, caller: caller)
  }

  package nonisolated func accounts(matching filter: AccountFilter) async throws -> [[String: BusValue]] {
    try await knownAccounts(matching: filter).map(\.info.busValue)
  }
}

extension BrokerConfig {
  /// Settings for the fake provider: its authority trusted and the default, client app1, scope read.
  package static var fakeIdP: BrokerConfig {
    var config = BrokerConfig()
    config.defaultAuthority = FakeIdP.authority
    config.defaultClientID = "app1"
    config.defaultScopes = ["read"]
    config.trustedAuthorities = ["https://idp.test"]
    return config
  }
}
