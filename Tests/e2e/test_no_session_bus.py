"""Tessera with no session bus at all (issue 23): an SSH login without dbus-user-session, a
container. No DBUS_SESSION_BUS_ADDRESS and nothing at $XDG_RUNTIME_DIR/bus, so no Secret Service
either: tesserad serves its own socket alone and keeps accounts in its file store. Everything the
CLI does is done here through it: device-code and browser sign-in, silent tokens, accounts, the
current account, access grants and refusals, the git, kubectl, SASL and exec helpers, a restart that
needs no new sign-in, and sign-out; and the real programs that call the helpers (git, kubectl, msmtp)
work there as they do on a desktop."""
import base64
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import threading

import dbus
import dbus.connection
import pytest

from conftest import BUS_NAME, ERROR_PREFIX, IFACE, OBJECT_PATH, TESSERA, TESSERAD, wait_until
from resource_servers import KubeAPI, SMTPServer
from test_integrations import git_server  # noqa: F401 (a fixture)
from test_integrations import git, helper_environment, kubeconfig, kubectl, kubectl_version, msmtp

CODE_RE = re.compile(r"\b(?=[A-Z0-9-]*[A-Z])[A-Z0-9]{4,}(?:-[A-Z0-9]{4,})?\b")


class Bare:
    """tesserad and the CLI in an environment with no session bus."""

    def __init__(self, tmp_path, config, browser):
        self.runtime = tmp_path / "run"
        self.runtime.mkdir(mode=0o700)
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("DBUS_SESSION_BUS_ADDRESS", "TESSERA_CONFIG", "CREDENTIALS_DIRECTORY")}
        self.env.update(XDG_RUNTIME_DIR=str(self.runtime), XDG_STATE_HOME=str(tmp_path / "state"),
                        XDG_CONFIG_HOME=str(tmp_path / "config"), TESSERA_TEST_BROWSER_FILE=browser.path,
                        TESSERA_CONFIG=config)
        self.socket = str(self.runtime / "tessera" / "bus")
        self.log_path = tmp_path / "tesserad.log"
        self.proc = None

    def start(self):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([TESSERAD, "--config", self.env["TESSERA_CONFIG"]], stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, env=self.env)
        log.close()
        wait_until(lambda: self.proc.poll() is not None or self.cli("status").returncode in (0, 4),
                   what="tesserad to serve its socket")
        assert self.proc.poll() is None, self.log()
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(20)
        rc = self.proc.returncode if self.proc else None
        self.proc = None
        return rc

    def log(self):
        return self.log_path.read_text(errors="replace")

    def cli(self, *args, stdin=None, env=None, timeout=120):
        return subprocess.run([TESSERA, *args], capture_output=True, text=True, timeout=timeout,
                              input=stdin, env=dict(self.env, **(env or {})))

    def ok(self, *args, **kw):
        out = self.cli(*args, **kw)
        assert out.returncode == 0, f"tessera {' '.join(args)}: rc {out.returncode}\n{out.stderr}"
        return out.stdout

    def device_login(self, idp, user, client="tessera-device"):
        device_code_login(idp, user, [TESSERA, "login", "--device-code", "--client-id", client, "--timeout", "60"],
                          env=self.env)


def device_code_login(idp, user, argv, env=None):
    """Runs `argv` (a `tessera login --device-code` command line) and approves the code it prints
    at the test IdP as `user`; it must sign `user` in."""
    since = idp.last_device_grant()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=30)
            codes = [c for c in CODE_RE.findall(line) if c in idp.pending_user_codes(since)]
            if codes:
                idp.approve_device(codes[0], "--user", user)
                break
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and user in out, out


@pytest.fixture
def bare(tmp_path, write_config, browser):
    config = write_config(store="auto", default_client_id="tessera-test", default_scopes=["read"])
    b = Bare(tmp_path, config, browser)
    assert not os.path.exists(os.path.join(b.env["XDG_RUNTIME_DIR"], "bus"))
    yield b
    rc = b.stop()
    assert rc in (None, 0), f"tesserad ended with {rc}:\n{b.log()[-3000:]}"


def test_without_a_session_bus_every_command_and_helper_works(bare, idp, tmp_path):
    bare.start()
    report = json.loads(bare.cli("status", "--json").stdout)
    assert report["running"] and report["connection"] == "socket", report
    assert report["microsoft_broker"] == "no_session_bus" and report["store_kind"] == "file", report
    assert "serving its own socket alone" in bare.log()

    # Sign-in: device code (no browser on an SSH box), then a browser sign-in for a second account.
    bare.device_login(idp, "alice")
    assert len(bare.ok("token", "--client-id", "tessera-device").strip()) >= 20
    bare.ok("login", "--login-hint", "bob@example.test")
    accounts = json.loads(bare.ok("accounts", "--json"))
    assert sorted(a["username"] for a in accounts) == ["alice", "bob"], accounts
    bare.ok("account", "use", "bob")
    token = bare.ok("token").strip()

    # Helpers: kubectl, SASL, exec, git.
    info = json.dumps({"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1",
                       "spec": {"interactive": False}})
    cred = json.loads(bare.ok("kube-credential", env={"KUBERNETES_EXEC_INFO": info}))
    assert cred["status"]["token"] == token
    xo = base64.b64decode(bare.ok("sasl", "--mech", "xoauth2").strip())
    assert xo == f"user=bob\x01auth=Bearer {token}\x01\x01".encode()
    assert bare.ok("exec", "--env", "TOK", "--", "sh", "-c", 'printf "%s" "$TOK"') == token
    config = bare.env["TESSERA_CONFIG"]
    with open(config, "a") as f:
        f.write('\n[[git]]\nurl = "https://git.example.test/team/"\nusername = "oauth2"\n')
    got = bare.ok("git-credential", "get", stdin="protocol=https\nhost=git.example.test\npath=team/app.git\n\n")
    assert dict(line.split("=", 1) for line in got.splitlines())["password"] == token

    # Access control: in strict mode another program (this python, over the socket) is refused
    # and told how to grant it; granted, it is served the same token.
    bare.stop()
    with open(config) as f:
        text = re.sub(r'(?m)^access_mode = .*\n', "", f.read())
    with open(config, "w") as f:
        f.write('access_mode = "strict"\n' + text)  # a top-level key: before the [[git]] table
    bare.start()
    python = dbus.connection.Connection("unix:path=" + bare.socket)

    def silent():
        reply = python.call_blocking(BUS_NAME, OBJECT_PATH, IFACE, "AcquireTokenSilent", "sassa{sv}",
                                     ("tessera-test", dbus.Array([], signature="s"), "", {}), timeout=30)
        return str(reply["access_token"])

    with pytest.raises(dbus.exceptions.DBusException) as refused:
        silent()
    assert refused.value.get_dbus_name() == ERROR_PREFIX + "AccessDenied", refused.value
    key = re.search(r"tessera access grant --app '([^']+)'", refused.value.get_dbus_message()).group(1)
    bare.ok("access", "grant", "--app", key, "--client-id", "tessera-test", "--account", "bob")
    assert silent() == token
    python.close()
    decisions = {(r["app_key"] == key, r["decision"]) for r in json.loads(bare.ok("access", "log", "--json"))}
    assert {(True, "refused"), (True, "allowed")} <= decisions, decisions

    # A restart needs no new sign-in and no request to the IdP.
    bare.stop()
    before = len(idp.tokens())
    bare.start()
    assert bare.ok("token").strip() == token
    assert len(idp.tokens()) == before, "the restart asked the IdP for a token"
    state = tmp_path / "state" / "tessera" / "store"
    stored = b"".join(p.read_bytes() for p in state.rglob("*") if p.is_file())
    assert stored and token.encode() not in stored, "the store holds the token in plaintext"

    # A token a resource refused is dropped over the socket too: the next request refreshes.
    bare.ok("token", "--reject", stdin=token)
    renewed = bare.ok("token").strip()
    assert renewed != token and len(renewed) >= 20

    # Sign-out.
    bare.ok("logout", "--account", "bob")
    bare.ok("logout", "--account", "alice")
    assert json.loads(bare.ok("accounts", "--json")) == []


def test_without_a_session_bus_git_kubectl_and_msmtp_get_their_tokens(bare, git_server, tmp_path):
    """The programs users run on an SSH box, with the helpers as they are installed: git clones and
    pushes through git-credential-tessera, kubectl's exec plugin runs `tessera kube-credential`, and
    msmtp's passwordeval runs `tessera token`. Each server accepts only a token the test IdP
    vouches for, and sees alice."""
    if kubectl_version() is None or shutil.which("msmtp") is None:
        pytest.fail("kubectl and msmtp are not installed: scripts/test installs them")
    repo = git_server
    config = bare.env["TESSERA_CONFIG"]
    with open(config, "a") as f:
        f.write(f'\n[[git]]\nurl = "{repo.url}/"\nclient_id = "tessera-test"\n')
    bare.start()
    bare.ok("login")  # through the browser (the test's), as alice
    env = helper_environment(tmp_path, bare.env)
    assert "DBUS_SESSION_BUS_ADDRESS" not in env
    api = KubeAPI()
    smtp = SMTPServer()
    try:
        work = tmp_path / "work"
        git(env, "clone", "-q", f"{repo.url}/repo.git", str(work))
        (work / "NEW").write_text("from an SSH box\n")
        git(env, "add", "NEW", cwd=work)
        git(env, "commit", "-qm", "pushed without a session bus", cwd=work)
        git(env, "push", "-q", "origin", "main", cwd=work)
        authorized = [r for r in repo.requests if r[4] != 401]
        assert authorized and {r[3] for r in authorized} == {"alice"}, repo.requests

        never = kubeconfig(tmp_path / "kube.json", api.url, "client.authentication.k8s.io/v1", "Never")
        got = kubectl(env, never)
        assert got.returncode == 0 and "pod-of-alice" in got.stdout, got.stderr
        assert {r[3] for r in api.requests if r[4] == 200} == {"alice"}

        sent = msmtp(tmp_path, smtp.port, "xoauth2", f"{TESSERA} token", env=env)
        assert sent.returncode == 0, sent.stderr
        assert smtp.auth == [("XOAUTH2", "alice", True)] and len(smtp.messages) == 1
    finally:
        api.close()
        smtp.close()


def test_a_tesserad_its_session_bus_started_leaves_when_that_bus_is_already_gone(tmp_path, write_config, browser):
    """dbus-daemon started tesserad (D-Bus activation without systemd: DBUS_STARTER_BUS_TYPE), and
    the session ended before tesserad connected. With nobody left to stop it, tesserad must not stay
    on serving its socket: it says why and exits. Started any other way with no bus (an SSH login,
    a container), it serves its socket alone, as above."""
    b = Bare(tmp_path, write_config(store="file"), browser)
    gone = f"unix:path={tmp_path}/ended-session-bus"
    b.env.update(DBUS_SESSION_BUS_ADDRESS=gone, DBUS_STARTER_ADDRESS=gone, DBUS_STARTER_BUS_TYPE="session")
    proc = subprocess.run([TESSERAD, "--config", b.env["TESSERA_CONFIG"]], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=b.env, timeout=60)
    assert proc.returncode != 0, proc.stderr
    assert "The session bus that started tesserad is gone" in proc.stderr, proc.stderr
    assert not os.path.exists(b.socket), "no socket is left behind"

    del b.env["DBUS_STARTER_ADDRESS"], b.env["DBUS_STARTER_BUS_TYPE"]
    b.start()
    assert b.ok("status", "--json")
    assert b.stop() == 0
