import CAdwaita
import CTesseraGtkShim

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
