"""Storage without a desktop keyring (issue 23): config.toml's `store`.

- A session with no Secret Service at all (a bus of its own that can start nothing): `store =
  "auto"` picks the file store, a device-code sign-in survives a restart of tesserad with no new
  sign-in and no request to the IdP, and the store holds no token the IdP issued in plaintext.
- A wrong key and a truncated record each give their documented error (docs/storage.md), and the
  other accounts stay. So does a store directory made unusable (writable by others, another
  user's, unreadable): a named StoreUnavailable, and everything is there again once it is fixed.
  (The fault suite's SIGKILL rounds run on the file store too: test_faults.py.)
- `store = "memory"` writes nothing: no file, no keyring item."""
import json
import os
import subprocess

import pytest

from conftest import ENVIRONMENT, TESSERA, Async, Broker, expect_error, run_cli, wait_until
from tessera_file_store import FileStoreView, record_name
from test_faults_keyring import PrivateSession

DEVICE_CLIENT = "tessera-device"


@pytest.fixture
def no_keyring(tmp_path, browser):
    """A session bus that can start no service at all, so no Secret Service; private XDG
    directories for the store and its key."""
    session = PrivateSession(tmp_path)
    session.env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    session.env["TESSERA_TEST_BROWSER_FILE"] = browser.path
    session.env.pop("CREDENTIALS_DIRECTORY", None)
    yield session
    session.close()


def status(env):
    proc = subprocess.run([TESSERA, "status", "--json"], capture_output=True, text=True, env=env, timeout=30,
                          stdin=subprocess.DEVNULL)
    return proc.returncode, json.loads(proc.stdout)


def device_sign_in(broker, idp, user):
    since = idp.last_device_grant()
    call = Async(broker.acquire, DEVICE_CLIENT, flow="device_code", timeout=60)
    codes = wait_until(lambda: idp.pending_user_codes(since), timeout=20, what="a pending device code")
    idp.approve_device(codes.pop(), "--user", user)
    result = call.result(60)
    assert result["account"]["username"] == user
    return result


def files_under(*roots):
    found = {}
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    found[path] = f.read()
    return found


def issued_tokens(idp):
    return ([row[0] for row in idp.query("SELECT token FROM oauth2_provider_accesstoken")]
            + [row[0] for row in idp.query("SELECT token FROM oauth2_provider_refreshtoken")])


def test_auto_uses_the_file_store_without_a_secret_service_and_keeps_sign_ins_sealed(
        no_keyring, write_config, idp, tmp_path):
    s = no_keyring
    config = write_config(store="auto")
    store_dir = str(tmp_path / "state" / "tessera" / "store")
    key_path = str(tmp_path / "config" / "tessera" / "store.key")
    log = str(tmp_path / "first.log")
    d = s.daemon(config, log).start()
    b = Broker(s.connection())
    try:
        rc, report = status(s.env)
        assert rc == 0, report
        assert report["store"] == "ok" and report["store_kind"] == "file", report
        assert report["store_path"] == store_dir and report["store_key"] == key_path, report
        assert "Using the file store" in open(log).read(), "the choice is logged"

        alice = device_sign_in(b, idp, "alice")
        bob = device_sign_in(b, idp, "bob")
        assert os.stat(store_dir).st_mode & 0o777 == 0o700
        assert os.stat(key_path).st_mode & 0o777 == 0o600
        records = [n for n in os.listdir(store_dir) if n.endswith(".item")]
        assert len(records) >= 4, records  # two accounts, their refresh and access tokens
        assert all(os.stat(os.path.join(store_dir, n)).st_mode & 0o777 == 0o600 for n in records)

        # Restarted: the tokens come from the store, with no sign-in and no request to the IdP.
        d.close()
        d = s.daemon(config, str(tmp_path / "second.log")).start()
        mark = idp.mark()
        for account in (alice, bob):
            token = b.silent(DEVICE_CLIENT, account_id=account["account"]["id"])
            assert token["access_token"] == account["access_token"]
        assert idp.requests(mark) == [], "served from the file store alone"
        assert "Using the file store" in open(str(tmp_path / "second.log")).read()

        # No token the IdP issued is in any file tesserad wrote, in any encoding we'd see.
        tokens = issued_tokens(idp)
        assert alice["access_token"] in tokens, "the IdP's tables hold the tokens it issued"
        written = files_under(str(tmp_path / "state"), str(tmp_path / "config"))
        assert any(p.startswith(store_dir) for p in written)
        for path, content in written.items():
            for token in tokens:
                assert token.encode() not in content, f"{path} holds a token in plaintext"
            assert b"alice" not in content and ENVIRONMENT.encode() not in content, path

        # A wrong key: a StoreUnavailable naming the key file; nothing deleted or overwritten.
        d.close()
        with open(key_path, "rb") as f:
            key = f.read()
        before = files_under(store_dir)
        with open(key_path, "wb") as f:
            f.write(os.urandom(32))
        d = s.daemon(config, str(tmp_path / "third.log")).start()
        message = expect_error("StoreUnavailable", b.accounts)
        assert key_path in message and "not the key" in message and "nothing was deleted" in message, message
        rc, report = status(s.env)
        assert rc == 11 and report["store"] == "unavailable" and key_path in report["store_message"], report
        human = subprocess.run([TESSERA, "status"], capture_output=True, text=True, env=s.env, timeout=30)
        assert f"cannot read the file store {store_dir}:" in human.stdout, human.stdout
        assert files_under(store_dir) == before, "the store is as it was"
        # The right key back: the next call finds everything, with no restart.
        with open(key_path, "wb") as f:
            f.write(key)
        assert {a["id"] for a in b.accounts()} == {alice["account"]["id"], bob["account"]["id"]}

        # A truncated record (bob's account): set aside as .corrupt and named; alice is intact.
        d.close()
        bob_record = record_name(key, {"tessera_schema": "1", "kind": "account",
                                       "account_id": bob["account"]["id"], "environment": ENVIRONMENT})
        path = os.path.join(store_dir, bob_record)
        assert os.path.exists(path), "the test computes the record's name as the store does"
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        log = str(tmp_path / "fourth.log")
        d = s.daemon(config, log).start()
        mark = idp.mark()
        assert [a["id"] for a in b.accounts()] == [alice["account"]["id"]]
        assert b.silent(DEVICE_CLIENT, account_id=alice["account"]["id"])["access_token"] == alice["access_token"]
        assert not any(r["path"] == idp.token_path and r.get("grant_type") != "refresh_token"
                       for r in idp.requests(mark)), "alice needs no sign-in"
        assert os.path.exists(path + ".corrupt") and not os.path.exists(path)
        assert f"{bob_record} could not be opened" in open(log).read()
        rc, report = status(s.env)
        assert rc == 0 and report["store"] == "ok", report
        assert any(bob_record + ".corrupt" in note for note in report["store_notes"]), report
    finally:
        b.close()
        d.close()


def test_an_unusable_store_directory_is_named_and_loses_nothing(start_daemon, write_config, tmp_path):
    store_dir = tmp_path / "state" / "tessera" / "store"
    items = FileStoreView(store_dir, tmp_path / "config" / "tessera" / "store.key")
    # Root reads and writes any directory: as root (CI), tesserad runs without the capabilities
    # that let it (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so an unreadable one is refused to it
    # as to any user.
    wrapper = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []
    d = start_daemon(write_config(store="file"), wrapper=wrapper, extra_env={
        "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "CREDENTIALS_DIRECTORY": str(tmp_path / "no-credentials")})
    b = Broker()
    try:
        alice = b.sign_in("alice")["account"]["id"]
        before = items.tessera_items(secrets=True)
        assert {a["kind"] for _, a, _ in before} >= {"account", "refresh_token", "access_token"}, before
        # (mode, owner, what the error says). A directory of another user's, or one others can
        # write, is refused by what it is; an unreadable one because it cannot be read.
        damages = [(0o777, None, "writable by other users"), (0o700, 65534, "belongs to another user"),
                   (0o000, None, "Cannot read the file store's directory")]
        for mode, owner, says in damages:
            os.chmod(store_dir, mode)
            if owner is not None:
                os.chown(store_dir, owner, -1)
            try:
                message = expect_error("StoreUnavailable", b.sign_in, "bob")
                assert str(store_dir) in message and says in message, message
                report = json.loads(run_cli("status", "--json", check_rc=11).stdout)
                assert report["store"] == "unavailable" and says in report["store_message"], report
            finally:
                if owner is not None:
                    os.chown(store_dir, os.geteuid(), -1)
                os.chmod(store_dir, 0o700)
            # Fixed: everything is there, with no restart; nothing was written, deleted or set aside.
            assert [a["id"] for a in b.accounts()] == [alice]
            assert b.silent(account_id=alice)["access_token"]
            assert items.damaged() == [], says
        assert sorted(items.tessera_items(secrets=True)) == sorted(before), "the store is as it was"
        d.restart()
        assert [a["id"] for a in b.accounts()] == [alice]
        assert b.silent(account_id=alice)["access_token"]
    finally:
        b.close()


def test_memory_store_writes_nothing(start_daemon, write_config, keyring, tmp_path):
    state, config_home = tmp_path / "state", tmp_path / "config"
    d = start_daemon(write_config(store="memory"),
                     extra_env={"XDG_STATE_HOME": str(state), "XDG_CONFIG_HOME": str(config_home)})
    b = Broker()
    try:
        signed_in = b.sign_in("alice")
        assert b.silent(account_id=signed_in["account"]["id"])["access_token"] == signed_in["access_token"]
        report = json.loads(run_cli("status", "--json", check_rc=0).stdout)
        assert report["store_kind"] == "memory" and "store_path" not in report, report
        assert "a restart of tesserad needs a new sign-in" in run_cli("status", check_rc=0).stdout
        assert keyring.item_paths() == [], "nothing in the keyring"
        assert files_under(str(state), str(config_home)) == {}, "no file written"
        assert not os.path.exists(state / "tessera" / "store")
        d.restart()
        assert b.accounts() == [], "a restart forgets everything"
    finally:
        b.close()


def test_the_test_sessions_keyring_store_is_shown(daemon):
    report = json.loads(run_cli("status", "--json", check_rc=0).stdout)
    assert report["store_kind"] == "secret-service" and report["store"] == "ok", report
    assert "Store: the Secret Service" in run_cli("status", check_rc=0).stdout
