"""`diff.diff_cases`: several cases of one capture pair, each side opened once — the same
reports as one `diff_captures` call per case, with the archive read and its model parsed once
(ci's per-layer gate diffs every case of a job this way)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_dump import make_dump, pack

from verify import diff
from verify.compare import ToleranceSet
from verify.errors import UsageError

DYNAMIC = Path(__file__).resolve().parent.parent / "goldens" / "models" / "dynamic.onnx"


@pytest.fixture(scope="module")
def three_cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cases")
    archive = pack(DYNAMIC, root / "dyn.vtc", "--layers", "-d", "x:[[1,2,3,4]]",
                   "-d", "x:[[1,2,3,4],[5,6,7,8]]", "-d", "x:[[0,0,0,1],[1,0,0,0],[2,2,2,2]]")
    return archive, make_dump(archive, root / "dump", "all")


def test_cases_match_one_call_per_case_and_open_each_side_once(
        three_cases: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    archive, dump = three_cases
    rules = ToleranceSet()
    singly = [diff.diff_captures(dump, archive, rules, case=c) for c in range(3)]
    reads, parses = [], []
    read, parse = diff.read_archive, diff.parse_model
    monkeypatch.setattr(diff, "read_archive", lambda p: reads.append(p) or read(p))
    monkeypatch.setattr(diff, "parse_model", lambda b, w: parses.append(w) or parse(b, w))
    together = diff.diff_cases(dump, archive, rules, [0, 1, 2])
    assert (len(reads), len(parses)) == (1, 1)
    assert [r.case for r in together] == [0, 1, 2]
    for one, many in zip(singly, together, strict=True):
        assert one.to_dict() == many.to_dict()
    # each case compared its own batch size: the last tensor's shape grows with the case
    shapes = [r.compared[-1].diff.reference_shape for r in together]  # type: ignore[union-attr]
    assert [s[0] for s in shapes] == [1, 2, 3], shapes


def test_a_case_either_side_lacks_is_one_usage_error(three_cases: tuple[Path, Path]) -> None:
    archive, dump = three_cases
    with pytest.raises(UsageError, match=r"dump: no case 5 \(the dump holds case\(s\) 0, 1, 2\)"):
        diff.diff_cases(dump, archive, ToleranceSet(), [0, 5])
    with pytest.raises(UsageError, match=r"dyn.vtc: no case 5 \(the archive holds 3 case"):
        diff.diff_cases(archive, dump, ToleranceSet(), [1, 5])
