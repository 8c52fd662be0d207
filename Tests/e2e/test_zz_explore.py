import time
from conftest import Broker, expect_error
import dbus

def test_lock_after_load(daemon, broker, keyring):
    r = broker.sign_in()
    keyring.lock()
    t0=time.monotonic()
    try:
        print("silent cached:", broker.silent()["access_token"][:5], time.monotonic()-t0)
    except dbus.exceptions.DBusException as e:
        print("silent cached err", e.get_dbus_name(), e.get_dbus_message(), time.monotonic()-t0)
    t0=time.monotonic()
    try:
        x = broker.silent(force_refresh=True, call_timeout=15)
        print("force ok", time.monotonic()-t0)
    except dbus.exceptions.DBusException as e:
        print("force err", e.get_dbus_name(), e.get_dbus_message(), time.monotonic()-t0)
    t0=time.monotonic()
    try:
        print("accounts", len(broker.accounts()), time.monotonic()-t0)
    except dbus.exceptions.DBusException as e:
        print("acc err", e.get_dbus_name(), e.get_dbus_message(), time.monotonic()-t0)
    keyring.unlock()
    t0=time.monotonic()
    try:
        print("after unlock accounts", len(broker.accounts(call_timeout=5) if False else broker.accounts()), time.monotonic()-t0)
        print("after unlock force", broker.silent(force_refresh=True)["account"]["username"], time.monotonic()-t0)
    except dbus.exceptions.DBusException as e:
        print("after unlock err", e.get_dbus_name(), e.get_dbus_message(), time.monotonic()-t0)
    print([a.get("kind") for a in keyring.item_attributes()])
    print(open(daemon.log_path).read()[-3000:])
