"""The fleet store: every robot's observations in one PostgreSQL + pgvector database.

Writes come from `memory-sync` (one transaction per batch: upsert the rows, then record the
batch's outbox position, so a crash anywhere leaves either both or neither). Reads serve the
JSON contract through `FleetEngine`: every filter is a SQL condition (filter_sql.py) evaluated
before ranking, and filtered semantic ranking is an exact `ORDER BY emb <#> q` over the rows
that pass.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from memory_node.core.errors import Unavailable
from memory_node.core.places import Place
from memory_node.core.types import Observation, Pose, RowFilter
from memory_node.fleet import filter_sql
from memory_node.fleet.credentials import redact, scrub
from memory_node.fleet.filter_sql import ties, time_window

log = logging.getLogger(__name__)

SCHEMA_VERSION = "2"  # 2: camera views (seen_near) and named places

# HNSW defaults, chosen by the sweep in bench/fleet_bench.py (BENCHMARKS.md, "Fleet store"):
# m 16 reached the recall target against the exact ranking only at a far deeper ef_search;
# m 32 (twice the build time) reaches it at this one, with less work per query.
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 200
HNSW_EF_SEARCH = 200
TABLE = "memory_observations"

# Columns a sync batch carries, in COPY order (the temporary table has the same names); the
# view's bounding box (view_bx0 .. view_by1) becomes the `view_box` column.
PUSH_COLUMNS = ("robot_id", "store_id", "local_id", "stream", "t", "map_id", "x", "y", "z",
                "yaw", "frame", "pose_source", "tags", "text", "ref", "model_id", "note_key",
                "emb", "archived_at", "archive_reason", "kept_local_id", "view_x", "view_y",
                "view_yaw", "view_hfov", "view_range", "view_bx0", "view_bx1", "view_by0",
                "view_by1")
_PUSH_TYPES = ("text", "text", "int8", "text", "float8", "text", "float8", "float8", "float8",
               "float8", "text", "text", "text", "text", "text", "text", "text", "vector",
               "float8", "text", "int8", "float8", "float8", "float8", "float8", "float8",
               "float8", "float8", "float8", "float8")
_BOX_COLUMNS = ("view_bx0", "view_bx1", "view_by0", "view_by1")
_SELECT = ("o.id, o.robot_id, o.map_id, o.stream, o.t, o.x, o.y, o.z, o.yaw, o.frame,"
           " o.pose_source, o.tags, o.text, o.ref, o.model_id, o.note_key, o.archived_at,"
           " o.local_id, o.store_id")
_SCORE = 19  # the column after _SELECT's: a row's score, where a query adds one


class FleetUnavailable(Unavailable):
    """The fleet database cannot be reached (or answered with a connection-level error): a
    request answers `unavailable` with this message."""


@dataclass
class FleetHit:
    """One row of a fleet answer: the observation (id = fleet id), whose robot, which map;
    `local_id` and `store_id` are the row's id and store on its robot (the tie order)."""

    obs: Observation
    robot: str
    map_id: str | None
    score: float | None = None
    archived: bool = False
    local_id: int = 0
    store_id: str = ""


@dataclass(frozen=True)
class FleetPlace(Place):
    """A named place in the fleet store: a robot's own place, plus whose and on which map."""

    robot: str
    map_id: str | None

    def info(self) -> dict[str, Any]:
        """The local `places` entry's shape, plus robot and map."""
        return {**super().info(), "robot": self.robot, "map": self.map_id}


def schema_sql() -> str:
    return resources.files("memory_node.fleet").joinpath("schema.sql").read_text("utf-8")


def hnsw_index_name(model_id: str) -> str:
    return "memory_obs_hnsw_" + hashlib.sha1(model_id.encode("utf-8")).hexdigest()[:12]


class FleetStore:
    """One connection (thread-safe behind a lock), opened lazily and reopened after a loss."""

    def __init__(self, url: str, *, connect_timeout_s: float = 5.0,
                 application_name: str = "memory_node", hnsw_ef_search: int = HNSW_EF_SEARCH):
        self._url = url  # never logged: use self.label
        self.label = redact(url)
        self.connect_timeout_s = connect_timeout_s
        self.application_name = application_name
        self.hnsw_ef_search = hnsw_ef_search
        # strict_order: with a stream restriction the scan goes on until k rows pass.
        self.hnsw_iterative_scan = "strict_order"
        self._conn: Any = None
        self._lock = threading.RLock()
        self._hnsw: dict[str, int] | None = None
        self._hnsw_at = 0.0

    def scrub(self, message: str) -> str:
        """A message with this store's password (if it shows up) removed."""
        return scrub(message, self._url)

    # ---- connection -----------------------------------------------------------------------
    def _connect(self) -> Any:
        import psycopg
        from pgvector.psycopg import register_vector

        try:
            conn = psycopg.connect(self._url, autocommit=True,
                                   connect_timeout=max(1, int(self.connect_timeout_s)),
                                   application_name=self.application_name)
        except psycopg.Error as exc:
            raise FleetUnavailable(
                f"cannot connect to the fleet store {self.label}: "
                f"{scrub(str(exc).strip(), self._url)}") from None
        try:
            register_vector(conn)
        except psycopg.ProgrammingError:
            pass  # no vector extension yet: init_schema creates it, then reconnects
        if self._has_vector(conn):
            conn.execute(f"SET hnsw.ef_search = {int(self.hnsw_ef_search)}")
        return conn

    @staticmethod
    def _has_vector(conn: Any) -> bool:
        return conn.execute("SELECT 1 FROM pg_extension WHERE extname='vector'").fetchone() \
            is not None

    def conn(self) -> Any:
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            return self._conn

    def drop_connection(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                except Exception:  # noqa: BLE001 - already broken
                    pass
            self._conn = None

    def close(self) -> None:
        self.drop_connection()

    def run(self, fn: Any, *, retry: bool = True) -> Any:
        """fn(conn) under the lock; a connection-level failure drops the connection and
        raises FleetUnavailable (the next call reconnects). A connection opened by an earlier
        call may have gone stale (the server restarted, an idle timeout): with `retry`, fn
        runs once more on a new connection before the failure counts. Writes pass
        retry=False: memory-sync retries them with its own backoff."""
        import psycopg

        with self._lock:
            reused = self._conn is not None and not self._conn.closed
            conn = self.conn()
            try:
                return fn(conn)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                self.drop_connection()
                said = scrub(str(exc).strip(), self._url)
                if retry and reused:
                    log.info("fleet store %s: connection lost (%s); reconnecting",
                             self.label, said.splitlines()[0] if said else "closed")
                    return self.run(fn, retry=False)
                raise FleetUnavailable(f"fleet store {self.label}: {said}") from None
            except psycopg.Error:
                if conn.info.transaction_status != 0:  # not idle: roll the failed one back
                    try:
                        conn.rollback()
                    except psycopg.Error:
                        self.drop_connection()
                raise

    # ---- schema ---------------------------------------------------------------------------
    def schema_ready(self) -> bool:
        def check(conn: Any) -> bool:
            row = conn.execute("SELECT to_regclass(%s), to_regclass(%s)",
                               (TABLE, "memory_fleet_meta")).fetchone()
            if row[0] is None or row[1] is None:
                return False
            v = conn.execute("SELECT value FROM memory_fleet_meta WHERE key='schema_version'"
                             ).fetchone()
            return v is not None and int(v[0]) >= int(SCHEMA_VERSION)
        return bool(self.run(check))

    def init_schema(self) -> None:
        """Create the extensions and tables (needs a role that may); a no-op when present."""
        def apply(conn: Any) -> None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(727274)")
                conn.execute(schema_sql())
        self.run(apply, retry=False)
        self.drop_connection()  # reconnect so the vector type is registered

    def ensure_schema(self, create: bool = True) -> None:
        if self.schema_ready():
            return
        if not create:
            raise FleetUnavailable(f"the fleet store {self.label} has no memory_node schema of "
                                   f"version {SCHEMA_VERSION}: run `memory-sync --init-schema`"
                                   " as its owner")
        self.init_schema()

    def meta(self, key: str) -> str | None:
        row = self.run(lambda c: c.execute(
            "SELECT value FROM memory_fleet_meta WHERE key=%s", (key,)).fetchone())
        return None if row is None else row[0]

    def create_vector_index(self, model_id: str, dim: int, *, m: int = HNSW_M,
                            ef_construction: int = HNSW_EF_CONSTRUCTION,
                            maintenance_work_mem: str = "1GB", replace: bool = False) -> bool:
        """An HNSW index (inner product) over one model's live vectors, for unfiltered semantic
        search. Returns False when this role may not create it (robots usually may not).
        `replace`: drop an existing one first (other build settings)."""
        import psycopg
        from psycopg import sql

        name = sql.Identifier(hnsw_index_name(model_id))
        stmt = sql.SQL(
            "CREATE INDEX IF NOT EXISTS {name} ON memory_observations USING hnsw "
            "((emb::vector({dim})) vector_ip_ops) WITH (m = {m}, ef_construction = {efc})"
            " WHERE model_id = {model} AND archived_at IS NULL"
        ).format(name=name, dim=sql.Literal(int(dim)), model=sql.Literal(model_id),
                 m=sql.Literal(int(m)), efc=sql.Literal(int(ef_construction)))

        def build(conn: Any) -> None:
            # A graph that fits in maintenance_work_mem builds several times faster.
            conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(
                sql.Literal(maintenance_work_mem)))
            if replace:
                conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(name))
            conn.execute(stmt)
        try:
            self.run(build, retry=False)
        except psycopg.errors.InsufficientPrivilege:
            return False
        self._hnsw = None
        return True

    def drop_vector_index(self, model_id: str) -> None:
        from psycopg import sql

        self.run(lambda c: c.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(
            sql.Identifier(hnsw_index_name(model_id)))), retry=False)
        self._hnsw = None

    def models(self) -> dict[str, int]:
        """Embedding models with vectors in the fleet: model_id -> dimension."""
        return dict(self.run(lambda c: c.execute(
            "SELECT model_id, dim FROM memory_models").fetchall()))

    def hnsw_models(self) -> dict[str, int]:
        """Models with an HNSW index: model_id -> dimension (looked up again after 30 s, so
        a running server starts using an index built meanwhile)."""
        import time

        if self._hnsw is None or time.monotonic() - self._hnsw_at > 30.0:
            rows = self.models()
            names = set(r[0] for r in self.run(lambda c: c.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename=%s", (TABLE,)).fetchall()))
            self._hnsw = {m: d for m, d in rows.items() if hnsw_index_name(m) in names}
            self._hnsw_at = time.monotonic()
        return self._hnsw

    # ---- sync writes ----------------------------------------------------------------------
    def acked_seq(self, robot_id: str, store_id: str) -> int:
        row = self.run(lambda c: c.execute(
            "SELECT acked_seq FROM memory_sync_state WHERE robot_id=%s AND store_id=%s",
            (robot_id, store_id)).fetchone())
        return 0 if row is None else int(row[0])

    def push(self, robot_id: str, store_id: str, map_id: str, rows: Sequence[tuple],
             acked_seq: int, models: dict[str, int], pause_s: float = 0.0) -> int:
        """Upsert one batch and record `acked_seq`, in one transaction. Returns rows changed.

        Idempotent: a row identical to what the fleet holds is not touched (its xmin stays),
        so a re-sent batch changes nothing."""
        def tx(conn: Any) -> int:
            with conn.transaction():
                conn.execute(
                    "CREATE TEMP TABLE IF NOT EXISTS memory_push ("
                    + ", ".join(f"{c} {t}" for c, t in zip(PUSH_COLUMNS, _PUSH_TYPES, strict=True))
                    + ") ON COMMIT DELETE ROWS")
                with (conn.cursor() as cur,
                      cur.copy(f"COPY memory_push ({', '.join(PUSH_COLUMNS)})"
                               " FROM STDIN (FORMAT BINARY)") as copy):
                    copy.set_types(list(_PUSH_TYPES))
                    for r in rows:
                        copy.write_row(r)
                stored = [c for c in PUSH_COLUMNS if c not in _BOX_COLUMNS] + ["view_box"]
                box = ("CASE WHEN view_bx0 IS NULL THEN NULL ELSE"
                       " box(point(view_bx0, view_by0), point(view_bx1, view_by1)) END")
                sel = ", ".join("tags::jsonb" if c == "tags" else box if c == "view_box" else c
                                for c in stored)
                upd = [c for c in stored if c not in ("robot_id", "store_id", "local_id")]

                def new(c: str) -> str:
                    if c in ("emb", "archived_at", "archive_reason", "kept_local_id"):
                        return f"COALESCE(EXCLUDED.{c}, o.{c})"  # never un-archive or un-embed
                    return f"EXCLUDED.{c}"
                sets = ", ".join(f"{c} = {new(c)}" for c in upd)
                # view_box follows the view's columns (and box '=' compares areas)
                same = [c for c in upd if c != "view_box"]
                old_row = ", ".join(f"o.{c}" for c in same)
                new_row = ", ".join(new(c) for c in same)
                changed = conn.execute(
                    f"INSERT INTO memory_observations AS o ({', '.join(stored)})"
                    f" SELECT {sel} FROM memory_push"
                    f" ON CONFLICT (robot_id, store_id, local_id) DO UPDATE SET {sets},"
                    f" synced_at = now() WHERE ({old_row}) IS DISTINCT FROM ({new_row})"
                ).rowcount
                for model_id, dim in models.items():
                    conn.execute("INSERT INTO memory_models(model_id, dim) VALUES (%s, %s)"
                                 " ON CONFLICT (model_id) DO NOTHING", (model_id, dim))
                conn.execute(
                    "INSERT INTO memory_robots(robot_id, map_id) VALUES (%s, %s)"
                    " ON CONFLICT (robot_id) DO UPDATE SET map_id = EXCLUDED.map_id,"
                    " last_sync = now()", (robot_id, map_id))
                conn.execute(
                    "INSERT INTO memory_sync_state(robot_id, store_id, acked_seq, rows_total)"
                    " VALUES (%s, %s, %s, %s) ON CONFLICT (robot_id, store_id) DO UPDATE SET"
                    " acked_seq = GREATEST(memory_sync_state.acked_seq, EXCLUDED.acked_seq),"
                    " rows_total = memory_sync_state.rows_total + EXCLUDED.rows_total,"
                    " updated = now()", (robot_id, store_id, acked_seq, changed))
                if pause_s > 0:  # tests only: hold the transaction open to be killed in it
                    import time

                    time.sleep(pause_s)
                return int(changed)
        return int(self.run(tx, retry=False))

    def push_places(self, robot_id: str, store_id: str, rows: Sequence[tuple]) -> int:
        """Upsert a robot's named places: rows of (name_key, name, map_id, x, y, radius, frame,
        t, removed). Returns places changed (an identical one is not rewritten)."""
        def tx(conn: Any) -> int:
            with conn.transaction(), conn.cursor() as cur:
                cols = "name, map_id, x, y, radius, frame, t, removed"
                ex = ", ".join("EXCLUDED." + c.strip() for c in cols.split(","))
                n = 0
                old = "p." + cols.replace(", ", ", p.")
                sql = ("INSERT INTO memory_places AS p (robot_id, store_id, name_key, "
                       f"{cols}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                       f" ON CONFLICT (robot_id, store_id, name_key) DO UPDATE SET ({cols},"
                       f" synced_at) = ({ex}, now()) WHERE ({old}) IS DISTINCT FROM ({ex})")
                for r in rows:
                    cur.execute(sql, (robot_id, store_id, *r))
                    n += cur.rowcount
                return n
        return int(self.run(tx, retry=False))

    # ---- reads ----------------------------------------------------------------------------
    def stream_names(self) -> set[str]:
        rows = self.run(lambda c: c.execute(
            "WITH RECURSIVE s AS (SELECT min(stream) AS v FROM memory_observations"
            " WHERE archived_at IS NULL UNION ALL SELECT (SELECT min(stream) FROM"
            " memory_observations WHERE archived_at IS NULL AND stream > s.v) FROM s"
            " WHERE s.v IS NOT NULL) SELECT v FROM s WHERE v IS NOT NULL").fetchall())
        return {r[0] for r in rows}

    def robot_map(self, robot_id: str) -> str | None:
        row = self.run(lambda c: c.execute(
            "SELECT map_id FROM memory_robots WHERE robot_id=%s", (robot_id,)).fetchone())
        return None if row is None else row[0]

    def robots(self) -> list[dict[str, Any]]:
        rows = self.run(lambda c: c.execute(
            "SELECT robot_id, map_id, extract(epoch from last_sync) FROM memory_robots"
            " ORDER BY robot_id").fetchall())
        return [{"robot": r, "map": m, "last_sync": float(s)} for r, m, s in rows]

    def stream_stats(self, robots: Sequence[str] | None = None) -> list[dict[str, Any]]:
        cond, params = "", []
        if robots:
            cond, params = " AND robot_id = ANY(%s)", [list(robots)]
        rows = self.run(lambda c: c.execute(
            "SELECT stream, robot_id, count(*), min(t), max(t), count(model_id)"
            f" FROM memory_observations WHERE archived_at IS NULL{cond}"
            " GROUP BY stream, robot_id ORDER BY stream, robot_id", params).fetchall())
        out: dict[str, dict[str, Any]] = {}
        for stream, robot, n, first, last, nvec in rows:
            e = out.setdefault(stream, {"name": stream, "count": 0, "first_t": first,
                                        "last_t": last, "semantic": False, "robots": []})
            e["count"] += int(n)
            e["first_t"] = min(e["first_t"], first)
            e["last_t"] = max(e["last_t"], last)
            e["semantic"] = e["semantic"] or bool(nvec)
            e["robots"].append({"robot": robot, "count": int(n), "first_t": first,
                                "last_t": last})
        return list(out.values())

    def count(self, robot_id: str | None = None) -> int:
        if robot_id is None:
            row = self.run(lambda c: c.execute(
                "SELECT count(*) FROM memory_observations").fetchone())
        else:
            row = self.run(lambda c: c.execute(
                "SELECT count(*) FROM memory_observations WHERE robot_id=%s",
                (robot_id,)).fetchone())
        return int(row[0])

    def places(self, robots: Sequence[str] | None = None, map_id: str | None = None,
               name_key: str | None = None) -> list[FleetPlace]:
        """Named places (not removed), newest first: of `robots` (all when None), on
        `map_id`, with one name. A robot with several stores: each name's newest state."""
        conds: list[str] = ["TRUE"]
        params: list[Any] = []
        if robots:
            conds.append("robot_id = ANY(%s)")
            params.append(list(robots))
        if name_key is not None:
            conds.append("name_key = %s")
            params.append(name_key)
        sql = ("SELECT name, x, y, radius, frame, t, robot_id, map_id FROM ("
               " SELECT DISTINCT ON (robot_id, name_key) * FROM memory_places"
               f" WHERE {' AND '.join(conds)} ORDER BY robot_id, name_key, t DESC, store_id) p"
               " WHERE NOT removed" + (" AND map_id = %s" if map_id else "")
               + " ORDER BY t DESC, robot_id")
        if map_id:
            params.append(map_id)
        rows = self.run(lambda c: c.execute(sql, params).fetchall())
        return [FleetPlace(*r) for r in rows]

    def pose_robots(self, map_id: str, robots: Sequence[str] | None, t_min: float | None,
                    t_max: float | None) -> list[str]:
        """Robots with a pose on `map_id` in the window (kept or archived rows)."""
        conds: list[str] = ["map_id = %s", "x IS NOT NULL"]
        params: list[Any] = [map_id]
        if robots:
            conds.append("robot_id = ANY(%s)")
            params.append(list(robots))
        time_window(conds, params, "t", t_min, t_max)
        rows = self.run(lambda c: c.execute(
            "SELECT r.robot_id FROM memory_robots r WHERE EXISTS (SELECT 1 FROM"
            f" memory_observations o WHERE o.robot_id = r.robot_id AND {' AND '.join(conds)})"
            " ORDER BY r.robot_id", params).fetchall())
        return [r[0] for r in rows]

    def pose_track(self, robot_id: str, map_id: str, t_min: float | None = None,
                   t_max: float | None = None) -> np.ndarray:
        """(t, x, y) of every row of one robot with a pose on `map_id`, kept or archived, in
        time order: that robot's pose history there (visits), as its own store keeps it."""
        conds: list[str] = ["robot_id = %s", "map_id = %s", "x IS NOT NULL", "y IS NOT NULL"]
        params: list[Any] = [robot_id, map_id]
        time_window(conds, params, "t", t_min, t_max)
        rows = self.run(lambda c: c.execute(
            f"SELECT t, x, y FROM memory_observations WHERE {' AND '.join(conds)}"
            " ORDER BY t, store_id, local_id", params).fetchall())
        return np.asarray(rows, dtype=np.float64).reshape(-1, 3)

    @staticmethod
    def _hit(r: Sequence[Any], score: float | None = None) -> FleetHit:
        (fid, robot, map_id, stream, t, x, y, z, yaw, frame, source, tags, text, ref, model_id,
         note_key, archived_at, local_id, store_id) = r[:_SCORE]
        pose = None
        if x is not None and y is not None:
            pose = Pose(x=x, y=y, z=z or 0.0, yaw=yaw or 0.0, frame=frame or "", source=source)
        obs = Observation(stream=stream, t=t, pose=pose, tags=tags, text=text, ref=ref, id=fid,
                          model_id=model_id, note_key=note_key)
        return FleetHit(obs, robot, map_id, score, archived_at is not None, local_id, store_id)

    # `filt` compiled for PostgreSQL: (conditions on alias o, parameters)
    where = staticmethod(filter_sql.where)

    def ordered(self, where: RowFilter, order_by: str, limit: int, *,
                exclude_models: Iterable[str] = ()) -> list[FleetHit]:
        """Rows passing `where`, ordered by time or a numeric tag ("score": newest first);
        `exclude_models`: leave out rows that have a vector of one of these models."""
        conds, params = self.where(where)
        excl = list(exclude_models)
        if excl:
            conds.append("(o.model_id IS NULL OR o.model_id <> ALL(%s))")
            params.append(excl)
        order, oparams = filter_sql.order(order_by if order_by != "score" else "-time")
        sql_where = ("WHERE " + " AND ".join(conds)) if conds else ""
        sql = (f"SELECT {_SELECT} FROM memory_observations o {sql_where} ORDER BY {order}"
               " LIMIT %s")
        rows = self.run(lambda c: c.execute(sql, params + oparams + [int(limit)]).fetchall())
        return [self._hit(r) for r in rows]

    def nearest(self, where: RowFilter, model_id: str, qvec: np.ndarray, k: int, *,
                min_score: float | None = None, use_hnsw: bool = False) -> list[FleetHit]:
        """The k rows of one model with the highest inner product with qvec among the rows
        passing `where` (and min_score): exact (a scan of the filtered rows) unless
        use_hnsw."""
        conds, params = self.where(where)
        conds.append("o.model_id = %s")
        params.append(model_id)
        q = np.asarray(qvec, np.float32)
        dim = self.hnsw_models().get(model_id) if use_hnsw else None
        emb = f"(o.emb)::vector({int(dim)})" if dim else "o.emb"
        if dim:
            # Literal model id: the planner must see the partial index's predicate.
            from psycopg import sql as psql

            conds[-1] = "o.model_id = " + psql.Literal(model_id).as_string(None)
            params.pop()
        if min_score is not None:
            conds.append(f"-({emb} <#> %s) >= %s")
            params += [q, float(min_score)]
        sql = (f"SELECT {_SELECT}, -({emb} <#> %s) AS score FROM memory_observations o"
               f" WHERE {' AND '.join(conds)} ORDER BY {emb} <#> %s, {ties('DESC')} LIMIT %s")
        args = [q, *params, q, int(k)]

        def go(conn: Any) -> list[Any]:
            if dim:
                with conn.transaction():
                    conn.execute(f"SET LOCAL hnsw.ef_search = {int(self.hnsw_ef_search)}")
                    conn.execute("SET LOCAL hnsw.iterative_scan = "
                                 + {"off": "off", "relaxed_order": "relaxed_order"}.get(
                                     self.hnsw_iterative_scan, "strict_order"))
                    return conn.execute(sql, args).fetchall()
            return conn.execute(sql, args).fetchall()
        return [self._hit(r, float(r[_SCORE])) for r in self.run(go)]

    def ordered_with_scores(self, where: RowFilter, order_by: str,
                            qvecs: dict[str, np.ndarray], min_score: float | None,
                            limit: int) -> list[FleetHit]:
        """Ordered by time or a tag, each row reporting its similarity (None without a
        vector of a queried model); with min_score, rows below it (or unscored) drop out."""
        conds, params = self.where(where)
        cases, cparams = [], []
        for m, q in qvecs.items():
            cases.append("WHEN o.model_id = %s THEN -(o.emb <#> %s)")
            cparams += [m, np.asarray(q, np.float32)]
        score = f"(CASE {' '.join(cases)} END)" if cases else "NULL::float8"
        order, oparams = filter_sql.order(order_by)
        sql_where = ("WHERE " + " AND ".join(conds)) if conds else ""
        inner = f"SELECT {_SELECT}, {score} AS score FROM memory_observations o {sql_where}"
        # the order's columns exist on the subquery alias o too
        outer_cond = "WHERE o.score >= %s" if min_score is not None else ""
        sql = f"SELECT * FROM ({inner}) o {outer_cond} ORDER BY {order} LIMIT %s"
        args = cparams + params + ([float(min_score)] if min_score is not None else [])
        args += list(oparams) + [int(limit)]
        rows = self.run(lambda c: c.execute(sql, args).fetchall())
        return [self._hit(r, None if r[_SCORE] is None else float(r[_SCORE])) for r in rows]
