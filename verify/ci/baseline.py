"""Baselines: what a job measured when someone last ran `verify ci --update-goldens`.

Errors: one JSON file per job at `<baselines>/<suite>/<testcase>/<device>/<options>.json`,
keys sorted and indented so a change reads well in a diff. Written only on purpose
(--update-goldens); a missing file is reported as such, never created silently.

Latency: per machine (a median only means something where it was measured), at
`<baselines>/<suite>/latency/<machine fingerprint>/<testcase>/<device>/<options>.json`.
Written by --update-goldens, and recorded by a run that finds none for its machine (the
report says so: that job's latency was recorded, not judged).

A run writes both through `staging.StagedBaselines`: put in place together when it finishes.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verify import __version__
from verify.ci.jobs import Job
from verify.ci.results import JobResult, Latency, TensorError, num, unnum
from verify.errors import UsageError
from verify.files import write_text_atomic

FORMAT = "verify-ci-baseline"
VERSION = 2              # 2: latency moved to per-machine files (a version 1 file's is ignored)
LATENCY_FORMAT = "verify-ci-latency"
LATENCY_VERSION = 1


@dataclass(frozen=True)
class Baseline:
    """The figures the regression and latency gates compare against."""

    outputs: Mapping[str, float]      # "case0/prob" -> max_abs
    layers: Mapping[str, float]       # "case0/conv1:0" -> max_abs (when captured per layer)
    model_sha256: str = ""
    cases_sha256: str = ""  # of the archive's inputs and ground truth ("": not recorded)
    device_spec: str = ""   # the [[device]] spec it was recorded with ("": not recorded)
    options: Mapping[str, Any] | None = None  # the option set it ran with (None: not recorded)


def cases_sha256(testcase: Any) -> str:
    """One digest of an archive's cases: every input and ground-truth tensor, by name, dtype,
    shape and bytes. A baseline recorded for other inputs is another experiment: the same
    model re-packed with other data changed every layer's error, and the regression gate
    compared against the old figures without a word."""
    import hashlib

    from verify.digest import tensor_digest

    h = hashlib.sha256()
    for i, case in enumerate(testcase.cases):
        for role, values in (("in", case.inputs), ("out", case.outputs)):
            for name in sorted(values):
                h.update(f"{i}/{role}/{tensor_digest(name, values[name])}\n".encode())
    return h.hexdigest()


def baseline_path(root: Path, suite_name: str, job: Job) -> Path:
    return root / suite_name / job.testcase / job.device.name / f"{job.options.name}.json"


def latency_path(root: Path, suite_name: str, machine: str, job: Job) -> Path:
    return (root / suite_name / "latency" / machine / job.testcase / job.device.name
            / f"{job.options.name}.json")


def _read(path: Path, fmt: str, version: int) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: unreadable baseline ({exc}); fix it or rewrite it with "
                         "--update-goldens") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise UsageError(f"{path}: not a verify ci baseline (format is not {fmt!r})")
    if int(data.get("version", 0)) > version:
        raise UsageError(f"{path}: baseline version {data.get('version')} is newer than this "
                         f"verify understands ({version}); upgrade verify")
    return data


def _malformed(path: Path, exc: Exception) -> UsageError:
    return UsageError(f"{path}: malformed baseline ({type(exc).__name__}: {exc}); rewrite it "
                      "with --update-goldens")


def load(path: Path) -> Baseline | None:
    """The baseline at `path`, or None when there is none; a malformed one is a UsageError.
    (A version 1 file's latency, recorded on an unknown machine, is not read.)"""
    data = _read(path, FORMAT, VERSION)
    if data is None:
        return None
    try:
        return Baseline(
            outputs={k: unnum(v["max_abs"]) for k, v in data.get("outputs", {}).items()},
            layers={k: unnum(v["max_abs"]) for k, v in data.get("layers", {}).items()},
            model_sha256=str(data.get("model_sha256", "")),
            cases_sha256=str(data.get("cases_sha256", "")),
            device_spec=str((data.get("device") or {}).get("spec", "")),
            options=data.get("options") if isinstance(data.get("options"), dict) else None)
    except (KeyError, TypeError, ValueError) as exc:
        raise _malformed(path, exc) from None


def load_latency(path: Path) -> Latency | None:
    """This machine's latency baseline at `path`, or None when there is none."""
    data = _read(path, LATENCY_FORMAT, LATENCY_VERSION)
    if data is None:
        return None
    try:
        lat = data["latency"]
        return Latency(tuple(unnum(x) for x in lat["samples_ms"]),
                       tuple(unnum(x) for x in lat.get("control_ms", ())))
    except (KeyError, TypeError, ValueError) as exc:
        raise _malformed(path, exc) from None


def _tensor_record(t: TensorError) -> dict[str, Any]:
    return {"max_abs": num(t.max_abs), "threshold": num(t.threshold),
            "tol_units": num(t.tol_units), "rule": t.rule}


def document(result: JobResult, suite_name: str, model_sha256: str,
             cases: str = "") -> dict[str, Any]:
    """The baseline document for a job's result (what --update-goldens writes); `cases`:
    `cases_sha256` of the archive it ran."""
    job = result.job
    doc: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "suite": suite_name, "job": job.id,
        "testcase": job.testcase, "archive": job.archive.name, "model_sha256": model_sha256,
        "cases_sha256": cases,
        "device": {"name": job.device.name, "spec": job.device.spec,
                   **{k: result.device.get(k) for k in ("arch", "os", "python", "onnxruntime")
                      if result.device.get(k) is not None}},
        "options": job.options.to_dict(), "iterations": job.iterations, "warmup": job.warmup,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "verify": __version__,
        "outputs": {t.key: _tensor_record(t) for t in result.outputs},
    }
    if result.layers:
        doc["layers"] = {t.key: _tensor_record(t) for t in result.layers}
    return doc


def latency_document(result: JobResult, suite_name: str, machine_facts: Mapping[str, Any],
                     model_sha256: str) -> dict[str, Any]:
    """This machine's latency baseline for a job's result."""
    job = result.job
    assert result.latency is not None
    return {
        "format": LATENCY_FORMAT, "version": LATENCY_VERSION, "suite": suite_name,
        "job": job.id, "machine": result.machine, "machine_facts": dict(machine_facts),
        "model_sha256": model_sha256, "options": job.options.to_dict(),
        "iterations": job.iterations, "warmup": job.warmup,
        "control": job.settings.latency_control,
        "onnxruntime": result.device.get("onnxruntime"),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "verify": __version__, "latency": result.latency.to_dict(),
    }


def write(path: Path, doc: Mapping[str, Any]) -> None:
    """Write atomically (temp file + rename), keys sorted, one value per line."""
    write_text_atomic(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
