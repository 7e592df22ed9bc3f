"""End to end: the sample flat's first 30 s played twice into memory-node, so simulated time
jumps back. A module of its own: no other test's nodes or /clock may be up while it runs (a
/clock standing at another time would make the clock jump back and forth)."""

from __future__ import annotations

from replay_support import RATE, check_poses, search, session_in

from memory_node.agent.ros_client import RosClient
from memory_node.session import wait_until_settled


def test_loop_replay_keeps_poses_right(sample, tmp_path):
    """The bag played twice: simulated time jumps back, TF buffers and gates reset, and the
    second pass's keyframes are posed as well as the first's."""
    session = session_in(tmp_path, two_process=False)
    session.start()
    client = RosClient(use_sim_time=True, timeout_s=20.0)
    try:
        out = session.replay(sample.bag, RATE, ["--duration", "30", "--loops", "2"])
        assert "2 pass(es)" in out
        wait_until_settled(client)
        cams = search(client, stream="camera", k=100, order_by="time")
    finally:
        client.close()
        session.stop()
    stamps = [round(r["t"], 3) for r in cams]
    assert len(stamps) > len(set(stamps)), "the second pass stored nothing"
    log = (tmp_path / "logs" / "memory-node.log").read_text()
    assert "time jumped back" in log
    check_poses(sample, cams)
