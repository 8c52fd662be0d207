"""A D-Bus client on a bare socket, for the identity race tests: a connection that survives exec
(libdbus and GDBus cannot adopt a connection another process authenticated) and is used by
whatever program holds its descriptor.

As a program:
  raw_dbus.py connect ADDRESS STEPS...       connects, authenticates, says Hello, then runs STEPS
  raw_dbus.py resume FD STEPS...             runs STEPS on a connection it inherited as FD
STEPS, in order:
  call                 AcquireTokenSilent(client, [scope], account, {}); prints one JSON line:
                       {"pid": ..., "ok": true} or {"pid": ..., "error": NAME, "message": TEXT}
  exec PROGRAM         execs PROGRAM (another python) with this script, resuming on the same fd
  fork-and-exit        forks; the parent exits; the child goes on (after the parent is gone)
The call's client, scope and account come from $RAW_CLIENT, $RAW_SCOPE and $RAW_ACCOUNT."""
import json
import os
import socket
import struct
import sys
import time


def pad(buf, n):
    buf.extend(b"\0" * ((-len(buf)) % n))


def put_string(buf, s, code="s"):
    data = s.encode()
    if code == "g":
        buf.append(len(data))
    else:
        pad(buf, 4)
        buf.extend(struct.pack("<I", len(data)))
    buf.extend(data + b"\0")


def message(serial, member, body=b"", signature="", destination="org.tessera.Broker1",
            path="/org/tessera/Broker1", interface="org.tessera.Broker1"):
    fields = bytearray()
    for code, typ, value in ((1, "o", path), (2, "s", interface), (3, "s", member), (6, "s", destination),
                             (8, "g", signature)):
        if typ == "g" and not value:
            continue
        pad(fields, 8)
        fields.append(code)
        put_string(fields, typ, "g")
        put_string(fields, value, typ)
    header = bytearray(b"l\x01\x00\x01")
    header.extend(struct.pack("<III", len(body), serial, len(fields)))
    header.extend(fields)
    pad(header, 8)
    return bytes(header) + body


def token_call_body(client, scope, account):
    body = bytearray()
    put_string(body, client)
    pad(body, 4)
    array = bytearray()
    put_string(array, scope)
    body.extend(struct.pack("<I", len(array)))
    body.extend(array)
    put_string(body, account)
    pad(body, 4)
    body.extend(struct.pack("<I", 0))  # an empty a{sv}
    pad(body, 8)
    return bytes(body)


def read_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the bus closed the connection")
        data += chunk
    return data


def read_message(sock):
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
    sock.sendall(message(serial, member, body, signature, **kw))
    while True:
        mtype, fields, reply = read_message(sock)
        if fields.get(5) == serial:
            return mtype, fields, reply


def connect(address):
    keys = dict(p.split("=", 1) for p in address.split(";")[0].split(":", 1)[1].split(","))
    path = keys["path"] if "path" in keys else "\0" + keys["abstract"]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(b"\0AUTH EXTERNAL " + str(os.getuid()).encode().hex().encode() + b"\r\n")
    assert read_exact(sock, 3) == b"OK "
    while not sock.recv(1) == b"\n":
        pass
    sock.sendall(b"BEGIN\r\n")
    call(sock, 1, "Hello", destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
         interface="org.freedesktop.DBus")
    return sock


def token_call(sock, serial):
    body = token_call_body(os.environ["RAW_CLIENT"], os.environ["RAW_SCOPE"], os.environ["RAW_ACCOUNT"])
    mtype, fields, reply = call(sock, serial, "AcquireTokenSilent", body, "sassa{sv}")
    if mtype == 2:
        return {"pid": os.getpid(), "ok": True}
    (n,) = struct.unpack_from("<I", reply, 0)
    return {"pid": os.getpid(), "error": fields.get(4), "message": reply[4:4 + n].decode()}


def run(sock, steps, serial):
    while steps:
        step = steps.pop(0)
        if step == "call":
            serial += 1
            print(json.dumps(token_call(sock, serial)), flush=True)
        elif step == "exec":
            program = steps.pop(0)
            os.set_inheritable(sock.fileno(), True)
            os.execv(program, [program, os.path.abspath(__file__), "resume", str(sock.fileno()), str(serial)]
                     + steps)
        elif step == "fork-and-exit":
            parent = os.getpid()
            if os.fork() != 0:
                os._exit(0)
            while os.path.exists(f"/proc/{parent}") and open(f"/proc/{parent}/stat").read().split()[2] != "Z":
                time.sleep(0.01)
            time.sleep(0.2)
        else:
            raise SystemExit(f"unknown step {step}")


def main():
    if sys.argv[1] == "connect":
        run(connect(sys.argv[2]), sys.argv[3:], 1)
    else:
        sock = socket.socket(fileno=int(sys.argv[2]))
        run(sock, sys.argv[4:], int(sys.argv[3]))


if __name__ == "__main__":
    main()
