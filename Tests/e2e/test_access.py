"""Per-application access control (issue 11), with real processes as different apps: this test's
Python (the app that signs in), the `tessera` command and busctl (other apps, told apart by their
executables), and a caller running as another user. The session's config.toml says
access_mode = "open" for the other suites; these tests set each mode themselves."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

import dbus
import pytest

import dbus_wire

from conftest import TESSERA, TESSERAD, Async, Broker, expect_error, run_cli, stop_process, wait_until
from tessera_session import bus_config, new_connection

HERE = os.path.dirname(os.path.abspath(__file__))

GRANT_COMMAND = re.compile(r"tessera access grant --app '([^']+)' --client-id (\S+) --account (\S+)")


def start(start_daemon, write_config, mode):
    return start_daemon(write_config(access_mode=mode))


def refused_app_key(proc):
    """The app key a refusal names in the command it suggests."""
    match = GRANT_COMMAND.search(proc.stderr)
    assert match, proc.stderr
    return match.group(1)


@pytest.mark.parametrize("path", ["own socket", "session bus"])
def test_strict_mode_keeps_each_app_to_its_grants(start_daemon, write_config, path):
    """The tessera command, another program than this test's python, is kept to its grants: the
    same decisions, refusals and audit records whichever way it reaches tesserad (issue 23 §2)."""
    via = ("--bus",) if path == "session bus" else ()

    def cli(*args, **kw):
        return run_cli(*via, *args, **kw)

    start(start_daemon, write_config, "strict")
    b = Broker()
    signed_in = b.sign_in()  # this Python completes the sign-in: it gets the grant
    token = signed_in["access_token"]
    assert b.silent()["access_token"] == token

    # Another program (the tessera command) asks for the same client: refused, told how to grant.
    other = cli("token")
    assert other.returncode == 12 and other.stdout == "", other.stderr
    assert "unverified" in other.stderr and "has no grant" in other.stderr
    report = json.loads(cli("status", "--json").stdout)
    assert report["connection"] == ("session_bus" if via else "socket"), report
    key = refused_app_key(other)
    assert key.startswith("exe:") and key.split("@")[0].endswith("/tessera"), key
    assert token not in other.stderr
    # It sees no account, and cannot sign this one out.
    assert json.loads(cli("accounts", "--json", check_rc=0).stdout) == []
    assert cli("logout", "--account", signed_in["account"]["id"]).returncode != 0
    assert [a["id"] for a in b.accounts()] == [signed_in["account"]["id"]]

    grants = json.loads(cli("access", "list", "--json", check_rc=0).stdout)
    assert [(g["client_id"], g["account"], g["via"]) for g in grants] == [("tessera-test", "alice", "sign-in")]
    assert grants[0]["app"].startswith("exe:") and "unverified" in grants[0]["app_display"]

    # The user grants it: the same token, from the cache.
    cli("access", "grant", "--app", key, "--client-id", "tessera-test", "--account", "alice", check_rc=0)
    assert cli("token", check_rc=0).stdout.strip() == token
    assert cli("token", check_rc=0).stdout.strip() == token  # and from the bus thread's cache
    # ... and takes it back: refused again, also on the bus thread's fast path.
    revoked = cli("access", "revoke", "--app", key, check_rc=0)
    assert "Removed 1 grant" in revoked.stdout
    assert cli("token").returncode == 12

    log = json.loads(cli("access", "log", "--json", check_rc=0).stdout)
    decisions = [(r["app_key"] == key, r["decision"], r["reason"]) for r in log]
    assert (True, "refused", "strict") in decisions and (True, "allowed", "grant") in decisions
    assert all(token not in json.dumps(r) for r in log)
    counts = [r["app_decisions"] for r in log if r["app_key"] == key]
    assert counts == sorted(counts) and counts[-1] == len(counts), "a per-app count shows dropped lines"
    b.close()


def test_confirm_mode_without_a_prompt_refuses_with_the_command(start_daemon, write_config):
    start(start_daemon, write_config, "confirm")
    b = Broker()
    b.sign_in()
    other = run_cli("token")
    assert other.returncode == 12
    assert "No desktop prompt could ask you" in other.stderr and GRANT_COMMAND.search(other.stderr)
    b.close()


def test_open_mode_lets_every_app_through_and_audits_it(start_daemon, write_config):
    start(start_daemon, write_config, "open")
    b = Broker()
    token = b.sign_in()["access_token"]
    assert run_cli("token", check_rc=0).stdout.strip() == token
    log = json.loads(run_cli("access", "log", "--json", check_rc=0).stdout)
    assert any(r["decision"] == "allowed" and r["reason"] == "open mode" and r["app_key"].endswith("/tessera")
               for r in log), log
    b.close()


def test_a_sign_in_by_a_second_app_for_a_held_client_is_refused(start_daemon, write_config):
    start(start_daemon, write_config, "strict")
    b = Broker()
    b.sign_in()
    login = run_cli("login", timeout=120)
    assert login.returncode == 12 and "has no grant" in login.stderr, login.stderr
    # A client no app holds yet: the sign-in is how the tessera command gets its own grant.
    assert run_cli("login", "--client-id", "tessera-other", timeout=120).returncode == 0
    assert run_cli("token", "--client-id", "tessera-other").returncode == 0
    assert run_cli("token").returncode == 12
    b.close()


def test_the_microsoft_front_follows_the_same_policy(start_daemon, write_config):
    start(start_daemon, write_config, "strict")
    b = Broker()
    account = b.sign_in()["account"]
    request = json.dumps({"authParameters": {
        "account": {"homeAccountId": account["id"], "username": "alice"}, "authority": account["authority"],
        "authorizationType": 1, "clientId": "tessera-test", "redirectUri": "http://localhost",
        "requestedScopes": ["read"]}})
    def call(method):
        out = subprocess.run(
            ["busctl", "--user", "--json=short", "--timeout=60", "call", "com.microsoft.identity.broker1",
             "/com/microsoft/identity/broker1", "com.microsoft.identity.Broker1", method, "sss", "0.0",
             "00000000-0000-4000-8000-000000000001", request], capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, out.stderr
        return json.loads(json.loads(out.stdout)["data"][0])["brokerTokenResponse"]

    # busctl is another app: to it the account is not there (status 2, sign in) ...
    silent = call("acquireTokenSilently")
    assert silent["error"]["status"] == 2 and not silent.get("accessToken"), silent
    # ... and signing in with a client another app holds is refused, naming the grant command.
    interactive = call("acquireTokenInteractively")
    assert "has no grant" in interactive["error"]["context"], interactive
    assert "tessera access grant" in interactive["error"]["context"]
    assert not interactive.get("accessToken")
    b.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None,
                    reason="needs root to run a caller as another user (CI runs as root)")
def test_a_caller_of_another_user_is_refused(tmp_path):
    """A bus that lets any user connect (a misconfigured or shared one): tesserad still serves
    only its own user."""
    shared = tempfile.mkdtemp(prefix="tessera-otheruser-")
    os.chmod(shared, 0o755)
    config = os.path.join(shared, "bus.conf")
    with open(config, "w") as f:
        f.write(bus_config("session", os.path.join(shared, "bus")))
    bus = subprocess.Popen(["dbus-daemon", "--nofork", f"--config-file={config}", "--print-address"],
                           stdout=subprocess.PIPE, text=True)
    address = bus.stdout.readline().strip()
    env = dict(os.environ, DBUS_SESSION_BUS_ADDRESS=address)
    daemon = subprocess.Popen([TESSERAD], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        os.chmod(os.path.join(shared, "bus"), 0o777)
        probe = ("import dbus, dbus.bus\n"
                 f"c = dbus.bus.BusConnection({address!r})\n"
                 "o = c.get_object('org.tessera.Broker1', '/org/tessera/Broker1')\n"
                 "try:\n"
                 "    o.GetAccounts(dbus.Dictionary({}, signature='sv'), dbus_interface='org.tessera.Broker1')\n"
                 "    print('ALLOWED')\n"
                 "except dbus.exceptions.DBusException as e:\n"
                 "    print(e.get_dbus_name(), e.get_dbus_message())\n"
                 "try:\n"
                 "    o.Get('org.tessera.Broker1', 'AttentionNeeded', dbus_interface='org.freedesktop.DBus.Properties')\n"
                 "    print('PROPERTY READ')\n"
                 "except dbus.exceptions.DBusException as e:\n"
                 "    print('PROPERTY', e.get_dbus_name())\n")

        def owned():
            return subprocess.run(["busctl", f"--address={address}", "status", "org.tessera.Broker1"],
                                  capture_output=True).returncode == 0
        wait_until(owned, what="tesserad on the shared bus")
        out = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", probe],
                             capture_output=True, text=True, timeout=30, cwd="/")
        assert "org.tessera.Broker1.Error.AccessDenied" in out.stdout, out.stdout + out.stderr
        assert "serves user 0 only" in out.stdout
        assert "PROPERTY org.tessera.Broker1.Error.AccessDenied" in out.stdout, out.stdout
    finally:
        stop_process(daemon)
        stop_process(bus)
        shutil.rmtree(shared, ignore_errors=True)


def token_in_background():
    """`tessera token`, started and not waited for (its app is being asked about)."""
    return subprocess.Popen([TESSERA, "token"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)


def test_confirm_mode_asks_the_user_through_the_desktop(start_daemon, write_config, tmp_path):
    from test_attention import NotificationServer
    notifications = NotificationServer(tmp_path)
    try:
        start(start_daemon, write_config, "confirm")
        b = Broker()
        token = b.sign_in()["access_token"]
        # The tessera command asks: the question is shown, and its call waits for the answer.
        asking = token_in_background()
        wait_until(lambda: notifications.calls("Notify"), what="the access question")
        (question,) = notifications.calls("Notify")
        assert question["actions"][0::2] == ["allow-once", "allow-always", "deny"]
        assert "alice" in question["summary"] and "tessera" in question["summary"]
        assert "cannot verify" in question["body"] and "tessera-test" in question["body"]
        # A question on screen blocks nobody else.
        assert b.silent(force_refresh=True)["access_token"]
        notifications.invoke(question["id"], "allow-always")
        out, err = asking.communicate(timeout=30)
        assert asking.returncode == 0, err
        assert out.strip() == b.silent()["access_token"]
        assert any(g["via"] == "user" for g in json.loads(run_cli("access", "list", "--json", check_rc=0).stdout))
        assert run_cli("token").returncode == 0 and len(notifications.calls("Notify")) == 1, "not asked again"

        # Deny: refused, and not asked again for a while.
        key = next(g["app"] for g in json.loads(run_cli("access", "list", "--json").stdout) if g["via"] == "user")
        run_cli("access", "revoke", "--app", key, check_rc=0)
        asking = token_in_background()
        wait_until(lambda: len(notifications.calls("Notify")) == 2, what="the second question")
        notifications.invoke(notifications.calls("Notify")[1]["id"], "deny")
        out, err = asking.communicate(timeout=30)
        assert asking.returncode == 12 and "You declined" in err and out == ""
        again = run_cli("token")
        assert again.returncode == 12 and "a moment ago" in again.stderr
        assert len(notifications.calls("Notify")) == 2, "a declined app is not asked again at once"
        log = json.loads(run_cli("access", "log", "--json", check_rc=0).stdout)
        reasons = [r["reason"] for r in log if r["app_key"] == key]
        assert "user, always" in reasons and "user" in reasons and "user, earlier" in reasons
        b.close()
    finally:
        notifications.close()


# ----------------------------------------------------------------------------------------------
# The portal access dialog, the first-use notification, narrowed grants

PORTAL_NAME = "org.freedesktop.impl.portal.desktop.tessertest"


class PortalBackend:
    """tests/e2e/fake_portal.py: an access-dialog backend the test answers."""

    def __init__(self, tmp_path, run=True):
        self.dir = tmp_path / "portals"
        self.dir.mkdir()
        (self.dir / "tessertest.portal").write_text(
            "[portal]\nDBusName=%s\nInterfaces=org.freedesktop.impl.portal.Access;\nUseIn=tessertest\n" % PORTAL_NAME)
        self.record = tmp_path / "portal.jsonl"
        self.record.write_text("")
        self.proc = None
        if run:
            self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_portal.py"), str(self.record)],
                                         stdout=subprocess.PIPE, text=True)
            assert self.proc.stdout.readline().strip() == "ready"

    env = property(lambda self: {"XDG_DESKTOP_PORTAL_DIR": str(self.dir), "XDG_CURRENT_DESKTOP": "tessertest"})

    def calls(self, name=None):
        entries = [json.loads(line) for line in self.record.read_text().splitlines() if line]
        return [e for e in entries if name is None or e["call"] == name]

    def answer(self, handle, response, remember=False):
        conn = new_connection()
        try:
            obj = conn.get_object(PORTAL_NAME, "/org/freedesktop/portal/desktop")
            assert obj.Answer(handle, dbus.UInt32(response), remember, dbus_interface="org.tessera.Test")
        finally:
            conn.close()

    def answer_with(self, handle, response, remember, chosen):
        conn = new_connection()
        try:
            obj = conn.get_object(PORTAL_NAME, "/org/freedesktop/portal/desktop")
            assert obj.AnswerWith(handle, dbus.UInt32(response), remember,
                                  dbus.Array([dbus.Struct(c) for c in chosen], signature="(ss)"),
                                  dbus_interface="org.tessera.Test")
        finally:
            conn.close()

    def close(self):
        if self.proc:
            stop_process(self.proc)


def test_without_the_app_the_account_chooser_is_the_portal_s_dialog(start_daemon, write_config, tmp_path):
    """Two accounts at the provider, no Tessera Accounts, a portal backend: an app's interactive
    request naming no account shows the portal's access dialog with the accounts as a choice list;
    the user picks bob and keeps the choice. The app gets bob's token (no browser), and its next
    request gets bob without a dialog. A silent request never asks."""
    portal = PortalBackend(tmp_path)
    try:
        start_daemon(write_config(access_mode="open"), extra_env=portal.env)
        b = Broker()
        b.sign_in("alice")
        bob = b.sign_in("bob")["account"]["id"]
        app = Broker()
        asking = Async(app.acquire, "tessera-test")
        wait_until(lambda: portal.calls("AccessDialog"), what="the portal's chooser")
        (dialog,) = portal.calls("AccessDialog")
        assert dialog["title"].startswith("Choose an account for ") and "python" in dialog["title"], dialog
        account_choice = next(c for c in dialog["choices"] if c["id"] == "account")
        assert sorted(label.split(" ")[0] for _, label in account_choice["options"]) == ["alice", "bob"]
        assert (dialog["grant_label"], dialog["deny_label"]) == ("Use", "Use another account")
        portal.answer_with(dialog["handle"], 0, True, [("account", bob)])
        assert asking.result()["account"]["id"] == bob
        assert app.acquire("tessera-test")["account"]["id"] == bob
        assert len(portal.calls("AccessDialog")) == 1, "remembered: not asked again"
        app.silent()
        assert len(portal.calls("AccessDialog")) == 1, "a silent request never asks"
        app.close()
        b.close()
    finally:
        portal.close()


def test_confirm_mode_asks_through_the_portal_access_dialog_first(start_daemon, write_config, tmp_path):
    from test_attention import NotificationServer
    portal = PortalBackend(tmp_path)
    notifications = NotificationServer(tmp_path)
    try:
        start_daemon(write_config(access_mode="confirm"), extra_env=portal.env)
        b = Broker()
        b.sign_in()
        asking = token_in_background()
        wait_until(lambda: portal.calls("AccessDialog"), what="the portal's access dialog")
        (dialog,) = portal.calls("AccessDialog")
        # It names the app (and that it is unverified), the account, the client and the scopes.
        assert "tessera" in dialog["title"] and "alice" in dialog["title"], dialog
        assert "(unverified)" in dialog["subtitle"] and "tessera-test" in dialog["subtitle"], dialog
        assert "cannot verify" in dialog["body"] and "read" in dialog["body"], dialog
        assert [c["id"] for c in dialog["choices"]] == ["remember"] and dialog["choices"][0]["label"] == "Always allow"
        assert (dialog["grant_label"], dialog["deny_label"]) == ("Allow", "Deny")
        assert notifications.calls("Notify") == [], "the portal asks; no notification question besides"
        # Another caller is served while the dialog is up.
        assert b.silent(force_refresh=True)["access_token"]
        portal.answer(dialog["handle"], 0, remember=True)  # Allow, with "Always allow" ticked
        out, err = asking.communicate(timeout=30)
        assert asking.returncode == 0, err
        assert out.strip() == b.silent()["access_token"]
        grants = json.loads(run_cli("access", "list", "--json", check_rc=0).stdout)
        (mine,) = [g for g in grants if g["via"] == "user"]
        assert mine["scopes"] == ["read"] and mine["authority"], mine
        assert run_cli("token").returncode == 0 and len(portal.calls("AccessDialog")) == 1, "not asked again"

        # Allow without "Always allow": this once only, so the next call asks again.
        run_cli("access", "revoke", "--app", mine["app"], check_rc=0)
        asking = token_in_background()
        wait_until(lambda: len(portal.calls("AccessDialog")) == 2, what="the second dialog")
        portal.answer(portal.calls("AccessDialog")[1]["handle"], 0, remember=False)
        assert asking.wait(timeout=30) == 0
        assert not any(g["via"] == "user" for g in json.loads(run_cli("access", "list", "--json").stdout))
        # Deny: refused, and remembered for a while.
        asking = token_in_background()
        wait_until(lambda: len(portal.calls("AccessDialog")) == 3, what="the third dialog")
        portal.answer(portal.calls("AccessDialog")[2]["handle"], 1)
        out, err = asking.communicate(timeout=30)
        assert asking.returncode == 12 and "You declined" in err and out == ""
        log = json.loads(run_cli("access", "log", "--json", check_rc=0).stdout)
        reasons = [r["reason"] for r in log if r["app_key"] == mine["app"]]
        assert "user, always" in reasons and "user, once" in reasons and "user" in reasons, reasons
        b.close()
    finally:
        portal.close()
        notifications.close()


def test_a_portal_backend_that_is_not_there_falls_back_to_the_notification(start_daemon, write_config, tmp_path):
    from test_attention import NotificationServer
    portal = PortalBackend(tmp_path, run=False)  # its .portal file names a service nobody provides
    notifications = NotificationServer(tmp_path)
    try:
        start_daemon(write_config(access_mode="confirm"), extra_env=portal.env)
        b = Broker()
        b.sign_in()
        asking = token_in_background()
        wait_until(lambda: notifications.calls("Notify"), what="the notification question")
        notifications.invoke(notifications.calls("Notify")[0]["id"], "allow-once")
        out, err = asking.communicate(timeout=30)
        assert asking.returncode == 0 and out.strip(), err
        b.close()
    finally:
        notifications.close()


def test_the_first_use_of_an_account_by_an_app_is_notified_once(start_daemon, write_config, tmp_path):
    from test_attention import NotificationServer
    notifications = NotificationServer(tmp_path)
    try:
        config = write_config(access_mode="open", notify_first_use=True)
        daemon = start_daemon(config)
        b = Broker()
        b.sign_in()
        b.silent()
        token = run_cli("token", check_rc=0).stdout.strip()
        wait_until(lambda: notifications.calls("Notify"), what="the first-use notification")
        time.sleep(0.5)  # anything sent for the signing-in app would have arrived before it
        (note,) = notifications.calls("Notify")  # the app that signed in is no news to the user
        assert "tessera" in note["summary"] and "alice" in note["summary"] and "first time" in note["summary"]
        assert "tessera access revoke --app 'exe:" in note["body"] and note["actions"] == []
        assert token not in json.dumps(note)
        run_cli("token", check_rc=0)
        # Remembered in the keyring: a restarted daemon does not tell it again.
        daemon.stop()
        start_daemon(config)
        run_cli("token", check_rc=0)
        time.sleep(0.5)
        assert len(notifications.calls("Notify")) == 1, notifications.calls("Notify")
        b.close()
    finally:
        notifications.close()


def test_a_grant_narrowed_to_scopes_and_operations(start_daemon, write_config):
    start(start_daemon, write_config, "strict")
    b = Broker()
    b.sign_in()
    key = refused_app_key(run_cli("token"))
    run_cli("access", "grant", "--app", key, "--client-id", "tessera-test", "--account", "alice",
            "--scope", "write", "--operation", "token", check_rc=0)
    listed = run_cli("access", "list", check_rc=0).stdout
    assert "scopes write; only token" in listed, listed
    assert run_cli("token").returncode == 12, "a grant for other scopes does not cover read"
    run_cli("access", "grant", "--app", key, "--client-id", "tessera-test", "--account", "alice",
            "--scope", "read", "--operation", "token", check_rc=0)
    assert run_cli("token", check_rc=0).stdout.strip()
    # Tokens only: the account list stays closed to it, and says how many it does not see.
    accounts = run_cli("accounts", check_rc=0)
    assert accounts.stdout == "" and "1 more signed-in account is hidden" in accounts.stderr, accounts.stderr
    logout = run_cli("logout", "--account", b.accounts()[0]["id"], "--no-revoke")
    assert logout.returncode == 12 and "may not sign it out" in logout.stderr, logout.stderr
    bad = run_cli("access", "grant", "--app", key, "--client-id", "tessera-test", "--operation", "everything")
    assert bad.returncode != 0 and "is not an operation" in bad.stderr
    b.close()


# ----------------------------------------------------------------------------------------------
# A Flatpak-like caller, and callers that change under their connection

def cgroup2_root():
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[2] == "cgroup2":
                return fields[1]
    return None


def flatpak_possible():
    root = cgroup2_root()
    return (os.geteuid() == 0 and shutil.which("bwrap") is not None and root is not None
            and os.access(root, os.W_OK))


class Sandbox:
    """Runs commands as Flatpak runs apps: in a systemd-style scope `app-flatpak-<SCOPE_ID>-N.scope`
    (a cgroup made here), inside bubblewrap with a root of its own that holds a `.flatpak-info`
    naming `info_id` (or none)."""

    counter = 0

    def __init__(self, scope_id, info_id):
        Sandbox.counter += 1
        self.cgroup = os.path.join(cgroup2_root(), f"app-flatpak-{scope_id}-{os.getpid()}{Sandbox.counter}.scope")
        os.mkdir(self.cgroup)
        self.info = None if info_id is None else f"[Application]\nname={info_id}\nruntime=runtime/x/y/z\n"

    def run(self, *argv):
        bwrap = ["bwrap", "--unshare-pid", "--die-with-parent", "--ro-bind", "/usr", "/usr",
                 "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                 "--symlink", "usr/sbin", "/sbin", "--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev",
                 "--bind", "/tmp", "/tmp"]
        pass_fds = ()
        if self.info is not None:
            r, w = os.pipe()
            os.write(w, self.info.encode())
            os.close(w)
            bwrap += ["--ro-bind-data", str(r), "/.flatpak-info"]
            pass_fds = (r,)
        # The shell puts itself in the scope, then becomes bwrap: the app is born inside it.
        script = f'echo $$ > {self.cgroup}/cgroup.procs && exec "$@"'
        try:
            return subprocess.run(["sh", "-c", script, "sh"] + bwrap + ["--"] + list(argv), capture_output=True,
                                  text=True, timeout=60, pass_fds=pass_fds)
        finally:
            for fd in pass_fds:
                os.close(fd)

    def close(self):
        for _ in range(50):
            try:
                os.rmdir(self.cgroup)
                return
            except OSError:
                time.sleep(0.1)


def busctl_token(account_id):
    return ["busctl", "--user", "call", "org.tessera.Broker1", "/org/tessera/Broker1", "org.tessera.Broker1",
            "AcquireTokenSilent", "sassa{sv}", "tessera-test", "1", "read", account_id, "0"]


@pytest.mark.skipif(not flatpak_possible(), reason="needs root, bwrap and a writable cgroup2 hierarchy (CI has them)")
def test_a_flatpak_app_is_identified_by_its_sandbox(start_daemon, write_config):
    start(start_daemon, write_config, "strict")
    b = Broker()
    account = b.sign_in()["account"]["id"]
    app = Sandbox("org.example.App", "org.example.App")
    spoof = Sandbox("org.example.Other", "org.example.App")  # its file and its scope disagree
    bare = Sandbox("org.example.App", None)  # the scope, but no sandbox file
    try:
        refused = app.run(*busctl_token(account))
        assert refused.returncode != 0 and "org.example.App (Flatpak) has no grant" in refused.stderr, refused.stderr
        assert "--app 'flatpak:org.example.App'" in refused.stderr
        # It may not grant itself.
        own = app.run("busctl", "--user", "call", "org.tessera.Broker1", "/org/tessera/Broker1",
                      "org.tessera.Broker1", "Grant", "ssssasas", "flatpak:org.example.App", "tessera-test", "*",
                      "", "0", "0")
        assert own.returncode != 0 and "runs in a sandbox" in own.stderr, own.stderr
        # Nor choose the account every request that names none gets (issue 22's current account).
        chosen = app.run("busctl", "--user", "call", "org.tessera.Broker1", "/org/tessera/Broker1",
                         "org.tessera.Broker1", "SetCurrentAccount", "ss", "alice", "")
        assert chosen.returncode != 0 and "runs in a sandbox" in chosen.stderr, chosen.stderr
        run_cli("access", "grant", "--app", "flatpak:org.example.App", "--client-id", "tessera-test",
                "--account", "alice", check_rc=0)
        allowed = app.run(*busctl_token(account))
        assert allowed.returncode == 0 and "access_token" in allowed.stdout, allowed.stderr
        # A sandbox that claims the app's id from another app's scope, or the app's scope without
        # a sandbox: neither is the app.
        for impostor in (spoof, bare):
            out = impostor.run(*busctl_token(account))
            assert out.returncode != 0 and "could not identify" in out.stderr, out.stderr
        log = json.loads(run_cli("access", "log", "--json", check_rc=0).stdout)
        assert any(r["app_key"] == "flatpak:org.example.App" and r["decision"] == "allowed" for r in log)
        assert sum(r["app_key"] == "unidentified" and r["decision"] == "refused" for r in log) >= 2
    finally:
        for s in (app, spoof, bare):
            s.close()
        b.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="copies python to a root-owned path (CI runs as root)")
@pytest.mark.parametrize("path", ["session bus", "own socket"])
def test_a_caller_that_execs_or_hands_its_connection_on_is_identified_anew(start_daemon, write_config, tmp_path, path):
    """The connection's first process is pinned (pidfd): after an exec its calls are the new
    program's, and after it exits, whoever holds the connection is nobody Tessera knows. The same
    on tesserad's own socket, where the process is pinned when it connects (SO_PEERPIDFD)."""
    start(start_daemon, write_config, "strict")
    b = Broker()  # this python signs in and holds the grant
    account = b.sign_in()["account"]["id"]
    python = os.path.realpath(sys.executable)
    other = str(tmp_path / "other-program")
    shutil.copy(python, other)
    env = dict(os.environ, RAW_CLIENT="tessera-test", RAW_SCOPE="read", RAW_ACCOUNT=account,
               PYTHONHOME=sys.base_prefix)
    raw = os.path.join(HERE, "raw_dbus.py")

    def run(*steps):
        address = os.environ["DBUS_SESSION_BUS_ADDRESS"] if path == "session bus" else \
            "unix:path=" + os.path.join(os.environ["XDG_RUNTIME_DIR"], "tessera", "bus")
        out = subprocess.run([python, raw, "connect", address, *steps],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        return [json.loads(line) for line in out.stdout.splitlines()]

    # The granted program calls, then execs another that goes on calling on the same connection.
    first, after_exec = run("call", "exec", other, "call")
    assert first.get("ok"), first
    assert after_exec["error"] == "org.tessera.Broker1.Error.AccessDenied", after_exec
    assert f"{other} (unverified) has no grant" in after_exec["message"], after_exec
    # The exec comes before any call: the connection is the new program's from the start.
    (only,) = run("exec", other, "call")
    assert f"{other} (unverified) has no grant" in only["message"], only
    # The granted program calls, forks and exits; its child inherits the connection.
    first, orphan = run("call", "fork-and-exit", "call")
    assert first.get("ok") and orphan["pid"] != first["pid"]
    assert orphan["error"] == "org.tessera.Broker1.Error.AccessDenied", orphan
    assert "could not identify" in orphan["message"], orphan
    b.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="copies python to a root-owned path (CI runs as root)")
def test_a_direct_peer_cannot_pass_for_another_caller_with_the_sender_field(start_daemon, write_config, tmp_path):
    """On tesserad's own socket no bus daemon stamps the SENDER header field: a peer may write any
    name there, and the broker must know it by its connection alone.
    - Another program's token call and sign-out, naming the granted caller (this python, on the bus
      and on the socket): neither is served (sd-bus answers InvalidArgs: it cannot vouch for a name
      on a peer-to-peer connection), and the account stays signed in.
    - Calls refused before they are read (wrong argument types) are logged with their caller: that
      caller must be the connection's, not the name written in the message. (It was the name: a
      peer that wrote the unique names the bus daemon gives next had them remembered as an unknown
      user, and the programs that then connected on the bus under those names were refused.)"""
    start(start_daemon, write_config, "strict")
    b = Broker()  # this python signs in and holds the grant
    account = b.sign_in()["account"]["id"]
    assert b.silent(account_id=account)["access_token"]  # its identity is known (cached) by now
    socket_address = "unix:path=" + os.path.join(os.environ["XDG_RUNTIME_DIR"], "tessera", "bus")
    granted_direct = dbus_wire.connect(socket_address)
    mtype, _, body = dbus_wire.call(granted_direct, 2, "Hello", destination="org.freedesktop.DBus",
                                    path="/org/freedesktop/DBus", interface="org.freedesktop.DBus")
    (n,) = struct.unpack_from("<I", body, 0)
    direct_name = body[4:4 + n].decode()
    assert mtype == 2 and direct_name.startswith(":direct."), body
    python = os.path.realpath(sys.executable)
    other = str(tmp_path / "other-program")
    shutil.copy(python, other)
    for victim in (b.conn.get_unique_name(), direct_name):
        env = dict(os.environ, RAW_CLIENT="tessera-test", RAW_SCOPE="read", RAW_ACCOUNT=account, RAW_SENDER=victim,
                   PYTHONHOME=sys.base_prefix)
        out = subprocess.run([other, os.path.join(HERE, "raw_dbus.py"), "connect", socket_address, "call", "signout"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        answers = [json.loads(line) for line in out.stdout.splitlines()]
        assert len(answers) == 2 and not any(a.get("ok") for a in answers), (victim, answers)
    assert [a["id"] for a in b.accounts()] == [account], "the account is still signed in"

    # The bus daemon names connections :1.N in order: the next ones are written into refused calls.
    probe = Broker()
    number = int(probe.conn.get_unique_name().split(".")[1])
    probe.close()
    spoofer = dbus_wire.connect(socket_address)
    for k in range(1, 9):
        spoofer.sendall(dbus_wire.message(k + 1, "GetAccounts", b"\0\0\0\0", "s", sender=f":1.{number + k}"))
        mtype, fields, body = dbus_wire.read_message(spoofer)
        assert mtype == 3 and fields.get(4) == "org.tessera.Broker1.Error.InvalidArgument", fields
    spoofer.close()
    # Programs connecting now get those names, and are served as themselves.
    newcomers = [Broker() for _ in range(4)]
    for newcomer in newcomers:
        assert int(newcomer.conn.get_unique_name().split(".")[1]) in range(number + 1, number + 9)
        assert [a["id"] for a in newcomer.accounts()] == [account], newcomer.conn.get_unique_name()
        newcomer.close()
    granted_direct.close()
    b.close()


class ManagementWatch:
    """ManagementChanged signals with their argument, as another program on the bus hears them
    (dbus-monitor without --profile prints each argument on a line of its own)."""

    def __init__(self):
        self.parts = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            ["dbus-monitor", "--session",
             "type='signal',interface='org.tessera.Broker1',member='ManagementChanged'",
             "type='signal',interface='org.tessera.Broker1',member='E2eManagementProbe'"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._member = None
        threading.Thread(target=self._read, daemon=True).start()
        conn = new_connection()
        try:
            # Once our own probe shows up, the monitor hears everything after it.
            deadline = time.monotonic() + 10
            while not self.wait_for(["probe"], timeout=0.5, exact=False):
                assert time.monotonic() < deadline, "dbus-monitor did not start"
                conn.send_message(dbus.lowlevel.SignalMessage("/org/tessera/Broker1", "org.tessera.Broker1",
                                                              "E2eManagementProbe"))
                conn.flush()
        finally:
            conn.close()
        with self._cond:
            self.parts.clear()

    def _read(self):
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("signal "):
                self._member = line.split("member=")[-1]
                if self._member == "E2eManagementProbe":
                    with self._cond:
                        self.parts.append("probe")
                        self._cond.notify_all()
            elif line.startswith('string "') and self._member == "ManagementChanged":
                with self._cond:
                    self.parts.append(line[len('string "'):-1])
                    self._cond.notify_all()

    def wait_for(self, parts, timeout=30, exact=True):
        with self._cond:
            done = (lambda: self.parts == parts) if exact else (lambda: all(p in self.parts for p in parts))
            self._cond.wait_for(done, timeout=timeout)
            return done()

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def test_grants_forwards_and_reloads_are_announced_and_a_revoke_can_name_one_account(
        start_daemon, write_config, tmp_path):
    """What the desktop app follows: ManagementChanged("grants" / "forwards" / "config") for each
    change, heard by another program on the bus; and `tessera access revoke --account` takes one
    account's grant away and keeps the app's grant for the other."""
    daemon = start(start_daemon, write_config, "strict")
    b = Broker()
    b.sign_in()
    b.sign_in("bob")
    watch = ManagementWatch()
    try:
        app = "exe:/usr/bin/e2e-mail-client"
        for account in ("alice", "bob"):
            run_cli("access", "grant", "--app", app, "--client-id", "tessera-test", "--account", account, check_rc=0)
        assert watch.wait_for(["grants", "grants"]), watch.parts

        revoked = run_cli("access", "revoke", "--app", app, "--account", "bob", check_rc=0)
        assert "Removed 1 grant(s) of exe:/usr/bin/e2e-mail-client for bob" in revoked.stdout, revoked.stdout
        left = json.loads(run_cli("access", "list", "--json", check_rc=0).stdout)
        assert [g["account"] for g in left if g["app"] == app] == ["alice"], left
        assert watch.wait_for(["grants"] * 3), watch.parts
        # Nothing left to revoke for bob: no change, no signal; a name that is no account is named.
        assert "Removed 0 grant" in run_cli("access", "revoke", "--app", app, "--account", "bob", check_rc=0).stdout
        missing = run_cli("access", "revoke", "--app", app, "--account", "carol")
        assert missing.returncode != 0 and "No single signed-in account is 'carol'" in missing.stderr, missing.stderr

        directory = tmp_path / "fwd"
        directory.mkdir(mode=0o700)
        run_cli("forward", "--socket", str(directory / "t.sock"), "--name", "announced", timeout=30, check_rc=0)
        run_cli("forward", "--stop", "announced", check_rc=0)
        assert watch.wait_for(["grants"] * 3 + ["forwards"] * 2), watch.parts

        daemon.proc.send_signal(signal.SIGHUP)
        assert watch.wait_for(["grants"] * 3 + ["forwards"] * 2 + ["config"]), watch.parts
    finally:
        watch.close()
        b.close()
