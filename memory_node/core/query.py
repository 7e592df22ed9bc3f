"""Parsing and validation of `search` and `save` payloads into typed requests.

Everything a caller can get wrong is caught here, before any storage is touched, and reported
as `BadRequest` with a message that names the field and what was expected.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from memory_node.core.errors import BadRequest

TAG_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
RANGE_OPS = ("gt", "gte", "lt", "lte")
SEARCH_FIELDS = (
    "stream",
    "semantic_query",
    "near_x",
    "near_y",
    "radius",
    "near_here",
    "after_seconds_ago",
    "before_seconds_ago",
    "after",
    "before",
    "tags",
    "order_by",
    "k",
    "min_score",
)
DEFAULT_RADIUS = 2.0
# Tags the engine writes itself on notes (folding counts repeats): a caller may filter on them
# but not set them.
RESERVED_NOTE_TAGS = ("repeats", "last_t")
# Limits on what a request may hold, checked before anything else looks at it: JSON nested
# deeper than this, integers beyond 64 bits (SQLite's integers), non-finite numbers, NUL
# characters (a ROS String ends at the first NUL) and lone surrogates (not UTF-8) are refused.
MAX_JSON_DEPTH = 32
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class SearchRequest:
    """A validated search. Times are absolute seconds on the caller's clock."""

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

    @property
    def has_filters(self) -> bool:
        """True when anything beyond the stream restricts the rows."""
        return bool(
            self.near is not None
            or self.t_min is not None
            or self.t_max is not None
            or self.tags
        )

    @property
    def empty_window(self) -> bool:
        return self.t_min is not None and self.t_max is not None and self.t_min > self.t_max


@dataclass
class SaveRequest:
    text: str
    tags: dict[str, Any] = field(default_factory=dict)


def _reject_constant(name: str) -> Any:
    raise BadRequest(f"{name} is not allowed in JSON: numbers must be finite")


def check_text(name: str, text: str) -> None:
    """A text field must be UTF-8 text without NUL (ROS would cut it there)."""
    if "\x00" in text:
        raise BadRequest(f"{name} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"{name} is not valid UTF-8 text (a lone surrogate)") from None


def check_json_values(obj: Any, what: str) -> None:
    """Every value of a parsed request within the limits above (iterative: any depth is safe).

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
        elif isinstance(value, (list, dict)):
            if depth >= MAX_JSON_DEPTH:
                raise BadRequest(f"{name} is nested more than {MAX_JSON_DEPTH} levels deep")
            if isinstance(value, dict):
                for key, item in value.items():
                    check_text(f"a field name in {name}", key)
                    stack.append((item, depth + 1, f"'{key[:64]}'" if depth == 0 else name))
            else:
                stack.extend((item, depth + 1, name) for item in value)


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


def _number(name: str, value: Any, *, minimum: float | None = None,
            strictly_positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"'{name}' must be a number, got {type(value).__name__}")
    try:
        out = float(value)
    except OverflowError:
        raise BadRequest(f"'{name}' is too large for a float") from None
    if not math.isfinite(out):
        raise BadRequest(f"'{name}' must be finite, got {value!r}")
    if strictly_positive and out <= 0:
        raise BadRequest(f"'{name}' must be > 0, got {value!r}")
    if minimum is not None and out < minimum:
        raise BadRequest(f"'{name}' must be >= {minimum:g}, got {value!r}")
    return out


def _timestamp(name: str, value: Any) -> float:
    """Absolute time: seconds since the epoch, or an ISO-8601 string (UTC when no zone)."""
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            raise BadRequest(
                f"'{name}' must be seconds since the epoch or an ISO-8601 time, got {value!r}"
            ) from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return dt.timestamp()
    return _number(name, value)


def _check_tag_value(name: str, value: Any, *, allow_range: bool) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRequest(f"tag '{name}' must be finite")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if allow_range and isinstance(value, dict):
        if not value or set(value) - set(RANGE_OPS):
            raise BadRequest(
                f"tag filter '{name}' as an object takes only {', '.join(RANGE_OPS)}"
            )
        return {op: _number(f"tags.{name}.{op}", v) for op, v in value.items()}
    if not allow_range and isinstance(value, list):
        return [_check_tag_value(name, v, allow_range=False) for v in value]
    raise BadRequest(f"tag '{name}' has an unsupported value type {type(value).__name__}")


def check_tags(tags: Any, *, allow_range: bool) -> dict[str, Any]:
    if not isinstance(tags, dict):
        raise BadRequest(f"'tags' must be an object, got {type(tags).__name__}")
    out = {}
    for key, value in tags.items():
        if not TAG_KEY.match(key):
            raise BadRequest(f"tag name {key!r} must match {TAG_KEY.pattern}")
        out[key] = _check_tag_value(key, value, allow_range=allow_range)
    return out


def parse_search(
    raw: Any, *, now: float, known_streams: set[str], k_default: int, k_max: int,
    max_bytes: int,
) -> SearchRequest:
    """Plain text is a semantic query over every stream with text; '{...}' is the JSON form."""
    if not isinstance(raw, str):
        raise BadRequest(f"search query must be a string, got {type(raw).__name__}")
    if len(raw.encode("utf-8", "surrogatepass")) > max_bytes:
        raise BadRequest(f"search query is larger than {max_bytes} bytes")
    check_text("search query", raw)
    text = raw.strip()
    if not text:
        raise BadRequest("empty search query: send text, or a JSON object such as "
                         '{"stream": "camera", "k": 5}')
    if not text.startswith("{"):
        return SearchRequest(semantic_query=text, order_by="score", k=k_default)
    obj = loads_strict(text, "search query")
    if not isinstance(obj, dict):
        raise BadRequest("search query JSON must be an object")
    unknown = sorted(set(obj) - set(SEARCH_FIELDS))
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(unknown)}; known: "
                         f"{', '.join(SEARCH_FIELDS)}")
    req = SearchRequest(k=k_default)

    stream = obj.get("stream")
    if stream is not None:
        names = [stream] if isinstance(stream, str) else stream
        if not isinstance(names, list) or not names or not all(isinstance(s, str) for s in names):
            raise BadRequest("'stream' must be a stream name or a list of names")
        for s in names:
            if s not in known_streams:
                raise BadRequest(f"unknown stream {s!r}; known streams: "
                                 f"{', '.join(sorted(known_streams))}")
        req.streams = tuple(dict.fromkeys(names))

    sq = obj.get("semantic_query")
    if sq is not None:
        if not isinstance(sq, str):
            raise BadRequest("'semantic_query' must be a string")
        req.semantic_query = sq.strip() or None

    near_x, near_y = obj.get("near_x"), obj.get("near_y")
    if (near_x is None) != (near_y is None):
        raise BadRequest("'near_x' and 'near_y' must be given together")
    near_here = obj.get("near_here", False)
    if near_here is None:
        near_here = False
    if not isinstance(near_here, bool):
        raise BadRequest("'near_here' must be true or false")
    if near_here and near_x is not None:
        raise BadRequest("give either 'near_here' or 'near_x'/'near_y', not both")
    if near_x is not None:
        req.near = (_number("near_x", near_x), _number("near_y", near_y))
    req.near_here = near_here
    if obj.get("radius") is not None:
        req.radius = _number("radius", obj["radius"], strictly_positive=True)

    t_min: float | None = None
    t_max: float | None = None
    if obj.get("after_seconds_ago") is not None:
        t_min = now - _number("after_seconds_ago", obj["after_seconds_ago"], minimum=0)
    if obj.get("before_seconds_ago") is not None:
        t_max = now - _number("before_seconds_ago", obj["before_seconds_ago"], minimum=0)
    if obj.get("after") is not None:
        a = _timestamp("after", obj["after"])
        t_min = a if t_min is None else max(t_min, a)
    if obj.get("before") is not None:
        b = _timestamp("before", obj["before"])
        t_max = b if t_max is None else min(t_max, b)
    req.t_min, req.t_max = t_min, t_max

    if obj.get("tags") is not None:
        req.tags = check_tags(obj["tags"], allow_range=True)

    order_by = obj.get("order_by")
    if order_by is None:
        req.order_by = "score" if req.semantic_query else "-time"
    else:
        if not isinstance(order_by, str):
            raise BadRequest("'order_by' must be a string")
        key = order_by.strip().lstrip("+")
        bare = key.lstrip("-")
        if key == "score":
            if not req.semantic_query:
                raise BadRequest("order_by 'score' needs a 'semantic_query'")
        elif bare != "time" and not TAG_KEY.match(bare):
            raise BadRequest("'order_by' must be 'score', 'time', '-time' or a numeric tag "
                             "name such as '-brightness'")
        req.order_by = key

    k = obj.get("k")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, (int, float)) or (
            isinstance(k, float) and not (math.isfinite(k) and k.is_integer())
        ):
            raise BadRequest(f"'k' must be a positive integer, got {k!r}")
        k = int(k)
        if k <= 0:
            raise BadRequest(f"'k' must be a positive integer, got {k}")
        req.k = k
    if req.k > k_max:
        req.k, req.k_capped = k_max, True

    if obj.get("min_score") is not None:
        req.min_score = _number("min_score", obj["min_score"])
    return req


def parse_save(raw: Any, *, max_bytes: int) -> SaveRequest:
    """Plain text is the note; '{...}' must be {"note": "...", "tags": {...}}."""
    if not isinstance(raw, str):
        raise BadRequest(f"note must be a string, got {type(raw).__name__}")
    size = len(raw.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise BadRequest(f"note is {size} bytes; the limit is {max_bytes} bytes")
    text = raw.strip()
    tags: dict[str, Any] = {}
    if text.startswith("{"):
        obj = loads_strict(text, "note")
        if not isinstance(obj, dict):
            raise BadRequest("note JSON must be an object")
        unknown = sorted(set(obj) - {"note", "tags"})
        if unknown:
            raise BadRequest(f"unknown field(s) {', '.join(unknown)}; a note takes 'note' "
                             "and 'tags'")
        note = obj.get("note")
        if not isinstance(note, str):
            raise BadRequest("'note' must be a string")
        text = note.strip()
        if obj.get("tags") is not None:
            tags = check_tags(obj["tags"], allow_range=False)
            reserved = sorted(set(tags) & set(RESERVED_NOTE_TAGS))
            if reserved:
                raise BadRequest(f"tag(s) {', '.join(reserved)} are reserved: the memory "
                                 "sets them when it folds a repeated note")
    if not text:
        raise BadRequest("empty note: nothing to remember")
    if "\x00" in text:
        raise BadRequest("note contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("note is not valid UTF-8 text") from None
    return SaveRequest(text=text, tags=tags)
