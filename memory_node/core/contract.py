"""The JSON contract (docs/design.md) as typed models: defined once, used everywhere.

Requests (`SearchQuery`, `SaveNote`) and answers (`SearchAnswer`, `VisitsAnswer`,
`SaveAnswer`, `CompactAnswer`, `StreamsAnswer`, `ErrorAnswer`) are pydantic v2 models. The
engine takes and returns them; JSON is parsed and written only at the edges (the engine's
string methods that the ROS server wraps, the CLI, the MCP server and the skills). The field
descriptions are written for an LLM: the skills' and MCP tools' JSON schemas are generated
from these fields (`tool_parameters`), and docs/design.md's field table is checked against
them by a test.

Validation errors are turned into short sentences by `explain` (pydantic's own texts are
long and name internal types); checks that span fields raise `PydanticCustomError` with the
message itself.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, to_json

from memory_node.core.errors import BadRequest
from memory_node.core.types import Observation, Pose

__all__ = [
    "DEFAULT_K",
    "DEFAULT_RADIUS",
    "ERROR_CODES",
    "RANGE_OPS",
    "RESERVED_NOTE_TAGS",
    "TAG_KEY",
    "CompactAnswer",
    "ErrorAnswer",
    "ErrorBody",
    "PlaceInfo",
    "PoseOut",
    "ResultItem",
    "SaveAnswer",
    "SaveNote",
    "SearchAnswer",
    "SearchQuery",
    "StreamInfo",
    "StreamsAnswer",
    "SummaryStep",
    "Visit",
    "VisitsAnswer",
    "check_json_values",
    "check_text",
    "explain",
    "nearest",
    "pose_out",
    "read_answer",
    "result_fields",
    "tool_parameters",
    "validate",
]

TAG_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
RANGE_OPS = ("gt", "gte", "lt", "lte")
DEFAULT_RADIUS = 2.0
DEFAULT_K = 5
# Tags the engine writes itself on notes (folding counts repeats): a caller may filter on them
# but not set them.
RESERVED_NOTE_TAGS = ("repeats", "last_t")
ERROR_CODES = ("bad_request", "not_active", "unavailable", "internal")
# Limits on what a request may hold, checked before anything else looks at it: JSON nested
# deeper than this, integers beyond 64 bits (SQLite's integers), non-finite numbers, NUL
# characters (a ROS String ends at the first NUL) and lone surrogates (not UTF-8) are refused.
MAX_JSON_DEPTH = 32
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


# ---- limits on every value ------------------------------------------------------------------

def check_text(name: str, text: str) -> None:
    """A text field must be UTF-8 text without NUL (ROS would cut it there)."""
    if "\x00" in text:
        raise BadRequest(f"{name} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"{name} is not valid UTF-8 text (a lone surrogate)") from None


def check_json_values(obj: Any, what: str) -> None:
    """Every value of a request within the limits above (iterative: any depth is safe).

    Errors name the top-level field the bad value is under."""
    stack: list[tuple[Any, int, str]] = [(obj, 0, what)]
    while stack:
        value, depth, name = stack.pop()
        if isinstance(value, str):
            check_text(name, value)
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not INT64_MIN <= value <= INT64_MAX:
                raise BadRequest(f"{name} holds an integer beyond 64 bits")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise BadRequest(f"{name} holds a number too large to be finite")
        elif isinstance(value, (list, tuple, dict)):
            if depth >= MAX_JSON_DEPTH:
                raise BadRequest(f"{name} is nested more than {MAX_JSON_DEPTH} levels deep")
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise BadRequest(f"a field name in {name} is not a string")
                    check_text(f"a field name in {name}", key)
                    stack.append((item, depth + 1, f"'{key[:64]}'" if depth == 0 else name))
            else:
                stack.extend((item, depth + 1, name) for item in value)


def nearest(name: str, choices: Iterable[str]) -> str | None:
    """The valid name closest to a misspelt one, or None when nothing is close."""
    choices = list(choices)
    match = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    if not match:
        low = {c.lower(): c for c in choices}
        match = difflib.get_close_matches(name.lower(), list(low), n=1, cutoff=0.6)
        match = [low[m] for m in match]
    return match[0] if match else None


def unknown_name(what: str, name: str, choices: Sequence[str], where: str = "") -> str:
    """"unknown field 'x'; did you mean 'y'? Valid: a, b." - the one shape such errors take,
    so a model can correct itself from the answer alone."""
    guess = nearest(name, choices)
    msg = f"unknown {what} '{name[:64]}'{where}"
    msg += f"; did you mean '{guess}'?" if guess else "."
    return msg + f" Valid: {', '.join(choices) if choices else 'none yet'}."


def _fail(message: str) -> PydanticCustomError:
    return PydanticCustomError("contract", "{message}", {"message": message})


def iso_seconds(text: str) -> float:
    """Seconds since the epoch of an ISO-8601 time ('Z' or no zone: UTC); ValueError when it
    is none. One reading for the search contract and every command that takes a time."""
    stamp = text.strip()
    if stamp.endswith("Z"):
        stamp = stamp[:-1] + "+00:00"
    dt = datetime.fromisoformat(stamp)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def _parse_time(name: str, value: Any) -> float:
    """Absolute time: seconds since the epoch, or an ISO-8601 string (UTC when no zone)."""
    if isinstance(value, str):
        try:
            return iso_seconds(value)
        except ValueError:
            raise _fail(f"'{name}' must be seconds since the epoch or an ISO-8601 time, "
                        f"got {value[:64]!r}") from None
    return float(value)


def _check_tag_value(name: str, value: Any, *, allow_range: bool) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _fail(f"tag '{name}' must be finite")
        return value
    if allow_range and isinstance(value, dict):
        if not value or set(value) - set(RANGE_OPS):
            raise _fail(f"tag filter '{name}' as an object takes only {', '.join(RANGE_OPS)}")
        out = {}
        for op, bound in value.items():
            if isinstance(bound, bool) or not isinstance(bound, (int, float)):
                raise _fail(f"'tags.{name}.{op}' must be a number, got {_json_kind(bound)}")
            out[op] = float(bound)
        return out
    if not allow_range and isinstance(value, (list, tuple)):
        return [_check_tag_value(name, v, allow_range=False) for v in value]
    raise _fail(f"tag '{name}' has an unsupported value type {_json_kind(value)}")


def _check_tags(tags: Mapping[str, Any], *, allow_range: bool) -> dict[str, Any]:
    out = {}
    for key, value in tags.items():
        if not TAG_KEY.match(key):
            raise _fail(f"tag name {key[:64]!r} must match {TAG_KEY.pattern}")
        out[key] = _check_tag_value(key, value, allow_range=allow_range)
    return out


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# ---- field types: each carries its own checks, so a tool model picking the field keeps them

def _integral(v: Any) -> Any:
    # 5.0 is 5 (JSON has one number type); 2.5, true and "5" are not counts.
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return v


def _names(v: list[str], info: ValidationInfo) -> list[str]:
    if not v:
        if info.field_name == "robot":
            raise _fail("'robot' must be a robot id, a list of ids, or \"all\"")
        raise _fail("'stream' must be a stream name or a list of names")
    return v


def _time_value(v: float | str, info: ValidationInfo) -> float | str:
    if isinstance(v, str):
        _parse_time(info.field_name or "time", v)
    return v


def _order_key(v: str) -> str:
    key = v.strip().lstrip("+")
    bare = key[1:] if key.startswith("-") else key
    if key not in ("score", "time", "-time") and not TAG_KEY.match(bare):
        raise _fail("'order_by' must be 'score', 'time', '-time' or a numeric tag name such "
                    "as '-brightness'")
    return key


def _note_tags(v: dict[str, Any]) -> dict[str, Any]:
    tags = _check_tags(v, allow_range=False)
    reserved = sorted(set(tags) & set(RESERVED_NOTE_TAGS))
    if reserved:
        raise _fail(f"tag(s) {', '.join(reserved)} are reserved: the memory sets them when it "
                    "folds a repeated note")
    return tags


Names = str | Annotated[list[str], AfterValidator(_names)]
Count = Annotated[int, Field(ge=1), BeforeValidator(_integral)]
TimeValue = Annotated[float | str, AfterValidator(_time_value)]
OrderKey = Annotated[str, AfterValidator(_order_key)]
SearchTags = Annotated[dict[str, Any], AfterValidator(lambda v: _check_tags(v, allow_range=True))]
NoteTags = Annotated[dict[str, Any], AfterValidator(_note_tags)]


# ---- requests -------------------------------------------------------------------------------

VALUES_CHECKED = "values_checked"  # validation context: check_json_values has run
_CHECKED = {VALUES_CHECKED: True}


class Request(BaseModel):
    """A request: unknown fields refused, values held to the limits above, no coercion of
    strings to numbers (ints are accepted where a number is asked for)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    # field -> what it must be, in words, for error messages ("a number", "true or false").
    expects: ClassVar[dict[str, str]] = {}
    what: ClassVar[str] = "request"

    @model_validator(mode="before")
    @classmethod
    def _limits(cls, data: Any, info: ValidationInfo) -> Any:
        # A request parsed from JSON text had every value checked as it was read.
        if isinstance(data, dict) and not (info.context or {}).get(VALUES_CHECKED):
            try:
                check_json_values(data, cls.what)
            except BadRequest as exc:
                raise _fail(exc.message) from None
        return data

    def to_json(self) -> str:
        """The JSON form (only the fields that were set), as a client sends it."""
        return json.dumps(self.model_dump(exclude_none=True), ensure_ascii=False,
                          allow_nan=False)


class SearchQuery(Request):
    """`/memory/search` as JSON; plain text is `{"semantic_query": text}` over every stream."""

    what: ClassVar[str] = "search query"
    expects: ClassVar[dict[str, str]] = {
        "stream": "a stream name or a list of names", "k": "a positive integer",
        "near_here": "true or false", "seen_near": "true or false",
        "include_archived": "true or false", "visits": "true or false",
        "tags": "an object", "robot": "a robot id or a list of ids",
        "after": "seconds since the epoch or an ISO-8601 time",
        "before": "seconds since the epoch or an ISO-8601 time",
    }

    stream: Names | None = Field(
        None, description="The stream to search (see the stream list), or a list of names. "
        "Omit to search every stream.")
    semantic_query: str | None = Field(
        None, description="What to look for, in words; matched by meaning (e.g. 'red door', "
        "'person waving'). Omit to list newest first (or by order_by).")
    near_x: float | None = Field(
        None, description="World x in metres of the place to search around; give it with "
        "near_y. Take it from a result's 'x=' or from the [Current pose: x=…] line.")
    near_y: float | None = Field(
        None, description="World y in metres of the place to search around; give it with "
        "near_x.")
    near: str | None = Field(
        None, description="A named place to search around, instead of near_x/near_y; the "
        "radius defaults to the place's.")
    near_here: bool | None = Field(
        None, description="true: search around the robot's current position.")
    radius: float | None = Field(
        None, gt=0, description="Search radius in metres around the centre (near_x/near_y, "
        "near or near_here); default 2. Needs a centre.")
    after_seconds_ago: float | None = Field(
        None, ge=0, description="Only observations from the last N seconds (600 = the last "
        "10 minutes).")
    before_seconds_ago: float | None = Field(
        None, ge=0, description="Only observations at least N seconds old (3600 = before "
        "the last hour).")
    after: TimeValue | None = Field(
        None, description="Only observations at or after this time: seconds since the epoch "
        "or ISO-8601 (e.g. '2025-11-30T14:00:00Z'; UTC when no zone is given).")
    before: TimeValue | None = Field(
        None, description="Only observations at or before this time: seconds since the epoch "
        "or ISO-8601.")
    tags: SearchTags | None = Field(
        None, description="Tag filters, all of which must match: {\"person\": true} matches "
        "equal values and list members; a numeric range is {\"brightness\": {\"gte\": 0.5}} "
        "with gt, gte, lt, lte.")
    order_by: OrderKey | None = Field(
        None, description="'score' (best match first; needs semantic_query, and is the "
        "default with it), '-time' (newest first; the default without), 'time' (oldest "
        "first), or a numeric tag: '-brightness' highest first, 'brightness' lowest first.")
    k: Count | None = Field(
        None, description="How many results to return (default 5; the memory caps it).")
    min_score: float | None = Field(
        None, description="Only semantic matches with at least this similarity (-1 to 1).")
    seen_near: bool | None = Field(
        None, description="true: camera frames whose view covers the point near_x/near_y, not "
        "only frames taken there.")
    include_archived: bool | None = Field(
        None, description="true: also search the rows compaction set aside.")
    robot: Names | None = Field(
        None, description="On a fleet store: a robot id or a list of ids.")
    map: str | None = Field(None, description="On a fleet store: the map the poses are in.")
    visits: bool | None = Field(
        None, description="true: answer the robot's visits to the place (start, end, "
        "duration) instead of observations.")

    @model_validator(mode="after")
    def _combinations(self) -> SearchQuery:
        if (self.near_x is None) != (self.near_y is None):
            raise _fail("'near_x' and 'near_y' must be given together")
        centres = [name for name, on in (("near_x/near_y", self.near_x is not None),
                                         ("near", self.near is not None),
                                         ("near_here", bool(self.near_here))) if on]
        if len(centres) > 1:
            if "near_here" in centres and "near_x/near_y" in centres:
                raise _fail("give either 'near_here' or 'near_x'/'near_y', not both")
            raise _fail(f"give one centre, not both: {' and '.join(centres)}")
        if self.radius is not None and not centres:
            raise _fail("'radius' needs a centre: give near_x and near_y, near, or "
                        "near_here: true")
        if self.seen_near and self.near_x is None and self.near is None:
            raise _fail("'seen_near' needs the point: give near_x and near_y (or near)")
        if self.visits and not centres:
            raise _fail("'visits' needs a place: give near_x and near_y, near, or "
                        "near_here: true")
        if self.order_by == "score" and not (self.semantic_query or "").strip():
            raise _fail("order_by 'score' needs a 'semantic_query'")
        return self

    def time_window(self, now: float) -> tuple[float | None, float | None]:
        """(t_min, t_max) in absolute seconds; "seconds ago" counts back from `now`."""
        t_min = None if self.after_seconds_ago is None else now - self.after_seconds_ago
        t_max = None if self.before_seconds_ago is None else now - self.before_seconds_ago
        if self.after is not None:
            a = _parse_time("after", self.after)
            t_min = a if t_min is None else max(t_min, a)
        if self.before is not None:
            b = _parse_time("before", self.before)
            t_max = b if t_max is None else min(t_max, b)
        return t_min, t_max

    @property
    def stream_names(self) -> tuple[str, ...] | None:
        if self.stream is None:
            return None
        names = [self.stream] if isinstance(self.stream, str) else self.stream
        return tuple(dict.fromkeys(names))


class SaveNote(Request):
    """`/memory/save` as JSON: a note (plain text is `{"note": text}`), or a place name."""

    what: ClassVar[str] = "note"
    expects: ClassVar[dict[str, str]] = {"tags": "an object", "remove": "true or false"}

    note: str | None = Field(
        None, description="The note, e.g. 'Met Bob at the front door; he asked for water.'")
    tags: NoteTags | None = Field(
        None, description="Tags to store with the note, e.g. {\"person\": \"Bob\"}: values are "
        "strings, numbers, true/false or lists of them.")
    place: str | None = Field(
        None, description="Name the robot's current position (or x, y) as this place, e.g. "
        "'kitchen'; searches can then use near: 'kitchen'.")
    radius: float | None = Field(
        None, gt=0, description="With place: how far the place reaches, in metres (default 2).")
    x: float | None = Field(None, description="With place: world x of the place, in metres "
                            "(default: where the robot is).")
    y: float | None = Field(None, description="With place: world y of the place, in metres.")
    remove: bool | None = Field(None, description="With place: true removes the name.")

    @model_validator(mode="after")
    def _form(self) -> SaveNote:
        place_only = [n for n in ("radius", "x", "y", "remove") if getattr(self, n) is not None]
        if self.place is None:
            if place_only:
                raise _fail(f"'{place_only[0]}' goes with 'place' (naming a place)")
            if self.note is None:
                raise _fail("'note' must be a string: the text to remember")
            if not self.note.strip():
                raise _fail("empty note: nothing to remember")
            return self
        if self.note is not None or self.tags is not None:
            raise _fail("a save is either a note ('note', 'tags') or a place ('place', "
                        "'radius', 'x', 'y', 'remove'), not both")
        if (self.x is None) != (self.y is None):
            raise _fail("'x' and 'y' must be given together")
        if not self.place.strip():
            raise _fail("'place' must name the place, e.g. 'kitchen'")
        if len(self.place) > 80 or "\n" in self.place or "\r" in self.place:
            raise _fail("'place' must be a short name on one line (at most 80 characters)")
        return self

    @property
    def text(self) -> str:
        return (self.note or "").strip()


# ---- answers --------------------------------------------------------------------------------

def _is_none(value: Any) -> bool:
    return value is None


class Answer(BaseModel):
    """An answer: fields a server of another version adds are kept (extra="allow"), the
    fields in `omit_if_none` are left out of the JSON when unset, and `took_ms` (stamped when
    the answer is done) is its last key, after any added field.

    The omission is each field's own `exclude_if`, set once per class here, so dumping an
    answer runs no Python per nested model (a wrap serializer on every result and pose cost
    a search answer two thirds of its dump time)."""

    model_config = ConfigDict(extra="allow")
    omit_if_none: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        fields = cls.model_fields
        undeclared = cls.omit_if_none - set(fields)
        if undeclared:
            raise TypeError(f"{cls.__name__}.omit_if_none names undeclared fields: "
                            f"{sorted(undeclared)}")
        if any(fields[name].exclude_if is not _is_none for name in cls.omit_if_none):
            for name in cls.omit_if_none:
                fields[name].exclude_if = _is_none
            cls.model_rebuild(force=True)



class Reply(Answer):
    """A whole answer (search, save, compact, streams): `took_ms` is its last declared field,
    and `json_text` keeps it the last key after any field a server of another version added.
    (A wrap serializer would do that too, but it is Python run on every dump, and in JSON mode
    it makes the whole nested answer a Python dict before the text: twice the work.)"""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if list(cls.model_fields)[-1:] != ["took_ms"]:
            raise TypeError(f"{cls.__name__}: took_ms must be its last field")

    def json_text(self) -> str:
        """The answer as the services' JSON text (compact, UTF-8, NaN as null)."""
        if not self.__pydantic_extra__:
            return self.model_dump_json()
        out = self.model_dump(mode="json")
        if "took_ms" in out:
            out["took_ms"] = out.pop("took_ms")
        return to_json(out, inf_nan_mode="null").decode()


class PoseOut(Answer):
    """A pose in an answer; a row stored without one has every field null, source 'none'."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset({"age_s", "stale"})
    x: float | None = None
    y: float | None = None
    z: float | None = None
    yaw: float | None = None
    frame: str | None = None
    source: str = "none"
    age_s: float | None = None
    stale: bool | None = None


class ResultItem(Answer):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"robot", "archived"})
    id: int | None
    stream: str
    t: float
    pose: PoseOut
    score: float | None = None
    tags: dict[str, Any] = Field(default_factory=dict)
    text: str = ""
    ref: str | None = None
    robot: str | None = None
    archived: bool | None = None  # true: compaction set the row aside (include_archived)


class SearchAnswer(Reply):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"notes", "took_ms"})
    ok: Literal[True] = True
    results: list[ResultItem] = Field(default_factory=list)
    count: int = 0
    notes: list[str] | None = None
    took_ms: float | None = None


class Visit(Answer):
    start: float
    end: float
    duration_s: float


class VisitsAnswer(Reply):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"notes", "took_ms"})
    ok: Literal[True] = True
    visits: list[Visit] = Field(default_factory=list)
    count: int = 0
    total_s: float = 0.0
    first: float | None = None
    last: float | None = None
    notes: list[str] | None = None
    took_ms: float | None = None


class PlaceInfo(Answer):
    name: str
    x: float
    y: float
    radius: float
    frame: str | None = None


class SaveAnswer(Reply):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"folded", "place", "removed",
                                                       "took_ms"})
    ok: Literal[True] = True
    id: int | None
    t: float
    pose: PoseOut
    indexed: bool
    folded: bool | None = None
    place: PlaceInfo | None = None  # a place save: the place as it is now named
    removed: bool | None = None  # a place save with remove: the name is gone
    took_ms: float | None = None


class SummaryStep(Answer):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"message", "model", "at"})
    status: str
    written: int = 0
    message: str | None = None
    model: str | None = None
    at: float | None = None


class CompactAnswer(Reply):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"kept", "now", "clock", "budget",
                                                       "took_ms"})
    ok: Literal[True] = True
    thinned: int = 0
    folded: int = 0
    summaries: SummaryStep
    archived_total: int = 0
    # Old keyframes thinning kept beside each cell's newest, by reason (a frame kept for two
    # reasons counts under both): extreme_tag, note_reference, visit_first_last, cell_newest.
    kept: dict[str, int] | None = None
    now: float | None = None  # the time ages were counted from
    clock: str | None = None  # "store" (the newest recorded row) or "clock" (the node clock)
    # With a disk budget: what the budget did after compaction (status, bytes, removed).
    budget: dict[str, Any] | None = None
    took_ms: float | None = None


class StreamInfo(Answer):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({
        "status", "topic", "captioned", "pending", "failed", "caption_max_per_min",
        "caption_requests_per_hour", "caption_tokens_per_hour", "reembed_pending",
        "skipped_until_keyframe"})
    name: str
    count: int
    first_t: float | None = None
    last_t: float | None = None
    semantic: bool = False
    status: str | None = None
    topic: str | None = None
    # Camera with `describer: vlm`: rows captioned, waiting for a caption, given up on; the
    # budget, and what it is estimated to cost per hour.
    captioned: int | None = None
    pending: int | None = None
    failed: int | None = None
    caption_max_per_min: float | None = None
    caption_requests_per_hour: int | None = None
    caption_tokens_per_hour: int | None = None
    # Rows still to be embedded again after the image embedder changed.
    reembed_pending: int | None = None
    # Rows the disk budget removed, and the oldest time the stream still has a row of
    # (kept or archived).
    evicted: int = 0
    oldest_t: float | None = None
    # Camera from a video source (the Go2's front video): access units skipped before the
    # first keyframe, when the recorder joined the stream mid-GOP.
    skipped_until_keyframe: int | None = None


class IndexInfo(Answer):
    """One embedding model's vector index: what an unfiltered semantic search uses and what
    it promises. `graph`: "exact" (too few rows for one), "building", "reading" (from the
    cache), "ready"; with a calibrated graph, the efSearch and rerank depth in use and the
    recall@5/@10 measured with them against exact search, on `calibration_queries` queries
    at `calibrated_rows` rows, and whether the target was met (by one standard error);
    `searched_by` "inverted file" when the graph's inverted file, probing `nprobe` lists,
    serves instead of the walk (it held the target in fewer microseconds a query);
    `graph_dims` the components of each vector the graph walks (its principal axes, or the
    whole vector)."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset({
        "graph_dims", "ef_search", "rerank", "recall_at_5", "recall_at_10", "recall_target",
        "target_met", "calibrated_rows", "calibration_queries", "searched_by", "nprobe"})
    model_id: str
    vectors: int
    graph: Literal["exact", "building", "reading", "ready"]
    graph_dims: int | None = None
    ef_search: int | None = None
    rerank: int | None = None
    recall_at_5: float | None = None
    recall_at_10: float | None = None
    recall_target: float | None = None
    target_met: bool | None = None
    calibrated_rows: int | None = None
    calibration_queries: int | None = None
    searched_by: Literal["graph", "inverted file"] | None = None
    nprobe: int | None = None


class StreamsAnswer(Reply):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"places", "took_ms", "indexes"})
    ok: Literal[True] = True
    streams: list[StreamInfo] = Field(default_factory=list)
    places: list[PlaceInfo] | None = None
    indexes: list[IndexInfo] | None = None
    # The memory directory's size on disk, its budget (null: none) and the free space left
    # on its file system (null where not known, e.g. a fleet store).
    disk_bytes: int | None = None
    disk_budget_bytes: int | None = None
    disk_free_bytes: int | None = None
    took_ms: float | None = None


class ErrorBody(Answer):
    code: Literal["bad_request", "not_active", "unavailable", "internal"]
    message: str


class ErrorAnswer(Answer):
    ok: Literal[False] = False
    error: ErrorBody

    @classmethod
    def of(cls, code: str, message: str) -> ErrorAnswer:
        code = code if code in ERROR_CODES else "internal"
        return cls(error=ErrorBody(code=code, message=message))


def pose_out(pose: Pose | None) -> PoseOut:
    """A stored pose in an answer (rounded like docs/design.md's examples); all null without one."""
    return PoseOut() if pose is None else PoseOut(**pose.to_dict())


def result_fields(obs: Observation, score: float | None) -> dict[str, Any]:
    """One search result's fields as plain values (docs/design.md's shape): an answer's
    results are validated with it in one call, not one model per result."""
    return {"id": obs.id, "stream": obs.stream, "t": obs.t,
            "pose": {} if obs.pose is None else obs.pose.to_dict(),
            "score": None if score is None else round(float(score), 6), "tags": obs.tags,
            "text": obs.text, "ref": obs.ref, "archived": True if obs.archived else None}


A = TypeVar("A", bound=BaseModel)


def read_answer(raw: Any, model: type[A]) -> A | ErrorAnswer:
    """A service's JSON answer as `model`, or the ErrorAnswer it carries; an answer that is not
    the contract's shape becomes an `internal` ErrorAnswer saying so (clients' edge)."""
    try:
        obj = json.loads(raw)
    except (TypeError, ValueError):
        return ErrorAnswer.of("internal", "memory answered something that is not JSON: "
                              f"{str(raw)[:200]!r}")
    if not isinstance(obj, dict):
        return ErrorAnswer.of("internal", "memory answered an unexpected JSON value")
    try:
        if obj.get("ok") is not True:
            err = obj.get("error")
            if not isinstance(err, dict):
                err = {}
            return ErrorAnswer.of(str(err.get("code", "internal")),
                                  str(err.get("message", "memory reported a failure")))
        if model is SearchAnswer and "visits" in obj:
            return VisitsAnswer.model_validate(obj)  # type: ignore[return-value]
        return model.model_validate(obj)
    except ValidationError as exc:
        return ErrorAnswer.of("internal", "memory answered an unexpected shape at "
                              f"{'.'.join(map(str, exc.errors()[0].get('loc', ())))}")


# ---- validation errors in words ---------------------------------------------------------------

_RANGE = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
          "less_than_equal": "<="}
_TYPE_WORDS = {"float": "a number", "int": "an integer", "string": "a string",
               "str": "a string", "bool": "true or false", "dict": "an object",
               "list": "a list"}


def _fields_of(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def explain(exc: ValidationError, model: type[BaseModel]) -> str:
    """One short sentence per wrong field (at most three), written for a person or an LLM."""
    expects: dict[str, str] = getattr(model, "expects", {})
    what = getattr(model, "what", "request")
    fields = _fields_of(model)
    messages: list[str] = []
    seen: set[str] = set()
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err.get("loc", ())]
        kind = err.get("type", "")
        field = loc[0] if loc else ""
        ctx = err.get("ctx") or {}
        if kind == "contract":
            msg = str(ctx.get("message") or err.get("msg"))
        elif kind == "extra_forbidden" and len(loc) == 1:
            noun = "argument" if what == "arguments" else "field"
            msg = unknown_name(noun, field, fields, f" in the {what}")
        elif kind == "missing":
            msg = (f"missing argument '{field}'" if what == "arguments"
                   else f"'{field}' is required")
        elif kind == "model_type" or kind == "model_attributes_type":
            msg = f"the {what} must be a JSON object"
        elif kind in _RANGE and field in expects:
            msg = f"'{field}' must be {expects[field]}, got {err.get('input')!r}"
        elif kind in _RANGE:
            bound = next(iter(ctx.values()), "")
            bound = f"{bound:g}" if isinstance(bound, (int, float)) else bound
            msg = f"'{field}' must be {_RANGE[kind]} {bound}, got {err.get('input')!r}"
        elif kind == "finite_number":
            msg = f"'{field}' must be finite"
        else:
            want = expects.get(field)
            if want is None:
                base = kind.split("_")[0]
                want = _TYPE_WORDS.get(base, base)
            msg = f"'{field}' must be {want}, got {_json_kind(err.get('input'))}"
        if field and field in seen:
            continue
        seen.add(field)
        if msg not in messages:
            messages.append(msg)
        if len(messages) == 3:
            break
    return "; ".join(messages) or f"invalid {what}"


def validate(model: type[Request], data: Any, values_checked: bool = False) -> Any:
    """`model(**data)`, a mistake raised as BadRequest in words (see `explain`);
    `values_checked`: `check_json_values` has passed `data` already (the JSON reader's)."""
    if not isinstance(data, dict):
        raise BadRequest(f"the {model.what} must be a JSON object, got {_json_kind(data)}")
    try:
        if values_checked:
            return model.model_validate(data, context=_CHECKED)
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(explain(exc, model)) from None


# ---- tool schemas ------------------------------------------------------------------------------

def _plain_schema(prop: dict[str, Any]) -> dict[str, Any]:
    """A property schema without the null branch pydantic writes for optional fields: tool
    schemas stay short, and 'omit it' is how a model says 'not given'."""
    prop = dict(prop)
    prop.pop("title", None)
    branches = prop.pop("anyOf", None)
    if branches:
        kept = [b for b in branches if b.get("type") != "null"]
        if len(kept) == 1:
            prop = {**kept[0], **prop}
        else:
            prop["anyOf"] = kept
    if prop.get("default") is None:
        prop.pop("default", None)
    for branch in prop.get("anyOf", ()):
        branch.pop("title", None)
    return prop


def tool_parameters(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of a tool taking `model`'s fields: an object, no other properties."""
    schema = model.model_json_schema()
    props = {name: _plain_schema(p) for name, p in schema.get("properties", {}).items()}
    return {"type": "object", "properties": props, "required": list(schema.get("required", [])),
            "additionalProperties": False}


def pick(name: str, base: type[Request], fields: Sequence[str],
         overrides: Mapping[str, FieldInfo | tuple[Any, FieldInfo]] | None = None
         ) -> type[Request]:
    """A request model holding some of `base`'s fields (same types, checks and descriptions),
    for a tool's arguments: the tool and the service cannot drift apart. An override is a
    FieldInfo giving the field another default, or (type, FieldInfo) replacing both (a
    required field)."""
    overrides = dict(overrides or {})
    definitions: dict[str, Any] = {}
    for f in fields:
        info = base.model_fields[f]
        over = overrides.get(f)
        if over is None:
            definitions[f] = (info.annotation, info)
        elif isinstance(over, tuple):
            definitions[f] = over
        else:  # a new default: the field otherwise as it is
            changed = copy.copy(info)
            changed.default = over.default
            definitions[f] = (info.annotation, changed)
    model = create_model(name, __base__=Request, **definitions)
    model.expects = {**base.expects}
    model.what = "arguments"
    return model


# ---- docs ---------------------------------------------------------------------------------------

def _type_words(schema: dict[str, Any]) -> str:
    branches = schema.get("anyOf") or [schema]
    words = []
    for b in branches:
        t = b.get("type")
        if t == "array":
            words.append(f"list of {b.get('items', {}).get('type', 'values')}")
        elif t:
            words.append(str(t))
    return " or ".join(words) or "value"


def field_table(model: type[BaseModel]) -> str:
    """The Markdown table of a request's fields (docs/design.md holds it; a test checks it is
    the one these models generate: `python -m memory_node.core.contract` prints them)."""
    props = tool_parameters(model)["properties"]
    lines = ["| field | type | meaning |", "|---|---|---|"]
    for name, prop in props.items():
        lines.append(f"| `{name}` | {_type_words(prop)} | {prop.get('description', '')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    for _model in (SearchQuery, SaveNote):
        print(f"{_model.__name__}:\n\n{field_table(_model)}\n")
