"""The shared option values (verify/options.py) check what no command-line type can, and layer
like the suite files and commands expect."""

from __future__ import annotations

import pytest

from verify.errors import UsageError
from verify.options import DeviceTarget, SessionSettings, TimedRuns, Tolerances


def test_values_refuse_what_a_run_cannot_use() -> None:
    with pytest.raises(UsageError, match="^--iter must be at least 1$"):
        TimedRuns(0)
    with pytest.raises(UsageError, match="^--warmup must be 0 or more$"):
        TimedRuns(1, -1)
    with pytest.raises(UsageError, match="^--opt-level must be one of disable, basic, "
                                         "extended, layout, all$"):
        SessionSettings("fast")
    with pytest.raises(UsageError, match="^--threads must be 0 or more$"):
        SessionSettings(threads=-2)


def test_tolerances_layer_the_more_specific_in_front() -> None:
    inner = Tolerances(None, 0.1, ("a:atol=1",))
    assert inner.over(Tolerances(1.0, 2.0, ("b:atol=2",))) == \
        Tolerances(1.0, 0.1, ("a:atol=1", "b:atol=2"))
    assert Tolerances().over(Tolerances()) == Tolerances()


def test_a_device_target_resolves_to_its_profile_with_the_host_key_choice() -> None:
    plain, lax = DeviceTarget("ssh:me@box").profile(), DeviceTarget("ssh:me@box", True).profile()
    assert (plain.transport, plain.address) == ("ssh", "me@box")
    assert "insecure_host_key" not in plain.options
    assert lax.options["insecure_host_key"] is True
    with pytest.raises(UsageError, match="expected ssh:user@host"):
        DeviceTarget("ssh:me@@box").profile()
