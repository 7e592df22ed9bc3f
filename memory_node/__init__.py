"""memory_node: queryable spatial, temporal and semantic memory for a ROS 2 robot and its agent."""

__version__ = "0.1.0"
