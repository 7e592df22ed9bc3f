"""`FleetEngine`: the engine's JSON contract served from the fleet store.

It is a `MemoryEngine` whose backend is the fleet's (`FleetBackend`, fleet/backend.py): the
same request parsing, planner, error handling and result shape, plus the fleet fields of
docs/design.md ("Fleet store"): `robot` (one id, a list, or "all"), `map`, and `robot`/`map`
in every result. `save` and `compact` belong to a robot's own memory (memory-sync brings the
result here) and are refused as bad requests.

What is the fleet's own here: a spatial filter applies within one map (the request's `map`,
else the map the robots the request names share, else the asking robot's own map; a named
place brings its own map), places are looked up among the robots', and the streams answer
lists every robot. `near`, `seen_near` and `visits` mean what they mean on a robot, over
what memory-sync brings (places, camera views, every row's pose); visits come from each
robot's own pose track.
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
from memory_node.core.engine import MemoryEngine
from memory_node.core.errors import BadRequest, Unavailable
from memory_node.core.places import place_key
from memory_node.core.query import SearchPlan
from memory_node.fleet.backend import FleetBackend
from memory_node.fleet.credentials import redact, resolve_fleet_url
from memory_node.fleet.store import FleetPlace, FleetStore, FleetUnavailable
from memory_node.fleet.sync import default_map_id, default_robot_id

log = logging.getLogger(__name__)

class FleetEngine(MemoryEngine):
    """The engine over the fleet store: the robot's planner and contract with a
    `FleetBackend`; what is its own is resolving places and maps, visits per robot, and the
    streams answer (with places and robots). Read-only: save and compact are refused."""

    # Every search field is served: robot and map are the fleet's own.
    UNSUPPORTED_SEARCH: dict[str, str] = {}

    def __init__(self, config: MemoryConfig | None = None, *, fleet_url: str,
                 robot_id: str | None = None, map_id: str | None = None,
                 store: FleetStore | None = None, create_schema: bool = False,
                 **kwargs: Any):
        self.fleet_url = fleet_url
        self.robot_id = robot_id or default_robot_id()
        self._map_id = map_id
        self._given_store = store
        self._create_schema = create_schema
        self.fleet_backend: FleetBackend | None = None
        super().__init__(config, **kwargs)

    # ---- lifecycle ----------------------------------------------------------------------
    def open(self) -> None:
        t0 = time.perf_counter()
        store = self._given_store or FleetStore(self.fleet_url, application_name="memory-server")
        try:
            store.ensure_schema(create=self._create_schema)
        except FleetUnavailable:
            store.close()
            raise
        self._load_embedders()
        self.fleet_backend = self.backend = FleetBackend(store)
        log.info("fleet memory opened at %s for robot %r in %.2f s", store.label,
                 self.robot_id, time.perf_counter() - t0)

    @property
    def fleet(self) -> FleetStore:
        """The fleet store searches run over (Unavailable once closed)."""
        if self.fleet_backend is None:
            raise Unavailable("the fleet store is closed")
        return self.fleet_backend.store

    @property
    def serves(self) -> str:
        """What this engine answers from, for a server's log (it has no memory directory)."""
        label = self._given_store.label if self._given_store else redact(self.fleet_url)
        return f"the fleet store {label} (read-only), asked as robot {self.robot_id!r}"

    def close(self) -> bool:
        """Close the fleet store. False, as MemoryEngine.close when no index cache was
        written: the fleet engine has none."""
        if self.fleet_backend is not None:
            self.fleet_backend.store.close()
        self.fleet_backend = self.backend = None
        return False

    def sync(self) -> int:
        return 0  # no in-memory index: PostgreSQL is always current

    def reembed_pending(self) -> int:
        return 0  # robots re-embed their own rows; memory-sync brings the new vectors

    # ---- places and maps ----------------------------------------------------------------
    @property
    def own_map(self) -> str:
        if self._map_id:
            return self._map_id
        return self.fleet.robot_map(self.robot_id) or default_map_id(self.robot_id)

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

    def map_for(self, plan: SearchPlan) -> str | None:
        """The map a spatial filter applies within: the request's `map` (or its place's),
        else the map the robots the request names share, else the asking robot's own."""
        if plan.near is None:
            return None
        if plan.map_id:
            return plan.map_id
        if plan.robots and not plan.near_here:
            maps = {self.fleet.robot_map(r) or default_map_id(r) for r in plan.robots}
            if len(maps) == 1:  # the named robots share one map
                return maps.pop()
        return self.own_map

    def fleet_place(self, name: str, robots: Sequence[str] | None, map_id: str | None
                    ) -> FleetPlace:
        """The place a request's `near` names. Places belong to a robot and a map: the
        asking robot's own place of that name first (when the request names no robot or
        map), else the newest naming among the named robots (all by default) on the named
        map; a name given on several maps needs `map` or `robot` to say which."""
        store = self.fleet
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

    # ---- answers of its own -------------------------------------------------------------
    def _streams(self) -> StreamsAnswer:
        """Every stream with per-robot counts, the places of every robot, and the robots."""
        store = self.fleet
        places = [p.info() for p in sorted(
            store.places(), key=lambda p: (p.name.casefold(), p.robot))]
        return StreamsAnswer.model_validate(
            {"streams": store.stream_stats(), "places": places, "robots": store.robots()})

    def _save(self, note: SaveNote) -> SaveAnswer:
        raise BadRequest("this memory serves the fleet store, which robots fill through "
                         "memory-sync: save the note on the robot's own memory")

    def _compact(self) -> CompactAnswer:
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
