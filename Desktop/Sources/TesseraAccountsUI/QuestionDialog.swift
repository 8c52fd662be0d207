import CAdwaita
import TesseraClient
import TesseraInterface

/// A question from the broker, as the app shows it: every name in it is the broker's (the app as
/// the broker identified it, never a name the app gave itself).
public struct QuestionText: Sendable, Equatable {
  public var kind: Question.Kind
  public var heading: String
  public var body: String
  public var app: String
  /// choose_account: (id, username, name), the preselected one first.
  public var accounts: [(id: String, username: String, name: String)]
  public var preselected: String?

  public static func == (a: QuestionText, b: QuestionText) -> Bool {
    a.kind == b.kind && a.heading == b.heading && a.body == b.body && a.accounts.map(\.id) == b.accounts.map(\.id)
  }

  public init?(_ info: [String: BusValue]) {
    guard let kind = info[Question.kind]?.stringValue.flatMap(Question.Kind.init(rawValue:)) else { return nil }
    self.kind = kind
    func text(_ key: String) -> String { info[key]?.stringValue ?? "" }
    app = text(Question.app)
    let provider = text(Question.provider)
    let assurance = text(Question.assurance)
    switch kind {
    case .consent:
      var scopes: [String] = []
      if case .strings(let list)? = info[Question.scopes] { scopes = list }
      heading = "Allow \(app) to use \(text(Question.account))?"
      let what =
        switch text(Question.operation) {
        case "sign-in": "sign in with"
        case "list-accounts": "see"
        case "sign-out": "sign out"
        default: "get tokens for"
        }
      body =
        "\(app) asks to \(what) your account \(text(Question.account)) at \(provider) (client \(text(Question.clientID))). It would get: \(ScopeWords.describe(scopes)). \(assurance)"
      accounts = []
      preselected = nil
    case .chooseAccount:
      heading = "Choose an account for \(app)"
      body = "\(app) asks to sign in at \(provider). Several of your accounts are signed in there. \(assurance)"
      var list: [(id: String, username: String, name: String)] = []
      if case .dicts(let entries)? = info[Question.accounts] {
        list = entries.map {
          (
            id: $0["id"]?.stringValue ?? "", username: $0["username"]?.stringValue ?? "",
            name: $0["name"]?.stringValue ?? ""
          )
        }
      }
      let first = info[Question.preselected]?.stringValue
      preselected = first
      accounts = list.sorted { ($0.id == first ? 0 : 1, $0.username) < ($1.id == first ? 0 : 1, $1.username) }
    }
  }
}

/// Scopes in words, for a consent question: OpenID Connect's own by what they give, the others
/// as they are.
public enum ScopeWords {
  static let known = [
    "openid": "who you are", "profile": "your name", "email": "your email address",
    "offline_access": "access while you are away", "User.Read": "your Microsoft profile",
  ]

  public static func describe(_ scopes: [String]) -> String {
    if scopes.isEmpty { return "who you are" }
    var words: [String] = []
    for scope in scopes {
      let word = known[scope] ?? scope
      if !words.contains(word) { words.append(word) }
    }
    return words.joined(separator: ", ")
  }
}

/// Shows the broker's questions and sends the user's answers.
@GtkActor
enum QuestionDialog {
  static func show(id: String, info: [String: BusValue], model: BrokerModel) {
    guard let question = QuestionText(info) else { return }
    let dialog = adw_message_dialog_new(
      model.window.map { $0.as(GtkWindow.self) }, question.heading, question.body)!
    let message = dialog.as(AdwMessageDialog.self)
    let open = OpenFlag()
    let answer: @GtkActor (String, Bool) -> Void = { answer, remember in
      guard open.value else { return }
      open.value = false
      gtk_window_destroy(dialog.as(GtkWindow.self))
      model.run("send your answer", then: { _ in }) { broker in
        try await broker.answerQuestion(id: id, answer: answer, remember: remember)
      }
    }
    switch question.kind {
    case .consent:
      adw_message_dialog_add_response(message, Question.deny, "Deny")
      adw_message_dialog_add_response(message, Question.allowOnce, "Allow once")
      adw_message_dialog_add_response(message, Question.allowAlways, "Always allow")
      adw_message_dialog_set_response_appearance(message, Question.deny, ADW_RESPONSE_DESTRUCTIVE)
      // Return in a dialog that just took the focus must not say yes: the default is Deny.
      adw_message_dialog_set_default_response(message, Question.deny)
      adw_message_dialog_set_close_response(message, Question.deny)
      Signals.connectResponse(dialog.raw) { response in answer(response, false) }
    case .chooseAccount:
      let box = gtk_box_new(GTK_ORIENTATION_VERTICAL, 12)!
      let list = gtk_list_box_new()!
      gtk_list_box_set_selection_mode(list.opaque, GTK_SELECTION_NONE)
      gtk_widget_add_css_class(list, "boxed-list")
      for account in question.accounts {
        let last = account.id == question.preselected ? " · used last" : ""
        let row = Gtk.row(
          title: account.username, subtitle: account.name + last,
          accessibleLabel: "\(account.username)\(last.isEmpty ? "" : ", used last")")
        // Once, or from now on for this app (as Android's chooser: "Just once", "Always").
        let always = Gtk.button("Always", accessibleLabel: "Always use \(account.username) for \(question.app)") {
          answer(account.id, true)
        }
        let use = Gtk.button("Use", accessibleLabel: "Use \(account.username) for \(question.app)") {
          answer(account.id, false)
        }
        if account.id == question.preselected { gtk_widget_add_css_class(use, "suggested-action") }
        Gtk.suffix(row, always)
        Gtk.suffix(row, use)
        gtk_list_box_append(list.opaque, row)
      }
      gtk_box_append(box.as(GtkBox.self), list)
      adw_message_dialog_set_extra_child(message, box)
      adw_message_dialog_add_response(message, Question.another, "Use another account…")
      adw_message_dialog_set_close_response(message, Question.another)
      Signals.connectResponse(dialog.raw) { response in
        guard response == Question.another else { return }
        answer(Question.another, false)
      }
    }
    gtk_window_present(dialog.as(GtkWindow.self))
    // The broker waits expires_in seconds, then takes no answer: the dialog goes with it.
    var seconds = Question.seconds
    if case .uint32(let given)? = info[Question.expiresIn] { seconds = min(given, Question.seconds) }
    Task { @GtkActor in
      try? await Task.sleep(for: .seconds(Int(seconds)))
      guard open.value else { return }
      open.value = false
      gtk_window_destroy(dialog.as(GtkWindow.self))
      model.say("The question from \(question.app) went unanswered for \(seconds / 60) minutes and was withdrawn.")
    }
  }
}

/// Whether a question's dialog is still up (answered, or withdrawn, once).
@GtkActor
final class OpenFlag {
  var value = true
}
