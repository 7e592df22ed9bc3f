#!/usr/bin/env bash
# Runs the core tests (test/core) on aarch64: Debian's arm64 Python under QEMU user-mode
# emulation, with the aarch64 wheels of requirements/apt.txt under the Humble pins
# (requirements/apt-humble.txt: what a Jetson with Ubuntu 22.04 + Humble installs), numpy 1,
# and opencv-python-headless 4.11 (the last for numpy 1) in place of apt's python3-opencv.
#
#   make test-aarch64            (or: tools/aarch64-core-tests.sh [pytest arguments])
#
# Needs qemu-aarch64-static (Debian: apt-get install qemu-user-static) and apt-get, but no
# binfmt_misc registration and no change to this machine's apt setup: the arm64 packages come
# through a private apt state in build/aarch64/apt and are unpacked (dpkg -x) into
# build/aarch64/root; QEMU is called explicitly (-L that root). build/aarch64/venv is a venv
# whose bin/python3 is a wrapper that starts QEMU, passing its own path as argv[0]: Python then
# finds the venv's pyvenv.cfg and site-packages, and child processes started as sys.executable
# (the tests start some) run emulated too. The wheels are fetched into that site-packages by the
# host's pip for the target (--target, --platform, --python-version); a .pth file there puts
# this checkout on the path.
#
# onnxruntime: 1.23.2 (the Humble pin) loads under QEMU 7.2; 1.32.0 (the Jazzy pin) crashes in
# its native module's start-up under QEMU 7.2 (SIGSEGV before any Python code), so this runs
# the Humble pins only.
set -euo pipefail
cd "$(dirname "$0")/.."
here="$PWD/build/aarch64"
pip_python="${PIP_PYTHON:-.venv/bin/python}"
qemu="$(command -v qemu-aarch64-static || true)"
if [ -z "$qemu" ]; then
  echo "aarch64-core-tests: qemu-aarch64-static not found (Debian: apt-get install" \
    "qemu-user-static)" >&2
  exit 1
fi
mkdir -p "$here"

# 1. Debian's arm64 Python in a root of its own (the host's release, from its apt sources).
if [ ! -x "$here/root/usr/bin/python3.11" ]; then
  apt="$here/apt"
  mkdir -p "$apt/state/lists/partial" "$apt/cache/archives/partial" "$apt/etc/sources.list.d" \
    "$apt/etc/preferences.d"
  : >"$apt/status"
  cp /etc/apt/sources.list.d/*.sources "$apt/etc/sources.list.d/" 2>/dev/null || true
  [ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$apt/etc/sources.list"
  opts=(-o APT::Architecture=arm64 -o "APT::Architectures::=arm64"
    -o "Dir::State=$apt/state" -o "Dir::State::status=$apt/status" -o "Dir::Cache=$apt/cache"
    -o "Dir::Etc::sourcelist=$apt/etc/sources.list" -o "Dir::Etc::sourceparts=$apt/etc/sources.list.d"
    -o "Dir::Etc::preferencesparts=$apt/etc/preferences.d" -o Debug::NoLocking=1)
  apt-get "${opts[@]}" -qq update
  apt-get "${opts[@]}" -qq -y --download-only --no-install-recommends install \
    python3.11 libpython3.11-stdlib libstdc++6 libgomp1
  rm -rf "$here/root.partial"
  for deb in "$apt"/cache/archives/*.deb; do dpkg -x "$deb" "$here/root.partial"; done
  rm -rf "$here/root"
  mv "$here/root.partial" "$here/root"
fi

# 2. The venv and its interpreter wrapper (-0 keeps the wrapper's path in argv[0]).
venv="$here/venv"
python="$venv/bin/python3"
mkdir -p "$venv/bin"
cat >"$python" <<EOF
#!/bin/sh
exec "$qemu" -L "$here/root" -0 "\$0" "$here/root/usr/bin/python3.11" "\$@"
EOF
chmod +x "$python"
printf 'home = %s\ninclude-system-site-packages = false\n' "$here/root/usr/bin" >"$venv/pyvenv.cfg"
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
machine=$("$python" -c 'import platform; print(platform.machine())')
site="$venv/lib/python$version/site-packages"
[ "$machine" = aarch64 ] || { echo "aarch64-core-tests: got $machine, not aarch64" >&2; exit 1; }

# 3. The aarch64 wheels, resolved and fetched by the host's pip for the target.
glibc=$("$python" -c 'import os; print(os.confstr("CS_GNU_LIBC_VERSION").split(".")[-1])')
platforms=(--platform manylinux2014_aarch64)
for v in $(seq 17 "$glibc"); do platforms+=(--platform "manylinux_2_${v}_aarch64"); done
inputs=$(cat requirements/apt.txt requirements/apt-humble.txt requirements/apt-test.txt \
  requirements/nodeps.txt | sha256sum | cut -c1-32)
if [ ! -d "$site" ] || [ "$(cat "$here/site.stamp" 2>/dev/null)" != "$inputs" ]; then
  rm -rf "$site"
  echo "opencv-python-headless==4.11.0.86" >"$here/opencv.txt"
  "$pip_python" -m pip install -q --only-binary=:all: --target "$site" \
    --python-version "$version" "${platforms[@]}" -c requirements/apt-humble.txt \
    -r requirements/apt.txt -r requirements/apt-test.txt -r "$here/opencv.txt"
  "$pip_python" -m pip install -q --no-deps --only-binary=:all: --target "$site" \
    --python-version "$version" "${platforms[@]}" -r requirements/nodeps.txt
  echo "$inputs" >"$here/site.stamp"
fi

# 4. The core tests, on the emulated interpreter (memory_node from the checkout).
echo "$PWD" >"$site/memory_node-checkout.pth"
echo "aarch64-core-tests: Python $version on $machine under $(basename "$qemu")"
"$python" -c \
  'import numpy, onnxruntime, faiss, cv2; print("numpy", numpy.__version__, "onnxruntime",
  onnxruntime.__version__, "faiss", faiss.__version__, "cv2", cv2.__version__)'
exec "$python" -m pytest -p no:cacheprovider \
  "${@:-test/core}"
