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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from verify.errors import ProfileError, UsageError

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


def verify_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "verify"


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


def list_profiles() -> list[Profile]:
    found: dict[str, Profile] = {}
    for d in profile_dirs():
        for path in sorted(d.glob("*.toml")):
            if path.stem not in found:
                found[path.stem] = load_profile(path)
    return list(found.values())


def resolve(spec: str) -> Profile:
    """Turn a device spec into a Profile; raise UsageError with the grammar when it is wrong."""
    spec = spec.strip()
    if spec.lower().endswith(".toml"):   # a profile named by its file: ./lo.toml, ~/dev/b.toml
        path = Path(spec).expanduser()
        if not path.is_file():
            raise UsageError(f"device {spec!r}: no such profile file {path}")
        return replace(load_profile(path), name=spec)
    transport, _, target = spec.partition(":")
    if not transport:
        raise UsageError(f"device spec {spec!r} is empty; use local, cuda[:N], "
                         "ssh:user@host[:port], adb[:SERIAL] or a profile name")
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
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from exc
    return profile_from_dict(data, path)


_KNOWN_KEYS = {"transport", "address", "description", "python", "runner", "base_dir", "env",
               "providers", "provider_options", "push", "timeouts", "options"}


def profile_from_dict(data: Mapping[str, Any], path: Path) -> Profile:
    unknown = sorted(set(data) - _KNOWN_KEYS)
    if unknown:
        raise ProfileError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KNOWN_KEYS))})")
    transport = data.get("transport")
    if not isinstance(transport, str) or not transport:
        raise ProfileError(f"{path}: 'transport' must be one of {', '.join(TRANSPORTS_BUILTIN)} "
                           "or a third-party driver's name")
    base_dir = _str(data, "base_dir", path)
    values = {"profile_dir": str(path.parent.resolve()),
              "cache": str(verify_cache_dir()), "arm64_root": str(arm64_root())}

    def expand(text: str, key: str = "") -> str:
        def sub(m: re.Match[str]) -> str:
            word = m.group(1)
            if word.startswith("env:"):
                name = word[4:]
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    raise ProfileError(f"{path}: {key}: {{{word}}} is not a variable name")
                if name not in os.environ:
                    raise ProfileError(f"{path}: {key}: {{{word}}}: ${name} is not set")
                return os.environ[name]
            if word not in values:
                raise ProfileError(f"{path}: {key}: unknown placeholder {{{word}}} (known: "
                                   + ", ".join(f"{{{p}}}" for p in _PLACEHOLDERS) + ")")
            return values[word]
        return _PLACEHOLDER.sub(sub, text)

    base_dir = expand(base_dir, "base_dir")  # {base_dir} in other keys is the expanded one
    values["base_dir"] = base_dir
    timeouts = data.get("timeouts", {})
    if not isinstance(timeouts, dict):
        raise ProfileError(f"{path}: [timeouts] must be a table with connect and command")
    for key in timeouts:
        value = timeouts[key]
        if key not in ("connect", "command"):
            raise ProfileError(f"{path}: timeouts.{key}: unknown key (connect, command)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 < value < float("inf"):
            raise ProfileError(f"{path}: timeouts.{key} = {value!r}: expected a number of "
                               "seconds > 0")
    push_items = []
    for i, item in enumerate(data.get("push", [])):
        if not isinstance(item, dict) or not isinstance(item.get("src"), str) \
                or not isinstance(item.get("dest"), str):
            raise ProfileError(f"{path}: push[{i}] needs string keys src and dest")
        src = Path(expand(item["src"], f"push[{i}].src"))
        push_items.append(PushItem(src if src.is_absolute() else path.parent / src,
                                   expand(item["dest"], f"push[{i}].dest")))
    transport_name = "local" if transport == "cuda" else transport
    providers = tuple(_list(data, "providers", path)) or (
        (CUDA, CPU) if transport == "cuda" else (CPU,))
    return Profile(
        name=path.stem, transport=transport_name,
        address=expand(_str(data, "address", path), "address"),
        description=_str(data, "description", path),
        python=tuple(expand(w, "python") for w in _list(data, "python", path)),
        runner=tuple(expand(w, "runner") for w in _list(data, "runner", path)),
        base_dir=base_dir,
        env={str(k): expand(str(v), f"env.{k}") for k, v in _table(data, "env", path).items()},
        providers=providers,
        provider_options={str(k): dict(v) for k, v in _table(data, "provider_options", path).items()},
        push=tuple(push_items),
        connect_timeout=float(timeouts.get("connect", 15.0)),
        command_timeout=float(timeouts.get("command", 600.0)),
        options={k: expand(v, f"options.{k}") if isinstance(v, str) else v
                 for k, v in _table(data, "options", path).items()},
        source=path)


def _str(data: Mapping[str, Any], key: str, path: Path) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise ProfileError(f"{path}: {key!r} must be a string")
    return value


def _list(data: Mapping[str, Any], key: str, path: Path) -> list[str]:
    value = data.get(key, [])
    if isinstance(value, str):
        return value.split()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProfileError(f"{path}: {key!r} must be a list of strings")
    return value


def _table(data: Mapping[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ProfileError(f"{path}: {key!r} must be a table")
    return value
