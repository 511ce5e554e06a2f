"""Suite files (TOML): testcases x devices x option sets, tolerances, iterations and gates.

The format is documented in docs/suite.md. `load_suite(path)` returns a frozen `Suite`; every
mistake is a `SuiteError` (exit 2) naming the file, the line when it can be found, and the key.
"""

from __future__ import annotations

import glob
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verify.errors import ProfileError, UsageError
from verify.files import read_user_file
from verify.options import OPT_LEVELS, SessionSettings, Tolerances
from verify.tolerance_specs import parse_tolerance
from verify.tomltable import NAME_RE, TableReader

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GATES = ("accuracy", "regression", "latency", "determinism")
LATENCY_CONTROLS = ("none", "probe")
DEFAULT_GATES = ("accuracy", "regression", "latency")


class SuiteError(ProfileError):
    """The suite file is malformed; the message names the line or key at fault (exit 2)."""


@dataclass(frozen=True)
class GateSettings:
    """How each gate decides (docs/suite.md, "Gates")."""

    regression_factor: float = 2.0    # error may grow by at most this factor ...
    regression_min_units: float = 0.01  # ... over max(baseline error, this x tolerance)
    latency_threshold: float = 0.25   # allowed slowdown of the median (0.25 = 25 %)
    latency_confidence: float = 0.95  # one-sided confidence of the bootstrap bound
    latency_min_delta_ms: float = 0.05  # slowdowns smaller than this never fail
    latency_control: str = "none"     # "probe": judge each iteration over the runner's probe


@dataclass(frozen=True)
class Device:
    name: str
    spec: str
    iterations: int | None = None
    warmup: int | None = None
    timeout: float | None = None
    group: str = ""      # devices sharing a group run one job at a time among them
    gates: tuple[str, ...] | None = None   # over the suite's; a testcase's own win

    @property
    def lane(self) -> str:
        """What the scheduler serializes on: the group, else the device itself."""
        return f"group:{self.group}" if self.group else f"device:{self.name}"


@dataclass(frozen=True)
class OptionSet:
    """An [[options]] table: session settings under a name."""

    name: str = "default"
    session: SessionSettings = SessionSettings()

    def to_dict(self) -> dict[str, Any]:
        s = self.session
        return {"name": self.name, "opt_level": s.opt_level, "threads": s.threads,
                "providers": list(s.providers)}


@dataclass(frozen=True)
class TestcaseEntry:
    name: str
    archive: Path
    devices: tuple[str, ...]
    options: tuple[str, ...]
    gates: tuple[str, ...] | None      # None: the device's, else the suite's
    iterations: int | None = None
    warmup: int | None = None
    timeout: float | None = None
    tolerance: Tolerances = Tolerances()
    layers: bool = False              # per-layer accuracy/regression (archive packed --layers)


@dataclass(frozen=True)
class Suite:
    path: Path
    name: str
    baselines: Path
    iterations: int
    warmup: int
    timeout: float | None
    retries: int
    gates: tuple[str, ...]
    settings: GateSettings
    tolerance: Tolerances
    devices: Mapping[str, Device]
    options: Mapping[str, OptionSet]
    testcases: tuple[TestcaseEntry, ...]


# --- parsing ---------------------------------------------------------------------------------

_SUITE_KEYS = ("name", "baselines", "iterations", "warmup", "timeout", "retries", "gates",
               "tolerance")
_TOL_KEYS = ("atol", "rtol", "tensors")
_GATE_KEYS = {"accuracy": ("layers",), "regression": ("factor", "min_units"),
              "latency": ("threshold", "confidence", "min_delta_ms", "control"), "determinism": ()}
_DEVICE_KEYS = ("name", "spec", "iterations", "warmup", "timeout", "group", "gates")
_OPTION_KEYS = ("name", "opt_level", "threads", "providers")
_TESTCASE_KEYS = ("name", "path", "devices", "options", "gates", "iterations", "warmup",
                  "timeout", "layers", "tolerance")


def load_suite(path: Path) -> Suite:
    """Read and validate a suite file; globs are expanded relative to its folder."""
    path = Path(path)
    try:
        text = read_user_file(path, SuiteError, "a suite .toml file").decode("utf-8")
    except UnicodeDecodeError:
        raise SuiteError(f"{path}: not a suite file (not UTF-8 text)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: not valid TOML: {exc}") from None
    return parse_suite(data, path, text)


def parse_suite(data: Mapping[str, Any], path: Path, text: str = "") -> Suite:
    r = TableReader(path, text, SuiteError)
    r.table(data, [], ("suite", "gate", "device", "options", "testcase"))
    base = path.parent
    s = r.table(data.get("suite", {}), ["suite"], _SUITE_KEYS)
    name = r.get(s, ["suite"], "name", "name", path.stem)
    baselines = base / r.get(s, ["suite"], "baselines", "str", "baselines")
    gates = _gates(r, s, ["suite"], DEFAULT_GATES) or ()
    settings = _settings(r, data.get("gate", {}))
    acc = data.get("gate", {}).get("accuracy", {})   # checked by _settings: a table
    layers = r.get(acc, ["gate", "accuracy"], "layers", "bool", False)  # the testcases' default
    tolerance = _tolerance(r, s.get("tolerance", {}), ["suite", "tolerance"])
    devices = _devices(r, data.get("device", []), base)
    options = _options(r, data.get("options", [{}]))
    testcases = _testcases(r, data.get("testcase", []), base, devices, options, layers)
    if not testcases:
        raise r.fail(["testcase"], "the suite lists no testcase; add a [[testcase]] with a path")
    return Suite(path=path, name=name, baselines=baselines,
                 iterations=r.get(s, ["suite"], "iterations", "count", 10),
                 warmup=r.get(s, ["suite"], "warmup", "int", 1),
                 timeout=r.get(s, ["suite"], "timeout", "positive", None),
                 retries=r.get(s, ["suite"], "retries", "int", 1),
                 gates=gates, settings=settings, tolerance=tolerance, devices=devices,
                 options=options, testcases=testcases)


def _gates(r: TableReader, data: Mapping[str, Any], where: list[str | int],
           default: tuple[str, ...] | None) -> tuple[str, ...] | None:
    gates = r.get(data, where, "gates", "strings", default)
    if gates is None:
        return None
    if not gates:  # every job it covers would pass having checked nothing
        raise r.fail([*where, "gates"], f"an empty list judges nothing: name at least one of "
                                        f"{', '.join(GATES)}")
    for g in gates:
        if g not in GATES:
            raise r.fail([*where, "gates"], f"unknown gate {g!r} (known: {', '.join(GATES)})")
    return tuple(dict.fromkeys(gates))


def _settings(r: TableReader, data: Any) -> GateSettings:
    r.table(data, ["gate"], tuple(_GATE_KEYS))
    for gate, keys in _GATE_KEYS.items():
        r.table(data.get(gate, {}), ["gate", gate], keys)
    reg, lat = data.get("regression", {}), data.get("latency", {})
    d = GateSettings()
    factor = r.get(reg, ["gate", "regression"], "factor", "positive", d.regression_factor)
    if factor < 1:
        raise r.fail(["gate", "regression", "factor"], "must be >= 1")
    confidence = r.get(lat, ["gate", "latency"], "confidence", "positive", d.latency_confidence)
    if not 0.5 <= confidence < 1:
        raise r.fail(["gate", "latency", "confidence"], "must be in [0.5, 1), e.g. 0.95")
    control = r.get(lat, ["gate", "latency"], "control", "str", d.latency_control)
    if control not in LATENCY_CONTROLS:
        raise r.fail(["gate", "latency", "control"],
                     f"must be one of {', '.join(LATENCY_CONTROLS)}")
    return GateSettings(
        latency_control=control,
        regression_factor=factor,
        regression_min_units=r.get(reg, ["gate", "regression"], "min_units", "float",
                                   d.regression_min_units),
        latency_threshold=r.get(lat, ["gate", "latency"], "threshold", "float",
                                d.latency_threshold),
        latency_confidence=confidence,
        latency_min_delta_ms=r.get(lat, ["gate", "latency"], "min_delta_ms", "float",
                                   d.latency_min_delta_ms))


def _tolerance(r: TableReader, data: Any, where: list[str | int]) -> Tolerances:
    r.table(data, where, _TOL_KEYS)
    tensors = data.get("tensors", {})
    if not isinstance(tensors, dict):
        raise r.fail([*where, "tensors"], 'must be a table of "GLOB" = "KEY=V[,KEY=V]" or "exact"')
    specs = []
    for glob_, setting in tensors.items():
        if not isinstance(setting, str):
            raise r.fail([*where, "tensors", glob_], 'must be a string like "atol=1e-4" or "exact"')
        spec = f"{glob_}:{setting}"
        try:
            parse_tolerance(spec)
        except UsageError as exc:
            raise r.fail([*where, "tensors", glob_], str(exc)) from None
        specs.append(spec)
    return Tolerances(r.get(data, where, "atol", "float"), r.get(data, where, "rtol", "float"),
                     tuple(specs))


def _unique(r: TableReader, seen: Mapping[str, Any], name: str, where: list[str | int]) -> None:
    if name in seen:
        raise r.fail([*where, "name"], f"duplicate name {name!r}")


def _devices(r: TableReader, items: Any, base: Path) -> dict[str, Device]:
    devices: dict[str, Device] = {}
    for i, d in enumerate(r.array(items, "device")):
        where: list[str | int] = ["device", i]
        r.table(d, where, _DEVICE_KEYS)
        spec = r.get(d, where, "spec", "str", None)
        default = spec
        if spec and spec.lower().endswith(".toml"):   # a profile file, relative to the suite
            path = Path(spec).expanduser()
            spec, default = str(path if path.is_absolute() else base / path), path.stem
        name = r.get(d, where, "name", "name",
                     default if default and NAME_RE.fullmatch(default) else None)
        if name is None:
            raise r.fail([*where, "name"], "needs a name (letters, digits, _ . + -)")
        _unique(r, devices, name, where)
        devices[name] = Device(name, spec or name, r.get(d, where, "iterations", "count"),
                               r.get(d, where, "warmup", "int"),
                               r.get(d, where, "timeout", "positive"),
                               r.get(d, where, "group", "name", ""),
                               _gates(r, d, where, None))
    if not devices:
        devices["local"] = Device("local", "local")
    return devices


def _options(r: TableReader, items: Any) -> dict[str, OptionSet]:
    options: dict[str, OptionSet] = {}
    for i, o in enumerate(r.array(items, "options")):
        where: list[str | int] = ["options", i]
        r.table(o, where, _OPTION_KEYS)
        name = r.get(o, where, "name", "name", "default")
        _unique(r, options, name, where)
        level = r.get(o, where, "opt_level", "str", "all")
        if level not in OPT_LEVELS:
            raise r.fail([*where, "opt_level"], f"must be one of {', '.join(OPT_LEVELS)}")
        options[name] = OptionSet(name, SessionSettings(
            level, r.get(o, where, "threads", "int", 0),
            r.get(o, where, "providers", "strings", ())))
    return options or {"default": OptionSet()}


def _pick(r: TableReader, data: Mapping[str, Any], where: list[str | int], key: str,
          known: Mapping[str, Any]) -> tuple[str, ...]:
    names = r.get(data, where, key, "strings", tuple(known))
    if not names:  # the testcase would run nowhere, and the night pass with it unchecked
        raise r.fail([*where, key], f"an empty list runs the testcase nowhere: name at least one "
                                    f"(known: {', '.join(known)}), or leave {key} out for all")
    for n in names:
        if n not in known:
            raise r.fail([*where, key], f"no [[{'device' if key == 'devices' else key}]] named "
                                        f"{n!r} (known: {', '.join(known)})")
    return tuple(names)


def _testcases(r: TableReader, items: Any, base: Path, devices: Mapping[str, Device],
               options: Mapping[str, OptionSet],
               layers: bool) -> tuple[TestcaseEntry, ...]:
    entries: list[TestcaseEntry] = []
    names: dict[str, Path] = {}
    for i, t in enumerate(r.array(items, "testcase")):
        where: list[str | int] = ["testcase", i]
        r.table(t, where, _TESTCASE_KEYS)
        pattern = r.get(t, where, "path", "str")
        if pattern is None:
            raise r.fail(where, "needs a path (a .vtc file or a glob such as '../testcases/*.vtc')")
        full = pattern if Path(pattern).is_absolute() else str(base / pattern)
        found = sorted(Path(p) for p in glob.glob(full, recursive=True))
        if not found:
            raise r.fail([*where, "path"], f"{pattern!r} matches no file (relative to {base})")
        explicit = r.get(t, where, "name", "name")
        if explicit and len(found) > 1:
            raise r.fail([*where, "name"], f"a name needs a path naming one file; "
                                          f"{pattern!r} matches {len(found)}")
        common = dict(devices=_pick(r, t, where, "devices", devices),
                      options=_pick(r, t, where, "options", options),
                      gates=_gates(r, t, where, None),
                      iterations=r.get(t, where, "iterations", "count"),
                      warmup=r.get(t, where, "warmup", "int"),
                      timeout=r.get(t, where, "timeout", "positive"),
                      layers=r.get(t, where, "layers", "bool", layers),
                      tolerance=_tolerance(r, t.get("tolerance", {}), [*where, "tolerance"]))
        for archive in found:
            name = explicit or archive.stem
            if not NAME_RE.fullmatch(name):
                raise r.fail([*where, "path"], f"{archive.name}: the testcase name {name!r} may "
                                               "only hold letters, digits and _ . + -")
            if name in names:
                fix = ("give one another name (its own name = \"...\")" if explicit else
                       "give one a name of its own (name = \"...\")")
                raise r.fail([*where, "name" if explicit else "path"],
                             f"testcase name {name!r} is used twice ({names[name]} and "
                             f"{archive}); {fix}")
            names[name] = archive
            entries.append(TestcaseEntry(name=name, archive=archive, **common))
    return tuple(entries)
