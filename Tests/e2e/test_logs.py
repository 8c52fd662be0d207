"""The daemon's log never contains a token, code or secret, even at trace level."""
import pytest

from conftest import Async, Broker, wait_until

# Every secret the IdP creates is copied into this table by triggers (authorization codes and
# access tokens are deleted from their own tables once used, so reading them afterwards is not
# enough).
CAPTURE = [
    ("oauth2_provider_refreshtoken", "token"),
    ("oauth2_provider_accesstoken", "token"),
    ("oauth2_provider_grant", "code"),
    ("oauth2_provider_devicegrant", "device_code"),
]


@pytest.fixture(scope="module")
def idp_secrets(idp):
    statements = ["CREATE TABLE IF NOT EXISTS e2e_seen_secrets (kind TEXT NOT NULL, value TEXT NOT NULL)"]
    for table, column in CAPTURE:
        statements.append(
            f"CREATE TRIGGER IF NOT EXISTS e2e_capture_{table} AFTER INSERT ON {table} "
            f"BEGIN INSERT INTO e2e_seen_secrets VALUES ('{table}.{column}', NEW.{column}); END")
    conn = idp.db()
    try:
        for sql in statements:
            conn.execute(sql)
        conn.commit()
    finally:
        conn.close()

    def seen():
        rows = idp.query("SELECT kind, value FROM e2e_seen_secrets")
        for table, column in CAPTURE:  # and whatever is still in the tables
            rows += [(f"{table}.{column}", v) for (v,) in idp.query(f"SELECT {column} FROM {table}")]
        return rows

    return seen


def test_no_secrets_in_the_trace_log(start_daemon, idp, idp_secrets):
    daemon = start_daemon(log_level="trace")
    b = Broker()
    returned = []
    try:
        first = b.sign_in()
        returned.append(first)
        returned.append(b.silent())
        returned.append(b.silent(force_refresh=True))
        returned.append(b.sign_in(client_id="tessera-short"))
        returned.append(b.silent("tessera-short"))  # 3 s tokens: refreshed (min_validity 300)

        since = idp.last_device_grant()
        device = Async(b.acquire, "tessera-device", flow="device_code", timeout=60)
        codes = wait_until(lambda: idp.pending_user_codes(since), what="a pending device code")
        idp.approve_device(codes.pop())
        returned.append(device.result(60))

        b.sign_out(first["account"]["id"])
    finally:
        b.close()
    daemon.stop()

    log = daemon.log()
    # The log is real: requests were logged at trace level.
    assert "AcquireToken" in log and "SignOut" in log and "AcquireTokenSilent" in log

    secrets = [("access_token", r["access_token"]) for r in returned]
    secrets += [("id_token", r["id_token"]) for r in returned if r.get("id_token")]
    secrets += [(kind, value) for kind, value in idp_secrets() if value]
    kinds = {kind for kind, _ in secrets}
    assert {"oauth2_provider_refreshtoken.token", "oauth2_provider_grant.code",
            "oauth2_provider_devicegrant.device_code"} <= kinds, kinds
    leaked = sorted({kind for kind, value in secrets if len(value) >= 8 and value in log})
    assert not leaked, f"the daemon's log contains secrets: {leaked}"
    # Parts of a JWT (header.payload) are just as bad.
    for _, token in [s for s in secrets if s[0] == "id_token"]:
        assert token.split(".")[1] not in log
