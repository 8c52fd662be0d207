"""Fixtures for the tests of tesserad's Microsoft front with the REAL MSAL Python and its broker
runtime (msal[broker] = pymsalruntime), headless.

Run inside scripts/msal-session (private network + mount namespace where
https://login.microsoftonline.com is the test IdP on 127.0.0.1:443; inside it scripts/test-session's
private bus, unlocked keyring and config.toml):

    scripts/msal setup
    scripts/msal-session "$PWD/.build-idp/venv/bin/python" -m pytest -q Tests/msal

The pytest process uses the IdP venv (dbus-python, requests); each MSAL operation runs in its own
process with the MSAL venv's python (Tests/msal/msal_client.py), as separate apps would.

Env: TESSERA_BIN_DIR (default .build/debug), TESSERA_MSAL_PYTHON (default
.build-msal/venv/bin/python), TESSERA_MSAL_BROKER_CMD (a command to run instead of tesserad, e.g. a
stub broker, to check the harness itself).

What MSAL's broker runtime (pymsalruntime 0.20.7) does, measured with a stub broker:
- acquire_token_interactive: getAccounts, then acquireTokenSilently (account null when there is
  none; else the first account), then acquireTokenInteractively unless the silent answer's
  username equals login_hint.
- it caches accounts and tokens itself in the keyring (xdg:schema com.microsoft.identity.secret):
  acquire_token_silent is served from there without any D-Bus call, even with force_refresh. Items
  with a `clientid` attribute are tokens, items without are accounts. With the token items deleted
  acquire_token_silent asks the broker (acquireTokenSilently); with the account items deleted too it
  gives up (None) without asking.
- remove_account signs out locally only: no removeAccount call reaches the broker.
- a broker answer with status 2 gives MSAL's {"error": "broker_error", "error_description":
  "... Status: Response_Status.Status_InteractionRequired ..."}.
"""
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

import dbus
import dbus.bus
import pytest

if os.environ.get("TESSERA_MSAL_SESSION") != "1":
    pytest.exit(
        "Tessera's MSAL tests must run inside the MSAL session:\n"
        '  scripts/msal-session "$PWD/.build-idp/venv/bin/python" -m pytest Tests/msal',
        returncode=2,
    )

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.environ.get("TESSERA_REPO") or os.path.dirname(os.path.dirname(HERE))
BIN_DIR = os.environ.get("TESSERA_BIN_DIR") or os.path.join(REPO, ".build", "debug")
TESSERAD = os.path.join(BIN_DIR, "tesserad")
TESSERA = os.path.join(BIN_DIR, "tessera")
MSAL_PYTHON = os.environ.get("TESSERA_MSAL_PYTHON") or os.path.join(REPO, ".build-msal", "venv", "bin", "python")
MSAL_CLIENT = os.path.join(HERE, "msal_client.py")
BROKER_CMD = os.environ.get("TESSERA_MSAL_BROKER_CMD", "")
SESSION_CONFIG = os.path.join(os.environ["XDG_CONFIG_HOME"], "tessera", "config.toml")

MS_NAME = "com.microsoft.identity.broker1"
MS_PATH = "/com/microsoft/identity/broker1"
MS_IFACE = "com.microsoft.identity.Broker1"

AUTHORITY = os.environ["TESSERA_IDP_AUTHORITY"]
IDP_DIR = os.environ["TESSERA_IDP_DIR"]
TENANT = AUTHORITY.rstrip("/").rsplit("/", 1)[1]
MSAL_TIMEOUT = 120

sys.path.insert(0, os.path.join(REPO, "Tests", "lib"))
from tessera_session import BrowserMode, Daemon, IdPLog, new_connection, tail  # noqa: E402
import tessera_keyring  # noqa: E402


# ----------------------------------------------------------------------------------------------
# Diagnostics: sections added to a failing test's report


class Diagnostics:
    def __init__(self):
        self.sections = []  # (title, callable -> text)

    def add(self, title, fn):
        self.sections.append((title, fn))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    diag = getattr(item, "_msal_diag", None)
    if diag is None or report.passed or report.when == "collect":
        return
    for title, fn in diag.sections:
        try:
            text = fn()
        except Exception as e:  # noqa: BLE001
            text = f"(could not collect: {e})"
        if text:
            report.sections.append((title, text))


@pytest.fixture(autouse=True)
def diag(request):
    d = Diagnostics()
    request.node._msal_diag = d
    return d


# ----------------------------------------------------------------------------------------------
# The broker under test: tesserad (or TESSERA_MSAL_BROKER_CMD)


class Broker(Daemon):
    """tesserad (or TESSERA_MSAL_BROKER_CMD), started once it owns com.microsoft.identity.broker1:
    pymsalruntime refuses to start ("Broker cannot be initialized") unless that name is owned or
    activatable, so the MSAL apps only run once it is."""

    def __init__(self, log_path, env):
        super().__init__(log_path, env, MS_NAME)

    def command(self):
        if BROKER_CMD:
            return shlex.split(BROKER_CMD)
        assert os.access(TESSERAD, os.X_OK), f"{TESSERAD} is missing: build it (swift build)"
        return [TESSERAD, "--config", SESSION_CONFIG]

    def owned(self):
        return self.has_owner()


@pytest.fixture
def browser(tmp_path):
    return BrowserMode(str(tmp_path / "browser-mode"))


@pytest.fixture
def env(browser):
    e = dict(os.environ, TESSERA_TEST_BROWSER_FILE=browser.path)
    e.pop("TESSERA_CONFIG", None)
    return e


@pytest.fixture
def broker(tmp_path, env, diag, calls):
    b = Broker(str(tmp_path / "broker.log"), env)
    diag.add("broker log (tail)", lambda: tail(b.log_path))
    b.start()
    yield b
    crashed = b.proc is not None and b.proc.poll() is not None
    rc = b.stop()
    b.close()
    if crashed:
        pytest.fail(f"the broker exited by itself with status {rc}:\n{tail(b.log_path, 3000)}")


# ----------------------------------------------------------------------------------------------
# The Microsoft front's method calls, as a bus monitor sees them


class CallRecorder:
    """dbus-monitor of method calls to com.microsoft.identity.broker1 (member names, in order)."""

    def __init__(self):
        self.members = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            ["dbus-monitor", "--session", "--profile", f"type='method_call',interface='{MS_IFACE}'",
             "type='method_call',member='MonitorProbe'"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()
        conn = new_connection()
        try:  # synchronise: once our probe shows up, the monitor sees everything
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                msg = dbus.lowlevel.MethodCallMessage("org.freedesktop.DBus", "/", "org.tessera.Probe", "MonitorProbe")
                msg.set_no_reply(True)
                conn.send_message(msg)
                conn.flush()
                with self._cond:
                    if self._cond.wait_for(lambda: "MonitorProbe" in self.members, 0.5):
                        break
            else:
                raise AssertionError("dbus-monitor did not start")
        finally:
            conn.close()

    def _read(self):
        for line in self.proc.stdout:
            parts = line.rstrip("\n").split("\t")
            if parts[0] == "mc" and len(parts) >= 8:
                with self._cond:
                    self.members.append(parts[7])
                    self._cond.notify_all()

    def mark(self):
        with self._cond:
            return len(self.members)

    def sync(self):
        """Returns once the monitor has seen every call made before: a probe sent now shows up
        behind them (the bus daemon hands the monitor messages in the order it routes them)."""
        with self._cond:
            probes = self.members.count("MonitorProbe")
        conn = new_connection()
        try:
            msg = dbus.lowlevel.MethodCallMessage("org.freedesktop.DBus", "/", "org.tessera.Probe", "MonitorProbe")
            msg.set_no_reply(True)
            conn.send_message(msg)
            conn.flush()
            with self._cond:  # 30 s only bounds a hang: the probe shows up at once
                seen = self._cond.wait_for(lambda: self.members.count("MonitorProbe") > probes, 30)
            assert seen, "dbus-monitor fell behind"
        finally:
            conn.close()

    def since(self, mark=0):
        self.sync()  # the monitor trails the bus a little
        with self._cond:
            return [m for m in self.members[mark:] if m != "MonitorProbe"]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


import dbus.lowlevel  # noqa: E402


@pytest.fixture
def calls(diag):
    r = CallRecorder()
    diag.add("calls to the Microsoft front (dbus-monitor)", lambda: " ".join(r.since()))
    yield r
    r.close()


def ms_call(method, request, correlation_id="", protocol="0.0", timeout=120):
    """Calls the Microsoft front directly: (s protocolVersion, s correlationId, s requestJson) -> s."""
    conn = new_connection()
    try:
        reply = conn.call_blocking(MS_NAME, MS_PATH, MS_IFACE, method, "sss",
                                   (protocol, correlation_id, json.dumps(request)), timeout=timeout)
        return json.loads(str(reply))
    finally:
        conn.close()


# ----------------------------------------------------------------------------------------------
# Keyring: msalruntime's own cache, and Tessera's items (Tests/lib/tessera_keyring.py)


keyring_session = tessera_keyring.keyring_session  # one connection for the whole run


@pytest.fixture(autouse=True)
def keyring(keyring_session):
    """Every test starts without msalruntime's or Tessera's items."""
    keyring_session.clear_msalruntime()
    keyring_session.clear()
    return keyring_session


# ----------------------------------------------------------------------------------------------
# Test identity provider


class IdP(IdPLog):
    def __init__(self):
        super().__init__(REPO, IDP_DIR, TENANT, os.environ["TESSERA_IDP_LOG"])

    def sign_in_traffic(self, since=0):
        """Requests that sign in or redeem grants: everything but discovery and signing keys (each
        MSAL process reads the discovery document itself, in PublicClientApplication())."""
        return [r for r in self.requests(since)
                if not (r["method"] == "GET" and ("/.well-known/" in r["path"]))]

    def authorizations(self, since=0):
        return [r for r in self.requests(since) if r["path"] == self.authorize_path]


@pytest.fixture(scope="session")
def idp_session():
    return IdP()


@pytest.fixture
def idp(idp_session, diag):
    start = idp_session.mark()
    diag.add("IdP requests during the test", lambda: "\n".join(
        f"{r['method']} {r['path']} -> {r['status']} grant={r['grant_type']} client={r['client_id']}"
        for r in idp_session.requests(start)))
    return idp_session


# ----------------------------------------------------------------------------------------------
# MSAL apps: one process per operation


class MsalError(AssertionError):
    pass


@pytest.fixture
def msal(tmp_path, diag):
    """msal(op, **command) -> the JSON msal_client.py printed (see its docstring)."""
    assert os.access(MSAL_PYTHON, os.X_OK), f"{MSAL_PYTHON} is missing: run scripts/msal setup"
    runs = []

    def show():
        out = []
        for i, (cmd, proc_out, log) in enumerate(runs):
            out.append(f"--- MSAL run {i}: {json.dumps({k: v for k, v in cmd.items() if k != 'account'})}\n"
                       f"{proc_out}\n--- its MSAL/msalruntime log (tail):\n{tail(log, 2500)}")
        return "\n".join(out)

    diag.add("MSAL runs", show)

    def run(op, **command):
        command = dict(command, op=op)
        log = str(tmp_path / f"msal-{len(runs)}.log")
        env = dict(os.environ, TESSERA_MSAL_LOG=log, PYTHONDONTWRITEBYTECODE="1")
        try:
            proc = subprocess.run([MSAL_PYTHON, MSAL_CLIENT, json.dumps(command)], capture_output=True, text=True,
                                  timeout=MSAL_TIMEOUT, env=env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            runs.append((command, f"TIMED OUT after {MSAL_TIMEOUT} s\nstderr: {e.stderr}", log))
            raise MsalError(f"MSAL {op} did not finish within {MSAL_TIMEOUT} s")
        runs.append((command, f"exit {proc.returncode}\nstdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}",
                     log))
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise MsalError(f"MSAL {op} printed no result (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        return json.loads(lines[-1])

    return run


def assert_token(result, user):
    assert result.get("ok"), f"MSAL failed: {result.get('error')}: {(result.get('result') or {}).get('error_description')}"
    r = result["result"]
    assert r.get("access_token"), r
    assert r.get("token_source") == "broker", f"token did not come through the broker: {r.get('token_source')}"
    assert result.get("username") == user, f"signed in as {result.get('username')}, not {user}"
    return r


def account_of(result, user):
    for acc in result.get("accounts", []):
        if acc.get("username") == user:
            return acc
    raise AssertionError(f"MSAL has no account {user}: {result.get('accounts')}")


# ----------------------------------------------------------------------------------------------
# CLI


@pytest.fixture
def cli(env, diag):
    runs = []
    diag.add("tessera CLI runs", lambda: "\n".join(runs))

    def run(*args, timeout=120):
        proc = subprocess.run([TESSERA, *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=env)
        runs.append(f"$ tessera {' '.join(args)}  -> exit {proc.returncode}\n{proc.stderr[-2000:]}")
        return proc

    return run
