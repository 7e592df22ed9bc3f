"""`save`: notes and place names, written to the Markdown notes first (the record), then to
memory.db. A note that repeats a recent one is folded into it; a row the database could not
take (a full disk) is added by the catch-up as soon as it can be."""

from __future__ import annotations

import logging
import threading

import numpy as np

from memory_node.core.catch_up import CatchUp
from memory_node.core.contract import (
    DEFAULT_RADIUS,
    PlaceInfo,
    SaveAnswer,
    SaveNote,
    pose_out,
    unknown_name,
)
from memory_node.core.disk import disk_full_text, is_disk_full
from memory_node.core.errors import BadRequest, Unavailable
from memory_node.core.notes import NoteEntry, new_key
from memory_node.core.operations.host import Host
from memory_node.core.operations.models import Models
from memory_node.core.operations.repair import StartupRepair
from memory_node.core.places import place_entry
from memory_node.core.query import SaveRequest
from memory_node.core.types import Observation, Pose, RowFilter

log = logging.getLogger(__name__)


class PlaceNaming:
    """Names the current pose (or a given point) as a place, or removes a name."""

    def __init__(self, host: Host):
        self.host = host

    def name_place(self, req: SaveNote) -> SaveAnswer:
        """Name the current pose (or x, y) as a place, or remove a name; written to the
        Markdown notes first, like every note."""
        assert req.place is not None
        host = self.host
        places = host._places
        now = host.clock()
        name = req.place
        old = places.get(name)
        pose = host.pose_provider()
        if req.remove:
            if old is None:
                raise BadRequest(unknown_name("place", name, places.names()))
            entry = place_entry(old.name, now, pose, removed=True)
            self.append(entry)
            return SaveAnswer(id=None, t=now, pose=pose_out(pose), indexed=True,
                              place=PlaceInfo(**old.info()), removed=True)
        if req.x is not None and req.y is not None:
            x, y = float(req.x), float(req.y)
            frame = pose.frame if pose is not None else (old.frame if old else None)
        else:
            if pose is None:
                raise Unavailable("the robot's current pose is unknown (no TF from the world "
                                  "frame to the base frame yet): give x and y to name a point")
            if pose.stale:
                raise Unavailable(f"the robot's newest pose is {pose.age_s:.2f} s old (older "
                                  "than max_pose_age_s): give x and y, or try again")
            x, y, frame = pose.x, pose.y, pose.frame or None
        radius = float(req.radius) if req.radius is not None else (
            old.radius if old is not None else DEFAULT_RADIUS)
        entry = place_entry(name, now, pose, x=x, y=y, radius=radius, frame=frame)
        self.append(entry)
        place = host.place(name)  # just written: there
        return SaveAnswer(id=None, t=now, pose=pose_out(pose), indexed=True,
                          place=PlaceInfo(**place.info()))

    def append(self, entry: NoteEntry) -> None:
        try:
            self.host._places.append(entry)
        except OSError as exc:
            if is_disk_full(exc, self.host.config.root):
                raise Unavailable(f"disk full: the place was not saved ({exc.strerror})") \
                    from None
            raise Unavailable(f"could not write the notes file: {exc.strerror}") from None


class NoteSaving:
    """`save` on a robot's own memory: notes and place names. Compaction's summaries are
    saved through `save_note` too."""

    def __init__(self, host: Host, models: Models, repair: StartupRepair):
        self.host = host
        self.models = models
        self.repair = repair
        self.naming = PlaceNaming(host)
        # A save's Markdown append and insert, and the catch-up of notes kept in Markdown
        # but not in memory.db (a full disk), one at a time (one row per note).
        self.lock = threading.Lock()
        self.catch_up = CatchUp(self.catch_up_notes, "notes")

    def reopen(self) -> None:
        """A catch-up again after the engine was closed and opened again."""
        if self.catch_up.closed:
            self.catch_up = CatchUp(self.catch_up_notes, "notes")

    def save(self, note: SaveNote) -> SaveAnswer:
        """`save`: a note stamped with the current pose and time (or a place name); raises
        ContractError."""
        if note.place is not None:
            return self.naming.name_place(note)
        return self.save_note(SaveRequest(text=note.text, tags=dict(note.tags or {})))

    def save_note(self, req: SaveRequest, stream: str = "events",
                  t: float | None = None, pose: Pose | None | str = "current") -> SaveAnswer:
        """A note on `stream` at `t` and `pose` ("current": the pose provider's), written
        to the Markdown notes first; compaction's summaries come through here too."""
        host = self.host
        now = host.clock() if t is None else t
        if isinstance(pose, str):  # "current"
            pose = host.pose_provider()
        vec: np.ndarray | None = None
        try:
            vec = host._embed_texts([req.text])[0]
        except Exception as exc:  # noqa: BLE001 - the note is kept; indexed at next start
            log.warning("embedding the note failed (%s); storing it unindexed", exc)
        if vec is not None:
            # A later search for the same words (an agent checking what it wrote) needs no
            # second embedding.
            self.models.remember_query(host.text_model_id, req.text, vec)
        if vec is not None and stream == "events":
            folded = self.fold_note(req, vec, now, pose)
            if folded is not None:
                return folded
        entry = NoteEntry(key=new_key(), stream=stream, t=now, text=req.text, pose=pose,
                          tags=req.tags)
        with self.lock:
            oid = self.write_note(entry, vec)
        indexed = vec is not None
        if indexed:
            try:
                host.sync()
            except Exception as exc:  # noqa: BLE001 - stored; indexed by the catch-up
                log.warning("note %d stored but the index could not be updated (%s); it is "
                            "indexed in the background", oid, exc)
                indexed = False
        if not indexed:
            self.catch_up.schedule()  # embedded and indexed as soon as that works
        return SaveAnswer(id=oid, t=now, pose=pose_out(pose), indexed=indexed)

    def write_note(self, entry: NoteEntry, vec: np.ndarray | None) -> int:
        """The note into its Markdown file (durable first: the file is the record), then its
        row into memory.db; its id. A note that could not be written at all raises
        Unavailable ("disk full: ..." on a full disk); one written to Markdown whose row
        could not be stored raises Unavailable too, and the catch-up adds the row (and
        indexes it) by itself as soon as it can: never an answer with no id."""
        host = self.host
        root = host.config.root
        try:
            host._notes.append(entry)
        except OSError as exc:
            if is_disk_full(exc, root):
                raise Unavailable(f"disk full: the note was not saved ({exc.strerror})") from None
            raise Unavailable(f"could not write the notes file: {exc.strerror}") from None
        obs = Observation(stream=entry.stream, t=entry.t, pose=entry.pose,
                          tags=dict(entry.tags), text=entry.text,
                          model_id=host.text_model_id if vec is not None else None,
                          note_key=entry.key)
        try:
            [oid] = host._store.insert([obs], [vec])
        except Exception as exc:  # noqa: BLE001 - in Markdown already: caught up later
            self.catch_up.schedule()
            where = f"notes/{entry.file}"
            if is_disk_full(exc, root):
                raise Unavailable(
                    f"disk full: the note is kept in {where} but not yet in memory.db "
                    f"({disk_full_text(exc)}); it is added and indexed by itself as soon as "
                    "there is space (no need to save it again)") from None
            log.warning("note %s is in %s but could not be added to memory.db: %s",
                        entry.key, where, exc)
            raise Unavailable(
                f"the note is kept in {where} but memory.db could not store it "
                f"({type(exc).__name__}); it is added by itself as soon as it can be") from None
        return oid

    def catch_up_notes(self) -> int:
        """Notes in Markdown that memory.db lacks, and rows without a vector, stored and
        indexed now (the catch-up thread; raises while that still fails)."""
        host = self.host
        if host.store is None:
            return 0
        with self.lock:
            picked = self.repair.ingest_note_files()
        indexed = self.repair.index_missing_vectors()
        host.sync()
        return picked + indexed

    def fold_note(self, req: SaveRequest, vec: np.ndarray, now: float,
                  pose: Pose | None) -> SaveAnswer | None:
        """A note that repeats a recent one (same meaning, same place) is folded into it."""
        host = self.host
        cfg = host.config
        probe = RowFilter(streams=("events",), t_min=now - cfg.note_fold_window_s,
                          t_max=now + 1e-6,
                          near=None if pose is None else (pose.x, pose.y),
                          radius=cfg.note_fold_radius_m)
        host.sync()
        key = (host.text_model_id, "events")
        idx = host._indexes.get(key)
        if idx is None:
            return None
        store = host._store
        cand = store.candidates(probe)
        if len(cand.ids) == 0:
            return None
        ids, scores = idx.search(vec, 1, candidates=cand.ids)
        if len(ids) == 0 or scores[0] < cfg.note_fold_similarity:
            return None
        prior = store.get([int(ids[0])])[int(ids[0])]
        if (prior.pose is None) != (pose is None):
            return None
        tags = dict(prior.tags)
        count = tags.get("repeats")  # a hand-edited Markdown tag may be anything
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            count = 1
        tags["repeats"] = count + 1
        tags["last_t"] = now
        store.update_tags(int(ids[0]), tags)
        log.info("note folded into #%d (similarity %.3f): %.60s", int(ids[0]), scores[0],
                 req.text)
        return SaveAnswer(id=prior.id, t=prior.t, pose=pose_out(prior.pose), indexed=True,
                          folded=True)
