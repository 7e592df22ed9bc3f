"""The agent's memory skills: name, description, JSON schema, call.

One list (`get_skills`) feeds every agent framework: the MCP server, OpenAI-style function
tools (`openai_tool_specs` / `call_openai_tool`) and any registry that takes a name, a
description, a JSON schema and a callable. The list is built each time tools are listed, so
`query_memory`'s description names the streams memory holds now, with their counts.

A skill answers short text lines (see `answers.py`). Failures are answers too: `Skill.run`
returns `SkillResult(is_error=True)` with a readable message (the MCP server turns it into a
tool error), and `Skill.call` returns that message as "Error: …".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from memory_node.agent.answers import (
    format_clock,
    format_place,
    format_results,
    format_when,
)
from memory_node.agent.client import MemoryClient
from memory_node.agent.prompt import current_pose_or_none, pose_line
from memory_node.core.contract import (
    DEFAULT_K,
    DEFAULT_RADIUS,
    ErrorAnswer,
    Request,
    SaveNote,
    SearchQuery,
    pick,
    tool_parameters,
    validate,
)
from memory_node.core.errors import BadRequest
from memory_node.core.query import ENGINE_TAGS

__all__ = [
    "MEMORY_SKILL_NAMES",
    "Skill",
    "SkillError",
    "SkillResult",
    "call_openai_tool",
    "get_skills",
    "openai_tool_specs",
]

log = logging.getLogger(__name__)

Clock = Callable[[], float]

MEMORY_SKILL_NAMES = frozenset({
    "list_memory_streams",
    "query_memory",
    "remember",
    "query_agent_memory",
    "compact_memory",
    "where_am_i",
    "visits",
    "name_place",
})
# where_am_i: "here" is this close, and "before" is at least this long ago.
HERE_RADIUS_M = 2.0
BEFORE_S = 60.0
# How many of a stream's newest rows show which numeric tags it has (for the descriptions).
NUMERIC_TAG_SAMPLE = 20
# The filters both query skills take: the search contract's own fields (same types, checks
# and descriptions), so every field added there is one name away from the tools.
FILTER_FIELDS = ("semantic_query", "near_x", "near_y", "near", "radius", "after_seconds_ago",
                 "before_seconds_ago", "after", "before", "tags", "order_by", "k")
# Where and when, for visits: the search's own place and time fields.
PLACE_TIME_FIELDS = ("near", "near_x", "near_y", "near_here", "radius", "after_seconds_ago",
                     "before_seconds_ago", "after", "before")
_DEFAULTS: dict[str, Any] = {"k": Field(default=DEFAULT_K)}

QueryAgentMemoryArgs = pick("QueryAgentMemoryArgs", SearchQuery, FILTER_FIELDS, _DEFAULTS)
QueryMemoryArgs = pick(
    "QueryMemoryArgs", SearchQuery, ("stream", *FILTER_FIELDS, "seen_near"), {
        **_DEFAULTS,
        "stream": (str, Field(description="The stream to search, e.g. 'camera' (see the "
                              "list in this description).")),
    })
RememberArgs = pick("RememberArgs", SaveNote, ("note",),
                    {"note": (str, Field(description=SaveNote.model_fields["note"].description))})
VisitsArgs = pick("VisitsArgs", SearchQuery, PLACE_TIME_FIELDS)
# On a fleet store the query skills also take `robot` (an id, a list, or "all").
FleetQueryAgentMemoryArgs = pick("QueryAgentMemoryArgs", SearchQuery,
                                 (*FILTER_FIELDS, "robot"), _DEFAULTS)
FleetQueryMemoryArgs = pick(
    "QueryMemoryArgs", SearchQuery, ("stream", *FILTER_FIELDS, "seen_near", "robot"), {
        **_DEFAULTS,
        "stream": (str, Field(description="The stream to search, e.g. 'camera' (see the "
                              "list in this description).")),
    })


FleetVisitsArgs = pick("VisitsArgs", SearchQuery, (*PLACE_TIME_FIELDS, "robot"))


class NamePlaceArgs(Request):
    """name_place's arguments: the place save form, with the name as `name`."""

    what: ClassVar[str] = "arguments"
    expects: ClassVar[dict[str, str]] = {"remove": "true or false"}
    name: str = Field(description="The place's name, e.g. 'kitchen' or 'charging dock'.")
    radius: float = Field(DEFAULT_RADIUS, gt=0, description="How far the place reaches, in "
                          "metres (default 2).")
    x: float | None = Field(None, description="World x of the place in metres (default: "
                            "where the robot is now); give it with y.")
    y: float | None = Field(None, description="World y of the place in metres.")
    remove: bool | None = Field(None, description="true: remove this name (nothing else is "
                                "deleted). To rename, name the same x, y anew, then remove the "
                                "old name.")


class SkillError(Exception):
    """A skill could not answer; the message is written for the model to read and act on."""


@dataclass(frozen=True)
class SkillResult:
    """What a call answered: the text for the model, and whether it is an error."""

    text: str
    is_error: bool = False

    @property
    def message(self) -> str:
        """The text without the 'Error: ' prefix (what an MCP tool error carries)."""
        return self.text.removeprefix("Error: ") if self.is_error else self.text


@dataclass(frozen=True)
class Skill:
    """A named, described, schema'd callable an agent framework can register as a tool.

    `args` is the request model of the arguments (None or () for none): its fields are the
    JSON schema, and it checks a call's arguments with the contract's own messages.
    """

    name: str
    description: str
    args: type[BaseModel] | tuple[()] | None
    fn: Callable[..., str] = field(repr=False)
    read_only: bool = True

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments (an object; no other properties)."""
        if not self.args:
            return {"type": "object", "properties": {}, "required": [],
                    "additionalProperties": False}
        return tool_parameters(self.args)

    def bind(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Arguments checked against the model; null means "not given" (models send it)."""
        given = {k: v for k, v in arguments.items() if v is not None}
        if not self.args:
            if given:
                raise SkillError(f"{self.name} takes no arguments; got {', '.join(given)}")
            return {}
        model: type[Request] = self.args  # type: ignore[assignment]
        try:
            checked = validate(model, given)
        except BadRequest as exc:
            raise SkillError(exc.message.replace(" in the arguments", f" of {self.name}")
                             + " (bad_request)") from None
        return checked.model_dump(exclude_none=True)

    def run(self, /, **arguments: Any) -> SkillResult:
        """Call the skill; never raises (an unexpected failure is logged and reported)."""
        try:
            return SkillResult(self.fn(**self.bind(arguments)))
        except SkillError as exc:
            return SkillResult(f"Error: {exc}", is_error=True)
        except Exception as exc:  # noqa: BLE001 - the agent gets an answer, the log the trace
            log.exception("skill %s failed", self.name)
            return SkillResult(f"Error: {self.name} failed unexpectedly "
                               f"({type(exc).__name__})", is_error=True)

    def call(self, /, **arguments: Any) -> str:
        """The answer as text ("Error: …" on failure), for frameworks that take str -> str."""
        return self.run(**arguments).text


# ---- talking to the client --------------------------------------------------------------

def _ok(answer: Any) -> Any:
    """An answer, or the SkillError naming its code."""
    if isinstance(answer, ErrorAnswer):
        raise SkillError(f"{answer.error.message} ({answer.error.code})")
    return answer


def _stream_summary(streams: Sequence[Any], now: float,
                    numeric: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    lines = []
    for s in streams:
        count = int(s.count or 0)
        what = "observation" if count == 1 else "observations"
        parts = [f"{s.name}: {count} {what}"]
        if s.semantic:
            parts.append("semantic search")
        first, last = s.first_t, s.last_t
        if isinstance(first, (int, float)) and isinstance(last, (int, float)):
            if first == last:
                parts.append(f"at {format_when(last, now)}")
            else:
                parts.append(f"from {format_when(first, now)} to {format_when(last, now)}")
        if numeric and numeric.get(s.name):
            parts.append("order_by tags: " + ", ".join(numeric[s.name]))
        evicted = getattr(s, "evicted", 0)
        if evicted:  # the agent should not take a missing old frame for one never seen
            parts.append(f"{evicted} older rows removed to keep within the disk budget")
        robots = (getattr(s, "model_extra", None) or {}).get("robots")
        if robots:  # a fleet: the rows of each robot
            parts.append("by robot: " + ", ".join(f"{r['robot']} {r['count']}"
                                                  for r in robots))
        lines.append(", ".join(parts))
    return lines


# ---- the skills -------------------------------------------------------------------------

_QUERY_HOW = (
    "Filters combine and are applied before ranking. With semantic_query the best matches "
    "come first, otherwise the newest; order_by sorts by time or by a numeric tag instead "
    "('-brightness' = brightest first: use it for 'where was it brightest', 'most people'). "
    "Each result line reads '#id stream time (age) at x=… y=… heading=… | what was observed "
    "| tags: …'; pass a result's x and y as near_x and near_y to look around that place, or "
    "the x and y of the [Current pose: …] line to look around the robot now.")


class _MemorySkills:
    """The memory skills bound to one client and clock (closures would hide the why)."""

    def __init__(self, client: MemoryClient, clock: Clock):
        self.client = client
        self.clock = clock

    # -- list_memory_streams --------------------------------------------------------------
    def list_memory_streams(self) -> str:
        streams = _ok(self.client.ask_streams()).streams
        now = self.clock()
        lines = _stream_summary(streams, now)
        empty = [s for s in self.client.default_streams
                 if s not in {x.name for x in streams}]
        if not lines:
            lines = ["Memory is empty: nothing recorded yet."]
        if empty:
            lines.append(f"No observations yet in: {', '.join(empty)}.")
        robots = self.fleet_robots()
        if robots:
            lines.append("Robots in the fleet (query with robot='<id>'): " + "; ".join(
                f"{r['robot']} (map {r.get('map')}, synced {format_when(r['last_sync'], now)})"
                if isinstance(r.get("last_sync"), (int, float)) else str(r["robot"])
                for r in robots))
        places = getattr(self.client.ask_streams(), "places", None) or []
        if places:
            lines.append("Named places (use near='<name>'): " + "; ".join(
                f"{p.name} at x={p.x:.2f} y={p.y:.2f} (radius {p.radius:g} m)"
                for p in places))
        return "\n".join(lines)

    def fleet_robots(self) -> list[dict[str, Any]]:
        """The robots of a fleet store ([] for one robot's own memory)."""
        answer = self.client.ask_streams()
        if isinstance(answer, ErrorAnswer):
            return []
        robots = (answer.model_extra or {}).get("robots")
        return list(robots) if isinstance(robots, list) else []

    def numeric_tags(self, stream: str) -> list[str]:
        """The numeric tags of a stream's newest rows: what order_by can sort by there."""
        answer = self.client.ask_search(SearchQuery(stream=stream, k=NUMERIC_TAG_SAMPLE))
        if isinstance(answer, ErrorAnswer):
            return []
        found = {key for r in getattr(answer, "results", ()) for key, v in r.tags.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return sorted(found - set(ENGINE_TAGS))

    def live_streams(self) -> tuple[str, str]:
        """(query_memory's stream list, query_agent_memory's) for the descriptions: the live
        streams with their counts and the numeric tags each can be ordered by."""
        answer = self.client.ask_streams()
        if isinstance(answer, ErrorAnswer):
            log.info("live stream list unavailable for the tool description: %s",
                     answer.error.message)
            return ("Streams (configured; the live list is unavailable now): "
                    + ", ".join(self.client.default_streams) + ".", "")
        streams = answer.streams
        if not streams:
            return ("Memory holds no observations yet; configured streams: "
                    + ", ".join(self.client.default_streams) + ".", "")
        numeric = {s.name: self.numeric_tags(s.name) for s in streams if s.count}
        lines = _stream_summary(streams, self.clock(), numeric)
        events = numeric.get("events")
        return ("Streams now:\n" + "\n".join(f"- {line}" for line in lines),
                f"Numeric tags of the notes (for order_by): {', '.join(events)}." if events
                else "")

    # -- query_memory / query_agent_memory -------------------------------------------------
    def query_memory(self, **filters: Any) -> str:
        stream = filters.pop("stream")
        if isinstance(stream, str) and not stream.strip():
            raise SkillError("'stream' must name a stream; call list_memory_streams() to see "
                             "them")
        return self._query(stream=stream.strip() if isinstance(stream, str) else stream,
                           **filters)

    def query_agent_memory(self, **filters: Any) -> str:
        return self._query(stream="events", **filters)

    def _query(self, **fields: Any) -> str:
        try:
            query = validate(SearchQuery, fields)
        except BadRequest as exc:
            raise SkillError(f"{exc.message} (bad_request)") from None
        answer = _ok(self.client.ask_search(query))
        return format_results([r.model_dump() for r in answer.results], self.clock(),
                              answer.notes or ())

    # -- visits ------------------------------------------------------------------------------
    def visits(self, **fields: Any) -> str:
        try:
            query = validate(SearchQuery, {**fields, "visits": True})
        except BadRequest as exc:
            raise SkillError(f"{exc.message} (bad_request)") from None
        answer = _ok(self.client.ask_search(query))
        now = self.clock()
        where = (f"'{fields['near']}'" if fields.get("near") else "here"
                 if fields.get("near_here") else
                 f"x={fields['near_x']:.2f} y={fields['near_y']:.2f}")
        if fields.get("radius") is not None:
            where += f" (within {fields['radius']:g} m)"
        count = int(getattr(answer, "count", 0))
        if not count:
            lines = [f"No visits to {where} in the pose history asked about."]
        else:
            lines = [f"{count} visit{'s' if count != 1 else ''} to {where}, "
                     f"{answer.total_s:.1f} s in all; first there {format_when(answer.first, now)}"
                     f", last there {format_when(answer.last, now)}."]
            for v in answer.visits:
                robot = (v.model_extra or {}).get("robot")  # a fleet: whose visit
                who = f"{robot} " if robot else ""
                lines.append(f"- {who}from {format_clock(v.start, now)} to "
                             f"{format_clock(v.end, now)}: {v.duration_s:.1f} s "
                             f"({format_when(v.start, now).split('(')[-1].rstrip(')')})")
        for note in answer.notes or ():
            lines.append(f"Note: {note}")
        return "\n".join(lines)

    # -- name_place ----------------------------------------------------------------------------
    def name_place(self, name: str, radius: float = DEFAULT_RADIUS, x: float | None = None,
                   y: float | None = None, remove: bool | None = None) -> str:
        try:
            note = validate(SaveNote, {"place": name, **({"remove": True} if remove else {
                "radius": radius, **({"x": x, "y": y} if x is not None or y is not None
                                     else {})})})
        except BadRequest as exc:
            raise SkillError(f"{exc.message} (bad_request)") from None
        answer = _ok(self.client.ask_save(note))
        p = answer.place
        if answer.removed:
            return f"Removed the name '{p.name}' (it was x={p.x:.2f} y={p.y:.2f})."
        return (f"Named '{p.name}': x={p.x:.2f} y={p.y:.2f}, radius {p.radius:g} m. Searches "
                f"and visits take near='{p.name}'.")

    # -- remember ----------------------------------------------------------------------------
    def remember(self, note: str) -> str:
        if not note.strip():
            raise SkillError("empty note: write what to remember")
        answer = _ok(self.client.ask_save(SaveNote(note=note)))
        now = self.clock()
        oid = answer.id
        when = format_when(float(answer.t), now)
        place = format_place(answer.pose.model_dump(), with_heading=False)
        if answer.folded:
            return (f"Already remembered: note #{oid} (written {when}, {place}) says the same "
                    f"from the same place; it now counts this repeat, nothing new stored.")
        if oid is None or not answer.indexed:
            ref = f"#{oid}" if oid is not None else "the note"
            return (f"Stored {ref} at {when}, {place}, in the notes file; it becomes "
                    f"searchable once indexing catches up.")
        return f"Remembered as #{oid} at {when}, {place}."

    # -- compact_memory ----------------------------------------------------------------------
    def compact_memory(self) -> str:
        answer = _ok(self.client.ask_compact())
        line = (f"Compaction done: {answer.thinned} old keyframe(s) thinned, {answer.folded} "
                f"near-duplicate(s) folded; nothing was deleted (set-aside rows kept: "
                f"{answer.archived_total}).")
        summ = answer.summaries
        if summ.status == "ok":
            line += f" Summaries written: {summ.written}."
        elif summ.status:
            line += f" Summaries {summ.status}" + (f": {summ.message}." if summ.message else ".")
        return line

    # -- where_am_i --------------------------------------------------------------------------
    def where_am_i(self) -> str:
        pose = current_pose_or_none(self.client)
        line = pose_line(pose)
        if pose is None:
            return (line + "\nThe robot's position is not known yet (no transform from the "
                    "world frame to the robot), so earlier visits cannot be looked up.")
        here: dict[str, Any] = {"near_x": round(pose.x, 3), "near_y": round(pose.y, 3),
                "radius": HERE_RADIUS_M, "before_seconds_ago": BEFORE_S}
        try:
            results = _ok(self.client.ask_search(SearchQuery(**here, k=3))).results
            first = []
            if results:
                first = _ok(self.client.ask_search(
                    SearchQuery(**here, k=1, order_by="time"))).results
        except SkillError as exc:
            return line + f"\nEarlier visits could not be looked up: {exc}"
        where = f"within {HERE_RADIUS_M:g} m of here"
        if not results:
            return line + f"\nNo memory of being {where} before (more than a minute ago)."
        now = self.clock()
        text = line + f"\nBeen {where} before: most recently {format_when(results[0].t, now)}"
        if first and first[0].id != results[0].id:
            text += f", first {format_when(first[0].t, now)}"
        return text + ".\nLatest observations here:\n" + format_results(
            [r.model_dump() for r in results], now)


def get_skills(client: MemoryClient, *, clock: Clock | None = None,
               live_descriptions: bool = True) -> list[Skill]:
    """The memory skills for `client`, descriptions computed now (one `streams()` call and one
    small search per stream with rows, for its numeric tags).

    Call it each time tools are listed to the model, so `query_memory`'s description names
    the streams memory holds now. `clock` is "now" for ages in answers; default the
    client's clock (the memory's clock: ROS time on the ROS backend, so simulated time reads
    right). `live_descriptions=False` skips those calls, for dispatching calls.
    """
    m = _MemorySkills(client, clock or client.now)
    fleet = client.serves_fleet()
    streams_text, events_text = m.live_streams() if live_descriptions else (
        "Call list_memory_streams() to see the streams.", "")
    return [
        Skill(
            "list_memory_streams",
            "List the robot's memory streams: how many observations each holds, whether it "
            "supports semantic_query, and the time span it covers.",
            (), m.list_memory_streams),
        Skill(
            "query_memory",
            "Search the robot's memory of what it perceived (camera descriptions, lidar, "
            "odometry) and its notes, in one stream, by meaning, place, time and tags. "
            + _QUERY_HOW + "\n" + streams_text,
            FleetQueryMemoryArgs if fleet else QueryMemoryArgs, m.query_memory),
        Skill(
            "remember",
            "Write an episodic note to long-term memory, stamped with the robot's current "
            "place and time. Use it after something worth recalling later: meeting or greeting "
            "someone (name, what they asked), finishing or failing a task, a user's "
            "instruction or preference, something notable seen. Write one self-contained "
            "sentence with names and specifics; it is found later by meaning, place and time. "
            "Not for routine steps (each move, each sensor check) or what the sensors record "
            "anyway. A repeat of a recent note from the same place is folded into it.",
            RememberArgs, m.remember, read_only=False),
        Skill(
            "query_agent_memory",
            "Search the agent's own episodic notes (stream 'events', written with remember): "
            "who was met, what was asked, decided or done, and where. " + _QUERY_HOW
            + (" " + events_text if events_text else ""),
            FleetQueryAgentMemoryArgs if fleet else QueryAgentMemoryArgs, m.query_agent_memory),
        Skill(
            "compact_memory",
            "Consolidate memory: thin old camera keyframes, fold near-duplicate observations "
            "and, when an LLM is configured, summarise old notes into the 'summaries' stream. "
            "Nothing is lost. Rarely needed: when asked to tidy memory or after a long "
            "session.",
            (), m.compact_memory, read_only=False),
        Skill(
            "visits",
            "The robot's visits to a place, from its pose history: each visit's start, end and "
            "duration, how many, the total time, the first and the last time there. For 'how "
            "long was I in the kitchen this morning', 'how many times did I pass the door', "
            "'when did I last go to the dock'. The place: near (a named place), near_x/near_y "
            "with radius, or near_here; the time: after/before or *_seconds_ago. Says where "
            "the pose history has gaps.",
            FleetVisitsArgs if fleet else VisitsArgs, m.visits),
        Skill(
            "name_place",
            "Name the robot's current position (or x, y) as a place, e.g. 'kitchen', with a "
            "radius; afterwards every search and visits take near='kitchen'. Naming a place "
            "again moves it; remove=true removes the name. Places are listed by "
            "list_memory_streams.",
            NamePlaceArgs, m.name_place, read_only=False),
        Skill(
            "where_am_i",
            "The robot's current position (x, y in metres and heading, in the world frame) "
            "and whether, and when, it was here before (within 2 m, more than a minute ago), "
            "with the latest things observed here.",
            (), m.where_am_i),
    ]


# ---- OpenAI-style function tools ----------------------------------------------------------

def openai_tool_specs(client: MemoryClient, *, clock: Clock | None = None) -> list[dict[str, Any]]:
    """`[{"type": "function", "function": {name, description, parameters}}, …]`, built now."""
    return [
        {"type": "function",
         "function": {"name": s.name, "description": s.description,
                      "parameters": s.parameters}}
        for s in get_skills(client, clock=clock)
    ]


def call_openai_tool(client: MemoryClient, name: str, arguments_json: str | Mapping[str, Any]
                     | None, *, clock: Clock | None = None) -> str:
    """Run the tool call a model made; the answer (or "Error: …") goes back as the tool
    message. Takes the arguments as the JSON string the model produced (or a mapping)."""
    skills = {s.name: s for s in get_skills(client, clock=clock, live_descriptions=False)}
    skill = skills.get(name)
    if skill is None:
        return f"Error: unknown tool {name!r}; memory tools: {', '.join(skills)}"
    if arguments_json is None or (isinstance(arguments_json, str)
                                  and not arguments_json.strip()):
        arguments: Any = {}
    elif isinstance(arguments_json, str):
        try:
            arguments = json.loads(arguments_json)
        except ValueError as exc:
            return f"Error: the arguments of {name} are not valid JSON ({exc})"
    else:
        arguments = dict(arguments_json)
    if not isinstance(arguments, dict):
        return f"Error: the arguments of {name} must be a JSON object"
    return skill.call(**arguments)
