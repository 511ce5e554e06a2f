"""docs/architecture.md lists every module of the package, so the map a new engineer reads is
the code as it is (a module added without a line there fails here)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_module_is_on_the_map() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w/]+(?:\.py)?)`", doc))
    # a row may name siblings by their bare file or module name after the first
    # (`cli/run_cmd.py`, `bench_cmd.py`; `ci/`: `suite`, `jobs`)
    missing = []
    for path in sorted((REPO / "verify").rglob("*.py")):
        rel = path.relative_to(REPO / "verify").as_posix()
        package = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
        if rel == "__init__.py":
            continue
        candidates = {rel, path.name, path.stem}
        if rel.endswith("__init__.py"):
            candidates = {rel, package}
        if not candidates & named:
            missing.append(rel)
    assert not missing, f"modules missing from docs/architecture.md: {missing}"
