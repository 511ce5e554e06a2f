"""SIGTERM raised from its handler is lost where it lands in a weakref callback or a __del__
(h5py's registry: 1 in 4 SIGTERMs to `verify localize`, which then ran on to its normal exit
code): while it is pending it is raised again, and a command that returns with it pending
still exits 143. Ctrl-C likewise (130). It is not raised again while it is on its way up: a
cleanup it runs (a `finally` stopping a device's runner) is not cut short."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from verify import cli
from verify.cli import interrupts
from verify.errors import EXIT_INTERRUPTED, EXIT_TERMINATED

LOST_THEN_RAISED = textwrap.dedent("""
    import signal, sys, time
    from verify.cli import interrupts as cli
    signal.signal(signal.SIGALRM, cli._rearm)
    handler = getattr(cli, sys.argv[1])

    class Swallows:
        def __del__(self):  # as a weakref callback: Python prints and drops what it raises
            handler(signal.SIGTERM, None)

    Swallows()
    try:
        time.sleep(10)
        print("ran on")
    except KeyboardInterrupt as exc:
        print(type(exc).__name__, "again")
""")

needs_timer = pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"),
                                 reason="needs setitimer")


@needs_timer
@pytest.mark.parametrize("handler, raised", [("_terminated", "Terminated"),
                                             ("_interrupted", "KeyboardInterrupt")])
def test_an_interrupt_lost_in_a_destructor_is_raised_again(handler: str, raised: str) -> None:
    proc = subprocess.run([sys.executable, "-c", LOST_THEN_RAISED, handler], capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout == f"{raised} again\n", proc.stdout + proc.stderr
    assert "Exception ignored" in proc.stderr  # the first one was lost as in the field


CLEANUP_RUNS_WHOLE = textwrap.dedent("""
    import signal, sys, time
    from verify.cli import interrupts as cli
    signal.signal(signal.SIGALRM, cli._rearm)
    try:
        try:
            cli._interrupted(signal.SIGINT, None)
        finally:  # stopping a device's runner, removing its folder: longer than a re-arm
            try:
                raise OSError("already gone")  # a cleanup step failing on its own
            except OSError:
                time.sleep(4 * cli.REARM_S)
            time.sleep(4 * cli.REARM_S)
            print("cleaned up")
    except KeyboardInterrupt:
        print("interrupted once")
""")


@needs_timer
def test_an_interrupt_on_its_way_up_does_not_cut_its_cleanup_short() -> None:
    proc = subprocess.run([sys.executable, "-c", CLEANUP_RUNS_WHOLE], capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout == "cleaned up\ninterrupted once\n", proc.stdout + proc.stderr


@pytest.mark.parametrize("exc, code, said", [(interrupts.Terminated, EXIT_TERMINATED, "terminated"),
                                             (KeyboardInterrupt, EXIT_INTERRUPTED, "interrupted")])
def test_a_command_returning_with_an_interrupt_pending_exits_as_interrupted(
        exc: type, code: int, said: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(interrupts._term, "state", "pending")
    monkeypatch.setitem(interrupts._term, "exc", exc)
    assert cli._main(["--version"]) == code
    assert capsys.readouterr().err == f"{said}\n" and interrupts._term["state"] == "handled"
