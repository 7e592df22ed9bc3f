"""Search resolution: a request becomes a plan (against the clock, the streams, the tags, the
named places and the current pose), and the plan's answer comes from the one planner over the
engine's backend. A store served from elsewhere resolves places and tags its own way by
subclassing `SearchResolver` (the fleet's, in fleet/engine.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from memory_node.core.contract import SearchAnswer, SearchQuery, VisitsAnswer, unknown_name
from memory_node.core.errors import BadRequest, Unavailable
from memory_node.core.operations.host import Host
from memory_node.core.places import Place
from memory_node.core.planner import QueryPlanner
from memory_node.core.query import SearchPlan, check_tag_names, plan_search


class StreamNames:
    """The stream names a search may use; a miss refreshes the engine's cache once (another
    process may have written a new stream), so validation stays off the database."""

    def __init__(self, host: Host):
        self.host = host

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.host.has_stream(name)

    def __len__(self) -> int:
        return len(self.host.known_streams())

    def __iter__(self) -> Iterator[str]:
        return iter(self.host.known_streams())


class SearchResolver:
    """Plans a search and answers it (visits go to the engine's visits part)."""

    def __init__(self, host: Host):
        self.host = host

    def plan(self, query: SearchQuery) -> SearchPlan:
        """Resolve a search against the clock, the streams, the tags, the named places and
        the current pose."""
        host = self.host
        for name, feature in host.UNSUPPORTED_SEARCH.items():
            value = getattr(query, name)
            if value is not None and value is not False:
                raise BadRequest(f"'{name}' is not supported by this memory ({feature})")
        cfg = host.config
        plan = plan_search(query, now=host.clock, known_streams=StreamNames(host),
                           k_default=cfg.k_default, k_max=cfg.k_max)
        if plan.tags or plan.order_by not in ("score", "time", "-time"):
            self.check_tags(plan)
        if plan.near_here:
            pose = host.pose_provider()
            if pose is None:
                raise Unavailable("near_here: the robot's current pose is unknown (no TF "
                                  "from the world frame to the base frame yet)")
            if pose.stale:
                raise Unavailable(f"near_here: the robot's newest pose is {pose.age_s:.2f} s old "
                                  "(older than max_pose_age_s): TF is not arriving or lags")
            plan.near = (pose.x, pose.y)
        if plan.place is not None:
            self.resolve_place(plan, plan.place)
        return plan

    def check_tags(self, plan: SearchPlan) -> None:
        """Refuse tag names no row has (with the nearest known names)."""
        store = self.host._store
        catalogue = store.tag_catalogue()
        if catalogue is not None:
            check_tag_names(plan, catalogue, store.has_tag)

    def resolve_place(self, plan: SearchPlan, name: str) -> None:
        """A named place becomes the plan's circle (its radius unless the query gave one)."""
        place = self.place(name)
        plan.near = (place.x, place.y)
        if not plan.radius_given:
            plan.radius = place.radius

    def place(self, name: str) -> Place:
        """The named place, or BadRequest naming the places there are."""
        places = self.host._places
        place = places.get(name)
        if place is None:
            raise BadRequest(unknown_name("place", name, places.names()))
        return place

    def answer(self, query: SearchQuery) -> SearchAnswer | VisitsAnswer:
        """`search`: the answer to one query; raises ContractError."""
        host = self.host
        plan = self.plan(query)
        if plan.visits:
            return host.run_visits(plan)
        pairs, notes = self.run(plan)
        if plan.semantic_query and (plan.streams is None or "camera" in plan.streams):
            waiting = host.reembed_pending()
            if waiting:
                notes.append(f"{waiting} camera rows still carry vectors of an earlier model "
                             f"and are being re-embedded with {host.camera_model_id()} in the "
                             "background; until then their scores do not compare with the "
                             "others'")
        if host.disk is not None:  # rows the disk budget removed from this window
            notes += host.disk.search_notes(plan.streams, plan.t_min)
        backend = host._backend
        results = [backend.result(row, score) for row, score in pairs]
        if plan.k_capped:
            notes.append(f"k capped at {host.config.k_max}")
        return SearchAnswer.model_validate(
            {"results": results, "count": len(results), "notes": notes or None})

    def run(self, plan: SearchPlan) -> tuple[list[tuple[Any, float | None]], list[str]]:
        """A resolved plan's rows (the backend's: an Observation on a robot) and scores, and
        notes for the answer: the one planner over the engine's backend."""
        return QueryPlanner(self.host._backend, self.host.query_vector).run(plan)
