"""Fuzzing a bus interface: generated calls sent many at a time on one connection, every reply
collected. Tests/e2e/test_fuzz.py fuzzes org.tessera.Broker1 with it and
Tests/e2e/test_microsoft_front.py the Microsoft front; each generates its own calls."""
import itertools
import os

# Both fuzzers' seed; TESSERA_FUZZ_SEED picks another.
SEED = int(os.environ.get("TESSERA_FUZZ_SEED", "20261123"))


def send_all(conn, calls, window, timeout):
    """Sends `calls`, an iterable of (tag, dbus.lowlevel.MethodCallMessage or None), on `conn`,
    `window` of them outstanding at a time, and yields (tag, reply) for each, in the order sent:
    reply is the MethodReturnMessage or ErrorMessage (libdbus's NoReply after `timeout` seconds),
    None if no reply came at all. A None message (a call that could not be built) takes its place
    in the window but is not sent and yields nothing.

    `calls` is read as the calls go out: a generator builds each call just before it is sent, and
    the broker starts on a window's first calls while the rest are being built."""
    calls = iter(calls)
    while True:
        replies = {}
        pending = []
        taken = 0
        for tag, message in itertools.islice(calls, window):
            if message is not None:
                call = conn.send_message_with_reply(message, lambda reply, i=taken: replies.__setitem__(i, reply),
                                                    timeout, require_main_loop=False)
                pending.append((taken, tag, call))
            taken += 1
        if not taken:
            return
        conn.flush()
        for index, tag, call in pending:
            call.block()  # libdbus reads replies while it waits; none is lost
            yield tag, replies.get(index)
