"""The JSON edge of `search` and `save`, and the resolution of a search into a plan.

`read_search` / `read_save` turn a payload (plain text or JSON) into the typed requests of
`contract.py`; `plan_search` resolves a `SearchQuery` against the clock and the known streams
into a `SearchPlan` (absolute times, capped k, a `RowFilter` for the store); `check_tag_names`
holds tag filters and `order_by` to the tags a stream really has. Everything a caller can get
wrong is reported as `BadRequest` before any storage is touched.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from memory_node.core.contract import (
    DEFAULT_RADIUS,
    MAX_JSON_DEPTH,
    RANGE_OPS,
    RESERVED_NOTE_TAGS,
    TAG_KEY,
    SaveNote,
    SearchQuery,
    check_json_values,
    check_text,
    nearest,
    unknown_name,
    validate,
)
from memory_node.core.errors import BadRequest
from memory_node.core.types import RowFilter

__all__ = [
    "DEFAULT_RADIUS",
    "MAX_JSON_DEPTH",
    "RANGE_OPS",
    "RESERVED_NOTE_TAGS",
    "TAG_KEY",
    "SaveRequest",
    "SearchPlan",
    "check_json_values",
    "check_tag_names",
    "check_text",
    "loads_strict",
    "parse_save",
    "parse_search",
    "plan_search",
    "read_save",
    "read_search",
]

# Tags the engine itself writes (note folding, compaction, hand-written notes): always valid
# filter and order keys, even before the first row carries them.
ENGINE_TAGS = {"repeats": True, "last_t": True, "merged": True, "span": False,
               "hand_written": False}


@dataclass
class SearchPlan:
    """A resolved search: absolute times on the caller's clock, k within the cap."""

    streams: tuple[str, ...] | None = None
    semantic_query: str | None = None
    near: tuple[float, float] | None = None
    radius: float = DEFAULT_RADIUS
    near_here: bool = False
    t_min: float | None = None
    t_max: float | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    order_by: str = "-time"
    k: int = 5
    k_capped: bool = False
    min_score: float | None = None
    place: str | None = None  # `near`: the place's name (the engine sets near and radius)
    radius_given: bool = False
    seen_near: bool = False
    include_archived: bool = False
    visits: bool = False
    robots: tuple[str, ...] | None = None  # a fleet store's: these robots' rows (None: all)
    map_id: str | None = None  # a fleet store's: the map `near` is on

    @property
    def filter(self) -> RowFilter:
        """The part of the plan a store applies."""
        return RowFilter(streams=self.streams, near=self.near, radius=self.radius,
                         t_min=self.t_min, t_max=self.t_max, tags=self.tags,
                         seen_near=self.seen_near and self.near is not None,
                         include_archived=self.include_archived, robots=self.robots,
                         map_id=self.map_id if self.near is not None else None)

    @property
    def has_filters(self) -> bool:
        return self.filter.has_filters

    @property
    def empty_window(self) -> bool:
        return self.t_min is not None and self.t_max is not None and self.t_min > self.t_max

    def but(self, **changes: Any) -> SearchPlan:
        return replace(self, **changes)


@dataclass
class SaveRequest:
    """A note to store: its text and tags (validated)."""

    text: str
    tags: dict[str, Any] = field(default_factory=dict)


def _reject_constant(name: str) -> Any:
    raise BadRequest(f"{name} is not allowed in JSON: numbers must be finite")


def loads_strict(raw: str, what: str) -> Any:
    """json.loads that refuses NaN/Infinity and reports syntax errors with their position;
    the parsed value is then held to the limits of `check_json_values`."""
    try:
        obj = json.loads(raw, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON in {what}: {exc.msg} at line {exc.lineno} "
                         f"column {exc.colno}") from None
    except RecursionError:
        raise BadRequest(f"malformed JSON in {what}: nested too deeply") from None
    except ValueError:  # an integer literal past the interpreter's digit limit (4300)
        raise BadRequest(f"{what} holds an integer beyond 64 bits") from None
    check_json_values(obj, what)
    return obj


_JSON_START = set('["-0123456789')
_JSON_WORDS = ("true", "false", "null")


def read_payload(raw: Any, what: str, max_bytes: int, example: str) -> str | dict[str, Any]:
    """A payload as text or a JSON object. A JSON value of another kind (a list, a number,
    true/false/null) is refused: it is a mistake, not words to search for. A JSON string is its
    text."""
    if not isinstance(raw, str):
        raise BadRequest(f"{what} must be a string, got {type(raw).__name__}")
    size = len(raw.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise BadRequest(f"{what} is {size} bytes; the limit is {max_bytes} bytes")
    check_text(what, raw)
    text = raw.strip()
    if text.startswith("{"):
        obj = loads_strict(text, what)
        if not isinstance(obj, dict):  # '{' then something else: cannot parse as an object
            raise BadRequest(f"{what} JSON must be an object")
        return obj
    if text and (text[0] in _JSON_START or text in _JSON_WORDS):
        try:
            value = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError, BadRequest):
            return text  # not JSON at all: words
        if isinstance(value, str):
            check_text(what, value)
            return value.strip()
        kind = {list: "a JSON list", bool: "JSON true/false", type(None): "JSON null"}.get(
            type(value), "a JSON number")
        raise BadRequest(f"{what} is {kind}; send text, or a JSON object such as {example}")
    return text


def read_search(raw: Any, *, max_bytes: int) -> SearchQuery:
    """Plain text is a semantic query over every stream with text; '{...}' is the JSON form."""
    body = read_payload(raw, "search query", max_bytes, '{"stream": "camera", "k": 5}')
    if isinstance(body, str):
        if not body:
            raise BadRequest("empty search query: send text, or a JSON object such as "
                             '{"stream": "camera", "k": 5}')
        return SearchQuery(semantic_query=body)
    return validate(SearchQuery, body, values_checked=True)  # loads_strict checked them


def read_save(raw: Any, *, max_bytes: int) -> SaveNote:
    """Plain text is the note; '{...}' is {"note": "...", "tags": {...}} or a place."""
    body = read_payload(raw, "note", max_bytes, '{"note": "Met Bob at the door"}')
    if isinstance(body, str):
        if not body:
            raise BadRequest("empty note: nothing to remember")
        return SaveNote(note=body)
    return validate(SaveNote, body, values_checked=True)


def plan_search(q: SearchQuery, *, now: float | Callable[[], float],
                known_streams: Collection[str], k_default: int, k_max: int) -> SearchPlan:
    """Resolve times against `now`, check the streams, default and cap k. `now` may be the
    clock itself: it is read only for "seconds ago" fields (a node under simulated time has
    no clock before its first /clock, and a search that needs none still works)."""
    plan = SearchPlan(k=k_default)
    names = q.stream_names
    if names is not None:
        for s in names:
            if s not in known_streams:
                raise BadRequest(unknown_name("stream", s, sorted(known_streams)))
        plan.streams = names
    plan.semantic_query = (q.semantic_query or "").strip() or None
    if q.near_x is not None and q.near_y is not None:
        plan.near = (float(q.near_x), float(q.near_y))
    plan.near_here = bool(q.near_here)
    if q.radius is not None:
        plan.radius = float(q.radius)
        plan.radius_given = True
    plan.place = q.near
    plan.seen_near = bool(q.seen_near)
    plan.include_archived = bool(q.include_archived)
    plan.visits = bool(q.visits)
    plan.robots = robot_ids(q.robot)
    if q.map is not None and not q.map.strip():
        raise BadRequest("'map' must be a map id (a non-empty string)")
    plan.map_id = q.map.strip() if q.map is not None else None
    if q.after_seconds_ago is not None or q.before_seconds_ago is not None:
        plan.t_min, plan.t_max = q.time_window(now() if callable(now) else now)
    else:
        plan.t_min, plan.t_max = q.time_window(0.0)  # absolute bounds only
    plan.tags = dict(q.tags or {})
    if q.order_by is None:
        plan.order_by = "score" if plan.semantic_query else "-time"
    else:
        plan.order_by = q.order_by
    if q.k is not None:
        plan.k = q.k
    if plan.k > k_max:
        plan.k, plan.k_capped = k_max, True
    plan.min_score = q.min_score
    return plan


def robot_ids(robot: str | list[str] | None) -> tuple[str, ...] | None:
    """A fleet query's `robot`: one id, a list, or "all" (also "*" or unset: None)."""
    if robot is None or robot in ("all", "*"):
        return None
    names = [robot] if isinstance(robot, str) else robot
    ids = tuple(dict.fromkeys(r.strip() for r in names))
    if not ids or not all(ids):
        raise BadRequest("'robot' must be a robot id, a list of ids, or \"all\"")
    return ids


def check_tag_names(plan: SearchPlan, catalogue: Mapping[str, Mapping[str, bool]],
                    has_tag: Any = None) -> None:
    """Tag filters and a tag `order_by` must name tags the searched streams have.

    `catalogue` maps stream -> {tag: holds numbers}; `has_tag(streams, tag)` (optional)
    double-checks a miss against the rows themselves (the catalogue is a hint). Streams with
    no rows yet are not checked: there is nothing to suggest."""
    scope = plan.streams if plan.streams is not None else tuple(catalogue)
    known: dict[str, bool] = {}
    for s in scope:
        for tag, is_number in catalogue.get(s, {}).items():
            known[tag] = known.get(tag, False) or is_number
    if not known:
        return
    known = {**{t: n for t, n in ENGINE_TAGS.items() if t not in known}, **known}
    where = f" in {'/'.join(scope)}" if plan.streams is not None else ""

    def exists(tag: str) -> bool:
        return tag in known or (has_tag is not None and has_tag(plan.streams, tag))

    for tag in plan.tags:
        if not exists(tag):
            listed = sorted(t for t in known if t not in ENGINE_TAGS)
            raise BadRequest(unknown_name("tag", tag, listed, where))
    key = plan.order_by
    if key in ("score", "time", "-time"):
        return
    tag = key.lstrip("-")
    numeric = sorted(t for t, n in known.items() if n and t not in ENGINE_TAGS)
    choices = ", ".join(numeric) or "none"
    if tag not in known and not exists(tag):
        guess = nearest(tag, numeric + ["time"])
        sign = "-" if key.startswith("-") else ""
        hint = f"; did you mean '{sign}{guess}'?" if guess else "."
        raise BadRequest(f"unknown order_by '{key}'{where}{hint} Valid: score, time, -time, "
                         f"or a numeric tag with or without '-': {choices}.")
    if tag in known and not known[tag]:
        raise BadRequest(f"order_by '{key}': tag '{tag}' holds no numbers{where}. Numeric "
                         f"tags: {choices}.")


def parse_search(raw: Any, *, now: float, known_streams: Collection[str], k_default: int,
                 k_max: int, max_bytes: int) -> SearchPlan:
    """`read_search` then `plan_search`: a payload straight to a plan."""
    return plan_search(read_search(raw, max_bytes=max_bytes), now=now,
                       known_streams=known_streams, k_default=k_default, k_max=k_max)


def parse_save(raw: Any, *, max_bytes: int) -> SaveNote:
    return read_save(raw, max_bytes=max_bytes)
