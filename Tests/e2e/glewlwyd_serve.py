#!/usr/bin/env python3
"""A configured glewlwyd (Tests/e2e/glewlwyd.py) for a program that is not a pytest test: the
benchmark's DPoP rows (scripts/bench) run tesserad against it. Run inside scripts/test-session.

Prints one JSON line once glewlwyd serves: {"issuer", "client_id", "scopes", "users"}, the
OpenID Connect plugin with DPoP and server nonces (a request without a proof is served as a plain
bearer request). Then reads commands, one per line, and answers each with one line:
  approve USER USER_CODE   the user approves a device code on "another device" -> "ok" or "error: ..."
glewlwyd stops at the end of input (or when this process is killed)."""
import json
import os
import signal
import sys

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from glewlwyd import OIDC_CLIENT, OIDC_INSTANCE, OIDC_SCOPES, USERS, approve_device, configure_and_start, installed, new_server  # noqa: E402,E501


def main():
    if not installed():
        print("glewlwyd_serve: glewlwyd is not installed (apt-get install glewlwyd; scripts/test does)", file=sys.stderr)
        return 2
    server = new_server()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        configure_and_start(server)
        print(json.dumps({"issuer": server.oidc_issuer, "client_id": OIDC_CLIENT, "scopes": list(OIDC_SCOPES),
                          "users": sorted(USERS)}), flush=True)
        for line in sys.stdin:
            words = line.split()
            if len(words) == 3 and words[0] == "approve" and words[1] in USERS:
                try:
                    approve_device(server, words[1], OIDC_CLIENT, words[2], instance=OIDC_INSTANCE,
                                   scope=" ".join(OIDC_SCOPES))
                    print("ok", flush=True)
                except Exception as error:  # the benchmark shows it and stops
                    print(f"error: {error}", flush=True)
            else:
                print(f"error: unknown command {line.strip()!r}", flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
