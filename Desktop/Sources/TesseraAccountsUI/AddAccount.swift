import CAdwaita
import TesseraClient
import TesseraInterface

/// Where a new account can be signed in: the default authority first, then config.toml's
/// providers by name.
public struct SignInTarget: Sendable, Equatable {
  public var label: String
  /// nil: the default authority (the request names none).
  public var provider: String?

  public static func targets(_ config: StatusReport.ConfigStatus?) -> [SignInTarget] {
    let fallback = config?.defaultAuthority.map { "The default (\(AccountRow.host(of: $0)))" } ?? "The default provider"
    return [SignInTarget(label: fallback, provider: nil)]
      + (config?.providers ?? []).map { provider in
        SignInTarget(
          label:
            "\(provider.name) (\(provider.profile.map { "\($0), " } ?? "")\(AccountRow.host(of: provider.issuer)))",
          provider: provider.name)
      }
  }
}

/// Add account: choose a provider, then sign in with the browser, or with a code on another
/// device (the code shown large, a button that copies it, and the link).
@GtkActor
enum AddAccount {
  /// A dialog with a row per place to sign in, each with its two ways: every choice is one
  /// button, reached by Tab and named for what it does ("Sign in at github with a code").
  static func ask(model: BrokerModel, window: Widget?) {
    let targets = SignInTarget.targets(model.status?.config)
    let dialog = adw_message_dialog_new(
      window.map { $0.as(GtkWindow.self) }, "Add an account",
      "Choose where the account is, and how to sign in: in a browser on this computer, or with a code you enter on another device (a phone, say)."
    )!
    let message = dialog.as(AdwMessageDialog.self)
    let list = gtk_list_box_new()!
    gtk_list_box_set_selection_mode(list.opaque, GTK_SELECTION_NONE)
    gtk_widget_add_css_class(list, "boxed-list")
    let close: @GtkActor () -> Void = { gtk_window_destroy(dialog.as(GtkWindow.self)) }
    for target in targets {
      let row = Gtk.row(title: target.label, subtitle: "", accessibleLabel: "Sign in at \(target.label)")
      let name = target.provider ?? "the default provider"
      Gtk.suffix(
        row,
        Gtk.button("Code", accessibleLabel: "Sign in at \(name) with a code") {
          close()
          signIn(at: target, deviceCode: true, model: model, window: window)
        })
      Gtk.suffix(
        row,
        Gtk.button("Browser", accessibleLabel: "Sign in at \(name) with the browser") {
          close()
          signIn(at: target, deviceCode: false, model: model, window: window)
        })
      gtk_list_box_append(list.opaque, row)
    }
    adw_message_dialog_set_extra_child(message, list)
    adw_message_dialog_add_response(message, "cancel", "Cancel")
    adw_message_dialog_set_close_response(message, "cancel")
    Signals.connectResponse(dialog.raw) { _ in gtk_window_destroy(dialog.as(GtkWindow.self)) }
    gtk_window_present(dialog.as(GtkWindow.self))
  }

  static func signIn(at target: SignInTarget, deviceCode: Bool, model: BrokerModel, window: Widget?) {
    var options = TesseraTokenOptions()
    options.provider = target.provider
    options.deviceCode = deviceCode
    let request = options
    let where_ = target.label
    let codeDialog = CodeDialog(window: window)
    model.say(
      deviceCode ? "Asking \(where_) for a code…" : "Signing in at \(where_): finish in the browser window that opens.")
    let signIn = model.run("sign in at \(where_)", then: { await $0.loadAccounts() }) { broker in
      let token: TesseraToken
      do {
        token = try await broker.acquireToken(options: request) { interaction in
          Task { @GtkActor in
            if interaction.userCode != nil {
              model.say(nil)
              codeDialog.show(interaction)
            } else {
              model.say(SignInWords.text(interaction, username: "your account"))
            }
          }
        }
      } catch {
        // Failed or cancelled: the code is of no use any more.
        Task { @GtkActor in codeDialog.close() }
        throw error
      }
      let username = token.account.username
      Task { @GtkActor in
        codeDialog.close()
        model.say("Signed in as \(username).")
      }
    }
    // Cancelling the call ends the broker's sign-in (TesseraClient gives it up and the broker
    // drops a flow whose caller left).
    codeDialog.onCancel = {
      signIn.cancel()
      model.say("The sign-in at \(where_) was cancelled.")
    }
  }
}

/// The device code, shown until the sign-in ends: the code (selectable, and named for screen
/// readers), Copy the code, and the page to enter it at.
@GtkActor
final class CodeDialog {
  private let window: Widget?
  private var dialog: Widget?
  /// The sign-in ended: a code that arrives after it is not shown.
  private var ended = false
  var onCancel: @GtkActor () -> Void = {}

  init(window: Widget?) { self.window = window }

  func show(_ interaction: TesseraInteraction) {
    guard let code = interaction.userCode, !ended else { return }
    // A new code replaces the one shown.
    if let shown = dialog {
      dialog = nil
      gtk_window_destroy(shown.as(GtkWindow.self))
    }
    let dialog = adw_message_dialog_new(
      window.map { $0.as(GtkWindow.self) }, "Enter this code on another device",
      "Open \(interaction.verificationURI) on your phone or another computer, sign in, and enter the code. This window closes when you are done."
    )!
    let box = gtk_box_new(GTK_ORIENTATION_VERTICAL, 12)!
    let label = Gtk.label(code, wrap: false)
    gtk_label_set_selectable(label.opaque, 1)
    gtk_widget_add_css_class(label, "title-1")
    label.setAccessibleLabel("Code: \(code)")
    gtk_box_append(box.as(GtkBox.self), label)
    let copy = Gtk.button("Copy the code", accessibleLabel: "Copy the code \(code)") {
      gdk_clipboard_set_text(gtk_widget_get_clipboard(label), code)
    }
    gtk_box_append(box.as(GtkBox.self), copy)
    let link = gtk_link_button_new_with_label(interaction.verificationURI, "Open \(interaction.verificationURI)")!
    gtk_box_append(box.as(GtkBox.self), link)
    let message = dialog.as(AdwMessageDialog.self)
    adw_message_dialog_set_extra_child(message, box)
    adw_message_dialog_add_response(message, "cancel", "Cancel the sign-in")
    adw_message_dialog_set_close_response(message, "cancel")
    Signals.connectResponse(dialog.raw) { [weak self] response in
      gtk_window_destroy(dialog.as(GtkWindow.self))
      guard let self, self.dialog != nil else { return }
      self.dialog = nil
      if response == "cancel" { self.onCancel() }
    }
    self.dialog = dialog
    gtk_window_present(dialog.as(GtkWindow.self))
  }

  /// The sign-in ended: the dialog goes (and its close is not a cancel).
  func close() {
    ended = true
    guard let dialog else { return }
    self.dialog = nil
    gtk_window_destroy(dialog.as(GtkWindow.self))
  }
}
