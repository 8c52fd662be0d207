/// Which app is calling, as sure as Tessera can be of it (issue 11). Computed once per bus
/// connection by the daemon (TesseraPlatform's CallerIdentity) and shown wherever a decision is.
///
/// - `flatpak`, `snap`: strong. The sandbox says who the app is, and the app cannot change it.
/// - `desktop`: weak. The desktop-file id of the systemd scope or service the process runs in
///   (`app-gnome-org.gnome.Evolution-1234.scope`); any program of the user can start itself in a
///   scope of that name, and programs started from an app (a terminal's shell) share its scope.
/// - `executable`: weak. The program's path, plus its device and inode when the file is not
///   owned by root (a user-writable program replaced by another is another app).
/// - `forward`: every caller that reaches tesserad through one forward's listener (`tessera
///   forward`, issue 24): a remote host over ssh, or a container. Known by the listener it came
///   through and the host it leads to, not by a process; it may only get tokens
///   (BrokerInterface.forwardedMethods).
public struct AppIdentity: Sendable, Hashable, Codable {
  public enum Kind: String, Sendable, Codable, CaseIterable {
    case flatpak, snap, desktop, executable, forward
  }

  public var kind: Kind
  /// The app id (Flatpak, desktop-file id), the snap's `name.app`, or the executable's path.
  public var id: String
  /// For executables not owned by root: "DEV:INODE" of the file, part of the identity.
  public var fileID: String?
  /// For a forward over ssh: the host it leads to, as `tessera forward` was given it (its ssh
  /// destination); part of the key, so a grant made for a forward to one host never serves the
  /// same name forwarded to another (issue 37). nil for a container's socket.
  public var forwardHost: String?
  /// For a forward: where it leads, as shown ("over ssh to build01", "socket /path").
  public var forwardedTo: String?

  public init(kind: Kind, id: String, fileID: String? = nil, forwardHost: String? = nil, forwardedTo: String? = nil) {
    self.kind = kind
    self.id = id
    self.fileID = fileID
    self.forwardHost = forwardHost
    self.forwardedTo = forwardedTo
  }

  /// The caller of forward `name`: over ssh to `host`, or (host nil) through the socket at `path`.
  public static func forward(_ name: String, host: String?, path: String) -> AppIdentity {
    AppIdentity(
      kind: .forward, id: name, forwardHost: host, forwardedTo: host.map { "over ssh to \($0)" } ?? "socket \(path)")
  }

  /// Whether `host` may be a forward's host (an ssh destination: `host`, `user@host`,
  /// `[::1]:22`): 1 to 255 of A-Z a-z 0-9 . _ - @ : [ ] %, not starting with '-' (ssh would read
  /// an option).
  public static func isForwardHost(_ host: String) -> Bool {
    !host.isEmpty && host.utf8.count <= 255 && !host.hasPrefix("-")
      && host.utf8.allSatisfy { c in
        (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A)
          || [0x2E, 0x5F, 0x2D, 0x40, 0x3A, 0x5B, 0x5D, 0x25].contains(c)
      }
  }

  /// Whether `name` may name a forward: 1 to 64 of A-Z a-z 0-9 . _ -, not starting with a dot
  /// (it is also the listener's file name).
  public static func isForwardName(_ name: String) -> Bool {
    !name.isEmpty && name.utf8.count <= 64 && !name.hasPrefix(".")
      && name.utf8.allSatisfy { c in
        (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x2E || c == 0x5F
          || c == 0x2D
      }
  }

  /// Whether the platform vouches for the identity (a sandbox), rather than the process saying so.
  public var isVerified: Bool { kind == .flatpak || kind == .snap }

  /// The key grants are stored under: `flatpak:org.example.App`, `exe:/usr/bin/git`,
  /// `exe:/home/a/bin/tool@2049:131`, `forward:build01@ann@build01.example` (a forward's name
  /// holds no '@', so the first one ends it) …
  public var key: String {
    let prefix =
      switch kind {
      case .flatpak: "flatpak"
      case .snap: "snap"
      case .desktop: "desktop"
      case .executable: "exe"
      case .forward: "forward"
      }
    return "\(prefix):\(id)" + ((fileID ?? forwardHost).map { "@\($0)" } ?? "")
  }

  /// Parses a key back (for `tessera access grant --app KEY`); nil when it is not one.
  public init?(key: String) {
    guard let colon = key.firstIndex(of: ":") else { return nil }
    let prefix = key[..<colon]
    var rest = String(key[key.index(after: colon)...])
    guard !rest.isEmpty, SafeText.isClean(rest) else { return nil }
    switch prefix {
    case "flatpak": kind = .flatpak
    case "snap": kind = .snap
    case "desktop": kind = .desktop
    case "forward":
      kind = .forward
      if let at = rest.firstIndex(of: "@") {
        let host = String(rest[rest.index(after: at)...])
        guard Self.isForwardHost(host) else { return nil }
        forwardHost = host
        forwardedTo = "over ssh to \(host)"
        rest = String(rest[..<at])
      }
      guard Self.isForwardName(rest) else { return nil }
    case "exe":
      kind = .executable
      guard rest.hasPrefix("/") else { return nil }
      if let at = rest.lastIndex(of: "@"), rest[rest.index(after: at)...].contains(":") {
        fileID = String(rest[rest.index(after: at)...])
        rest = String(rest[..<at])
      }
    default: return nil
    }
    id = rest
  }

  /// How it is shown to the user: "org.example.App (Flatpak)", "/usr/bin/git (unverified)".
  public var display: String {
    switch kind {
    case .flatpak: "\(id) (Flatpak)"
    case .snap: "\(id) (snap)"
    case .desktop: "\(id) (desktop app, unverified)"
    case .executable: "\(id) (unverified)"
    case .forward: "\(id) (forwarded\(forwardedTo.map { " \($0)" } ?? ""))"
    }
  }

  /// How sure Tessera is of who asks, for the user's question (the portal dialog, the
  /// notification).
  public var assurance: String {
    switch kind {
    case .flatpak: "Tessera is sure which app this is (Flatpak sandbox)."
    case .snap: "Tessera is sure which app this is (snap sandbox)."
    case .desktop, .executable:
      "Tessera cannot verify which program this is: any program of yours could call itself this."
    case .forward:
      "The request comes through the forward \(id) (`tessera forward`): anything that can reach its socket on the other side (the remote host's administrator included) asks through it."
    }
  }
}

/// How strictly apps are kept to their grants (config.toml's `access_mode`).
public enum AccessMode: String, Sendable, CaseIterable {
  /// Every app may use every account and client, as before; each decision is still audited.
  case open
  /// An app without a grant is asked about (or refused with the command that grants it, when no
  /// desktop prompt is available). The default.
  case confirm
  /// An app without a grant is refused; grants come from sign-ins and `tessera access grant`.
  case strict
}

/// What one app may use: a client id, with one account or all of them ("*"), optionally narrowed
/// to one authority, some scopes and some operations (nil: any).
public struct AccessGrant: Sendable, Hashable, Codable {
  public var app: String
  public var clientID: String
  public var accountID: String
  /// Unix seconds it was given, and how ("sign-in", "user", "command").
  public var grantedAt: Int64
  public var via: String
  /// The canonical authority URL the grant is for; nil: any the client signs in at.
  public var authority: String?
  /// The scopes (or resources) the app may ask for; nil: any. OpenID Connect's own scopes (openid,
  /// profile, email, offline_access) are always allowed.
  public var scopes: [String]?
  /// What the app may do; nil: all of `Operation`.
  public var operations: [Operation]?

  /// What an app asks for: a token, an interactive sign-in, the account list, a sign-out.
  public enum Operation: String, Sendable, Codable, CaseIterable {
    case token
    case signIn = "sign-in"
    case listAccounts = "list-accounts"
    case signOut = "sign-out"
  }

  public static let anyAccount = "*"

  public init(
    app: String, clientID: String, accountID: String, grantedAt: Int64, via: String, authority: String? = nil,
    scopes: [String]? = nil, operations: [Operation]? = nil
  ) {
    self.app = app
    self.clientID = clientID
    self.accountID = accountID
    self.grantedAt = grantedAt
    self.via = via
    self.authority = authority
    self.scopes = scopes
    self.operations = operations
  }

  /// Whether the grant lets `app` use `client` for `account` (scopes are checked by the engine).
  public func covers(
    app other: String, clientID client: String, accountID account: String, authority url: String? = nil,
    operation: Operation? = nil
  ) -> Bool {
    app == other && clientID == client && (accountID == Self.anyAccount || accountID == account)
      && (authority == nil || url == nil || authority == url)
      && (operations == nil || operation == nil || operations!.contains(operation!))
  }

  /// Whether the grant allows `operation` at all (for the account list and sign-outs).
  public func allows(_ operation: Operation) -> Bool { operations?.contains(operation) ?? true }
}
