"""A private glewlwyd (Debian's `glewlwyd` 2.7, a C authorization server written by others) for
Tessera's end-to-end tests against a real plain OAuth 2.0 server (Tests/e2e/test_glewlwyd.py) and
a real OpenID provider that binds tokens with DPoP (RFC 9449) and requires server nonces.

The `glewlwyd` fixture starts one for the test module: its own directory, an SQLite database
made from the package's own schema (/usr/share/dbconfig-common/data/glewlwyd/install/sqlite3,
which makes the administrator admin/password and the scope `openid`), a config file (`glewlwyd -c
FILE`) serving HTTPS on 127.0.0.1 with a certificate from the session's test CA
($TESSERA_IDP_CA, which config.toml's `ca_file` trusts: Tessera takes only https endpoints for a
[[provider]]), and a Prometheus metrics port. The rest is set up as an administrator would,
through the admin REST API: a scope, the users, two plugin instances and their clients:

- `glwd`, the OAuth 2.0 plugin (`libprotocol_oauth2.so`, module `oauth2-glewlwyd`), with a public
  client and a confidential one (client_secret_basic; glewlwyd refuses client_secret_post);
- `oidc`, the OpenID Connect plugin (`libprotocol_oidc.so`, module `oidc`): issuer
  https://127.0.0.1:PORT/api/oidc (its `iss` parameter; the discovery document is at
  {issuer}/.well-known/openid-configuration and names every endpoint as {issuer}/NAME, no
  trailing slash), ES256 tokens signed with a key made for the run (kid OIDC_KID, served at
  {issuer}/jwks), DPoP with nonces mandatory, the code flow with PKCE (S256), the device grant,
  and one-use rolling refresh tokens; its public client OIDC_CLIENT asks for "openid read". Its
  id_token and userinfo carry sub (an opaque per-user id), preferred_username (the glewlwyd
  username), name and email.

glewlwyd is then restarted, to serve the plugin instances as a glewlwyd started with them in its
database does (a plugin added through the API has been seen to serve only after a restart; these
routes answer at once, and the restart costs a tenth of a second).

glewlwyd matches redirect URIs exactly (port included), so the clients register
http://127.0.0.1:REDIRECT_PORT/ and the tests set config.toml's `redirect_port` to it.

The plain OAuth 2.0 plugin publishes no metadata document, issues no id_token, and its profile
endpoint (GET /api/<instance>/profile/) answers {"username", "name", "email"}: no `sub`.

DPoP at the `oidc` instance, as measured: a proof's htu must be the endpoint exactly as discovery
names it (https://127.0.0.1:PORT/api/oidc/token; a trailing slash is 403 invalid_dpop_proof). The
nonce is one per client (all its users and keys); a proof without it, or with an old one, gets
400 {"error": "use_dpop_nonce"} with the nonce in a DPoP-Nonce header (at userinfo a 401 with
WWW-Authenticate: DPoP error="use_dpop_nonce"). Each nonce serves DPOP_NONCE_COUNTER + 1
successful token requests; the answer to the last carries the next one in DPoP-Nonce (other
successful answers carry none). The device grant checks proofs only once the code is approved
(before: 400 authorization_pending, or slow_down when polled faster than every second), and the
first proof at the token endpoint binds the grant. Tokens bound: token_type "DPoP", the access
token's cnf.jkt; the refresh token is bound too: another key's proof or none is 403
invalid_dpop_proof and leaves it usable. A refresh answers a new refresh token (no id_token) and
disables the one redeemed; redeeming a disabled one is 400 with an empty body and disables the
newest of its chain too. glewlwyd's /auth wants a `nonce` when openid is asked for (else it
redirects with error=invalid_request, "nonce required"). Its userinfo takes a valid proof from
any key for a bound access token (it never compares the proof's key with cnf.jkt).
"""
import base64
import hashlib
import hmac
import json
import os
import queue
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid

import pytest
import requests
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

GLEWLWYD = "/usr/bin/glewlwyd"
SCHEMA = "/usr/share/dbconfig-common/data/glewlwyd/install/sqlite3"
LIB_DIR = "/usr/lib/glewlwyd"
WEBAPP = "/usr/share/glewlwyd/webapp"
# The package schema's administrator.
ADMIN = ("admin", "password")

INSTANCE = "glwd"  # the plugin instance: its endpoints are under /api/glwd/
SCOPE = "read"
PUBLIC_CLIENT = "tessera-public"
CONFIDENTIAL_CLIENT = "tessera-confidential"
USERS = {"alice": "alice-glwd-pw", "bob": "bob-glwd-pw"}

# The OpenID Connect plugin instance (module `oidc`): its endpoints are under /api/oidc/, its
# issuer is https://127.0.0.1:PORT/api/oidc (the `iss` parameter), DPoP on with server nonces.
OIDC_INSTANCE = "oidc"
OIDC_CLIENT = "tessera-dpop"  # public, PKCE, code + refresh_token + device_authorization
OIDC_SCOPES = ("openid", SCOPE)  # what its client asks for: "openid read"
OIDC_KID = "tessera-e2e-es256"  # the kid of the plugin's ES256 signing key
# How many DPoP token requests of a client a nonce serves after the first before glewlwyd
# rotates it (the new one comes in the DPoP-Nonce header of the answer that used up the old).
DPOP_NONCE_COUNTER = 2
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
# Bounds against a hang only: every wait below ends at the event it waits for.
START_TIMEOUT = 30.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def installed():
    return os.access(GLEWLWYD, os.X_OK) and os.path.exists(SCHEMA)


def server_certificate(directory, ca_cert, ca_key):
    """A key and a certificate for 127.0.0.1 signed by the test CA (as scripts/idp makes its own)."""
    key, csr, cert, ext = (os.path.join(directory, name)
                           for name in ("server-key.pem", "server.csr", "server.pem", "server.ext"))
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    for cmd in (
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", csr],
        ["openssl", "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial",
         "-CAserial", os.path.join(directory, "ca.srl"), "-days", "2", "-extfile", ext, "-out", cert],
    ):
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    return key, cert


class Glewlwyd:
    """One glewlwyd process and what the tests ask it: its URLs, its metrics, its database."""

    def __init__(self, directory, ca_cert, ca_key):
        self.dir = directory
        self.ca = ca_cert
        self.port = free_port()
        self.metrics_port = free_port()
        # The loopback redirect URI's port, registered for both clients (exact match).
        self.redirect_port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.db_path = os.path.join(directory, "glewlwyd.db")
        self.log_path = os.path.join(directory, "glewlwyd.log")
        self.output_path = os.path.join(directory, "glewlwyd.out")
        self.config_path = os.path.join(directory, "glewlwyd.conf")
        self.secret = "glwd-" + secrets.token_urlsafe(24)  # the confidential client's
        self.jwt_key = secrets.token_urlsafe(32)  # the plugin signs its tokens with it (HS256)
        # The OpenID Connect plugin's signing key (ES256): its id_tokens and access tokens.
        self.oidc_key = ec.generate_private_key(ec.SECP256R1())
        # What the browser stand-in (a process tesserad starts) reads: where, and who with which
        # password; and where it records the authorization requests it opened.
        self.browser_state = os.path.join(directory, "browser.json")
        self.browser_record = os.path.join(directory, "browser.log")
        self.proc = None
        self.key, self.cert = server_certificate(directory, ca_cert, ca_key)

    # ---- URLs

    def endpoint(self, name):
        """An endpoint of the OAuth 2.0 plugin instance: auth, token, profile, introspect, revoke,
        device_authorization, device."""
        return f"{self.url}/api/{INSTANCE}/{name}/"

    @property
    def issuer(self):
        return f"{self.url}/api/{INSTANCE}"

    @property
    def redirect_uri(self):
        return f"http://127.0.0.1:{self.redirect_port}/"

    @property
    def oidc_issuer(self):
        """The OpenID Connect plugin instance's issuer: its discovery document's `issuer`, its tokens'
        `iss`, and the URL its document hangs off ({issuer}/.well-known/openid-configuration)."""
        return f"{self.url}/api/{OIDC_INSTANCE}"

    def oidc_endpoint(self, name):
        """An endpoint of the OpenID Connect plugin instance as its discovery document names it (no
        trailing slash; a DPoP proof's htu must be exactly this): auth, token, userinfo, jwks,
        device_authorization, introspect, revoke; `device` is the page the user enters a code at."""
        return f"{self.oidc_issuer}/{name}"

    @property
    def oidc_discovery_url(self):
        return f"{self.oidc_issuer}/.well-known/openid-configuration"

    # ---- process

    def write_config(self):
        with open(self.config_path, "w") as f:
            f.write(f"""# A glewlwyd of Tests/e2e/glewlwyd.py
port={self.port}
bind_address="127.0.0.1"
external_url="{self.url}"
login_url="login.html"
api_prefix="api"
static_files_path="{WEBAPP}/"
allow_origin="*"
log_mode="file"
log_level="INFO"
log_file="{self.log_path}"
cookie_secure=1
cookie_same_site="empty"
session_expiration=3600
session_key="GLEWLWYD2_SESSION_ID"
admin_session_authentication="cookie"
profile_session_authentication="cookie"
allow_multiple_user_per_session=true
login_api_enabled=true
plugin_api_run_enabled=""
admin_scope="g_admin"
profile_scope="g_profile"
user_module_path="{LIB_DIR}/user"
client_module_path="{LIB_DIR}/client"
user_auth_scheme_module_path="{LIB_DIR}/scheme"
plugin_module_path="{LIB_DIR}/plugin"
use_secure_connection=true
secure_connection_key_file="{self.key}"
secure_connection_pem_file="{self.cert}"
hash_algorithm="SHA512"
metrics_endpoint=true
metrics_endpoint_port={self.metrics_port}
metrics_bind_address="127.0.0.1"
metrics_endpoint_admin_session=false
database =
{{
  type = "sqlite3"
  path = "{self.db_path}"
}};
""")

    def write_browser_state(self):
        with open(os.open(self.browser_state, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump({"url": self.url, "ca": self.ca, "scope": SCOPE, "users": USERS,
                       "record": self.browser_record}, f)

    def create_database(self):
        with open(SCHEMA) as f:
            schema = f.read()
        conn = sqlite3.connect(self.db_path)
        try:
            conn.executescript(schema)
        finally:
            conn.close()

    def session(self):
        s = requests.Session()
        s.trust_env = False  # no proxy or CA variables: everything here is 127.0.0.1
        s.verify = self.ca
        return s

    def answers(self, path):
        """Whether glewlwyd answers `path` with anything but 404 (TLS works, the route exists)."""
        try:
            return self.session().post(self.url + path, timeout=5).status_code != 404
        except requests.RequestException:
            return False

    def start(self, ready_path="/api/auth/", *more_paths):
        """Starts glewlwyd and returns once it answers `ready_path` and `more_paths` (a plugin's
        route once the plugin serves)."""
        assert self.proc is None
        # In the test session's process group: if the session is killed, so is glewlwyd.
        with open(self.output_path, "ab") as out:
            self.proc = subprocess.Popen([GLEWLWYD, "-c", self.config_path], stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=out, cwd=self.dir)
        deadline = time.monotonic() + START_TIMEOUT
        while not all(self.answers(path) for path in (ready_path, *more_paths)):
            if self.proc.poll() is not None:
                raise AssertionError(f"glewlwyd exited with {self.proc.returncode} at start:\n{self.output()}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(
                    f"glewlwyd did not answer {ready_path} within {START_TIMEOUT:.0f} s:\n{self.output()}")
            time.sleep(0.05)

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def output(self, limit=4000):
        text = ""
        for path in (self.output_path, self.log_path):
            try:
                with open(path, errors="replace") as f:
                    text += f"--- {os.path.basename(path)}\n{f.read()[-limit:]}\n"
            except OSError:
                pass
        return text

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # ---- set-up through the admin API

    def admin(self):
        s = self.session()
        r = s.post(f"{self.url}/api/auth/", json={"username": ADMIN[0], "password": ADMIN[1]}, timeout=30)
        assert r.status_code == 200, f"admin login: HTTP {r.status_code} {r.text}"
        return s

    @staticmethod
    def ok(response, what):
        assert response.status_code == 200, f"{what}: HTTP {response.status_code} {response.text}"

    def configure(self):
        """The scope, the users, the plugin instance and the clients, as an administrator adds them."""
        s = self.admin()
        api = f"{self.url}/api"
        self.ok(s.post(f"{api}/scope/", json={
            "name": SCOPE, "display_name": "Read", "description": "What Tessera's tests ask for",
            "password_required": True, "password_max_age": 0, "scheme": {}}, timeout=30), "add scope")
        for user, password in USERS.items():
            self.ok(s.post(f"{api}/user/", json={
                "username": user, "name": user.capitalize(), "email": f"{user}@example.test", "password": password,
                # g_profile: the user grants clients their scopes (PUT /api/auth/grant/CLIENT);
                # openid (in the package's schema): what the OpenID Connect client asks for.
                "scope": ["g_profile", "openid", SCOPE], "enabled": True}, timeout=30), f"add user {user}")
        self.ok(s.post(f"{api}/mod/plugin/", json={
            "module": "oauth2-glewlwyd", "name": INSTANCE, "display_name": "OAuth 2.0 for Tessera's tests",
            "enabled": True,
            "parameters": {
                "jwt-type": "sha", "jwt-key-size": "256", "key": self.jwt_key,
                "access-token-duration": 3600, "refresh-token-duration": 1209600, "code-duration": 600,
                "refresh-token-rolling": True,
                "auth-type-code-enabled": True, "auth-type-implicit-enabled": False,
                "auth-type-password-enabled": False, "auth-type-client-enabled": False,
                "auth-type-refresh-enabled": True, "auth-type-device-enabled": True,
                "device-authorization-expiration": 600, "device-authorization-interval": 1,
                "pkce-allowed": True, "pkce-method-plain-allowed": False,
                # Revocation (RFC 7009): glewlwyd takes it from a confidential client that
                # authenticates, for its own tokens; a public client cannot revoke here.
                "introspection-revocation-allowed": True, "introspection-revocation-allow-target-client": True,
                "scope": [], "additional-parameters": []}}, timeout=30), "add the OAuth 2.0 plugin")
        kinds = ["code", "refresh_token", "device_authorization"]
        self.ok(s.post(f"{api}/client/", json={
            "client_id": PUBLIC_CLIENT, "name": "Tessera (public)", "confidential": False, "enabled": True,
            "redirect_uri": [self.redirect_uri], "authorization_type": kinds, "scope": []}, timeout=30),
            "add the public client")
        self.ok(s.post(f"{api}/client/", json={
            "client_id": CONFIDENTIAL_CLIENT, "name": "Tessera (confidential)", "confidential": True,
            "password": self.secret, "enabled": True, "redirect_uri": [self.redirect_uri],
            # client_credentials: what glewlwyd asks of a client that revokes its tokens.
            "authorization_type": kinds + ["client_credentials"], "scope": [SCOPE]}, timeout=30),
            "add the confidential client")
        self.configure_oidc(s)

    def oidc_signing_jwk(self, private=False):
        """The OpenID Connect plugin's ES256 key as a JWK (what its /jwks serves, or with `d`)."""
        numbers = self.oidc_key.private_numbers()
        jwk = {"kty": "EC", "crv": "P-256", "x": b64encode(numbers.public_numbers.x.to_bytes(32, "big")),
               "y": b64encode(numbers.public_numbers.y.to_bytes(32, "big")), "kid": OIDC_KID, "alg": "ES256",
               "use": "sig"}
        if private:
            jwk["d"] = b64encode(numbers.private_value.to_bytes(32, "big"))
        return jwk

    def configure_oidc(self, s):
        """The OpenID Connect plugin instance and its public client: ES256 tokens, DPoP (RFC 9449)
        with server nonces, the code flow with PKCE, the device grant, one-use refresh tokens."""
        api = f"{self.url}/api"
        self.ok(s.post(f"{api}/mod/plugin/", json={
            "module": "oidc", "name": OIDC_INSTANCE, "display_name": "OpenID Connect with DPoP for Tessera's tests",
            "enabled": True,
            "parameters": {
                "iss": self.oidc_issuer,
                "jwks-private": json.dumps({"keys": [self.oidc_signing_jwk(private=True)]}),
                "default-kid": OIDC_KID,
                "jwks-show": True,
                "access-token-duration": 3600, "refresh-token-duration": 1209600, "code-duration": 600,
                # Rolling: a refresh restarts the refresh token's lifetime. One use: each refresh
                # answers a new refresh token and disables the one redeemed (a replay of a redeemed
                # one breaks the chain: glewlwyd then disables the newest).
                "refresh-token-rolling": True, "refresh-token-one-use": "always",
                "allow-non-oidc": False,
                "auth-type-code-enabled": True, "auth-type-token-enabled": False, "auth-type-none-enabled": False,
                "auth-type-password-enabled": False, "auth-type-client-enabled": False,
                "auth-type-refresh-enabled": True, "auth-type-device-enabled": True,
                "device-authorization-expiration": 600, "device-authorization-interval": 1,
                "pkce-allowed": True, "pkce-method-plain-allowed": False,
                "subject-type": "public",
                "allowed-scope": list(OIDC_SCOPES),  # the discovery document's scopes_supported
                # The id_token and userinfo: name and email always, and preferred_username (the
                # glewlwyd username), which Tessera names the account with.
                "name-claim": "mandatory", "email-claim": "mandatory", "scope-claim": "no",
                "address-claim": {"type": "no"},
                "claims": [{"name": "preferred_username", "user-property": "username", "type": "string",
                            "mandatory": True}],
                "introspection-revocation-allowed": True, "introspection-revocation-allow-target-client": True,
                "request-parameter-allow": False, "session-management-allowed": False,
                "oauth-dpop-allowed": True, "oauth-dpop-iat-duration": 60, "oauth-dpop-iat-gap-duration": 10,
                "oauth-dpop-nonce-mandatory": True, "oauth-dpop-nonce-counter": DPOP_NONCE_COUNTER,
                "scope": [], "additional-parameters": []}}, timeout=30), "add the OpenID Connect plugin")
        self.ok(s.post(f"{api}/client/", json={
            "client_id": OIDC_CLIENT, "name": "Tessera (public, DPoP)", "confidential": False, "enabled": True,
            "redirect_uri": [self.redirect_uri],
            "authorization_type": ["code", "refresh_token", "device_authorization"], "scope": []}, timeout=30),
            "add the OpenID Connect client")

    # ---- what glewlwyd saw

    def metrics(self):
        """The Prometheus counters: {(name, frozenset(labels.items())): value}."""
        text = self.session().get(f"http://127.0.0.1:{self.metrics_port}/", timeout=30).text
        counters = {}
        for line in text.splitlines():
            m = re.match(r"^(\w+)(?:\{(.*)\})?\s+(\S+)$", line)
            if m:
                labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
                counters[(m.group(1), labels)] = float(m.group(3))
        return counters

    def counter(self, name, **labels):
        """A counter of the plugin instance, e.g. counter("oauth2_access_token", response_type="code")."""
        labels = frozenset({("plugin", INSTANCE), *labels.items()})
        return int(self.metrics().get((f"glewlwyd_{name}_total", labels), 0))

    def access_tokens_by(self, response_type):
        """How many access tokens the plugin issued for a grant: code or refresh_token (a device
        grant counts twice: at its approval and at its token request)."""
        return self.counter("oauth2_access_token", response_type=response_type)

    def refresh_tokens(self, username, client_id):
        """The user's refresh tokens for the client in glewlwyd's database: [enabled, ...] (the
        database keeps only their hashes)."""
        conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=20)
        try:
            rows = conn.execute(
                "SELECT gpgr_enabled FROM gpg_refresh_token WHERE gpgr_plugin_name = ? AND gpgr_username = ? "
                "AND gpgr_client_id = ? ORDER BY gpgr_id", (INSTANCE, username, client_id)).fetchall()
        finally:
            conn.close()
        return [bool(r[0]) for r in rows]

    def verify(self, token):
        """The claims of an access token glewlwyd signed (HS256 with the plugin's key), unexpired.
        Checked here rather than at the profile endpoint, which crashes glewlwyd when called with
        a device-code token (it has no scope)."""
        header, payload, signature = token.split(".")
        assert json.loads(b64decode(header))["alg"] == "HS256", header
        expected = hmac.new(self.jwt_key.encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest()
        assert hmac.compare_digest(b64decode(signature), expected), "not signed by this glewlwyd"
        claims = json.loads(b64decode(payload))
        assert claims["type"] == "access_token" and claims["exp"] > time.time(), claims
        return claims

    def profile(self, token):
        """GET /api/glwd/profile/ with the token: glewlwyd's resource, which honours it. Never
        with a device-code token (see verify)."""
        r = self.session().get(self.endpoint("profile"), headers={"Authorization": f"Bearer {token}"}, timeout=30)
        self.ok(r, "profile")
        return r.json()

    def redeem(self, refresh_token, client_id, secret=None):
        """A refresh request of our own at glewlwyd's token endpoint -> the response."""
        return self.session().post(self.endpoint("token"), data={
            "grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_id},
            auth=(client_id, secret) if secret else None, timeout=30)

    def introspect(self, token):
        """RFC 7662 introspection, authenticated as the confidential client."""
        r = self.session().post(self.endpoint("introspect"), data={"token": token},
                                auth=(CONFIDENTIAL_CLIENT, self.secret), timeout=30)
        self.ok(r, "introspection")
        return r.json()

    # ---- the OpenID Connect plugin instance (DPoP)

    def oidc_discovery(self):
        """The OpenID Connect plugin's discovery document."""
        r = self.session().get(self.oidc_discovery_url, timeout=30)
        self.ok(r, "discovery")
        return r.json()

    def verify_oidc(self, token, audience=None):
        """The claims of a JWT the OpenID Connect plugin signed (ES256, its key), unexpired, from
        its issuer: an access token ({"type": "access_token", "sub", "client_id", "scope", "cnf":
        {"jkt"} when DPoP-bound, ...}) or an id_token (with `audience`, its aud must hold it)."""
        header, payload, signature = token.split(".")
        assert json.loads(b64decode(header)).get("alg") == "ES256", b64decode(header)
        raw = b64decode(signature)
        assert len(raw) == 64, "an ES256 signature"
        der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
        self.oidc_key.public_key().verify(der, f"{header}.{payload}".encode(), ec.ECDSA(hashes.SHA256()))
        claims = json.loads(b64decode(payload))
        assert claims["iss"] == self.oidc_issuer and claims["exp"] > time.time(), claims
        if audience is not None:
            aud = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
            assert audience in aud, claims
        return claims

    def access_token_jkt(self, access_token):
        """The thumbprint an access token of the OpenID Connect plugin is bound to (cnf.jkt), or None."""
        return self.verify_oidc(access_token).get("cnf", {}).get("jkt")

    def dpop_send(self, method, name, key, access_token=None, **kwargs):
        """A request to an endpoint of the OpenID Connect plugin with a DPoP proof from `key` (none
        when key is None): when glewlwyd asks for its nonce (400 use_dpop_nonce at the token
        endpoint, 401 with WWW-Authenticate DPoP error="use_dpop_nonce" at a resource) it is sent
        again once with the nonce glewlwyd named. `access_token`: sent as `Authorization: DPoP`,
        the proof carrying its hash. Returns the last response."""
        url = self.oidc_endpoint(name)
        nonce = self.dpop_nonce()
        extra = dict(kwargs.pop("headers", None) or {})
        for _ in range(2):
            headers = dict(extra)
            if key is not None:
                headers["DPoP"] = key.proof(method, url, nonce=nonce, access_token=access_token)
            if access_token is not None:
                headers["Authorization"] = f"DPoP {access_token}"
            r = self.session().request(method, url, headers=headers, timeout=30, **kwargs)
            if key is None or not is_use_dpop_nonce(r) or r.headers.get("DPoP-Nonce") in (None, nonce):
                return r
            nonce = r.headers["DPoP-Nonce"]
        return r

    def oidc_device_sign_in(self, user, key, scope=" ".join(OIDC_SCOPES), client_id=OIDC_CLIENT):
        """A device-code sign-in of our own at the OpenID Connect plugin, tokens bound to `key`:
        the device authorization, the user's approval (approve_device), then the token request
        with a proof (glewlwyd checks proofs only once the code is approved) -> the token answer
        {"token_type": "DPoP", "access_token", "refresh_token", "id_token", "scope", ...}."""
        r = self.session().post(self.oidc_endpoint("device_authorization"),
                                data={"client_id": client_id, "scope": scope}, timeout=30)
        self.ok(r, "device authorization")
        approve_device(self, user, client_id, r.json()["user_code"], instance=OIDC_INSTANCE, scope=scope)
        answer = self.dpop_send("POST", "token", key, data={
            "grant_type": DEVICE_GRANT, "device_code": r.json()["device_code"], "client_id": client_id})
        self.ok(answer, "device token")
        return answer.json()

    def oidc_redeem(self, refresh_token, key, client_id=OIDC_CLIENT):
        """A refresh request of our own at the OpenID Connect plugin's token endpoint, with a proof
        from `key` (None: no proof) -> the response. A bound refresh token redeemed with another
        key's proof or none is refused with 403 {"error": "invalid_dpop_proof"}, and stays usable."""
        return self.dpop_send("POST", "token", key, data={
            "grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_id})

    def userinfo(self, access_token, key):
        """GET userinfo with a DPoP-bound access token and a proof from `key` -> the response.
        glewlwyd does not compare the proof's key with the token's cnf.jkt here: any valid proof
        passes (compare them with access_token_jkt if it matters)."""
        return self.dpop_send("GET", "userinfo", key, access_token=access_token)

    def _query(self, sql, args=()):
        conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=20)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def dpop_nonce(self, client_id=OIDC_CLIENT):
        """The DPoP nonce glewlwyd expects now in the client's proofs (one per client, for all its
        users and keys; None before the client's first DPoP request)."""
        rows = self._query("SELECT gpodcn_nonce FROM gpo_dpop_client_nonce WHERE gpodcn_client_id = ?", (client_id,))
        return rows[0][0] if rows else None

    def dpop_proofs(self, client_id=OIDC_CLIENT):
        """The DPoP proofs glewlwyd accepted from the client, oldest first: [{"jkt", "htm", "htu"}]
        (a proof it refused is not kept)."""
        rows = self._query("SELECT gpod_jkt, gpod_htm, gpod_htu FROM gpo_dpop WHERE gpod_plugin_name = ? "
                           "AND gpod_client_id = ? ORDER BY gpod_id", (OIDC_INSTANCE, client_id))
        return [{"jkt": jkt, "htm": htm, "htu": htu} for jkt, htm, htu in rows]

    def oidc_refresh_tokens(self, username, client_id=OIDC_CLIENT):
        """The user's refresh tokens of the OpenID Connect plugin for the client, oldest first:
        [{"enabled": bool, "jkt": the thumbprint it is bound to or None}]."""
        rows = self._query(
            "SELECT gpor_enabled, gpor_dpop_jkt FROM gpo_refresh_token WHERE gpor_plugin_name = ? "
            "AND gpor_username = ? AND gpor_client_id = ? ORDER BY gpor_id", (OIDC_INSTANCE, username, client_id))
        return [{"enabled": bool(enabled), "jkt": jkt} for enabled, jkt in rows]


def b64decode(part):
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def b64encode(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class DPoPKey:
    """A client's DPoP key (RFC 9449): an ES256 key of its own, and the proofs it signs."""

    def __init__(self):
        self.key = ec.generate_private_key(ec.SECP256R1())
        numbers = self.key.public_key().public_numbers()
        self.jwk = {"kty": "EC", "crv": "P-256", "x": b64encode(numbers.x.to_bytes(32, "big")),
                    "y": b64encode(numbers.y.to_bytes(32, "big"))}

    @property
    def jkt(self):
        """The key's RFC 7638 thumbprint: what a bound token's cnf.jkt is."""
        return jwk_thumbprint(self.jwk)

    def proof(self, htm, htu, nonce=None, access_token=None):
        """A DPoP proof JWT for a request: `htu` the URL without query (glewlwyd compares it with
        the endpoint as its discovery document names it), `nonce` the server's DPoP-Nonce, and with
        `access_token` its hash (ath), for a resource request."""
        claims = {"jti": str(uuid.uuid4()), "htm": htm, "htu": htu, "iat": int(time.time())}
        if nonce is not None:
            claims["nonce"] = nonce
        if access_token is not None:
            claims["ath"] = b64encode(hashlib.sha256(access_token.encode()).digest())
        header = {"typ": "dpop+jwt", "alg": "ES256", "jwk": self.jwk}
        signing_input = ".".join(b64encode(json.dumps(part, separators=(",", ":")).encode())
                                 for part in (header, claims))
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing_input}.{b64encode(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def is_use_dpop_nonce(response):
    """Whether glewlwyd asks for a proof with its nonce: 400 {"error": "use_dpop_nonce"} at the
    token endpoint, 401 with WWW-Authenticate: DPoP error="use_dpop_nonce" at a resource."""
    if "use_dpop_nonce" in response.headers.get("WWW-Authenticate", ""):
        return True
    try:
        return response.json().get("error") == "use_dpop_nonce"
    except ValueError:
        return False


def jwk_thumbprint(jwk):
    """RFC 7638 SHA-256 thumbprint of an EC or RSA public JWK."""
    members = ("crv", "kty", "x", "y") if jwk["kty"] == "EC" else ("e", "kty", "n")
    canonical = json.dumps({k: jwk[k] for k in members}, separators=(",", ":"), sort_keys=True)
    return b64encode(hashlib.sha256(canonical.encode()).digest())


def approve_device(server, user, client_id, user_code, instance=INSTANCE, scope=SCOPE):
    """What the user does on another device with glewlwyd's JavaScript pages, as their HTTP calls
    (Tests/e2e/glewlwyd_browser.py): signs in, grants the client its scope, enters the user code.
    For the OpenID Connect client: instance=OIDC_INSTANCE, scope=" ".join(OIDC_SCOPES)."""
    from glewlwyd_browser import Browser
    browser = Browser(server.url, server.ca)
    browser.sign_in(user, USERS[user])
    grant(browser.s, server.url, client_id, scope)
    browser.approve_device(instance, user_code)


def grant(session, url, client_id, scope):
    """The consent page's "Grant" button with a signed-in `session`: PUT /api/auth/grant/CLIENT
    {"scope": "a b"}. glewlwyd splits the list at spaces only (a comma-separated one is a single
    unknown scope: 401), so several scopes, such as "openid read", are sent space-separated."""
    scopes = " ".join(s for s in scope.replace(",", " ").split() if s)
    r = session.put(f"{url}/api/auth/grant/{client_id}", json={"scope": scopes}, timeout=30)
    assert r.status_code == 200, f"granting {scopes!r} to {client_id}: HTTP {r.status_code} {r.text}"


def new_server():
    """A glewlwyd in a new directory of the test session's, with a certificate from its test CA."""
    ca_cert = os.environ["TESSERA_IDP_CA"]
    ca_key = os.path.join(os.path.dirname(ca_cert), "ca-key.pem")
    directory = tempfile.mkdtemp(prefix="glewlwyd.", dir=os.environ["TESSERA_SESSION_DIR"])
    return Glewlwyd(directory, ca_cert, ca_key)


def configure_and_start(server):
    """Its database, its plugin instances and clients (through the admin API), then a restart to
    serve them; returns once both instances' token endpoints answer."""
    server.write_config()
    server.create_database()
    server.start()
    server.configure()
    server.stop()
    server.start(f"/api/{INSTANCE}/token/", f"/api/{OIDC_INSTANCE}/token/")
    server.write_browser_state()


@pytest.fixture(scope="module")
def glewlwyd():
    """A configured glewlwyd for the test module, stopped at its end; one that died meanwhile fails
    the module. Its directory is in the test session's, kept with TESSERA_KEEP_SESSION=1."""
    if not installed():
        pytest.fail("glewlwyd is not installed: install Debian's glewlwyd package as scripts/test does "
                    "(tessera_install_glewlwyd in scripts/lib/packages.sh)")
    server = new_server()
    try:
        configure_and_start(server)
        yield server
    finally:
        crashed = server.proc is not None and server.proc.poll() is not None
        server.stop()
        if crashed:
            pytest.fail(f"glewlwyd died during the tests:\n{server.output()}")



# glewlwyd's user codes: 8 characters in two groups, e.g. 3246-68C3.
USER_CODE_RE = re.compile(r"\b[0-9A-Z]{4}-[0-9A-Z]{4}\b")


def device_login(argv, approve):
    """Runs `argv` (a `tessera login --device-code` command line), calls approve(user_code) with
    the code it shows, and returns (returncode, stdout, what it showed on stderr)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    shown = ""
    try:
        user_code = None
        while user_code is None:
            line = lines.get(timeout=60)
            shown += line
            found = USER_CODE_RE.findall(line)
            user_code = found[0] if found else None
        approve(user_code)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, shown + err
