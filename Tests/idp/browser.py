#!/usr/bin/env python3
"""Headless stand-in for the user's web browser, for Tessera's tests.

Usage: browser.py URL   (the URL is the last argument: Tessera's loopback start URL, which
                         answers 303 with the authorization URL or a sign-out page's URL, or an
                         authorization URL)

Signs in at the test IdP (user from login_hint, else $TESSERA_TEST_USER, else alice), answers a
consent page if one appears, follows redirects until the IdP sends the browser to the loopback
redirect URI (http://127.0.0.1:PORT/... or http://localhost:PORT/...), then GETs that URL, which
hands the code (or error) to the waiting app. A sign-out page (RP-Initiated Logout: a URL without
response_type) is confirmed, which ends the IdP's session, and logged as "signed out at the
identity provider".

$TESSERA_TEST_BROWSER_COOKIES: a file that keeps the IdP's cookies from one run to the next, as a
real browser does: a second sign-in then finds the IdP's session and shows no login page. Each
login page shown is logged as "login page: ...".

Mode: $TESSERA_TEST_BROWSER, or the first line of the file $TESSERA_TEST_BROWSER_FILE if set and
present (the file wins, so a test can switch modes while the daemon runs):
  allow (default)  approve consent;  deny  press Deny on consent (-> error=access_denied);
  ignore           do nothing and exit 0 (to test timeouts and cancel);
  hold             do nothing for 60 s (a browser that stays open, for reading its command line);
  print            sign in, then print the loopback URL with the code instead of opening it.
"""
import http.cookiejar
import os
import sys
import time
from urllib.parse import parse_qs, urljoin, urlsplit

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from webform import forms, is_login_page, log, login, pick_user, session, submit  # noqa: E402

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


def mode():
    path = os.environ.get("TESSERA_TEST_BROWSER_FILE")
    if path and os.path.exists(path):
        with open(path) as f:
            return (f.readline().strip() or "allow").lower()
    return os.environ.get("TESSERA_TEST_BROWSER", "allow").strip().lower() or "allow"


def is_loopback(url):
    parts = urlsplit(url)
    return parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS


def consent_form(resp):
    """DOT's consent form: the one with an "allow" submit button."""
    return next((f for f in forms(resp.text) if any(b[0] == "allow" for b in f["buttons"])), None)


def cookie_jar(s):
    """The IdP's cookies kept in $TESSERA_TEST_BROWSER_COOKIES (None: forgotten when this exits)."""
    path = os.environ.get("TESSERA_TEST_BROWSER_COOKIES")
    if not path:
        return None
    jar = http.cookiejar.LWPCookieJar(path)
    if os.path.exists(path):
        jar.load(ignore_discard=True, ignore_expires=True)
    s.cookies = jar
    return jar


def sign_out(s, url):
    """An RP-Initiated Logout page: confirm it when it asks. The IdP then ends its session and
    sends the browser on (to the client's post-logout page, or its own start page): not followed."""
    resp = s.get(url, allow_redirects=False)
    if resp.status_code == 200 and (form := consent_form(resp)):
        log("sign-out page: confirming")
        resp = submit(s, resp, form, {"allow": dict(form["buttons"])["allow"]})
    if resp.status_code >= 400:
        log(f"sign-out page answered HTTP {resp.status_code} at {urlsplit(resp.url).path}")
        return 1
    log("signed out at the identity provider")
    return 0


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: browser.py AUTHORIZATION_URL")
    url = sys.argv[-1]
    m = mode()
    if m == "ignore":
        log("mode ignore: doing nothing")
        return 0
    if m == "hold":
        log("mode hold: staying open")
        time.sleep(60)
        return 0
    s = session()
    jar = cookie_jar(s)
    try:
        return browse(s, url, m)
    finally:
        if jar is not None:
            jar.save(ignore_discard=True, ignore_expires=True)


def browse(s, url, m):
    if is_loopback(url):
        # Tessera's start URL: the listener sends the browser on to the authorization URL.
        start = s.get(url, allow_redirects=False, timeout=30)
        if start.status_code != 303:
            log(f"start URL answered HTTP {start.status_code}")
            return 1
        url = start.headers["Location"]
    if "response_type" not in parse_qs(urlsplit(url).query):
        return sign_out(s, url)
    user = pick_user(parse_qs(urlsplit(url).query).get("login_hint", [None])[0])
    resp = s.get(url, allow_redirects=False)
    for _ in range(20):
        if resp.is_redirect:
            target = urljoin(resp.url, resp.headers["Location"])
            if is_loopback(target):
                if m == "print":
                    print(target)  # for a test playing an attacker who delivers it elsewhere
                    return 0
                log("delivering the IdP's answer to the loopback redirect URI")
                # The app may answer with a page or close the connection: either is fine.
                try:
                    s.get(target, timeout=30, allow_redirects=False)
                except Exception as e:  # noqa: BLE001
                    log(f"loopback GET ended with {type(e).__name__}")
                return 0
            resp = s.get(target, allow_redirects=False)
        elif resp.status_code == 200 and is_login_page(resp):
            log("login page: the identity provider asks for a password")
            resp = login(s, resp, user)
        elif resp.status_code == 200 and (form := consent_form(resp)):
            if m == "deny":
                log("consent page: pressing Cancel (deny)")
                resp = submit(s, resp, form)  # no "allow" field == deny
            else:
                log("consent page: pressing Authorize")
                resp = submit(s, resp, form, {"allow": "Authorize"})
        else:
            log(f"unexpected page: HTTP {resp.status_code} at {urlsplit(resp.url).path}")
            return 1
    log("too many steps")
    return 1


if __name__ == "__main__":
    sys.exit(main())
