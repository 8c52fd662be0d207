import CAdwaita
import CTesseraGtkShim
import Glibc

/// A GTK widget pointer: GTK's functions take the class they belong to, and C's cast macros are
/// not callable from Swift, so the pointer is reinterpreted here (GTK checks the type at run time).
typealias Widget = UnsafeMutablePointer<GtkWidget>

extension UnsafeMutablePointer where Pointee == GtkWidget {
  func `as`<T>(_: T.Type) -> UnsafeMutablePointer<T> { UnsafeMutableRawPointer(self).assumingMemoryBound(to: T.self) }
  var opaque: OpaquePointer { OpaquePointer(self) }
  var raw: UnsafeMutableRawPointer { UnsafeMutableRawPointer(self) }

  /// The name assistive technologies (and the tests, through AT-SPI) know the widget by.
  @GtkActor func setAccessibleLabel(_ label: String) { tessera_gtk_set_accessible_label(self, label) }
  @GtkActor func setAccessibleDescription(_ text: String) { tessera_gtk_set_accessible_description(self, text) }
}

@GtkActor
enum Gtk {
  static func label(_ text: String, wrap: Bool = true) -> Widget {
    let label = gtk_label_new(text)!
    gtk_label_set_wrap(label.opaque, wrap ? 1 : 0)
    return label
  }

  static func button(_ text: String, accessibleLabel: String, action: @escaping @GtkActor () -> Void) -> Widget {
    let button = gtk_button_new_with_label(text)!
    button.setAccessibleLabel(accessibleLabel)
    Signals.connect(button.raw, "clicked", action)
    return button
  }
}

extension Gtk {
  /// A button showing an icon only; its accessible name says what it does and to what.
  static func iconButton(_ icon: String, accessibleLabel: String, action: @escaping @GtkActor () -> Void) -> Widget {
    let button = gtk_button_new_from_icon_name(icon)!
    button.setAccessibleLabel(accessibleLabel)
    gtk_widget_set_tooltip_text(button, accessibleLabel)
    gtk_widget_set_valign(button, GTK_ALIGN_CENTER)
    Signals.connect(button.raw, "clicked", action)
    return button
  }

  /// An AdwActionRow with a title and a subtitle, both shown as text (never markup: they come
  /// from identity providers and apps), and an accessible name that says both.
  static func row(title: String, subtitle: String, accessibleLabel: String? = nil) -> Widget {
    let row = adw_action_row_new()!
    adw_preferences_row_set_use_markup(row.as(AdwPreferencesRow.self), 0)
    adw_preferences_row_set_title(row.as(AdwPreferencesRow.self), title)
    adw_action_row_set_subtitle(row.as(AdwActionRow.self), subtitle)
    row.setAccessibleLabel(accessibleLabel ?? "\(title): \(subtitle)")
    return row
  }

  static func suffix(_ row: Widget, _ widget: Widget) {
    gtk_widget_set_valign(widget, GTK_ALIGN_CENTER)
    adw_action_row_add_suffix(row.as(AdwActionRow.self), widget)
  }

  /// A drop-down list of `labels`; its accessible name says what it filters.
  static func dropDown(_ labels: [String], accessibleLabel: String) -> Widget {
    let dropDown = withStrings(labels) { gtk_drop_down_new_from_strings($0) }!
    dropDown.setAccessibleLabel(accessibleLabel)
    // GTK 4.8 gives the keyboard focus to the drop-down's inner toggle button, which has no name
    // of its own: a screen reader would say "toggle button". It gets the drop-down's name.
    if let button = gtk_widget_get_first_child(dropDown) { button.setAccessibleLabel(accessibleLabel) }
    return dropDown
  }

  /// Calls `body` with a NULL-terminated C array of `strings`, valid for the call.
  static func withStrings<T>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> T) -> T {
    let copies = strings.map { UnsafePointer(strdup($0)) }
    defer { for copy in copies { free(UnsafeMutablePointer(mutating: copy)) } }
    return (copies + [nil]).withUnsafeBufferPointer { body($0.baseAddress!) }
  }

  /// Asks before a change that cannot be taken back: Cancel (the default, and what Escape does)
  /// and `actions`, `destructive` styled as such; `onConfirm` gets the action chosen.
  static func confirm(
    window: Widget?, heading: String, body: String, actions: [(id: String, label: String)], destructive: String,
    onConfirm: @escaping @GtkActor (String) -> Void
  ) {
    let dialog = adw_message_dialog_new(window.map { $0.as(GtkWindow.self) }, heading, body)!
    let message = dialog.as(AdwMessageDialog.self)
    adw_message_dialog_add_response(message, "cancel", "Cancel")
    for action in actions { adw_message_dialog_add_response(message, action.id, action.label) }
    adw_message_dialog_set_response_appearance(message, destructive, ADW_RESPONSE_DESTRUCTIVE)
    adw_message_dialog_set_default_response(message, "cancel")
    adw_message_dialog_set_close_response(message, "cancel")
    Signals.connectResponse(dialog.raw) { response in
      gtk_window_destroy(dialog.as(GtkWindow.self))
      guard actions.contains(where: { $0.id == response }) else { return }
      onConfirm(response)
    }
    gtk_window_present(dialog.as(GtkWindow.self))
  }

  /// A page: a vertical box whose preferences page scrolls.
  static func preferencesPage() -> Widget { adw_preferences_page_new()! }

  static func group(_ title: String, description: String? = nil) -> Widget {
    let group = adw_preferences_group_new()!
    adw_preferences_group_set_title(group.as(AdwPreferencesGroup.self), title)
    if let description { adw_preferences_group_set_description(group.as(AdwPreferencesGroup.self), description) }
    return group
  }
}

/// A preferences group whose rows are replaced whole on each update, with a line of text when it
/// has none.
@GtkActor
final class RowGroup {
  let group: Widget
  private var rows: [Widget] = []
  private let empty: Widget

  init(_ title: String, description: String? = nil, empty text: String) {
    group = Gtk.group(title, description: description)
    empty = Gtk.label(text)
    gtk_label_set_xalign(empty.opaque, 0)
    adw_preferences_group_add(group.as(AdwPreferencesGroup.self), empty)
  }

  func set(_ newRows: [Widget]) {
    for row in rows { adw_preferences_group_remove(group.as(AdwPreferencesGroup.self), row) }
    rows = newRows
    for row in rows { adw_preferences_group_add(group.as(AdwPreferencesGroup.self), row) }
    gtk_widget_set_visible(empty, rows.isEmpty ? 1 : 0)
  }

  func setTitle(_ title: String, description: String? = nil) {
    adw_preferences_group_set_title(group.as(AdwPreferencesGroup.self), title)
    adw_preferences_group_set_description(group.as(AdwPreferencesGroup.self), description)
  }

  func setEmptyText(_ text: String) { gtk_label_set_text(empty.opaque, text) }
}
