"""`tessera status` and `tessera login` answer at once, with the specific cause, whatever the
keyring does (issue 22, point 4):

- inside a dbus-run-session started from a session with a keyring (GNOME_KEYRING_CONTROL
  inherited, as the CLI's own advice to run dbus-run-session leads to): D-Bus starts a keyring
  for the new bus that joins the outer session's keyring and never answers on this bus;
- with the keyring locked after tesserad read it: the sign-in says so before the browser opens,
  not after the user signed in."""
import json
import os
import subprocess
import time

import pytest

from conftest import BIN_DIR, REPO, TESSERA, run_cli

# Not a speed target (those are the benchmark's): the difference between answering and waiting
# for D-Bus's 25 s activation timeout.
ANSWERS_AT_ONCE = 5.0


@pytest.fixture
def nested_session(tmp_path):
    """A dbus-run-session command whose bus can start tesserad and (from Debian's own service
    files) a keyring, run with this session's environment (GNOME_KEYRING_CONTROL set)."""
    assert os.environ.get("GNOME_KEYRING_CONTROL"), "the test session exports its keyring's control directory"
    services = tmp_path / "services"
    services.mkdir()
    template = open(os.path.join(REPO, "dbus", "org.tessera.Broker1.service")).read()
    (services / "org.tessera.Broker1.service").write_text(template.replace("@bindir@", BIN_DIR))
    (tmp_path / "session.conf").write_text(f"""<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <include>/usr/share/dbus-1/session.conf</include>
  <servicedir>{services}</servicedir>
</busconfig>
""")
    return ["dbus-run-session", f"--config-file={tmp_path}/session.conf", "--"]


def timed(cmd, **kw):
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, **kw)
    return proc, time.monotonic() - started


def test_status_and_login_in_a_nested_session_answer_at_once_with_the_cause(nested_session, idp):
    # The first command activates tesserad on the new bus; each answers on its own.
    script = (f'"{TESSERA}" status; echo "status-rc=$?"; "{TESSERA}" status --json; echo "json-rc=$?"; '
              f'start=$(date +%s%N); "{TESSERA}" login --login-hint bob@example.test; '
              f'echo "login-rc=$? login-ms=$(( ($(date +%s%N) - start) / 1000000 ))"')
    mark = idp.mark()
    proc, elapsed = timed(nested_session + ["sh", "-c", script])
    out = proc.stdout
    assert "status-rc=11" in out, out + proc.stderr
    assert "keyring" in out and "GNOME_KEYRING_CONTROL" in out, out
    assert "env -u GNOME_KEYRING_CONTROL dbus-run-session" in out, "it says what to do"
    report = json.loads(out.split("status-rc=11\n", 1)[1].split("json-rc=", 1)[0])
    assert report["running"] is True and report["store"] == "unavailable" and report["needs_attention"] is True
    assert "login-rc=11" in out, out + proc.stderr
    assert "GNOME_KEYRING_CONTROL" in proc.stderr, proc.stderr
    login_ms = int(out.rsplit("login-ms=", 1)[1].split()[0])
    assert login_ms < ANSWERS_AT_ONCE * 1000, f"login took {login_ms} ms"
    assert elapsed < 3 * ANSWERS_AT_ONCE + 5, f"the three commands took {elapsed:.1f} s"
    assert not any("/authorize" in r["path"] for r in idp.requests(mark)), "no browser for a sign-in that cannot be kept"


def test_a_keyring_locked_since_the_start_stops_a_login_before_the_browser(broker, keyring, idp):
    broker.sign_in("alice")
    keyring.lock()
    try:
        mark = idp.mark()
        proc, elapsed = timed([TESSERA, "login", "--login-hint", "bob@example.test"])
        assert proc.returncode == 11, proc.stderr
        assert "locked" in proc.stderr, proc.stderr
        assert elapsed < ANSWERS_AT_ONCE
        assert not any("/authorize" in r["path"] for r in idp.requests(mark)), "the browser never opened"
        status = run_cli("status")
        assert status.returncode == 11 and "locked" in status.stdout, status.stdout
    finally:
        keyring.unlock()
    assert run_cli("status").returncode == 0
