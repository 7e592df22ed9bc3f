"""System-prompt text and the per-turn pose line.

Spatial parameters take world coordinates, which an LLM cannot know by itself. Two sources
give them for free: the pose line prepended to each user turn (`prepend_pose`: "around me")
and the `at x=… y=…` of every memory result (tool chaining: "the kitchen from earlier").
`MEMORY_PROMPT_SECTION` tells the model both, and when to write notes.

Use in an agent host:

    system_prompt = BASE_PROMPT + "\\n\\n" + MEMORY_PROMPT_SECTION
    user_turn = prepend_pose(user_text, client)   # every turn, before the LLM sees it
"""

from __future__ import annotations

import logging

from memory_node.agent.answers import format_heading
from memory_node.agent.client import MemoryClient
from memory_node.core.types import Pose

__all__ = ["MEMORY_PROMPT_SECTION", "UNKNOWN_POSE_LINE", "pose_line", "prepend_pose"]

log = logging.getLogger(__name__)

UNKNOWN_POSE_LINE = "[Current pose: unknown]"

MEMORY_PROMPT_SECTION = """\
## Memory

You have a persistent memory of what the robot perceived (camera, lidar, odometry; every
observation is stamped with the place and the time) and of your own notes. Use it instead of
guessing, and never invent memories.

Recall
- Before answering about the past (what you saw, who you met, where something was, whether you
  have been somewhere), query memory first.
- Sensor memory: `query_memory(stream=...)`; the stream names and counts are in its
  description, and `list_memory_streams()` refreshes them. Your own notes:
  `query_agent_memory(...)`.
- Filters combine and are applied before ranking: `semantic_query` (what, in words),
  `near_x`/`near_y` with `radius` (where: metres in the world frame), `after_seconds_ago`
  (when: only the last N seconds). Without `semantic_query` results come newest first.

Coordinates
- Each user message starts with a line like
  `[Current pose: x=1.20, y=-0.40, heading=90°, frame=map]`: where the robot is now. For
  "around me" or "here", pass that x and y as `near_x` and `near_y`.
- Each result line says where it was observed: `at x=3.10 y=0.50 heading=…`. To look around a
  remembered place ("the kitchen from earlier"), find it first (for example
  `query_agent_memory(semantic_query="kitchen")`), then pass that result's x and y as
  `near_x`/`near_y` in the next query, or as a navigation goal.
- `where_am_i()` gives the current pose and whether, and when, you were here before.
- Heading 0° faces +x, 90° faces +y.

Remember
- Call `remember(note)` after something worth recalling later: meeting or greeting someone
  (name, what they asked), finishing or failing a task, an instruction or preference a user
  gave, something notable seen. Write one self-contained sentence with names and specifics,
  e.g. `remember("Met Bob at the front door; he asked for a glass of water.")`. The place and
  time are stamped automatically.
- Do not call `remember()` for routine steps (each move, each sensor check), for what the
  sensors record anyway, or to repeat a note you already wrote.

Empty or failed answers
- "No matching observations found." means nothing passed the filters: widen `radius`, drop
  `after_seconds_ago` or rephrase before concluding that nothing is known.
- An error message names the wrong argument: correct it and try again once.
"""


def pose_line(pose: Pose | None) -> str:
    """'[Current pose: x=1.20, y=-0.40, heading=90°, frame=map]', or '[Current pose: unknown]'.

    Two decimals (centimetres) are what the spatial parameters need; the heading is in whole
    degrees, counter-clockwise from +x.
    """
    if pose is None:
        return UNKNOWN_POSE_LINE
    return (f"[Current pose: x={pose.x:.2f}, y={pose.y:.2f}, "
            f"heading={format_heading(pose.yaw)}, frame={pose.frame}]")


def current_pose_or_none(client: MemoryClient) -> Pose | None:
    """The client's pose; a failing pose source reads as unknown, never as a failed turn."""
    try:
        return client.current_pose()
    except Exception:  # noqa: BLE001 - the turn goes on without a pose
        log.exception("could not read the current pose")
        return None


def prepend_pose(message: str, client: MemoryClient) -> str:
    """The user's message with the pose line in front (call once per turn)."""
    return f"{pose_line(current_pose_or_none(client))}\n{message}"
