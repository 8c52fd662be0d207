"""tessera.socket and tessera.service under a real user service manager (`systemd --user`, Debian's
own), as on a desktop or a server with lingering: the unit files from systemd/, installed for an
unprivileged user, socket activation by the manager itself, and the client's check of who serves
the socket against what the manager says.

The manager runs in a mount namespace of its own, where /run/systemd/system exists (systemd
refuses to run a user instance on a system not booted with it, as in this container), inside a
cgroup delegated to the user, as logind's user@.service would give it. The user's commands run in
the same mount namespace, as a login would.

Why it matters: with socket activation the kernel names the process that called listen(), the
manager, as the socket's peer, whichever process accepts; a client that trusted only
tessera.service's MainPID refused every call after the first."""
import json
import os
import pwd
import shutil
import socket
import struct
import subprocess
import tempfile
import textwrap

import pytest

from conftest import REPO, TESSERA, TESSERAD, session_config, toml_value, wait_until
from test_access import cgroup2_root
from test_direct_socket import FAKE_SERVER
from test_no_session_bus import device_code_login
from tessera_sshd import remove_user, session_user

USER = session_user("tessera-e2e-mgr")
SYSTEMD = "/lib/systemd/systemd"

def cgroup_of(pid):
    with open(f"/proc/{pid}/cgroup") as f:
        return [line for line in f.read().splitlines() if line.startswith("0::")][0][3:]


def report_lines(path, count):
    """The first `count` lines of an impostor's report, once it has written them."""
    def lines():
        try:
            with open(path) as f:
                found = f.read().splitlines()
        except FileNotFoundError:
            return None
        return found if len(found) >= count else None
    return wait_until(lines, timeout=40, what=f"{count} lines in {path}")


def missing():
    if os.geteuid() != 0:
        return "needs root to run a user manager for another user (CI runs as root)"
    for tool in (SYSTEMD, shutil.which("unshare"), shutil.which("nsenter"), shutil.which("runuser"),
                 shutil.which("systemctl"), shutil.which("useradd")):
        if not tool or not os.access(tool, os.X_OK):
            return f"{tool} is missing"
    root = cgroup2_root()
    if not root:
        return "no cgroup2 hierarchy to delegate to the user manager"
    probe = os.path.join(root, f"tessera-e2e-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as e:
        return f"cannot make a cgroup under {root} to delegate ({e})"
    return None


pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")


class UserManager:
    """`systemd --user` for USER, with tessera.socket and tessera.service installed from systemd/."""

    def __init__(self):
        self.proc = self.log = None
        try:
            self.pw = pwd.getpwnam(USER)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                            "--shell", "/usr/sbin/nologin", USER], check=True)
            self.pw = pwd.getpwnam(USER)
        self.base = tempfile.mkdtemp(prefix="tessera-manager.", dir="/tmp")
        os.chmod(self.base, 0o755)
        self.bin = os.path.join(self.base, "bin")
        os.mkdir(self.bin)
        for exe in (TESSERAD, TESSERA):
            shutil.copy2(exe, self.bin)
        self.home = self.mine("home")
        self.runtime = self.mine("run")
        os.chmod(self.runtime, 0o700)
        self.config_home = self.mine("home/.config")
        units = self.mine("home/.config/systemd/user")
        with open(os.path.join(REPO, "systemd", "tessera.service")) as f:
            self.write(os.path.join(units, "tessera.service"), f.read().replace("@bindir@", self.bin))
        with open(os.path.join(REPO, "systemd", "tessera.socket")) as f:
            self.write(os.path.join(units, "tessera.socket"), f.read())
        self.units = units
        # The session's identity provider, with its CA where the user can read it; the file store.
        values = session_config()
        for key in ("browser", "ca_file"):
            values.pop(key, None)
        ca = os.path.join(self.home, "idp-ca.pem")
        shutil.copy(session_config()["ca_file"], ca)
        os.chown(ca, self.pw.pw_uid, self.pw.pw_gid)
        values.update(ca_file=ca, store="file", log_level="info")
        tessera_config = self.mine("home/.config/tessera")
        os.chmod(tessera_config, 0o700)
        self.write(os.path.join(tessera_config, "config.toml"),
                   "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()))
        self.socket = os.path.join(self.runtime, "tessera", "bus")
        # The user's delegated cgroup, as user@.service has it.
        self.cgroup = os.path.join(cgroup2_root(), f"tessera-e2e-{os.getpid()}")
        os.mkdir(self.cgroup)
        for root, dirs, files in os.walk(self.cgroup):
            for name in [root] + [os.path.join(root, n) for n in files]:
                os.chown(name, self.pw.pw_uid, self.pw.pw_gid)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self):
        self.log = open(os.path.join(self.base, "manager.log"), "wb")
        script = (f"mkdir -p /run/systemd && mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system && "
                  f"echo $$ > {self.cgroup}/cgroup.procs && "
                  f"exec runuser -u {USER} -- env -i {' '.join(self.environment())} {SYSTEMD} --user")
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        wait_until(lambda: self.proc.poll() is not None or os.path.exists(
            os.path.join(self.runtime, "systemd", "private")), timeout=30, what="systemd --user to start")
        assert self.proc.poll() is None, self.manager_log()
        # The manager itself, not runuser: the process that holds its private socket (which may
        # exist a moment before it listens).
        self.pid = wait_until(self.listening_pid, what="systemd --user to listen on its private socket")

    def mine(self, relative):
        path = os.path.join(self.base, relative)
        os.makedirs(path, exist_ok=True)
        os.chown(path, self.pw.pw_uid, self.pw.pw_gid)
        return path

    def write(self, path, text):
        with open(path, "w") as f:
            f.write(text)
        os.chown(path, self.pw.pw_uid, self.pw.pw_gid)

    def environment(self, **extra):
        env = dict(PATH="/usr/local/bin:/usr/bin:/bin", HOME=self.home, XDG_RUNTIME_DIR=self.runtime,
                   XDG_CONFIG_HOME=self.config_home, **extra)
        return [f"{k}={v}" for k, v in env.items()]

    def command(self, *args, **env):
        """ARGS as the user, in the manager's mount namespace, with a login's environment."""
        return ["nsenter", f"--mount=/proc/{self.proc.pid}/ns/mnt", "runuser", "-u", USER, "--", "env", "-i",
                *self.environment(**env), *args]

    def run(self, *args, env=None, timeout=60):
        return subprocess.run(self.command(*args, **(env or {})), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def tessera(self, *args, env=None):
        return self.run(os.path.join(self.bin, "tessera"), *args, env=env)

    def status(self):
        out = self.tessera("status", "--json")
        return json.loads(out.stdout), out

    def systemctl(self, *args):
        out = self.run("systemctl", "--user", *args)
        assert out.returncode == 0, f"systemctl --user {' '.join(args)}: {out.stderr}"
        return out.stdout

    def unit(self, name):
        text = self.systemctl("show", "-p", "ActiveState,MainPID,SubState", name)
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def listening_pid(self):
        """The process listening on the manager's private socket (SO_PEERCRED); None until it
        listens."""
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(os.path.join(self.runtime, "systemd", "private"))
            return struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        except ConnectionRefusedError:
            return None
        finally:
            s.close()

    def manager_log(self):
        with open(os.path.join(self.base, "manager.log"), errors="replace") as f:
            return f.read()[-3000:]

    def device_login(self, idp, user, client="tessera-device"):
        device_code_login(idp, user, self.command(os.path.join(self.bin, "tessera"), "login", "--device-code",
                                                  "--client-id", client, "--timeout", "60"))

    def close(self):
        # Everything in the user's cgroup (the manager, tesserad, the units' processes) at once.
        kill = os.path.join(self.cgroup, "cgroup.kill")
        if os.path.exists(kill):
            with open(kill, "w") as f:
                f.write("1")
        else:
            subprocess.run(["pkill", "-KILL", "-u", USER])
        if self.proc:
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        subprocess.run(["pkill", "-KILL", "-u", USER])
        if self.log:
            self.log.close()
        for root, dirs, _ in os.walk(self.cgroup, topdown=False):
            for d in dirs:
                wait_until(lambda: not _rmdir(os.path.join(root, d)), what=f"cgroup {root}/{d} to empty")
        wait_until(lambda: not _rmdir(self.cgroup), what="the test's cgroup to empty")
        shutil.rmtree(self.base, ignore_errors=True)
        remove_user(USER)  # named for this test process: nothing else uses it


def _rmdir(path):
    """Removes an empty cgroup; True while it still has processes."""
    try:
        os.rmdir(path)
        return False
    except FileNotFoundError:
        return False
    except OSError:
        return True


@pytest.fixture
def manager():
    m = UserManager()  # cleans up after itself when it cannot start
    try:
        yield m
    finally:
        m.close()


def test_tessera_socket_under_systemd_user_starts_tesserad_and_serves_every_later_call(manager, idp):
    m = manager
    m.systemctl("start", "tessera.socket")
    assert m.unit("tessera.service")["ActiveState"] == "inactive"
    st = os.stat(m.socket)
    assert st.st_uid == m.pw.pw_uid and st.st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(m.socket)).st_mode & 0o777 == 0o700
    # The first call starts tessera.service through the socket.
    report, out = m.status()
    assert report["running"] and report["connection"] == "socket", out.stdout + out.stderr
    service = m.unit("tessera.service")
    assert service["ActiveState"] == "active", service
    main_pid = int(service["MainPID"])
    assert os.path.realpath(f"/proc/{main_pid}/exe") == os.path.realpath(os.path.join(m.bin, "tesserad"))
    # tesserad, running as the user, leaves no core file: its memory holds every token.
    with open(f"/proc/{main_pid}/limits") as f:
        core = [line.split()[4:6] for line in f if line.startswith("Max core file size")][0]
    assert core == ["0", "0"], core
    # What a client is told listens there: the manager, which called listen(), not tesserad.
    probe = socket.socket(socket.AF_UNIX)
    probe.connect(m.socket)
    listener = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    probe.close()
    assert listener == m.pid != main_pid
    # Every later call is served: the manager vouches for the socket as tessera.socket's.
    for _ in range(3):
        report, out = m.status()
        assert report["running"] and report["connection"] == "socket", out.stdout + out.stderr
    # A sign-in by device code and a token, through the activated service.
    m.device_login(idp, "alice")
    first = m.tessera("token", "--client-id", "tessera-device")
    assert first.returncode == 0 and len(first.stdout.strip()) >= 20, first.stderr
    # The service stops; the socket stays with the manager; the next call starts it again, and the
    # file store still has the account: no new sign-in.
    m.systemctl("stop", "tessera.service")
    assert m.unit("tessera.service")["ActiveState"] == "inactive"
    assert m.unit("tessera.socket")["ActiveState"] == "active"
    again = m.tessera("token", "--client-id", "tessera-device")
    assert again.returncode == 0 and again.stdout.strip() == first.stdout.strip(), again.stderr
    assert int(m.unit("tessera.service")["MainPID"]) not in (0, main_pid)


def test_a_same_user_impostor_gets_nothing_from_its_cgroup_name_or_from_another_socket_unit(manager):
    m = manager
    m.systemctl("start", "tessera.socket")
    report, out = m.status()
    assert report["running"], out.stdout + out.stderr
    main_pid = int(m.unit("tessera.service")["MainPID"])

    # 1. A program of the user's, in a cgroup it made itself and named tessera.service (a user
    # service may: the user owns the manager's delegated cgroup tree), serving a socket of its own.
    script = os.path.join(m.home, "impostor.py")
    m.write(script, textwrap.dedent(FAKE_SERVER))
    evil_cgroup = os.path.join(m.cgroup, "evil", "tessera.service")
    fake = os.path.join(m.mine("home/fake"), "bus")
    os.chmod(os.path.dirname(fake), 0o700)
    report = os.path.join(m.home, "impostor-1.report")
    started = m.run("systemd-run", "--user", "--collect", "--quiet", "--unit", "impostor-1", "sh", "-c",
                    f"mkdir -p {evil_cgroup} && {{ echo $$ > {evil_cgroup}/cgroup.procs; }} 2>/dev/null; "
                    f"exec python3 {script} {fake} {report}")
    assert started.returncode == 0, started.stderr
    assert report_lines(report, 1)[0] == "listening"
    pid = int(m.unit("impostor-1.service")["MainPID"])
    if not cgroup_of(pid).endswith("/evil/tessera.service"):
        # This machine's kernel refuses an unprivileged process any cgroup move (EIO), even inside
        # its own delegated tree, which Linux otherwise allows: the move the impostor makes
        # elsewhere is made for it here.
        with open(os.path.join(evil_cgroup, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    assert cgroup_of(pid).endswith("/evil/tessera.service"), cgroup_of(pid)
    out = m.tessera("token", env={"TESSERA_SOCKET": fake})
    assert out.returncode == 12, out.stdout + out.stderr
    assert f"tessera.service runs as process {main_pid}" in out.stderr, out.stderr
    assert report_lines(report, 2)[1] == "0", "the impostor was sent something"

    # 2. A socket the manager holds for another unit of the user's: the manager is the listener,
    # but not for tessera.socket.
    counted = os.path.join(m.home, "impostor-2.report")
    m.write(os.path.join(m.units, "impostor.socket"), "[Socket]\nListenStream=%t/impostor/bus\nAccept=no\n")
    m.write(os.path.join(m.units, "impostor.service"),
            f"[Service]\nExecStart=/usr/bin/python3 {script} 3 {counted}\n")
    m.systemctl("daemon-reload")
    m.systemctl("start", "impostor.socket")
    other = os.path.join(m.runtime, "impostor", "bus")
    out = m.tessera("token", env={"TESSERA_SOCKET": other})
    assert out.returncode == 12, out.stdout + out.stderr
    assert f"held by your service manager (process {m.pid}), but not as tessera.socket's" in out.stderr, out.stderr
    # The connection woke impostor.service, which was sent nothing.
    assert report_lines(counted, 2) == ["listening", "0"]
    # The real socket is still the broker's.
    report, out = m.status()
    assert report["running"] and report["connection"] == "socket", out.stdout + out.stderr

    # 3. tessera.service stopped (no MainPID to compare with), and a program of the user's puts
    # its own socket in the place of tessera.socket's, in the user's own directory.
    m.systemctl("stop", "tessera.service")
    report3 = os.path.join(m.home, "impostor-3.report")
    taker = subprocess.Popen(m.command("sh", "-c", f"rm -f {m.socket} && exec python3 {script} {m.socket} {report3}"),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert report_lines(report3, 1)[0] == "listening"
        out = m.tessera("token")
        assert out.returncode == 12, out.stdout + out.stderr
        assert "belongs to tessera.socket, but process" in out.stderr, out.stderr
        assert report_lines(report3, 2)[1] == "0", "the impostor was sent something"
    finally:
        if taker.poll() is None:
            taker.kill()
        taker.wait()
    # The manager makes its socket again; the broker is reached through it.
    m.systemctl("restart", "tessera.socket")
    report, out = m.status()
    assert report["running"] and report["connection"] == "socket", out.stdout + out.stderr
