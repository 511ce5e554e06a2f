"""The ssh transport: one paramiko connection per driver, commands on exec channels, files by SFTP.

Address `user@host[:port]` (user defaults to the local user, port to 22). Authentication by
ssh-agent, the usual ~/.ssh keys and `options.identity` (a key file). Host keys are checked
against `options.known_hosts` (default ~/.ssh/known_hosts): an unknown host or a changed key
is refused; `options.insecure_host_key = true` skips the check and warns.

Commands go to the login shell of the remote user, which must be POSIX (sh, bash, dash, zsh,
ash). Each command is prefixed with `echo <marker> $$` so the driver learns the pid of the
shell, which `exec`s the command: sshd starts every session in a new session and process
group, so that pid is also the group of everything the command starts. When a command
overruns its timeout the driver runs `kill -KILL -- -<pid>` on a second channel, then closes
the first, and raises DeviceTimeout: nothing lingers, except processes that left the group on
purpose (daemons calling setsid). Output a noisy shell rc file prints before the marker is
dropped. A process killed by a signal has no exit status in SSH (paramiko reports -1).

Files go over one SFTP session (put, get, rename, stat, mkdir); a single SFTP reply that takes
longer than the command timeout fails the transfer. Every paramiko and socket exception is
converted here into verify's errors; a dropped link says "connection lost while <what>".
"""

from __future__ import annotations

import errno
import getpass
import logging
import os
import posixpath
import secrets
import selectors
import shlex
import socket
import stat
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

from verify.drivers.base import CommandResult, Driver, DriverConfig, Progress, shell_command
from verify.errors import (ConnectError, DeviceTimeout, ProfileError, TransferError,
                           UsageError)

# Without logging configured, paramiko's ERROR records would reach stderr through logging's
# last-resort handler; verify reports the failure itself as one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def _quiet_prefetch_deaths(args: "threading.ExceptHookArgs") -> None:
    """Drop the traceback of paramiko's SFTP prefetch thread when the link dies under it.

    That helper thread queues a download's read requests; a link dropped meanwhile ends it
    with an EOFError/OSError that nobody catches, and Python would print its traceback. The
    download itself fails too and is reported as one line, so this one says nothing new.
    """
    tb, in_prefetch = args.exc_traceback, False
    while tb is not None:
        in_prefetch = in_prefetch or tb.tb_frame.f_code.co_name == "_prefetch_thread"
        tb = tb.tb_next
    if not (in_prefetch and issubclass(args.exc_type, (EOFError, OSError, paramiko.SSHException))):
        _previous_excepthook(args)


_previous_excepthook = threading.excepthook
threading.excepthook = _quiet_prefetch_deaths

_CHUNK = 1 << 16
_KILL_TIMEOUT = 10.0  # bound on killing a timed-out command; a dead link must not hang it
_KEEPALIVE = 30       # seconds between keepalive messages on an idle connection
_POLL = 0.05          # longest wait for output before looking again (see _pump)


@dataclass(frozen=True)
class SshAddress:
    """`user@host[:port]`, with the defaults filled in."""

    user: str
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> "SshAddress":
        user, _, hostport = text.strip().rpartition("@")
        host, sep, port_text = hostport.partition(":")
        if not host or "@" in user or (sep and not port_text.isdigit()) \
                or not 0 < int(port_text or 22) < 65536:
            raise UsageError(f"ssh:{text}: expected ssh:user@host[:port]")
        return cls(user or getpass.getuser(), host, int(port_text or 22))


class SshDriver(Driver):
    """A device reached over SSH. Use as a context manager; one TCP connection for its lifetime."""

    transport = "ssh"

    def __init__(self, config: DriverConfig) -> None:
        super().__init__(config)
        self.target = SshAddress.parse(config.address)
        self.default_base_dir = f"/tmp/verify-{self.target.user}"
        self.base_dir = config.base_dir or self.default_base_dir
        options = config.options
        self.insecure = _flag(options.get("insecure_host_key", False), "insecure_host_key")
        self.known_hosts = Path(os.path.expanduser(str(
            options.get("known_hosts") or "~/.ssh/known_hosts")))
        identity = options.get("identity")
        self.identity = Path(os.path.expanduser(str(identity))) if identity else None
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None

    # --- connection -----------------------------------------------------------------------
    def _open_impl(self) -> None:
        if self.identity is not None and not self.identity.is_file():
            raise ProfileError(f"{self.describe_address()}: identity file {self.identity} "
                               "does not exist (options.identity)")
        client = paramiko.SSHClient()
        accept_any = _AcceptAny()
        if self.insecure:
            client.set_missing_host_key_policy(accept_any)
        else:
            if self.known_hosts.is_file():
                try:
                    client.load_system_host_keys(str(self.known_hosts))
                except OSError as exc:
                    raise ConnectError(f"{self.describe_address()}: cannot read known_hosts "
                                       f"{self.known_hosts}: {exc.strerror or exc}") from exc
            client.set_missing_host_key_policy(
                _RejectUnknown(self.describe_address(), self.target, self.known_hosts))
        limit = self.config.connect_timeout
        started = time.monotonic()
        try:
            client.connect(self.target.host, self.target.port, username=self.target.user,
                           key_filename=str(self.identity) if self.identity else None,
                           allow_agent=True, look_for_keys=True, timeout=limit,
                           banner_timeout=limit, auth_timeout=limit, channel_timeout=limit)
        except BaseException as exc:
            client.close()
            converted = self._connect_failed(exc, time.monotonic() - started)
            if converted is None:
                raise
            raise converted from exc
        self._client = client
        transport = client.get_transport()
        if transport is not None:
            # NAT boxes and Wi-Fi access points drop idle flows during long silent commands.
            transport.set_keepalive(_KEEPALIVE)
        if accept_any.key is not None:
            warnings.warn(f"{self.describe_address()}: not checking the host key "
                          f"(insecure_host_key); the server sent {_fingerprint(accept_any.key)}",
                          UserWarning, stacklevel=3)

    def _connect_failed(self, exc: BaseException, elapsed: float) -> ConnectError | None:
        """verify's error for a failed connect, or None to let an unexpected one through."""
        where, t = self.describe_address(), self.target
        if isinstance(exc, ConnectError):
            return exc
        if isinstance(exc, paramiko.BadHostKeyException):
            entry = f"[{t.host}]:{t.port}" if t.port != 22 else t.host
            return ConnectError(
                f"{where}: the host key changed: {self.known_hosts} has "
                f"{_fingerprint(exc.expected_key)}, the server sent {_fingerprint(exc.key)}; "
                f"if the device was reinstalled, remove the old key with ssh-keygen -R "
                f"'{entry}' -f {self.known_hosts}, otherwise someone may be intercepting "
                "the connection")
        tried = "ssh-agent, ~/.ssh keys" + (f", {self.identity}" if self.identity else "")
        if isinstance(exc, paramiko.PasswordRequiredException):
            return ConnectError(f"{where}: authentication failed for user {t.user}: a key "
                                f"needs its passphrase (tried {tried}); load it into ssh-agent "
                                "with ssh-add")
        if isinstance(exc, paramiko.AuthenticationException):
            return ConnectError(f"{where}: authentication failed for user {t.user} "
                                f"(tried {tried}); add your public key to the device's "
                                "~/.ssh/authorized_keys or set options.identity")
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            codes = {getattr(e, "errno", None) for e in exc.errors.values()}
            if codes == {errno.ECONNREFUSED}:
                return ConnectError(f"{where}: connection refused by {t.host} port {t.port}; "
                                    "is sshd running there?")
            return ConnectError(f"{where}: cannot connect to {t.host} port {t.port}: "
                                f"{_reason(next(iter(exc.errors.values())))}")
        if isinstance(exc, socket.gaierror):
            return ConnectError(f"{where}: cannot resolve host {t.host}: {exc.strerror or exc}")
        # paramiko gives up a slow handshake without saying so ("No existing session").
        if _timed_out(exc) or (isinstance(exc, (paramiko.SSHException, EOFError))
                               and elapsed >= self.config.connect_timeout):
            return ConnectError(f"{where}: {t.host} port {t.port} did not answer within "
                                f"{self.config.connect_timeout:g} s (connect timeout)")
        if isinstance(exc, OSError):
            return ConnectError(f"{where}: cannot connect to {t.host} port {t.port}: "
                                f"{_reason(exc)}")
        if isinstance(exc, (paramiko.SSHException, EOFError)):
            return ConnectError(f"{where}: ssh handshake with {t.host} port {t.port} failed: "
                                f"{_reason(exc)}")
        return None

    def _close_impl(self) -> None:
        sftp, client, self._sftp, self._client = self._sftp, self._client, None, None
        for thing in (sftp, client):
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # noqa: BLE001 - closing a broken link must not raise
                    pass

    def _transport(self, what: str) -> paramiko.Transport:
        transport = self._client.get_transport() if self._client else None
        if transport is None or not transport.is_active():
            raise ConnectError(f"{self.describe_address()}: connection lost ({what}); "
                               "reconnect and retry")
        return transport

    def _alive(self) -> bool:
        transport = self._client.get_transport() if self._client else None
        return transport is not None and transport.is_active()

    def _probe(self) -> bool:
        """True if the link still answers: opens and closes a channel (one round trip)."""
        if not self._alive():
            return False
        try:
            self._transport("probing").open_session(
                timeout=min(self.config.connect_timeout, _KILL_TIMEOUT)).close()
        except Exception:  # noqa: BLE001 - any failure here means the link is gone
            return False
        return True

    # --- commands -------------------------------------------------------------------------
    def _exec_impl(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str],
                   cwd: str | None) -> CommandResult:
        what = f"running {posixpath.basename(argv[0])}"
        marker = f"verify-pid-{secrets.token_hex(6)}"
        status, out, err = self._exec_channel(
            f"echo {marker} $$; {shell_command(argv, env, cwd)}", timeout, what, marker, argv)
        return CommandResult(tuple(argv), status, out.decode(errors="replace"),
                             err.decode(errors="replace"))

    def _exec_channel(self, command: str, timeout: float, what: str, marker: str | None,
                      argv: Sequence[str]) -> tuple[int, bytes, bytes]:
        """Run one command string; kill its process group and raise DeviceTimeout on overrun."""
        where = self.describe_address()
        try:
            chan = self._transport(what).open_session(timeout=self.config.connect_timeout)
        except ConnectError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, ConnectError) from exc
        deadline = time.monotonic() + timeout
        stdout = _MarkedStream(marker)
        err = bytearray()
        # A selector, not select(): select() fails on descriptors above 1023.
        ready = selectors.DefaultSelector()
        try:
            chan.exec_command(command)
            chan.shutdown_write()  # stdin at EOF, as the local driver's DEVNULL
            ready.register(chan, selectors.EVENT_READ)  # paramiko's pipe: set on data or EOF
            if _pump(chan, ready, stdout, err, deadline):
                # The exit status may trail the EOF by a moment.
                while not chan.exit_status_ready() and time.monotonic() < deadline:
                    time.sleep(0.01)
                if chan.exit_status_ready():
                    status = chan.recv_exit_status()
                    # No exit status: killed by a signal (SSH's exit-signal, which paramiko
                    # drops), or the link died, which closes every channel a moment before
                    # paramiko marks the transport inactive.
                    if status == -1 and not self._probe():
                        raise ConnectError(f"{where}: connection lost while {what}")
                    return status, stdout.value(), bytes(err)
                # EOF without an exit: the command closed its outputs and runs on.
            elif marker is not None and not stdout.seen:
                # Overran before the shell even printed its pid (a slow rc file): wait a little
                # longer for the pid, so there is something to kill.
                _pump(chan, ready, stdout, err, time.monotonic() + _KILL_TIMEOUT,
                      until=lambda: stdout.seen)
            # Kill the whole process group on the device; the channel is closed below.
            self._kill_group(stdout.pid)
            unknown = "" if stdout.pid is not None or marker is None else \
                "; its pid was unknown, so it may still be running"
            shown = shlex.join(argv)[:120].replace("\n", "\\n")  # keep the message one line
            raise DeviceTimeout(f"{where}: {shown} did not finish within {timeout:g} s{unknown}")
        except (DeviceTimeout, ConnectError):
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, ConnectError) from exc
        except BaseException:
            self._kill_group(stdout.pid)  # interrupted (Ctrl-C): leave nothing running
            raise
        finally:
            ready.close()
            chan.close()

    def _kill_group(self, pid: int | None) -> None:
        if pid is None or not self._alive():
            return
        group = shlex.join(["kill", "-KILL", "--", f"-{pid}"])
        single = shlex.join(["kill", "-KILL", str(pid)])
        try:
            self._exec_channel(f"{group} 2>/dev/null || {single}", _KILL_TIMEOUT,
                               "killing a timed-out command", None, ["kill", str(pid)])
        except (DeviceTimeout, ConnectError):
            pass

    # --- files ----------------------------------------------------------------------------
    def _sftp_client(self, what: str) -> paramiko.SFTPClient:
        if self._sftp is not None and not self._sftp.get_channel().closed:
            return self._sftp
        try:
            sftp = self._transport(what).open_sftp_client()
        except ConnectError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, ConnectError) from exc
        if sftp is None:
            raise ConnectError(f"{self.describe_address()}: the server refused the sftp "
                               f"subsystem ({what}); enable 'Subsystem sftp' in its sshd_config")
        # A stalled link must fail a transfer, not hang it; no single reply may take longer.
        sftp.get_channel().settimeout(self.config.command_timeout)
        self._sftp = sftp
        return sftp

    def _put_impl(self, local: Path, remote: str, progress: Progress | None) -> None:
        what = f"copying {local} to {remote}"
        sftp = self._sftp_client(what)
        try:
            sftp.put(str(local), remote, callback=_adapt(progress), confirm=True)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, TransferError) from exc

    def _get_impl(self, remote: str, local: Path, progress: Progress | None) -> None:
        what = f"fetching {remote}"
        sftp = self._sftp_client(what)
        try:
            # Unbounded prefetch (paramiko's default): its helper thread queues every read
            # request at once and ends, instead of living on and dying noisily with the link.
            sftp.get(remote, str(local), callback=_adapt(progress))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, TransferError) from exc

    def _rename_impl(self, src: str, dst: str) -> None:
        what = f"renaming {src} to {dst}"
        sftp = self._sftp_client(what)
        try:
            sftp.posix_rename(src, dst)
        except OSError as exc:
            if exc.errno is None and self._probe():
                # No posix-rename@openssh.com extension on this server: let mv(1) do it.
                super()._rename_impl(src, dst)
                return
            raise self._lost(what, exc, TransferError) from exc
        except (paramiko.SSHException, EOFError) as exc:
            raise self._lost(what, exc, TransferError) from exc

    def _exists_impl(self, path: str) -> bool:
        what = f"checking {path}"
        sftp = self._sftp_client(what)
        try:
            sftp.stat(path)
        except FileNotFoundError:
            return False
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, TransferError) from exc
        return True

    def _makedirs_impl(self, path: str) -> None:
        what = f"creating {path}"
        sftp = self._sftp_client(what)
        try:
            _sftp_makedirs(sftp, path)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, TransferError) from exc

    # --- errors ---------------------------------------------------------------------------
    def _lost(self, what: str, exc: BaseException,
              cls: type[TransferError] | type[ConnectError]) -> Exception:
        """The error for a failure while doing `what`: says so when the connection is gone."""
        where = self.describe_address()
        # An OSError with an errno is the server's answer (no such file, ...): the link works.
        answered = isinstance(exc, OSError) and exc.errno is not None and not _timed_out(exc)
        if not answered and not self._probe():
            return cls(f"{where}: connection lost while {what}")
        if _timed_out(exc):
            return cls(f"{where}: no answer within {self.config.command_timeout:g} s while {what}")
        return cls(f"{where}: {what} failed: {_reason(exc)}")


# --- host-key policies ----------------------------------------------------------------------
class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    """Refuse a host that known_hosts does not list, with the command that would add it."""

    def __init__(self, where: str, target: SshAddress, known_hosts: Path) -> None:
        self.where, self.target, self.known_hosts = where, target, known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        port = f"-p {self.target.port} " if self.target.port != 22 else ""
        raise ConnectError(
            f"{self.where}: host key not in {self.known_hosts}; add it with ssh-keyscan {port}"
            f"{self.target.host} >> {self.known_hosts} (after checking its fingerprint "
            f"{_fingerprint(key)}) or pass --insecure-host-key")


class _AcceptAny(paramiko.MissingHostKeyPolicy):
    """The explicit opt-out: accept any key; remember it so the driver can warn."""

    key: paramiko.PKey | None = None

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        self.key = key


# --- helpers --------------------------------------------------------------------------------
def _flag(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0", ""):
        return value.lower() in ("true", "yes", "1")
    raise ProfileError(f"options.{name} must be true or false, not {value!r}")


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _timed_out(exc: BaseException | None) -> bool:
    """True if exc, or what it was raised from, is a timeout (paramiko wraps some of them)."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class _MarkedStream:
    """stdout of a command prefixed with `echo MARKER $$`: takes the pid out, keeps the rest.

    Anything before the marker line (a chatty shell rc file) is dropped.
    """

    def __init__(self, marker: str | None) -> None:
        self.key = marker.encode() + b" " if marker else None
        self.seen = False
        self.pid: int | None = None
        self.head = bytearray()
        self.body = bytearray()

    def feed(self, data: bytes) -> None:
        if self.key is None or self.seen:
            self.body += data
            return
        self.head += data
        start = self.head.find(self.key)
        end = self.head.find(b"\n", start) if start >= 0 else -1
        if end >= 0:
            text = self.head[start + len(self.key):end]
            self.seen, self.pid = True, int(text) if text.isdigit() and int(text) > 1 else None
            self.body += self.head[end + 1:]
            self.head.clear()

    def value(self) -> bytes:
        # No marker seen (a shell that is not POSIX?): hand back all of it rather than nothing.
        return bytes(self.body if self.key is None or self.seen else self.head)


def _pump(chan: paramiko.Channel, ready: selectors.BaseSelector, stdout: _MarkedStream,
          err: bytearray, deadline: float, until: Callable[[], bool] | None = None) -> bool:
    """Read both streams as data comes (never one blocking the other) until EOF, the deadline,
    or `until()`; True at EOF, when everything has been read."""
    while (remaining := deadline - time.monotonic()) > 0:
        # Capped: paramiko's "or" of the two streams' events can lose a wake-up when one stream
        # is read while the other is fed (seen in 1 of 5 runs with busy stdout and stderr).
        ready.select(min(remaining, _POLL))
        while chan.recv_ready():
            stdout.feed(chan.recv(_CHUNK))
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(_CHUNK)
        if chan.eof_received or chan.closed:
            stdout.feed(_drain(chan.recv))
            err += _drain(chan.recv_stderr)
            return True
        if until is not None and until():
            return False
    return False


def _drain(recv: Callable[[int], bytes]) -> bytes:
    """Everything left in a stream at EOF (reads return at once then; b'' means empty)."""
    chunks = []
    while data := recv(_CHUNK):
        chunks.append(data)
    return b"".join(chunks)


def _adapt(progress: Progress | None) -> Callable[[int, int], None] | None:
    """paramiko reports bytes so far; verify's Progress wants bytes since the last call."""
    if progress is None:
        return None
    done = 0

    def callback(sofar: int, total: int) -> None:
        nonlocal done
        if sofar > done:
            progress(sofar - done)
            done = sofar
    return callback


def _sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    try:
        mode = sftp.stat(path).st_mode
    except FileNotFoundError:
        parent = posixpath.dirname(path.rstrip("/"))
        if parent and parent != path:
            _sftp_makedirs(sftp, parent)
        try:
            sftp.mkdir(path)
            return
        except OSError as exc:
            try:
                mode = sftp.stat(path).st_mode  # created meanwhile by someone else?
            except OSError:
                raise exc from None
    if mode is None or not stat.S_ISDIR(mode):
        raise NotADirectoryError(errno.ENOTDIR, f"{path} exists and is not a directory")
