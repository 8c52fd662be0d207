"""D-Bus on a bare socket, marshalled by hand, where libdbus and dbus-python will not do: a string
that is not UTF-8 (they refuse to send one; Tests/e2e/test_fuzz.py shows that the bus drops it), a
connection another process authenticated (they cannot adopt one; Tests/e2e/raw_dbus.py, for the
identity race tests), and many calls in flight on one connection or a connection dropped at any
byte (Tests/e2e/test_faults_callers.py).

Little-endian method calls, and only the header fields they need; a body is built with pad() and
put_string() (and struct.pack for the rest). Standard library only: raw_dbus.py also runs under a
bare copy of the python binary."""
import os
import socket
import struct


def pad(buf, n):
    buf.extend(b"\0" * ((-len(buf)) % n))


def put_string(buf, s, code="s"):
    """A string (`s`, `o`) or a signature (`g`, one length byte). `s` may be bytes: a string that
    is not UTF-8."""
    data = s if isinstance(s, (bytes, bytearray)) else s.encode()
    if code == "g":
        buf.append(len(data))
    else:
        pad(buf, 4)
        buf.extend(struct.pack("<I", len(data)))
    buf.extend(data + b"\0")


def message(serial, member, body=b"", signature="", destination="org.tessera.Broker1",
            path="/org/tessera/Broker1", interface="org.tessera.Broker1", sender=None):
    """One method call; its destination, path and interface are the broker's unless given.
    `sender`: a SENDER header field of the caller's choosing (a bus daemon replaces it; on a
    peer-to-peer connection it arrives as written)."""
    fields = bytearray()
    for code, typ, value in ((1, "o", path), (2, "s", interface), (3, "s", member), (6, "s", destination),
                             (7, "s", sender), (8, "g", signature)):
        if (typ == "g" and not value) or value is None:
            continue
        pad(fields, 8)  # each field is a struct, 8-aligned
        fields.append(code)
        put_string(fields, typ, "g")
        put_string(fields, value, typ)
    header = bytearray(b"l\x01\x00\x01")
    header.extend(struct.pack("<III", len(body), serial, len(fields)))
    header.extend(fields)
    pad(header, 8)
    return bytes(header) + body


def read_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the bus closed the connection")
        data += chunk
    return data


def read_message(sock):
    """The next message -> (type, {header field code: value}, body)."""
    fixed = read_exact(sock, 16)
    _, mtype, _, _, body_len, _, fields_len = struct.unpack("<BBBBIII", fixed)
    fields_raw = read_exact(sock, fields_len + ((-(16 + fields_len)) % 8))[:fields_len]
    body = read_exact(sock, body_len)
    fields, i = {}, 0
    while i < len(fields_raw):
        i += (-i) % 8
        code = fields_raw[i]
        sig_len = fields_raw[i + 1]
        sig = fields_raw[i + 2:i + 2 + sig_len].decode()
        i += 3 + sig_len
        if sig in ("s", "o"):
            i += (-i) % 4
            (n,) = struct.unpack_from("<I", fields_raw, i)
            fields[code] = fields_raw[i + 4:i + 4 + n].decode()
            i += 5 + n
        elif sig == "u":
            i += (-i) % 4
            (fields[code],) = struct.unpack_from("<I", fields_raw, i)
            i += 4
        elif sig == "g":
            n = fields_raw[i]
            fields[code] = fields_raw[i + 1:i + 1 + n].decode()
            i += 2 + n
        else:
            raise ValueError(f"header field of type {sig}")
    return mtype, fields, body


def call(sock, serial, member, body=b"", signature="", **kw):
    """Sends a call and reads up to its reply (what comes before is dropped) -> read_message()'s."""
    sock.sendall(message(serial, member, body, signature, **kw))
    while True:
        mtype, fields, reply = read_message(sock)
        if fields.get(5) == serial:
            return mtype, fields, reply


def connect(address, timeout=None):
    """A connection to the bus at `address` (unix:path= or unix:abstract=), authenticated and
    past Hello (serial 1). `timeout`: of every read and write on the socket (None: none)."""
    keys = dict(p.split("=", 1) for p in address.split(";")[0].split(":", 1)[1].split(","))
    path = keys["path"] if "path" in keys else "\0" + keys["abstract"]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    sock.sendall(b"\0AUTH EXTERNAL " + str(os.getuid()).encode().hex().encode() + b"\r\n")
    assert read_exact(sock, 3) == b"OK ", "the bus refused authentication"
    while not sock.recv(1) == b"\n":
        pass
    sock.sendall(b"BEGIN\r\n")
    call(sock, 1, "Hello", destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
         interface="org.freedesktop.DBus")
    return sock
