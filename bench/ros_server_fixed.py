"""`memory-server` with the prototyped core fixes (bench/prototypes.py) applied to its engine.

Usage: python -m bench.ros_server_fixed --ros-args -p memory_dir:=DIR
Only for the ROS round-trip benchmark: it shows what /memory/search costs once the fixes the
report suggests are in core, without changing core.
"""

from __future__ import annotations

import sys
from typing import Any

from bench import prototypes


def main() -> int:
    import rclpy

    from memory_node.core.engine import MemoryEngine
    from memory_node.ros.server import MemoryServer, spin_nodes

    def factory(config: Any, **kwargs: Any) -> MemoryEngine:
        eng = MemoryEngine(config, **kwargs)
        prototypes.apply(eng)
        return eng

    rclpy.init(args=sys.argv)
    node = MemoryServer(engine_factory=factory)
    node.trigger_configure()
    if node.lifecycle_state == "inactive":  # as server.main
        node.trigger_activate()
    spin_nodes([node])
    return 0


if __name__ == "__main__":
    sys.exit(main())
