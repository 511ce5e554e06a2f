#!/usr/bin/env python3
"""Write runner/native/src/contract.hpp, the native runner's copy of the runner contract's
defaults, from their one owner, verify/runner/contract.py.

    python scripts/gen_native_contract.py           write it
    python scripts/gen_native_contract.py --check   exit 1 if the file is not what it would write

tests/runner/test_contract.py runs the check, so a default changed in contract.py without
regenerating (and rebuilding the runner: scripts/build_native_runner.py) fails the tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEADER = REPO / "runner" / "native" / "src" / "contract.hpp"


def _contract():  # type: ignore[no-untyped-def]
    """verify/runner/contract.py, loaded by path (stdlib only: no install needed)."""
    spec = importlib.util.spec_from_file_location("verify_runner_contract",
                                                  REPO / "verify" / "runner" / "contract.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cpp(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a C++ string literal for the ASCII values used here
    raise TypeError(f"no C++ form for {value!r}")


def render() -> str:
    c = _contract()
    job, dump = c.Job, c.DumpSpec
    consts = [
        ("const char*", "kContract", c.CONTRACT),
        ("int", "kContractVersion", c.VERSION),
        ("const char*", "kCpuProvider", c.CPU_PROVIDER),
        ("const char*", "kDefaultOptLevel", job.OPT_LEVEL.default),
        ("int", "kDefaultThreads", job.THREADS.default),
        ("int", "kDefaultInterOpThreads", job.INTER_OP_THREADS.default),
        ("int", "kDefaultWarmup", job.WARMUP.default),
        ("int", "kDefaultIterations", job.ITERATIONS.default),
        ("const char*", "kDefaultOutputsDir", job.OUTPUTS_DIR.default),
        ("const char*", "kDefaultResult", job.RESULT.default),
        ("bool", "kDefaultNoCpuArena", job.NO_CPU_ARENA.default),
        ("int", "kDefaultOrtLogSeverity", job.ORT_LOG_SEVERITY.default),
        ("bool", "kDefaultControlProbe", job.CONTROL_PROBE.default),
        ("const char*", "kDefaultDumpDir", dump.DIR.default),
        ("bool", "kDefaultDumpSave", dump.SAVE.default),
        ("bool", "kDefaultDumpStats", dump.STATS.default),
        ("int", "kStatFirst", dump.FIRST.default),
        ("int", "kPackAlign", c.PACK_ALIGN),
    ]
    lines = [
        "// The runner contract's defaults (docs/runner-contract.md), generated from their one",
        "// owner, verify/runner/contract.py, by scripts/gen_native_contract.py: do not edit.",
        "// A job without a key means the default below, in every runner.",
        "#pragma once",
        "",
        "namespace contract {",
        "",
    ]
    lines += [f"constexpr {t} {name} = {_cpp(v)};" for t, name, v in consts]
    lines += ["", "}  // namespace contract", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the header is not what this would write")
    args = parser.parse_args(argv)
    text = render()
    current = HEADER.read_text(encoding="utf-8") if HEADER.is_file() else None
    if args.check:
        if current != text:
            print(f"{HEADER.relative_to(REPO)} is stale: run scripts/gen_native_contract.py",
                  file=sys.stderr)
            return 1
        return 0
    if current != text:
        HEADER.write_text(text, encoding="utf-8")
        print(f"wrote {HEADER.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
