"""Revocation at the IdP and SignOut."""
import time

from conftest import expect_error


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
