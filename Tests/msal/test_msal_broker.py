"""The real MSAL Python (msal[broker], pymsalruntime) with tesserad as its Linux broker
(com.microsoft.identity.broker1), against the test IdP playing login.microsoftonline.com.

Each MSAL operation runs in its own process (msal_client.py). msalruntime keeps its own cache in
the keyring, so to show that tesserad answered, the tests delete msalruntime's cached tokens (or
all of its cache: an app that never ran here) and check the IdP's request log.
"""
import json
import time

import pytest
from conftest import AUTHORITY, account_of, assert_token, ms_call

SHORT = "tessera-short"  # the IdP's access tokens for this client live 3 s (Tests/idp/idp/lifetimes.py)


def sign_in(msal, user, **kw):
    """MSAL's interactive sign-in; tesserad opens the test browser, which signs in as `user`."""
    result = msal("interactive", login_hint=user, **kw)
    assert_token(result, user)
    return result


def test_broker_answers_the_protocol(broker):
    """The front as every client first meets it (no accounts yet)."""
    assert ms_call("getLinuxBrokerVersion", {}).get("linuxBrokerVersion")
    answer = ms_call("getAccounts", {"clientId": "tessera-test", "redirectUri": "tessera-test"})
    assert answer == {"accounts": []} or answer.get("accounts") == [], answer


def test_msal_enables_its_broker(broker, msal):
    result = msal("version")
    assert result["broker_enabled"], result
    assert result["result"]["msal"]


def test_interactive_sign_in(broker, msal, idp, calls):
    mark, seen = idp.mark(), calls.mark()
    result = sign_in(msal, "alice")
    account = account_of(result, "alice")
    # Entra-style home account: "<oid>.<tid>" from client_info; environment = the authority's host.
    assert account["home_account_id"].endswith("." + account["realm"]), account
    assert account["local_account_id"] == account["home_account_id"].split(".")[0]
    assert account["environment"] == "login.microsoftonline.com"
    assert idp.authorizations(mark), "no sign-in at the IdP"
    assert idp.token_posts(mark, grant_type="authorization_code", status=200), "no code redeemed at the IdP"
    members = calls.since(seen)
    assert "acquireTokenInteractively" in members, members
    listed = ms_call("getAccounts", {"clientId": "tessera-test", "redirectUri": "tessera-test"})["accounts"]
    assert [a["username"] for a in listed] == ["alice"], listed
    assert listed[0]["homeAccountId"] == account["home_account_id"]


def test_silent_from_tesserad_cache(broker, msal, idp, keyring, calls):
    first = sign_in(msal, "alice")
    account = account_of(first, "alice")
    assert keyring.clear_msalruntime_tokens() > 0, "msalruntime cached no tokens in the keyring"
    mark, seen = idp.mark(), calls.mark()
    result = msal("silent", account=account)
    assert_token(result, "alice")
    assert "acquireTokenSilently" in calls.since(seen), "MSAL answered from its own cache, not through the broker"
    assert idp.sign_in_traffic(mark) == [], "tesserad's cache should have answered without the IdP"


def test_second_app_signs_in_without_a_prompt(broker, msal, idp, keyring, calls):
    """An app that never ran here (msalruntime cache empty): MSAL's interactive call asks the
    broker for accounts and a silent token first; tesserad's cache answers, no browser, no IdP."""
    sign_in(msal, "alice")
    keyring.clear_msalruntime()
    mark, seen = idp.mark(), calls.mark()
    result = msal("interactive", login_hint="alice")
    assert_token(result, "alice")
    members = calls.since(seen)
    assert members[:2] == ["getAccounts", "acquireTokenSilently"], members
    assert idp.sign_in_traffic(mark) == [], "no request should have reached the IdP"


def test_silent_after_expiry_refreshes(broker, msal, idp, keyring, calls):
    first = sign_in(msal, "alice", client_id=SHORT)
    account = account_of(first, "alice")
    time.sleep(4)  # the access token has expired (3 s)
    keyring.clear_msalruntime_tokens()
    mark = idp.mark()
    result = msal("silent", account=account, client_id=SHORT)
    token = assert_token(result, "alice")
    assert token["access_token"] != first["result"]["access_token"]
    assert idp.token_posts(mark, grant_type="refresh_token", status=200), "tesserad did not refresh at the IdP"
    assert not idp.authorizations(mark), "a refresh must not need a sign-in"


def test_two_accounts(broker, msal, idp, keyring, calls):
    alice = account_of(sign_in(msal, "alice"), "alice")
    bob = account_of(sign_in(msal, "bob"), "bob")
    assert alice["home_account_id"] != bob["home_account_id"]
    listed = ms_call("getAccounts", {"clientId": "tessera-test", "redirectUri": "tessera-test"})["accounts"]
    assert sorted(a["username"] for a in listed) == ["alice", "bob"], listed
    keyring.clear_msalruntime_tokens()
    mark = idp.mark()
    for user, account in (("alice", alice), ("bob", bob)):
        assert_token(msal("silent", account=account), user)
    assert idp.sign_in_traffic(mark) == [], "both accounts' tokens should come from tesserad's cache"


def test_remove_account(broker, msal, idp, keyring, calls):
    result = sign_in(msal, "alice")
    account = account_of(result, "alice")
    # MSAL's remove_account signs out in msalruntime only (it sends no removeAccount): afterwards
    # MSAL refuses silent tokens for the account.
    removed = msal("remove", account=account)
    assert removed["ok"], removed
    after = msal("silent", account=account)
    assert not after["ok"], after
    # Other clients (sso-mib, teams-for-linux) call removeAccount: tesserad forgets the account.
    listed = ms_call("getAccounts", {"clientId": "tessera-test", "redirectUri": "tessera-test"})["accounts"]
    full = next(a for a in listed if a["username"] == "alice")
    answer = ms_call("removeAccount", {"clientId": "tessera-test", "account": full})
    assert "error" not in answer, answer
    listed = ms_call("getAccounts", {"clientId": "tessera-test", "redirectUri": "tessera-test"})["accounts"]
    assert all(a["username"] != "alice" for a in listed), listed
    # A new app then gets no token without a sign-in: the browser does nothing, so none happens.
    keyring.clear_msalruntime()
    mark = idp.mark()
    assert ms_call("acquireTokenSilently", {"authParameters": {
        "account": full, "authority": AUTHORITY, "authorizationType": 1, "clientId": "tessera-test",
        "redirectUri": "tessera-test", "requestedScopes": ["read"], "username": "alice"}}
    )["brokerTokenResponse"]["error"]["status"] == 2
    assert not idp.token_posts(mark, status=200)


def test_revocation_gives_interaction_required(broker, msal, idp, keyring, calls):
    first = sign_in(msal, "alice", client_id=SHORT)
    account = account_of(first, "alice")
    idp.revoke_user("alice")
    time.sleep(4)  # tesserad's access token has expired too: it must use the revoked refresh token
    keyring.clear_msalruntime_tokens()
    mark = idp.mark()
    result = msal("silent", account=account, client_id=SHORT)
    assert not result["ok"], result
    assert result["error"] == "broker_error", result
    description = (result.get("result") or {}).get("error_description", "")
    assert "InteractionRequired" in description, description
    assert idp.token_posts(mark, grant_type="refresh_token"), "tesserad did not try the refresh token"
    assert not idp.token_posts(mark, status=200), "no token may be issued after the revocation"
    # Interaction then signs the user in again.
    again = sign_in(msal, "alice", client_id=SHORT)
    assert again["result"]["access_token"] != first["result"]["access_token"]


def test_tessera_login_then_msal(broker, msal, idp, cli, calls):
    """Cross-front single sign-on: signed in with `tessera login`, an MSAL app (that never ran here)
    gets a token for the same account without a prompt."""
    login = cli("login", "--login-hint", "alice", "--json")
    assert login.returncode == 0, login.stderr
    signed_in = json.loads(login.stdout)
    assert signed_in["username"] == "alice"
    mark, seen = idp.mark(), calls.mark()
    result = msal("interactive", login_hint="alice")
    assert_token(result, "alice")
    assert account_of(result, "alice")["home_account_id"] == signed_in["id"]
    assert not idp.authorizations(mark), "MSAL's call should not have needed a sign-in"
    assert not idp.token_posts(mark, grant_type="authorization_code")
    assert "acquireTokenSilently" in calls.since(seen)


def test_msal_then_tessera_token(broker, msal, idp, cli):
    """The reverse: signed in through MSAL, `tessera token` needs no sign-in."""
    result = sign_in(msal, "alice")
    mark = idp.mark()
    token = cli("token", "--json")
    assert token.returncode == 0, token.stderr
    answer = json.loads(token.stdout)
    assert answer["account"]["username"] == "alice"
    assert answer["account"]["id"] == account_of(result, "alice")["home_account_id"]
    assert not idp.authorizations(mark), "tessera token must not need a sign-in after MSAL's"
    assert not idp.token_posts(mark, grant_type="authorization_code")


@pytest.mark.parametrize("method", ["getAccounts", "acquireTokenSilently", "acquireTokenInteractively",
                                    "removeAccount", "getLinuxBrokerVersion"])
def test_broker_keeps_running_on_garbage(broker, method):
    """Not MSAL, but what any client could send: a JSON answer (never a D-Bus error), the broker survives."""
    answer = ms_call(method, {"unexpected": True}, timeout=30)  # a D-Bus error fails the test
    if method == "getLinuxBrokerVersion":
        assert answer.get("linuxBrokerVersion"), answer
    else:
        error = answer.get("error") or answer.get("brokerTokenResponse", {}).get("error")
        assert error and error["status"] == 6, answer  # ApiContractViolation
        assert len(error["context"]) > 20, error
    assert broker.owned(), f"the broker went away after a bad {method} request"
    assert broker.proc.poll() is None
