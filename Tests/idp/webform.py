"""Tiny helpers for scripting the IdP's HTML pages with requests (used by browser.py and
approve_device.py). Prints progress to stderr only; never prints codes or tokens."""
import os
import sys
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import requests

USERS = {"alice": "alice-pw", "bob": "bob-pw"}


def log(msg):
    try:  # a detached spawn may have no usable stderr
        print(f"[{os.path.basename(sys.argv[0])}] {msg}", file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):
        pass


def ca_file():
    """$TESSERA_IDP_CA, else ca_file from Tessera's config.toml (the test session writes it),
    else $REQUESTS_CA_BUNDLE."""
    if os.environ.get("TESSERA_IDP_CA"):
        return os.environ["TESSERA_IDP_CA"]
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    try:
        import tomllib

        with open(os.path.join(config_home, "tessera", "config.toml"), "rb") as f:
            ca = tomllib.load(f).get("ca_file")
        if ca:
            return ca
    except (OSError, ValueError, ImportError):
        pass
    return os.environ.get("REQUESTS_CA_BUNDLE")


def session():
    s = requests.Session()
    # Ignore proxy/CA variables from the environment (requests would let REQUESTS_CA_BUNDLE
    # override s.verify); everything here talks to 127.0.0.1.
    s.trust_env = False
    ca = ca_file()
    if ca:
        s.verify = ca
    return s


class _FormParser(HTMLParser):
    """Collects each <form>: action, method, and its named inputs/buttons."""

    def __init__(self):
        super().__init__()
        self.forms = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.forms.append({"action": a.get("action"), "method": (a.get("method") or "get").lower(),
                               "fields": {}, "buttons": []})
        elif self.forms and tag in ("input", "button") and a.get("name"):
            form = self.forms[-1]
            kind = (a.get("type") or ("submit" if tag == "button" else "text")).lower()
            if kind == "submit":
                form["buttons"].append((a["name"], a.get("value", "")))
            elif kind != "checkbox" or "checked" in a:
                form["fields"][a["name"]] = a.get("value") or ""


def forms(html):
    p = _FormParser()
    p.feed(html)
    return p.forms


def submit(s, page, form, extra=None, allow_redirects=False):
    """POST form (from page) with its fields plus extra; Referer set for Django's CSRF check."""
    data = dict(form["fields"])
    data.update(extra or {})
    action = urljoin(page.url, form["action"] or page.url)
    return s.post(action, data=data, headers={"Referer": page.url}, allow_redirects=allow_redirects)


def is_login_page(resp):
    return "/accounts/login/" in urlsplit(resp.url).path


def login(s, page, user):
    """page is the login page response; posts the credentials and returns the response (no redirects)."""
    form = next(f for f in forms(page.text) if "password" in f["fields"])
    log(f"signing in as {user}")
    resp = submit(s, page, form, {"username": user, "password": USERS[user]})
    if resp.status_code != 302:
        raise SystemExit(f"login as {user} failed (HTTP {resp.status_code})")
    return resp


def pick_user(hint=None):
    """login_hint's local part if it names a known user, else $TESSERA_TEST_USER, else alice."""
    if hint:
        local = hint.split("@", 1)[0].lower()
        if local in USERS:
            return local
    env = os.environ.get("TESSERA_TEST_USER", "")
    return env if env in USERS else "alice"
