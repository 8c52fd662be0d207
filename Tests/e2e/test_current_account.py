"""A second account beside the first (issue 22, point 3): what was set up for alice keeps working
when bob signs in, `tessera account use bob` moves every helper that names no account to bob
(tessera token, git through git-credential-tessera, kubectl through kube-credential), a
[[git]] entry or --account naming alice by username keeps alice, and the choice outlives a
restart of tesserad and ends with bob's sign-out."""
import json
from conftest import Broker, run_cli
from resource_servers import KubeAPI
from test_integrations import credential, helper_env, kubeconfig, kubectl, kubectl_version, with_tables  # noqa: F401


def token_username(*extra):
    proc = run_cli("token", "--json", *extra, check_rc=0)
    return json.loads(proc.stdout)["account"]["username"]


def test_the_current_account_serves_every_helper_that_names_none(start_daemon, write_config, helper_env, tmp_path):
    config = with_tables(write_config(), '[[git]]\nurl = "git.any.test"\n\n'
                                         '[[git]]\nurl = "git.alice.test"\naccount = "alice"\n')
    helper_env["TESSERA_CONFIG"] = config
    daemon = start_daemon(config)
    b = Broker()
    alice = b.sign_in("alice")
    assert token_username() == "alice"
    bob = b.sign_in("bob")
    b.close()

    # bob beside alice: alice stays the one used, so nothing set up for her breaks.
    assert token_username() == "alice"
    listed = run_cli("accounts", check_rc=0).stdout.splitlines()
    assert sorted(line.split("\t")[0] + ":" + line.split("\t")[-1] for line in listed) == ["alice:current", "bob:-"]

    def git_user(host):
        got = credential(helper_env, "get", f"protocol=https\nhost={host}\n\n")
        assert got.returncode == 0, got.stderr
        password = dict(line.split("=", 1) for line in got.stdout.splitlines())["password"]
        for who in ("alice", "bob"):
            if password == json.loads(run_cli("token", "--json", "--account", who, check_rc=0).stdout)["access_token"]:
                return who
        return None

    assert git_user("git.any.test") == "alice"

    used = run_cli("account", "use", "bob", check_rc=0)
    assert used.stdout.startswith("bob is now the current account")
    assert token_username() == "bob"
    assert token_username("--account", "alice") == "alice", "--account by username still names alice"
    assert git_user("git.any.test") == "bob"
    assert git_user("git.alice.test") == "alice", "a [[git]] entry naming alice keeps alice"
    status = run_cli("status")
    assert "* bob (" in status.stdout and "  alice (" in status.stdout, status.stdout

    version = kubectl_version()
    assert version is not None, "kubectl is not installed: scripts/test installs it (kubernetes-client)"
    api = KubeAPI()
    try:
        api_version = "client.authentication.k8s.io/v1" if version >= (1, 22) else "client.authentication.k8s.io/v1beta1"
        modern = version >= (1, 22)
        got = kubectl(helper_env, kubeconfig(tmp_path / "kube.json", api.url, api_version, "Never" if modern else None))
        assert got.returncode == 0, got.stderr
        assert {r[3] for r in api.requests if r[4] == 200} == {"bob"}
    finally:
        api.close()

    # The choice is kept in the keyring: a restarted tesserad still uses bob.
    daemon.stop()
    start_daemon(config)
    assert token_username() == "bob"

    # bob signed out (`tessera logout` without --account signs out the current one): alice alone.
    out = run_cli("logout", check_rc=0)
    assert out.stdout.strip() == "Signed out bob."
    assert token_username() == "alice"
    assert run_cli("accounts", check_rc=0).stdout.split("\t")[0] == "alice"
    assert alice["account"]["id"] != bob["account"]["id"]


def test_account_use_of_an_unknown_account_changes_nothing(broker):
    broker.sign_in("alice")
    broker.sign_in("bob")
    wrong = run_cli("account", "use", "carol")
    assert wrong.returncode == 5, wrong.stderr
    assert "No signed-in account is 'carol'" in wrong.stderr and "tessera accounts" in wrong.stderr
    assert token_username() == "alice"
