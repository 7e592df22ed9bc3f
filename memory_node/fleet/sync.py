"""Local-first sync: push a robot's memory.db to the fleet store, idempotently.

The robot's SQLite store stays the source of truth and works with no network. Triggers that
this module installs in memory.db append the id of every inserted, updated, embedded or
archived row to `fleet_outbox` in the same transaction as the change (so whichever process
writes - recorder, server, compaction - nothing is missed, and rows written before the first
sync are queued when the triggers are installed). The pusher reads the outbox in order, reads
each row's current state, and sends a batch in one PostgreSQL transaction that upserts the
rows keyed by (robot_id, store_id, local_id) and records the batch's last outbox position.
Then the local outbox is trimmed. A crash between the two leaves rows the fleet has and the
outbox still lists: they are sent again and change nothing. A lost connection is retried
with exponential backoff; the outbox keeps growing meanwhile and drains when it returns.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memory_node.core.notes import NotesLog
from memory_node.core.parameters import split_ros_args
from memory_node.core.places import Places
from memory_node.core.types import View
from memory_node.fleet.credentials import CredentialError, resolve_fleet_url
from memory_node.fleet.store import (
    HNSW_EF_CONSTRUCTION,
    HNSW_M,
    SCHEMA_VERSION,
    FleetStore,
    FleetUnavailable,
)

# the module path also when run as `python -m` (there __name__ is "__main__")
log = logging.getLogger(__spec__.name if __spec__ is not None else __name__)

PAUSE_ENV = "MEMORY_SYNC_TEST_PAUSE_S"  # tests only: hold each batch's transaction open

_OUTBOX_SQL = """
CREATE TABLE IF NOT EXISTS fleet_outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    obs_id INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS fleet_obs_ins AFTER INSERT ON observations
    BEGIN INSERT INTO fleet_outbox(obs_id) VALUES (NEW.id); END;
CREATE TRIGGER IF NOT EXISTS fleet_obs_upd AFTER UPDATE ON observations
    BEGIN INSERT INTO fleet_outbox(obs_id) VALUES (NEW.id); END;
CREATE TRIGGER IF NOT EXISTS fleet_vec_ins AFTER INSERT ON vectors
    BEGIN INSERT INTO fleet_outbox(obs_id) VALUES (NEW.id); END;
DROP TRIGGER IF EXISTS fleet_vec_upd;
CREATE TRIGGER fleet_vec_upd AFTER UPDATE OF crc ON vectors
    BEGIN INSERT INTO fleet_outbox(obs_id) VALUES (NEW.id); END;
CREATE TRIGGER IF NOT EXISTS fleet_arch_ins AFTER INSERT ON archive
    BEGIN INSERT INTO fleet_outbox(obs_id) VALUES (NEW.id); END;
"""

_COLS = ("id, stream, t, x, y, z, yaw, frame, pose_source, tags, text, ref, model_id, note_key")
_VIEW = "w.x, w.y, w.yaw, w.hfov, w.range"  # what a camera keyframe covered (seen_near)


def default_robot_id() -> str:
    return socket.gethostname() or "robot"


def default_map_id(robot_id: str, frame: str = "map") -> str:
    """A robot's own map: its `map` frame is nobody else's unless configured so."""
    return f"{robot_id}/{frame}"


@dataclass
class SyncStats:
    batches: int = 0
    rows_sent: int = 0
    rows_changed: int = 0
    places_changed: int = 0
    retries: int = 0
    last_error: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class LocalOutbox:
    """The robot side: memory.db, its outbox triggers, and the rows they point at."""

    def __init__(self, db_path: Path, *, timeout_s: float = 10.0):
        from memory_node.core.store.sqlite_store import SqliteObservationStore
        from memory_node.core.store.vector_files import DIR_NAME, VectorFiles

        self.path = Path(db_path)
        SqliteObservationStore(self.path).close()  # create or migrate the store's schema
        self.files = VectorFiles(self.path.parent / DIR_NAME)
        self.db = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None,
                                  check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
        self.install()
        self.store_id = self.db.execute(
            "SELECT value FROM meta WHERE key='db_uuid'").fetchone()[0]

    def install(self) -> None:
        """Create the outbox and its triggers; queue every row that predates them."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            had = self.db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='trigger' AND name='fleet_arch_ins'"
            ).fetchone()
            for stmt in _OUTBOX_SQL.split(";\n"):
                if stmt.strip():
                    self.db.execute(stmt)
            if not had:
                self.db.execute(
                    "INSERT INTO fleet_outbox(obs_id) SELECT id FROM ("
                    "SELECT id FROM observations UNION SELECT id FROM archive) ORDER BY id")
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def requeue_all(self) -> None:
        """Queue every row again (the fleet database was replaced or emptied)."""
        self.db.execute(
            "INSERT INTO fleet_outbox(obs_id) SELECT id FROM ("
            "SELECT id FROM observations UNION SELECT id FROM archive) ORDER BY id")

    def pending(self, after_seq: int) -> int:
        return int(self.db.execute("SELECT count(*) FROM fleet_outbox WHERE seq > ?",
                                   (after_seq,)).fetchone()[0])

    def max_seq(self) -> int:
        return int(self.db.execute("SELECT coalesce(max(seq), 0) FROM fleet_outbox")
                   .fetchone()[0])

    def next_batch(self, after_seq: int, limit: int) -> tuple[int, list[int]]:
        """(last seq of the batch, distinct row ids in it); (after_seq, []) when empty."""
        rows = self.db.execute(
            "SELECT seq, obs_id FROM fleet_outbox WHERE seq > ? ORDER BY seq LIMIT ?",
            (after_seq, limit)).fetchall()
        if not rows:
            return after_seq, []
        return rows[-1][0], list(dict.fromkeys(r[1] for r in rows))

    def trim(self, upto_seq: int) -> None:
        self.db.execute("DELETE FROM fleet_outbox WHERE seq <= ?", (upto_seq,))

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def read_rows(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        """The current state of each row: live (with its vector) or archived. Read again when
        compaction replaced a vector file in between (its old file is gone)."""
        for attempt in range(5):
            try:
                return self._read_rows(ids)
            except FileNotFoundError:
                if attempt == 4:
                    raise
        return []

    def _read_rows(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        self.db.execute("BEGIN")  # one snapshot for both tables
        try:
            for s in range(0, len(ids), 500):
                chunk = list(ids[s:s + 500])
                marks = ",".join("?" * len(chunk))
                for r in self.db.execute(
                        f"SELECT o.{_COLS.replace(', ', ', o.')}, v.slot, f.gen, f.dim, {_VIEW}"
                        " FROM observations o LEFT JOIN vectors v ON v.id = o.id"
                        " LEFT JOIN vector_files f ON f.model_id = o.model_id AND"
                        " f.stream = o.stream"
                        f" LEFT JOIN views w ON w.id = o.id WHERE o.id IN ({marks})", chunk):
                    slot, gen, dim = r[14:17]
                    vec = None if slot is None or gen is None else self.files.read(
                        r[12], r[1], gen, dim, [slot])[0]
                    out[r[0]] = _row_dict(r[:14], vec, None, r[17:22])
                missing = [i for i in chunk if i not in out]
                if missing:
                    marks = ",".join("?" * len(missing))
                    for r in self.db.execute(
                            f"SELECT a.{_COLS.replace(', ', ', a.')}, a.archived_at, a.reason,"
                            f" a.kept_id, {_VIEW} FROM archive a"
                            f" LEFT JOIN views w ON w.id = a.id WHERE a.id IN ({marks})",
                            missing):
                        out[r[0]] = _row_dict(r[:14], None, r[14:17], r[17:22])
        finally:
            self.db.execute("COMMIT")
        return [out[i] for i in ids if i in out]

    def close(self) -> None:
        self.db.close()
        self.files.close()


def _row_dict(r: Sequence[Any], vec: np.ndarray | None, arch: Sequence[Any] | None,
              view: Sequence[Any]) -> dict[str, Any]:
    (oid, stream, t, x, y, z, yaw, frame, source, tags, text, ref, model_id, note_key) = r
    v = None if view[0] is None else View(*(float(c) for c in view))
    return {"id": oid, "stream": stream, "t": t, "x": x, "y": y, "z": z, "yaw": yaw,
            "frame": frame, "pose_source": source, "tags": tags, "text": text, "ref": ref,
            "model_id": model_id,
            "note_key": note_key, "emb": vec,
            "archived_at": arch[0] if arch else None, "archive_reason": arch[1] if arch else None,
            "kept_local_id": arch[2] if arch else None, "view": v}


class FleetSync:
    """Pushes one memory.db to the fleet store: `push_once()` drains the outbox."""

    def __init__(self, memory_dir: str | Path, store: FleetStore, robot_id: str, *,
                 map_id: str | None = None, world_frame: str = "map", batch_size: int = 1000,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 init_schema: bool = True):
        self.root = Path(memory_dir)
        self.store = store
        self.robot_id = robot_id
        self.world_frame = world_frame
        self.map_id = map_id or default_map_id(robot_id, world_frame)
        self.batch_size = max(1, int(batch_size))
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.init_schema = init_schema
        self.outbox = LocalOutbox(self.root / "memory.db")
        self.places = Places(NotesLog(self.root / "notes"))
        self._places_sent: tuple | None = None  # notes files' signature when places last went
        self.cursor: int | None = None  # outbox position the fleet has acknowledged
        self.stats = SyncStats()
        self.pause_s = float(os.environ.get(PAUSE_ENV, "0") or 0)
        self._stop = False

    def stop(self) -> None:
        self._stop = True

    def close(self) -> None:
        self.outbox.close()

    def map_for(self, frame: str | None) -> str | None:
        if frame is None:
            return None
        if frame == self.world_frame:
            return self.map_id
        return default_map_id(self.robot_id, frame)

    # ---- one connection's worth of work --------------------------------------------------
    def _start(self) -> None:
        """Schema present; find where the fleet's acknowledgements stand for this store."""
        self.store.ensure_schema(create=self.init_schema)
        fleet_uuid = self.store.meta("fleet_uuid") or ""
        acked = self.store.acked_seq(self.robot_id, self.outbox.store_id)
        # The schema version too: a store synced to an older schema sends its rows again,
        # with what that version added (camera views).
        identity = json.dumps({"fleet": fleet_uuid, "robot": self.robot_id, "map": self.map_id,
                               "schema": SCHEMA_VERSION})
        if self.outbox.get_meta("fleet_identity") not in (None, identity):
            # Another (or a re-created) fleet database, or a new robot or map id for this
            # store: what was acknowledged before does not hold for it.
            log.warning("fleet database, robot id or map id changed since this store last "
                        "synced: sending every row again")
            self.outbox.requeue_all()
        self.outbox.set_meta("fleet_identity", identity)
        self.outbox.trim(acked)
        self.cursor = acked
        self._places_sent = None  # (re)connected: send the places once more (idempotent)

    def _rows(self, states: list[dict[str, Any]]) -> tuple[list[tuple], dict[str, int]]:
        rows, models = [], {}
        for s in states:
            emb = s["emb"]
            if emb is not None and s["model_id"]:
                models[s["model_id"]] = int(len(emb))
            v = s["view"]
            view: tuple = (None,) * 9
            if v is not None:
                x0, x1, y0, y1 = v.bbox()
                view = (v.x, v.y, v.yaw, v.hfov, v.range, x0, x1, y0, y1)
            located = s["x"] is not None or v is not None
            rows.append((self.robot_id, self.outbox.store_id, s["id"], s["stream"], s["t"],
                         self.map_for(s["frame"] or self.world_frame) if located else None,
                         s["x"], s["y"], s["z"], s["yaw"], s["frame"], s["pose_source"],
                         s["tags"], s["text"], s["ref"], s["model_id"], s["note_key"], emb,
                         s["archived_at"], s["archive_reason"], s["kept_local_id"], *view))
        return rows, models

    def push_once(self, until_seq: int | None = None) -> int:
        """Send batches until the outbox is empty (or past until_seq). Returns rows sent.
        Raises FleetUnavailable when the connection is lost (the caller retries)."""
        if self.cursor is None:
            self._start()
        assert self.cursor is not None  # _start sets it (or raises)
        sent = 0
        while not self._stop:
            last, ids = self.outbox.next_batch(self.cursor, self.batch_size)
            if not ids:
                break
            states = self.outbox.read_rows(ids)
            rows, models = self._rows(states)
            t0 = time.perf_counter()
            changed = self.store.push(self.robot_id, self.outbox.store_id, self.map_id, rows,
                                      last, models, pause_s=self.pause_s)
            self.stats.seconds += time.perf_counter() - t0
            self.cursor = last
            self.outbox.trim(last)
            self.stats.batches += 1
            self.stats.rows_sent += len(rows)
            self.stats.rows_changed += changed
            sent += len(rows)
            log.debug("batch up to outbox #%d: %d rows sent, %d changed", last, len(rows),
                      changed)
            if until_seq is not None and last >= until_seq:
                break
        if not self._stop:
            self.push_places()
        return sent

    def push_places(self) -> int:
        """Send the named places (every name's newest state, removals included) when a notes
        file changed since they last went; an unchanged place is not rewritten."""
        sig = self.places.signature()
        if sig == self._places_sent:
            return 0
        rows = []
        for key, st in self.places.states().items():
            p = st.place
            frame = p.frame if p is not None else None
            rows.append((key, st.name, self.map_for(frame or self.world_frame),
                         None if p is None else p.x, None if p is None else p.y,
                         None if p is None else p.radius, frame, st.t, p is None))
        changed = self.store.push_places(self.robot_id, self.outbox.store_id, rows) \
            if rows else 0
        self._places_sent = sig
        self.stats.places_changed += changed
        return changed

    def run(self, *, once: bool = False, interval_s: float = 0.25,
            timeout_s: float | None = None) -> bool:
        """Keep pushing (or, once: until what is queued now is acknowledged). Returns True
        when everything asked for was acknowledged."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        target = self.outbox.max_seq() if once else None
        failures = 0
        while not self._stop:
            try:
                self.push_once()
                if failures:
                    log.info("fleet store reachable again; outbox drained up to #%d",
                             self.cursor)
                failures = 0
                if once and self.cursor is not None and self.cursor >= (target or 0):
                    return True
                if once and self.outbox.pending(self.cursor or 0) == 0:
                    return True
                time.sleep(interval_s)
            except (FleetUnavailable, Exception) as exc:  # noqa: BLE001 - retried, logged
                if not isinstance(exc, FleetUnavailable):
                    import psycopg

                    if not isinstance(exc, psycopg.Error):
                        raise
                    exc = FleetUnavailable(  # e.g. a permission or constraint refusal
                        f"the fleet store refused a batch: {type(exc).__name__}: "
                        f"{self.store.scrub(str(exc).strip())}")
                failures += 1
                self.stats.retries += 1
                self.stats.last_error = str(exc)
                self.cursor = None  # re-read the acknowledgement after reconnecting
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** min(failures - 1, 10))
                delay *= random.uniform(0.8, 1.2)
                if failures == 1 or failures % 10 == 0:
                    log.warning("%s; retrying in %.1f s (rows keep queueing locally)", exc,
                                delay)
                if deadline is not None and time.monotonic() + delay > deadline:
                    return False
                time.sleep(delay)
            if deadline is not None and time.monotonic() > deadline:
                return False
        return False


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="memory-sync",
        description="Push this robot's memory (observations, notes with pose and tags, vectors "
                    "and compaction archives) to the fleet store (PostgreSQL + pgvector), "
                    "idempotently, retrying with backoff while the network is away. The URL "
                    "comes from --fleet-url (no password there) or $MEMORY_FLEET_URL or the "
                    "file named by $MEMORY_FLEET_URL_FILE; a password from the URL in the "
                    "environment or file, $PGPASSWORD or ~/.pgpass.")
    p.add_argument("--memory-dir", default=None,
                   help="the robot's memory directory (default $AGENT_MEMORY_DIR or "
                        "./agent_memory)")
    p.add_argument("--fleet-url", default=None,
                   help="postgresql://user@host/db (default $MEMORY_FLEET_URL)")
    p.add_argument("--robot-id", default=None,
                   help="this robot's id in the fleet (default $MEMORY_ROBOT_ID or the host "
                        "name)")
    p.add_argument("--map-id", default=None,
                   help="the map this robot's world frame belongs to; robots that share a map "
                        "give the same id (default $MEMORY_MAP_ID or <robot-id>/map)")
    p.add_argument("--world-frame", default="map", help="the world frame (default map)")
    p.add_argument("--once", action="store_true",
                   help="push what is queued now; exit 0 when all is acknowledged, 1 when the "
                        "timeout passes first, 2 when the memory directory holds no memory.db")
    p.add_argument("--timeout", type=float, default=None,
                   help="with --once: give up after this many seconds (default 300)")
    p.add_argument("--interval", type=float, default=0.25,
                   help="seconds between checks for new rows (default 0.25)")
    p.add_argument("--batch-size", type=int, default=1000, help="rows per transaction")
    p.add_argument("--init-schema", action="store_true",
                   help="create the fleet schema (as a role that may) and exit")
    p.add_argument("--create-vector-index", action="store_true",
                   help="build pgvector's HNSW index for each embedding model in the fleet "
                        "(as a role that may; unfiltered semantic search then uses it), and "
                        "exit")
    p.add_argument("--hnsw-m", type=int, default=HNSW_M,
                   help=f"with --create-vector-index: graph degree m (default {HNSW_M})")
    p.add_argument("--hnsw-ef-construction", type=int, default=HNSW_EF_CONSTRUCTION,
                   help="with --create-vector-index: ef_construction (default "
                        f"{HNSW_EF_CONSTRUCTION})")
    p.add_argument("--maintenance-work-mem", default="1GB",
                   help="with --create-vector-index: memory for the build (default 1GB; a "
                        "graph that fits builds several times faster)")
    p.add_argument("--rebuild", action="store_true",
                   help="with --create-vector-index: drop an existing index first (to change "
                        "m or ef_construction)")
    p.add_argument("--no-create", action="store_true",
                   help="never try to create the schema (a least-privilege robot role)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    return p


def _create_vector_indexes(store: FleetStore, args: argparse.Namespace) -> int:
    """`--create-vector-index`: one HNSW index per embedding model the fleet holds."""
    try:
        models = store.models()
        if not models:
            print("memory-sync: no vectors in the fleet yet: sync a robot first",
                  file=sys.stderr)
            return 1
        for model_id, dim in sorted(models.items()):
            t0 = time.perf_counter()
            if not store.create_vector_index(
                    model_id, dim, m=args.hnsw_m, ef_construction=args.hnsw_ef_construction,
                    maintenance_work_mem=args.maintenance_work_mem, replace=args.rebuild):
                print("memory-sync: this role may not create indexes: run it as the "
                      "database owner", file=sys.stderr)
                return 1
            print(f"memory-sync: HNSW index for {model_id} ({dim}-d, m {args.hnsw_m}, "
                  f"ef_construction {args.hnsw_ef_construction}) ready in "
                  f"{time.perf_counter() - t0:.1f} s")
    except Exception as exc:  # noqa: BLE001 - one line, no URL
        print(f"memory-sync: {store.scrub(str(exc))}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, _ = split_ros_args(argv)  # launch_ros and `ros2 run` add them; this is no ROS node
    args = _parser().parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        url = resolve_fleet_url(args.fleet_url)
    except CredentialError as exc:
        print(f"memory-sync: {exc}", file=sys.stderr)
        return 2
    if not url:
        print("memory-sync: no fleet URL: give --fleet-url or set MEMORY_FLEET_URL",
              file=sys.stderr)
        return 2
    store = FleetStore(url, application_name="memory-sync")
    if args.init_schema:
        try:
            store.init_schema()
        except Exception as exc:  # noqa: BLE001 - one line, no URL
            print(f"memory-sync: {exc}", file=sys.stderr)
            return 1
        print(f"memory-sync: schema ready on {store.label}")
        return 0
    if args.create_vector_index:
        return _create_vector_indexes(store, args)
    from memory_node.core.config import MemoryConfig

    values = {"memory_dir": args.memory_dir} if args.memory_dir else {}
    root = MemoryConfig.from_mapping(values).root
    if args.once and not (root / "memory.db").is_file():
        # Nothing to push, and most likely a mistyped directory: say so rather than create an
        # empty store there and report "0 rows sent".
        print(f"memory-sync: no memory at {root} (no memory.db there): give the robot's "
              "memory directory with --memory-dir or $AGENT_MEMORY_DIR", file=sys.stderr)
        return 2
    robot_id = args.robot_id or os.environ.get("MEMORY_ROBOT_ID") or default_robot_id()
    map_id = args.map_id or os.environ.get("MEMORY_MAP_ID") or None
    sync = FleetSync(root, store, robot_id, map_id=map_id, world_frame=args.world_frame,
                     batch_size=args.batch_size, init_schema=not args.no_create)
    signal.signal(signal.SIGTERM, lambda *_: sync.stop())
    log.info("memory-sync: %s -> %s as robot %r (map %r)", root, store.label, robot_id,
             sync.map_id)
    try:
        ok = sync.run(once=args.once, interval_s=args.interval,
                      timeout_s=(args.timeout or 300.0) if args.once else None)
    except KeyboardInterrupt:
        ok = True
    finally:
        sync.close()
        store.close()
    s = sync.stats
    log.info("memory-sync: %d batches, %d rows sent, %d changed in the fleet, %d retries",
             s.batches, s.rows_sent, s.rows_changed, s.retries)
    if args.once and not ok:
        print(f"memory-sync: not everything was acknowledged: {s.last_error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
