"""Tessera Accounts (Desktop/, issue 39), the desktop app, under Xvfb with the real tesserad,
keyring and test IdP, read through AT-SPI as a screen reader (or a person) would: by the accessible
names of its rows. It follows the broker live: an account signed in elsewhere appears, and one
whose refresh token the IdP revoked says it needs a sign-in, with no reload by hand.

scripts/test builds the app and names it in TESSERA_ACCOUNTS_APP; without that variable (a by-hand
run of one suite) these tests are skipped, and with it a missing binary fails them."""
import json
import os
import shutil
import subprocess

import pytest

from conftest import Broker, expect_error, wait_until

APP = os.environ.get("TESSERA_ACCOUNTS_APP")
HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.skipif(not APP, reason="TESSERA_ACCOUNTS_APP not set: scripts/test builds the app")


@pytest.fixture
def display():
    """A private X server; its display name."""
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", "1", "-screen", "0", "1024x768x24", "-nolisten", "tcp"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    number = xvfb.stdout.readline().strip()
    assert number.isdigit(), "Xvfb did not start"
    yield ":" + number
    xvfb.terminate()
    xvfb.wait(timeout=30)


def screenshot(display, path):
    """The screen as a PNG at `path`, checked not to be blank (one colour)."""
    subprocess.run(["import", "-display", display, "-window", "root", str(path)], check=True, timeout=60)
    spread = subprocess.run(["convert", str(path), "-format", "%[fx:standard_deviation]", "info:"],
                            capture_output=True, text=True, check=True, timeout=60).stdout
    assert float(spread) > 0.01, f"{path} is blank"
    keep = os.environ.get("TESSERA_SCREENSHOTS")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(path, os.path.join(keep, os.path.basename(path)))


@pytest.fixture
def app(display, daemon, tmp_path):
    assert os.access(APP, os.X_OK), f"{APP} is not built (cd Desktop && swift build)"
    env = dict(os.environ, DISPLAY=display, GSK_RENDERER="cairo")
    env.pop("GTK_A11Y", None)
    env.pop("NO_AT_BRIDGE", None)
    log = open(tmp_path / "tessera-accounts.log", "w")
    proc = subprocess.Popen([APP], env=env, stdout=log, stderr=subprocess.STDOUT)
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=30)
    finally:
        log.close()
    assert proc.returncode in (0, -15), (tmp_path / "tessera-accounts.log").read_text()[-3000:]


def tree():
    """The app's accessibility tree (None before it is on the accessibility bus)."""
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "atspi_tree.py"), "tessera-accounts"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def press(name):
    """Presses the app's control with this accessible name; False when there is none yet."""
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "atspi_tree.py"), "tessera-accounts", "--press", name],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) is True


def rows():
    """The accessible names of the account rows, in the order shown."""
    nodes = tree() or []
    return [n["name"] for n in nodes if " at " in n["name"] and n["role"] in ("list item", "row", "push button")]


def wait_for_rows(predicate, what):
    seen = []

    def check():
        seen[:] = rows()
        return predicate(seen)
    try:
        wait_until(check, timeout=60, interval=0.3, what=what)
    except AssertionError as e:
        labels = [n["name"] for n in (tree() or []) if n["role"] == "label"]
        raise AssertionError(f"{e}; rows: {seen}; labels: {labels}") from None
    return seen


def test_the_accounts_page_follows_the_broker_live(app, idp, display, tmp_path):
    broker = Broker()
    alice = broker.sign_in("alice")["account"]["id"]
    shown = wait_for_rows(lambda r: any(n.startswith("alice") for n in r), "alice's row")
    assert any(n.startswith("alice") and ", signed in" in n for n in shown), shown

    # Signed in by another program: the row appears without a reload by hand (AccountsChanged).
    other = Broker()
    try:
        other.sign_in("bob")
    finally:
        other.close()
    wait_for_rows(lambda r: any(n.startswith("bob") for n in r), "bob's row")

    # The IdP revokes alice's refresh token: after one refresh she needs a sign-in, and comes first.
    idp.revoke_user("alice")
    expect_error("InteractionRequired", broker.silent, account_id=alice, force_refresh=True)
    shown = wait_for_rows(lambda r: r and r[0].startswith("alice") and "needs sign-in" in r[0],
                          "alice first, needing a sign-in")
    assert any(n.startswith("bob") and "signed in" in n for n in shown), shown
    screenshot(display, tmp_path / "accounts.png")
    broker.close()


def test_make_current_and_sign_out_from_the_app(app, idp):
    broker = Broker()
    try:
        broker.sign_in("alice")
        bob = broker.sign_in("bob")["account"]["id"]
        wait_for_rows(lambda r: any(n.startswith("bob") for n in r) and any(n.startswith("alice") for n in r),
                      "both rows")
        # Each control names the account it acts on: the Make current of bob's row, not alice's.
        wait_until(lambda: press("Make bob the current account"), what="bob's Make current button")
        wait_for_rows(lambda r: any(n.startswith("bob") and "current account" in n for n in r), "bob current")
        assert [a["username"] for a in broker.accounts() if a.get("current")] == ["bob"]

        # Sign out asks first; Cancel keeps the account.
        assert press("Sign out bob")
        wait_until(lambda: press("Cancel"), what="the sign-out question")
        assert [a["id"] for a in broker.accounts() if a["id"] == bob] == [bob]
        assert press("Sign out bob")
        wait_until(lambda: press("Sign out"), what="the sign-out question")
        wait_for_rows(lambda r: r and not any(n.startswith("bob") for n in r), "bob's row gone")
        assert [a["username"] for a in broker.accounts()] == ["alice"]
    finally:
        broker.close()
