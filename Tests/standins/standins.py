"""Stand-ins for the identity providers Tessera's built-in profiles name, answering as each one's
public documentation says, under the real host names (github.com, api.github.com,
accounts.google.com, oauth2.googleapis.com, bitbucket.org, api.bitbucket.org, gitlab.com,
codeberg.org, ...). scripts/msal-session's private network namespace resolves those names to
127.0.0.2, where one HTTPS server with a certificate from the session's test CA serves them all
on port 443, so the profiles are tested exactly as shipped: no endpoint of theirs is rewritten.

What each stand-in does, and the page it follows:

- GitHub (https://docs.github.com/en/apps/oauth-apps/building-oauth-apps/authorizing-oauth-apps,
  .../refreshing-user-access-tokens, https://docs.github.com/en/rest/users/users): the token
  endpoint answers form-encoded unless the request accepts JSON, and its errors come with HTTP 200;
  the code exchange needs the client secret, the device flow does not; `slow_down` adds 5 s to the
  interval; scopes come back comma-separated. An OAuth app's token has no `expires_in` and no
  refresh token; a GitHub App's (client ids starting "Iv") expires after 28800 s and has a
  refresh token for 15811200 s, rotated at each use. `GET https://api.github.com/user` names the
  user (`id`, `login`). git takes any username with the token as the password. There is no
  revocation endpoint.
- GitLab (https://docs.gitlab.com/ee/api/oauth2.html, .../integration/openid_connect_provider.html,
  https://docs.gitlab.com/ee/api/users.html): OpenID discovery at https://gitlab.com, the device
  flow at /oauth/authorize_device, tokens for 7200 s with a refresh token rotated at each use,
  an id_token with `openid`; `GET /api/v4/user` (`id`, `username`). git takes the username
  `oauth2`.
- Google (https://developers.google.com/identity/protocols/oauth2/native-app,
  .../oauth2/limited-input-device, https://accounts.google.com/.well-known/openid-configuration):
  a desktop client must send its secret with PKCE; the device flow answers `verification_url`;
  a refresh answers no new refresh token.
- Bitbucket Cloud (https://developer.atlassian.com/cloud/bitbucket/oauth-2/,
  https://developer.atlassian.com/cloud/bitbucket/rest/api-group-users/): the client id and secret
  as HTTP Basic only; the answer names its scopes in `scopes`, not `scope`; `GET
  https://api.bitbucket.org/2.0/user` (`uuid`, `nickname`). git takes the username `x-token-auth`.
- Codeberg (Forgejo: https://forgejo.org/docs/latest/user/oauth2-provider/): OpenID discovery at
  https://codeberg.org; `GET /api/v1/user` (`id`, `login`); git takes any username.

The user approves at once (the browser stand-in follows the redirect); a device code is approved
by the test calling `approve(user_code)`, as the user would on the verification page.
"""
import base64
import hashlib
import http.server
import json
import os
import secrets
import socketserver
import ssl
import subprocess
import threading
import time
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from resource_servers import git_http_backend, seeded_repository

LISTEN = ("127.0.0.2", 443)
HOSTS = [
    "github.com", "api.github.com", "gitlab.com", "accounts.google.com", "oauth2.googleapis.com",
    "openidconnect.googleapis.com", "www.googleapis.com", "bitbucket.org", "api.bitbucket.org", "codeberg.org",
]
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


class Answer:
    def __init__(self, status=200, body=b"", content_type="application/json", headers=()):
        self.status, self.body, self.content_type, self.headers = status, body, content_type, list(headers)


def as_json(value, status=200):
    return Answer(status, json.dumps(value).encode())


def redirect(url):
    return Answer(302, b"", "text/plain", [("Location", url)])


def is_loopback_redirect(uri):
    parts = urlsplit(uri or "")
    return parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1")


def s256(verifier):
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class Provider:
    """One identity provider: what it issued, and every request it saw (for the tests)."""

    name = "provider"
    user = ("octocat", 583231)
    expires_in = 3600
    rotates_refresh_tokens = True
    git_username = None  # None: any username

    def __init__(self):
        self.lock = threading.Lock()
        self.codes = {}
        self.devices = {}
        self.tokens = {}  # access token -> {user, scopes, expires (None: never), client}
        self.refresh_tokens = {}
        self.requests = []  # (method, host, path, fields, headers)
        self.revoked = []

    # -- what the tests look at --

    def saw(self, path, **fields):
        """Requests to `path` whose form fields include `fields`."""
        with self.lock:
            return [r for r in self.requests if r[2] == path and all(r[3].get(k) == v for k, v in fields.items())]

    def approve(self, user_code):
        with self.lock:
            for device in self.devices.values():
                if device["user_code"] == user_code:
                    device["approved"] = True
                    return
        raise AssertionError(f"{self.name}: no device code with user code {user_code}")

    def revoke_all(self, user=None):
        """The user revokes the app at the provider: every token stops working."""
        with self.lock:
            self.tokens.clear()
            self.refresh_tokens.clear()

    def valid(self, token):
        with self.lock:
            entry = self.tokens.get(token)
        if not entry or (entry["expires"] is not None and entry["expires"] < time.time()):
            return None
        return entry

    # -- issuing --

    def issue(self, client, scopes, user, with_refresh=True, nonce=None):
        access = f"{self.name[:3]}_{secrets.token_urlsafe(24)}"
        expires = None if self.expires_in is None else time.time() + self.expires_in
        with self.lock:
            self.tokens[access] = {"user": user, "scopes": scopes, "expires": expires, "client": client}
        answer = {"access_token": access, "token_type": "bearer", "scope": " ".join(scopes)}
        if self.expires_in is not None:
            answer["expires_in"] = self.expires_in
        if with_refresh:
            refresh = f"{self.name[:3]}r_{secrets.token_urlsafe(24)}"
            with self.lock:
                self.refresh_tokens[refresh] = {"user": user, "scopes": scopes, "client": client}
            answer["refresh_token"] = refresh
        return answer

    def authorize(self, query, login_user=None):
        redirect_uri = query.get("redirect_uri")
        if not is_loopback_redirect(redirect_uri):
            return Answer(400, b"redirect_uri must be a loopback http URL", "text/plain")
        code = secrets.token_urlsafe(16)
        with self.lock:
            self.codes[code] = {
                "client": query.get("client_id"), "redirect_uri": redirect_uri, "scopes": query.get("scope", "").split(),
                "challenge": query.get("code_challenge"), "nonce": query.get("nonce"), "user": self.user,
            }
        return redirect(f"{redirect_uri}{'&' if '?' in redirect_uri else '?'}{urlencode({'code': code, 'state': query.get('state', '')})}")

    def redeem_code(self, fields):
        with self.lock:
            grant = self.codes.pop(fields.get("code", ""), None)
        if not grant or grant["client"] != fields.get("client_id") or grant["redirect_uri"] != fields.get("redirect_uri"):
            return None, "bad_verification_code"
        if grant["challenge"] and s256(fields.get("code_verifier", "")) != grant["challenge"]:
            return None, "invalid_grant"
        return grant, None

    def start_device(self, fields, verification_key="verification_uri", verification=""):
        device_code = secrets.token_urlsafe(24)
        user_code = f"{secrets.randbelow(10000):04d}-{secrets.randbelow(10000):04d}"
        with self.lock:
            self.devices[device_code] = {
                "user_code": user_code, "client": fields.get("client_id"), "scopes": fields.get("scope", "").split(),
                "approved": False, "interval": 5, "last_poll": 0.0,
            }
        return {"device_code": device_code, "user_code": user_code, verification_key: verification,
                "expires_in": 900, "interval": 5}

    def poll_device(self, fields):
        """(device, error) for a device-code token request; slow_down when polled too fast."""
        with self.lock:
            device = self.devices.get(fields.get("device_code", ""))
            if not device:
                return None, "expired_token"
            now = time.monotonic()
            too_fast = now - device["last_poll"] < device["interval"] - 0.5
            device["last_poll"] = now
            if too_fast:
                device["interval"] += 5
                return device, "slow_down"
            if not device["approved"]:
                return device, "authorization_pending"
            del self.devices[fields["device_code"]]
            return device, None

    def redeem_refresh(self, fields):
        with self.lock:
            grant = self.refresh_tokens.get(fields.get("refresh_token", ""))
            if grant and self.rotates_refresh_tokens:
                del self.refresh_tokens[fields["refresh_token"]]
        if not grant or grant["client"] != fields.get("client_id", grant["client"]):
            return None
        return grant

    def git_user(self, handler):
        """The user a git request's Basic credentials stand for, or None (a 401)."""
        header = handler.headers.get("Authorization") or ""
        if not header.lower().startswith("basic "):
            return None
        username, _, password = base64.b64decode(header[6:]).decode().partition(":")
        if self.git_username is not None and username != self.git_username:
            return None
        entry = self.valid(password)
        return entry and entry["user"][0]


class OpenIDProvider(Provider):
    """A provider that signs id_tokens (RS256) with a key of its own, published at its jwks_uri."""

    issuer = ""
    jwks_path = ""

    def __init__(self):
        super().__init__()
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = secrets.token_hex(8)

    def jwks(self):
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        jwk.update({"kid": self.kid, "use": "sig", "alg": "RS256"})
        return {"keys": [jwk]}

    def id_token(self, client, user, nonce, extra=()):
        now = int(time.time())
        claims = {"iss": self.issuer, "aud": client, "sub": str(user[1]), "iat": now, "exp": now + 3600}
        if nonce:
            claims["nonce"] = nonce
        claims.update(dict(extra))
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})


# ------------------------------------------------------------------------------------------------


class GitHub(Provider):
    name = "github"
    user = ("octocat", 583231)
    secret = "gh-app-secret"

    def expiring(self, client):
        return (client or "").startswith("Iv")

    def token_answer(self, handler, value):
        if "application/json" in (handler.headers.get("Accept") or ""):
            return as_json(value)
        return Answer(200, urlencode(value).encode(), "application/x-www-form-urlencoded")

    def issue_for(self, client, scopes):
        self.expires_in = 28800 if self.expiring(client) else None
        answer = self.issue(client, scopes, self.user, with_refresh=self.expiring(client))
        answer["scope"] = ",".join(scopes)  # GitHub's separator
        if self.expiring(client):
            answer["refresh_token_expires_in"] = 15811200
        return answer

    def handle(self, handler, host, method, path, query, fields):
        if host == "api.github.com":
            if path == "/user":
                header = handler.headers.get("Authorization") or ""
                entry = self.valid(header.split(" ", 1)[1] if " " in header else "")
                if not entry:
                    return as_json({"message": "Bad credentials"}, 401)
                return as_json({"login": entry["user"][0], "id": entry["user"][1], "name": "The Octocat"})
            return as_json({"message": "Not Found"}, 404)
        if path == "/login/oauth/authorize" and method == "GET":
            return self.authorize(query)
        if path == "/login/device/code" and method == "POST":
            return self.token_answer(handler, self.start_device(fields, verification="https://github.com/login/device"))
        if path == "/login/oauth/access_token" and method == "POST":
            return self.token_answer(handler, self.exchange(fields))
        return None

    def exchange(self, fields):
        client = fields.get("client_id")
        if fields.get("grant_type") == DEVICE_GRANT:
            device, error = self.poll_device(fields)
            if error == "slow_down":
                return {"error": error, "error_description": "Too many requests.", "interval": device["interval"]}
            if error:
                return {"error": error}
            return self.issue_for(client, device["scopes"])
        if fields.get("client_secret") != self.secret:
            return {"error": "incorrect_client_credentials",
                    "error_description": "The client_id and/or client_secret passed are incorrect."}
        if fields.get("grant_type") == "refresh_token":
            grant = self.redeem_refresh(fields)
            if not grant:
                return {"error": "bad_refresh_token", "error_description": "The refresh token passed is incorrect or expired."}
            return self.issue_for(client, grant["scopes"])
        grant, error = self.redeem_code(fields)
        if error:
            return {"error": error, "error_description": "The code passed is incorrect or expired."}
        return self.issue_for(client, grant["scopes"])


class GitLab(OpenIDProvider):
    name = "gitlab"
    user = ("gitlab-alice", 4711)
    issuer = "https://gitlab.com"
    expires_in = 7200
    git_username = "oauth2"

    def discovery(self):
        base = self.issuer
        return {
            "issuer": base, "authorization_endpoint": f"{base}/oauth/authorize", "token_endpoint": f"{base}/oauth/token",
            "revocation_endpoint": f"{base}/oauth/revoke", "userinfo_endpoint": f"{base}/oauth/userinfo",
            "jwks_uri": f"{base}/oauth/discovery/keys", "device_authorization_endpoint": f"{base}/oauth/authorize_device",
            "scopes_supported": ["api", "read_api", "read_user", "read_repository", "write_repository", "openid",
                                 "profile", "email"],
            "response_types_supported": ["code"], "id_token_signing_alg_values_supported": ["RS256"],
            "subject_types_supported": ["public"],
        }

    def bearer(self, handler):
        header = handler.headers.get("Authorization") or ""
        return self.valid(header.split(" ", 1)[1] if " " in header else "")

    def handle(self, handler, host, method, path, query, fields):
        if path == "/.well-known/openid-configuration":
            return as_json(self.discovery())
        if path == "/oauth/discovery/keys":
            return as_json(self.jwks())
        if path == "/oauth/authorize" and method == "GET":
            return self.authorize(query)
        if path == "/oauth/authorize_device" and method == "POST":
            return as_json(self.start_device(fields, verification="https://gitlab.com/oauth/device"))
        if path == "/oauth/token" and method == "POST":
            return self.exchange(fields)
        if path == "/oauth/revoke" and method == "POST":
            with self.lock:
                self.revoked.append(fields.get("token"))
                self.refresh_tokens.pop(fields.get("token"), None)
                self.tokens.pop(fields.get("token"), None)
            return as_json({})
        if path == "/oauth/userinfo":
            entry = self.bearer(handler)
            if not entry or "openid" not in entry["scopes"]:
                return as_json({"error": "insufficient_scope"}, 403)
            return as_json({"sub": str(entry["user"][1]), "nickname": entry["user"][0],
                            "preferred_username": entry["user"][0]})
        if path == "/api/v4/user":
            entry = self.bearer(handler)
            if not entry:
                return as_json({"message": "401 Unauthorized"}, 401)
            return as_json({"id": entry["user"][1], "username": entry["user"][0], "name": "Alice"})
        return None

    def with_id_token(self, answer, client, scopes, nonce):
        answer["token_type"] = "Bearer"
        answer["created_at"] = int(time.time())
        if "openid" in scopes:
            answer["id_token"] = self.id_token(client, self.user, nonce, {"preferred_username": self.user[0]})
        return as_json(answer)

    def exchange(self, fields):
        client = fields.get("client_id")
        if fields.get("grant_type") == DEVICE_GRANT:
            device, error = self.poll_device(fields)
            if error:
                return as_json({"error": error, "error_description": error}, 400)
            return self.with_id_token(self.issue(client, device["scopes"], self.user), client, device["scopes"], None)
        if fields.get("grant_type") == "refresh_token":
            grant = self.redeem_refresh(fields)
            if not grant:
                return as_json({"error": "invalid_grant", "error_description": "The provided authorization grant is invalid"}, 400)
            return self.with_id_token(self.issue(client, grant["scopes"], self.user), client, grant["scopes"], None)
        grant, error = self.redeem_code(fields)
        if error:
            return as_json({"error": "invalid_grant", "error_description": error}, 400)
        return self.with_id_token(self.issue(client, grant["scopes"], self.user), client, grant["scopes"], grant["nonce"])


class Google(OpenIDProvider):
    name = "google"
    user = ("alice@gmail.example", 1098765432101234567890)
    issuer = "https://accounts.google.com"
    expires_in = 3599
    rotates_refresh_tokens = False
    secret = "GOCSPX-desktop-secret"

    def discovery(self):
        return {
            "issuer": self.issuer, "authorization_endpoint": "https://accounts.google.com/o/oauth2/v2/auth",
            "device_authorization_endpoint": "https://oauth2.googleapis.com/device/code",
            "token_endpoint": "https://oauth2.googleapis.com/token",
            "userinfo_endpoint": "https://openidconnect.googleapis.com/v1/userinfo",
            "revocation_endpoint": "https://oauth2.googleapis.com/revoke",
            "jwks_uri": "https://www.googleapis.com/oauth2/v3/certs",
            "response_types_supported": ["code", "token", "id_token"], "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "scopes_supported": ["openid", "email", "profile"],
            "code_challenge_methods_supported": ["plain", "S256"],
        }

    def handle(self, handler, host, method, path, query, fields):
        if host == "accounts.google.com" and path == "/.well-known/openid-configuration":
            return as_json(self.discovery())
        if host == "www.googleapis.com" and path == "/oauth2/v3/certs":
            return as_json(self.jwks())
        if host == "accounts.google.com" and path == "/o/oauth2/v2/auth":
            return self.authorize(query)
        if host == "oauth2.googleapis.com" and path == "/device/code" and method == "POST":
            return as_json(self.start_device(fields, "verification_url", "https://www.google.com/device"))
        if host == "oauth2.googleapis.com" and path == "/token" and method == "POST":
            return self.exchange(fields)
        if host == "oauth2.googleapis.com" and path == "/revoke" and method == "POST":
            with self.lock:
                self.revoked.append(fields.get("token"))
                self.refresh_tokens.pop(fields.get("token"), None)
            return as_json({})
        if host == "openidconnect.googleapis.com" and path == "/v1/userinfo":
            header = handler.headers.get("Authorization") or ""
            entry = self.valid(header.split(" ", 1)[1] if " " in header else "")
            if not entry:
                return as_json({"error": "invalid_request"}, 401)
            return as_json({"sub": str(entry["user"][1]), "email": entry["user"][0], "email_verified": True})
        return None

    def answer(self, answer, client, scopes, nonce):
        answer["token_type"] = "Bearer"
        if "openid" in scopes:
            answer["id_token"] = self.id_token(
                client, self.user, nonce, {"email": self.user[0], "email_verified": True, "azp": client})
        return as_json(answer)

    def exchange(self, fields):
        client = fields.get("client_id")
        # Desktop ("installed app") clients send their secret too (PKCE does not replace it here).
        if fields.get("client_secret") != self.secret:
            return as_json({"error": "invalid_client", "error_description": "Unauthorized"}, 401)
        if fields.get("grant_type") == DEVICE_GRANT:
            device, error = self.poll_device(fields)
            if error:
                status = 428 if error == "authorization_pending" else 403 if error == "slow_down" else 400
                return as_json({"error": error, "error_description": error}, status)
            return self.answer(self.issue(client, device["scopes"], self.user), client, device["scopes"], None)
        if fields.get("grant_type") == "refresh_token":
            grant = self.redeem_refresh(fields)
            if not grant:
                return as_json({"error": "invalid_grant", "error_description": "Token has been expired or revoked."}, 400)
            answer = self.issue(client, grant["scopes"], self.user, with_refresh=False)
            return self.answer(answer, client, grant["scopes"], None)
        grant, error = self.redeem_code(fields)
        if error:
            return as_json({"error": "invalid_grant", "error_description": "Bad Request"}, 400)
        return self.answer(self.issue(client, grant["scopes"], self.user), client, grant["scopes"], grant["nonce"])


class Bitbucket(Provider):
    name = "bitbucket"
    user = ("bb-alice", "{5c1a6ad0-0000-4000-8000-000000000042}")
    expires_in = 7200
    rotates_refresh_tokens = False
    git_username = "x-token-auth"
    key, secret = "bb-consumer-key", "bb-consumer-secret"

    def handle(self, handler, host, method, path, query, fields):
        if host == "api.bitbucket.org":
            if path == "/2.0/user":
                header = handler.headers.get("Authorization") or ""
                entry = self.valid(header.split(" ", 1)[1] if " " in header else "")
                if not entry:
                    return as_json({"type": "error", "error": {"message": "Access token expired."}}, 401)
                return as_json({"uuid": entry["user"][1], "nickname": entry["user"][0], "display_name": "Alice",
                                "account_id": "557058:0000", "type": "user"})
            return None
        if path == "/site/oauth2/authorize" and method == "GET":
            return self.authorize(query)
        if path == "/site/oauth2/access_token" and method == "POST":
            return self.exchange(handler, fields)
        return None

    def exchange(self, handler, fields):
        header = handler.headers.get("Authorization") or ""
        expected = "Basic " + base64.b64encode(f"{self.key}:{self.secret}".encode()).decode()
        if header != expected:
            return as_json({"error": "invalid_client", "error_description": "Client credentials missing"}, 401)
        fields = dict(fields, client_id=self.key)
        if fields.get("grant_type") == "refresh_token":
            grant = self.redeem_refresh(fields)
            if not grant:
                return as_json({"error": "invalid_grant", "error_description": "Invalid refresh_token"}, 400)
            scopes = grant["scopes"]
        else:
            grant, error = self.redeem_code(fields)
            if error:
                return as_json({"error": "invalid_grant", "error_description": error}, 400)
            scopes = grant["scopes"] or ["repository", "repository:write"]
        answer = self.issue(self.key, scopes, self.user)
        answer["scopes"] = answer.pop("scope")  # Bitbucket's name for it
        if fields.get("grant_type") == "refresh_token":
            answer["refresh_token"] = fields["refresh_token"]  # the same one, as Bitbucket answers
            with self.lock:
                self.refresh_tokens[fields["refresh_token"]] = grant
        return as_json(answer)


class Codeberg(OpenIDProvider):
    name = "codeberg"
    user = ("cb-alice", 90210)
    issuer = "https://codeberg.org"
    expires_in = 3600

    def handle(self, handler, host, method, path, query, fields):
        base = self.issuer
        if path == "/.well-known/openid-configuration":
            return as_json({
                "issuer": base, "authorization_endpoint": f"{base}/login/oauth/authorize",
                "token_endpoint": f"{base}/login/oauth/access_token", "jwks_uri": f"{base}/login/oauth/keys",
                "userinfo_endpoint": f"{base}/login/oauth/userinfo", "introspection_endpoint": f"{base}/login/oauth/introspect",
                "response_types_supported": ["code", "id_token"], "id_token_signing_alg_values_supported": ["RS256"],
                "subject_types_supported": ["public"], "scopes_supported": ["openid", "profile", "email", "groups"],
                "code_challenge_methods_supported": ["plain", "S256"],
            })
        if path == "/login/oauth/keys":
            return as_json(self.jwks())
        if path == "/login/oauth/authorize" and method == "GET":
            return self.authorize(query)
        if path == "/login/oauth/access_token" and method == "POST":
            client = fields.get("client_id")
            if fields.get("grant_type") == "refresh_token":
                grant = self.redeem_refresh(fields)
                if not grant:
                    return as_json({"error": "unauthorized_client", "error_description": "refresh token not found"}, 400)
                nonce, scopes = None, grant["scopes"]
            else:
                grant, error = self.redeem_code(fields)
                if error:
                    return as_json({"error": "unauthorized_client", "error_description": error}, 400)
                nonce, scopes = grant["nonce"], grant["scopes"]
            answer = self.issue(client, scopes, self.user)
            answer["token_type"] = "Bearer"
            if "openid" in scopes:
                answer["id_token"] = self.id_token(client, self.user, nonce, {"preferred_username": self.user[0]})
            return as_json(answer)
        if path in ("/login/oauth/userinfo", "/api/v1/user"):
            header = handler.headers.get("Authorization") or ""
            entry = self.valid(header.split(" ", 1)[1] if " " in header else "")
            if not entry:
                return as_json({"message": "invalid token"}, 401)
            if path == "/api/v1/user":
                return as_json({"id": entry["user"][1], "login": entry["user"][0], "full_name": "Alice"})
            return as_json({"sub": str(entry["user"][1]), "preferred_username": entry["user"][0], "name": "Alice"})
        return None


# ------------------------------------------------------------------------------------------------


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class StandIns:
    """Every stand-in behind one HTTPS server on 127.0.0.2:443, and git repositories on the git
    hosts (git http-backend), each refusing a request without a valid token of that provider in
    the host's username convention."""

    def __init__(self, directory, ca, ca_key):
        self.github, self.gitlab, self.google = GitHub(), GitLab(), Google()
        self.bitbucket, self.codeberg = Bitbucket(), Codeberg()
        self.by_host = {
            "github.com": self.github, "api.github.com": self.github, "gitlab.com": self.gitlab,
            "accounts.google.com": self.google, "oauth2.googleapis.com": self.google,
            "openidconnect.googleapis.com": self.google, "www.googleapis.com": self.google,
            "bitbucket.org": self.bitbucket, "api.bitbucket.org": self.bitbucket, "codeberg.org": self.codeberg,
        }
        self.git_root = os.path.join(directory, "git")
        self.git_requests = []  # (host, path, user or None)
        for host in ("github.com", "gitlab.com", "bitbucket.org", "codeberg.org"):
            repository = os.path.join(self.git_root, host, "team", "repo.git")
            os.makedirs(os.path.dirname(repository), exist_ok=True)
            seeded_repository(repository, repository + ".seed")
        cert, key = certificate(directory, ca, ca_key)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_any(self):
                host = (self.headers.get("Host") or "").split(":")[0].lower()
                provider = outer.by_host.get(host)
                split = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if provider and ".git/" in split.path and host in ("github.com", "gitlab.com", "bitbucket.org", "codeberg.org"):
                    return outer.git(self, host, provider, split, body)
                query = {k: v[0] for k, v in parse_qs(split.query).items()}
                fields = {k: v[0] for k, v in parse_qs(body.decode(errors="replace")).items()} if body else {}
                answer = provider and provider.handle(self, host, self.command, split.path, query, fields)
                if provider:
                    with provider.lock:
                        provider.requests.append((self.command, host, split.path, dict(fields, **query), dict(self.headers)))
                answer = answer or Answer(404, b"not found", "text/plain")
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                for name, value in answer.headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            do_GET = do_POST = handle_any

        self.httpd = _Server(LISTEN, Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def git(self, handler, host, provider, split, body):
        user = provider.git_user(handler)
        self.git_requests.append((host, split.path, user))
        if user is None:
            handler.send_response(401)
            handler.send_header("WWW-Authenticate", f'Basic realm="{host}"')
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        git_http_backend(handler, os.path.join(self.git_root, host), user, split.path, split.query, body)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def certificate(directory, ca, ca_key):
    """A certificate for every stand-in host, from the session's test CA."""
    os.makedirs(directory, exist_ok=True)
    cert, key, csr, ext = (os.path.join(directory, n) for n in ("standins.pem", "standins-key.pem", "standins.csr", "standins.ext"))
    with open(ext, "w") as f:
        f.write("subjectAltName=" + ",".join(f"DNS:{h}" for h in HOSTS) + "\nextendedKeyUsage=serverAuth\n")
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=github.com", "-keyout", key,
                    "-out", csr], check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-CAserial",
                    os.path.join(directory, "ca.srl"), "-days", "2", "-extfile", ext, "-out", cert],
                   check=True, capture_output=True)
    return cert, key
