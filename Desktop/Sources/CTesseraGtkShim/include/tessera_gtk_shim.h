// What Swift cannot call in GTK: variadic functions. Each function is one line, prefixed
// tessera_gtk_, with the reason it exists.
#pragma once
#include <adwaita.h>

// gtk_accessible_update_property is variadic: sets a widget's accessible name (label).
void tessera_gtk_set_accessible_label(GtkWidget *widget, const char *label);

// gtk_accessible_update_property is variadic: sets a widget's accessible description.
void tessera_gtk_set_accessible_description(GtkWidget *widget, const char *description);
