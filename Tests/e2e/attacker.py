#!/usr/bin/python3
"""Another local user attacking a Tessera sign-in. The tests run it as `nobody` (runuser) with
Debian's /usr/bin/python3 and the standard library only.

  attacker.py cmdlines NEEDLE...     every process command line (/proc/*/cmdline) holding a needle
  attacker.py get URL [HOST]         one GET; prints {"status": N} or {"status": null, "error": ...}
  attacker.py hold URL N SECONDS     opens N idle connections, prints "held K", keeps them open

Prints JSON (one line) for cmdlines and get.
"""
import http.client
import json
import os
import socket
import sys
import time
from urllib.parse import urlsplit


def cmdlines(needles):
    hits = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                text = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "attacker.py" in text or text.startswith("runuser"):
            continue  # this scan's own command line holds the needles
        hits += [{"pid": int(pid), "needle": n, "cmdline": text[:300]} for n in needles if n in text]
    print(json.dumps({"readable": True, "hits": hits}))


def get(url, host=None):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        target = parts.path + ("?" + parts.query if parts.query else "")
        headers = {"Host": host} if host else {}
        conn.request("GET", target or "/", headers=headers)
        print(json.dumps({"status": conn.getresponse().status}))
    except (OSError, http.client.HTTPException) as e:
        print(json.dumps({"status": None, "error": type(e).__name__}))
    finally:
        conn.close()


def hold(url, count, seconds):
    parts = urlsplit(url)
    held = []
    for _ in range(count):
        s = socket.create_connection((parts.hostname, parts.port), timeout=5)
        held.append(s)
    print(f"held {len(held)}", flush=True)
    time.sleep(seconds)


def main():
    command, args = sys.argv[1], sys.argv[2:]
    if command == "cmdlines":
        cmdlines(args)
    elif command == "get":
        get(args[0], args[1] if len(args) > 1 else None)
    elif command == "hold":
        hold(args[0], int(args[1]), float(args[2]))
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
