"""Fixtures the ROS node tests share."""

from __future__ import annotations

import pytest
import rclpy

from memory_node.ros.cli import ServiceCaller


@pytest.fixture(scope="module")
def ros(request):
    """(context, a service caller, a node to publish from), for one test module."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    caller = ServiceCaller(f"{name}_client", context=ctx)
    node = rclpy.create_node(f"{name}_publisher", context=ctx)
    yield ctx, caller, node
    caller.close()
    node.destroy_node()
    rclpy.shutdown(context=ctx)
