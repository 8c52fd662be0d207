"""tessera's helpers with the real programs that call them (issue 10): git through
git-credential-tessera against an HTTPS git server, kubectl through its exec credential plugin
against an API stub, msmtp through passwordeval against an SMTP server taking XOAUTH2 and
OAUTHBEARER, and `tessera exec`. Every server accepts only a token the test IdP vouches for."""
import base64
import json
import os
import pty
import shutil
import ssl
import subprocess
import urllib.parse
import urllib.request

import pytest

from conftest import IDP_DIR, IDP_URL, TENANT, TESSERA, TESSERAD, Broker, run_cli, toml_value
from resource_servers import CA, GitServer, KubeAPI, SMTPServer, seeded_repository, token_user



def expire_access_token(idp, token):
    """The IdP ends the access token's life early (as after a policy change); the refresh token
    stays good. (RFC 7009 revocation of an access token also ends its refresh token at DOT.)"""
    conn = idp.db()
    try:
        changed = conn.execute("UPDATE oauth2_provider_accesstoken SET expires = '2000-01-01 00:00:00' "
                               "WHERE token = ?", (token,)).rowcount
        conn.commit()
    finally:
        conn.close()
    assert changed == 1
    assert token_user(token) is None


def with_tables(config_path, text):
    with open(config_path, "a") as f:
        f.write("\n" + text)
    return config_path


def helper_environment(tmp_path, base):
    """The environment git and kubectl run helpers in, from `base`: git-credential-tessera on PATH
    (a link to tessera, as scripts/install makes it), a HOME of its own, no terminal prompts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(TESSERA, bin_dir / "git-credential-tessera")
    home = tmp_path / "home"
    home.mkdir()
    return dict(base, PATH=f"{bin_dir}:{base['PATH']}", HOME=str(home), GIT_TERMINAL_PROMPT="0",
                GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="Alice", GIT_AUTHOR_EMAIL="alice@example.test",
                GIT_COMMITTER_NAME="Alice", GIT_COMMITTER_EMAIL="alice@example.test", GIT_SSL_CAINFO=CA)


@pytest.fixture
def helper_env(tmp_path):
    env = helper_environment(tmp_path, os.environ)
    env.pop("TESSERA_CONFIG", None)
    return env


# ----------------------------------------------------------------------------------------------
# git


def git(env, *args, cwd=None, check=True):
    proc = subprocess.run(["git", "-c", "credential.helper=", "-c", "credential.helper=tessera", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, f"git {' '.join(args)}: {proc.returncode}\n{proc.stderr}"
    return proc


def credential(env, action, text, *extra):
    return subprocess.run(["git-credential-tessera", *extra, action], input=text, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def git_server(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    seeded_repository(str(root / "repo.git"), str(tmp_path / "seed"))
    server = GitServer(str(root))
    yield server
    server.close()


def test_git_clones_and_pushes_with_tokens_from_tessera(start_daemon, write_config, git_server, helper_env, tmp_path,
                                                        idp):
    config = with_tables(write_config(), f'[[git]]\nurl = "{git_server.url}/"\nclient_id = "tessera-test"\n')
    helper_env["TESSERA_CONFIG"] = config
    start_daemon(config)
    b = Broker()
    signed_in = b.sign_in()

    work = tmp_path / "work"
    git(helper_env, "clone", "-q", f"{git_server.url}/repo.git", str(work))
    assert (work / "README").read_text() == "hello\n"
    (work / "NEW").write_text("from alice\n")
    git(helper_env, "add", "NEW", cwd=work)
    git(helper_env, "commit", "-qm", "alice's change", cwd=work)
    git(helper_env, "push", "-q", "origin", "main", cwd=work)
    pushed = subprocess.run(["git", "-C", os.path.join(git_server.root, "repo.git"), "log", "-1", "--format=%s"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert pushed == "alice's change"
    authorized = [r for r in git_server.requests if r[4] != 401]
    assert authorized and {r[3] for r in authorized} == {"alice"}
    assert {r[2] for r in authorized} == {"basic"}, "git 2.39 sends the token as the password"

    # The IdP ends the access token early: the server refuses it, git runs `erase`, and the next
    # `get` answers a new token, refreshed with the refresh token tesserad keeps.
    expire_access_token(idp, signed_in["access_token"])
    mark = idp.mark()
    failed = git(helper_env, "fetch", "-q", cwd=work, check=False)
    assert failed.returncode != 0 and "Authentication failed" in failed.stderr, failed.stderr
    assert len(idp.token_posts(mark, grant_type="refresh_token")) == 1, "erase makes tesserad refresh at once"
    git(helper_env, "fetch", "-q", cwd=work)
    assert b.silent()["access_token"] != signed_in["access_token"]
    b.close()


def test_git_credential_protocol(start_daemon, write_config, helper_env, idp):
    config = with_tables(write_config(), '[[git]]\nurl = "https://git.example.test/team/"\n'
                                         'username = "oauth2"\n')
    helper_env["TESSERA_CONFIG"] = config
    first = start_daemon(config)
    b = Broker()
    token = b.sign_in()["access_token"]

    got = credential(helper_env, "get", "protocol=https\nhost=git.example.test\npath=team/app.git\n\n")
    assert got.returncode == 0, got.stderr
    lines = dict(line.split("=", 1) for line in got.stdout.splitlines())
    assert lines["username"] == "oauth2" and lines["password"] == token
    assert abs(int(lines["password_expiry_utc"]) - b.silent()["expires_on"]) <= 1
    assert set(lines) == {"username", "password", "password_expiry_utc"}, "never a refresh token"

    # git 2.46+ announces authtype: a Bearer credential git must not store.
    bearer = credential(helper_env, "get", "capability[]=authtype\nprotocol=https\nhost=git.example.test\n"
                                           "path=team/x\nwwwauth[]=Bearer realm=\"x\"\n\n")
    assert bearer.stdout.splitlines()[:4] == ["capability[]=authtype", "authtype=Bearer", f"credential={token}",
                                              "ephemeral=true"]
    # Hosts without a [[git]] entry (or outside its path) get no answer: git asks its next helper.
    for other in ("protocol=https\nhost=github.com\n\n", "protocol=https\nhost=git.example.test\npath=other/x\n\n",
                  "protocol=http\nhost=git.example.test\npath=team/x\n\n"):
        none = credential(helper_env, "get", other)
        assert none.returncode == 0 and none.stdout == "" and none.stderr == "", other
    # store does nothing; unknown actions are ignored, as git-credential(1) asks.
    assert credential(helper_env, "store", f"protocol=https\nhost=git.example.test\npassword={token}\n\n").stdout == ""
    assert credential(helper_env, "frobnicate", "\n").returncode == 0
    # erase with a token that is not the cached one changes nothing.
    mark = idp.mark()
    assert credential(helper_env, "erase", "protocol=https\nhost=git.example.test\npath=team/x\n"
                                           "password=not-the-token\n\n").returncode == 0
    assert idp.token_posts(mark) == []
    # A broken [[git]] entry is reported on stderr, with the file and its line, and stdout stays
    # empty; tesserad refuses the same file (one rule for every reader of config.toml).
    broken = with_tables(write_config(name="broken.toml"), '[[git]]\nclient_id = "x"\n')
    line = open(broken).read().splitlines().index("[[git]]") + 1
    bad = credential(helper_env, "get", "protocol=https\nhost=h\n\n", "--config", broken)
    assert bad.returncode == 15 and bad.stdout == "", bad
    assert bad.stderr.startswith(f"tessera git-credential: {broken}:{line}: [[git]] has no url"), bad.stderr
    b.close()
    first.stop()
    refused = subprocess.run([TESSERAD, "--config", broken], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL)
    assert refused.returncode == 78, refused
    assert f"tesserad: bad configuration: {broken}:{line}: [[git]] has no url" in refused.stderr, refused.stderr


# ----------------------------------------------------------------------------------------------
# kubectl


def kubectl_version():
    if shutil.which("kubectl") is None:
        return None
    out = subprocess.run(["kubectl", "version", "--client", "-o", "json"], capture_output=True, text=True).stdout
    try:
        info = json.loads(out)["clientVersion"]
        return int(info["major"]), int(info["minor"].rstrip("+"))
    except (ValueError, KeyError):
        return None


def kubeconfig(path, server, api_version, interactive_mode=None, extra_args=()):
    exec_ = {"apiVersion": api_version, "command": TESSERA, "args": ["kube-credential", *extra_args]}
    if interactive_mode:
        exec_["interactiveMode"] = interactive_mode
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
              "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": CA}}],
              "users": [{"name": "me", "user": {"exec": exec_}}],
              "contexts": [{"name": "test", "context": {"cluster": "test", "user": "me"}}]}
    path.write_text(json.dumps(config))  # JSON is YAML
    return str(path)


def kubectl(env, config, with_terminal=False):
    cmd = ["kubectl", "--kubeconfig", config, "get", "--raw", "/api/v1/namespaces/default/pods"]
    if not with_terminal:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    # kubectl treats the session as interactive when its stdin is a terminal.
    primary, secondary = pty.openpty()
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, stdin=secondary)
    finally:
        os.close(primary)
        os.close(secondary)


def test_kubectl_exec_plugin_both_interactive_modes(daemon, helper_env, tmp_path, idp):
    version = kubectl_version()
    if version is None:
        pytest.fail("kubectl is not installed: scripts/test installs it (kubernetes-client) when missing")
    api = KubeAPI()
    try:
        modern = version >= (1, 22)  # ExecCredential v1 and interactiveMode
        api_version = "client.authentication.k8s.io/v1" if modern else "client.authentication.k8s.io/v1beta1"
        never = kubeconfig(tmp_path / "never.json", api.url, api_version, "Never" if modern else None)
        # Not signed in, not interactive: fails at once with one line, and no browser opens.
        mark = idp.mark()
        failed = kubectl(helper_env, never)
        assert failed.returncode != 0
        # One line per run of the plugin (kubectl itself may run it twice), saying what to do.
        ours = [line for line in failed.stderr.splitlines() if line.startswith("tessera:")]
        assert 1 <= len(ours) <= 2 and len(set(ours)) == 1, failed.stderr
        assert "kubectl runs non-interactively" in ours[0] and "tessera login" in ours[0], ours[0]
        assert not any("/authorize" in r["path"] for r in idp.requests(mark)), "no sign-in may start"

        if modern:
            # Interactive (a terminal): the plugin signs in through the browser, then answers.
            available = kubeconfig(tmp_path / "ifavailable.json", api.url, api_version, "IfAvailable")
            signed = kubectl(helper_env, available, with_terminal=True)
            assert signed.returncode == 0, signed.stderr
            assert json.loads(signed.stdout)["items"][0]["metadata"]["name"] == "pod-of-alice"
        else:
            Broker().sign_in()
        # Signed in now: the non-interactive mode works silently, and so does v1beta1.
        quiet = kubectl(helper_env, never)
        assert quiet.returncode == 0, quiet.stderr
        assert "pod-of-alice" in quiet.stdout and quiet.stderr == ""
        beta = kubeconfig(tmp_path / "beta.json", api.url, "client.authentication.k8s.io/v1beta1")
        assert kubectl(helper_env, beta).returncode == 0
        assert {r[3] for r in api.requests if r[4] == 200} == {"alice"}
        assert {r[2] for r in api.requests} == {"bearer"}
    finally:
        api.close()


def test_kube_credential_output(broker):
    broker.sign_in()
    for version in ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"):
        info = json.dumps({"kind": "ExecCredential", "apiVersion": version, "spec": {"interactive": False}})
        proc = subprocess.run([TESSERA, "kube-credential"], env=dict(os.environ, KUBERNETES_EXEC_INFO=info),
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        cred = json.loads(proc.stdout)
        assert cred["apiVersion"] == version and cred["kind"] == "ExecCredential"
        assert cred["status"]["token"] == broker.silent()["access_token"]
        stamp = cred["status"]["expirationTimestamp"]
        assert stamp.endswith("Z") and len(stamp) == 20, stamp
    # Not interactive and no account for that client: sign in first, exit status 4 as documented.
    info = json.dumps({"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1",
                       "spec": {"interactive": False}})
    none = subprocess.run([TESSERA, "kube-credential", "--authority", "https://127.0.0.1:1/nobody"],
                          env=dict(os.environ, KUBERNETES_EXEC_INFO=info), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert none.stdout == "" and none.returncode in (4, 6), none.stderr
    bad = subprocess.run([TESSERA, "kube-credential"], env=dict(os.environ, KUBERNETES_EXEC_INFO="{nope"),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 64 and bad.stdout == ""


# ----------------------------------------------------------------------------------------------
# Mail: msmtp with passwordeval, and tessera sasl


def msmtp(tmp_path, port, mechanism, passwordeval, env=None):
    rc = tmp_path / f"msmtprc-{mechanism}"
    rc.write_text(f"""defaults
tls off
account test
host 127.0.0.1
port {port}
from alice@example.test
auth {mechanism}
user alice
passwordeval "{passwordeval}"
account default : test
""")
    rc.chmod(0o600)
    message = "Subject: hello\n\nfrom Tessera's tests\n"
    return subprocess.run(["msmtp", "-C", str(rc), "bob@example.test"], input=message, capture_output=True,
                          text=True, timeout=60, env=env)


def test_msmtp_sends_with_xoauth2_and_oauthbearer(broker, tmp_path):
    if shutil.which("msmtp") is None:
        pytest.fail("msmtp is not installed: scripts/test installs it")
    broker.sign_in()
    smtp = SMTPServer()
    try:
        for mechanism in ("xoauth2", "oauthbearer"):
            sent = msmtp(tmp_path, smtp.port, mechanism, f"{TESSERA} token")
            assert sent.returncode == 0, sent.stderr
        assert len(smtp.messages) == 2
        assert [a for a in smtp.auth] == [("XOAUTH2", "alice", True), ("OAUTHBEARER", "alice", True)]
        # The server does check: a wrong token is refused.
        refused = msmtp(tmp_path, smtp.port, "xoauth2", "echo not-a-token")
        assert refused.returncode != 0 and smtp.auth[-1] == ("XOAUTH2", "alice", False)
        assert len(smtp.messages) == 2
    finally:
        smtp.close()


def test_sasl_initial_responses(broker):
    token = broker.sign_in()["access_token"]
    xo = base64.b64decode(run_cli("sasl", "--mech", "xoauth2", check_rc=0).stdout.strip())
    assert xo == f"user=alice\x01auth=Bearer {token}\x01\x01".encode()
    ob = run_cli("sasl", "--mech", "oauthbearer", "--user", "a,b=c", "--host", "mail.example.test", "--port", "587",
                 check_rc=0)
    assert base64.b64decode(ob.stdout.strip()) == (
        f"n,a=a=2Cb=3Dc,\x01host=mail.example.test\x01port=587\x01auth=Bearer {token}\x01\x01").encode()
    assert run_cli("sasl", "--mech", "plain").returncode == 64


# ----------------------------------------------------------------------------------------------
# tessera exec


def test_exec_puts_the_token_in_the_environment_only(broker):
    token = broker.sign_in()["access_token"]
    proc = run_cli("exec", "--env", "TOK", "--", "sh", "-c",
                   'printf "%s" "$TOK"; tr "\\0" " " < /proc/$$/cmdline >&2', check_rc=0)
    assert proc.stdout == token
    assert token not in proc.stderr, "the token is never in the command's arguments"
    assert run_cli("exec", "--", "sh", "-c", "exit 7").returncode == 7
    missing = run_cli("exec", "--", "no-such-command-tessera")
    assert missing.returncode == 127 and "no-such-command-tessera" in missing.stderr
    assert run_cli("exec", "--env", "1BAD", "--", "true").returncode == 64
    default = run_cli("exec", "--", "sh", "-c", 'test "$ACCESS_TOKEN" = "$0"', token)
    assert default.returncode == 0, default.stderr
