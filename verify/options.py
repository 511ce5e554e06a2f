"""The options a command shares with others, as frozen values: built once (by one click option
group in `verify/cli/groups.py`, or by a suite file), passed whole to the features.

- `SessionSettings`: how onnxruntime's session is made on the device (run, bench, ci, localize);
- `TimedRuns`: warmup and timed iterations per case;
- `Tolerances`: tolerances given beside an archive's own record (run, bench, diff, pack, ci);
- `ArchiveSelection`: an archive, which of its cases, and those tolerances;
- `DeviceTarget`: a device spec, resolved to its profile (`devices.resolve_profile`);
- `DumpOptions`: `run`'s per-layer dump flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from verify.errors import UsageError
from verify.runner.contract import OPT_LEVELS as _LEVELS
from verify.runner.contract import Job

if TYPE_CHECKING:
    from verify.devices import Profile

OPT_LEVELS = tuple(_LEVELS)  # the runner contract's names, in order


MAX_THREADS = 1024  # intra-op threads: above the largest machines' hardware threads


@dataclass(frozen=True)
class SessionSettings:
    """How the session is made: graph optimization level, intra-op threads (0: onnxruntime's
    default), providers in order (empty: the device profile's) and raw session config entries."""

    opt_level: str = Job.OPT_LEVEL.default  # the runner contract's defaults: a job without
    threads: int = Job.THREADS.default      # the key gets the same from every runner
    providers: tuple[str, ...] = ()
    session_config: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.opt_level not in OPT_LEVELS:
            raise UsageError(f"--opt-level must be one of {', '.join(OPT_LEVELS)}")
        if not 0 <= self.threads <= MAX_THREADS:
            # onnxruntime starts them all before the first run: --threads 100000 hung the
            # device until the job's timeout
            raise UsageError(f"--threads {self.threads}: expected 0 (onnxruntime's default) "
                             f"to {MAX_THREADS}")


@dataclass(frozen=True)
class TimedRuns:
    """Untimed warmup runs, then timed iterations, per case."""

    iterations: int = Job.ITERATIONS.default
    warmup: int = Job.WARMUP.default

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise UsageError("--iter must be at least 1")
        if self.warmup < 0:
            raise UsageError("--warmup must be 0 or more")


@dataclass(frozen=True)
class Tolerances:
    """Tolerances layered over an archive's own record (`tolerance.tolerance_set`): tensor
    globs (`specs`, the first match wins) in front, then a global atol/rtol replacing the
    archive's global rule."""

    atol: float | None = None
    rtol: float | None = None
    specs: tuple[str, ...] = ()
    # those of `specs` from a layer over many archives (a suite's): an archive need not have
    # what they name, so one matching none of its outputs is not a typo to note
    shared: tuple[str, ...] = ()

    def over(self, outer: Tolerances, *, shared: bool = False) -> Tolerances:
        """This (more specific) layer in front of `outer`; `shared`: outer's specs are meant
        for many archives."""
        return Tolerances(self.atol if self.atol is not None else outer.atol,
                          self.rtol if self.rtol is not None else outer.rtol,
                          (*self.specs, *outer.specs),
                          (*self.shared, *outer.shared, *(outer.specs if shared else ())))

    def own_specs(self) -> tuple[str, ...]:
        """The specs meant for this archive (not `shared`)."""
        return tuple(s for s in self.specs if s not in self.shared)


@dataclass(frozen=True)
class ArchiveSelection:
    """An archive to run, which case (None: every case, or what the command picks), and the
    tolerances over its own."""

    archive: Path
    case_index: int | None = None
    tolerances: Tolerances = Tolerances()


@dataclass(frozen=True)
class DeviceTarget:
    """A device as the user named it; `timeout` bounds each job there (None: the profile's)."""

    spec: str = "local"
    insecure_host_key: bool = False
    timeout: float | None = None

    def profile(self) -> Profile:
        """The device's profile (UsageError for a spec that names none)."""
        from verify.devices import resolve_profile

        return resolve_profile(self.spec, self.insecure_host_key)


@dataclass(frozen=True)
class DumpOptions:
    """`run`'s per-layer dump: a folder (`bin_io_dump`) and/or a text file (`io_dump`), the
    live-tensor budget per segment (None: sized by the runner), a name filter, stats only."""

    bin_io_dump: Path | None = None
    io_dump: Path | None = None
    budget_mb: float | None = None
    dump_filter: str | None = None
    stats_only: bool = False

    @property
    def wanted(self) -> bool:
        return self.bin_io_dump is not None or self.io_dump is not None
