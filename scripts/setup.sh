#!/usr/bin/env bash
# Set up verify on a fresh Debian/Ubuntu machine.
#   scripts/setup.sh          install verify (pip, editable) into the current Python
#   scripts/setup.sh --test   also the test dependencies: openssh-server, adb,
#                             qemu-user-static, chromium (headless, for the HTML report
#                             test) and a font (apt), the test extras (pip), and the
#                             emulated ARM64 userlands (scripts/build_arm64_root.py: one with
#                             Python, one --minimal without; cached)
#                             and the real third-party models the tests use
#                             (scripts/fetch_models.py, cached outside the repository),
#                             and the native runner's toolchain (g++, g++-aarch64-linux-gnu,
#                             cmake, nlohmann-json3-dev, npm, ccache: apt) and clang (the
#                             compiled comparison kernel is tested with GCC and clang), and
#                             the native runner's two Linux
#                             bundles (scripts/build_native_runner.py --target all, cached);
#                             the test extra includes onnx-verify[torch], the CPU-only torch
#                             (no CUDA libraries: about 30 s and 0.8 GB to install)
# apt waits (at most 10 min, VERIFY_APT_LOCK_WAIT) while another apt or dpkg holds its locks,
# saying which process holds which; downloads are retried (VERIFY_SETUP_TRIES, default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
. scripts/setup_lib.sh

with_tests=0
[ "${1:-}" = "--test" ] && with_tests=1

# The distribution was renamed verify -> onnx-verify: an old install of this project under the
# old name would own the same `verify` command and import package, so it goes first. The
# unrelated `verify` from the package index is left alone, with a warning.
old_summary=$("$PYTHON" -m pip show verify 2>/dev/null | sed -n 's/^Summary: //p' || true)
case "$old_summary" in
  "") ;;
  "Cross-platform correctness verification for ONNX"*)
    echo "setup: removing this project's old 'verify' distribution (now named onnx-verify)" >&2
    "$PYTHON" -m pip uninstall -q -y verify ;;
  *) echo "setup: warning: an unrelated package named 'verify' is installed; it owns the same" \
          "import name as this project: pip uninstall verify" >&2 ;;
esac

if [ "$with_tests" = 1 ]; then
  need=()
  for pkg in openssh-server adb qemu-user-static chromium fonts-dejavu-core \
             g++ g++-aarch64-linux-gnu cmake nlohmann-json3-dev ccache clang; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  # npm may come with a nodejs that is not Debian's (NodeSource's bundles it, and Debian's npm
  # then cannot be installed beside it): any working npm will do.
  command -v npm >/dev/null 2>&1 || need+=(npm)
  if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "setup: installing ${need[*]} (apt)" >&2
    retry apt_get update -qq
    retry apt_get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  retry "$PYTHON" -m pip install -q -e '.[test]'
  retry "$PYTHON" scripts/build_arm64_root.py
  retry "$PYTHON" scripts/build_arm64_root.py --minimal >/dev/null
  # A CUDA build of onnxruntime, unpacked beside (not over) the CPU one: tests/test_cuda.py runs
  # it on this GPU-less machine, where onnxruntime silently falls back to the CPU.
  ortgpu_version=1.31.1
  ortgpu="${XDG_CACHE_HOME:-$HOME/.cache}/verify/onnxruntime-gpu-$ortgpu_version-$("$PYTHON" -c 'import sys; print("py%d%d" % sys.version_info[:2])')"
  if [ ! -f "$ortgpu/.complete" ]; then
    echo "setup: unpacking onnxruntime-gpu $ortgpu_version into $ortgpu (pip)" >&2
    unpack_ortgpu() {  # from scratch on every try: a half-written target is not reused
      rm -rf "$ortgpu.tmp"
      "$PYTHON" -m pip install -q --no-deps --no-compile --target "$ortgpu.tmp" "onnxruntime-gpu==$ortgpu_version"
    }
    retry unpack_ortgpu
    touch "$ortgpu.tmp/.complete"
    rm -rf "$ortgpu" && mv "$ortgpu.tmp" "$ortgpu"
  fi
  retry "$PYTHON" scripts/fetch_models.py >/dev/null
  "$PYTHON" scripts/build_native_runner.py --target all >/dev/null
else
  retry "$PYTHON" -m pip install -q -e .
fi
