"""`memory-cli` refuses text a ROS String cannot carry whole, before calling anything."""

from __future__ import annotations

import json
import time

import pytest

from memory_node.ros.cli import main


@pytest.mark.parametrize(("verb", "payload", "named"), [
    ("search", "abc\x00def", "NUL"),
    ("save", "Met Bob\x00 at the door", "NUL"),
    ("save", "Met Bob \udcff", "UTF-8"),  # an undecodable argv byte (surrogateescape)
])
def test_cli_refuses_text_ros_would_cut(capsys, verb, payload, named):
    t0 = time.monotonic()
    rc = main([verb, payload, "--timeout", "3"])
    assert time.monotonic() - t0 < 2.5  # refused, not a wait for a server
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["ok"] is False and out["error"]["code"] == "bad_request"
    assert named in out["error"]["message"]
