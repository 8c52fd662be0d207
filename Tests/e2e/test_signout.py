"""Revocation at the IdP and SignOut, here and in the browser (issue 39, point 4)."""
import time

from conftest import Broker, expect_error, jwt_claims, run_cli, wait_until


def test_revoked_at_the_idp_needs_interaction_but_keeps_the_account(broker, idp):
    signed_in = broker.sign_in()
    idp.revoke_user("alice")
    message = expect_error("InteractionRequired", broker.silent, force_refresh=True)
    assert "sign in" in message.lower() or "acquiretoken" in message.lower()
    # The account stays listed, so an app can offer to sign in again with it.
    assert [a["id"] for a in broker.accounts()] == [signed_in["account"]["id"]]
    # ... and signing in again makes it work again.
    again = broker.sign_in(account_id=signed_in["account"]["id"])
    assert again["account"]["id"] == signed_in["account"]["id"]
    assert broker.silent(force_refresh=True)["account"]["username"] == "alice"


def test_sign_out_removes_everything_and_revokes(broker, idp, keyring, monitor):
    first_id = idp.max_refresh_token_id()
    account_id = broker.sign_in()["account"]["id"]
    broker.sign_in(client_id="tessera-other")
    # The account and refresh tokens are stored before the reply; access tokens just behind it.
    # And the grant each sign-in gives the app that completed it (issue 11), one per client.
    assert sorted(a["kind"] for a in keyring.item_attributes() if a["kind"] != "access_token") == [
        "access_grant", "access_grant", "account", "refresh_token", "refresh_token"]
    deadline = time.monotonic() + 30  # only bounds a hang: they are stored just behind the reply
    while True:
        kinds = sorted(a["kind"] for a in keyring.item_attributes())
        if kinds.count("access_token") == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert kinds == ["access_grant", "access_grant", "access_token", "access_token", "account", "refresh_token",
                     "refresh_token"], kinds

    mark = idp.mark()
    broker.sign_out(account_id)
    assert keyring.item_paths() == [], "SignOut must delete every Tessera item from the keyring"
    assert broker.accounts() == []
    expect_error("NoSuchAccount", broker.silent)
    expect_error("NoSuchAccount", broker.silent, account_id=account_id)
    expect_error("NoSuchAccount", broker.sign_out, account_id)

    ours = [t for t in idp.refresh_tokens("alice") if t["id"] > first_id]
    assert {t["client_id"] for t in ours} == {"tessera-test", "tessera-other"}
    assert all(t["revoked"] for t in ours), ours
    revocations = [r for r in idp.requests(mark) if "/o/revoke" in r["path"]]
    assert len(revocations) == 2 and all(r["status"] == 200 for r in revocations)
    monitor.sync()
    assert len(monitor.signals("AccountsChanged")) == 2  # sign-in and sign-out


def test_sign_out_without_revoke_leaves_the_idp_token(broker, idp, keyring):
    first_id = idp.max_refresh_token_id()
    account_id = broker.sign_in()["account"]["id"]
    mark = idp.mark()
    broker.sign_out(account_id, revoke=False)
    assert keyring.item_paths() == []
    assert broker.accounts() == []
    assert idp.requests(mark) == [], "revoke=false must not call the IdP"
    ours = [t for t in idp.refresh_tokens("alice", "tessera-test") if t["id"] > first_id]
    assert len(ours) == 1 and not ours[0]["revoked"]


def test_sign_out_of_one_client_keeps_the_account(broker, idp, keyring):
    first_id = idp.max_refresh_token_id()
    test = broker.sign_in(client_id="tessera-test")
    account_id = test["account"]["id"]
    broker.sign_in(client_id="tessera-other")

    broker.sign_out(account_id, client_id="tessera-other")
    assert [a["id"] for a in broker.accounts()] == [account_id]
    assert broker.accounts(client_id="tessera-other") == []
    expect_error("InteractionRequired", broker.silent, "tessera-other")
    assert broker.silent("tessera-test")["access_token"] == test["access_token"]

    items = keyring.item_attributes()
    assert not [a for a in items if a.get("client_id") == "tessera-other"], items
    assert sorted(a["kind"] for a in items) == ["access_grant", "access_token", "account", "refresh_token"]
    ours = {t["client_id"]: t for t in idp.refresh_tokens("alice") if t["id"] > first_id}
    assert ours["tessera-other"]["revoked"] and not ours["tessera-test"]["revoked"]


def test_sign_out_in_the_browser_ends_the_idp_session_so_the_next_sign_in_asks_for_the_password(
        start_daemon, write_config, tmp_path):
    # The scripted browser keeps the IdP's cookies, as a real one does: a second sign-in finds the
    # IdP's session and shows no login page.
    daemon = start_daemon(write_config(), extra_env={"TESSERA_TEST_BROWSER_COOKIES": str(tmp_path / "cookies.txt")})
    b = Broker()
    try:
        def login_pages():
            return daemon.log().count("login page: the identity provider asks for a password")

        signed_in = b.sign_in()
        id_token = signed_in["id_token"]
        assert jwt_claims(id_token)["sub"]
        assert login_pages() == 1

        # A plain sign-out forgets the account here, but the browser's session at the IdP lives on:
        # signing in again needs no password (what pop-os/pop#4 reported).
        out = run_cli("logout", check_rc=0)
        assert "Signed out alice" in out.stdout, out.stdout
        b.sign_in()
        assert login_pages() == 1, "the IdP's session should have let the sign-in through"

        out = run_cli("logout", "--browser", check_rc=0)
        assert "opened the provider's sign-out page" in out.stdout, out.stdout
        assert b.accounts() == []
        wait_until(lambda: "signed out at the identity provider" in daemon.log(), what="the browser's sign-out")

        again = b.sign_in()
        assert again["account"]["username"] == "alice"
        assert login_pages() == 2, "after a sign-out in the browser the IdP asks for the password again"
        # The id_token went to the IdP through the browser, never into the log.
        log = daemon.log()
        assert id_token not in log and id_token.split(".")[1] not in log
        assert "Opened the provider's sign-out page in the browser" in log
    finally:
        b.close()


def test_sign_out_in_the_browser_with_an_app_s_client_id_is_refused(start_daemon, write_config):
    start_daemon(write_config())
    out = run_cli("logout", "--browser", "--client-id", "tessera-test")
    assert out.returncode == 64, (out.returncode, out.stderr)
    assert "--client-id" in out.stderr, out.stderr
