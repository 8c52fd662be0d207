"""Tokens bound to this machine (issue 40, RFC 9449 DPoP) against a real third-party server that
binds them: glewlwyd 2.7's OpenID Connect plugin with DPoP and server nonces required
(Tests/e2e/glewlwyd.py). tesserad makes a key per sign-in (software keys here), proves it at every
token request, and hands proofs to the app that holds a bound token; glewlwyd refuses the refresh
token without that key, so a copy of it taken from the keyring is worthless elsewhere.

glewlwyd's userinfo takes a valid proof from any key (a gap measured in
../shared/notes/identity-providers.md), so the tests compare the proof's key with the token's
cnf.jkt themselves."""
import base64
import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import ssl
import threading
import time

import dbus
import requests
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from conftest import BUS_NAME, IDP_DIR, IFACE, OBJECT_PATH, REPO, TESSERA, expect_error, run_cli, wait_until
from glewlwyd import (INSTANCE, OIDC_CLIENT, OIDC_INSTANCE, DPoPKey, approve_device, device_login,  # noqa: F401
                      glewlwyd, jwk_thumbprint)

BROWSER = os.path.join(REPO, "Tests", "e2e", "glewlwyd_browser.py")
NAME = "glwd-dpop"


def dpop_config(write_config, glewlwyd, mode="auto", plain=False, **settings):
    """config.toml with a [[provider]] for glewlwyd's OpenID Connect plugin (discovery), `dpop` as
    given; with `plain`, the plain OAuth 2.0 plugin instead (no metadata, so no DPoP)."""
    config = write_config(redirect_port=glewlwyd.redirect_port,
                          browser=f"{sys.executable} {BROWSER} {glewlwyd.browser_state}", **settings)
    if plain:
        table = f"""
[[provider]]
name = "{NAME}"
discovery = "none"
issuer = "{glewlwyd.issuer}"
authorization_endpoint = "{glewlwyd.endpoint('auth')}"
token_endpoint = "{glewlwyd.endpoint('token')}"
client_id = "tessera-public"
scopes = ["read"]
dpop = "{mode}"
"""
    else:
        table = f"""
[[provider]]
name = "{NAME}"
discovery = "openid"
issuer = "{glewlwyd.oidc_issuer}"
client_id = "{OIDC_CLIENT}"
scopes = ["read"]
dpop = "{mode}"
"""
    with open(config, "a") as f:
        f.write(table)
    return config


def token(*args):
    return json.loads(run_cli("token", "--provider", NAME, "--json", *args, check_rc=0).stdout)


def stored(keyring, kind):
    return [(attributes, json.loads(secret)) for _, attributes, secret in keyring.tessera_items(secrets=True)
            if attributes.get("kind") == kind]


def b64decode(part):
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


class DPoPResource:
    """A resource server that checks DPoP as RFC 9449 §7 says, written here because glewlwyd's own
    userinfo takes a valid proof from any key: the access token must be glewlwyd's (its signature
    and expiry), and the proof a JWS signed by the key the token names in cnf.jkt, for this method
    and URL (htm, htu), for this token (ath), fresh (iat within 60 s, a jti never seen) and with
    this server's nonce (a request without it gets 401 with use_dpop_nonce and the nonce). Answers
    {"user": preferred_username}; every refusal is recorded with its reason."""

    def __init__(self, glewlwyd):
        self.glewlwyd = glewlwyd
        self.nonce = "resource-nonce-1"
        self.jtis = set()
        self.refusals = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                status, headers, body = outer.check(self)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                data = json.dumps(body).encode()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(os.path.join(IDP_DIR, "server.pem"), os.path.join(IDP_DIR, "server-key.pem"))
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}/me"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def refuse(self, why, nonce=False):
        self.refusals.append(why)
        challenge = 'DPoP error="use_dpop_nonce"' if nonce else f'DPoP error="invalid_token", error_description="{why}"'
        headers = {"WWW-Authenticate": challenge}
        if nonce:
            headers["DPoP-Nonce"] = self.nonce
        return 401, headers, {"error": why}

    def check(self, handler):
        scheme, _, token = (handler.headers.get("Authorization") or "").partition(" ")
        proof = handler.headers.get("DPoP")
        if scheme != "DPoP" or not token or not proof:
            return self.refuse("no DPoP token and proof")
        try:
            claims = self.glewlwyd.verify_oidc(token)
            head, payload, signature = proof.split(".")
            header, body = json.loads(b64decode(head)), json.loads(b64decode(payload))
            assert header["typ"] == "dpop+jwt" and header["alg"] == "ES256", "typ or alg"
            jwk = header["jwk"]
            key = ec.EllipticCurvePublicNumbers(int.from_bytes(b64decode(jwk["x"]), "big"),
                                                int.from_bytes(b64decode(jwk["y"]), "big"),
                                                ec.SECP256R1()).public_key()
            raw = b64decode(signature)
            key.verify(encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big")),
                       f"{head}.{payload}".encode(), ec.ECDSA(hashes.SHA256()))
        except Exception as e:  # noqa: BLE001
            return self.refuse(f"bad token or proof: {e}")
        if jwk_thumbprint(jwk) != claims.get("cnf", {}).get("jkt"):
            return self.refuse("the proof's key is not the one the token is bound to")
        if body.get("htm") != handler.command or body.get("htu") != self.url:
            return self.refuse("htm or htu")
        if body.get("ath") != base64.urlsafe_b64encode(hashlib.sha256(token.encode()).digest()).rstrip(b"=").decode():
            return self.refuse("ath")
        if abs(body.get("iat", 0) - time.time()) > 60 or body.get("jti") in self.jtis:
            return self.refuse("stale or replayed")
        if body.get("nonce") != self.nonce:
            return self.refuse("use_dpop_nonce", nonce=True)
        self.jtis.add(body["jti"])
        return 200, {}, {"sub": claims["sub"], "client_id": claims.get("client_id")}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def proof_jkt(proof):
    header = json.loads(base64.urlsafe_b64decode(proof.split(".")[0] + "=="))
    assert header["typ"] == "dpop+jwt" and header["alg"] == "ES256", header
    return jwk_thumbprint(header["jwk"])


def test_a_sign_in_binds_the_tokens_to_this_machine_and_a_copied_refresh_token_is_refused(
        start_daemon, write_config, glewlwyd, keyring):
    """The browser sign-in at glewlwyd: the token is DPoP-bound (token_type DPoP, cnf.jkt the key
    tesserad kept), glewlwyd bound the refresh token to that key, and `tessera accounts` and
    `tessera status` say so. The refresh token copied out of the keyring is refused by glewlwyd
    from another key and without a proof, and that costs tesserad nothing: its own refresh still
    works, bound to the same key."""
    daemon = start_daemon(dpop_config(write_config, glewlwyd, mode="required"))
    login = run_cli("login", "--provider", NAME, timeout=120)
    assert login.returncode == 0 and "Signed in as alice" in login.stdout, login.stdout + login.stderr
    first = token()
    assert first["token_type"] == "DPoP", first
    [(attributes, key)] = stored(keyring, "dpop_key")
    assert key["kind"] == "software" and attributes["jkt"] == jwk_thumbprint(key["jwk"]), attributes
    jkt = attributes["jkt"]
    assert glewlwyd.access_token_jkt(first["access_token"]) == jkt, "the access token is bound to the kept key"
    assert glewlwyd.oidc_refresh_tokens("alice")[-1]["jkt"] == jkt, "so is the refresh token, at glewlwyd"
    [(_, refresh)] = stored(keyring, "refresh_token")
    assert refresh["proofKey"] == jkt, refresh

    [account] = json.loads(run_cli("accounts", "--json", check_rc=0).stdout)
    assert account["token_binding"] == "dpop", account
    status = json.loads(run_cli("status", "--json", check_rc=0).stdout)
    assert status["dpop"]["kind"] == "software", status["dpop"]
    text = run_cli("status", check_rc=0).stdout
    assert "bound to this machine's key (DPoP)" in text, text

    # Copied out of the keyring: worthless without the key, from another key or with none, and
    # the refused attempts use nothing up.
    stolen = refresh["secret"]
    other = glewlwyd.oidc_redeem(stolen, DPoPKey())
    assert other.status_code in (400, 403) and other.json().get("error") == "invalid_dpop_proof", other.text
    bare = glewlwyd.oidc_redeem(stolen, None)
    assert bare.status_code in (400, 401, 403), bare.text
    refreshed = token("--force-refresh")
    assert refreshed["token_type"] == "DPoP" and refreshed["access_token"] != first["access_token"]
    assert glewlwyd.access_token_jkt(refreshed["access_token"]) == jkt, "the refresh proved the same key"
    assert len(stored(keyring, "dpop_key")) == 1

    # glewlwyd rotates its nonce every few requests: tesserad follows it, refresh after refresh.
    nonce = glewlwyd.dpop_nonce()
    for _ in range(4):
        assert glewlwyd.access_token_jkt(token("--force-refresh")["access_token"]) == jkt
    assert glewlwyd.dpop_nonce() != nonce, "the nonce rotated mid-session"

    # A restart of tesserad: the binding survives (the key from the keyring signs the refresh).
    daemon.stop()
    daemon.start()
    assert glewlwyd.access_token_jkt(token("--force-refresh")["access_token"]) == jkt

    # Signed out: the key goes with the account; nothing of Tessera's is left in the keyring.
    run_cli("logout", check_rc=0)
    assert keyring.tessera_items() == []


def test_an_app_gets_proofs_for_its_own_token_and_curl_reaches_the_resource(
        start_daemon, write_config, glewlwyd, tmp_path):
    """`tessera proof` for the token `tessera token` printed: curl with both headers (the README's
    recipe) reaches a resource server that checks DPoP fully, taking its nonce with --nonce; a
    proof from another key for the same token is refused there. Another program that was never
    handed the token gets no proof for it (GetProof refuses), until it asks for the token itself."""
    start_daemon(dpop_config(write_config, glewlwyd))
    assert run_cli("login", "--provider", NAME, timeout=120).returncode == 0
    resource = DPoPResource(glewlwyd)
    try:
        url = resource.url
        ca = os.environ["TESSERA_IDP_CA"]
        # The README's recipe; the first answer names the resource's nonce, the second proof carries it.
        script = f"""set -e
url={url}
at=$(tessera token --provider {NAME})
curl -s -o /dev/null -D headers --cacert {ca} -H "Authorization: DPoP $at" \\
     -H "DPoP: $(tessera proof --provider {NAME} --method GET --url "$url")" "$url"
nonce=$(sed -n 's/^[Dd][Pp][Oo][Pp]-[Nn]once: *//p' headers | tr -d '\\r')
proof=$(tessera proof --provider {NAME} --method GET --url "$url" ${{nonce:+--nonce "$nonce"}})
echo "$proof" >proof
curl -sf --cacert {ca} -H "Authorization: DPoP $at" -H "DPoP: $proof" "$url"
"""
        env = dict(os.environ, PATH=os.path.dirname(TESSERA) + os.pathsep + os.environ["PATH"])
        out = subprocess.run(["sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stdout + out.stderr + str(resource.refusals)
        at = token()["access_token"]
        assert json.loads(out.stdout) == {"sub": glewlwyd.verify_oidc(at)["sub"], "client_id": OIDC_CLIENT}
        assert resource.refusals == ["use_dpop_nonce"], "refused once, for its nonce"
        assert proof_jkt((tmp_path / "proof").read_text().strip()) == glewlwyd.access_token_jkt(at)

        # Another key's proof for the same token: refused by a server that checks.
        thief = DPoPKey().proof("GET", url, nonce=resource.nonce, access_token=at)
        r = requests.get(url, headers={"Authorization": f"DPoP {at}", "DPoP": thief}, verify=ca, timeout=30)
        assert r.status_code == 401 and resource.refusals[-1].startswith("the proof's key"), r.text

        # Another program on the bus that never got the token: no proof.
        bus = dbus.SessionBus()
        broker = dbus.Interface(bus.get_object(BUS_NAME, OBJECT_PATH), IFACE)
        none = dbus.Dictionary({}, signature="sv")
        expect_error("AccessDenied", broker.GetProof, "GET", url, at, none)
        # Once it gets the token itself, it gets proofs for it, with the resource's nonce.
        got = broker.AcquireTokenSilent(OIDC_CLIENT, dbus.Array(["read"], signature="s"), "",
                                        dbus.Dictionary({"provider": NAME}, signature="sv"))
        assert str(got["access_token"]) == at
        proof = str(broker.GetProof("GET", url, at, dbus.Dictionary({"nonce": resource.nonce}, signature="sv")))
        r = requests.get(url, headers={"Authorization": f"DPoP {at}", "DPoP": proof}, verify=ca, timeout=30)
        assert r.status_code == 200, r.text
        expect_error("InvalidArgument", broker.GetProof, "GET", "ftp://x/", at, none)
        expect_error("InvalidArgument", broker.GetProof, "GET", url, "not-a-token", none)
    finally:
        resource.close()


def test_the_device_code_sign_in_binds_too(start_daemon, write_config, glewlwyd):
    """`tessera login --device-code` at glewlwyd: the code is approved, the token request carries a
    proof with glewlwyd's nonce, and the token is bound."""
    start_daemon(dpop_config(write_config, glewlwyd, mode="required"))
    rc, out, shown = device_login(
        [TESSERA, "login", "--provider", NAME, "--device-code", "--timeout", "120"],
        lambda code: approve_device(glewlwyd, "bob", OIDC_CLIENT, code, instance=OIDC_INSTANCE, scope="read openid"))
    assert rc == 0, shown
    assert "Signed in as bob" in out, out
    bound = token()
    assert bound["token_type"] == "DPoP" and glewlwyd.access_token_jkt(bound["access_token"]), bound


def test_required_refuses_a_server_that_cannot_bind_before_the_browser_opens(start_daemon, write_config, glewlwyd):
    """dpop = "required" for glewlwyd's plain OAuth 2.0 plugin, which publishes no metadata (so no
    dpop_signing_alg_values_supported): the sign-in is refused at once with what to change, and no
    browser opens."""
    start_daemon(dpop_config(write_config, glewlwyd, mode="required", plain=True))
    before = glewlwyd.access_tokens_by("code")
    out = run_cli("login", "--provider", NAME, "--login-hint", "alice", timeout=60)
    assert out.returncode != 0, out.stdout
    assert 'dpop = "required"' in out.stderr and 'dpop = "auto" or "off"' in out.stderr, out.stderr
    assert glewlwyd.access_tokens_by("code") == before
    assert json.loads(run_cli("accounts", "--json", check_rc=0).stdout) == []


def test_a_key_this_machine_lost_means_sign_in_again_and_nothing_else_is_lost(
        start_daemon, write_config, glewlwyd, keyring):
    """The key's item gone from the keyring (a keyring restored from an old backup): after a
    restart the account says it needs a sign-in because this machine's key changed, the bound
    refresh token is not sent to glewlwyd, and the account and its refresh token stay. A sign-in
    makes a new key and everything works again."""
    daemon = start_daemon(dpop_config(write_config, glewlwyd))
    assert run_cli("login", "--provider", NAME, timeout=120).returncode == 0
    daemon.stop()
    gone = [(path, attributes) for path, attributes in keyring.tessera_items() if attributes.get("kind") == "dpop_key"]
    assert keyring.delete(gone) == 1
    daemon.start()
    proofs = len(glewlwyd.dpop_proofs())
    refused = run_cli("token", "--provider", NAME, "--force-refresh")
    assert refused.returncode == 4, refused.stderr
    assert "this machine's key changed" in refused.stderr, refused.stderr
    assert len(glewlwyd.dpop_proofs()) == proofs, "nothing was sent to glewlwyd"
    assert [a["username"] for a in json.loads(run_cli("accounts", "--json", check_rc=0).stdout)] == ["alice"]
    assert stored(keyring, "refresh_token"), "the refresh token stays"
    assert run_cli("login", "--provider", NAME, timeout=120).returncode == 0
    assert token("--force-refresh")["token_type"] == "DPoP"


class SoftwareTPM:
    """swtpm, a software TPM 2.0, on a socket: `restart(clear=True)` starts it with a new storage
    hierarchy, as `tpm2_clear` leaves a real one."""

    def __init__(self, directory):
        self.directory = directory
        self.socket = os.path.join(directory, "swtpm.sock")
        self.proc = None
        self.generation = 0

    def start(self):
        self.generation += 1
        state = os.path.join(self.directory, f"state-{self.generation}")
        os.makedirs(state, exist_ok=True)
        self.proc = subprocess.Popen(
            ["swtpm", "socket", "--tpm2", "--server", f"type=unixio,path={self.socket}",
             # tpm2-tss's swtpm TCTI finds the control channel at the socket's path + ".ctrl".
             "--ctrl", f"type=unixio,path={self.socket}.ctrl", "--tpmstate", f"dir={state}",
             "--flags", "not-need-init,startup-clear"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)

        def answers():
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(self.socket)
                return True
            except OSError:
                assert self.proc.poll() is None, "swtpm exited"
                return False
            finally:
                s.close()
        wait_until(answers, what="swtpm's socket")

    def stop(self):
        # SIGKILL: swtpm waits for its client to hang up before it honours SIGTERM, and what a TPM
        # keeps across a restart (its seeds) is written when it changes, not at exit.
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    @property
    def tcti(self):
        return f"swtpm:path={self.socket}"


def test_with_a_tpm_the_key_is_made_in_it_and_a_cleared_tpm_means_sign_in_again(
        start_daemon, write_config, glewlwyd, keyring, tmp_path):
    """tesserad with a TPM (swtpm here, /dev/tpmrm0 on a machine): the key tokens are bound to is
    made by the TPM and the keyring keeps only the TPM's wrapped copy; glewlwyd takes the proofs it
    signs, at the sign-in and at every refresh, and `tessera status` says where the keys are. When
    the TPM is cleared, the account says it needs a sign-in because this machine's key changed, and
    a sign-in makes a key in the new TPM."""
    tpm = SoftwareTPM(str(tmp_path))
    tpm.start()
    try:
        daemon = start_daemon(dpop_config(write_config, glewlwyd, mode="required"),
                              extra_env={"TESSERA_TPM_TCTI": tpm.tcti})
        assert run_cli("login", "--provider", NAME, timeout=120).returncode == 0
        [(attributes, key)] = stored(keyring, "dpop_key")
        assert key["kind"] == "tpm", key["kind"]
        assert "." in key["blob"] and len(key["blob"]) > 100, "the TPM's wrapped key, not a bare scalar"
        first = token()
        assert glewlwyd.access_token_jkt(first["access_token"]) == attributes["jkt"]
        status = json.loads(run_cli("status", "--json", check_rc=0).stdout)
        assert status["dpop"]["kind"] == "tpm" and "TPM" in status["dpop"]["summary"], status["dpop"]
        refreshed = token("--force-refresh")
        assert glewlwyd.access_token_jkt(refreshed["access_token"]) == attributes["jkt"], "the TPM signed the refresh"

        # The TPM cleared (a new storage hierarchy): its old keys load no more.
        daemon.stop()
        tpm.stop()
        tpm.start()
        daemon.start()
        refused = run_cli("token", "--provider", NAME, "--force-refresh")
        assert refused.returncode == 4 and "this machine's key changed" in refused.stderr, refused.stderr
        assert [a["username"] for a in json.loads(run_cli("accounts", "--json", check_rc=0).stdout)] == ["alice"]
        assert run_cli("login", "--provider", NAME, timeout=120).returncode == 0
        again = token("--force-refresh")
        assert again["token_type"] == "DPoP"
        [(attributes, key)] = stored(keyring, "dpop_key")
        assert key["kind"] == "tpm" and glewlwyd.access_token_jkt(again["access_token"]) == attributes["jkt"]
    finally:
        tpm.stop()


def test_the_file_store_and_its_key_copied_to_another_machine_are_worthless_there(write_config, glewlwyd, tmp_path):
    """A machine without a session bus keeps its accounts in the file store; its tokens are bound
    to a key in its TPM (swtpm here). The store and the key that seals it are copied to a second
    machine with a TPM of its own: there the account is named, but its refresh token cannot be
    used (the key is the first TPM's: "needs sign-in: this machine's key changed"), and the refresh
    token read out of the copy is refused by glewlwyd from any other key. The first machine keeps
    working."""
    import shutil

    from tessera_file_store import FileStoreView
    from test_no_session_bus import Bare

    config = dpop_config(write_config, glewlwyd, mode="required", store="file")
    machines = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        tpm = SoftwareTPM(str(tmp_path / name))
        tpm.start()
        machine = Bare(tmp_path / name, config, browser=type("NoBrowser", (), {"path": ""})())
        machine.env["TESSERA_TPM_TCTI"] = tpm.tcti
        machines.append((machine, tpm))
    (first, first_tpm), (second, second_tpm) = machines
    try:
        first.start()
        assert first.cli("login", "--provider", NAME, timeout=120).returncode == 0
        assert json.loads(first.ok("token", "--provider", NAME, "--json"))["token_type"] == "DPoP"
        first.stop()

        # The copy: the sealed records and the key that opens them, as a backup holds them.
        shutil.copytree(tmp_path / "first" / "state" / "tessera", tmp_path / "second" / "state" / "tessera")
        (tmp_path / "second" / "config" / "tessera").mkdir(parents=True)
        shutil.copy2(tmp_path / "first" / "config" / "tessera" / "store.key",
                     tmp_path / "second" / "config" / "tessera" / "store.key")
        view = FileStoreView(tmp_path / "second" / "state" / "tessera" / "store",
                             tmp_path / "second" / "config" / "tessera" / "store.key")
        records = {attributes["kind"]: json.loads(secret) for _, attributes, _, secret in view.records()}
        assert records["dpop_key"]["kind"] == "tpm", "the key itself is in the first TPM: only its wrapped copy here"
        stolen = records["refresh_token"]["secret"]

        second.start()
        assert [a["username"] for a in json.loads(second.ok("accounts", "--json"))] == ["alice"]
        refused = second.cli("token", "--provider", NAME, "--force-refresh")
        assert refused.returncode == 4 and "this machine's key changed" in refused.stderr, refused.stderr
        second.stop()
        elsewhere = glewlwyd.oidc_redeem(stolen, DPoPKey())
        assert elsewhere.status_code in (400, 403) and elsewhere.json().get("error") == "invalid_dpop_proof", \
            elsewhere.text

        first.start()
        assert json.loads(first.ok("token", "--provider", NAME, "--force-refresh", "--json"))["token_type"] == "DPoP"
    finally:
        for machine, tpm in machines:
            machine.stop()
            tpm.stop()
