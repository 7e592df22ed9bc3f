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
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memory_node.agent.answers import (
    format_place,
    format_results,
    format_when,
)
from memory_node.agent.client import MemoryClient
from memory_node.agent.prompt import current_pose_or_none, pose_line

__all__ = [
    "MEMORY_SKILL_NAMES",
    "Param",
    "Skill",
    "SkillError",
    "SkillResult",
    "call_openai_tool",
    "get_skills",
    "openai_tool_specs",
]

log = logging.getLogger("memory_node.agent")

Clock = Callable[[], float]

MEMORY_SKILL_NAMES = frozenset({
    "list_memory_streams",
    "query_memory",
    "remember",
    "query_agent_memory",
    "compact_memory",
    "where_am_i",
})
DEFAULT_RADIUS = 2.0
DEFAULT_K = 5
# where_am_i: "here" is this close, and "before" is at least this long ago.
HERE_RADIUS_M = 2.0
BEFORE_S = 60.0

_REQUIRED = object()
_JSON_TYPES = {"string": (str,), "number": (int, float), "integer": (int,)}


class SkillError(Exception):
    """A skill could not answer; the message is written for the model to read and act on."""


@dataclass(frozen=True)
class Param:
    """One parameter: its JSON type, what it means, and its default (required when absent).

    Optional parameters accept JSON null as "not given", since models often send it.
    """

    name: str
    type: str
    description: str
    default: Any = _REQUIRED
    minimum: float | None = None
    exclusive_minimum: float | None = None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "description": self.description}
        if not self.required and self.default is not None:
            out["default"] = self.default
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.exclusive_minimum is not None:
            out["exclusiveMinimum"] = self.exclusive_minimum
        return out

    def check(self, value: Any) -> Any:
        """Type-check one argument (range checks are the memory's: it names the field)."""
        if value is None and not self.required:
            return self.default
        if self.type == "integer" and isinstance(value, float) and value.is_integer():
            value = int(value)
        ok = isinstance(value, _JSON_TYPES[self.type]) and not isinstance(value, bool)
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            article = "an" if self.type == "integer" else "a"
            raise SkillError(f"'{self.name}' must be {article} {self.type}, got {value!r}")
        return value


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
    """A named, described, schema'd callable an agent framework can register as a tool."""

    name: str
    description: str
    params: tuple[Param, ...]
    fn: Callable[..., str] = field(repr=False)
    read_only: bool = True

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments (an object; no other properties)."""
        return {
            "type": "object",
            "properties": {p.name: p.schema() for p in self.params},
            "required": [p.name for p in self.params if p.required],
            "additionalProperties": False,
        }

    def bind(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Arguments checked against the parameters, defaults filled in."""
        known = {p.name: p for p in self.params}
        unknown = sorted(set(arguments) - set(known))
        if unknown:
            takes = ", ".join(known) or "no arguments"
            raise SkillError(f"unknown argument(s) {', '.join(unknown)}; {self.name} takes "
                             f"{takes}")
        out: dict[str, Any] = {}
        for p in self.params:
            if p.name in arguments:
                out[p.name] = p.check(arguments[p.name])
            elif p.required:
                raise SkillError(f"missing argument '{p.name}': {p.description}")
            else:
                out[p.name] = p.default
        return out

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

def _ask(fn: Callable[[], str]) -> dict[str, Any]:
    """One client call, its JSON decoded; a failure becomes a SkillError naming its code."""
    raw = fn()
    try:
        resp = json.loads(raw)
    except (TypeError, ValueError):
        raise SkillError(f"memory answered something that is not JSON: {str(raw)[:200]!r}"
                         ) from None
    if not isinstance(resp, dict):
        raise SkillError("memory answered an unexpected JSON value")
    if not resp.get("ok"):
        err = resp.get("error") or {}
        code = err.get("code", "internal")
        raise SkillError(f"{err.get('message', 'memory reported a failure')} ({code})")
    return resp


def _stream_summary(streams: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    lines = []
    for s in streams:
        count = int(s.get("count") or 0)
        what = "observation" if count == 1 else "observations"
        parts = [f"{s.get('name')}: {count} {what}"]
        if s.get("semantic"):
            parts.append("semantic search")
        first, last = s.get("first_t"), s.get("last_t")
        if isinstance(first, (int, float)) and isinstance(last, (int, float)):
            if first == last:
                parts.append(f"at {format_when(last, now)}")
            else:
                parts.append(f"from {format_when(first, now)} to {format_when(last, now)}")
        lines.append(", ".join(parts))
    return lines


def _search_query(stream: str | None, semantic_query: str | None, near_x: float | None,
                  near_y: float | None, radius: float, after_seconds_ago: float | None,
                  k: int) -> str:
    q: dict[str, Any] = {"k": k, "radius": radius}
    if stream is not None:
        q["stream"] = stream
    if semantic_query is not None:
        q["semantic_query"] = semantic_query
    if near_x is not None or near_y is not None:
        q["near_x"], q["near_y"] = near_x, near_y
    if after_seconds_ago is not None:
        q["after_seconds_ago"] = after_seconds_ago
    return json.dumps(q, ensure_ascii=False)


# ---- the skills -------------------------------------------------------------------------

_FILTER_PARAMS = (
    Param("semantic_query", "string",
          "What to look for, in words; matched by meaning (e.g. 'red door', 'person waving'). "
          "Omit to list newest first.", None),
    Param("near_x", "number",
          "World x in metres of the place to search around; give it with near_y. Take it from "
          "a result's 'x=' or from the [Current pose: x=…] line.", None),
    Param("near_y", "number",
          "World y in metres of the place to search around; give it with near_x.", None),
    Param("radius", "number", "Search radius in metres around near_x/near_y.",
          DEFAULT_RADIUS, exclusive_minimum=0),
    Param("after_seconds_ago", "number",
          "Only observations from the last N seconds (600 = the last 10 minutes).", None,
          minimum=0),
    Param("k", "integer", "How many results to return.", DEFAULT_K, minimum=1),
)

_QUERY_HOW = (
    "Filters combine and are applied before ranking. With semantic_query the best matches "
    "come first, otherwise the newest. Each result line reads '#id stream time (age) at x=… "
    "y=… heading=… | what was observed | tags: …'; pass a result's x and y as near_x and "
    "near_y to look around that place, or the x and y of the [Current pose: …] line to look "
    "around the robot now.")


class _MemorySkills:
    """The six skills bound to one client and clock (closures would hide the why)."""

    def __init__(self, client: MemoryClient, clock: Clock):
        self.client = client
        self.clock = clock

    # -- list_memory_streams --------------------------------------------------------------
    def list_memory_streams(self) -> str:
        resp = _ask(self.client.streams)
        streams = resp.get("streams") or []
        now = self.clock()
        lines = _stream_summary(streams, now)
        empty = [s for s in self.client.default_streams
                 if s not in {str(x.get("name")) for x in streams}]
        if not lines:
            lines = ["Memory is empty: nothing recorded yet."]
        if empty:
            lines.append(f"No observations yet in: {', '.join(empty)}.")
        return "\n".join(lines)

    def streams_for_description(self) -> str:
        """The live stream list for query_memory's description, or the configured names."""
        try:
            streams = _ask(self.client.streams).get("streams") or []
        except Exception as exc:  # noqa: BLE001 - a description must always be produced
            log.info("live stream list unavailable for the tool description: %s", exc)
            return ("Streams (configured; the live list is unavailable now): "
                    + ", ".join(self.client.default_streams) + ".")
        if not streams:
            return ("Memory holds no observations yet; configured streams: "
                    + ", ".join(self.client.default_streams) + ".")
        now = self.clock()
        return "Streams now:\n" + "\n".join(f"- {line}" for line in _stream_summary(streams, now))

    # -- query_memory / query_agent_memory -------------------------------------------------
    def _query(self, stream: str, semantic_query: str | None, near_x: float | None,
               near_y: float | None, radius: float, after_seconds_ago: float | None,
               k: int) -> str:
        if not stream.strip():
            raise SkillError("'stream' must name a stream; call list_memory_streams() to see "
                             "them")
        query = _search_query(stream.strip(), semantic_query, near_x, near_y, radius,
                              after_seconds_ago, k)
        resp = _ask(lambda: self.client.search(query))
        return format_results(resp.get("results") or [], self.clock(), resp.get("notes") or ())

    def query_memory(self, stream: str, semantic_query: str | None = None,
                     near_x: float | None = None, near_y: float | None = None,
                     radius: float = DEFAULT_RADIUS, after_seconds_ago: float | None = None,
                     k: int = DEFAULT_K) -> str:
        return self._query(stream, semantic_query, near_x, near_y, radius, after_seconds_ago, k)

    def query_agent_memory(self, semantic_query: str | None = None, near_x: float | None = None,
                           near_y: float | None = None, radius: float = DEFAULT_RADIUS,
                           after_seconds_ago: float | None = None, k: int = DEFAULT_K) -> str:
        return self._query("events", semantic_query, near_x, near_y, radius,
                           after_seconds_ago, k)

    # -- remember ----------------------------------------------------------------------------
    def remember(self, note: str) -> str:
        if not note.strip():
            raise SkillError("empty note: write what to remember")
        resp = _ask(lambda: self.client.save(note))
        now = self.clock()
        oid = resp.get("id")
        t = resp.get("t")
        when = format_when(float(t), now) if isinstance(t, (int, float)) else "now"
        place = format_place(resp.get("pose"), with_heading=False)
        if resp.get("folded"):
            return (f"Already remembered: note #{oid} (written {when}, {place}) says the same "
                    f"from the same place; it now counts this repeat, nothing new stored.")
        if oid is None or not resp.get("indexed", True):
            ref = f"#{oid}" if oid is not None else "the note"
            return (f"Stored {ref} at {when}, {place}, in the notes file; it becomes "
                    f"searchable once indexing catches up.")
        return f"Remembered as #{oid} at {when}, {place}."

    # -- compact_memory ----------------------------------------------------------------------
    def compact_memory(self) -> str:
        resp = _ask(self.client.compact)
        thinned = int(resp.get("thinned") or 0)
        folded = int(resp.get("folded") or 0)
        line = (f"Compaction done: {thinned} old keyframe(s) thinned, {folded} "
                f"near-duplicate(s) folded; nothing was deleted (set-aside rows kept: "
                f"{int(resp.get('archived_total') or 0)}).")
        summ = resp.get("summaries") or {}
        status = summ.get("status")
        if status == "ok":
            line += f" Summaries written: {int(summ.get('written') or 0)}."
        elif status:
            msg = summ.get("message")
            line += f" Summaries {status}" + (f": {msg}." if msg else ".")
        return line

    # -- where_am_i --------------------------------------------------------------------------
    def where_am_i(self) -> str:
        pose = current_pose_or_none(self.client)
        line = pose_line(pose)
        if pose is None:
            return (line + "\nThe robot's position is not known yet (no transform from the "
                    "world frame to the robot), so earlier visits cannot be looked up.")
        base = {"near_x": round(pose.x, 3), "near_y": round(pose.y, 3),
                "radius": HERE_RADIUS_M, "before_seconds_ago": BEFORE_S}
        try:
            newest = _ask(lambda: self.client.search(json.dumps({**base, "k": 3})))
            results = newest.get("results") or []
            first: list[Mapping[str, Any]] = []
            if results:
                oldest = _ask(lambda: self.client.search(
                    json.dumps({**base, "k": 1, "order_by": "time"})))
                first = oldest.get("results") or []
        except SkillError as exc:
            return line + f"\nEarlier visits could not be looked up: {exc}"
        where = f"within {HERE_RADIUS_M:g} m of here"
        if not results:
            return line + f"\nNo memory of being {where} before (more than a minute ago)."
        now = self.clock()
        text = line + (f"\nBeen {where} before: most recently {format_when(results[0]['t'], now)}")
        if first and first[0].get("id") != results[0].get("id"):
            text += f", first {format_when(first[0]['t'], now)}"
        return text + ".\nLatest observations here:\n" + format_results(results, now)


def get_skills(client: MemoryClient, *, clock: Clock | None = None,
               live_descriptions: bool = True) -> list[Skill]:
    """The memory skills for `client`, descriptions computed now (one `streams()` call).

    Call it each time tools are listed to the model, so `query_memory`'s description names
    the streams memory holds now. `clock` is "now" for ages in answers; default the
    client's clock (the memory's clock: ROS time on the ROS backend, so simulated time reads
    right). `live_descriptions=False` skips the `streams()` call, for dispatching calls.
    """
    live = live_descriptions
    m = _MemorySkills(client, clock or client.now)
    streams_text = m.streams_for_description() if live else (
        "Call list_memory_streams() to see the streams.")
    return [
        Skill(
            "list_memory_streams",
            "List the robot's memory streams: how many observations each holds, whether it "
            "supports semantic_query, and the time span it covers.",
            (), m.list_memory_streams),
        Skill(
            "query_memory",
            "Search the robot's memory of what it perceived (camera descriptions, lidar, "
            "odometry) and its notes, in one stream, by meaning, place and time. "
            + _QUERY_HOW + "\n" + streams_text,
            (Param("stream", "string",
                   "The stream to search, e.g. 'camera' (see the list in this description)."),
             *_FILTER_PARAMS),
            m.query_memory),
        Skill(
            "remember",
            "Write an episodic note to long-term memory, stamped with the robot's current "
            "place and time. Use it after something worth recalling later: meeting or greeting "
            "someone (name, what they asked), finishing or failing a task, a user's "
            "instruction or preference, something notable seen. Write one self-contained "
            "sentence with names and specifics; it is found later by meaning, place and time. "
            "Not for routine steps (each move, each sensor check) or what the sensors record "
            "anyway. A repeat of a recent note from the same place is folded into it.",
            (Param("note", "string",
                   "The note, e.g. 'Met Bob at the front door; he asked for water.'"),),
            m.remember, read_only=False),
        Skill(
            "query_agent_memory",
            "Search the agent's own episodic notes (stream 'events', written with remember): "
            "who was met, what was asked, decided or done, and where. " + _QUERY_HOW,
            _FILTER_PARAMS, m.query_agent_memory),
        Skill(
            "compact_memory",
            "Consolidate memory: thin old camera keyframes, fold near-duplicate observations "
            "and, when an LLM is configured, summarise old notes into the 'summaries' stream. "
            "Nothing is lost. Rarely needed: when asked to tidy memory or after a long "
            "session.",
            (), m.compact_memory, read_only=False),
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
