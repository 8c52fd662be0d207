"""The Debian packages (issue 26) installed into a fresh Debian 12 that has no Swift: a root made
with debootstrap (kept in /var/cache/tessera-test between runs), entered with bubblewrap. There,
apt installs tessera and tessera-microsoft-broker with the dependencies their control files name,
and a user with a session bus of its own and the file store signs in by device code against the
test identity provider, gets a silent token and signs out; a newer build upgrades the packages
and keeps the account; `apt-get purge` removes every file the packages installed and no user data.

scripts/test builds the packages first (scripts/package --revision 1 and 2) and names their folder
in TESSERA_DEB_DIR; without it these tests are skipped (scripts/test --e2e-only)."""
import fcntl
import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid

import pytest

DEB_DIR = os.environ.get("TESSERA_DEB_DIR")
CACHE = os.environ.get("TESSERA_DEBOOTSTRAP_CACHE", "/var/cache/tessera-test")
SUITE = "bookworm"
USER = "tester"
CODE_RE = re.compile(r"\b(?=[A-Z0-9-]*[A-Z])[A-Z0-9]{4,}(?:-[A-Z0-9]{4,})?\b")

pytestmark = pytest.mark.skipif(not DEB_DIR, reason="TESSERA_DEB_DIR not set: scripts/test builds the packages")


def run(args, **kw):
    out = subprocess.run(args, capture_output=True, text=True, timeout=kw.pop("timeout", 900), **kw)
    assert out.returncode == 0, f"{' '.join(args)}: rc {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def base_root():
    """A minimal Debian 12 root with its package lists, made once and kept as a tarball. Made under
    a lock: scripts/test starts it early (`python3 Tests/e2e/test_package.py --prepare-root`), beside
    the builds, and two runs on one machine may want it at once."""
    tarball = os.path.join(CACHE, f"debian-{SUITE}-minbase.tar")
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(tarball):
            build = tarball + ".d"
            shutil.rmtree(build, ignore_errors=True)
            # No mirror named: debootstrap's default, the one apt uses on this machine.
            run(["debootstrap", "--variant=minbase", SUITE, build], timeout=1800)
            run(["chroot", build, "apt-get", "update"], timeout=900)
            run(["tar", "-C", build, "-cf", tarball + ".tmp", "."], timeout=900)
            os.rename(tarball + ".tmp", tarball)
            shutil.rmtree(build, ignore_errors=True)
    return tarball


class Machine:
    """The Debian root, entered with bubblewrap: its own /proc, /dev, /tmp and /run, this host's
    network (the test IdP listens on 127.0.0.1)."""

    def __init__(self, path):
        self.path = path

    def sh(self, script, user="root", env=None, timeout=900, check=True):
        prefix = [] if user == "root" else ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--init-groups"]
        args = ["bwrap", "--clearenv", "--bind", self.path, "/", "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
                "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf", "--die-with-parent",
                "--setenv", "PATH", "/usr/sbin:/usr/bin:/sbin:/bin", "--setenv", "DEBIAN_FRONTEND", "noninteractive"]
        for k, v in (env or {}).items():
            args += ["--setenv", k, v]
        out = subprocess.run(args + prefix + ["/bin/sh", "-c", script], capture_output=True, text=True,
                             timeout=timeout)
        if check:
            assert out.returncode == 0, f"{script}\nrc {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out

    def popen(self, script, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE):
        args = ["bwrap", "--clearenv", "--bind", self.path, "/", "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
                "--die-with-parent", "--setenv", "PATH", "/usr/sbin:/usr/bin:/sbin:/bin"]
        for k, v in env.items():
            args += ["--setenv", k, v]
        args += ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--init-groups", "/bin/sh", "-c", script]
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, text=True)

    @property
    def uid(self):
        return 1000


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    tarball = base_root()
    path = str(tmp_path_factory.mktemp("debian12") / "root")
    os.makedirs(path)
    run(["tar", "-C", path, "-xf", tarball])
    m = Machine(path)
    m.sh(f"useradd --create-home --uid 1000 --shell /bin/sh {USER} && "
         f"install -d -o 1000 -g 1000 -m 0700 /run/user/1000")
    yield m
    subprocess.run(["rm", "-rf", "--one-file-system", os.path.dirname(path)], timeout=300)


SERVER_PACKAGES = ("tessera", "tessera-microsoft-broker")


def debs(revision, packages=SERVER_PACKAGES):
    found = sorted(p for p in glob.glob(os.path.join(DEB_DIR, f"tessera*-{revision}_*.deb"))
                   if os.path.basename(p).split("_")[0] in packages)
    assert len(found) == len(packages), f"expected {', '.join(packages)}, revision {revision}, in {DEB_DIR}: {found}"
    return found


def install(machine, revision, packages=SERVER_PACKAGES):
    os.makedirs(os.path.join(machine.path, "tmp-debs"), exist_ok=True)
    names = []
    for deb in debs(revision, packages):
        shutil.copy(deb, os.path.join(machine.path, "tmp-debs"))
        names.append("/tmp-debs/" + os.path.basename(deb))
    machine.sh("apt-get install -y --no-install-recommends " + " ".join(names))
    shutil.rmtree(os.path.join(machine.path, "tmp-debs"))


def session_env():
    return {"HOME": f"/home/{USER}", "USER": USER, "XDG_RUNTIME_DIR": "/run/user/1000",
            "TESSERA_CONFIG": f"/home/{USER}/.config/tessera/config.toml", "LANG": "C.UTF-8"}


def write_config(machine):
    home = os.path.join(machine.path, "home", USER)
    os.makedirs(os.path.join(home, ".config", "tessera"), exist_ok=True)
    shutil.copy(os.environ["TESSERA_IDP_CA"], os.path.join(home, ".config", "tessera", "idp-ca.pem"))
    with open(os.path.join(home, ".config", "tessera", "config.toml"), "w") as f:
        f.write(f'default_authority = "{os.environ["TESSERA_IDP_AUTHORITY"]}"\n'
                f'trusted_authorities = ["{os.environ["TESSERA_IDP_URL"]}"]\n'
                f'ca_file = "/home/{USER}/.config/tessera/idp-ca.pem"\n'
                'default_client_id = "tessera-device"\n'
                'default_scopes = ["openid", "profile", "offline_access", "read"]\n'
                'access_mode = "open"\n'
                'store = "file"\n')
    machine.sh(f"chown -R 1000:1000 /home/{USER}/.config")


def session_processes(marker):
    """The processes a session started (its marker in their environment), as `pid command` lines."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"TESSERA_TEST_SESSION={marker}".encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{pid} {command}")
        except OSError:
            continue  # ended, or a kernel thread
    return "\n".join(found)


def kill_session(listing):
    for line in listing.splitlines():
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except OSError:
            pass


def assert_session_ended(marker, result):
    """Nothing a session started outlives it: its bus gone, tesserad and the app end too. Waits for
    them to go (each exits on its own when the bus does), and names any that stay."""
    deadline = time.monotonic() + 60
    while (left := session_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    kill_session(left)
    assert not left, f"still running after the session ended:\n{left}\n{result}"


def in_session(machine, commands, idp=None, user="alice"):
    """Runs shell commands in a session bus of their own (dbus-run-session) as the test user; with
    idp, approves the device code `tessera login --device-code` prints."""
    env = dict(session_env(), TESSERA_TEST_SESSION=uuid.uuid4().hex)
    if idp is None:
        # Into files, not pipes: the session is over when its shell is, whatever it started.
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = machine.popen("exec dbus-run-session -- /bin/sh -ec '" + commands + "'", env, out, err)
            try:
                proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                left = session_processes(env["TESSERA_TEST_SESSION"])
                kill_session(left)
                proc.kill()
                proc.wait()
                out.seek(0), err.seek(0)
                raise AssertionError(f"the session did not end in 180 s; its processes:\n{left}\n"
                                     f"{out.read()[-3000:]}\n{err.read()[-3000:]}")
            out.seek(0), err.seek(0)
            result = proc.returncode, out.read(), err.read()
        assert_session_ended(env["TESSERA_TEST_SESSION"], result)
        return result
    out_file = tempfile.TemporaryFile("w+")
    proc = machine.popen("exec dbus-run-session -- /bin/sh -ec '" + commands + "'", env, out_file)
    since = idp.last_device_grant()
    collected = []
    approved = set()

    def pump():
        # Every device code the session's sign-ins print is approved as `user`.
        for line in proc.stderr:
            collected.append(line)
            for code in CODE_RE.findall(line):
                if code not in approved and code in idp.pending_user_codes(since):
                    approved.add(code)
                    idp.approve_device(code, "--user", user)
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=300)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out_file.seek(0)
        out = out_file.read()
        out_file.close()
    result = proc.returncode, out, "".join(collected)
    assert_session_ended(env["TESSERA_TEST_SESSION"], result)
    return result


def test_the_packages_install_and_work_on_debian_12_without_swift(machine, idp):
    install(machine, 1)
    # A server's packages pull no GTK in: the desktop app is tessera-gtk's.
    assert machine.sh("dpkg -l | grep -c '^ii  libgtk-4' || true").stdout.strip() == "0"
    # No Swift anywhere: not on the machine, not in what the binaries load.
    machine.sh("! ls -d /usr/lib/swift /usr/share/swift 2>/dev/null && ! dpkg -l | grep -i swift")
    for exe in ("tesserad", "tessera"):
        libs = machine.sh(f"ldd /usr/bin/{exe}").stdout
        assert "not found" not in libs and "swift" not in libs.lower() and "Foundation" not in libs, libs
    version = machine.sh("tessera --version", user=USER).stdout
    assert re.match(r"\d+\.\d+\.\d+", version.strip()), version
    write_config(machine)

    # D-Bus activation from the package's service file, the file store, a device-code sign-in.
    # Sign in, a token twice (the second from the cache: the same), sign out; then sign in again,
    # for the upgrade to keep.
    rc, out, err = in_session(
        machine, "tessera --bus login --device-code --timeout 60 >/dev/null; tessera --bus token >/tmp/t1; "
                 "tessera --bus token >/tmp/t2; cmp /tmp/t1 /tmp/t2; tessera --bus logout; "
                 "echo accounts-after-logout; tessera --bus accounts; "
                 "tessera --bus login --device-code --timeout 60 >/dev/null; echo accounts-at-end; "
                 "tessera --bus accounts", idp=idp)
    assert rc == 0, f"{out}\n{err}"
    after_logout, at_end = out.split("accounts-after-logout")[1].split("accounts-at-end")
    assert "alice" not in after_logout and "alice" in at_end, out
    store = os.path.join(machine.path, "home", USER, ".local", "state", "tessera", "store")
    assert os.listdir(store), "the file store holds the account"

    # The administrator's policy in /etc/tessera, as the packaged binaries read it: the user's
    # `tessera config` shows the locked key and its file, and the daemon's status says so.
    machine.sh("mkdir -p /etc/tessera/config.d && printf 'microsoft_broker = false\\n[policy]\\n"
               "locked = [\"microsoft_broker\"]\\n' >/etc/tessera/config.d/10-site.toml")
    try:
        shown = machine.sh("tessera config", user=USER, env=session_env()).stdout
        assert "microsoft_broker = false  # /etc/tessera/config.d/10-site.toml:1, locked" in shown, shown
        rc, out, err = in_session(machine, "tessera --bus status")
        assert rc == 0 and "Locked by the administrator's [policy]: microsoft_broker." in out, f"{out}\n{err}"
        assert "Microsoft broker protocol: off" in out, out
    finally:
        machine.sh("rm -r /etc/tessera")


def test_an_upgrade_keeps_the_account_and_purge_removes_every_installed_file(machine, idp):
    files = machine.sh("dpkg -L tessera tessera-microsoft-broker").stdout.split()
    install(machine, 2)
    assert "-2" in machine.sh("dpkg-query -W -f '${Version}' tessera").stdout
    # After the upgrade the account is there and a silent token needs no sign-in.
    rc, out, err = in_session(machine, "tessera --bus accounts; tessera --bus token >/dev/null && echo token-ok")
    assert rc == 0 and "alice" in out and "token-ok" in out, f"{out}\n{err}"
    rc, out, err = in_session(machine, "tessera --bus logout >/dev/null; tessera --bus accounts --json")
    assert rc == 0 and "alice" not in out, f"{out}\n{err}"

    machine.sh("apt-get purge -y tessera-microsoft-broker tessera")
    left = [f for f in files if os.path.isfile(os.path.join(machine.path, f.lstrip("/")))]
    assert left == [], f"left behind by purge: {left}"
    assert machine.sh("dpkg -l | grep -c '^ii  tessera' || true").stdout.strip() == "0"
    # The user's data is the user's: purge does not touch it.
    assert os.path.exists(os.path.join(machine.path, "home", USER, ".config", "tessera", "config.toml"))
    assert os.path.isdir(os.path.join(machine.path, "home", USER, ".local", "state", "tessera"))


def test_the_desktop_app_package_installs_and_opens_its_window_under_xvfb(machine, idp):
    """tessera-gtk on the same Debian 12 root: apt brings GTK 4, libadwaita and tessera (its
    Depends), the desktop entry and metainfo are where the desktop looks, and tessera-accounts
    starts under Xvfb, with the broker D-Bus activated, and maps its window."""
    install(machine, 2, ("tessera", "tessera-gtk"))
    machine.sh("apt-get install -y --no-install-recommends xvfb x11-utils")
    for path in ("usr/share/applications/org.tessera.Accounts.desktop",
                 "usr/share/metainfo/org.tessera.Accounts.metainfo.xml",
                 "usr/share/icons/hicolor/scalable/apps/org.tessera.Accounts.svg",
                 "usr/share/dbus-1/services/org.tessera.Accounts.service", "usr/share/man/man1/tessera-accounts.1.gz"):
        assert os.path.isfile(os.path.join(machine.path, path)), path
    libs = machine.sh("ldd /usr/bin/tessera-accounts").stdout
    assert "not found" not in libs and "swift" not in libs.lower() and "libadwaita-1" in libs, libs
    write_config(machine)
    # Xvfb (-displayfd: a display no other server on this host holds), then the app; done when its
    # window is mapped (xwininfo), or the app ended (its status). Each wait is bounded in time, and
    # what the app said is shown when it fails. (GTK_A11Y=none: no accessibility bus, which
    # this test does not use, to start and outlive the session.)
    rc, out, err = in_session(
        machine,
        "Xvfb -displayfd 3 -nolisten tcp 3>/tmp/display >/dev/null 2>&1 & xvfb=$!; "
        "timeout 60 sh -c \"until [ -s /tmp/display ]; do sleep 0.1; done\" || { echo no-display; exit 3; }; "
        "export DISPLAY=:$(cat /tmp/display) GSK_RENDERER=cairo GTK_A11Y=none; "
        "tessera-accounts >/tmp/app.log 2>&1 & app=$!; "
        "mapped=0; timeout 90 sh -c \"until xwininfo -root -tree | grep -q \\\"Tessera Accounts\\\"; do "
        "kill -0 $app 2>/dev/null || exit 4; sleep 0.1; done\" || mapped=$?; "
        "[ $mapped -eq 0 ] && echo window-mapped || { echo not-mapped-$mapped; xwininfo -root -tree | head -n 20; "
        "cat /tmp/app.log; }; kill $app $xvfb 2>/dev/null || true")
    assert rc == 0 and "window-mapped" in out, f"rc {rc}\n{out}\n{err}"
    machine.sh("apt-get purge -y tessera-gtk tessera && apt-get autoremove -y --purge")


if __name__ == "__main__":
    # scripts/test: the root made ahead, while the builds run (the tests wait for its lock).
    import sys
    if sys.argv[1:] != ["--prepare-root"]:
        sys.exit("usage: test_package.py --prepare-root")
    print(base_root())
