"""A run's baselines are put in place together or not at all (verify/ci/staging.py): staged
beside the suite's baselines, moved when the run has finished, dropped when it has not; the
staging folders runs killed outright leave are cleared by the next run, and another run's
folder in progress is left alone. Under --update-goldens, the jobs that held their gates are
updated together, and those that failed or errored are listed as not updated, with why."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fixtures_ci import lost_board_suite, run_ci

from verify.ci import staging
from verify.ci.staging import StagedBaselines, clear_leftovers
from verify.errors import OutputError


def _doc(n: int) -> dict[str, int]:
    return {"n": n}


def _files(root: Path) -> dict[str, dict[str, int]]:
    return {p.relative_to(root).as_posix(): json.loads(p.read_text())
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_set_goes_in_whole_when_committed(tmp_path: Path) -> None:
    root = tmp_path / "bl"
    (root / "s" / "a" / "local").mkdir(parents=True)
    (root / "s" / "a" / "local" / "o.json").write_text(json.dumps(_doc(0)))
    with StagedBaselines(root, "s") as staged:
        staged.write(root / "s" / "a" / "local" / "o.json", _doc(1))
        staged.write(root / "s" / "latency" / "m" / "b" / "local" / "o.json", _doc(2))
        assert _files(root / "s") == {"a/local/o.json": _doc(0)}  # nothing in place yet
        assert staged.commit() == 2
    assert _files(root) == {"s/a/local/o.json": _doc(1),
                            "s/latency/m/b/local/o.json": _doc(2)}  # the staging folder gone


def test_a_run_that_does_not_finish_leaves_the_old_set_and_no_trace(tmp_path: Path) -> None:
    root = tmp_path / "new" / "bl"   # folders a run makes for its staging are removed again
    with pytest.raises(KeyboardInterrupt), StagedBaselines(root, "s") as staged:
        staged.write(root / "s" / "a" / "local" / "o.json", _doc(1))
        raise KeyboardInterrupt
    assert not (tmp_path / "new").exists()
    # a job that finishes after the run was stopped keeps nothing either
    with pytest.raises(OutputError, match="the run was stopped before its baselines were put"):
        staged.write(root / "s" / "b" / "local" / "o.json", _doc(2))
    assert not (tmp_path / "new").exists()


def test_an_interrupt_while_the_set_moves_waits_for_the_last_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "bl"
    replace, calls = os.replace, []

    def interrupted_once(src: str, dst: str) -> None:
        replace(src, dst)
        if Path(dst).name == "o.json":
            calls.append(dst)
            if len(calls) == 1:  # Ctrl-C right after the set's first rename
                raise KeyboardInterrupt

    staged = StagedBaselines(root, "s")
    for n in range(3):
        staged.write(root / "s" / f"t{n}" / "local" / "o.json", _doc(n))
    monkeypatch.setattr(staging.os, "replace", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        staged.commit()
    assert _files(root) == {f"s/t{n}/local/o.json": _doc(n) for n in range(3)}
    assert len(calls) == 3


def _leftover(root: Path, suite: str, marker: bool) -> Path:
    """A staging folder as a run killed outright leaves it (while it ran, or while it moved
    its set into place when `marker`)."""
    folder = root / f".{suite}.staging~{'k' if marker else 'r'}1234567"
    path = folder / "new" / "a" / "local" / "o.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_doc(9)))
    (folder / "lock").write_text("")
    if marker:
        (folder / "committing").write_text("")
    return folder


def test_the_next_run_clears_leftovers_and_finishes_a_set_cut_short(tmp_path: Path) -> None:
    root = tmp_path / "bl"
    old = root / "s" / "a" / "local" / "o.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps(_doc(0)))
    ran = _leftover(root, "s", marker=False)
    other_suite = _leftover(root, "s2", marker=False)
    assert clear_leftovers(root, "s") == [
        f"removed {ran.name}: the staged baselines of a run that did not finish (the "
        "baselines were left as they were)"]
    assert not ran.exists() and other_suite.exists()
    assert json.loads(old.read_text()) == _doc(0)
    moving = _leftover(root, "s", marker=True)
    assert clear_leftovers(root, "s") == [
        f"put in place the 1 remaining baseline(s) of a run killed while it put its set in "
        f"place ({moving.name})"]
    assert not moving.exists() and json.loads(old.read_text()) == _doc(9)


def test_another_run_s_staging_in_progress_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "bl"
    with StagedBaselines(root, "s") as running:
        running.write(root / "s" / "a" / "local" / "o.json", _doc(1))
        folder, = root.glob(".s.staging~*")
        assert clear_leftovers(root, "s") == [] and folder.is_dir()
        assert running.commit() == 1
    assert _files(root) == {"s/a/local/o.json": _doc(1)}


def test_a_staging_folder_is_never_a_suite_s_baselines() -> None:
    from verify.tomltable import NAME_RE

    assert not NAME_RE.fullmatch(".s" + staging.MARK + "abc")  # `~` is in no suite name


def test_update_goldens_with_a_device_down_updates_the_others_and_lists_what_it_kept(
        link_down_transport: str, device_env, tmp_path: Path, capsys) -> None:
    suite = lost_board_suite(tmp_path, link_down_transport, retries=0,
                             gates=["accuracy", "regression"])
    base = tmp_path / "bl"
    old = base / "lost" / "two_io" / "board" / "default.json"
    old.parent.mkdir(parents=True)
    old.write_text('{"format": "verify-ci-baseline", "version": 2, "outputs": {}}')
    before = old.read_bytes()
    run = run_ci([suite, "--baselines", base, "--update-goldens", "--markdown",
                  tmp_path / "ci.md"], capsys, tmp_path)
    assert run.code == 3, run.out    # the step still fails: device errors
    assert old.read_bytes() == before
    assert sorted(p.relative_to(base).as_posix() for p in base.rglob("*.json")) == [
        "lost/int_bool/local/default.json", "lost/two_io/board/default.json",
        "lost/two_io/local/default.json"]
    down = "linkdown:rack7: the link is down"
    assert run.report["baselines_not_updated"] == [
        {"job": "two_io/board/default", "why": f"device error: {down}"},
        {"job": "int_bool/board/default",
         "why": f"device error: not run: device board was unreachable earlier in this run "
                f"({down})"}]
    record = (f"verify ci {suite} --baselines {base} --update-goldens --only "
              "two_io/board/default --only int_bool/board/default")
    assert ("2 job(s) kept their old baseline (not updated: a gate failed or the job errored): "
            "two_io/board/default, int_bool/board/default; the other jobs' baselines were put "
            f"in place; record these once they pass with `{record}`\n") in run.err
    md = (tmp_path / "ci.md").read_text()
    assert (f"### Baselines not updated\n\n2 job(s) kept their old baselines (or still have "
            "none); the other jobs' new baselines were put in place together. Record these "
            f"once they pass with `{record}`:\n\n- `two_io/board/default`: device error: "
            f"{down}\n") in md


def test_an_option_set_named_with_a_leading_dot_is_put_in_place(tmp_path: Path) -> None:
    """An [[options]] name may begin with a dot (`.fast`): its baseline `.fast.json` was
    staged and then left out of the set as if it were an atomic write's temporary file,
    so --update-goldens said 'baseline written' and wrote nothing."""
    root = tmp_path / "bl"
    with StagedBaselines(root, "s") as staged:
        staged.write(root / "s" / "a" / "local" / ".fast.json", _doc(1))
        (staged._staging() / "new" / "a" / "local" / ".o.json.x1.part").write_text("{")
        assert staged.commit() == 1
    assert _files(root) == {"s/a/local/.fast.json": _doc(1)}


def test_a_staging_folder_cleared_by_another_run_as_it_was_made_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs starting together: the other one's clear_leftovers takes the new folder for a
    leftover (its lock file not yet locked) and removes it between this run's open of the lock
    file and its flock. The flock then held a removed file: the run staged into a folder that
    a write made again, lockless, and a third run's clear_leftovers threw its set away."""
    import fcntl
    import shutil

    root, made, flock, mkdtemp = tmp_path / "bl", [], fcntl.flock, staging.tempfile.mkdtemp

    def recording_mkdtemp(*args: Any, **kwargs: Any) -> str:
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    def cleared_first(fd: int, how: int) -> None:
        if len(made) == 1 and Path(made[0]).exists():  # the other run removes the folder
            shutil.rmtree(made[0])
        flock(fd, how)

    monkeypatch.setattr(staging.tempfile, "mkdtemp", recording_mkdtemp)
    monkeypatch.setattr(staging.fcntl, "flock", cleared_first)
    with StagedBaselines(root, "s") as staged:
        staged.write(root / "s" / "a" / "local" / "o.json", _doc(1))
        monkeypatch.undo()
        assert clear_leftovers(root, "s") == []   # a third run leaves the folder alone
        assert staged.commit() == 1
    assert _files(root) == {"s/a/local/o.json": _doc(1)}
