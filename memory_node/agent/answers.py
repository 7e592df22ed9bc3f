"""Turning the JSON contract into short lines an LLM reads and re-uses.

One result is one line: id, stream, time with its age, the place in the same words the spatial
parameters take (`x=` → `near_x`, `y=` → `near_y`), the score, the text and the tags:

    #42 camera 14:03:12 (5 min ago) at x=1.20 y=-0.40 heading=90° score=0.71 | bright scene;
    mostly red, white; one person | tags: brightness=0.82 person=true

Ages count from the memory's clock (passed in as `now`), so they are right under simulated
time; clock times are local time of day, with the date when it is not today.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from memory_node.core.types import Pose

__all__ = [
    "NO_RESULTS",
    "format_age",
    "format_clock",
    "format_heading",
    "format_place",
    "format_result",
    "format_results",
    "format_tags",
    "format_when",
]

NO_RESULTS = "No matching observations found."
MAX_TEXT_CHARS = 300
MAX_TAG_CHARS = 60


def format_heading(yaw: float) -> str:
    """Heading in whole degrees in (-180, 180], as the pose line writes it."""
    deg = math.degrees(yaw)
    deg = (deg + 180.0) % 360.0 - 180.0
    if deg <= -179.5:
        deg = 180.0
    return f"{round(deg):d}°"


def format_clock(t: float, now: float) -> str:
    """Local time of day, with the date when `t` is not on `now`'s day."""
    when = datetime.fromtimestamp(t)
    if when.date() == datetime.fromtimestamp(now).date():
        return when.strftime("%H:%M:%S")
    return when.strftime("%Y-%m-%d %H:%M:%S")


def format_age(t: float, now: float) -> str:
    """'just now', '12 s ago', '5 min ago', '2 h 5 min ago', '3 d ago' (or 'in …' ahead)."""
    delta = now - t
    ahead = delta < 0
    d = abs(delta)
    if d < 1.0:
        return "just now"
    if d < 60:
        text = f"{int(d)} s"
    elif d < 3600:
        text = f"{int(d // 60)} min"
    elif d < 86400:
        h, m = int(d // 3600), int(d % 3600 // 60)
        text = f"{h} h {m} min" if m else f"{h} h"
    else:
        text = f"{int(d // 86400)} d"
    return f"in {text}" if ahead else f"{text} ago"


def format_when(t: float, now: float) -> str:
    return f"{format_clock(t, now)} ({format_age(t, now)})"


def _xy(x: float, y: float) -> str:
    return f"x={x:.2f} y={y:.2f}"


def format_place(pose: Mapping[str, Any] | Pose | None, *, with_heading: bool = True) -> str:
    """'at x=1.20 y=-0.40 heading=90°' (frame named when not 'map'), or 'at an unknown place'."""
    if isinstance(pose, Pose):
        pose = pose.to_dict()
    if not pose or pose.get("x") is None or pose.get("y") is None:
        return "at an unknown place"
    out = f"at {_xy(float(pose['x']), float(pose['y']))}"
    if with_heading and pose.get("yaw") is not None:
        out += f" heading={format_heading(float(pose['yaw']))}"
    frame = pose.get("frame")
    if frame and frame != "map":
        out += f" frame={frame}"
    return out


def _scalar(key: str, value: Any, now: float) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if key.endswith("_t") and isinstance(value, (int, float)) and value > 1e8:
            return format_clock(float(value), now)  # a stamp (e.g. a folded note's last_t)
        if isinstance(value, float):
            if not math.isfinite(value):
                return str(value)
            return f"{value:.3f}".rstrip("0").rstrip(".") or "0"
        return str(value)
    text = str(value)
    if not text or any(c.isspace() or c in "|=\"," for c in text):
        text = json.dumps(text, ensure_ascii=False)
    return text


def format_tags(tags: Mapping[str, Any], now: float) -> str:
    """'brightness=0.82 colors=red,white person=true' (long values shortened)."""
    parts = []
    for key, value in tags.items():
        if isinstance(value, (list, tuple)):
            text = ",".join(_scalar(key, v, now) for v in value)
        elif isinstance(value, Mapping):
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        else:
            text = _scalar(key, value, now)
        if len(text) > MAX_TAG_CHARS:
            text = text[: MAX_TAG_CHARS - 1] + "…"
        parts.append(f"{key}={text}")
    return " ".join(parts)


def _one_line(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def format_result(result: Mapping[str, Any], now: float) -> str:
    """One search result (docs/design.md's JSON shape) as one line."""
    head = [f"#{result.get('id')}", str(result.get("stream"))]
    if result.get("robot"):  # a fleet's answer: which robot it was
        head.append(f"robot={result['robot']}")
    t = result.get("t")
    if isinstance(t, (int, float)):
        head.append(format_when(float(t), now))
    head.append(format_place(result.get("pose")))
    score = result.get("score")
    if isinstance(score, (int, float)):
        head.append(f"score={score:.2f}")
    parts = [" ".join(head)]
    text = result.get("text") or ""
    if text:
        parts.append(_one_line(str(text)))
    tags = result.get("tags") or {}
    if tags:
        parts.append("tags: " + format_tags(tags, now))
    return " | ".join(parts)


def format_results(results: Sequence[Mapping[str, Any]], now: float,
                   notes: Sequence[str] = ()) -> str:
    """Result lines, or NO_RESULTS; the engine's notes (e.g. 'k capped') follow in brackets."""
    lines = [format_result(r, now) for r in results] or [NO_RESULTS]
    lines.extend(f"({n})" for n in notes)
    return "\n".join(lines)
