"""Every failure reaches the caller as the documented org.tessera.Broker1.Error.* name with a
message that says what went wrong and what to do."""
import json
import http.server
import os
import socket
import ssl
import subprocess
import threading
import time

import dbus
import pytest

from conftest import (BIN_DIR, BUS_NAME, IDP_DIR, IDP_URL, OBJECT_PATH, REPO, TESSERA, TESSERAD, Broker,
                      expect_error, run_cli)
from tessera_session import bus_config


def test_wrong_argument_types(broker):
    message = expect_error(
        "InvalidArgument", broker.call, "AcquireTokenSilent", "iassa{sv}",
        (dbus.Int32(42), dbus.Array([], signature="s"), "", dbus.Dictionary({}, signature="sv")))
    assert "AcquireTokenSilent" in message
    expect_error("InvalidArgument", broker.call, "GetAccounts", "s", ("not a dict",))
    expect_error("InvalidArgument", broker.call, "SignOut", "", ())
    # A call without an interface field is checked the same way.
    expect_error(
        "InvalidArgument", broker.conn.call_blocking, BUS_NAME, OBJECT_PATH, None, "GetAccounts", "s", ("not a dict",))


def test_unknown_option_key(broker):
    message = expect_error("InvalidArgument", broker.silent, bogus_option="x")
    assert "bogus_option" in message
    message = expect_error("InvalidArgument", broker.accounts, client_idd="x")
    assert "client_idd" in message
    message = expect_error("InvalidArgument", broker.sign_out, "someone.000000000000", force_refresh=True)
    assert "force_refresh" in message


def test_option_of_wrong_type(broker):
    message = expect_error("InvalidArgument", broker.silent, force_refresh=dbus.String("yes"))
    assert "force_refresh" in message
    message = expect_error("InvalidArgument", broker.silent, min_validity=dbus.Int32(5))
    assert "min_validity" in message
    message = expect_error("InvalidArgument", broker.acquire, timeout=dbus.String("10"))
    assert "timeout" in message


def test_bad_option_values(broker):
    message = expect_error("InvalidArgument", broker.acquire, extra_query={"client_id": "x"})
    assert "client_id" in message
    message = expect_error("InvalidArgument", broker.acquire, prompt="sometimes")
    assert "prompt" in message
    message = expect_error("InvalidArgument", broker.acquire, flow="carrier_pigeon")
    assert "flow" in message
    expect_error("InvalidArgument", broker.acquire, timeout=0)
    expect_error("InvalidArgument", broker.silent, scopes=["read write"])
    expect_error("InvalidArgument", broker.acquire, prompt="none", flow="device_code")


def test_prompt_none_without_a_session_needs_interaction(broker):
    message = expect_error("InteractionRequired", broker.acquire, prompt="none", timeout=30)
    assert "login_required" in message or "interact" in message.lower()
    assert broker.accounts() == []


def test_scopes_rejected_by_the_provider(broker):
    """The contract: InvalidArgument when the provider rejects the scopes, whether it says so on
    the sign-in redirect or at the token endpoint."""
    account_id = broker.sign_in()["account"]["id"]
    message = expect_error("InvalidArgument", broker.silent, scopes=["no-such-scope"], account_id=account_id)
    assert "invalid_scope" in message
    message = expect_error("InvalidArgument", broker.acquire, scopes=["no-such-scope"], timeout=30)
    assert "invalid_scope" in message


def test_untrusted_authority(broker, idp):
    mark = idp.mark()
    message = expect_error("UntrustedAuthority", broker.silent, authority="https://evil.example/tenant")
    assert "evil.example" in message and "trusted_authorities" in message
    # Interactive too: refused before any browser or network traffic.
    expect_error("UntrustedAuthority", broker.acquire, authority="https://evil.example/tenant")
    # A look-alike of the trusted IdP (other port) is not trusted either.
    expect_error("UntrustedAuthority", broker.acquire, authority="https://127.0.0.1:1/tenant")
    assert idp.requests(mark) == []


def test_http_authority(broker):
    message = expect_error("UntrustedAuthority", broker.silent, authority="http://127.0.0.1:1/x")
    assert "http" in message
    expect_error("UntrustedAuthority", broker.acquire, authority="http://127.0.0.1:1/x")


def test_http_loopback_authority_when_allowed(start_daemon, write_config):
    insecure = f"http://127.0.0.1:{closed_port()}"
    start_daemon(write_config(allow_insecure_loopback=True, trusted_authorities=[IDP_URL, insecure]))
    b = Broker()
    try:
        # Allowed now: the broker tries to reach it (and cannot) instead of refusing it.
        expect_error("Network", b.acquire, authority=insecure + "/t")
        # Still only loopback, and only trusted ones.
        expect_error("UntrustedAuthority", b.acquire, authority="http://example.test/t")
        other_port = int(insecure.rsplit(":", 1)[1]) ^ 1
        expect_error("UntrustedAuthority", b.acquire, authority=f"http://127.0.0.1:{other_port}/t")
    finally:
        b.close()


def test_unknown_account(broker):
    broker.sign_in()
    message = expect_error("NoSuchAccount", broker.silent, account_id="nobody.000000000000")
    assert "nobody.000000000000" in message
    expect_error("NoSuchAccount", broker.sign_out, "nobody.000000000000")


def test_no_scopes_and_no_default_scopes(start_daemon, write_config):
    start_daemon(write_config(drop=["default_scopes"]))
    b = Broker()
    try:
        message = expect_error("InvalidArgument", b.silent, "tessera-test", [])
        assert "default_scopes" in message
        expect_error("InvalidArgument", b.acquire, "tessera-test", [])
    finally:
        b.close()


def test_huge_client_id_is_refused_and_the_daemon_lives_on(daemon, broker):
    message = expect_error("InvalidArgument", broker.silent, "x" * 1_000_000)
    assert "client_id" in message
    assert len(message) < 2000, "the message must not echo the huge value"
    expect_error("InvalidArgument", broker.acquire, "y" * 1_000_000, ["read"] * 10)
    assert daemon.running
    assert broker.accounts() == []
    assert broker.version()


def test_locked_keyring(start_daemon, keyring, idp):
    # Something to find once the keyring is unlocked again.
    first = start_daemon()
    b = Broker()
    try:
        account_id = b.sign_in()["account"]["id"]
        first.stop()
        keyring.lock()
        start_daemon()  # it must not touch the keyring before the first request
        message = expect_error("StoreUnavailable", b.accounts)
        assert "lock" in message.lower()
        expect_error("StoreUnavailable", b.silent)
        # `tessera status` says so, and exits 11 (the keyring needs attention).
        locked = json.loads(run_cli("status", "--json", check_rc=11).stdout)
        assert locked["store"] == "unavailable" and "lock" in locked["store_message"].lower()
        assert locked["accounts"] == [] and locked["needs_attention"] is True
        assert "cannot read the keyring" in run_cli("status", check_rc=11).stdout
        keyring.unlock()
        # No restart: the next call loads the store.
        assert [a["id"] for a in b.accounts()] == [account_id]
        mark = idp.mark()
        assert b.silent()["account"]["id"] == account_id
        assert idp.requests(mark) == []
    finally:
        b.close()


def test_keyring_locked_while_the_daemon_runs(daemon, broker, keyring, idp):
    signed_in = broker.sign_in()
    keyring.lock()
    # The cache in memory still serves tokens.
    assert broker.silent()["access_token"] == signed_in["access_token"]
    # A refresh rotates the refresh token at the IdP but cannot be saved: StoreUnavailable, quickly
    # (no hang on a keyring prompt that nobody can answer).
    started = time.monotonic()
    expect_error("StoreUnavailable", broker.silent, force_refresh=True, call_timeout=20)
    assert time.monotonic() - started < 10
    (alice,) = json.loads(run_cli("status", "--json", check_rc=11).stdout)["accounts"]
    assert alice["state"] == "store_locked" and alice["last_error"]["code"] == "StoreUnavailable"
    keyring.unlock()
    # Nothing was lost: the rotated refresh token was kept and is saved now.
    refreshed = broker.silent(force_refresh=True)
    assert refreshed["account"]["id"] == signed_in["account"]["id"]
    daemon.restart()
    mark = idp.mark()
    assert broker.silent()["access_token"] == refreshed["access_token"]
    assert idp.requests(mark) == []


def test_user_denies_consent(broker, browser):
    browser.set("deny")
    message = expect_error("AccessDenied", broker.acquire, "tessera-consent")
    assert "declined" in message.lower() or "denied" in message.lower()
    assert broker.accounts() == []


def test_interactive_timeout(broker, browser):
    browser.set("ignore")
    started = time.monotonic()
    expect_error("TimedOut", broker.acquire, timeout=2)
    assert 1.5 < time.monotonic() - started < 15
    assert broker.accounts() == []


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class GarbageServer:
    """HTTPS on 127.0.0.1 (with the test IdP's certificate) answering every GET with non-JSON."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = b"<html>this is not an OpenID Connect discovery document</html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(IDP_DIR, "server.pem"), os.path.join(IDP_DIR, "server-key.pem"))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def garbage_idp():
    server = GarbageServer()
    yield server
    server.close()


def test_unreachable_and_garbage_identity_providers(start_daemon, write_config, garbage_idp):
    unreachable = f"https://127.0.0.1:{closed_port()}"
    start_daemon(write_config(trusted_authorities=[IDP_URL, unreachable, garbage_idp.url]))
    b = Broker()
    try:
        message = expect_error("Network", b.acquire, authority=unreachable + "/t")
        assert "127.0.0.1" in message
        expect_error("Network", b.acquire, authority=unreachable + "/t", flow="device_code")
        message = expect_error("Provider", b.acquire, authority=garbage_idp.url + "/t")
        assert garbage_idp.url in message or "discovery" in message.lower()
        assert b.accounts() == []
    finally:
        b.close()


# Cancelled (org.tessera.Broker1.Error.Cancelled) is not reachable from outside yet: the daemon
# drops pending calls when it stops, and there is no cancel method. Not tested here.


def test_a_taken_redirect_port_is_a_configuration_error_not_a_bug(start_daemon, write_config):
    """Configuration problems have their own error (and exit status 15), never Internal (13)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        start_daemon(write_config(redirect_port=port))
        b = Broker()
        try:
            message = expect_error("Configuration", b.acquire, timeout=30)
            assert str(port) in message and "redirect_port" in message, message
        finally:
            b.close()
        cli = run_cli("login", "--timeout", "30")
        assert cli.returncode == 15, (cli.returncode, cli.stderr)
        assert "Configuration" in cli.stderr and "redirect_port" in cli.stderr
    finally:
        holder.close()


def test_the_client_checks_options_with_the_brokers_table(daemon):
    """The CLI refuses an option value the broker's table refuses, with the table's message in the
    CLI's words (the flag the user typed), as InvalidArgument (exit 3), the same as the broker would."""
    proc = run_cli("token", "--min-validity", "86401")
    assert proc.returncode == 3, proc.stderr
    assert "--min-validity is 86401" in proc.stderr and "86400" in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------------------------
# config.toml: one rule for every reader (issue 22). A mistake anywhere in the file stops tesserad
# (exit 78); the CLI, finding the broker stopped on it, shows the file's own problem and exits 15.


@pytest.fixture
def activating_bus(tmp_path):
    """A private bus that starts the real tesserad by D-Bus activation (as a session without systemd
    does), with XDG_CONFIG_HOME pointing at a directory of the test's own: returns (env, config
    path) for the CLI, which checks the same file."""
    services = tmp_path / "services"
    services.mkdir()
    template = open(os.path.join(REPO, "dbus", "org.tessera.Broker1.service")).read()
    (services / "org.tessera.Broker1.service").write_text(template.replace("@bindir@", BIN_DIR))
    (tmp_path / "bus.conf").write_text(bus_config("session", tmp_path / "bus", services))
    config_home = tmp_path / "config"
    (config_home / "tessera").mkdir(parents=True)
    env = dict(os.environ, XDG_CONFIG_HOME=str(config_home))
    env.pop("TESSERA_CONFIG", None)
    bus = subprocess.Popen(
        ["dbus-daemon", f"--config-file={tmp_path}/bus.conf", "--nofork", "--print-address"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    address = bus.stdout.readline().strip()
    assert address, "dbus-daemon did not start"
    env["DBUS_SESSION_BUS_ADDRESS"] = address
    yield env, config_home / "tessera" / "config.toml"
    bus.terminate()
    bus.wait(10)


def cli(env, *args, stdin=None):
    return subprocess.run([TESSERA, *args], capture_output=True, text=True, timeout=60, env=env,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)


def test_a_typo_in_config_toml_is_shown_by_the_cli_not_hidden_behind_not_running(activating_bus):
    env, config = activating_bus
    config.write_text(f'default_authority = "{IDP_URL}/t"\ndefault_scope = ["read"]\n')
    expected = f"{config}:2: key 'default_scope': unknown key; did you mean 'default_scopes'?"
    token = cli(env, "token")
    assert token.returncode == 15, token  # Configuration, not 14 (not running)
    assert token.stdout == ""
    assert f"tessera: {expected}\n" in token.stderr, token.stderr
    assert "cannot start until config.toml is fixed" in token.stderr and "tessera config check" in token.stderr
    assert "not running" not in token.stderr, token.stderr
    # status always prints its report (on stdout), here why the broker is not running.
    status = cli(env, "status")
    assert status.returncode == 15 and status.stderr == "", status
    assert status.stdout.startswith("tesserad is not running:\n") and f"  {expected}\n" in status.stdout, status.stdout
    assert "cannot start until config.toml is fixed" in status.stdout
    check = cli(env, "config", "check")
    assert check.returncode == 15 and check.stderr == expected + "\n", check
    # Fixed, the broker starts (and answers: no keyring on this bus, so StoreUnavailable).
    config.write_text(f'default_authority = "{IDP_URL}/t"\ndefault_scopes = ["read"]\n')
    assert cli(env, "config", "check").stdout == f"{config}: OK\n"
    fixed = cli(env, "status", "--json")
    assert fixed.returncode != 15 and "default_scope" not in fixed.stderr, fixed


def test_an_unknown_table_stops_tesserad_and_git_credential_alike(activating_bus, tmp_path):
    env, config = activating_bus
    config.write_text('default_client_id = "tessera-test"\n\n[[gti]]\nurl = "git.example.test"\n')
    expected = f"{config}:3: table [[gti]]: unknown table; did you mean [[git]]?"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(TESSERA, bin_dir / "git-credential-tessera")
    got = subprocess.run([str(bin_dir / "git-credential-tessera"), "get"], input="protocol=https\nhost=git.example.test\n\n",
                         capture_output=True, text=True, timeout=60, env=env)
    assert got.returncode == 15 and got.stdout == "", got
    assert got.stderr == f"tessera git-credential: {expected}\n", got.stderr
    # tesserad refuses the same file: run by hand, and as the bus activates it.
    daemon = subprocess.run([TESSERAD], capture_output=True, text=True, timeout=20, env=env, stdin=subprocess.DEVNULL)
    assert daemon.returncode == 78, daemon
    assert f"tesserad: bad configuration: {expected}" in daemon.stderr, daemon.stderr
    status = cli(env, "status")
    assert status.returncode == 15 and f"  {expected}\n" in status.stdout, status


def test_a_config_toml_over_16_mib_at_the_default_path_stops_tesserad(tmp_path):
    config_home = tmp_path / "config"
    (config_home / "tessera").mkdir(parents=True)
    config = config_home / "tessera" / "config.toml"
    with open(config, "wb") as f:
        f.write(b'default_client_id = "tessera-test"\n')
        f.write(b"#" * (16 << 20))
    env = dict(os.environ, XDG_CONFIG_HOME=str(config_home))
    env.pop("TESSERA_CONFIG", None)
    proc = subprocess.run([TESSERAD], capture_output=True, text=True, timeout=20, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 78, proc
    assert f"{config}: is larger than 16 MiB, and is refused" in proc.stderr, proc.stderr
    check = cli(env, "config", "check")
    assert check.returncode == 15 and "larger than 16 MiB" in check.stderr, check
