#!/usr/bin/env bash
# Set up verify on a fresh Debian/Ubuntu machine.
#   scripts/setup.sh          install verify (pip, editable) into the current Python
#   scripts/setup.sh --test   also the test dependencies: openssh-server, adb,
#                             qemu-user-static, chromium (headless, for the HTML report
#                             test) and a font (apt), the test extras (pip), and the
#                             emulated ARM64 userland (scripts/build_arm64_root.py, cached)
#                             and the real third-party models the tests use
#                             (scripts/fetch_models.py, cached outside the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

with_tests=0
[ "${1:-}" = "--test" ] && with_tests=1

if [ "$with_tests" = 1 ]; then
  need=()
  for pkg in openssh-server adb qemu-user-static chromium fonts-dejavu-core; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "setup: installing ${need[*]} (apt)" >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  "$PYTHON" -m pip install -q -e '.[test]'
  "$PYTHON" scripts/build_arm64_root.py
  "$PYTHON" scripts/fetch_models.py >/dev/null
else
  "$PYTHON" -m pip install -q -e .
fi
