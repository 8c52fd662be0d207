"""D-Bus activation: a bus that knows only dbus/org.tessera.Broker1.service starts tesserad on the
first call; on that bus there is no Secret Service, so the broker answers StoreUnavailable (and
keeps running); when the bus goes away, tesserad exits."""
import os
import subprocess
import time

import dbus
import dbus.bus
import pytest

from conftest import BIN_DIR, BUS_NAME, ERROR_PREFIX, IFACE, OBJECT_PATH, REPO
from tessera_session import bus_config



@pytest.fixture
def private_bus(tmp_path):
    services = tmp_path / "services"
    services.mkdir()
    template = open(os.path.join(REPO, "dbus", "org.tessera.Broker1.service")).read()
    (services / "org.tessera.Broker1.service").write_text(template.replace("@bindir@", BIN_DIR))
    (tmp_path / "bus.conf").write_text(bus_config("session", tmp_path / "bus", services))
    bus = subprocess.Popen(
        ["dbus-daemon", f"--config-file={tmp_path}/bus.conf", "--nofork", "--print-address"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    address = bus.stdout.readline().strip()
    assert address, "dbus-daemon did not start"
    yield bus, address
    if bus.poll() is None:
        bus.terminate()
        bus.wait(10)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (nobody reaps in this sandbox) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_activation_starts_the_daemon_and_it_exits_with_the_bus(private_bus):
    bus, address = private_bus
    connection = dbus.bus.BusConnection(address)
    assert not connection.name_has_owner(BUS_NAME)

    version = connection.call_blocking(
        BUS_NAME, OBJECT_PATH, "org.freedesktop.DBus.Properties", "Get", "ss", (IFACE, "Version"), timeout=20)
    assert str(version) == "0.1.0"
    pid = int(connection.call_blocking(
        "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetConnectionUnixProcessID", "s",
        (BUS_NAME,)))
    assert os.readlink(f"/proc/{pid}/exe") == os.path.realpath(os.path.join(BIN_DIR, "tesserad"))

    # No Secret Service on this bus: a clear StoreUnavailable, and the daemon stays up.
    with pytest.raises(dbus.exceptions.DBusException) as info:
        connection.call_blocking(BUS_NAME, OBJECT_PATH, IFACE, "GetAccounts", "a{sv}", ({},), timeout=20)
    assert info.value.get_dbus_name() == ERROR_PREFIX + "StoreUnavailable"
    assert "Secret Service" in info.value.get_dbus_message()
    assert connection.name_has_owner(BUS_NAME)

    connection.close()
    bus.terminate()
    bus.wait(10)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid), "tesserad kept running after its bus went away"
