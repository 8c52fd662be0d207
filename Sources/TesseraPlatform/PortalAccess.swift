import Glibc
import Logging
import Synchronization
import TesseraBus
import TesseraCore
import TesseraInterface
import TesseraSystem

/// Asks the user through the desktop's own permission dialog: the portal access-dialog backend
/// (`org.freedesktop.impl.portal.Access`, what xdg-desktop-portal-gnome, -kde and -gtk show for a
/// portal's own questions), with "Allow", "Deny" and a "remember" choice for "Always allow". With no
/// such backend for this desktop, or one that fails, the notification question (`fallback`) asks.
///
/// The backend is found as xdg-desktop-portal finds it: the `*.portal` files in
/// `$XDG_DESKTOP_PORTAL_DIR` (else /usr/share/xdg-desktop-portal/portals) that list the Access
/// interface, the one whose `UseIn` names a desktop of `$XDG_CURRENT_DESKTOP` first.
public final class PortalAccessPrompter: AccessPrompter {
  static let interface = "org.freedesktop.impl.portal.Access"
  static let objectPath = "/org/freedesktop/portal/desktop"
  static let remember = "remember"
  static let account = "account"

  private let server: BusServer
  private let logger: Logger
  private let fallback: (any AccessPrompter)?
  private let portalDirectory: String
  private let desktops: [String]
  private let nextHandle = Atomic<UInt64>(0)

  public init(server: BusServer, logger: Logger, fallback: (any AccessPrompter)?) {
    self.server = server
    self.logger = logger
    self.fallback = fallback
    func env(_ name: String) -> String? { getenv(name).map { String(cString: $0) } }
    portalDirectory = env("XDG_DESKTOP_PORTAL_DIR") ?? "/usr/share/xdg-desktop-portal/portals"
    desktops = (env("XDG_CURRENT_DESKTOP") ?? "").split(separator: ":").map { $0.lowercased() }
  }

  static func trimmed<S: StringProtocol>(_ s: S) -> String {
    String(
      s.drop { $0 == " " || $0 == "\t" || $0 == "\r" }.reversed().drop { $0 == " " || $0 == "\t" || $0 == "\r" }
        .reversed())
  }

  /// A portal backend's description (a `*.portal` file's `[portal]` group).
  struct Backend: Equatable {
    var file: String
    var busName: String
    var interfaces: [String]
    var useIn: [String]
  }

  /// Parses a `*.portal` file; nil when it is not one.
  static func parse(_ text: String, file: String) -> Backend? {
    var group = ""
    var values: [String: String] = [:]
    for raw in text.split(whereSeparator: \.isNewline) {
      let line = trimmed(raw)
      if line.hasPrefix("#") || line.isEmpty { continue }
      if line.hasPrefix("[") && line.hasSuffix("]") {
        group = String(line.dropFirst().dropLast())
      } else if group == "portal", let eq = line.firstIndex(of: "=") {
        values[trimmed(line[..<eq])] = trimmed(line[line.index(after: eq)...])
      }
    }
    func list(_ key: String) -> [String] {
      (values[key] ?? "").split(separator: ";").map { trimmed($0) }.filter { !$0.isEmpty }
    }
    guard let name = values["DBusName"], !name.isEmpty, !name.hasPrefix(":") else { return nil }
    return Backend(
      file: file, busName: name, interfaces: list("Interfaces"), useIn: list("UseIn").map { $0.lowercased() })
  }

  /// The backend that shows access dialogs on this desktop: one meant for it first, else any (in
  /// file-name order), as older xdg-desktop-portal versions pick.
  static func choose(_ backends: [Backend], desktops: [String]) -> Backend? {
    let able = backends.filter { $0.interfaces.contains(interface) }.sorted { $0.file < $1.file }
    for desktop in desktops {
      if let meant = able.first(where: { $0.useIn.contains(desktop) }) { return meant }
    }
    return able.first
  }

  func backend() -> Backend? {
    guard let files = try? Files.names(in: portalDirectory) else { return nil }
    var backends: [Backend] = []
    for file in files {
      guard file.hasSuffix(".portal"), backends.count < 256 else { continue }
      // Distributions link these files: links are followed (the directory is the system's).
      let fd = open(portalDirectory + "/" + file, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
      guard fd >= 0 else { continue }
      let text = CallerIdentity.readAll(fd, limit: 64 * 1024)
      close(fd)
      guard let text, let backend = Self.parse(text, file: file) else { continue }
      backends.append(backend)
    }
    return Self.choose(backends, desktops: desktops)
  }

  /// The dialog's texts: who asks (and how sure Tessera is of it), for which account, client and
  /// scopes. Plain text: backends show it as such.
  static func texts(_ q: AccessQuestion) -> (title: String, subtitle: String, body: String) {
    let app = SafeText.clip(q.app.display, limit: 200)
    let user = SafeText.clip(q.username, limit: 200)
    let title = "Allow \(SafeText.clip(q.app.id, limit: 120)) to use \(SafeText.clip(q.username, limit: 120))?"
    let subtitle = "\(app) asks to use the sign-in of \(user) for client \(SafeText.clip(q.clientID, limit: 200))."
    var body = q.app.assurance
    if !q.scopes.isEmpty { body += " Scopes: \(SafeText.clip(q.scopes.joined(separator: " "), limit: 300))." }
    if q.operation != AccessGrant.Operation.token.rawValue { body += " It asks to: \(q.operation)." }
    return (title, subtitle, body)
  }

  /// The account chooser in the portal's access dialog: a choice list of the accounts (the one the
  /// app was last granted preselected) and "Use this choice from now on"; "Use" answers with the
  /// account chosen, "Use another account" with Question.another. nil with no backend, or when
  /// the dialog was closed or could not ask.
  public func chooseAccount(_ choice: AccountChoice) async -> ChoiceAnswer? {
    guard let backend = backend(), !choice.accounts.isEmpty else { return nil }
    let handle = "/org/tessera/Broker1/request/choose\(nextHandle.add(1, ordering: .relaxed).newValue)"
    let app = SafeText.clip(choice.app.display, limit: 200)
    let title = "Choose an account for \(SafeText.clip(choice.app.id, limit: 120))"
    let subtitle =
      "\(app) asks to sign in at \(SafeText.clip(choice.provider, limit: 200)), where several of your accounts are signed in."
    let accounts: [[BusValue]] = choice.accounts.map {
      [
        .string($0.id),
        .string(SafeText.clip($0.name.isEmpty ? $0.username : "\($0.username) (\($0.name))", limit: 200)),
      ]
    }
    let options: [String: BusValue] = [
      "grant_label": .string("Use"), "deny_label": .string("Use another account"), "icon": .string("dialog-password"),
      "choices": .structs(
        elementSignature: "(ssa(ss)s)",
        [
          [
            .string(Self.account), .string("Account"), .structs(elementSignature: "(ss)", accounts),
            .string(choice.preselected ?? choice.accounts[0].id),
          ],
          [
            .string(Self.remember), .string("Use this choice from now on"), .structs(elementSignature: "(ss)", []),
            .string("false"),
          ],
        ]),
    ]
    let appID = choice.app.kind == .flatpak || choice.app.kind == .desktop ? choice.app.id : ""
    let arguments: [BusValue] = [
      .objectPath(handle), .string(appID), .string(""), .string(title), .string(subtitle),
      .string(choice.app.assurance), .dict(options),
    ]
    let result = await accessDialog(backend, arguments)
    guard case .success(let reply) = result, case .uint32(let response)? = reply.values.first else { return nil }
    var chosen: String?
    var remember = false
    if reply.values.count > 1, case .dict(let results) = reply.values[1],
      case .structs(_, let rows)? = results["choices"]
    {
      for row in rows where row.count == 2 {
        if row[0] == .string(Self.account) { chosen = row[1].stringValue }
        if row[0] == .string(Self.remember) { remember = row[1] == .string("true") }
      }
    }
    logger.info(
      "The portal's account chooser answered", metadata: ["backend": "\(backend.busName)", "response": "\(response)"])
    switch response {
    case 0:
      // Only one of the accounts offered (a backend that answers anything else chose nothing).
      guard let chosen, choice.accounts.contains(where: { $0.id == chosen }) else { return nil }
      return ChoiceAnswer(answer: chosen, remember: remember)
    case 1: return ChoiceAnswer(answer: Question.another, remember: false)
    default: return nil
    }
  }

  /// One AccessDialog call to the backend: its reply, or why there is none (waits as long as a
  /// person may take to answer).
  private func accessDialog(_ backend: Backend, _ arguments: [BusValue]) async
    -> Result<(sender: String, values: [BusValue]), BusCallError>
  {
    await withCheckedContinuation { done in
      server.call(
        destination: backend.busName, path: Self.objectPath, interface: Self.interface, member: "AccessDialog",
        arguments: arguments, timeoutSeconds: Double(DesktopNotifier.questionSeconds), autoStart: true
      ) { done.resume(returning: $0) }
    }
  }

  public func ask(_ question: AccessQuestion) async -> AccessAnswer? {
    guard let backend = backend() else { return await fallback?.ask(question) }
    let handle = "/org/tessera/Broker1/request/access\(nextHandle.add(1, ordering: .relaxed).newValue)"
    let texts = Self.texts(question)
    // The app id lets the backend show the app's name and icon; only for ids the platform gave.
    let appID = question.app.kind == .flatpak || question.app.kind == .desktop ? question.app.id : ""
    let options: [String: BusValue] = [
      "grant_label": .string("Allow"), "deny_label": .string("Deny"), "icon": .string("dialog-password"),
      "choices": .structs(
        elementSignature: "(ssa(ss)s)",
        [[.string(Self.remember), .string("Always allow"), .structs(elementSignature: "(ss)", []), .string("false")]]),
    ]
    let arguments: [BusValue] = [
      .objectPath(handle), .string(appID), .string(""), .string(texts.title), .string(texts.subtitle),
      .string(texts.body), .dict(options),
    ]
    let result = await accessDialog(backend, arguments)
    switch result {
    case .success(let reply):
      guard case .uint32(let response)? = reply.values.first else { return nil }
      var remember = false
      if reply.values.count > 1, case .dict(let results) = reply.values[1],
        case .structs(_, let rows)? = results["choices"]
      {
        remember = rows.contains { $0 == [.string(Self.remember), .string("true")] }
      }
      logger.info(
        "The portal access dialog answered",
        metadata: ["backend": "\(backend.busName)", "response": "\(response)", "remember": "\(remember)"])
      switch response {
      case 0: return remember ? .allowAlways : .allowOnce
      case 1: return .deny
      default: return nil  // closed some other way: nobody said yes
      }
    case .failure(let error):
      if error.name == "org.freedesktop.DBus.Error.NoReply" || error.name.hasSuffix(".TimedOut") {
        // Unanswered: the dialog is taken down, and nobody said yes.
        server.call(
          destination: backend.busName, path: handle, interface: "org.freedesktop.impl.portal.Request",
          member: "Close", arguments: [], timeoutSeconds: 10, autoStart: false
        ) { _ in }
        return nil
      }
      logger.info(
        "The portal access dialog could not ask; asking through a notification",
        metadata: ["backend": "\(backend.busName)", "error": "\(error.name)"])
      return await fallback?.ask(question)
    }
  }
}
