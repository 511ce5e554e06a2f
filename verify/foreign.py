"""Cases in other tools' formats, read and written without pickle.

- onnx_test_runner's folder: `test_data_set_N/input_K.pb` and `output_K.pb` (TensorProto), one
  case per `test_data_set_N`, in N order; the folder given may be the model's folder holding
  them, or one `test_data_set_N` itself. A tensor's name, when set, names its input or output;
  an unnamed one goes by its index K in the model's declaration order.
- Polygraphy's JSON (`polygraphy run --save-inputs` / `--save-outputs`): arrays are encoded as
  `{"array": BASE64 of a .npy file, "polygraphy_class": "ndarray"}`, decoded here with
  `np.load(..., allow_pickle=False)`; inputs are a list of feed dicts (one per case), outputs
  a `RunResults` (`{"lst": [[runner, [IterationResult...]]]}`, each iteration's `outputs`
  mapping names to arrays or `LazyArray` `{"values": ARRAY}`): the first runner's iterations
  are the cases.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verify.datafiles import load_pb
from verify.errors import InputError
from verify.files import NPY_READ_ERRORS, npy_reason, npy_refusal, read_user_file

_MARKER = "polygraphy_class"
_LEGACY_MARKER = "__polygraphy_encoded_ndarray"
_SET = re.compile(r"test_data_set_(\d+)")
_PB = re.compile(r"(input|output)_(\d+)\.pb")


def is_case_file(folder: Path, path: Path) -> bool:
    """Whether `path` is one an onnx_test_runner `folder` is read from: its test_data_set_N/
    input_K.pb or output_K.pb, or the folder's own when it is one test_data_set_N (what
    `pack -o` must not overwrite; the folder's other files, model.vtc say, are not read)."""
    path, folder = path.resolve(), folder.resolve()
    sets = path.parent.name.startswith("test_data_set_")
    return _PB.fullmatch(path.name) is not None and sets and folder in (path.parent,
                                                                          path.parent.parent)


@dataclass(frozen=True)
class ForeignCase:
    """One case read from another tool's files: arrays by name (`str`) or by position (`int`)."""

    inputs: Mapping[str | int, np.ndarray]
    outputs: Mapping[str | int, np.ndarray]


# --- onnx_test_runner folders --------------------------------------------------------------------
def is_test_runner_dir(path: Path) -> bool:
    return path.is_dir() and (_SET.fullmatch(path.name) is not None
                              or any(_SET.fullmatch(p.name) for p in path.iterdir() if p.is_dir()))


def read_test_runner_dir(path: Path, label: str) -> list[ForeignCase]:
    sets = [path] if _SET.fullmatch(path.name) else sorted(
        (p for p in path.iterdir() if p.is_dir() and _SET.fullmatch(p.name)),
        key=lambda p: int(_SET.fullmatch(p.name).group(1)))  # type: ignore[union-attr]
    cases = []
    for folder in sets:
        found: dict[str, dict[str | int, np.ndarray]] = {"input": {}, "output": {}}
        for f in sorted(folder.iterdir(), key=lambda p: p.name):
            m = _PB.fullmatch(f.name)
            if m is None:
                continue
            loaded = load_pb(f, f"{label}/{folder.name}/{f.name}")
            key, arr = (next(iter(loaded.items())) if isinstance(loaded, dict)
                        else (int(m.group(2)), loaded))
            found[m.group(1)][key] = arr
        if not found["input"]:
            raise InputError(f"{label}/{folder.name}: no input_K.pb files (onnx_test_runner's "
                             "layout: test_data_set_N/input_0.pb, output_0.pb)")
        cases.append(ForeignCase(found["input"], found["output"]))
    return cases


# --- Polygraphy JSON --------------------------------------------------------------------------
def is_polygraphy(obj: object) -> bool:
    """Whether decoded JSON holds Polygraphy's encoded arrays or results (a cheap look)."""
    if isinstance(obj, dict):
        return _MARKER in obj or _LEGACY_MARKER in obj or any(
            isinstance(v, dict) and (_MARKER in v or _LEGACY_MARKER in v) for v in obj.values())
    if isinstance(obj, list) and obj:
        return is_polygraphy(obj[0])
    return False


def read_polygraphy(path: Path, label: str) -> list[ForeignCase]:
    """Cases from a Polygraphy inputs file (list of feed dicts: inputs only) or outputs file
    (RunResults: outputs only, the first runner's iterations)."""
    obj = _load_json(path, label)
    if not is_polygraphy(obj):
        raise InputError(f"{label}: not a Polygraphy inputs or outputs JSON file")
    decoded = _decode(obj, label)
    if isinstance(decoded, list):  # --save-inputs: one feed dict per iteration
        return [ForeignCase(_arrays(feed, label), {}) for feed in decoded]
    if isinstance(decoded, dict) and isinstance(decoded.get("lst"), list):  # RunResults
        if not decoded["lst"]:
            raise InputError(f"{label}: Polygraphy results with no runner")
        _runner, iterations = decoded["lst"][0]
        return [ForeignCase({}, _arrays(it.get("outputs", it), label)) for it in iterations]
    raise InputError(f"{label}: a Polygraphy file of a kind verify does not read "
                     f"({decoded.get(_MARKER, 'unknown') if isinstance(decoded, dict) else 'unknown'})")


def polygraphy_inputs(cases: Sequence[Mapping[str, np.ndarray]]) -> str:
    """Polygraphy's `--load-inputs` JSON for these feeds."""
    return json.dumps([{k: _encode(v) for k, v in feed.items()} for feed in cases], indent=1)


def polygraphy_outputs(cases: Sequence[Mapping[str, np.ndarray]], runner: str) -> str:
    """Polygraphy's RunResults JSON (`--load-outputs`): one iteration per case."""
    iterations = [{"outputs": {k: {"values": _encode(v), _MARKER: "LazyArray"}
                               for k, v in outs.items()},
                   "runtime": None, "runner_name": runner, _MARKER: "IterationResult"}
                  for outs in cases]
    return json.dumps({"lst": [[runner, iterations]], _MARKER: "RunResults"}, indent=1)


def _encode(arr: np.ndarray) -> dict[str, str]:
    buf = io.BytesIO()
    np.save(buf, np.asarray(arr), allow_pickle=False)
    return {"array": base64.b64encode(buf.getvalue()).decode("ascii"), _MARKER: "ndarray"}


def _decode(obj: object, label: str) -> object:
    if isinstance(obj, list):
        return [_decode(v, label) for v in obj]
    if not isinstance(obj, dict):
        return obj
    kind = obj.get(_MARKER)
    if kind == "ndarray" or _LEGACY_MARKER in obj:
        return _array(obj.get("array"), label)
    if kind in ("LazyArray", "LazyNumpyArray"):
        return _decode(obj.get("values"), label)
    return {k: _decode(v, label) for k, v in obj.items() if k != _MARKER}


def _array(text: object, label: str) -> np.ndarray:
    if not isinstance(text, str):
        raise InputError(f"{label}: a Polygraphy array without its 'array' data")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise InputError(f"{label}: a Polygraphy array whose data is not base64") from None
    try:
        arr = np.load(io.BytesIO(raw), allow_pickle=False)
        if not isinstance(arr, np.ndarray):  # an old .npz encoding: its only array
            with arr:
                if not arr.files:
                    raise ValueError("an empty .npz")
                arr = arr[arr.files[0]]
    except NPY_READ_ERRORS as e:
        if npy_refusal(e, raw[:2]) == "pickled":
            raise InputError(f"{label}: holds pickled Python objects, which verify never "
                             "loads") from None
        raise InputError(f"{label}: a Polygraphy array that is not a valid .npy "
                         f"({npy_reason(e)})") from None
    return arr


def _arrays(obj: object, label: str) -> dict[str | int, np.ndarray]:
    if not isinstance(obj, dict) or not all(isinstance(v, np.ndarray) for v in obj.values()):
        raise InputError(f"{label}: expected arrays by name in each Polygraphy iteration")
    return dict(obj)


def _load_json(path: Path, label: str) -> object:
    try:
        return json.loads(read_user_file(path, InputError, "a .json file", label).decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{label}: not a UTF-8 text file") from None
    except ValueError as e:
        raise InputError(f"{label}: invalid JSON ({e})") from None
