"""`FleetEngine`: the engine's JSON contract served from the fleet store.

It is a `MemoryEngine` whose store is PostgreSQL: the same request parsing, error handling and
result shape, plus the fleet fields of docs/design.md ("Fleet store"): `robot` (one id, a
list, or "all"), `map`, and `robot`/`map` in every result. `save` and `compact` belong to a
robot's own memory (memory-sync brings the result here) and are refused as bad requests.

Planning: every filter is a SQL condition, so filtered answers are exact top-k of the rows
that pass (`ORDER BY emb <#> q` over them). An unfiltered semantic search (at most a stream
restriction) uses the model's HNSW index when one exists, with pgvector's iterative scan.
A spatial filter applies within one map: the request's `map`, else the map the robots the
request names share, else the asking robot's own map. A named place brings its own map.
`near`, `seen_near` and `visits` mean what they mean on a robot, over what memory-sync brings
(places, camera views, every row's pose); visits come from each robot's own pose track.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from memory_node.core.config import MemoryConfig
from memory_node.core.contract import VisitsAnswer, unknown_name
from memory_node.core.engine import MemoryEngine
from memory_node.core.errors import BadRequest, Unavailable
from memory_node.core.places import place_key
from memory_node.core.query import SEARCH_FIELDS, SearchRequest, loads_strict
from memory_node.core.visits import VisitSpan
from memory_node.fleet.credentials import redact, resolve_fleet_url
from memory_node.fleet.store import FleetHit, FleetPlace, FleetStore, FleetUnavailable
from memory_node.fleet.sync import default_map_id, default_robot_id

log = logging.getLogger("memory_node.fleet.engine")

FLEET_FIELDS = ("robot", "map")


class FleetEngine(MemoryEngine):
    # Every search field is served: robot and map are taken off the request before planning.
    UNSUPPORTED_SEARCH: dict[str, str] = {}

    def __init__(self, config: MemoryConfig | None = None, *, fleet_url: str,
                 robot_id: str | None = None, map_id: str | None = None,
                 store: FleetStore | None = None, create_schema: bool = False,
                 **kwargs: Any):
        self.fleet_url = fleet_url
        self.robot_id = robot_id or default_robot_id()
        self._map_id = map_id
        self._fleet_store = store
        self._create_schema = create_schema
        self._models: dict[str, int] | None = None
        self._models_at = 0.0
        super().__init__(config, **kwargs)

    # ---- lifecycle ----------------------------------------------------------------------
    def open(self) -> None:
        t0 = time.perf_counter()
        store = self._fleet_store or FleetStore(self.fleet_url, application_name="memory-server")
        try:
            store.ensure_schema(create=self._create_schema)
        except FleetUnavailable:
            store.close()
            raise
        self._load_embedders()
        self.store = store  # type: ignore[assignment]  # the fleet store serves the reads
        log.info("fleet memory opened at %s for robot %r in %.2f s", store.label,
                 self.robot_id, time.perf_counter() - t0)

    @property
    def serves(self) -> str:
        """What this engine answers from, for a server's log (it has no memory directory)."""
        label = self._fleet_store.label if self._fleet_store else redact(self.fleet_url)
        return f"the fleet store {label} (read-only), asked as robot {self.robot_id!r}"

    def close(self) -> bool:
        """Close the fleet store. False, as MemoryEngine.close when no index cache was
        written: the fleet engine has none."""
        if self.store is not None:
            self.store.close()
        self.store = None
        return False

    def sync(self) -> int:
        return 0  # no in-memory index: PostgreSQL is always current

    # ---- fleet fields -------------------------------------------------------------------
    @property
    def own_map(self) -> str:
        if self._map_id:
            return self._map_id
        return self.store.robot_map(self.robot_id) or default_map_id(self.robot_id)

    def split_fleet_fields(self, query: str) -> tuple[str, list[str] | None, str | None,
                                                      bool]:
        """(query without the fleet fields, robots or None for all, map or None,
        include_archived)."""
        text = query.strip() if isinstance(query, str) else ""
        if not text.startswith("{"):
            return query, None, None, False
        obj = loads_strict(text, "search query")
        if not isinstance(obj, dict):
            return query, None, None, False
        robot = obj.pop("robot", None)
        map_id = obj.pop("map", None)
        archived = False
        if "include_archived" not in SEARCH_FIELDS:
            archived = obj.pop("include_archived", False)
            if archived is not None and not isinstance(archived, bool):
                raise BadRequest("'include_archived' must be true or false")
        robots: list[str] | None
        if robot is None or robot == "all" or robot == "*":
            robots = None
        elif isinstance(robot, str) and robot.strip():
            robots = [robot.strip()]
        elif (isinstance(robot, list) and robot
              and all(isinstance(r, str) and r.strip() for r in robot)):
            robots = list(dict.fromkeys(r.strip() for r in robot))
        else:
            raise BadRequest("'robot' must be a robot id, a list of ids, or \"all\"")
        if map_id is not None and not (isinstance(map_id, str) and map_id.strip()):
            raise BadRequest("'map' must be a map id (a non-empty string)")
        return json.dumps(obj), robots, (map_id.strip() if map_id else None), bool(archived)

    def map_for(self, req: SearchRequest, robots: list[str] | None, map_id: str | None
                ) -> str | None:
        if req.near is None:
            return None
        if map_id:
            return map_id
        if robots and not req.near_here:
            maps = {self.store.robot_map(r) or default_map_id(r) for r in robots}
            if len(maps) == 1:  # the named robots share one map
                return maps.pop()
        return self.own_map

    def models(self) -> dict[str, int]:
        """Embedding models with vectors in the fleet (refreshed every few seconds)."""
        if self._models is None or time.monotonic() - self._models_at > 5.0:
            rows = self.store.run(lambda c: c.execute(
                "SELECT model_id, dim FROM memory_models").fetchall())
            self._models, self._models_at = dict(rows), time.monotonic()
        return self._models

    # ---- JSON contract ------------------------------------------------------------------
    def search_dict(self, query: str) -> dict[str, Any]:
        try:
            query, robots, map_id, archived = self.split_fleet_fields(query)
            q = self.read_search(query)
            # A named place is looked up in the fleet (whose, on which map), not in notes.
            req = self.plan(q.model_copy(update={"near": None}) if q.near else q)
            if q.near:
                place = self.fleet_place(q.near, robots, map_id)
                req.near = (place.x, place.y)
                if not req.radius_given:
                    req.radius = place.radius
                map_id = place.map_id
            if req.visits:
                return self.fleet_visits(req, robots, map_id).model_dump()
            archived = archived or bool(getattr(req, "include_archived", False))
            hits, notes = self.run_fleet_search(req, robots, map_id, archived)
        except FleetUnavailable as exc:
            raise Unavailable(str(exc)) from None
        results = [h.to_result() for h in hits]
        out: dict[str, Any] = {"ok": True, "results": results, "count": len(results)}
        if req.k_capped:
            notes.append(f"k capped at {self.config.k_max}")
        if notes:
            out["notes"] = notes
        return out

    def fleet_place(self, name: str, robots: list[str] | None, map_id: str | None
                    ) -> FleetPlace:
        """The place a request's `near` names. Places belong to a robot and a map: the
        asking robot's own place of that name first (when the request names no robot or
        map), else the newest naming among the named robots (all by default) on the named
        map; a name given on several maps needs `map` or `robot` to say which."""
        store: FleetStore = self.store  # type: ignore[assignment]
        key = place_key(name)
        if not robots and map_id is None:
            own = store.places([self.robot_id], None, key)
            if own:
                return own[0]
        found = store.places(robots, map_id, key)
        if not found:
            known = sorted({p.name for p in store.places(robots, map_id)}, key=str.casefold)
            where = "" if not robots else f" of robot {', '.join(robots)}"
            where += "" if map_id is None else f" on map {map_id}"
            raise BadRequest(unknown_name("place", name, known, where))
        maps: dict[str | None, list[str]] = {}
        for p in found:
            maps.setdefault(p.map_id, []).append(p.robot)
        if len(maps) > 1:
            said = "; ".join(f"map {m} (robot {', '.join(sorted(set(r)))})"
                             for m, r in maps.items())
            raise BadRequest(f"place '{name}' is named on {len(maps)} maps: {said}. A map's "
                             "coordinates mean nothing on another: give 'map' or 'robot'")
        return found[0]

    def fleet_visits(self, req: SearchRequest, robots: list[str] | None,
                     map_id: str | None) -> VisitsAnswer:
        """Visits to the circle on one map, from each robot's own pose history there (a
        robot's track never joins another's); each visit names its robot. By default every
        robot with a pose on that map in the window."""
        assert req.near is not None
        if req.empty_window:
            return VisitsAnswer(notes=["the time window is empty (its start is after its end)"])
        store: FleetStore = self.store  # type: ignore[assignment]
        the_map = self.map_for(req, robots, map_id)
        assert the_map is not None  # req.near is set
        lo, hi = self.visit_track_window(req)
        who = list(robots) if robots else store.pose_robots(the_map, None, lo, hi)
        spans: list[tuple[VisitSpan, dict[str, Any]]] = []
        notes: list[str] = []
        for robot in who:
            got, said = self.visit_spans(req, store.pose_track(robot, the_map, lo, hi))
            spans += [(v, {"robot": robot}) for v in got]
            notes += said if len(who) == 1 else [f"{robot}: {n}" for n in said]
        if not who:
            notes.append(f"no robot has pose history on map {the_map} in this time window, "
                         "so visits are not known")
        spans.sort(key=lambda p: (p[0].start, p[1]["robot"]))
        return self.visits_answer(spans, notes)

    def run_fleet_search(self, req: SearchRequest, robots: list[str] | None,
                         map_id: str | None, archived: bool = False
                         ) -> tuple[list[FleetHit], list[str]]:
        notes: list[str] = []
        if req.empty_window:
            return [], ["the time window is empty (its start is after its end)"]
        store: FleetStore = self.store  # type: ignore[assignment]
        the_map = self.map_for(req, robots, map_id)
        if not req.semantic_query:
            return store.ordered(req, robots, the_map, req.k, include_archived=archived), notes
        qvecs = {}
        for m in self.models():
            v = self.query_vector(m, req.semantic_query)
            if v is not None:
                qvecs[m] = v
        if not qvecs:
            notes.append("no embedded rows of a loaded model: semantic_query ignored, "
                         "newest first")
            req_time = SearchRequest(**{**req.__dict__, "order_by": "-time"})
            return store.ordered(req_time, robots, the_map, req.k,
                                 include_archived=archived), notes
        if req.order_by != "score":
            return store.ordered_with_scores(req, robots, the_map, qvecs, req.k,
                                             include_archived=archived), notes
        filtered = req.has_filters or bool(robots) or archived
        hnsw = store.hnsw_models() if not filtered else {}
        hits: list[FleetHit] = []
        for m, q in qvecs.items():
            hits += store.nearest(req, robots, the_map, m, q, req.k, include_archived=archived,
                                  use_hnsw=m in hnsw)
        hits.sort(key=FleetHit.rank_key, reverse=True)  # ties: the robot's order
        hits = hits[:req.k]
        missing = req.k - len(hits)
        if missing > 0 and req.min_score is None:
            req_time = SearchRequest(**{**req.__dict__, "order_by": "-time"})
            hits += store.ordered(req_time, robots, the_map, missing, include_archived=archived,
                                  exclude_models=list(qvecs))
        return hits, notes

    def streams_dict(self) -> dict[str, Any]:
        try:
            places = [p.info() for p in sorted(
                self.store.places(), key=lambda p: (p.name.casefold(), p.robot))]
            return {"ok": True, "streams": self.store.stream_stats(),
                    "places": places, "robots": self.store.robots()}
        except FleetUnavailable as exc:
            raise Unavailable(str(exc)) from None

    def save_dict(self, note: str) -> dict[str, Any]:
        raise BadRequest("this memory serves the fleet store, which robots fill through "
                         "memory-sync: save the note on the robot's own memory")

    def compact_dict(self) -> dict[str, Any]:
        raise BadRequest("compaction runs on each robot's own memory (memory-sync brings "
                         "its archives to the fleet store)")


def open_engine(config: MemoryConfig | None = None, *, fleet_url: str | None = None,
                robot_id: str | None = None, map_id: str | None = None,
                **kwargs: Any) -> FleetEngine:
    """The engine over the fleet store, for `memory-server -p backend:=fleet` and
    `memory-mcp --fleet-url`. `fleet_url` is the parameter/option value (it may not carry a
    password); unset, $MEMORY_FLEET_URL or $MEMORY_FLEET_URL_FILE. kwargs go to the engine
    (clock, pose_provider, text_embedder, ...). Raises ValueError without a URL and
    FleetUnavailable when the database cannot be reached."""
    url = resolve_fleet_url(fleet_url)
    if not url:
        raise ValueError("backend fleet needs fleet_url (or $MEMORY_FLEET_URL)")
    return FleetEngine(config, fleet_url=url, robot_id=robot_id, map_id=map_id, **kwargs)
