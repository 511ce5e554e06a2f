"""docs/architecture.md is the map of the package: every module is on it, in exactly one
section's table, and the core imports nothing from the layers above it (features, transports,
the CLI). A module added without a row, or a core module reaching up, fails here; so does a
module past 400 lines (the device-side runner excepted)."""

from __future__ import annotations

import re
from pathlib import Path

from test_imports import imported

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "verify"
LAYERS = {"The command line": "cli", "Features": "features", "Core": "core",
          "Transports": "transports"}


def doc_map() -> dict[str, str]:
    """Module path (relative to verify/) -> layer, from the first cell of each table row. A
    row's later names are siblings of its first (`cli/run_cmd.py`, `bench_cmd.py`)."""
    layer, found = None, {}
    for line in (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            layer = next((v for k, v in LAYERS.items() if line[3:].startswith(k)), None)
        elif line.startswith("| `") and layer is not None:
            names = re.findall(r"`([^`]+)`", line.split("|")[1])
            folder = names[0].rpartition("/")[0]
            for name in names:
                rel = name if "/" in name or not folder else f"{folder}/{name}"
                assert rel not in found, f"{rel} is on the map twice"
                found[rel] = layer
    return found


def modules() -> list[str]:
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                  if p != PACKAGE / "__init__.py")


def test_every_module_is_on_the_map_and_nothing_else() -> None:
    mapped = doc_map()
    assert set(mapped.values()) == set(LAYERS.values())  # every section was read
    missing = [m for m in modules() if m not in mapped]
    assert not missing, f"modules missing from docs/architecture.md: {missing}"
    stale = [m for m in mapped if m not in modules()]
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def _imported_modules(path: Path) -> set[str]:
    """verify modules a file imports, as paths relative to verify/ (x.py or x/__init__.py)."""
    out = set()
    for name in imported(path):
        if name.startswith("verify."):
            rel = name[len("verify."):].replace(".", "/")
            out.update(f for f in (f"{rel}.py", f"{rel}/__init__.py") if (PACKAGE / f).exists())
    return out


def test_the_core_imports_nothing_from_the_layers_above() -> None:
    mapped = doc_map()
    # the runner is a leaf both ends share (its contract names, opt levels, chunk planning)
    allowed = {m for m, layer in mapped.items() if layer == "core"} | {"runner/runner.py",
                                                                       "runner/contract.py"}
    reaching_up = {m: sorted(_imported_modules(PACKAGE / m) - allowed)
                   for m, layer in mapped.items() if layer == "core"}
    assert not {m: i for m, i in reaching_up.items() if i}, reaching_up


MAX_LINES = 400  # a module one person reads in one sitting (STYLE.md 5; issue 13)
# the device-side runner is one file on purpose: it is copied to devices as is, stdlib only
# beside contract.py (docs/runner-contract.md)
LONG_ALLOWED = {"runner/runner.py"}


def test_every_module_stays_under_the_size_limit() -> None:
    over = {m: n for m in modules() if m not in LONG_ALLOWED
            and (n := len((PACKAGE / m).read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not over, (f"modules over {MAX_LINES} lines (split them along a seam): "
                      + ", ".join(f"verify/{m} ({n})" for m, n in sorted(over.items())))
    assert all((PACKAGE / m).is_file() for m in LONG_ALLOWED)  # the exception is still real
