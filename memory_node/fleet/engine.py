"""`FleetEngine`: the engine's JSON contract served from the fleet store.

It is the `MemoryEngine` facade composed with the fleet's parts (`fleet_parts`), whose
backend is the fleet's (`FleetBackend`, fleet/backend.py): the same request parsing,
planner, error handling and result shape, plus the fleet fields of
docs/design.md ("Fleet store"): `robot` (one id, a list, or "all"), `map`, and `robot`/`map`
in every result. `save` and `compact` belong to a robot's own memory (memory-sync brings the
result here) and are refused as bad requests.

What is the fleet's own here: a spatial filter applies within one map (the request's `map`,
else the map the robots the request names share, else the asking robot's own map; a named
place brings its own map), places are looked up among the robots', and the streams answer
lists every robot. `near`, `seen_near` and `visits` mean what they mean on a robot, over
what memory-sync brings (places, camera views, every row's pose); visits come from each
robot's own pose track (the robot's `VisitFinder` and planner over the fleet backend).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from memory_node.core.config import MemoryConfig
from memory_node.core.contract import (
    CompactAnswer,
    SaveAnswer,
    SaveNote,
    SearchQuery,
    StreamsAnswer,
    unknown_name,
)
from memory_node.core.engine import EngineParts, MemoryEngine
from memory_node.core.errors import BadRequest, Unavailable
from memory_node.core.operations.search import SearchResolver
from memory_node.core.operations.visits import VisitFinder
from memory_node.core.places import Place, place_key
from memory_node.core.query import SearchPlan
from memory_node.fleet.backend import FleetBackend
from memory_node.fleet.credentials import redact, resolve_fleet_url
from memory_node.fleet.store import FleetPlace, FleetStore, FleetUnavailable
from memory_node.fleet.sync import default_map_id, default_robot_id

log = logging.getLogger(__name__)


class FleetEngine(MemoryEngine):
    """The engine over the fleet store: the robot's facade, planner and contract composed
    with the fleet's parts (`fleet_parts`): its storage, its search resolution (places and
    maps), its streams answer, and save and compact refused (read-only)."""

    # Every search field is served: robot and map are the fleet's own.
    UNSUPPORTED_SEARCH: dict[str, str] = {}

    def __init__(self, config: MemoryConfig | None = None, *, fleet_url: str,
                 robot_id: str | None = None, map_id: str | None = None,
                 store: FleetStore | None = None, create_schema: bool = False,
                 **kwargs: Any):
        self.fleet_url = fleet_url
        self.robot_id = robot_id or default_robot_id()
        self.map_id = map_id
        self.given_store = store
        self.create_schema = create_schema
        self.fleet_backend: FleetBackend | None = None
        super().__init__(config, parts=fleet_parts, **kwargs)

    @property
    def fleet(self) -> FleetStore:
        """The fleet store searches run over (Unavailable once closed)."""
        if self.fleet_backend is None:
            raise Unavailable("the fleet store is closed")
        return self.fleet_backend.store

    def sync(self) -> int:
        """No in-memory index: PostgreSQL is always current (MemoryEngine.sync catches up
        the robot's vector indexes, which the fleet engine has none of)."""
        return 0


def fleet_parts(engine: MemoryEngine) -> EngineParts:
    """The fleet engine's parts: what differs from a robot's own memory."""
    assert isinstance(engine, FleetEngine)
    read_only = ReadOnly()
    return EngineParts(storage=FleetStorage(engine), search=FleetSearch(engine),
                       visits=VisitFinder(engine), save=read_only, compact=read_only,
                       streams=FleetStreams(engine))


class FleetStorage:
    """`Storage` over the fleet store: PostgreSQL opened with the engine (its schema checked
    or created) and the embedders loaded for query vectors."""

    def __init__(self, engine: FleetEngine):
        self.engine = engine

    @property
    def serves(self) -> str:
        """What this engine answers from, for a server's log (it has no memory directory)."""
        eng = self.engine
        label = eng.given_store.label if eng.given_store else redact(eng.fleet_url)
        return f"the fleet store {label} (read-only), asked as robot {eng.robot_id!r}"

    def open(self) -> None:
        eng = self.engine
        t0 = time.perf_counter()
        store = eng.given_store or FleetStore(eng.fleet_url, application_name="memory-server")
        try:
            store.ensure_schema(create=eng.create_schema)
        except FleetUnavailable:
            store.close()
            raise
        eng.models.load()
        eng.fleet_backend = FleetBackend(store)
        eng.backend = eng.fleet_backend
        log.info("fleet memory opened at %s for robot %r in %.2f s", store.label,
                 eng.robot_id, time.perf_counter() - t0)

    def close(self) -> bool:
        """Close the fleet store. False, as a robot's memory when no index cache was
        written: the fleet engine has none."""
        eng = self.engine
        if eng.fleet_backend is not None:
            eng.fleet_backend.store.close()
        eng.fleet_backend = eng.backend = None
        return False

    def reembed_pending(self) -> int:
        return 0  # robots re-embed their own rows; memory-sync brings the new vectors


class FleetSearch(SearchResolver):
    """The robot's search resolution, with places and maps looked up in the fleet."""

    def __init__(self, engine: FleetEngine):
        super().__init__(engine)
        self.engine = engine

    @property
    def own_map(self) -> str:
        eng = self.engine
        if eng.map_id:
            return eng.map_id
        return eng.fleet.robot_map(eng.robot_id) or default_map_id(eng.robot_id)

    def plan(self, query: SearchQuery) -> SearchPlan:
        """The robot's planning, then the map a circle is on (see map_for)."""
        plan = super().plan(query)
        plan.map_id = self.map_for(plan)
        return plan

    def check_tags(self, plan: SearchPlan) -> None:
        """The fleet store keeps no tag catalogue: tag names are not checked."""

    def resolve_place(self, plan: SearchPlan, name: str) -> None:
        """A named place is looked up in the fleet (whose, on which map), not in notes; it
        brings its map."""
        place = self.fleet_place(name, plan.robots, plan.map_id)
        plan.near = (place.x, place.y)
        if not plan.radius_given:
            plan.radius = place.radius
        plan.map_id = place.map_id or plan.map_id

    def place(self, name: str) -> Place:
        """The named place as a search would find it (see fleet_place)."""
        return self.fleet_place(name, None, None)

    def map_for(self, plan: SearchPlan) -> str | None:
        """The map a spatial filter applies within: the request's `map` (or its place's),
        else the map the robots the request names share, else the asking robot's own."""
        if plan.near is None:
            return None
        if plan.map_id:
            return plan.map_id
        if plan.robots and not plan.near_here:
            fleet = self.engine.fleet
            maps = {fleet.robot_map(r) or default_map_id(r) for r in plan.robots}
            if len(maps) == 1:  # the named robots share one map
                return maps.pop()
        return self.own_map

    def fleet_place(self, name: str, robots: Sequence[str] | None, map_id: str | None
                    ) -> FleetPlace:
        """The place a request's `near` names. Places belong to a robot and a map: the
        asking robot's own place of that name first (when the request names no robot or
        map), else the newest naming among the named robots (all by default) on the named
        map; a name given on several maps needs `map` or `robot` to say which."""
        store = self.engine.fleet
        key = place_key(name)
        if not robots and map_id is None:
            own = store.places([self.engine.robot_id], None, key)
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


class FleetStreams:
    """Every stream with per-robot counts, the places of every robot, and the robots."""

    def __init__(self, engine: FleetEngine):
        self.engine = engine

    def answer(self) -> StreamsAnswer:
        store = self.engine.fleet
        places = [p.info() for p in sorted(
            store.places(), key=lambda p: (p.name.casefold(), p.robot))]
        return StreamsAnswer.model_validate(
            {"streams": store.stream_stats(), "places": places, "robots": store.robots()})


class ReadOnly:
    """`save` and `compact` belong to a robot's own memory (memory-sync brings the result
    to the fleet store): refused as bad requests."""

    def save(self, note: SaveNote) -> SaveAnswer:
        raise BadRequest("this memory serves the fleet store, which robots fill through "
                         "memory-sync: save the note on the robot's own memory")

    def compact(self) -> CompactAnswer:
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
