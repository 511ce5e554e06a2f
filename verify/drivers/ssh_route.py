"""Where an ssh device spec leads: the user's OpenSSH client config applied, ProxyJump expanded.

`ssh:[user@]host[:port]` names a host as `ssh` would: `host` may be a `Host` alias of the
client config, whose HostName, User, Port, IdentityFile, IdentitiesOnly, UserKnownHostsFile
and ProxyJump apply; what the spec spells out (user, port) wins over the config, as on
OpenSSH's command line. ProxyJump (`a,b` or `ssh://user@a:port,...`) becomes a list of hops:
the first jump is resolved with its own config (its own ProxyJump included), later jumps and
the target are reached through the hop before them, as `ssh -J` does.

The config file: the profile's `options.ssh_config`, else `$VERIFY_SSH_CONFIG`, else
~/.ssh/config; `none` reads no file (as `ssh -F none`). `Include` is followed (globs; relative
paths from ~/.ssh); its lines are read in place, so an Include inside a Host block carries no
block of its own. ProxyCommand is refused (verify never runs a command from the config).
StrictHostKeyChecking is not honoured: every hop's key is checked against known_hosts whatever
it says; only the strict direction exists.
"""

from __future__ import annotations

import getpass
import glob
import io
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import paramiko

from verify.errors import ProfileError, UsageError

CONFIG_ENV = "VERIFY_SSH_CONFIG"
DEFAULT_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
_MAX_HOPS = 8
_MAX_INCLUDE_DEPTH = 16
_ADDRESS = re.compile(r"(?:(?P<user>[^@\s:/]+)@)?(?P<host>[^@\s:/]+)(?::(?P<port>\d{1,5}))?")


@dataclass(frozen=True)
class SshHop:
    """One host to log in to on the way to the device (the last hop is the device)."""

    name: str                      # as written in the spec or in ProxyJump (an alias, maybe)
    host: str                      # where to connect: HostName, else the name
    port: int
    user: str
    identities: tuple[Path, ...]   # key files to offer, besides the agent's and ~/.ssh's
    identities_only: bool          # IdentitiesOnly yes: offer those files only
    known_hosts: tuple[Path, ...]  # the files that must list this hop's host key
    strict_setting: str            # StrictHostKeyChecking as configured ("" unset), for messages

    @property
    def host_entry(self) -> str:
        """This hop's name in known_hosts (`host`, or `[host]:port` off port 22)."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def describe(self) -> str:
        shown = self.name if self.name == self.host else f"{self.name} ({self.host})"
        return f"{shown} port {self.port}"


@dataclass(frozen=True)
class _Spec:
    user: str | None
    host: str
    port: int | None


def parse_address(text: str, *, what: str = "ssh:") -> _Spec:
    """`[user@]host[:port]` (ProxyJump also allows an `ssh://` prefix)."""
    body = text.strip()
    body = body[len("ssh://"):] if body.startswith("ssh://") else body
    m = _ADDRESS.fullmatch(body)
    port = int(m["port"]) if m and m["port"] else None
    if not m or (port is not None and not 0 < port < 65536):
        raise UsageError(f"{what}{text}: expected ssh:user@host[:port] or a Host alias of "
                         "the ssh config")
    return _Spec(m["user"], m["host"], port)


def config_path(options: Mapping[str, object]) -> Path | None:
    """The client config to read, or None for none (`options.ssh_config`, the env, default)."""
    explicit = options.get("ssh_config")
    text = str(explicit) if explicit not in (None, "") else os.environ.get(CONFIG_ENV, "")
    if text.strip().lower() == "none":
        return None
    if text:
        path = Path(os.path.expanduser(text))
        if not path.is_file():
            source = "options.ssh_config" if explicit not in (None, "") else f"${CONFIG_ENV}"
            raise ProfileError(f"ssh config {path} does not exist ({source}; 'none' reads "
                               "no config)")
        return path
    path = Path(os.path.expanduser(DEFAULT_CONFIG))
    return path if path.is_file() else None


def load_config(path: Path | None) -> paramiko.SSHConfig:
    """The parsed config (empty for None), with Include lines followed."""
    config = paramiko.SSHConfig()
    if path is None:
        return config
    lines: list[str] = []
    _read_with_includes(path, lines, 0)
    try:
        config.parse(io.StringIO("".join(lines)))
    except Exception as exc:  # noqa: BLE001 - paramiko raises several kinds on bad syntax
        raise ProfileError(f"ssh config {path}: {exc}") from exc
    return config


def _read_with_includes(path: Path, out: list[str], depth: int) -> None:
    if depth > _MAX_INCLUDE_DEPTH:
        raise ProfileError(f"ssh config {path}: Include nested deeper than {_MAX_INCLUDE_DEPTH}")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ProfileError(f"cannot read ssh config {path}: {exc.strerror or exc}") from exc
    for line in text.splitlines(keepends=True):
        words = line.strip().replace("=", " ", 1).split()
        if not words or words[0].lower() != "include":
            out.append(line if line.endswith("\n") else line + "\n")
            continue
        for pattern in words[1:]:
            expanded = os.path.expanduser(pattern)
            if not os.path.isabs(expanded):
                expanded = os.path.join(os.path.expanduser("~/.ssh"), expanded)
            for name in sorted(glob.glob(expanded)):
                if os.path.isfile(name):
                    _read_with_includes(Path(name), out, depth + 1)


def route(address: str, options: Mapping[str, object]) -> tuple[SshHop, ...]:
    """The hops from here to the device named by `address` (jump hosts first, device last)."""
    target = parse_address(address)
    path = config_path(options)
    config = load_config(path)
    known = options.get("known_hosts")
    known_override = (Path(os.path.expanduser(str(known))),) if known else None
    identity = options.get("identity")
    extra_identity = (Path(os.path.expanduser(str(identity))),) if identity else ()
    hops = _resolve(target, config, path, known_override, extra_identity, follow_jumps=True,
                    depth=0)
    if len(hops) > _MAX_HOPS:
        raise ProfileError(f"ssh:{address}: ProxyJump chain longer than {_MAX_HOPS} hops "
                           f"(a loop in {path}?)")
    return tuple(hops)


def _resolve(spec: _Spec, config: paramiko.SSHConfig, path: Path | None,
             known_override: tuple[Path, ...] | None, extra_identity: tuple[Path, ...], *,
             follow_jumps: bool, depth: int) -> list[SshHop]:
    if depth > _MAX_HOPS:
        raise ProfileError(f"ssh config {path}: ProxyJump loops (through {spec.host})")
    try:
        entry = config.lookup(spec.host)
    except Exception as exc:  # noqa: BLE001 - Match exec and tokens can fail many ways
        raise ProfileError(f"ssh config {path}: cannot apply it to {spec.host}: {exc}") from exc
    try:
        port = spec.port or int(entry.get("port", 22))
    except ValueError:
        raise ProfileError(f"ssh config {path}: Port {entry.get('port')!r} of {spec.host} "
                           "is not a number") from None
    configured = [Path(os.path.expanduser(p)) for p in entry.get("identityfile", [])]
    # OpenSSH skips configured key files that do not exist (Host * defaults often list several).
    identities = extra_identity + tuple(p for p in configured if p.is_file())
    if known_override is not None:
        known_hosts = known_override
    else:
        files = entry.get("userknownhostsfile", DEFAULT_KNOWN_HOSTS).split()
        known_hosts = tuple(Path(os.path.expanduser(f)) for f in files if f.lower() != "none")
    hop = SshHop(name=spec.host, host=entry.get("hostname", spec.host), port=port,
                 user=spec.user or entry.get("user") or getpass.getuser(),
                 identities=identities,
                 identities_only=entry.get("identitiesonly", "no").lower() == "yes",
                 known_hosts=known_hosts,
                 strict_setting=entry.get("stricthostkeychecking", ""))
    jumps = entry.get("proxyjump", "") if follow_jumps else ""
    if not jumps or jumps.lower() == "none":
        command = entry.get("proxycommand", "")
        if command and command.lower() != "none":
            raise ProfileError(f"ssh config {path}: {spec.host} uses ProxyCommand, which "
                               "verify does not run; use ProxyJump")
        return [hop]
    specs = [parse_address(j, what=f"ssh config {path}: ProxyJump of {spec.host}: ")
             for j in jumps.split(",")]
    # Jump hosts are logged in to as themselves: the device's -i/known_hosts options do not
    # apply to them (as `ssh -J` gives them their own ssh), except an explicit known_hosts.
    first = _resolve(specs[0], config, path, known_override, (), follow_jumps=True,
                     depth=depth + 1)
    rest = [_resolve(s, config, path, known_override, (), follow_jumps=False,
                     depth=depth + 1)[0] for s in specs[1:]]
    return [*first, *rest, hop]
