"""`verify devices check`'s text: what the runner's --describe said (its keys from the
contract, verify/runner/contract.py) and what the host added (the spec as the user named it,
the device cache, the transfer method)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from verify.cli.render import fmt_bytes
from verify.runner.contract import Describe


def print_device(info: Mapping[str, Any]) -> None:
    """`devices check`: the runner's --describe (keys from the contract) and what the host
    added (spec, cache, transfer method)."""
    echo = click.echo
    echo(f"device {info.get('spec')}: reachable")
    if info.get(Describe.RUNNER):  # a runner other than runner.py names itself (native)
        echo(f"  {'runner':12} {info[Describe.RUNNER]}")
    for key, label in ((Describe.ARCH, "arch"), (Describe.OS, "os"),
                       (Describe.HOSTNAME, "hostname"), (Describe.PYTHON, "python"),
                       (Describe.NUMPY, "numpy"), (Describe.ONNXRUNTIME, "onnxruntime"),
                       (Describe.CPU_COUNT, "cpus")):
        value = info.get(key)
        if value is None:  # a native runner has no Python and no numpy: not "None"
            value = ("not needed (native runner)" if key in (Describe.PYTHON, Describe.NUMPY)
                     and info.get(Describe.RUNNER) else "unknown")
        echo(f"  {label:12} {value}")
    echo(f"  {'providers':12} {', '.join(info.get(Describe.PROVIDERS) or []) or 'none'}")
    free = info.get(Describe.FREE_DISK_BYTES)
    echo(f"  {'free disk':12} {fmt_bytes(free) if free is not None else '?'}")
    cache = info.get("cache")
    if isinstance(cache, dict):
        parts = cache.get("partial_transfers", 0)
        echo(f"  {'cache':12} {fmt_bytes(cache.get('bytes', 0))} in {cache.get('files', 0)} "
             f"file(s)" + (f", {parts} partial transfer(s)" if parts else "")
             + " (trim it: verify devices clean SPEC --keep-mb N)")
    if info.get("transfer_method"):
        echo(f"  {'transfers':12} {info['transfer_method']}")
    for key in (Describe.NUMPY_ERROR, Describe.ONNXRUNTIME_ERROR):
        if info.get(key):
            echo(f"  warning: {info[key]}")
