#!/usr/bin/env python3
"""End-to-end check of the test IdP and the headless browser. Run inside scripts/test-session
(needs the TESSERA_IDP_* variables), with the venv python:
    scripts/test-session bash -c '"$TESSERA_IDP_PYTHON" "$TESSERA_REPO/Tests/idp/selfcheck.py"'
"""
import base64
import hashlib
import http.server
import json
import os
import secrets
import shlex
import subprocess
import sys
import threading
import time
from urllib.parse import parse_qs, urlencode, urlsplit

import requests
from jwcrypto import jwk, jwt

AUTHORITY = os.environ["TESSERA_IDP_AUTHORITY"]
CA = os.environ["TESSERA_IDP_CA"]
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
passed = 0


def check(cond, what):
    global passed
    if not cond:
        sys.exit(f"FAIL: {what}")
    passed += 1
    print(f"ok   {what}", flush=True)


def get(url, **kw):
    return requests.get(url, verify=CA, timeout=10, **kw)


def post(url, data):
    return requests.post(url, data=data, verify=CA, timeout=10)


def idp_manage(*args):
    out = subprocess.run([f"{REPO}/scripts/idp", "manage", os.environ["TESSERA_IDP_DIR"], *args],
                         check=True, capture_output=True, text=True).stdout
    return out


class Loopback:
    """One-shot loopback redirect listener (what the broker runs) on 127.0.0.1:<ephemeral>."""

    def __init__(self, host="127.0.0.1"):
        self.result = None
        self.done = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.result = parse_qs(urlsplit(self.path).query)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"You can close this window.")
                outer.done.set()

            def log_message(self, *a):
                pass

        self.server = http.server.HTTPServer((host, 0), Handler)
        self.redirect_uri = f"http://{host}:{self.server.server_port}/"
        threading.Thread(target=self.server.handle_request, daemon=True).start()

    def wait(self, timeout=20):
        self.done.wait(timeout)
        self.server.server_close()
        return self.result


def browse(url, env=None):
    cmd = shlex.split(os.environ["TESSERA_TEST_BROWSER_CMD"]) + [url]
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, timeout=30).returncode


def authorize(conf, client_id, scope="openid profile offline_access read", extra=None, env=None,
              host="127.0.0.1"):
    """Authorization code + PKCE through browser.py; returns (loopback params, verifier, redirect)."""
    lb = Loopback(host)
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    params = {"client_id": client_id, "response_type": "code", "redirect_uri": lb.redirect_uri,
              "scope": scope, "state": secrets.token_urlsafe(8), "nonce": "n-123",
              "code_challenge": challenge, "code_challenge_method": "S256", **(extra or {})}
    rc = browse(conf["authorization_endpoint"] + "?" + urlencode(params), env)
    result = lb.wait()
    check(rc == 0 and result is not None, f"{client_id}: browser.py delivered to the loopback URI")
    check(result.get("state") == [params["state"]], f"{client_id}: state round-trips")
    return result, verifier, lb.redirect_uri


def redeem(conf, client_id, result, verifier, redirect_uri):
    r = post(conf["token_endpoint"], {"grant_type": "authorization_code", "code": result["code"][0],
                                      "redirect_uri": redirect_uri, "client_id": client_id,
                                      "code_verifier": verifier})
    check(r.status_code == 200, f"{client_id}: code redeemed (HTTP {r.status_code})")
    return r.json()


def verify_id_token(conf, raw, client_id):
    keys = jwk.JWKSet.from_json(get(conf["jwks_uri"]).text)
    claims = json.loads(jwt.JWT(jwt=raw, key=keys, algs=["RS256"]).claims)
    check(claims["iss"] == AUTHORITY and claims["aud"] == client_id, f"{client_id}: id_token iss/aud")
    check(all(k in claims for k in ("sub", "iat", "exp")), f"{client_id}: id_token sub/iat/exp")
    return claims


def main():
    t0 = time.time()
    # Discovery at both spots, issuer == authority.
    confs = [get(AUTHORITY + p).json() for p in ("/.well-known/openid-configuration",
                                                   "/v2.0/.well-known/openid-configuration")]
    conf = confs[0]
    check(all(c["issuer"] == AUTHORITY for c in confs), "discovery (both paths): issuer == authority")
    check(all(k in conf for k in ("device_authorization_endpoint", "revocation_endpoint", "jwks_uri")),
          "discovery lists device and revocation endpoints")

    # Authorization code + PKCE, id_token signature and claims.
    result, verifier, redirect = authorize(conf, "tessera-test")
    tok = redeem(conf, "tessera-test", result, verifier, redirect)
    check({"access_token", "refresh_token", "id_token"} <= tok.keys(), "tokens: access + refresh + id_token")
    check(tok["expires_in"] == 3600, "tessera-test: expires_in 3600")
    claims = verify_id_token(conf, tok["id_token"], "tessera-test")
    check(claims.get("preferred_username") == "alice" and claims.get("name") == "Alice Liddell"
          and claims.get("nonce") == "n-123", "id_token: preferred_username, name, nonce")
    ui = get(conf["userinfo_endpoint"], headers={"Authorization": "Bearer " + tok["access_token"]})
    check(ui.status_code == 200 and ui.json().get("preferred_username") == "alice", "userinfo answers")

    # Refresh with rotation and reuse protection.
    r = post(conf["token_endpoint"], {"grant_type": "refresh_token", "refresh_token": tok["refresh_token"],
                                      "client_id": "tessera-test"})
    check(r.status_code == 200, "refresh succeeds")
    tok2 = r.json()
    check(tok2["refresh_token"] != tok["refresh_token"], "refresh token rotated")
    check("id_token" in tok2, "refresh response carries an id_token")
    r = post(conf["token_endpoint"], {"grant_type": "refresh_token", "refresh_token": tok["refresh_token"],
                                      "client_id": "tessera-test"})
    check(r.status_code == 400 and r.json().get("error") == "invalid_grant", "replayed old refresh token: invalid_grant")

    # login_hint picks bob; revoke bob's refresh token (RFC 7009, public client).
    result, verifier, redirect = authorize(conf, "tessera-other", extra={"login_hint": "bob@example.test"})
    tok = redeem(conf, "tessera-other", result, verifier, redirect)
    check(verify_id_token(conf, tok["id_token"], "tessera-other")["preferred_username"] == "bob",
          "login_hint=bob@example.test signs in bob")
    r = post(conf["revocation_endpoint"], {"token": tok["refresh_token"], "token_type_hint": "refresh_token",
                                           "client_id": "tessera-other"})
    check(r.status_code == 200, "revocation endpoint answers 200")
    listing = json.loads(idp_manage("idp_tokens"))
    bob_rts = [t for t in listing["refresh_tokens"] if t["user"] == "bob" and t["client_id"] == "tessera-other"]
    check(bob_rts and all(t["revoked"] for t in bob_rts), "idp_tokens shows bob's refresh token revoked")
    r = post(conf["token_endpoint"], {"grant_type": "refresh_token", "refresh_token": tok["refresh_token"],
                                      "client_id": "tessera-other"})
    check(r.status_code == 400, "revoked refresh token is refused")

    # Short-lived access tokens: expires_in and DB expiry agree.
    result, verifier, redirect = authorize(conf, "tessera-short")
    tok = redeem(conf, "tessera-short", result, verifier, redirect)
    check(tok["expires_in"] == 3, "tessera-short: expires_in 3")
    listing = json.loads(idp_manage("idp_tokens"))
    short = [t for t in listing["access_tokens"] if t["client_id"] == "tessera-short"][-1]
    check(abs(short["expires_at"] - time.time() - 3) < 3, "tessera-short: stored expiry ~3 s")

    # http://localhost:PORT/ is a loopback redirect URI too.
    result, verifier, redirect = authorize(conf, "tessera-test", host="localhost")
    check(redirect.startswith("http://localhost:") and "code" in result, "localhost loopback redirect URI")

    # Consent screen: allow, then deny (mode read from $TESSERA_TEST_BROWSER_FILE).
    result, verifier, redirect = authorize(conf, "tessera-consent")
    check("code" in result, "tessera-consent: consent allowed gives a code")
    mode_file = os.path.join(os.environ["TESSERA_IDP_DIR"], "browser-mode")
    with open(mode_file, "w") as f:
        f.write("deny\n")
    result, _, _ = authorize(conf, "tessera-consent", env={"TESSERA_TEST_BROWSER_FILE": mode_file})
    os.unlink(mode_file)
    check(result.get("error") == ["access_denied"], "tessera-consent: deny gives error=access_denied")

    # prompt=none without a session.
    lb = Loopback()
    params = {"client_id": "tessera-test", "response_type": "code", "redirect_uri": lb.redirect_uri,
              "scope": "openid", "state": "s1", "prompt": "none",
              "code_challenge": "x" * 43, "code_challenge_method": "S256"}
    r = get(conf["authorization_endpoint"] + "?" + urlencode(params), allow_redirects=False)
    loc = r.headers.get("Location", "")
    q = parse_qs(urlsplit(loc).query)
    check(r.status_code == 302 and loc.startswith(lb.redirect_uri) and q.get("error") == ["login_required"]
          and q.get("state") == ["s1"], "prompt=none without session: redirect with error=login_required")
    lb.server.server_close()

    # prompt=none with a signed-in session: a code, silently.
    sys.dont_write_bytecode = True
    sys.path.insert(0, HERE)
    import webform

    s = webform.session()
    page = s.get(AUTHORITY + "/accounts/login/")
    webform.login(s, page, "alice")
    r = s.get(conf["authorization_endpoint"] + "?" + urlencode(params), allow_redirects=False)
    q = parse_qs(urlsplit(r.headers.get("Location", "")).query)
    check(r.status_code == 302 and "code" in q, "prompt=none with a session: code without any page")

    # Browser mode ignore: exits 0 at once and does nothing.
    check(browse("https://127.0.0.1:1/never", {"TESSERA_TEST_BROWSER": "ignore"}) == 0, "browser mode ignore")

    # Device flow.
    r = post(conf["device_authorization_endpoint"], {"client_id": "tessera-device",
                                                     "scope": "openid profile offline_access"})
    check(r.status_code == 200, "device authorization")
    dev = r.json()
    poll = {"grant_type": "urn:ietf:params:oauth:grant-type:device_code", "device_code": dev["device_code"],
            "client_id": "tessera-device"}
    r = post(conf["token_endpoint"], poll)
    check(r.status_code == 400 and r.json().get("error") == "authorization_pending", "device: pending before approval")
    rc = subprocess.run([sys.executable, os.path.join(HERE, "approve_device.py"), dev["user_code"], "--user", "bob"]).returncode
    check(rc == 0, "approve_device.py approves")
    r = post(conf["token_endpoint"], poll)
    tok = r.json()
    check(r.status_code == 200 and {"access_token", "refresh_token", "id_token"} <= tok.keys(),
          "device: token poll gives access + refresh + id_token")
    claims = verify_id_token(conf, tok["id_token"], "tessera-device")
    check(claims["preferred_username"] == "bob" and "nonce" not in claims, "device id_token: bob, no nonce")

    r = post(conf["token_endpoint"], {"grant_type": "refresh_token", "refresh_token": tok["refresh_token"],
                                      "client_id": "tessera-device"})
    check(r.status_code == 200 and "id_token" in r.json(), "device: refresh works and carries an id_token")
    tok = r.json()

    # Admin revocation of a user's sessions.
    out = idp_manage("idp_revoke_user", "bob")
    r = post(conf["token_endpoint"], {"grant_type": "refresh_token", "refresh_token": tok["refresh_token"],
                                      "client_id": "tessera-device"})
    check(r.status_code == 400, f"idp_revoke_user: refresh refused ({out.strip()})")

    # Request log.
    with open(os.environ["TESSERA_IDP_LOG"]) as f:
        lines = [json.loads(line) for line in f]
    grants = {l["grant_type"] for l in lines if l["grant_type"]}
    check(len(lines) > 10 and {"authorization_code", "refresh_token"} <= grants, f"request log: {len(lines)} lines")
    text = open(os.environ["TESSERA_IDP_LOG"]).read()
    check(tok["refresh_token"] not in text and "alice-pw" not in text, "request log holds no secrets")
    print(f"{passed} passed, 0 failed  ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
