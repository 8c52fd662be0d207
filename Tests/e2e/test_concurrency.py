"""Callers never wait behind each other, and identical refreshes are merged."""
import threading
import time

import dbus

from conftest import ERROR_PREFIX, Async, Broker, PendingCall, options


def test_a_slow_sign_in_never_blocks_other_callers(broker, browser, monitor):
    account_id = broker.sign_in()["account"]["id"]
    browser.set("ignore")  # the next sign-in waits for a redirect that never comes
    slow_caller = Broker()
    try:
        # The slow sign-in's timeout (60 s) is far beyond what the calls below take even on a loaded
        # machine: with 5 s, a wait for it to start and 21 calls on a busy 2-core machine could
        # outlast it, and it ended before the check that it still pends. The waits' bounds (30 s)
        # only end a hang. Sent without waiting, so its caller can cancel it when the calls are
        # done (waiting out 60 s would prove nothing more: test_errors.py tests the timeout).
        slow = PendingCall(slow_caller, "AcquireToken", "sasa{sv}",
                           ("", dbus.Array([], signature="s"), options(correlation_id="slow-1", timeout=60)))
        assert monitor.wait_for(lambda s: s["member"] == "InteractionPending", timeout=30), "sign-in did not start"

        durations = []
        for i in range(20):
            t0 = time.monotonic()
            result = broker.silent(account_id=account_id) if i % 2 else broker.silent()
            durations.append(time.monotonic() - t0)
            assert result["account"]["id"] == account_id
        t0 = time.monotonic()
        assert [a["id"] for a in broker.accounts()] == [account_id]
        durations.append(time.monotonic() - t0)

        # A call on the slow caller's connection reads what has come for it: the sign-in's reply
        # would be there by now.
        slow_caller.version()
        assert not slow.done(), "the interactive sign-in should still be pending"
        # Served while the sign-in pends (checked above), and promptly: a caller held behind the
        # sign-in would wait out its 60 s. The bound is generous for a loaded machine.
        assert max(durations) < 10.0, durations
        slow_caller.call("Cancel", "s", ("slow-1",))
        name, detail = slow.error()
        assert name == ERROR_PREFIX + "Cancelled", (name, detail)
    finally:
        slow_caller.close()


def test_two_interactive_sign_ins_at_once(broker):
    other = Broker()
    try:
        alice = Async(broker.sign_in, "alice")
        bob = Async(other.sign_in, "bob")
        assert alice.result(60)["account"]["username"] == "alice"
        assert bob.result(60)["account"]["username"] == "bob"
    finally:
        other.close()
    assert [a["username"] for a in broker.accounts()] == ["alice", "bob"]


def test_concurrent_silent_calls_share_one_refresh(broker, idp):
    """64 callers, each on its own connection, released together on an expired token: one refresh
    at the IdP (its refresh tokens rotate with reuse protection, so a second one would fail)."""
    signed_in = broker.sign_in(client_id="tessera-short")
    time.sleep(max(0.0, signed_in["expires_on"] + 0.3 - time.time()))  # let the 3 s token expire

    n = 64
    callers = [Broker() for _ in range(n)]
    barrier = threading.Barrier(n)
    mark = idp.mark()

    def call(b):
        barrier.wait()
        return b.silent("tessera-short", min_validity=0)

    try:
        calls = [Async(call, b) for b in callers]
        results = [c.result(60) for c in calls]
    finally:
        for b in callers:
            b.close()
    tokens = {r["access_token"] for r in results}
    assert len(tokens) == 1 and signed_in["access_token"] not in tokens
    assert all(r["account"]["id"] == signed_in["account"]["id"] for r in results)
    assert len({r["correlation_id"] for r in results}) == n, "each caller keeps its own correlation id"
    posts = idp.token_posts(mark)
    assert [(p["grant_type"], p["status"]) for p in posts] == [("refresh_token", 200)], posts
