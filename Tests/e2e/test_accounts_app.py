"""Tessera Accounts (Desktop/, issue 39), the desktop app, under Xvfb with the real tesserad,
keyring and test IdP, read through AT-SPI as a screen reader (or a person) would: by the accessible
names of its rows. It follows the broker live: an account signed in elsewhere appears, and one
whose refresh token the IdP revoked says it needs a sign-in, with no reload by hand.

scripts/test builds the app and names it in TESSERA_ACCOUNTS_APP; without that variable (a by-hand
run of one suite) these tests are skipped, and with it a missing binary fails them."""
import json
import os
import re
import subprocess

import pytest

import dbus

from conftest import AUTHORITY, TESSERA, Async, Broker, expect_error, run_cli, wait_until
from test_access import Sandbox, flatpak_possible

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
        # Kept as the README shows them (docs/screenshots): the window, without the empty screen.
        os.makedirs(keep, exist_ok=True)
        subprocess.run(["convert", str(path), "-trim", "+repage", os.path.join(keep, os.path.basename(path))],
                       check=True, timeout=60)


def app_env(display):
    env = dict(os.environ, DISPLAY=display, GSK_RENDERER="cairo")
    env.pop("GTK_A11Y", None)
    env.pop("NO_AT_BRIDGE", None)
    return env


@pytest.fixture
def launch_app(display, tmp_path):
    """launch_app() starts the app against the tesserad the test started; stopped at teardown."""
    assert os.access(APP, os.X_OK), f"{APP} is not built (cd Desktop && swift build)"
    started = []

    def launch(**env):
        log = open(tmp_path / "tessera-accounts.log", "w")
        proc = subprocess.Popen([APP], env=dict(app_env(display), **env), stdout=log, stderr=subprocess.STDOUT)
        started.append((proc, log))
        return proc

    yield launch
    for proc, log in started:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            log.close()
        assert proc.returncode in (0, -15), (tmp_path / "tessera-accounts.log").read_text()[-3000:]


@pytest.fixture
def app(daemon, launch_app):
    return launch_app()


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


def names():
    return [n["name"] for n in tree() or []]


def wait_for_name(predicate, what):
    """Waits until a node of the app's tree has a name for which predicate holds; that name."""
    found = []

    def check():
        found[:] = [n for n in names() if predicate(n)]
        return found
    try:
        wait_until(check, timeout=60, interval=0.3, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}; names: {names()}") from None
    return found[0]


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


def test_a_second_start_shows_the_first_window_instead_of_a_second_app(app, display):
    """A GApplication: starting it again (a second click on its icon) activates the running one."""
    wait_until(lambda: any(n["role"] == "frame" for n in tree() or []), what="the window")
    second = subprocess.run([APP], env=app_env(display), capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert app.poll() is None, "the first instance keeps running"
    assert [n["name"] for n in tree() if n["role"] == "frame"] == ["Tessera Accounts"]


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


def test_every_page_shows_the_broker_and_acts_on_it(start_daemon, write_config, launch_app, display, tmp_path,
                                                    monkeypatch):
    """The pages as a user goes through them, with an administrator's policy, two accounts, an app
    granted one of them, and a forward: each page shows what the broker says (and a screenshot of
    it is taken), an account's Revoke refuses that app its account and only that, Stop ends the
    forward, and Status says the broker is managed by the organisation."""
    system = tmp_path / "etc-tessera"
    system.mkdir()
    (system / "config.toml").write_text('access_mode = "strict"\n[policy]\nlocked = ["access_mode"]\n')
    os.chmod(system / "config.toml", 0o644)
    monkeypatch.setenv("TESSERA_SYSTEM_CONFIG_DIR", str(system))
    start_daemon(config=write_config(access_mode="strict"), extra_env={"TESSERA_SYSTEM_CONFIG_DIR": str(system)})
    broker = Broker()
    try:
        broker.sign_in("alice")
        bob = broker.sign_in("bob")["account"]["id"]
        # The tessera command is another app: refused until granted bob, then served.
        refused = run_cli("token", "--account", bob)
        assert refused.returncode == 12, refused.stderr
        key = re.search(r"--app '([^']+)'", refused.stderr).group(1)
        run_cli("access", "grant", "--app", key, "--client-id", "tessera-test", "--account", "bob", check_rc=0)
        run_cli("token", "--account", bob, check_rc=0)
        grants = json.loads(run_cli("access", "list", "--json", check_rc=0).stdout)
        display_name = next(g["app_display"] for g in grants if g["app"] == key)
        directory = tmp_path / "ctr"
        directory.mkdir(mode=0o700)
        run_cli("forward", "--socket", str(directory / "t.sock"), "--name", "devbox", timeout=30, check_rc=0)

        launch_app()
        wait_for_rows(lambda r: any(n.startswith("bob") for n in r) and any(n.startswith("alice") for n in r),
                      "both rows, though this app holds no grant (strict mode)")
        screenshot(display, tmp_path / "accounts.png")

        # bob's own page: the tessera command among its apps, with its last token; Revoke it.
        wait_until(lambda: press("Open bob's account"), what="bob's Open button")
        revoke = f"Revoke {display_name}'s access to bob"
        wait_for_name(lambda n: n == revoke, "the Revoke button of the tessera command on bob's page")
        wait_for_name(lambda n: n.startswith(display_name + ":") and "last token just now" in n,
                      "the tessera command's row saying when it last got a token")
        screenshot(display, tmp_path / "account.png")
        assert press(revoke)
        wait_until(lambda: run_cli("token", "--account", bob).returncode == 12, what="the tessera command refused")
        assert broker.silent(account_id=bob)["access_token"], "the app that signed in keeps bob"
        assert [g["app"] for g in json.loads(run_cli("access", "list", "--json").stdout) if g["app"] == key] == []
        assert press("Back to all accounts")

        assert press("Apps")
        wait_for_name(lambda n: n.startswith(display_name + ":") and "refused" in n,
                      "the tessera command on the Apps page, with its refusals")
        screenshot(display, tmp_path / "apps.png")

        assert press("Activity")
        wait_for_name(lambda n: n.startswith(f"{display_name}: token for bob:") and n.split(": ", 2)[2].startswith("Refused"),
                      "the refusal after the revoke in the activity")
        screenshot(display, tmp_path / "activity.png")

        assert press("Forwards")
        wait_for_name(lambda n: n.startswith("Forward devbox: to a container"), "the forward's row")
        screenshot(display, tmp_path / "forwards.png")
        assert press("Stop forward devbox")
        wait_until(lambda: json.loads(run_cli("forward", "--list", "--json", check_rc=0).stdout) == [],
                   what="the forward to end")
        wait_until(lambda: not any(n.startswith("Forward devbox") for n in names()), what="its row to go")

        assert press("Status")
        wait_for_name(lambda n: n == "Managed by your organisation", "the organisation's policy on the Status page")
        wait_for_name(lambda n: n.startswith("access_mode: Locked"), "the key it locks")
        wait_for_name(lambda n: n.startswith("Microsoft broker protocol: Served by Tessera"), "Microsoft's front")
        screenshot(display, tmp_path / "status.png")
    finally:
        broker.close()


def test_add_an_account_by_browser_then_by_device_code(start_daemon, write_config, launch_app, idp, display,
                                                      tmp_path):
    """Add account: the default provider in the browser (the scripted browser signs alice in),
    then bob at a provider config.toml names, with a code entered on another device: the code is
    shown (and named for a screen reader), and the dialog goes when the sign-in is done. Each new
    row appears with its state."""
    config = write_config()
    with open(config, "a") as f:
        # The test IdP allows one grant per client: the device code flow has a client of its own.
        f.write(f'\n[[provider]]\nname = "phone"\nissuer = "{AUTHORITY}"\nclient_id = "tessera-device"\n')
    start_daemon(config=config)
    launch_app()
    wait_until(lambda: press("Add an account"), what="the Add account button")
    wait_until(lambda: press("Sign in at the default provider with the browser"), what="the Add account dialog")
    wait_for_rows(lambda r: any(n.startswith("alice") and "signed in" in n for n in r), "alice's row")
    wait_for_name(lambda n: n == "Signed in as alice.", "the banner saying who signed in")

    assert press("Add an account")
    wait_until(lambda: press("Sign in at phone with a code"), what="the Add account dialog")
    code = wait_for_name(lambda n: n.startswith("Code: "), "the device code")[len("Code: "):]
    assert any(n == f"Copy the code {code}" for n in names())
    screenshot(display, tmp_path / "add-account.png")
    idp.approve_device(code, "--user", "bob")
    wait_for_rows(lambda r: any(n.startswith("bob") and "signed in" in n for n in r), "bob's row")
    wait_until(lambda: not any(n.startswith("Code: ") for n in names()), what="the code dialog to close")
    b = Broker()
    try:
        assert sorted(a["username"] for a in b.accounts()) == ["alice", "bob"]
    finally:
        b.close()


def start_answering(start_daemon, write_config, launch_app, mode):
    """tesserad in `mode` and the app, once it takes the broker's questions (RegisterPrompter)."""
    daemon = start_daemon(config=write_config(access_mode=mode))
    launch_app()
    wait_until(lambda: "Tessera Accounts asks the user's questions from now on" in daemon.log(),
               what="the app to take the broker's questions")
    return daemon


def cli_key(proc):
    match = re.search(r"--app '([^']+)'", proc.stderr)
    assert match, proc.stderr
    return match.group(1)


def cli_grants(key):
    return [g for g in json.loads(run_cli("access", "list", "--json", check_rc=0).stdout) if g["app"] == key]


def test_consent_is_asked_in_the_app_and_each_answer_does_what_it_says(start_daemon, write_config, launch_app,
                                                                       display, tmp_path):
    """access_mode = "confirm": another program (the tessera command) asks for alice's token, and the
    app asks the user, naming the program as the broker identified it, the account, the provider and
    what it would get. Allow once: the token, and no grant. Always allow: the token and a grant
    `tessera access list` shows. Deny: refused, and the log says the user refused."""
    start_answering(start_daemon, write_config, launch_app, "confirm")
    broker = Broker()
    try:
        broker.sign_in()
        heading = []

        def ask_and(answer):
            proc = subprocess.Popen([TESSERA, "token"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            heading[:] = [wait_for_name(lambda n: n.startswith("Allow ") and n.endswith(" to use alice?"),
                                        "the consent question")]
            if not os.path.exists(tmp_path / "consent.png"):
                screenshot(display, tmp_path / "consent.png")
            assert press(answer)
            out, err = proc.communicate(timeout=60)
            return proc.returncode, out, err

        rc, out, err = ask_and("Allow once")
        assert rc == 0 and out.strip(), err
        assert "(unverified)" in heading[0] and "/tessera" in heading[0], heading
        assert any("at 127.0.0.1" in n and "who you are" in n for n in names()) is False  # the dialog is gone
        key = "exe:" + heading[0][len("Allow "):-len(" to use alice?")].removesuffix(" (unverified)")
        assert [g for g in json.loads(run_cli("access", "list", "--json").stdout) if g["app"].startswith(key)] == []

        rc, out, err = ask_and("Always allow")
        assert rc == 0 and out.strip(), err
        granted = [g for g in json.loads(run_cli("access", "list", "--json").stdout) if g["app"].startswith(key)]
        assert [(g["account"], g["via"]) for g in granted] == [("alice", "user")], granted
        run_cli("access", "revoke", "--app", granted[0]["app"], check_rc=0)

        rc, out, err = ask_and("Deny")
        assert rc == 12 and out == "", err
        log = json.loads(run_cli("access", "log", "--json", check_rc=0).stdout)
        assert log[-1]["decision"] == "refused" and log[-1]["reason"] == "user", log[-1]
    finally:
        broker.close()


def consent_question_up(daemon, broker):
    """alice signed in by this test's Python; the tessera command then asks for her token, and the
    app shows the consent question. Returns the waiting command and the question's id (the
    journal has it: it is no secret)."""
    broker.sign_in()
    proc = subprocess.Popen([TESSERA, "token"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_name(lambda n: n.endswith(" to use alice?"), "the consent question")
    asked = re.search(r"question=(\S+) \[TesseraCore\] Asking the user through Tessera Accounts", daemon.log())
    assert asked, daemon.log()[-2000:]
    return proc, asked.group(1).strip('"')


def test_a_forged_answer_from_another_program_is_refused(start_daemon, write_config, launch_app, tmp_path):
    """While the app's consent question is up, another program on the bus that learnt its id (it is
    no secret: the journal has it) answers "Always allow": refused, and the question still waits.
    Then the user's own answer in the app counts."""
    daemon = start_answering(start_daemon, write_config, launch_app, "confirm")
    broker = Broker()
    try:
        proc, question = consent_question_up(daemon, broker)

        def answer(caller):
            caller.call("AnswerQuestion", "ssa{sv}", (question, "allow_always", dbus.Dictionary({}, signature="sv")))

        # Another program on the bus (this test's Python), with the right id.
        expect_error("AccessDenied", answer, broker)
        assert proc.poll() is None, "the question still waits for the user"
        assert names().count("Always allow") >= 1

        assert press("Deny")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 12, err
        assert all(g["via"] != "user" for g in json.loads(run_cli("access", "list", "--json").stdout))
    finally:
        broker.close()


@pytest.mark.skipif(not flatpak_possible(), reason="needs root, bwrap and a writable cgroup2 hierarchy (CI has them)")
def test_a_sandboxed_app_can_neither_answer_nor_take_the_questions(start_daemon, write_config, launch_app):
    """A Flatpak-style caller (the project's sandbox: a flatpak scope, bwrap, .flatpak-info) that
    learnt the question's id answers "Always allow": refused, and the question still waits; it may
    not take the questions for itself either. The user's own answer in the app then counts."""
    daemon = start_answering(start_daemon, write_config, launch_app, "confirm")
    broker = Broker()
    try:
        proc, question = consent_question_up(daemon, broker)
        box = Sandbox("org.example.Forger", "org.example.Forger")
        try:
            call = ["busctl", "--user", "call", "org.tessera.Broker1", "/org/tessera/Broker1", "org.tessera.Broker1"]
            forged = box.run(*call, "AnswerQuestion", "ssa{sv}", question, "allow_always", "0")
            # busctl prints the error's message: the broker's AccessDenied says who was refused.
            assert forged.returncode != 0 and "org.example.Forger (Flatpak) was not asked" in forged.stderr, forged
            squat = box.run(*call, "RegisterPrompter")
            assert squat.returncode != 0 and "org.example.Forger (Flatpak) runs in a sandbox" in squat.stderr, squat
        finally:
            box.close()
        assert proc.poll() is None, "the question still waits for the user"
        assert press("Allow once")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out.strip(), err
        assert all(g["via"] != "user" for g in json.loads(run_cli("access", "list", "--json").stdout))
    finally:
        broker.close()


def test_the_account_chooser_asks_once_and_remembers(start_daemon, write_config, launch_app, idp, display, tmp_path,
                                                    keyring):
    """Two accounts signed in and an app asks to sign in without naming one: the app shows both
    (the one it used last first), the user picks bob and keeps the choice; the app gets bob's token
    without a browser, and its next request gets bob without a question."""
    start_answering(start_daemon, write_config, launch_app, "open")
    broker = Broker()
    app_broker = Broker()
    try:
        broker.sign_in("alice")
        bob = broker.sign_in("bob")["account"]["id"]
        mark = idp.mark()
        asking = Async(app_broker.acquire, "tessera-test")
        wait_for_name(lambda n: n.startswith("Use bob for "), "the chooser's button for bob")
        # Both offered; bob, whom this app was granted last (it signed him in), first.
        uses = [n for n in names() if n.startswith("Use ") and " for " in n]
        assert [u.split(" ")[1] for u in uses] == ["bob", "alice"], uses
        screenshot(display, tmp_path / "chooser.png")
        assert press(next(n for n in names() if n.startswith("Always use bob for ")))
        assert asking.result()["account"]["id"] == bob
        assert not idp.token_posts(mark, grant_type="authorization_code"), "bob's refresh token answered: no browser"
        again = app_broker.acquire("tessera-test")
        assert again["account"]["id"] == bob
        assert not any(n.startswith("Use bob for ") for n in names()), "no second question"
        # Kept in the keyring, so it holds after a restart (the Secret Service once refused the
        # item for an attribute its schema did not name, and the choice lived in memory only).
        wait_until(lambda: any(a.get("kind") == "account_choice" for _, a in keyring.tessera_items()),
                   what="the kept choice in the keyring")
    finally:
        app_broker.close()
        broker.close()


def atspi(*args):
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "atspi_tree.py"), "tessera-accounts", *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def key(display, name):
    """Types a key as a keyboard would (XTest, through xdotool) into the window with the focus."""
    subprocess.run(["xdotool", "key", "--clearmodifiers", name], env=dict(os.environ, DISPLAY=display), check=True,
                   timeout=30)


def test_every_control_is_named_and_reached_with_the_keyboard(app, idp, display):
    """Accessibility: every button, tab and row has a name that says what it acts on, and a user
    with a keyboard alone Tabs to bob's Make current and presses Return: bob becomes current."""
    broker = Broker()
    try:
        broker.sign_in("alice")
        broker.sign_in("bob")
        wait_for_rows(lambda r: any(n.startswith("bob") for n in r) and any(n.startswith("alice") for n in r),
                      "both rows")
        controls = [n for n in tree() if n["role"] in ("push button", "toggle button", "page tab", "check box")
                    and "visible" in n["states"]]
        assert controls and all(n["name"].strip() for n in controls), [n for n in controls if not n["name"].strip()]
        assert all("focusable" in n["states"] for n in controls), [n for n in controls if "focusable" not in n["states"]]
        assert "Sign out bob" in [n["name"] for n in controls]

        target = "Make bob the current account"
        seen = []
        for _ in range(40):
            key(display, "Tab")
            now = wait_until(lambda: atspi("--focused"), timeout=10, what="a focused control")
            seen.append(now)
            if now == target:
                break
        assert seen[-1] == target, f"Tab never reached {target!r}: {seen}"
        key(display, "Return")
        wait_until(lambda: [a["username"] for a in broker.accounts() if a.get("current")] == ["bob"],
                   what="bob to become current from the keyboard")
        # The same on every other page (the Activity page's filters among them).
        for tab in ("Apps", "Activity", "Forwards", "Status"):
            assert press(tab)
            on_page = [n for n in tree() if n["role"] in ("push button", "toggle button", "page tab", "check box")
                       and "visible" in n["states"]]
            unnamed = [n for n in on_page if not n["name"].strip() or n["name"].startswith("Gtk")]
            assert not unnamed, (tab, unnamed)
    finally:
        broker.close()


def test_the_sign_in_notification_opens_the_app_at_the_account(app, idp, tmp_path):
    """bob's refresh token is revoked at the IdP: the notification that he needs a sign-in, clicked,
    opens Tessera Accounts at bob's own page (app.show-account over D-Bus) instead of a browser;
    its "Sign in" button still signs in."""
    from test_attention import NotificationServer
    notifications = NotificationServer(tmp_path)
    broker = Broker()
    try:
        broker.sign_in("alice")
        bob = broker.sign_in("bob")["account"]["id"]
        wait_for_rows(lambda r: any(n.startswith("bob") for n in r), "bob's row")
        idp.revoke_user("bob")
        expect_error("InteractionRequired", broker.silent, account_id=bob, force_refresh=True)
        shown = wait_until(lambda: notifications.calls("Notify"), what="the notification")
        mark = idp.mark()
        notifications.invoke(shown[0]["id"], "default")
        wait_for_name(lambda n: n == "Back to all accounts", "the account's own page")
        wait_for_name(lambda n: n.startswith("bob: needs sign-in"), "bob's page, saying he needs a sign-in")
        assert not idp.token_posts(mark, grant_type="authorization_code"), "no browser sign-in: the app opened"
    finally:
        broker.close()
        notifications.close()


def test_sign_out_in_the_browser_from_the_app_makes_the_next_sign_in_ask_for_the_password(
        start_daemon, write_config, launch_app, tmp_path):
    """The app's "Sign out here and in the browser": the account goes, the provider's sign-out page
    is opened with the account's id_token, and the next sign-in shows the login form again (the
    scripted browser keeps the IdP's cookies, as a real one does)."""
    daemon = start_daemon(write_config(), extra_env={"TESSERA_TEST_BROWSER_COOKIES": str(tmp_path / "cookies.txt")})
    launch_app()
    broker = Broker()
    try:
        def login_pages():
            return daemon.log().count("login page: the identity provider asks for a password")

        broker.sign_in("alice")
        assert login_pages() == 1
        wait_until(lambda: press("Sign out alice"), what="alice's Sign out button")
        wait_until(lambda: press("Sign out here and in the browser"), what="the sign-out question")
        wait_for_rows(lambda r: not any(n.startswith("alice") for n in r), "alice's row gone")
        wait_until(lambda: "signed out at the identity provider" in daemon.log(), what="the browser's sign-out")
        assert broker.sign_in("alice")["account"]["username"] == "alice"
        assert login_pages() == 2, "after the browser sign-out the IdP asks for the password again"
    finally:
        broker.close()


def test_the_activity_is_filtered_by_decision_from_the_keyboard(start_daemon, write_config, launch_app, display):
    """Activity: with an allowed and a refused request in the log, the decision filter (reached
    with Tab, opened and chosen with the keyboard) leaves only the refusals."""
    start_daemon(config=write_config(access_mode="strict"))
    launch_app()
    broker = Broker()
    try:
        broker.sign_in()
        broker.silent()  # allowed: the app that signed in
        assert run_cli("token").returncode == 12  # refused: another program
        wait_until(lambda: press("Activity"), what="the Activity tab")
        wait_for_name(lambda n: ": token for alice: Refused (strict)" in n, "the refusal in the activity")
        assert any(": token for alice: Allowed (grant)" in n for n in names())
        seen = []
        for _ in range(30):
            key(display, "Tab")
            now = wait_until(lambda: atspi("--focused"), timeout=10, what="a focused control")
            seen.append(now)
            if now == "Show decisions":
                break
        assert seen[-1] == "Show decisions", f"Tab never reached the decision filter: {seen}"
        for name in ("Return", "Down", "Down", "Return"):  # open, past "Allowed", to "Refused", choose
            key(display, name)
        wait_until(lambda: not any(": token for alice: Allowed" in n for n in names()),
                   what="the allowed records filtered out")
        assert any(": token for alice: Refused (strict)" in n for n in names())
    finally:
        broker.close()


def colour_pixels(path, colour):
    """How many pixels of the PNG at `path` are exactly `colour`."""
    out = subprocess.run(["convert", str(path), "-fill", "black", "+opaque", colour, "-fill", "white", "-opaque", colour,
                          "-format", "%[fx:round(mean*w*h)]", "info:"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return int(out)


def test_apps_show_the_icons_their_packaging_installed(daemon, launch_app, display, tmp_path):
    """The Apps page draws each app's own icon, found as the desktop finds it: a snap's by the
    desktop file snapd writes (named SNAP_APP.desktop, its Icon a path into the snap), a Flatpak's
    by its id in the icon theme. Two solid-colour icons, and the screenshot holds both colours."""
    share = tmp_path / "share"
    (share / "applications").mkdir(parents=True)
    snap_icon = tmp_path / "snap" / "paint" / "7" / "meta" / "gui" / "icon.png"
    snap_icon.parent.mkdir(parents=True)
    subprocess.run(["convert", "-size", "64x64", "xc:#ff00ff", str(snap_icon)], check=True, timeout=60)
    (share / "applications" / "paint_paint.desktop").write_text(
        f"[Desktop Entry]\nType=Application\nName=Paint\nExec=paint\nIcon={snap_icon}\n")
    themed = share / "icons" / "hicolor" / "64x64" / "apps"
    themed.mkdir(parents=True)
    subprocess.run(["convert", "-size", "64x64", "xc:#00ffff", str(themed / "org.example.Viewer.png")], check=True,
                   timeout=60)
    broker = Broker()
    try:
        broker.sign_in("alice")
        for key in ("snap:paint.paint", "flatpak:org.example.Viewer"):
            run_cli("access", "grant", "--app", key, "--client-id", "tessera-test", "--account", "alice", check_rc=0)
    finally:
        broker.close()

    data_dirs = f"{share}:{os.environ.get('XDG_DATA_DIRS') or '/usr/local/share:/usr/share'}"
    launch_app(XDG_DATA_DIRS=data_dirs)
    wait_until(lambda: press("Apps"), what="the Apps page's tab")
    wait_for_name(lambda n: "snap:paint.paint" in n, "the snap's row")
    wait_for_name(lambda n: "flatpak:org.example.Viewer" in n, "the Flatpak's row")
    shot = tmp_path / "apps-icons.png"
    found = {}

    def both_drawn():
        screenshot(display, shot)
        found.update(snap=colour_pixels(shot, "#ff00ff"), flatpak=colour_pixels(shot, "#00ffff"))
        # Drawn at 32 px: about a thousand pixels each.
        return found["snap"] >= 500 and found["flatpak"] >= 500
    try:
        wait_until(both_drawn, timeout=30, interval=0.5, what="both icons drawn")
    except AssertionError as e:
        raise AssertionError(f"{e}: pixels of each colour {found}; the screen is {shot}") from None
