import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// An OAuth authority: `https://host[:port]/tenant[/…]`, canonicalised.
public struct Authority: Sendable, Hashable, CustomStringConvertible {
  public let scheme: String
  public let host: String
  public let port: Int?
  /// Path segments after the host (the first one is the tenant).
  public let pathSegments: [String]

  /// The canonical URL: lowercase scheme and host, no default port, no trailing slash.
  public var url: String {
    "\(scheme)://\(environment)" + pathSegments.map { "/" + $0 }.joined()
  }
  public var description: String { url }

  /// Host, with the port when it is not the scheme's default.
  public var environment: String {
    if let port, !(scheme == "https" && port == 443) && !(scheme == "http" && port == 80) { return "\(host):\(port)" }
    return host
  }

  /// The tenant segment (`common`, `organizations`, a GUID, a domain), or "" when there is none.
  public var tenant: String { pathSegments.first ?? "" }

  public static let microsoftHosts: Set<String> = [
    "login.microsoftonline.com", "login.microsoft.com", "login.windows.net", "sts.windows.net",
  ]
  public var isMicrosoft: Bool { Self.microsoftHosts.contains(host) }
  public var isLoopback: Bool { host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host == "::1" }

  public init(parsing text: String) throws {
    let bad = { (why: String) in
      TesseraError.invalidArgument(
        "Authority '\(RequestOptions.clip(text))' is not usable: \(why). "
          + "Use a URL like https://login.microsoftonline.com/<tenant>.")
    }
    guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
      let host = components.host?.lowercased(), !host.isEmpty
    else { throw bad("it is not an absolute URL") }
    guard scheme == "https" || scheme == "http" else { throw bad("the scheme must be https") }
    guard components.query == nil, components.fragment == nil else { throw bad("it must not have a query or fragment") }
    guard components.user == nil, components.password == nil else { throw bad("it must not contain credentials") }
    self.scheme = scheme
    self.host = host
    self.port = components.port
    self.pathSegments = components.path.split(separator: "/").map(String.init)
    for segment in pathSegments where segment == "." || segment == ".." {
      throw bad("it must not contain '.' or '..' segments")
    }
  }

  /// Does `self` lie at or below `prefix` (same scheme, host, port, leading path segments)?
  public func isWithin(_ prefix: Authority) -> Bool {
    scheme == prefix.scheme && environment == prefix.environment
      && pathSegments.count >= prefix.pathSegments.count
      && zip(pathSegments, prefix.pathSegments).allSatisfy { $0 == $1 }
  }
}

/// Which authorities the broker talks to.
public struct AuthorityPolicy: Sendable {
  public var trusted: [Authority]
  public var allowInsecureLoopback: Bool

  public init(trusted: [Authority], allowInsecureLoopback: Bool) {
    self.trusted = trusted
    self.allowInsecureLoopback = allowInsecureLoopback
  }

  /// Parses and checks an authority; throws `UntrustedAuthority` or `InvalidArgument`.
  public func validate(_ text: String) throws -> Authority {
    let authority = try Authority(parsing: text)
    if authority.scheme == "http" {
      guard authority.isLoopback, allowInsecureLoopback else {
        throw TesseraError.untrustedAuthority(
          "Authority \(authority.url) uses plain http. Tokens are only sent over https"
            + (authority.isLoopback ? "; for a local test IdP set allow_insecure_loopback = true in config.toml." : ".")
        )
      }
    }
    if authority.isMicrosoft {
      guard !authority.tenant.isEmpty else {
        throw TesseraError.invalidArgument(
          "Authority \(authority.url) has no tenant. Add one, e.g. /common, /organizations or your tenant id.")
      }
      if authority.scheme == "https" { return authority }
    }
    if trusted.contains(where: { authority.isWithin($0) }) { return authority }
    throw TesseraError.untrustedAuthority(
      "Authority \(authority.url) is not trusted. Add it (or its host) to trusted_authorities in config.toml "
        + "if you trust it with your sign-in.")
  }
}
