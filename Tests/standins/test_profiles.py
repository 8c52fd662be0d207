"""The built-in provider profiles exactly as shipped (issue 38), against stand-ins that answer as
each provider's documentation says under its real host names (standins.py): one
`[[provider]]` table with a profile and a client id (and a secret where the provider demands
one), then sign-in by browser and by device code where the provider has it, silent tokens,
refreshes, a token the provider stopped honouring dropped and replaced, sign-out, and real git
cloning and pushing with no `[[git]]` entry, in each host's username convention."""
import base64
import json
import os
import queue
import re
import subprocess
import threading
import time

from conftest import TESSERA, run_cli, wait_until
from test_integrations import git, helper_environment

NEVER = 253402300799


def providers_config(write_config, tmp_path, tables):
    """config.toml with `tables` ([[provider]] entries; SECRET:name becomes a 0600 secret file)."""
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir(mode=0o700, exist_ok=True)
    text = ""
    for table in tables:
        for key, value in table.items():
            if key == "secret":
                path = secrets_dir / f"{table['name']}.secret"
                path.write_text(value + "\n")
                os.chmod(path, 0o600)
                text += f'client_secret_file = "{path}"\n'
            else:
                text = text + ("\n[[provider]]\n" if key == "name" else "") + f"{key} = {json.dumps(value)}\n"
    config = write_config()
    with open(config, "a") as f:
        f.write(text)
    return config


def login(*args):
    proc = run_cli("login", *args, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def token(provider, *args):
    return json.loads(run_cli("token", "--provider", provider, "--json", *args, check_rc=0).stdout)


def device_login(provider, standin):
    """`tessera login --device-code`, approved at the stand-in as the user would on its page."""
    proc = subprocess.Popen([TESSERA, "login", "--provider", provider, "--device-code", "--timeout", "120"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    shown = queue.Queue()
    threading.Thread(target=lambda: [shown.put(line) for line in proc.stderr], daemon=True).start()
    try:
        code = wait_until(lambda: next((d["user_code"] for d in list(standin.devices.values())), None), timeout=60,
                          what=f"a device code at the {standin.name} stand-in")
        text = ""
        while code not in text:
            text += shown.get(timeout=60)
        standin.approve(code)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, text
    return text, out


def reject_and_replace(provider, standin):
    """The resource refuses the current token (the stand-in stops honouring it); `tessera token
    --reject` drops it and the next token is a new one, from a refresh."""
    held = token(provider)["access_token"]
    with standin.lock:
        standin.tokens.pop(held, None)
    rejected = subprocess.run([TESSERA, "token", "--reject", "--provider", provider], input=held + "\n",
                              capture_output=True, text=True, timeout=60)
    assert rejected.returncode == 0 and rejected.stderr == "", rejected.stderr
    fresh = token(provider)["access_token"]
    assert fresh != held and standin.valid(fresh), "a new token the provider honours"


def logout(config):
    """`tessera logout` reading the same config.toml as tesserad (for the revocation hint)."""
    proc = subprocess.run([TESSERA, "logout"], env=dict(os.environ, TESSERA_CONFIG=config), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def git_env(tmp_path, config):
    env = helper_environment(tmp_path, os.environ)
    env["TESSERA_CONFIG"] = config
    return env


def clone_and_push(env, tmp_path, url, name):
    work = tmp_path / f"work-{name}"
    git(env, "clone", "-q", url, str(work))
    (work / "NEW").write_text(f"pushed with a token from {name}\n")
    git(env, "add", "NEW", cwd=work)
    git(env, "commit", "-qm", f"push through {name}", cwd=work)
    git(env, "push", "-q", "origin", "main", cwd=work)
    return work


def test_github_oauth_app_token_that_never_expires_until_github_refuses_it(start_daemon, write_config, standins,
                                                                          tmp_path):
    """An OAuth app: the code exchange with the secret, an answer with no expires_in and no
    refresh token, the account from api.github.com/user. git clones and pushes with no [[git]]
    entry. When GitHub stops honouring the token, git's erase drops it and the next request asks
    for a sign-in; sign-out says where GitHub keeps the grant."""
    gh = standins.github
    # As the README says: one `tessera provider add` (the secret on standard input), one login.
    config = providers_config(write_config, tmp_path, [])
    added = subprocess.run([TESSERA, "provider", "add", "github", "--profile", "github", "--client-id", "Ov23liOAUTHAPP",
                            "--client-secret-stdin", "--config", config], input=gh.secret + "\n", capture_output=True,
                           text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    start_daemon(config)
    assert "Signed in as octocat" in login("--provider", "github")
    exchange = gh.saw("/login/oauth/access_token", client_secret=gh.secret, client_id="Ov23liOAUTHAPP")
    assert len(exchange) == 1 and exchange[0][3].get("code_verifier"), "PKCE and the secret"
    assert "application/json" in exchange[0][4].get("Accept", ""), "asked for JSON"
    assert [r[2] for r in gh.requests if r[1] == "api.github.com"] == ["/user"]
    first = token("github")
    assert first["expires_on"] == NEVER and first["account"]["username"] == "octocat", first
    assert first["scopes"] == ["repo"], "GitHub's comma-separated scope read"
    assert "does not expire" in run_cli("status").stdout
    # kubectl's credential plugin: a token that does not expire has no expirationTimestamp, so
    # kubectl keeps it until the server refuses it.
    kube = json.loads(run_cli("kube-credential", "--provider", "github", check_rc=0).stdout)
    assert kube["status"] == {"token": first["access_token"]}, kube

    env = git_env(tmp_path, config)
    answer = subprocess.run([TESSERA, "git-credential", "get"], input="protocol=https\nhost=github.com\n\n",
                            capture_output=True, text=True, env=env, timeout=60)
    assert "password_expiry_utc" not in answer.stdout and f"password={first['access_token']}" in answer.stdout
    work = clone_and_push(env, tmp_path, "https://github.com/team/repo.git", "github")
    assert {u for h, _, u in standins.git_requests if h == "github.com" and u} == {"octocat"}

    # The user revokes the app on github.com: git is refused, erases the token, and the next
    # request needs a sign-in (there is no refresh token to get another).
    gh.revoke_all()
    (work / "MORE").write_text("x\n")
    git(env, "add", "MORE", cwd=work)
    git(env, "commit", "-qm", "more", cwd=work)
    refused = git(env, "push", "-q", "origin", "main", cwd=work, check=False)
    assert refused.returncode != 0
    needs = run_cli("token", "--provider", "github")
    assert needs.returncode == 4, needs.stderr
    assert "refused octocat's token" in needs.stderr and "tessera login --provider github" in needs.stderr, needs.stderr
    status = json.loads(run_cli("status", "--json").stdout)
    assert status["needs_attention"] and status["accounts"][0]["state"] == "needs_sign_in", status
    told = subprocess.run([TESSERA, "status"], env=dict(os.environ, TESSERA_CONFIG=config), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert "octocat (github.com): needs a sign-in: run `tessera login --provider github`" in told.stdout, told.stdout
    assert "Signed in as octocat" in login("--provider", "github")
    assert token("github")["access_token"] != first["access_token"]
    git(env, "push", "-q", "origin", "main", cwd=work)

    out = logout(config)
    assert "https://github.com/settings/connections/applications/Ov23liOAUTHAPP" in out, out


def test_github_app_device_code_refresh_rotation_and_a_rejected_token_replaced(start_daemon, write_config, standins,
                                                                             tmp_path):
    """A GitHub App: the device flow without the secret, tokens for 8 hours with a refresh token
    that lasts about 6 months (shown by status), refreshes with the secret, and a token rejected
    with `tessera token --reject` replaced by a refresh."""
    gh = standins.github
    config = providers_config(write_config, tmp_path, [
        {"name": "ghapp", "profile": "github", "client_id": "Iv1.ghapp", "secret": gh.secret}])
    start_daemon(config)
    shown, out = device_login("ghapp", gh)
    assert "https://github.com/login/device" in shown and "octocat" in out
    polls = gh.saw("/login/oauth/access_token", grant_type="urn:ietf:params:oauth:grant-type:device_code")
    assert polls, "polled the token endpoint"
    now = int(time.time())
    first = token("ghapp")
    assert now + 28700 <= first["expires_on"] <= now + 28900, first
    report = json.loads(run_cli("status", "--json").stdout)
    lapses = report["accounts"][0]["refresh_token_expires_on"]
    assert now + 15811000 <= lapses <= now + 15811400, report
    assert "the sign-in lapses when its refresh token expires" in run_cli("status").stdout

    refreshed = token("ghapp", "--force-refresh")
    assert refreshed["access_token"] != first["access_token"]
    assert len(gh.saw("/login/oauth/access_token", grant_type="refresh_token", client_secret=gh.secret)) == 1
    rejected = subprocess.run([TESSERA, "token", "--reject", "--provider", "ghapp", "--json"],
                              input=refreshed["access_token"], capture_output=True, text=True, timeout=60)
    assert json.loads(rejected.stdout) == {"dropped": True}, rejected.stderr
    third = token("ghapp")
    assert third["access_token"] not in (first["access_token"], refreshed["access_token"])
    assert len(gh.saw("/login/oauth/access_token", grant_type="refresh_token")) == 2, "replaced by a refresh"
    assert gh.valid(third["access_token"]), "the refresh used the rotated refresh token"


def test_github_without_a_secret_signs_in_by_device_code_and_the_browser_refusal_says_why(
        start_daemon, write_config, standins, tmp_path):
    """An OAuth app given no secret: GitHub's device flow needs none and signs in; its browser
    flow does, and GitHub's refusal (an error answered with HTTP 200) is a named error that says
    what to do, with nothing stored."""
    gh = standins.github
    config = providers_config(write_config, tmp_path, [
        {"name": "gh-public", "profile": "github", "client_id": "Ov23liPUBLIC"}])
    start_daemon(config)
    refused = run_cli("login", "--provider", "gh-public", timeout=120)
    assert refused.returncode == 3, refused.stderr  # InvalidArgument
    assert "rejected the client id (incorrect_client_credentials" in refused.stderr, refused.stderr
    assert "client_secret_file" in refused.stderr, "says what to fix"
    assert json.loads(run_cli("accounts", "--json", check_rc=0).stdout) == []
    _, out = device_login("gh-public", gh)
    assert "octocat" in out
    polls = gh.saw("/login/oauth/access_token", client_id="Ov23liPUBLIC",
                   grant_type="urn:ietf:params:oauth:grant-type:device_code")
    assert polls and all("client_secret" not in p[3] for p in polls), "no secret to send"
    assert token("gh-public")["expires_on"] == NEVER


def test_gitlab_public_client_browser_device_refresh_git_and_revocation(start_daemon, write_config, standins,
                                                                        tmp_path):
    """gitlab.com as a public client (no secret): OpenID discovery, an id_token checked with
    GitLab's keys, the device flow at /oauth/authorize_device, refresh-token rotation, git with
    the username oauth2, and sign-out revoking at /oauth/revoke."""
    gl = standins.gitlab
    config = providers_config(write_config, tmp_path, [{"name": "gitlab", "profile": "gitlab", "client_id": "gl-app"}])
    start_daemon(config)
    assert "Signed in as gitlab-alice" in login("--provider", "gitlab")
    exchange = gl.saw("/oauth/token", grant_type="authorization_code")
    assert len(exchange) == 1 and "client_secret" not in exchange[0][3] and exchange[0][3].get("code_verifier")
    authorize = gl.saw("/oauth/authorize")[0][3]
    assert authorize["scope"] == "openid read_repository write_repository", authorize
    first = token("gitlab")
    assert first["account"]["username"] == "gitlab-alice"
    refreshed = token("gitlab", "--force-refresh")
    assert refreshed["access_token"] != first["access_token"]
    reject_and_replace("gitlab", gl)

    env = git_env(tmp_path, config)
    clone_and_push(env, tmp_path, "https://gitlab.com/team/repo.git", "gitlab")
    assert {u for h, _, u in standins.git_requests if h == "gitlab.com" and u} == {"gitlab-alice"}
    answer = subprocess.run([TESSERA, "git-credential", "get"], input="protocol=https\nhost=gitlab.com\n\n",
                            capture_output=True, text=True, env=env, timeout=60)
    assert "username=oauth2\n" in answer.stdout and "password_expiry_utc=" in answer.stdout

    logout(config)
    assert gl.revoked, "sign-out revoked the refresh token at GitLab"
    _, out = device_login("gitlab", gl)
    assert "gitlab-alice" in out
    assert token("gitlab")["account"]["username"] == "gitlab-alice"


def test_google_desktop_client_sends_its_secret_with_pkce_and_refreshes_without_a_new_refresh_token(
        start_daemon, write_config, standins, tmp_path):
    """Google: a desktop client's secret with PKCE, access_type=offline, an id_token from Google's
    keys, the device flow's `verification_url`, a refresh that answers no new refresh token (the
    old one keeps working), and sign-out revoking at oauth2.googleapis.com."""
    go = standins.google
    config = providers_config(write_config, tmp_path, [
        {"name": "google", "profile": "google", "client_id": "1234-desktop.apps.googleusercontent.com",
         "secret": go.secret}])
    start_daemon(config)
    assert "Signed in as alice@gmail.example" in login("--provider", "google")
    authorize = go.saw("/o/oauth2/v2/auth")[0][3]
    assert authorize["access_type"] == "offline" and authorize["code_challenge_method"] == "S256", authorize
    assert go.saw("/token", grant_type="authorization_code", client_secret=go.secret)
    first = token("google")
    second = token("google", "--force-refresh")
    third = token("google", "--force-refresh")
    assert len({first["access_token"], second["access_token"], third["access_token"]}) == 3
    assert len(go.saw("/token", grant_type="refresh_token")) == 2, "the same refresh token served twice"
    reject_and_replace("google", go)
    # Mail: Gmail's XOAUTH2 initial response with the account's token.
    sasl = run_cli("sasl", "--provider", "google", "--mech", "xoauth2", check_rc=0).stdout.strip()
    held = token("google")["access_token"]
    assert base64.b64decode(sasl) == f"user=alice@gmail.example\x01auth=Bearer {held}\x01\x01".encode()
    logout(config)
    assert go.revoked
    shown, out = device_login("google", go)
    assert "https://www.google.com/device" in shown and "alice@gmail.example" in out


def test_bitbucket_basic_client_authentication_scopes_field_and_git_username(start_daemon, write_config, standins,
                                                                           tmp_path):
    """Bitbucket Cloud: the consumer's key and secret as HTTP Basic only, an answer naming its
    scopes in `scopes`, the account from api.bitbucket.org (uuid, nickname), and git with the
    username x-token-auth; sign-out says where Bitbucket keeps the grant."""
    bb = standins.bitbucket
    config = providers_config(write_config, tmp_path, [
        {"name": "bitbucket", "profile": "bitbucket", "client_id": bb.key, "secret": bb.secret}])
    start_daemon(config)
    assert "Signed in as bb-alice" in login("--provider", "bitbucket")
    assert all("client_secret" not in r[3] for r in bb.saw("/site/oauth2/access_token")), "Basic only"
    first = token("bitbucket")
    assert first["account"]["username"] == "bb-alice"
    assert token("bitbucket", "--force-refresh")["access_token"] != first["access_token"]
    reject_and_replace("bitbucket", bb)
    env = git_env(tmp_path, config)
    clone_and_push(env, tmp_path, "https://bitbucket.org/team/repo.git", "bitbucket")
    assert {u for h, _, u in standins.git_requests if h == "bitbucket.org" and u} == {"bb-alice"}
    out = logout(config)
    assert "https://bitbucket.org/account/settings/app-authorizations/" in out, out


def test_codeberg_openid_sign_in_and_git(start_daemon, write_config, standins, tmp_path):
    """Codeberg (Forgejo): OpenID discovery, an id_token from its keys, git with the account's name."""
    cb = standins.codeberg
    config = providers_config(write_config, tmp_path, [{"name": "codeberg", "profile": "codeberg", "client_id": "cb-app"}])
    start_daemon(config)
    assert "Signed in as cb-alice" in login("--provider", "codeberg")
    assert token("codeberg")["account"]["username"] == "cb-alice"
    reject_and_replace("codeberg", cb)
    env = git_env(tmp_path, config)
    clone_and_push(env, tmp_path, "https://codeberg.org/team/repo.git", "codeberg")
    assert {u for h, _, u in standins.git_requests if h == "codeberg.org" and u} == {"cb-alice"}
    out = logout(config)
    assert "https://codeberg.org/user/settings/applications" in out, out
