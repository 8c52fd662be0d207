"""Reads libFuzzer logs of scripts/fuzz and prints one row per target; with --write FAULTS.md, puts
the rows into the file's "Coverage-guided fuzzing" section (the targets not in this run keep their
rows, so long runs can be made a few targets at a time).
Usage: fuzz_report.py [--write FAULTS.md] [--differential FILE] TARGET=LOG:EXIT:SECONDS:CORPUS_DIR ..."""
import os
import platform
import re
import subprocess
import sys
import time

HEADING = "## Coverage-guided fuzzing"
COLUMNS = ["target", "what it reads", "time", "executions", "exec/s", "coverage (edges / features)",
           "corpus (inputs / bytes)", "crashes", "leaks", "timeouts", "date, commit"]
WHAT = {
    "FuzzConfig": "config.toml and its `[[git]]` tables, the administrator's files with `[policy]`, and what `tessera config` prints",
    "FuzzOAuth": "token and error bodies, client_info, Retry-After, base64url, form encoding, authorities, SafeText",
    "FuzzGitCredential": "git's credential protocol, KUBERNETES_EXEC_INFO",
    "FuzzLoopback": "the browser's redirect request (request line, headers, query), /proc/net/tcp",
    "FuzzMicrosoft": "com.microsoft.identity.broker1's eight methods over the engine",
    "FuzzProvider": "discovery, JWKS, device authorization, token answers, id_tokens, revocation",
    "FuzzBus": "D-Bus calls as bytes: sd-bus, the codec under the wire limits, both fronts with the option table",
    "FuzzStore": "file-store records, keyring items of every schema version, the move journal",
}
INTRO = """{heading} (scripts/fuzz --long)

Each target of Tests/TesseraFuzzTargets (issue 25) under libFuzzer with AddressSanitizer and
LeakSanitizer, from its seeds (Fuzz/corpus) and dictionary (Fuzz/dicts), for the time shown, on one
core. *Coverage* is libFuzzer's count of instrumented edges reached and of features (edges with hit
counts); *corpus* is the inputs it kept. A crash, a leak or a timeout (an input that runs over 10 s)
stops a target and is counted here; each one found is fixed at its cause, its input kept in
Fuzz/regressions/TARGET (replayed by every `swift test`), and named in CHANGELOG.md. The test command
runs each target for a short time (`scripts/fuzz --seconds 30`), not these figures.
"""


def parse(log_path, exit_code, seconds, corpus_dir):
    with open(log_path, errors="replace") as f:
        log = f.read()
    done = [l for l in log.splitlines() if re.match(r"#\d+\s+(DONE|INITED|NEW|REDUCE|pulse)", l)]
    last = done[-1] if done else ""
    cov = re.search(r"cov: (\d+)", last)
    ft = re.search(r"ft: (\d+)", last)
    execs = re.search(r"stat::number_of_executed_units: (\d+)", log)
    rate = re.search(r"stat::average_exec_per_sec:\s+(\d+)", log)
    files = [os.path.join(corpus_dir, n) for n in os.listdir(corpus_dir)] if os.path.isdir(corpus_dir) else []
    leaks = int("ERROR: LeakSanitizer" in log)
    timeouts = int("ERROR: libFuzzer: timeout" in log)
    crashes = int(exit_code != 0 and not leaks and not timeouts)
    return {
        "time": f"{int(seconds) // 60} min" if int(seconds) >= 60 else f"{seconds} s",
        "executions": f"{int(execs.group(1)):,}" if execs else "?",
        "exec/s": rate.group(1) if rate else "?",
        "coverage (edges / features)": f"{cov.group(1)} / {ft.group(1)}" if cov and ft else "?",
        "corpus (inputs / bytes)": f"{len(files):,} / {sum(os.path.getsize(p) for p in files):,}",
        "crashes": str(crashes), "leaks": str(leaks), "timeouts": str(timeouts),
    }


def main():
    args = sys.argv[1:]
    out = None
    differential = None
    while args and args[0].startswith("--"):
        if args[0] == "--write":
            out = args[1]
        elif args[0] == "--differential":
            differential = args[1]
        args = args[2:]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    date = time.strftime("%Y-%m-%d", time.gmtime())
    rows = {}
    for arg in args:
        target, rest = arg.split("=", 1)
        log, code, seconds, corpus = rest.split(":", 3)
        row = parse(log, int(code), seconds, corpus)
        row["target"] = target
        row["what it reads"] = WHAT.get(target, "")
        # The commit the executables were built from (scripts/fuzz notes it), else the checkout's.
        noted = os.path.join(os.path.dirname(os.path.dirname(corpus)), "commit")
        built = open(noted).read().strip() if os.path.exists(noted) else commit
        row["date, commit"] = f"{date}, `{built}`"
        rows[target] = row
        print(f"{target}: " + ", ".join(f"{k} {row[k]}" for k in COLUMNS[2:10]))
    if not out:
        return
    text = open(out).read() if os.path.exists(out) else "# Fault injection\n"
    kept = {}
    note = ""
    if HEADING in text:
        section = text[text.index(HEADING):]
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| Fuzz") and len(cells) == len(COLUMNS):
                kept[cells[0]] = dict(zip(COLUMNS, cells))
        found = re.search(r"\n(Differential check.*?)(\n\n|\Z)", section, re.S)
        note = found.group(1) if found else ""
        text = text[:text.index(HEADING)].rstrip() + "\n"
    kept.update(rows)
    if differential and os.path.exists(differential):
        note = open(differential).read().strip()
    order = list(WHAT) + sorted(set(kept) - set(WHAT))
    table = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    for target in order:
        if target in kept:
            table += "| " + " | ".join(kept[target][c] for c in COLUMNS) + " |\n"
    machine = f"Machine: {os.cpu_count()} cores, kernel {platform.release()}."
    text += "\n" + INTRO.format(heading=HEADING) + "\n" + table + "\n" + machine + "\n"
    if note:
        text += "\n" + note + "\n"
    with open(out, "w") as f:
        f.write(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
