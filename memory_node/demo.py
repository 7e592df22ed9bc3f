"""`memory-demo` (`make demo`): replay the sample flat into live nodes, then ask memory the
questions an agent would, through the agent skills, and check the answers against ground truth.

Steps: generate (or reuse) the seeded sample bag; start `memory-node --use-sim-time` on a fresh
store; replay the bag with /clock; while the robot stands at the front door with a person
there, the scripted agent calls `remember`; afterwards it asks where the brightest place is,
whether it has been here before, who it greeted at the door, and a combined spatial + temporal
+ semantic question. It writes a top-down PNG (metres, a scale bar) of trajectory, keyframes,
notes and hits, and the server publishes each search's hits on /memory/markers
(visualization_msgs/MarkerArray).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from memory_node.session import Sample, Session, isolated_env, load_sample, wait_until_settled

ALICE_NOTE = "Met Alice at the front door. She asked me to water the plants in the living room."


def tick_step(span_m: float, max_ticks: int = 10) -> float:
    """The step of round axis ticks (1, 2 or 5 x 10^k metres) giving at most `max_ticks`."""
    raw = max(span_m, 1e-9) / max_ticks
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * (1 - 1e-9))


def ticks(lo: float, hi: float, max_ticks: int = 10) -> list[float]:
    """Round metre values from lo to hi (both inclusive), `tick_step` apart."""
    step = tick_step(hi - lo, max_ticks)
    first = math.ceil(lo / step - 1e-9) * step
    n = int(math.floor((hi - first) / step + 1e-9)) + 1
    return [round(first + i * step, 9) + 0.0 for i in range(max(n, 0))]


def scale_bar_m(span_m: float) -> float:
    """A scale bar's length: the longest round length (1, 2 or 5 x 10^k m) within a fifth of
    the span."""
    target = max(span_m, 1e-9) / 5
    magnitude = 10.0 ** math.floor(math.log10(target))
    return max(m * magnitude for m in (1, 2, 5) if m * magnitude <= target * (1 + 1e-9))


def _metres(v: float) -> str:
    return f"{v:g}"


@dataclass(frozen=True)
class MapView:
    """A top-down plan: world (x0..x1, y0..y1) in metres at `scale` px/m, drawn with margins
    for the axes' labels (left, bottom) and the legend (below)."""

    x0: float
    x1: float
    y0: float
    y1: float
    scale: float = 60.0
    left: int = 48
    top: int = 12
    right: int = 12
    bottom: int = 36  # the x axis' tick labels and title
    legend: int = 50
    min_width: int = 580  # the legend's two lines

    @property
    def plot_w(self) -> int:
        return int(round((self.x1 - self.x0) * self.scale))

    @property
    def plot_h(self) -> int:
        return int(round((self.y1 - self.y0) * self.scale))

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) of the whole picture in pixels."""
        return (self.top + self.plot_h + self.bottom + self.legend,
                max(self.left + self.plot_w + self.right, self.min_width))

    def px(self, x: float, y: float) -> tuple[int, int]:
        return (self.left + int(round((x - self.x0) * self.scale)),
                self.top + int(round((self.y1 - y) * self.scale)))

    def canvas(self) -> Any:
        import numpy as np

        return np.full((*self.size, 3), 250, np.uint8)

    def draw_axes(self, img: Any, frame: str) -> dict[str, Any]:
        """Grid, ticks labelled in metres on both axes, the axes' titles, the frame's name and
        a scale bar; returns what it drew (tick values, the bar's length and pixel ends)."""
        import cv2

        font, ink, grid = cv2.FONT_HERSHEY_SIMPLEX, (60, 60, 60), (232, 232, 232)
        left, top = self.left, self.top
        right, bottom = left + self.plot_w, top + self.plot_h
        # labelled ticks at least ~50 px apart
        xs = ticks(self.x0, self.x1, max(2, self.plot_w // 50))
        ys = ticks(self.y0, self.y1, max(2, self.plot_h // 50))
        for x in xs:
            u = self.px(x, self.y0)[0]
            cv2.line(img, (u, top), (u, bottom), grid, 1)
            cv2.line(img, (u, bottom), (u, bottom + 5), ink, 1)
            label = _metres(x)
            (w, _), _ = cv2.getTextSize(label, font, 0.4, 1)
            cv2.putText(img, label, (u - w // 2, bottom + 18), font, 0.4, ink, 1, cv2.LINE_AA)
        for y in ys:
            v = self.px(self.x0, y)[1]
            cv2.line(img, (left, v), (right, v), grid, 1)
            cv2.line(img, (left - 5, v), (left, v), ink, 1)
            label = _metres(y)
            (w, h), _ = cv2.getTextSize(label, font, 0.4, 1)
            cv2.putText(img, label, (left - 8 - w, v + h // 2), font, 0.4, ink, 1, cv2.LINE_AA)
        cv2.rectangle(img, (left, top), (right, bottom), ink, 1)
        cv2.putText(img, "x (m)", (right - 40, bottom + 32), font, 0.42, ink, 1, cv2.LINE_AA)
        cv2.putText(img, "y (m)", (4, top + 10), font, 0.42, ink, 1, cv2.LINE_AA)
        cv2.putText(img, f"frame: {frame}", (left + 8, top + 18), font, 0.45, ink, 1,
                    cv2.LINE_AA)
        bar = scale_bar_m(self.x1 - self.x0)
        b1 = right - 16
        b0 = b1 - int(round(bar * self.scale))
        yb = bottom - 16
        cv2.rectangle(img, (b0, yb - 2), (b1, yb + 2), (30, 30, 30), -1)
        for end in (b0, b1):
            cv2.line(img, (end, yb - 7), (end, yb + 7), (30, 30, 30), 2)
        label = f"{_metres(bar)} m"
        (w, _), _ = cv2.getTextSize(label, font, 0.45, 1)
        cv2.putText(img, label, ((b0 + b1 - w) // 2, yb - 10), font, 0.45, (30, 30, 30), 1,
                    cv2.LINE_AA)
        return {"x_ticks": xs, "y_ticks": ys, "scale_bar_m": bar, "scale_bar_px": (b0, b1, yb)}


def draw_map(path: Path, sample: Sample, memory_dir: Path, hits: list[dict],
             notes: list[dict], frame: str = "map") -> Path:
    """Top-down PNG in `frame` (metres, a scale bar): walls, trajectory, camera keyframes,
    notes and one query's hits."""
    import cv2

    from memory_node.core.config import MemoryConfig
    from memory_node.core.store.sqlite_store import SqliteObservationStore

    truth = sample.truth
    pts = [(p["x"], p["y"]) for p in truth.get("path", [])]
    boxes = [r["box"] for r in truth.get("rooms", {}).values()]
    xs = [p[0] for p in pts] + [b[0] for b in boxes] + [b[2] for b in boxes] + [sample.door[0]]
    ys = [p[1] for p in pts] + [b[1] for b in boxes] + [b[3] for b in boxes] + [sample.door[1]]
    view = MapView(min(xs) - 1.5, max(xs) + 1.5, min(ys) - 1.5, max(ys) + 1.5)
    img = view.canvas()
    view.draw_axes(img, frame)
    px = view.px

    for name, room in truth.get("rooms", {}).items():
        x_min, y_min, x_max, y_max = room["box"]
        cv2.rectangle(img, px(x_min, y_max), px(x_max, y_min), (180, 180, 180), 2)
        cv2.putText(img, name.replace("_", " "), px(x_min + 0.2, y_max - 0.4),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.5, (120, 120, 120), 1)
    for a, b in pairwise(pts):
        cv2.line(img, px(*a), px(*b), (200, 160, 120), 1)
    store = SqliteObservationStore(MemoryConfig(memory_dir=str(memory_dir)).db_path)
    try:
        for obs in store.rows("stream = 'camera'"):
            if obs.pose is not None and obs.pose.frame == frame:
                lum = float(obs.tags.get("brightness", 0.5))  # dark blue .. bright yellow
                colour = (int(160 * (1 - lum)), int(40 + 215 * lum), int(40 + 215 * lum))
                cv2.circle(img, px(obs.pose.x, obs.pose.y), 4, colour, -1)
    finally:
        store.close()
    for hit in hits:
        p = hit.get("pose") or {}
        if p.get("x") is not None:
            cv2.circle(img, px(p["x"], p["y"]), 9, (0, 140, 255), 2)
    for note in notes:
        p = note.get("pose") or {}
        if p.get("x") is not None:
            cv2.drawMarker(img, px(p["x"], p["y"]), (30, 30, 220), cv2.MARKER_STAR, 18, 2)
    cv2.drawMarker(img, px(*sample.door), (0, 0, 160), cv2.MARKER_SQUARE, 14, 2)
    cv2.drawMarker(img, px(*sample.window), (0, 200, 255), cv2.MARKER_DIAMOND, 14, 2)
    legend_top = view.size[0] - view.legend
    for i, legend in enumerate((
            "line: path   dots: camera keyframes (blue = dark, yellow = bright view)",
            "orange rings: query hits   red star: note   square: front door   diamond: window")):
        cv2.putText(img, legend, (6, legend_top + 20 + 18 * i), cv2.FONT_HERSHEY_SIMPLEX, 0.42,
                    (40, 40, 40), 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), img)
    return path


# ---- the scripted agent -------------------------------------------------------------------
class Turns:
    """Prints the conversation readably and keeps the checks' outcomes."""

    def __init__(self, out: Callable[[str], None] = print):
        self.out = out
        self.checks: list[tuple[str, bool, str]] = []
        self.n = 0

    def user(self, text: str, pose_line: str) -> None:
        self.n += 1
        self.out(f"\n[turn {self.n}] user: {text}\n  {pose_line}")

    def tool(self, name: str, args: dict[str, Any], answer: str) -> None:
        shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
        self.out(f"  -> {name}({shown})")
        for line in answer.splitlines()[:6]:
            self.out(f"     {line}")

    def agent(self, text: str) -> None:
        self.out(f"  agent: {text}")

    def check(self, what: str, ok: bool, detail: str) -> None:
        self.checks.append((what, ok, detail))
        self.out(f"  check: {what}: {'OK' if ok else 'FAILED'} ({detail})")


QUESTIONS = (
    "Walk towards the brightest part of the flat. Where is it?",
    "Have you been here before?",
    "Who did you greet at the door earlier?",
    "Was anyone standing near the front door since you started?",
)


def run_demo(out_dir: Path, *, rate: float = 2.0, seed: int = 7, two_process: bool = False,
             duration_s: float | None = None, echo: Callable[[str], None] = print,
             llm: Any = None) -> dict[str, Any]:
    """Everything `make demo` does; returns the checks and paths (the e2e tests use it)."""
    from memory_node.agent.prompt import pose_line
    from memory_node.agent.ros_client import RosClient
    from memory_node.agent.skills import get_skills

    out_dir = Path(out_dir)
    echo(f"memory-demo: sample flat (seed {seed}) in {out_dir / 'sample'}")
    sample = load_sample(out_dir / "sample", seed, duration_s)
    memory_dir = out_dir / "memory"
    shutil.rmtree(memory_dir, ignore_errors=True)
    env = isolated_env()
    for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_LOCALHOST_ONLY"):
        if k in env:
            os.environ[k] = env[k]
    session = Session(memory_dir, env, out_dir / "logs", two_process)
    echo(f"memory-demo: starting {'recorder + server' if two_process else 'memory-node'} "
         f"(sim time, ROS_DOMAIN_ID={env['ROS_DOMAIN_ID']}) on a fresh store {memory_dir}")
    session.start()
    client = RosClient(use_sim_time=True, timeout_s=20.0)
    turns = Turns(echo)
    result: dict[str, Any] = {"memory_dir": memory_dir, "sample": sample, "turns": turns}
    try:
        skills = {s.name: s for s in get_skills(client)}
        remembered: dict[str, Any] = {}
        person = sample.person

        def at_the_door() -> None:
            if remembered:
                return
            pose, now = client.current_pose(), client.now()
            if pose is None or not person["t_start"] <= now <= person["t_end"]:
                return
            if math.hypot(pose.x - person["x"], pose.y - person["y"]) > 3.0:
                return
            turns.user("(at the front door, a person greets the robot)", pose_line(pose))
            answer = skills["remember"].call(note=ALICE_NOTE)
            turns.tool("remember", {"note": ALICE_NOTE}, answer)
            remembered.update(answer=answer, pose=pose, t=now)

        echo(f"memory-demo: replaying {sample.bag} at {rate:g}x "
             f"({sample.truth.get('duration', '?')} s of recording)")
        t0 = time.monotonic()
        session.replay(sample.bag, rate, on_wait=at_the_door)
        settled = wait_until_settled(client)
        echo(f"memory-demo: replay done in {time.monotonic() - t0:.0f} s; {settled} "
             "observations stored")
        result["remembered"] = remembered
        ask(skills, client, sample, turns, result)
        ask_each_kind(skills, client, sample, turns)
        if llm is not None:
            ask_llm(llm, client, echo)
        result["png"] = draw_map(out_dir / "memory_map.png", sample, memory_dir,
                                 result.get("hits", []), result.get("notes", []))
        echo(f"\nmemory-demo: top-down picture: {result['png']}")
    finally:
        client.close()
        session.stop()
    ok = all(c[1] for c in turns.checks)
    echo(f"\nmemory-demo: {sum(c[1] for c in turns.checks)} of {len(turns.checks)} checks "
         f"against ground truth passed")
    result["ok"] = ok
    return result


def _results(client: Any, query: dict[str, Any]) -> list[dict]:
    return json.loads(client.search(json.dumps(query))).get("results", [])


def ask(skills: dict, client: Any, sample: Sample, turns: Turns, result: dict) -> None:
    from memory_node.agent.prompt import pose_line

    def call(name: str, **kwargs: Any) -> str:
        answer = skills[name].call(**kwargs)
        turns.tool(name, kwargs, answer)
        return answer

    pose = client.current_pose()
    now = client.now()
    started = float(sample.truth.get("epoch", now - 600))
    # 1. brightest place
    turns.user(QUESTIONS[0], pose_line(pose))
    call("query_memory", stream="camera", semantic_query="a very bright scene, white light",
         k=3)
    [top] = _results(client, {"stream": "camera", "order_by": "-brightness", "k": 1}) or [{}]
    tp = top.get("pose") or {}
    if tp.get("x") is not None:
        d = math.hypot(tp["x"] - sample.window[0], tp["y"] - sample.window[1])
        turns.agent(f"The brightest view (brightness {top['tags'].get('brightness')}) was seen "
                    f"from x={tp['x']:.2f}, y={tp['y']:.2f}; I would walk there.")
        turns.check("brightest place is by the window", d <= 3.0,
                    f"{d:.2f} m from the window at x={sample.window[0]:.2f}, "
                    f"y={sample.window[1]:.2f}; tolerance 3.0 m")
    else:
        turns.check("brightest place is by the window", False, "no camera keyframes")
    result["brightest"] = top

    # 2. been here before?
    turns.user(QUESTIONS[1], pose_line(pose))
    call("where_am_i")
    earlier = []
    if pose is not None:
        earlier = _results(client, {"stream": "odom", "near_x": pose.x, "near_y": pose.y,
                                    "radius": 1.0, "before_seconds_ago": 60, "k": 3})
    turns.agent(("Yes: I was within 1 m of here " + ", ".join(
        f"{now - r['t']:.0f} s ago" for r in earlier) + ".") if earlier else "No.")
    turns.check("been here before (revisited place)", bool(earlier),
                f"{len(earlier)} earlier odometry keyframes within 1 m")
    nv = (sample.truth.get("never_visited") or [{}])[0]
    if "x" in nv:
        never = _results(client, {"stream": "odom", "near_x": nv["x"], "near_y": nv["y"],
                                  "radius": 1.0})
        turns.check("never been at an unvisited point", not never,
                    f"x={nv['x']:.2f}, y={nv['y']:.2f}: {len(never)} keyframes within 1 m")
    result["been_here"] = earlier

    # 3. who did I greet at the door?
    turns.user(QUESTIONS[2], pose_line(pose))
    call("query_agent_memory", semantic_query="who did I greet at the door")
    notes = _results(client, {"stream": "events", "semantic_query": "who did I greet at the door",
                              "k": 1})
    result["notes"] = notes
    if notes:
        turns.agent(f"\"{notes[0]['text']}\"")
    turns.check("the door note is recalled", bool(notes) and "Alice" in notes[0]["text"],
                "top event: " + (notes[0]["text"][:50] if notes else "none"))

    # 4. combined spatial + temporal + semantic
    person = sample.person
    since = now - started + 5
    turns.user(QUESTIONS[3], pose_line(pose))
    q = {"stream": "camera", "semantic_query": "one person standing", "near_x": sample.door[0],
         "near_y": sample.door[1], "radius": 3.5, "after_seconds_ago": round(since, 1),
         "k": 5}
    call("query_memory", **q)
    hits = _results(client, {**q, "tags": {"person": True}})
    result["hits"] = hits
    in_window = [h for h in hits if person["t_start"] - 1 <= h["t"] <= person["t_end"] + 1]
    if hits:
        turns.agent(f"Yes: {len(hits)} views with a person near the door, at "
                    + ", ".join(f"{now - h['t']:.0f} s ago" for h in hits[:3]) + ".")
    turns.check("person seen near the door, in the right time window",
                bool(hits) and len(in_window) == len(hits),
                f"{len(in_window)} of {len(hits)} person frames within "
                f"[{person['t_start'] - started:.0f} s, {person['t_end'] - started:.0f} s]")


# One question of each kind from the sample's question set (ground_truth.json; memory-eval
# asks them all): where, when, what / yes-no, how long, how many.
KIND_QUESTIONS = ("where-window_1", "when-last-kitchen", "seen-window", "how-long-kitchen",
                  "count-hallway-living room doorway")


def ask_each_kind(skills: dict, client: Any, sample: Sample, turns: Turns) -> None:
    from memory_node.agent.prompt import pose_line
    from memory_node.eval import Asker, check, name_places, show

    truth = sample.truth
    by_id = {q["id"]: q for q in truth.get("questions", [])}
    if not by_id:
        return
    name_places(skills, truth.get("places", {}))
    turns.user("(the rooms, doorways and a few spots are named with name_place: "
               + ", ".join(truth.get("places", {})) + ")", pose_line(client.current_pose()))
    for qid in KIND_QUESTIONS:
        q = by_id.get(qid)
        if q is None:
            continue
        turns.user(q["question"], pose_line(client.current_pose()))
        asker = Asker(skills, client.now(), on_call=turns.tool)
        got = asker.answer(q["ask"])
        turns.agent(show(got))
        tol = f" ± {q['tolerance']}" if q.get("tolerance") else ""
        turns.check(f"{q['kind']}: {q['question']}", check(q, got),
                    f"expected {show(q['answer'])}{tol}, answered {show(got)}")


def ask_llm(chat: Any, client: Any, echo: Callable[[str], None]) -> None:
    """The same questions, answered by a real model driving the same tools."""
    from memory_node.agent.llm_agent import run_turn

    echo(f"\nmemory-demo: the same questions, answered by {chat.settings.model} through the "
         "memory tools")
    history: list[dict[str, Any]] = []
    for q in QUESTIONS:
        echo(f"\n[llm] user: {q}")

        def show(name: str, args: dict[str, Any], answer: str) -> None:
            echo(f"  -> {name}({', '.join(f'{k}={v!r}' for k, v in args.items())})")
            for line in answer.splitlines()[:4]:
                echo(f"     {line}")

        try:
            result = run_turn(chat, client, q, history, on_tool=show)
        except Exception as exc:  # noqa: BLE001 - the model is optional; report and go on
            echo(f"  (the model call failed: {exc})")
            return
        echo(f"  {chat.settings.model}: {result.answer}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memory-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("demo_out"))
    parser.add_argument("--rate", type=float, default=2.0, help="replay speed (default 2x)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--two-process", action="store_true",
                        help="recorder and server in separate processes")
    parser.add_argument("--llm", action="store_true",
                        help="also let a real model (VLM_* or OPENAI_* settings) answer the "
                        "questions through the same tools")
    args = parser.parse_args(argv)
    chat = None
    if args.llm:
        from memory_node.core.llm import ChatClient, resolve_llm_settings

        settings = resolve_llm_settings()
        if settings is None:
            print("memory-demo: --llm needs VLM_API_KEY (with VLM_BASE_URL, VLM_MODEL) or "
                  "OPENAI_API_KEY", file=sys.stderr)
            return 2
        chat = ChatClient(settings, timeout=120.0)
    result = run_demo(args.out, rate=args.rate, seed=args.seed, two_process=args.two_process,
                      llm=chat)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
