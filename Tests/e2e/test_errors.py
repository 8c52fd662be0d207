"""Every failure reaches the caller as the documented org.tessera.Broker1.Error.* name with a
message that says what went wrong and what to do."""
import json
import http.server
import os
import socket
import ssl
import threading
import time

import dbus
import pytest

from conftest import BUS_NAME, IDP_DIR, IDP_URL, OBJECT_PATH, Broker, expect_error, run_cli


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
        # `tessera status` says so, and still succeeds.
        locked = json.loads(run_cli("status", "--json", check_rc=0).stdout)
        assert locked["store"] == "unavailable" and "lock" in locked["store_message"].lower()
        assert locked["accounts"] == []
        assert "cannot read the keyring" in run_cli("status", check_rc=0).stdout
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
    (alice,) = json.loads(run_cli("status", "--json", check_rc=0).stdout)["accounts"]
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
    """The CLI refuses an option value the broker's table refuses, with the table's message, as
    InvalidArgument (exit 3), the same as the broker would."""
    proc = run_cli("token", "--min-validity", "86401")
    assert proc.returncode == 3, proc.stderr
    assert "min_validity" in proc.stderr and "86400" in proc.stderr
