"""config.toml's `store = "auto"` (issue 37 §10): the file store only where the session bus has no
Secret Service at all. A keyring that is there but locked at start, or slow to start, or that can
never start in this bus (a `dbus-run-session` nested in a desktop), stays the store: requests are
told why it cannot be used until it can, and no account is lost to a second store. (The case with
no Secret Service at all, which gets the file store, is test_file_store.py's first test.)"""
import json
import os
import shutil
import subprocess

import dbus
import dbus.bus
import pytest

from conftest import TESSERA, Broker, expect_error, stop_process, wait_until
from tessera_keyring import SECRETS
from tessera_session import bus_config
from test_faults_keyring import PrivateSession

PASSWORD = os.environ["TESSERA_TEST_KEYRING_PASSWORD"]


def own_file_store(tmp_path):
    """tesserad's extra environment for a file store and key of the test's own, and the store's
    directory: that it stays absent shows that `auto` did not choose it."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "CREDENTIALS_DIRECTORY": str(tmp_path / "no-credentials")}
    return env, tmp_path / "state" / "tessera" / "store"


def status(env=None):
    proc = subprocess.run([TESSERA, "status", "--json"], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, env=env)
    return proc.returncode, json.loads(proc.stdout)


def test_a_keyring_locked_at_start_stays_the_store(start_daemon, write_config, keyring, idp, tmp_path):
    """An auto-login desktop, or tesserad socket-activated before the keyring is unlocked: the
    accounts are in the keyring, so the keyring stays the store (it used to be left for an empty
    file store, and the accounts seemed gone)."""
    env, store_dir = own_file_store(tmp_path)
    config = write_config(store="auto")
    first = start_daemon(config, extra_env=env)
    b = Broker()
    try:
        account = b.sign_in()["account"]["id"]
        first.stop()
        keyring.lock()
        d = start_daemon(config, extra_env=env)
        assert "Using the secret-service store: a Secret Service is on the session bus" in d.log()
        rc, report = status()
        assert rc == 11 and report["store_kind"] == "secret-service", report
        assert "lock" in report["store_message"].lower(), report
        message = expect_error("StoreUnavailable", b.accounts)
        assert "locked" in message.lower(), message
        assert not store_dir.exists(), "auto chose the file store"
        keyring.unlock()
        assert [a["id"] for a in b.accounts()] == [account], "no account lost"
        assert b.silent()["account"]["id"] == account
    finally:
        b.close()


class ActivatingSession(PrivateSession):
    """A session bus of its own whose Secret Service D-Bus starts on demand, as a desktop's does:
    through `Exec` in a service file, with the environment given to the bus daemon. (A
    PrivateSession's bus starts nothing; its connection and daemon helpers serve here too.)"""

    def __init__(self, tmp_path, exec_line, extra_env=None):
        self.dir = tmp_path
        services = tmp_path / "services"
        services.mkdir()
        (services / "org.freedesktop.secrets.service").write_text(
            f"[D-BUS Service]\nName=org.freedesktop.secrets\nExec={exec_line}\n")
        (tmp_path / "bus.conf").write_text(bus_config("session", tmp_path / "bus", service_dir=services))
        for name in ("home", "data", "run", "state", "config"):
            (tmp_path / name).mkdir(mode=0o700, exist_ok=True)
        self.env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path / "run"), XDG_DATA_HOME=str(tmp_path / "data"),
                        XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"),
                        CREDENTIALS_DIRECTORY=str(tmp_path / "no-credentials"), **(extra_env or {}))
        if "GNOME_KEYRING_CONTROL" not in (extra_env or {}):
            self.env.pop("GNOME_KEYRING_CONTROL", None)
        self.env.pop("TESSERA_SOCKET", None)
        self.bus = subprocess.Popen(["dbus-daemon", f"--config-file={tmp_path}/bus.conf", "--nofork", "--print-address"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.env)
        self.address = self.bus.stdout.readline().strip()
        assert self.address, "dbus-daemon did not start"
        self.env["DBUS_SESSION_BUS_ADDRESS"] = self.address
        self.store_dir = tmp_path / "state" / "tessera" / "store"

    def keyring_pid(self):
        """The pid of the process that owns org.freedesktop.secrets here; None when none does."""
        conn = self.connection()
        try:
            bus = dbus.Interface(conn.get_object("org.freedesktop.DBus", "/org/freedesktop/DBus"), "org.freedesktop.DBus")
            return int(bus.GetConnectionUnixProcessID(SECRETS))
        except dbus.exceptions.DBusException as error:
            if error.get_dbus_name() == "org.freedesktop.DBus.Error.NameHasNoOwner":
                return None
            raise
        finally:
            conn.close()

    def start_keyring(self):
        """Has D-Bus start the keyring now, and waits until it is unlocked."""
        conn = self.connection()
        try:
            bus = dbus.Interface(conn.get_object("org.freedesktop.DBus", "/org/freedesktop/DBus"), "org.freedesktop.DBus")
            bus.StartServiceByName(SECRETS, dbus.UInt32(0), timeout=60)
            props = dbus.Interface(conn.get_object(SECRETS, "/org/freedesktop/secrets/aliases/default"),
                                   "org.freedesktop.DBus.Properties")
            wait_until(lambda: not props.Get("org.freedesktop.Secret.Collection", "Locked"), timeout=30,
                       what="the keyring to unlock")
        finally:
            conn.close()

    def stop_keyring(self):
        pid = self.keyring_pid()
        if pid is not None:
            os.kill(pid, 15)
            wait_until(lambda: self.keyring_pid() is None, timeout=30, what="the keyring to be gone")

    def close(self):
        try:
            self.stop_keyring()
        finally:
            stop_process(self.bus)


def delayed_keyring(tmp_path):
    """A script that D-Bus runs to start the keyring: it waits 3 s first, then starts an unlocked
    gnome-keyring with its own data directory (as a keyring still coming up at login)."""
    script = tmp_path / "slow-keyring"
    script.write_text(f"""#!/bin/sh
sleep 3
printf %s '{PASSWORD}' | exec gnome-keyring-daemon --foreground --unlock --components=secrets
""")
    script.chmod(0o700)
    return str(script)


def test_a_keyring_that_appears_3_s_after_tesserad_stays_the_store(write_config, browser, tmp_path):
    """The keyring is there to be started (activatable) but answers only 3 s later: tesserad
    keeps it, says why meanwhile, and finds the account signed in before."""
    session = ActivatingSession(tmp_path, delayed_keyring(tmp_path))
    try:
        session.env["TESSERA_TEST_BROWSER_FILE"] = browser.path
        config = write_config(store="auto")
        session.start_keyring()
        first = session.daemon(config, str(tmp_path / "first.log")).start()
        b = Broker(session.connection())
        signed_in = b.sign_in()
        assert session.keyring_pid() is not None and not session.store_dir.exists()
        first.close()
        session.stop_keyring()

        d = session.daemon(config, str(tmp_path / "second.log")).start()
        try:
            log = d.log()
            assert "Using the secret-service store" in log, log
            assert "Using the file store" not in log, log

            def accounts():
                try:
                    return [a["id"] for a in b.accounts()]
                except dbus.exceptions.DBusException as error:
                    assert error.get_dbus_name().endswith("StoreUnavailable"), error
                    return None

            assert wait_until(accounts, timeout=60, interval=0.2, what="the keyring to answer") == [
                signed_in["account"]["id"]], "no account lost"
            assert b.silent()["access_token"] == signed_in["access_token"]
            assert not session.store_dir.exists(), "auto chose the file store"
        finally:
            b.close()
            d.close()
    finally:
        session.close()


def test_a_nested_dbus_run_session_says_why_the_keyring_does_not_answer(write_config, browser, idp, tmp_path):
    """A `dbus-run-session` inside a desktop session: D-Bus can start gnome-keyring on this bus,
    but with GNOME_KEYRING_CONTROL set it joins the desktop's keyring on the other bus and never
    answers here. `tessera login` says so; it used to open the browser against a file store."""
    if shutil.which("gnome-keyring-daemon") is None:
        pytest.skip("needs gnome-keyring-daemon")
    outer = os.environ.get("GNOME_KEYRING_CONTROL")
    if not outer:
        pytest.skip("the test session's keyring exported no GNOME_KEYRING_CONTROL")
    session = ActivatingSession(tmp_path, "/usr/bin/gnome-keyring-daemon --start --foreground --components=secrets",
                                extra_env={"GNOME_KEYRING_CONTROL": outer})
    try:
        session.env["TESSERA_TEST_BROWSER_FILE"] = browser.path
        browser.set("ignore")
        mark = idp.mark()
        config = write_config(store="auto")
        d = session.daemon(config, str(tmp_path / "nested.log")).start()
        try:
            assert "Using the secret-service store" in d.log(), d.log()
            login = subprocess.run([TESSERA, "login", "--timeout", "30"], capture_output=True, text=True, timeout=120,
                                   env=session.env, stdin=subprocess.DEVNULL)
            assert login.returncode == 11, login.stderr
            assert "GNOME_KEYRING_CONTROL" in login.stderr, login.stderr
            assert not any("/authorize" in r["path"] for r in idp.requests(mark)), "a sign-in started"
            rc, report = status(session.env)
            assert rc == 11 and report["store_kind"] == "secret-service", report
            assert not session.store_dir.exists(), "auto chose the file store"
        finally:
            d.close()
    finally:
        session.close()
