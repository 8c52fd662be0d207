"""A stand-in for the user's service manager on its private socket ($XDG_RUNTIME_DIR/systemd/private),
for the impostor test: it answers org.freedesktop.DBus.Properties.Get(Service, MainPID) for
tessera.service with the pid it is given, as systemd --user does for a running service.

Usage: fake_systemd.py SOCKET_PATH MAIN_PID   (prints "ready" once it listens)"""
import sys

import dbus
import dbus.exceptions
import dbus.mainloop.glib
import dbus.server
import dbus.service
from gi.repository import GLib

UNIT = "/org/freedesktop/systemd1/unit/tessera_2eservice"


class Unit(dbus.service.Object):
    def __init__(self, conn, main_pid):
        super().__init__(conn, UNIT)
        self.main_pid = main_pid

    @dbus.service.method("org.freedesktop.DBus.Properties", in_signature="ss", out_signature="v")
    def Get(self, interface, name):
        if interface == "org.freedesktop.systemd1.Service" and name == "MainPID":
            return dbus.UInt32(self.main_pid)
        raise dbus.exceptions.DBusException(f"no property {interface}.{name}",
                                            name="org.freedesktop.DBus.Error.UnknownProperty")


class Manager(dbus.server.Server):
    """Its constructor is dbus-python's (address only); main_pid and units are set after it."""
    main_pid = 0
    units = []

    def connection_added(self, conn):
        self.units.append(Unit(conn, self.main_pid))


def main():
    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    server = Manager("unix:path=" + sys.argv[1])
    server.main_pid = int(sys.argv[2])
    print("ready", flush=True)
    try:
        GLib.MainLoop().run()
    finally:
        server.disconnect()


if __name__ == "__main__":
    main()
