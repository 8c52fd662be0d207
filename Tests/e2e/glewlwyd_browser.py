#!/usr/bin/env python3
"""Headless stand-in for the user's web browser at glewlwyd (Tests/e2e/glewlwyd.py).

Usage: glewlwyd_browser.py STATE URL   (tesserad's `browser` command: the URL is the last argument,
                                        Tessera's loopback start URL, which answers 303 with the
                                        authorization URL, or an authorization URL)

glewlwyd's login page is a JavaScript app; this does what the user does in it, with its REST
calls: signs in (POST /api/auth/ with username and password, keeping the session cookie), grants
the client the scopes it asks for (PUT /api/auth/grant/CLIENT), then GETs the authorization URL
with the cookie and follows redirects until glewlwyd sends the browser to the loopback redirect
URI (http://127.0.0.1:PORT/...), and GETs that URL, which hands the code to tesserad.

STATE is a JSON file the glewlwyd fixture writes: glewlwyd's URL, its CA, the users' passwords, and
a file where each authorization request's parameters are recorded (a JSON object a line; the
code_challenge and state values are left out) for the tests to check. The user is the login_hint
when it names a known user, else alice.
"""
import json
import sys
from urllib.parse import parse_qs, urljoin, urlsplit

import requests

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
RECORDED = ("client_id", "redirect_uri", "response_type", "scope", "code_challenge_method", "login_hint")


def log(msg):
    try:  # a detached spawn may have no usable stderr
        print(f"[glewlwyd_browser] {msg}", file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):
        pass


def is_loopback(url):
    parts = urlsplit(url)
    return parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS


class Browser:
    """A browser with glewlwyd's session cookie."""

    def __init__(self, url, ca):
        self.url = url.rstrip("/")
        self.s = requests.Session()
        self.s.trust_env = False  # no proxy or CA variables: everything here is 127.0.0.1
        self.s.verify = ca

    def sign_in(self, user, password):
        """The login page's password form."""
        r = self.s.post(f"{self.url}/api/auth/", json={"username": user, "password": password}, timeout=30)
        if r.status_code != 200:
            raise SystemExit(f"signing in as {user} failed: HTTP {r.status_code}")
        log(f"signed in as {user}")

    def grant(self, client_id, scope):
        """The consent page's "Grant" button: the client may have `scope` (space- or comma-separated)."""
        # glewlwyd reads the granted list space-separated ("openid,read" would be one unknown scope).
        scopes = " ".join(s for s in scope.replace(",", " ").split() if s)
        r = self.s.put(f"{self.url}/api/auth/grant/{client_id}", json={"scope": scopes}, timeout=30)
        if r.status_code != 200:
            raise SystemExit(f"granting {scopes} to {client_id} failed: HTTP {r.status_code} {r.text}")

    def authorize(self, url):
        """Follows the authorization URL's redirects to the loopback redirect URI and GETs it there.
        Returns the loopback URL (with the code)."""
        resp = self.s.get(url, allow_redirects=False, timeout=30)
        continued = False
        for _ in range(10):
            if not resp.is_redirect:
                raise SystemExit(f"glewlwyd answered HTTP {resp.status_code} at {urlsplit(resp.url).path}, no redirect")
            target = urljoin(resp.url, resp.headers["Location"])
            if is_loopback(target):
                log("delivering glewlwyd's answer to the loopback redirect URI")
                try:  # the app may answer with a page or close the connection: either is fine
                    self.s.get(target, timeout=30, allow_redirects=False)
                except requests.RequestException as e:
                    log(f"loopback GET ended with {type(e).__name__}")
                return target
            if urlsplit(target).path.endswith("/login.html"):
                # The JavaScript login page. The user is signed in and has granted the scopes, so
                # the page would send the browser back to the request with g_continue (which asks
                # glewlwyd to answer it); a second visit means the session is not enough.
                callback = parse_qs(urlsplit(target).query).get("callback_url", [""])[0]
                if continued or not callback:
                    raise SystemExit(f"glewlwyd sent the browser to its login page: {parse_qs(urlsplit(target).query)}")
                continued = True
                target = callback + ("&" if "?" in callback else "?") + "g_continue"
            resp = self.s.get(target, allow_redirects=False, timeout=30)
        raise SystemExit("too many redirects")

    def approve_device(self, instance, user_code):
        """The device page with the user code, continued: glewlwyd answers a redirect to its login
        page with prompt=deviceComplete once the device is approved."""
        r = self.s.get(f"{self.url}/api/{instance}/device", params={"code": user_code, "g_continue": ""},
                       allow_redirects=False, timeout=30)
        location = r.headers.get("Location", "")
        prompt = parse_qs(urlsplit(location).query).get("prompt", [""])[0]
        if r.status_code != 302 or prompt != "deviceComplete":
            raise SystemExit(f"glewlwyd did not approve the device code: HTTP {r.status_code}, prompt {prompt!r}")
        log("device code approved")


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: glewlwyd_browser.py STATE URL")
    with open(sys.argv[1]) as f:
        state = json.load(f)
    url = sys.argv[-1]
    browser = Browser(state["url"], state["ca"])
    if is_loopback(url):
        # Tessera's start URL: the listener sends the browser on to the authorization URL.
        start = browser.s.get(url, allow_redirects=False, timeout=30)
        if start.status_code != 303:
            sys.exit(f"the start URL answered HTTP {start.status_code}")
        url = start.headers["Location"]
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    with open(state["record"], "a") as f:
        f.write(json.dumps({"path": urlsplit(url).path, "has_code_challenge": "code_challenge" in query,
                            **{k: query[k] for k in RECORDED if k in query}}) + "\n")
    hint = query.get("login_hint", "").split("@", 1)[0]
    user = hint if hint in state["users"] else "alice"
    browser.sign_in(user, state["users"][user])
    browser.grant(query.get("client_id", ""), query.get("scope", state["scope"]))
    browser.authorize(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
