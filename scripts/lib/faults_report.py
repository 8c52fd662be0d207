"""Prints the fault suite's figures as a table, and writes FAULTS.md when given its path.
Usage: faults_report.py REPORT.jsonl ROUNDS SEED [FAULTS.md]"""
import json
import os
import platform
import subprocess
import sys
import time

HEADER = """# Fault injection

What happens to Tessera when things break, measured by its fault suite (issue 12): real
processes (tesserad, a private session bus, gnome-keyring, the test identity provider), faults
injected from outside, every invariant checked after each round. The test command
(`scripts/test`) runs a short round of 20 per variant; `scripts/faults --write-md` runs the long
round below and rewrites this file. Tests/e2e/test_faults*.py say what each round checks.

## SIGKILL during a forced refresh (refresh-token rotation with reuse protection)

Each round forces a refresh and kills tesserad at a random moment within the time a forced
refresh takes, then restarts it; against each store (issue 23): the Secret Service (gnome-keyring),
and the file store (`store = "file"`, whose records the test opens with the key). Where the kill fell: *before the exchange* (the IdP had not
rotated the token), *inside the exchange* (rotated, not yet stored), *after the store*.
Invariants after each restart: the account is still listed, no stored item without its account,
one refresh token per client, and on the file store every record opens (none damaged or set aside); a silent call succeeds with at most one refresh, unless the token
was lost inside the exchange without a grace period, and then the account is in AttentionNeeded
before any caller asks. *Check* is the time from the restart until the interrupted refresh has
been checked (its journal note is gone).

"""


def store_of(record):
    """The store a record was measured on (records from before issue 23 name none: the keyring)."""
    return {"secret-service": "Secret Service", "file": "file store"}[record.get("store", "secret-service")]


def refresh_section(runs):
    lines = ["| store | IdP grace period | rounds | before the exchange | inside the exchange | after the store | "
             "refresh tokens lost | lost outside the exchange | check, median | check, worst |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        phases = r["phases"]

        def cell(name):
            p = phases.get(name, {"rounds": 0, "lost": 0})
            return f"{p['rounds']} ({p['lost']} lost)"
        outside = r["lost"] - phases.get("inside the exchange", {"lost": 0})["lost"]
        lines.append(f"| {store_of(r)} | {r['grace_s']} s | {r['rounds']} | {cell('before the exchange')} | "
                     f"{cell('inside the exchange')} | {cell('after the store')} | {r['lost']} | {outside} | "
                     f"{r['median_check_s'] * 1000:.0f} ms | {r['worst_check_s'] * 1000:.0f} ms |")
    goal = ("Goal: 0 lost with a grace period of a few seconds, and 0 outside the exchange without one. "
            "The worst case costs one interactive sign-in, and it is reported at the restart.")
    torn = [r for r in runs if "torn_writes" in r]
    if torn:
        goal += (f"\n\nOn the file store, {sum(r['torn_writes'] for r in torn)} of {sum(r['rounds'] for r in torn)} kills "
                 "fell inside a write (a temporary file was left beside the records; the restart removes it); no record "
                 "was ever damaged.")
    crashes = sum(r.get("keyring_crashes", 0) for r in runs)
    if crashes:
        goal += (f"\n\ngnome-keyring itself aborted {crashes} time(s) during these rounds (a known upstream crash "
                 "when a client vanishes while it sets a session up: gnome-keyring #196); it was started again, as "
                 "a desktop's service manager does, and every check above was made against it, with nothing lost.")
    return "\n".join(lines) + "\n\n" + goal


def sign_in_out_section(records):
    text = ("## SIGKILL during sign-ins and sign-outs\n\n"
            "Each round signs a second account (bob) in, or out, beside one that stays (alice), and kills\n"
            "tesserad at a random moment within the time that takes on a just-started daemon (*span*), on\n"
            "each store. After the restart bob must be wholly there (a silent call works) or wholly gone (no\n"
            "stored item of his), no item may be orphaned, no file-store record damaged, and alice must work.\n\n"
            "| store | operation | span | rounds | account whole after restart | account gone, nothing left | "
            "invariant broken |\n"
            "|---|---|---|---|---|---|---|\n")
    for r in records:
        o = r["outcomes"]
        for operation, span in (("sign-in", r["sign_in_ms"]), ("sign-out", r["sign_out_ms"])):
            text += (f"| {store_of(r)} | {operation} | {span} ms | {r['rounds']} | {o[operation]['whole']} | "
                     f"{o[operation]['none']} | 0 |\n")
    return text + ("\nRestarts that found items of a missing account and finished the job: "
                   + ", ".join(f"{r['cleanups']} ({store_of(r)})" for r in records) + ".")


def keyring_section(killed, locked):
    text = ("## The Secret Service killed, restarted, locked, absent (Tests/e2e/test_faults_keyring.py)\n\n"
            "Each round forces a refresh and SIGKILLs gnome-keyring a random moment later (within 1.5 times\n"
            "what a forced refresh takes). The keyring comes back restarted and unlocked (even rounds), or\n"
            "started locked by D-Bus activation and then unlocked (odd rounds). Invariants: the call\n"
            "succeeds or fails with StoreUnavailable, nothing else; while the keyring is away the account\n"
            "stays listed and its cached token is served; once it is back the keyring holds the refresh token\n"
            "the IdP holds, with no caller asking; every fifth round a restarted tesserad refreshes from it.\n"
            "*Landed* is the time from the keyring's return until that token is in it.\n\n"
            "| fault | rounds | call succeeded | StoreUnavailable | other errors | refresh tokens lost | landed, median | landed, worst |\n"
            "|---|---|---|---|---|---|---|---|\n")
    for r in killed:
        o = r["outcomes"]
        text += (f"| keyring SIGKILLed during a refresh | {r['rounds']} | {o['ok']} | {o['StoreUnavailable']} | 0 | "
                 f"{r['lost']} | {r['landing_median_s']:.2f} s | {r['landing_worst_s']:.2f} s |\n")
    for r in locked:
        text += ("\nLocked while alice's tokens are cached: her cached token is served with no IdP request, "
                 f"{r['refreshes_while_locked']} forced refreshes (each rotating her refresh token) fail with "
                 f"StoreUnavailable and are kept in memory, and {r['sign_ins_refused_before_browser']} sign-in of bob "
                 "is refused before the browser opens; "
                 f"{r['landing_s']:.2f} s after the unlock, with no caller, the keyring holds alice's newest refresh "
                 "token, and a restarted tesserad serves it (and signs bob in).\n")
    text += ("\nAbsent at start: tesserad answers StoreUnavailable (\"start your desktop keyring\"), `tessera status` "
             "says so, and the first call after the keyring appears finds the account, with no restart.")
    return text


FUZZ_HEADING = "## Coverage-guided fuzzing"


def main():
    path, rounds, seed = sys.argv[1], sys.argv[2], sys.argv[3]
    out = sys.argv[4] if len(sys.argv) > 4 else None
    with open(path) as f:
        runs = [json.loads(line) for line in f if line.strip()]

    def of(fault):
        return [r for r in runs if r.get("fault") == fault]
    # The Secret Service's rows first, then the file store's, each by grace period.
    sections = [refresh_section(sorted((r for r in runs if "grace_s" in r),
                                       key=lambda r: (r.get("store", "secret-service") != "secret-service", r["grace_s"])))]
    if of("SIGKILL during sign-ins and sign-outs"):
        sections.append(sign_in_out_section(sorted(of("SIGKILL during sign-ins and sign-outs"),
                                                   key=lambda r: r.get("store", "secret-service") != "secret-service")))
    if of("keyring killed mid-write") or of("keyring locked while tokens are cached"):
        sections.append(keyring_section(of("keyring killed mid-write"), of("keyring locked while tokens are cached")))
    # Later parts add their sections here (see each test file's "fault" records).
    sections += [render(r) for render, r in later_sections(runs)]
    table = "\n\n".join(sections)
    print(table)
    if not out:
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    machine = (f"- commit: `{commit}`, seed {seed}, {rounds} rounds per variant\n"
               f"- date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
               f"- cores: {os.cpu_count()}, kernel: {platform.release()}\n")
    # scripts/fuzz --long keeps its own section at the end of the file (fuzz_report.py): kept as it is.
    fuzzing = ""
    if os.path.exists(out):
        with open(out) as f:
            old = f.read()
        if FUZZ_HEADING in old:
            fuzzing = "\n" + old[old.index(FUZZ_HEADING):].rstrip() + "\n"
    with open(out, "w") as f:
        f.write(HEADER + table + "\n\n## Machine\n\n" + machine + fuzzing)
    print(f"wrote {out}")


def idp_section(records):
    text = ("## The identity provider misbehaving (Tests/e2e/test_faults_idp.py)\n\n"
            "A fault-injecting HTTPS proxy the test owns stands between tesserad and the test IdP (tesserad's\n"
            "authority is the proxy). Alice signs in through it; then the proxy refuses, resets, stays silent,\n"
            "trickles, shows a certificate no CA signed, answers an error status or garbage, or changes the\n"
            "IdP's real answer, and alice asks for a token: a forced refresh (for discovery and signing-key\n"
            "faults on a restarted tesserad, which fetches them again). Invariants: the documented error,\n"
            "within the documented time (10 s per request, 5 s to connect, plus 4 s of margin), the account\n"
            "kept (listed, keyring items and refresh token unchanged, no AttentionNeeded, no token in the\n"
            "log), and once the fault is gone a silent call works (the refresh token was not lost). After\n"
            "429 or 503 with Retry-After no request reaches the token endpoint before the wait is over.\n"
            "*Token requests* counts the requests that reached the proxy's token endpoint during the call.\n\n"
            "| fault | endpoint | error | answered in | account kept | token requests | works again |\n"
            "|---|---|---|---|---|---|---|\n")
    for r in records:
        error = r["error"] if r["error"] == r["expected"] else f"{r['error']} (documented: {r['expected']})"
        works = {True: "yes", False: "no: needs a sign-in", None: "not checked"}[r["works_again"]]
        text += (f"| {r['fault']} | {r['endpoint']} | {error} | {r['answered_s']:.2f} s | "
                 f"{'yes' if r['account_kept'] else 'no'} | {r['token_requests']} | {works} |\n")
    return text.rstrip("\n")


def callers_section(records):
    text = ("## Callers misbehaving (Tests/e2e/test_faults_callers.py)\n\n"
            "Bare-socket clients flood the daemon while a well-behaved caller makes silent calls on its own\n"
            "connection; every one of its calls must succeed, and the daemon's anonymous memory must come\n"
            "back within 1 MiB of where it was (it hands freed memory back at its maintenance passes). The two\n"
            "floods that queue hundreds of messages at once are measured from after their first flood (the\n"
            "high-water mark of sd-bus's buffers and the allocator, shown in brackets, bounded at 2 MiB): the\n"
            "1 MiB bound is on growth from one flood to the next.\n\n"
            "| fault | outcome | well-behaved caller: calls, p50, p99, worst | memory after |\n"
            "|---|---|---|---|\n")
    for r in records:
        v = r["victim"]
        kind = r["fault"].removesuffix(" (own socket)")
        if kind == "callers disconnecting mid-call":
            outcome = (f"{r['refresh_leavers']} left mid forced refresh, {r['sign_in_leavers']} mid sign-in; "
                       "all sign-in places free again")
        elif kind == "1,000 concurrent silent calls":
            outcome = (f"{r['waves']} waves, {r['answered']} of {r['waves'] * 1000} answered with a token; "
                       f"a wave took {r['wave_median_s'] * 1000:.0f} ms (median)")
        elif kind == "64 clients starting and cancelling sign-ins":
            outcome = ", ".join(f"{n} {k}" for k, n in sorted(r["outcomes"].items())) + f", all in {r['all_done_s']} s"
        elif kind == "a client that never reads its replies":
            outcome = f"{r['calls_sent']} calls sent, none read"
        else:
            outcome = f"{r['messages']} messages of {r['message_mib']} MiB refused (InvalidArgument) in {r['answered_s']} s"
        text += (f"| {r['fault']} | {outcome} | {v['calls']}, {v['p50_ms']} ms, {v['p99_ms']} ms, {v['max_ms']} ms | "
                 f"{r['memory_kib']:+d} KiB"
                 + (f" (first flood {r['high_water_kib']:+d} KiB)" if "high_water_kib" in r else "") + " |\n")
    text += ("\nThe well-behaved caller's worst waits come from the one bus socket: its call queues behind the\n"
             "flood's (1,000 calls, or a 128 MiB message that sd-bus reads whole before tesserad sees it).")
    return text


def soak_section(records):
    text = ("## Soak (Tests/e2e/test_faults_soak.py)\n\n"
            "16 connections make silent calls back to back (`tessera-bench soak`, debug build) for an account\n"
            "whose access tokens live 2 minutes, so refresh-ahead renews them while the calls run. The\n"
            "baseline is taken after the same load once and one refresh; the daemon's anonymous memory\n"
            "(RssAnon: heap, arenas, stacks) must end within 1 MiB of it once a maintenance pass has handed\n"
            "freed memory back, with no more descriptors or threads.\n\n"
            "| calls | errors | time | calls/s | p50 | p99 | refreshes | memory | descriptors | threads |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    for r in records:
        text += (f"| {r['calls']:,} | {r['errors']} | {r['seconds']} s | {r['calls_per_second']:,} | "
                 f"{r['p50_us']} µs | {r['p99_us']} µs | {r['refreshes']} | {r['memory_kib']:+d} KiB | "
                 f"{r['fds'][0]} → {r['fds'][1]} | {r['threads'][0]} → {r['threads'][1]} |\n")
    return text


def clock_section(records):
    text = ("## The clock set (Tests/e2e/test_faults_clock.py)\n\n"
            "libfaketime sets tesserad's wall clock alone (the IdP keeps the true time). Each token served\n"
            "afterwards is looked up at the IdP: none may be past its real expiry, nor say it has more time\n"
            "left than its 3 s lifetime. A suspend (wall and boot clocks move, the monotonic clock does not)\n"
            "cannot be faked this way; the engine's tests cover it with their fake clock.\n\n"
            "| clock set by | noticed after | calls after | served past real expiry |\n"
            "|---|---|---|---|\n")
    for r in records:
        text += f"| {r['jump_s']:+d} s | {r['noticed_after_s']} s | {r['calls']} | {r['served_expired']} |\n"
    return text


def store_move_section(records):
    text = ("## SIGKILL during store moves (Tests/e2e/test_faults_store_move.py)\n\n"
            "Two accounts with two clients each and app grants are moved back and forth between the Secret\n"
            "Service and the file store (`tessera store migrate`); each round kills tesserad at a random moment\n"
            "within the time a whole move takes and restarts it (`store = \"auto\"`). Invariants: every item\n"
            "(attributes and secret) is in exactly one store, none is lost, tesserad uses the store that holds\n"
            "them, no move journal is left, no file-store record is damaged, silent calls work.\n\n"
            "| items | move | rounds | not started | finished at start (copying) | finished at start (deleting) "
            "| finished before the kill | invariant broken |\n"
            "|---|---|---|---|---|---|---|---|\n")
    for r in records:
        o = r["outcomes"]
        text += (f"| {r['items']} | {r['move_ms']} ms | {r['rounds']} | {o['not started']} | "
                 f"{o['finished at start, killed while copying']} | {o['finished at start, killed while deleting']} | "
                 f"{o['finished before the kill']} | 0 |\n")
    return text


def later_sections(runs):
    """(renderer, records) of the sections parts 3 to 6 add."""
    sections = []
    idp = [r for r in runs if r.get("section") == "idp"]
    if idp:
        sections.append((idp_section, idp))
    callers = [r for r in runs if r.get("fault", "").removesuffix(" (own socket)") in (
        "callers disconnecting mid-call", "1,000 concurrent silent calls", "64 clients starting and cancelling sign-ins",
        "a client that never reads its replies", "messages at the bus's size limit")]
    if callers:
        sections.append((callers_section, callers))
    moves = [r for r in runs if r.get("fault") == "SIGKILL during store moves"]
    if moves:
        sections.append((store_move_section, moves))
    soak = [r for r in runs if r.get("fault") == "soak"]
    if soak:
        sections.append((soak_section, soak))
    clock = [r for r in runs if r.get("fault") == "clock set"]
    if clock:
        sections.append((clock_section, clock))
    return sections


if __name__ == "__main__":
    main()
