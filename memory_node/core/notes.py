"""Episodic notes as Markdown: `notes/YYYY-MM-DD_notes.md`, appended and fsynced before `save`
answers, human-readable, and enough to rebuild the notes' rows.

An entry written by the engine looks like this::

    ## 07:20:12.250 UTC · events · n-3f2a9c1b7d4e
    - t: 1764487212.250000
    - pose: x=1.2000 y=-0.4000 z=0.0000 yaw=1.5700 frame=map source=tf
    - tags: {"person": true}

    > Met Alice at the front door.

Every line of the note's text is quoted with "> ", so text that looks like a heading cannot
start a new entry. Text a person writes into the file outside such entries (a paragraph, a
list, a "## heading" with lines under it) is picked up as a note of its own at start-up.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memory_node.core.types import Pose

log = logging.getLogger(__name__)

ENTRY_HEADING = re.compile(
    r"^## (?P<when>[^·]*?) · (?P<stream>[A-Za-z0-9_-]+) · (?P<key>n-[0-9a-f]{12})\s*$"
)
POSE_LINE = re.compile(
    r"^- pose: x=(?P<x>\S+) y=(?P<y>\S+) z=(?P<z>\S+) yaw=(?P<yaw>\S+) "
    r"frame=(?P<frame>\S*) source=(?P<source>\S+)\s*$"
)
FILE_NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})_notes\.md$")


@dataclass
class NoteEntry:
    """One note read back from (or about to be written to) a Markdown file."""

    key: str
    stream: str
    t: float
    text: str
    pose: Pose | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    hand_written: bool = False
    file: str = ""


def day_of(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d")


def new_key() -> str:
    return "n-" + secrets.token_hex(6)


def format_entry(entry: NoteEntry) -> str:
    when = datetime.fromtimestamp(entry.t, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    lines = [f"## {when} UTC · {entry.stream} · {entry.key}", f"- t: {entry.t:.6f}"]
    p = entry.pose
    if p is not None:
        lines.append(
            f"- pose: x={p.x:.4f} y={p.y:.4f} z={p.z:.4f} yaw={p.yaw:.4f} "
            f"frame={p.frame or '-'} source={p.source}"
        )
    if entry.tags:
        lines.append("- tags: " + json.dumps(entry.tags, ensure_ascii=False, sort_keys=True))
    lines.append("")
    for line in entry.text.splitlines() or [""]:
        lines.append(("> " + line) if line else ">")
    lines.append("")
    return "\n".join(lines) + "\n"


class NotesLog:
    """Appends entries durably and reads every file back (engine entries and hand-written)."""

    def __init__(self, notes_dir: Path):
        self.dir = Path(notes_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def path_for(self, t: float) -> Path:
        return self.dir / f"{day_of(t)}_notes.md"

    def append(self, entry: NoteEntry) -> Path:
        """Write the entry and fsync the file (and the directory when the file is new).

        All or nothing: when a write or the fsync fails (a full disk, a file size limit), the
        file is cut back to its length before the entry, so a save that was not acknowledged
        leaves nothing that is read back as a note. An exclusive flock keeps appends of
        several processes on one directory whole."""
        path = self.path_for(entry.t)
        data = format_entry(entry).encode("utf-8")
        with self._lock:
            created = not path.exists()
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                size = os.fstat(fd).st_size
                if size == 0:
                    data = f"# Notes {day_of(entry.t)}\n\n".encode() + data
                elif os.pread(fd, 1, size - 1) != b"\n":
                    data = b"\n" + data  # a hand edit may have left no final newline
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except BaseException:
                    _cut_back(fd, path, size)
                    raise
            finally:
                os.close(fd)  # releases the flock
            if created:
                dfd = os.open(self.dir, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        entry.file = path.name
        return path

    def read_all(self) -> list[NoteEntry]:
        out: list[NoteEntry] = []
        for path in sorted(self.dir.glob("*_notes.md")):
            m = FILE_NAME.match(path.name)
            if not m:
                continue
            out.extend(parse_file(path.read_text(encoding="utf-8", errors="replace"),
                                  path.name, m.group(1), path.stat().st_mtime))
        return out


def _cut_back(fd: int, path: Path, size: int) -> None:
    """Cut a failed append off the file again (shrinking a file needs no free space)."""
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    except OSError as exc:
        log.error("a failed note append could not be cut off %s: %s", path.name, exc)


def _day_start(day: str) -> float:
    return datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()


def parse_file(content: str, file_name: str, day: str, mtime: float) -> list[NoteEntry]:
    """Engine entries by their headings; every other text block becomes a hand-written note."""
    entries: list[NoteEntry] = []
    start = _day_start(day)
    # Hand-written notes get a time inside their file's day: the file's mtime if it falls on
    # that day, else noon.
    hand_t = mtime if start <= mtime < start + 86400 else start + 43200
    lines = content.splitlines()
    i = 0
    hand_block: list[str] = []

    def flush_hand() -> None:
        text = "\n".join(hand_block).strip()
        hand_block.clear()
        if not text:
            return
        digest = hashlib.sha1(f"{file_name}\n{text}".encode()).hexdigest()[:12]
        entries.append(NoteEntry(key="h-" + digest, stream="events", t=hand_t, text=text,
                                 hand_written=True, file=file_name))

    while i < len(lines):
        line = lines[i]
        m = ENTRY_HEADING.match(line)
        if m:
            flush_hand()
            entry, i = _parse_entry(lines, i + 1, m, file_name)
            if entry is not None:
                entries.append(entry)
            continue
        if line.startswith("# ") and not hand_block:
            i += 1  # a file title
            continue
        if not line.strip():
            # Blank lines separate hand-written paragraphs, except right after a heading.
            if hand_block and not (len(hand_block) == 1 and hand_block[0].startswith("#")):
                flush_hand()
            i += 1
            continue
        if line.startswith("## ") and hand_block:
            flush_hand()
        hand_block.append(line)
        i += 1
    flush_hand()
    return entries


def _parse_entry(
    lines: list[str], i: int, m: re.Match, file_name: str
) -> tuple[NoteEntry | None, int]:
    t: float | None = None
    pose: Pose | None = None
    tags: dict[str, Any] = {}
    text_lines: list[str] = []
    while i < len(lines):
        line = lines[i]
        if line.startswith("## ") or line.startswith("# "):
            break
        if line.startswith("- t: ") and not text_lines:
            try:
                t = float(line[5:].strip())
            except ValueError:
                t = None
        elif line.startswith("- pose: ") and not text_lines:
            pm = POSE_LINE.match(line)
            if pm:
                try:
                    frame = pm.group("frame")
                    pose = Pose(float(pm.group("x")), float(pm.group("y")), float(pm.group("z")),
                                float(pm.group("yaw")), "" if frame == "-" else frame,
                                pm.group("source"))
                except ValueError:
                    pose = None
        elif line.startswith("- tags: ") and not text_lines:
            try:
                loaded = json.loads(line[8:])
                tags = loaded if isinstance(loaded, dict) else {}
            except json.JSONDecodeError:
                tags = {}
        elif line.startswith(">"):
            text_lines.append(line[2:] if line.startswith("> ") else line[1:])
        elif line.strip() and text_lines:
            break  # unquoted text after an entry: a hand-written paragraph follows
        i += 1
    text = "\n".join(text_lines).strip()
    if t is None or not text:
        return None, i
    return NoteEntry(key=m.group("key"), stream=m.group("stream"), t=t, text=text, pose=pose,
                     tags=tags, file=file_name), i
