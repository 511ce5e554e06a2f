"""The ssh transport: one paramiko connection per driver, commands on exec channels.

Address `[user@]host[:port]`, where host may be a `Host` alias of the user's OpenSSH client
config (HostName, User, Port, IdentityFile, IdentitiesOnly, UserKnownHostsFile and ProxyJump
are honoured; see ssh_route.py), user defaults to the local user, port to 22. Authentication by
ssh-agent, the usual ~/.ssh keys, the config's IdentityFile and `options.identity` (a key
file). Host keys of the device and of every jump host are checked against known_hosts
(`options.known_hosts`, else the config's UserKnownHostsFile, else ~/.ssh/known_hosts): an
unknown host or a changed key is refused; `options.insecure_host_key = true` skips the check
and warns. Jump hosts are chained in-process: a direct-tcpip channel on one hop's connection is
the socket of the next (ssh_login.py).

Commands go to the login shell of the remote user, which must be POSIX (sh, bash, dash, zsh,
ash). Each command is prefixed with `echo <marker> $$` so the driver learns the pid of the
shell, which runs the command and waits for it: sshd starts every session in a new session and
process group, so that pid is also the group of everything the command starts. When a command
overruns its timeout the driver runs `kill -KILL -- -<pid>` on a second channel, then closes
the first, and raises DeviceTimeout: nothing lingers, except processes that left the group on
purpose (daemons calling setsid). Output a noisy shell rc file prints before the marker is
dropped (ssh_exec.py). A process killed by a signal has no exit status in SSH (paramiko
reports -1).

Files: uploads, small downloads (up to 256 KiB), renames, stat and mkdir go over one SFTP
session when the server has the subsystem, else over exec (`cat > path`, `cat path`, `mv`,
`test -e`, `mkdir -p`; ssh_files.py, size and sha256 checked); larger downloads always stream
through `cat`. No SFTP prefetch: its helper thread dies with an uncaught exception when the
link drops. A single SFTP reply or a transfer stalled longer than the command timeout fails
the transfer. Every
paramiko and socket exception is converted here into verify's errors; a dropped link says
"connection lost while <what>".
"""

from __future__ import annotations

import logging
import os
import posixpath
import shlex
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import paramiko

from verify.drivers import ssh_exec, ssh_files
from verify.drivers.channel import LineChannel, command_text
from verify.drivers.base import (
    CommandResult,
    Driver,
    DriverConfig,
    Progress,
)
from verify.drivers.ssh_exec import KILL_TIMEOUT, close_quietly
from verify.drivers.ssh_login import (Login, fingerprint, insecure_host_key, log_in, open_tunnel,
                                      reason, timed_out)
from verify.drivers.ssh_route import SshHop, route
from verify.errors import ConnectError, DeviceError, DeviceTimeout, ProfileError, TransferError

# Without logging configured, paramiko's ERROR records would reach stderr through logging's
# last-resort handler; verify reports the failure itself as one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

SFTP, EXEC = "sftp", "exec"
# Downloads up to this size use sequential SFTP reads (32 KiB each, one round trip apiece);
# larger ones stream through `cat` (see _get_impl and benchmarks/bench_ssh_transfers.py).
_SFTP_GET_MAX = 256 << 10


class SshDriver(Driver):
    """A device reached over SSH. Use as a context manager; one TCP connection for its lifetime
    (through the jump hosts' connections when the ssh config names ProxyJump)."""

    transport = "ssh"

    def __init__(self, config: DriverConfig) -> None:
        super().__init__(config)
        options = config.options
        self.insecure = insecure_host_key(options)
        identity = options.get("identity")
        self.identity = Path(os.path.expanduser(str(identity))) if identity else None
        self.route: tuple[SshHop, ...] = route(config.address, options)
        self.target = self.route[-1]
        self.default_base_dir = f"/tmp/verify-{self.target.user}"
        self.base_dir = config.base_dir or self.default_base_dir
        self._logins: list[Login] = []
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._files: str | None = None  # SFTP or EXEC once known

    # --- connection -----------------------------------------------------------------------
    def _open_impl(self) -> None:
        if self.identity is not None and not self.identity.is_file():
            raise ProfileError(f"{self.describe_address()}: identity file {self.identity} "
                               "does not exist (options.identity)")
        limit = self.config.connect_timeout
        logins: list[Login] = []
        try:
            for i, hop in enumerate(self.route):
                sock = open_tunnel(logins[-1], self.route[i - 1], hop, self.describe_address(),
                                   limit) if i else None
                logins.append(log_in(hop, self._where(i), limit, self.insecure, sock))
        except BaseException:
            for login in reversed(logins):
                login.client.close()
            raise
        self._logins, self._client = logins, logins[-1].client
        for i, login in enumerate(logins):
            if login.unchecked_key is not None:
                warnings.warn(f"{self._where(i)}: not checking the host key (insecure_host_key);"
                              f" the server sent {fingerprint(login.unchecked_key)}",
                              UserWarning, stacklevel=3)

    def _where(self, hop_index: int) -> str:
        """How messages name a hop: the device spec, plus which jump host for a jump."""
        if hop_index == len(self.route) - 1:
            return self.describe_address()
        return f"{self.describe_address()}: jump host {self.route[hop_index].describe()}"

    def transfer_method(self) -> str:
        """How files travel to this device, in words (asks the server for sftp once)."""
        self._sftp_client("checking for an sftp subsystem")
        return "sftp (large downloads: cat over exec)" if self._files == SFTP else \
            "cat over exec (the server has no sftp subsystem)"

    def _close_impl(self) -> None:
        sftp, logins = self._sftp, self._logins
        self._sftp, self._client, self._logins = None, None, []
        for thing in (sftp, *(login.client for login in reversed(logins))):
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
                timeout=min(self.config.connect_timeout, KILL_TIMEOUT)).close()
        except Exception:  # noqa: BLE001 - any failure here means the link is gone
            return False
        return True

    # --- commands -------------------------------------------------------------------------
    def _exec_impl(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str],
                   cwd: str | None) -> CommandResult:
        what = f"running {posixpath.basename(argv[0])}"
        marker, command = ssh_exec.marked_command(argv, env, cwd)
        status, out, err = self._exec_channel(command, timeout, what, marker, argv)
        status, err = ssh_exec.signal_status(status, err)
        return CommandResult(tuple(argv), status, out.decode(errors="replace"),
                             err.decode(errors="replace"))

    def _exec_channel(self, command: str, timeout: float, what: str, marker: str | None,
                      argv: Sequence[str]) -> tuple[int, bytes, bytes]:
        """Run one command string; kill its process group and raise DeviceTimeout on overrun."""
        where = self.describe_address()
        chan = self._open_channel(what)
        deadline = time.monotonic() + timeout
        stdout = ssh_exec.MarkedStream(marker)
        err = bytearray()
        try:
            status = ssh_exec.run(chan, command, deadline, stdout, err)
            if status is not None:
                # No exit status: killed by a signal (SSH's exit-signal, which paramiko
                # drops), or the link died, which closes every channel a moment before
                # paramiko marks the transport inactive.
                if status == -1 and not self._probe():
                    raise ConnectError(f"{where}: connection lost while {what}")
                return status, stdout.value(), bytes(err)
            # Kill the whole process group on the device; the channel is closed below.
            self._kill_group(stdout.pid)
            unknown = "" if stdout.pid is not None or marker is None else \
                "; its pid was unknown, so it may still be running"
            shown = command_text(argv)  # one line, cut in the middle
            raise DeviceTimeout(f"{where}: {shown} did not finish within {timeout:g} s{unknown}")
        except (DeviceTimeout, ConnectError):
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, ConnectError) from exc
        except BaseException:
            self._kill_group(stdout.pid)  # interrupted (Ctrl-C): leave nothing running
            raise
        finally:
            close_quietly(chan)

    def _spawn_impl(self, argv: Sequence[str], *, env: Mapping[str, str],
                    cwd: str | None) -> LineChannel | None:
        from verify.drivers.ssh_serve import SshChannel

        what = f"starting {posixpath.basename(argv[0])}"
        marker, command = ssh_exec.marked_command(argv, env, cwd)
        chan = self._open_channel(what)
        try:
            chan.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            close_quietly(chan)
            raise self._lost(what, exc, ConnectError) from exc
        return SshChannel(chan, argv, self.describe_address(), marker, self._probe,
                          self._kill_group)

    def _kill_group(self, pid: int | None) -> None:
        if pid is None or not self._alive():
            return
        group = shlex.join(["kill", "-KILL", "--", f"-{pid}"])
        single = shlex.join(["kill", "-KILL", str(pid)])
        try:
            self._exec_channel(f"{group} 2>/dev/null || {single}", KILL_TIMEOUT,
                               "killing a timed-out command", None, ["kill", str(pid)])
        except (DeviceTimeout, ConnectError):
            pass

    # --- files ----------------------------------------------------------------------------
    def _sftp_client(self, what: str) -> paramiko.SFTPClient | None:
        """The SFTP session; None when the server has no sftp subsystem (exec transfers)."""
        if self._files == EXEC:
            return None
        if self._sftp is not None and not self._sftp.get_channel().closed:
            return self._sftp
        try:
            sftp = self._transport(what).open_sftp_client()
        except ConnectError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            # OpenSSH without `Subsystem sftp` closes the channel ("Channel closed."); if the
            # link still answers, that is the answer.
            if self._files is None and not timed_out(exc) and self._probe():
                self._files = EXEC
                return None
            raise self._lost(what, exc, ConnectError) from exc
        if sftp is None:
            self._files = EXEC
            return None
        # A stalled link must fail a transfer, not hang it; no single reply may take longer.
        sftp.get_channel().settimeout(self.config.command_timeout)
        self._sftp, self._files = sftp, SFTP
        return sftp

    def _open_channel(self, what: str) -> paramiko.Channel:
        """A new session channel on the connection; a lost link is a ConnectError."""
        try:
            return self._transport(what).open_session(timeout=self.config.connect_timeout)
        except ConnectError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, ConnectError) from exc

    def _exec_transfer(self, what: str, remote: str,
                       move: Callable[[paramiko.Channel], ssh_files.Outcome]) -> None:
        """Run one exec-channel transfer; a refusal or a failed check is a TransferError."""
        chan = self._open_channel(what)
        try:
            chan.settimeout(self.config.command_timeout)
            outcome = move(chan)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, TransferError) from exc
        finally:
            close_quietly(chan)
        if outcome.status == -1 and not self._probe():
            raise TransferError(f"{self.describe_address()}: connection lost while {what}")
        problem = outcome.problem(remote)
        if problem is not None:
            raise TransferError(f"{self.describe_address()}: {what} failed: {problem}")

    def _put_impl(self, local: Path, remote: str, progress: Progress | None) -> None:
        what = f"copying {local} to {remote}"
        sftp = self._sftp_client(what)
        if sftp is None:
            self._exec_transfer(what, remote,
                                lambda chan: ssh_files.put(chan, local, remote, progress))
            return
        try:
            sftp.put(str(local), remote, callback=ssh_files.adapt_progress(progress), confirm=True)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if "size mismatch" in str(exc):  # paramiko's pipelined writes hide the server's
                raise TransferError(f"{self.describe_address()}: {what} failed: "  # ENOSPC
                                    f"{self._short_write(remote, local.stat().st_size, exc)}"
                                    ) from exc
            raise self._lost(what, exc, TransferError) from exc

    def _short_write(self, remote: str, size: int, exc: BaseException) -> str:
        """Why an SFTP upload came up short: a full disk where the device's folder has less
        room than the file, the partial copy removed first ("size mismatch in put!" said
        nothing of it), else paramiko's words."""
        folder = posixpath.dirname(remote) or "."
        with self._cleaning_up():
            try:
                self._try_remove(remote)  # the partial file: the room there was before it
                df = self.run(["df", "-Pk", folder], check=False)
                free = int(df.stdout.splitlines()[-1].split()[3]) * 1024 if df.status == 0 \
                    else None
            except (DeviceError, ValueError, IndexError):
                free = None
        if free is not None and free < size:
            return (f"No space left on device ({free / 2**20:.1f} MB free in {folder}, the file "
                    f"is {size / 2**20:.1f} MB)")
        return reason(exc)

    def _get_impl(self, remote: str, local: Path, progress: Progress | None) -> None:
        what = f"fetching {remote}"
        sftp = self._sftp_client(what)
        if sftp is not None:
            try:
                size = sftp.stat(remote).st_size
                if size is not None and size <= _SFTP_GET_MAX:
                    # Plain SFTP reads in this thread: a few round trips, no process started on
                    # the device (a layer dump fetches hundreds of small files). No prefetch:
                    # paramiko's prefetch thread dies noisily when the link drops.
                    sftp.get(remote, str(local), callback=ssh_files.adapt_progress(progress),
                             prefetch=False)
                    return
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise self._lost(what, exc, TransferError) from exc
        # Large files, or no SFTP: one stream through `cat`, size and sha256 checked.
        self._exec_transfer(what, remote,
                            lambda chan: ssh_files.get(chan, remote, local, progress))

    def _rename_impl(self, src: str, dst: str) -> None:
        what = f"renaming {src} to {dst}"
        sftp = self._sftp_client(what)
        if sftp is None:
            super()._rename_impl(src, dst)
            return
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

    def _remove_impl(self, path: str) -> None:
        what = f"removing {path}"
        sftp = self._sftp_client(what)
        try:
            if sftp is not None and ssh_files.sftp_remove_small(sftp, path):
                return
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, TransferError) from exc
        super()._remove_impl(path)  # no SFTP, or a large tree: one `rm -rf`

    def _exists_impl(self, path: str) -> bool:
        what = f"checking {path}"
        sftp = self._sftp_client(what)
        if sftp is None:
            return super()._exists_impl(path)
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
        if sftp is None:
            super()._makedirs_impl(path)
            return
        try:
            ssh_files.sftp_makedirs(sftp, path)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(what, exc, TransferError) from exc

    # --- errors ---------------------------------------------------------------------------
    def _lost(self, what: str, exc: BaseException,
              cls: type[TransferError] | type[ConnectError]) -> Exception:
        """The error for a failure while doing `what`: says so when the connection is gone."""
        where = self.describe_address()
        # An OSError with an errno is the server's answer (no such file, ...): the link works.
        answered = isinstance(exc, OSError) and exc.errno is not None and not timed_out(exc)
        if not answered and not self._probe():
            return cls(f"{where}: connection lost while {what}")
        if timed_out(exc):
            return cls(f"{where}: no answer within {self.config.command_timeout:g} s while {what}")
        return cls(f"{where}: {what} failed: {reason(exc)}")

