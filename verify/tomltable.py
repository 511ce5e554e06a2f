"""Typed reading of parsed TOML tables (device profiles, ci suites), every mistake one line
naming the file, the line when it can be found, and the key: `FILE: line N: key.path: message`.

`tomllib` parses but keeps no line numbers; `line_of` finds a key's line in the text again
(headers `[a.b]`, `[[array]]` counted per table, `key =` lines), best effort.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from verify.errors import ProfileError

NAME_RE = re.compile(r"(?!\.\.?$)[A-Za-z0-9_.+-]+")  # a folder of the baselines: not . or ..
Where = Sequence[str | int]


def line_of(text: str, where: Where) -> int | None:
    """Best-effort line number of a key path like ("testcase", 1, "iterations")."""
    names = [w for w in where if isinstance(w, str)]
    nth = next((w for w in where if isinstance(w, int)), 0)
    if not names:
        return None
    top = names[0]
    key_re = re.compile(rf'^\s*"?{re.escape(names[-1])}"?\s*=')
    current, counts = "", {}
    for no, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$", line)
        if m:
            current = m.group(1).replace('"', "").replace(" ", "")
            counts[current] = counts.get(current, -1) + 1
            if current == ".".join(names) and counts.get(top, 0) == nth:
                return no
            continue
        if current == ".".join(names[:-1]) and counts.get(top, 0) == nth and key_re.match(line):
            return no
    # a key inside an inline table: the line of the table's own key
    return line_of(text, list(where)[:-1]) if len(names) > 2 else None


def key_path(where: Where) -> str:
    """("testcase", 0, "path") -> "testcase[0].path"."""
    parts: list[str] = []
    for w in where:
        parts.append(f"[{w}]" if isinstance(w, int) else ("." if parts else "") + w)
    return "".join(parts)


class TableReader:
    """Typed access to one file's parsed TOML; `fail` builds the `error` class's message."""

    def __init__(self, path: Path, text: str, error: type[ProfileError] = ProfileError) -> None:
        self.path, self.text, self.error = path, text, error

    def fail(self, where: Where, message: str) -> ProfileError:
        line = line_of(self.text, where)
        at = f"line {line}: " if line else ""
        return self.error(f"{self.path}: {at}{key_path(where)}: {message}")

    def table(self, data: Any, where: Where, known: Sequence[str]) -> Mapping[str, Any]:
        """`data` is a table holding only `known` keys."""
        if not isinstance(data, dict):
            raise self.fail(where, "must be a table")
        for key in data:
            if key not in known:
                raise self.fail([*where, key], f"unknown key (known: {', '.join(known)})")
        return data

    def array(self, items: Any, key: str) -> list[Mapping[str, Any]]:
        """A top-level `[[key]]` array of tables (one table is an array of one)."""
        if isinstance(items, dict):
            items = [items]
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise self.fail([key], f"must be written as [[{key}]] tables")
        return items

    def get(self, data: Mapping[str, Any], where: Where, key: str, kind: str,
            default: Any = None) -> Any:
        """`data[key]` checked as `kind`, or `default` when absent. Kinds: str (non-empty),
        text (any string), name (letters, digits, _ . + -), int, count (>= 1), float (>= 0),
        positive (> 0), bool, strings (a string or a list of strings: a tuple), words (a list
        of strings, or one string split on spaces: a tuple), table."""
        if key not in data:
            return default
        value = data[key]
        at = [*where, key]
        if kind == "str":
            if not isinstance(value, str) or not value:
                raise self.fail(at, "must be a non-empty string")
        elif kind == "text":
            if not isinstance(value, str):
                raise self.fail(at, "must be a string")
        elif kind == "name":
            if not isinstance(value, str) or not NAME_RE.fullmatch(value):
                raise self.fail(at, "must be a name of letters, digits and _ . + - (not . or ..)")
        elif kind in ("int", "count"):
            if isinstance(value, bool) or not isinstance(value, int) or value < (kind == "count"):
                raise self.fail(at, f"must be an integer >= {int(kind == 'count')}")
        elif kind in ("float", "positive"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0 or (kind == "positive" and value == 0):
                raise self.fail(at, "must be a number > 0" if kind == "positive"
                                else "must be a number >= 0")
            value = float(value)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise self.fail(at, "must be true or false")
        elif kind == "strings":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise self.fail(at, "must be a string or a list of strings")
            value = tuple(value)
        elif kind == "words":
            if isinstance(value, str):
                value = value.split()
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise self.fail(at, "must be a list of strings")
            value = tuple(value)
        elif kind == "table":
            if not isinstance(value, dict):
                raise self.fail(at, "must be a table")
        else:
            raise ValueError(f"unknown kind {kind!r}")
        return value
