"""What the sample-replay tests share: a memory-node session in a test's folder, a search
that must succeed, and the check that stored poses are where the robot really was.

Tolerances: a pose from TF is within POSE_TOL_M of the ground-truth path interpolated at its
stamp; one from the odometry fallback (TF late or lost, odometry put in the map frame through
the last map -> odom) within ODOM_TOL_M."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from memory_node.session import Session

POSE_TOL_M = 0.15
ODOM_TOL_M = 0.5
RATE = 3.0  # replay rate of the sample


def session_in(tmp: Path, two_process: bool) -> Session:
    """memory-node (or memory-recorder + memory-server) on a store under `tmp`."""
    return Session(tmp / "memory", dict(os.environ), tmp / "logs", two_process)


def search(client, **query) -> list[dict]:
    answer = json.loads(client.search(json.dumps(query)))
    assert answer["ok"], answer
    return answer["results"]


def path_at(sample, t: float) -> tuple[float, float]:
    path = sample.truth["path"]
    ts = np.array([p["t"] for p in path])
    return (float(np.interp(t, ts, [p["x"] for p in path])),
            float(np.interp(t, ts, [p["y"] for p in path])))


def check_poses(sample, rows: list[dict]) -> None:
    """Every pose is in the map frame and where the robot really was at that stamp."""
    for r in rows:
        assert r["pose"]["frame"] == "map", r
        tol = POSE_TOL_M if r["pose"]["source"] == "tf" else ODOM_TOL_M
        x, y = path_at(sample, r["t"])
        assert abs(r["pose"]["x"] - x) < tol and abs(r["pose"]["y"] - y) < tol, r
