#!/usr/bin/env python3
"""Write the README's corpus table from the results of the corpus test run.

tests/test_corpus.py records, per model, the outcome of every stage (pack, run, per-layer dumps
at --opt-level disable and all, diff, localize of an injected fault, profile) in a JSON file
(``$VERIFY_CORPUS_RESULTS``, else ``.pytest_cache/verify-corpus-results.json``). This script
renders that file as a Markdown table and replaces the README's section between the
``<!-- corpus-table -->`` markers with it; the corpus test checks that the README holds the
table its own run produced.

    python3 -m pytest tests/test_corpus.py && python3 scripts/corpus_table.py
    python3 scripts/corpus_table.py --check     # exit 1 when the README differs
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DEFAULT_RESULTS = REPO / ".pytest_cache" / "verify-corpus-results.json"
BEGIN, END = "<!-- corpus-table -->", "<!-- /corpus-table -->"
STAGES = ("pack", "run", "dump_disable", "dump_all", "diff", "localize", "profile")
NEEDS = {"diff": ("dump_disable", "dump_all")}  # a stage that runs only after these passed
SUMMARY_TAIL = "(written by scripts/corpus_table.py from tests/test_corpus.py's run)."
HEADERS = ("pack", "run", "dump disable", "dump all", "diff", "localize", "profile")


def save_results(path: Path, results: Mapping[str, Any]) -> None:
    """Merge `results` into the file at `path` (atomically: a temp file renamed)."""
    merged: dict[str, Any] = {}
    if path.is_file():
        try:
            merged = json.loads(path.read_text())
        except ValueError:
            merged = {}
    merged.update(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(merged, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _cell(stage: str, outcome: str | None, known: Mapping[str, str]) -> str:
    if outcome is None:
        return "–"  # not reached: an earlier stage failed
    if outcome.startswith("ok"):
        return "✓"
    if stage in known:
        return f"✗ {known[stage]}"
    return "✗ " + outcome.replace("|", "\\|")[:80]


def render(results: Mapping[str, Any]) -> str:
    """The Markdown table, one row per model, in the corpus test's order."""
    results = dict(sorted(results.items(), key=lambda kv: kv[1].get("order", 0)))
    lines = ["| model | source package | what it brings | " + " | ".join(HEADERS) + " |",
             "|---|---|---|" + "---|" * len(STAGES)]
    for name, rec in results.items():
        stages, known = rec["stages"], rec.get("known", {})
        cells = [_cell(s, stages.get(s), known) for s in STAGES]
        lines.append(f"| {name} | {rec['source']} | {rec['covers']} | " + " | ".join(cells) + " |")
    ok = sum(1 for rec in results.values()
             if all(str(v).startswith("ok") for v in rec["stages"].values()))
    lines.append("")
    lines.append(f"{ok} of {len(results)} models pass every stage {SUMMARY_TAIL}")
    return "\n".join(lines)


def masked(table: str, results: Mapping[str, Any]) -> str:
    """`table` with each model's known-issue cells blanked: where a known issue depends on
    the machine (how a capture is cut up), the check compares everything else."""
    stage_col = {s: 3 + i for i, s in enumerate(STAGES)}
    lines = []
    for line in table.splitlines():
        cells = line.split(" | ")
        name = cells[0].lstrip("| ").strip() if line.startswith("| ") else ""
        if name in results:
            known = set(results[name].get("known", {}))
            known |= {s for s, needs in NEEDS.items() if known & set(needs)}
            for stage in known:
                cells[stage_col[stage]] = "(known issue)"
        lines.append(" | ".join(cells))
    return "\n".join(line for line in lines if not line.endswith(SUMMARY_TAIL))


def section(readme: str) -> str:
    """The README's current table (between the markers)."""
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"corpus_table: README.md has no {BEGIN} ... {END} section")
    return readme.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def replace(readme: str, table: str) -> str:
    head, rest = readme.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", type=Path,
                    default=Path(os.environ.get("VERIFY_CORPUS_RESULTS", DEFAULT_RESULTS)))
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md differs")
    args = ap.parse_args(argv)
    if not args.results.is_file():
        raise SystemExit(f"corpus_table: {args.results}: no results; run "
                         "python3 -m pytest tests/test_corpus.py first")
    results = json.loads(args.results.read_text())
    readme = README.read_text()
    table = render(results)
    if args.check:
        same = section(readme) == table
        print("README.md corpus table is up to date" if same else "README.md corpus table differs")
        return 0 if same else 1
    README.write_text(replace(readme, table))
    print(f"corpus_table: wrote {len(results)} rows into README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
