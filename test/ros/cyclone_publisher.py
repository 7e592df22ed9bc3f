"""A robot's middleware stand-in: a plain Cyclone DDS participant (the `cyclonedds` Python
binding and the Cyclone DDS library it bundles, no ROS) publishing `/odom` and `/tf` as a Go2
does. ROS 2 topics are DDS topics named `rt/<name>`, of types named
`<package>::msg::dds_::<Type>_`, encoded as classic CDR; the structs below follow the
messages' definitions field by field.

    CYCLONEDDS_URI=file://cyclone.xml python cyclone_publisher.py COUNT

Waits (up to 60 s) until both writers are matched by a subscriber, says so, then publishes
COUNT messages at 10 Hz: the robot drives +x at 1 m/s in `odom` (odom -> base_link on /tf and
on /odom), with map -> odom offset by (1, 2) on /tf. Each line it prints is one fact.
"""

# No `from __future__ import annotations`: cyclonedds.idl reads the field types at run time.
import os
import sys
import time
from dataclasses import dataclass, field

from cyclonedds.domain import DomainParticipant
from cyclonedds.idl import IdlStruct
from cyclonedds.idl.types import array, float64, int32, sequence, uint32
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.topic import Topic
from cyclonedds.util import duration


@dataclass
class Time(IdlStruct, typename="builtin_interfaces::msg::dds_::Time_"):
    sec: int32 = 0
    nanosec: uint32 = 0


@dataclass
class Header(IdlStruct, typename="std_msgs::msg::dds_::Header_"):
    stamp: Time = field(default_factory=Time)
    frame_id: str = ""


@dataclass
class Vector3(IdlStruct, typename="geometry_msgs::msg::dds_::Vector3_"):
    x: float64 = 0.0
    y: float64 = 0.0
    z: float64 = 0.0


@dataclass
class Point(IdlStruct, typename="geometry_msgs::msg::dds_::Point_"):
    x: float64 = 0.0
    y: float64 = 0.0
    z: float64 = 0.0


@dataclass
class Quaternion(IdlStruct, typename="geometry_msgs::msg::dds_::Quaternion_"):
    x: float64 = 0.0
    y: float64 = 0.0
    z: float64 = 0.0
    w: float64 = 1.0


@dataclass
class Pose(IdlStruct, typename="geometry_msgs::msg::dds_::Pose_"):
    position: Point = field(default_factory=Point)
    orientation: Quaternion = field(default_factory=Quaternion)


@dataclass
class PoseWithCovariance(IdlStruct, typename="geometry_msgs::msg::dds_::PoseWithCovariance_"):
    pose: Pose = field(default_factory=Pose)
    covariance: array[float64, 36] = field(default_factory=lambda: [0.0] * 36)


@dataclass
class Twist(IdlStruct, typename="geometry_msgs::msg::dds_::Twist_"):
    linear: Vector3 = field(default_factory=Vector3)
    angular: Vector3 = field(default_factory=Vector3)


@dataclass
class TwistWithCovariance(IdlStruct,
                          typename="geometry_msgs::msg::dds_::TwistWithCovariance_"):
    twist: Twist = field(default_factory=Twist)
    covariance: array[float64, 36] = field(default_factory=lambda: [0.0] * 36)


@dataclass
class Odometry(IdlStruct, typename="nav_msgs::msg::dds_::Odometry_"):
    header: Header = field(default_factory=Header)
    child_frame_id: str = ""
    pose: PoseWithCovariance = field(default_factory=PoseWithCovariance)
    twist: TwistWithCovariance = field(default_factory=TwistWithCovariance)


@dataclass
class Transform(IdlStruct, typename="geometry_msgs::msg::dds_::Transform_"):
    translation: Vector3 = field(default_factory=Vector3)
    rotation: Quaternion = field(default_factory=Quaternion)


@dataclass
class TransformStamped(IdlStruct, typename="geometry_msgs::msg::dds_::TransformStamped_"):
    header: Header = field(default_factory=Header)
    child_frame_id: str = ""
    transform: Transform = field(default_factory=Transform)


@dataclass
class TFMessage(IdlStruct, typename="tf2_msgs::msg::dds_::TFMessage_"):
    transforms: sequence[TransformStamped] = field(default_factory=list)


def stamp(t: float) -> Time:
    return Time(int(t), int(round((t % 1.0) * 1e9)) % 1_000_000_000)


def main(count: int) -> int:
    participant = DomainParticipant(int(os.environ.get("ROS_DOMAIN_ID", "0")))
    # ROS 2's defaults for these topics: reliable, volatile, keep last; classic CDR (XCDR1).
    qos = Qos(Policy.Reliability.Reliable(max_blocking_time=duration(milliseconds=100)),
              Policy.History.KeepLast(50),
              Policy.DataRepresentation(use_cdrv0_representation=True))
    odom = DataWriter(participant, Topic(participant, "rt/odom", Odometry), qos=qos)
    tf = DataWriter(participant, Topic(participant, "rt/tf", TFMessage), qos=qos)
    deadline = time.monotonic() + 60
    while not (odom.get_matched_subscriptions() and tf.get_matched_subscriptions()):
        if time.monotonic() > deadline:
            print("no subscriber matched /odom and /tf within 60 s", flush=True)
            return 1
        time.sleep(0.1)
    print("matched /odom and /tf", flush=True)
    time.sleep(0.5)  # the other side's reader matches our writer in its own time
    t0 = time.time()
    for i in range(count):
        t, x = t0 + i * 0.1, i * 0.1
        header = Header(stamp(t), "odom")
        tf.write(TFMessage([
            TransformStamped(Header(stamp(t), "map"), "odom",
                             Transform(Vector3(1.0, 2.0, 0.0))),
            TransformStamped(header, "base_link", Transform(Vector3(x, 0.0, 0.0)))]))
        odom.write(Odometry(header, "base_link",
                            PoseWithCovariance(Pose(Point(x, 0.0, 0.0))),
                            TwistWithCovariance(Twist(Vector3(1.0, 0.0, 0.0)))))
        time.sleep(max(0.0, t0 + (i + 1) * 0.1 - time.time()))
    odom.wait_for_acks(duration(seconds=5))
    tf.wait_for_acks(duration(seconds=5))
    print(f"published {count}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 40))
