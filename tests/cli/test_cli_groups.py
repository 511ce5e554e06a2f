"""Option groups (verify/cli/groups.py): each adds its options to a command and hands it one
value object; the commands that share a group share its flags, defaults and checks."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import click
import pytest
from helpers_cli import verify

from verify.cli import cli
from verify.cli.groups import archive_selection, device_target, session_settings, timed_runs
from verify.options import (
    ArchiveSelection,
    DeviceTarget,
    SessionSettings,
    TimedRuns,
    Tolerances,
)


def _probe() -> tuple[click.Command, list[dict[str, Any]]]:
    """A throwaway command with every group, recording what its function receives."""
    seen: list[dict[str, Any]] = []

    @click.command()
    @archive_selection("which case")
    @device_target("the job")
    @timed_runs("case")
    @session_settings()
    def probe(**values: Any) -> None:
        seen.append(values)

    return probe, seen


def test_each_group_builds_one_value_from_its_options() -> None:
    probe, seen = _probe()
    probe.main(["m.vtc", "--case", "2", "--tol", "a*:atol=1", "--rtol", "0.5", "--device",
                "ssh:me@box", "--timeout", "30", "--insecure-host-key", "--iter", "3",
                "--warmup", "0", "--provider", "CUDAExecutionProvider", "--opt-level",
                "basic", "--threads", "2"], standalone_mode=False)
    assert seen == [{
        "selection": ArchiveSelection(Path("m.vtc"), 2, Tolerances(None, 0.5, ("a*:atol=1",))),
        "device": DeviceTarget("ssh:me@box", True, 30.0),
        "timed": TimedRuns(3, 0),
        "session": SessionSettings("basic", 2, ("CUDAExecutionProvider",))}]


def test_defaults_are_the_value_objects_defaults() -> None:
    probe, seen = _probe()
    probe.main(["m.vtc"], standalone_mode=False)
    assert seen == [{"selection": ArchiveSelection(Path("m.vtc")), "device": DeviceTarget(),
                     "timed": TimedRuns(), "session": SessionSettings()}]


@pytest.mark.parametrize("command", ["run", "bench", "localize"])
def test_the_commands_take_a_handful_of_objects(command: str) -> None:
    function = cli.get_command(click.Context(cli), command).callback
    params = inspect.signature(function).parameters
    assert {"selection", "device"} <= set(params)
    assert not {"archive", "device_spec", "atol", "rtol", "tol_specs", "timeout",
                "insecure_host_key", "iterations", "opt_level"} & set(params)
    assert len(params) <= 10, list(params)


@pytest.mark.parametrize("argv, message", [
    (["run", "x.vtc", "--timeout", "0"], "error: --timeout 0: expected a number of seconds > 0\n"),
    (["bench", "x.vtc", "--timeout", "-1"],
     "error: --timeout -1: expected a number of seconds > 0\n"),
    (["localize", "x.vtc", "--timeout", "inf"],
     "error: --timeout inf: expected a number of seconds > 0\n"),
])
def test_a_groups_check_is_the_same_on_every_command(capsys, argv: list[str],
                                                      message: str) -> None:
    code, out, err = verify(capsys, *argv)
    assert (code, out, err) == (2, "", message)
