"""Device code flow (RFC 8628): through the CLI, and over D-Bus."""
import queue
import re
import subprocess
import threading

from conftest import TESSERA, Async, Broker, run_cli, wait_until

# A user code as the IdP makes them: upper-case letters and digits, maybe with a dash.
CODE_RE = re.compile(r"\b(?=[A-Z0-9-]*[A-Z])[A-Z0-9]{4,}(?:-[A-Z0-9]{4,})?\b")


def test_device_code_login_with_the_cli(daemon, idp):
    since = idp.last_device_grant()
    proc = subprocess.Popen(
        [TESSERA, "login", "--device-code", "--client-id", "tessera-device", "--timeout", "60"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        user_code = None
        shown = ""
        while user_code is None:
            line = lines.get(timeout=20)
            shown += line
            codes = [c for c in CODE_RE.findall(line) if c in idp.pending_user_codes(since)]
            if codes:
                user_code = codes[0]
        assert "https://" in shown, f"the CLI should show where to enter the code: {shown!r}"
        idp.approve_device(user_code)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, shown
    assert "alice" in out

    token = run_cli("token", "--client-id", "tessera-device", check_rc=0)
    assert len(token.stdout.splitlines()) == 1 and len(token.stdout.strip()) >= 20


def test_device_code_over_dbus_and_interaction_pending_is_unicast(broker, monitor, idp):
    since = idp.last_device_grant()
    caller = Broker()
    try:
        call = Async(caller.acquire, "tessera-device", flow="device_code", timeout=60)
        found = monitor.wait_for(lambda s: s["member"] == "InteractionPending", timeout=20)
        assert found, "no InteractionPending signal"
        codes = wait_until(lambda: idp.pending_user_codes(since), what="a pending device code")
        assert len(codes) == 1
        idp.approve_device(codes.pop(), "--user", "bob")
        result = call.result(60)
    finally:
        caller.close()
    assert result["account"]["username"] == "bob"
    assert result["access_token"] and result["id_token"]
    monitor.sync()
    # Sent to the caller's unique name only: never broadcast, never to the other connection.
    assert [s["destination"] for s in monitor.signals("InteractionPending")] == [caller.unique_name]
    assert caller.unique_name != broker.unique_name
    assert broker.silent("tessera-device")["access_token"] == result["access_token"]
