"""Option groups: each adds a few options to a command and hands the command ONE value built
from them (verify/options.py), so commands share flags, help and checks, and a command's
function takes a handful of objects instead of a parameter per flag."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from verify.errors import UsageError, VerifyError

if TYPE_CHECKING:
    from verify.options import Tolerances

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def option_group(target: str, build: Callable[..., Any], params: Sequence[Decorator]) -> Decorator:
    """A decorator adding `params` (click options or arguments, shown in this order) and passing
    the command `target=build(**their values)` in their place."""
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        def probe() -> None: ...
        for param in params:
            param(probe)
        names = [p.name for p in probe.__click_params__]  # type: ignore[attr-defined]

        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in names}
            return f(*args, **kwargs, **{target: build(**values)})

        for param in reversed(params):
            command = param(command)
        return command
    return decorate


# --- the device ----------------------------------------------------------------------------------
DEVICE_HELP = ("local, cuda[:N], ssh:user@host[:port], adb[:SERIAL], or a profile name from "
               "devices/ (see `verify devices list`). The ssh host may be a Host alias of "
               "~/.ssh/config (HostName, User, Port, IdentityFile, ProxyJump apply).")


def complete_device(_ctx: click.Context, _param: click.Parameter,
                    incomplete: str) -> list[click.shell_completion.CompletionItem]:
    """Shell completion for a device spec: the profiles on the search path (devices/,
    $VERIFY_DEVICES), the built-in transports, and profile names after `adb:`/`ssh:`."""
    from click.shell_completion import CompletionItem

    from verify.devices import TRANSPORTS_BUILTIN, list_profiles, profile_names

    names = profile_names()
    transport, colon, _ = incomplete.partition(":")
    if colon:   # adb:phone, ssh:board: a profile of that transport named by the target
        try:
            candidates = [f"{transport}:{p.name}" for p in list_profiles()
                          if p.transport == transport]
        except VerifyError:   # a broken profile: complete nothing rather than fail
            candidates = []
        if transport == "cuda":
            candidates += ["cuda:0", "cuda:1"]
    else:
        candidates = [*names, "local", "cuda", *(f"{t}:" for t in TRANSPORTS_BUILTIN
                                               if t not in ("local", "cuda"))]
    return [CompletionItem(c) for c in dict.fromkeys(candidates) if c.startswith(incomplete)]


insecure_host_key_option = click.option(
    "--insecure-host-key", is_flag=True,
    help="ssh: accept an unknown or changed host key (not recommended).")


def _positive_seconds(ctx: click.Context, param: click.Parameter,
                      value: float | None) -> float | None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise UsageError(f"--timeout {value:g}: expected a number of seconds > 0")
    return value


def device_target(timeout_what: str) -> Decorator:
    """--device SPEC, --timeout SECONDS (> 0, finite; `timeout_what` says which work it bounds)
    and --insecure-host-key → `device`, a DeviceTarget."""
    def build(device_spec: str, timeout: float | None, insecure_host_key: bool) -> Any:
        from verify.options import DeviceTarget

        return DeviceTarget(device_spec, insecure_host_key, timeout)

    return option_group("device", build, (
        click.option("--device", "device_spec", default="local", show_default=True,
                     metavar="SPEC", help=DEVICE_HELP, shell_complete=complete_device),
        click.option("--timeout", type=float, default=None, callback=_positive_seconds,
                     help=f"Seconds {timeout_what} may take on the device (default: the "
                          "profile's [timeouts] command, 600 s if unset)."),
        insecure_host_key_option))


def device_argument(f: Callable[..., Any]) -> Callable[..., Any]:
    """SPEC (an argument) and --insecure-host-key → `device`, a DeviceTarget (`devices check`,
    `devices clean`: commands about the device itself, with no job to time out)."""
    def build(spec: str, insecure_host_key: bool) -> Any:
        from verify.options import DeviceTarget

        return DeviceTarget(spec, insecure_host_key)

    return option_group("device", build, (
        click.argument("spec", shell_complete=complete_device), insecure_host_key_option))(f)


# --- the archive and its tolerances --------------------------------------------------------------
_TOLERANCE_PARAMS = (
    click.option("--atol", type=float, default=None,
                 help="Absolute tolerance; replaces the default rule, alone or with --rtol "
                      "(default: max|x-r| <= 2^-14 * max(max|r|, F), scaled by dtype)."),
    click.option("--rtol", type=float, default=None,
                 help="Relative tolerance; replaces the default rule, alone or with --atol."),
    click.option("--tol", "tol_specs", multiple=True, metavar="GLOB:KEY=V[,KEY=V]",
                 help="Per-tensor tolerance by name glob, e.g. 'prob:atol=1e-4,rtol=1e-3' "
                      "or 'conv*:k=2^-12'; gates 'logits:cos>=0.9999', '*:sqnr>=40' (dB), "
                      "'*:p99_abs<=1e-3' (error percentile). Repeatable; the first match "
                      "wins. Integer tensors stay exact unless a glob names them (not '*'): "
                      "'*_QuantizeLinear_Output:atol=1' lets int8 values differ by one step; "
                      "bool tensors are always exact."))


def _tolerances(atol: float | None, rtol: float | None, tol_specs: tuple[str, ...]
                ) -> Tolerances:
    from verify.options import Tolerances

    return Tolerances(atol, rtol, tuple(tol_specs))


# --atol, --rtol, --tol → `tolerances`, a Tolerances (pack, diff: no archive to run)
tolerance_group = option_group("tolerances", _tolerances, _TOLERANCE_PARAMS)


def archive_selection(case_help: str, case_type: Any = int) -> Decorator:
    """The ARCHIVE argument, --case and the tolerances → `selection`, an ArchiveSelection."""
    def build(archive: Path, case_index: int | None, atol: float | None, rtol: float | None,
              tol_specs: tuple[str, ...]) -> Any:
        from verify.options import ArchiveSelection

        return ArchiveSelection(archive, case_index, _tolerances(atol, rtol, tol_specs))

    return option_group("selection", build, (
        click.argument("archive", type=click.Path(path_type=Path)),
        click.option("--case", "case_index", type=case_type, default=None, help=case_help),
        *_TOLERANCE_PARAMS))


# --- how it runs ---------------------------------------------------------------------------------
def timed_runs(per: str) -> Decorator:
    """--iter and --warmup, as load_and_run has them (`per` says what they count for) →
    `timed`, a TimedRuns."""
    def build(iterations: int, warmup: int) -> Any:
        from verify.options import TimedRuns

        return TimedRuns(iterations, warmup)

    return option_group("timed", build, (
        click.option("--iter", "iterations", type=click.IntRange(min=1), default=10,
                     show_default=True, help=f"Timed iterations per {per}."),
        click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
                     help=f"Untimed warmup runs per {per}.")))


def session_settings(where: str = "") -> Decorator:
    """--provider, --opt-level and --threads (`where` says where the session runs, e.g.
    " on the device") → `session`, a SessionSettings."""
    from verify.options import OPT_LEVELS

    def build(providers: tuple[str, ...], opt_level: str, threads: int) -> Any:
        from verify.options import SessionSettings

        return SessionSettings(opt_level, threads, tuple(providers))

    return option_group("session", build, (
        click.option("--provider", "providers", multiple=True, metavar="NAME",
                     help=f"Execution provider(s){where} in order, e.g. "
                          "CUDAExecutionProvider (default: the device profile's)."),
        click.option("--opt-level", type=click.Choice(list(OPT_LEVELS)), default="all",
                     show_default=True, help=f"ONNX Runtime graph optimization level{where}."),
        click.option("--threads", type=int, default=0, show_default=True,
                     help=f"Intra-op threads{where} (0: onnxruntime's default).")))
