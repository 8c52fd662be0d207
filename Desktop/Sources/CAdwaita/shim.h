// libadwaita 1.2 and GTK 4.8 (Debian 12), for tessera-accounts only: tesserad never links them.
#include <adwaita.h>
