"""Fault injection, the store move (issue 23): SIGKILL of tesserad while `tessera store migrate`
moves the items between the Secret Service (gnome-keyring) and the file store.

Two accounts are signed in with two clients each, and apps get grants, so a move has many items
to carry. Each round moves to the other store, kills tesserad a random moment into the move (the
kills are spread over the time a whole move takes), restarts it (config.toml `store = "auto"`),
and checks:

- every item is in exactly one store: the union of the two stores' items (attributes and secrets,
  byte for byte) is what it was before the move, and no item is in both;
- nothing is lost: that set is the same set as before;
- tesserad uses the store the items are in (`tessera status`), and silent calls for both accounts
  work with no sign-in;
- no file store record is damaged.

Rounds: $TESSERA_FAULT_ROUNDS (default 6 here; `scripts/faults` sets more). With
$TESSERA_FAULT_REPORT set, the figures are appended there as a JSON line."""
import json
import os
import random
import subprocess
import time

from conftest import TESSERA, Broker
from test_faults import KeyringCrashes, kill_at_random, report
from test_store_migrate import contents, own_file_store

ROUNDS = int(os.environ.get("TESSERA_FAULT_ROUNDS", "6"))
SEED = int(os.environ.get("TESSERA_FAULT_SEED", "12"))
GRANTS = 24


def status_kind():
    proc = subprocess.run([TESSERA, "status", "--json"], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    return json.loads(proc.stdout)["store_kind"]


def migrate(to):
    return subprocess.run([TESSERA, "store", "migrate", "--to", to], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_sigkill_during_store_moves_loses_nothing_and_doubles_nothing(start_daemon, write_config, tmp_path, keyring):
    from test_faults_keyring import keyring_pid, start_keyring_unlocked
    env, files = own_file_store(tmp_path)
    daemon = start_daemon(write_config(store="auto"), extra_env=env)
    crashes = KeyringCrashes(keyring)
    b = Broker()
    accounts = []
    for user in ("alice", "bob"):
        accounts.append(b.sign_in(user)["account"]["id"])
        b.sign_in(user, client_id="tessera-other")
    for number in range(GRANTS):
        b.call("Grant", "ssssasas", (f"exe:/usr/bin/app{number}", "tessera-test", "*", "", [], []))
    for account in accounts:
        b.silent(account_id=account)
    b.close()
    before = contents(keyring)
    assert len(before) >= GRANTS + 8, len(before)

    # How long a whole move takes, each way, as the rounds run it.
    spans = []
    for to in ("file", "secret-service", "file", "secret-service"):
        began = time.monotonic()
        proc = migrate(to)
        assert proc.returncode == 0, proc.stderr
        spans.append(time.monotonic() - began)
    span = max(spans) * 1.2
    assert contents(keyring) == before

    rng = random.Random(SEED)
    journal = tmp_path / "state" / "tessera" / "moving"
    outcomes = {"not started": 0, "finished at start, killed while copying": 0,
                "finished at start, killed while deleting": 0, "finished before the kill": 0}
    for number in range(ROUNDS):
        where = status_kind()
        to = "file" if where == "secret-service" else "secret-service"
        delay = rng.uniform(0, span)
        kill_at_random(daemon, lambda _: migrate(to), delay)
        # gnome-keyring may abort under a killed client (see test_faults.KeyringCrashes): a desktop
        # starts it again, so does this.
        if keyring_pid() is None:
            crashes.count += 1
            start_keyring_unlocked(keyring)
        phase = journal.read_text().split("phase=")[-1].strip() if journal.exists() else None
        log_before = daemon.log().count("was interrupted; finished it now")
        daemon.start()
        kind = status_kind()
        finished = daemon.log().count("was interrupted; finished it now") > log_before
        in_keyring = crashes.survive(lambda: contents(keyring))
        in_files = contents(files)
        evidence = (f"round {number} (to {to}, journal {phase}, kill {delay * 1000:.1f} ms in, span {span * 1000:.0f} ms): "
                    f"{len(in_keyring)} in the keyring, {len(in_files)} in the file store, using {kind}\n"
                    f"{daemon.log()[-2500:]}")
        assert not (set(in_keyring) & set(in_files)), "no item is in both stores: " + evidence
        assert sorted(in_keyring + in_files) == before, "nothing lost, nothing doubled: " + evidence
        assert (in_files if kind == "file" else in_keyring) == before, "the store in use holds them all: " + evidence
        assert files.damaged() == [], "every record opens: " + evidence
        assert not journal.exists(), "no move is left: " + evidence
        b = Broker()
        for account in accounts:
            assert b.silent(account_id=account)["access_token"], evidence
        b.close()
        if finished:
            assert phase in ("copying", "deleting"), evidence
            outcomes[f"finished at start, killed while {phase}"] += 1
        elif kind == where:
            outcomes["not started"] += 1
        else:
            outcomes["finished before the kill"] += 1
    report({"fault": "SIGKILL during store moves", "rounds": ROUNDS, "items": len(before),
            "move_ms": round(max(spans) * 1000), "outcomes": outcomes, "keyring_crashes": crashes.count})
