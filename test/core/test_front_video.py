"""The Go2's front video (unitree_ros2's Go2FrontVideoData) decoded in memory: payloads sniffed
as H.264 Annex-B or JPEG, a late join skipped to the first keyframe and counted, a bad payload
counted and passed over, and pixels made only for the frames the keyframe gate keeps. Real
libx264 streams (PyAV), real decoding, the real recorder policy and engine."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import numpy as np
import pytest
from engine_support import make_engine

from memory_node.core.front_video import (
    FRONT_VIDEO,
    IDR,
    FrontVideoDecoder,
    FrontVideoError,
    FrontVideoReceiver,
    nal_types,
    register_rosbags_type,
    sniff,
)
from memory_node.core.recorder import RecorderPolicy
from memory_node.core.recorder_settings import recorder_settings
from memory_node.sim.front_video import FrontVideoWriter

W, H, GOP = 160, 120, 10
T0 = 1_764_460_800.0


def picture(i: int) -> np.ndarray:
    """A frame with a bright block that moves and a grey level that changes."""
    img = np.full((H, W, 3), 40 + (i * 7) % 150, np.uint8)
    img[30:70, (4 * i) % (W - 40):(4 * i) % (W - 40) + 40] = (250, 120, 10)
    return img


def stream(n: int, codec: str = "h264") -> list[tuple[NS, np.ndarray]]:
    writer = FrontVideoWriter(W, H, 15.0, codec, gop=GOP)
    out = []
    for i in range(n):
        img = picture(i)
        p = writer.payloads(img)
        out.append((NS(time_frame=i, video720p=p["720p"], video360p=p["360p"],
                       video180p=p["180p"]), img))
    return out


def test_sniffing_tells_jpeg_from_annex_b_and_neither():
    assert sniff(b"\xff\xd8\xff\xe0rest") == "jpeg"
    assert sniff(b"\x00\x00\x00\x01\x67") == sniff(b"\x00\x00\x01\x67") == "h264"
    assert sniff(b"") is None and sniff(b"\x00\x00\x00\x18ftyp") is None


def test_a_stream_joined_mid_gop_skips_to_the_first_idr_and_counts_the_skips():
    msgs = stream(3 * GOP)
    assert IDR in nal_types(msgs[0][0].video720p) and IDR in nal_types(msgs[GOP][0].video720p)
    assert IDR not in nal_types(msgs[3][0].video720p)
    dec = FrontVideoDecoder("720p")
    got = [dec.decode(m) for m, _ in msgs[3:]]  # joined 3 frames into the first GOP
    skipped = GOP - 3
    assert all(p is None for p in got[:skipped])
    assert all(p is not None for p in got[skipped:])
    c = dec.counters
    assert (c.skipped_until_keyframe, c.decoded, c.failed) == (skipped, 2 * GOP, 0)
    # the decoded pictures are the frames sent, at the selected resolution
    for p, (_, img) in zip(got[skipped:], msgs[GOP:], strict=True):
        assert p.size == (W, H)
        assert np.abs(p.to_bgr().astype(int) - img.astype(int)).mean() < 6
    assert c.converted == 2 * GOP


def test_the_resolution_picks_the_field():
    msgs = stream(GOP)
    dec = FrontVideoDecoder("180p")
    pics = [dec.decode(m) for m, _ in msgs]
    assert pics[0].to_bgr().shape == (H // 4, W // 4, 3)
    with pytest.raises(ValueError, match="front_video_resolution"):
        FrontVideoDecoder("1080p")


def test_jpeg_payloads_decode():
    msgs = stream(4, "jpeg")
    assert sniff(msgs[0][0].video720p) == "jpeg"
    dec = FrontVideoDecoder("720p")
    for m, img in msgs:
        p = dec.decode(m)
        assert p.codec == "jpeg" and p.time_frame == m.time_frame
        assert np.abs(p.to_bgr().astype(int) - img.astype(int)).mean() < 6
        assert p.gray().shape == (H // 4, W // 4)  # the gate's reduced decode
    assert dec.counters.skipped_until_keyframe == 0 and dec.counters.decoded == 4


def test_garbage_and_broken_payloads_are_counted_failed_and_decoding_goes_on():
    msgs = stream(2 * GOP)
    dec = FrontVideoDecoder("720p")
    assert dec.decode(msgs[0][0]) is not None
    for junk in (b"", b"\x12\x34\x56\x78garbage"):
        with pytest.raises(FrontVideoError, match="neither JPEG nor H.264"):
            dec.decode(NS(time_frame=0, video720p=junk, video360p=b"", video180p=b""))
    assert dec.decode(msgs[1][0]) is not None  # an unknown payload never reached the decoder
    # an access unit that claims H.264 but is truncated rubbish: failed, then wait for an IDR
    broken = b"\x00\x00\x00\x01\x41" + bytes(range(7, 200, 3))
    try:
        out = dec.decode(NS(time_frame=0, video720p=broken, video360p=b"", video180p=b""))
    except FrontVideoError:
        out = None
    later = [dec.decode(m) for m, _ in msgs[2:]]
    assert later[-1] is not None and dec.counters.decoded >= GOP
    assert dec.counters.failed >= 2
    assert out is None or out.size == (W, H)


def test_only_frames_the_gate_keeps_are_converted_to_pixels(tmp_path):
    """A unitree_ros2-like recording through the recorder's policy offline: odometry with zero
    stamps, the front video joined mid-GOP. Camera rows are the admitted frames, and pixels
    were made for those only (the gate's view test reads the luma plane)."""
    engine = make_engine(tmp_path / "mem")
    try:
        policy = RecorderPolicy.offline({"tf_wait_s": 0.5, "min_distance": 0.5,
                                         "camera_mount_x": 0.33, "camera_hfov_deg": 73.0,
                                         "front_video_topic": "/frontvideostream"}, engine)
        said: list[str] = []
        receiver = FrontVideoReceiver("720p", policy.count, said.append)
        assert receiver.stats() == {}  # nothing to say before a mid-GOP join
        msgs = stream(90)
        for i, (m, _) in enumerate(msgs[4:], start=4):
            t = T0 + i / 15.0
            x = 0.8 * i / 15.0
            policy.on_odom(NS(header=NS(stamp=NS(sec=0, nanosec=0), frame_id="odom"),
                              child_frame_id="base_link",
                              pose=NS(pose=NS(position=NS(x=x, y=0.0, z=0.0),
                                              orientation=NS(x=0.0, y=0.0, z=0.0, w=1.0))),
                              twist=NS(twist=NS(linear=NS(x=0.8, y=0.0, z=0.0)))),
                           arrived_s=t)
            pic = receiver.picture(m)
            if pic is not None:
                policy.on_message("camera", pic, arrived_s=t + 0.01, kind=FRONT_VIDEO.kind)
        policy.flush()
        c, dec = policy.counters["camera"], receiver.decoder.counters
        assert dec.skipped_until_keyframe == GOP - 4
        assert receiver.stats() == {"skipped_until_keyframe": GOP - 4}
        assert c.received == 86 and c.stored >= 5
        assert c.received == c.skipped + c.stored + c.failed
        assert dec.converted == c.stored < dec.decoded / 3
        answer = engine.ask_search(json.dumps({"stream": "camera", "k": 100,
                                               "order_by": "time"})).model_dump()
        rows = answer["results"]
        assert len(rows) == c.stored
        assert all(r["pose"]["frame"] == "odom" for r in rows)
        assert any("mid-stream" in s for s in said) and any("H264" in s for s in said)
        # poses where the robot was (stamped on arrival: no header)
        for r in rows:
            assert r["pose"]["x"] == pytest.approx(0.8 * (r["t"] - T0), abs=0.1)
    finally:
        engine.close()


def test_the_parameters_and_the_bag_type():
    cfg = recorder_settings({"front_video_topic": "frontvideostream", "robot_prefix": "go2"})
    assert cfg["front_video_topic"] == "/go2/frontvideostream"
    assert recorder_settings()["front_video_topic"] == ""
    assert recorder_settings()["front_video_resolution"] == "720p"
    with pytest.raises(ValueError, match="720p, 360p, 180p"):
        recorder_settings({"front_video_resolution": "4k"})
    from rosbags.typesys import Stores, get_typestore

    ts = register_rosbags_type(get_typestore(Stores.ROS2_KILTED))
    cls = ts.types["unitree_go/msg/Go2FrontVideoData"]
    msg = cls(7, np.frombuffer(b"\x00\x00\x00\x01\x65", np.uint8), np.zeros(0, np.uint8),
              np.zeros(0, np.uint8))
    raw = ts.serialize_cdr(msg, "unitree_go/msg/Go2FrontVideoData")
    back = ts.deserialize_cdr(raw, "unitree_go/msg/Go2FrontVideoData")
    assert back.time_frame == 7 and bytes(back.video720p) == b"\x00\x00\x00\x01\x65"
