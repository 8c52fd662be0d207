"""The tessera command line: output and exit codes (tessera(1))."""
import json
import os
import subprocess

from conftest import TESSERA, TESSERAD, run_cli, wait_until


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


# tesserad's own command line


def run_tesserad(*args, timeout=20):
    return subprocess.run([TESSERAD, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_tesserad_refuses_a_bad_config(tmp_path, daemon):
    daemon.stop()
    bad = tmp_path / "bad.toml"
    bad.write_text('default_client_id = "tessera-test"\ndefault_scope = ["read"]\n')
    proc = run_tesserad("--config", str(bad))
    assert proc.returncode == 78, proc.stderr
    assert "default_scope" in proc.stderr and ":2" in proc.stderr, proc.stderr
    proc = run_tesserad("--config", str(tmp_path / "missing.toml"))
    assert proc.returncode == 78 and "missing.toml" in proc.stderr, proc.stderr
    assert not daemon.has_owner()


def test_tesserad_without_a_session_bus_serves_its_socket_alone(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)  # no bus socket there
    log_path = tmp_path / "tesserad.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([TESSERAD], stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env)
    try:
        # Logged once the broker knows it has no bus (GetStatus says so from then on).
        wait_until(lambda: "serving its own socket alone" in log_path.read_text(errors="replace")
                   or proc.poll() is not None, what="tesserad to serve its socket")
        assert proc.poll() is None, log_path.read_text(errors="replace")
        out = subprocess.run([TESSERA, "status", "--json"], capture_output=True, text=True, timeout=20, env=env)
        report = json.loads(out.stdout)
        assert report["running"] and report["connection"] == "socket", report
        assert report["microsoft_broker"] == "no_session_bus", report
        assert report["session_bus"] == "missing" and "session bus" in report["session_bus_message"], report
        # A client that has a session bus itself still says what tesserad lacks, not what it sees.
        with_bus = dict(os.environ, TESSERA_SOCKET=str(tmp_path / "tessera" / "bus"))
        out = subprocess.run([TESSERA, "status", "--json"], capture_output=True, text=True, timeout=20, env=with_bus)
        report = json.loads(out.stdout)
        assert report["connection"] == "socket" and report["microsoft_broker"] == "no_session_bus", report
        human = subprocess.run([TESSERA, "status"], capture_output=True, text=True, timeout=20, env=with_bus).stdout
        assert "tesserad has no session bus: Could not connect to the session bus" in human, human
    finally:
        proc.terminate()
        proc.wait(20)
    log = log_path.read_text(errors="replace")
    assert proc.returncode == 0, log
    assert "serving its own socket alone: there is no session bus" in log, log


def test_a_client_without_the_bus_tesserad_has_says_so(daemon, tmp_path):
    """tesserad has a session bus; a program reaching it over its socket from where there is none
    (an SSH login to the desktop machine) is told that, not that tesserad has none."""
    socket_path = os.path.join(os.environ["XDG_RUNTIME_DIR"], "tessera", "bus")
    env = {k: v for k, v in os.environ.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    env.update(XDG_RUNTIME_DIR=str(tmp_path), TESSERA_SOCKET=socket_path)
    out = subprocess.run([TESSERA, "status", "--json"], capture_output=True, text=True, timeout=20, env=env)
    report = json.loads(out.stdout)
    assert report["connection"] == "socket" and report["session_bus"] == "connected", report
    assert report["microsoft_broker"] == "not_reachable_here", report
    human = subprocess.run([TESSERA, "status"], capture_output=True, text=True, timeout=20, env=env).stdout
    assert "tesserad has a session bus, but this program cannot reach it" in human, human


def test_tesserad_with_neither_a_session_bus_nor_a_socket_says_so(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)  # no bus socket there
    env["TESSERA_SOCKET"] = "/proc/no-such-dir/bus"  # cannot be made
    proc = subprocess.run([TESSERAD], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL, env=env)
    assert proc.returncode == 1
    assert "session bus" in proc.stderr and "/proc/no-such-dir" in proc.stderr, proc.stderr


def test_a_second_tesserad_does_not_take_over(daemon, broker):
    proc = run_tesserad("--config", daemon.config)
    assert proc.returncode != 0
    assert "already" in proc.stderr, proc.stderr
    assert daemon.running and broker.accounts() == []
