#!/usr/bin/env python3
"""Build the native runner (runner/native/, C++17) into a self-contained bundle for a target.

    python scripts/build_native_runner.py --target linux-x86_64
    python scripts/build_native_runner.py --target linux-aarch64
    python scripts/build_native_runner.py --target android-arm64-v8a --ndk ~/Android/Sdk/ndk/27.2.12479018
    python scripts/build_native_runner.py --target all          # both Linux targets
    python scripts/build_native_runner.py --print-bundle linux-aarch64   # its folder; 1 if not built

A bundle is a folder, by default `${XDG_CACHE_HOME:-~/.cache}/verify/native-runner/TARGET`
(the device profiles name it as `{cache}/native-runner/TARGET`):

    bin/verify-runner          the runner (libstdc++ linked statically on Linux)
    lib/libonnxruntime.so.1    ONNX Runtime (libonnxruntime.so on Android)
    manifest.json              target, runner and contract versions, ONNX Runtime's version and
                               API level, the packages used (version, sha512, licence), compiler
    LICENSES.txt               the licences of what the bundle contains
    contract.schema.json       the runner contract it follows, as JSON Schema

Everything comes from packages, pinned here, nothing from a project site:
- Debian: g++ (x86-64), g++-aarch64-linux-gnu, cmake, nlohmann-json3-dev (scripts/setup.sh
  --test installs them); ccache is used when present.
- npm, fetched with `npm pack NAME@VERSION` into `.../verify/native/` and checked against the
  sha512 pinned in PACKAGES before anything is extracted:
  `onnxruntime-node` (libonnxruntime.so.1 for linux x64 and arm64, ONNX Runtime 1.30.0) and
  `com.github.asus4.onnxruntime` (ONNX Runtime's Android AAR: the C/C++ API headers, API
  version 29, and jni/arm64-v8a/libonnxruntime.so, ONNX Runtime 1.29.0). ONNX Runtime is MIT
  licensed (Microsoft); both packages declare MIT.
The headers ask for API version 29; a library serves every API version up to its own minor
version (1.30 serves 1..30), and the runner says so plainly when a library is older.

The build is cached: a bundle whose manifest records the same inputs (the sources' sha256 —
their contents, not their path —, pins, compiler, target) is left as is ("up to date") whichever
checkout asks, and the CMake build folder is kept for incremental rebuilds: one per target and
source folder (`.../verify/native/build/TARGET-KEY`), so worktrees and fresh clones at other
paths never share CMake's cache. Exit codes: 0 built or up to date, 1 --print-bundle of a bundle not built, 2 usage
(unknown target, Android without --ndk), 3 the build failed (the message says which step),
130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = REPO / "runner" / "native"
MANIFEST_FORMAT = 1
JSON_HEADER = Path("/usr/include/nlohmann/json.hpp")
SCHEMA = REPO / "verify" / "runner" / "contract.schema.json"  # shipped in the bundle

# npm packages: version, the registry's sha512 integrity (checked on every use), licence.
PACKAGES = {
    "onnxruntime-node": {
        "version": "1.30.0", "license": "MIT",
        "integrity": "sha512-twhs1C2C/BFkz1yc5OY0KIU2GUq6DURO7hD4bx5Q2Qy3nAMJwRXW8xU3NVczE29VA9"
                     "lolLOYepoD8fjTGOfIqw=="},
    "com.github.asus4.onnxruntime": {
        "version": "0.4.9", "license": "MIT",
        "integrity": "sha512-BkzxduSZ9IkeDP6Q8lz2TFU2ie7hSSvS7ZIfzMooExoq0CNzJnuuGaUJ7IsojBgqO4"
                     "ouD1jXah8OYyJbCN29Fg=="},
}
AAR_MEMBER = "package/Plugins/Android/onnxruntime.aar"


@dataclass(frozen=True)
class Target:
    name: str
    compiler: str          # C++ compiler (Linux targets); Android uses the NDK's
    package: str           # npm package with the library
    library: str           # member of that package (or of the AAR, for Android)
    lib_name: str          # file name in the bundle's lib/
    ort_version: str


TARGETS = {
    "linux-x86_64": Target("linux-x86_64", "g++", "onnxruntime-node",
                           "package/bin/napi-v6/linux/x64/libonnxruntime.so.1",
                           "libonnxruntime.so.1", "1.30.0"),
    "linux-aarch64": Target("linux-aarch64", "aarch64-linux-gnu-g++", "onnxruntime-node",
                            "package/bin/napi-v6/linux/arm64/libonnxruntime.so.1",
                            "libonnxruntime.so.1", "1.30.0"),
    "android-arm64-v8a": Target("android-arm64-v8a", "", "com.github.asus4.onnxruntime",
                                "jni/arm64-v8a/libonnxruntime.so", "libonnxruntime.so", "1.29.0"),
}
LINUX_TARGETS = ("linux-x86_64", "linux-aarch64")


class BuildError(Exception):
    """The build cannot go on; the message says what to fix."""


def verify_cache() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "verify"


def default_bundle(target: str) -> Path:
    return verify_cache() / "native-runner" / target


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(argv: Sequence[str], *, what: str, cwd: Path | None = None,
        env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        raise BuildError(f"{what}: cannot start {argv[0]}: {exc.strerror}") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-25:])
        raise BuildError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def integrity(path: Path) -> str:
    h = hashlib.sha512()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return "sha512-" + base64.b64encode(h.digest()).decode("ascii")


def fetch_package(name: str, cache: Path) -> Path:
    """The pinned tarball of an npm package, fetched with `npm pack` once, checked every time."""
    pin = PACKAGES[name]
    dist = cache / "dist"
    dist.mkdir(parents=True, exist_ok=True)
    tarball = dist / f"{name}-{pin['version']}.tgz"
    if not tarball.is_file():
        if shutil.which("npm") is None:
            raise BuildError("npm is missing: apt-get install npm (scripts/setup.sh --test does)")
        log(f"npm pack {name}@{pin['version']}…")
        with tempfile_dir(dist) as tmp:
            run(["npm", "pack", f"{name}@{pin['version']}", "--silent"], cwd=tmp,
                what=f"npm pack {name}@{pin['version']}")
            got = Path(tmp) / tarball.name
            if not got.is_file():
                raise BuildError(f"npm pack {name}@{pin['version']} wrote no {tarball.name}")
            check_integrity(got, pin["integrity"], name)
            os.replace(got, tarball)
    check_integrity(tarball, pin["integrity"], name)
    return tarball


def check_integrity(path: Path, want: str, name: str) -> None:
    got = integrity(path)
    if got != want:
        raise BuildError(f"{path}: sha512 {got} is not the pinned {want} for {name} "
                         f"{PACKAGES[name]['version']}; delete it to fetch it again")


class tempfile_dir:
    """A temporary folder inside `parent` (same file system: results are renamed out)."""

    def __init__(self, parent: Path) -> None:
        import tempfile
        self._tmp = tempfile.TemporaryDirectory(prefix=".tmp-", dir=parent)

    def __enter__(self) -> str:
        return self._tmp.name

    def __exit__(self, *exc: object) -> None:
        self._tmp.cleanup()


def extract_member(tarball: Path, member: str, dest: Path) -> Path:
    """One named member of a tarball, written to dest (no other member is touched)."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "r:gz") as tar:
        try:
            info = tar.getmember(member)
        except KeyError:
            raise BuildError(f"{tarball.name} has no {member}") from None
        src = tar.extractfile(info)
        if src is None:
            raise BuildError(f"{tarball.name}: {member} is not a file")
        tmp = dest.with_name(dest.name + ".tmp")
        with open(tmp, "wb") as out:
            shutil.copyfileobj(src, out)
        os.replace(tmp, dest)
    return dest


def aar_files(cache: Path) -> tuple[Path, Path]:
    """(headers folder, android arm64 library) from the AAR inside the asus4 package."""
    pin = PACKAGES["com.github.asus4.onnxruntime"]
    base = cache / "extract" / f"com.github.asus4.onnxruntime-{pin['version']}"
    headers = base / "headers"
    lib = base / "jni" / "arm64-v8a" / "libonnxruntime.so"
    if (headers / "onnxruntime_cxx_api.h").is_file() and lib.is_file():
        return headers, lib
    aar = extract_member(fetch_package("com.github.asus4.onnxruntime", cache), AAR_MEMBER,
                         base / "onnxruntime.aar")
    with zipfile.ZipFile(aar) as z:
        names = [n for n in z.namelist() if n.startswith("headers/") and n.endswith((".h", ".inc"))]
        names.append("jni/arm64-v8a/libonnxruntime.so")
        for n in names:
            target = base / n
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(n) as src, open(str(target) + ".tmp", "wb") as out:
                shutil.copyfileobj(src, out)
            os.replace(str(target) + ".tmp", target)
    return headers, lib


def ort_api_version(headers: Path) -> int:
    for line in (headers / "onnxruntime_c_api.h").read_text(encoding="utf-8").splitlines():
        if line.startswith("#define ORT_API_VERSION "):
            return int(line.split()[2])
    raise BuildError(f"{headers}/onnxruntime_c_api.h defines no ORT_API_VERSION")


def library_for(target: Target, cache: Path) -> Path:
    if target.name.startswith("android-"):
        return aar_files(cache)[1]
    pin = PACKAGES[target.package]
    dest = (cache / "extract" / f"{target.package}-{pin['version']}" /
            target.library.replace("package/", "", 1))
    return extract_member(fetch_package(target.package, cache), target.library, dest)


def source_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(SOURCES.rglob("*")):
        if path.is_file() and "build" not in path.relative_to(SOURCES).parts:
            h.update(str(path.relative_to(SOURCES)).encode() + b"\0" + path.read_bytes())
    h.update(Path(__file__).read_bytes())
    h.update(SCHEMA.read_bytes())
    return h.hexdigest()


def compiler_version(argv: Sequence[str]) -> str:
    try:
        out = subprocess.run([*argv, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, check=False).stdout
    except OSError:
        return ""
    return out.splitlines()[0] if out else ""


def wanted_manifest(target: Target, compiler: str, headers: Path) -> dict[str, object]:
    """What a bundle must have been built from to be up to date (the manifest's key part)."""
    used = sorted({target.package, "com.github.asus4.onnxruntime"})
    return {"format": MANIFEST_FORMAT, "target": target.name, "source_sha256": source_digest(),
            "compiler": compiler, "onnxruntime": target.ort_version,
            "ort_api_version": ort_api_version(headers),
            "packages": {n: dict(PACKAGES[n]) for n in used}}


def cmake_args(target: Target, headers: Path, json_dir: Path, ndk: Path | None,
               toolchain: Path | None) -> list[str]:
    args = ["-DCMAKE_BUILD_TYPE=Release", f"-DORT_INCLUDE_DIR={headers}",
            f"-DJSON_INCLUDE_DIR={json_dir}"]
    if target.name.startswith("android-"):
        tc = toolchain or (ndk / "build" / "cmake" / "android.toolchain.cmake" if ndk else None)
        if tc is None or not tc.is_file():
            raise BuildError(f"no Android toolchain file at {tc}: --ndk takes the NDK's root "
                             "(the folder holding build/cmake/android.toolchain.cmake)")
        args += [f"-DCMAKE_TOOLCHAIN_FILE={tc}", "-DANDROID_ABI=arm64-v8a",
                 "-DANDROID_PLATFORM=android-24", "-DANDROID_STL=c++_static"]
    else:
        if shutil.which(target.compiler) is None:
            raise BuildError(f"{target.compiler} is missing: apt-get install "
                             f"{'g++' if target.compiler == 'g++' else 'g++-aarch64-linux-gnu'}")
        args.append(f"-DCMAKE_CXX_COMPILER={shutil.which(target.compiler)}")
        if target.name == "linux-aarch64":
            args += ["-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64"]
    if shutil.which("ccache"):
        args.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    return args


def json_include(cache: Path) -> Path:
    """A folder holding only nlohmann/json.hpp (never /usr/include itself, which would put the
    host's C headers in front of a cross or NDK compiler's)."""
    if not JSON_HEADER.is_file():
        raise BuildError(f"{JSON_HEADER} is missing: apt-get install nlohmann-json3-dev")
    folder = cache / "include"
    dest = folder / "nlohmann"
    if not (dest / "json.hpp").is_file() or \
            (dest / "json.hpp").read_bytes() != JSON_HEADER.read_bytes():
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(JSON_HEADER.parent, dest)
    return folder


def build(target_name: str, *, out: Path | None = None, ndk: Path | None = None,
          toolchain: Path | None = None, jobs: int = 2, force: bool = False,
          configure_only: bool = False) -> Path:
    """Build (or confirm) the bundle for target_name; return its folder."""
    target = TARGETS[target_name]
    cache = verify_cache() / "native"
    cache.mkdir(parents=True, exist_ok=True)
    out = Path(os.path.abspath(out or default_bundle(target_name)))
    if shutil.which("cmake") is None:
        raise BuildError("cmake is missing: apt-get install cmake")
    headers, _ = aar_files(cache)
    json_dir = json_include(cache)
    args = cmake_args(target, headers, json_dir, ndk, toolchain)
    compiler = compiler_version([target.compiler]) if target.compiler else f"NDK {ndk or toolchain}"
    want = wanted_manifest(target, compiler, headers)
    manifest_path = out / "manifest.json"
    with open(cache / f"build-{target_name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and not configure_only and _current(manifest_path, want):
            log(f"{out}: up to date")
            return out
        build_dir = build_folder(target_name, args)
        t0 = time.monotonic()
        configure(target_name, build_dir, args)
        if configure_only:
            return build_dir
        log(f"cmake build ({target_name}, -j{jobs})…")
        run(["nice", "-n", "10", "cmake", "--build", str(build_dir), "-j", str(jobs)],
            what=f"build for {target_name}")
        library = library_for(target, cache)
        _assemble(out, build_dir / "verify-runner", library, target,
                  {**want, "runner": _runner_version(),
                   "contract_version": 1, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   "build_seconds": round(time.monotonic() - t0, 1),
                   "library": {"file": f"lib/{target.lib_name}", "sha256": _sha256(library)}})
        log(f"built {out} in {time.monotonic() - t0:.1f} s")
        return out


def build_folder(target_name: str, args: Sequence[str]) -> Path:
    """The CMake build folder for target_name built from this checkout's sources.

    One folder per (target, source folder, toolchain file): CMake refuses a build folder
    configured from another source folder, and keeps the first toolchain file it saw, so
    checkouts at different paths (worktrees, CI's fresh clone) never share one."""
    key = "\0".join([str(SOURCES.resolve()),
                      *(a for a in args if a.startswith("-DCMAKE_TOOLCHAIN_FILE="))])
    return verify_cache() / "native" / "build" / \
        f"{target_name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def cmake_home(build_dir: Path) -> str | None:
    """The source folder a build folder was configured from (None: not configured)."""
    try:
        text = (build_dir / "CMakeCache.txt").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            return line.split("=", 1)[1]
    return None


def configure(target_name: str, build_dir: Path, args: Sequence[str]) -> None:
    """CMake's configure step; a folder configured from other sources starts afresh."""
    home = cmake_home(build_dir)
    if home is not None and os.path.realpath(home) != os.path.realpath(SOURCES):
        log(f"{build_dir} was configured from {home}: configuring afresh")
        shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    log(f"cmake configure ({target_name})…")
    run(["cmake", "-S", str(SOURCES), "-B", str(build_dir), *args],
        what=f"cmake configure for {target_name}")


def unit_tests(target_name: str = "linux-x86_64", jobs: int = 2) -> Path:
    """The native unit tests (runner/native/tests/) built from this checkout's sources in its
    build folder (incremental; the bundle may have come from another checkout's build)."""
    target = TARGETS[target_name]
    cache = verify_cache() / "native"
    headers, _ = aar_files(cache)
    args = cmake_args(target, headers, json_include(cache), None, None)
    with open(cache / f"build-{target_name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build_dir = build_folder(target_name, args)
        if cmake_home(build_dir) is None or not (build_dir / "verify-runner-tests").is_file():
            configure(target_name, build_dir, args)
        run(["nice", "-n", "10", "cmake", "--build", str(build_dir), "--target",
             "verify-runner-tests", "-j", str(jobs)], what=f"unit tests for {target_name}")
    return build_dir / "verify-runner-tests"


def _current(manifest_path: Path, want: dict[str, object]) -> bool:
    try:
        have = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    bundle = manifest_path.parent
    lib = bundle / str(have.get("library", {}).get("file", "-"))
    return (all(have.get(k) == v for k, v in want.items())
            and (bundle / "bin" / "verify-runner").is_file() and lib.is_file())


def _runner_version() -> str:
    text = (SOURCES / "src" / "common.hpp").read_text(encoding="utf-8")
    for line in text.splitlines():
        if "kRunnerVersion" in line and '"' in line:
            return line.split('"')[1]
    return "unknown"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


LICENSES = """The verify native runner bundle ({target}) contains:

bin/verify-runner  verify's native runner, built from runner/native/ with nlohmann/json
                   (MIT License, Niels Lohmann; Debian package nlohmann-json3-dev)
lib/{lib}  ONNX Runtime {ort} (MIT License, Copyright (c) Microsoft Corporation),
                   taken from the npm package {package} {version} (licence: MIT)

MIT License: Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in the Software
without restriction, including without limitation the rights to use, copy, modify, merge,
publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons to
whom the Software is furnished to do so, subject to the following conditions: The above
copyright notice and this permission notice shall be included in all copies or substantial
portions of the Software. THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND,
EXPRESS OR IMPLIED.
"""


def _assemble(out: Path, runner: Path, library: Path, target: Target,
              manifest: dict[str, object]) -> None:
    """Write the bundle into out.tmp, then swap it in (a half-built bundle is never seen)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "bin").mkdir(parents=True)
    (tmp / "lib").mkdir()
    shutil.copy2(runner, tmp / "bin" / "verify-runner")
    shutil.copy2(library, tmp / "lib" / target.lib_name)
    shutil.copy2(SCHEMA, tmp / "contract.schema.json")
    (tmp / "LICENSES.txt").write_text(LICENSES.format(
        target=target.name, lib=target.lib_name, ort=target.ort_version, package=target.package,
        version=PACKAGES[target.package]["version"]), encoding="utf-8")
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build verify's native runner bundle (runner + libonnxruntime + manifest).")
    parser.add_argument("--target", choices=[*TARGETS, "all"], default=None,
                        help="what to build for; all: both Linux targets")
    parser.add_argument("--out", type=Path, default=None,
                        help="bundle folder (default: {cache}/native-runner/TARGET)")
    parser.add_argument("--ndk", type=Path, default=None,
                        help="the Android NDK's root (android-arm64-v8a only)")
    parser.add_argument("--toolchain-file", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--configure-only", action="store_true",
                        help="run the CMake configure step only (checks a toolchain)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="parallel compile jobs (2)")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--print-bundle", metavar="TARGET", choices=list(TARGETS),
                        help="print TARGET's bundle folder; exit 1 if it is not built")
    args = parser.parse_args(argv)
    if args.print_bundle:
        bundle = default_bundle(args.print_bundle)
        if not (bundle / "manifest.json").is_file():
            print(f"error: no {args.print_bundle} bundle at {bundle}; build it with: "
                  f"{sys.executable} {Path(__file__).resolve()} --target {args.print_bundle}",
                  file=sys.stderr)
            return 1
        print(bundle)
        return 0
    if args.target is None:
        parser.error("--target is required")
    targets = list(LINUX_TARGETS) if args.target == "all" else [args.target]
    if args.out is not None and len(targets) > 1:
        parser.error("--out names one bundle: give one --target")
    if any(t.startswith("android-") for t in targets) and args.ndk is None \
            and args.toolchain_file is None:
        print("error: --target android-arm64-v8a needs --ndk PATH (the Android NDK's root; "
              "see docs/native-runner.md)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        for t in targets:
            print(build(t, out=args.out, ndk=args.ndk, toolchain=args.toolchain_file,
                        jobs=args.jobs, force=args.force, configure_only=args.configure_only))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
