#!/usr/bin/env python3
"""Splits Tests/e2e between scripts/test's parallel sessions: each file goes, longest first, to the
session with the least work so far, by the seconds in Tests/e2e/durations.txt (a file not listed
counts 20 s). A file's tests stay in one session: module fixtures and the order within a file hold.

Usage: e2e_shards.py N K          the files of session K (0 .. N-1), one per line
       e2e_shards.py --learn LOG  rewrites durations.txt from a pytest run with --durations=0
"""
import collections
import os
import re
import sys

E2E = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Tests", "e2e")
TABLE = os.path.join(E2E, "durations.txt")
UNLISTED = 20


def read_table():
    header, seconds = [], {}
    with open(TABLE) as f:
        for line in f:
            if line.startswith("#"):
                header.append(line)
            elif line.strip():
                value, name = line.split()
                seconds[name] = int(value)
    return header, seconds


def shards(n):
    _, seconds = read_table()
    files = sorted(f for f in os.listdir(E2E) if f.startswith("test_") and f.endswith(".py"))
    load = [0] * n
    out = [[] for _ in range(n)]
    for name in sorted(files, key=lambda f: (-seconds.get(f, UNLISTED), f)):
        k = load.index(min(load))
        out[k].append(name)
        load[k] += seconds.get(name, UNLISTED)
    return out


def learn(log):
    header, _ = read_table()
    total = collections.Counter()
    pattern = re.compile(r"^([\d.]+)s (?:call|setup|teardown)\s+(?:Tests/e2e/)?(test_\w+\.py)::")
    with open(log) as f:
        for line in f:
            m = pattern.match(line)
            if m:
                total[m.group(2)] += float(m.group(1))
    if not total:
        sys.exit(f"e2e_shards: no test timings in {log} (run pytest with --durations=0)")
    with open(TABLE, "w") as f:
        f.writelines(header)
        for name, value in sorted(total.items(), key=lambda kv: (-kv[1], kv[0])):
            f.write(f"{max(1, round(value))} {name}\n")


def main(argv):
    if len(argv) == 2 and argv[0] == "--learn":
        learn(argv[1])
    elif len(argv) == 2 and argv[0].isdigit() and argv[1].isdigit() and int(argv[1]) < int(argv[0]):
        for name in shards(int(argv[0]))[int(argv[1])]:
            print(os.path.join("Tests", "e2e", name))
    else:
        sys.exit(__doc__.strip())


if __name__ == "__main__":
    main(sys.argv[1:])
