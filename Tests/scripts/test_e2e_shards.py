"""scripts/lib/e2e_shards.py: how scripts/test splits Tests/e2e between its parallel sessions.
Every test file runs in exactly one session, the longest files are spread out, and a run's
timings (pytest --durations=0) rewrite the table it splits by."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "lib" / "e2e_shards.py"


def shard(n, k, repo=REPO):
    out = subprocess.run([sys.executable, str(repo / "scripts" / "lib" / "e2e_shards.py"), str(n), str(k)],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


def table(repo=REPO):
    seconds = {}
    for line in (repo / "Tests" / "e2e" / "durations.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            value, name = line.split()
            seconds[name] = int(value)
    return seconds


def test_every_file_runs_in_exactly_one_session():
    files = sorted(f"Tests/e2e/{p.name}" for p in (REPO / "Tests" / "e2e").glob("test_*.py"))
    for n in (1, 2, 3):
        shards = [shard(n, k) for k in range(n)]
        together = sorted(f for s in shards for f in s)
        assert together == files, n


def test_the_sessions_get_about_the_same_work():
    seconds = table()
    loads = [sum(seconds.get(f.split("/")[-1], 20) for f in shard(2, k)) for k in range(2)]
    longest = max(seconds.values())
    # Greedy longest-first: the two differ by at most the longest file.
    assert abs(loads[0] - loads[1]) <= longest, loads
    # The two longest files are not in one session.
    top = sorted(seconds, key=seconds.get, reverse=True)[:2]
    assert not set(f"Tests/e2e/{t}" for t in top) <= set(shard(2, 0)), top


def test_a_runs_timings_rewrite_the_table(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts" / "lib").mkdir(parents=True)
    (repo / "Tests" / "e2e").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "scripts" / "lib")
    (repo / "Tests" / "e2e" / "durations.txt").write_text("# header kept\n5 test_a.py\n5 test_b.py\n")
    for name in ("test_a.py", "test_b.py", "test_c.py"):
        (repo / "Tests" / "e2e" / name).write_text("")
    log = tmp_path / "run.log"
    log.write_text("============ slowest durations ============\n"
                   "30.50s call     Tests/e2e/test_b.py::test_one\n"
                   "2.00s setup    Tests/e2e/test_b.py::test_one\n"
                   "1.20s call     Tests/e2e/test_a.py::test_two[x]\n"
                   "0.01s teardown Tests/e2e/test_a.py::test_two[x]\n")
    subprocess.run([sys.executable, str(repo / "scripts" / "lib" / "e2e_shards.py"), "--learn", str(log)], check=True)
    assert (repo / "Tests" / "e2e" / "durations.txt").read_text() == "# header kept\n32 test_b.py\n1 test_a.py\n"
    # test_c.py is not listed (20 s): it goes with test_a.py, away from test_b.py.
    assert shard(2, 0, repo) == ["Tests/e2e/test_b.py"]
    assert shard(2, 1, repo) == ["Tests/e2e/test_c.py", "Tests/e2e/test_a.py"]


def test_a_log_without_timings_is_refused(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("266 passed in 934.31s\n")
    out = subprocess.run([sys.executable, str(SCRIPT), "--learn", str(log)], capture_output=True, text=True)
    assert out.returncode != 0 and "--durations=0" in out.stderr
