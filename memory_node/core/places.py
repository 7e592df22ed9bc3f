"""Named places ("this is the kitchen"): kept in the Markdown notes like every other note.

A place is a note entry in stream `places`; its tags hold the name, the point and the radius.
The newest entry of a name wins (naming a place again moves or resizes it), and an entry
tagged `"removed": true` removes the name. So places survive restarts, a person can read and
edit them in the notes files, and a rename is "name the point anew, remove the old name"::

    ## 07:20:12.250 UTC · places · n-3f2a9c1b7d4e
    - t: 1764487212.250000
    - pose: x=1.2000 y=-0.4000 z=0.0000 yaw=1.5700 frame=map source=tf
    - tags: {"frame": "map", "place": "kitchen", "radius": 2.0, "x": 1.2, "y": -0.4}

    > Place 'kitchen': x=1.20, y=-0.40, radius 2 m.

The registry re-reads the notes files only when one of them changed (size or mtime), so
another process that names a place on the same directory is seen at the next lookup.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

from memory_node.core.notes import NoteEntry, NotesLog, new_key
from memory_node.core.types import Pose

PLACES_STREAM = "places"
MAX_NAME_CHARS = 80


@dataclass(frozen=True)
class Place:
    name: str
    x: float
    y: float
    radius: float
    frame: str | None
    t: float

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "x": round(self.x, 4), "y": round(self.y, 4),
                "radius": round(self.radius, 4), "frame": self.frame}


def place_key(name: str) -> str:
    """Names compare without case and surrounding or repeated blanks."""
    return " ".join(name.split()).casefold()


def clean_name(name: str) -> str:
    return " ".join(name.split())


def _place_from(entry: NoteEntry) -> tuple[str, Place | None] | None:
    """(key, place or None for a removal) of a place entry; None when it is not one."""
    tags = entry.tags
    name = tags.get("place")
    if not isinstance(name, str) or not name.strip():
        return None
    if tags.get("removed") is True:
        return place_key(name), None
    try:
        x, y = float(tags["x"]), float(tags["y"])
        radius = float(tags.get("radius", 2.0))
    except (KeyError, TypeError, ValueError):
        return None
    if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(radius)) or radius <= 0:
        return None
    frame = tags.get("frame")
    return place_key(name), Place(clean_name(name), x, y, radius,
                                  frame if isinstance(frame, str) and frame else None, entry.t)


def place_entry(name: str, t: float, pose: Pose | None, *, x: float | None = None,
                y: float | None = None, radius: float = 2.0, frame: str | None = None,
                removed: bool = False) -> NoteEntry:
    """The Markdown entry that names (or, `removed`, un-names) a place."""
    name = clean_name(name)
    if removed:
        return NoteEntry(key=new_key(), stream=PLACES_STREAM, t=t, pose=pose,
                         text=f"Place '{name}' removed.",
                         tags={"place": name, "removed": True})
    assert x is not None and y is not None
    tags: dict[str, Any] = {"place": name, "x": round(float(x), 4), "y": round(float(y), 4),
                            "radius": round(float(radius), 4)}
    if frame:
        tags["frame"] = frame
    text = f"Place '{name}': x={x:.2f}, y={y:.2f}, radius {radius:g} m."
    return NoteEntry(key=new_key(), stream=PLACES_STREAM, t=t, pose=pose, text=text, tags=tags)


@dataclass(frozen=True)
class PlaceState:
    """The newest entry of one name: the place, or None when that entry removed it."""

    name: str
    place: Place | None
    t: float


def fold_places(entries: list[NoteEntry]) -> dict[str, PlaceState]:
    """Each name's newest state from the `places` entries: what the registry shows, plus the
    removals (a fleet store needs those to forget a name too)."""
    out: dict[str, PlaceState] = {}
    for e in sorted((e for e in entries if e.stream == PLACES_STREAM), key=lambda e: e.t):
        got = _place_from(e)
        if got is None:
            continue
        key, place = got
        out[key] = PlaceState(clean_name(str(e.tags["place"])), place, e.t)
    return out


class Places:
    """The named places of one memory directory, read from its notes."""

    def __init__(self, notes: NotesLog):
        self.notes = notes
        self._lock = threading.Lock()
        self._signature: tuple | None = None
        self._places: dict[str, Place] = {}

    def _files_signature(self) -> tuple:
        out = []
        for path in sorted(self.notes.dir.glob("*_notes.md")):
            try:
                st = path.stat()
            except OSError:
                continue
            out.append((path.name, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def reload(self) -> dict[str, Place]:
        with self._lock:
            sig = self._files_signature()
            if sig != self._signature:
                places = {key: st.place for key, st in self.states().items()
                          if st.place is not None}
                self._places, self._signature = places, sig
            return dict(self._places)

    def states(self) -> dict[str, PlaceState]:
        """Every name's newest state, removals included, read from the notes now."""
        return fold_places(self.notes.read_all())

    def signature(self) -> tuple:
        """Changes when a notes file does (size or mtime)."""
        return self._files_signature()

    def all(self) -> list[Place]:
        return sorted(self.reload().values(), key=lambda p: p.name.casefold())

    def get(self, name: str) -> Place | None:
        return self.reload().get(place_key(name))

    def names(self) -> list[str]:
        return [p.name for p in self.all()]

    def append(self, entry: NoteEntry) -> None:
        self.notes.append(entry)
        with self._lock:
            self._signature = None  # re-read at the next lookup
