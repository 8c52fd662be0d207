"""What the tests' fake desktop services share (Tests/e2e/fake_portal.py, fake_notifications.py):
each is a program that owns a name on the session bus, writes the calls it gets as JSON lines to the
file given as argv[1] (the test reads them there), and prints "ready" once it owns the name: the
test waits for that line before it starts anything that talks to the service."""
import json
import sys

import dbus
import dbus.mainloop.glib
import dbus.service
from gi.repository import GLib


class Recorded(dbus.service.Object):
    """An exported object that writes what it is asked to the record file."""

    def __init__(self, bus, path, record):
        super().__init__(bus, path)
        self.record = record

    def write(self, entry):
        with open(self.record, "a") as f:
            f.write(json.dumps(entry) + "\n")


def serve(name, service):
    """Exports service(bus, record file), owns `name` and serves until killed."""
    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    bus = dbus.SessionBus()
    exported = service(bus, sys.argv[1])
    owned = dbus.service.BusName(name, bus, do_not_queue=True)  # kept while running
    print("ready", flush=True)
    GLib.MainLoop().run()
    del exported, owned
