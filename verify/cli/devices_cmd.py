"""`verify devices list|check|clean`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import click

from verify.cli import CONTEXT, cli, emit_json, json_option, render, render_device
from verify.cli.groups import device_argument
from verify.errors import EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from verify.options import DeviceTarget


# --- devices-------------------------------------------------------------------------------
@cli.group(context_settings=CONTEXT)
def devices() -> None:
    """List device profiles, check that a device is reachable and ready, clean its cache.

    \b
      verify devices list
      verify devices check ssh:me@board
      verify devices clean adb:phone
    """


@devices.command("list", context_settings=CONTEXT)
@json_option
def devices_list(as_json: bool) -> int:
    """List the device profiles found in $VERIFY_DEVICES, ./devices and the shipped devices/.

    A profile that does not load is left out of the list and named on stderr after it, with
    its line and key; the exit code is then 2.

    \b
      verify devices list
    """
    from verify.devices import list_profiles, profile_dirs

    problems: list[str] = []
    rows = [render.profile_row(p) for p in list_profiles(problems)]
    if as_json:
        emit_json({"search_path": [str(d) for d in profile_dirs()], "profiles": rows,
                   "problems": problems}, "devices-list")
    else:
        render.print_profiles(rows)
    for problem in problems:  # after the listing: each bad profile named, exit 2
        click.echo(f"error: {problem}", err=True)
    return EXIT_USAGE if problems else EXIT_OK


@devices.command("check", context_settings=CONTEXT)
@device_argument
@click.option("--conformance", is_flag=True,
              help="Run the runner contract's checks against SPEC's runner (docs/"
                   "runner-contract.md): a pass/fail line each; exit 1 if any fails.")
@json_option
def devices_check(device: "DeviceTarget", conformance: bool, as_json: bool) -> int:
    """Connect to SPEC and report arch, OS, Python, numpy/onnxruntime, providers, free disk.

    Each of the profile's execution providers is tried: the Python runner makes a session with
    it, since onnxruntime lists a provider whose libraries it cannot load (CUDA, cuDNN) and
    then runs on the CPU instead. Exits 3 with the reason when the device cannot be reached,
    cannot run the runner, or cannot run one of the providers.

    \b
      verify devices check local
      verify devices check cuda
      verify devices check ssh:me@192.0.2.10:2222
      verify devices check ssh:myboard     # a Host alias of ~/.ssh/config, ProxyJump too

    Over ssh it also says how files travel: SFTP, or `cat` over exec when the server has no
    sftp subsystem (large downloads always stream through `cat`).

    With --conformance it checks the profile's runner (yours, or the native one) against the
    runner contract on that device, through its transport: --describe against the contract's
    JSON Schema; a timed job on a tiny model it pushes, outputs against onnxruntime on this
    host; a bad model, a bad input and a missing provider answered with a result of kind
    model, input and provider; a job of an unknown version answered with exit 2 and no
    result; a dump job whose records match the schema and whose final outputs are
    bit-identical to the run's.

    \b
      verify devices check arm64-native --conformance
    """
    from verify.errors import EXIT_MISMATCH, ProviderUnavailable
    profile = device.profile()
    if conformance:
        from verify.conformance import run_checks

        checks = run_checks(profile)
        if as_json:
            emit_json({"spec": profile.spec, "passed": all(c.passed for c in checks),
                       "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail}
                                  for c in checks]}, "devices-conformance")
        else:
            for c in checks:
                click.echo(f"{'PASS' if c.passed else 'FAIL'}  {c.name}: {c.detail}")
            failed = sum(not c.passed for c in checks)
            click.echo(f"{profile.spec}: " + (f"{failed} of {len(checks)} checks failed"
                                              if failed else f"all {len(checks)} checks passed"))
        return EXIT_MISMATCH if any(not c.passed for c in checks) else EXIT_OK
    from verify.pipeline import describe_device, provider_problems

    info = describe_device(profile)
    problems = provider_problems(profile, info)
    if as_json:
        emit_json(info, "devices-check")
    else:
        render_device.print_device(info)
    if problems:
        raise ProviderUnavailable(f"{profile.spec}: " + "; ".join(problems))
    return EXIT_OK


@devices.command("clean", context_settings=CONTEXT)
@device_argument
@click.option("--keep-mb", type=float, default=None, metavar="N",
              help="Keep the cache, up to N MB of its most recently used files; remove the "
                   "rest and partial transfers (work directories stay).")
@json_option
def devices_clean(device: "DeviceTarget", keep_mb: float | None, as_json: bool) -> int:
    """Remove verify's file cache and leftover work directories from the device SPEC.

    The next run pushes the runner, model and inputs again. Refused (exit 2) while a verify
    command on this host is using the device; one on another host is not seen, so clean a
    shared device when nothing runs there. `verify devices check` shows how much the cache
    holds.

    \b
      verify devices clean phone
      verify devices clean ssh:me@192.0.2.10
      verify devices clean phone --keep-mb 500     # least recently used files go first
    """
    from verify.drivers import clean_device
    from verify.errors import UsageError
    if keep_mb is not None and not (keep_mb >= 0 and math.isfinite(keep_mb)):
        raise UsageError(f"--keep-mb {keep_mb:g}: expected a number of MB >= 0")
    profile = device.profile()
    removed = clean_device(profile, None if keep_mb is None else int(keep_mb * (1 << 20)))
    if as_json:
        emit_json({"spec": profile.spec, "removed": removed}, "devices-clean")
    else:
        for path in removed:
            click.echo(f"removed {path}")
        click.echo(f"device {profile.spec}: " + ("clean" if keep_mb is None else
                   f"cache trimmed to at most {keep_mb:g} MB ({len(removed)} file(s) removed)"))
    return EXIT_OK
