"""The Microsoft broker front: com.microsoft.identity.broker1, served by the same tesserad as
org.tessera.Broker1 and from the same token cache.

The tests replay what real clients send (linux-entra-sso, sso-mib, onedrive, teams-for-linux, MSAL
through msalruntime: their requests as in /work/shared/notes/microsoft-broker-protocol.md and their
sources), check what each of them reads from the answers (field names and JSON types), fuzz the
front with malformed requests, and check single sign-on across the two fronts.

The clients' hard-coded Microsoft values are replaced by the test IdP's: the authority
(https://login.microsoftonline.com/common -> AUTHORITY), the client ids (Edge's, Teams', OneDrive's
-> tessera-test / tessera-other, which the test IdP knows) and the scopes (Graph's -> "read").
Everything else is sent as the clients send it.

Errors travel inside the JSON answer, never as D-Bus errors: every call here goes through
MsBroker.raw, which fails the test on a D-Bus error."""
import base64
import json
import os
import random
import re
import shlex
import subprocess
import time
import uuid
import xml.etree.ElementTree as ET

import dbus
import dbus.bus
import dbus.lowlevel
import pytest

from bus_fuzz import SEED, send_all
from conftest import (AUTHORITY, BUS_NAME, PendingCall, ENVIRONMENT, IDP_URL, INTERACTIVE_TIMEOUT, SILENT_TIMEOUT, TENANT,
                      Broker, BusPeer, bus_daemon, expect_error, jwt_claims, new_connection, run_cli, wait_until)

MS_NAME = "com.microsoft.identity.broker1"
MS_PATH = "/com/microsoft/identity/broker1"
MS_IFACE = "com.microsoft.identity.Broker1"
MS_METHODS = ["acquireTokenInteractively", "acquireTokenSilently", "getAccounts", "removeAccount",
              "acquirePrtSsoCookie", "generateSignedHttpRequest", "cancelInteractiveFlow", "getLinuxBrokerVersion"]
TOKEN_METHODS = {"acquireTokenInteractively", "acquireTokenSilently"}

# `status` on the wire, as msalruntime reads it (see the note).
INTERACTION_REQUIRED = 2
NETWORK_STATUSES = {3, 4, 5}  # NoNetwork, NetworkTemporarilyUnavailable, ServerTemporarilyUnavailable
API_CONTRACT_VIOLATION = 6
CANCELED_STATUSES = {7, 8}  # UserCanceled, ApplicationCanceled
AUTHORITY_UNTRUSTED = 11
DEVICE_NOT_REGISTERED = 17

ERROR_KEYS = {"context", "diagnostics", "errorCode", "status", "subStatus", "tag"}
ERROR_TOKEN_RESPONSE_KEYS = {"accessTokenType", "error", "expiresOn", "extendedExpiresOn", "subError"}
TOKEN_RESPONSE_KEYS = {"accessToken", "accessTokenType", "account", "clientInfo", "expiresOn", "extendedExpiresOn",
                       "grantedScopes", "idToken"}
ACCOUNT_FIELDS = {"environment", "givenName", "familyName", "homeAccountId", "localAccountId", "name",
                  "passwordExpiry", "realm", "username", "clientInfo", "authorityType"}
# sso-mib's mib_account_from_json refuses an account without any of these.
SSO_MIB_ACCOUNT_MEMBERS = {"clientInfo", "environment", "givenName", "homeAccountId", "localAccountId", "name",
                           "passwordExpiry", "realm", "username"}
# sso-mib's mib_prt_from_json refuses a token response without any of these.
SSO_MIB_TOKEN_MEMBERS = {"accessToken", "accessTokenType", "account", "clientInfo", "expiresOn", "idToken",
                         "grantedScopes"}

SCOPES = ["read"]
LIFETIME = 3600  # the test IdP's access tokens live 1 h (Tests/idp/idp/lifetimes.py), tessera-short's aside
# The test IdP's oid claim: uuid5 of the username (Tests/idp/idp/validators.py).
OID_NAMESPACE = uuid.UUID("0b8a5d0e-7a1c-4a44-9d8e-4e7c1b2f0a11")
UUID36 = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
VERSION_RE = re.compile(r"\d+(\.\d+)+")
NATIVE_CLIENT = "https://login.microsoftonline.com/common/oauth2/nativeclient"
MAX_REQUEST = 65536  # bytes of requestJson (and of any string argument) the front reads

PRT_CONTEXT = re.compile(r"primary refresh token|\bPRT\b|device", re.IGNORECASE)


# ----------------------------------------------------------------------------------------------
# JSON values


def is_int(value):
    """A JSON integer (json.loads gives int; a float or a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def b64url_json(text):
    assert isinstance(text, str) and re.fullmatch(r"[A-Za-z0-9_-]+=*", text), f"not base64url: {text!r}"
    return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def check_account(account):
    """Every field a client reads, with its JSON type (sso-mib drops an account that lacks one)."""
    assert isinstance(account, dict), account
    missing = ACCOUNT_FIELDS - set(account)
    assert not missing, f"account lacks {sorted(missing)}: {account}"
    for key in ACCOUNT_FIELDS - {"passwordExpiry"}:
        assert isinstance(account[key], str), f"account.{key} is not a string: {account[key]!r}"
    assert is_int(account["passwordExpiry"]) and account["passwordExpiry"] == 0, account["passwordExpiry"]
    # sso-mib: uuid_parse(realm) must succeed (36 characters, hyphens in place).
    assert UUID36.fullmatch(account["realm"]), f"realm is not a UUID: {account['realm']!r}"
    uuid.UUID(account["realm"])
    assert account["authorityType"] == "MSSTS"
    info = b64url_json(account["clientInfo"])
    assert isinstance(info, dict) and isinstance(info.get("uid"), str) and isinstance(info.get("utid"), str), info
    for key in ("homeAccountId", "localAccountId", "username", "environment"):
        assert account[key], f"account.{key} is empty"
    return account


def check_alice(account, native):
    """alice's account as the Microsoft front shows it, against the native front's view of it."""
    check_account(account)
    assert account["environment"] == ENVIRONMENT
    assert account["username"] == native["username"] == "alice"
    assert account["name"] == "Alice Liddell"
    assert account["givenName"] == "Alice"
    assert account["familyName"] == "Liddell"
    # Not Entra: homeAccountId is Tessera's account id; localAccountId the oid claim.
    assert account["homeAccountId"] == native["id"]
    assert account["localAccountId"] == native["local_account_id"] == str(uuid.uuid5(OID_NAMESPACE, "alice"))
    # The test IdP's tid is a UUID: it is the realm.
    assert account["realm"].lower() == TENANT.lower()


def error_of(method, response):
    """The error object of an error answer, in the place the method's clients read it:
    brokerTokenResponse.error for the token methods, error at the top level for the others."""
    assert isinstance(response, dict), response
    if method in TOKEN_METHODS:
        assert "brokerTokenResponse" in response, f"{method}: no brokerTokenResponse: {response}"
        btr = response["brokerTokenResponse"]
        assert isinstance(btr, dict), btr
        missing = ERROR_TOKEN_RESPONSE_KEYS - set(btr)
        assert not missing, f"{method}: error response lacks {sorted(missing)}: {btr}"
        assert "accessToken" not in btr, btr
        assert is_int(btr["accessTokenType"]) and btr["accessTokenType"] == 0, btr
        assert is_int(btr["expiresOn"]) and btr["expiresOn"] == 0, btr
        assert is_int(btr["extendedExpiresOn"]) and btr["extendedExpiresOn"] == 0, btr
        assert isinstance(btr["subError"], str), btr
        error = btr["error"]
    else:
        assert "error" in response, f"{method}: no error: {response}"
        error = response["error"]
    assert isinstance(error, dict), error
    assert set(error) == ERROR_KEYS, f"{method}: error keys {sorted(error)}"
    assert isinstance(error["context"], str) and error["context"].strip(), error
    assert len(error["context"]) < 2000, "the context must not echo a huge input"
    assert error["diagnostics"] is None, error
    for key in ("errorCode", "status", "subStatus", "tag"):
        assert is_int(error[key]), f"error.{key} is not an integer: {error[key]!r}"
    assert error["subStatus"] == 0 and error["tag"] == 0, error
    return error


def expect_ms_error(method, response, status):
    error = error_of(method, response)
    assert error["status"] == status, f"{method}: status {error['status']}, not {status}: {error['context']}"
    return error


def token_of(response, client_id, scopes, method="acquireTokenSilently"):
    """A successful token answer -> its brokerTokenResponse, every field checked."""
    assert isinstance(response, dict) and "brokerTokenResponse" in response, response
    btr = response["brokerTokenResponse"]
    if isinstance(btr, dict) and "error" in btr:
        pytest.fail(f"{method} failed: {btr['error']} (subError {btr.get('subError')!r})")
    missing = TOKEN_RESPONSE_KEYS - set(btr)
    assert not missing, f"token response lacks {sorted(missing)}: {sorted(btr)}"
    assert isinstance(btr["accessToken"], str) and len(btr["accessToken"]) >= 20, btr["accessToken"]
    assert is_int(btr["accessTokenType"]) and btr["accessTokenType"] == 0  # bearer
    check_account(btr["account"])
    assert isinstance(btr["clientInfo"], str)
    assert btr["clientInfo"] == btr["account"]["clientInfo"]
    # Milliseconds since the epoch, not seconds.
    assert is_int(btr["expiresOn"]) and btr["expiresOn"] > time.time() * 1000, btr["expiresOn"]
    assert is_int(btr["extendedExpiresOn"]) and btr["extendedExpiresOn"] >= btr["expiresOn"], btr
    # A string, and every scope asked for is in it (msalruntime refuses "declined scopes").
    assert isinstance(btr["grantedScopes"], str), btr["grantedScopes"]
    granted = btr["grantedScopes"].split(" ")
    assert "" not in granted, f"grantedScopes is not space separated: {btr['grantedScopes']!r}"
    assert set(scopes) <= set(granted), (scopes, btr["grantedScopes"])
    # A real JWT (MSAL refuses placeholders), for this client and this account.
    assert isinstance(btr["idToken"], str) and btr["idToken"].count(".") == 2, btr["idToken"]
    claims = jwt_claims(btr["idToken"])
    assert claims["aud"] == client_id or client_id in claims["aud"], claims
    assert claims["preferred_username"] == btr["account"]["username"]
    return btr


def assert_fresh_expiry(btr, lifetime=LIFETIME):
    """expiresOn of a token issued just now: within a minute of now + its lifetime, in milliseconds."""
    expected = (time.time() + lifetime) * 1000
    assert abs(btr["expiresOn"] - expected) < 60_000, (
        f"expiresOn {btr['expiresOn']} is not about now + {lifetime} s in milliseconds ({expected:.0f})")


# ----------------------------------------------------------------------------------------------
# Client


class MsBroker(BusPeer):
    """com.microsoft.identity.broker1 over dbus-python. One connection per instance."""

    def raw(self, method, request="{}", protocol="0.0", correlation_id=None, timeout=SILENT_TIMEOUT,
            signature="sss", args=None):
        """One call -> the reply's only argument, a str. A D-Bus error fails the test: the front
        answers everything, errors included, with a JSON string."""
        if args is None:
            if correlation_id is None:
                correlation_id = str(uuid.uuid4())
            text = request if isinstance(request, str) else json.dumps(request)
            args = (dbus.String(protocol), dbus.String(correlation_id), dbus.String(text))
        try:
            reply = self.conn.call_blocking(MS_NAME, MS_PATH, MS_IFACE, method, signature, args, timeout=timeout)
        except dbus.exceptions.DBusException as e:
            if e.get_dbus_name() == "org.freedesktop.DBus.Error.NoReply":
                pytest.fail(f"{method}({signature}): no answer within {timeout:g} s")
            pytest.fail(f"{method}({signature}): a D-Bus error instead of a JSON answer: "
                        f"{e.get_dbus_name()}: {e.get_dbus_message()}")
        assert isinstance(reply, dbus.String), f"{method}: the reply is {reply!r}, not one string"
        return str(reply)

    def call(self, method, request="{}", **kw):
        """One call -> its answer, parsed (a JSON object)."""
        text = self.raw(method, request, **kw)
        try:
            answer = json.loads(text)
        except ValueError:
            pytest.fail(f"{method}: the answer is not JSON: {text[:300]!r}")
        assert isinstance(answer, dict), f"{method}: the answer is not a JSON object: {text[:300]!r}"
        return answer

    def accounts(self, client_id, redirect_uri=None, **kw):
        request = {"clientId": client_id}
        if redirect_uri is not None:
            request["redirectUri"] = redirect_uri
        answer = self.call("getAccounts", request, **kw)
        assert "error" not in answer, answer
        assert isinstance(answer.get("accounts"), list), answer
        for account in answer["accounts"]:
            check_account(account)
        return answer["accounts"]

    def silent(self, auth_parameters, **kw):
        return self.call("acquireTokenSilently", {"authParameters": auth_parameters}, **kw)

    def interactive(self, request, timeout=INTERACTIVE_TIMEOUT, **kw):
        return self.call("acquireTokenInteractively", request, timeout=timeout, **kw)

    def version(self):
        answer = self.call("getLinuxBrokerVersion", {"msalCppVersion": "1.28.0"})
        assert isinstance(answer.get("linuxBrokerVersion"), str), answer
        assert VERSION_RE.fullmatch(answer["linuxBrokerVersion"]), answer
        return answer["linuxBrokerVersion"]


class MsPendingCall(PendingCall):
    """A call to Microsoft's front sent now whose reply is collected later on the same connection
    (the connection can make other calls meanwhile, e.g. cancelInteractiveFlow)."""

    def __init__(self, client, method, correlation_id, request, timeout=INTERACTIVE_TIMEOUT):
        super().__init__(client, method, "sss", ("0.0", correlation_id, json.dumps(request)), timeout,
                         destination=MS_NAME, path=MS_PATH, interface=MS_IFACE)
        self.method = method

    def answer(self):
        error, value = self.reply()
        assert error is None, f"{self.method}: D-Bus error {error}: {value}"
        args = self._replies[0].get_args_list()
        assert len(args) == 1 and isinstance(value, dbus.String), args
        answer = json.loads(str(value))
        assert isinstance(answer, dict), answer
        return answer


def auth_parameters(client_id="tessera-test", scopes=SCOPES, account=None, **extra):
    """authParameters as sso-mib / linux-entra-sso / onedrive build them (the common core)."""
    params = {
        "account": account,
        "additionalQueryParametersForAuthorization": {},
        "authority": AUTHORITY,
        "authorizationType": 1,
        "clientId": client_id,
        "redirectUri": NATIVE_CLIENT,
        "requestedScopes": list(scopes),
        "uxContextHandle": -1,
    }
    if account and "username" in account:
        params["username"] = account["username"]
    params.update(extra)
    return params


def msal_auth_parameters(client_id, account, scopes=SCOPES, **extra):
    """authParameters as MSAL (msalruntime) sends them."""
    params = {
        "account": account,
        "additionalQueryParametersForAuthorization": {
            "msal_client_sku": "MSAL.Python", "msal_client_ver": "1.39.0", "validateAuthority": "false"},
        "authority": AUTHORITY,
        "authorizationType": 1,
        "clientId": client_id,
        "decodedClaims": "",
        "enrollmentId": "",
        "isTestMode": False,
        "password": "",
        "popParams": None,
        "redirectUri": f"ms-appx-web://Microsoft.AAD.BrokerPlugin/{client_id}",
        "requestedScopes": list(scopes),
        "username": account["username"] if account else "",
        "uxContextHandle": -1,
    }
    params.update(extra)
    return params


def sso_mib_account(account):
    """An account as sso-mib sends it back (mib_account_to_json): its own ten keys, realm in lower case."""
    return {
        "clientInfo": account["clientInfo"], "environment": account["environment"],
        "familyName": account["familyName"], "givenName": account["givenName"],
        "homeAccountId": account["homeAccountId"], "localAccountId": account["localAccountId"],
        "name": account["name"], "passwordExpiry": account["passwordExpiry"],
        "realm": str(uuid.UUID(account["realm"])), "username": account["username"],
    }


def native_account(broker, username):
    [account] = [a for a in broker.accounts() if a["username"] == username]
    return account


def ms_owner_pid(bus):
    return int(bus.GetConnectionUnixProcessID(MS_NAME))


def wait_for_ms_name(daemon, timeout=60.0):
    """tesserad owns the Microsoft name (it may ask for it just after its own)."""
    conn, bus = bus_daemon()
    try:
        wait_until(lambda: bool(bus.NameHasOwner(MS_NAME)), timeout=timeout,
                   what=f"tesserad owning {MS_NAME}")
        assert ms_owner_pid(bus) == daemon.proc.pid, f"{MS_NAME} is not owned by the test's tesserad"
    finally:
        conn.close()


@pytest.fixture
def ms(daemon):
    """A client of the Microsoft front of the test's tesserad."""
    wait_for_ms_name(daemon)
    client = MsBroker()
    yield client
    client.close()


def run_browser(url):
    """What the user's browser does with a sign-in URL (Tests/idp/browser.py; user from login_hint)."""
    env = dict(os.environ, TESSERA_TEST_BROWSER="allow")
    env.pop("TESSERA_TEST_BROWSER_FILE", None)
    cmd = shlex.split(os.environ["TESSERA_TEST_BROWSER_CMD"]) + [url]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# ----------------------------------------------------------------------------------------------
# The bus name and its interface


def test_the_name_is_owned_by_tesserad_and_introspectable(daemon, ms):
    conn, bus = bus_daemon()
    try:
        assert bool(bus.NameHasOwner(MS_NAME))
        assert ms_owner_pid(bus) == int(bus.GetConnectionUnixProcessID(BUS_NAME)) == daemon.proc.pid
    finally:
        conn.close()
    # pydbus (linux-entra-sso) and dbus-native (teams-for-linux) build their proxies by introspection.
    xml = str(ms.conn.call_blocking(MS_NAME, MS_PATH, "org.freedesktop.DBus.Introspectable", "Introspect", "", (),
                                    timeout=SILENT_TIMEOUT))
    root = ET.fromstring(xml)
    [iface] = [i for i in root.iter("interface") if i.get("name") == MS_IFACE]
    methods = {m.get("name"): m for m in iface.iter("method")}
    assert set(methods) == set(MS_METHODS), sorted(methods)
    for name, method in methods.items():
        args = [(a.get("direction") or "in", a.get("type")) for a in method.iter("arg")]
        assert args == [("in", "s"), ("in", "s"), ("in", "s"), ("out", "s")], (name, args)
    daemon.stop()
    conn, bus = bus_daemon()
    try:
        assert not bool(bus.NameHasOwner(MS_NAME)), "the name outlived tesserad"
    finally:
        conn.close()


def test_protocol_versions_and_correlation_ids(ms):
    for protocol in ("0.0", "1.0", "0.1", "1.5"):
        assert ms.call("getAccounts", {"clientId": "tessera-test"}, protocol=protocol) == {"accounts": []}, protocol
    for protocol in ("2.0", "", "abc", "10.0", "v1.0", "2"):
        for method in ("getAccounts", "acquireTokenSilently"):
            request = {"clientId": "tessera-test"} if method == "getAccounts" else {
                "authParameters": auth_parameters()}
            error = expect_ms_error(method, ms.call(method, request, protocol=protocol), API_CONTRACT_VIOLATION)
            assert "protocolVersion" in error["context"], error["context"]
    # Correlation ids follow the native front's rule: printable, no spaces (they go into logs and
    # the client-request-id header).
    for correlation_id in ("", str(uuid.uuid4()), str(uuid.uuid4()).upper(), "e2e-correlation-0001", "x" * 128,
                           "printable,without-spaces:~!@#$%^&*()"):
        assert ms.call("getAccounts", {"clientId": "tessera-test"}, correlation_id=correlation_id) == {
            "accounts": []}, correlation_id
    for correlation_id in ("x" * 129, "a\nb", "a\x1b[2Jb", "tab\there", "nul-less\x7f", "c1\x9bcontrol",
                           "with spaces", "bidi\u202eoverride"):
        error = expect_ms_error("getAccounts", ms.call("getAccounts", {"clientId": "tessera-test"},
                                                       correlation_id=correlation_id), API_CONTRACT_VIOLATION)
        assert "correlationId" in error["context"], error["context"]


def test_wrong_dbus_signatures_and_huge_strings_get_json_answers(daemon, ms):
    valid = json.dumps({"clientId": "tessera-test"})
    cases = [
        ("ss", ("0.0", str(uuid.uuid4()))),
        ("ssi", ("0.0", str(uuid.uuid4()), dbus.Int32(7))),
        ("", ()),
        ("s", (valid,)),
        ("ssss", ("0.0", str(uuid.uuid4()), valid, valid)),
        ("iss", (dbus.Int32(0), str(uuid.uuid4()), valid)),
        ("ssas", ("0.0", str(uuid.uuid4()), dbus.Array([valid], signature="s"))),
        ("ssv", ("0.0", str(uuid.uuid4()), dbus.String(valid, variant_level=1))),
        ("ssay", ("0.0", str(uuid.uuid4()), dbus.ByteArray(valid.encode()))),
    ]
    for method in ("getAccounts", "acquireTokenSilently", "removeAccount", "acquireTokenInteractively"):
        for signature, args in cases:
            answer = json.loads(ms.raw(method, signature=signature, args=args))
            expect_ms_error(method, answer, API_CONTRACT_VIOLATION)
    # Strings over 64 KiB, in any argument: refused by the D-Bus layer, answered in JSON all the same.
    huge = "x" * (MAX_REQUEST + 1)
    for method in ("getAccounts", "acquireTokenSilently"):
        request = {"clientId": "tessera-test"} if method == "getAccounts" else {"authParameters": auth_parameters()}
        for args in ((huge, "", json.dumps(request)), ("0.0", huge, json.dumps(request)),
                     ("0.0", "", json.dumps(dict(request, padding=huge))), ("0.0", "", "y" * 1_000_000)):
            answer = json.loads(ms.raw(method, args=args))
            expect_ms_error(method, answer, API_CONTRACT_VIOLATION)
    # The limit itself: 65,536 bytes of requestJson are read (an unknown key is ignored; with no
    # account that is status 2), one byte more is refused.
    for size, status in ((MAX_REQUEST, INTERACTION_REQUIRED), (MAX_REQUEST + 1, API_CONTRACT_VIOLATION)):
        params = auth_parameters(unknownPadding="")
        text = json.dumps({"authParameters": params})
        params["unknownPadding"] = "p" * (size - len(text.encode()))
        text = json.dumps({"authParameters": params})
        assert len(text.encode()) == size
        expect_ms_error("acquireTokenSilently", json.loads(ms.raw("acquireTokenSilently", text)), status)
    # The version is answered whatever the request.
    for request in ("{}", "not json", json.dumps({"msalCppVersion": "1.28.0"}), json.dumps({"clientId": "x"})):
        assert VERSION_RE.fullmatch(json.loads(ms.raw("getLinuxBrokerVersion", request))["linuxBrokerVersion"])
    assert daemon.running


# ----------------------------------------------------------------------------------------------
# Replays of real clients


def test_linux_entra_sso_replay(broker, ms, idp):
    # linux-entra-sso's host keeps one session id (a UUID) for its life: the correlation id of every
    # call, and the redirectUri of getAccounts.
    session = str(uuid.uuid4())
    assert ms.accounts("tessera-test", redirect_uri=session, correlation_id=session) == []

    signed_in = broker.sign_in(scopes=SCOPES)
    native = native_account(broker, "alice")
    answer = ms.call("getAccounts", {"clientId": "tessera-test", "redirectUri": session}, correlation_id=session)
    assert set(answer) == {"accounts"}, answer
    [account] = answer["accounts"]
    check_alice(account, native)
    # Listed only for client ids that can use the account silently.
    assert ms.accounts("tessera-other", redirect_uri=session, correlation_id=session) == []

    mark = idp.mark()
    request = {"authParameters": {
        "account": account,  # as getAccounts gave it
        "additionalQueryParametersForAuthorization": {},
        "authority": AUTHORITY,
        "authorizationType": 1,
        "clientId": "tessera-test",
        "redirectUri": NATIVE_CLIENT,
        "requestedScopes": SCOPES,
        "username": account["username"],
        "uxContextHandle": -1,
    }}
    btr = token_of(ms.call("acquireTokenSilently", request, correlation_id=session), "tessera-test", SCOPES)
    assert btr["accessToken"] == signed_in["access_token"]
    assert btr["account"] == account
    # linux-entra-sso treats expiresOn as milliseconds.
    assert_fresh_expiry(btr)
    assert abs(btr["expiresOn"] - signed_in["expires_on"] * 1000) < 1000, (btr["expiresOn"], signed_in["expires_on"])
    assert idp.requests(mark) == [], "a cached token must not cause a request to the IdP"

    # Its SSO cookie request: no PRT here, a clear error in the JSON.
    sso_url = "https://login.microsoftonline.com/"
    cookie_request = {
        "account": account,
        "authParameters": dict(request["authParameters"], authorizationType=8, ssoUrl=sso_url,
                               requestedScopes=SCOPES),
        "mamEnrollment": False,
        "ssoUrl": sso_url,
    }
    started = time.monotonic()
    answer = ms.call("acquirePrtSsoCookie", cookie_request, correlation_id=session)
    assert time.monotonic() - started < 5
    error = expect_ms_error("acquirePrtSsoCookie", answer, DEVICE_NOT_REGISTERED)
    assert PRT_CONTEXT.search(error["context"]), error["context"]

    version = ms.call("getLinuxBrokerVersion", {"msalCppVersion": "1.4.0"}, correlation_id=session)
    assert isinstance(version.get("linuxBrokerVersion"), str), version
    assert VERSION_RE.fullmatch(version["linuxBrokerVersion"]), version


def test_sso_mib_replay(broker, ms, idp):
    signed_in = broker.sign_in(scopes=SCOPES)
    native = native_account(broker, "alice")
    correlation = str(uuid.uuid4())  # sso-mib: one random UUID per client app
    # Older sso-mib sends the nativeclient redirect URI, newer ones the broker plugin's.
    for redirect in (NATIVE_CLIENT, "ms-appx-web://Microsoft.AAD.BrokerPlugin/tessera-test"):
        [account] = ms.accounts("tessera-test", redirect_uri=redirect, correlation_id=correlation)
        # mib_account_from_json: every required member exists, passwordExpiry is an integer, realm
        # parses as a UUID.
        assert SSO_MIB_ACCOUNT_MEMBERS <= set(account)
        assert is_int(account["passwordExpiry"])
        uuid.UUID(account["realm"])
        check_alice(account, native)

    echoed = sso_mib_account(account)
    params = {  # prepare_prt_auth_params: authorizationType 8 even for a silent call
        "account": echoed,
        "authority": AUTHORITY,
        "authorizationType": 8,
        "clientId": "tessera-test",
        "redirectUri": "ms-appx-web://Microsoft.AAD.BrokerPlugin/tessera-test",
        "requestedScopes": SCOPES,
        "username": echoed["username"],
    }
    mark = idp.mark()
    answer = ms.call("acquireTokenSilently", {"account": echoed, "authParameters": params}, correlation_id=correlation)
    btr = token_of(answer, "tessera-test", SCOPES)
    # mib_prt_from_json
    assert SSO_MIB_TOKEN_MEMBERS <= set(btr)
    assert SSO_MIB_ACCOUNT_MEMBERS <= set(btr["account"])
    assert btr["accessToken"] == signed_in["access_token"]
    assert btr["account"]["homeAccountId"] == account["homeAccountId"]
    assert abs(btr["expiresOn"] // 1000 - signed_in["expires_on"]) <= 1  # it divides by 1000
    assert set(SCOPES) <= set(btr["grantedScopes"].split(" "))
    assert idp.requests(mark) == []

    sso_url = "https://login.microsoftonline.com/"
    started = time.monotonic()
    answer = ms.call("acquirePrtSsoCookie", {"account": echoed, "authParameters": params, "ssoUrl": sso_url},
                     correlation_id=correlation)
    assert time.monotonic() - started < 5
    error = expect_ms_error("acquirePrtSsoCookie", answer, DEVICE_NOT_REGISTERED)
    assert PRT_CONTEXT.search(error["context"]), error["context"]
    assert "cookieItems" not in answer and "cookieContent" not in answer

    pop = {"authenticationScheme": "pop", "clientClaims": "", "httpMethod": "GET", "nonce": str(uuid.uuid4()),
           "uriHost": "graph.microsoft.com", "uriPath": "/v1.0/me", "homeAccountId": echoed["homeAccountId"]}
    started = time.monotonic()
    answer = ms.call("generateSignedHttpRequest", {"clientId": "tessera-test", "popParams": pop},
                     correlation_id=correlation)
    assert time.monotonic() - started < 5
    error = expect_ms_error("generateSignedHttpRequest", answer, DEVICE_NOT_REGISTERED)
    assert PRT_CONTEXT.search(error["context"]), error["context"]
    assert "signedHttpRequest" not in answer

    assert VERSION_RE.fullmatch(ms.call("getLinuxBrokerVersion", {"msalCppVersion": "0.0.0"},
                                        correlation_id=correlation)["linuxBrokerVersion"])


def test_sso_mib_interactive_with_each_prompt(broker, ms):
    """sso-mib adds "prompt"; with select_account it drops account and username (the browser then
    signs in its default user, alice)."""
    # select_account first: no account exists yet, so whether it tries a silent call first or not,
    # the browser signs in.
    for prompt, hint in (("select_account", None), ("login", "bob@example.test"),
                         ("consent", "bob@example.test")):
        params = auth_parameters("tessera-other", authorizationType=8, prompt=prompt)
        params.pop("account")
        if hint:
            params["username"] = hint
        request = {"authParameters": params}
        btr = token_of(ms.interactive(request), "tessera-other", SCOPES, "acquireTokenInteractively")
        assert btr["account"]["username"] == ("bob" if hint else "alice"), (prompt, btr["account"])
    assert {a["username"] for a in broker.accounts()} == {"alice", "bob"}


def test_onedrive_replay(broker, ms, idp, browser):
    signed_in = broker.sign_in(scopes=SCOPES)
    # onedrive checks NameHasOwner (activation alone is not enough).
    conn, bus = bus_daemon()
    try:
        assert bool(bus.NameHasOwner(MS_NAME))
    finally:
        conn.close()
    browser.set("ignore")  # a browser would do nothing: every answer below comes from the cache
    mark = idp.mark()
    version = ms.call("getLinuxBrokerVersion", {"clientId": "tessera-test"}, timeout=10)
    assert isinstance(version.get("linuxBrokerVersion"), str), version
    answer = ms.call("getAccounts", {"clientId": "tessera-test"}, timeout=10)
    assert "error" not in answer and isinstance(answer["accounts"], list) and answer["accounts"]
    account = answer["accounts"][0]  # it sends the first account back as it came
    check_account(account)

    silent = {"authParameters": {
        "clientId": "tessera-test", "redirectUri": NATIVE_CLIENT, "authority": AUTHORITY, "authorizationType": 1,
        "requestedScopes": SCOPES, "additionalQueryParametersForAuthorization": {}, "uxContextHandle": -1,
        "account": account, "username": account["username"]}}
    btr = ms.call("acquireTokenSilently", silent, timeout=10)["brokerTokenResponse"]
    # broker_token_response_has_error / has_required_auth_elements
    assert "error" not in btr
    assert isinstance(btr["accessToken"], str) and btr["accessToken"] == signed_in["access_token"]
    assert "expiresOn" in btr and isinstance(btr["account"], dict)

    minimal = {"clientId": "tessera-test", "redirectUri": NATIVE_CLIENT, "authority": AUTHORITY,
               "requestedScopes": SCOPES}
    # Older onedrive: the minimal form at the top level; newer: the same inside authParameters.
    for request in (minimal, {"authParameters": minimal}):
        started = time.monotonic()
        answer = ms.interactive(request, timeout=10)  # (no answer in 10 s: it went for the browser)
        assert time.monotonic() - started < 10
        btr = token_of(answer, "tessera-test", SCOPES, "acquireTokenInteractively")
        assert btr["accessToken"] == signed_in["access_token"], "interactive tries silent first"
        assert btr["account"]["username"] == "alice"
    assert idp.requests(mark) == []


def test_teams_for_linux_replay(broker, ms):
    broker.sign_in(scopes=SCOPES)
    answer = ms.call("getAccounts", {"clientId": "tessera-test", "redirectUri": "urn:ietf:oob"}, correlation_id="")
    assert "error" not in answer
    account = answer["accounts"][0]
    assert account["username"] == "alice"
    # addSsoCookie: no PRT here; it reads response.error.context.
    request = {"ssoUrl": "https://login.microsoftonline.com/common/oauth2/authorize?client_id=x", "account": account,
               "authParameters": {"authority": "https://login.microsoftonline.com/common/"}}
    answer = ms.call("acquirePrtSsoCookie", request, correlation_id="")
    assert "error" in answer and "cookieContent" not in answer
    assert isinstance(answer["error"]["context"], str) and answer["error"]["context"]
    error_of("acquirePrtSsoCookie", answer)
    # Any other error reaches it the same way.
    answer = ms.call("getAccounts", {"redirectUri": "urn:ietf:oob"}, correlation_id="")
    error = expect_ms_error("getAccounts", answer, API_CONTRACT_VIOLATION)
    assert "clientId" in error["context"], error["context"]


def test_msal_flow_silent_without_an_account_needs_interaction(broker, ms, idp):
    """MSAL: getAccounts, then acquireTokenSilently with "account": null when it found none (status 2
    sends it on to the interactive call), then acquireTokenInteractively."""
    broker.sign_in(scopes=SCOPES)  # alice exists, but not for tessera-other
    assert ms.accounts("tessera-other", redirect_uri="tessera-other") == []
    answer = ms.silent(msal_auth_parameters("tessera-other", None))
    error = expect_ms_error("acquireTokenSilently", answer, INTERACTION_REQUIRED)
    assert isinstance(answer["brokerTokenResponse"]["subError"], str)
    assert error["context"]
    # An account the client cannot use silently is no different: 2, not 6 nor AccountNotFound.
    alice = ms.accounts("tessera-test")[0]
    expect_ms_error("acquireTokenSilently", ms.silent(msal_auth_parameters("tessera-other", alice)),
                    INTERACTION_REQUIRED)
    # An account nobody knows: 2 as well.
    stranger = dict(alice, homeAccountId="nobody.000000000000", localAccountId=str(uuid.uuid4()), username="nobody")
    expect_ms_error("acquireTokenSilently", ms.silent(msal_auth_parameters("tessera-test", stranger)),
                    INTERACTION_REQUIRED)

    params = msal_auth_parameters("tessera-other", None, authorizationType=6, isSignIn=True,
                                  onboardingBlob=json.dumps({"tessera": "e2e"}), parentWindow={"handle": 1},
                                  username="bob@example.test")
    answer = ms.interactive({"authParameters": params, "parentWindowHandle": 1})
    btr = token_of(answer, "tessera-other", SCOPES, "acquireTokenInteractively")
    assert btr["account"]["username"] == "bob"
    assert_fresh_expiry(btr)

    [bob] = ms.accounts("tessera-other", redirect_uri="tessera-other")
    assert bob == btr["account"]
    mark = idp.mark()
    again = token_of(ms.silent(msal_auth_parameters("tessera-other", bob)), "tessera-other", SCOPES)
    assert again["accessToken"] == btr["accessToken"]
    assert idp.requests(mark) == []


def test_the_account_is_matched_by_home_then_local_id_then_username(broker, ms, idp):
    signed_in = broker.sign_in(scopes=SCOPES)
    account = ms.accounts("tessera-test")[0]
    empty = {key: "" for key in ACCOUNT_FIELDS - {"passwordExpiry"}}
    mark = idp.mark()
    for given in (
        account,
        {"homeAccountId": account["homeAccountId"]},
        dict(empty, homeAccountId=account["homeAccountId"], passwordExpiry=0, somethingNew=""),
        dict(empty, localAccountId=account["localAccountId"]),
        {"username": account["username"]},
        dict(empty, username=account["username"]),
        # homeAccountId wins over a username that names nobody
        {"homeAccountId": account["homeAccountId"], "username": "nobody"},
    ):
        btr = token_of(ms.silent(auth_parameters(account=given)), "tessera-test", SCOPES)
        assert btr["accessToken"] == signed_in["access_token"], given
        assert btr["account"] == account
    assert idp.requests(mark) == []
    for given in ({"homeAccountId": "nobody.000000000000"}, {"username": "nobody"}, dict(empty), {}):
        expect_ms_error("acquireTokenSilently", ms.silent(auth_parameters(account=given)), INTERACTION_REQUIRED)


# ----------------------------------------------------------------------------------------------
# One cache, two fronts


def test_single_sign_on_across_the_two_fronts(broker, ms, idp):
    # Native first: AcquireToken for (tessera-test, read); the Microsoft front serves that token.
    native = broker.sign_in("alice", client_id="tessera-test", scopes=SCOPES)
    mark = idp.mark()
    [alice] = ms.accounts("tessera-test")
    btr = token_of(ms.silent(auth_parameters("tessera-test", account=alice)), "tessera-test", SCOPES)
    assert btr["accessToken"] == native["access_token"]
    assert btr["account"]["homeAccountId"] == native["account"]["id"]
    assert idp.requests(mark) == [], "the Microsoft front must serve the native front's token from the cache"

    # Microsoft first: an interactive sign-in for (tessera-other, read); the native front serves it.
    answer = ms.interactive({"authParameters": auth_parameters("tessera-other", authorizationType=6,
                                                               username="bob@example.test")})
    ms_token = token_of(answer, "tessera-other", SCOPES, "acquireTokenInteractively")
    assert ms_token["account"]["username"] == "bob"
    bob = native_account(broker, "bob")
    assert ms_token["account"]["homeAccountId"] == bob["id"]
    mark = idp.mark()
    silent = broker.silent("tessera-other", SCOPES, account_id=bob["id"])
    assert silent["access_token"] == ms_token["accessToken"]
    assert silent["account"]["username"] == "bob"
    assert abs(silent["expires_on"] * 1000 - ms_token["expiresOn"]) < 1000
    # ... and the Microsoft front's silent call too.
    again = token_of(ms.silent(auth_parameters("tessera-other", account=ms_token["account"])), "tessera-other",
                     SCOPES)
    assert again["accessToken"] == ms_token["accessToken"]
    assert idp.requests(mark) == []
    # Each account is listed for the client ids that hold its tokens.
    assert [a["username"] for a in ms.accounts("tessera-other")] == ["bob"]
    assert [a["username"] for a in ms.accounts("tessera-test")] == ["alice"]


def test_access_token_to_renew_forces_a_refresh(broker, ms, idp):
    signed_in = broker.sign_in(scopes=SCOPES)
    account = ms.accounts("tessera-test")[0]
    mark = idp.mark()
    # MSAL sends accessTokenToRenew (sso-mib too); a different value is no reason to refresh.
    btr = token_of(ms.silent(auth_parameters(account=account, accessTokenToRenew="not-the-cached-token")),
                   "tessera-test", SCOPES)
    assert btr["accessToken"] == signed_in["access_token"]
    assert idp.requests(mark) == []
    renewed = token_of(ms.silent(auth_parameters(account=account, accessTokenToRenew=signed_in["access_token"])),
                       "tessera-test", SCOPES)
    assert renewed["accessToken"] != signed_in["access_token"]
    assert_fresh_expiry(renewed)
    posts = idp.token_posts(mark)
    assert [p["grant_type"] for p in posts] == ["refresh_token"] and posts[0]["status"] == 200, posts
    # The renewed token is in the one cache: both fronts serve it now.
    mark = idp.mark()
    assert token_of(ms.silent(auth_parameters(account=account)), "tessera-test", SCOPES)["accessToken"] == \
        renewed["accessToken"]
    assert broker.silent("tessera-test", SCOPES)["access_token"] == renewed["accessToken"]
    assert idp.requests(mark) == []


def test_remove_account(broker, ms, idp):
    broker.sign_in(client_id="tessera-test", scopes=SCOPES)
    broker.sign_in(client_id="tessera-other", scopes=SCOPES)
    [account] = ms.accounts("tessera-test")
    account_id = native_account(broker, "alice")["id"]
    # sso-mib's request: {"clientId", "account"} with the account as it echoes it.
    answer = ms.call("removeAccount", {"clientId": "tessera-test", "account": sso_mib_account(account)})
    assert answer == {}, answer
    assert ms.accounts("tessera-test") == []
    expect_ms_error("acquireTokenSilently", ms.silent(auth_parameters("tessera-test", account=account)),
                    INTERACTION_REQUIRED)
    # The account's tokens for tessera-test are gone; tessera-other keeps its own.
    expect_error("InteractionRequired", broker.silent, "tessera-test", SCOPES, account_id=account_id)
    assert [a["username"] for a in ms.accounts("tessera-other")] == ["alice"]
    assert [a["id"] for a in broker.accounts()] == [account_id]
    mark = idp.mark()
    token_of(ms.silent(auth_parameters("tessera-other", account=account)), "tessera-other", SCOPES)
    assert broker.silent("tessera-other", SCOPES, account_id=account_id)["account"]["username"] == "alice"
    assert idp.requests(mark) == []
    # Unknown accounts, and an account removed already: {} too.
    stranger = dict(account, homeAccountId="nobody.000000000000", localAccountId=str(uuid.uuid4()), username="nobody")
    assert ms.call("removeAccount", {"clientId": "tessera-test", "account": stranger}) == {}
    assert ms.call("removeAccount", {"clientId": "tessera-test", "account": account}) == {}
    assert [a["username"] for a in ms.accounts("tessera-other")] == ["alice"]


# ----------------------------------------------------------------------------------------------
# Errors


def test_untrusted_authority(broker, ms, idp):
    broker.sign_in(scopes=SCOPES)
    account = ms.accounts("tessera-test")[0]
    mark = idp.mark()
    for authority in ("https://evil.example/tenant", "https://127.0.0.1:1/tenant"):
        answer = ms.silent(auth_parameters(account=account, authority=authority))
        error = expect_ms_error("acquireTokenSilently", answer, AUTHORITY_UNTRUSTED)
        assert urlsplit_host(authority) in error["context"], error["context"]
        started = time.monotonic()
        answer = ms.interactive({"authParameters": auth_parameters(authority=authority, authorizationType=6)})
        expect_ms_error("acquireTokenInteractively", answer, AUTHORITY_UNTRUSTED)
        assert time.monotonic() - started < 10, "refused before any browser"
    assert idp.requests(mark) == []


def urlsplit_host(url):
    return url.split("://", 1)[1].split("/", 1)[0].split(":", 1)[0]


def test_revoked_refresh_token_needs_interaction(broker, ms, idp):
    signed_in = broker.sign_in(scopes=SCOPES)
    account = ms.accounts("tessera-test")[0]
    idp.revoke_user("alice")
    answer = ms.silent(auth_parameters(account=account, accessTokenToRenew=signed_in["access_token"]))
    error = expect_ms_error("acquireTokenSilently", answer, INTERACTION_REQUIRED)
    assert isinstance(answer["brokerTokenResponse"]["subError"], str)
    assert error["context"]
    # MSAL goes on with the interactive call, which signs in again (or serves the cached token,
    # which the IdP no longer honours, but the broker cannot know that).
    answer = ms.interactive({"authParameters": auth_parameters(account=account, authorizationType=6,
                                                               accessTokenToRenew=signed_in["access_token"])})
    btr = token_of(answer, "tessera-test", SCOPES, "acquireTokenInteractively")
    assert btr["account"]["homeAccountId"] == account["homeAccountId"]


def test_unreachable_authority_is_a_network_status(start_daemon, write_config):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    unreachable = f"https://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    daemon = start_daemon(write_config(trusted_authorities=[IDP_URL, unreachable]))
    wait_for_ms_name(daemon)
    client = MsBroker()
    try:
        answer = client.interactive({"authParameters": auth_parameters(authority=unreachable + "/t",
                                                                       authorizationType=6)}, timeout=60)
        error = error_of("acquireTokenInteractively", answer)
        assert error["status"] in NETWORK_STATUSES, error
        assert "127.0.0.1" in error["context"], error["context"]
    finally:
        client.close()


def test_cancel_interactive_flow_ends_only_the_callers_own_sign_in(start_daemon, write_config, tmp_path):
    # A browser that only writes down the URL it was given: the test plays the user.
    urls = tmp_path / "browser-urls"
    script = tmp_path / "record-url.sh"
    script.write_text(f'#!/bin/sh\nfor last; do :; done\nprintf "%s\\n" "$last" >> {shlex.quote(str(urls))}\n')
    script.chmod(0o700)
    daemon = start_daemon(write_config(browser=str(script)))
    wait_for_ms_name(daemon)

    def browser_urls():
        return urls.read_text().split() if urls.exists() else []

    a, b = MsBroker(), MsBroker()
    try:
        first = str(uuid.uuid4())
        call = MsPendingCall(a, "acquireTokenInteractively", first, {"authParameters": auth_parameters(
            authorizationType=6, username="alice@example.test")})
        [url] = wait_until(browser_urls, timeout=30, what="the sign-in's browser")
        # Another caller's cancel answers {} and leaves the sign-in alone: the user finishes it.
        assert b.call("cancelInteractiveFlow", {}, correlation_id=first) == {}
        run_browser(url)
        btr = token_of(call.answer(), "tessera-test", SCOPES, "acquireTokenInteractively")
        assert btr["account"]["username"] == "alice"

        # The caller's own cancel ends its pending sign-in at once.
        second = str(uuid.uuid4())
        call = MsPendingCall(a, "acquireTokenInteractively", second, {"authParameters": auth_parameters(
            "tessera-other", authorizationType=6, username="alice@example.test")})
        wait_until(lambda: len(browser_urls()) == 2, timeout=30, what="the second sign-in's browser")
        started = time.monotonic()
        assert a.call("cancelInteractiveFlow", {}, correlation_id=second) == {}
        answer = call.answer()
        assert time.monotonic() - started < 5
        error = error_of("acquireTokenInteractively", answer)
        assert error["status"] in CANCELED_STATUSES, error
        # Nothing pending: cancelling again is still {}.
        assert a.call("cancelInteractiveFlow", {}, correlation_id=second) == {}
        assert a.accounts("tessera-other") == []
        assert [x["username"] for x in a.accounts("tessera-test")] == ["alice"]
    finally:
        a.close()
        b.close()


# ----------------------------------------------------------------------------------------------
# Fuzz

FUZZ_CALLS = int(os.environ.get("TESSERA_MS_FUZZ_CALLS", "4000"))
BAD_PROTOCOLS = ["2.0", "", "abc", "10.0", "3.5", "v1.0", "2", "0x1", "-1.0", "2.0.0"]
BAD_CORRELATIONS = ["x" * 129, "y" * 1000, "a\nb", "\x1b[2J", "tab\there", "del\x7f", "c1\x9b31m", "\r",
                    "z" * (MAX_REQUEST + 10)]
WRONG_STRING = [42, -1, 3.5, True, False, None, [], ["tessera-test"], {}, {"clientId": "tessera-test"}]
WRONG_SCOPES = ["read", "", 42, None, True, {}, {"read": True}, [42], ["read", None], [["read"]], [{}], [True],
                [1.5]]
WRONG_ACCOUNT = ["alice", "", 42, True, False, [], ["alice"], 1.5]
WRONG_OBJECT = ["x", "", 42, True, [], [{}], None]
NOT_OBJECT = ["[]", "[{}]", "42", "-1", "3.5", '"text"', "null", "true", "false", '""',
              '[{"clientId":"tessera-test"}]']
# (No trailing commas: Foundation's parser accepts them, a harmless leniency.)
NOT_JSON = ["", " ", "{", "}", "{{}}", "{'clientId': 'tessera-test'}",
            '{"clientId": "tessera-test"} trailing', '{"clientId": "tessera-test"/* c */}', '{"clientId": tessera}',
            '{"clientId": "a\x01b"}', '{"clientId": "\\x41"}', '{clientId: "x"}', "<xml/>", "\u00a0{}"]
SIGNATURES = ["ss", "ssi", "", "s", "ssss", "iss", "ssas", "ssv", "ssay", "sis"]


def strict_json(text):
    """The parsed value, or None when the text is not JSON (NaN and Infinity are not JSON)."""
    def refuse(name):
        raise ValueError(name)
    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError:
        return None


def get_path(obj, path):
    for key in path.split(".")[:-1]:
        obj = obj[key]
    return obj, path.split(".")[-1]


class MsFuzzer:
    """Seeded malformed calls: (method, signature, args, field the context must name or None, kind)."""

    def __init__(self, rng, account):
        self.rng = rng
        self.account = account

    def base(self, method):
        a = self.account
        if method == "getAccounts":
            return {"clientId": "tessera-test",
                    "redirectUri": self.rng.choice([str(uuid.uuid4()), NATIVE_CLIENT, "urn:ietf:oob", "tessera-test"])}
        if method == "removeAccount":
            return {"clientId": "tessera-test", "account": dict(a)}
        if method == "acquireTokenSilently":
            return {"authParameters": auth_parameters(account=dict(a))}
        if method == "acquireTokenInteractively":
            return {"authParameters": auth_parameters(account=dict(a), authorizationType=6)}
        if method == "acquirePrtSsoCookie":
            url = "https://login.microsoftonline.com/"
            return {"account": dict(a), "authParameters": auth_parameters(account=dict(a), authorizationType=8,
                                                                          ssoUrl=url),
                    "mamEnrollment": False, "ssoUrl": url}
        if method == "generateSignedHttpRequest":
            return {"clientId": "tessera-test", "popParams": {"authenticationScheme": "pop", "httpMethod": "GET",
                                                              "uriHost": "graph.microsoft.com",
                                                              "homeAccountId": a["homeAccountId"]}}
        if method == "cancelInteractiveFlow":
            return {}
        return {"msalCppVersion": "1.28.0"}

    # Field paths a wrong type or a missing value makes invalid, per method.
    TYPED = {
        "getAccounts": [("clientId", WRONG_STRING)],
        "removeAccount": [("clientId", WRONG_STRING), ("account", WRONG_ACCOUNT)],
        "acquireTokenSilently": [("authParameters", WRONG_OBJECT), ("authParameters.clientId", WRONG_STRING),
                                 ("authParameters.requestedScopes", WRONG_SCOPES),
                                 ("authParameters.account", WRONG_ACCOUNT)],
        "acquirePrtSsoCookie": [("account", WRONG_ACCOUNT), ("authParameters", WRONG_OBJECT),
                                ("authParameters.clientId", WRONG_STRING)],
        "generateSignedHttpRequest": [("clientId", WRONG_STRING), ("popParams", WRONG_OBJECT)],
    }
    TYPED["acquireTokenInteractively"] = TYPED["acquireTokenSilently"]
    REQUIRED = {
        "getAccounts": ["clientId"],
        "removeAccount": ["clientId"],
        "acquireTokenSilently": ["authParameters", "authParameters.clientId", "authParameters.requestedScopes"],
        "acquireTokenInteractively": ["authParameters", "authParameters.clientId", "authParameters.requestedScopes"],
        "acquirePrtSsoCookie": ["authParameters"],
        "generateSignedHttpRequest": ["clientId"],
    }

    @staticmethod
    def field_for(method, path):
        """What the context must name for a bad value at `path` (None: not checked). The
        interactive call also takes onedrive's top-level form, so without a usable authParameters
        object its complaint may be about the top level."""
        if method in ("acquirePrtSsoCookie", "generateSignedHttpRequest"):
            return None
        if method == "acquireTokenInteractively" and "." not in path:
            return None
        return path.split(".")[-1]

    def text(self):
        r = self.rng.random()
        n = self.rng.randrange(1, 200)
        if r < 0.4:  # random bytes (no NUL: a D-Bus string cannot hold one)
            return bytes(self.rng.randrange(1, 256) for _ in range(n)).decode("latin-1")
        if r < 0.7:
            return "".join(self.rng.choice('{}[]":,0123456789.-+eE truefalsn\\') for _ in range(n))
        return "".join(chr(self.rng.choice([self.rng.randrange(1, 0xD800), self.rng.randrange(0xE000, 0x110000)]))
                       for _ in range(n))

    def case(self):
        method = self.rng.choice(MS_METHODS)
        base = self.base(method)
        correlation = str(uuid.uuid4())
        kinds = ["not_json", "truncated", "not_object", "deep", "long", "protocol", "correlation", "signature"]
        if method in self.TYPED:
            kinds += ["wrong_type"] * 4 + ["missing"] * 2
        kind = self.rng.choice(kinds)
        protocol, field, request = self.rng.choice(["0.0", "1.0"]), None, json.dumps(base)
        if kind == "not_json":
            if self.rng.random() < 0.5:
                request = self.rng.choice(NOT_JSON)
            else:
                while True:
                    request = self.text()
                    parsed = strict_json(request)
                    if parsed is None or not isinstance(parsed, dict) or parsed == {}:
                        break
        elif kind == "truncated":
            full = json.dumps(base)
            request = full[:self.rng.randrange(0, len(full))]
            assert strict_json(request) is None, request
        elif kind == "not_object":
            request = self.rng.choice(NOT_OBJECT)
        elif kind == "deep":
            opener, closer = self.rng.choice([("[", "]"), ('{"a":', "}")])
            # Deeper than 32 levels; 30,000 brackets stay under the size limit (a recursive parser's
            # stack is what they test).
            depth = self.rng.choice([33, 34, 40, 64, 100, 1000] + ([30000] if opener == "[" else []))
            inner = opener * depth + ("1" if opener != "[" else "") + closer * depth
            body = json.dumps(base)
            request = body[:-1] + (", " if base else "") + f'"x": {inner}' + "}"
        elif kind == "long":
            r = self.rng.random()
            body = json.dumps(base)
            prefix, suffix = body[:-1] + (", " if base else "") + '"x": "', '"}'
            if r < 0.3:  # one byte over the limit
                request = prefix + "a" * (MAX_REQUEST + 1 - len(prefix) - len(suffix)) + suffix
                assert len(request.encode()) == MAX_REQUEST + 1
            elif r < 0.5:  # under the limit in characters, over it in bytes
                request = prefix + "é" * 33000 + suffix
                assert len(request) < MAX_REQUEST < len(request.encode())
            elif r < 0.8:
                request = prefix + "b" * self.rng.choice([70000, 200000, 1_000_000]) + suffix
            else:  # the string argument itself over the limit, at the D-Bus level
                if self.rng.random() < 0.5:
                    protocol = "0." + "0" * (MAX_REQUEST + self.rng.randrange(1, 5000))
                else:
                    correlation = "c" * (MAX_REQUEST + self.rng.randrange(1, 5000))
            assert len(request.encode()) > MAX_REQUEST or len(protocol) > MAX_REQUEST or len(correlation) > MAX_REQUEST
        elif kind == "protocol":
            protocol = self.rng.choice(BAD_PROTOCOLS)
            field = "protocolVersion"
        elif kind == "correlation":
            correlation = self.rng.choice(BAD_CORRELATIONS)
            field = "correlationId" if len(correlation) <= MAX_REQUEST else None
        elif kind == "signature":
            signature = self.rng.choice(SIGNATURES)
            args = {
                "ss": (protocol, correlation), "ssi": (protocol, correlation, dbus.Int32(self.rng.randrange(-9, 9))),
                "": (), "s": (request,), "ssss": (protocol, correlation, request, request),
                "iss": (dbus.Int32(0), correlation, request),
                "ssas": (protocol, correlation, dbus.Array([request], signature="s")),
                "ssv": (protocol, correlation, dbus.String(request, variant_level=1)),
                "ssay": (protocol, correlation, dbus.ByteArray(request.encode())),
                "sis": (protocol, dbus.Int32(1), request),
            }[signature]
            return method, signature, args, None, kind
        elif kind == "wrong_type":
            path, values = self.rng.choice(self.TYPED[method])
            obj, key = get_path(base, path)
            obj[key] = self.rng.choice(values)
            request = json.dumps(base)
            field = self.field_for(method, path)
        elif kind == "missing":
            path = self.rng.choice(self.REQUIRED[method])
            obj, key = get_path(base, path)
            del obj[key]
            request = json.dumps(base)
            field = self.field_for(method, path)
        return method, "sss", (dbus.String(protocol), dbus.String(correlation), dbus.String(request)), field, kind


def judge(method, message, field):
    """-> None when the reply is what the front must answer, else what is wrong with it."""
    if isinstance(message, dbus.lowlevel.ErrorMessage):
        return f"D-Bus error {message.get_error_name()}: {message.get_args_list()[:1]}"
    args = message.get_args_list()
    if len(args) != 1 or not isinstance(args[0], dbus.String):
        return f"reply {message.get_signature()!r}, not one string"
    try:
        answer = json.loads(str(args[0]))
    except ValueError:
        return f"not JSON: {str(args[0])[:200]!r}"
    if method == "getLinuxBrokerVersion" and isinstance(answer, dict) and "linuxBrokerVersion" in answer:
        ok = isinstance(answer["linuxBrokerVersion"], str) and VERSION_RE.fullmatch(answer["linuxBrokerVersion"])
        return None if ok else f"bad version answer {answer}"
    if method == "cancelInteractiveFlow" and answer == {}:
        return None
    try:
        error = error_of(method, answer)
    except AssertionError as e:
        return f"not an error answer: {e}"
    allowed = {API_CONTRACT_VIOLATION}
    if method in ("acquirePrtSsoCookie", "generateSignedHttpRequest"):
        allowed.add(DEVICE_NOT_REGISTERED)
    if error["status"] not in allowed:
        return f"status {error['status']}: {error['context']}"
    if field and error["status"] == API_CONTRACT_VIOLATION and field not in error["context"]:
        return f"the context does not name {field}: {error['context']!r}"
    return None


def status_of(method, reply):
    """The error status of a judged reply, or "answer" for a version or {}."""
    answer = json.loads(str(reply.get_args_list()[0]))
    if method in TOKEN_METHODS:
        return answer["brokerTokenResponse"]["error"]["status"]
    return answer["error"]["status"] if "error" in answer else "answer"


def fuzz(cases, timeout=15.0, window=200):
    """Sends the cases, `window` outstanding at a time -> [(case, problem or None, status)]."""
    def calls():
        for index, (method, signature, args, _, _) in enumerate(cases):
            message = dbus.lowlevel.MethodCallMessage(MS_NAME, MS_PATH, MS_IFACE, method)
            if args:
                message.append(*args, signature=signature)
            yield index, message

    outcomes = []
    conn = new_connection()
    try:
        for index, reply in send_all(conn, calls(), window, timeout):
            method, _, _, field, kind = cases[index]
            problem = "no reply" if reply is None else judge(method, reply, field)
            outcomes.append((cases[index], problem, None if problem else status_of(method, reply)))
    finally:
        conn.close()
    return outcomes


def test_fuzzing_the_microsoft_front(daemon, broker, ms, idp):
    signed_in = broker.sign_in(scopes=SCOPES)
    [account] = ms.accounts("tessera-test")
    fuzzer = MsFuzzer(random.Random(SEED), account)
    cases = [fuzzer.case() for _ in range(FUZZ_CALLS)]
    kinds = {}
    for case in cases:
        kinds[case[4]] = kinds.get(case[4], 0) + 1
    assert len(kinds) >= 10 and min(kinds.values()) >= 50, kinds

    started = time.monotonic()
    outcomes = fuzz(cases)
    elapsed = time.monotonic() - started

    assert daemon.running, f"tesserad died:\n{daemon.log()[-3000:]}"
    problems = [(method, kind, signature, [repr(str(a))[:80] for a in args], problem)
                for (method, signature, args, _, kind), problem, _ in outcomes if problem]
    assert problems == [], f"{len(problems)} wrong answers, e.g.:\n" + "\n".join(map(str, problems[:10]))
    statuses = {}
    for _, _, status in outcomes:
        statuses[status] = statuses.get(status, 0) + 1
    assert statuses.get(API_CONTRACT_VIOLATION, 0) >= FUZZ_CALLS * 0.6, statuses
    assert elapsed < 90, f"{FUZZ_CALLS} calls took {elapsed:.0f} s"

    # The daemon still serves, and the account and its token are intact.
    mark = idp.mark()
    btr = token_of(ms.silent(auth_parameters(account=account)), "tessera-test", SCOPES)
    assert btr["accessToken"] == signed_in["access_token"]
    assert ms.accounts("tessera-test") == [account]
    assert [a["username"] for a in broker.accounts()] == ["alice"]
    assert broker.silent("tessera-test", SCOPES)["access_token"] == signed_in["access_token"]
    assert idp.requests(mark) == []
    print(f"ms fuzz: {len(outcomes)} calls in {elapsed:.1f} s; kinds {sorted(kinds.items())}; "
          f"statuses {sorted(statuses.items(), key=str)}")


# ----------------------------------------------------------------------------------------------
# Configuration and a taken name


def test_microsoft_broker_false_leaves_the_name_alone(start_daemon, write_config):
    daemon = start_daemon(write_config(microsoft_broker=False))
    b = Broker()
    conn, bus = bus_daemon()
    try:
        assert b.accounts() == []
        time.sleep(1.0)  # time to have asked for it, were it going to
        assert not bool(bus.NameHasOwner(MS_NAME)), f"{MS_NAME} is owned although microsoft_broker = false"
        assert daemon.running
    finally:
        conn.close()
        b.close()


def test_a_name_owned_by_another_program_is_left_to_it(start_daemon):
    holder = new_connection()
    conn, bus = bus_daemon()
    try:
        owned = holder.request_name(MS_NAME, dbus.bus.NAME_FLAG_DO_NOT_QUEUE)
        assert owned == dbus.bus.REQUEST_NAME_REPLY_PRIMARY_OWNER
        holder_name = str(holder.get_unique_name())
        daemon = start_daemon()
        b = Broker()
        try:
            # tesserad serves its own front ...
            assert b.accounts() == []
            assert b.version()
            # ... says why the Microsoft front is missing ...
            wait_until(lambda: "com.microsoft.identity.broker1" in daemon.log() and "already owned" in daemon.log(),
                       timeout=10, what="the log saying the Microsoft name is taken")
            line = next(line for line in daemon.log().splitlines()
                        if "com.microsoft.identity.broker1" in line and "already owned" in line)
            assert line
            # ... and leaves the name to its owner.
            assert str(bus.GetNameOwner(MS_NAME)) == holder_name
            status = run_cli("status", check_rc=0)
            assert "com.microsoft.identity.broker1" in status.stdout + status.stderr, status.stdout
            assert "not served" in status.stdout, status.stdout
            assert daemon.running
            # When the other broker lets go, tesserad takes the name and serves MSAL apps.
            holder.release_name(MS_NAME)
            wait_until(lambda: bool(bus.NameHasOwner(MS_NAME)) and
                       int(bus.GetConnectionUnixProcessID(MS_NAME)) == daemon.proc.pid,
                       timeout=10, what="tesserad to take the released name")
            assert MsBroker().call("getLinuxBrokerVersion", {}).get("linuxBrokerVersion")
            status = json.loads(run_cli("status", "--json", check_rc=0).stdout)
            assert status["microsoft_broker"] == "served" and MS_NAME in status["fronts"], status
        finally:
            b.close()
    finally:
        conn.close()
        holder.close()
