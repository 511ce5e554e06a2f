"""A real OpenSSH sshd on loopback, for the ssh tests (fixtures_ssh.py) and the benchmarks.

No pytest here: benchmarks/bench_devices.py starts the same server on an install without it.

Each server lives in its own temp dir: sshd_config, an ed25519 host key, a client key, its
authorized_keys and a known_hosts holding the host key. It listens on 127.0.0.1 at a free high
port and lets in the user running the tests (root included: PermitRootLogin prohibit-password).

Needs /usr/sbin/sshd and ssh-keygen (Debian: openssh-server, openssh-client); start_sshd raises
ServerUnavailable when they are absent (the tests skip). Run as root, sshd also needs its privilege separation directory
(/run/sshd on Debian, normally made by systemd) and the `sshd` user (made by the package):
a missing directory is created, root-owned, mode 0755, and left in place (another sshd may
be using it by the time we finish). Run as another user, sshd needs neither.
"""

from __future__ import annotations

import getpass
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
START_DEADLINE = 15.0   # seconds for sshd to accept connections
POLL = 0.02

__all__ = ["ServerUnavailable", "SshServer", "free_port", "keygen", "process_alive", "start_sshd"]


class ServerUnavailable(RuntimeError):
    """sshd or ssh-keygen is not installed here (tests skip, benchmarks say so)."""


def _which_keygen() -> str | None:
    for d in ("/usr/bin", "/bin", *os.environ.get("PATH", "").split(os.pathsep)):
        candidate = Path(d) / "ssh-keygen"
        if d and candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of asking)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str = "verify-test") -> str:
    """Make an ed25519 key pair at path (no passphrase); return the public key line."""
    keygen_bin = _which_keygen()
    assert keygen_bin, "ssh-keygen not found"
    subprocess.run([keygen_bin, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, capture_output=True)
    return path.with_name(path.name + ".pub").read_text().strip()


@dataclass
class SshServer:
    """One running sshd and the files a client needs to reach it."""

    root: Path
    port: int
    user: str
    proc: subprocess.Popen[bytes]
    host_key: str            # "ssh-ed25519 AAAA..." as a known_hosts line wants it
    client_key: Path         # private key authorized on the server
    known_hosts: Path
    log: Path
    _stopped: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    @property
    def host_entry(self) -> str:
        return f"[127.0.0.1]:{self.port}"

    def profile(self, base_dir: str, **options: object):
        """A Profile reaching this server; options override known_hosts and identity."""
        from verify.devices import Profile

        # ssh_config none: the user's own ~/.ssh/config must not change what the tests reach.
        merged = {"known_hosts": str(self.known_hosts), "identity": str(self.client_key),
                  "ssh_config": "none", **options}
        return Profile(name="ssh-test", transport="ssh", address=self.address,
                       base_dir=base_dir, python=(sys.executable,), options=merged)

    def session_pids(self) -> list[int]:
        """Every process below the listening sshd: per-connection sshds, shells, commands."""
        return _descendants(self.proc.pid)

    def kill_sessions(self) -> None:
        """Drop every connection at once (SIGKILL to all of the server's descendants)."""
        pids = self.session_pids()
        for pid in pids:
            _kill(pid, signal.SIGKILL)
        _wait_gone(pids)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.kill_sessions()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def start_sshd(root: Path, attempts: int = 5, *, sftp: bool = True, forwarding: bool = False,
               log_level: str = "INFO", extra: tuple[str, ...] = ()) -> SshServer:
    """Start sshd in `root` (created) and wait until it accepts; retries if the port was taken.

    `sftp=False` leaves out the SFTP subsystem; `forwarding=True` lets clients open
    direct-tcpip channels (a jump host); `extra` adds sshd_config lines."""
    if not SSHD.is_file():
        raise ServerUnavailable(f"{SSHD} not found; install openssh-server to run the ssh tests")
    if _which_keygen() is None:
        raise ServerUnavailable("ssh-keygen not found; install openssh-client to run the ssh "
                                "tests")
    root.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    host_pub = keygen(root / "host_ed25519_key", "verify-test-host")
    client_pub = keygen(root / "client_key", "verify-test-client")
    (root / "authorized_keys").write_text(client_pub + "\n")
    host_key = " ".join(host_pub.split()[:2])
    if os.geteuid() == 0:
        _ensure_privsep_dir(Path("/run/sshd"))
    last_log = ""
    for attempt in range(attempts):
        port = free_port()
        config = root / "sshd_config"
        config.write_text(_config(root, port, user, sftp, forwarding, log_level, extra))
        log = root / f"sshd-{attempt}.log"
        with open(log, "wb") as log_fh:
            proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)],
                                    stdin=subprocess.DEVNULL, stdout=log_fh, stderr=log_fh,
                                    start_new_session=True)
        known_hosts = root / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_key}\n")
        server = SshServer(root, port, user, proc, host_key, root / "client_key", known_hosts, log)
        if _wait_listening(server):
            return server
        server.stop()
        last_log = server.log_text()
        missing = re.search(r"Missing privilege separation directory: (\S+)", last_log)
        if missing and os.geteuid() == 0:
            _ensure_privsep_dir(Path(missing.group(1)))
            continue
        if "Address already in use" not in last_log:
            break
    raise RuntimeError(f"sshd did not start; its log:\n{last_log}")


def _config(root: Path, port: int, user: str, sftp: bool = True, forwarding: bool = False,
            log_level: str = "INFO", extra: tuple[str, ...] = ()) -> str:
    return "\n".join([
        f"Port {port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {root / 'host_ed25519_key'}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}",
        f"AllowUsers {user}",
        "PidFile none",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",                        # PAM stacks fail in containers and need root
        "StrictModes no",                   # keys live under /tmp
        "PermitRootLogin prohibit-password",
        # internal-sftp: no dependence on where sftp-server is installed
        *(["Subsystem sftp internal-sftp"] if sftp else []),
        "UseDNS no",
        "PrintMotd no",
        "X11Forwarding no",
        f"AllowTcpForwarding {'local' if forwarding else 'no'}",
        "MaxSessions 64",
        "MaxStartups 64",
        f"LogLevel {log_level}",
        *extra,
        "",
    ])


def _ensure_privsep_dir(path: Path) -> None:
    if not path.is_dir():
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(path, 0o755)


def _wait_listening(server: SshServer) -> bool:
    deadline = time.monotonic() + START_DEADLINE
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=1):
                return True
        except OSError:
            time.sleep(POLL)
    return False


def _descendants(root_pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_alive(pid: int) -> bool:
    """True if pid runs (a zombie, killed but not reaped yet, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_gone(pids: list[int], deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while any(process_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(POLL)
