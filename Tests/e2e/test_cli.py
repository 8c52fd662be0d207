"""The tessera command line: output and exit codes (tessera(1))."""
import json

from conftest import run_cli


def test_help():
    proc = run_cli("--help", check_rc=0)
    assert "login" in proc.stdout and "token" in proc.stdout


def test_token_accounts_status(broker):
    no_account = run_cli("token")
    assert no_account.returncode == 5, no_account.stderr  # NoSuchAccount
    assert no_account.stdout == "" and "login" in no_account.stderr

    signed_in = broker.sign_in()
    token = run_cli("token", check_rc=0)
    assert token.stdout == signed_in["access_token"] + "\n"  # the bare token, one line

    by_name = run_cli("token", "--account", "alice", check_rc=0)
    assert by_name.stdout.strip() == signed_in["access_token"]

    other = run_cli("token", "--client-id", "tessera-other")
    assert other.returncode == 4, other.stderr  # InteractionRequired
    assert other.stdout == "" and "tessera login" in other.stderr

    accounts = json.loads(run_cli("accounts", "--json", check_rc=0).stdout)
    assert isinstance(accounts, list) and [a["username"] for a in accounts] == ["alice"]
    assert accounts[0]["id"] == signed_in["account"]["id"]

    status = json.loads(run_cli("status", "--json", check_rc=0).stdout)
    assert status["version"] == broker.version()
    assert status["running"] is True
    assert [a["username"] for a in status["accounts"]] == ["alice"]


def test_errors_map_to_exit_codes(broker):
    bad = run_cli("token", "--authority", "https://evil.example/t")
    assert bad.returncode == 6 and "UntrustedAuthority" in bad.stderr
    unknown = run_cli("token", "--account", "nobody")
    assert unknown.returncode == 5


def test_broker_not_running(daemon):
    daemon.stop()
    proc = run_cli("token")
    assert proc.returncode == 14, proc.stderr
    assert "not running" in proc.stderr
    assert run_cli("status").returncode == 14
