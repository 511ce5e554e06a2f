"""One command on an ssh exec channel, read against a deadline: the ssh driver's `run`.

The command is prefixed with `echo <marker> $$`; `MarkedStream` takes the shell's pid out of
stdout (the process group the driver kills on overrun) and drops what a chatty rc file printed
before it. Both streams are read as data comes, so neither blocks the other. This module
raises nothing of its own: paramiko's exceptions pass through to the driver, which converts
them and owns the connection (probing it, killing the group on a second channel).
"""

from __future__ import annotations

import re
import secrets
import selectors
import time
from collections.abc import Callable, Mapping, Sequence

import paramiko

from verify.drivers.base import shell_command

CHUNK = 1 << 16
KILL_TIMEOUT = 10.0  # bound on killing a timed-out command; a dead link must not hang it
_POLL = 0.05         # longest wait for output before looking again (see pump)


def marked_command(argv: Sequence[str], env: Mapping[str, str],
                   cwd: str | None) -> tuple[str, str]:
    """(marker, command line): the line makes the login shell print `<marker> <its pid>`, then
    run `argv` in `cwd` with `env`.

    The shell waits for the command instead of exec-ing it (`; exit $?` keeps dash and bash from
    exec-ing a last command on their own): a command killed by a signal then ends the shell with
    128+N, where SSH's exit-signal (which paramiko drops) would say nothing. The shell leads the
    process group, so a timeout still kills it all.
    """
    marker = f"verify-pid-{secrets.token_hex(6)}"
    return marker, f"echo {marker} $$; {shell_command(argv, env, cwd, exec_=False)}; exit $?"


def signal_status(status: int, err: bytes) -> tuple[int, bytes]:
    """A marked command's status and stderr as the local driver (subprocess) gives them: the
    shell's 128+N ("killed by signal N") becomes -N, without the shell's own report of it."""
    if 128 < status <= 128 + 64:
        # bash's report ("bash: line 1: 4242 Killed  python3 …") is not the command's output
        err = re.sub(rb"(?:^|\n)[^\n:]+: line \d+: +\d+ [^\n]*\n?$", b"", bytes(err))
        return 128 - status, err
    return status, err


class MarkedStream:
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


def run(chan: paramiko.Channel, command: str, deadline: float, stdout: MarkedStream,
        err: bytearray) -> int | None:
    """Run `command` on the fresh channel `chan`, its output read into `stdout` and `err`.

    Its exit status (-1: none came, killed by a signal or the link died); None when it overran
    `deadline` or closed its outputs and runs on: `stdout.pid` is then the group to kill (None
    if the shell never printed it). The caller closes the channel.
    """
    # A selector, not select(): select() fails on descriptors above 1023.
    ready = selectors.DefaultSelector()
    try:
        chan.exec_command(command)
        chan.shutdown_write()  # stdin at EOF, as the local driver's DEVNULL
        ready.register(chan, selectors.EVENT_READ)  # paramiko's pipe: set on data or EOF
        if pump(chan, ready, stdout, err, deadline):
            # The exit status may trail the EOF by a moment.
            while not chan.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.01)
            if chan.exit_status_ready():
                return chan.recv_exit_status()
            # EOF without an exit: the command closed its outputs and runs on.
        elif stdout.key is not None and not stdout.seen:
            # Overran before the shell even printed its pid (a slow rc file): wait a little
            # longer for the pid, so there is something to kill.
            pump(chan, ready, stdout, err, time.monotonic() + KILL_TIMEOUT,
                 until=lambda: stdout.seen)
        return None
    finally:
        ready.close()


def pump(chan: paramiko.Channel, ready: selectors.BaseSelector, stdout: MarkedStream,
         err: bytearray, deadline: float, until: Callable[[], bool] | None = None) -> bool:
    """Read both streams as data comes (never one blocking the other) until EOF, the deadline,
    or `until()`; True at EOF, when everything has been read."""
    while (remaining := deadline - time.monotonic()) > 0:
        # Capped: paramiko's "or" of the two streams' events can lose a wake-up when one stream
        # is read while the other is fed (seen in 1 of 5 runs with busy stdout and stderr).
        ready.select(min(remaining, _POLL))
        while chan.recv_ready():
            stdout.feed(chan.recv(CHUNK))
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(CHUNK)
        if chan.eof_received or chan.closed:
            stdout.feed(drain(chan.recv))
            err += drain(chan.recv_stderr)
            return True
        if until is not None and until():
            return False
    return False


def drain(recv: Callable[[int], bytes]) -> bytes:
    """Everything left in a stream at EOF (reads return at once then; b'' means empty)."""
    chunks = []
    while data := recv(CHUNK):
        chunks.append(data)
    return b"".join(chunks)


def close_quietly(chan: paramiko.Channel) -> None:
    """Close a channel whose link may have just died. paramiko sends the close message and
    raises EOFError when the socket is gone; from a `finally` that would replace the error
    being raised (a TransferError, say) with an EOFError, which click turns into "interrupted",
    exit 130."""
    try:
        chan.close()
    except (paramiko.SSHException, OSError, EOFError):
        pass
