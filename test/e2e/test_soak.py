"""A short soak (the long one is `python -m bench.soak --soak`): `memory-node` under a looping
replay with a save every second. Every save is answered, open file handles stay flat, the
node prints no error, and the store grows only by what it keeps."""

from __future__ import annotations

import argparse
import os

from bench.soak import run_soak


def test_looping_replay_with_saves_stays_flat(tmp_path, monkeypatch):
    monkeypatch.setattr("bench.soak.DOMAIN_ID", os.environ["ROS_DOMAIN_ID"])
    args = argparse.Namespace(rate=4.0, duration=75.0, save_every=1.0, warmup=25.0)
    result = run_soak(args, tmp_path)
    assert result["saves"]["failed"] == 0 and result["saves"]["ok"] >= 30, result

    assert result["fds"]["max"] - result["fds"]["min"] <= 2, result["fds"]
    errors = [ln for ln in result["node_problems"] if "[WARN]" not in ln]
    assert errors == [], errors  # warnings (a loop's clock jump) are expected; errors are not
    # what the store holds is what was kept: ~tens of kB per row (a JPEG or a cloud at most)
    assert 0 < result["store_kb_per_row"] < 100, result
    assert result["rows"] >= result["saves"]["ok"]
