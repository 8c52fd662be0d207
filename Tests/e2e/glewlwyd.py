"""A private glewlwyd (Debian's `glewlwyd` 2.7, a C authorization server written by others) for
Tessera's end-to-end tests against a real plain OAuth 2.0 server (Tests/e2e/test_glewlwyd.py).

The `glewlwyd` fixture starts one for the test module: its own directory, an SQLite database
made from the package's own schema (/usr/share/dbconfig-common/data/glewlwyd/install/sqlite3,
which makes the administrator admin/password), a config file (`glewlwyd -c FILE`) serving HTTPS
on 127.0.0.1 with a certificate from the session's test CA ($TESSERA_IDP_CA, which config.toml's
`ca_file` trusts: Tessera takes only https endpoints for a [[provider]]), and a Prometheus
metrics port. The rest is set up as an administrator would, through the admin REST API: a scope,
the users, the OAuth 2.0 plugin instance (`libprotocol_oauth2.so`, module `oauth2-glewlwyd`) and
two clients, a public one and a confidential one (client_secret_basic; glewlwyd refuses
client_secret_post). glewlwyd is then restarted, to serve the plugin instance as a glewlwyd
started with it in its database does (a plugin added through the API has been seen to serve only
after a restart; this one's routes answer at once, and the restart costs a tenth of a second).

glewlwyd matches redirect URIs exactly (port included), so the clients register
http://127.0.0.1:REDIRECT_PORT/ and the tests set config.toml's `redirect_port` to it.

The plain OAuth 2.0 plugin publishes no metadata document, issues no id_token, and its profile
endpoint (GET /api/<instance>/profile/) answers {"username", "name", "email"}: no `sub`.
"""
import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time

import pytest
import requests

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

    def start(self, ready_path="/api/auth/"):
        """Starts glewlwyd and returns once it answers `ready_path` (a plugin's route once the
        plugin serves)."""
        assert self.proc is None
        # In the test session's process group: if the session is killed, so is glewlwyd.
        with open(self.output_path, "ab") as out:
            self.proc = subprocess.Popen([GLEWLWYD, "-c", self.config_path], stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=out, cwd=self.dir)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.answers(ready_path):
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
                # g_profile: the user grants clients their scopes (PUT /api/auth/grant/CLIENT).
                "scope": ["g_profile", SCOPE], "enabled": True}, timeout=30), f"add user {user}")
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


def b64decode(part):
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def approve_device(server, user, client_id, user_code):
    """What the user does on another device with glewlwyd's JavaScript pages, as their HTTP calls
    (Tests/e2e/glewlwyd_browser.py): signs in, grants the client its scope, enters the user code."""
    from glewlwyd_browser import Browser
    browser = Browser(server.url, server.ca)
    browser.sign_in(user, USERS[user])
    browser.grant(client_id, SCOPE)
    browser.approve_device(INSTANCE, user_code)


@pytest.fixture(scope="module")
def glewlwyd():
    """A configured glewlwyd for the test module, stopped at its end; one that died meanwhile fails
    the module. Its directory is in the test session's, kept with TESSERA_KEEP_SESSION=1."""
    if not installed():
        pytest.fail("glewlwyd is not installed: install Debian's glewlwyd package as scripts/test does "
                    "(tessera_install_glewlwyd in scripts/lib/packages.sh)")
    ca_cert = os.environ["TESSERA_IDP_CA"]
    ca_key = os.path.join(os.path.dirname(ca_cert), "ca-key.pem")
    directory = tempfile.mkdtemp(prefix="glewlwyd.", dir=os.environ["TESSERA_SESSION_DIR"])
    server = Glewlwyd(directory, ca_cert, ca_key)
    try:
        server.write_config()
        server.create_database()
        server.start()
        server.configure()
        server.stop()
        server.start(ready_path=f"/api/{INSTANCE}/token/")
        server.write_browser_state()
        yield server
    finally:
        crashed = server.proc is not None and server.proc.poll() is not None
        server.stop()
        if crashed:
            pytest.fail(f"glewlwyd died during the tests:\n{server.output()}")

