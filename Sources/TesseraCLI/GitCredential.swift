import TesseraInterface

/// git's credential helper protocol (git-credential(1)): the lines git writes and reads. Pure: the
/// CLI reads config.toml's `[[git]]` rules (GitCredentialRule) and the broker's answer; this turns
/// them into git's lines.

/// What git writes to a credential helper: `key=value` lines up to a blank line or the end.
public struct GitCredentialRequest: Sendable, Equatable {
  public var `protocol`: String = ""
  public var host: String = ""
  public var path: String?
  public var username: String?
  public var password: String?
  /// git 2.46+: `credential=` with `authtype`.
  public var credential: String?
  public var authtype: String?
  /// `capability[]=…` lines: `authtype` means git takes `authtype` / `credential` answers.
  public var capabilities: Set<String> = []
  /// The server's `WWW-Authenticate` challenges, as git relays them (`wwwauth[]=…`).
  public var challenges: [String] = []

  public init() {}

  /// At most this much is read from git (its own lines are short; a password is a token).
  public static let maxBytes = 256 * 1024

  public struct ParseError: Error, Equatable, Sendable {
    public var reason: String
  }

  public init(parsing text: String) throws(ParseError) {
    for raw in text.split(separator: "\n", omittingEmptySubsequences: false) {
      let line = raw.hasSuffix("\r") ? raw.dropLast() : raw
      if line.isEmpty { break }
      guard let equals = line.firstIndex(of: "=") else {
        throw ParseError(reason: "a line without '=' (git-credential(1) sends key=value lines)")
      }
      let key = String(line[..<equals])
      let value = String(line[line.index(after: equals)...])
      guard !value.contains("\0") else { throw ParseError(reason: "the value of '\(key)' holds a NUL byte") }
      switch key {
      case "protocol": self.protocol = value
      case "host": host = value
      case "path": path = value
      case "username": username = value
      case "password": password = value
      case "credential": credential = value
      case "authtype": authtype = value
      case "capability[]": capabilities.insert(value)
      case "wwwauth[]": challenges.append(value)
      case "url":
        // git sends url= only from `git credential fill` input; split it as git would.
        if let (scheme, rest) = GitCredentialRule.schemeSplit(Substring(value)) {
          self.protocol = String(scheme)
          let authority = rest.prefix { $0 != "/" }
          host = String(authority.split(separator: "@").last ?? "")
          let p = rest.dropFirst(authority.count).drop { $0 == "/" }
          if !p.isEmpty { path = String(p) }
        }
      default: break  // password_expiry_utc, oauth_refresh_token, state[]…: not ours
      }
    }
  }

  /// The token git holds for this remote: `credential` (authtype) or `password`.
  public var heldToken: String? { credential ?? password }
}

/// The answer to `get`. Never a refresh token: git would store it (git-credential-oauth stores
/// oauth_refresh_token; Tessera keeps its own and gives git only access tokens).
public struct GitCredentialAnswer: Sendable, Equatable {
  public var username: String
  public var accessToken: String
  /// Unix seconds: git (2.41+) drops the credential then and asks again.
  public var expiresOn: Int64

  public init(username: String, accessToken: String, expiresOn: Int64) {
    self.username = username
    self.accessToken = accessToken
    self.expiresOn = expiresOn
  }

  /// git-credential(1)'s lines. When git announced `capability[]=authtype` (2.46+) and the server
  /// offers Bearer (a `wwwauth[]` challenge), a Bearer credential git sends as is and must not
  /// store (`ephemeral`); else a username and password (servers such as Azure DevOps, GitHub and
  /// Gitea take a token as the password, and many offer Basic only).
  /// nil when a value would break the protocol (a newline or NUL from the IdP: it could add lines
  /// of its own choosing, such as a url= or a second password=).
  public func lines(for request: GitCredentialRequest) -> String? {
    guard [username, accessToken].allSatisfy({ SafeText.isClean($0) && !$0.isEmpty }) else { return nil }
    var out = ""
    let offersBearer = request.challenges.contains { $0.lowercased().hasPrefix("bearer") }
    if request.capabilities.contains("authtype") && offersBearer {
      out += "capability[]=authtype\n"
      out += "authtype=Bearer\n"
      out += "credential=\(accessToken)\n"
      out += "ephemeral=true\n"
    } else {
      out += "username=\(username)\n"
      out += "password=\(accessToken)\n"
    }
    // A token that does not expire: git keeps it until a server refuses it (then `erase`).
    if !TokenExpiry.isNever(expiresOn) { out += "password_expiry_utc=\(expiresOn)\n" }
    return out
  }
}

/// Which rule answers git: matching is the helper's, on git's request.
extension GitCredentialRule {
  /// Whether this rule covers git's request: https, the same host (and port), and, when the rule
  /// has a path prefix, a path git sent (credential.useHttpPath) under it, segment by segment.
  public func matches(_ request: GitCredentialRequest) -> Bool {
    guard request.protocol == "https", request.host.lowercased() == host else { return false }
    guard !pathPrefix.isEmpty else { return true }
    guard let path = request.path else { return false }
    // "team/../other" would match "team" here and reach "other" once the URL is normalised:
    // dot and empty segments match nothing.
    let raw = path.split(separator: "/", omittingEmptySubsequences: false)
    guard !raw.contains(where: { $0 == "." || $0 == ".." || $0.lowercased().contains("%2e") }) else { return false }
    let given = path.split(separator: "/")
    let prefix = pathPrefix.split(separator: "/")
    guard given.count >= prefix.count else { return false }
    // A ".git" suffix is the same repository to git's hosts.
    return zip(prefix, given).enumerated().allSatisfy { index, pair in
      pair.0 == pair.1 || (index == prefix.count - 1 && pair.0 + ".git" == pair.1)
    }
  }

  /// The rule for a request: the one with the longest matching path prefix, the first written on a tie.
  public static func best(for request: GitCredentialRequest, in rules: [GitCredentialRule]) -> GitCredentialRule? {
    var best: GitCredentialRule?
    for rule in rules where rule.matches(request) {
      if best == nil || rule.pathPrefix.split(separator: "/").count > best!.pathPrefix.split(separator: "/").count {
        best = rule
      }
    }
    return best
  }

  /// With no [[git]] entry for the host: the provider whose git host it is (a github, gitlab,
  /// bitbucket, gitea, forgejo or codeberg profile), as an entry: its issuer, client id and scopes,
  /// and the username its host takes (GitLab's `oauth2`, Bitbucket's `x-token-auth`; GitHub and
  /// Gitea take any, so the account's). Only over https.
  public static func fromProviders(for request: GitCredentialRequest, in providers: [ProviderConfig])
    -> GitCredentialRule?
  {
    guard request.protocol == "https" else { return nil }
    let host = request.host.lowercased()
    guard let provider = providers.first(where: { $0.gitHost == host }) else { return nil }
    var rule = GitCredentialRule(
      host: host, clientID: provider.clientID, authority: provider.issuer, scopes: provider.scopes,
      username: provider.gitUsername, line: provider.line)
    rule.file = provider.file
    return rule
  }
}
