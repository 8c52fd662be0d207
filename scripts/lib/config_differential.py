"""Differential check of Tessera's config.toml reader against Python's tomllib, on the inputs the
fuzzer found (scripts/fuzz): the reader takes a subset of TOML 1.0 "to the letter", so every input it
accepts must be valid TOML that tomllib reads to the same keys and values; inputs it refuses may be
valid TOML outside that subset (floats, dates, inline tables, dotted keys).
Usage: config_differential.py DUMP.jsonl MISMATCH_DIR FILE...
DUMP.jsonl holds, in FILE order, the reader's result for each file (FuzzConfig with
TESSERA_FUZZ_CONFIG_DUMP). Prints a summary; exits 1 and copies the inputs to MISMATCH_DIR when any
accepted input is not TOML or reads differently."""
import json
import os
import shutil
import sys
import tomllib


def ours_as_toml(result):
    """The reader's entries, [[name]] and [name] tables as the dict tomllib gives."""
    out = {key: value for key, value in result["entries"]}
    for table in result["tables"]:
        name, entries = table[0], table[1]
        values = {key: value for key, value in entries}
        if len(table) > 2 and not table[2]:
            out[name] = values
        else:
            out.setdefault(name, []).append(values)
    return out


def main():
    dump, mismatch_dir, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    with open(dump) as f:
        results = [json.loads(line) for line in f if line.strip()]
    if len(results) != len(files):
        print(f"config differential: {len(results)} readings for {len(files)} inputs", file=sys.stderr)
        return 1
    both = only_toml = neither = 0
    bad = []
    for path, result in zip(files, results):
        data = open(path, "rb").read()
        try:
            theirs = tomllib.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError):
            theirs = None
        if not result["ok"]:
            if theirs is None:
                neither += 1
            else:
                only_toml += 1
            continue
        if theirs is None:
            bad.append((path, "accepted, but it is not TOML (tomllib refuses it)"))
        elif ours_as_toml(result) != theirs:
            bad.append((path, f"read as {ours_as_toml(result)!r}, tomllib reads {theirs!r}"))
        else:
            both += 1
    print(f"Differential check against Python's tomllib ({len(files)} inputs of FuzzConfig's corpus): "
          f"{both} read alike by both, {only_toml} valid TOML outside the reader's subset and refused by it, "
          f"{neither} refused by both, {len(bad)} read differently.")
    if bad:
        os.makedirs(mismatch_dir, exist_ok=True)
        for path, why in bad[:20]:
            print(f"  {path}: {why[:300]}", file=sys.stderr)
            shutil.copy(path, mismatch_dir)
        print(f"config differential: {len(bad)} inputs read differently; copied to {mismatch_dir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
