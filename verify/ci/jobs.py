"""The job matrix: testcases x devices x option sets, and how a CI run picks its share."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from verify.ci.suite import Device, GateSettings, OptionSet, Suite
from verify.options import ArchiveSelection, DeviceTarget, TimedRuns, Tolerances
from verify.errors import UsageError


@dataclass(frozen=True)
class Job:
    """One testcase on one device with one option set; its id is `testcase/device/options`."""

    testcase: str
    archive: Path
    device: Device
    options: OptionSet
    iterations: int
    warmup: int
    timeout: float | None
    retries: int
    gates: tuple[str, ...]
    tolerance: Tolerances
    settings: GateSettings
    layers: bool = False

    @property
    def id(self) -> str:
        return f"{self.testcase}/{self.device.name}/{self.options.name}"

    @property
    def selection(self) -> ArchiveSelection:
        """Every case of the archive, with the job's tolerances over the archive's own."""
        return ArchiveSelection(self.archive, None, self.tolerance)

    @property
    def target(self) -> DeviceTarget:
        return DeviceTarget(self.device.spec, timeout=self.timeout)

    @property
    def timed(self) -> TimedRuns:
        return TimedRuns(self.iterations, self.warmup)


def expand(suite: Suite) -> list[Job]:
    """Every job of the suite, in suite order (testcases, then devices, then option sets)."""
    jobs = []
    for tc in suite.testcases:
        for dev_name in tc.devices:
            device = suite.devices[dev_name]
            for opt_name in tc.options:
                jobs.append(Job(
                    testcase=tc.name, archive=tc.archive, device=device,
                    options=suite.options[opt_name],
                    iterations=_first(tc.iterations, device.iterations, suite.iterations),
                    warmup=_first(tc.warmup, device.warmup, suite.warmup),
                    timeout=_first(tc.timeout, device.timeout, suite.timeout),
                    retries=suite.retries,
                    gates=_first(tc.gates, device.gates, suite.gates),
                    tolerance=tc.tolerance.over(suite.tolerance, shared=True),
                    settings=suite.settings,
                    layers=tc.layers))
    return jobs


def _first(*values):  # type: ignore[no-untyped-def]
    return next((v for v in values if v is not None), None)


def parse_shard(text: str) -> tuple[int, int]:
    """'2/4' -> (2, 4); shards are numbered from 1."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise UsageError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. --shard 2/4")
    return int(m.group(1)), int(m.group(2))


def shard_of(job_id: str, total: int) -> int:
    """The shard (1..total) a job belongs to: depends only on its id, so adding or removing
    other jobs never moves it, and every CI runner computes the same split."""
    digest = hashlib.sha256(job_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % total + 1


def select(jobs: Sequence[Job], only: Sequence[str] = (),
           shard: tuple[int, int] | None = None) -> list[Job]:
    """The jobs matching any --only pattern (a glob on the id, or one of its three parts),
    then those of this shard."""
    picked = [j for j in jobs if not only or any(_matches(j.id, p) for p in only)]
    if only and not picked:
        raise UsageError(f"--only {' '.join(only)}: matches none of the {len(jobs)} jobs "
                         f"(ids look like {jobs[0].id if jobs else 'testcase/device/options'})")
    if shard is not None:
        index, total = shard
        picked = [j for j in picked if shard_of(j.id, total) == index]
    return picked


def _matches(job_id: str, pattern: str) -> bool:
    return fnmatchcase(job_id, pattern) or pattern in job_id.split("/")
