"""Tessera against a real third-party plain OAuth 2.0 server: glewlwyd 2.7's OAuth 2.0 plugin
(Tests/e2e/glewlwyd.py starts a private one for this module). No metadata document, no id_token,
tokens that are bearer JWTs: a [[provider]] of config.toml with every endpoint written out
(discovery = "none"), a public client (PKCE) and a confidential one (client_secret_basic, the
only client authentication glewlwyd takes), the browser sign-in and the device code, refresh,
sign-out with revocation, and a restart of tesserad.

Naming the account: glewlwyd's profile endpoint (GET /api/glwd/profile/) answers {"username",
"name", "email"} and no `sub`, which Tessera's userinfo reading needs, and a table written out
cannot name a user API (only a built-in profile has one). So the tables here have no
userinfo_endpoint and the account is named with --login-hint; a test below shows what a user who
sets the profile endpoint as userinfo_endpoint gets.

The sign-in page is glewlwyd's JavaScript app: Tests/e2e/glewlwyd_browser.py makes its REST calls
instead (the `browser` command of config.toml).
"""
import base64
import json
import os
import subprocess
import sys

from conftest import REPO, TESSERA, run_cli, wait_until
from glewlwyd import CONFIDENTIAL_CLIENT, INSTANCE, PUBLIC_CLIENT, SCOPE, approve_device, device_login, glewlwyd  # noqa: F401

BROWSER = os.path.join(REPO, "Tests", "e2e", "glewlwyd_browser.py")


def provider_config(write_config, glewlwyd, tmp_path, name, client_id, secret=None, userinfo=False):
    """config.toml with a [[provider]] for glewlwyd's plugin instance, written out; with `secret`,
    in a 0600 file sent as client_secret_basic. The loopback redirect URI's port is the one the
    clients registered (glewlwyd compares redirect URIs exactly)."""
    config = write_config(redirect_port=glewlwyd.redirect_port,
                          browser=f"{sys.executable} {BROWSER} {glewlwyd.browser_state}")
    table = f"""
[[provider]]
name = "{name}"
discovery = "none"
issuer = "{glewlwyd.issuer}"
authorization_endpoint = "{glewlwyd.endpoint('auth')}"
token_endpoint = "{glewlwyd.endpoint('token')}"
device_authorization_endpoint = "{glewlwyd.endpoint('device_authorization')}"
revocation_endpoint = "{glewlwyd.endpoint('revoke')}"
client_id = "{client_id}"
scopes = ["{SCOPE}"]
"""
    if userinfo:
        table += f'userinfo_endpoint = "{glewlwyd.endpoint("profile")}"\n'
    if secret is not None:
        secret_file = tmp_path / "secrets" / f"{name}.secret"
        secret_file.parent.mkdir(mode=0o700, exist_ok=True)
        secret_file.write_text(secret + "\n")
        os.chmod(secret_file, 0o600)
        table += f'client_secret_file = "{secret_file}"\nclient_authentication = "client_secret_basic"\n'
    with open(config, "a") as f:
        f.write(table)
    return config


def browser_requests(glewlwyd, since=0):
    """The authorization requests the stand-in browser opened, oldest first."""
    try:
        with open(glewlwyd.browser_record) as f:
            return [json.loads(line) for line in f.readlines()[since:]]
    except FileNotFoundError:
        return []


def sign_in(glewlwyd, name, client_id, user="alice"):
    """`tessera login --provider NAME --login-hint USER` through the browser stand-in; returns
    `tessera token --provider NAME --json`."""
    since = len(browser_requests(glewlwyd))
    login = run_cli("login", "--provider", name, "--login-hint", user, timeout=120)
    assert login.returncode == 0, login.stderr
    assert f"Signed in as {user}" in login.stdout, login.stdout
    opened = browser_requests(glewlwyd, since)
    assert len(opened) == 1, opened
    assert opened[0]["path"] == f"/api/{INSTANCE}/auth/" and opened[0]["client_id"] == client_id, opened
    assert opened[0]["redirect_uri"] == glewlwyd.redirect_uri and opened[0]["scope"] == SCOPE, opened
    token = json.loads(run_cli("token", "--provider", name, "--json", check_rc=0).stdout)
    assert token["account"]["username"] == user, token
    assert token["account"]["authority"] == glewlwyd.issuer, token
    return token, opened[0]


def stored_refresh_token(keyring, client_id):
    """The refresh token tesserad keeps in the keyring for the client (glewlwyd keeps only its hash)."""
    [secret] = [json.loads(secret)["secret"] for _, attributes, secret in keyring.tessera_items(secrets=True)
                if attributes.get("kind") == "refresh_token" and attributes.get("client_id") == client_id]
    return secret


def accounts():
    return json.loads(run_cli("accounts", "--json", check_rc=0).stdout)


def test_a_public_client_signs_in_with_pkce_refreshes_and_signs_out(start_daemon, write_config, tmp_path, glewlwyd,
                                                                    keyring):
    """The public client: the browser sign-in sends a PKCE S256 challenge and glewlwyd hands out a
    token for alice that glewlwyd itself honours; `tessera token` then answers from the cache
    (glewlwyd issues nothing), and --force-refresh redeems the refresh token for a new access
    token. glewlwyd takes revocation only from a confidential client that authenticates, so the
    sign-out forgets the account here, tesserad's log says glewlwyd refused to revoke, and the
    refresh token still redeems at glewlwyd."""
    config = provider_config(write_config, glewlwyd, tmp_path, "glwd-public", PUBLIC_CLIENT)
    daemon = start_daemon(config)
    issued = glewlwyd.access_tokens_by("code")
    token, opened = sign_in(glewlwyd, "glwd-public", PUBLIC_CLIENT)
    assert opened["response_type"] == "code" and opened["code_challenge_method"] == "S256", opened
    assert opened["has_code_challenge"], opened
    assert glewlwyd.access_tokens_by("code") == issued + 1
    claims = glewlwyd.verify(token["access_token"])
    assert claims["username"] == "alice" and claims["scope"] == SCOPE, claims
    assert not token.get("id_token"), "glewlwyd's OAuth 2.0 plugin issues no id_token"
    # The token works at glewlwyd's own resource (a code-flow token: it carries its scope).
    assert glewlwyd.profile(token["access_token"])["username"] == "alice"

    refreshes = glewlwyd.access_tokens_by("refresh_token")
    again = json.loads(run_cli("token", "--provider", "glwd-public", "--json", check_rc=0).stdout)
    assert again["access_token"] == token["access_token"], "silent: from the cache"
    assert glewlwyd.access_tokens_by("refresh_token") == refreshes, "the cache answered, not glewlwyd"

    refreshed = json.loads(run_cli("token", "--provider", "glwd-public", "--force-refresh", "--json",
                                   check_rc=0).stdout)
    assert refreshed["access_token"] != token["access_token"]
    assert refreshed["account"]["id"] == token["account"]["id"]
    assert glewlwyd.access_tokens_by("refresh_token") == refreshes + 1, "glewlwyd saw one refresh"
    assert glewlwyd.verify(refreshed["access_token"])["username"] == "alice"
    assert run_cli("token", "--provider", "glwd-public", check_rc=0).stdout.strip() == refreshed["access_token"]

    stored = stored_refresh_token(keyring, PUBLIC_CLIENT)
    logout = run_cli("logout", check_rc=0)
    assert "Signed out alice" in logout.stdout, logout.stdout
    assert accounts() == []
    assert run_cli("token", "--provider", "glwd-public").returncode == 5, "no account any more"
    wait_until(lambda: "refused to revoke a refresh token" in daemon.log(), timeout=30,
               what="tesserad's log of glewlwyd's refusal")
    assert glewlwyd.refresh_tokens("alice", PUBLIC_CLIENT)[-1], "glewlwyd kept the public client's refresh token"
    assert glewlwyd.redeem(stored, PUBLIC_CLIENT).status_code == 200, "and it still redeems there"


def test_a_confidential_client_authenticates_with_http_basic_and_its_sign_out_revokes(
        start_daemon, write_config, tmp_path, glewlwyd, keyring):
    """The confidential client: glewlwyd refuses a confidential client's code and refresh
    requests without its secret, so the sign-in and the refresh succeeding show tesserad sent it
    (as client_secret_basic); the secret never reaches tesserad's log, in clear or in its HTTP
    Basic form. `tessera logout` revokes the refresh token at glewlwyd's revocation endpoint:
    glewlwyd logs the revocation, no refresh token of alice for the client is left enabled, and
    the refresh token tesserad held no longer redeems there."""
    config = provider_config(write_config, glewlwyd, tmp_path, "glwd-conf", CONFIDENTIAL_CLIENT, secret=glewlwyd.secret)
    daemon = start_daemon(config, log_level="trace")
    token, _ = sign_in(glewlwyd, "glwd-conf", CONFIDENTIAL_CLIENT)
    introspected = glewlwyd.introspect(token["access_token"])
    assert introspected["active"] and introspected["client_id"] == CONFIDENTIAL_CLIENT, introspected
    assert introspected["username"] == "alice", introspected

    refreshes = glewlwyd.access_tokens_by("refresh_token")
    refreshed = json.loads(run_cli("token", "--provider", "glwd-conf", "--force-refresh", "--json", check_rc=0).stdout)
    assert refreshed["access_token"] != token["access_token"]
    assert glewlwyd.access_tokens_by("refresh_token") == refreshes + 1
    assert glewlwyd.introspect(refreshed["access_token"])["active"]

    log = daemon.log()
    assert glewlwyd.secret not in log
    basic = base64.b64encode(f"{CONFIDENTIAL_CLIENT}:{glewlwyd.secret}".encode()).decode()
    assert basic not in log, "nor as HTTP Basic"

    assert glewlwyd.refresh_tokens("alice", CONFIDENTIAL_CLIENT)[-1], "enabled before the sign-out"
    stored = stored_refresh_token(keyring, CONFIDENTIAL_CLIENT)
    revoked = "Refresh token generated for client 'tessera-confidential' revoked"
    before = glewlwyd.log().count(revoked)
    logout = run_cli("logout", check_rc=0)
    assert "Signed out alice" in logout.stdout, logout.stdout
    assert accounts() == []
    wait_until(lambda: glewlwyd.log().count(revoked) == before + 1, timeout=30, what="glewlwyd's revocation")
    assert not any(glewlwyd.refresh_tokens("alice", CONFIDENTIAL_CLIENT)), "every refresh token of alice is revoked"
    invalid = glewlwyd.counter("oauth2_invalid_refresh_token")
    refused = glewlwyd.redeem(stored, CONFIDENTIAL_CLIENT, glewlwyd.secret)
    assert refused.status_code == 400, refused.text
    # Counted as a revoked refresh token: glewlwyd's metrics may come in just behind its answer.
    wait_until(lambda: glewlwyd.counter("oauth2_invalid_refresh_token") == invalid + 1, timeout=15,
               what=f"glewlwyd counting the refusal as an invalid refresh token (it answered {refused.text!r})")
    assert "refused to revoke" not in daemon.log()
    assert glewlwyd.secret not in daemon.log() and basic not in daemon.log()


def test_device_code_sign_in_is_approved_at_glewlwyd(start_daemon, write_config, tmp_path, glewlwyd):
    """`tessera login --device-code` against glewlwyd: the CLI shows glewlwyd's verification URL
    and user code, the user approves it (signs in, grants the scope, continues on the device
    page), and the CLI returns signed in. The account is named by --login-hint: glewlwyd's device
    tokens carry no scope, and its profile endpoint crashes glewlwyd when called with one, so the
    table has no userinfo_endpoint and Tessera never calls it (the glewlwyd fixture fails the
    module if glewlwyd died)."""
    config = provider_config(write_config, glewlwyd, tmp_path, "glwd-device", PUBLIC_CLIENT)
    start_daemon(config)
    # glewlwyd's metrics count a device grant at the approval and again at the token request: its
    # database says better what was issued.
    issued = len(glewlwyd.refresh_tokens("bob", PUBLIC_CLIENT))
    rc, out, shown = device_login(
        [TESSERA, "login", "--provider", "glwd-device", "--device-code", "--login-hint", "bob", "--timeout", "120"],
        lambda user_code: approve_device(glewlwyd, "bob", PUBLIC_CLIENT, user_code))
    assert glewlwyd.endpoint("device").rstrip("/") in shown, f"the CLI shows where to enter the code: {shown!r}"
    assert rc == 0, shown
    assert "Signed in as bob" in out, out
    assert len(glewlwyd.refresh_tokens("bob", PUBLIC_CLIENT)) == issued + 1, "one device grant redeemed"
    token = json.loads(run_cli("token", "--provider", "glwd-device", "--json", check_rc=0).stdout)
    assert token["account"]["username"] == "bob", token
    assert glewlwyd.verify(token["access_token"])["username"] == "bob"
    assert glewlwyd.alive(), "glewlwyd still runs: its profile endpoint was never called with the device token"


def test_a_restart_of_tesserad_keeps_the_account_and_its_refresh_token(start_daemon, write_config, tmp_path, glewlwyd):
    """After tesserad restarts with the same config, the account is still signed in, `tessera
    token` serves a token glewlwyd honours, and the refresh token kept in the keyring still
    redeems at glewlwyd."""
    config = provider_config(write_config, glewlwyd, tmp_path, "glwd-public", PUBLIC_CLIENT)
    daemon = start_daemon(config)
    token, _ = sign_in(glewlwyd, "glwd-public", PUBLIC_CLIENT)
    daemon.restart()
    assert [a["username"] for a in accounts()] == ["alice"]
    served = json.loads(run_cli("token", "--provider", "glwd-public", "--json", check_rc=0).stdout)
    assert served["account"]["id"] == token["account"]["id"]
    assert glewlwyd.profile(served["access_token"])["username"] == "alice"
    refreshes = glewlwyd.access_tokens_by("refresh_token")
    refreshed = json.loads(run_cli("token", "--provider", "glwd-public", "--force-refresh", "--json",
                                   check_rc=0).stdout)
    assert refreshed["access_token"] not in (token["access_token"], served["access_token"])
    assert glewlwyd.access_tokens_by("refresh_token") == refreshes + 1


def test_glewlwyds_profile_endpoint_as_userinfo_is_refused_for_want_of_a_sub(
        start_daemon, write_config, tmp_path, glewlwyd):
    """A user who sets glewlwyd's profile endpoint as the table's userinfo_endpoint: it answers
    {"username", "name", "email"} and no `sub`, so Tessera cannot name the account from it and
    refuses the sign-in, saying why (--login-hint does not stand in for it), and keeps nothing.
    (The profile is called with the code-flow token, which carries its scope: safe.)"""
    config = provider_config(write_config, glewlwyd, tmp_path, "glwd-userinfo", PUBLIC_CLIENT, userinfo=True)
    start_daemon(config)
    login = run_cli("login", "--provider", "glwd-userinfo", "--login-hint", "alice", timeout=120)
    assert login.returncode != 0, login.stdout
    assert f"{glewlwyd.endpoint('profile')} answered without a sub" in login.stderr, login.stderr
    assert accounts() == []
