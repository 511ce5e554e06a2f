"""One hierarchy of errors; the CLI maps each class to an exit code and nothing else does.

Exit codes: 0 checks held, 1 a check failed (a result, never an exception), 2 usage or input
error, 3 device or transport error, 4 internal error (a bug), 130 interrupted, 141 the reader of
stdout went away (a broken pipe), 143 terminated (SIGTERM).
"""

from __future__ import annotations

from collections.abc import Sequence

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2
EXIT_DEVICE = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # SIGTERM (128 + 15): stopped like Ctrl-C, said apart
EXIT_BROKEN_PIPE = 141  # SIGPIPE (128 + 13): the reader of stdout went away (`| head -1`)


class VerifyError(Exception):
    """Base of every error verify raises on purpose. Its message is one actionable line."""

    exit_code = EXIT_INTERNAL


# --- usage and input errors: exit 2 -------------------------------------------------------
class UsageError(VerifyError):
    """The user asked for something that cannot be done as asked."""

    exit_code = EXIT_USAGE


class InputError(UsageError):
    """An input array or -d spec is wrong (unknown name, shape, dtype, undecodable file)."""


class ModelError(UsageError):
    """The ONNX model is missing, not ONNX, invalid, or cannot be run by onnxruntime."""


class ArchiveError(UsageError):
    """A .vtc testcase archive is missing, corrupt, truncated, or of an unknown version."""


class DumpError(UsageError):
    """A dump directory is incomplete, corrupt, or does not match another one."""


class OutputError(UsageError):
    """A file or folder verify was asked to write cannot be written (read-only, full, a folder
    where a file belongs): the user's side, exit 2."""


class ArchiveWarning(UserWarning):
    """An archive that can be read but not verified (format 1: no checksums)."""


class ProfileError(UsageError):
    """A device profile, suite file or profile trace is malformed."""


# --- device and transport errors: exit 3 ----------------------------------------------------
class MissingDependency(UsageError):
    """An optional dependency is not installed (names the extra to install). Set-up, not a
    device failure: retrying cannot help, so it is not a DeviceError (exit 2, not 3)."""


class DeviceError(VerifyError):
    """The device or the way to it failed: unreachable, dropped, timed out, runner crashed."""

    exit_code = EXIT_DEVICE


class ConnectError(DeviceError):
    """Could not reach or authenticate to the device."""


class TransferError(DeviceError):
    """A push or pull failed part way."""


class DeviceTimeout(DeviceError):
    """A command on the device did not finish in time."""


class ProviderUnavailable(DeviceError):
    """The requested execution provider is not available on the device."""


class RemoteCommandFailed(DeviceError):
    """A command on the device exited non-zero; carries argv, exit status and stderr's tail."""

    def __init__(self, what: str, argv: Sequence[str], status: int, stderr: str = "") -> None:
        self.argv = list(argv)
        self.status = status
        self.stderr_tail = "\n".join(stderr.strip().splitlines()[-5:])
        tail = f": {self.stderr_tail.splitlines()[-1]}" if self.stderr_tail else ""
        super().__init__(f"{what} exited with status {status}{tail}")


class RunnerError(DeviceError):
    """The device-side runner crashed or reported an error it could not attribute to the input."""
