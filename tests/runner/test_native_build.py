"""scripts/build_native_runner.py: the bundles (contents, manifest, cache), its refusals, and the
Android configuration, checked against a stand-in for the NDK's toolchain file (no NDK can be
installed here: what runs is CMake's configure step with the flags an NDK build gets)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures_native import REPO, SCRIPT, build_script, bundle

STANDIN = """\
# A stand-in for $NDK/build/cmake/android.toolchain.cmake: what CMake's configure step needs
# from it (a system, a C++ compiler, ANDROID set), with Debian's aarch64 cross compiler.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(ANDROID TRUE)
"""


def script(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=900, **kw)


@pytest.mark.parametrize("target,lib,machine", [("linux-x86_64", "libonnxruntime.so.1", "X86-64"),
                                                 ("linux-aarch64", "libonnxruntime.so.1", "AArch64")])
def test_bundle_contents(target: str, lib: str, machine: str) -> None:
    b = bundle(target)
    manifest = json.loads((b / "manifest.json").read_text())
    assert manifest["target"] == target and manifest["onnxruntime"] == "1.30.0"
    assert manifest["ort_api_version"] == 29 and manifest["contract_version"] == 1
    assert manifest["packages"]["onnxruntime-node"]["version"] == "1.30.0"
    assert manifest["packages"]["onnxruntime-node"]["integrity"].startswith("sha512-")
    assert all(p["license"] == "MIT" for p in manifest["packages"].values())
    assert manifest["library"]["file"] == f"lib/{lib}"
    assert "MIT License" in (b / "LICENSES.txt").read_text()
    assert (b / "contract.schema.json").read_bytes() == \
        (REPO / "verify" / "runner" / "contract.schema.json").read_bytes()
    header = subprocess.run(["readelf", "-h", str(b / "bin" / "verify-runner")],
                            capture_output=True, text=True, check=True).stdout
    assert machine in header
    needed = subprocess.run(["readelf", "-d", str(b / "bin" / "verify-runner")],
                            capture_output=True, text=True, check=True).stdout
    assert "libstdc++" not in needed and "libonnxruntime" not in needed  # static; dlopen'd
    assert "$ORIGIN/../lib" in needed  # RUNPATH


def test_a_second_build_is_cached() -> None:
    bundle("linux-x86_64")
    proc = script("--target", "linux-x86_64")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith(": up to date") and "cmake" not in proc.stderr


def test_a_tampered_tarball_is_refused(tmp_path: Path) -> None:
    bnr = build_script()
    dist = bnr.verify_cache() / "native" / "dist"
    fake = tmp_path / "t.tgz"
    fake.write_bytes((dist / "onnxruntime-node-1.30.0.tgz").read_bytes()[:1000])
    with pytest.raises(bnr.BuildError, match="is not the pinned sha512"):
        bnr.check_integrity(fake, bnr.PACKAGES["onnxruntime-node"]["integrity"], "onnxruntime-node")


def test_android_needs_an_ndk(tmp_path: Path) -> None:
    proc = script("--target", "android-arm64-v8a")
    assert proc.returncode == 2 and "needs --ndk PATH" in proc.stderr
    proc = script("--target", "android-arm64-v8a", "--ndk", str(tmp_path))
    assert proc.returncode == 3
    assert f"no Android toolchain file at {tmp_path}/build/cmake/android.toolchain.cmake" \
        in proc.stderr


def test_android_configuration_with_a_stand_in_toolchain(tmp_path: Path) -> None:
    """The configure step an NDK build runs: the toolchain file, ABI, platform and STL passed,
    the AAR's headers found, ANDROID's branch of the CMake file taken."""
    bundle("linux-x86_64")  # fetched packages and extracted headers in place
    tc = tmp_path / "android.toolchain.cmake"
    tc.write_text(STANDIN)
    proc = script("--target", "android-arm64-v8a", "--toolchain-file", str(tc),
                  "--configure-only")
    assert proc.returncode == 0, proc.stderr
    build_dir = Path(proc.stdout.strip())
    try:
        check_android_cache(build_dir, tc)
    finally:
        import shutil

        shutil.rmtree(build_dir)  # one folder per toolchain file: this one is the test's


def check_android_cache(build_dir: Path, tc: Path) -> None:
    cache = (build_dir / "CMakeCache.txt").read_text()
    for line in (f"CMAKE_TOOLCHAIN_FILE:FILEPATH={tc}", "ANDROID_ABI:UNINITIALIZED=arm64-v8a",
                 "ANDROID_PLATFORM:UNINITIALIZED=android-24",
                 "ANDROID_STL:UNINITIALIZED=c++_static"):
        assert line in cache
    headers = next(ln for ln in cache.splitlines() if ln.startswith("ORT_INCLUDE_DIR"))
    assert headers.endswith("com.github.asus4.onnxruntime-0.4.9/headers")
    link = (build_dir / "CMakeFiles" / "verify-runner.dir" / "link.txt").read_text()
    assert "-static-libstdc++" in link and "-static-libgcc" not in link  # the Android branch
    assert not (REPO / "runner" / "native" / "build").exists()


def test_minimal_arm64_root_has_no_python(tmp_path: Path) -> None:
    """build_arm64_root.py --minimal: libc, libgcc and libstdc++ only; its prefix and check."""
    from verify.devices import arm64_root

    tool = REPO / "scripts" / "build_arm64_root.py"
    root = Path(str(arm64_root()) + "-minimal")
    proc = subprocess.run([sys.executable, str(tool), "--minimal", "--check"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.skip("the minimal root is not built: python scripts/build_arm64_root.py --minimal")
    proc = subprocess.run([sys.executable, str(tool), "--minimal", "--print-prefix"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(proc.stdout) == ["qemu-aarch64-static", "-L", str(root), "-cpu",
                                       "neoverse-n1"]
    stamp = json.loads((root / ".verify-arm64-root.json").read_text())
    assert sorted(stamp["deb_versions"]) == ["libc6", "libgcc-s1", "libstdc++6"]
    names = {p.name for p in root.rglob("*")}
    assert not any(n.startswith("python") or n in ("numpy", "onnxruntime") for n in names)
    assert "libstdc++.so.6" in names and "ld-linux-aarch64.so.1" in names
    proc = subprocess.run([sys.executable, str(tool), "--minimal", "--root", str(tmp_path / "no"),
                           "--print-prefix"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "no minimal arm64 root at" in proc.stderr


def checkout_copy(dest: Path) -> Path:
    """What the build reads of a checkout (runner/native, the script, the schema), copied to
    another path: a second checkout, as a worktree or CI's fresh clone is."""
    import shutil

    shutil.copytree(REPO / "runner" / "native", dest / "runner" / "native",
                    ignore=shutil.ignore_patterns("build"))
    (dest / "scripts").mkdir()
    shutil.copy2(SCRIPT, dest / "scripts" / SCRIPT.name)
    (dest / "verify" / "runner").mkdir(parents=True)
    shutil.copy2(REPO / "verify" / "runner" / "contract.schema.json",
                 dest / "verify" / "runner" / "contract.schema.json")
    return dest / "scripts" / SCRIPT.name


def copy_script(copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(copy), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=900)


def test_another_checkout_reuses_the_bundle_and_has_its_own_cmake_folder(tmp_path: Path) -> None:
    """Same sources at another path: the bundle is up to date (no cmake run); configuring
    uses a build folder of its own (CMake refuses one configured from another source folder),
    and a folder left configured from elsewhere is configured afresh, not reused."""
    import shutil

    bundle("linux-x86_64")
    copy = checkout_copy(tmp_path / "other")
    proc = copy_script(copy, "--target", "linux-x86_64")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith(": up to date") and "cmake" not in proc.stderr
    proc = copy_script(copy, "--target", "linux-x86_64", "--configure-only")
    assert proc.returncode == 0, proc.stderr
    build_dir = Path(proc.stdout.strip())
    try:
        ours = Path(script("--target", "linux-x86_64", "--configure-only").stdout.strip())
        assert build_dir != ours and build_dir.parent == ours.parent
        bnr = build_script()
        assert bnr.cmake_home(build_dir) == str(tmp_path / "other" / "runner" / "native")
        assert bnr.cmake_home(ours) == str(REPO / "runner" / "native")
        # a folder configured from other sources (an older layout, a moved checkout)
        cache = build_dir / "CMakeCache.txt"
        cache.write_text(cache.read_text().replace(str(tmp_path / "other"), "/elsewhere"))
        proc = copy_script(copy, "--target", "linux-x86_64", "--configure-only")
        assert proc.returncode == 0, proc.stderr
        assert "was configured from /elsewhere/runner/native: configuring afresh" in proc.stderr
        assert bnr.cmake_home(build_dir) == str(tmp_path / "other" / "runner" / "native")
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)


@pytest.mark.slow
def test_changed_sources_rebuild_from_another_checkout(tmp_path: Path) -> None:
    """A source changed in another checkout: its bundle is stale and is rebuilt (cmake runs),
    then up to date; this checkout's bundle stays up to date for this checkout."""
    import shutil

    ours = json.loads((bundle("linux-x86_64") / "manifest.json").read_text())
    copy = checkout_copy(tmp_path / "other")
    src = tmp_path / "other" / "runner" / "native" / "src" / "common.cpp"
    src.write_text(src.read_text() + "\n// changed in another checkout\n")
    out = tmp_path / "bundle"
    build_dir = Path(copy_script(copy, "--target", "linux-x86_64",
                                 "--configure-only").stdout.strip())
    try:
        proc = copy_script(copy, "--target", "linux-x86_64", "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        assert "cmake build (linux-x86_64" in proc.stderr and f"built {out}" in proc.stderr
        theirs = json.loads((out / "manifest.json").read_text())
        assert theirs["source_sha256"] != ours["source_sha256"]
        assert (out / "bin" / "verify-runner").is_file()
        proc = copy_script(copy, "--target", "linux-x86_64", "--out", str(out))
        assert proc.returncode == 0 and proc.stderr.strip().endswith(": up to date")
        proc = script("--target", "linux-x86_64")
        assert proc.returncode == 0 and proc.stderr.strip().endswith(": up to date")
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
