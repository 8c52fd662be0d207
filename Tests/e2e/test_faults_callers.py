"""Fault injection (issue 12), callers: clients that disconnect in the middle of their calls, 1,000
silent calls in flight at once, 64 clients each starting and cancelling sign-ins, a client that
never reads its replies, and messages at the bus's size limit.

What must hold: the daemon keeps answering everyone else (a well-behaved caller's silent p99 is
measured while each fault runs), no call goes unanswered, and the daemon's memory returns to within
1 MiB of where it was before the fault (for the two floods of queued messages: of where it was after
their first flood, see HIGH_WATER_KIB).

The floods use bare-socket clients (Tests/lib/dbus_wire.py) so that many calls can be in flight per
connection and a connection can be dropped at any byte. Figures go to $TESSERA_FAULT_REPORT
(FAULTS.md)."""
import os
import socket
import struct
import threading
import time

import dbus
import pytest

import dbus_wire
from conftest import ERROR_PREFIX, Broker, bus_address, expect_error, wait_until
from test_attacks import rss_kib
from test_engine import start_sign_in
from test_faults import report

# The D-Bus specification's (and dbus-daemon's, and sd-bus's) largest message: 128 MiB.
BUS_MESSAGE_LIMIT = 128 * 1024 * 1024
MEMORY_SLACK_KIB = 1024
# The floods that queue hundreds of messages at once leave a high-water mark: what the peak needed
# (sd-bus's queues, glibc's arenas), kept rather than returned. Measured (issue 27: three short runs
# and the long rounds of seeds 77 and 78): +984 to +1,020 KiB after the first two waves of 1,000
# calls in flight, then +4 to +60 KiB over eight more waves; +696 to +996 KiB after a first round of
# 64 sign-in churners, then +120 to +580 KiB over a second round, and six further rounds stayed
# between +508 and +712 KiB of the first baseline, with no trend. A leak grows with every flood; a
# mark does not. So these two tests take their baseline after a first flood and keep the 1 MiB
# bound on the growth after it; the first flood's mark is bounded apart, at twice the largest
# measured.
HIGH_WATER_KIB = 2048


def empty_silent_body(client, account):
    """AcquireTokenSilent(client, [], account, {}) as bytes."""
    body = bytearray()
    dbus_wire.put_string(body, client)
    dbus_wire.pad(body, 4)
    body.extend(struct.pack("<I", 0))  # no scopes
    dbus_wire.put_string(body, account)
    dbus_wire.pad(body, 4)
    body.extend(struct.pack("<I", 0))  # an empty a{sv}
    dbus_wire.pad(body, 8)  # (its elements' alignment, even with none)
    return bytes(body)


def force_refresh_body():
    """AcquireTokenSilent("", [], "", {"force_refresh": <true>})."""
    body = bytearray()
    dbus_wire.put_string(body, "")
    dbus_wire.pad(body, 4)
    body.extend(struct.pack("<I", 0))
    dbus_wire.put_string(body, "")
    dbus_wire.pad(body, 4)
    entry = bytearray()
    dbus_wire.put_string(entry, "force_refresh")
    entry.extend(b"\x01b\x00")  # variant signature "b"
    dbus_wire.pad(entry, 4)
    entry.extend(struct.pack("<I", 1))
    # The array's length counts from its first element, which is 8-aligned (a dict entry).
    body.extend(struct.pack("<I", len(entry)))
    dbus_wire.pad(body, 8)
    body.extend(entry)
    return bytes(body)


def interactive_body(correlation_id):
    """AcquireToken("", [], {"correlation_id": <id>})."""
    body = bytearray()
    dbus_wire.put_string(body, "")
    dbus_wire.pad(body, 4)
    body.extend(struct.pack("<I", 0))
    dbus_wire.pad(body, 4)
    entry = bytearray()
    dbus_wire.put_string(entry, "correlation_id")
    entry.extend(b"\x01s\x00")
    dbus_wire.put_string(entry, correlation_id)
    body.extend(struct.pack("<I", len(entry)))
    dbus_wire.pad(body, 8)
    body.extend(entry)
    return bytes(body)


class Victim:
    """A well-behaved caller making silent calls on its own connection the whole time a fault
    runs; every call must succeed, and its latencies give the p99 under load."""

    def __init__(self, account_id):
        self.account_id = account_id
        self.latencies = []
        self.errors = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        b = Broker()
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    b.silent(account_id=self.account_id, call_timeout=30)
                    self.latencies.append(time.monotonic() - began)
                except dbus.exceptions.DBusException as e:
                    self.errors.append(f"{e.get_dbus_name()}: {e.get_dbus_message()}")
                time.sleep(0.002)
        finally:
            b.close()

    def stop(self):
        self._stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the well-behaved caller's call never came back"
        assert self.errors == [], f"the well-behaved caller got errors: {self.errors[:5]}"
        assert self.latencies, "the well-behaved caller made no call"
        ordered = sorted(self.latencies)
        return {"calls": len(ordered), "p50_ms": round(ordered[len(ordered) // 2] * 1000, 2),
                "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2),
                "max_ms": round(ordered[-1] * 1000, 2)}


def settled_memory(daemon, baseline, timeout=45):
    """Waits (the daemon hands freed memory back after its maintenance passes, every 30 s) until its
    anonymous memory is within 1 MiB of `baseline`; returns the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        now = rss_kib(daemon.proc.pid)
        if now - baseline <= MEMORY_SLACK_KIB or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


SOCKET_ADDRESS = "unix:path=" + os.path.join(os.environ["XDG_RUNTIME_DIR"], "tessera", "bus")


@pytest.fixture(params=["session bus", "own socket"])
def path(request):
    """Which way the flood comes: through the bus daemon, or straight to tesserad's own socket
    (issue 23), where tesserad alone bounds what a connection may queue. Returns (address, the
    suffix its report's fault name gets)."""
    if request.param == "session bus":
        return bus_address(), ""
    return SOCKET_ADDRESS, " (own socket)"


@pytest.fixture
def warmed(daemon, broker):
    """alice signed in, and every kind of call made once (so what the daemon allocates once, lazily,
    is in the baseline); returns (account id, baseline anonymous memory in KiB)."""
    account = broker.sign_in()["account"]["id"]
    for _ in range(50):
        broker.silent(account_id=account)
        broker.accounts()
    broker.silent(force_refresh=True)
    expect_error("InvalidArgument", broker.call, "Cancel", "s", ("nothing",))
    time.sleep(0.5)
    return account, rss_kib(daemon.proc.pid)


def leaver_outcomes(daemon, prefix, outcome):
    """How many calls with a correlation id starting `prefix` the daemon logged with `outcome`."""
    return sum(1 for line in daemon.log().splitlines()
               if f"correlation_id={prefix}" in line and f"outcome={outcome}" in line)


def test_callers_that_disconnect_mid_call(daemon, warmed, browser, idp, path, monitor):
    """200 callers send a forced refresh and close their connection before the reply, and 16 start
    an interactive sign-in and leave while it waits for the browser (one program: at most 4 hold a
    place at a time, the others are refused Busy). Invariants: the daemon keeps answering a
    well-behaved caller with no error, the abandoned sign-ins are cancelled (the program's 4 places
    are all free again: 4 new sign-ins at once, none Busy), the account keeps working, and memory
    comes back within 1 MiB."""
    account, baseline = warmed
    browser.set("ignore")
    victim = Victim(account)
    address, suffix = path
    for n in range(200):
        sock = dbus_wire.connect(address)
        sock.sendall(dbus_wire.message(2, "AcquireTokenSilent", force_refresh_body(), "sassa{sv}"))
        if n % 2:
            time.sleep(0.002 * (n % 10))  # some leave at once, some a little into the call
        sock.close()
    leavers = []
    for n in range(16):
        sock = dbus_wire.connect(address)
        sock.sendall(dbus_wire.message(2, "AcquireToken", interactive_body(f"leaver-{n}"), "sasa{sv}"))
        leavers.append(sock)
    # They leave while their sign-ins wait: once the daemon has dealt with all 16 (4 hold the
    # program's places, 12 are refused Busy; 30 s only bounds a hang).
    wait_until(lambda: leaver_outcomes(daemon, "leaver-", "Busy") >= 12, timeout=30, what="12 leavers refused Busy")
    for sock in leavers:
        sock.close()
    under_load = victim.stop()
    assert daemon.running
    # The leavers' 4 sign-ins end as their callers go (each logged once its place is free again).
    wait_until(lambda: leaver_outcomes(daemon, "leaver-", "Cancelled") >= 4, timeout=30,
               what="the leavers' 4 sign-ins cancelled")
    # The program's places are all free again: 4 sign-ins at once, none refused Busy.
    waiting = [Broker() for _ in range(4)]
    calls = [start_sign_in(w, f"after-{n}", call_timeout=60) for n, w in enumerate(waiting)]

    def started(n, w):
        """The sign-in holds a place (its InteractionPending sent), or was answered (refused)."""
        return (any(s["destination"] == w.unique_name for s in monitor.signals("InteractionPending"))
                or leaver_outcomes(daemon, f"after-{n} ", "") > 0)

    wait_until(lambda: all(started(n, w) for n, w in enumerate(waiting)), timeout=30, what="the 4 sign-ins started")
    for n, w in enumerate(waiting):
        try:
            w.call("Cancel", "s", (f"after-{n}",))
        except dbus.exceptions.DBusException:
            pass  # answered already (refused): its reply says how, below
    names = [call.reply()[0] for call in calls]
    assert names == [ERROR_PREFIX + "Cancelled"] * 4, f"places left held by the leavers: {names}"
    for w in waiting:
        w.close()
    browser.set("allow")
    b = Broker()
    assert b.sign_in()["account"]["id"] == account, "a sign-in after the leavers is not Busy"
    assert b.silent(account_id=account, force_refresh=True)["access_token"], "the refresh token survived"
    b.close()
    after = settled_memory(daemon, baseline)
    assert after - baseline <= MEMORY_SLACK_KIB, f"memory grew from {baseline} to {after} KiB"
    report({"fault": "callers disconnecting mid-call" + suffix, "refresh_leavers": 200, "sign_in_leavers": 16,
            "victim": under_load, "memory_kib": after - baseline})


def test_a_thousand_concurrent_silent_calls(daemon, warmed, path):
    """Ten waves: 50 connections each send 20 silent calls at once, without waiting, so 1,000 are
    in flight. Invariants: every one is answered with a token (no error, none dropped), a
    well-behaved caller meanwhile gets its tokens, and memory does not grow from one flood to the
    next by more than 1 MiB (the first two waves set the high-water mark, bounded apart)."""
    account, baseline = warmed
    body = empty_silent_body("", account)
    burst = b"".join(dbus_wire.message(serial, "AcquireTokenSilent", body, "sassa{sv}") for serial in range(2, 22))
    victim = Victim(account)
    address, suffix = path
    answered, errors, waves = 0, [], []

    def flood(count):
        nonlocal answered
        for _ in range(count):
            socks = [dbus_wire.connect(address) for _ in range(50)]
            began = time.monotonic()
            for sock in socks:
                sock.sendall(burst)
            for sock in socks:
                sock.settimeout(60)
                for _ in range(20):
                    mtype, fields, reply = dbus_wire.read_message(sock)
                    while mtype == 4:  # a signal (NameAcquired): not a reply
                        mtype, fields, reply = dbus_wire.read_message(sock)
                    if mtype == 2:
                        answered += 1
                    else:
                        errors.append(fields.get(4))
                sock.close()
            waves.append(time.monotonic() - began)

    flood(2)
    high_water = settled_memory(daemon, baseline)
    flood(8)
    under_load = victim.stop()
    assert errors == [] and answered == 10_000, f"{answered} answered, errors {errors[:5]}"
    after = settled_memory(daemon, high_water)
    assert high_water - baseline <= HIGH_WATER_KIB, f"the first flood left {high_water - baseline} KiB"
    assert after - high_water <= MEMORY_SLACK_KIB, f"memory grew from {high_water} to {after} KiB over 8 waves"
    waves.sort()
    report({"fault": "1,000 concurrent silent calls" + suffix, "waves": 10, "answered": answered,
            "wave_median_s": round(waves[5], 3), "victim": under_load, "memory_kib": after - high_water,
            "high_water_kib": high_water - baseline})


def test_64_clients_start_and_cancel_sign_ins(daemon, warmed, browser):
    """Twice, 64 clients each start an interactive sign-in (the browser never answers) and cancel
    it, half of them right behind the call. Each AcquireToken ends with Cancelled, or at once with
    Busy (one app may hold 4 sign-ins, all apps 16: these 64 clients are one program); none hangs;
    a well-behaved caller is served throughout; afterwards a sign-in works; memory does not grow
    from the first round to the second by more than 1 MiB (the first sets the high-water mark,
    bounded apart)."""
    account, baseline = warmed
    victim = Victim(account)
    lock = threading.Lock()

    def client(n, outcomes):
        b = Broker()
        try:
            correlation = f"cancel-{n}"
            call = start_sign_in(b, correlation, call_timeout=60)
            # Half cancel right behind the call (the Cancel may overtake it), half a little later.
            if n % 2:
                time.sleep((n % 8) * 0.02)
            try:
                b.call("Cancel", "s", (correlation,))
            except dbus.exceptions.DBusException:
                pass  # its sign-in was refused Busy: Cancel finds none (InvalidArgument, after 1 s)
            name, _ = call.reply()
            outcome = "token" if name is None else name.removeprefix(ERROR_PREFIX)
            with lock:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
        finally:
            b.close()

    def churn():
        browser.set("ignore")
        outcomes = {}
        threads = [threading.Thread(target=client, args=(n, outcomes)) for n in range(64)]
        began = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert not any(t.is_alive() for t in threads), "a sign-in call never came back"
        elapsed = time.monotonic() - began
        assert set(outcomes) <= {"Cancelled", "Busy"} and sum(outcomes.values()) == 64, outcomes
        assert outcomes.get("Cancelled", 0) >= 4, outcomes
        browser.set("allow")
        b = Broker()
        assert b.sign_in()["account"]["id"] == account
        b.close()
        return elapsed, outcomes

    churn()
    high_water = settled_memory(daemon, baseline)
    elapsed, outcomes = churn()
    under_load = victim.stop()
    after = settled_memory(daemon, high_water)
    assert high_water - baseline <= HIGH_WATER_KIB, f"the first round left {high_water - baseline} KiB"
    assert after - high_water <= MEMORY_SLACK_KIB, f"memory grew from {high_water} to {after} KiB"
    report({"fault": "64 clients starting and cancelling sign-ins", "outcomes": outcomes,
            "all_done_s": round(elapsed, 2), "victim": under_load, "memory_kib": after - high_water,
            "high_water_kib": high_water - baseline})


def test_a_client_that_never_reads_its_replies(daemon, warmed, path):
    """One connection sends 20,000 calls and reads none of the replies (the bus holds them for it,
    or drops it). Invariants: the daemon is never stuck writing to it, a well-behaved caller is
    served throughout, and memory comes back within 1 MiB once it is gone."""
    account, baseline = warmed
    victim = Victim(account)
    address, suffix = path
    sock = dbus_wire.connect(address)
    body = empty_silent_body("", account)
    batch = b"".join(dbus_wire.message(serial, "AcquireTokenSilent", body, "sassa{sv}") for serial in range(2, 1002))
    sent = 0
    sock.settimeout(5)
    try:
        for _ in range(20):
            sock.sendall(batch)
            sent += 1000
    except (socket.timeout, OSError):
        pass  # the bus (or tesserad, on its own socket) stopped reading from it, or dropped it: both fine
    time.sleep(1)
    assert daemon.running
    under_load = victim.stop()
    sock.close()
    after = settled_memory(daemon, baseline)
    assert after - baseline <= MEMORY_SLACK_KIB, f"memory grew from {baseline} to {after} KiB"
    report({"fault": "a client that never reads its replies" + suffix, "calls_sent": sent, "victim": under_load,
            "memory_kib": after - baseline})


def test_messages_at_the_bus_size_limit(daemon, warmed, path):
    """Four callers each send a message just under the bus's 128 MiB limit (a silent call whose
    client id is that long). Invariants: each is refused with InvalidArgument (never a dropped bus
    connection: sd-bus's limit is the same 128 MiB), the daemon stays up and serves a well-behaved
    caller meanwhile, and memory comes back within 1 MiB."""
    account, baseline = warmed
    victim = Victim(account)
    overhead = 1024
    client = "x" * (BUS_MESSAGE_LIMIT - overhead)
    body = empty_silent_body(client, account)
    message = dbus_wire.message(2, "AcquireTokenSilent", body, "sassa{sv}")
    assert BUS_MESSAGE_LIMIT - 2 * overhead < len(message) <= BUS_MESSAGE_LIMIT
    replies = []
    address, suffix = path
    began = time.monotonic()
    for _ in range(4):
        sock = dbus_wire.connect(address)
        sock.settimeout(120)
        sock.sendall(message)
        mtype, fields, reply = dbus_wire.read_message(sock)
        while mtype == 4:
            mtype, fields, reply = dbus_wire.read_message(sock)
        replies.append(fields.get(4))
        sock.close()
    elapsed = time.monotonic() - began
    del message, body, client
    under_load = victim.stop()
    assert daemon.running
    assert replies == [ERROR_PREFIX + "InvalidArgument"] * 4, replies
    after = settled_memory(daemon, baseline)
    assert after - baseline <= MEMORY_SLACK_KIB, f"memory grew from {baseline} to {after} KiB"
    report({"fault": "messages at the bus's size limit" + suffix, "message_mib": 128, "messages": 4,
            "answered_s": round(elapsed, 2), "victim": under_load, "memory_kib": after - baseline})
