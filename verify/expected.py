"""Cases and ground truth that come from elsewhere, for `pack`.

`pack -d` takes, besides its own specs (verify/inputs.py), whole cases from another tool: an
onnx_test_runner folder (its `output_K.pb` become the ground truth) or a Polygraphy inputs
JSON file (`polygraphy run --save-inputs`). Such a source supplies every case, so it is the
only `-d` of its pack.

`pack --expected` stores ground truth computed elsewhere (training code, another runtime,
another machine) instead of this host's onnxruntime:
    --expected FILE        a Polygraphy outputs JSON (`--save-outputs`), an onnx_test_runner
                           folder, a .npz of arrays named after the outputs, or for a
                           single-output model a .npy, .pb or .json array
    --expected NAME:FILE   output NAME's array; a repeated NAME starts the next case
The model still runs on this host, to check that every output is given, with the shape and
dtype onnxruntime computes (a float64 file for a float32 output is cast; anything else is an
error); the values stored are the given ones. Its values are compared with the given ones under
the archive's tolerances (`host_agreement`, the provenance's `host_vs_given`): pack warns where
they already differ.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from verify.datafiles import check_file, fmt_names, load_data_file
from verify.errors import InputError
from verify.foreign import (ForeignCase, is_polygraphy, is_test_runner_dir, read_polygraphy,
                            read_test_runner_dir)
from verify.inputs import InputInfo


@dataclass(frozen=True)
class ForeignSource:
    """The cases `-d` took from another tool's files."""

    cases: tuple[ForeignCase, ...]
    labels: tuple[str, ...]

    @property
    def has_outputs(self) -> bool:
        return any(c.outputs for c in self.cases)

    def inputs(self, infos: Sequence[InputInfo]) -> list[dict[str, np.ndarray]]:
        names = [i.name for i in infos]
        return [_by_name(c.inputs, names, "input", " ".join(self.labels)) for c in self.cases]

    def outputs(self, names: Sequence[str]) -> list[dict[str, np.ndarray]]:
        return [_by_name(c.outputs, names, "output", " ".join(self.labels)) for c in self.cases]


def _foreign(path: Path, label: str) -> list[ForeignCase] | None:
    """The cases in `path` when it is another tool's file or folder, else None."""
    if is_test_runner_dir(path):
        return read_test_runner_dir(path, label)
    if path.suffix.lower() == ".json" and path.is_file():
        import json

        try:
            obj = json.loads(path.read_bytes())
        except (ValueError, OSError):
            return None  # inputs.py reads it, and says what is wrong
        if is_polygraphy(obj):
            return read_polygraphy(path, label)
    return None


def read_case_sources(data: Sequence[str]) -> ForeignSource | None:
    """The cases of `-d` specs naming another tool's files; None when there are none."""
    found = [(spec, _foreign(Path(spec).expanduser(), spec)) for spec in data]
    foreign = [(spec, cases) for spec, cases in found if cases is not None]
    if not foreign:
        return None
    if len(foreign) != len(data):
        other = next(spec for spec, cases in found if cases is None)
        raise InputError(f"-d {foreign[0][0]} supplies whole cases; -d {other} cannot be added "
                         "to them (put every input in that source)")
    cases = tuple(c for _, cs in foreign for c in cs)
    if not any(c.inputs for c in cases):
        raise InputError(f"-d {foreign[0][0]}: holds outputs only; give it to --expected")
    return ForeignSource(cases, tuple(spec for spec, _ in foreign))


def read_expected(specs: Sequence[str], names: Sequence[str],
                  foreign: ForeignSource | None) -> list[dict[str, np.ndarray]]:
    """Ground truth per case, by output name (empty: compute it on this host)."""
    from_source = foreign.outputs(names) if foreign is not None and foreign.has_outputs else []
    if from_source and specs:
        raise InputError(f"-d {foreign.labels[0]} holds the expected outputs already; "  # type: ignore[union-attr]
                         "drop --expected")
    if not specs:
        return from_source
    longest = sorted(names, key=len, reverse=True)
    cases: list[dict[str, np.ndarray]] = []
    current: dict[str, np.ndarray] = {}
    for spec in specs:
        name = next((n for n in longest if spec.startswith(n + ":")), None)
        file = spec[len(name) + 1:] if name is not None else spec
        path = Path(file).expanduser()
        if name is None:
            given = _foreign(path, file)
            if given is not None:
                if current:
                    cases.append(current)
                    current = {}
                cases.extend(_by_name(c.outputs, names, "output", file) for c in given)
                continue
            if ":" in spec and not path.exists():
                raise InputError(f"--expected {spec}: no output named '{spec.split(':', 1)[0]}'"
                                 f"; the model's outputs are {fmt_names(names)}")
        check_file(path, file)
        loaded = load_data_file(path, file)
        if name is not None:
            arrays = {name: loaded if isinstance(loaded, np.ndarray)
                      else _only(loaded, name, file)}
        elif isinstance(loaded, np.ndarray):
            if len(names) != 1:
                raise InputError(f"--expected {spec}: the model has {len(names)} outputs "
                                 f"({fmt_names(names)}); write --expected NAME:{file}")
            arrays = {names[0]: loaded}
        else:
            arrays = _by_name(dict(loaded), names, "output", file)
        if current.keys() & arrays.keys():
            cases.append(current)
            current = {}
        current.update(arrays)
    if current:
        cases.append(current)
    return cases


def check_expected(given: Mapping[str, np.ndarray], host: Mapping[str, np.ndarray],
                   index: int) -> dict[str, np.ndarray]:
    """The given outputs of case `index` in the host's order, checked against what onnxruntime
    computes here: every output present, same shape, same dtype (float64 cast to float32)."""
    missing = [n for n in host if n not in given]
    if missing:
        raise InputError(f"expected outputs of case {index} lack {fmt_names(missing)}; "
                         "give every output (or none, to compute them on this host)")
    out = {}
    for name, ref in host.items():
        arr = np.asarray(given[name])
        if arr.shape != ref.shape:
            raise InputError(f"expected output '{name}' of case {index} has shape "
                             f"{tuple(arr.shape)}, but the model gives {tuple(ref.shape)}")
        if arr.dtype != ref.dtype:
            if not (arr.dtype.kind == ref.dtype.kind == "f"):
                raise InputError(f"expected output '{name}' of case {index} is {arr.dtype}, "
                                 f"but the model gives {ref.dtype}")
            arr = arr.astype(ref.dtype)
        out[name] = arr
    return out


def host_agreement(given: Sequence[Mapping[str, np.ndarray]],
                   host: Sequence[Mapping[str, np.ndarray]],
                   tolerances: Mapping[str, Any],
                   floors: Mapping[str, float]) -> dict[str, Any]:
    """How onnxruntime on this host compares with the given outputs, judged as `run` judges
    (the archive's tolerances, the outputs' saturation `floors`; a provenance record): where
    it already differs, a device run will differ there too, and the given ground truth or the
    export is the first thing to look at."""
    from verify.check import check_outputs
    from verify.tolerance import tolerance_set

    rules = tolerance_set(dict(tolerances))
    failing: dict[str, float | None] = {}
    first: dict[str, Any] | None = None
    for i, (ref, ours) in enumerate(zip(given, host)):
        for verdict in check_outputs(ours, ref, rules, floors, "this host"):
            if verdict.passed:
                continue
            err = float(verdict.max_abs)
            err = err if math.isfinite(err) else None
            old = failing.get(verdict.name)
            failing[verdict.name] = err if old is None else max(old, err or 0.0)
            if first is None:
                first = {"tensor": verdict.name, "case": i, "max_abs": err}
    return {"passed": not failing, "compared": "outputs", "failing": list(failing),
            "tensors": list(dict.fromkeys(n for case in given for n in case)), "first": first}


def _by_name(arrays: Mapping[str | int, np.ndarray], names: Sequence[str], kind: str,
             label: str) -> dict[str, np.ndarray]:
    """Keys that are names must be the model's; integer keys (an unnamed input_K.pb) are
    positions in its declaration order."""
    out = {}
    for key, arr in arrays.items():
        if isinstance(key, int):
            if key >= len(names):
                raise InputError(f"{label}: {kind}_{key}.pb, but the model has {len(names)} "
                                 f"{kind}s")
            key = names[key]
        elif key not in names:
            raise InputError(f"{label}: {kind} '{key}' is not one of the model's "
                             f"({fmt_names(names)})")
        out[key] = arr
    return out


def _only(arrays: dict[str, np.ndarray], name: str, label: str) -> np.ndarray:
    if name in arrays:
        return arrays[name]
    if len(arrays) == 1:
        return next(iter(arrays.values()))
    raise InputError(f"{label}: has no array named '{name}' (it holds {fmt_names(arrays)})")
