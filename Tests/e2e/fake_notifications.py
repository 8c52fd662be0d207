"""A notification server for the tests: owns org.freedesktop.Notifications on the session bus,
writes each Notify and CloseNotification call as a JSON line to the file given as argv[1], and
emits ActionInvoked(id, key) when the test calls org.tessera.Test.Invoke(id, key)."""
import os
import sys

import dbus.service

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from fake_service import Recorded, serve  # noqa: E402

NAME = "org.freedesktop.Notifications"
PATH = "/org/freedesktop/Notifications"


class Notifications(Recorded):
    def __init__(self, bus, record):
        super().__init__(bus, PATH, record)
        self.next_id = 0

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


if __name__ == "__main__":
    serve(NAME, Notifications)
