"""Fault injection (issue 12), part 3: the identity provider misbehaving.

A fault-injecting HTTPS reverse proxy the test owns (fault_proxy.py) stands between tesserad and
the test IdP: tesserad's authority is the proxy, which forwards to the IdP and, when told, fails
in the IdP's place (connection refused, reset mid-body, a black hole, a slow trickle, a certificate
no CA vouches for, 500/502/503/429 with and without Retry-After, garbage, a 10 MB body) or changes
the IdP's real answer (fields dropped, an id_token signed with a key the IdP never published).
Nothing in tesserad knows: the faults come from outside.

Alice signs in through the proxy, then a fault is injected and she asks for a token (a forced
refresh; for discovery and signing-key faults on a restarted daemon, which fetches them again).
Every case checks the invariants of docs/errors.md and docs/token-cache.md:

- the call ends in the documented D-Bus error, with a helpful message that quotes no token and
  not the IdP's body;
- it is answered within the documented time: each request to the IdP has 10 s in all, 5 s to
  connect (plus a margin for a loaded machine), so a dead or slow IdP cannot hang a caller;
- the account is kept: still listed, its keyring items unchanged (its refresh token included;
  when the IdP did rotate it in an answer tesserad refused, the keyring holds the new one),
  not in AttentionNeeded (an IdP outage is no reason to ask the user to sign in), tesserad still
  running, no token in its log;
- once the fault is gone a silent call works again: no refresh token was lost on the way;
- a token endpoint that answered 429 or 503 with Retry-After gets no request before the wait is
  over, and the calls in between fail at once, saying how long to wait.

With $TESSERA_FAULT_REPORT set, each case appends its figures (error, time to answer, account
kept, requests to the token endpoint) as a JSON line; scripts/lib/faults_report.py renders them
for FAULTS.md."""
import hashlib
import json
import os
import time

import dbus
import pytest

from conftest import ERROR_PREFIX, IDP_DIR, IDP_URL, TENANT, Async, Broker, expect_error
from fault_proxy import start_proxy
from test_faults import newest_refresh_token, stored_refresh_tokens
from test_attention import attention_needed, status

IDP_DB = os.path.join(IDP_DIR, "db.sqlite3")

REPORT = os.environ.get("TESSERA_FAULT_REPORT")
# docs/errors.md, "Transport failures": each request has 10 s in all, 5 s to connect.
REQUEST_TIMEOUT = 10.0
CONNECT_TIMEOUT = 5.0
# Slack for a loaded 2-core machine (D-Bus round trips, the keyring, a concurrent build).
MARGIN = 4.0

# Answers tesserad reads but refuses for who they say the user is (an id_token failing validation):
# the refresh token they carry is not trusted with the account, and is revoked. The IdP has rotated
# the old one away, so the user signs in again (the documented cost of an IdP that answers so).
IDENTITY_REFUSALS = {"id_token signed with an unknown key"}


@pytest.fixture
def proxy():
    p = start_proxy(IDP_URL, TENANT, IDP_DIR)
    yield p
    p.close()


class Alice:
    """Alice signed in through the proxy, and what the checks look at."""

    def __init__(self, daemon, broker, account_id, proxy, keyring, idp):
        self.daemon = daemon
        self.broker = broker
        self.account = account_id
        self.proxy = proxy
        self.keyring = keyring
        self.idp = idp
        self.outcomes = []

    def items(self):
        """Every Tessera keyring item: its attributes and a digest of its secret (the refresh
        token's included; digests, so a failing check never prints a token)."""
        return sorted((json.dumps(attributes, sort_keys=True), hashlib.sha256(secret.encode()).hexdigest()[:12])
                      for _, attributes, secret in self.keyring.tessera_items(secrets=True))

    def evidence(self, proxy_mark, idp_mark):
        requests = "\n".join(
            f"  {r['method']} {r['path']} endpoint={r['endpoint']} fault={r['fault']} status={r['status']}"
            f" forwarded={r['forwarded']}" for r in self.proxy.requests(proxy_mark))
        idp_requests = "\n".join(f"  {r['method']} {r['path']} {r['status']} {r.get('grant_type') or ''}"
                                 for r in self.idp.requests(idp_mark))
        items = "\n".join(f"  {json.dumps(attributes, sort_keys=True)}"
                          for attributes in self.keyring.item_attributes())
        return (f"\nrequests at the proxy:\n{requests or '  none'}\nrequests at the IdP:\n{idp_requests or '  none'}"
                f"\nkeyring items:\n{items or '  none'}\ntesserad's log (end):\n{self.daemon.log()[-3000:]}")

    def inject(self, fault, endpoint, error, within, call=None, refresh=True, fault_name=None, **params):
        """Injects the fault, makes the call (a forced refresh unless `call` is given; `refresh`:
        whether the call refreshes alice's token), and checks the invariants above but the last
        one; returns the error message."""
        call = call or (lambda: self.broker.silent(force_refresh=True))
        name = fault_name or fault
        before = self.items()
        proxy_mark, idp_mark = self.proxy.mark(), self.idp.mark()
        self.proxy.fault(fault, endpoint, **params)
        started = time.monotonic()
        got, message = None, ""
        try:
            call()
        except dbus.exceptions.DBusException as e:
            got, message = e.get_dbus_name().removeprefix(ERROR_PREFIX), e.get_dbus_message() or ""
        elapsed = time.monotonic() - started
        listed = [a["id"] for a in self.broker.accounts()]
        after = self.items()
        # Kept: still listed, with the same keyring items (a refresh token the IdP rotated may have
        # replaced the old one: the checks below say which it must be).
        kept = listed == [self.account] and [a for a, _ in after] == [a for a, _ in before]
        token_requests = len(self.proxy.requests(proxy_mark, "token"))
        outcome = {"section": "idp", "fault": name, "endpoint": endpoint or "any (a connection fault)",
                   "error": got or "none: a token", "expected": error or "none: a token", "message": message,
                   "answered_s": round(elapsed, 2), "account_kept": kept, "token_requests": token_requests,
                   "works_again": None}
        self.outcomes.append(outcome)
        evidence = f"\nfault {name} at {endpoint}: {got}: {message!r} after {elapsed:.2f} s" + \
            self.evidence(proxy_mark, idp_mark)

        assert got == error, f"the documented error is {error}" + evidence
        if error:
            assert len(message) >= 20 and " " in message, "a helpful message" + evidence
            assert len(message) < 2000, "the message does not echo the IdP's body" + evidence
        assert elapsed <= within, f"answered within {within:.0f} s (the documented timeout and a margin)" + evidence
        assert listed == [self.account], "the account is still signed in" + evidence
        rotated = bool(self.idp.token_posts(idp_mark, grant_type="refresh_token", status=200))
        if error is None:
            assert [a for a, _ in after] == [a for a, _ in before], "the same keyring items" + evidence
        elif rotated and name in IDENTITY_REFUSALS:
            assert after == before, "a refused identity's refresh token is not stored" + evidence
            revoked = lambda: self.idp.requests(idp_mark) and any(  # noqa: E731
                r["method"] == "POST" and "/o/revoke" in r["path"] for r in self.idp.requests(idp_mark))
            deadline = time.monotonic() + 10
            while not revoked() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert revoked(), "the refused answer's refresh token is revoked at the IdP" + evidence
        elif rotated:
            # The IdP rotated the token and the answer was refused: the new token is kept (the old
            # one is dead), everything else is unchanged.
            assert [a for a, _ in after] == [a for a, _ in before], "the same keyring items" + evidence
            assert [x for x in after if '"refresh_token"' not in x[0]] == \
                [x for x in before if '"refresh_token"' not in x[0]], "nothing but the refresh token changed" + evidence
            assert stored_refresh_tokens(self.keyring) == [newest_refresh_token(IDP_DB)[1]], \
                "the keyring holds the refresh token the IdP rotated to" + evidence
        else:
            assert after == before, "its keyring items, refresh token included, are unchanged" + evidence
        assert self.account not in attention_needed(), "an IdP fault is no reason to ask for a sign-in" + evidence
        if error and refresh:
            # What `tessera status` tells the user: the IdP's trouble, not a sign-in to do.
            (account,) = status()["accounts"]
            assert account.get("last_error", {}).get("code") == error, f"status: {account}" + evidence
            assert account["state"] == ("idp_unreachable" if error == "Network" else "ok"), f"status: {account}" + evidence
        assert self.daemon.running, "tesserad lives on" + evidence
        log = self.daemon.log()
        leaked = [s for s in self.proxy.secrets if len(s) >= 8 and (s in message or s in log)]
        assert not leaked, f"no token in the error or the log ({len(leaked)} found)" + evidence
        return message

    def works_again(self, case=None):
        """The fault is gone: a forced refresh reaches the IdP and succeeds, so the refresh token
        survived the fault."""
        self.proxy.clear()
        proxy_mark, idp_mark = self.proxy.mark(), self.idp.mark()
        try:
            result = self.broker.silent(force_refresh=True)
        except dbus.exceptions.DBusException as e:
            self.settle(False)
            raise AssertionError(f"after the fault, a silent call fails: {e.get_dbus_name()}: {e.get_dbus_message()}"
                                 + self.evidence(proxy_mark, idp_mark)) from None
        self.settle(True)
        assert result["account"]["id"] == self.account
        assert len(self.proxy.requests(proxy_mark, "token")) == 1, "the refresh went to the IdP" + \
            self.evidence(proxy_mark, idp_mark)
        return result

    def needs_sign_in(self):
        """The fault is gone, but the refresh token did not survive it (by design): the next call
        says InteractionRequired, the account is still listed, and one sign-in brings it back."""
        self.proxy.clear()
        with pytest.raises(dbus.exceptions.DBusException) as info:
            self.broker.silent(force_refresh=True)
        assert info.value.get_dbus_name() == ERROR_PREFIX + "InteractionRequired", info.value.get_dbus_message()
        assert [a["id"] for a in self.broker.accounts()] == [self.account]
        self.settle(False)
        assert self.broker.sign_in()["account"]["id"] == self.account
        assert self.broker.silent(force_refresh=True)["account"]["id"] == self.account

    def settle(self, works):
        for outcome in self.outcomes:
            if outcome["works_again"] is None:
                outcome["works_again"] = works

    def restart(self):
        """A new tesserad process: the discovery document and signing keys are fetched again."""
        self.daemon.restart()
        self.broker.close()
        self.broker = Broker()
        assert [a["id"] for a in self.broker.accounts()] == [self.account]


@pytest.fixture
def alice(proxy, start_daemon, write_config, keyring, idp):
    # Only the proxy is trusted: an endpoint the proxy failed to rewrite would be refused.
    config = write_config(default_authority=proxy.authority, trusted_authorities=[proxy.url])
    daemon = start_daemon(config, log_level="trace")
    broker = Broker()
    account = broker.sign_in()["account"]["id"]
    assert proxy.requests(endpoint="token"), "the sign-in went through the proxy"
    a = Alice(daemon, broker, account, proxy, keyring, idp)
    yield a
    proxy.clear()
    broker.close()
    if REPORT:
        with open(REPORT, "a") as f:
            for outcome in a.outcomes:
                f.write(json.dumps(outcome) + "\n")


# ----------------------------------------------------------------------------------------------
# The token endpoint cannot be reached, or does not answer in time


@pytest.mark.parametrize("fault, endpoint, case, within, says", [
    # Nothing listens: refused at once.
    pytest.param("refuse", None, "connection refused", CONNECT_TIMEOUT + MARGIN, "Cannot connect", id="refused"),
    # The TCP connection opens, then nothing, not even TLS: the 5 s connect timeout ends it.
    pytest.param("black_hole", None, "black hole (no TLS answer)", CONNECT_TIMEOUT + MARGIN,
                 "did not answer in time", id="black-hole"),
    # A certificate no trusted CA signed: refused, with the hint for a private CA.
    pytest.param("wrong_cert", None, "certificate no CA signed", CONNECT_TIMEOUT + MARGIN, "ca_file",
                 id="wrong-certificate"),
    # The answer starts, then the connection is reset halfway through the body.
    pytest.param("reset", "token", "reset mid-body", REQUEST_TIMEOUT + MARGIN, "127.0.0.1", id="reset-mid-body"),
    # The request is read and never answered: the 10 s request timeout ends it.
    pytest.param("no_answer", "token", "no answer", REQUEST_TIMEOUT + MARGIN, "did not answer in time",
                 id="no-answer"),
    # One byte a second: the request timeout covers the whole answer, not each read.
    pytest.param("trickle", "token", "trickle (1 byte/s)", REQUEST_TIMEOUT + MARGIN, "did not answer in time",
                 id="trickle"),
])
def test_unreachable_or_silent_token_endpoint(alice, fault, endpoint, case, within, says):
    """Network, within the connect or request timeout; the refresh is not retried on its own
    (a POST with a refresh token may have been served), and the account is untouched. While a
    refresh waits on a silent IdP, other callers are not held up: accounts are listed and a
    cached token is served (the README: a slow IdP never blocks another caller)."""
    others_waited = []

    def refresh_while_others_call():
        pending = Async(alice.broker.silent, force_refresh=True)
        time.sleep(1)  # the refresh is waiting on the IdP now
        other = Broker()
        try:
            started = time.monotonic()
            other.accounts()
            assert other.silent()["access_token"]
            others_waited.append(time.monotonic() - started)
        finally:
            other.close()
        pending.result(timeout=within + 5)

    slow = fault in ("black_hole", "no_answer", "trickle")
    mark = alice.proxy.mark()
    message = alice.inject(fault, endpoint, "Network", within, fault_name=case,
                           call=refresh_while_others_call if slow else None)
    assert says in message, message
    assert len(alice.proxy.requests(mark, "token")) <= 1, "one token request at most, no retries"
    if slow:
        # Not a speed test: held up would mean waiting for the IdP's timeout (5 or 10 s).
        assert others_waited and others_waited[0] < CONNECT_TIMEOUT / 2, f"other callers waited {others_waited} s"
    alice.works_again()


# ----------------------------------------------------------------------------------------------
# The token endpoint is unavailable: 5xx and 429, with and without Retry-After


@pytest.mark.parametrize("status, retry_after", [(500, None), (502, None), (503, None), (429, None), (500, 2),
                                                 (502, 2)], ids=lambda v: str(v))
def test_unavailable_token_endpoint(alice, status, retry_after):
    """Network, naming the status and quoting the IdP's wait when it sent one. Only 429 and 503 make
    tesserad pause (docs/token-cache.md): after a 5xx without Retry-After, or a 500/502 with one,
    the next call goes to the IdP at once."""
    name = f"HTTP {status}" + (f", Retry-After: {retry_after}" if retry_after else "")
    message = alice.inject("status", "token", "Network", REQUEST_TIMEOUT + MARGIN, fault_name=name,
                           status=status, retry_after=retry_after)
    assert f"HTTP {status}" in message, message
    if retry_after:
        assert f"wait {retry_after} s" in message, message
    alice.works_again()


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured(alice, status):
    """After 429/503 with Retry-After: 3, the calls inside the window fail at once with Network
    naming the seconds left, and no request reaches the token endpoint before the 3 s are over;
    the first call after the window goes through."""
    wait = 3
    message = alice.inject("status", "token", "Network", REQUEST_TIMEOUT + MARGIN,
                           fault_name=f"HTTP {status}, Retry-After: {wait}", status=status, retry_after=wait, count=1)
    assert f"wait {wait} s" in message, message
    (answered,) = alice.proxy.requests(endpoint="token")[-1:]
    assert answered["status"] == status
    not_before = answered["t"] + wait
    alice.proxy.clear()  # the IdP is fine again, but asked for a pause

    mark = alice.proxy.mark()
    started = time.monotonic()
    inside = expect_error("Network", alice.broker.silent, force_refresh=True)
    assert time.monotonic() - started < 2, "inside the window a call fails at once"
    assert "retry in" in inside and any(f"{n} s" in inside for n in range(1, wait + 1)), inside
    assert alice.proxy.requests(mark, "token") == [], "no request inside the window"
    assert alice.account not in attention_needed()

    time.sleep(max(0.0, not_before - time.monotonic()) + 0.2)
    assert alice.broker.silent(force_refresh=True)["access_token"]
    sent = alice.proxy.requests(mark, "token")
    assert len(sent) == 1 and sent[0]["t"] >= not_before - 0.05, \
        f"one request, after the window ({[round(r['t'] - not_before, 3) for r in sent]} s from its end)"
    alice.settle(True)


# ----------------------------------------------------------------------------------------------
# The token endpoint answers 200 with something unusable


@pytest.mark.parametrize("fault, case, params, says", [
    pytest.param("garbage", "garbage JSON", {}, "not JSON", id="garbage"),
    pytest.param("huge", "a 10 MB body", {"size": 10 * 1024 * 1024}, "larger than", id="10MB"),
    pytest.param("drop_fields", "no access_token", {"fields": ["access_token"]}, "access_token",
                 id="no-access-token"),
    pytest.param("foreign_key", "id_token signed with an unknown key", {}, "signature", id="unknown-key"),
])
def test_unusable_token_response(alice, fault, case, params, says):
    """Provider (docs/errors.md: not JSON, no access token, over 1 MiB, an invalid id token); the
    account and its refresh token are kept, and a silent call works once the IdP answers well."""
    message = alice.inject(fault, "token", "Provider", REQUEST_TIMEOUT + MARGIN, fault_name=case, **params)
    assert says in message, message
    if case in IDENTITY_REFUSALS:
        alice.needs_sign_in()
    else:
        alice.works_again(case)


@pytest.mark.parametrize("field", ["token_type", "expires_in", "id_token"])
def test_token_response_without_an_optional_field(alice, field):
    """A refresh answer without token_type (Bearer assumed), expires_in (3600 s assumed, as
    documented) or id_token (a refresh needs none) is still a token."""
    result = {}
    alice.inject("drop_fields", "token", None, REQUEST_TIMEOUT + MARGIN, fault_name=f"no {field}",
                 call=lambda: result.update(alice.broker.silent(force_refresh=True)), fields=[field])
    assert result["token_type"] == "Bearer"
    if field == "expires_in":
        assert abs(result["expires_on"] - (time.time() + 3600)) < 120, "3600 s assumed"
    else:
        assert result["expires_on"] > time.time() + 60
    alice.works_again()


def test_sign_in_answer_without_an_id_token_or_with_a_foreign_key(alice):
    """A sign-in whose answer has no id_token, or one signed with a key the IdP never published,
    ends in Provider and signs nobody in; the account already there is untouched."""
    def sign_in_bob():
        alice.broker.sign_in(user="bob")

    alice.inject("drop_fields", "token", "Provider", 60, call=sign_in_bob, refresh=False,
                 fault_name="sign-in without id_token", fields=["id_token"])
    alice.inject("foreign_key", "token", "Provider", 60, call=sign_in_bob, refresh=False,
                 fault_name="sign-in with an id_token signed with an unknown key")
    assert [a["username"] for a in alice.broker.accounts()] == ["alice"]
    alice.works_again()


# ----------------------------------------------------------------------------------------------
# Discovery and signing keys (fetched again by a restarted daemon)


@pytest.mark.parametrize("fault, case, params, error, says", [
    pytest.param("status", "HTTP 503", {"status": 503}, "Network", "unavailable", id="503"),
    pytest.param("status", "HTTP 404", {"status": 404}, "Provider", "discovery", id="404"),
    pytest.param("garbage", "garbage JSON", {}, "Provider", "not valid OpenID Connect metadata", id="garbage"),
    pytest.param("no_answer", "no answer", {}, "Network", "did not answer in time", id="no-answer"),
])
def test_discovery_failures(alice, fault, case, params, error, says):
    """Without its discovery document tesserad cannot refresh: the documented error, before the
    refresh token is sent anywhere, so it is kept."""
    alice.restart()
    message = alice.inject(fault, "discovery", error, REQUEST_TIMEOUT + MARGIN, fault_name=case, **params)
    assert says in message, message
    assert alice.outcomes[-1]["token_requests"] == 0, "the refresh token stayed home"
    alice.works_again()


@pytest.mark.parametrize("fault, case, params, error, says", [
    pytest.param("status", "HTTP 503", {"status": 503}, "Network", "signing keys", id="503"),
    pytest.param("garbage", "garbage JSON", {}, "Provider", "signing keys", id="garbage"),
])
def test_signing_key_failures(alice, fault, case, params, error, says):
    """Signing keys (JWKS) unavailable: Network; unreadable: Provider (docs/errors.md), not "a bad
    signature". The keys check the id_token in the refresh's answer, so they are fetched before the
    refresh token leaves: the IdP never rotates a refresh token into an answer tesserad cannot check."""
    alice.restart()
    message = alice.inject(fault, "jwks", error, REQUEST_TIMEOUT + MARGIN, fault_name=case, **params)
    assert says in message, message
    assert alice.outcomes[-1]["token_requests"] == 0, "the refresh token stayed home"
    alice.works_again()
