"""Per-application access control (issue 11), with real processes as different apps: this test's
Python (the app that signs in), the `tessera` command and busctl (other apps, told apart by their
executables), and a caller running as another user. The session's config.toml says
access_mode = "open" for the other suites; these tests set each mode themselves."""
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from conftest import TESSERA, TESSERAD, Broker, expect_error, run_cli, stop_process, wait_until
from tessera_session import bus_config

GRANT_COMMAND = re.compile(r"tessera access grant --app '([^']+)' --client-id (\S+) --account (\S+)")


def start(start_daemon, write_config, mode):
    return start_daemon(write_config(access_mode=mode))


def refused_app_key(proc):
    """The app key a refusal names in the command it suggests."""
    match = GRANT_COMMAND.search(proc.stderr)
    assert match, proc.stderr
    return match.group(1)


def test_strict_mode_keeps_each_app_to_its_grants(start_daemon, write_config):
    start(start_daemon, write_config, "strict")
    b = Broker()
    signed_in = b.sign_in()  # this Python completes the sign-in: it gets the grant
    token = signed_in["access_token"]
    assert b.silent()["access_token"] == token

    # Another program (the tessera command) asks for the same client: refused, told how to grant.
    other = run_cli("token")
    assert other.returncode == 12 and other.stdout == "", other.stderr
    assert "unverified" in other.stderr and "has no grant" in other.stderr
    key = refused_app_key(other)
    assert key.startswith("exe:") and key.split("@")[0].endswith("/tessera"), key
    assert token not in other.stderr
    # It sees no account, and cannot sign this one out.
    assert json.loads(run_cli("accounts", "--json", check_rc=0).stdout) == []
    assert run_cli("logout", "--account", signed_in["account"]["id"]).returncode != 0
    assert [a["id"] for a in b.accounts()] == [signed_in["account"]["id"]]

    grants = json.loads(run_cli("access", "list", "--json", check_rc=0).stdout)
    assert [(g["client_id"], g["account"], g["via"]) for g in grants] == [("tessera-test", "alice", "sign-in")]
    assert grants[0]["app"].startswith("exe:") and "unverified" in grants[0]["app_display"]

    # The user grants it: the same token, from the cache.
    run_cli("access", "grant", "--app", key, "--client-id", "tessera-test", "--account", "alice", check_rc=0)
    assert run_cli("token", check_rc=0).stdout.strip() == token
    assert run_cli("token", check_rc=0).stdout.strip() == token  # and from the bus thread's cache
    # ... and takes it back: refused again, also on the bus thread's fast path.
    revoked = run_cli("access", "revoke", "--app", key, check_rc=0)
    assert "Removed 1 grant" in revoked.stdout
    assert run_cli("token").returncode == 12

    log = json.loads(run_cli("access", "log", "--json", check_rc=0).stdout)
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


def test_confirm_mode_asks_the_user_through_the_desktop(start_daemon, write_config, tmp_path):
    from test_attention import NotificationServer
    notifications = NotificationServer(tmp_path)
    try:
        start(start_daemon, write_config, "confirm")
        b = Broker()
        token = b.sign_in()["access_token"]
        # The tessera command asks: the question is shown, and its call waits for the answer.
        asking = subprocess.Popen([TESSERA, "token"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  stdin=subprocess.DEVNULL)
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
        asking = subprocess.Popen([TESSERA, "token"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  stdin=subprocess.DEVNULL)
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
