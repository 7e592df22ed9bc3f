"""`memory-export --mcap OUT`: a robot's memory as an MCAP file that Foxglove opens.

Each stored row becomes a message at the row's own time (the MCAP log time), in Foxglove's
schemas, so Foxglove's timeline plays the memory back as the robot built it:

  /memory/tf              foxglove.FrameTransforms  <pose frame> -> base_link at every posed row,
                                                    and -> <stream> (the camera, optical axes) at
                                                    each camera keyframe: its image's frame
  /memory/trajectory      foxglove.PosesInFrame     every pose of the window, one message per
                                                    pose frame, at the window's first time
  /memory/keyframes       foxglove.PosesInFrame     where each camera keyframe was taken (idem)
  /memory/<stream>/image  foxglove.CompressedImage  each camera keyframe: its stored JPEG
  /memory/<stream>/points foxglove.PointCloud       each lidar keyframe: its stored points
  /memory/notes           foxglove.Log              each note (events, summaries)
  /memory/notes/labels    foxglove.SceneUpdate      each note with a pose: a text label there
  /memory/places          foxglove.SceneUpdate      the named places: a disc of their radius
                                                    and the name, at the window's first time

It reads the memory directory through the core's store and notes (no ROS, no models, so a
robot's live store can be exported while memory-node records), and writes OUT whole or not at
all (a temporary file renamed at the end).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from memory_node.agent.source_args import memory_dir_of
from memory_node.core.config import NOTE_STREAMS, MemoryConfig
from memory_node.core.contract import iso_seconds
from memory_node.core.types import Observation, Pose, RowFilter, View

BASE_FRAME = "base_link"  # the child of every pose transform (the store keeps no frame name)
TF_TOPIC = "/memory/tf"
TRAJECTORY_TOPIC = "/memory/trajectory"
KEYFRAMES_TOPIC = "/memory/keyframes"
NOTES_TOPIC = "/memory/notes"
NOTE_LABELS_TOPIC = "/memory/notes/labels"
PLACES_TOPIC = "/memory/places"
IMAGE_FORMATS = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png", ".webp": "webp"}
POINTS_SUFFIX = ".npy"  # a lidar keyframe's points: float32 (n, 3), written by np.save
DEFAULT_FRAME = "map"  # for a place named without a pose frame


def image_topic(stream: str) -> str:
    return f"/memory/{stream}/image"


def points_topic(stream: str) -> str:
    return f"/memory/{stream}/points"


class ExportError(Exception):
    """A memory or an output that cannot be exported: one line for the user, and the exit
    status: 2 for input that cannot be used, 1 for nothing to export or a failed write."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def parse_time(name: str, text: str) -> float:
    """--after / --before: seconds since the epoch, or an ISO-8601 time (UTC when no zone),
    as the search contract's `after` and `before` take them."""
    try:
        value = float(text)
    except ValueError:
        try:
            value = iso_seconds(text)
        except ValueError:
            raise ExportError(f"{name} must be seconds since the epoch or an ISO-8601 time, "
                              f"got {text[:64]!r}") from None
    if not math.isfinite(value):
        raise ExportError(f"{name} must be a finite time, got {text[:64]!r}")
    return value


@dataclass
class ExportSummary:
    """What went into the file: messages per topic, rows passed over, the window covered."""

    out: Path
    messages: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)  # "<stream> blob missing" -> rows
    first_t: float = 0.0
    last_t: float = 0.0
    rows: int = 0
    places: int = 0

    def line(self) -> str:
        m = self.messages
        images = sum(n for t, n in m.items() if t.endswith("/image"))
        clouds = sum(n for t, n in m.items() if t.endswith("/points"))
        parts = [f"{images} images", f"{clouds} point clouds", f"{m[NOTES_TOPIC]} notes",
                 f"{m[TF_TOPIC]} poses"]
        size = self.out.stat().st_size if self.out.exists() else 0
        line = (f"memory-export: wrote {self.out} ({size / 1e6:.1f} MB) from {self.rows} rows, "
                f"{_iso(self.first_t)} .. {_iso(self.last_t)}: {', '.join(parts)}, "
                f"{self.places} places")
        if self.skipped:
            line += "; skipped: " + ", ".join(f"{n} {why}" for why, n in
                                                sorted(self.skipped.items()))
        return line


def _iso(t: float) -> str:
    try:
        return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):  # beyond the calendar: say the number
        return f"{t:g} s since the epoch"


def _ns(t: float) -> int:
    """A row's time as MCAP's log time: nanoseconds since the epoch, to the microsecond (a
    float64 epoch time holds no finer digits), never negative."""
    return max(0, round(t * 1_000_000) * 1000)


def open_memory(memory_dir: Path) -> tuple[Any, MemoryConfig]:
    """The store of an existing memory directory; never creates one."""
    cfg = MemoryConfig.from_mapping({"memory_dir": str(memory_dir)})
    if not cfg.root.is_dir():
        raise ExportError(f"no memory directory at {cfg.root}")
    if not cfg.db_path.is_file():
        raise ExportError(f"{cfg.root} holds no memory (no {cfg.db_path.name})")
    from memory_node.core.store.sqlite_store import SqliteObservationStore

    try:
        return SqliteObservationStore(cfg.db_path), cfg
    except Exception as exc:  # noqa: BLE001 - a newer schema, a corrupt or locked file
        raise ExportError(f"cannot read {cfg.db_path}: {exc}") from None


def check_output(out: Path) -> None:
    """OUT must be a file we may create or replace: checked before anything is read."""
    if out.is_dir():
        raise ExportError(f"{out} is a directory; give the file to write, e.g. {out}/memory.mcap")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise ExportError(f"cannot write {out}: no directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ExportError(f"cannot write {out}: permission denied")


def export_mcap(memory_dir: Path, out: Path, *, t_min: float | None = None,
                t_max: float | None = None) -> ExportSummary:
    """Write the rows of `memory_dir` with t_min <= t <= t_max (both inclusive, as a search's
    `after` / `before`) and its named places to `out`. Raises ExportError."""
    if t_min is not None and t_max is not None and t_min > t_max:
        raise ExportError(f"--after ({_iso(t_min)}) is later than --before ({_iso(t_max)})")
    out = Path(out)
    check_output(out)
    store, cfg = open_memory(Path(memory_dir))
    try:
        total = store.count()
        if total == 0:
            raise ExportError(f"nothing to export: the memory at {cfg.root} holds no rows",
                              status=1)
        rows = store.ordered(RowFilter(t_min=t_min, t_max=t_max), "time", total)
        views = store.views_of([r.id for r in rows if r.id is not None
                                and _image_format(r) is not None])
    finally:
        store.close()
    if not rows:
        window = (f"{_iso(t_min) if t_min is not None else 'the start'} and "
                  f"{_iso(t_max) if t_max is not None else 'the end'}")
        raise ExportError(f"nothing to export: no rows between {window} (the memory at "
                          f"{cfg.root} holds {total} rows outside that window)", status=1)
    from memory_node.core.notes import NotesLog
    from memory_node.core.places import Places

    places = Places(NotesLog(cfg.notes_dir)).all() if cfg.notes_dir.is_dir() else []
    summary = ExportSummary(out=out, first_t=rows[0].t, last_t=rows[-1].t, rows=len(rows),
                            places=len(places))
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        sink = _Sink(tmp)
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from None
    try:
        with _Interrupts() as stop:
            _write(sink, cfg, rows, views, places, summary, t_min, t_max, stop)
            sink.finish()
            os.replace(tmp, out)
    except BaseException as exc:  # a full disk, a write error, Ctrl-C: nothing left behind
        sink.abandon()
        if isinstance(exc, OSError):
            raise ExportError(f"cannot write {out}: {exc.strerror or exc}", status=1) from None
        if isinstance(exc, Exception) and not isinstance(exc, ExportError):
            raise ExportError(f"writing {out} failed: {exc}", status=1) from None
        raise
    return summary


class _Interrupts:
    """SIGINT and SIGTERM only note that the user wants to stop while the file is written:
    raised inside the writer's own calls back into Python, the interrupt would break the
    writer midway (a stream of errors, not a stop); the export checks after each row and
    stops there, leaving no file. Off the main thread (a library caller) nothing changes."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        self.requested = True

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class _Sink:
    """The temporary file the MCAP writer writes to. The writer only logs a failed write and
    goes on; so the first failure is kept here, later writes are dropped (the file is thrown
    away), and the export stops at the next row with the failure's own words."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "xb")  # noqa: SIM115 - closed by finish() or abandon()
        self.failure: OSError | None = None
        self.pos = 0  # where the writer believes it is, failed or not
        self.size = 0

    def write(self, data: bytes | bytearray) -> int:
        if self.failure is None:
            try:
                self.file.write(data)
            except OSError as exc:
                self.failure = exc
        self.pos += len(data)
        self.size = max(self.size, self.pos)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset + (0, self.pos, self.size)[whence]
        if self.failure is None:
            try:
                self.file.seek(self.pos)
            except OSError as exc:
                self.failure = exc
        return self.pos

    def flush(self) -> None:
        if self.failure is None:
            try:
                self.file.flush()
            except OSError as exc:
                self.failure = exc

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def finish(self) -> None:
        """Everything on disk (flushed, fsynced) before the file takes OUT's name."""
        self.check()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()

    def abandon(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass  # the failure being reported already says what went wrong
        self.path.unlink(missing_ok=True)


# ---- writing ------------------------------------------------------------------------------
class _Channels:
    """The file's channels, each made when its first message comes (a topic that has none
    is not in the file), and the count of what each logged."""

    def __init__(self, ctx: Any, summary: ExportSummary):
        from foxglove import channels

        self.ctx = ctx
        self.kinds = channels
        self.summary = summary
        self.open: dict[str, Any] = {}

    def log(self, topic: str, kind: str, msg: Any, t: float) -> None:
        if topic not in self.open:
            self.open[topic] = getattr(self.kinds, f"{kind}Channel")(topic, context=self.ctx)
        self.open[topic].log(msg, log_time=_ns(t))
        self.summary.messages[topic] += 1


def _write(sink: _Sink, cfg: MemoryConfig, rows: Sequence[Observation], views: dict[int, View],
           places: Sequence[Any], summary: ExportSummary, t_min: float | None,
           t_max: float | None, stop: _Interrupts) -> None:
    import foxglove

    ctx = foxglove.Context()  # this export's channels only, not the process's global ones
    writer = foxglove.open_mcap(sink, context=ctx)
    try:
        out = _Channels(ctx, summary)
        t0 = rows[0].t
        if places:
            out.log(PLACES_TOPIC, "SceneUpdate", _places_update(places, _main_frame(rows), t0),
                    t0)
        keyframes = [r for r in rows if _image_format(r) is not None]
        for topic, posed in ((TRAJECTORY_TOPIC, rows), (KEYFRAMES_TOPIC, keyframes)):
            for msg in _poses_by_frame(posed, t0):
                out.log(topic, "PosesInFrame", msg, t0)
        for row in rows:
            _write_row(out, cfg.root, row, views.get(row.id) if row.id is not None else None)
            sink.check()
            stop.check()
        writer.write_metadata("memory_node", {
            "memory_dir": str(cfg.root.resolve()),
            "after": "" if t_min is None else repr(t_min),
            "before": "" if t_max is None else repr(t_max),
            "rows": str(len(rows)), "first_t": repr(rows[0].t), "last_t": repr(rows[-1].t),
            "base_frame": BASE_FRAME})
    finally:
        writer.close()
    sink.check()


def _write_row(out: _Channels, root: Path, row: Observation, view: View | None) -> None:
    """One row's messages, all at its time: its pose, then its image, points or note."""
    transforms = _transforms(row, view)
    if transforms is not None:
        out.log(TF_TOPIC, "FrameTransforms", transforms, row.t)
    fmt = _image_format(row)
    if fmt is not None:
        data = _blob(root, row, out.summary)
        if data is not None:
            out.log(image_topic(row.stream), "CompressedImage", _image(row, data, fmt), row.t)
    elif row.ref is not None and row.ref.endswith(POINTS_SUFFIX):
        cloud = _cloud(root, row, out.summary)
        if cloud is not None:
            out.log(points_topic(row.stream), "PointCloud", cloud, row.t)
    elif row.stream in NOTE_STREAMS:
        out.log(NOTES_TOPIC, "Log", _log(row), row.t)
        if row.pose is not None:
            out.log(NOTE_LABELS_TOPIC, "SceneUpdate", _note_label(row), row.t)


def _image_format(row: Observation) -> str | None:
    if row.ref is None:
        return None
    return IMAGE_FORMATS.get(os.path.splitext(row.ref)[1].lower())


def _blob(root: Path, row: Observation, summary: ExportSummary) -> bytes | None:
    """A row's blob, or None (counted) when it is gone or its reference leaves the memory
    directory (a hand-edited database: refs are relative paths under blobs/)."""
    ref = row.ref
    assert ref is not None
    if os.path.isabs(ref) or ".." in ref.replace("\\", "/").split("/"):
        summary.skipped[f"{row.stream} blobs outside the memory"] += 1
        return None
    try:
        with open(os.path.join(root, ref), "rb") as f:
            return f.read()
    except OSError:
        summary.skipped[f"{row.stream} blobs missing"] += 1
        return None


def read_points(data: bytes) -> np.ndarray:
    """A lidar keyframe's stored points (core/ingest.py: np.save of float32 (n, 3))."""
    pts = np.load(io.BytesIO(data), allow_pickle=False)
    if pts.ndim != 2 or pts.shape[1] != 3:
        raise ValueError(f"points of shape {pts.shape}, not (n, 3)")
    return np.ascontiguousarray(pts, dtype="<f4")


def _stamp(t: float) -> Any:
    from foxglove.messages import Timestamp

    ns = _ns(t)
    return Timestamp(ns // 1_000_000_000, ns % 1_000_000_000)


def _quaternion(yaw: float) -> Any:
    from foxglove.messages import Quaternion

    return Quaternion(x=0.0, y=0.0, z=math.sin(yaw / 2), w=math.cos(yaw / 2))


def _frame(pose: Pose) -> str:
    return pose.frame or DEFAULT_FRAME


def _main_frame(rows: Iterable[Observation]) -> str:
    """The pose frame most rows are in: where places named without a frame are drawn."""
    frames = Counter(_frame(r.pose) for r in rows if r.pose is not None)
    return frames.most_common(1)[0][0] if frames else DEFAULT_FRAME


def _pose(x: float, y: float, z: float = 0.0, yaw: float = 0.0) -> Any:
    from foxglove.messages import Pose as FoxglovePose
    from foxglove.messages import Vector3

    return FoxglovePose(position=Vector3(x=float(x), y=float(y), z=float(z)),
                        orientation=_quaternion(yaw))


# The optical convention of a camera frame (z forward, x right, y down) in a body frame
# (x forward, y left, z up): the rotation every camera keyframe's frame adds to its heading.
_OPTICAL = (-0.5, 0.5, -0.5, 0.5)  # x, y, z, w


def _camera_rotation(yaw: float) -> Any:
    from foxglove.messages import Quaternion

    z, w = math.sin(yaw / 2), math.cos(yaw / 2)
    ox, oy, oz, ow = _OPTICAL
    # (0, 0, z, w) * (ox, oy, oz, ow), Hamilton product
    return Quaternion(x=w * ox - z * oy, y=w * oy + z * ox, z=w * oz + z * ow,
                      w=w * ow - z * oz)


def _transforms(row: Observation, view: View | None) -> Any:
    """<pose frame> -> base_link at a posed row; for a camera keyframe also <pose frame> ->
    <stream>, the camera where it stood (its stored view, else the base), in the optical
    convention its image's frame_id names."""
    from foxglove.messages import FrameTransform, FrameTransforms, Vector3

    pose = row.pose
    if pose is None:
        return None
    stamp = _stamp(row.t)
    out = [FrameTransform(timestamp=stamp, parent_frame_id=_frame(pose), child_frame_id=BASE_FRAME,
                          translation=Vector3(x=pose.x, y=pose.y, z=pose.z),
                          rotation=_quaternion(pose.yaw))]
    if _image_format(row) is not None:
        x, y, yaw = (view.x, view.y, view.yaw) if view is not None else (pose.x, pose.y, pose.yaw)
        out.append(FrameTransform(timestamp=stamp, parent_frame_id=_frame(pose),
                                  child_frame_id=row.stream,
                                  translation=Vector3(x=x, y=y, z=pose.z),
                                  rotation=_camera_rotation(yaw)))
    return FrameTransforms(transforms=out)


def _poses_by_frame(rows: Iterable[Observation], t: float) -> list[Any]:
    from foxglove.messages import PosesInFrame

    by_frame: dict[str, list[Any]] = {}
    for r in rows:
        if r.pose is not None:
            p = r.pose
            by_frame.setdefault(_frame(p), []).append(_pose(p.x, p.y, p.z, p.yaw))
    return [PosesInFrame(timestamp=_stamp(t), frame_id=frame, poses=poses)
            for frame, poses in by_frame.items()]


def _image(row: Observation, data: bytes, fmt: str) -> Any:
    from foxglove.messages import CompressedImage

    return CompressedImage(timestamp=_stamp(row.t), frame_id=row.stream, data=data, format=fmt)


def _cloud(root: Path, row: Observation, summary: ExportSummary) -> Any:
    """A lidar row's points. A cloud stored in its pose's frame (a map chunk) stays there; a
    sensor-frame cloud is drawn from the robot's base, since the store keeps no mount."""
    from foxglove.messages import (
        PackedElementField,
        PackedElementFieldNumericType,
        PointCloud,
    )

    data = _blob(root, row, summary)
    if data is None:
        return None
    try:
        pts = read_points(data)
    except (ValueError, OSError) as exc:
        summary.skipped[f"{row.stream} blobs unreadable ({exc})"] += 1
        return None
    stored = str(row.tags.get("frame") or "")
    frame = stored if row.pose is not None and stored == row.pose.frame else BASE_FRAME
    f32 = PackedElementFieldNumericType.Float32
    return PointCloud(timestamp=_stamp(row.t), frame_id=frame, pose=_pose(0.0, 0.0),
                      point_stride=12, data=pts.tobytes(),
                      fields=[PackedElementField(name=n, offset=4 * i, type=f32)
                              for i, n in enumerate("xyz")])


def _log(row: Observation) -> Any:
    from foxglove.messages import Log, LogLevel

    return Log(timestamp=_stamp(row.t), level=LogLevel.Info, message=row.text, name=row.stream)


NOTE_COLOUR = (0.86, 0.12, 0.12)
PLACE_COLOUR = (0.1, 0.45, 0.85)


def _colour(rgb: tuple[float, float, float], a: float) -> Any:
    from foxglove.messages import Color

    return Color(r=rgb[0], g=rgb[1], b=rgb[2], a=a)


def _label(x: float, y: float, z: float, text: str, rgb: tuple[float, float, float]) -> Any:
    from foxglove.messages import TextPrimitive

    return TextPrimitive(pose=_pose(x, y, z), billboard=True, font_size=14.0,
                         scale_invariant=True, color=_colour(rgb, 1.0), text=text)


def _note_label(row: Observation) -> Any:
    from foxglove.messages import SceneEntity, SceneUpdate, SpherePrimitive, Vector3

    p = row.pose
    assert p is not None
    text = row.text if len(row.text) <= 80 else row.text[:79] + "…"
    marker = SpherePrimitive(pose=_pose(p.x, p.y, p.z + 0.3), size=Vector3(x=0.2, y=0.2, z=0.2),
                             color=_colour(NOTE_COLOUR, 0.9))
    return SceneUpdate(entities=[SceneEntity(
        timestamp=_stamp(row.t), frame_id=_frame(p), id=f"note-{row.id}",
        spheres=[marker], texts=[_label(p.x, p.y, p.z + 0.6, text, NOTE_COLOUR)])])


def _places_update(places: Sequence[Any], default_frame: str, t: float) -> Any:
    from foxglove.messages import CylinderPrimitive, SceneEntity, SceneUpdate, Vector3

    entities = []
    for place in places:
        disc = CylinderPrimitive(pose=_pose(place.x, place.y, 0.01),
                                 size=Vector3(x=2 * place.radius, y=2 * place.radius, z=0.02),
                                 bottom_scale=1.0, top_scale=1.0,
                                 color=_colour(PLACE_COLOUR, 0.25))
        entities.append(SceneEntity(
            timestamp=_stamp(t), frame_id=place.frame or default_frame, id=f"place-{place.name}",
            cylinders=[disc],
            texts=[_label(place.x, place.y, 0.3, f"{place.name} ({place.radius:g} m)",
                          PLACE_COLOUR)]))
    return SceneUpdate(entities=entities)


# ---- the command --------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-export", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Open OUT in Foxglove (File > Open local file, or drop it on the window); set the "
               "3D panel's display frame to the pose frame (map). Exit status: 0 when OUT was "
               "written, 1 when there was nothing to export or writing failed, 2 for a memory "
               "directory, time or OUT that cannot be used, 130 when interrupted; OUT is "
               "written whole or left as it was.")
    parser.add_argument("--mcap", type=Path, required=True, metavar="OUT",
                        help="the MCAP file to write (replaced when it exists)")
    parser.add_argument("--memory-dir", metavar="D",
                        help="the memory to export (default: $AGENT_MEMORY_DIR, else "
                        "./agent_memory)")
    parser.add_argument("--after", metavar="T",
                        help="only rows at or after T: seconds since the epoch or an ISO-8601 "
                        "time (UTC when it names no zone), as a search's 'after'")
    parser.add_argument("--before", metavar="T",
                        help="only rows at or before T (the same forms)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        t_min = None if args.after is None else parse_time("--after", args.after)
        t_max = None if args.before is None else parse_time("--before", args.before)
        memory_dir = memory_dir_of(args)
    except (ExportError, ValueError) as exc:
        print(f"memory-export: {exc}", file=sys.stderr)
        return 2
    try:
        summary = export_mcap(memory_dir, args.mcap, t_min=t_min, t_max=t_max)
    except ExportError as exc:
        print(f"memory-export: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print(f"memory-export: interrupted; {args.mcap} not written", file=sys.stderr)
        return 130
    print(summary.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
