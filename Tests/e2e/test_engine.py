"""The token engine under load and interruption: refresh-token rotation, refreshes racing on one
refresh token, Cancel, callers leaving the bus, the cap on sign-ins, forged redirects, claims and
domain_hint."""
import http.client
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from urllib.parse import parse_qs, urlsplit

import dbus
import dbus.lowlevel
import pytest

from conftest import (BUS_NAME, PendingCall, stop_process, ERROR_PREFIX, IFACE, INTERACTIVE_TIMEOUT, OBJECT_PATH, TESSERA, Async, Broker,
                      expect_error, new_connection, options, run_cli, wait_until)

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


# ----------------------------------------------------------------------------------------------
# Helpers


def start_sign_in(broker, correlation_id, call_timeout=INTERACTIVE_TIMEOUT, **opts):
    """AcquireToken (sent, not waited for) with this correlation id."""
    opts.setdefault("timeout", 60)
    return PendingCall(broker, "AcquireToken", "sasa{sv}",
                       ("", dbus.Array([], signature="s"), options(correlation_id=correlation_id, **opts)),
                       timeout=call_timeout)


class InteractionMonitor:
    """dbus-monitor printing InteractionPending with its arguments (the conftest monitor only sees
    names): wait_for(correlation_id) -> the info dict, with its string and integer values."""

    SCALAR = re.compile(r'^(variant\s+)?(string|uint32|int32|int64|uint64|boolean) (.*)$')

    def __init__(self):
        self.infos = {}
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            ["dbus-monitor", "--session", f"type='signal',interface='{IFACE}'"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()
        self._conn = new_connection()
        deadline = time.monotonic() + 10
        while not self._poke(lambda: "probe" in self.infos, 0.1):
            assert time.monotonic() < deadline, "dbus-monitor did not start"

    def _poke(self, predicate, timeout):
        """dbus-monitor ends a message's last line only when it prints the next message: a probe
        signal pushes out the one before it."""
        self._conn.send_message(dbus.lowlevel.SignalMessage(OBJECT_PATH + "/e2eprobe", IFACE, "E2eProbe"))
        self._conn.flush()
        with self._cond:
            return self._cond.wait_for(predicate, timeout=timeout)

    def _read(self):
        block = None
        for line in self.proc.stdout:
            if line.startswith("signal "):
                self._finish(block)
                member = re.search(r"member=(\w+)", line)
                block = {"member": member.group(1) if member else "", "lines": []}
            elif block is not None:
                block["lines"].append(line.strip())
        self._finish(block)

    def _finish(self, block):
        if block is None:
            return
        if block["member"] == "E2eProbe":
            with self._cond:
                self.infos["probe"] = {}
                self._cond.notify_all()
            return
        if block["member"] != "InteractionPending":
            return
        correlation_id, info, key, in_entry = None, {}, None, False
        for line in block["lines"]:
            if line == "dict entry(":
                in_entry, key = True, None
                continue
            m = self.SCALAR.match(line)
            if not m:
                continue
            value = m.group(3)
            value = value[1:-1] if m.group(2) == "string" else int(value) if "int" in m.group(2) else value
            if not in_entry:
                correlation_id = value
            elif m.group(1) is None and key is None:
                key = value
            elif m.group(1) is not None:
                info[key] = value
        with self._cond:
            self.infos[correlation_id] = info
            self._cond.notify_all()

    def wait_for(self, correlation_id, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not self._poke(lambda: correlation_id in self.infos, 0.1):
            assert time.monotonic() < deadline, f"no InteractionPending for {correlation_id}"
        with self._cond:
            return self.infos[correlation_id]

    def close(self):
        self._conn.close()
        stop_process(self.proc)


@pytest.fixture
def interactions():
    m = InteractionMonitor()
    yield m
    m.close()


def query_of(url):
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def authorization_url(start_url):
    """What the listener's start URL (the verification_uri a caller is given, and what the
    browser opens) sends the browser on to: the IdP's authorization URL."""
    parts = urlsplit(start_url)
    assert parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost"), start_url
    assert re.fullmatch(r"/start/[0-9a-f]{32}", parts.path), start_url
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", parts.path)
        response = conn.getresponse()
        assert response.status == 303, response.status
        return response.getheader("Location")
    finally:
        conn.close()


def sign_in_by_hand(interactions, browser, correlation_id, **opts):
    """A sign-in whose browser the test plays: -> (the authorization URL's query, the reply)."""
    browser.set("ignore")
    a = Broker()
    try:
        call = start_sign_in(a, correlation_id, **opts)
        url = authorization_url(interactions.wait_for(correlation_id)["verification_uri"])
        run_browser(url)
        name, result = call.reply()
        assert name is None, (name, result)
        return query_of(url), result
    finally:
        a.close()


def http_get(url, path_and_query):
    """GET on the loopback redirect listener -> HTTP status."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", path_and_query)
        return conn.getresponse().status
    finally:
        conn.close()


def run_browser(url, mode="allow"):
    """What the user's browser does with the sign-in URL (Tests/idp/browser.py), run by the test."""
    env = dict(os.environ, TESSERA_TEST_BROWSER=mode)
    env.pop("TESSERA_TEST_BROWSER_FILE", None)
    cmd = shlex.split(os.environ["TESSERA_TEST_BROWSER_CMD"]) + [url]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def error_name(name):
    return ERROR_PREFIX + name


# ----------------------------------------------------------------------------------------------
# Refresh tokens: rotation and serialisation


def test_two_hundred_refresh_token_rotations_in_a_row(broker, idp):
    """The test IdP rotates refresh tokens with reuse protection and no grace period: any use of a
    stale refresh token would revoke the family and sign alice out."""
    first_id = idp.max_refresh_token_id()
    signed_in = broker.sign_in()
    account_id = signed_in["account"]["id"]
    mark = idp.mark()
    tokens = [signed_in["access_token"]]
    for _ in range(200):
        tokens.append(broker.silent(account_id=account_id, force_refresh=True)["access_token"])
    assert len(set(tokens)) == 201, "every forced refresh returns a new access token"
    posts = idp.token_posts(mark)
    assert len(posts) == 200 and all(p["grant_type"] == "refresh_token" for p in posts), posts[-3:]
    assert [p for p in posts if p["status"] != 200] == []
    # Still signed in: served from the cache without the IdP, and after another refresh.
    mark = idp.mark()
    assert broker.silent(account_id=account_id)["access_token"] == tokens[-1]
    assert idp.token_posts(mark) == []
    assert broker.silent(account_id=account_id, force_refresh=True)["access_token"] not in tokens
    assert [a["username"] for a in broker.accounts()] == ["alice"]
    # At the IdP: one refresh token from the sign-in and one per refresh, all but the newest used up.
    live = [row[0] for row in idp.query(
        "SELECT revoked IS NULL FROM oauth2_provider_refreshtoken WHERE id > ? ORDER BY id", first_id)]
    assert len(live) == 202 and live[-1] == 1 and sum(live) == 1, (len(live), sum(live))


# Scope sets the single-flight key tells apart (ScopeSet.normalize keeps OIDC scopes) but that are
# the same request at the IdP (the broker always adds openid, profile, offline_access). Genuinely
# different resource scopes cannot be used: DOT ties a rotated refresh token to the scopes of its
# last access token, so after one refresh narrowed to "read", a refresh asking "write" is invalid_scope.
SCOPE_SETS = [["read"], ["read", "openid"], ["read", "profile"], ["read", "openid", "offline_access"]]


def test_refreshes_for_different_scopes_take_turns_on_the_refresh_token(broker, idp):
    account_id = broker.sign_in(scopes=["read"])["account"]["id"]
    n = 16
    callers = [Broker() for _ in range(n)]
    barrier = threading.Barrier(n)
    mark = idp.mark()

    def call(i):
        barrier.wait()
        return callers[i].silent(scopes=SCOPE_SETS[i % len(SCOPE_SETS)], account_id=account_id, force_refresh=True)

    try:
        calls = [Async(call, i) for i in range(n)]
        results = [c.result(60) for c in calls]  # re-raises InteractionRequired if a token was reused
    finally:
        for b in callers:
            b.close()
    assert all(r["account"]["id"] == account_id for r in results)
    posts = idp.token_posts(mark)
    assert posts and all(p["grant_type"] == "refresh_token" for p in posts)
    assert [p for p in posts if p["status"] != 200] == [], posts
    # At least one refresh per scope set (identical ones may share one), never more than one per call.
    assert len(SCOPE_SETS) <= len(posts) <= n
    assert len({r["access_token"] for r in results}) == len(posts)
    # The refresh token family is intact.
    assert broker.silent(account_id=account_id, force_refresh=True)["access_token"]
    assert [a["username"] for a in broker.accounts()] == ["alice"]


# ----------------------------------------------------------------------------------------------
# Cancel, callers leaving, the cap


def test_cancel_ends_only_the_callers_own_sign_in(broker, browser, monitor):
    browser.set("ignore")  # the sign-in waits for a redirect that never comes
    a = Broker()
    b = Broker()
    try:
        call = start_sign_in(a, "c-1")
        assert monitor.wait_for(lambda s: s["member"] == "InteractionPending" and s["destination"] == a.unique_name,
                                timeout=10), "sign-in did not start"
        # Another connection cannot cancel it; unknown ids are refused.
        message = expect_error("InvalidArgument", b.call, "Cancel", "s", ("c-1",))
        assert "c-1" in message
        expect_error("InvalidArgument", a.call, "Cancel", "s", ("no-such-sign-in",))
        # The caller can: its AcquireToken ends with Cancelled at once.
        started = time.monotonic()
        a.call("Cancel", "s", ("c-1",))
        name, detail = call.error()
        assert name == error_name("Cancelled"), (name, detail)
        assert time.monotonic() - started < 2.0
        assert "cancel" in detail.lower()
        # It is gone: cancelling again is refused, and the id can be used again.
        expect_error("InvalidArgument", a.call, "Cancel", "s", ("c-1",))
        browser.set("allow")
        assert a.sign_in(correlation_id="c-1")["correlation_id"] == "c-1"
        assert [x["username"] for x in b.accounts()] == ["alice"]
        assert broker.silent()["account"]["username"] == "alice"
    finally:
        a.close()
        b.close()


def test_caller_leaving_the_bus_stops_device_code_polling(daemon, broker, idp):
    """`tessera login --device-code` is killed while the broker polls the IdP for it: the broker
    stops polling (the IdP's device interval is 1 s) and keeps serving."""
    mark = idp.mark()
    proc = subprocess.Popen(
        [TESSERA, "login", "--device-code", "--client-id", "tessera-device", "--timeout", "60"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: idp.token_posts(mark, grant_type=DEVICE_GRANT), timeout=20,
                   what="the broker polling the token endpoint")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed = time.time()
    wait_until(lambda: "The caller left the bus; cancelling its sign-in" in daemon.log(), timeout=3,
               what="the daemon noticing that the caller left")
    time.sleep(max(0.0, killed + 3.2 - time.time()))  # three polling intervals after the kill
    polls = idp.token_posts(mark, grant_type=DEVICE_GRANT)
    assert polls and all(p["status"] == 400 for p in polls)  # authorization_pending
    # A poll under way at the kill may still arrive; the next one would be an interval later.
    late = [p for p in polls if p["t"] > killed + 0.8]
    assert late == [], f"the broker still polled {len(late)} times after its caller left"
    # Still serving.
    assert broker.accounts() == []
    assert broker.sign_in()["account"]["username"] == "alice"


SignInPlacesPerApp = 4  # SignInRegistry.maxFlowsPerApp

HOLDERS = {
    # Other programs the user runs, each an app of its own (places are counted by executable).
    "busctl": lambda: ["busctl", "--user", "call", "--timeout=120", BUS_NAME, OBJECT_PATH, IFACE, "AcquireToken",
                       "sasa{sv}", "", "0", "0"],
    "gdbus": lambda: ["gdbus", "call", "--session", "--timeout", "120", "--dest", BUS_NAME, "--object-path",
                      OBJECT_PATH, "--method", IFACE + ".AcquireToken", "", "@as []", "@a{sv} {}"],
}


def test_sign_in_places_are_shared_by_apps_not_connections(daemon, broker, browser, monitor, tmp_path):
    """Issue 8 §4: one program with four connections and five sign-ins each held all 16 places
    for up to an hour, and `tessera login` failed with "Too many sign-ins"."""
    browser.set("ignore")  # nobody finishes these sign-ins

    def pending():
        return len(monitor.signals("InteractionPending"))

    callers = [Broker() for _ in range(5)]
    holders = []
    try:
        # One program (this test's python), four connections: four places at most.
        calls = []
        for i in range(4):
            calls.append(start_sign_in(callers[i], f"cap-{i}"))
            wait_until(lambda: pending() == i + 1, what=f"sign-in {i + 1}")
        for c in (callers[0], callers[4]):
            message = expect_error("Busy", c.acquire, correlation_id="cap-more", timeout=60)
            assert "already has 4 sign-ins" in message
        # Silent calls are not capped.
        assert broker.accounts() == []

        # Three other programs fill the other twelve places: busctl, gdbus, and a copy of busctl
        # (another executable, so another app).
        other = str(tmp_path / "other-app")
        shutil.copy(shutil.which("busctl"), other)
        holders_commands = dict(HOLDERS, other=lambda: [other] + HOLDERS["busctl"]()[1:])
        for name, command in holders_commands.items():
            for _ in range(4):
                holders.append(subprocess.Popen(command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                text=True))
        wait_until(lambda: pending() == 16 or any(h.poll() is not None for h in holders), timeout=20,
                   what="16 sign-ins in progress")
        assert all(h.poll() is None for h in holders), [h.stderr.read() for h in holders if h.poll() is not None]
        assert pending() == 16
        # Each sign-in's browser has read its mode ("ignore") before the mode changes below.
        wait_until(lambda: daemon.log().count("mode ignore: doing nothing") == 16, timeout=30,
                   what="the 16 browsers starting")

        # A legitimate `tessera login` still signs in: it takes the oldest place of an app that
        # holds four (the oldest of all: this test's first), whose sign-in ends with Cancelled and
        # says why.
        browser.set("allow")
        login = run_cli("login", "--client-id", "tessera-test", timeout=60)
        assert login.returncode == 0, login.stderr
        assert "Signed in as alice" in login.stdout
        name, message = calls[0].error()
        assert name == error_name("Cancelled") and "to make room for another app's sign-in" in message, message
        assert daemon.log().count("Ended the oldest sign-in of an app holding 4 places") == 1

        # A cancelled sign-in frees its place (for the same app).
        callers[1].call("Cancel", "s", ("cap-1",))
        browser.set("ignore")
        start_sign_in(callers[4], "cap-again")
        wait_until(lambda: pending_to(monitor, callers[4]), what="the sign-in in the freed place")
    finally:
        for c in callers:
            c.close()  # the broker cancels the sign-ins of callers that left
        for h in holders:
            h.kill()
            h.wait()
    wait_until(lambda: daemon.log().count("The caller left the bus; cancelling its sign-in") >= 15, timeout=15,
               what="the broker cancelling the sign-ins of the callers that left")
    # All places are free again.
    browser.set("allow")
    others = [Broker() for _ in range(3)]
    try:
        signed = [Async(o.sign_in) for o in others]
        assert [s.result(60)["account"]["username"] for s in signed] == ["alice"] * 3
    finally:
        for o in others:
            o.close()


# ----------------------------------------------------------------------------------------------
# The loopback redirect listener


def test_forged_redirects_are_refused_and_the_sign_in_goes_on(broker, browser, interactions, idp):
    """Requests to the loopback port without this sign-in's state get HTTP 400 (404 without a
    query) and change nothing: the sign-in still succeeds afterwards, not with AccessDenied."""
    browser.set("ignore")  # the test plays the browser itself
    a = Broker()
    try:
        call = start_sign_in(a, "forge-1", login_hint="alice@example.test")
        url = authorization_url(interactions.wait_for("forge-1")["verification_uri"])
        query = query_of(url)
        redirect_uri, state = query["redirect_uri"], query["state"]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", redirect_uri), redirect_uri

        # Any local process can reach the port; only the redirect with this sign-in's state counts.
        assert http_get(redirect_uri, "/?error=access_denied&state=forged") == 400
        assert http_get(redirect_uri, "/?code=stolen-code&state=forged") == 400
        assert http_get(redirect_uri, "/?error=access_denied") == 400
        assert http_get(redirect_uri, f"/?state={state}") == 400  # neither code nor error
        assert http_get(redirect_uri, "/favicon.ico") == 404
        mark = idp.mark()

        # Still waiting for the real browser, whose redirect ends it.
        run_browser(url)
        name, result = call.reply()
        assert name is None, (name, result)
        assert str(result["account"]["username"]) == "alice"
        assert str(result["correlation_id"]) == "forge-1"
        # The forged code was never redeemed: one authorization_code POST (the real one).
        assert [p["grant_type"] for p in idp.token_posts(mark)] == ["authorization_code"]
    finally:
        a.close()


# ----------------------------------------------------------------------------------------------
# Options: claims, domain_hint


def test_claims_must_be_a_json_object_and_skip_the_cache(broker, idp):
    signed_in = broker.sign_in()
    account_id = signed_in["account"]["id"]
    mark = idp.mark()
    for bad in ("not json", '["access_token"]', '"x"', "{"):
        message = expect_error("InvalidArgument", broker.silent, account_id=account_id, claims=bad)
        assert "claims" in message
    expect_error("InvalidArgument", broker.acquire, claims="not json")
    assert idp.requests(mark) == []

    challenge = '{"access_token":{"acrs":{"essential":true,"value":"c1"}}}'
    first = broker.silent(account_id=account_id, claims=challenge)
    second = broker.silent(account_id=account_id, claims=challenge)
    tokens = {signed_in["access_token"], first["access_token"], second["access_token"]}
    assert len(tokens) == 3, "a claims challenge always gets a new token"
    posts = idp.token_posts(mark)
    assert [(p["grant_type"], p["status"]) for p in posts] == [("refresh_token", 200)] * 2


def test_domain_hint(broker, browser, interactions):
    query, signed_in = sign_in_by_hand(interactions, browser, "dh-1", domain_hint="example.test")
    assert query["domain_hint"] == "example.test"
    # With account_id its user name is the login_hint, and a domain_hint is derived only from a
    # user name with a domain (alice's has none).
    query, again = sign_in_by_hand(interactions, browser, "dh-2", account_id=signed_in["account"]["id"])
    assert again["account"]["id"] == signed_in["account"]["id"]
    assert query["login_hint"] == "alice" and "domain_hint" not in query
    # The broker sets domain_hint itself: not through extra_query.
    message = expect_error("InvalidArgument", broker.acquire, extra_query={"domain_hint": "x.test"})
    assert "domain_hint" in message


# ----------------------------------------------------------------------------------------------
# Races at the start of a sign-in. A sign-in is registered before the broker's first await (store
# loading, OIDC discovery), so a burst of calls, a repeated correlation id, and callers leaving at
# once are all seen by the cap, Cancel and the caller-left handling. On a fresh daemon the window
# would be the store load, so these would fail every time without that ordering.


def pending_to(monitor, broker):
    monitor.sync()
    return [s for s in monitor.signals("InteractionPending") if s["destination"] == broker.unique_name]



def test_a_burst_of_sign_ins_from_one_caller_is_capped_too(daemon, browser, monitor):
    browser.set("ignore")
    a = Broker()
    try:
        # Each call ends on its event (refused, or the Cancel below); 60 s only bounds a hang, as do
        # the waits' 30 s.
        calls = [start_sign_in(a, f"burst-{i}", call_timeout=60) for i in range(8)]
        wait_until(lambda: len(pending_to(monitor, a)) >= 4, timeout=30, what="4 sign-ins")
        # The other four are refused at once; the broker logs each call's outcome.
        wait_until(lambda: daemon.log().count("outcome=Busy") == 4, timeout=30, what="4 refusals")
        for i in range(8):
            try:
                a.call("Cancel", "s", (f"burst-{i}",))
            except dbus.exceptions.DBusException:
                pass
        outcomes = sorted(c.error()[0] for c in calls)
    finally:
        a.close()
    assert outcomes == sorted([error_name("Cancelled")] * 4 + [error_name("Busy")] * 4)



def test_a_burst_with_one_correlation_id_starts_one_sign_in(daemon, browser, monitor):
    browser.set("ignore")
    a = Broker()
    try:
        # One call is refused, the other ends on the Cancel below: 60 s only bounds a hang (with 2 s,
        # a wait below that took longer under load ended the pending call NoReply first).
        first = start_sign_in(a, "dup", call_timeout=60)
        second = start_sign_in(a, "dup", call_timeout=60)
        wait_until(lambda: pending_to(monitor, a), timeout=30, what="a sign-in")
        wait_until(lambda: any("correlation_id=dup " in line and "outcome=InvalidArgument" in line
                               for line in daemon.log().splitlines()), timeout=30, what="the second call refused")
        a.call("Cancel", "s", ("dup",))
        # Fixed: one is refused at once, the other cancelled. Now: both start, Cancel reaches the
        # one registered last, and the other can no longer be cancelled (its call gets NoReply).
        outcomes = sorted([first.error()[0], second.error()[0]])
    finally:
        a.close()
    assert outcomes == sorted([error_name("Cancelled"), error_name("InvalidArgument")])



def test_callers_that_leave_at_once_hold_no_sign_in_places(daemon, browser, monitor):
    """16 callers start a sign-in and exit at once, while the fresh daemon still loads its store:
    their sign-ins (4: they are one app) must not go on, holding this app's places for the whole
    timeout."""
    browser.set("ignore")
    leavers = [Broker() for _ in range(16)]
    for i, b in enumerate(leavers):
        start_sign_in(b, f"gone-{i}", timeout=300)
    for b in leavers:
        b.close()
    deadline = time.monotonic() + 3
    while len(monitor.signals("InteractionPending")) < SignInPlacesPerApp and time.monotonic() < deadline:
        time.sleep(0.1)
    browser.set("allow")
    b = Broker()
    try:
        assert b.sign_in(timeout=30)["account"]["username"] == "alice"
    finally:
        b.close()
