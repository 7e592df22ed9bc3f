"""The keyframe gate decodes a camera frame's thumbnail only when it needs it: a frame that the
pose and the clock already turn down costs no image decode (what makes memory-import fast),
and the decisions are those of a gate given every thumbnail."""

from __future__ import annotations

import numpy as np

from memory_node.core.recording import KeyframeGate
from memory_node.core.types import Pose


def _frames(n: int = 600, seed: int = 4):
    """15 Hz frames of a robot that walks, stands (someone walks in: the view changes), walks."""
    rng = np.random.default_rng(seed)
    views = rng.random((4, 24, 32)).astype(np.float32)
    out = []
    for i in range(n):
        t = 100.0 + i / 15.0
        walking = not (200 <= i < 420)
        x = 0.8 * t if walking else 0.8 * (100.0 + 200 / 15.0)
        view = views[(i // 40) % 4] if not walking else views[0] + 0.01 * (i % 3)
        out.append((t, Pose(x, 0.0, 0.0, 0.0, "map", "tf"), view))
    return out


def test_lazy_thumbnails_decide_as_eager_ones_with_far_fewer_decodes():
    def gate() -> KeyframeGate:
        return KeyframeGate(0.5, 0.5, 10.0, min_view_change=0.06, min_view_interval=1.0)

    eager, lazy = gate(), gate()
    decodes = 0

    def thumbnail(v):
        def make():
            nonlocal decodes
            decodes += 1
            return v
        return make

    frames = _frames()
    got_eager = [eager.admit(t, p, v) for t, p, v in frames]
    got_lazy = [lazy.admit(t, p, thumbnail(v)) for t, p, v in frames]
    assert got_lazy == got_eager
    kept = sum(got_eager)
    assert 0 < kept < len(frames) // 3
    # Decoded: the kept frames, and those standing still past min_view_interval (view test).
    assert decodes < len(frames) // 2, (decodes, kept)
    # Standing still, the view changes every 40 frames: those changes are kept.
    assert sum(got_eager[200:420]) >= 4


def test_an_undecodable_thumbnail_neither_keeps_a_frame_nor_replaces_the_last_view():
    g = KeyframeGate(0.5, 0.5, 10.0, min_view_change=0.06, min_view_interval=1.0)
    pose = Pose(0.0, 0.0, 0.0, 0.0, "map", "tf")
    first = np.zeros((24, 32), np.float32)
    assert g.admit(0.0, pose, lambda: first)
    assert not g.admit(2.0, pose, lambda: None)
    assert g.last_view is first
    assert g.admit(3.0, pose, lambda: first + 0.5)
