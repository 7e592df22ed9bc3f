"""A sensor stream kind the tests define themselves (a range finder's sensor_msgs/Range), not
the package: registering it is all a new kind needs beside its decoder."""

from __future__ import annotations

from typing import Any

import pytest

from memory_node.core.streams import StreamKind, register_stream, unregister_stream


def range_row(msg: Any) -> tuple[dict, str]:
    """The new stream's decoder: the reading as a tag and as words."""
    metres = round(float(msg.range), 3)
    return {"range_m": metres}, f"obstacle {metres:.2f} m ahead"


RANGE = StreamKind("range", ("sensor_msgs/msg/Range",), "range_topic", "/range",
                   tags=("range_m",), to_row=range_row)


@pytest.fixture
def range_stream():
    """RANGE registered for one test, then gone again."""
    register_stream(RANGE)
    try:
        yield RANGE
    finally:
        unregister_stream(RANGE.name)
