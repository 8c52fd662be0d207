"""Every fenced code block of README.md and docs/integrations.md runs as written, or names the test
that covers it (issue 22: the README's git setup did not work as pasted).

The blocks are read from the Markdown itself (its ``` and ~~~ fences, indented ones too) and each
is known by its file and the hash of its text. DOC_BLOCKS below says, for every block, which test
runs it ("run::test_name", a test of this module) or which test elsewhere covers it
("path::text the file must hold"). test_every_block_is_run_or_claimed fails when a block appears
that DOC_BLOCKS does not name (a new snippet cannot go untested) and when a named block is gone or
changed (its hash: update the entry once the test still does what the new text says).

"As written" means the block's text with only the substitutions of SUBSTITUTIONS (placeholders the
docs tell the reader to replace: client ids, scopes, the Entra authority, the reader's own
addresses) and the environment of ENVIRONMENT (a HOME of its own, tessera and
git-credential-tessera on PATH as scripts/install puts them, and real host names such as
dev.azure.com reaching the test servers through an HTTPS proxy that trusts the test CA).
"""
import base64
import hashlib
import inspect
import json
import os
import re
import shutil
import stat
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import AUTHORITY, REPO, TESSERA, Broker, session_config, toml_value
from resource_servers import CA, ConnectProxy, GitServer, KubeAPI, SMTPServer, UserAPI, server_cert, token_user

DOCS = ("README.md", "docs/integrations.md")

# ----------------------------------------------------------------------------------------------
# What the test changes in a block before it runs it: (as the docs write it, as the test runs it,
# only in blocks whose first line starts with this (None: every block), why). Applied in order.

SUBSTITUTIONS = [
    ("11111111-2222-3333-4444-555555555555", "tessera-test", None, "your app's client id: the test IdP's client"),
    ("00000000-0000-0000-0000-000000000000", "tessera-test", None, "your app's client id: the test IdP's client"),
    ("https://login.microsoftonline.com/organizations", AUTHORITY, None, "Entra ID: the test IdP's authority"),
    ("499b84ac-1321-427f-aa17-267ca6975798/.default", "read", None, "Azure DevOps' scope: a test IdP scope"),
    ("6dae42f8-4368-4678-94ff-3960e28e3630/user.read", "read", None, "AKS's scope: a test IdP scope"),
    ("https://outlook.office.com/IMAP.AccessAsUser.All", "read", None, "Outlook IMAP: a test IdP scope"),
    ("https://outlook.office.com/SMTP.Send", "write", None, "Outlook SMTP: another test IdP scope"),
    ("User.Read", "read", None, "Graph's scope: a test IdP scope"),
    ("alice@example.test", "alice", None, "an account's username: the test IdP's alice"),
    ("host smtp.office365.com\nport 587\ntls on\ntls_starttls on\n", "host 127.0.0.1\nport SMTP_PORT\ntls off\n"
     "tls_starttls off\n", "account outlook", "Outlook's SMTP server: the test's (no TLS, port SMTP_PORT below)"),
    ("user alice@contoso.com", "user alice", "account outlook", "your address: the test IdP's alice"),
    ("CORRELATION_ID", "6f1c2a3e-0b4d-4e5f-8a9b-0c1d2e3f4a5b", None, "a correlation id of your choosing"),
    ("CLIENT", "tessera-test", "tessera access", "CLIENT: a client id"),
    ("Mail.Send", "write", "tessera access", "a scope"),
    ("--client-id … --scope …", "--client-id tessera-test --scope read", "# printf", "placeholders"),
    # The test IdP lets an app have one grant type: the device code flow has a client of its own.
    ("tessera login --device-code", "tessera login --device-code --client-id tessera-device", "tessera login",
     "the test IdP's device-code client"),
    ("AcquireToken 'sasa{sv}' \"\" 1 read", "AcquireToken 'sasa{sv}' tessera-device 1 read", "B=",
     "the test IdP's device-code client"),
]

# The environment a block runs in (doc_env): HOME is a new directory with nothing in it; PATH starts
# with a directory holding tessera and git-credential-tessera (as scripts/install puts them);
# XDG_CONFIG_HOME and TESSERA_CONFIG are unset, so ~/.config/tessera/config.toml is the file read;
# GIT_TERMINAL_PROMPT=0 (git fails instead of prompting); GIT_SSL_CAINFO and CURL_CA_BUNDLE trust
# the test CA; https_proxy sends dev.azure.com and graph.microsoft.com (port 443) to the test's git
# and /me servers (ConnectProxy, certificates for those names from the test CA). SMTP_PORT is the
# test SMTP server's port (msmtp's --host would make it ignore its file, hence the substitution).
# config.toml: the README's Entra ID block (with SUBSTITUTIONS) followed by the test session's own
# settings (trusted_authorities, ca_file, browser: the scripted browser...), see entra_config.


# ----------------------------------------------------------------------------------------------
# The blocks, and who runs or covers each: (file, sha256 of the text [:10], first line, claim).

DOC_BLOCKS = [
    # DPoP: test_dpop runs this recipe (with the test IdP's CA and the resource's nonce) against
    # glewlwyd's userinfo, a real resource that checks the proof.
    ("README.md", "8ec09bacda", "url=https://api.example.com/me",
     "Tests/e2e/test_dpop.py::-H \"DPoP: $(tessera proof --provider"),
    # Providers: `provider add` with the secret on stdin, `provider list`, `login --provider` and
    # `token --provider` run against the test IdP's confidential client (GitHub itself cannot be
    # reached here; ProviderCommandTests runs `provider add` from a profile).
    ("README.md", "ce74f69890", "tessera provider add github --profile github --client-id Ov23liABCDEF --client-secret-stdin",
     "Tests/e2e/test_providers.py::run_cli(\"login\", \"--provider\", \"plain\""),
    # SSH boxes and servers: the whole sequence with no session bus, through the socket and the
    # file store, is test_no_session_bus.py (a device-code sign-in, tokens across a restart).
    ("README.md", "8a3bf7eeab", "tesserad &                        # or once, with a user manager: systemctl --user enable --now tessera.socket",
     "Tests/e2e/test_no_session_bus.py::bare.device_login(idp, \"alice\")"),
    ("README.md", "769981c064", "busctl --address=unix:path=$XDG_RUNTIME_DIR/tessera/bus get-property org.tessera.Broker1 /org/tessera/Broker1 org.tessera.Broker1 Version",
     "run::test_readme_busctl_reaches_the_socket"),
    ("README.md", "42c3f68237", 'curl -H "Authorization: Bearer $(tessera token)" https://graph.microsoft.com/v1.0/me',
     "run::test_curl_and_tessera_exec_reach_an_api"),
    ("README.md", "e0fdb40de5", "scripts/demo     # runs Tessera end to end against the bundled local identity provider",
     ".ci/run::scripts/demo || demo_rc=$?"),  # CI runs both; Tests/scripts checks their packages
    ("README.md", "c148e1e5e3", "scripts/bench              # or: make bench; --json FILE to keep the figures, --write-md for BENCHMARKS.md",
     "scripts/test::scripts/bench\" --smoke"),
    ("README.md", "b8f9d7f572", "scripts/faults             # the long round (about 20 minutes); --write-md rewrites FAULTS.md",
     "Tests/e2e/test_faults.py::TESSERA_FAULT_ROUNDS"),  # the short round; the long one by hand
    ("README.md", "8254dcb0e0", "scripts/fuzz --seconds 60 FuzzBus   # one target for a minute; no target: all eight; --long: 30 min each, figures to FAULTS.md",
     "scripts/test::scripts/fuzz\" --seconds 30"),  # every target, 30 s; the long runs by hand
    ("README.md", "1b92a00875", "scripts/package                 # .build-package/tessera_0.1.0-1_amd64.deb and tessera-microsoft-broker_0.1.0-1_all.deb",
     "Tests/e2e/test_package.py::def test_the_packages_install_and_work_on_debian_12_without_swift"),
    ("README.md", "665b24d9ee", "# /etc/tessera/config.d/10-site.toml",
     "run::test_the_administrators_policy_block_is_read_as_written"),
    ("README.md", "6819099cd8", "sudo scripts/install --prefix /usr/local     # or: sudo make install PREFIX=/usr/local",
     "Tests/scripts/test_readme_scripts.py::def test_installs_packages_before_building"),
    ("README.md", "5ad6afcf15", 'default_authority = "https://login.microsoftonline.com/organizations"   # or your tenant id',
     "run::entra_config"),  # the config.toml of every test here
    ("README.md", "2e161cdbf1", "tessera login                  # opens your browser",
     "run::test_readme_sign_in_token_accounts_logout"),
    # Run; its wording ("served", "not served") is test_microsoft_front.py's
    # test_a_name_owned_by_another_program_is_left_to_it.
    ("README.md", "3b4ca279c7", 'tessera status     # "Microsoft broker protocol: served (...)", or who else owns the name',
     "run::test_readme_sign_in_token_accounts_logout"),
    ("README.md", "ad645b4d0f", "git config --global credential.helper tessera",
     "run::test_readme_git_setup_clones_and_pushes_to_dev_azure_com"),
    ("README.md", "fcf742ab81", "users:", "run::test_kubeconfig_users_run_with_kubectl"),
    ("README.md", "17692ebe49", "account outlook", "run::test_mail_blocks_send_with_msmtp_and_give_tokens"),
    ("README.md", "c1a0efba29", "tessera access list                                   # who may use what",
     "run::test_readme_access_commands"),
    ("README.md", "fffa7688f1", 'B="org.tessera.Broker1 /org/tessera/Broker1 org.tessera.Broker1"',
     "run::test_readme_busctl_calls"),
    ("README.md", "81a4ec1e9a", "import TesseraClient",
     "Tests/TesseraClientTests/AsyncClientTests.swift::func theReadmeExampleRuns"),  # test_readme_swift_example
    ("docs/integrations.md", "77b3b0ac5f", "git config --global credential.helper tessera",
     "run::test_integrations_git_setup_and_entries"),
    ("docs/integrations.md", "c7871679ab", "# Azure DevOps with Entra ID: any username works, the token is the password.",
     "run::test_integrations_git_setup_and_entries"),
    ("docs/integrations.md", "063e051b89", "# ~/.kube/config (the user part)", "run::test_kubeconfig_users_run_with_kubectl"),
    ("docs/integrations.md", "85c79b139c",
     "tessera: InteractionRequired: Sign-in needed, and kubectl runs non-interactively: run `tessera login --client-id …` in a terminal, then retry. (…)",
     "run::test_kubeconfig_users_run_with_kubectl"),
    ("docs/integrations.md", "d3b7e2cc05", "tessera login --client-id 11111111-2222-3333-4444-555555555555 \\",
     "run::test_mail_blocks_send_with_msmtp_and_give_tokens"),
    ("docs/integrations.md", "17692ebe49", "account outlook", "run::test_mail_blocks_send_with_msmtp_and_give_tokens"),
    ("docs/integrations.md", "05939f77aa", "IMAPAccount outlook", "run::test_mail_blocks_send_with_msmtp_and_give_tokens"),
    ("docs/integrations.md", "fbf3cf4d96", 'set imap_user = "alice@contoso.com"',
     "run::test_mail_blocks_send_with_msmtp_and_give_tokens"),
    ("docs/integrations.md", "4a2ff7672b", "# msmtp", "run::test_mail_blocks_send_with_msmtp_and_give_tokens"),
    ("docs/integrations.md", "3b7185c03f", "tessera sasl --mech xoauth2                 # base64 of user=U^Aauth=Bearer T^A^A",
     "run::test_sasl_lines"),
    ("docs/integrations.md", "065ed2b617", "# printf is the shell's own, so the token reaches curl on a pipe, not in an argument.",
     "run::test_curl_and_tessera_exec_reach_an_api"),
    ("docs/integrations.md", "76785ea71d", "{", "Tests/e2e/test_cli.py::def test_token_accounts_status"),
    # A refused token piped to `tessera token --reject`: the same command against the test IdP.
    ("docs/integrations.md", "6540d7f4a7",
     "# The token is piped in, never an argument; give the options the token was asked with.",
     "Tests/e2e/test_providers.py::def test_a_rejected_token_is_dropped_and_only_by_an_app_that_may_have_it"),
    # tessera forward (issue 24): a real sshd and bubblewrap, as root (test_forward.py); the
    # commands there are these, with the test's ssh_config (-F) and the test's own paths.
    ("README.md", "a250d417d0",
     "tessera forward build01.example.com                        # a login shell there, in which `tessera token` works",
     "Tests/e2e/test_forward.py::def test_a_forward_lives_as_long_as_its_ssh"),
    ("README.md", "f6b96e5dcf", "mkdir -p -m 700 \"$XDG_RUNTIME_DIR/tessera/devbox\"",
     "Tests/e2e/test_forward.py::def test_a_container_forward_serves_another_mount_namespace"),
    ("docs/integrations.md", "74dfb5bf85",
     "# ~/.config/tessera/config.toml on the remote host: only what its helpers read.",
     "Tests/e2e/test_forward.py::def test_git_on_the_remote_host_clones_with_the_credential_helper"),
    ("docs/integrations.md", "455aa8a2a8",
     "# On the remote host, once: tessera and the helper's name for it on PATH, git told to use it.",
     "Tests/e2e/test_forward.py::\"git-credential-tessera\""),
    ("docs/integrations.md", "78038ce1d4",
     "# A lasting socket for containers: its directory yours alone, the socket 0600. Below",
     "Tests/e2e/test_forward.py::def test_a_container_forward_serves_another_mount_namespace"),
    ("docs/integrations.md", "af6c201061", "{", "Tests/e2e/test_forward.py::def in_container"),
]


# ----------------------------------------------------------------------------------------------
# Reading the Markdown


@dataclass
class Block:
    file: str
    line: int
    info: str
    text: str

    @property
    def digest(self):
        return hashlib.sha256(self.text.encode()).hexdigest()[:10]

    @property
    def first(self):
        return next((line.strip() for line in self.text.splitlines() if line.strip()), "")

    def entry(self):
        return f'    ("{self.file}", "{self.digest}", {json.dumps(self.first, ensure_ascii=False)}, "CLAIM"),'


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


def fenced_blocks(rel):
    """The fenced code blocks of a Markdown file, their content without the fence's indentation."""
    lines = (Path(REPO) / rel).read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        close = re.compile(r"^[ \t]*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$")
        body = []
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            line = lines[j]
            k = 0
            while k < indent and k < len(line) and line[k] == " ":
                k += 1
            body.append(line[k:])
            j += 1
        assert j < len(lines), f"{rel}:{i + 1}: a code fence that is never closed"
        blocks.append(Block(rel, i + 1, m["info"].strip(), "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def all_blocks():
    return [b for rel in DOCS for b in fenced_blocks(rel)]


def doc(file, digest):
    """The text of a block DOC_BLOCKS names (as written: before SUBSTITUTIONS)."""
    found = [b for b in fenced_blocks(file) if b.digest == digest]
    assert found, (f"{file}: the block {digest} is gone or was changed; test_every_block_is_run_or_claimed "
                   f"prints the blocks as they are now")
    return found[0].text


def as_run(text):
    """A block's text with SUBSTITUTIONS applied (those limited to blocks starting with a prefix
    only there)."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    for written, used, only, _ in SUBSTITUTIONS:
        if only is None or first.startswith(only):
            text = text.replace(written, used)
    return text


def test_every_block_is_run_or_claimed():
    blocks = all_blocks()
    assert len(blocks) >= 20, "the Markdown parser lost blocks"
    named = {(f, d): (first, claim) for f, d, first, claim in DOC_BLOCKS}
    assert len(named) == len(DOC_BLOCKS), "a block is named twice in DOC_BLOCKS"
    unclaimed = [b for b in blocks if (b.file, b.digest) not in named]
    present = {(b.file, b.digest) for b in blocks}
    gone = [(f, d, first) for (f, d), (first, _) in named.items() if (f, d) not in present]
    assert not unclaimed and not gone, (
        "README.md / docs/integrations.md and DOC_BLOCKS disagree.\n"
        + "".join(f"  gone or changed: {f} {d} {first!r}\n" for f, d, first in gone)
        + "".join(f"  not run or claimed by any test: {b.file}:{b.line}\n" for b in unclaimed)
        + "Each new or changed block needs a test that runs it (or covers it) and an entry:\n"
        + "\n".join(b.entry() for b in unclaimed))
    for b in blocks:
        assert named[(b.file, b.digest)][0] == b.first, f"{b.file}:{b.line}: DOC_BLOCKS has another first line"


def test_every_claim_names_a_real_test():
    module = globals()
    for file, digest, first, claim in DOC_BLOCKS:
        where, _, what = claim.partition("::")
        assert what, f"{claim}: write run::TEST or path::TEXT"
        if where == "run":
            assert callable(module.get(what)), f"{claim}: no such function in test_docs.py"
            # The test (or the helper every test calls) really reads the block: it names its hash.
            assert digest in inspect.getsource(module[what]), f"{what} does not read {file} {digest} ({first!r})"
        else:
            path = Path(REPO) / where
            assert path.is_file(), f"{claim}: {where} does not exist"
            assert what in path.read_text(), f"{claim}: {where} does not hold {what!r}"


def test_readme_swift_example():
    """README's Swift example is Tests/TesseraClientTests' theReadmeExampleRuns, line by line (the
    unit tests compile it and run it against a scripted broker)."""
    lines = [line.strip() for line in doc("README.md", "81a4ec1e9a").splitlines() if line.strip()]
    swift = (Path(REPO) / "Tests/TesseraClientTests/AsyncClientTests.swift").read_text()
    assert lines[0] == "import TesseraClient" and "import TesseraClient\n" in swift
    body = swift.split("func theReadmeExampleRuns()", 1)[1].split("@Test", 1)[0]
    test_lines = [line.strip() for line in body.splitlines()]
    for line in lines[1:]:
        assert line in test_lines, f"README's Swift line is not in theReadmeExampleRuns: {line}"


# ----------------------------------------------------------------------------------------------
# Where the blocks run


@pytest.fixture
def doc_env(tmp_path):
    """ENVIRONMENT: the environment a reader's shell would have, in a HOME of the test's own."""
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("tessera", "git-credential-tessera"):
        os.symlink(TESSERA, bin_dir / name)
    env = dict(os.environ, HOME=str(home), PATH=f"{bin_dir}:{os.environ['PATH']}", GIT_TERMINAL_PROMPT="0",
               GIT_CONFIG_NOSYSTEM="1", GIT_SSL_CAINFO=CA, CURL_CA_BUNDLE=CA, GIT_AUTHOR_NAME="Alice",
               GIT_AUTHOR_EMAIL="alice@example.test", GIT_COMMITTER_NAME="Alice",
               GIT_COMMITTER_EMAIL="alice@example.test")
    for name in ("XDG_CONFIG_HOME", "TESSERA_CONFIG", "http_proxy", "https_proxy", "HTTPS_PROXY", "all_proxy",
                 "ALL_PROXY", "no_proxy", "NO_PROXY"):
        env.pop(name, None)
    return env


@pytest.fixture
def alice():
    """The test's own connection to the broker (the harness's, not the docs')."""
    b = Broker()
    yield b
    b.close()


def sh(env, script, check=True, timeout=180, cwd=None, input=None):
    """Runs a block (or a line of one) in bash, as pasted into a terminal, stopping at a failure."""
    proc = subprocess.run(["bash", "-e", "-c", script], env=env, cwd=cwd or env["HOME"], capture_output=True,
                          text=True, timeout=timeout, input=input,
                          stdin=None if input is not None else subprocess.DEVNULL)
    if check:
        assert proc.returncode == 0, f"{script}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def config_path(env):
    return Path(env["HOME"]) / ".config" / "tessera" / "config.toml"


def entra_config(env):
    """~/.config/tessera/config.toml from the README's Entra ID block, then the test session's own
    settings that point Tessera at the test IdP (trusted authority, its CA, the scripted browser)."""
    path = config_path(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    own = {k: v for k, v in session_config().items() if not k.startswith("default_")}
    path.write_text(as_run(doc("README.md", "5ad6afcf15"))
                    + "".join(f"{k} = {toml_value(v)}\n" for k, v in own.items()))
    return str(path)


def started(start_daemon, env):
    return start_daemon(entra_config(env))


def assert_token_for_alice(token):
    token = token.strip()
    assert token and token_user(token) == "alice", f"not a token the IdP takes for alice: {token[:12]}…"
    return token


# ----------------------------------------------------------------------------------------------
# README: Microsoft Entra ID, the CLI


def approve_when_shown(proc, idp, since):
    """Reads a device-code sign-in's stderr until the IdP has its user code pending, approves it."""
    shown = ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        shown += line
        codes = [c for c in re.findall(r"[A-Z0-9-]{4,}", line) if c in idp.pending_user_codes(since)]
        if codes:
            idp.approve_device(codes[0])
            return shown
    raise AssertionError(f"no user code shown: {shown!r}")


def test_readme_sign_in_token_accounts_logout(start_daemon, doc_env, idp, alice):
    started(start_daemon, doc_env)
    lines = [line for line in as_run(doc("README.md", "2e161cdbf1")).splitlines() if line.strip()]
    assert [line.split("#")[0].split()[:2] for line in lines] == [
        ["tessera", "login"], ["tessera", "login"], ["tessera", "token"], ["tessera", "accounts"],
        ["tessera", "logout"]], lines
    login, device, token, accounts, logout = lines
    assert "alice" in sh(doc_env, login).stdout  # the scripted browser signs alice in
    since = idp.last_device_grant()
    proc = subprocess.Popen(["bash", "-e", "-c", device], env=doc_env, cwd=doc_env["HOME"], text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        shown = approve_when_shown(proc, idp, since)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "alice" in out, shown + err
    assert "https://" in shown, f"a link to open: {shown!r}"
    assert_token_for_alice(sh(doc_env, token).stdout)
    assert "alice" in sh(doc_env, accounts).stdout
    # README: `tessera status` shows the broker and the account (its wording has its own tests).
    assert sh(doc_env, as_run(doc("README.md", "3b4ca279c7"))).stdout
    sh(doc_env, logout)
    assert sh(doc_env, accounts).stdout.strip() == "" and alice.accounts() == []


# ----------------------------------------------------------------------------------------------
# git


def git_fill(env, url="https://dev.azure.com/contoso/repo.git", check=True):
    """`git credential fill` for a remote, as git asks before it talks to the server."""
    proc = subprocess.run(["git", "credential", "fill"], input=f"url={url}\n\n", env=env, capture_output=True,
                          text=True, timeout=120, cwd=env["HOME"])
    if check:
        assert proc.returncode == 0, f"git credential fill {url}: exit {proc.returncode}\n{proc.stderr}"
    return proc


def fill_answer(proc):
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


@pytest.fixture
def dev_azure_com(tmp_path, doc_env):
    """https://dev.azure.com/contoso/repo.git, served by the test git server through the proxy."""
    root = tmp_path / "srv"
    (root / "contoso").mkdir(parents=True)
    bare = root / "contoso" / "repo.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    subprocess.run(["git", "-C", str(bare), "config", "http.receivepack", "true"], check=True)
    seed = tmp_path / "seed"
    env = dict(doc_env, HOME=str(tmp_path))
    subprocess.run(["git", "init", "-q", "-b", "main", str(seed)], check=True, env=env)
    (seed / "README").write_text("hello\n")
    subprocess.run(["git", "-C", str(seed), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(seed), "commit", "-qm", "seed"], check=True, env=env)
    subprocess.run(["git", "-C", str(seed), "push", "-q", str(bare), "main"], check=True, env=env)
    server = GitServer(str(root), cert=server_cert(str(tmp_path / "cert-dev"), ["dev.azure.com"]))
    proxy = ConnectProxy({"dev.azure.com:443": server.port})
    yield server, proxy
    proxy.close()
    server.close()


def test_readme_git_setup_clones_and_pushes_to_dev_azure_com(start_daemon, doc_env, dev_azure_com, tmp_path, alice):
    started(start_daemon, doc_env)
    alice.sign_in()
    # The README's block, pasted into a shell.
    sh(doc_env, as_run(doc("README.md", "ad645b4d0f")))
    assert '[[git]]\nurl = "https://dev.azure.com/contoso/"' in config_path(doc_env).read_text()

    # The check: git asks the helpers, and tessera answers for the organisation's URL.
    answer = fill_answer(git_fill(doc_env))
    assert answer["username"] == "oauth2", answer
    assert_token_for_alice(answer["password"])

    # And git talks to dev.azure.com with it (the test's git server, through the proxy).
    server, proxy = dev_azure_com
    env = dict(doc_env, https_proxy=proxy.url)
    work = tmp_path / "work"
    sh(env, f"git clone -q https://dev.azure.com/contoso/repo.git {work}")
    assert (work / "README").read_text() == "hello\n"
    (work / "NEW").write_text("from alice\n")
    sh(env, "git add NEW && git commit -qm 'from the README' && git push -q origin main", cwd=str(work))
    pushed = subprocess.run(["git", "-C", os.path.join(server.root, "contoso", "repo.git"), "log", "-1",
                             "--format=%s"], capture_output=True, text=True, check=True).stdout.strip()
    assert pushed == "from the README"
    assert set(proxy.connects) == {"dev.azure.com:443"}
    authorized = [r for r in server.requests if r[4] != 401]
    assert authorized and {r[3] for r in authorized} == {"alice"}

    # Who set up git without useHttpPath (the README before issue 22): git still gets no answer,
    # but the helper says, in one line, what to run.
    without = git_fill(dict(doc_env, GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="credential.https://dev.azure.com.useHttpPath",
                            GIT_CONFIG_VALUE_0="false"), check=False)
    assert without.returncode != 0 and "could not read Username" in without.stderr, without.stderr
    hints = [line for line in without.stderr.splitlines() if line.startswith("tessera git-credential:")]
    assert len(hints) == 1, without.stderr
    assert "git config --global credential.https://dev.azure.com.useHttpPath true" in hints[0], hints


def test_integrations_git_setup_and_entries(start_daemon, doc_env, alice):
    config = entra_config(doc_env)
    sh(doc_env, as_run(doc("docs/integrations.md", "77b3b0ac5f")))
    # "one [[git]] entry per host or URL prefix, after the other settings"
    with open(config, "a") as f:
        f.write(as_run(doc("docs/integrations.md", "c7871679ab")))
    # Both entries parse: tesserad does not warn about them, and the helper answers nothing (and
    # says nothing) for a host without an entry.
    daemon = start_daemon(config)
    alice.sign_in()
    other = subprocess.run(["git-credential-tessera", "get"], input="protocol=https\nhost=elsewhere.example\n\n",
                           env=doc_env, capture_output=True, text=True, timeout=60)
    assert (other.returncode, other.stdout, other.stderr) == (0, "", ""), other
    assert "[[git]] entries ignored" not in daemon.log(), daemon.log()[-2000:]
    answer = fill_answer(git_fill(doc_env))
    assert answer["username"] == "oauth2"
    assert_token_for_alice(answer["password"])


# ----------------------------------------------------------------------------------------------
# kubectl


def kubeconfig_from(users_yaml, server):
    """A whole kubeconfig around the docs' user part: a cluster (the test's API stub) and a context."""
    user = re.search(r"^- name: (\S+)", users_yaml, re.M).group(1)
    return users_yaml + f"""clusters:
- name: test
  cluster:
    server: {server}
    certificate-authority: {CA}
contexts:
- name: test
  context:
    cluster: test
    user: {user}
current-context: test
apiVersion: v1
kind: Config
"""


def test_the_administrators_policy_block_is_read_as_written(doc_env, tmp_path):
    """The README's /etc/tessera drop-in, as the administrator's file (TESSERA_SYSTEM_CONFIG_DIR in
    place of /etc/tessera), under a user's file that tries to change what it locks."""
    system = tmp_path / "etc-tessera"
    (system / "config.d").mkdir(parents=True)
    (system / "config.d" / "10-site.toml").write_text(doc("README.md", "665b24d9ee"))
    user = Path(doc_env["HOME"]) / ".config" / "tessera"
    user.mkdir(parents=True)
    (user / "config.toml").write_text('ca_file = "/tmp/mine.pem"\naccess_mode = "open"\nstore = "memory"\n')
    env = dict(doc_env, TESSERA_SYSTEM_CONFIG_DIR=str(system))
    env.pop("TESSERA_CONFIG", None)
    env.pop("XDG_CONFIG_HOME", None)
    check = subprocess.run(["tessera", "config", "check"], capture_output=True, text=True, env=env, timeout=30)
    assert check.returncode == 0, check.stderr
    assert len(check.stderr.splitlines()) == 3, check.stderr  # one warning per ignored setting
    shown = json.loads(subprocess.run(["tessera", "config", "--json"], capture_output=True, text=True, env=env,
                                      timeout=30, check=True).stdout)
    settings = shown["settings"]
    assert settings["trusted_authorities"]["value"] == ["https://sso.example.com/realms/corp"]
    assert settings["trusted_authorities"]["locked"] and settings["ca_file"]["value"] is None
    assert settings["access_mode"]["value"] == "confirm" and settings["store"]["value"] == "auto"
    assert shown["policy"] == {"locked": ["trusted_authorities", "ca_file"], "minimum_access_mode": "confirm",
                               "allow_forwarding": False, "allowed_stores": ["secret-service", "file"]}


def test_kubeconfig_users_run_with_kubectl(start_daemon, doc_env, alice):
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not installed: scripts/test installs it (kubernetes-client) when missing")
    started(start_daemon, doc_env)
    api = KubeAPI()
    kube = Path(doc_env["HOME"]) / ".kube"
    kube.mkdir()
    try:
        get = "kubectl get --raw /api/v1/namespaces/default/pods"
        for file, digest in (("README.md", "fcf742ab81"), ("docs/integrations.md", "063e051b89")):
            (kube / "config").write_text(kubeconfig_from(as_run(doc(file, digest)), api.url))
            if file == "docs/integrations.md":
                # Not signed in, and kubectl not in a terminal: the line integrations.md shows.
                alice.sign_out(alice.accounts()[0]["id"])
                failed = sh(doc_env, get, check=False)
                assert failed.returncode != 0
                shown = as_run(doc("docs/integrations.md", "85c79b139c")).strip()
                pattern = ".*?".join(re.escape(part) for part in shown.split("…"))
                ours = [line for line in failed.stderr.splitlines() if line.startswith("tessera:")]
                assert ours and all(re.fullmatch(pattern, line) for line in ours), (shown, failed.stderr)
            alice.sign_in()
            pods = sh(doc_env, get)
            assert json.loads(pods.stdout)["items"][0]["metadata"]["name"] == "pod-of-alice", file
        assert {r[3] for r in api.requests if r[4] == 200} == {"alice"}
    finally:
        api.close()


# ----------------------------------------------------------------------------------------------
# Mail


def msmtp_send(env, *options):
    """msmtp with the reader's ~/.config/msmtp/config."""
    return subprocess.run(["msmtp", *options, "bob@example.test"],
                          input="Subject: hello\n\nfrom Tessera's docs\n", env=env, capture_output=True, text=True,
                          timeout=60, cwd=env["HOME"])


def commands_in(text, pattern):
    """The quoted commands of a mail client's file (PassCmd "…", …_refresh_command = "…")."""
    return re.findall(r"(?:" + pattern + r')\s*=?\s*"([^"]+)"', text)


def test_mail_blocks_send_with_msmtp_and_give_tokens(start_daemon, doc_env):
    if shutil.which("msmtp") is None:
        pytest.fail("msmtp is not installed: scripts/test installs it")
    started(start_daemon, doc_env)
    # integrations.md: sign in once for Outlook (the scripted browser is the user).
    assert "alice" in sh(doc_env, as_run(doc("docs/integrations.md", "d3b7e2cc05"))).stdout
    smtp = SMTPServer()
    rc = Path(doc_env["HOME"]) / ".config" / "msmtp" / "config"
    rc.parent.mkdir(parents=True)
    try:
        for file, digest in (("README.md", "17692ebe49"), ("docs/integrations.md", "17692ebe49")):
            rc.write_text(as_run(doc(file, digest)).replace("SMTP_PORT", str(smtp.port)))
            rc.chmod(stat.S_IRUSR | stat.S_IWUSR)
            sent = msmtp_send(doc_env)
            assert sent.returncode == 0, sent.stderr
            assert smtp.auth[-1] == ("XOAUTH2", "alice", True), smtp.auth
            # "For a server that prefers the standard mechanism, write auth oauthbearer."
            sent = msmtp_send(doc_env, "--auth=oauthbearer")
            assert sent.returncode == 0 and smtp.auth[-1] == ("OAUTHBEARER", "alice", True), (sent.stderr, smtp.auth)
        # A generic OIDC server: the "# msmtp" lines in place of the Outlook file's auth and
        # passwordeval (config.toml's defaults are the test IdP's).
        generic = as_run(doc("docs/integrations.md", "4a2ff7672b"))
        msmtp_lines = generic.split("# msmtp\n", 1)[1].split("# mbsync", 1)[0]
        outlook = [line for line in rc.read_text().splitlines()
                   if not line.startswith(("auth ", "passwordeval ", "account default"))]
        rc.write_text("\n".join(outlook) + "\n" + msmtp_lines + "account default : outlook\n")
        sent = msmtp_send(doc_env)
        assert sent.returncode == 0 and smtp.auth[-1] == ("OAUTHBEARER", "alice", True), (sent.stderr, smtp.auth)
        assert len(smtp.messages) == 5
    finally:
        smtp.close()
    # mbsync and neomutt are not installed here: the commands they would run give alice's token.
    mbsync = as_run(doc("docs/integrations.md", "05939f77aa"))
    neomutt = as_run(doc("docs/integrations.md", "fbf3cf4d96"))
    commands = (commands_in(mbsync, "PassCmd") + commands_in(neomutt, r"set \w+_oauth_refresh_command")
                + commands_in(generic, r"PassCmd|set imap_oauth_refresh_command"))
    assert len(commands) == 5 and all(c.startswith("tessera token") for c in commands), commands
    for command in commands:
        assert_token_for_alice(sh(doc_env, command).stdout)


def test_sasl_lines(start_daemon, doc_env, alice):
    started(start_daemon, doc_env)
    alice.sign_in()
    token = sh(doc_env, "tessera token").stdout.strip()
    lines = sh(doc_env, as_run(doc("docs/integrations.md", "3b7185c03f"))).stdout.splitlines()
    assert len(lines) == 2, lines
    assert base64.b64decode(lines[0]) == f"user=alice\x01auth=Bearer {token}\x01\x01".encode()
    assert base64.b64decode(lines[1]) == (
        f"n,a=alice,\x01host=mail.example.com\x01port=587\x01auth=Bearer {token}\x01\x01").encode()


# ----------------------------------------------------------------------------------------------
# Scripts: curl and tessera exec


def test_curl_and_tessera_exec_reach_an_api(start_daemon, doc_env, tmp_path, alice):
    started(start_daemon, doc_env)
    alice.sign_in()
    graph = UserAPI(cert=server_cert(str(tmp_path / "cert-graph"), ["graph.microsoft.com"]))
    proxy = ConnectProxy({"graph.microsoft.com:443": graph.port})
    env = dict(doc_env, https_proxy=proxy.url)
    try:
        # README's first block.
        me = sh(env, as_run(doc("README.md", "42c3f68237")))
        assert json.loads(me.stdout) == {"userPrincipalName": "alice", "path": "/v1.0/me"}, me.stdout
        # integrations.md: the same through tessera exec, then a script of the reader's own.
        (Path(env["HOME"]) / "deploy.sh").write_text('#!/bin/sh\nprintf "%s" "$GH_TOKEN" >deployed-with\n')
        (Path(env["HOME"]) / "deploy.sh").chmod(0o755)
        out = sh(env, as_run(doc("docs/integrations.md", "065ed2b617")))
        assert json.loads(out.stdout.splitlines()[0])["userPrincipalName"] == "alice", out.stdout
        assert_token_for_alice((Path(env["HOME"]) / "deployed-with").read_text())
        assert [r[2] for r in graph.requests] == ["bearer", "bearer"] and set(proxy.connects) == {
            "graph.microsoft.com:443"}
    finally:
        proxy.close()
        graph.close()


# ----------------------------------------------------------------------------------------------
# README: which app gets which token; the D-Bus API


def test_readme_access_commands(start_daemon, doc_env, alice):
    started(start_daemon, doc_env)
    alice.sign_in()
    sh(doc_env, as_run(doc("README.md", "c1a0efba29")))
    listed = sh(doc_env, "tessera access list").stdout
    assert "org.example.Mail" in listed and "python3.11" in listed and "org.example.App" not in listed, listed


def busctl_lines(text):
    """The block's commands, one per line, each after the B= line it needs."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0].startswith("B=")
    return lines[0], lines[1:]


def test_readme_busctl_calls(start_daemon, doc_env, idp, alice):
    started(start_daemon, doc_env)
    prelude, commands = busctl_lines(as_run(doc("README.md", "fffa7688f1")))
    ran = []
    for command in commands:
        if "SignOut" in command or "GetAccounts 'a{sv}' 1" in command:
            if not alice.accounts():
                alice.sign_in()
            command = command.replace("ACCOUNT_ID", alice.accounts()[0]["id"])
        script = f"{prelude}\n{command}"
        if "flow s device_code" in command:
            since = idp.last_device_grant()
            waiter = threading.Thread(target=lambda: approve_pending(idp, since), daemon=True)
            waiter.start()
            proc = sh(doc_env, script, check=False)
            waiter.join(5)
        else:
            proc = sh(doc_env, script, check=False)
        if "call $B Cancel" in command:
            # Only the caller that started a sign-in may cancel it: a separate busctl may not.
            # (busctl shows the message of org.tessera.Broker1.Error.InvalidArgument, not its name.)
            assert proc.returncode != 0 and "Only the caller that started a sign-in can cancel it" in proc.stderr, \
                proc.stderr
        else:
            assert proc.returncode == 0, f"{command}\n{proc.stderr}"
        ran.append(command.split("call $B ")[-1].split()[0] if "call $B" in command else command.split()[-1])
    assert ran == ["AcquireToken", "AcquireToken", "AcquireToken", "AcquireTokenSilent", "AcquireTokenSilent",
                   "GetAccounts", "GetAccounts", "SignOut", "SignOut", "Cancel", "Version", "GetStatus",
                   "AttentionNeeded", "ListGrants", "GetAccessLog"], ran


def approve_pending(idp, since):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        codes = idp.pending_user_codes(since)
        if codes:
            idp.approve_device(sorted(codes)[0])
            return
        time.sleep(0.2)


def test_readme_busctl_reaches_the_socket(daemon, doc_env):
    """The README's busctl and gdbus lines, as pasted, get the broker's version and its accounts
    over its own socket."""
    out = sh(doc_env, as_run(doc("README.md", "769981c064"))).stdout.splitlines()
    assert out[0].strip() == f's "{Broker().version()}"', out
    assert out[1].startswith("(@aa{sv} ["), out
