"""Device specs and profiles: `local`, `cuda[:N]`, `ssh:user@host[:port]`, `adb[:SERIAL]`, or a
name with a profile in a `devices/` folder (`phone` and `adb:phone` → `devices/phone.toml`).

Profiles are searched in `$VERIFY_DEVICES` (a path list), then `./devices`, then the
`devices/` folder shipped beside the package in a source checkout.

Profile keys (TOML): transport, address, description, python (argv prefix that runs the
Python runner), runner (argv of a native runner following docs/runner-contract.md; replaces
python), base_dir, env, providers, provider_options, [[push]] src/dest, [timeouts]
connect/command, [options] (transport-specific). String values may use the placeholders
{base_dir}, {profile_dir}, {cache} (the user's verify cache folder), {arm64_root} (the
emulated ARM64 userland: $VERIFY_ARM64_ROOT, else {cache}/arm64-root) and {env:NAME}; an
unset variable or an unknown placeholder is an error naming the key, never an empty string.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from verify.cache import verify_cache_dir
from verify.errors import ProfileError, UsageError
from verify.tomltable import TableReader

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TRANSPORTS_BUILTIN = ("local", "cuda", "ssh", "adb")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?::[^{}]*)?)\}")
_PLACEHOLDERS = ("base_dir", "profile_dir", "cache", "arm64_root", "env:NAME")
ARM64_ROOT_ENV = "VERIFY_ARM64_ROOT"


@dataclass(frozen=True)
class PushItem:
    src: Path
    dest: str


@dataclass(frozen=True)
class Profile:
    """Everything verify needs to reach one device and run the runner there."""

    name: str
    transport: str
    address: str = ""
    description: str = ""
    python: tuple[str, ...] = ()
    runner: tuple[str, ...] = ()
    base_dir: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    providers: tuple[str, ...] = (CPU,)
    provider_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    push: tuple[PushItem, ...] = ()
    connect_timeout: float = 15.0
    command_timeout: float = 600.0
    options: Mapping[str, Any] = field(default_factory=dict)
    source: Path | None = None

    @property
    def spec(self) -> str:
        """How the user named the device (`arm64`, `cuda:1`, `ssh:me@board`): for messages."""
        return self.name or self.target

    @property
    def target(self) -> str:
        """Transport and address, e.g. `ssh:me@board:2222`, `adb:SERIAL`, `local`."""
        return f"{self.transport}:{self.address}" if self.address else self.transport


def arm64_root() -> Path:
    """Where scripts/build_arm64_root.py puts the emulated ARM64 userland."""
    explicit = os.environ.get(ARM64_ROOT_ENV)
    return Path(explicit).expanduser().absolute() if explicit else verify_cache_dir() / "arm64-root"


def profile_dirs() -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("VERIFY_DEVICES", "").split(os.pathsep) if p]
    dirs.append(Path.cwd() / "devices")
    shipped = Path(__file__).resolve().parent.parent / "devices"
    if shipped.is_dir():
        dirs.append(shipped)
    seen: list[Path] = []
    for d in dirs:
        if d.resolve() not in [s.resolve() for s in seen]:
            seen.append(d)
    return seen


def find_profile(name: str) -> Path | None:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        return None
    for d in profile_dirs():
        candidate = d / f"{name}.toml"
        if candidate.is_file():
            return candidate
    return None


def list_profiles(problems: list[str] | None = None) -> list[Profile]:
    """The profiles on the search path, the first of each name. A profile that does not
    load raises its ProfileError, or with `problems` is left out and its message added there
    (`devices list` shows the rest: the command that helps find a bad profile must not be
    the one it stops)."""
    found: dict[str, Profile | None] = {}
    for d in profile_dirs():
        for path in sorted(d.glob("*.toml")):
            if path.stem in found:
                continue
            try:
                found[path.stem] = load_profile(path)
            except ProfileError as exc:
                if problems is None:
                    raise
                problems.append(str(exc))
                found[path.stem] = None  # it still shadows its namesakes further down
    return [p for p in found.values() if p is not None]


def resolve(spec: str) -> Profile:
    """Turn a device spec into a Profile; raise UsageError with the grammar when it is wrong."""
    spec = spec.strip()
    if spec.lower().endswith(".toml"):   # a profile named by its file: ./lo.toml, ~/dev/b.toml
        path = Path(spec).expanduser()
        if not path.is_file():
            raise UsageError(f"device {spec!r}: no such profile file {path}")
        return replace(load_profile(path), name=spec)
    transport, colon, target = spec.partition(":")
    if not transport:
        raise UsageError(f"device spec {spec!r} is empty; use local, cuda[:N], "
                         "ssh:user@host[:port], adb[:SERIAL] or a profile name")
    if colon and not target:  # `local:`, `adb:`: a target left out, not meant to be none
        word = {"local": "PROFILE", "cuda": "N", "adb": "SERIAL",
                "ssh": "user@host[:port]"}.get(transport, "TARGET")
        alone = f"{transport} alone or " if transport in ("local", "cuda", "adb") else ""
        raise UsageError(f"device {spec!r}: nothing after ':'; give {alone}{transport}:{word}")
    if transport == "cuda" and target and not target.isdigit():
        raise UsageError(f"device {spec!r}: cuda takes a GPU index, e.g. cuda:0")
    if transport == "local" and target and find_profile(target) is None:
        raise UsageError(f"device {spec!r}: local takes no target (cuda:N picks a GPU)")
    # A profile named by the whole spec or by its target wins over the built-in grammar.
    for name in (target, transport) if target and transport != "cuda" else (transport,):
        path = find_profile(name)
        if path is not None:
            profile = load_profile(path)
            if transport == "cuda" and target:
                return _on_gpu(profile, int(target), spec)
            if target and name == target and transport in TRANSPORTS_BUILTIN \
                    and profile.transport != transport:
                raise UsageError(f"device {spec!r}: profile {path} is for transport "
                                 f"{profile.transport!r}, not {transport!r}")
            # Reports name the device as typed (`ssh:board`, not the profile's `board`).
            return profile if name == spec else replace(profile, name=spec)
    if transport == "local":
        return Profile(name="local", transport="local")
    if transport == "cuda":
        index = int(target or 0)
        return Profile(name=spec, transport="local", providers=(CUDA, CPU),
                       provider_options={CUDA: {"device_id": index}})
    if transport == "ssh":
        if not re.fullmatch(r"(?:[^@\s:]+@)?[^@\s:/]+(?::\d{1,5})?", target):
            raise UsageError(f"device {spec!r}: expected ssh:user@host[:port]")
        return Profile(name=spec, transport="ssh", address=target)
    if transport == "adb":
        return Profile(name=spec, transport="adb", address=target)
    if ":" not in spec and transport not in TRANSPORTS_BUILTIN:
        near = difflib.get_close_matches(spec, profile_names(), n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise UsageError(f"unknown device {spec!r}: no profile {spec}.toml in "
                         f"{', '.join(str(d) for d in profile_dirs())}; {hint}use local, "
                         "cuda[:N], ssh:user@host[:port], adb[:SERIAL] or a profile name")
    return Profile(name=spec, transport=transport, address=target)


def resolve_profile(spec: str, insecure_host_key: bool = False) -> Profile:
    """`resolve`, with --insecure-host-key passed on to the ssh driver through the options."""
    profile = resolve(spec)
    if insecure_host_key:
        profile = replace(profile, options={**profile.options, "insecure_host_key": True})
    return profile


def _on_gpu(profile: Profile, index: int, spec: str) -> Profile:
    """The cuda profile with its CUDA provider pointed at GPU `index`."""
    options = {k: dict(v) for k, v in profile.provider_options.items()}
    options[CUDA] = {**options.get(CUDA, {}), "device_id": index}
    return replace(profile, name=spec, provider_options=options)


def profile_names() -> list[str]:
    """Names of the profiles on the search path, without parsing them."""
    return sorted({p.stem for d in profile_dirs() for p in d.glob("*.toml")})


def load_profile(path: Path) -> Profile:
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from exc
    return profile_from_dict(data, path, text)


_KNOWN_KEYS = ("transport", "address", "description", "python", "runner", "base_dir", "env",
               "providers", "provider_options", "push", "timeouts", "options")


def profile_from_dict(data: Mapping[str, Any], path: Path, text: str = "") -> Profile:
    """A profile from parsed TOML; `text`, the file's own, lets errors name their line."""
    r = TableReader(path, text)
    r.table(data, [], sorted(_KNOWN_KEYS))
    transport = data.get("transport")
    if not isinstance(transport, str) or not transport:
        raise r.fail(["transport"], f"missing: one of {', '.join(TRANSPORTS_BUILTIN)} or a "
                                    "third-party driver's name" if transport is None else
                     f"must be one of {', '.join(TRANSPORTS_BUILTIN)} or a third-party "
                     "driver's name")
    values = {"profile_dir": str(path.parent.resolve()),
              "cache": str(verify_cache_dir()), "arm64_root": str(arm64_root())}

    def expand(text: str, where: Sequence[str | int]) -> str:
        def sub(m: re.Match[str]) -> str:
            word = m.group(1)
            if word.startswith("env:"):
                name = word[4:]
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    raise r.fail(where, f"{{{word}}} is not a variable name")
                if name not in os.environ:
                    raise r.fail(where, f"{{{word}}}: ${name} is not set")
                return os.environ[name]
            if word not in values:
                raise r.fail(where, f"unknown placeholder {{{word}}} (known: "
                                    + ", ".join(f"{{{p}}}" for p in _PLACEHOLDERS) + ")")
            return values[word]
        return _PLACEHOLDER.sub(sub, text)

    def text_of(key: str) -> str:
        return expand(r.get(data, [], key, "text", ""), [key])

    base_dir = text_of("base_dir")  # {base_dir} in other keys is the expanded one
    values["base_dir"] = base_dir
    timeouts = r.table(data.get("timeouts", {}), ["timeouts"], ("connect", "command"))
    for key, value in timeouts.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 < value < float("inf"):
            raise r.fail(["timeouts", key], f"expected a number of seconds > 0, got {value!r}")
    push = data.get("push", [])
    if not isinstance(push, list):
        raise r.fail(["push"], "must be written as [[push]] tables with src and dest")
    push_items = []
    for i, item in enumerate(push):
        if not isinstance(item, dict) or not isinstance(item.get("src"), str) \
                or not isinstance(item.get("dest"), str):
            raise r.fail(["push", i], "needs string keys src and dest")
        r.table(item, ["push", i], ("src", "dest"))
        src = Path(expand(item["src"], ["push", i, "src"]))
        push_items.append(PushItem(src if src.is_absolute() else path.parent / src,
                                   expand(item["dest"], ["push", i, "dest"])))
    transport_name = "local" if transport == "cuda" else transport
    providers = r.get(data, [], "providers", "words", ()) or (
        (CUDA, CPU) if transport == "cuda" else (CPU,))
    provider_options = r.get(data, [], "provider_options", "table", {})
    for name in provider_options:
        r.get(provider_options, ["provider_options"], name, "table")
    return Profile(
        name=path.stem, transport=transport_name,
        address=text_of("address"),
        description=r.get(data, [], "description", "text", ""),
        python=tuple(expand(w, ["python"]) for w in r.get(data, [], "python", "words", ())),
        runner=tuple(expand(w, ["runner"]) for w in r.get(data, [], "runner", "words", ())),
        base_dir=base_dir,
        env={str(k): expand(str(v), ["env", k])
             for k, v in r.get(data, [], "env", "table", {}).items()},
        providers=providers,
        provider_options={str(k): dict(v) for k, v in provider_options.items()},
        push=tuple(push_items),
        connect_timeout=float(timeouts.get("connect", 15.0)),
        command_timeout=float(timeouts.get("command", 600.0)),
        options={k: expand(v, ["options", k]) if isinstance(v, str) else v
                 for k, v in r.get(data, [], "options", "table", {}).items()},
        source=path)
