"""Tessera's file store (config.toml `store = "file"`, docs/storage.md) as the suites see it: the
records in the store directory opened with the key, exactly as Sources/TesseraPlatform/
FileStore.swift seals them, behind the same interface the suites use from the keyring
(tessera_keyring.Keyring): `tessera_items`, `item_attributes`, `item_paths`, `delete`, `clear`.
So a check written against the keyring's items runs unchanged against the file store.

The format, in short (FileStore.swift is the reference):
- the key: 32 bytes; HKDF-SHA256 (salt `tessera file store`) derives the sealing subkey (info
  `seal records, version 1`) and the naming subkey (`name records, version 1`);
- a record's name: HMAC-SHA256 (naming subkey) of its canonical identity (the attributes sorted by
  name bytewise, each name and value preceded by its 32-bit big-endian length, after `tessera
  record identity, version 1` and a NUL), in hex, plus `.item`;
- a record: `TSTORE1\\n`, then AES-256-GCM's combined box (12-byte nonce, ciphertext, 16-byte tag)
  of the JSON {attributes, label, secret}, with `tessera file store, version 1`, a NUL and the
  record's own name as associated data; the attributes inside must hash to that name too.

The view reads while tesserad may be writing: a write is a rename over the record, so a file read
is the old record or the new one; a record deleted between the listing and its read counts as
gone (as the keyring helper counts an item deleted while it is read). A record that does not open
is *damaged*: `damaged()` names them, with the records tesserad set aside (`.corrupt`)."""
import hashlib
import hmac
import json
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"TSTORE1\n"
KEY_CHECK = "key-check"
KEY_CHECK_TEXT = b"tessera file store key check, version 1"
RECORD_SUFFIX = ".item"
CORRUPT_SUFFIX = ".corrupt"
TEMPORARY_SUFFIX = ".tmp"
NONCE_BYTES = 12
TAG_BYTES = 16
KEY_BYTES = 32


def hkdf_sha256(key, salt, info):
    """HKDF-SHA256 with a 32-byte output (one block of the expansion), as swift-crypto's
    HKDF<SHA256>.deriveKey(..., outputByteCount: 32)."""
    prk = hmac.new(salt, key, hashlib.sha256).digest()
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


def subkeys(key):
    """(sealing subkey, naming subkey) of a store key."""
    assert len(key) == KEY_BYTES, f"a store key is {KEY_BYTES} bytes, not {len(key)}"
    salt = b"tessera file store"
    return hkdf_sha256(key, salt, b"seal records, version 1"), hkdf_sha256(key, salt, b"name records, version 1")


def canonical(attributes):
    """A record's identity (FileStore.canonical)."""
    identity = b"tessera record identity, version 1\x00"
    for name in sorted(attributes, key=lambda s: s.encode()):
        for part in (name.encode(), attributes[name].encode()):
            identity += struct.pack(">I", len(part)) + part
    return identity


def name_with(name_key, attributes):
    return hmac.new(name_key, canonical(attributes), hashlib.sha256).hexdigest() + RECORD_SUFFIX


def record_name(key, attributes):
    """The file a record with these attributes lives in (FileStore.name), from the store key."""
    return name_with(subkeys(key)[1], attributes)


def associated_data(name):
    return b"tessera file store, version 1\x00" + name.encode()


def open_sealed(data, name, seal_key):
    """The plaintext of a sealed file named `name`; ValueError when it does not open."""
    if len(data) <= len(MAGIC) or not data.startswith(MAGIC):
        raise ValueError("not a store record")
    box = data[len(MAGIC):]
    if len(box) < NONCE_BYTES + TAG_BYTES:
        raise ValueError("too short for a sealed box")
    try:
        return AESGCM(seal_key).decrypt(box[:NONCE_BYTES], box[NONCE_BYTES:], associated_data(name))
    except InvalidTag:
        raise ValueError("does not open under this key and name") from None


def is_record_name(name):
    stem = name[:-len(RECORD_SUFFIX)] if name.endswith(RECORD_SUFFIX) else ""
    return len(stem) == 64 and all(c in "0123456789abcdef" for c in stem)


class FileStoreView:
    """The records of the file store at `directory`, opened with the key at `key_path` (read when
    first needed: tesserad makes it on first use)."""

    def __init__(self, directory, key_path):
        self.directory = str(directory)
        self.key_path = str(key_path)
        self._keys = None

    def keys(self):
        if self._keys is None:
            with open(self.key_path, "rb") as f:
                self._keys = subkeys(f.read())
        return self._keys

    def _names(self):
        try:
            return sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []

    def _read(self, name):
        """A file's bytes, or None when it is gone."""
        try:
            with open(os.path.join(self.directory, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def open_record(self, name, data):
        """(attributes, label, secret) of a record's bytes; ValueError when it does not open or its
        attributes do not hash to its name (FileStore.openRecord)."""
        seal_key, name_key = self.keys()
        record = json.loads(open_sealed(data, name, seal_key))
        attributes = record["attributes"]
        if name_with(name_key, attributes) != name:
            raise ValueError("its attributes are not the ones its name stands for")
        return attributes, record["label"], record["secret"]

    def records(self):
        """[(name, attributes, label, secret)] of every record that opens; records that do not open
        are left out (`damaged()` names them)."""
        out = []
        for name in self._names():
            if not is_record_name(name):
                continue
            data = self._read(name)
            if data is None:
                continue
            try:
                attributes, label, secret = self.open_record(name, data)
            except ValueError:
                continue
            out.append((name, attributes, label, secret))
        return out

    def damaged(self):
        """Names of the records that do not open, and of the records tesserad set aside
        (`NAME.corrupt`): after any fault, the goal is none."""
        out = []
        for name in self._names():
            if name.endswith(CORRUPT_SUFFIX):
                out.append(name)
            elif is_record_name(name):
                data = self._read(name)
                if data is None:
                    continue
                try:
                    self.open_record(name, data)
                except ValueError as error:
                    out.append(f"{name} ({error})")
        return out

    def leftovers(self):
        """Temporary files of writes that were interrupted (tesserad removes them at its next load)."""
        return [n for n in self._names() if n.endswith(TEMPORARY_SUFFIX)]

    def key_check_opens(self):
        data = self._read(KEY_CHECK)
        if data is None:
            return None
        try:
            return open_sealed(data, KEY_CHECK, self.keys()[0]) == KEY_CHECK_TEXT
        except ValueError:
            return False

    # The keyring helper's interface (tessera_keyring.Keyring): paths are the records' files.

    def tessera_items(self, secrets=False):
        """Every Tessera item as [(path, attributes)], or with `secrets` [(path, attributes,
        secret)], as Keyring.tessera_items."""
        out = []
        for name, attributes, _, secret in self.records():
            if attributes.get("tessera_schema") != "1":
                continue
            path = os.path.join(self.directory, name)
            out.append((path, attributes, secret) if secrets else (path, attributes))
        return out

    def item_attributes(self):
        return [attributes for _, attributes in self.tessera_items()]

    def item_paths(self):
        return [path for path, _ in self.tessera_items()]

    def items(self, attributes):
        """[(path, attributes)] of the items whose attributes include these, as Keyring.items."""
        return [(path, a) for path, a in self.tessera_items()
                if all(a.get(k) == v for k, v in attributes.items())]

    def delete(self, items):
        """Deletes items ((path, attributes) pairs) -> how many. Only while tesserad is stopped: a
        running one keeps them in memory and would not know."""
        for path, _ in items:
            os.unlink(path)
        return len(items)

    def clear(self):
        return self.delete(self.tessera_items())
