"""Optional: a note after each completed skill call of the agent (off by default).

The default `remember()` policy is the LLM's judgement, guided by the prompt: notes written
for later recall, not a log. Hosts that want a deterministic trail of what the robot *did*
(navigation goals reached, objects picked) turn this on: after each call of a selected skill,
one line goes to memory through `save`, stamped with place and time like any note and tagged
`kind=skill_call`. The memory skills themselves are never recorded (a query would record a
line, which a query would find, ...), and the engine folds repeats from the same place.

    recorder = SkillCallRecorder(client, record_skill_calls=True, include={"navigate_to"})
    navigate_to = recorder.wrap_function(navigate_to)      # a host function
    skills = [recorder.wrap(s) for s in host_skills]        # or Skill objects
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from memory_node.agent.client import MemoryClient
from memory_node.agent.skills import MEMORY_SKILL_NAMES, Skill, SkillError
from memory_node.core.contract import ErrorAnswer, SaveAnswer, SaveNote

__all__ = ["SkillCallRecorder"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def _short(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class SkillCallRecorder:
    """Records one note per completed call of the selected skills.

    `record_skill_calls` switches it on (off by default). `include` selects skills: None for
    every skill, a collection of names, or a predicate on the name; `exclude` removes names.
    Memory skills are never recorded whatever the filter says.
    """

    client: MemoryClient
    record_skill_calls: bool = False
    include: Collection[str] | Callable[[str], bool] | None = None
    exclude: Collection[str] = ()
    record_failures: bool = True
    max_chars: int = 200

    def wants(self, name: str) -> bool:
        if not self.record_skill_calls or name in MEMORY_SKILL_NAMES or name in self.exclude:
            return False
        if self.include is None:
            return True
        if callable(self.include):
            return bool(self.include(name))
        return name in self.include

    def note_for(self, name: str, arguments: Mapping[str, Any], result: Any, ok: bool) -> str:
        """The save payload: one readable line, tagged so queries can filter on it."""
        args = ", ".join(f"{k}={_short(v, 60)}" for k, v in arguments.items())
        outcome = "->" if ok else "failed:"
        line = f"Skill call {name}({args}) {outcome} {_short(result, self.max_chars)}"
        return SaveNote(note=line, tags={"kind": "skill_call", "skill": name, "ok": ok}
                        ).to_json()

    def record(self, name: str, arguments: Mapping[str, Any], result: Any, *,
               ok: bool = True) -> SaveAnswer | ErrorAnswer | None:
        """Save the line when the filter selects `name`; returns memory's answer or None.

        Never raises: a memory that is down must not fail the skill call it records.
        """
        if not self.wants(name) or (not ok and not self.record_failures):
            return None
        try:
            answer = self.client.ask_save(self.note_for(name, arguments, result, ok))
            if isinstance(answer, ErrorAnswer):
                log.warning("recording the call of %s failed: %s: %s", name,
                            answer.error.code, answer.error.message)
        except Exception:  # noqa: BLE001
            log.exception("recording the call of %s failed", name)
            return None
        return answer

    def wrap(self, skill: Skill) -> Skill:
        """The same skill, recording each completed call while the filter selects it
        (memory skills come back unchanged)."""
        if skill.name in MEMORY_SKILL_NAMES:
            return skill
        inner = skill.fn

        def fn(**kwargs: Any) -> str:
            try:
                result = inner(**kwargs)
            except SkillError as exc:
                self.record(skill.name, kwargs, str(exc), ok=False)
                raise
            self.record(skill.name, kwargs, result)
            return result

        return replace(skill, fn=fn)

    def wrap_function(self, fn: F, name: str | None = None) -> F:
        """Decorate a host function (keyword arguments are recorded by name)."""
        skill_name = name or fn.__name__

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            shown = {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                self.record(skill_name, shown, f"{type(exc).__name__}: {exc}", ok=False)
                raise
            self.record(skill_name, shown, result)
            return result

        return wrapper  # type: ignore[return-value]
