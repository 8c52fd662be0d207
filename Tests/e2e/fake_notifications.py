"""A notification server for the tests: owns org.freedesktop.Notifications on the session bus,
writes each Notify and CloseNotification call as a JSON line to the file given as argv[1], and
emits ActionInvoked(id, key) when the test calls org.tessera.Test.Invoke(id, key)."""
import json
import sys

import dbus
import dbus.mainloop.glib
import dbus.service
from gi.repository import GLib

NAME = "org.freedesktop.Notifications"
PATH = "/org/freedesktop/Notifications"


class Notifications(dbus.service.Object):
    def __init__(self, bus, record):
        super().__init__(bus, PATH)
        self.record = record
        self.next_id = 0

    def write(self, entry):
        with open(self.record, "a") as f:
            f.write(json.dumps(entry) + "\n")

    @dbus.service.method(NAME, in_signature="susssasa{sv}i", out_signature="u")
    def Notify(self, app_name, replaces_id, app_icon, summary, body, actions, hints, expire_timeout):
        self.next_id += 1
        self.write({"call": "Notify", "id": self.next_id, "app_name": str(app_name), "summary": str(summary),
                    "body": str(body), "actions": [str(a) for a in actions]})
        return self.next_id

    @dbus.service.method(NAME, in_signature="u", out_signature="")
    def CloseNotification(self, notification_id):
        self.write({"call": "CloseNotification", "id": int(notification_id)})
        self.NotificationClosed(notification_id, 3)

    @dbus.service.method(NAME, in_signature="", out_signature="as")
    def GetCapabilities(self):
        return ["actions", "body"]

    @dbus.service.method(NAME, in_signature="", out_signature="ssss")
    def GetServerInformation(self):
        return ("fake", "tessera-tests", "1", "1.2")

    @dbus.service.signal(NAME, signature="us")
    def ActionInvoked(self, notification_id, action_key):
        pass

    @dbus.service.signal(NAME, signature="uu")
    def NotificationClosed(self, notification_id, reason):
        pass

    @dbus.service.method("org.tessera.Test", in_signature="us", out_signature="")
    def Invoke(self, notification_id, action_key):
        self.ActionInvoked(notification_id, action_key)


def main():
    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    bus = dbus.SessionBus()
    server = Notifications(bus, sys.argv[1])
    name = dbus.service.BusName(NAME, bus, do_not_queue=True)  # noqa: F841 (kept while running)
    print("ready", flush=True)
    GLib.MainLoop().run()
    del server


if __name__ == "__main__":
    main()
