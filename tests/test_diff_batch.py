"""Batched comparison of small tensors (issue 14): `diff` scans many small float32 pairs with one
kernel call; every report field must be identical, bit for bit, to comparing them one by one,
on both engines, on real dumps of a real model and on pairs built to hit every path (several
blocks, a partial last block, NaN/Inf, a failing magnitude rule's recount, allclose units)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from corpus import model_path
from fixtures_dump import make_dump, pack
from verify import diff as diff_mod
from verify.compare import ToleranceSet, compare, compare_batch, numba_available
from verify.diff import diff_captures
from verify import scan as scan_mod
from verify.scan import Batch

ENGINES = ["numpy", "auto"] + (["numba"] if numba_available() else [])
RULES = {"default": [], "tight": ["*:k=1e-9"], "allclose": ["*:atol=1e-7,rtol=1e-6"],
         "gate": ["*:sqnr>=200"]}


@pytest.fixture(scope="module")
def cls_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Dumps of PP-OCR cls (a real third-party model) at two opt levels."""
    root = tmp_path_factory.mktemp("batch")
    archive = root / "cls.vtc"
    pack(model_path("ppocr_cls"), archive, "--shape", "x:2x3x48x192")
    return {level: make_dump(archive, root / level, level) for level in ("disable", "all")}


def _report(a: Path, b: Path, rules: list[str], engine: str) -> dict[str, Any]:
    return diff_captures(a, b, ToleranceSet.from_specs(rules), engine=engine).to_dict()


def _exact(x: Any) -> str:
    return json.dumps(x, sort_keys=True)  # repr of every float: equal strings, equal bits


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("rules", list(RULES))
def test_batched_diff_reports_equal_one_by_one_on_real_dumps(
        cls_dumps: dict[str, Path], engine: str, rules: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    batched: list[int] = []
    real_batch = diff_mod.compare_batch

    def counting(items: Any, batch: Batch, eng: Any) -> Any:
        batched.append(len(items))
        return real_batch(items, batch, eng)

    monkeypatch.setattr(diff_mod, "compare_batch", counting)
    new = _report(cls_dumps["all"], cls_dumps["disable"], RULES[rules], engine)
    assert sum(batched) >= 20  # most of this model's tensors went through the batch
    monkeypatch.setattr(diff_mod, "BATCH_BELOW", 0)  # nothing batched: today's path
    old = _report(cls_dumps["all"], cls_dumps["disable"], RULES[rules], engine)
    assert len(new["rows"]) == len(old["rows"]) > 20
    for got, want in zip(new["rows"], old["rows"], strict=True):
        assert _exact(got) == _exact(want), got["name"]
    assert _exact(new) == _exact(old)
    if rules == "tight":
        assert not new["passed"]  # the recount path ran on failing tensors


def _pairs() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    out = []
    for n in (1, 7, 1000, (1 << 16) - 1, 1 << 16, (1 << 16) + 5, 200_003):
        r = rng.standard_normal(n).astype(np.float32)
        a = (r + rng.standard_normal(n).astype(np.float32) * 1e-6).astype(np.float32)
        out.append((a, r))
    a, r = out[4]
    a[[3, 70]], r[[3, 71]] = np.nan, np.inf  # non-finite blocks: redone in numpy
    out.append((np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32)))
    out.append((np.full(9, 2.0, np.float32), np.full(9, 2.0, np.float32)))
    return out


@pytest.mark.parametrize("engine", ["numpy"] + (["numba"] if numba_available() else []))
@pytest.mark.parametrize("spec", [[], ["*:k=1e-9"], ["*:atol=1e-7,rtol=1e-6"],
                                  ["*:atol=0,cos>=0.9999999"], ["*:exact"]])
def test_compare_batch_equals_compare_field_by_field(engine: str, spec: list[str]) -> None:
    rule = ToleranceSet.from_specs(spec).rule_for("t", np.float32)
    batch = Batch(1 << 20)
    items = []
    for k, (a, r) in enumerate(_pairs()):
        assert batch.room_for(a.size)
        xa, xr, span = batch.add(a, r)
        items.append((f"t{k}", xa, xr, rule, k % 2 == 0, span))
    got = compare_batch(items, batch, engine)  # type: ignore[arg-type]
    want = [compare(f"t{k}", a, r, rule, topk=k % 2 == 0, engine=engine)  # type: ignore[arg-type]
            for k, (a, r) in enumerate(_pairs())]
    for g, w in zip(got, want, strict=True):
        assert _exact(g.to_dict()) == _exact(w.to_dict()), g.name
    assert got[4].nan_actual == 2 and got[4].inf_reference == 2


@pytest.mark.parametrize("engine", ["numpy"] + (["numba"] if numba_available() else []))
def test_batch_blocks_never_straddle_tensors(engine: str) -> None:
    batch = Batch(1 << 18)
    spans = [batch.add(np.full(n, v, np.float32), np.zeros(n, np.float32))[2]
             for n, v in ((5, 1.0), (70_000, 2.0))]
    assert spans == [(0, 5), (Batch.ALIGN, 70_000)]
    assert not batch.room_for(1 << 18)
    rows = batch.rows(spans, engine, 0.0, 0.0, 1.0, False)
    assert [r.shape[0] for r in rows] == [1, 2]
    assert [int(r[:, scan_mod._NCMP].sum()) for r in rows] == [5, 70_000]
    assert [float(r[:, scan_mod._SAA].sum()) for r in rows] == [5.0, 280_000.0]

