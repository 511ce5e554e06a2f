"""Transport registry: a name → Driver class, imported only when used.

Third-party drivers register under the entry-point group `verify.drivers`
(`name = "package.module:ClassName"`). A driver whose library is missing raises
MissingDependency naming the extra to install, and breaks nothing else.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points
from pathlib import Path

from verify import DISTRIBUTION
from verify.devices import Profile, arm64_root
from verify.drivers.base import Driver, DriverConfig
from verify.errors import ConnectError, MissingDependency, UsageError

_BUILTIN: dict[str, tuple[str, str, str]] = {
    # name: (module, class, extra that provides its dependency)
    "local": ("verify.drivers.local", "LocalDriver", ""),
    "ssh": ("verify.drivers.ssh", "SshDriver", "ssh"),
    "adb": ("verify.drivers.adb", "AdbDriver", "adb"),
}


def available_transports() -> list[str]:
    names = set(_BUILTIN)
    names.update(ep.name for ep in entry_points(group="verify.drivers"))
    return sorted(names)


def driver_class(transport: str) -> type[Driver]:
    if transport in _BUILTIN:
        module_name, class_name, extra = _BUILTIN[transport]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("verify"):
                raise MissingDependency(
                    f"the {transport} transport needs the {exc.name} package: "
                    f"pip install '{DISTRIBUTION}[{extra}]'") from exc
            raise
        return getattr(module, class_name)
    for ep in entry_points(group="verify.drivers"):
        if ep.name == transport:
            return ep.load()
    raise UsageError(f"unknown transport {transport!r}; available: "
                     f"{', '.join(available_transports())} (as a --device: local, cuda[:N], "
                     "ssh:user@host[:port], adb[:SERIAL] or a profile name)")


def make_driver(profile: Profile) -> Driver:
    """An unopened driver for the profile's device."""
    if profile.transport == "local":
        _check_local_paths(profile)
    config = DriverConfig(transport=profile.transport, address=profile.address,
                          base_dir=profile.base_dir, env=dict(profile.env),
                          connect_timeout=profile.connect_timeout,
                          command_timeout=profile.command_timeout, options=dict(profile.options),
                          spec=profile.spec)
    return driver_class(profile.transport)(config)


def _check_local_paths(profile: Profile) -> None:
    """The program a local profile starts, and any path into the emulated ARM64 root, must
    exist: qemu-user exits 1 without a word when its root or guest program is missing."""
    root = arm64_root()
    for argv in (profile.python, profile.runner):
        for i, word in enumerate(argv):
            in_root = Path(word).is_absolute() and Path(word).is_relative_to(root)
            if ((i == 0 and word.startswith("/")) or in_root) and not os.path.exists(word):
                hint = "; build the emulated ARM64 userland with python " \
                    "scripts/build_arm64_root.py" if in_root else ""
                raise ConnectError(f"{profile.spec}: {word} does not exist{hint}")


def clean_device(profile: Profile, keep_bytes: int | None = None) -> list[str]:
    """Remove verify's cache and work directories from the device; return what was removed.
    With `keep_bytes`, only partial transfers and the least recently used cache files go,
    until the cache holds at most that much (work directories are left alone).

    Refused (UsageError) while a verify command on this host uses the device (live.py); one
    on another host is not seen: clean a shared device when nothing runs there.
    """
    from verify.drivers.live import DeviceLock

    driver = make_driver(profile)
    with DeviceLock(driver.work_key, profile.spec, exclusive=True), driver:
        if keep_bytes is not None:
            return [f.path for f in driver.evict(keep_bytes)]
        removed = []
        for path in (driver.cache_dir, driver.jobs_dir):
            if driver.exists(path):
                driver.remove(path)
                removed.append(path)
        return removed
