"""Attacks on a running tesserad, performed as an attacker would (issue 8). Another Unix user is
`nobody`, reached through runuser (the tests run as root in CI); it runs Tests/e2e/attacker.py
with Debian's /usr/bin/python3."""
import json
import os
import shutil
import subprocess
from urllib.parse import urlsplit

import dbus
import pytest

from conftest import (ERROR_PREFIX, IFACE, OBJECT_PATH, REPO, TESSERA, Broker, expect_error, monitor,  # noqa: F401
                      run_cli, wait_until)
from test_engine import (authorization_url, interactions, query_of, run_browser,  # noqa: F401
                         start_sign_in)

ATTACKER = os.path.join(REPO, "Tests", "e2e", "attacker.py")
NOBODY = ["runuser", "-u", "nobody", "--", "/usr/bin/python3", ATTACKER]

cross_user = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("runuser") or not os.path.exists("/usr/bin/python3"),
    reason="attacks by another user need root (to become nobody) and /usr/bin/python3")


def as_nobody(*args):
    proc = subprocess.run(NOBODY + list(args), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def browser_as(user, mode, url):
    """The IdP side of a browser (Tests/idp/browser.py) signing in as `user`; in mode "print" it
    prints the loopback URL carrying the code instead of opening it."""
    env = dict(os.environ, TESSERA_TEST_BROWSER=mode, TESSERA_TEST_USER=user)
    env.pop("TESSERA_TEST_BROWSER_FILE", None)
    cmd = os.environ["TESSERA_TEST_BROWSER_CMD"].split() + [url]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@cross_user
def test_another_user_can_neither_read_end_stall_nor_hijack_a_sign_in(broker, browser, interactions, idp):
    browser.set("hold")  # the browser the daemon starts stays open, its command line readable
    victim = Broker()
    try:
        call = start_sign_in(victim, "xuser-1")
        start = interactions.wait_for("xuser-1")["verification_uri"]
        url = authorization_url(start)  # the test is the victim's user: it may follow the start URL
        query = query_of(url)
        redirect_uri, state = query["redirect_uri"], query["state"]
        start_path = urlsplit(start).path

        # 1. Every user can read every command line: the browser's holds the start URL only.
        wait_until(lambda: as_nobody("cmdlines", start_path)["hits"], timeout=20,
                   what="nobody seeing the browser's command line (so the scan below can see it)")
        leaks = as_nobody("cmdlines", state, query["nonce"], query["code_challenge"], "/o/authorize")["hits"]
        assert leaks == [], leaks

        # 2. nobody cannot follow the start URL, nor end the sign-in with an error of its choosing:
        #    its connections are closed before a byte is read.
        assert as_nobody("get", start)["status"] is None
        forged = (f"{redirect_uri}?state={state}&error=access_denied"
                  "&error_description=Your+account+is+locked%0A%1B%5B31mcall+555-0100")
        assert as_nobody("get", forged)["status"] is None

        # 3. Hijack: the attacker signs in at the IdP as bob with the victim's own URL (so PKCE and
        #    the nonce match) and delivers bob's code to the victim's listener.
        bobs_redirect = browser_as("bob", "print", url)
        assert query_of(bobs_redirect)["state"] == state and "code" in query_of(bobs_redirect)
        assert as_nobody("get", bobs_redirect)["status"] is None

        # 4. Starving the listener: nobody holds 64 connections open; the real redirect still
        #    gets through at once (the sign-in's call would otherwise time out).
        holder = subprocess.Popen(NOBODY + ["hold", redirect_uri, "64", "60"], stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert holder.stdout.readline().strip() == "held 64"
            run_browser(url)  # the victim's own browser, signing in as alice
            name, result = call.reply()
        finally:
            holder.kill()
            holder.wait()
        assert name is None, (name, result)
        assert str(result["account"]["username"]) == "alice"
    finally:
        victim.close()
    assert [a["username"] for a in broker.accounts()] == ["alice"], "bob's sign-in was not taken"


def test_a_hostile_error_description_cannot_drive_a_terminal_or_forge_a_log_line(
        broker, browser, interactions, daemon):
    """The user's own browser can be sent to the redirect with any text (a web page can do it):
    what reaches the caller and the log has no control characters."""
    browser.set("ignore")
    a = Broker()
    try:
        call = start_sign_in(a, "hostile-1")
        url = authorization_url(interactions.wait_for("hostile-1")["verification_uri"])
        query = query_of(url)
        hostile = ("%0AFAKE+LOG+LINE+level%3Derror%0D%1B%5B2J%1B%5D8%3B%3Bhttps%3A%2F%2Fevil%1B%5C"
                   "%E2%80%AEreversed%C2%9B31m")
        import http.client
        parts = urlsplit(query["redirect_uri"])
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request("GET", f"/?state={query['state']}&error=access_denied&error_description={hostile}")
        assert conn.getresponse().status == 200
        conn.close()
        name, message = call.reply()
    finally:
        a.close()
    assert name.endswith(".AccessDenied"), name
    assert "FAKE LOG LINE" in message, "the text is kept, made inert"
    for bad in ("\n", "\r", "\x1b", "\u202e", "\x9b"):
        assert bad not in message, repr(message)
    for line in daemon.log().splitlines():
        assert not line.startswith("FAKE LOG LINE"), line
        assert "\x1b" not in line


# ----------------------------------------------------------------------------------------------
# Huge messages on the bus thread (issue 8 §3)


def rss_kib(pid):
    """The daemon's anonymous resident memory (heap, stacks, arenas): what it allocated and holds.
    Not VmRSS, which also counts the executable's code pages as calls first run them (clean,
    file-backed, shared with the page cache): after the fuzz reached new code paths, VmRSS of the
    debug build grew by about 1 MiB of code alone, which made the check flaky without any leak."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


def huge_filter(keys):
    """GetAccounts' filter with `keys` entries (2 million: about 32 MB on the wire)."""
    return dbus.Dictionary({f"k{i:08d}": dbus.String("v", variant_level=1) for i in range(keys)}, signature="sv")


def test_huge_messages_are_refused_early_without_stalling_others_or_keeping_memory(broker, daemon):
    from conftest import PendingCall
    signed_in = broker.sign_in()
    account_id = signed_in["account"]["id"]
    broker.silent(account_id=account_id)
    before = rss_kib(daemon.proc.pid)

    # Six senders of 2 million filter keys each, and a silent caller among them.
    message = huge_filter(2_000_000)
    senders = [Broker() for _ in range(6)]
    try:
        calls = [PendingCall(s, "GetAccounts", "a{sv}", (message,), timeout=120) for s in senders]
        token = broker.silent(account_id=account_id)
        assert token["access_token"] == signed_in["access_token"], "the silent caller got its cached token"
        for call in calls:
            name, detail = call.reply()
            assert name == ERROR_PREFIX + "InvalidArgument", (name, detail)
            assert "more than 64 entries" in detail, detail
    finally:
        for s in senders:
            s.close()
    del message

    # Memory comes back: nothing of the messages is kept.
    after = rss_kib(daemon.proc.pid)
    assert after - before < 8 * 1024, f"RSS grew from {before} to {after} KiB"
    assert daemon.running


@pytest.mark.parametrize("case", ["nested variant", "long string", "many scopes"])
def test_malformed_values_are_refused_by_type_and_size(broker, case):
    if case == "nested variant":
        # 62 variants around a string: the contract says the option is a string, not a variant.
        value = dbus.String("c-1", variant_level=62)
        message = expect_error("InvalidArgument", broker.call, "GetAccounts", "a{sv}",
                               (dbus.Dictionary({"client_id": value}, signature="sv"),))
        assert "variant holding a variant" in message
    elif case == "long string":
        message = expect_error("InvalidArgument", broker.call, "GetAccounts", "a{sv}",
                               (dbus.Dictionary({"client_id": dbus.String("x" * (1 << 20))}, signature="sv"),))
        assert "string of 1048576 bytes" in message
    else:
        message = expect_error("InvalidArgument", broker.call, "AcquireTokenSilent", "sassa{sv}",
                               ("", dbus.Array([f"s{i}" for i in range(100_000)], signature="s"), "",
                                dbus.Dictionary({}, signature="sv")))
        assert "more than 256 elements" in message


# ----------------------------------------------------------------------------------------------
# Spoofed signals (issue 8 §5)


def test_spoofed_interaction_signals_do_not_reach_the_user(broker, browser, interactions, monitor):
    """Another program on the bus sends `tessera login` an InteractionPending with its own URL and
    device code (broadcast, and sent to the CLI's connection): the CLI shows only the broker's.
    The CLI is sent over the bus (--bus): on tesserad's own socket its connection has one peer,
    the broker it checked, and no other program can send it anything."""
    browser.set("ignore")  # the test plays the browser, after the attack
    cli = subprocess.Popen([TESSERA, "--bus", "login", "--client-id", "tessera-test", "--timeout", "60"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    attacker = Broker()
    try:
        real = wait_until(lambda: monitor.signals("InteractionPending"), what="the broker's InteractionPending")[0]
        # What a program of the same user can learn by monitoring the bus: the CLI's connection and
        # the correlation id it chose.
        wait_until(lambda: interactions._poke(lambda: len(interactions.infos) > 1, 0.2),
                   what="the correlation id on the bus")
        correlation_id = next(k for k in interactions.infos if k != "probe")
        start = interactions.infos[correlation_id]["verification_uri"]  # the broker's, before the fakes
        for destination in (None, real["destination"]):
            fake = dbus.lowlevel.SignalMessage(OBJECT_PATH, IFACE, "InteractionPending")
            if destination:
                fake.set_destination(destination)
            fake.append(dbus.String(correlation_id), dbus.Dictionary({
                "flow": dbus.String("device_code"), "verification_uri": dbus.String("https://evil.example/device"),
                "user_code": dbus.String("EVIL-CODE"), "expires_in": dbus.UInt32(600),
                "message": dbus.String("To sign in, open https://evil.example/device and enter EVIL-CODE"),
            }, signature="sv"), signature="sa{sv}")
            attacker.conn.send_message(fake)
        # A round trip through the bus daemon: the fake signals are queued for the CLI before
        # anything the broker sends from here on.
        attacker.conn.call_blocking("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                    "GetId", "", ())
        run_browser(authorization_url(start))
        out, err = cli.communicate(timeout=60)
    finally:
        attacker.close()
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 0, err
    assert "Signed in as alice" in out
    assert "Opening your browser" in err, "the broker's own signal is shown"
    assert "evil.example" not in err and "EVIL-CODE" not in err, err


# ----------------------------------------------------------------------------------------------
# One app breaking another's refresh (issue 8 §6)


def test_an_app_signing_in_with_other_scopes_does_not_break_another_apps_refresh(broker, idp):
    """django-oauth-toolkit binds a refresh token to the scopes first granted. A sign-in for
    ["write"] used to replace the default-scope grant, and the next default refresh failed with
    invalid_scope."""
    first = broker.sign_in()  # default scopes (read)
    other = broker.acquire("tessera-test", ["write"], login_hint="alice@example.test")
    assert other["account"]["id"] == first["account"]["id"]
    assert "write" in other["scopes"]

    token = run_cli("token", "--force-refresh", check_rc=0).stdout.strip()
    assert token and token not in (first["access_token"], other["access_token"])
    write = broker.silent(scopes=["write"], force_refresh=True)
    assert write["access_token"] != other["access_token"]
    # Each grant was refreshed with its own refresh token; neither was refused.
    mark = idp.mark()
    run_cli("token", "--force-refresh", check_rc=0)
    assert [p["status"] for p in idp.token_posts(mark, grant_type="refresh_token")] == [200]


# ----------------------------------------------------------------------------------------------
# Identity and trust details (issue 8 §7)


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "another user's", "in a shared directory",
                                 "linked into a shared directory"])
def test_a_config_others_can_write_is_refused(tmp_path, daemon, how):
    """config.toml's `browser` key runs a program: a file another user can change is not read. A
    symbolic link is judged by the file it leads to: a link kept in a private directory that leads
    into one others can write is refused (issue 37: the check used to look at the link's own
    directory, after the read)."""
    from conftest import SESSION_CONFIG, TESSERAD
    if how == "another user's" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    daemon.stop()
    directory = tmp_path / "cfg"
    directory.mkdir(mode=0o700)
    path = directory / "config.toml"
    shutil.copy(SESSION_CONFIG, path)
    os.chmod(path, 0o600)
    if how == "group-writable":
        os.chmod(path, 0o620)
    elif how == "world-writable":
        os.chmod(path, 0o602)
    elif how == "another user's":
        os.chown(path, 65534, -1)  # nobody
    elif how == "in a shared directory":
        os.chmod(directory, 0o777)
    named = path
    if how == "linked into a shared directory":
        os.chmod(directory, 0o777)
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        named = private / "config.toml"
        named.symlink_to(path)
    proc = subprocess.run([TESSERAD, "--config", str(named)], capture_output=True, text=True, timeout=20,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 78, proc.stderr
    assert "chmod go-w" in proc.stderr and ("writable by other users" in proc.stderr
                                            or "belongs to another user" in proc.stderr), proc.stderr
    assert not daemon.has_owner()
    # The same file, private again, is read.
    os.chmod(directory, 0o700)
    os.chown(path, os.geteuid(), -1)
    os.chmod(path, 0o600)
    daemon.config = str(named)
    daemon.start()


def test_a_config_that_is_a_fifo_is_refused_at_once(tmp_path, daemon):
    """A FIFO put where config.toml belongs is refused without waiting for a writer (issue 37: the
    file was opened for reading first, which blocks on a FIFO until someone writes to it)."""
    from conftest import TESSERAD
    daemon.stop()
    directory = tmp_path / "cfg"
    directory.mkdir(mode=0o700)
    path = directory / "config.toml"
    os.mkfifo(path, 0o600)
    for command in ([TESSERAD, "--config", str(path)], [TESSERA, "config", "check", "--config", str(path)]):
        proc = subprocess.run(command, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        assert proc.returncode != 0, proc.stderr
        assert f"{path}: is a FIFO, not a regular file" in proc.stderr + proc.stdout, proc.stderr
    assert not daemon.has_owner()


def test_caller_input_cannot_forge_a_log_line(broker, daemon):
    """Correlation ids given to Cancel and option keys are the caller's text; in the log they stay
    on their own line, without escape sequences."""
    forged = "x\n2026-01-01T00:00:00+0000 critical tesserad: FORGED keyring wiped\x1b[2J"
    expect_error("InvalidArgument", broker.call, "Cancel", "s", (forged,))
    expect_error("InvalidArgument", broker.call, "GetAccounts", "a{sv}",
                 (dbus.Dictionary({forged: dbus.String("v")}, signature="sv"),))
    expect_error("InvalidArgument", broker.silent, correlation_id=forged)
    log = daemon.log()
    assert "FORGED" in log, "the caller's text was logged (made inert), so this test can see a forgery"
    for line in log.splitlines():
        assert "FORGED" not in line or not line.startswith("2026-01-01"), line
        assert "\x1b" not in line, repr(line)
