"""Logging in to one ssh hop: its host key checked, paramiko's failures as one-line messages.

Every hop (jump hosts and the device) is checked against its known_hosts files: an unknown
host or a changed key is refused, whatever StrictHostKeyChecking says in the ssh config;
`insecure` (the explicit `--insecure-host-key` opt-out) accepts any key and the caller warns.
A hop after the first is reached through a `direct-tcpip` channel of the hop before it (what
`ssh -J` does), passed to paramiko as the socket.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

import paramiko

from verify.drivers.ssh_route import SshHop
from verify.errors import ConnectError, ProfileError

KEEPALIVE = 30  # seconds between keepalive messages on an idle connection


@dataclass(frozen=True)
class Login:
    """A logged-in hop: its client, and the key accepted unchecked (insecure mode) if any."""

    client: paramiko.SSHClient
    unchecked_key: paramiko.PKey | None


def insecure_host_key(options: Mapping[str, object]) -> bool:
    """The profile's `options.insecure_host_key` (the opt-out of the host key check)."""
    value = options.get("insecure_host_key", False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0", ""):
        return value.lower() in ("true", "yes", "1")
    raise ProfileError(f"options.insecure_host_key must be true or false, not {value!r}")


def log_in(hop: SshHop, where: str, timeout: float, insecure: bool,
           sock: paramiko.Channel | None = None) -> Login:
    """Connect and authenticate to `hop` (through `sock` if given); raise ConnectError."""
    client = paramiko.SSHClient()
    accept_any = _AcceptAny()
    if insecure:
        client.set_missing_host_key_policy(accept_any)
    else:
        for path in hop.known_hosts:
            if path.is_file():
                try:
                    client.load_system_host_keys(str(path))
                except OSError as exc:
                    raise ConnectError(f"{where}: cannot read known_hosts {path}: "
                                       f"{exc.strerror or exc}") from exc
        client.set_missing_host_key_policy(_RejectUnknown(where, hop))
    started = time.monotonic()
    try:
        client.connect(hop.host, hop.port, username=hop.user,
                       key_filename=[str(p) for p in hop.identities] or None,
                       allow_agent=not hop.identities_only,
                       look_for_keys=not hop.identities_only, sock=sock, timeout=timeout,
                       banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout)
    except BaseException as exc:
        client.close()
        converted = _connect_failed(hop, where, exc, time.monotonic() - started, timeout)
        if converted is None:
            raise
        raise converted from exc
    transport = client.get_transport()
    if transport is not None:
        # NAT boxes and Wi-Fi access points drop idle flows during long silent commands.
        transport.set_keepalive(KEEPALIVE)
    return Login(client, accept_any.key)


def open_tunnel(login: Login, via: SshHop, to: SshHop, where: str,
                timeout: float) -> paramiko.Channel:
    """A direct-tcpip channel from the logged-in hop `via` to the next hop `to`."""
    transport = login.client.get_transport()
    try:
        if transport is None or not transport.is_active():
            raise paramiko.SSHException("connection lost")
        return transport.open_channel("direct-tcpip", (to.host, to.port), ("127.0.0.1", 0),
                                      timeout=timeout)
    except paramiko.ChannelException as exc:
        # OpenSSH answers 1 (prohibited) when AllowTcpForwarding is off, 2 when it could not
        # connect onward.
        hint = "; allow it with AllowTcpForwarding in its sshd_config" if exc.code == 1 else ""
        raise ConnectError(f"{where}: jump host {via.describe()} could not open a tunnel to "
                           f"{to.host} port {to.port}: {exc.text or exc}{hint}") from exc
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise ConnectError(f"{where}: jump host {via.describe()} did not open a tunnel to "
                           f"{to.host} port {to.port} within {timeout:g} s: "
                           f"{reason(exc)}") from exc


def _connect_failed(hop: SshHop, where: str, exc: BaseException, elapsed: float,
                    limit: float) -> ConnectError | None:
    """verify's error for a failed login, or None to let an unexpected one through."""
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        known = hop.known_hosts[0] if hop.known_hosts else "known_hosts"
        return ConnectError(
            f"{where}: the host key changed: {known} has {fingerprint(exc.expected_key)}, the "
            f"server sent {fingerprint(exc.key)}; if the device was reinstalled, remove the old "
            f"key with ssh-keygen -R '{hop.host_entry}' -f {known}, otherwise someone may be "
            "intercepting the connection")
    tried = ("" if hop.identities_only else "ssh-agent, ~/.ssh keys") + \
        "".join(f", {p}" for p in hop.identities)
    tried = tried.lstrip(", ") or "no key"
    if isinstance(exc, paramiko.PasswordRequiredException):
        return ConnectError(f"{where}: authentication failed for user {hop.user}: a key needs "
                            f"its passphrase (tried {tried}); load it into ssh-agent with ssh-add")
    if isinstance(exc, paramiko.AuthenticationException):
        return ConnectError(f"{where}: authentication failed for user {hop.user} (tried "
                            f"{tried}); add your public key to the device's "
                            "~/.ssh/authorized_keys or set options.identity")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        if codes == {errno.ECONNREFUSED}:
            return ConnectError(f"{where}: connection refused by {hop.host} port {hop.port}; "
                                "is sshd running there?")
        return ConnectError(f"{where}: cannot connect to {hop.host} port {hop.port}: "
                            f"{reason(next(iter(exc.errors.values())))}")
    if isinstance(exc, socket.gaierror):
        return ConnectError(f"{where}: cannot resolve host {hop.host}: {exc.strerror or exc}")
    # paramiko gives up a slow handshake without saying so ("No existing session").
    if timed_out(exc) or (isinstance(exc, (paramiko.SSHException, EOFError))
                          and elapsed >= limit):
        return ConnectError(f"{where}: {hop.host} port {hop.port} did not answer within "
                            f"{limit:g} s (connect timeout)")
    if isinstance(exc, OSError):
        return ConnectError(f"{where}: cannot connect to {hop.host} port {hop.port}: "
                            f"{reason(exc)}")
    if isinstance(exc, (paramiko.SSHException, EOFError)):
        return ConnectError(f"{where}: ssh handshake with {hop.host} port {hop.port} failed: "
                            f"{reason(exc)}")
    return None


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    """Refuse a host that known_hosts does not list, with the command that would add it."""

    def __init__(self, where: str, hop: SshHop) -> None:
        self.where, self.hop = where, hop

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        hop = self.hop
        known = hop.known_hosts[0] if hop.known_hosts else "~/.ssh/known_hosts"
        port = f"-p {hop.port} " if hop.port != 22 else ""
        ignored = ""
        if hop.strict_setting and hop.strict_setting.lower() not in ("yes", "true"):
            ignored = (f" (StrictHostKeyChecking {hop.strict_setting} in the ssh config is not "
                       "honoured: verify never accepts an unknown key by itself)")
        raise ConnectError(
            f"{self.where}: host key not in {known}; add it with "
            f"ssh-keyscan {port}{hop.host} >> {known} (after checking its fingerprint "
            f"{fingerprint(key)}) or pass --insecure-host-key{ignored}")


class _AcceptAny(paramiko.MissingHostKeyPolicy):
    """The explicit opt-out: accept any key; remember it so the driver can warn."""

    key: paramiko.PKey | None = None

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        self.key = key


def fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


def reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def timed_out(exc: BaseException | None) -> bool:
    """True if exc, or what it was raised from, is a timeout (paramiko wraps some of them)."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
