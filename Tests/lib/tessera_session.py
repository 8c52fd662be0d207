"""What Tessera's test suites that run inside scripts/test-session share (Tests/e2e, and Tests/msal
inside scripts/msal-session): connections to the session bus, a broker process started by a test,
and the mode file of the session's test browser (Tests/idp/browser.py)."""
import json
import os
import signal
import subprocess
import time

import dbus
import dbus.bus
import pytest


def bus_address():
    return os.environ["DBUS_SESSION_BUS_ADDRESS"]


def new_connection():
    """A private connection of its own (own unique name; safe to use from one thread)."""
    return dbus.bus.BusConnection(bus_address())


def bus_daemon():
    """A connection and the bus daemon's org.freedesktop.DBus interface on it."""
    conn = new_connection()
    return conn, dbus.Interface(conn.get_object("org.freedesktop.DBus", "/org/freedesktop/DBus"), "org.freedesktop.DBus")


def bus_config(bus_type, socket_path, service_dir=None):
    """A dbus-daemon configuration for a private bus the tests own: anyone may own any name and
    send anything (the policy of Debian's session bus). `bus_type` is "session" or "system"."""
    services = f"  <servicedir>{service_dir}</servicedir>\n" if service_dir else ""
    return f"""<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>{bus_type}</type>
  <listen>unix:path={socket_path}</listen>
  <auth>EXTERNAL</auth>
{services}  <policy context="default">
    <allow user="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""


def tail(path, limit=4000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-limit:]
    except OSError:
        return ""


class BusPeer:
    """A client of one of the broker's fronts, on a connection of its own."""

    def __init__(self, connection=None):
        self.conn = connection or new_connection()
        self.unique_name = str(self.conn.get_unique_name())

    def close(self):
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


class Daemon:
    """A broker process started by a test; its output (the log) goes to a file. It counts as
    started once it owns `name` (and the owner is this process). Subclasses say what to run."""

    def __init__(self, log_path, env, name):
        self.log_path = log_path
        self.env = env
        self.name = name
        self.proc = None
        self._conn, self._dbus = bus_daemon()

    def command(self):
        raise NotImplementedError

    def has_owner(self):
        return bool(self._dbus.NameHasOwner(self.name))

    def start(self, timeout=60.0):
        # The event waited for is the name's owner (or the process's exit); the bound is only
        # against a hang: a busy 2-core machine has taken over 10 s to start a debug tesserad.
        assert not self.has_owner(), f"{self.name} is already owned before the test starts its broker"
        cmd = self.command()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"{cmd[0]} exited with {self.proc.returncode} at start:\n{self.log()[-3000:]}")
            if self.has_owner():
                pid = int(self._dbus.GetConnectionUnixProcessID(self.name))
                assert pid == self.proc.pid, f"{self.name} is owned by pid {pid}, not by our {cmd[0]}"
                return self
            time.sleep(0.02)
        self.stop()
        pytest.fail(f"{cmd[0]} did not own {self.name} within {timeout} s:\n{self.log()[-3000:]}")

    def stop(self, timeout=30.0):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                pytest.fail(f"the broker did not stop within {timeout:.0f} s of SIGTERM")
        rc = self.proc.returncode
        self.proc = None
        deadline = time.monotonic() + 5
        while self.has_owner() and time.monotonic() < deadline:
            time.sleep(0.02)
        return rc

    def restart(self):
        self.stop()
        return self.start()

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def log(self):
        return tail(self.log_path, limit=1 << 30)

    def close(self):
        self.stop()
        self._conn.close()


class BrowserMode:
    """The file browser.py reads its mode from (allow / deny / ignore); the daemon's environment
    points TESSERA_TEST_BROWSER_FILE at it, so tests switch modes while the daemon runs."""

    def __init__(self, path):
        self.path = path
        self.set("allow")

    def set(self, mode):
        with open(self.path, "w") as f:
            f.write(mode + "\n")


class IdPLog:
    """The test IdP (scripts/idp) as the suites see it: its request log (one JSON line per
    request, written by Tests/idp/idp/middleware.py) and its management commands."""

    def __init__(self, repo, idp_dir, tenant, log_path):
        self.repo = repo
        self.dir = idp_dir
        self.log_path = log_path
        self.token_path = f"/{tenant}/o/token/"
        self.authorize_path = f"/{tenant}/o/authorize/"

    def _lines(self):
        try:
            with open(self.log_path) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def mark(self):
        """The current end of the request log; pass it to requests()."""
        return len(self._lines())

    def requests(self, since=0):
        return self._lines()[since:]

    def token_posts(self, since=0, grant_type=None, status=None):
        return [r for r in self.requests(since)
                if r["method"] == "POST" and r["path"] == self.token_path
                and (grant_type is None or r["grant_type"] == grant_type)
                and (status is None or r["status"] == status)]

    def manage(self, *args):
        out = subprocess.run([os.path.join(self.repo, "scripts", "idp"), "manage", self.dir, *args],
                             check=True, capture_output=True, text=True, timeout=60)
        return out.stdout

    def revoke_user(self, name):
        return self.manage("idp_revoke_user", name)
