"""How command-line tolerances layer over an archive's record (verify/tolerance.py): a `--tol`
glob given on the command line wins over the archive's, a global --atol/--rtol replaces the
archive's global rule, and the layered record is what a repro archive stores."""

from __future__ import annotations

import pytest

from verify.errors import ArchiveError, UsageError
from verify.tolerance import describe_record, layered_record, tolerance_record, tolerance_set

STORED = {"atol": 1e-3, "specs": ["conv*:exact", "out:atol=0.5"]}


def rules(record: dict, *args: object) -> dict[str, str]:
    ts = tolerance_set(record, *args)  # type: ignore[arg-type]
    return {n: ts.rule_for(n, "float32").describe() for n in ("conv1", "conv2", "out", "other")}


def test_the_archive_alone() -> None:
    assert layered_record(STORED) == STORED
    assert rules(STORED) == {"conv1": "exact", "conv2": "exact", "out": "allclose atol=0.5 rtol=0",
                             "other": "allclose atol=0.001 rtol=0"}


def test_a_command_line_glob_wins_over_the_archive_and_the_rest_stays() -> None:
    layered = layered_record(STORED, None, None, ["conv1:atol=2"])
    assert layered == {"atol": 1e-3, "specs": ["conv1:atol=2", "conv*:exact", "out:atol=0.5"]}
    assert rules(STORED, None, None, ["conv1:atol=2"])["conv1"] == "allclose atol=2 rtol=0"
    assert rules(STORED, None, None, ["conv1:atol=2"])["conv2"] == "exact"


def test_a_global_option_replaces_the_archives_global_rule() -> None:
    layered = layered_record(STORED, None, 1e-2, ())
    assert "atol" not in layered and layered["rtol"] == 1e-2  # the stored atol is gone too
    assert rules(STORED, None, 1e-2)["other"] == "allclose atol=0 rtol=0.01"
    assert rules({})["other"].startswith("magnitude")  # no record, no option: the default


def test_the_layered_record_round_trips_as_an_archive_record() -> None:
    layered = layered_record(STORED, None, None, ["x:exact"])
    assert layered == {**{k: STORED[k] for k in ("atol", "rtol") if k in STORED},
                       "specs": ["x:exact", "conv*:exact", "out:atol=0.5"]}
    assert tolerance_record(layered.get("atol"), layered.get("rtol"), layered["specs"]) == layered
    assert tolerance_set(STORED, None, None, ["x:exact"]).notes() == ()
    # --atol/--rtol replace the stored record, its globs included: a stored '*:atol=1' won
    # over a stricter --atol 1e-9, and the loose check passed without a word
    layered = layered_record(STORED, 1e-4, 0.0, ["x:exact"])
    assert layered == {"atol": 1e-4, "rtol": 0.0, "specs": ["x:exact"]}
    assert describe_record(layered) == "allclose atol=0.0001 rtol=0.0; --tol x:exact"
    assert tolerance_set(STORED, 1e-4, None).notes() == (
        "--atol/--rtol replace the archive's stored tolerances (--tol 'conv*:exact', --tol "
        "'out:atol=0.5'); add --tol to keep one",)


def test_a_stored_record_that_does_not_parse_is_a_corrupt_archive() -> None:
    with pytest.raises(ArchiveError, match="the archive's tolerances do not parse"):
        layered_record({"specs": ["conv*:atol=abc"]})
    with pytest.raises(ArchiveError):
        tolerance_set({"specs": ["conv*:atol=abc"]})
    for bad in ({"atol": "abc"}, {"atol": -1}, {"rtol": [1]}):  # the global rule, not a spec
        with pytest.raises(ArchiveError, match="the archive's tolerances do not parse"):
            tolerance_set(bad)
    with pytest.raises(UsageError, match="'abc' is not a number") as info:
        tolerance_set(STORED, None, None, ["x:atol=abc"])  # the user's own option: usage
    assert not isinstance(info.value, ArchiveError)


def test_inspect_describes_whichever_global_rule_the_archive_holds() -> None:
    assert describe_record({}) == ("default (magnitude: max|x-r| <= 2^-14 * max(max|r|, F), "
                                   "scaled by dtype)")
    assert describe_record({"rtol": 1e-3}) == "allclose atol=0 rtol=0.001"  # rtol alone
    assert describe_record({"atol": 1e-4}) == "allclose atol=0.0001 rtol=0"
    assert describe_record({"atol": 0.0, "specs": ["p*:exact"]}) == \
        "allclose atol=0.0 rtol=0; --tol p*:exact"


@pytest.mark.parametrize("args, message", [
    ((-1.0, None), "atol must be finite and >= 0, got -1"),
    ((None, float("inf")), "rtol must be finite and >= 0, got inf"),
    ((None, None, ["conv*:atol=1,k=2"]), "atol/rtol and k/floor cannot be mixed"),
])
def test_the_record_pack_stores_is_validated_when_made(args: tuple, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("/", "/").replace("*", r"\*")):
        tolerance_record(*args)
