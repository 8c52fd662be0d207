"""A [[provider]] of config.toml against the real test IdP (issue 38): its endpoints written out
(no discovery), a confidential client whose secret tesserad reads from a 0600 file and sends as
client_secret_post or client_secret_basic, exactly its scopes, and the account named by the
userinfo endpoint (the id_token is not trusted without the provider's keys). The secret never
reaches a log, and a wrong one is the IdP's refusal, not a lost account."""
import base64
import json
import os
import re
import subprocess

from conftest import IDP_URL, TENANT, TESSERA, run_cli
from test_integrations import git_server, helper_env  # noqa: F401 (fixtures)


def provider_config(write_config, tmp_path, method, secret="conf-secret-1"):
    secret_file = tmp_path / "secrets" / "conf.secret"
    secret_file.parent.mkdir(mode=0o700, exist_ok=True)
    secret_file.write_text(secret + "\n")
    os.chmod(secret_file, 0o600)
    config = write_config()
    base = f"{IDP_URL}/{TENANT}/o"
    with open(config, "a") as f:
        f.write(f"""
[[provider]]
name = "plain"
discovery = "none"
issuer = "{IDP_URL}/plain-oauth"
authorization_endpoint = "{base}/authorize/"
token_endpoint = "{base}/token/"
userinfo_endpoint = "{base}/userinfo/"
revocation_endpoint = "{base}/revoke_token/"
client_id = "tessera-confidential"
client_secret_file = "{secret_file}"
client_authentication = "{method}"
scopes = ["openid", "read"]
""")
    return config, secret_file


def sign_in_and_check(idp, daemon, method):
    mark = idp.mark()
    login = run_cli("login", "--provider", "plain", timeout=120)
    assert login.returncode == 0, login.stderr
    assert "Signed in as alice" in login.stdout, login.stdout
    token = json.loads(run_cli("token", "--provider", "plain", "--json", check_rc=0).stdout)
    assert token["account"]["username"] == "alice", token
    assert token["account"]["authority"] == f"{IDP_URL}/plain-oauth", token
    exchanges = idp.token_posts(mark, grant_type="authorization_code", status=200)
    assert [p["client_auth"] for p in exchanges] == [method], idp.requests(mark)
    assert any(r["path"].endswith("/o/userinfo/") and r["status"] == 200 for r in idp.requests(mark))
    # A refresh goes with the secret too.
    refreshed = json.loads(run_cli("token", "--provider", "plain", "--force-refresh", "--json", check_rc=0).stdout)
    assert refreshed["access_token"] != token["access_token"]
    assert [p["client_auth"] for p in idp.token_posts(mark, grant_type="refresh_token", status=200)] == [method]
    log = daemon.log()
    assert "conf-secret-1" not in log
    assert base64.b64encode(b"tessera-confidential:conf-secret-1").decode() not in log, "nor as HTTP Basic"
    return token


def test_a_provider_written_out_signs_in_with_its_secret_in_the_body(start_daemon, write_config, tmp_path, idp):
    config, _ = provider_config(write_config, tmp_path, "client_secret_post")
    daemon = start_daemon(config, log_level="trace")
    sign_in_and_check(idp, daemon, "post")


def test_a_provider_signs_in_with_http_basic_and_a_wrong_secret_is_refused_without_losing_the_account(
        start_daemon, write_config, tmp_path, idp):
    config, secret_file = provider_config(write_config, tmp_path, "client_secret_basic")
    daemon = start_daemon(config, log_level="trace")
    sign_in_and_check(idp, daemon, "basic")
    # The secret is read when it is needed: a wrong one is the IdP's refusal, said as such.
    secret_file.write_text("not-the-secret\n")
    refused = run_cli("token", "--provider", "plain", "--force-refresh")
    assert refused.returncode != 0
    assert "rejected the client id" in refused.stderr, refused.stderr
    # Nothing was lost: with the right secret again, the account refreshes.
    secret_file.write_text("conf-secret-1\n")
    assert run_cli("token", "--provider", "plain", "--force-refresh").returncode == 0
    accounts = json.loads(run_cli("accounts", "--json", check_rc=0).stdout)
    assert [a["username"] for a in accounts if a["authority"] == f"{IDP_URL}/plain-oauth"] == ["alice"]
    # A secret file others can read is refused at start, naming its line.
    os.chmod(secret_file, 0o644)
    check = run_cli("config", "check", "--config", config)
    assert check.returncode == 15 and "can be read by other users (mode 644)" in check.stderr, check.stderr


def test_a_provider_without_an_end_session_endpoint_cannot_sign_out_in_the_browser_and_keeps_the_account(
        start_daemon, write_config, tmp_path, idp):
    config, _ = provider_config(write_config, tmp_path, "client_secret_post")
    start_daemon(config)
    assert run_cli("login", "--provider", "plain", timeout=120).returncode == 0
    out = run_cli("logout", "--browser")
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr)  # invalid argument
    assert "end_session_endpoint" in out.stderr and "Nothing was signed out" in out.stderr, out.stderr
    assert "alice" in run_cli("accounts", check_rc=0).stdout
    # Without --browser it signs out as always.
    assert run_cli("logout", check_rc=0).returncode == 0
    assert "alice" not in run_cli("accounts", check_rc=0).stdout


def test_an_unknown_provider_is_named_with_the_nearest(start_daemon, write_config, tmp_path):
    config, _ = provider_config(write_config, tmp_path, "client_secret_post")
    start_daemon(config)
    wrong = run_cli("token", "--provider", "plian")
    assert wrong.returncode != 0
    assert "There is no provider 'plian'; did you mean 'plain'?" in wrong.stderr, wrong.stderr


def test_git_gets_tokens_for_a_providers_host_with_no_git_entry(start_daemon, write_config, git_server, helper_env,
                                                              tmp_path, idp):
    """Issue 38 §6: a provider with a git profile makes its host a git host: git clones and pushes
    through `credential.helper tessera` with no [[git]] entry, with the host's username (GitLab's
    oauth2) and password_expiry_utc."""
    from conftest import AUTHORITY, Broker
    from test_integrations import git
    host = git_server.url.split("://", 1)[1]
    config = write_config()
    with open(config, "a") as f:
        f.write(f"""
[[provider]]
name = "our-gitlab"
profile = "gitlab"
host = "{host}"
issuer = "{AUTHORITY}"
client_id = "tessera-test"
scopes = ["read"]
""")
    helper_env["TESSERA_CONFIG"] = config
    start_daemon(config)
    b = Broker()
    signed_in = b.sign_in()
    answer = subprocess.run([TESSERA, "git-credential", "get"], input=f"protocol=https\nhost={host}\n\n",
                            capture_output=True, text=True, env=helper_env, timeout=60)
    assert answer.returncode == 0, answer.stderr
    lines = dict(line.split("=", 1) for line in answer.stdout.splitlines() if "=" in line)
    assert lines["username"] == "oauth2", answer.stdout
    assert lines["password"] == signed_in["access_token"]
    assert int(lines["password_expiry_utc"]) == signed_in["expires_on"]
    # Another host gets no answer (git asks its next helper).
    other = subprocess.run([TESSERA, "git-credential", "get"], input="protocol=https\nhost=example.org\n\n",
                           capture_output=True, text=True, env=helper_env, timeout=60)
    assert other.returncode == 0 and other.stdout == "", other.stdout

    work = tmp_path / "work"
    git(helper_env, "clone", "-q", f"{git_server.url}/repo.git", str(work))
    (work / "NEW").write_text("through the provider\n")
    git(helper_env, "add", "NEW", cwd=work)
    git(helper_env, "commit", "-qm", "provider push", cwd=work)
    git(helper_env, "push", "-q", "origin", "main", cwd=work)
    authorized = [r for r in git_server.requests if r[4] != 401]
    assert authorized and {r[3] for r in authorized} == {"alice"}
    b.close()


def reject_with_cli(token, *args):
    return subprocess.run([TESSERA, "token", "--reject", *args], input=token + "\n", capture_output=True, text=True,
                          timeout=60)


def test_a_rejected_token_is_dropped_and_only_by_an_app_that_may_have_it(start_daemon, write_config, idp):
    """Issue 38 §5, over the session bus against the real IdP: the app that got a token drops it
    with RejectToken and the next silent call refreshes; another program (the tessera command,
    with no grant) cannot drop it; once granted, `tessera token --reject` does."""
    import dbus
    from conftest import Broker
    start_daemon(write_config(access_mode="strict"))
    b = Broker()
    first = b.sign_in()["access_token"]
    assert b.silent()["access_token"] == first

    refused = reject_with_cli(first)
    assert refused.returncode == 12, refused.stderr
    assert "has no grant" in refused.stderr and first not in refused.stderr
    assert b.silent()["access_token"] == first, "another app's attempt changed nothing"

    mark = idp.mark()
    reject = ("RejectToken", "sssa{sv}")
    assert b.call(*reject, (dbus.String(""), dbus.String(""), dbus.String(first), dbus.Dictionary({}, "sv"))) == 1
    second = b.silent()["access_token"]
    assert second != first
    assert len(idp.token_posts(mark, grant_type="refresh_token", status=200)) == 1, "replaced by a refresh"
    again = b.call(*reject, (dbus.String(""), dbus.String(""), dbus.String(first), dbus.Dictionary({}, "sv")))
    assert again == 0, "the old token is no longer cached: nothing to drop"

    key = re.search(r"--app '([^']+)'", refused.stderr).group(1)
    run_cli("access", "grant", "--app", key, "--client-id", "tessera-test", "--account", "alice", check_rc=0)
    assert run_cli("token", check_rc=0).stdout.strip() == second
    dropped = reject_with_cli(second, "--json")
    assert dropped.returncode == 0 and json.loads(dropped.stdout) == {"dropped": True}, dropped.stderr
    third = run_cli("token", check_rc=0).stdout.strip()
    assert third not in (first, second)
    stale = reject_with_cli(second)
    assert stale.returncode == 0 and "nothing was dropped" in stale.stderr, stale.stderr
    empty = subprocess.run([TESSERA, "token", "--reject"], input="", capture_output=True, text=True, timeout=60)
    assert empty.returncode == 64 and "no token on standard input" in empty.stderr, empty.stderr
