"""When a sign-in is needed (issue 10 §5–§7): the AttentionNeeded property, one desktop
notification per account through a notification server the test owns, its "Sign in" action, the
status report, and the refresh after resume from suspend or when the network comes back, with a
fake logind and NetworkManager on a private system bus."""
import json
import os
import subprocess
import sys
import threading
import time

import dbus
import dbus.bus
import dbus.lowlevel
import pytest

from conftest import (BUS_NAME, ERROR_PREFIX, IFACE, OBJECT_PATH, Broker, expect_error, new_connection, run_cli,
                      stop_process, wait_until)

from tessera_session import bus_config  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class NotificationServer:
    def __init__(self, tmp_path):
        self.record = tmp_path / "notifications.jsonl"
        self.record.write_text("")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_notifications.py"), str(self.record)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def calls(self, name=None):
        entries = [json.loads(line) for line in self.record.read_text().splitlines() if line]
        return [e for e in entries if name is None or e["call"] == name]

    def invoke(self, notification_id, action):
        conn = new_connection()
        try:
            obj = conn.get_object("org.freedesktop.Notifications", "/org/freedesktop/Notifications")
            obj.Invoke(dbus.UInt32(notification_id), action, dbus_interface="org.tessera.Test")
        finally:
            conn.close()

    def close(self):
        stop_process(self.proc)


@pytest.fixture
def notifications(tmp_path):
    server = NotificationServer(tmp_path)
    yield server
    server.close()


def attention_needed():
    conn = new_connection()
    try:
        props = dbus.Interface(conn.get_object(BUS_NAME, OBJECT_PATH), "org.freedesktop.DBus.Properties")
        return [str(a) for a in props.Get(IFACE, "AttentionNeeded")]
    finally:
        conn.close()


def status():
    """`tessera status --json`; its exit status says whether an account needs a sign-in (4) or not."""
    proc = run_cli("status", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == (4 if report["attention_needed"] else 0), (proc.returncode, report)
    return report


class PropertiesMonitor:
    """dbus-monitor watching PropertiesChanged on the broker's object; ready once it saw our probe."""

    def __init__(self):
        self.lines = []
        self.proc = subprocess.Popen(
            ["dbus-monitor", "--session", "--profile",
             f"type='signal',interface='org.freedesktop.DBus.Properties',path='{OBJECT_PATH}'"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        threading.Thread(target=lambda: [self.lines.append(line) for line in self.proc.stdout], daemon=True).start()
        conn = new_connection()
        try:
            def probed():
                conn.send_message(dbus.lowlevel.SignalMessage(OBJECT_PATH, "org.freedesktop.DBus.Properties", "Probe"))
                conn.flush()
                time.sleep(0.1)
                return any("\tProbe" in line for line in self.lines)
            wait_until(probed, what="dbus-monitor to start")
        finally:
            conn.close()

    def seen(self, member):
        return [line for line in self.lines if line.rstrip("\n").endswith("\t" + member)]

    def close(self):
        stop_process(self.proc)


def test_a_refused_refresh_token_gives_one_notification_and_its_action_signs_in(broker, notifications, idp):
    account_id = broker.sign_in()["account"]["id"]
    assert attention_needed() == []
    report = status()
    assert report["schema"] == 1 and report["attention_needed"] == []
    (alice,) = report["accounts"]
    assert alice["state"] == "ok" and "last_error" not in alice
    assert alice["refresh_token_clients"] == ["tessera-test"]
    assert [t["client_id"] for t in alice["tokens"]] == ["tessera-test"]
    assert alice["tokens"][0]["expires_on"] > time.time() and "secret" not in json.dumps(alice)

    properties = PropertiesMonitor()
    idp.revoke_user("alice")
    for _ in range(20):
        expect_error("InteractionRequired", broker.silent, force_refresh=True)
    wait_until(lambda: attention_needed() == [account_id], what="AttentionNeeded to name alice")
    time.sleep(0.5)  # a second notification would have arrived by now
    shown = notifications.calls("Notify")
    assert len(shown) == 1, shown
    assert shown[0]["summary"] == "Sign in again to alice"
    assert "tessera-test" in shown[0]["body"]
    assert shown[0]["actions"][2:] == ["sign-in", "Sign in"]
    wait_until(lambda: properties.seen("PropertiesChanged"), what="PropertiesChanged for AttentionNeeded")
    properties.close()

    report = status()
    assert report["attention_needed"] == [account_id]
    (alice,) = report["accounts"]
    assert alice["state"] == "needs_sign_in"
    assert alice["last_error"]["code"] == "InteractionRequired" and abs(alice["last_error"]["at"] - time.time()) < 60
    text = run_cli("status", check_rc=4).stdout
    assert "needs a sign-in" in text and "tessera login" in text

    # The user clicks "Sign in": tesserad opens the browser (the test browser signs alice in).
    mark = idp.mark()
    notifications.invoke(shown[0]["id"], "sign-in")
    wait_until(lambda: attention_needed() == [], timeout=60, what="the sign-in from the notification")
    assert idp.token_posts(mark, grant_type="authorization_code"), "the action started a real sign-in"
    wait_until(lambda: notifications.calls("CloseNotification"), what="the notification to be withdrawn")
    assert notifications.calls("CloseNotification")[0]["id"] == shown[0]["id"]
    assert broker.silent(force_refresh=True)["account"]["id"] == account_id
    assert status()["accounts"][0]["state"] == "ok"


def test_actions_from_another_program_are_ignored(broker, notifications, idp):
    broker.sign_in()
    idp.revoke_user("alice")
    expect_error("InteractionRequired", broker.silent, force_refresh=True)
    wait_until(lambda: notifications.calls("Notify"), what="the notification")
    (shown,) = notifications.calls("Notify")
    # Another program on the bus forges ActionInvoked for that id: no sign-in starts.
    mark = idp.mark()
    conn = new_connection()
    try:
        signal = dbus.lowlevel.SignalMessage("/org/freedesktop/Notifications", "org.freedesktop.Notifications",
                                             "ActionInvoked")
        signal.append(dbus.UInt32(shown["id"]), "sign-in", signature="us")
        conn.send_message(signal)
        conn.flush()
    finally:
        conn.close()
    time.sleep(1.5)
    assert not any("/authorize" in r["path"] for r in idp.requests(mark))
    assert attention_needed() != []


def test_no_notification_server_means_no_notification(daemon, broker, idp):
    broker.sign_in()
    idp.revoke_user("alice")
    expect_error("InteractionRequired", broker.silent, force_refresh=True)
    wait_until(lambda: "No notification shown" in daemon.log(), what="the log to say no notification was shown")
    assert attention_needed() != []


# ----------------------------------------------------------------------------------------------
# Resume and network: a private system bus with a fake logind and NetworkManager




@pytest.fixture
def system_bus(tmp_path):
    socket = tmp_path / "system_bus_socket"
    config = tmp_path / "system.conf"
    config.write_text(bus_config("system", socket))
    proc = subprocess.Popen(["dbus-daemon", "--nofork", f"--config-file={config}", "--print-address"],
                            stdout=subprocess.PIPE, text=True)
    address = proc.stdout.readline().strip()
    assert address, "the private system bus did not start"
    yield address
    stop_process(proc)


def emit(address, name, path, interface, member, signature, *args):
    """Owns `name` on the bus at `address` and emits the signal from it, as logind or
    NetworkManager would."""
    conn = dbus.bus.BusConnection(address)
    try:
        assert conn.request_name(name) == dbus.bus.REQUEST_NAME_REPLY_PRIMARY_OWNER
        signal = dbus.lowlevel.SignalMessage(path, interface, member)
        signal.append(*args, signature=signature)
        conn.send_message(signal)
        conn.flush()
        time.sleep(0.2)
    finally:
        conn.close()


LOGIND = ("org.freedesktop.login1", "/org/freedesktop/login1", "org.freedesktop.login1.Manager")
NM = ("org.freedesktop.NetworkManager", "/org/freedesktop/NetworkManager", "org.freedesktop.NetworkManager")


def test_resume_from_suspend_refreshes_tokens_in_use(start_daemon, system_bus, idp):
    start_daemon(extra_env={"DBUS_SYSTEM_BUS_ADDRESS": system_bus})
    b = Broker()
    first = b.sign_in()["access_token"]
    assert b.silent()["access_token"] == first  # in recent use now
    mark = idp.mark()
    emit(system_bus, *LOGIND, "PrepareForSleep", "b", True)  # going to sleep: nothing happens
    time.sleep(0.5)
    assert idp.token_posts(mark) == []
    emit(system_bus, *LOGIND, "PrepareForSleep", "b", False)  # woke up
    wait_until(lambda: idp.token_posts(mark, grant_type="refresh_token"), what="a refresh after resume")
    assert b.silent()["access_token"] != first
    b.close()


def test_the_network_coming_back_refreshes_tokens_in_use(start_daemon, system_bus, idp):
    start_daemon(extra_env={"DBUS_SYSTEM_BUS_ADDRESS": system_bus})
    b = Broker()
    b.sign_in()
    b.silent()
    mark = idp.mark()
    emit(system_bus, *NM, "StateChanged", "u", dbus.UInt32(20))  # disconnected
    time.sleep(0.5)
    assert idp.token_posts(mark) == []
    emit(system_bus, *NM, "StateChanged", "u", dbus.UInt32(70))  # connected, global
    wait_until(lambda: idp.token_posts(mark, grant_type="refresh_token"), what="a refresh when the network is back")
    b.close()


def test_signals_from_a_program_that_is_not_logind_are_ignored(start_daemon, system_bus, idp):
    daemon = start_daemon(extra_env={"DBUS_SYSTEM_BUS_ADDRESS": system_bus})
    b = Broker()
    b.sign_in()
    b.silent()
    mark = idp.mark()
    conn = dbus.bus.BusConnection(system_bus)  # owns no name: any local user could be this
    try:
        bus = dbus.Interface(conn.get_object("org.freedesktop.DBus", "/org/freedesktop/DBus"), "org.freedesktop.DBus")
        tesserad = wait_until(lambda: [n for n in bus.ListNames() if n.startswith(":") and
                                       bus.GetConnectionUnixProcessID(n) == daemon.proc.pid],
                              what="tesserad on the system bus")[0]
        # A broadcast, and the same signal addressed to tesserad alone (which the bus delivers
        # whatever tesserad's match rules say), both from a connection that is not logind.
        for destination in (None, tesserad):
            signal = dbus.lowlevel.SignalMessage(*LOGIND[1:], "PrepareForSleep")
            if destination:
                signal.set_destination(destination)
            signal.append(False, signature="b")
            conn.send_message(signal)
        # The real owner of the name, but addressed to tesserad alone: not how logind speaks.
        assert conn.request_name(LOGIND[0]) == dbus.bus.REQUEST_NAME_REPLY_PRIMARY_OWNER
        time.sleep(0.3)  # tesserad hears the new owner
        signal = dbus.lowlevel.SignalMessage(*LOGIND[1:], "PrepareForSleep")
        signal.set_destination(tesserad)
        signal.append(False, signature="b")
        conn.send_message(signal)
        conn.flush()
        time.sleep(1)
        assert idp.token_posts(mark) == []
        # The same owner broadcasting is logind waking up: heard.
        signal = dbus.lowlevel.SignalMessage(*LOGIND[1:], "PrepareForSleep")
        signal.append(False, signature="b")
        conn.send_message(signal)
        conn.flush()
        wait_until(lambda: idp.token_posts(mark, grant_type="refresh_token"), what="the real logind to be heard")
    finally:
        conn.close()
    b.close()


def test_a_resume_offline_does_not_hold_back_the_network_refresh(start_daemon, system_bus, idp):
    start_daemon(extra_env={"DBUS_SYSTEM_BUS_ADDRESS": system_bus})
    b = Broker()
    b.sign_in()
    b.silent()
    mark = idp.mark()
    emit(system_bus, *LOGIND, "PrepareForSleep", "b", False)
    wait_until(lambda: len(idp.token_posts(mark, grant_type="refresh_token")) == 1, what="the resume refresh")
    emit(system_bus, *NM, "StateChanged", "u", dbus.UInt32(20))
    emit(system_bus, *NM, "StateChanged", "u", dbus.UInt32(70))
    wait_until(lambda: len(idp.token_posts(mark, grant_type="refresh_token")) == 2,
               what="the network refresh seconds after the resume one")
    # The same kind of event again within a minute: nothing more.
    emit(system_bus, *LOGIND, "PrepareForSleep", "b", False)
    time.sleep(1)
    assert len(idp.token_posts(mark, grant_type="refresh_token")) == 2
    b.close()
