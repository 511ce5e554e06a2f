"""Which machine a latency was measured on: a fingerprint of the device's own description.

Latency baselines are kept per machine (docs/suite.md, "Baselines"): a median recorded on one
machine says nothing about another. The fingerprint hashes what the runner reports about the
machine it runs on (host name, architecture, OS, CPU count and model, a hash of the OS's
machine id), so the same device always gets the same one and a fresh clone on another machine
gets its own, even where every VM is called `vm`. A CI fleet whose runners are fresh VMs of
one kind names the machine itself: `VERIFY_MACHINE=LABEL` replaces the host name and machine
id of every device that runs on this host (local, cuda, emulated targets).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from collections.abc import Mapping
from typing import Any

from verify.runner.contract import Describe as D

ENV = "VERIFY_MACHINE"


def facts(device: Mapping[str, Any], host: str | None = None) -> dict[str, Any]:
    """The parts of a device description that identify its machine; `host` is this host's
    name (VERIFY_MACHINE applies to devices reporting it)."""
    name = str(device.get(D.HOSTNAME) or "")
    machine_id = str(device.get(D.MACHINE_ID) or "")
    label = os.environ.get(ENV, "").strip()
    if label and name == (platform.node() if host is None else host):
        name, machine_id = label, ""
    # named as in the description they come from, but "system" (the OS without its release)
    return {D.HOSTNAME: name, D.ARCH: str(device.get(D.ARCH) or ""),
            "system": str(device.get(D.OS) or "").split(" ")[0],
            D.CPU_COUNT: device.get(D.CPU_COUNT), D.CPU: str(device.get(D.CPU) or ""),
            D.MACHINE_ID: machine_id}


def fingerprint(device: Mapping[str, Any], host: str | None = None) -> str:
    """`<host name>-<10 hex digits>`: readable, and different for different machines."""
    f = facts(device, host)
    digest = hashlib.sha256(json.dumps(f, sort_keys=True).encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9_.+-]+", "-", f[D.HOSTNAME]).strip("-.")[:40]
    return f"{slug or 'machine'}-{digest}"


def this_host() -> tuple[str, dict[str, Any]]:
    """The fingerprint of this host (as the local device reports it) and its facts."""
    from verify.runner import runner

    described = runner.describe()
    return fingerprint(described), facts(described)
