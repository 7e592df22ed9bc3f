"""Running the package's launch file the way `ros2 launch` does, without ros2cli: real
`launch` and `launch_ros` (test/wheels) and an install prefix laid out as colcon's."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN_LAUNCH = """
import sys
import launch
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource

path, *arguments = sys.argv[1:]
ld = launch.LaunchDescription([IncludeLaunchDescription(
    PythonLaunchDescriptionSource(path),
    launch_arguments=[tuple(a.split(":=", 1)) for a in arguments])])
service = launch.LaunchService(argv=[])
service.include_launch_description(ld)
sys.exit(service.run())
"""


def install_prefix(prefix: Path) -> Path:
    """What `colcon build` installs for launch_ros to find: lib/memory_node/<executable>,
    the ament index entry, and share/memory_node/{config,launch}."""
    lib = prefix / "lib" / "memory_node"
    lib.mkdir(parents=True)
    for name in ("memory-node", "memory-sync"):
        exe = Path(sys.executable).parent / name
        assert exe.exists(), f"{exe} is not installed (make setup)"
        (lib / name).symlink_to(exe)
    index = prefix / "share" / "ament_index" / "resource_index" / "packages"
    index.mkdir(parents=True)
    (index / "memory_node").write_text("")
    share = prefix / "share" / "memory_node"
    for sub in ("config", "launch"):
        shutil.copytree(ROOT / sub, share / sub)
    return share / "launch" / "memory.launch.py"
