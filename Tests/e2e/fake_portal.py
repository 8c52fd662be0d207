"""A portal access-dialog backend for the tests, like xdg-desktop-portal-gnome's: owns
org.freedesktop.impl.portal.desktop.tessertest on the session bus and serves
org.freedesktop.impl.portal.Access.AccessDialog. Each dialog is written as a JSON line to the file
given as argv[1] and stays open until the test answers it with org.tessera.Test.Answer(handle,
response, remember) (response 0 allow, 1 deny, 2 closed), or until tesserad calls
org.freedesktop.impl.portal.Request.Close on its handle."""
import os
import sys

import dbus
import dbus.service

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from fake_service import Recorded, serve  # noqa: E402

NAME = "org.freedesktop.impl.portal.desktop.tessertest"
PATH = "/org/freedesktop/portal/desktop"
ACCESS = "org.freedesktop.impl.portal.Access"


class Request(dbus.service.Object):
    """The dialog's handle, as backends export it: Close takes the dialog down."""

    def __init__(self, bus, handle, backend):
        super().__init__(bus, handle)
        self.handle = handle
        self.backend = backend

    @dbus.service.method("org.freedesktop.impl.portal.Request", in_signature="", out_signature="")
    def Close(self):
        self.backend.write({"call": "Close", "handle": self.handle})
        self.backend.finish(self.handle, 2, False)


class Backend(Recorded):
    def __init__(self, bus, record):
        super().__init__(bus, PATH, record)
        self.bus = bus
        self.open = {}

    @dbus.service.method(ACCESS, in_signature="osssssa{sv}", out_signature="ua{sv}",
                         async_callbacks=("reply", "error"))
    def AccessDialog(self, handle, app_id, parent_window, title, subtitle, body, options, reply, error):
        choices = [{"id": str(c[0]), "label": str(c[1]), "default": str(c[3]),
                    "options": [[str(o[0]), str(o[1])] for o in c[2]]} for c in options.get("choices", [])]
        self.write({"call": "AccessDialog", "handle": str(handle), "app_id": str(app_id), "title": str(title),
                    "subtitle": str(subtitle), "body": str(body), "choices": choices,
                    "grant_label": str(options.get("grant_label", "")),
                    "deny_label": str(options.get("deny_label", ""))})
        self.open[str(handle)] = (Request(self.bus, str(handle), self), reply)

    def finish(self, handle, response, remember, chosen=()):
        request, reply = self.open.pop(handle, (None, None))
        if reply is None:
            return False
        request.remove_from_connection()
        results = {}
        if response == 0:
            picked = [dbus.Struct((str(k), str(v))) for k, v in chosen]
            picked.append(dbus.Struct(("remember", "true" if remember else "false")))
            results["choices"] = dbus.Array(picked, signature="(ss)")
        reply(dbus.UInt32(response), dbus.Dictionary(results, signature="sv"))
        return True

    @dbus.service.method("org.tessera.Test", in_signature="suba(ss)", out_signature="b")
    def AnswerWith(self, handle, response, remember, chosen):
        """Answer, with the user's picks in the dialog's choice lists (id, option)."""
        return self.finish(str(handle), int(response), bool(remember), [(c[0], c[1]) for c in chosen])

    @dbus.service.method("org.tessera.Test", in_signature="sub", out_signature="b")
    def Answer(self, handle, response, remember):
        return self.finish(str(handle), int(response), bool(remember))


if __name__ == "__main__":
    serve(NAME, Backend)
