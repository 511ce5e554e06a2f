"""The text io-dump (`verify run --io-dump`): load_and_run's format, one block per tensor with
its summary stats, stable formatting so two files `diff` cleanly line by line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from verify.dump_read import shape_text
from verify.files import read_head
from verify.runner.contract import ManifestCase, ManifestTensor, Record

MC, MT = ManifestCase, ManifestTensor
TITLE = "verify io-dump of"  # the first header line's start: a file's first bytes "# " + TITLE


def is_io_dump(path: Any) -> bool:
    """Whether the file at `path` begins as a text io-dump does (diff and inspect name it)."""
    title = f"# {TITLE}".encode()
    return read_head(path, len(title)) == title


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):  # json_safe's nan/inf
        return value
    return f"{value:.7g}"


def escape(name: str) -> str:
    """A name on one line: backslashes doubled, newlines and other unprintable characters as
    Python escapes (\\n, \\x00); printable unicode is kept as is."""
    return "".join(c if c.isprintable() and c != "\\" else
                   "\\\\" if c == "\\" else c.encode("unicode_escape").decode("ascii")
                   for c in name)


def io_dump_cases(cases: Sequence[Mapping[str, Any]]
                  ) -> list[tuple[int, list[dict[str, Any]]]]:
    """The manifest's cases as `io_dump_text` takes them: each tensor entry with its stats."""
    return [(c[MC.CASE], [{**t, **t[MT.STATS]} for t in c[MC.TENSORS]]) for c in cases]


def io_dump_text(header: Sequence[str], cases: Sequence[tuple[int, Sequence[Mapping[str, Any]]]]
                 ) -> str:
    """load_and_run's --io-dump: one block per tensor in order, stable formatting (7
    significant digits), so two files `diff` cleanly line by line. Each tensor record has
    index, name, node, op and the runner's stats (dtype, shape, first, min, max, mean, std,
    nan, inf)."""
    lines = [f"# {h}" for h in header]
    for case, records in cases:
        lines.append(f"=== case {case}: {len(records)} tensors")
        for t in records:
            lines.append(f"[{int(t[MT.INDEX]):05d}] {escape(str(t[MT.NAME]))}")
            lines.append(f"  node {escape(str(t.get(MT.NODE) or '-'))}  "
                         f"op {escape(str(t.get(MT.OP) or '-'))}")
            lines.append(f"  shape {shape_text(t.get(MT.SHAPE, ()))}  dtype {t.get(MT.DTYPE)}")
            lines.append("  first " + " ".join(_num(v) for v in t.get(Record.FIRST) or []))
            lines.append(f"  min {_num(t.get(Record.MIN))}  max {_num(t.get(Record.MAX))}  "
                         f"mean {_num(t.get(Record.MEAN))}  std {_num(t.get(Record.STD))}")
            lines.append(f"  nan {t.get(Record.NAN, 0)}  inf {t.get(Record.INF, 0)}")
    return "\n".join(lines) + "\n"
