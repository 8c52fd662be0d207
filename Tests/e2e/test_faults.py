"""Fault injection (issue 12), part 1: SIGKILL of tesserad while a refresh with refresh-token
rotation and reuse protection is at the test IdP, with and without the IdP's grace period.

Each round forces a refresh, kills tesserad a random moment later, looks at where the kill fell
(before the IdP rotated the token, inside the exchange: rotated but not stored, or after the new
token was stored; the kills are spread over the time a forced refresh takes), restarts tesserad and checks the invariants:

- the account is still signed in (listed; no account is half-deleted; no keyring item is orphaned);
- unless the kill fell inside the exchange with no grace period, a silent call succeeds with at
  most one refresh;
- when the kill did cost the refresh token, the account is in AttentionNeeded at once, before any
  caller asks (tesserad's refresh journal makes the restart check it first).

Part 2: SIGKILL while a sign-in completes and while a sign-out runs. After each restart the
account is either wholly there (a silent call works) or wholly gone (no stored item of it), and
no item is orphaned.

Both parts run against each store (issue 23): the session's Secret Service (gnome-keyring), and
the file store (config.toml `store = "file"`, a directory and key of the test's own), whose records
the test opens with the key (Tests/lib/tessera_file_store.py) and checks with the same code. On
the file store a kill must also leave no damaged record: every record opens, none is set aside.

Rounds: $TESSERA_FAULT_ROUNDS (20, the short round the test command runs; `scripts/faults` runs
100). With $TESSERA_FAULT_REPORT set, each variant's figures are appended there as a JSON line
(scripts/faults turns them into FAULTS.md)."""
import json
import os
import random
import sqlite3
import subprocess
import threading
import time

import pytest

from conftest import IDP_DIR, REPO, Broker, wait_until
from tessera_file_store import FileStoreView
from test_attention import attention_needed

ROUNDS = int(os.environ.get("TESSERA_FAULT_ROUNDS", "20"))
STORES = ["secret-service", "file"]
SEED = int(os.environ.get("TESSERA_FAULT_SEED", "12"))
REPORT = os.environ.get("TESSERA_FAULT_REPORT")


def report(summary):
    """Prints a fault's figures and, with $TESSERA_FAULT_REPORT set, appends them there as a JSON
    line (scripts/faults turns them into FAULTS.md)."""
    print(json.dumps(summary))
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps(summary) + "\n")


def idp_env(path):
    values = {}
    with open(path) as f:
        for line in f:
            if line.startswith("export "):
                key, _, value = line[len("export "):].strip().partition("=")
                values[key] = value.strip("'")
    return values


@pytest.fixture(scope="module")
def grace_idp(tmp_path_factory):
    """A second test IdP whose rotated refresh tokens stay valid for 5 s."""
    directory = tmp_path_factory.mktemp("idp-grace")
    env = dict(os.environ, TESSERA_IDP_GRACE_SECONDS="5")
    env.pop("TESSERA_IDP_PORT", None)
    subprocess.run([os.path.join(REPO, "scripts", "idp"), "start", str(directory)], env=env, check=True,
                   capture_output=True, timeout=120)
    yield idp_env(directory / "idp.env")
    subprocess.run([os.path.join(REPO, "scripts", "idp"), "stop", str(directory)], capture_output=True, timeout=60)


def newest_refresh_token(db_path, user="alice", client_id="tessera-test"):
    """(id, token) of the newest refresh token the IdP issued to this user and client."""
    conn = sqlite3.connect(db_path, timeout=20)
    try:
        row = conn.execute(
            "SELECT r.id, r.token FROM oauth2_provider_refreshtoken r"
            " JOIN oauth2_provider_application a ON a.id = r.application_id"
            " JOIN auth_user u ON u.id = r.user_id"
            " WHERE a.client_id = ? AND u.username = ? ORDER BY r.id DESC LIMIT 1", (client_id, user)).fetchone()
        return row or (0, None)
    finally:
        conn.close()


def stored_refresh_tokens(keyring, client_id="tessera-test", account_id=None):
    return [json.loads(secret)["secret"] for _, attributes, secret in keyring.tessera_items(secrets=True)
            if attributes.get("kind") == "refresh_token" and attributes.get("client_id") == client_id
            and account_id in (None, attributes.get("account_id"))]


def orphans(keyring):
    """Items whose account is not stored: what a half-done sign-in or sign-out would leave."""
    items = keyring.item_attributes()
    accounts = {a["account_id"] for a in items if a.get("kind") == "account"}
    return [a for a in items if a.get("account_id") not in (None, "*") and a["account_id"] not in accounts]


class KeyringCrashes:
    """gnome-keyring (Debian 12's 42.1, and upstream still: gnome-keyring #190, #196, #199) now and
    then aborts when a client it is setting a session up with has vanished: a SIGKILLed tesserad,
    here. That is a crash of the keyring, not of Tessera, and a desktop's service manager starts
    the keyring again. So does this: `call` is run; when it fails because the keyring is gone, the
    keyring is started again (unlocked, as a login would; it keeps its items on disk) and `call`
    repeated until Tessera answers from it again, without a restart of tesserad. Each crash is
    counted for the report."""

    def __init__(self, keyring):
        self.keyring = keyring
        self.count = 0

    def survive(self, call):
        import dbus
        from test_faults_keyring import keyring_pid, start_keyring_unlocked  # it imports this module
        try:
            return call()
        except dbus.exceptions.DBusException:
            if keyring_pid() is not None:
                raise
        self.count += 1
        start_keyring_unlocked(self.keyring)
        outcome = []

        def answered():
            try:
                outcome.append(call())
                return True
            except dbus.exceptions.DBusException:
                return False

        wait_until(answered, timeout=30, interval=0.5, what="Tessera to use the restarted keyring")
        return outcome[0]


class NoCrashes:
    """The file store: no keyring in the way, so nothing to survive."""
    count = 0

    def survive(self, call):
        return call()


def store_under_test(store, tmp_path, keyring):
    """(tesserad's extra environment, the view of what it stores, crash handling) for a store:
    the session's keyring (gnome-keyring may abort under a killed client: KeyringCrashes), or a
    file store of the test's own (XDG_STATE_HOME, and XDG_CONFIG_HOME for its key, under
    tmp_path), seen through FileStoreView with the keyring helper's interface."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    if store == "secret-service":
        return env, keyring, KeyringCrashes(keyring)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    env["CREDENTIALS_DIRECTORY"] = str(tmp_path / "no-credentials")  # never a credential for the key
    view = FileStoreView(tmp_path / "state" / "tessera" / "store", tmp_path / "config" / "tessera" / "store.key")
    return env, view, NoCrashes()


def damaged(items):
    """Records of the file store that do not open or were set aside (the keyring has none)."""
    return items.damaged() if isinstance(items, FileStoreView) else []


def kill_rounds(daemon, keyring, db_path, grace, state_dir, crashes):
    rng = random.Random(SEED + grace)
    account = Broker().sign_in()["account"]["id"]
    # How long a forced refresh takes from a new connection, as the rounds call it: kills are
    # spread over that, so some land inside the exchange.
    spans = []
    for _ in range(5):
        began = time.monotonic()
        Broker().silent(force_refresh=True)
        spans.append(time.monotonic() - began)
    span = sorted(spans)[len(spans) // 2] * 1.2
    rounds = []
    for number in range(ROUNDS):
        assert daemon.running
        before_id, _ = newest_refresh_token(db_path)

        def force_refresh():
            try:
                Broker().silent(force_refresh=True)
            except Exception:  # noqa: BLE001 (the daemon is killed under it)
                pass

        caller = threading.Thread(target=force_refresh)
        caller.start()
        delay = rng.uniform(0, span)
        time.sleep(delay)
        ended = daemon.proc.poll()
        assert ended is None, f"tesserad ended by itself (status {ended}) before the kill:\n{daemon.log()[-3000:]}"
        daemon.proc.kill()
        daemon.proc.wait()
        daemon.proc = None
        caller.join(30)
        # The IdP finishes a request whose client was killed: let it, before looking at its tokens.
        time.sleep(0.3)
        newest_id, newest = newest_refresh_token(db_path)
        stored = crashes.survive(lambda: stored_refresh_tokens(keyring))
        torn = isinstance(keyring, FileStoreView) and bool(keyring.leftovers())
        assert damaged(keyring) == [], f"round {number}: a kill damaged a stored record: {damaged(keyring)}"
        if newest_id == before_id:
            phase = "before the exchange"
        elif newest in stored:
            phase = "after the store"
        else:
            phase = "inside the exchange"
        journaled = sorted(os.listdir(state_dir)) if os.path.isdir(state_dir) else []

        wait_until(lambda: not daemon.has_owner(), what="the killed daemon's name to be released")
        started = time.monotonic()
        daemon.start()
        # The restart checks the interrupted refresh itself: wait for its note to go, without calling.
        wait_until(lambda: not os.listdir(state_dir), timeout=30, what="the restart to check the interrupted refresh")
        reported_after = time.monotonic() - started
        attention = attention_needed()
        lost = account in attention

        evidence = (f"round {number} ({phase}, kill {delay * 1000:.1f} ms after the call, grace {grace} s):"
                    f" attention {attention}, journal at kill {journaled}\n{daemon.log()[-2500:]}")
        b = Broker()
        accounts = crashes.survive(lambda: [a["id"] for a in b.accounts()])
        assert accounts == [account], "the account must stay signed in: " + evidence
        assert crashes.survive(lambda: orphans(keyring)) == [], \
            "no stored item may be left without its account: " + evidence
        assert damaged(keyring) == [], "every stored record opens: " + evidence
        assert len(crashes.survive(lambda: stored_refresh_tokens(keyring))) == 1, \
            "one refresh token per client and account: " + evidence
        if lost:
            assert grace == 0 and phase == "inside the exchange", \
                "a refresh token may be lost only inside the exchange, without a grace period: " + evidence
            b.sign_in(account_id=account)  # what the loss costs the user: one sign-in
        else:
            refreshes_before = newest_refresh_token(db_path)[0]
            assert b.silent()["access_token"], evidence
            assert newest_refresh_token(db_path)[0] - refreshes_before <= 1, "at most one refresh: " + evidence
        rounds.append({"phase": phase, "lost": lost, "delay_ms": round(delay * 1000, 1),
                       "journaled": bool(journaled), "check_s": round(reported_after, 3), "torn_write": torn})
        b.close()
    return rounds


def summarize(name, store, grace, rounds):
    phases = {}
    for r in rounds:
        phases.setdefault(r["phase"], {"rounds": 0, "lost": 0})
        phases[r["phase"]]["rounds"] += 1
        phases[r["phase"]]["lost"] += int(r["lost"])
    summary = {"fault": name, "store": store, "grace_s": grace, "rounds": len(rounds),
               "lost": sum(r["lost"] for r in rounds),
               "phases": phases, "worst_check_s": max(r["check_s"] for r in rounds),
               "median_check_s": sorted(r["check_s"] for r in rounds)[len(rounds) // 2]}
    if store == "file":  # kills that fell inside a write: a temporary file left beside the records
        summary["torn_writes"] = sum(r["torn_write"] for r in rounds)
    return summary


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("grace", [0, 5])
def test_sigkill_during_refreshes_loses_nothing_outside_the_exchange(start_daemon, write_config, tmp_path, grace,
                                                                     store, keyring, request):
    env, items, crashes = store_under_test(store, tmp_path, keyring)
    if grace:
        idp = request.getfixturevalue("grace_idp")
        config = write_config(store=store, default_authority=idp["TESSERA_IDP_AUTHORITY"],
                              trusted_authorities=[idp["TESSERA_IDP_URL"]], ca_file=idp["TESSERA_IDP_CA"])
        env["TESSERA_IDP_CA"] = idp["TESSERA_IDP_CA"]
        db_path = os.path.join(idp["TESSERA_IDP_DIR"], "db.sqlite3")
    else:
        config = write_config(store=store)
        db_path = os.path.join(IDP_DIR, "db.sqlite3")
    daemon = start_daemon(config, extra_env=env)
    rounds = kill_rounds(daemon, items, db_path, grace, str(tmp_path / "state" / "tessera" / "refreshing"), crashes)
    summary = summarize("SIGKILL during a forced refresh", store, grace, rounds)
    if store == "secret-service":
        summary["keyring_crashes"] = crashes.count
    else:
        assert keyring.item_paths() == [], "the file store's daemon wrote nothing to the Secret Service"
    report(summary)
    if grace:
        assert summary["lost"] == 0, summary
    assert summary["phases"].get("inside the exchange", {"lost": 0})["lost"] == summary["lost"], summary


def kill_at_random(daemon, action, delay):
    """Runs `action` on a new connection, SIGKILLs tesserad `delay` seconds later, waits for the
    action's thread, and lets the killed daemon's name go."""
    def run():
        try:
            action(Broker())
        except Exception:  # noqa: BLE001 (the daemon is killed under it)
            pass
    caller = threading.Thread(target=run)
    caller.start()
    time.sleep(delay)
    # A daemon that died by itself (a crash under load) must not pass for one this test killed.
    ended = daemon.proc.poll()
    assert ended is None, f"tesserad ended by itself (status {ended}) before the kill:\n{daemon.log()[-3000:]}"
    daemon.proc.kill()
    daemon.proc.wait()
    daemon.proc = None
    caller.join(60)
    wait_until(lambda: not daemon.has_owner(), what="the killed daemon's name to be released")


def settle_after_restart(daemon, keyring):
    """Restarts tesserad and lets it load the keyring (a call does) and finish its clean-up writes;
    returns the accounts it lists."""
    daemon.start()
    b = Broker()
    listed = [a["username"] for a in b.accounts()]
    wait_until(lambda: orphans(keyring) == [], timeout=10, what="the clean-up of items without their account")
    return b, listed


@pytest.mark.parametrize("store", STORES)
def test_sigkill_during_sign_ins_and_sign_outs_leaves_accounts_whole(start_daemon, write_config, tmp_path, store,
                                                                     keyring):
    env, items, _ = store_under_test(store, tmp_path, keyring)
    daemon = start_daemon(write_config(store=store), extra_env=env)
    rng = random.Random(SEED)
    alice = Broker().sign_in()["account"]["id"]  # alice stays signed in throughout: nothing may touch her

    def sign_in_bob(b):
        return b.sign_in(user="bob")

    def sign_out_bob(b):
        bob = [a["id"] for a in b.accounts() if a["username"] == "bob"]
        b.sign_out(bob[0])

    # Each round runs on a daemon just restarted (no discovery or keys cached yet): measured so.
    sign_in_spans, sign_out_spans = [], []
    for _ in range(3):
        daemon.restart()
        began = time.monotonic()
        sign_in_bob(Broker())
        sign_in_spans.append(time.monotonic() - began)
        daemon.restart()
        began = time.monotonic()
        sign_out_bob(Broker())
        sign_out_spans.append(time.monotonic() - began)
    sign_in_span, sign_out_span = sorted(sign_in_spans)[1], sorted(sign_out_spans)[1]
    outcomes = {"sign-in": {"whole": 0, "none": 0}, "sign-out": {"whole": 0, "none": 0}}
    for number in range(ROUNDS):
        for kind in ("sign-in", "sign-out"):
            b = Broker()
            present = any(a["username"] == "bob" for a in b.accounts())
            if kind == "sign-in" and present:
                sign_out_bob(b)
            if kind == "sign-out" and not present:
                b.sign_in(user="bob")
            b.close()
            delay = rng.uniform(0, (sign_in_span if kind == "sign-in" else sign_out_span) * 1.2)
            kill_at_random(daemon, sign_in_bob if kind == "sign-in" else sign_out_bob, delay)
            b, listed = settle_after_restart(daemon, items)
            evidence = f"round {number} ({kind}, kill {delay * 1000:.1f} ms in): listed {listed}\n{daemon.log()[-2500:]}"
            assert "alice" in listed, "the other account is untouched: " + evidence
            assert b.silent(account_id=alice)["access_token"], evidence
            assert damaged(items) == [], "every stored record opens: " + evidence
            bob_items = [a for a in items.item_attributes() if a.get("kind") == "account"
                         and any(x["username"] == "bob" and x["id"] == a["account_id"] for x in b.accounts())]
            if "bob" in listed:
                bob = next(a for a in b.accounts() if a["username"] == "bob")
                assert b.silent(account_id=bob["id"])["access_token"], "a listed account works: " + evidence
                assert bob_items, evidence
                outcomes[kind]["whole"] += 1
            else:
                assert len({a.get("account_id") for a in items.item_attributes() if a.get("account_id")}) == 1, \
                    "nothing of a gone account is left: " + evidence
                outcomes[kind]["none"] += 1
            b.close()
    if store == "file":
        assert keyring.item_paths() == [], "the file store's daemon wrote nothing to the Secret Service"
    summary = {"fault": "SIGKILL during sign-ins and sign-outs", "store": store, "rounds": ROUNDS, "outcomes": outcomes,
               "sign_in_ms": round(sign_in_span * 1000), "sign_out_ms": round(sign_out_span * 1000),
               # Restarts that found items of a missing account and finished the job.
               "cleanups": daemon.log().count("Removing what an interrupted sign-out or sign-in left")}
    report(summary)


def test_sigterm_while_a_request_runs_on_its_thread_exits_cleanly(start_daemon, write_config, tmp_path):
    """SIGTERM while an HTTP request is still running on its thread (here: libcurl parsing a 15 MiB
    ca_file, about two seconds of OpenSSL work, for a sign-in's discovery request). tesserad must
    leave with status 0: exit(3) would run OpenSSL's atexit clean-up under the request and crash
    the daemon on its way out (SIGSEGV in libcrypto, seen in this suite's runs)."""
    from conftest import session_config
    with open(session_config()["ca_file"]) as f:
        pem = f.read()
    big = tmp_path / "big-ca.pem"
    big.write_text(pem * ((15 << 20) // len(pem)))
    config = write_config(ca_file=str(big))
    rng = random.Random(23)
    for round_ in range(3):
        daemon = start_daemon(config)
        caller = threading.Thread(target=lambda: _ignore_errors(lambda: Broker().acquire(client_id="tessera-test")))
        caller.start()
        time.sleep(rng.uniform(0.3, 1.2))
        rc = daemon.stop()
        caller.join(30)
        log = daemon.log()
        assert rc == 0 and "Program crashed" not in log, f"round {round_}: status {rc}\n{log[-3000:]}"


def _ignore_errors(call):
    try:
        call()
    except Exception:  # noqa: BLE001 (the daemon stops under it)
        pass
