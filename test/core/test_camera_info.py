"""The views' field of view from the driver's CameraInfo (go2_ros2_sdk publishes its
calibration): 2 atan(width / 2 fx) replaces camera_hfov_deg once it arrives; an uncalibrated
CameraInfo (zeros) changes nothing, and camera_hfov_deg 0 keeps views off."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest
from engine_support import make_engine

from memory_node.core.camera_info import camera_info_topic, hfov_deg
from memory_node.core.recorder import Job, RecorderPolicy
from memory_node.core.types import Pose

T0 = 1_764_460_800.0


def info(width: int, fx: float) -> NS:
    return NS(width=width, height=width * 9 // 16, k=[fx, 0.0, width / 2, 0.0, fx, 0.0, 0.0,
                                                       0.0, 1.0])


def test_the_info_topic_beside_the_image_topic():
    assert camera_info_topic("/camera/image_raw") == "/camera/camera_info"
    assert camera_info_topic("/camera/image_raw/compressed") == "/camera/camera_info"
    assert camera_info_topic("/robot1/camera/image_raw") == "/robot1/camera/camera_info"
    assert camera_info_topic("image") == "/camera_info"


def test_hfov_from_k_and_width():
    # go2_ros2_sdk's front_camera_720 calibration: 1280 px over fx 864 px
    assert hfov_deg(info(1280, 864.0)) == pytest.approx(73.05, abs=0.01)
    assert hfov_deg(info(320, 160.0)) == pytest.approx(90.0)
    assert hfov_deg(info(1280, 0.0)) is None and hfov_deg(info(0, 500.0)) is None
    assert hfov_deg(NS(width=640)) is None


def test_views_take_the_drivers_field_of_view(tmp_path):
    engine = make_engine(tmp_path / "mem")
    try:
        policy = RecorderPolicy.offline({"camera_hfov_deg": 73.0, "camera_mount_x": 0.33},
                                        engine)
        image = NS(header=NS(stamp=NS(sec=int(T0), nanosec=0), frame_id=""))
        job = Job("camera", T0, image, "raw", lookup_t=T0,
                  pose=Pose(1.0, 0.0, 0.0, 0.0, "odom", "odom"))
        assert policy.camera_view(job).hfov == pytest.approx(math.radians(73.0))
        policy.on_camera_info(info(1280, 0.0))  # uncalibrated: nothing changes
        assert policy.camera_view(job).hfov == pytest.approx(math.radians(73.0))
        policy.on_camera_info(info(320, 160.0))
        view = policy.camera_view(job)
        assert view.hfov == pytest.approx(math.radians(90.0))
        assert (view.x, view.y) == (pytest.approx(1.33), pytest.approx(0.0))
        off = RecorderPolicy.offline({"camera_hfov_deg": 0.0}, engine)
        off.on_camera_info(info(320, 160.0))
        assert off.camera_view(job) is None
    finally:
        engine.close()
