"""Fault injection (issue 12), the clock: tesserad's wall clock set back and forward while it
runs (libfaketime, preloaded into tesserad alone and told the offset through a file; the IdP keeps
the true time, as resources do).

What must hold: no token is ever served past its real expiry (the IdP's record of it), no token is
reported with more time left than its lifetime, calls keep succeeding from the first one after
the jump, and the daemon notices the jump (at the first request that reaches the engine, or at its
next maintenance pass, whichever comes first). A suspend, which moves the wall clock and the
boot clock but not the monotonic one, cannot be faked this way: the engine's tests cover it with
their fake clock (TokenEngineTests), and logind's resume signal is covered by test_attention.py."""
import datetime
import os
import sqlite3
import subprocess
import time

import pytest

from conftest import IDP_DIR, Broker, wait_until
from test_faults import report

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
LIFETIME = 3  # tessera-short's access tokens (Tests/idp/idp/lifetimes.py)


def real_expiry(token):
    """When the IdP says this access token expires (Unix seconds, the true clock)."""
    conn = sqlite3.connect(os.path.join(IDP_DIR, "db.sqlite3"), timeout=20)
    try:
        (expires,) = conn.execute("SELECT expires FROM oauth2_provider_accesstoken WHERE token = ?",
                                  (token,)).fetchone()
    finally:
        conn.close()
    when = datetime.datetime.fromisoformat(expires)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


@pytest.fixture
def faked_daemon(start_daemon, tmp_path):
    if not os.path.exists(LIBFAKETIME):
        pytest.fail(f"{LIBFAKETIME} is missing: install Debian's faketime package (scripts/setup does)")
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    daemon = start_daemon(extra_env={
        "LD_PRELOAD": LIBFAKETIME, "FAKETIME_TIMESTAMP_FILE": str(offset), "FAKETIME_NO_CACHE": "1",
        # The wall clock alone: the monotonic and boot clocks keep the true time, as when the
        # clock is set by hand or by NTP.
        "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    return daemon, offset


def check_served(b, offset_s, evidence):
    """A silent call for tessera-short: the token is really valid, and says no more time left than
    it can have."""
    result = b.silent(client_id="tessera-short")
    real_now = time.time()
    expires = real_expiry(result["access_token"])
    assert expires > real_now, f"served {real_now - expires:.1f} s past its real expiry; {evidence()}"
    said_left = result["expires_on"] - (real_now + offset_s)
    assert said_left <= LIFETIME + 1, f"reported {said_left:.0f} s left of a {LIFETIME} s token; {evidence()}"
    return result


def certificate_age():
    """Seconds since the test IdP's TLS certificate became valid (it is made when the session starts)."""
    out = subprocess.run(["openssl", "x509", "-noout", "-startdate", "-in", os.path.join(IDP_DIR, "server.pem")],
                         capture_output=True, text=True, check=True).stdout
    start = datetime.datetime.strptime(out.strip().split("=", 1)[1], "%b %d %H:%M:%S %Y %Z")
    return time.time() - start.replace(tzinfo=datetime.timezone.utc).timestamp()


@pytest.mark.parametrize("jump", [-90, 240])
def test_the_clock_set_back_or_forward(faked_daemon, jump):
    """The wall clock is set by `jump` seconds (beyond the 60 s a jump must exceed; within the
    300 s of skew an id_token may show). Invariants above, checked on every call from the first one
    after the jump, for 10 s and until the daemon has noticed it. Set back, a token cached before would look valid for 90 s more on the new
    clock: it must not be served (tessera-short's tokens live 3 s)."""
    if jump < 0 and certificate_age() < -jump + 30:
        # Set back past the test IdP's certificate's birth, TLS would (rightly) refuse it.
        time.sleep(-jump + 30 - certificate_age())
    daemon, offset = faked_daemon
    b = Broker()
    b.sign_in(client_id="tessera-short")
    check_served(b, 0, lambda: daemon.log()[-2000:])
    # Replaced whole (rename), never truncated in place: libfaketime rereads the file on every call.
    staged = offset.with_suffix(".new")
    staged.write_text(f"{jump:+d}\n")
    staged.replace(offset)
    set_at = time.monotonic()
    # Calls start at once: the first one after the jump must already be right. The daemon notices
    # the jump at the first request the engine sees or at its maintenance pass. Waiting for the
    # pass alone failed by chance once in ~20 long rounds (seed 79: not noticed within 45 s of a
    # 30 s interval), so the test no longer rests on one pass's timing, and what a caller gets is
    # checked from the first moment instead of only after the daemon has caught up.
    noticed_after = None
    calls = 0
    until = set_at + 10
    while time.monotonic() < until or noticed_after is None:
        check_served(b, jump, lambda: daemon.log()[-2000:])
        calls += 1
        if noticed_after is None and "The wall clock was set" in daemon.log():
            noticed_after = time.monotonic() - set_at
        assert time.monotonic() - set_at < 45, (
            f"tesserad did not notice the clock being set within 45 s of calls; {daemon.log()[-3000:]}")
        time.sleep(0.2)
    assert f"direction={'backward' if jump < 0 else 'forward'}" in daemon.log()
    b.close()
    summary = {"fault": "clock set", "jump_s": jump, "noticed_after_s": round(noticed_after, 1), "calls": calls,
               "served_expired": 0}
    report(summary)
