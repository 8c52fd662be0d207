"""`tessera forward` (issue 24): the desktop's tesserad serves a remote host over ssh, and a
container through a socket of its own. The "remote host" is this machine reached through a real
OpenSSH server (Tests/lib/tessera_sshd.py) as another user, tessera-b, who cannot read the test
session's files: on that side there is only a copy of the `tessera` binary, no tesserad, no
keyring, no session bus. A third user, tessera-c, plays anyone else on the remote host. Every
connection on a forward's listener is the app `forward:NAME@HOST`: it may get tokens (as the access
mode says) and nothing else, and no refresh token ever leaves this machine."""
import json
import os
import pty
import re
import select
import shutil
import signal
import stat
import subprocess
import time

import pytest

from conftest import TESSERA, Broker, run_cli, wait_until
from resource_servers import CA, KubeAPI
from test_access import PortalBackend
from test_integrations import git_server, kubectl_version  # noqa: F401  (the fixture)
from tessera_sshd import SSHServer, session_user, why_not
from glewlwyd import glewlwyd  # noqa: F401  (the fixture)
from test_dpop import NAME as DPOP_NAME, DPoPResource, dpop_config, proof_jkt
import requests

FORWARD_DIR = os.path.join(os.environ["XDG_RUNTIME_DIR"], "tessera", "forward")
REMOTE_USER = session_user("tessera-b")
OTHER_USER = session_user("tessera-c")
REMOTE_HOME = f"/home/{REMOTE_USER}"
REMOTE_BIN = f"{REMOTE_HOME}/bin"
REMOTE_TESSERA = f"{REMOTE_BIN}/tessera"
REMOTE_SOCKET = re.compile(r"^/tmp/tessera-fwd-[0-9a-f]{16}\.sock$")
# The remote login's PATH (sshd's default) with the copied tessera and git-credential-tessera first.
REMOTE_PATH = f"PATH={REMOTE_BIN}:/usr/local/bin:/usr/bin:/bin"
REFUSED = "may only get tokens"


class RemoteHost(SSHServer):
    """The sshd, its users, and what the remote user has of Tessera: the binary (with the git
    helper's name), the test CA and a config.toml of its own."""

    def install(self):
        entry = self.users[REMOTE_USER]
        os.makedirs(REMOTE_BIN, exist_ok=True)
        shutil.copy(TESSERA, REMOTE_TESSERA)
        os.chmod(REMOTE_TESSERA, 0o755)
        os.symlink("tessera", os.path.join(REMOTE_BIN, "git-credential-tessera"))
        shutil.copy(CA, os.path.join(REMOTE_HOME, "ca.pem"))
        self.chown(REMOTE_BIN, REMOTE_USER)
        os.chown(os.path.join(REMOTE_HOME, "ca.pem"), entry.pw_uid, entry.pw_gid)
        os.chmod(REMOTE_BIN, 0o755)  # tessera-c runs the same binary
        return self

    def write_config(self, text):
        """~tessera-b/.config/tessera/config.toml (0600): what the remote clients read themselves."""
        directory = os.path.join(REMOTE_HOME, ".config", "tessera")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "config.toml")
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o600)
        self.chown(os.path.join(REMOTE_HOME, ".config"), REMOTE_USER)

    def files_text(self):
        """Everything under ~tessera-b that is a file, as one string (to look for secrets in)."""
        parts = []
        for root, _, files in os.walk(REMOTE_HOME):
            for name in files:
                path = os.path.join(root, name)
                if os.path.islink(path) or not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
                with open(path, "rb") as f:
                    parts.append(f.read().decode("latin-1"))
        return "\n".join(parts)

    def clean(self):
        """What one test leaves on the remote side: its work tree, its config, stale sockets."""
        shutil.rmtree(os.path.join(REMOTE_HOME, "work"), ignore_errors=True)
        shutil.rmtree(os.path.join(REMOTE_HOME, ".config"), ignore_errors=True)
        uid = self.users[REMOTE_USER].pw_uid
        for name in os.listdir("/tmp"):
            path = os.path.join("/tmp", name)
            if name.startswith("tessera-fwd-") and os.lstat(path).st_uid == uid:
                os.unlink(path)


@pytest.fixture(scope="module")
def remote_host(tmp_path_factory):
    reason = why_not()
    if reason:
        if os.geteuid() == 0 and not os.path.isdir("/run/systemd/system"):
            # Here scripts/test installs OpenSSH's server itself (as in CI): missing, it is a failure.
            pytest.fail(reason)
        pytest.skip(reason)
    assert os.access(TESSERA, os.X_OK), f"{TESSERA} is missing: build it (swift build)"
    host = RemoteHost(tmp_path_factory.mktemp("sshd"), [REMOTE_USER, OTHER_USER])  # users a failure leaves: make_user
    try:
        host.install().start()
        hello = host.ssh("echo", "hello from", "$USER")
        assert hello.stdout == f"hello from {REMOTE_USER}\n", hello.stderr + host.log()
        # The remote user is another user indeed: the session's files (the IdP's CA and database,
        # the daemon's socket directory) are out of its reach.
        blocked = subprocess.run(["runuser", "-u", REMOTE_USER, "--", "test", "-x", os.environ["XDG_RUNTIME_DIR"]],
                                 cwd="/")
        assert blocked.returncode != 0, "the remote user can enter the session's XDG_RUNTIME_DIR"
        yield host
    finally:
        host.clean()
        host.close()


@pytest.fixture
def remote(remote_host):
    yield remote_host
    remote_host.clean()


def app_key(host, name="build01", destination=None):
    """The app a forward's callers are: its name and the host it leads to (issue 37)."""
    return f"forward:{name}@{destination or host.host}"


def forward(host, *command, name="build01", destination=None, timeout=90):
    """`tessera forward --name NAME HOST -F CONFIG -- COMMAND...`, waited for."""
    named = ["--name", name] if name else []
    return run_cli("forward", *named, destination or host.host, "-F", host.config, "--", *command, timeout=timeout)


def forward_in_background(host, *command, name="build01", destination=None):
    named = ["--name", name] if name else []
    return subprocess.Popen([TESSERA, "forward", *named, destination or host.host, "-F", host.config, "--", *command],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def first_line(proc, timeout=30):
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the remote command printed nothing"
    line = proc.stdout.readline()
    assert line, f"tessera forward ended early ({proc.wait()}): {proc.stderr.read()}"
    return line.strip()


def ended(proc, timeout=30):
    """The exit status of a `tessera forward` that has to end now, and its stderr."""
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"tessera forward did not end within {timeout} s")
    return rc, proc.stderr.read()


def store_kind_now():
    return json.loads(run_cli("status", "--json").stdout)["store_kind"]


def forwards():
    """tessera forward --list --json, by name."""
    return {f["name"]: f for f in json.loads(run_cli("forward", "--list", "--json", check_rc=0).stdout)}


def local_socket(name):
    return os.path.join(FORWARD_DIR, name)


def gone(path, name):
    """The forward is gone, its socket file with it: tesserad sees its owner's connection close a
    moment after `tessera forward` exits."""
    wait_until(lambda: not os.path.exists(path) and name not in forwards(), timeout=10,
               what=f"the forward {name} and {path} to go")


def remote_tessera(host, *args, name="build01"):
    return forward(host, REMOTE_TESSERA, *args, name=name)


def access_log():
    return json.loads(run_cli("access", "log", "--json", check_rc=0).stdout)


def grant(app):
    run_cli("access", "grant", "--app", app, "--client-id", "tessera-test", "--account", "alice", check_rc=0)


# ----------------------------------------------------------------------------------------------
# Tokens cross, refresh tokens do not


def test_a_remote_command_gets_the_desktops_token_and_no_refresh_token(daemon, remote, idp):
    b = Broker()
    token = b.sign_in()["access_token"]
    out = remote_tessera(remote, "token", "--client-id", "tessera-test")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == token == b.silent()["access_token"]
    whole = remote_tessera(remote, "token", "--json")
    assert whole.returncode == 0, whole.stderr
    assert json.loads(whole.stdout)["access_token"] == token

    refresh_tokens = [row[0] for row in idp.query("SELECT token FROM oauth2_provider_refreshtoken")]
    assert refresh_tokens, "the sign-in got a refresh token"
    seen = out.stdout + out.stderr + whole.stdout + whole.stderr + remote.files_text()
    assert not [t for t in refresh_tokens if t in seen], "a refresh token reached the remote host"
    # Each forward ended with its command: no listener here, no socket file there.
    gone(local_socket("build01"), "build01")
    uid = remote.users[REMOTE_USER].pw_uid
    left = [n for n in os.listdir("/tmp") if n.startswith("tessera-fwd-") and os.lstat(f"/tmp/{n}").st_uid == uid]
    assert not left, left
    # Open mode lets the forward through, and says so, with the host, in the audit.
    mine = [r for r in access_log() if r["app_key"] == app_key(remote)]
    assert mine and all(r["decision"] == "allowed" and r["reason"] == "open mode" for r in mine), mine
    assert all("tessera-remote" in r["app"] for r in mine), mine
    b.close()


# A remote command's own GetProof over the forward's socket, with a token it names (busctl, which
# speaks to the socket as the tessera CLI does): prints the proof as busctl does (s "..."), or the
# error busctl reports.
GET_PROOF = ('busctl --address="unix:path=$TESSERA_SOCKET" call org.tessera.Broker1 /org/tessera/Broker1 '
             'org.tessera.Broker1 GetProof "sssa{sv}" GET "$0" "$1" 0 2>&1')


def test_a_remote_command_gets_proofs_for_its_bound_token_and_another_forward_does_not(
        start_daemon, write_config, remote, glewlwyd):
    """Issue 40 through a forward: a token bound to the desktop's key (DPoP at glewlwyd) is used on
    the remote host with proofs the desktop's tesserad signs for it (the key stays here); a resource
    server that checks DPoP takes them. Another forward, which was never handed that token, gets no
    proof for it."""
    start_daemon(dpop_config(write_config, glewlwyd))
    assert run_cli("login", "--provider", DPOP_NAME, timeout=120).returncode == 0
    resource = DPoPResource(glewlwyd)
    try:
        out = forward(remote, "sh", "-c",
                      f"{REMOTE_TESSERA} token --provider {DPOP_NAME} && {REMOTE_TESSERA} proof --provider {DPOP_NAME}"
                      f" --method GET --url {resource.url} --nonce {resource.nonce}")
        assert out.returncode == 0, out.stderr
        at, proof = out.stdout.split()
        assert proof_jkt(proof) == glewlwyd.access_token_jkt(at), "the proof is signed by the token's key"
        r = requests.get(resource.url, headers={"Authorization": f"DPoP {at}", "DPoP": proof},
                         verify=os.environ["TESSERA_IDP_CA"], timeout=30)
        assert r.status_code == 200, (r.text, resource.refusals)
        # The same token, asked for by a forward that never got it.
        other = forward(remote, "sh", "-c", GET_PROOF, resource.url, at, name="other")
        assert other.returncode != 0 and "GetProof" not in other.stdout, other.stdout
        assert "other (forwarded over ssh to tessera-remote) was not handed this token" in other.stdout, other.stdout
        # A forward of the name that got it (the app build01@host) still does, through a raw call too.
        again = forward(remote, "sh", "-c", GET_PROOF, resource.url, at)
        assert again.returncode == 0 and again.stdout.startswith('s "'), again.stdout
        assert proof_jkt(again.stdout.strip()[3:-1]) == proof_jkt(proof), again.stdout
        # The token and the key stay out of what is recorded and of the remote host's files.
        assert at not in json.dumps(access_log())
        assert at not in run_cli("status", "--json", check_rc=0).stdout
        assert proof not in remote.files_text() and at not in remote.files_text()
    finally:
        resource.close()


def test_a_remote_command_drops_a_token_it_was_refused(daemon, remote, idp):
    """Issue 38 §5 through a forward: a program on the remote host that got a 401 drops the token
    with `tessera token --reject`; the desktop's next token is a new one."""
    b = Broker()
    first = b.sign_in()["access_token"]
    out = forward(remote, "sh", "-c",
                  f"printf %s '{first}' | {REMOTE_TESSERA} token --reject --json --client-id tessera-test")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"dropped": True}
    assert b.silent()["access_token"] != first
    b.close()


def test_git_on_the_remote_host_clones_with_the_credential_helper(daemon, remote, git_server):  # noqa: F811
    b = Broker()
    b.sign_in()
    # The git helper reads [[git]] from the config.toml of the machine git runs on: the remote's own.
    remote.write_config(f'[[git]]\nurl = "{git_server.url}/"\nclient_id = "tessera-test"\n')
    work = os.path.join(REMOTE_HOME, "work")
    out = forward(remote, "env", REMOTE_PATH, "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1",
                  f"GIT_SSL_CAINFO={REMOTE_HOME}/ca.pem", "git", "-c", "credential.helper=", "-c",
                  "credential.helper=tessera", "clone", "-q", f"{git_server.url}/repo.git", work)
    assert out.returncode == 0, out.stderr
    with open(os.path.join(work, "README")) as f:
        assert f.read() == "hello\n"
    assert os.stat(work).st_uid == remote.users[REMOTE_USER].pw_uid
    authorized = [r for r in git_server.requests if r[4] != 401]
    assert authorized and {r[3] for r in authorized} == {"alice"}
    assert {r[2] for r in authorized} == {"basic"}
    b.close()


def test_kubectl_on_the_remote_host_uses_the_exec_plugin(daemon, remote):
    version = kubectl_version()
    assert version is not None, "kubectl is not installed: scripts/test installs it (kubernetes-client)"
    b = Broker()
    b.sign_in()
    api = KubeAPI()
    try:
        api_version = "client.authentication.k8s.io/v1" if version >= (1, 22) else "client.authentication.k8s.io/v1beta1"
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
                  "clusters": [{"name": "test", "cluster": {"server": api.url,
                                                            "certificate-authority": f"{REMOTE_HOME}/ca.pem"}}],
                  "users": [{"name": "me", "user": {"exec": {
                      "apiVersion": api_version, "command": REMOTE_TESSERA,
                      "args": ["kube-credential", "--client-id", "tessera-test"],
                      **({"interactiveMode": "Never"} if version >= (1, 22) else {})}}}],
                  "contexts": [{"name": "test", "context": {"cluster": "test", "user": "me"}}]}
        path = os.path.join(REMOTE_HOME, "kube.json")
        with open(path, "w") as f:
            json.dump(config, f)
        entry = remote.users[REMOTE_USER]
        os.chown(path, entry.pw_uid, entry.pw_gid)
        try:
            out = forward(remote, "env", f"HOME={REMOTE_HOME}", "kubectl", "--kubeconfig", path, "get", "--raw",
                          "/api/v1/namespaces/default/pods")
        finally:
            os.unlink(path)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["items"][0]["metadata"]["name"] == "pod-of-alice"
        assert {r[3] for r in api.requests if r[4] == 200} == {"alice"}
    finally:
        api.close()
        b.close()


def test_an_interactive_login_shell_gets_the_socket_and_its_exit_status_comes_back(daemon, remote):
    b = Broker()
    token = b.sign_in()["access_token"]
    # With a terminal and no command, ssh gets -t and the remote user's login shell runs.
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([TESSERA, "forward", "--name", "build01", remote.host, "-F", remote.config],
                            stdin=secondary, stdout=secondary, stderr=secondary, close_fds=True)
    os.close(secondary)
    seen = b""
    try:
        os.write(primary, f'echo "SOCKET=$TESSERA_SOCKET"; {REMOTE_TESSERA} token --client-id tessera-test; '
                          f'echo DONE; exit 3\n'.encode())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([primary], [], [], 1)
            if ready:
                try:
                    seen += os.read(primary, 65536)
                except OSError:
                    break
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(primary)
    text = seen.decode(errors="replace")
    assert rc == 3, text
    assert re.search(r"SOCKET=/tmp/tessera-fwd-[0-9a-f]{16}\.sock", text), text
    assert token in text, text
    gone(local_socket("build01"), "build01")
    b.close()


def test_a_chosen_remote_socket_path_is_used_and_removed(daemon, remote):
    path = f"/tmp/tessera-chosen-{os.getpid()}.sock"
    out = run_cli("forward", "--name", "build01", "--remote-socket", path, remote.host, "-F", remote.config, "--",
                  "sh", "-c", 'echo "$TESSERA_SOCKET"; test -S "$TESSERA_SOCKET"', timeout=90)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == path
    assert not os.path.exists(path), "the wrapper removes the socket ssh left"
    relative = run_cli("forward", "--remote-socket", "tmp/x.sock", remote.host)
    assert relative.returncode == 64 and "absolute" in relative.stderr


# ----------------------------------------------------------------------------------------------
# What a forward may not do


def test_a_forward_may_only_get_tokens(daemon, remote, idp):
    b = Broker()
    alice = b.sign_in()["account"]
    # Granted alice, so that each command below gets as far as the call it is about.
    grant(app_key(remote))
    mark, device_grants = idp.mark(), idp.last_device_grant()
    for command in (["logout", "--account", alice["id"], "--no-revoke"],
                    ["logout", "--account", alice["id"]],
                    ["access", "grant", "--app", app_key(remote), "--client-id", "tessera-other", "--account",
                     alice["id"]],
                    ["access", "list"],
                    ["access", "revoke", "--app", app_key(remote), "--account", alice["id"]],
                    ["access", "log"],
                    ["status"],
                    ["account", "use", alice["id"]],
                    ["login"],
                    ["login", "--device-code"],
                    ["store", "migrate", "--to", "file"],
                    ["forward", "--socket", "/tmp/tessera-fwd-from-remote.sock", "--name", "onward"],
                    ["forward", "--stop", "build01"],
                    ["forward", "--list"]):
        out = remote_tessera(remote, *command)
        said = out.stdout + out.stderr
        assert out.returncode == 12 and REFUSED in said, (command, out.returncode, said)
        assert "build01" in said, (command, said)
        if command == ["status"]:
            assert "tesserad is running, but does not report its status" in said, said
    status = json.loads(remote_tessera(remote, "status", "--json").stdout)
    assert status["running"] is True and REFUSED in status["reason"], status
    # Nothing happened: still signed in, no sign-in started (a browser tesserad opened would have
    # asked the IdP's /authorize; a device code is a device grant), no grant added.
    assert [a["id"] for a in b.accounts()] == [alice["id"]]
    assert not any("/authorize" in r["path"] for r in idp.requests(mark)), "a sign-in started"
    assert idp.last_device_grant() == device_grants, "a device code was asked for"
    grants = json.loads(run_cli("access", "list", "--json", check_rc=0).stdout)
    assert not any(g["client_id"] == "tessera-other" for g in grants), grants
    # Every refusal is audited: in the access log, as the forward (with its host) and the method.
    records = json.loads(run_cli("access", "log", "--json", check_rc=0).stdout)
    refused = {r["operation"] for r in records if r["app_key"] == app_key(remote) and r["decision"] == "refused"}
    assert {"SignOut", "Grant", "ListGrants", "RevokeGrant", "GetAccessLog", "GetStatus", "SetCurrentAccount",
            "AcquireToken", "MoveStore", "AddForward", "RemoveForward", "ListForwards"} <= refused, refused
    assert list(forwards()) == [], "a forward made or ended from the remote host"
    assert store_kind_now() == "secret-service", "the store moved"
    assert all("tessera-remote" in r["app"] for r in records if r["app_key"] == app_key(remote)), records

    # bob signs in on the desktop: the forward still sees only the account it was granted.
    b.sign_in("bob")
    listed = remote_tessera(remote, "accounts", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [a["username"] for a in json.loads(listed.stdout)] == ["alice"]
    b.close()


def test_confirm_mode_asks_once_naming_the_forward_and_its_host(start_daemon, write_config, remote, tmp_path):
    portal = PortalBackend(tmp_path)
    try:
        start_daemon(write_config(access_mode="confirm"), extra_env=portal.env)
        b = Broker()
        b.sign_in()
        asking = forward_in_background(remote, REMOTE_TESSERA, "token")
        wait_until(lambda: portal.calls("AccessDialog"), timeout=30, what="the portal's access dialog")
        (dialog,) = portal.calls("AccessDialog")
        text = " ".join((dialog["title"], dialog["subtitle"], dialog["body"]))
        assert "build01" in text and "forwarded over ssh" in text and "tessera-remote" in text, dialog
        portal.answer(dialog["handle"], 1)  # Deny
        rc, err = ended(asking, timeout=60)
        assert rc == 12 and "You declined" in err, err
        assert asking.stdout.read() == ""
        # Declined a moment ago: refused again without asking.
        again = remote_tessera(remote, "token")
        assert again.returncode == 12 and again.stdout == "", again.stderr
        assert len(portal.calls("AccessDialog")) == 1, "asked twice"
        mine = [r for r in access_log() if r["app_key"] == app_key(remote)]
        assert any(r["decision"] == "refused" and r["reason"] == "user" for r in mine), mine
        assert all("tessera-remote" in r["app"] for r in mine), mine
        b.close()
    finally:
        portal.close()


def test_strict_mode_refuses_a_forward_until_it_is_granted(start_daemon, write_config, remote):
    start_daemon(write_config(access_mode="strict"))
    b = Broker()
    token = b.sign_in()["access_token"]
    refused = remote_tessera(remote, "token")
    assert refused.returncode == 12 and refused.stdout == "", refused.stderr
    assert f"--app '{app_key(remote)}'" in refused.stderr, refused.stderr
    assert token not in refused.stderr
    # The grant is the forward's name and its host: a later `tessera forward --name build01` to the
    # same host has it.
    grant(app_key(remote))
    allowed = remote_tessera(remote, "token")
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.strip() == token
    listed = json.loads(run_cli("access", "list", "--json", check_rc=0).stdout)
    assert [g["host"] for g in listed if g["app"] == app_key(remote)] == [remote.host], listed
    # Another name is another app.
    assert remote_tessera(remote, "token", name="build02").returncode == 12
    # So is the same name forwarded to another host (issue 37: a grant keyed on the name alone was
    # inherited by `tessera forward other-host --name build01`). Refused, saying why.
    other = f"{REMOTE_USER}@{remote.host}"
    elsewhere = forward(remote, REMOTE_TESSERA, "token", destination=other)
    assert elsewhere.returncode == 12 and elsewhere.stdout == "", elsewhere.stderr
    assert f"was granted for {remote.host}, not for {other}" in elsewhere.stderr, elsewhere.stderr
    assert f"--app '{app_key(remote, destination=other)}'" in elsewhere.stderr, elsewhere.stderr
    refusals = [r for r in access_log() if r["app_key"] == app_key(remote, destination=other)]
    assert refusals and refusals[-1]["reason"] == "strict, forward name granted for another host", refusals
    # Revoking the name without a host revokes it for every host.
    run_cli("access", "revoke", "--app", "forward:build01", check_rc=0)
    assert remote_tessera(remote, "token").returncode == 12
    b.close()


# ----------------------------------------------------------------------------------------------
# How long a forward lives


def test_a_forward_lives_as_long_as_its_ssh(daemon, remote):
    keep = ["sh", "-c", 'echo "$TESSERA_SOCKET"; exec sleep 60']

    # While it runs: listed, with its socket here (0600 in a 0700 directory) and there.
    running = forward_in_background(remote, *keep)
    remote_path = first_line(running)
    assert REMOTE_SOCKET.match(remote_path), remote_path
    st = os.lstat(remote_path)
    assert stat.S_ISSOCK(st.st_mode) and st.st_mode & 0o777 == 0o600
    assert st.st_uid == remote.users[REMOTE_USER].pw_uid
    entry = wait_until(lambda: forwards().get("build01"), what="the forward in --list")
    assert entry["host"] == "tessera-remote" and entry["path"] == local_socket("build01"), entry
    assert entry["lasting"] is False and entry["owner_pid"] == running.pid, entry
    assert isinstance(entry["connections"], int) and abs(entry["since"] - time.time()) < 60, entry
    assert stat.S_IMODE(os.stat(FORWARD_DIR).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(local_socket("build01")).st_mode) == 0o600
    # For people: one row with its name, where it leads, and how it ends (piped: tab-separated).
    rows = [line.split("\t") for line in run_cli("forward", "--list", check_rc=0).stdout.splitlines()]
    assert [r[:2] for r in rows] == [["build01", "tessera-remote"]], rows
    assert f"pid {running.pid}" in rows[0][4] and rows[0][5] == local_socket("build01"), rows
    # A second forward of the same name is refused while this one lives.
    twice = forward(remote, "true")
    assert twice.returncode != 0 and "build01" in twice.stderr, twice.stderr

    # --stop: ssh is ended, then the command, and the listener and its file are gone.
    run_cli("forward", "--stop", "build01", check_rc=0)
    rc, err = ended(running)
    assert rc in (143, 255), (rc, err)  # ssh's own status on SIGTERM
    gone(local_socket("build01"), "build01")
    unknown = run_cli("forward", "--stop", "build01")
    assert unknown.returncode != 0 and "build01" in unknown.stderr, unknown.stderr

    # ssh killed: the command ends with 128+9 and cleans up the same way.
    running = forward_in_background(remote, *keep)
    first_line(running)
    wait_until(lambda: os.path.exists(local_socket("build01")), what="the forward's socket")
    ssh_pid = wait_until(lambda: subprocess.run(["pgrep", "-P", str(running.pid), "-x", "ssh"], capture_output=True,
                                                text=True).stdout.split(), what="the ssh child")
    os.kill(int(ssh_pid[0]), signal.SIGKILL)
    rc, err = ended(running)
    assert rc == 137, (rc, err)
    gone(local_socket("build01"), "build01")

    # `tessera forward` asked to end (SIGTERM; SIGHUP when its terminal closes): it ends ssh and
    # then itself, with ssh's status, and no ssh is left behind.
    running = forward_in_background(remote, *keep)
    first_line(running)
    ssh_pid = wait_until(lambda: subprocess.run(["pgrep", "-P", str(running.pid), "-x", "ssh"], capture_output=True,
                                                text=True).stdout.split(), what="the ssh child")
    running.send_signal(signal.SIGTERM)
    rc, err = ended(running)
    assert rc in (143, 255), (rc, err)
    assert not os.path.exists(f"/proc/{ssh_pid[0]}"), "ssh outlived its tessera forward"
    gone(local_socket("build01"), "build01")

    # The remote command ends: its status is the forward's, and the wrapper removed the remote socket.
    out = forward(remote, "sh", "-c", 'echo "$TESSERA_SOCKET"; test -S "$TESSERA_SOCKET" && exit 7')
    assert out.returncode == 7, out.stderr
    remote_path = out.stdout.strip()
    assert REMOTE_SOCKET.match(remote_path) and not os.path.exists(remote_path), remote_path
    gone(local_socket("build01"), "build01")
    # Words reach the command as they were given: no second round of shell parsing.
    words = forward(remote, "printf", "%s|", "it's $HOME", "a  b", "*")
    assert words.returncode == 0 and words.stdout == "it's $HOME|a  b|*|", words.stdout + words.stderr


def test_a_forward_made_over_the_session_bus_serves_and_ends_the_same(daemon, remote):
    b = Broker()
    token = b.sign_in()["access_token"]
    # `--bus`: the forward belongs to a session-bus connection instead of one on the socket.
    out = run_cli("--bus", "forward", "--name", "viabus", remote.host, "-F", remote.config, "--", REMOTE_TESSERA,
                  "token", "--client-id", "tessera-test", timeout=90)
    assert out.returncode == 0 and out.stdout.strip() == token, out.stderr
    gone(local_socket("viabus"), "viabus")  # it ended with its ssh
    running = subprocess.Popen([TESSERA, "--bus", "forward", "--name", "viabus", remote.host, "-F", remote.config,
                                "--", "sh", "-c", 'echo "$TESSERA_SOCKET"; exec sleep 60'],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert REMOTE_SOCKET.match(first_line(running))
    wait_until(lambda: forwards().get("viabus"), what="the forward in --list")
    # --stop reaches its owner on the bus (ForwardEnded, to that connection alone), which ends ssh.
    run_cli("forward", "--stop", "viabus", check_rc=0)
    rc, err = ended(running)
    assert rc in (143, 255), (rc, err)
    assert "viabus" in err and "ended" in err, err
    assert "viabus" not in forwards() and not os.path.exists(local_socket("viabus"))
    b.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user (CI runs as root)")
def test_another_local_user_is_closed_at_a_forwards_listener_before_a_byte_is_read(daemon):
    from test_direct_socket import NOBODY, assert_closed_unread_for_nobody
    # A container's socket in a directory others may enter, the socket itself opened to all: only
    # tesserad's own check is left (rootful docker's uid 0 meets the same check as this one).
    directory = f"/tmp/tessera-ctr-{os.getpid()}"
    os.mkdir(directory, 0o755)
    path = os.path.join(directory, "tessera.sock")
    try:
        run_cli("forward", "--socket", path, "--name", "openbox", check_rc=0)
        os.chmod(path, 0o777)
        assert_closed_unread_for_nobody(path)
        wait_until(lambda: f"Closed a direct connection from user {NOBODY}" in daemon.log(),
                   what="tesserad to log the refused connection")
    finally:
        run_cli("forward", "--stop", "openbox")
        shutil.rmtree(directory, ignore_errors=True)


def test_a_name_is_free_again_as_soon_as_its_forward_ends(daemon, remote):
    # Back to back, as a script runs them: each `tessera forward` finds the name free, although
    # tesserad may not have read the end of the one before yet.
    for _ in range(5):
        out = forward(remote, "true")
        assert out.returncode == 0, out.stderr


def test_options_that_would_outlive_the_forward_are_refused(daemon):
    for option in (["-f"], ["-N"], ["-O", "exit"], ["-W", "localhost:22"]):
        out = run_cli("forward", "--name", "build01", "tessera-remote", *option, "--", "true")
        # A usage error (docs/man/tessera.1, EXIT STATUS: 64), before ssh runs or a listener is made.
        assert out.returncode == 64 and option[0] in out.stderr, (option, out.returncode, out.stderr)
    assert forwards() == {}


# ----------------------------------------------------------------------------------------------
# Others on the remote host


def test_another_user_on_the_remote_host_cannot_use_the_forward(daemon, remote):
    b = Broker()
    token = b.sign_in()["access_token"]
    # No --name: the forward is named after the host, without the user.
    running = forward_in_background(remote, "sh", "-c", 'echo "$TESSERA_SOCKET"; exec sleep 60', name=None,
                                    destination=f"{REMOTE_USER}@{remote.host}")
    try:
        path = first_line(running)
        entry = wait_until(lambda: forwards().get("tessera-remote"), what="the forward named after its host")
        assert entry["path"] == local_socket("tessera-remote"), entry
        # The remote user's other sessions may use it (it is theirs) ...
        own = remote.ssh(f"TESSERA_SOCKET={path} {REMOTE_TESSERA} token")
        assert own.returncode == 0 and own.stdout.strip() == token, own.stderr
        # ... another user's client refuses the socket before sending a byte ...
        env = ["env", "-i", f"TESSERA_SOCKET={path}", "PATH=/usr/bin:/bin", f"HOME=/home/{OTHER_USER}"]
        other = subprocess.run(["runuser", "-u", OTHER_USER, "--", *env, REMOTE_TESSERA, "token"], cwd="/",
                               capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert other.returncode == 12 and other.stdout == "", other.stderr
        uid = remote.users[REMOTE_USER].pw_uid
        assert REMOTE_USER in other.stderr or f"user {uid}" in other.stderr, other.stderr
        # ... and the kernel would not let it connect anyway (the socket is 0600).
        probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
                 "    print('connected')\nexcept OSError as e:\n    print(e.errno)\n")
        raw = subprocess.run(["runuser", "-u", OTHER_USER, "--", "/usr/bin/python3", "-c", probe, path], cwd="/",
                             capture_output=True, text=True, timeout=30)
        assert raw.stdout.strip() == "13", raw.stdout + raw.stderr  # EACCES
        assert not any(r["app_key"].startswith("forward:tessera-remote@") and r["decision"] == "refused"
                       for r in access_log())
    finally:
        run_cli("forward", "--stop", "tessera-remote")
        ended(running)
    b.close()


# ----------------------------------------------------------------------------------------------
# A container


def in_container(directory, *argv):
    """Runs argv in bubblewrap with mount, pid, network and IPC namespaces of its own, the host's
    /usr and /etc read-only, tessera at /opt/tessera, and `directory` (which holds the forward's
    socket) at /run/tessera: as a container with a bind-mounted socket, running as the user."""
    bwrap = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent",
             "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
             "--symlink", "usr/lib64", "/lib64", "--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev",
             "--tmpfs", "/tmp", "--tmpfs", "/run", "--bind", directory, "/run/tessera",
             "--ro-bind", TESSERA, "/opt/tessera", "--unsetenv", "XDG_RUNTIME_DIR",
             "--unsetenv", "DBUS_SESSION_BUS_ADDRESS", "--unsetenv", "XDG_CONFIG_HOME", "--unsetenv", "TESSERA_CONFIG",
             "--setenv", "HOME", "/tmp", "--setenv", "TESSERA_SOCKET", "/run/tessera/tessera.sock", "--chdir", "/tmp"]
    return subprocess.run(bwrap + ["--", *argv], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None, reason="needs root and bwrap (CI has them)")
def test_a_container_forward_serves_another_mount_namespace(start_daemon, write_config, tmp_path, idp):
    start_daemon(write_config(access_mode="strict"))
    b = Broker()
    token = b.sign_in()["access_token"]
    directory = tmp_path / "ctr"
    directory.mkdir(mode=0o700)
    path = str(directory / "tessera.sock")
    made = run_cli("forward", "--socket", path, "--name", "devbox", timeout=30, check_rc=0)
    assert made.stdout.strip() == path
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode) and st.st_mode & 0o777 == 0o600
    entry = forwards()["devbox"]
    assert entry["lasting"] is True and entry["path"] == path and "owner_pid" not in entry, entry

    inside = in_container(str(directory), "readlink", "/proc/self/ns/mnt")
    assert inside.returncode == 0 and inside.stdout.strip() != os.readlink("/proc/self/ns/mnt"), inside
    refused = in_container(str(directory), "/opt/tessera", "token")
    assert refused.returncode == 12 and refused.stdout == "", refused.stderr
    assert "--app 'forward:devbox'" in refused.stderr, refused.stderr
    grant("forward:devbox")
    allowed = in_container(str(directory), "/opt/tessera", "token")
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.strip() == token == b.silent()["access_token"]
    # Granted tokens, still no sign-in from in there.
    mark = idp.mark()
    login = in_container(str(directory), "/opt/tessera", "login")
    assert login.returncode == 12 and REFUSED in login.stderr, login.stderr
    assert not any("/authorize" in r["path"] for r in idp.requests(mark)), "a sign-in started"
    log = access_log()
    assert any(r["app_key"] == "forward:devbox" and r["decision"] == "allowed" for r in log), log
    assert not any(r["app_key"].startswith("exe:/opt/") for r in log), "the forward is the app, not the program"

    # It outlives the command that made it, until --stop.
    wait_until(lambda: forwards()["devbox"]["connections"] == 0, what="the container's connections to close")
    run_cli("forward", "--stop", "devbox", check_rc=0)
    assert not os.path.exists(path) and "devbox" not in forwards()
    gone = in_container(str(directory), "/opt/tessera", "token")
    assert gone.returncode == 14, gone.stderr
    b.close()


# ----------------------------------------------------------------------------------------------
# A crowd through a forward (issue 37 §2)


def test_a_crowd_through_a_forward_leaves_local_callers_their_slots(daemon, tmp_path):
    """A remote user (or root on the remote host) opens as many connections through a forward as
    it likes and never speaks. A forward has a bound of its own, well below the local one: local
    `tessera` commands over tesserad's socket are still served. (Forward connections counted
    against the local bound: the crowd took every slot, and local commands were refused.)"""
    import resource
    import socket
    b = Broker()
    token = b.sign_in()["access_token"]
    directory = tmp_path / "crowd"
    directory.mkdir(mode=0o700)
    path = str(directory / "tessera.sock")
    run_cli("forward", "--socket", path, "--name", "crowd", timeout=30, check_rc=0)
    crowd = 1100  # past the local bound at any descriptor limit (1024 at most)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < crowd + 256:
        pytest.skip(f"the descriptor limit ({hard}) is too low to open {crowd} connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, crowd + 256), hard))
    sockets = []
    try:
        for _ in range(crowd):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            sockets.append(s)

        def closed(s):
            try:
                return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                return False  # held: nothing to read yet

        def held():
            # Asked over the session bus: the socket is what is under test.
            listing = subprocess.run([TESSERA, "--bus", "forward", "--list", "--json"], capture_output=True,
                                     text=True, timeout=30, stdin=subprocess.DEVNULL)
            assert listing.returncode == 0, listing.stderr
            return {f["name"]: f for f in json.loads(listing.stdout)}["crowd"]["connections"]

        # Every connection of the crowd is either held by tesserad or closed by it, unread.
        state = {}

        def settled():
            state["held"], state["closed"] = held(), sum(1 for s in sockets if closed(s))
            return state["held"] + state["closed"] == crowd

        wait_until(settled, timeout=60, what="tesserad to hold or close every connection of the crowd")
        assert 4 <= state["held"] <= 64, state
        # Local commands over tesserad's own socket are served.
        for _ in range(3):
            got = run_cli("token", timeout=30)
            assert got.returncode == 0, got.stderr
            assert got.stdout.strip() == token
        assert "Closed a connection through forward crowd" in daemon.log()
    finally:
        for s in sockets:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        run_cli("forward", "--stop", "crowd")
        b.close()
