"""A throwaway OpenSSH server on 127.0.0.1 for the tests of `tessera forward` (Tests/e2e/test_forward.py):
local users made for the run (the "remote" side), host and user keys made here, an sshd of its own
(no system service, no PAM) and an ssh_config naming it, for `ssh -F CONFIG HOST`.

Needs root and /usr/sbin/sshd (Debian's openssh-server; scripts/test installs it where no systemd
runs as init). Facts it relies on (checked with OpenSSH 9.2): `useradd` leaves the password `!`
(locked), and with `UsePAM no` sshd then refuses even a key, hence `-p '*'`; sshd needs its
privilege separation directory /run/sshd, which only the service makes; sshd must be started by
its absolute path."""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time

SSHD = "/usr/sbin/sshd"


def why_not():
    """None when an sshd can run here, else the reason (for pytest.skip)."""
    if os.geteuid() != 0:
        return "needs root to make users and run sshd (CI runs as root)"
    if not os.path.exists(SSHD) or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        if os.path.isdir("/run/systemd/system"):
            return ("needs OpenSSH's server, which scripts/test installs only where no systemd runs as init (on a "
                    "desktop the package would start sshd on port 22): run `sudo apt-get install openssh-server` "
                    "yourself, or the tests in a container")
        return "needs OpenSSH's server (/usr/sbin/sshd, Debian's openssh-server): scripts/test installs it"
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_of(uid):
    """The pids of the processes running as `uid` (by their real uid)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                real = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration, ValueError):
            continue
        if real == uid:
            pids.append(int(entry))
    return pids


def remove_user(name):
    """Removes a test user and its home, and ends its processes (a killed run leaves them)."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        return
    uid = pwd.getpwnam(name).pw_uid
    for _ in range(50):
        left = processes_of(uid)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    subprocess.run(["userdel", "-r", "-f", name], capture_output=True)


def session_user(base):
    """A test user's name for this test process: `base` and its pid. Users are the machine's, so a
    fixed name would let two runs of the tests on one machine (a developer's beside CI's) delete
    each other's users half-way; the users a killed run left are removed first."""
    for entry in pwd.getpwall():
        suffix = entry.pw_name[len(base):]
        if entry.pw_name.startswith(base) and suffix.isdigit() and not os.path.exists(f"/proc/{suffix}"):
            remove_user(entry.pw_name)
    return f"{base}{os.getpid()}"


def make_user(name):
    """A user with a home, bash, and the password `*` (no password login, but not locked)."""
    remove_user(name)
    subprocess.run(["useradd", "-m", "-p", "*", "-s", "/bin/bash", name], check=True, capture_output=True)
    return pwd.getpwnam(name)


class SSHServer:
    """sshd on 127.0.0.1:<free port> letting `users` in with one key; `config` is the ssh_config
    whose `Host <host>` reaches it as the first user."""

    def __init__(self, directory, users, host="tessera-remote"):
        self.dir = str(directory)
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.host = host
        self.users = {}
        self.proc = None
        self.port = free_port()
        self.log_path = os.path.join(self.dir, "sshd.log")
        self.config = os.path.join(self.dir, "ssh_config")
        self.key = os.path.join(self.dir, "userkey")
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        hostkey = os.path.join(self.dir, "hostkey")
        for path in (hostkey, self.key):
            for old in (path, path + ".pub"):
                if os.path.exists(old):
                    os.unlink(old)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tessera-test", "-f", path],
                           check=True, capture_output=True)
        with open(hostkey + ".pub") as f:
            kind, blob = f.read().split()[:2]
        with open(self.known_hosts, "w") as f:
            f.write(f"[127.0.0.1]:{self.port} {kind} {blob}\n")
        for name in users:
            entry = make_user(name)
            self.users[name] = entry
            ssh_dir = os.path.join(entry.pw_dir, ".ssh")
            os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
            shutil.copy(self.key + ".pub", os.path.join(ssh_dir, "authorized_keys"))
            os.chmod(os.path.join(ssh_dir, "authorized_keys"), 0o600)
            self.chown(ssh_dir, name)
        self.sshd_config = os.path.join(self.dir, "sshd_config")
        with open(self.sshd_config, "w") as f:
            f.write(f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {hostkey}\n"
                    f"PidFile {os.path.join(self.dir, 'sshd.pid')}\nUsePAM no\nPasswordAuthentication no\n"
                    "KbdInteractiveAuthentication no\nAuthorizedKeysFile .ssh/authorized_keys\n"
                    f"AllowUsers {' '.join(users)}\nLogLevel DEBUG1\n")
        first = next(iter(users))
        with open(self.config, "w") as f:
            f.write(f"Host {host}\n  HostName 127.0.0.1\n  Port {self.port}\n  User {first}\n"
                    f"  IdentityFile {self.key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
                    f"  StrictHostKeyChecking yes\n  UserKnownHostsFile {self.known_hosts}\n"
                    "  GlobalKnownHostsFile /dev/null\n  LogLevel ERROR\n")

    def chown(self, path, user):
        entry = self.users[user]
        for root, dirs, files in os.walk(path):
            os.chown(root, entry.pw_uid, entry.pw_gid)
            for name in dirs + files:
                os.lchown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)
        if not os.path.isdir(path):
            os.lchown(path, entry.pw_uid, entry.pw_gid)

    def start(self, timeout=60.0):  # a bound against a hang; the event is the port answering
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation; only the service makes it
        checked = subprocess.run([SSHD, "-t", "-f", self.sshd_config], capture_output=True, text=True)
        assert checked.returncode == 0, f"sshd -t: {checked.stderr}"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", self.sshd_config], stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"sshd exited with {self.proc.returncode}:\n{self.log()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"sshd did not listen on port {self.port}:\n{self.log()}")

    def ssh(self, *command, user=None, timeout=60):
        """Runs a command on the "remote" side (as the first user, or `user`), with plain ssh."""
        target = [f"{user}@{self.host}"] if user else [self.host]
        return subprocess.run(["ssh", "-F", self.config, *target, *command], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for name in self.users:
            remove_user(name)
