"""What a kept keyframe becomes before it is stored: the recorder policy's last stage, split
from core/recorder.py because it is a job of its own (decoding, camera views, scan geometry).

`KeyframePayloads.build(job)` turns a kept `Job` into the payload its stream kind stores
(core/stream_rows.py): a camera frame decoded to pixels with the view it covered, a lidar
scan voxel-downsampled with its frame and ranges, or for any other kind the `SensorRow` its
registered decoder (`StreamKind.to_row`) gives. Camera and lidar need the policy's pose
history and the newest lidar keyframe (the range of camera views), so they are built here
rather than by a decoder of the message alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_node.core.pose_history import Logger, PoseHistory
from memory_node.core.stream_rows import CameraFrame, LidarScan, SensorRow
from memory_node.core.streams import stream_kind
from memory_node.core.types import Pose, View
from memory_node.core.views import forward_yaw, is_optical, make_view, mounted, view_range
from memory_node.wire.tf_buffer import Transform, TransformError


@dataclass
class Job:
    """One received message on its way through the stages."""

    stream: str
    t: float  # the time stored
    msg: Any
    kind: str = ""  # camera: "raw" (Image), "compressed" (CompressedImage) or "video"
    # (a core.front_video.VideoPicture, converted to pixels only when kept)
    enqueued: float = 0.0  # arrival on the wall clock (bounds the wait for TF)
    pose: Pose | None = None
    epoch: int = 0  # time jumps back seen before the message arrived
    lookup_t: float = 0.0  # the stamp TF and odometry are looked up at (see `stamp`)
    tags: dict[str, Any] = field(default_factory=dict)  # tags known on arrival (odom speed)
    # A payload decoded and prepared ahead of storing (`RecorderPolicy.prepare`: a camera
    # frame's pixels, description and JPEG), or why that failed.
    payload: Any = None
    failure: Exception | None = None


class KeyframePayloads:
    """Builds each kept job's payload (see the module docstring). `settings`: the recorder's
    (core.recorder_settings); `poses`: the policy's pose history."""

    def __init__(self, settings: Mapping[str, Any], poses: PoseHistory, log: Logger):
        self.settings = settings
        self.poses = poses
        self.log = log
        self.voxel = settings["lidar_voxel"]
        # The newest lidar keyframe in world coordinates (t, xy): the range of camera views.
        self.last_scan: tuple[float, np.ndarray] | None = None
        # The views' field of view: camera_hfov_deg until the driver's CameraInfo tells it.
        self.camera_hfov_deg: float = settings["camera_hfov_deg"]
        self._mount_lidar()

    def build(self, job: Job) -> Any:
        """The payload of a kept job, in storing order (a lidar keyframe sets the range of the
        camera views after it)."""
        if job.stream == "camera":
            frame = (job.payload if job.payload is not None
                     else CameraFrame(job.t, job.pose, self.decode_image(job)))
            frame.view = self.camera_view(job)
            return frame
        if job.stream == "lidar":
            return self.lidar_scan(job)
        decode = stream_kind(job.stream).to_row
        assert decode is not None  # only camera and lidar have none
        tags, text = decode(job.msg)
        return SensorRow(job.t, job.pose, dict(job.tags) | tags, text)

    def early(self, job: Job) -> Any:
        """The part of a payload that can be built ahead of storing, out of order: a camera
        frame's pixels (its view waits for `build`); None for other streams."""
        if job.stream != "camera":
            return None
        return CameraFrame(job.t, job.pose, self.decode_image(job))

    @staticmethod
    def decode_image(job: Job) -> np.ndarray:
        from memory_node.wire.image_codec import compressed_to_bgr, image_to_bgr

        if job.kind == "video":
            return job.msg.to_bgr()
        return compressed_to_bgr(job.msg) if job.kind == "compressed" else image_to_bgr(job.msg)

    # ---- camera ---------------------------------------------------------------------------
    def on_camera_info(self, msg: Any) -> None:
        """The driver's CameraInfo: its field of view replaces camera_hfov_deg for views (said
        when it changes); camera_hfov_deg 0 (no views) stays off."""
        from memory_node.core.camera_info import hfov_deg

        hfov = hfov_deg(msg)
        if hfov is None or self.settings["camera_hfov_deg"] <= 0:
            return
        hfov = round(hfov, 2)
        if hfov != self.camera_hfov_deg:
            self.log.info(f"camera field of view {hfov:g} deg from camera_info (width "
                          f"{int(msg.width)} px, fx {float(msg.k[0]):g} px)")
            self.camera_hfov_deg = hfov

    def camera_view(self, job: Job) -> View | None:
        """What the keyframe covered: camera pose from TF (world <- camera frame) at the
        stamp, else the base pose with the configured mount; range from a lidar keyframe
        close in time, else view_max_range; the field of view camera_info's, else
        camera_hfov_deg. None without any pose."""
        cfg = self.settings
        hfov = self.camera_hfov_deg
        if hfov <= 0:
            return None
        frame = cfg["camera_frame"] or getattr(job.msg.header, "frame_id", "")
        tr = self.poses.lookup(frame, job.lookup_t) if frame else None
        if tr is not None:
            rot = tr.as_matrix()[:3, :3]
            # optical by name (REP 103) or by orientation: an optical frame's y axis points
            # down (go2_ros2_sdk's front_camera, rpy -pi/2 0 -pi/2, is one without the name)
            optical = is_optical(frame) or float(rot[2, 1]) < -0.7
            x, y, yaw = tr.x, tr.y, forward_yaw(rot, optical)
        elif job.pose is not None:
            x, y, yaw = mounted(job.pose, (cfg["camera_mount_x"], cfg["camera_mount_y"],
                                           cfg["camera_mount_yaw"]))
        else:
            return None
        scan = self.last_scan
        pts = (scan[1] if scan is not None
               and abs(scan[0] - job.t) <= cfg["view_lidar_max_age_s"] else None)
        rng = view_range(pts, x, y, yaw, math.radians(hfov), cfg["view_max_range"])
        return make_view(x, y, yaw, hfov, rng)

    # ---- lidar ----------------------------------------------------------------------------
    def lidar_scan(self, job: Job) -> LidarScan:
        """The scan's points voxel-downsampled, with its frame and ranges; kept as the range
        of the camera views after it."""
        from memory_node.wire.pointcloud import read_xyz, voxel_downsample

        pts = voxel_downsample(read_xyz(job.msg), self.voxel)
        self._keep_scan(job, pts)
        return LidarScan(job.t, job.pose, pts, self._scan_tags(job, pts))

    def _mount_lidar(self) -> None:
        """The lidar mount parameters as a static transform base_frame -> lidar_frame, for a
        stack that publishes none (unitree_ros2's utlidar_lidar); a published transform for
        that frame replaces it (the newest wins)."""
        cfg = self.settings
        frame = cfg["lidar_frame"]
        if not frame or self.poses.buffer.has_frame(frame):
            return
        from memory_node.wire.geometry import quaternion_from_euler

        q = quaternion_from_euler(cfg["lidar_mount_roll"], cfg["lidar_mount_pitch"],
                                  cfg["lidar_mount_yaw"])
        self.poses.buffer.set_edge(cfg["base_frame"], frame, 0.0,
                                   (cfg["lidar_mount_x"], cfg["lidar_mount_y"],
                                    cfg["lidar_mount_z"]), tuple(q), "lidar_mount parameters",
                                   is_static=True)

    def _frame_in_pose_frame(self, frame: str, job: Job) -> Transform | None:
        """pose frame <- `frame` at the job's stamp: TF world <- frame when TF has it, else
        the job's pose (odometry, in its frame) composed with base <- frame (a mount)."""
        tr = self.poses.lookup(frame, job.lookup_t)
        if tr is not None or job.pose is None:
            return tr
        pose = job.pose
        if frame == pose.frame:
            return Transform.identity()
        base = Transform.from_xyz_yaw(pose.x, pose.y, pose.yaw, pose.z)
        try:
            mount = self.poses.buffer.lookup(self.poses.base_frame, frame, job.lookup_t,
                                             self.poses.tolerance_s)
        except TransformError:
            return None
        return base.compose(mount)

    def _scan_tags(self, job: Job, pts: np.ndarray) -> dict[str, Any]:
        """The stored cloud's frame, and for a cloud in a world-like frame (the world frame,
        the pose's frame, any frame above the base: go2_ros2_sdk's /point_cloud2 is a map
        chunk in odom, not a scan) its range tags measured from the robot's position there —
        left out when that position is unknown. A sensor-frame cloud keeps the ranges from
        its origin (core/stream_rows.py's default)."""
        frame = str(getattr(job.msg.header, "frame_id", "") or "").lstrip("/")
        if not frame:
            return {}
        tags: dict[str, Any] = {"frame": frame}
        p = self.poses
        pose_frame = job.pose.frame if job.pose is not None else None
        if frame not in (p.world_frame, pose_frame) and frame not in p.frames_above(p.base_frame):
            return tags
        robot: tuple[float, float] | None = None
        try:
            tr = p.buffer.lookup(frame, p.base_frame, job.lookup_t, p.tolerance_s)
            robot = (tr.x, tr.y)
        except TransformError:
            if job.pose is not None and frame == pose_frame:
                robot = (job.pose.x, job.pose.y)
        if robot is None:
            return tags | {"max_range": None, "mean_range": None}
        xy = np.asarray(pts, np.float64).reshape(-1, 3)[:, :2] - np.array(robot)
        ranges = np.hypot(xy[:, 0], xy[:, 1]) if len(xy) else np.zeros(1)
        return tags | {"max_range": round(float(ranges.max()), 3),
                       "mean_range": round(float(ranges.mean()), 3)}

    def _keep_scan(self, job: Job, pts: np.ndarray) -> None:
        """The lidar keyframe's points in the world (above the floor), for view ranges."""
        frame = getattr(job.msg.header, "frame_id", "")
        tr = self._frame_in_pose_frame(frame, job) if frame else None
        if tr is None or len(pts) == 0:
            return
        world = tr.apply(np.asarray(pts, np.float64))
        self.last_scan = (job.t, world[world[:, 2] > 0.05][:, :2])
