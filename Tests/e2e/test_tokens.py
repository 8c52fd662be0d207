"""Sign-in, the token cache, refresh, several accounts and clients, restart."""
import json
import re
import time
import uuid

from conftest import AUTHORITY, ENVIRONMENT, TENANT, Broker, expect_error, jwt_claims, wait_until

ACCOUNT_KEYS = {"id", "username", "name", "authority", "environment", "realm", "local_account_id"}
# The test IdP's oid claim: uuid5 of the username (Tests/idp/idp/validators.py).
OID_NAMESPACE = uuid.UUID("0b8a5d0e-7a1c-4a44-9d8e-4e7c1b2f0a11")
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_interactive_sign_in(broker, monitor):
    before = time.time()
    result = broker.acquire()  # defaults: tessera-test, default_scopes; browser.py signs in alice
    assert set(result) >= {"access_token", "token_type", "expires_on", "scopes", "account", "id_token", "correlation_id"}
    assert isinstance(result["access_token"], str) and len(result["access_token"]) >= 20
    assert result["token_type"].lower() == "bearer"
    assert isinstance(result["expires_on"], int)
    assert before + 3000 < result["expires_on"] <= time.time() + 3601  # tessera-test tokens live 1 h
    assert "read" in result["scopes"]

    account = result["account"]
    assert set(account) == ACCOUNT_KEYS
    assert account["username"] == "alice"
    assert account["name"] == "Alice Liddell"
    assert account["authority"] == AUTHORITY
    assert account["environment"] == ENVIRONMENT
    assert account["realm"] == TENANT
    assert account["local_account_id"] == str(uuid.uuid5(OID_NAMESPACE, "alice"))
    assert re.fullmatch(r".+\.[0-9a-f]{12}", account["id"]), account["id"]

    claims = jwt_claims(result["id_token"])
    assert claims["preferred_username"] == "alice"
    assert claims["aud"] == "tessera-test" or "tessera-test" in claims["aud"]
    assert claims["iss"] == AUTHORITY
    assert UUID_RE.fullmatch(result["correlation_id"]), result["correlation_id"]

    # Signals: InteractionPending to the caller only, AccountsChanged to everyone.
    monitor.sync()
    pending = monitor.signals("InteractionPending")
    assert [s["destination"] for s in pending] == [broker.unique_name]
    changed = monitor.signals("AccountsChanged")
    assert len(changed) == 1 and changed[0]["destination"] is None

    # A caller's correlation id is echoed; signing in again to a known account is no account change.
    again = broker.acquire(correlation_id="e2e-correlation-0001")
    assert again["correlation_id"] == "e2e-correlation-0001"
    assert again["account"] == account
    assert again["access_token"] != result["access_token"]
    monitor.sync()
    assert len(monitor.signals("AccountsChanged")) == 1
    assert [a["id"] for a in broker.accounts()] == [account["id"]]


def test_silent_is_served_from_the_cache(broker, idp):
    signed_in = broker.sign_in()
    mark = idp.mark()
    for kwargs in ({}, {"account_id": signed_in["account"]["id"]}, {"scopes": ["READ"]}):
        result = broker.silent(**kwargs)
        assert result["access_token"] == signed_in["access_token"]
        assert result["expires_on"] == signed_in["expires_on"]
        assert result["account"] == signed_in["account"]
        assert UUID_RE.fullmatch(result["correlation_id"])
    assert broker.silent(correlation_id="e2e-silent-7")["correlation_id"] == "e2e-silent-7"
    assert idp.requests(mark) == [], "a cached token must not cause any request to the IdP"


def test_silent_refreshes_an_expired_token(broker, idp):
    signed_in = broker.sign_in(client_id="tessera-short")
    assert signed_in["expires_on"] - time.time() <= 4  # the IdP issues 3 s tokens to tessera-short
    mark = idp.mark()
    if time.time() < signed_in["expires_on"] - 0.5:  # (unless this machine is very slow)
        # Still valid: min_validity=0 serves it from the cache.
        assert broker.silent("tessera-short", min_validity=0)["access_token"] == signed_in["access_token"]
        assert idp.requests(mark) == []
    time.sleep(max(0.0, signed_in["expires_on"] + 0.3 - time.time()))

    refreshed = broker.silent("tessera-short", min_validity=0)
    assert refreshed["access_token"] != signed_in["access_token"]
    assert refreshed["expires_on"] > time.time()
    assert refreshed["account"] == signed_in["account"]
    posts = idp.token_posts(mark)
    assert [p["grant_type"] for p in posts] == ["refresh_token"], posts
    assert posts[0]["status"] == 200 and posts[0]["client_id"] == "tessera-short"


def test_force_refresh_and_refresh_token_rotation(broker, idp):
    first_id = idp.max_refresh_token_id()
    signed_in = broker.sign_in()

    def ours():
        return [t for t in idp.refresh_tokens("alice", "tessera-test") if t["id"] > first_id]

    issued = ours()
    assert len(issued) == 1 and not issued[0]["revoked"]

    mark = idp.mark()
    refreshed = broker.silent(force_refresh=True)
    assert refreshed["access_token"] != signed_in["access_token"]
    assert [p["grant_type"] for p in idp.token_posts(mark)] == ["refresh_token"]
    after = {t["id"]: t for t in ours()}
    assert after[issued[0]["id"]]["revoked"], "the IdP rotated the refresh token: the old one is revoked"
    live = [t for t in after.values() if not t["revoked"]]
    assert len(live) == 1 and live[0]["id"] > issued[0]["id"]

    # The broker kept the rotated token: a second forced refresh works (the old one would be refused).
    again = broker.silent(force_refresh=True)
    assert again["access_token"] not in (signed_in["access_token"], refreshed["access_token"])
    assert len([t for t in ours() if not t["revoked"]]) == 1
    # The newest token is what the cache serves now.
    assert broker.silent()["access_token"] == again["access_token"]


def test_two_accounts(broker):
    alice = broker.sign_in("alice")
    bob = broker.sign_in("bob")
    assert alice["account"]["id"] != bob["account"]["id"]
    accounts = broker.accounts()
    assert [a["username"] for a in accounts] == ["alice", "bob"]
    assert {a["id"] for a in accounts} == {alice["account"]["id"], bob["account"]["id"]}
    assert [a["username"] for a in broker.accounts(username="BOB")] == ["bob"]

    # "" names the current account: alice, the only one before bob signed in beside her.
    assert broker.silent()["account"]["id"] == alice["account"]["id"]
    assert [a["current"] for a in broker.accounts()] == [True, False]

    for who in (alice, bob):
        result = broker.silent(account_id=who["account"]["id"])
        assert result["account"]["username"] == who["account"]["username"]
        assert result["access_token"] == who["access_token"]
        assert jwt_claims(result["id_token"])["preferred_username"] == who["account"]["username"]


def test_two_client_ids(broker, idp):
    test = broker.sign_in(client_id="tessera-test")
    message = expect_error("InteractionRequired", broker.silent, "tessera-other")
    assert "tessera-other" in message

    other = broker.sign_in(client_id="tessera-other")
    assert other["account"]["id"] == test["account"]["id"]
    assert jwt_claims(other["id_token"])["aud"] in ("tessera-other", ["tessera-other"])
    assert len(broker.accounts()) == 1
    assert [a["username"] for a in broker.accounts(client_id="tessera-other")] == ["alice"]

    mark = idp.mark()
    assert broker.silent("tessera-test")["access_token"] == test["access_token"]
    assert broker.silent("tessera-other")["access_token"] == other["access_token"]
    assert test["access_token"] != other["access_token"]
    assert idp.requests(mark) == []
    # Each client refreshes with its own refresh token.
    forced = broker.silent("tessera-other", force_refresh=True)
    assert idp.token_posts(mark)[-1]["client_id"] == "tessera-other"
    assert broker.silent("tessera-test")["access_token"] == test["access_token"]
    assert broker.silent("tessera-other")["access_token"] == forced["access_token"]


def test_tokens_survive_a_daemon_restart(daemon, broker, idp):
    signed_in = broker.sign_in()
    daemon.restart()
    mark = idp.mark()
    fresh = Broker()
    try:
        result = fresh.silent()
        assert result["access_token"] == signed_in["access_token"]
        assert result["account"] == signed_in["account"]
        assert [a["id"] for a in fresh.accounts()] == [signed_in["account"]["id"]]
    finally:
        fresh.close()
    assert idp.requests(mark) == [], "after a restart the token must come from the Secret Service"


def test_a_keyring_with_hundreds_of_accounts_loads_whole(daemon, broker, keyring):
    # The broker reads the keyring in batches of GetSecrets calls; every batch must arrive.
    signed_in = broker.sign_in()
    [path] = [p for p in keyring.item_paths()
              if keyring.item_attributes_of(p)["kind"] == "account"]
    account = json.loads(keyring.secret(path))
    ids = [f"bulk-{n}.bulk" for n in range(300)]
    for n, account_id in enumerate(ids):
        clone = dict(account, id=account_id, username=f"user{n}@bulk.test", localAccountID=str(n))
        keyring.create_item(
            {"tessera_schema": "1", "kind": "account", "account_id": account_id, "environment": account["environment"]},
            json.dumps(clone))
    daemon.restart()
    fresh = Broker()
    try:
        listed = {a["id"] for a in fresh.accounts()}
        assert listed == set(ids) | {signed_in["account"]["id"]}
        assert fresh.silent(account_id=signed_in["account"]["id"])["access_token"] == signed_in["access_token"]
    finally:
        fresh.close()


def test_refresh_ahead_renews_a_token_in_use_without_making_the_caller_wait(broker, idp):
    # tessera-short tokens live 3 s; the broker refreshes them ahead after half their life. The call
    # must reach the broker between that and expiry: aimed 0.7 s before expiry, a loaded machine may
    # deliver it only after. Its reply coming after expiry is how such an attempt shows: it proves
    # nothing either way, and is made again with the fresh token it got. A reply before expiry
    # means the broker saw a valid token, which it must serve from its cache.
    current = broker.sign_in(client_id="tessera-short")
    for _ in range(5):
        time.sleep(max(0.0, current["expires_on"] - 0.7 - time.time()))  # past refresh time, still valid
        mark = idp.mark()
        served = broker.silent("tessera-short", min_validity=0)
        if served["access_token"] == current["access_token"] or time.time() <= current["expires_on"]:
            break
        current = served
    assert served["access_token"] == current["access_token"], "the caller got the cached token at once"
    # ... and the broker renewed it in the background (30 s only bounds a hang).
    wait_until(lambda: idp.token_posts(mark, grant_type="refresh_token"), timeout=30, what="the refresh ahead")
    assert [p["status"] for p in idp.token_posts(mark, grant_type="refresh_token")] == [200]
    # The renewed token is in the cache once the background refresh has stored it (a bounded wait).
    renewed = wait_until(
        lambda: (r := broker.silent("tessera-short", min_validity=0))["access_token"] != current["access_token"] and r,
        timeout=30, what="the renewed token in the cache")
    assert len(idp.token_posts(mark, grant_type="refresh_token")) == 1, "the renewed token came from the cache"
