"""`tessera store migrate --to file|secret-service` (issue 23): two accounts signed in on the
Secret Service move to the file store with every item kept byte for byte (attributes and
secrets), the keyring keeps no Tessera item, silent tokens need no sign-in and no request to the
IdP, a restart with store = "auto" finds them in the file store; and back to the Secret Service.
A move the configuration or the stores do not allow is refused with what to do, and moves nothing.
A move interrupted while copying whose target is locked at the next start waits (the source, which
holds every item, serves) and is finished at the start after the unlock.
(SIGKILL in the middle of moves: test_faults_store_move.py.)"""
import json
import subprocess

from conftest import TESSERA, Broker
from tessera_file_store import FileStoreView
from tessera_keyring import LOGIN_COLLECTION


def own_file_store(tmp_path):
    """tesserad's extra environment for a file store (and key) of the test's own, and its view."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "CREDENTIALS_DIRECTORY": str(tmp_path / "no-credentials")}
    view = FileStoreView(tmp_path / "state" / "tessera" / "store", tmp_path / "config" / "tessera" / "store.key")
    return env, view


def contents(store):
    """Every Tessera item of a store (the keyring, or a FileStoreView) as (attributes, secret),
    without libsecret's own `xdg:schema` attribute."""
    out = []
    for _, attributes, secret in store.tessera_items(secrets=True):
        attributes = {k: v for k, v in attributes.items() if k != "xdg:schema"}
        out.append((tuple(sorted(attributes.items())), secret))
    return sorted(out)


def migrate(*args):
    return subprocess.run([TESSERA, "store", "migrate", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def store_kind():
    proc = subprocess.run([TESSERA, "status", "--json"], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    return json.loads(proc.stdout)["store_kind"]


def issued_access_tokens(idp):
    return idp.query("SELECT COUNT(*) FROM oauth2_provider_accesstoken")[0][0]


def test_migrate_to_the_file_store_and_back_keeps_every_item_and_needs_no_sign_in(
        start_daemon, write_config, tmp_path, keyring, idp):
    env, files = own_file_store(tmp_path)
    daemon = start_daemon(write_config(store="auto"), extra_env=env)
    b = Broker()
    alice = b.sign_in("alice")["account"]["id"]
    bob = b.sign_in("bob")["account"]["id"]
    b.close()
    assert store_kind() == "secret-service"
    before = contents(keyring)
    assert len(before) >= 6 and files.tessera_items() == []
    issued = issued_access_tokens(idp)

    proc = migrate("--to", "file")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"Moved {len(before)} items from the secret-service store to the file store; "
                                   "tesserad uses the file store now."), proc.stdout
    assert keyring.tessera_items() == [], "the keyring keeps no Tessera item"
    assert contents(files) == before, "every item, attributes and secret, is in the file store"
    assert store_kind() == "file"
    b = Broker()
    for account in (alice, bob):
        assert b.silent(account_id=account)["access_token"]
    b.close()
    assert issued_access_tokens(idp) == issued, "no request to the IdP, no sign-in"

    # A restart with store = "auto" finds them in the file store.
    daemon.restart()
    assert "Using the file store: the file store holds records" in daemon.log()
    assert store_kind() == "file"
    b = Broker()
    for account in (alice, bob):
        assert b.silent(account_id=account)["access_token"]
    b.close()
    assert keyring.tessera_items() == []

    # And back, with --json.
    proc = migrate("--to", "secret-service", "--json")
    assert proc.returncode == 0, proc.stderr
    moved = json.loads(proc.stdout)
    assert moved == {"from": "file", "to": "secret-service", "items": len(before)}, moved
    assert files.tessera_items() == [] and files.damaged() == []
    assert contents(keyring) == before
    daemon.restart()
    assert store_kind() == "secret-service"
    b = Broker()
    for account in (alice, bob):
        assert b.silent(account_id=account)["access_token"]
    b.close()
    assert issued_access_tokens(idp) == issued
    assert "store move" not in daemon.log(), "no move was left to finish"


def test_a_move_that_is_not_allowed_says_what_to_do_and_moves_nothing(start_daemon, write_config, tmp_path, keyring):
    env, files = own_file_store(tmp_path)
    # config.toml names the store: the next start would open it, so the move is refused.
    daemon = start_daemon(write_config(store="secret-service"), extra_env=env)
    Broker().sign_in("alice")
    before = contents(keyring)
    proc = migrate("--to", "file")
    assert proc.returncode != 0
    assert 'config.toml says store = "secret-service": set it to "file" or "auto" first, then run this again' \
        in proc.stderr, proc.stderr
    # The store in use already.
    proc = migrate("--to", "secret-service")
    assert proc.returncode != 0 and "already" in proc.stderr, proc.stderr
    # Not a store.
    proc = migrate("--to", "memory")
    assert proc.returncode != 0 and "file or secret-service" in proc.stderr, proc.stderr
    assert contents(keyring) == before and files.tessera_items() == []
    daemon.stop()

    # A target that already holds Tessera items of its own (left from an earlier use) is not mixed
    # with these.
    daemon = start_daemon(write_config(store="auto"), extra_env=env)
    assert store_kind() == "secret-service"
    proc = migrate("--to", "file")
    assert proc.returncode == 0, proc.stderr
    assert contents(files) == before
    keyring.create_item({"tessera_schema": "1", "kind": "app_use", "app": "exe:/stale", "account_id": "gone"},
                        '{"accountID":"gone","app":"exe:/stale","firstUsedAt":1}')
    proc = migrate("--to", "secret-service")
    assert proc.returncode != 0, proc.stdout
    assert "already holds 1 of Tessera's items" in proc.stderr and "secret-tool clear" in proc.stderr, proc.stderr
    assert contents(files) == before and len(keyring.tessera_items()) == 1
    assert store_kind() == "file"
    assert Broker().silent()["access_token"]


def interrupted_move_back_to_the_keyring(start_daemon, write_config, tmp_path, keyring, env):
    """alice signed in, everything moved to the file store, then the state a kill while copying
    back to the keyring leaves: the journal, one item copied. Returns (daemon, alice's id, what
    the keyring held first, the journal's path); the daemon is stopped."""
    daemon = start_daemon(write_config(store="auto"), extra_env=env)
    b = Broker()
    alice = b.sign_in("alice")["account"]["id"]
    b.close()
    before = contents(keyring)
    assert migrate("--to", "file").returncode == 0
    daemon.stop()
    journal = tmp_path / "state" / "tessera" / "moving"
    journal.write_text("from=file\nto=secret-service\nphase=copying\n")
    account_item = next(x for x in before if ("kind", "account") in x[0])
    keyring.create_item(dict(account_item[0]), account_item[1], collection=LOGIN_COLLECTION)
    return daemon, alice, before, journal


def test_an_interrupted_move_waits_for_a_locked_target_and_is_finished_at_the_next_start(
        start_daemon, write_config, tmp_path, keyring):
    env, files = own_file_store(tmp_path)
    daemon, alice, before, journal = interrupted_move_back_to_the_keyring(
        start_daemon, write_config, tmp_path, keyring, env)
    keyring.lock()
    daemon.start()
    assert "cannot be finished now; using the file store" in daemon.log()
    assert store_kind() == "file"
    assert Broker().silent(account_id=alice)["access_token"], "the store that holds every item serves"
    assert journal.exists() and contents(files) == before
    daemon.stop()

    keyring.unlock()
    daemon.start()
    assert "Using the secret-service store: a store move (tessera store migrate) was interrupted; finished it now" \
        in daemon.log()
    assert store_kind() == "secret-service"
    assert not journal.exists()
    assert contents(keyring) == before, "each item once, none lost"
    assert files.tessera_items() == []
    assert Broker().silent(account_id=alice)["access_token"]
