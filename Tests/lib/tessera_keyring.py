"""The session's keyring (gnome-keyring, through the Secret Service API on the session bus) as
Tessera's suites see it: Tessera's items, msalruntime's own cache (Tests/msal), and the login
collection's lock. The `keyring_session` fixture holds one connection for the whole run; each
suite's autouse `keyring` fixture cleans it up for every test in its own way."""
import os

import dbus
import pytest

from tessera_session import new_connection

SECRETS = "org.freedesktop.secrets"
SECRETS_PATH = "/org/freedesktop/secrets"
LOGIN_COLLECTION = "/org/freedesktop/secrets/collection/login"
SESSION_COLLECTION = "/org/freedesktop/secrets/aliases/session"

TESSERA_ITEMS = {"tessera_schema": "1"}
MSALRUNTIME_SCHEMA = "com.microsoft.identity.secret"


class Keyring:
    def __init__(self):
        self._connect()

    def _connect(self):
        self._session = None
        self.conn = new_connection()
        obj = self.conn.get_object(SECRETS, SECRETS_PATH)
        self.service = dbus.Interface(obj, "org.freedesktop.Secret.Service")
        self.gnome = dbus.Interface(obj, "org.gnome.keyring.InternalUnsupportedGuiltRiddenInterface")

    def reconnect(self):
        """After the keyring daemon was replaced: proxies are bound to the old one's unique name."""
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass
        self._connect()

    # Items

    def paths(self, attributes):
        """Paths of the items with these attributes, locked or not."""
        unlocked, locked = self.service.SearchItems(dbus.Dictionary(attributes, signature="ss"))
        return [str(p) for p in list(unlocked) + list(locked)]

    # What gnome-keyring answers for an item deleted after it was listed (tesserad's start-up
    # clean-up, say): the object, and so its Properties interface, is gone.
    GONE = ("org.freedesktop.DBus.Error.UnknownMethod", "org.freedesktop.DBus.Error.UnknownObject")

    def item_attributes_of(self, path):
        """An item's attributes (readable without unlocking secrets); None when the item is gone
        (deleted between the search that listed it and this read)."""
        props = dbus.Interface(self.conn.get_object(SECRETS, path), "org.freedesktop.DBus.Properties")
        try:
            attributes = props.Get("org.freedesktop.Secret.Item", "Attributes")
        except dbus.exceptions.DBusException as error:
            if error.get_dbus_name() in self.GONE:
                return None
            raise
        return {str(k): str(v) for k, v in attributes.items()}

    def items(self, attributes):
        """[(path, its attributes)] of the items with these attributes; an item deleted while they
        are read counts as gone."""
        read = ((path, self.item_attributes_of(path)) for path in self.paths(attributes))
        return [(path, attrs) for path, attrs in read if attrs is not None]

    def delete(self, items):
        """Deletes items ((path, attributes) pairs, as items() gives them) -> how many."""
        for path, _ in items:
            self._delete(path)
        return len(items)

    def _delete(self, path):
        prompt = str(dbus.Interface(self.conn.get_object(SECRETS, path), "org.freedesktop.Secret.Item").Delete())
        assert prompt == "/", f"deleting {path} wants a prompt"

    def _plain_session(self):
        if getattr(self, "_session", None) is None:
            _, session = self.service.OpenSession("plain", dbus.String("", variant_level=1))
            self._session = dbus.ObjectPath(session)
        return self._session

    def secret(self, path):
        """The secret of one item, as text (through a plain session on the private test bus)."""
        secret = self.secret_or_none(path)
        assert secret is not None, f"{path} is gone"
        return secret

    def secret_or_none(self, path):
        """The secret of one item; None when the item is gone (GetSecrets leaves it out)."""
        secrets = self.service.GetSecrets(dbus.Array([dbus.ObjectPath(path)], signature="o"), self._plain_session())
        found = secrets.get(dbus.ObjectPath(path))
        return None if found is None else bytes(found[2]).decode()

    def create_item(self, attributes, secret, label="tessera test item", collection=SESSION_COLLECTION):
        """Stores an item as libsecret would (xdg:schema added) in the in-memory session collection."""
        props = {
            "org.freedesktop.Secret.Item.Label": dbus.String(label, variant_level=1),
            "org.freedesktop.Secret.Item.Attributes": dbus.Dictionary(
                dict(attributes, **{"xdg:schema": "org.tessera.Broker1"}), signature="ss", variant_level=1),
        }
        value = dbus.Struct((self._plain_session(), dbus.ByteArray(b""), dbus.ByteArray(secret.encode()),
                             dbus.String("text/plain")), signature="oayays")
        coll = dbus.Interface(self.conn.get_object(SECRETS, collection), "org.freedesktop.Secret.Collection")
        item, prompt = coll.CreateItem(dbus.Dictionary(props, signature="sv"), value, True)
        assert str(prompt) == "/"
        return str(item)

    # Tessera's items

    def item_paths(self):
        return self.paths(TESSERA_ITEMS)

    def tessera_items(self, secrets=False):
        """Every Tessera item as [(path, attributes)], or with `secrets` [(path, attributes,
        secret)]: the one inventory the suites take while tesserad may be deleting items (its
        start-up clean-up), so an item deleted while it is read counts as gone."""
        out = []
        for path in self.item_paths():
            attributes = self.item_attributes_of(path)
            secret = self.secret_or_none(path) if secrets and attributes is not None else None
            if attributes is None or (secrets and secret is None):
                continue
            out.append((path, attributes, secret) if secrets else (path, attributes))
        return out

    def item_attributes(self):
        """Attributes of every Tessera item (readable without unlocking secrets); an item deleted
        while they are read counts as gone."""
        return [attributes for _, attributes in self.tessera_items()]

    def clear(self):
        """Deletes every Tessera item -> how many."""
        paths = self.item_paths()
        for path in paths:
            self._delete(path)
        return len(paths)

    # msalruntime's own cache (Tests/msal): items with a `clientid` attribute are tokens, items
    # without are accounts.

    def msalruntime_items(self):
        return self.items({"xdg:schema": MSALRUNTIME_SCHEMA})

    def clear_msalruntime_tokens(self):
        """Deletes msalruntime's cached tokens (items with a clientid) and keeps its accounts: MSAL's
        acquire_token_silent then has to ask the broker."""
        return self.delete([i for i in self.msalruntime_items() if "clientid" in i[1]])

    def clear_msalruntime(self):
        """Deletes all of msalruntime's cache: as an app that never ran on this machine."""
        return self.delete(self.msalruntime_items())

    # The login collection's lock

    def locked(self):
        props = dbus.Interface(self.conn.get_object(SECRETS, LOGIN_COLLECTION), "org.freedesktop.DBus.Properties")
        return bool(props.Get("org.freedesktop.Secret.Collection", "Locked"))

    def lock(self):
        _, prompt = self.service.Lock(dbus.Array([dbus.ObjectPath(LOGIN_COLLECTION)], signature="o"))
        assert str(prompt) == "/"
        assert self.locked()

    def unlock(self):
        _, session = self.service.OpenSession("plain", dbus.String("", variant_level=1))
        secret = dbus.Struct(
            (dbus.ObjectPath(session), dbus.ByteArray(b""),
             dbus.ByteArray(os.environ["TESSERA_TEST_KEYRING_PASSWORD"].encode()), dbus.String("text/plain")),
            signature="oayays")
        self.gnome.UnlockWithMasterPassword(dbus.ObjectPath(LOGIN_COLLECTION), secret)
        assert not self.locked()


@pytest.fixture(scope="session")
def keyring_session():
    k = Keyring()
    yield k
    k.conn.close()
