"""Every script the README tells a newcomer to run installs its Debian packages before it builds.

A fresh Debian 12 with Swift has no libcurl/libsecret/libsystemd headers, so a script that runs
`swift build` first fails there (it did: scripts/demo stopped at 'curl/curl.h' file not found),
while a machine that already has the packages hides the bug. Each command is taken from the
README's code blocks and run as written (less `sudo`) in a copy of the repository, with `dpkg`
saying nothing is installed and stand-ins for `apt-get` and `swift` that log their calls; the
stand-in `swift` fails, so nothing is built, installed or started. The log must show the
packages installed before the first build.
"""

import os
import re
import shutil
import subprocess
import hashlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def readme_commands():
    """Command lines in the README's fenced code blocks that run one of the repository's scripts."""
    commands = []
    in_block = False
    for line in README.read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            continue
        command = line.split("#", 1)[0].strip()
        command = re.sub(r"^sudo\s+", "", command)
        if re.match(r"^scripts/[\w-]+", command):
            commands.append(command)
    return commands


COMMANDS = readme_commands()


def test_readme_names_the_run_and_test_commands():
    names = {c.split()[0] for c in COMMANDS}
    assert {"scripts/demo", "scripts/test"} <= names, COMMANDS


STUBS = {
    # Nothing is installed.
    "dpkg": '#!/bin/sh\necho "dpkg $*" >>"$STUB_LOG"\nexit 1\n',
    "apt-get": '#!/bin/sh\necho "apt-get $*" >>"$STUB_LOG"\nexit 0\n',
    # A build that fails: whatever comes after it does not run.
    "swift": '#!/bin/sh\necho "swift $*" >>"$STUB_LOG"\necho "swift (stand-in): not building" >&2\nexit 1\n',
    "sudo": '#!/bin/sh\nexec "$@"\n',
}


@pytest.fixture
def sandbox(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(
        REPO,
        copy,
        ignore=shutil.ignore_patterns(".git", ".build", ".build-*", ".build_*", "__pycache__"),
    )
    # The test IdP's venv counts as set up (scripts/idp compares the requirements' hash), so no
    # Python package is downloaded.
    venv = copy / ".build-idp" / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    requirements = (copy / "Tests" / "idp" / "requirements.txt").read_bytes()
    (venv / ".requirements.sha256").write_text(hashlib.sha256(requirements).hexdigest() + "\n")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    return copy, stubs, tmp_path / "calls.log"


@pytest.mark.parametrize("command", COMMANDS)
def test_installs_packages_before_building(sandbox, command):
    copy, stubs, log = sandbox
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TESSERA_", "DBUS_", "XDG_RUNTIME")) and k != "CI"
    }
    env["PATH"] = f"{stubs}:{env.get('PATH', '/usr/bin:/bin')}"
    env["STUB_LOG"] = str(log)
    run = subprocess.run(
        ["bash", "-c", command],
        cwd=copy,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    builds = [i for i, c in enumerate(calls) if c.startswith("swift build")]
    installs = [i for i, c in enumerate(calls) if c.startswith("apt-get") and " install " in f" {c} "]
    evidence = f"calls: {calls}\nstdout:\n{run.stdout[-2000:]}\nstderr:\n{run.stderr[-2000:]}"
    assert builds, f"`{command}` never reached a build; {evidence}"
    assert installs, f"`{command}` built without installing Debian packages; {evidence}"
    assert installs[0] < builds[0], f"`{command}` built before installing its packages; {evidence}"
    for header_package in ("libcurl4-openssl-dev", "libsecret-1-dev", "libsystemd-dev"):
        assert header_package in calls[installs[0]], f"`{command}` did not install {header_package}; {evidence}"
