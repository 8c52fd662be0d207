"""A D-Bus client on a bare socket, for the identity race tests: a connection that survives exec
(libdbus and GDBus cannot adopt a connection another process authenticated) and is used by
whatever program holds its descriptor.

As a program:
  raw_dbus.py connect ADDRESS STEPS...       connects, authenticates, says Hello, then runs STEPS
  raw_dbus.py resume FD STEPS...             runs STEPS on a connection it inherited as FD
STEPS, in order:
  call                 AcquireTokenSilent(client, [scope], account, {}); prints one JSON line:
                       {"pid": ..., "ok": true} or {"pid": ..., "error": NAME, "message": TEXT}
  signout              SignOut(account, {}); prints the same
  exec PROGRAM         execs PROGRAM (another python) with this script, resuming on the same fd
  fork-and-exit        forks; the parent exits; the child goes on (after the parent is gone)
The call's client, scope and account come from $RAW_CLIENT, $RAW_SCOPE and $RAW_ACCOUNT; with
$RAW_SENDER, the call says it comes from that name (its SENDER header field)."""
import json
import os
import socket
import struct
import sys
import time

# The marshalling is Tests/lib/dbus_wire.py's (this runs as a program, without conftest.py's path).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from dbus_wire import call, connect, pad, put_string  # noqa: E402


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


def token_call(sock, serial):
    body = token_call_body(os.environ["RAW_CLIENT"], os.environ["RAW_SCOPE"], os.environ["RAW_ACCOUNT"])
    return answer(*call(sock, serial, "AcquireTokenSilent", body, "sassa{sv}", sender=os.environ.get("RAW_SENDER")))


def sign_out_call(sock, serial):
    body = bytearray()
    put_string(body, os.environ["RAW_ACCOUNT"])
    pad(body, 4)
    body.extend(struct.pack("<I", 0))  # an empty a{sv}
    pad(body, 8)
    return answer(*call(sock, serial, "SignOut", bytes(body), "sa{sv}", sender=os.environ.get("RAW_SENDER")))


def answer(mtype, fields, reply):
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
        elif step == "signout":
            serial += 1
            print(json.dumps(sign_out_call(sock, serial)), flush=True)
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
