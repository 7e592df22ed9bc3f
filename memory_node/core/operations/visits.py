"""Visits as an answer: the planner finds them over the engine's backend (a robot's own pose
history, or each robot's in a fleet); this adds what the disk budget says about the history
and lists them."""

from __future__ import annotations

from collections.abc import Sequence

from memory_node.core.contract import Visit, VisitsAnswer
from memory_node.core.operations.host import Host
from memory_node.core.planner import EMPTY_WINDOW, QueryPlanner
from memory_node.core.query import SearchPlan
from memory_node.core.visits import VisitSpan


class VisitFinder:
    """Answers a visits search (`"visits": true` with a circle)."""

    def __init__(self, host: Host):
        self.host = host

    def run(self, plan: SearchPlan) -> VisitsAnswer:
        """Visits to the plan's circle within its time window, from the pose history (kept
        and archived rows with a pose), with notes where it is missing. A fleet answers from
        each robot's own track on the circle's map, and each visit names its robot."""
        host = self.host
        if plan.empty_window:
            return VisitsAnswer(notes=[EMPTY_WINDOW])
        disk = host.disk
        # a pose history the disk budget made coarser than the gap threshold
        coarse = disk.visit_notes(plan.t_min)[1] if disk is not None else None
        planner = QueryPlanner(host._backend, host.query_vector)
        spans, notes = planner.visits(plan, host.config.visit_gap_s, host.clock, coarse)
        if disk is not None:  # pose history the disk budget downsampled
            notes += disk.visit_notes(plan.t_min)[0]
        return self.answer(spans, notes)

    def answer(self, spans: Sequence[tuple[VisitSpan, str | None]],
               notes: list[str]) -> VisitsAnswer:
        """The answer from visits in time order, each naming its robot in a fleet."""
        k_max = self.host.config.k_max
        visits = [Visit(start=round(v.start, 3), end=round(v.end, 3),
                        duration_s=round(v.duration, 3),
                        **({} if robot is None else {"robot": robot})) for v, robot in spans]
        shown = visits
        if len(visits) > k_max:
            shown = visits[-k_max:]
            notes.append(f"{len(visits)} visits: the newest {k_max} are listed; "
                         "count, total_s, first and last count them all")
        return VisitsAnswer(
            visits=shown, count=len(visits),
            total_s=round(sum(v.duration for v, _ in spans), 3),
            first=min(v.start for v in visits) if visits else None,
            last=max(v.end for v in visits) if visits else None, notes=notes or None)
