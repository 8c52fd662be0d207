#!/usr/bin/env python3
"""Play the user on another device for the device-code flow (RFC 8628).

Usage: approve_device.py USER_CODE [--user alice|bob] [--deny] [--url VERIFICATION_URI]

Signs in at the test IdP, enters USER_CODE on the verification page and presses Accept (or
Deny). The verification page defaults to $TESSERA_IDP_AUTHORITY/o/device/. Exit 0 on success.
"""
import argparse
import os
import sys
from urllib.parse import urljoin

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from webform import USERS, forms, is_login_page, log, login, pick_user, session, submit  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("user_code")
    ap.add_argument("--user", choices=sorted(USERS), default=None)
    ap.add_argument("--deny", action="store_true")
    ap.add_argument("--url", default=None, help="verification URI (default: from $TESSERA_IDP_AUTHORITY)")
    args = ap.parse_args()
    url = args.url or os.environ["TESSERA_IDP_AUTHORITY"] + "/o/device/"
    user = args.user or pick_user()

    s = session()
    page = s.get(url)  # redirects to the login page first
    if is_login_page(page):
        resp = login(s, page, user)
        page = s.get(urljoin(page.url, resp.headers["Location"]))
    # Enter the user code.
    form = next(f for f in forms(page.text) if "user_code" in f["fields"])
    resp = submit(s, page, form, {"user_code": args.user_code})
    if resp.status_code != 302:
        log(f"user code rejected (HTTP {resp.status_code})")
        return 1
    # Accept or deny the device.
    page = s.get(urljoin(resp.url, resp.headers["Location"]))
    form = forms(page.text)[0] if page.status_code == 200 and forms(page.text) else None
    if not form:
        log(f"no confirmation page (HTTP {page.status_code})")
        return 1
    action = "deny" if args.deny else "accept"
    resp = submit(s, page, form, {"action": action}, allow_redirects=True)
    if resp.status_code != 200:
        log(f"{action} failed (HTTP {resp.status_code})")
        return 1
    log(f"device {'denied' if args.deny else 'approved'} by {user}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
