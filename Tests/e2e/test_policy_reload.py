"""System-wide policy and reload without restart (issue 26): the administrator's files
(TESSERA_SYSTEM_CONFIG_DIR standing in for /etc/tessera) under the user's config.toml, a key the
administrator locks that the user tries to change, and SIGHUP (what `systemctl --user reload
tessera` sends) while a token is cached and a sign-in waits, with a good file and a broken one."""
import json
import os
import signal

import dbus

from conftest import IDP_URL, Async, Broker, expect_error, run_cli, session_config, toml_value, wait_until

# An authority nobody serves: refused at once on loopback, so a request there fails fast.
NOWHERE = "https://127.0.0.2:1/"


def write_toml(path, values, tail=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()) + tail)
    os.chmod(path, 0o644)
    return path


def status():
    return json.loads(run_cli("status", "--json").stdout)


def reload(daemon):
    """SIGHUP, then wait until tesserad has read the files again: its count of reloads goes up, or
    a new refusal is reported. Returns the configuration's status."""
    before = status()["config"]

    def read_again():
        now = status()["config"]
        return now if now["reloads"] > before["reloads"] or now.get("refused") != before.get("refused") else None

    daemon.proc.send_signal(signal.SIGHUP)
    config = wait_until(read_again, timeout=10, what="tesserad to read its configuration again")
    assert daemon.running, f"tesserad ended on SIGHUP:\n{daemon.log()[-3000:]}"
    return config


def error_name(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except dbus.exceptions.DBusException as e:
        return e.get_dbus_name()
    raise AssertionError("the call succeeded")


def test_a_locked_key_the_user_changes_is_ignored_with_one_warning(tmp_path, start_daemon, browser, monkeypatch):
    system = str(tmp_path / "etc-tessera")
    write_toml(f"{system}/config.toml", {"trusted_authorities": [IDP_URL]},
               '[policy]\nlocked = ["trusted_authorities"]\nallow_forwarding = false\n')
    # The user's file would trust somewhere else instead of the test IdP.
    user = write_toml(str(tmp_path / "config.toml"), dict(session_config(), trusted_authorities=[NOWHERE]))
    monkeypatch.setenv("TESSERA_SYSTEM_CONFIG_DIR", system)
    daemon = start_daemon(config=user, extra_env={"TESSERA_SYSTEM_CONFIG_DIR": system})
    broker = Broker()
    try:
        # The administrator's trust is in force: a sign-in at the test IdP works, NOWHERE is refused.
        broker.sign_in("alice")
        message = expect_error("UntrustedAuthority", broker.silent, authority=NOWHERE)
        assert "trusted_authorities" in message
        warnings = [line for line in daemon.log().splitlines() if "is locked by the administrator's [policy]" in line]
        assert len(warnings) == 1, daemon.log()[-3000:]
        assert f"{user}:" in warnings[0] and "trusted_authorities" in warnings[0]
        assert "warning" in warnings[0].lower()
        # tessera status says so, and which keys are locked.
        config = status()["config"]
        assert config["files"] == [f"{system}/config.toml", user]
        assert config["locked"] == ["trusted_authorities"]
        assert len(config["warnings"]) == 1 and config["warnings"][0].startswith(f"{user}:")
        text = run_cli("status").stdout
        assert "Locked by the administrator's [policy]: trusted_authorities." in text
        assert "warning: " + config["warnings"][0] in text
        # tessera config shows the value in force and where it came from.
        shown = run_cli("config", "--config", user, check_rc=0)
        assert f'trusted_authorities = ["{IDP_URL}"]  # {system}/config.toml:1, locked' in shown.stdout
        assert "is locked by the administrator's [policy]" in shown.stderr
        # The policy's allow_forwarding = false: AddForward is refused, saying why.
        message = expect_error("AccessDenied", broker.call, "AddForward", "sssa{sv}",
                               ("build01", "build01.example.com", "", {}))
        assert "allow_forwarding = false" in message
    finally:
        broker.close()


def test_a_reload_changes_the_log_level_and_trust_keeping_the_cached_token_and_a_waiting_sign_in(
        tmp_path, start_daemon, idp):
    path = str(tmp_path / "config.toml")
    values = dict(session_config(), log_level="info")
    write_toml(path, values)
    daemon = start_daemon(config=path)
    broker, waiting = Broker(), Broker()
    try:
        alice = broker.sign_in("alice")
        alice_id = alice["account"]["id"]
        cached = broker.silent(account_id=alice_id)["access_token"]
        tokens_at_idp = len(idp.tokens())
        expect_error("UntrustedAuthority", broker.silent, authority=NOWHERE)
        broker.accounts()
        assert "GetAccounts succeeded" in daemon.log()
        # A device-code sign-in waits for the user.
        since = idp.last_device_grant()
        sign_in = Async(waiting.acquire, "tessera-device", flow="device_code", timeout=90)
        codes = wait_until(lambda: idp.pending_user_codes(since), timeout=20, what="a pending device code")

        # Reload: log level warning, and NOWHERE trusted too.
        write_toml(path, dict(values, log_level="warning", trusted_authorities=[IDP_URL, NOWHERE]))
        config = reload(daemon)
        mark = len(daemon.log())
        assert config.get("refused") is None and config["at_next_start"] == []
        # The cached token still answers (nothing asked of the IdP) on the same connection.
        assert broker.silent(account_id=alice_id)["access_token"] == cached
        assert len(idp.tokens()) == tokens_at_idp
        # NOWHERE is trusted now: the request is no longer refused for its authority.
        assert not error_name(broker.silent, authority=NOWHERE).endswith(".UntrustedAuthority")
        # Info lines are gone at level warning.
        broker.accounts()
        assert "GetAccounts succeeded" not in daemon.log()[mark:]
        # The waiting sign-in goes on and completes.
        idp.approve_device(codes.pop(), "--user", "bob")
        result = sign_in.result(60)
        assert result["account"]["username"] == "bob"

        # Reload again: the test IdP no longer trusted, level debug. Alice's cached token is not
        # served from a now-untrusted authority; her account stays.
        write_toml(path, dict(values, log_level="debug", trusted_authorities=[NOWHERE]))
        mark = len(daemon.log())
        reload(daemon)
        message = expect_error("UntrustedAuthority", broker.silent, account_id=alice_id)
        assert "no longer trusts" in message or "not trusted" in message
        assert {a["username"] for a in broker.accounts()} == {"alice", "bob"}
        assert "GetAccounts succeeded" in daemon.log()[mark:]
        assert "Reloaded the configuration" in daemon.log()[mark:]
        # `tessera status` (and the desktop app) say why: blocked by the configuration.
        states = {a["username"]: a["state"] for a in status()["accounts"]}
        assert states == {"alice": "blocked_by_policy", "bob": "blocked_by_policy"}, states
        text = run_cli("status").stdout
        assert "alice (" in text and "blocked: the configuration no longer trusts" in text, text
        # And back: the same cached token, still nothing asked of the IdP.
        write_toml(path, values)
        reload(daemon)
        assert broker.silent(account_id=alice_id)["access_token"] == cached
        assert {a["state"] for a in status()["accounts"]} == {"ok"}
    finally:
        broker.close()
        waiting.close()


def test_a_broken_file_on_reload_is_refused_whole_and_status_says_why(tmp_path, start_daemon, monkeypatch):
    path = str(tmp_path / "config.toml")
    values = dict(session_config(), log_level="info")
    write_toml(path, values)
    system = str(tmp_path / "etc-tessera")
    daemon = start_daemon(config=path, extra_env={"TESSERA_SYSTEM_CONFIG_DIR": system})
    broker = Broker()
    try:
        alice = broker.sign_in("alice")
        cached = broker.silent(account_id=alice["account"]["id"])["access_token"]
        # A good key and a broken one in the same file: neither is taken.
        write_toml(path, dict(values, log_level="warning"), "log_levl = 'debug'\n")
        config = reload(daemon)
        refused = config["refused"]
        assert refused["problems"] == [f"{path}:{len(values) + 1}: key 'log_levl': unknown key; did you mean 'log_level'?"]
        assert daemon.running
        assert broker.silent(account_id=alice["account"]["id"])["access_token"] == cached
        broker.accounts()
        mark = len(daemon.log())
        broker.accounts()
        assert "GetAccounts succeeded" in daemon.log()[mark:], "log_level changed although the file was refused"
        assert "Refused to reload the configuration" in daemon.log()
        text = run_cli("status").stdout
        assert "was refused, and the configuration above stays in force" in text
        assert f"{path}:{len(values) + 1}: key 'log_levl'" in text
        # An administrator's file that breaks its own policy is refused whole as well.
        write_toml(path, values)
        write_toml(f"{system}/config.d/50-site.toml", {"store": "memory"}, '[policy]\nallowed_stores = ["file"]\n')
        refused = reload(daemon)["refused"]
        assert refused["problems"][0].startswith(f"{system}/config.d/50-site.toml:1: key 'store': 'memory' is not among")
        # Fixed: the next reload succeeds and the refusal is gone from status.
        os.remove(f"{system}/config.d/50-site.toml")
        config = reload(daemon)
        assert config.get("refused") is None
        assert "was refused" not in run_cli("status").stdout
    finally:
        broker.close()


def test_an_interrupted_move_to_a_store_the_policy_now_forbids_is_taken_back(start_daemon, write_config, tmp_path,
                                                                            keyring):
    """A `tessera store migrate` killed while copying to the keyring, and meanwhile the administrator
    allowed only the file store: the next start does not finish the move into the keyring; it
    deletes the copies there, and the file store, which holds every item, serves."""
    from test_store_migrate import contents, interrupted_move_back_to_the_keyring, migrate, own_file_store, store_kind
    env, files = own_file_store(tmp_path)
    system = str(tmp_path / "etc-tessera")
    env["TESSERA_SYSTEM_CONFIG_DIR"] = system
    daemon, alice, before, journal = interrupted_move_back_to_the_keyring(
        start_daemon, write_config, tmp_path, keyring, env)
    write_toml(f"{system}/config.toml", {}, '[policy]\nallowed_stores = ["file"]\n')
    daemon.start()
    assert "allowed_stores no longer allow that store; took the move back (1 items)" in daemon.log(), daemon.log()
    assert store_kind() == "file"
    assert not journal.exists()
    assert keyring.tessera_items() == [], "no Tessera item left in a store the policy forbids"
    assert contents(files) == before
    broker = Broker()
    try:
        assert broker.silent(account_id=alice)["access_token"]
        # And `tessera store migrate` refuses the forbidden store, saying why.
        proc = migrate("--to", "secret-service")
        assert proc.returncode == 12 and "does not allow the secret-service store" in proc.stderr, proc.stderr
    finally:
        broker.close()
