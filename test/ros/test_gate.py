"""Keyframe gating, as the recorder applies it per stream."""

from __future__ import annotations

import numpy as np

from memory_node.core.recorder import view_thumbnail
from memory_node.core.recording import KeyframeGate as Gate
from memory_node.core.types import Pose
from memory_node.wire.image_codec import bgr_to_image_msg


def test_moved_turned_or_interval():
    g = Gate(min_distance=0.5, min_yaw=0.5, max_interval=10.0)
    assert g.admit(0.0, Pose(0, 0))  # the first frame
    assert not g.admit(0.1, Pose(0.3, 0))
    assert g.admit(0.2, Pose(0.5, 0))  # moved 0.5 m since the last kept
    assert not g.admit(0.3, Pose(0.5, 0, yaw=0.4))
    assert g.admit(0.4, Pose(0.5, 0, yaw=0.6))  # turned
    assert g.admit(0.5, Pose(0.5, 0, yaw=0.6 + 2 * np.pi - 0.5)) is True  # wraps: -0.5 rad
    assert not g.admit(5.0, Pose(0.5, 0, yaw=0.1))
    assert g.admit(10.5, Pose(0.5, 0, yaw=0.1))  # standing still: one per max_interval
    assert g.admit(3.0, Pose(0.5, 0, yaw=0.1))  # time jumped back: start over


def test_no_pose_keeps_one_per_interval_and_the_first_pose():
    g = Gate(0.5, 0.5, 10.0)
    assert g.admit(0.0, None)
    assert not g.admit(1.0, None)
    assert g.admit(2.0, Pose(0, 0))  # a pose appeared
    assert g.admit(12.0, None)


def test_view_change_keeps_a_frame_when_someone_walks_in():
    g = Gate(0.5, 0.5, 10.0, min_view_change=0.06, min_view_interval=1.0)
    wall = np.full((240, 320, 3), 150, np.uint8)
    person = wall.copy()
    person[40:230, 130:190] = 20  # a dark figure in front of the wall
    still = Pose(1, 1)
    v_wall = view_thumbnail(bgr_to_image_msg(wall, "rgb8"), "raw")
    v_person = view_thumbnail(bgr_to_image_msg(person, "rgb8"), "raw")
    assert v_wall.shape == (24, 32) and 0 <= v_wall.min() <= v_wall.max() <= 1
    assert g.admit(0.0, still, v_wall)
    assert not g.admit(2.0, still, v_wall)  # same view, not moving
    assert not g.admit(0.5, still, v_person)  # too soon after the last keyframe
    assert g.admit(2.5, still, v_person)  # changed view
    assert not g.admit(4.0, still, v_person)


def test_thumbnail_of_a_compressed_image_and_of_garbage():
    from memory_node.wire.image_codec import bgr_to_compressed_msg

    img = np.full((240, 320, 3), 200, np.uint8)
    v = view_thumbnail(bgr_to_compressed_msg(img, "jpeg"), "compressed")
    assert v.shape == (24, 32) and abs(float(v.mean()) - 200 / 255) < 0.02
    msg = bgr_to_compressed_msg(img, "jpeg")
    msg.data = b"not a jpeg"
    assert view_thumbnail(msg, "compressed") is None
