#!/usr/bin/env python3
"""Build an emulated aarch64 userland that runs Python + numpy + onnxruntime under qemu-user.

    python scripts/build_arm64_root.py                 # build (or confirm) the default root
    python scripts/build_arm64_root.py --root DIR      # somewhere else
    python scripts/build_arm64_root.py --print-prefix  # the prefix as JSON; 1 if not built
    python scripts/build_arm64_root.py --check         # 0 if built and current, else 1
    python scripts/build_arm64_root.py --minimal       # the root with no Python (below)

Neither --print-prefix nor --check ever builds. Exit codes: 0 ok, 1 not built (those two
options), 2 not Linux, 3 the build failed (the message says which step), 130 interrupted.

The root holds Debian's arm64 Python 3.11 (plain `.deb`s unpacked with `dpkg -x`, fetched by
`apt-get download` with a private apt state that reuses the system's own mirror URIs; nothing
on the system is changed: no `dpkg --add-architecture`, no /etc/apt edits) and the aarch64
manylinux wheels of numpy and onnxruntime, by default the versions installed on this host.
Run the command prefix from any directory; script paths and arguments follow it:

    qemu-aarch64-static -L ROOT -cpu neoverse-n1 ROOT/usr/bin/python3.11 -E -s -B runner.py ...

Why each word is there:
- `-L ROOT` serves absolute paths from ROOT first (the ELF interpreter, the shared libraries,
  /proc/cpuinfo) and falls back to the host for everything else (work directories, /tmp).
- `-cpu neoverse-n1`: qemu's default model (all features, SVE included) makes onnxruntime
  pick SVE kernels that qemu emulates slowly: Sigmoid/Tanh/Erf/Softmax ran ~6x slower with it
  (qemu 7.2; MatMul and Conv about the same). An argv word, so the environment cannot undo it.
- Python finds its prefix from the executable's real host path, so no PYTHONHOME is needed;
  the wheels sit in ROOT/usr/lib/python3/dist-packages, which Debian's site.py adds.
- `-E -s` keep the host's PYTHONPATH, PYTHONHOME and ~/.local site (x86 packages) out;
  `-B` keeps the root read-only after the build (the stdlib and wheels are precompiled).
- ROOT/proc/cpuinfo: onnxruntime's import segfaults under qemu-user without an ARM cpuinfo
  (qemu 7.2 passes the host's x86 one through); `-L` serves ours instead.

The default root is $VERIFY_ARM64_ROOT, else ${XDG_CACHE_HOME:-~/.cache}/verify/arm64-root (the
`arm64-root` folder of verify's cache). The build is cached and atomic: it happens in ROOT.tmp,
a stamp file records what went in, and only a finished, smoke-tested tree is renamed to ROOT.
A rerun with a current stamp returns at once without touching the network.
Needs: apt-get, dpkg (Debian 12 sources), qemu-user-static, pip; stdlib only.

`--minimal` builds a second root, by default beside the first as `arm64-root-minimal`, with
no Python, numpy or onnxruntime: only libc, libgcc and libstdc++ (MINIMAL_DEBS), the ARM
cpuinfo and the empty ld.so.cache — what a stock embedded Linux board offers. The native
runner (scripts/build_native_runner.py) runs there; its prefix (`--minimal --print-prefix`) is
`qemu-aarch64-static -L ROOT -cpu neoverse-n1`, and the program's path follows it.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT_ENV = "VERIFY_ARM64_ROOT"
STAMP_NAME = ".verify-arm64-root.json"
STAMP_FORMAT = 1
QEMU = "qemu-aarch64-static"
QEMU_CPU = "neoverse-n1"
GUEST_PYTHON = "usr/bin/python3.11"
GUEST_SITE = "usr/lib/python3/dist-packages"
PYTHON_FLAGS = ("-E", "-s", "-B")

# Debian 12 arm64 packages unpacked into the root. The first eight are Python's own closure;
# libffi8 is there because onnxruntime imports ctypes. Everything else libpython3.11-stdlib
# declares (ssl, sqlite3, lzma, bz2, uuid, curses, readline, dbm…) is left out: neither
# numpy, onnxruntime nor the runner imports it, and hashlib falls back to its built-in hashes.
DEBS = ("libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libexpat1", "libffi8",
        "libpython3.11-minimal", "python3.11-minimal", "libpython3.11-stdlib")

# The root with no Python (--minimal): the C and C++ runtimes only.
MINIMAL_DEBS = ("libc6", "libgcc-s1", "libstdc++6")
MINIMAL_SUFFIX = "-minimal"
GUEST_LOADER = "lib/ld-linux-aarch64.so.1"

# Wheels unpacked into GUEST_SITE, with the version used when the host has none installed.
# onnxruntime's declared deps (flatbuffers, packaging, protobuf) are not needed to import it
# or run sessions (only onnxruntime.backend and the tools use them), so they stay out.
WHEELS = {"numpy": "2.4.6", "onnxruntime": "1.31.1"}
WHEEL_PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64")

# Not worth compiling under emulation: test suites and tools no runner imports.
COMPILE_EXCLUDE = (r"/(tests?|idlelib|turtledemo|lib2to3|tkinter|ensurepip|pydoc_data"
                   r"|transformers|quantization)/")

CPUINFO_CORE = """\
processor\t: {n}
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1

"""

WRAPPER = """\
#!/bin/sh
# Runs the emulated aarch64 Python of this root (written by scripts/build_arm64_root.py).
root=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
exec {qemu} -L "$root" -cpu {cpu} "$root/{python}" {flags} "$@"
"""

SMOKE = """\
import json, platform, sys
import numpy, onnxruntime
print(json.dumps({"machine": platform.machine(), "python": platform.python_version(),
                  "numpy": numpy.__version__, "onnxruntime": onnxruntime.__version__,
                  "providers": onnxruntime.get_available_providers()}))
"""

Log = Callable[[str], None]


class BuildError(Exception):
    """The build cannot go on; the message says what to fix."""


def default_root() -> Path:
    """$VERIFY_ARM64_ROOT, else the `arm64-root` folder of verify's cache directory."""
    explicit = os.environ.get(ROOT_ENV)
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "verify" / "arm64-root"


def command_prefix(root: Path) -> list[str]:
    """The argv words that run the root's Python; a script path and its arguments follow."""
    root = Path(os.path.abspath(root))
    return [QEMU, "-L", str(root), "-cpu", QEMU_CPU, str(root / GUEST_PYTHON), *PYTHON_FLAGS]


def wanted_spec(versions: dict[str, str] | None = None) -> dict[str, object]:
    """What a root must have been built from to count as current (the stamp's key part)."""
    return {"format": STAMP_FORMAT, "debs": list(DEBS), "qemu_cpu": QEMU_CPU,
            "wheels": dict(versions or host_wheel_versions())}


def host_wheel_versions() -> dict[str, str]:
    """The numpy/onnxruntime versions installed beside this Python, else the pinned defaults."""
    found = {}
    for name, fallback in WHEELS.items():
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = fallback
    return found


def read_stamp(root: Path) -> dict[str, object] | None:
    try:
        stamp = json.loads((root / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def is_built(root: Path) -> bool:
    """A finished build of any versions is at `root` (only finished trees carry a stamp)."""
    return read_stamp(root) is not None and (root / GUEST_PYTHON).is_file()


def is_current(root: Path, spec: dict[str, object]) -> bool:
    stamp = read_stamp(root)
    return (stamp is not None and (root / GUEST_PYTHON).is_file()
            and all(stamp.get(k) == v for k, v in spec.items()))


# --- apt with a private state -------------------------------------------------------------

@dataclass
class AptSource:
    """One deb822 stanza: field name → raw value lines (continuations kept verbatim)."""

    fields: dict[str, list[str]] = field(default_factory=dict)

    def get(self, name: str) -> str:
        for key, lines in self.fields.items():
            if key.lower() == name.lower():
                return " ".join(line.strip() for line in lines).strip()
        return ""

    def set(self, name: str, value: str | None) -> None:
        for key in [k for k in self.fields if k.lower() == name.lower()]:
            del self.fields[key]
        if value is not None:
            self.fields[name] = [value]

    def render(self) -> str:
        out = []
        for key, lines in self.fields.items():
            out.append(f"{key}: {lines[0]}".rstrip())
            out.extend(lines[1:])
        return "\n".join(out) + "\n"


def parse_deb822(text: str) -> list[AptSource]:
    stanzas, current, last = [], AptSource(), None
    for raw in text.splitlines() + [""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if current.fields:
                stanzas.append(current)
            current, last = AptSource(), None
        elif raw[0] in " \t" and last is not None:
            current.fields[last].append(raw)
        elif ":" in raw:
            last, _, value = raw.partition(":")
            last = last.strip()
            current.fields[last] = [value.strip()]
    return stanzas


_ONE_LINE_OPTIONS = {"arch": "Architectures", "signed-by": "Signed-By", "trusted": "Trusted"}


def parse_one_line(text: str) -> list[AptSource]:
    sources = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        options: dict[str, str] = {}
        match = re.match(r"(\S+)\s+\[([^\]]*)\]\s+(.*)", line)
        if match:
            kind, opts, rest = match.groups()
            for opt in opts.split():
                key, _, value = opt.partition("=")
                if key in _ONE_LINE_OPTIONS:
                    options[_ONE_LINE_OPTIONS[key]] = value.replace(",", " ")
        else:
            kind, _, rest = line.partition(" ")
        words = rest.split()
        if len(words) < 2:
            continue
        src = AptSource({"Types": [kind], "URIs": [words[0]], "Suites": [words[1]],
                         "Components": [" ".join(words[2:])]})
        for key, value in options.items():
            src.set(key, value)
        sources.append(src)
    return sources


def os_codename() -> str:
    try:
        text = Path("/etc/os-release").read_text(encoding="utf-8")
    except OSError:
        return ""
    match = re.search(r"^VERSION_CODENAME=\"?([^\"\n]*)\"?$", text, re.M)
    return match.group(1) if match else ""


def system_apt_sources(etc: Path = Path("/etc/apt")) -> list[AptSource]:
    """The system's enabled binary sources of this release that can serve arm64.

    Third-party repositories (their suites are not this release's codename) are dropped: they
    rarely carry arm64 Python, and one unreachable repository would fail the whole update.
    """
    found: list[AptSource] = []
    if (etc / "sources.list").is_file():
        found += parse_one_line((etc / "sources.list").read_text(encoding="utf-8"))
    parts = etc / "sources.list.d"
    for path in sorted(parts.glob("*.list")) if parts.is_dir() else []:
        found += parse_one_line(path.read_text(encoding="utf-8"))
    for path in sorted(parts.glob("*.sources")) if parts.is_dir() else []:
        found += parse_deb822(path.read_text(encoding="utf-8"))
    codename = os_codename()
    kept = []
    for src in found:
        if "deb" not in src.get("Types").split() or src.get("Enabled").lower() == "no":
            continue
        arches = src.get("Architectures").split()
        if arches and "arm64" not in arches:
            continue
        suites = [s for s in src.get("Suites").split() if not codename
                  or s == codename or s.startswith((codename + "-", codename + "/"))]
        if not suites or not src.get("URIs"):
            continue
        src.set("Types", "deb")
        src.set("Suites", " ".join(suites))
        src.set("Architectures", None)
        src.set("Enabled", None)
        kept.append(src)
    if not kept:
        raise BuildError(f"no enabled 'deb' source for Debian {codename or '(unknown release)'} in "
                         f"{etc}/sources.list or {etc}/sources.list.d/; the arm64 packages are "
                         "fetched from the same mirrors the system uses")
    return kept


class PrivateApt:
    """apt-get with its own state, cache and sources under `base`, architecture arm64."""

    def __init__(self, base: Path, sources: Sequence[AptSource]) -> None:
        self.base = base
        for sub in ("lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        (base / "status").write_text("", encoding="utf-8")
        (base / "sources.list").write_text("", encoding="utf-8")
        (base / "preferences").write_text("", encoding="utf-8")
        (base / "sources.list.d" / "system.sources").write_text(
            "\n".join(s.render() for s in sources), encoding="utf-8")

    def options(self) -> list[str]:
        b = self.base
        opts = {
            "APT::Architecture": "arm64", "APT::Architectures": "arm64",
            "Dir::State": str(b), "Dir::State::Lists": str(b / "lists"),
            "Dir::State::status": str(b / "status"), "Dir::Cache": str(b / "cache"),
            "Dir::Etc::SourceList": str(b / "sources.list"),
            "Dir::Etc::SourceParts": str(b / "sources.list.d"),
            "Dir::Etc::Preferences": str(b / "preferences"),
            "Dir::Etc::PreferencesParts": str(b / "preferences.d"),
            "Acquire::Languages": "none", "APT::Get::List-Cleanup": "false",
        }
        if os.geteuid() == 0:
            # apt drops to _apt for downloads, which cannot enter a private dir under /root.
            opts["APT::Sandbox::User"] = "root"
        return [w for k, v in opts.items() for w in ("-o", f"{k}={v}")]

    def update(self) -> None:
        run(["apt-get", "-q", *self.options(), "update"], what="apt-get update (arm64)")

    def download(self, packages: Sequence[str], dest: Path) -> list[Path]:
        dest.mkdir(parents=True, exist_ok=True)
        run(["apt-get", "-q", *self.options(), "download", *packages], cwd=dest,
            what="apt-get download")
        return sorted(dest.glob("*.deb"))


# --- the build ------------------------------------------------------------------------------

def run(argv: Sequence[str], *, what: str, cwd: Path | None = None,
        env: dict[str, str] | None = None) -> str:
    """Run argv (a list, never a shell string); raise BuildError with stderr's tail on failure.

    The command gets its own process group, killed whole if we are interrupted, so that
    compileall's worker processes do not outlive the build and write into a tree being removed.
    """
    try:
        proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as exc:
        raise BuildError(f"{what}: cannot run {argv[0]}: {exc.strerror or exc}") from exc
    try:
        out, err = proc.communicate()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        raise
    if proc.returncode != 0:
        tail = "\n".join((err or out).strip().splitlines()[-15:])
        raise BuildError(f"{what} failed (exit {proc.returncode}): {shlex.join(argv)}\n{tail}")
    return out


def deb_field(deb: Path, name: str) -> str:
    return run(["dpkg-deb", "--field", str(deb), name], what="dpkg-deb --field").strip()


def fetch_wheels(versions: dict[str, str], dest: Path) -> dict[str, Path]:
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
            "--only-binary=:all:", "--no-deps", "--python-version", "3.11",
            "--implementation", "cp", "--abi", "cp311", "--dest", str(dest)]
    for plat in WHEEL_PLATFORMS:
        argv += ["--platform", plat]
    run(argv + [f"{n}=={v}" for n, v in versions.items()], what="pip download (aarch64 wheels)")
    wheels = {}
    for name, version in versions.items():
        hits = sorted(dest.glob(f"{name}-{version}-*.whl"))
        if len(hits) != 1:
            raise BuildError(f"pip download left {len(hits)} wheels for {name}=={version} "
                             f"in {dest}")
        wheels[name] = hits[0]
    return wheels


def unpack_wheel(wheel: Path, site: Path) -> None:
    """Unpack like an installer would for a root-is-purelib/platlib wheel, keeping file modes."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            target = Path(zf.extract(info, site))
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(target, mode)
    for data in site.glob("*.data"):
        for scheme in ("purelib", "platlib"):
            if (data / scheme).is_dir():
                shutil.copytree(data / scheme, site, dirs_exist_ok=True)
        shutil.rmtree(data)


def write_cpuinfo(root: Path) -> None:
    cores = max(1, os.cpu_count() or 1)
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc" / "cpuinfo").write_text(
        "".join(CPUINFO_CORE.format(n=n) for n in range(cores)), encoding="utf-8")


def guest_run(root: Path, args: Sequence[str], *, what: str) -> str:
    return run([*command_prefix(root), *args], what=what, cwd=root)


def build(root: Path, versions: dict[str, str] | None = None, *, force: bool = False,
          log: Log = lambda msg: print(msg, file=sys.stderr, flush=True)) -> bool:
    """Make `root` a current arm64 root; return False if it already was (nothing touched)."""
    root = Path(os.path.abspath(root))
    spec = wanted_spec(versions)
    if not force and is_current(root, spec):
        return False
    check_tools()
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent build of the same root waits here
        if not force and is_current(root, spec):
            return False
        _build_locked(root, spec, log)
    return True


def check_tools() -> None:
    missing = [t for t in (QEMU, "apt-get", "dpkg", "dpkg-deb") if shutil.which(t) is None]
    if missing:
        raise BuildError(f"missing {', '.join(missing)}: apt-get install qemu-user-static "
                         "(and run on Debian 12, whose apt/dpkg fetch and unpack the packages)")


def _build_locked(root: Path, spec: dict[str, object], log: Log) -> None:
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(exist_ok=True)
    times: dict[str, float] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=root.name + ".work-", dir=root.parent) as work_dir:
        work = Path(work_dir)
        t = time.monotonic()
        apt = PrivateApt(work / "apt", system_apt_sources())
        log("apt-get update (arm64, private state)…")
        apt.update()
        log(f"apt-get download {' '.join(DEBS)}…")
        debs = apt.download(DEBS, work / "debs")
        times["debs"] = time.monotonic() - t

        t = time.monotonic()
        wheels_wanted = dict(spec["wheels"])  # type: ignore[arg-type]
        log("pip download " + " ".join(f"{n}=={v}" for n, v in wheels_wanted.items())
            + " (manylinux aarch64)…")
        wheels = fetch_wheels(wheels_wanted, work / "wheels")
        times["wheels"] = time.monotonic() - t

        t = time.monotonic()
        deb_versions = {}
        for deb in debs:
            run(["dpkg", "-x", str(deb), str(tmp)], what=f"dpkg -x {deb.name}")
            deb_versions[deb_field(deb, "Package")] = deb_field(deb, "Version")
        missing = sorted(set(DEBS) - set(deb_versions))
        if missing:
            raise BuildError(f"apt-get download did not fetch {', '.join(missing)}")
        site = tmp / GUEST_SITE
        site.mkdir(parents=True, exist_ok=True)
        for wheel in wheels.values():
            unpack_wheel(wheel, site)
    write_cpuinfo(tmp)
    # An empty cache makes the guest's ld.so search its default directories instead of
    # reading the host's /etc/ld.so.cache (an x86 one) through qemu's -L fallback.
    (tmp / "etc" / "ld.so.cache").write_bytes(b"")
    wrapper = tmp / "bin" / "verify-python"
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(WRAPPER.format(qemu=QEMU, cpu=QEMU_CPU, python=GUEST_PYTHON,
                                      flags=" ".join(PYTHON_FLAGS)), encoding="utf-8")
    wrapper.chmod(0o755)
    times["unpack"] = time.monotonic() - t

    t = time.monotonic()
    log("compiling the stdlib and wheels to bytecode under emulation…")
    guest_run(tmp, ["-m", "compileall", "-q", "-j", "0", "-x", COMPILE_EXCLUDE,
                    str(tmp / "usr/lib/python3.11"), str(site)], what="compileall (aarch64)")
    times["compile"] = time.monotonic() - t

    t = time.monotonic()
    log("smoke test: import numpy, onnxruntime on aarch64…")
    lines = guest_run(tmp, ["-c", SMOKE], what="smoke test (aarch64)").strip().splitlines()
    smoke = json.loads(lines[-1]) if lines else {}
    expected = {"machine": "aarch64", **wheels_wanted}
    wrong = {k: smoke.get(k) for k, v in expected.items() if smoke.get(k) != v}
    if wrong or "CPUExecutionProvider" not in smoke.get("providers", []):
        raise BuildError(f"smoke test in {tmp}: expected {expected}, got {smoke}")
    times["smoke"] = time.monotonic() - t

    stamp = {**spec, "deb_versions": deb_versions, "python": smoke["python"],
             "providers": smoke["providers"], "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "build_seconds": {k: round(v, 1) for k, v in
                               {**times, "total": time.monotonic() - started}.items()}}
    (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    old = root.with_name(root.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if root.exists():
        os.rename(root, old)
    os.rename(tmp, root)
    shutil.rmtree(old, ignore_errors=True)
    log("built {} in {:.1f} s ({})".format(root, time.monotonic() - started, ", ".join(
        f"{k} {v:.1f} s" for k, v in times.items())))


def minimal_prefix(root: Path) -> list[str]:
    """The argv words that run an aarch64 program in the minimal root; its path follows."""
    return [QEMU, "-L", str(Path(os.path.abspath(root))), "-cpu", QEMU_CPU]


def minimal_spec() -> dict[str, object]:
    return {"format": STAMP_FORMAT, "flavour": "minimal", "debs": list(MINIMAL_DEBS),
            "qemu_cpu": QEMU_CPU}


def minimal_is_current(root: Path) -> bool:
    stamp = read_stamp(root)
    return (stamp is not None and (root / GUEST_LOADER).exists()
            and all(stamp.get(k) == v for k, v in minimal_spec().items()))


def build_minimal(root: Path, *, force: bool = False,
                  log: Log = lambda msg: print(msg, file=sys.stderr, flush=True)) -> bool:
    """Make `root` a current minimal root (no Python); False if it already was."""
    root = Path(os.path.abspath(root))
    if not force and minimal_is_current(root):
        return False
    check_tools()
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and minimal_is_current(root):
            return False
        started = time.monotonic()
        tmp = root.with_name(root.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        with tempfile.TemporaryDirectory(prefix=root.name + ".work-", dir=root.parent) as wd:
            work = Path(wd)
            apt = PrivateApt(work / "apt", system_apt_sources())
            log("apt-get update (arm64, private state)…")
            apt.update()
            log(f"apt-get download {' '.join(MINIMAL_DEBS)}…")
            versions = {}
            for deb in apt.download(MINIMAL_DEBS, work / "debs"):
                run(["dpkg", "-x", str(deb), str(tmp)], what=f"dpkg -x {deb.name}")
                versions[deb_field(deb, "Package")] = deb_field(deb, "Version")
        missing = sorted(set(MINIMAL_DEBS) - set(versions))
        if missing:
            raise BuildError(f"apt-get download did not fetch {', '.join(missing)}")
        for extra in ("usr/share", "usr/lib/aarch64-linux-gnu/gconv", "sbin", "usr/sbin",
                      "usr/bin", "etc/ld.so.conf.d"):
            shutil.rmtree(tmp / extra, ignore_errors=True)
        write_cpuinfo(tmp)
        (tmp / "etc").mkdir(exist_ok=True)
        (tmp / "etc" / "ld.so.cache").write_bytes(b"")
        for python in (tmp / "usr" / "bin").glob("python*"):
            raise BuildError(f"{python} in a root meant to have no Python")
        out = run([*minimal_prefix(tmp), str(tmp / GUEST_LOADER), "--version"],
                  what="smoke test (aarch64 ld.so)", cwd=tmp)
        if "GNU C Library" not in out and "GLIBC" not in out:
            raise BuildError(f"smoke test in {tmp}: ld.so --version said {out.strip()!r}")
        stamp = {**minimal_spec(), "deb_versions": versions,
                 "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                 "build_seconds": round(time.monotonic() - started, 1)}
        (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
        old = root.with_name(root.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if root.exists():
            os.rename(root, old)
        os.rename(tmp, root)
        shutil.rmtree(old, ignore_errors=True)
        log(f"built {root} in {time.monotonic() - started:.1f} s")
    return True


def main_minimal(args: argparse.Namespace) -> int:
    root = Path(os.path.abspath(args.root if args.root is not None else
                                str(default_root()) + MINIMAL_SUFFIX))
    if args.print_prefix:
        if read_stamp(root) is None:
            print(f"error: no minimal arm64 root at {root}; build it with: {sys.executable} "
                  f"{Path(__file__).resolve()} --minimal --root {root}", file=sys.stderr)
            return 1
        print(json.dumps(minimal_prefix(root)))
        return 0
    if args.check:
        current = minimal_is_current(root)
        print(f"{root}: {'current' if current else 'missing or stale'}", file=sys.stderr)
        return 0 if current else 1
    if platform.system() != "Linux":
        print("error: the arm64 root needs Linux (qemu-user)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        built = build_minimal(root, force=args.force)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"interrupted; {root} is unchanged", file=sys.stderr)
        return 130
    if not built:
        print(f"{root}: up to date", file=sys.stderr)
    print(shlex.join(minimal_prefix(root)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build the emulated aarch64 Python + numpy + onnxruntime root for qemu-user.")
    parser.add_argument("--root", type=Path, default=None,
                        help=f"where the root lives (default: ${ROOT_ENV}, else "
                             "${XDG_CACHE_HOME:-~/.cache}/verify/arm64-root)")
    parser.add_argument("--print-prefix", action="store_true",
                        help="print the python command prefix as a JSON list and exit; "
                             "exit 1 if the root is not built (never builds)")
    parser.add_argument("--check", action="store_true",
                        help="exit 0 if the root is built and current, 1 if not (never builds)")
    parser.add_argument("--force", action="store_true", help="rebuild even if current")
    parser.add_argument("--minimal", action="store_true",
                        help="the root with no Python: libc, libgcc, libstdc++ only (default "
                             "ROOT: the default root's folder name + '-minimal')")
    for name in WHEELS:
        parser.add_argument(f"--{name}", metavar="VERSION", default=None,
                            help=f"{name} version (default: the host's, else {WHEELS[name]})")
    args = parser.parse_args(argv)
    if args.minimal:
        return main_minimal(args)
    root = Path(os.path.abspath(args.root if args.root is not None else default_root()))

    if args.print_prefix:
        if not is_built(root):
            print(f"error: no arm64 root at {root}; build it with: {sys.executable} "
                  f"{Path(__file__).resolve()} --root {root}", file=sys.stderr)
            return 1
        print(json.dumps(command_prefix(root)))
        return 0
    versions = host_wheel_versions()
    for name in WHEELS:
        if getattr(args, name):
            versions[name] = getattr(args, name)
    if args.check:
        current = is_current(root, wanted_spec(versions))
        print(f"{root}: {'current' if current else 'missing or stale'}", file=sys.stderr)
        return 0 if current else 1
    if platform.system() != "Linux":
        print("error: the arm64 root needs Linux (qemu-user)", file=sys.stderr)
        return 2
    # SIGTERM (CI cancelling a job) unwinds like Ctrl-C: child process groups are killed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        built = build(root, versions, force=args.force)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"interrupted; {root} is unchanged (the next build removes {root}.tmp)",
              file=sys.stderr)
        return 130
    if not built:
        print(f"{root}: up to date", file=sys.stderr)
    print(shlex.join(command_prefix(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
