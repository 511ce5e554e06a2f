"""The `verify` command line: parsing, rendering and exit codes. No logic of its own."""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import select
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import click

from verify import DISTRIBUTION, __version__
from verify.cli.interrupts import Terminated, _term, _term_handled, signals_handled
from verify.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_MISMATCH,
    EXIT_TERMINATED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    VerifyError,
)

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _format_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> str:
    return f"warning: {message}\n"


# numpy's OpenBLAS starts a worker thread per core when numpy is imported, and each spins for
# ~0.1 s of CPU before it sleeps (0.13 s per process on 2 cores; a plain `verify run` of PP-OCRv4
# det paid it in both of its processes). verify never threads BLAS (its dot products are cut
# into pieces below OpenBLAS's threading size), so its processes start none, unless the user
# asked for a number. Processes the command starts meanwhile inherit it (the bundled runner
# sets it itself); a caller of main() in its own process gets its environment back after.
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run the command, map errors to exit codes (see verify/errors.py)."""
    added = BLAS_THREADS[0] not in os.environ
    if added:  # before anything imports numpy
        os.environ[BLAS_THREADS[0]] = BLAS_THREADS[1]
    warnings.formatwarning = _format_warning  # one line, not Python's file:line form
    try:
        with signals_handled():
            return _main(argv)
    finally:
        if added:
            os.environ.pop(BLAS_THREADS[0], None)


def _main(argv: Sequence[str] | None) -> int:
    try:
        code = cli.main(args=list(argv) if argv is not None else None, prog_name="verify",
                        standalone_mode=False)
        code = code if isinstance(code, int) else EXIT_OK
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.UsageError as exc:  # one line, as every other error: not click's three
        where = exc.ctx.command_path if exc.ctx is not None else "verify"
        click.echo(f"error: {exc.format_message().rstrip('.')} (see `{where} --help`)", err=True)
        code = EXIT_USAGE
    except click.ClickException as exc:
        exc.show()
        code = EXIT_USAGE
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        if _term["state"] == "pending":
            _term_handled()
            exc = _term["exc"]()  # raised again while the first one was still unwinding
        if isinstance(exc.__cause__, EOFError):
            # click turns an EOFError that escaped the command into Abort: not Ctrl-C but a bug
            # (a library's EOFError some boundary failed to convert), so not "interrupted"
            click.echo("".join(traceback.format_exception(exc.__cause__)), err=True)
            click.echo("error: internal error (a bug in verify; please report it with the "
                       "trace above)", err=True)
            code = EXIT_INTERNAL
        elif isinstance(exc, Terminated) or isinstance(exc.__cause__, Terminated):
            click.echo("terminated", err=True)
            code = EXIT_TERMINATED
        else:
            click.echo("interrupted", err=True)
            code = EXIT_INTERRUPTED
    except _ReaderGone:
        # nothing more can be said on stdout; what Python would flush at exit must not fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_BROKEN_PIPE
    except VerifyError as exc:
        click.echo(f"error: {exc}", err=True)
        code = exc.exit_code
    except OSError as exc:  # one the code did not convert where it happened: still one line
        where = f"{exc.filename}: " if exc.filename else ""
        from verify.files import os_reason  # numpy: not imported for --help

        click.echo(f"error: {where}{os_reason(exc)}", err=True)
        code = EXIT_USAGE
    except Exception:  # a bug: show everything
        click.echo(traceback.format_exc(), err=True)
        click.echo("error: internal error (a bug in verify; please report it with the trace above)",
                   err=True)
        code = EXIT_INTERNAL
    # a verdict (0 or 1) the reader may not have read all of; an error, an interrupt or a
    # termination is the command's own exit whether the reader stayed or not
    if code in (EXIT_OK, EXIT_MISMATCH) and _reader_left():
        code = EXIT_BROKEN_PIPE
    if _term["state"] == "pending":  # lost where it was raised: the command ran on to its end
        _term_handled()
        terminated = _term["exc"] is Terminated
        click.echo("terminated" if terminated else "interrupted", err=True)
        code = EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    if argv is None:  # the `verify` command itself
        if code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            _exit_interrupted(code)
        sys.exit(code)
    return code


def _exit_interrupted(code: int) -> None:
    """End an interrupted command without the interpreter's module teardown: what is still
    running (a ci job finishing on its device) is waited for and the exit handlers run (temp
    folders go), then the process exits. Tearing h5py's modules down after an interrupt could
    wait forever on a lock an interrupted thread left taken (seen once in ~80 interrupted
    `verify ci` runs: exit 137 after 10 minutes instead of 130)."""
    import atexit

    try:
        scan = sys.modules.get("verify.scan_numba")
        if scan is not None:  # its idle threads never end on their own
            scan.stop_thread_pool()
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
    except KeyboardInterrupt:  # interrupted again while waiting: go now
        pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _max_tensor_mb(ctx: click.Context, param: click.Parameter, value: float | None) -> None:
    if value is None:
        return
    if not (value > 0 and math.isfinite(value)):
        raise UsageError(f"--max-tensor-mb {value:g}: expected a number of MB > 0")
    from verify.schema import MAX_TENSOR_MB_ENV

    previous = os.environ.get(MAX_TENSOR_MB_ENV)
    os.environ[MAX_TENSOR_MB_ENV] = repr(value)  # read where archives are opened

    def restore() -> None:  # main() may run again in this process (tests, embedding)
        if previous is None:
            os.environ.pop(MAX_TENSOR_MB_ENV, None)
        else:
            os.environ[MAX_TENSOR_MB_ENV] = previous

    ctx.call_on_close(restore)


def _ort_log(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is None:
        return
    from verify.reference import ORT_LOG_ENV, ORT_LOG_LEVELS, parse_ort_log

    level = parse_ort_log(value)
    if level is None:
        raise UsageError(f"--ort-log {value!r}: expected one of {', '.join(ORT_LOG_LEVELS)} "
                         "(or 0..4)")
    previous = os.environ.get(ORT_LOG_ENV)
    os.environ[ORT_LOG_ENV] = str(level)  # read where sessions are made and jobs written

    def restore() -> None:
        if previous is None:
            os.environ.pop(ORT_LOG_ENV, None)
        else:
            os.environ[ORT_LOG_ENV] = previous

    ctx.call_on_close(restore)


# The commands, each in its module (verify/cli/NAME_cmd.py), imported only when that command
# runs, completes or shows its help, so `verify --help` does not pay for numpy, rich or the
# features (click's lazy-subcommand pattern). The short help `verify --help` lists is held here;
# tests/test_imports.py checks it against each command's own docstring.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("bench_cmd", "Run ARCHIVE on one device under several settings and compare them: "
                           "latency (avg, sd, min, max), speed-up over the first setting, and "
                           "each setting's error against the ground truth with pass/fail."),
    "ci": ("ci_cmd", "Run the nightly gates of a SUITE file and write reports."),
    "devices": ("devices_cmd", "List device profiles, check that a device is reachable and "
                               "ready, clean its cache."),
    "diff": ("diff_cmd", "Compare ACTUAL against REFERENCE layer by layer and name the first "
                         "divergent tensor."),
    "export": ("export_cmd", "Write the ONNX model held in ARCHIVE to a file (open it in "
                             "Netron, or any ONNX tool)."),
    "inspect": ("inspect_cmd", "Show what a .vtc archive holds: model, inputs/outputs, cases, "
                               "tolerances, provenance."),
    "localize": ("localize_cmd", "Find the node that computes wrong on a device, and write a "
                                 "one-node repro archive."),
    "pack": ("pack_cmd", "Pack MODEL, its inputs and ground-truth outputs into one .vtc "
                         "testcase archive."),
    "profile": ("profile_cmd", "Summarize TRACE, a profile from `verify run --profile` (or any "
                               "ONNX Runtime profile): total time first, then the top nodes "
                               "with their self and cumulative time, FLOPs, achieved FLOP/s, "
                               "bytes moved, bandwidth and shapes."),
    "run": ("run_cmd", "Run ARCHIVE on a device, time it like load_and_run, and check the "
                       "outputs."),
}


class _ReaderGone(Exception):
    """stdout's reader went away (`verify inspect x.vtc | head -1`): stop quietly."""


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has gone (and not some other pipe, a device's,
    that broke)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real file behind stdout
        return False


def _reader_left() -> bool:
    """Whether stdout's reader went away before the command ended (`verify diff ... | head
    -1`), stdout then pointed at /dev/null. A write of over 64 KiB (a long report, a --json
    document) that the reader leaves midway loses the rest without an error in Python, so
    the command ran on to its verdict's exit code as if all of it had been read."""
    try:
        sys.stdout.flush()
        gone = _stdout_gone()
    except BrokenPipeError:
        gone = True
    except (OSError, ValueError, AttributeError):  # stdout closed (`>&-`): sys.stdout is None
        return False
    if gone:  # what Python would flush at exit must not fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return gone


@contextlib.contextmanager
def _reader_gone() -> Iterator[None]:
    """A BrokenPipeError on stdout as _ReaderGone: click's own handling of it exits 1, which
    here means "a check failed"."""
    try:
        yield
    except BrokenPipeError:
        if _stdout_gone():
            raise _ReaderGone() from None
        raise


class LazyGroup(click.Group):
    """A group whose commands in LAZY_COMMANDS are imported on first use."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _reader_gone():  # `verify --help | true`
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _reader_gone():
            return super().invoke(ctx)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in LAZY_COMMANDS:
            importlib.import_module(f"verify.cli.{LAZY_COMMANDS[cmd_name][0]}")  # registers it
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click's, with the short help of a command not yet imported from LAZY_COMMANDS."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            cmd = self.commands.get(name)
            if cmd is not None:
                if cmd.hidden:
                    continue
                rows.append((name, cmd.get_short_help_str(limit)))
            else:
                rows.append((name, click.Command(name, help=LAZY_COMMANDS[name][1])
                             .get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="verify",
                      message=f"%(prog)s %(version)s (distribution {DISTRIBUTION})")
@click.option("--max-tensor-mb", type=float, default=None, expose_value=False, is_eager=True,
              callback=_max_tensor_mb, metavar="MB",
              help="Refuse an archive dataset declaring more than MB (default 2048, or "
                   "$VERIFY_MAX_TENSOR_MB); checked before anything is read.")
@click.option("--ort-log", default=None, expose_value=False, is_eager=True, callback=_ort_log,
              metavar="LEVEL",
              help="Show onnxruntime's own log at LEVEL (verbose, info, warning, error, fatal; "
                   "or $VERIFY_ORT_LOG=0..4), from the sessions made here and from the "
                   "device's runner. Off by default: its errors come as verify's one line.")
def cli() -> None:
    """Check that an ONNX model computes the same thing on a device as on your reference.

    \b
      verify pack model.onnx -d cat.png -o model.vtc   model + inputs + ground truth
      verify inspect model.vtc                          what is inside
      verify run model.vtc --device local --iter 10    time it and check the outputs
      verify run model.vtc --device adb:phone --bin-io-dump phone/
      verify diff phone/ cpu/                           ACTUAL REFERENCE: first divergent layer

    Exit codes: 0 checks held, 1 a check failed, 2 bad usage or input,
    3 device or transport failure, 4 internal error, 130 interrupted, 141 the reader of the
    output went away, 143 terminated (SIGTERM; the device's runner is stopped as for Ctrl-C).
    """
    if os.environ.get("VERIFY_ORT_LOG", "").strip():  # checked by every command, not only
        from verify.reference import requested_ort_log  # those that make a session

        requested_ort_log()


# --- shared option helpers ------------------------------------------------------------------
def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document on stdout instead of text.")(f)


# The document each command's --json prints: "format": "verify-KIND" and its "version" come first
# (README, "JSON output"). A version goes up when a key changes meaning or goes away; new keys
# do not change it. `verify ci --json` prints its report (verify-ci-report, verify/ci/report.py).
JSON_KINDS = ("pack", "inspect", "inspect-model", "inspect-dump", "run", "diff", "diff-case",
              "localize", "profile", "bench", "export", "devices-list", "devices-check",
              "devices-conformance", "devices-clean", "ci-list", "ci-report")
JSON_VERSION = 1


def emit_json(data: Mapping[str, Any], kind: str) -> None:
    """Print one JSON document on stdout, headed by its format name and version."""
    if kind not in JSON_KINDS:
        raise ValueError(f"unknown JSON document kind {kind!r}")
    from verify.files import json_value

    doc = {"format": f"verify-{kind}", "version": JSON_VERSION, **data}
    click.echo(json.dumps(doc, indent=2, sort_keys=False, default=json_value))
