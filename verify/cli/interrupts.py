"""Ctrl-C and SIGTERM: both unwind the command as KeyboardInterrupt does (the device's runner
stopped, nothing half-written kept), and neither is lost where Python drops what a signal
handler raises."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, a cancelled CI job, kill): unwound like Ctrl-C, so the device's runner
    is stopped and nothing half-written stays; without it Python died at once and left the
    runner running on the device."""


# The interrupt's state: "" none, "pending" raised, "handled" caught by _main; "exc" is what was
# raised (Terminated for SIGTERM, KeyboardInterrupt for Ctrl-C). Raised from a signal handler,
# it is lost where the signal lands in a weakref callback or a __del__ (h5py's registry: 1 in 4
# SIGTERMs to `verify localize`, which then ran to its normal exit code), so while it is pending
# it is raised again every REARM_S (SIGALRM), and a command that returns with it pending still
# exits 143 (130 for Ctrl-C).
_term: dict[str, Any] = {"state": "", "exc": Terminated}
REARM_S = 0.25


def _pending(exc: type[KeyboardInterrupt]) -> None:
    if _term["state"] != "pending":  # a second signal: the first one's kind stands
        _term["exc"] = exc
    _term["state"] = "pending"
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, REARM_S, REARM_S)
    raise _term["exc"]()


def _terminated(signum: int, frame: Any) -> None:
    _pending(Terminated)


def _interrupted(signum: int, frame: Any) -> None:
    """Ctrl-C: KeyboardInterrupt as Python raises it, kept pending as SIGTERM is."""
    _pending(KeyboardInterrupt)


def _rearm(signum: int, frame: Any) -> None:
    if _term["state"] == "pending" and not _unwinding(sys.exc_info()[1]):
        raise _term["exc"]()


def _unwinding(exc: BaseException | None) -> bool:
    """Whether the interrupt is still on its way up: the code the alarm landed in handles it (a
    `finally`, an `except` or an `__exit__` cleaning up: a device's runner stopped, its work
    folder removed), or an exception raised while handling it. Raised again there, it would
    cut that cleanup short; only an interrupt that was lost is raised again."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (KeyboardInterrupt, click.exceptions.Abort)):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _term_handled() -> None:
    """The interrupt reached _main: no more re-raising."""
    _term["state"] = "handled"
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, 0)


@contextmanager
def signals_handled() -> Iterator[None]:
    """SIGTERM, SIGALRM (the re-raise) and Ctrl-C handled as above while the command runs (in
    the main thread only), the caller's handlers put back after."""
    previous = alarm = interrupt = None
    if threading.current_thread() is threading.main_thread():
        _term.update(state="", exc=Terminated)
        previous = signal.signal(signal.SIGTERM, _terminated)
        if hasattr(signal, "SIGALRM"):
            alarm = signal.signal(signal.SIGALRM, _rearm)
            # Ctrl-C kept pending too, unless the caller ignores it or handles it its own way
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                interrupt = signal.signal(signal.SIGINT, _interrupted)
    try:
        yield
    finally:
        if previous is not None:
            _term_handled()
            signal.signal(signal.SIGTERM, previous)
            if alarm is not None:
                signal.signal(signal.SIGALRM, alarm)
            if interrupt is not None:
                signal.signal(signal.SIGINT, interrupt)
