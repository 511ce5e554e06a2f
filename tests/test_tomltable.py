"""The TOML table reader profiles and suites share (verify/tomltable.py): typed values, and
errors naming the file, the line and the key path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from verify.errors import ProfileError
from verify.tomltable import TableReader, key_path, line_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TEXT = """\
name = "x"

[gate.latency]
threshold = 0.2

[[device]]
spec = "local"

[[device]]
spec = "ssh:me@box"
iterations = 0
opts = { depth = "x" }
"""


@pytest.mark.parametrize("where, line", [
    (["name"], 1),
    (["gate", "latency"], 3),
    (["gate", "latency", "threshold"], 4),
    (["device", 0, "spec"], 7),
    (["device", 1, "spec"], 10),
    (["device", 1, "iterations"], 11),
    (["device", 1, "opts", "depth"], 12),   # inside an inline table: the table's own line
    (["device", 2, "spec"], None),
    (["nowhere"], None),
])
def test_line_of_finds_the_key_in_its_table_and_array_entry(where: list, line: int | None) -> None:
    assert line_of(TEXT, where) == line


def test_key_path_reads_like_the_toml() -> None:
    assert key_path(["testcase", 0, "tolerance", "tensors", "prob"]) == \
        "testcase[0].tolerance.tensors.prob"


def test_errors_name_file_line_and_key_in_the_callers_error_class() -> None:
    class SuiteLike(ProfileError):
        pass

    r = TableReader(Path("s.toml"), TEXT, SuiteLike)
    data = tomllib.loads(TEXT)
    second = r.array(data["device"], "device")[1]
    with pytest.raises(SuiteLike) as info:
        r.get(second, ["device", 1], "iterations", "count")
    assert str(info.value) == "s.toml: line 11: device[1].iterations: must be an integer >= 1"
    with pytest.raises(SuiteLike, match=r"^s.toml: line 10: device\[1\].spec: unknown key "
                                        r"\(known: name\)$"):
        r.table(second, ["device", 1], ("name",))
    assert r.get(second, ["device", 1], "spec", "words") == ("ssh:me@box",)
    assert r.get({"python": "qemu -L /x python3"}, [], "python", "words") == \
        ("qemu", "-L", "/x", "python3")
    assert r.get({"x": "a"}, [], "x", "strings") == ("a",)
    assert r.get({}, [], "x", "positive", 3.0) == 3.0
    for kind, value, message in (("positive", 0, "must be a number > 0"),
                                 ("bool", 1, "must be true or false"),
                                 ("table", [], "must be a table"),
                                 ("text", 3, "must be a string"),
                                 ("name", "a b", "must be a name of letters, digits and "
                                                 "_ . + - (not . or ..)")):
        with pytest.raises(SuiteLike) as info:
            r.get({"v": value}, ["suite"], "v", kind)
        assert str(info.value) == f"s.toml: suite.v: {message}"
