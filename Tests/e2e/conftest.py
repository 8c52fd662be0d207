"""Fixtures for Tessera's end-to-end tests.

Run inside the headless test session (private bus, unlocked gnome-keyring, test IdP):

    scripts/test-session "$PWD/.build-idp/venv/bin/python" -m pytest -q Tests/e2e

Each test gets a clean keyring (no item with tessera_schema=1), a browser mode file set to
"allow", and, when it asks for the `daemon` / `broker` fixtures, a freshly started tesserad
(binary from $TESSERA_BIN_DIR, default <repo>/.build/debug) reading the session's config.toml.
"""
import base64
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import tomllib

import dbus
import dbus.bus
import dbus.lowlevel
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from tessera_session import BrowserMode, BusPeer, IdPLog, bus_address, bus_daemon, new_connection  # noqa: E402
from tessera_session import Daemon as SessionDaemon  # noqa: E402
import tessera_keyring  # noqa: E402

if os.environ.get("TESSERA_TEST_SESSION") != "1":
    pytest.exit(
        "Tessera's e2e tests must run inside the test session:\n"
        '  scripts/test-session "$PWD/.build-idp/venv/bin/python" -m pytest Tests/e2e',
        returncode=2,
    )

REPO = os.environ.get("TESSERA_REPO") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("TESSERA_BIN_DIR") or os.path.join(REPO, ".build", "debug")
TESSERAD = os.path.join(BIN_DIR, "tesserad")
TESSERA = os.path.join(BIN_DIR, "tessera")
SESSION_CONFIG = os.path.join(os.environ["XDG_CONFIG_HOME"], "tessera", "config.toml")

BUS_NAME = "org.tessera.Broker1"
OBJECT_PATH = "/org/tessera/Broker1"
IFACE = "org.tessera.Broker1"
ERROR_PREFIX = "org.tessera.Broker1.Error."

AUTHORITY = os.environ["TESSERA_IDP_AUTHORITY"]
IDP_URL = os.environ["TESSERA_IDP_URL"]
IDP_DIR = os.environ["TESSERA_IDP_DIR"]
TENANT = AUTHORITY.rstrip("/").rsplit("/", 1)[1]
ENVIRONMENT = IDP_URL.split("://", 1)[1]  # 127.0.0.1:PORT

# Interactive calls: the broker answers when the sign-in is over; never use D-Bus's 25 s default.
INTERACTIVE_TIMEOUT = 120.0
SILENT_TIMEOUT = 30.0


# ----------------------------------------------------------------------------------------------
# Values


def unwrap(value):
    """dbus-python values -> plain Python (str, int, bool, float, list, dict, bytes)."""
    if isinstance(value, dbus.Boolean):
        return bool(value)
    if isinstance(value, (dbus.String, dbus.ObjectPath, dbus.Signature)):
        return str(value)
    if isinstance(value, (dbus.Byte, dbus.Int16, dbus.UInt16, dbus.Int32, dbus.UInt32, dbus.Int64, dbus.UInt64)):
        return int(value)
    if isinstance(value, dbus.Double):
        return float(value)
    if isinstance(value, dbus.ByteArray):
        return bytes(value)
    if isinstance(value, (dbus.Array, list)):
        return [unwrap(v) for v in value]
    if isinstance(value, (dbus.Struct, tuple)):
        return tuple(unwrap(v) for v in value)
    if isinstance(value, (dbus.Dictionary, dict)):
        return {unwrap(k): unwrap(v) for k, v in value.items()}
    return value


def contract_options():
    """The contract's option table: {method: {key: {"type": T, ...}}}, read from the
    org.tessera.Broker1.Option.* annotations of dbus/org.tessera.Broker1.xml (which the unit tests
    check against the broker's own table, Sources/TesseraInterface/Options.swift)."""
    import xml.etree.ElementTree as ET
    root = ET.parse(os.path.join(REPO, "dbus", "org.tessera.Broker1.xml")).getroot()
    prefix = "org.tessera.Broker1.Option."
    table = {}
    for method in root.iter("method"):
        options = {}
        for annotation in method.findall("annotation"):
            name = annotation.get("name", "")
            if name.startswith(prefix):
                fields = dict(re.findall(r"(\w+)=(\S+)", annotation.get("value", "").split(" default=")[0]))
                options[name[len(prefix):]] = fields
        table[method.get("name")] = options
    return table


CONTRACT_OPTIONS = contract_options()
# D-Bus type of each documented option / filter key (a key has one type whichever method takes it).
OPTION_TYPES = {key: spec["type"] for options in CONTRACT_OPTIONS.values() for key, spec in options.items()}
assert {"min_validity", "force_refresh", "client_id", "revoke", "username"} <= set(OPTION_TYPES), OPTION_TYPES


def typed(key, value):
    """Wraps a Python option value in the D-Bus type the contract documents for `key`.
    Values that already are dbus types are passed through (for wrong-type tests)."""
    if isinstance(value, (dbus.String, dbus.Boolean, dbus.UInt32, dbus.Int32, dbus.Int64, dbus.Dictionary,
                          dbus.Array, dbus.Double, dbus.Byte, dbus.UInt64, dbus.Struct)):
        return value
    kind = OPTION_TYPES.get(key)
    if kind == "s":
        return dbus.String(value)
    if kind == "b":
        return dbus.Boolean(value)
    if kind == "u":
        return dbus.UInt32(value)
    if kind == "a{ss}":
        return dbus.Dictionary(value, signature="ss")
    if isinstance(value, bool):
        return dbus.Boolean(value)
    if isinstance(value, int):
        return dbus.UInt32(value)
    return dbus.String(value)


def options(**kw):
    return dbus.Dictionary({k: typed(k, v) for k, v in kw.items()}, signature="sv")


def jwt_claims(token):
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


# ----------------------------------------------------------------------------------------------
# Broker client


class Broker(BusPeer):
    """org.tessera.Broker1 over dbus-python with explicit types. One connection per instance."""

    def call(self, method, signature, args, timeout=SILENT_TIMEOUT, interface=IFACE):
        return self.conn.call_blocking(BUS_NAME, OBJECT_PATH, interface, method, signature, args, timeout=timeout)

    def acquire(self, client_id="", scopes=(), call_timeout=INTERACTIVE_TIMEOUT, **opts):
        """AcquireToken; `call_timeout` is the D-Bus call's, `timeout=` the broker option."""
        reply = self.call(
            "AcquireToken", "sasa{sv}",
            (dbus.String(client_id), dbus.Array(list(scopes), signature="s"), options(**opts)), timeout=call_timeout)
        return unwrap(reply)

    def sign_in(self, user="alice", client_id="tessera-test", **opts):
        """Interactive browser sign-in through browser.py (which picks the user from login_hint)."""
        opts.setdefault("login_hint", f"{user}@example.test")
        result = self.acquire(client_id, **opts)
        assert result["account"]["username"] == user, result["account"]
        return result

    def silent(self, client_id="", scopes=(), account_id="", call_timeout=SILENT_TIMEOUT, **opts):
        reply = self.call(
            "AcquireTokenSilent", "sassa{sv}",
            (dbus.String(client_id), dbus.Array(list(scopes), signature="s"), dbus.String(account_id), options(**opts)),
            timeout=call_timeout)
        return unwrap(reply)

    def accounts(self, **filter_):
        return unwrap(self.call("GetAccounts", "a{sv}", (options(**filter_),)))

    def sign_out(self, account_id, **opts):
        return unwrap(self.call("SignOut", "sa{sv}", (dbus.String(account_id), options(**opts))))

    def version(self):
        return unwrap(self.call("Get", "ss", (IFACE, "Version"), interface="org.freedesktop.DBus.Properties"))

    def introspect(self):
        return str(self.call("Introspect", "", (), interface="org.freedesktop.DBus.Introspectable"))


class PendingCall:
    """A method call sent now whose reply is collected later, on the same connection, without a
    main loop or a thread: libdbus keeps the reply until reply() blocks on it. Meanwhile the
    connection can make other (blocking) calls, e.g. Cancel. To org.tessera.Broker1 unless another
    destination, path and interface are named (Microsoft's front)."""

    def __init__(self, broker, method, signature, args, timeout=INTERACTIVE_TIMEOUT,
                 destination=BUS_NAME, path=OBJECT_PATH, interface=IFACE):
        message = dbus.lowlevel.MethodCallMessage(destination, path, interface, method)
        message.append(*args, signature=signature)
        self._replies = []
        self._pending = broker.conn.send_message_with_reply(message, self._replies.append, timeout,
                                                            require_main_loop=False)
        broker.conn.flush()

    def reply(self):
        """(error name or None, first argument) once the reply is there."""
        self._pending.block()
        assert self._replies, "no reply"
        message = self._replies[0]
        args = message.get_args_list()
        if isinstance(message, dbus.lowlevel.ErrorMessage):
            return message.get_error_name(), str(args[0]) if args else ""
        return None, args[0]

    def done(self):
        """Has the reply come? (Read when this connection last read: make a blocking call on it
        first for an answer that holds now.)"""
        return self._pending.get_completed()

    def error(self):
        name, detail = self.reply()
        assert name is not None, "the call succeeded"
        return name, detail


def expect_error(name, fn, *args, **kwargs):
    """Runs fn, which must fail with org.tessera.Broker1.Error.<name> and a helpful message."""
    with pytest.raises(dbus.exceptions.DBusException) as info:
        fn(*args, **kwargs)
    error = info.value
    assert error.get_dbus_name() == ERROR_PREFIX + name, f"{error.get_dbus_name()}: {error.get_dbus_message()}"
    message = error.get_dbus_message() or ""
    # Helpful: a real sentence, not just a code.
    assert len(message) >= 20 and " " in message, f"unhelpful message for {name}: {message!r}"
    return message


# ----------------------------------------------------------------------------------------------
# Daemon


class Daemon(SessionDaemon):
    """A tesserad process started by a test, reading `config` (which a test may change before a
    restart); its log goes to a file. `wrapper`: a command it runs under (prlimit, setpriv)."""

    def __init__(self, config, log_path, env, log_level=None, wrapper=()):
        super().__init__(log_path, env, BUS_NAME)
        self.config = config
        self.log_level = log_level
        self.wrapper = list(wrapper)

    def command(self):
        assert os.access(TESSERAD, os.X_OK), f"{TESSERAD} is missing: build it (swift build)"
        cmd = self.wrapper + [TESSERAD, "--config", self.config]
        if self.log_level:
            cmd += ["--log-level", self.log_level]
        return cmd


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    # A JSON string is a TOML basic string, as long as non-ASCII stays literal: JSON's \ud83d\udd11
    # surrogate-pair escapes are not TOML.
    return json.dumps(str(v), ensure_ascii=False)


def session_config():
    with open(SESSION_CONFIG, "rb") as f:
        return tomllib.load(f)


@pytest.fixture
def write_config(tmp_path):
    """write_config(drop=[keys], **overrides) -> path of a config.toml based on the session's."""

    def write(drop=(), name="config.toml", **overrides):
        values = session_config()
        for key in drop:
            values.pop(key, None)
        values.update(overrides)
        path = tmp_path / name
        path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()))
        return str(path)

    return write


@pytest.fixture
def browser(tmp_path):
    return BrowserMode(str(tmp_path / "browser-mode"))


@pytest.fixture
def start_daemon(tmp_path, browser):
    """start_daemon(config=None, log_level=None, extra_env=None, wrapper=()) -> a started Daemon;
    all are stopped at teardown."""
    started = []
    env = dict(os.environ, TESSERA_TEST_BROWSER_FILE=browser.path)
    env.pop("TESSERA_CONFIG", None)

    def start(config=None, log_level=None, extra_env=None, wrapper=()):
        log_path = str(tmp_path / f"tesserad-{len(started)}.log")
        d = Daemon(config or SESSION_CONFIG, log_path, dict(env, **(extra_env or {})), log_level, wrapper)
        started.append(d)
        return d.start()

    yield start
    crashed = []
    for d in started:
        if d.proc is not None and d.proc.poll() is not None:
            crashed.append(f"tesserad exited by itself with status {d.proc.returncode}:\n{d.log()[-3000:]}")
        rc = d.stop()
        if rc not in (None, 0):
            crashed.append(f"tesserad ended with status {rc} on SIGTERM:\n{d.log()[-3000:]}")
        d.close()
    if crashed:
        pytest.fail("\n\n".join(crashed))


@pytest.fixture
def daemon(start_daemon):
    return start_daemon()


@pytest.fixture
def broker(daemon):
    b = Broker()
    yield b
    b.close()


# ----------------------------------------------------------------------------------------------
# Keyring (Secret Service over D-Bus): Tests/lib/tessera_keyring.py


keyring_session = tessera_keyring.keyring_session  # one connection for the whole run


@pytest.fixture(autouse=True)
def keyring(keyring_session):
    """Every test starts (and leaves) with an unlocked keyring without Tessera items. A keyring that
    crashed in an earlier test (see test_faults.KeyringCrashes) is started again first, so that one
    crash of gnome-keyring does not fail every test after it."""
    from test_faults_keyring import keyring_pid, start_keyring_unlocked
    if keyring_pid() is None:
        print("the session's gnome-keyring is gone (it crashed in an earlier test): started again")
        start_keyring_unlocked(keyring_session)
    if keyring_session.locked():
        keyring_session.unlock()
    keyring_session.clear()
    assert keyring_session.item_paths() == []
    yield keyring_session
    if keyring_session.locked():
        keyring_session.unlock()


# ----------------------------------------------------------------------------------------------
# Test identity provider


class IdP(IdPLog):
    authority = AUTHORITY
    url = IDP_URL

    def __init__(self):
        super().__init__(REPO, IDP_DIR, TENANT, os.environ["TESSERA_IDP_LOG"])

    def tokens(self):
        return json.loads(self.manage("idp_tokens"))

    def refresh_tokens(self, user=None, client_id=None):
        return [t for t in self.tokens()["refresh_tokens"]
                if (user is None or t["user"] == user) and (client_id is None or t["client_id"] == client_id)]

    def db(self):
        return sqlite3.connect(os.path.join(IDP_DIR, "db.sqlite3"), timeout=20)

    def query(self, sql, *params):
        conn = self.db()
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def last_device_grant(self):
        return self.query("SELECT COALESCE(MAX(id), 0) FROM oauth2_provider_devicegrant")[0][0]

    def pending_user_codes(self, since):
        """User codes handed out after device grant `since` that the IdP still waits for."""
        return {row[0] for row in self.query(
            "SELECT user_code FROM oauth2_provider_devicegrant WHERE id > ? AND status = 'authorization-pending'",
            since)}

    def approve_device(self, user_code, *extra):
        """Tests/idp/approve_device.py: the user enters the code on another device and accepts."""
        proc = subprocess.run([sys.executable, os.path.join(REPO, "Tests", "idp", "approve_device.py"), user_code, *extra],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr

    def max_refresh_token_id(self):
        return self.query("SELECT COALESCE(MAX(id), 0) FROM oauth2_provider_refreshtoken")[0][0]


@pytest.fixture(scope="session")
def idp():
    return IdP()


# ----------------------------------------------------------------------------------------------
# Signals: dbus-monitor (a bus monitor sees every message with its destination, so it can tell a
# broadcast from a unicast signal without a main loop in the test process).


class SignalMonitor:
    def __init__(self):
        assert shutil.which("dbus-monitor"), "dbus-monitor is missing (Debian package dbus-bin)"
        self.lines = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            ["dbus-monitor", "--session", "--profile", f"type='signal',interface='{IFACE}'"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()
        # Synchronise: once our own probe signal shows up, the monitor sees everything.
        conn = new_connection()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                conn.send_message(dbus.lowlevel.SignalMessage(OBJECT_PATH + "/e2eprobe", IFACE, "E2eProbe"))
                conn.flush()
                if self.wait_for(lambda s: s["member"] == "E2eProbe", timeout=0.5):
                    return
            raise AssertionError("dbus-monitor did not start")
        finally:
            conn.close()

    def _read(self):
        for line in self.proc.stdout:
            parts = line.rstrip("\n").split("\t")
            if parts[0] != "sig" or len(parts) < 8:
                continue
            sig = {"sender": parts[3], "destination": None if parts[4] == "<none>" else parts[4],
                   "path": parts[5], "interface": parts[6], "member": parts[7]}
            with self._cond:
                self.lines.append(sig)
                self._cond.notify_all()

    def signals(self, member=None):
        with self._cond:
            return [s for s in self.lines if s["path"] == OBJECT_PATH and (member is None or s["member"] == member)]

    def wait_for(self, predicate, timeout=5.0):
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [s for s in self.lines if predicate(s)]
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(left)

    def sync(self):
        """Returns once every signal sent before this call has been seen."""
        conn = new_connection()
        try:
            marker = f"E2eSync{time.monotonic_ns()}"
            conn.send_message(dbus.lowlevel.SignalMessage(OBJECT_PATH + "/e2eprobe", IFACE, marker))
            conn.flush()
            assert self.wait_for(lambda s: s["member"] == marker, timeout=10), "dbus-monitor fell behind"
        finally:
            conn.close()

    def close(self):
        stop_process(self.proc)


def stop_process(proc):
    """SIGTERM, then SIGKILL after 5 s."""
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def monitor():
    m = SignalMonitor()
    yield m
    m.close()


# ----------------------------------------------------------------------------------------------
# CLI


def run_cli(*args, timeout=60, check_rc=None):
    proc = subprocess.run([TESSERA, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check_rc is not None:
        assert proc.returncode == check_rc, f"tessera {' '.join(args)}: rc {proc.returncode}\n{proc.stderr}"
    return proc


def wait_until(predicate, timeout=30.0, interval=0.05, what="condition"):
    """Polls predicate until it holds; timeout bounds a hang only (a busy machine is slow)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


class Async:
    """Runs fn(*args) on a thread; result() re-raises its exception."""

    def __init__(self, fn, *args, **kwargs):
        self._result = None
        self._error = None
        self.thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True)
        self.thread.start()

    def _run(self, fn, args, kwargs):
        try:
            self._result = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001
            self._error = e

    def done(self):
        return not self.thread.is_alive()

    def result(self, timeout=INTERACTIVE_TIMEOUT):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the call did not finish"
        if self._error is not None:
            raise self._error
        return self._result
