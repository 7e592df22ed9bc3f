"""`memory-eval`: the sample recording's question set (ground_truth.json, issue 14), answered
through the agent skills, with accuracy per kind of question.

Kinds: where (a position), when (a time), yes_no (what / yes-no), how_long (a duration),
count (how many times) and object (where did I see the fridge: the flat's furniture, answered
by a semantic camera search, right when the answer is within 1 m of a pose the object was in
view from; see memory_node.sim.objects). Each question carries its expected answer, a
tolerance, and `ask`: a structured form that this command maps, deterministically, to skill
calls (query_memory, visits, name_place), whose text answers it reads back the way an agent
would. The named
places of the question set are named first with name_place.

The store: --memory-dir D when it holds a recording of the sample; otherwise (or with
--record) the sample is imported into a fresh store by `memory-import` (memory-node's
recorder policy, offline: the rows of a live 1x recording, in seconds), or with --replay
replayed into memory-node under simulated time at --rate, as `memory-demo` does (needs the
ROS 2 runtime). `--captions standin|vlm` and `--clip` ask a copy of it
(OUT/memory-captions-standin, ...) whose novel camera views were captioned by the background
captioner, or whose camera rows were re-embedded with the fetched CLIP model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memory_node.sim.generate import QUESTION_KINDS as SAMPLE_KINDS

# The sample's question kinds, and "object" (where did I see the fridge?): asked of the
# camera stream's meaning, so the describer, CLIP or captions decide the answer.
QUESTION_KINDS = (*SAMPLE_KINDS, "object")

POSE = re.compile(r"at x=(-?\d+(?:\.\d+)?) y=(-?\d+(?:\.\d+)?)")
CLOCK = re.compile(r"(\d{4}-\d{2}-\d{2} )?(\d{2}:\d{2}:\d{2})")
VISITS = re.compile(r"^(\d+) visits? to .*?, (\d+(?:\.\d+)?) s in all; first there "
                    r"(.+?) \(.*?\), last there (.+?) \(")


@dataclass
class Outcome:
    question: Mapping[str, Any]
    got: Any
    ok: bool
    calls: list[str]


def parse_clock(text: str, now: float) -> float | None:
    """A time the skills wrote (local time of day, with the date when not today)."""
    m = CLOCK.search(text)
    if not m:
        return None
    day = m.group(1).strip() if m.group(1) else datetime.fromtimestamp(now).strftime("%Y-%m-%d")
    return datetime.strptime(f"{day} {m.group(2)}", "%Y-%m-%d %H:%M:%S").timestamp()


def result_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#")]


class Asker:
    """Maps a question's `ask` to skill calls and reads the answer back from their text."""

    def __init__(self, skills: Mapping[str, Any], now: float,
                 on_call: Callable[[str, dict[str, Any], str], None] | None = None):
        self.skills = skills
        self.now = now
        self.calls: list[str] = []
        self.on_call = on_call

    def call(self, name: str, **kwargs: Any) -> str:
        self.calls.append(f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")
        text = self.skills[name].run(**kwargs).text
        if self.on_call is not None:
            self.on_call(name, kwargs, text)
        return text

    def visits(self, **kwargs: Any) -> dict[str, Any]:
        text = self.call("visits", **kwargs)
        m = VISITS.match(text)
        if not m:
            return {"count": 0, "total_s": 0.0, "first": None, "last": None, "text": text}
        return {"count": int(m.group(1)), "total_s": float(m.group(2)),
                "first": parse_clock(m.group(3), self.now),
                "last": parse_clock(m.group(4), self.now), "text": text}

    def first_result(self, **kwargs: Any) -> str | None:
        lines = result_lines(self.call("query_memory", **kwargs))
        return lines[0] if lines else None

    def answer(self, ask: Mapping[str, Any]) -> Any:
        kind = ask["type"]
        if kind == "pose_at":
            t = float(ask["t"])
            best = None
            for order, window in (("-time", {"before": t}), ("time", {"after": t})):
                line = self.first_result(stream="odom", order_by=order, k=1, **window)
                if line is None:
                    continue
                when = parse_clock(line, self.now)
                pose = POSE.search(line)
                if when is None or pose is None:
                    continue
                if best is None or abs(when - t) < best[0]:
                    best = (abs(when - t), {"x": float(pose.group(1)), "y": float(pose.group(2))})
            return None if best is None else best[1]
        if kind == "brightest":
            line = self.first_result(stream="camera", order_by="-brightness", k=1)
            pose = POSE.search(line or "")
            return {"x": float(pose.group(1)), "y": float(pose.group(2))} if pose else None
        if kind in ("first_visit", "last_visit"):
            v = self.visits(near=ask["place"])
            return v["first"] if kind == "first_visit" else v["last"]
        if kind in ("first_seen", "last_seen"):
            line = self.first_result(stream="camera", tags=dict(ask["tags"]), k=1,
                                     order_by="time" if kind == "first_seen" else "-time")
            return None if line is None else parse_clock(line, self.now)
        if kind == "been_at":
            window = {"before": ask["before"]} if "before" in ask else {}
            return self.visits(near_x=ask["x"], near_y=ask["y"], radius=ask["radius"],
                               **window)["count"] > 0
        if kind == "seen_near":
            return self.first_result(stream="camera", near_x=ask["x"], near_y=ask["y"],
                                     radius=ask["radius"], seen_near=True, k=1) is not None
        if kind == "seen_with":
            return self.first_result(stream="camera", near_x=ask["x"], near_y=ask["y"],
                                     radius=ask["radius"], tags=dict(ask["tags"]),
                                     k=1) is not None
        if kind == "object_seen":
            line = self.first_result(stream="camera", semantic_query=ask["object"], k=1)
            pose = POSE.search(line or "")
            return {"x": float(pose.group(1)), "y": float(pose.group(2))} if pose else None
        if kind == "time_in":
            return self.visits(near=ask["place"])["total_s"]
        if kind == "visits_count":
            return self.visits(near=ask["place"])["count"]
        raise ValueError(f"unknown question type {kind!r}")


def check(q: Mapping[str, Any], got: Any) -> bool:
    want, tol = q["answer"], float(q.get("tolerance") or 0.0)
    if got is None:
        return False
    if q["kind"] == "where":
        return math.hypot(got["x"] - want["x"], got["y"] - want["y"]) <= tol
    if q["kind"] in ("when", "how_long"):
        return abs(float(got) - float(want)) <= tol
    if q["kind"] == "count":
        return abs(int(got) - int(want)) <= tol
    if q["kind"] == "object":  # seen from where the answer says: near a pose it was seen from
        return any(math.hypot(got["x"] - x, got["y"] - y) <= tol for x, y in want["seen_from"])
    return bool(got) == bool(want)


def name_places(skills: Mapping[str, Any], places: Mapping[str, Mapping[str, float]]) -> None:
    for name, p in places.items():
        result = skills["name_place"].run(name=name, x=p["x"], y=p["y"], radius=p["radius"])
        if result.is_error:
            raise RuntimeError(f"naming {name!r} failed: {result.text}")


def answer_all(skills: Mapping[str, Any], truth: Mapping[str, Any], now: float,
               only: Callable[[Mapping[str, Any]], bool] = lambda q: True) -> list[Outcome]:
    """Name the places, then answer every question (deterministic: no model involved)."""
    name_places(skills, truth.get("places", {}))
    out = []
    for q in [*truth["questions"], *truth.get("object_questions", [])]:
        if not only(q):
            continue
        asker = Asker(skills, now)
        got = asker.answer(q["ask"])
        out.append(Outcome(q, got, check(q, got), asker.calls))
    return out


def accuracy(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = {}
    for kind in (*QUESTION_KINDS, "all"):
        mine = [o for o in outcomes if kind == "all" or o.question["kind"] == kind]
        if mine:
            right = sum(o.ok for o in mine)
            table[kind] = {"questions": len(mine), "right": right,
                           "accuracy": round(right / len(mine), 3)}
    return table


def show(got: Any) -> str:
    if isinstance(got, dict) and "seen_from" in got:
        return (f"near one of {len(got['seen_from'])} poses it was seen from (the object at "
                f"x={got['x']:.2f} y={got['y']:.2f})")
    if isinstance(got, dict):
        return f"x={got['x']:.2f} y={got['y']:.2f}"
    if isinstance(got, float) and got > 1e9:  # a time: UTC, to the tenth of a second
        return datetime.fromtimestamp(got, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-5] + " UTC"
    if isinstance(got, float):
        return f"{got:.2f}"
    return str(got)


REPORT_BEGIN, REPORT_END = "<!-- eval:begin -->", "<!-- eval:end -->"


def report_section(outcomes: list[Outcome], table: Mapping[str, Mapping[str, float]],
                   command: str, store: str,
                   recorded: str = "imported with memory-import") -> str:
    """The "Question set" section of BENCHMARKS.md."""
    import platform
    import time

    lines = [REPORT_BEGIN, "## Question set (memory-eval): accuracy per kind", "",
             f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M:%S %z')}, "
             f"{platform.machine()}, Python {platform.python_version()}). The sample flat "
             f"(seed 7, 150 s) {recorded}, then "
             f"every question of its ground_truth.json answered on that store ({store}) "
             "through the skills, deterministically (no model). Tolerances: where 0.75 m "
             "(brightest view 1 m), when 3 s (a person's first/last sight 6 s), how long "
             "max(2 s, 10 %), counts exact, objects 1 m from a pose they were seen from.", "",
             "| kind | questions | right | accuracy |", "|---|---|---|---|"]
    for kind, row in table.items():
        lines.append(f"| {kind} | {int(row['questions'])} | {int(row['right'])} | "
                     f"{row['accuracy']:.0%} |")
    wrong = [o for o in outcomes if not o.ok]
    if wrong:
        lines += ["", "Answered wrongly:"]
        for o in wrong:
            q = o.question
            lines.append(f"- `{q['id']}`: {q['question']} expected {show(q['answer'])}, "
                         f"answered {show(o.got)}")
    lines.append(REPORT_END)
    return "\n".join(lines) + "\n"


def write_report(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if REPORT_BEGIN in text and REPORT_END in text:
        a, b = text.index(REPORT_BEGIN), text.index(REPORT_END) + len(REPORT_END)
        text = text[:a] + section.rstrip("\n") + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def import_sample(sample: Any, memory_dir: Path, echo: Callable[[str], None]) -> int:
    """Import the sample into a fresh store with memory-import; returns the rows stored."""
    import shutil

    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine
    from memory_node.ros import bag_import

    shutil.rmtree(memory_dir, ignore_errors=True)
    echo(f"memory-eval: importing {sample.bag} into {memory_dir}")
    if bag_import.main([str(sample.bag), "--memory-dir", str(memory_dir)]) != 0:
        raise RuntimeError(f"memory-import of {sample.bag} failed (see above)")
    with MemoryEngine(MemoryConfig.from_mapping({"memory_dir": str(memory_dir)})) as engine:
        assert engine.store is not None
        return engine.store.count()


def record(sample: Any, memory_dir: Path, out_dir: Path, rate: float,
           echo: Callable[[str], None]) -> int:
    """Replay the sample into a fresh store with memory-node under simulated time."""
    import os
    import shutil

    from memory_node.agent.ros_client import RosClient
    from memory_node.session import Session, isolated_env, wait_until_settled

    shutil.rmtree(memory_dir, ignore_errors=True)
    env = isolated_env()
    for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_LOCALHOST_ONLY"):
        if k in env:
            os.environ[k] = env[k]
    session = Session(memory_dir, env, out_dir / "logs")
    echo(f"memory-eval: recording {sample.bag} into {memory_dir} at {rate:g}x")
    session.start()
    client = RosClient(use_sim_time=True, timeout_s=20.0)
    try:
        session.replay(sample.bag, rate)
        return wait_until_settled(client)
    finally:
        client.close()
        session.stop()


def camera_stream(engine: Any) -> Any:
    """The camera entry of the engine's streams answer: caption progress and row count."""
    from memory_node.core.contract import ErrorAnswer

    answer = engine.ask_streams()
    if isinstance(answer, ErrorAnswer):
        raise RuntimeError(f"memory-eval: streams failed: {answer.error.message}")
    return next(e for e in answer.streams if e.name == "camera")


def camera_variant(memory_dir: Path, out: Path, truth: Mapping[str, Any], now: float,
                   captions: str | None, clip: bool, rate: float,
                   echo: Callable[[str], None], stack: contextlib.ExitStack,
                   timeout_s: float = 1800.0) -> Any:
    """A copy of the recorded store with richer camera semantics, ready to be asked: captions
    (`standin`: the sample's caption oracle; `vlm`: the VLM_* / OPENAI_* endpoint) added by the
    background captioner to the novel views, and/or camera rows re-embedded with the fetched
    CLIP model. Returns the engine; `stack` closes it and the stand-in."""
    import shutil
    import time

    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    name = "-".join([*([f"captions-{captions}"] if captions else []), *(["clip"] if clip else [])])
    target = out / f"memory-{name}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(memory_dir, target, ignore=shutil.ignore_patterns("*.lock"))
    values: dict[str, Any] = {"memory_dir": str(target)}
    if clip:
        values["image_embedder"] = "clip"
    describer = None
    if captions:
        values.update(describer="vlm", caption_max_per_min=rate)
        if captions == "standin":
            from memory_node.core.embedders.describer import VLMDescriber
            from memory_node.core.llm import ChatClient, LLMSettings

            oracle = stack.enter_context(_oracle(memory_dir, truth))
            describer = VLMDescriber(ChatClient(LLMSettings(
                base_url=oracle.base_url, api_key="standin", model="caption-oracle")))
    engine = MemoryEngine(MemoryConfig.from_mapping(values), clock=lambda: now,
                          describer=describer)
    stack.callback(engine.close)
    deadline = time.monotonic() + timeout_s
    if captions:
        queued = engine.captioner().backfill()
        echo(f"memory-eval: {queued} novel views of {memory_dir.name} queued for captions "
             f"({captions}, at most {rate:g} a minute)")
        while True:
            cam = camera_stream(engine)
            if not cam.pending:
                echo(f"memory-eval: captions: {cam.captioned} done, {cam.failed} failed")
                break
            if time.monotonic() > deadline:
                echo(f"memory-eval: captions: {cam.pending} still pending after "
                     f"{timeout_s:.0f} s; asking anyway")
                break
            time.sleep(1.0)
    while clip and engine.reembed_pending():
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return engine


def _oracle(memory_dir: Path, truth: Mapping[str, Any]) -> Any:
    """The caption stand-in, knowing the recorded keyframes and the sample's ground truth."""
    import cv2

    from memory_node.core.store.sqlite_store import SqliteObservationStore
    from memory_node.sim.caption_oracle import CaptionOracle
    from memory_node.sim.generate import EPOCH_S
    from memory_node.sim.objects import caption, object_views

    store = SqliteObservationStore(memory_dir / "memory.db")
    try:
        frames = []
        for obs in store.rows_of(["camera"]):
            img = cv2.imread(str(memory_dir / obs.ref)) if obs.ref else None
            if img is not None:
                frames.append((obs.t, img))
    finally:
        store.close()
    views = object_views(int(truth["seed"]), float(truth["duration"]))
    return CaptionOracle(frames, lambda t: caption(views.at(t - EPOCH_S)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="memory-eval", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("eval_out"),
                        help="where the sample and the recorded store go (default eval_out)")
    parser.add_argument("--sample", type=Path, default=None,
                        help="the sample directory (default OUT/sample; made when missing)")
    parser.add_argument("--memory-dir", type=Path, default=None,
                        help="a store recorded from the sample (default OUT/memory)")
    parser.add_argument("--record", action="store_true",
                        help="record the sample into a fresh store first, even if one exists")
    parser.add_argument("--replay", action="store_true",
                        help="record by replaying into memory-node (at --rate) instead of "
                        "importing with memory-import")
    parser.add_argument("--rate", type=float, default=3.0,
                        help="--replay: replay speed (default 3x)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--kind", choices=QUESTION_KINDS, action="append",
                        help="only questions of this kind (repeatable)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="one line per question: expected, answered, the skill calls")
    parser.add_argument("--captions", choices=("standin", "vlm"), default=None,
                        help="ask a copy of the store whose novel camera views were captioned "
                        "by the background captioner: 'standin' answers from the sample's "
                        "ground truth (the objects in view), 'vlm' is the model at "
                        "VLM_BASE_URL / VLM_API_KEY (then OPENAI_*)")
    parser.add_argument("--caption-rate", type=float, default=None, metavar="N",
                        help="caption_max_per_min for --captions (default 600 for the "
                        "stand-in, 10 for a real model)")
    parser.add_argument("--clip", action="store_true",
                        help="ask a copy of the store re-embedded with the fetched CLIP model "
                        "(memory-models fetch clip)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--report", type=Path, default=None, metavar="MD",
                        help="also write the figures as the 'Question set' section of MD "
                        "(e.g. BENCHMARKS.md)")
    args = parser.parse_args(argv)

    from memory_node.agent.client import EngineClient
    from memory_node.agent.skills import get_skills
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine
    from memory_node.session import load_sample

    sample_dir = args.sample or args.out / "sample"
    sample = load_sample(sample_dir, args.seed)
    truth = sample.truth
    if "questions" not in truth:
        print("memory-eval: the sample's ground truth has no question set", file=sys.stderr)
        return 2
    memory_dir = args.memory_dir or args.out / "memory"
    echo = (lambda s: print(s, file=sys.stderr)) if args.json else print
    if (args.record or args.replay) or not (memory_dir / "memory.db").is_file():
        try:
            if args.replay:
                record(sample, memory_dir, args.out, args.rate, echo)
            else:
                import_sample(sample, memory_dir, echo)
        except ImportError as exc:
            print(f"memory-eval: recording needs ROS 2 ({exc}); give --memory-dir of a store "
                  "recorded from the sample", file=sys.stderr)
            return 2
    now = float(truth["epoch"]) + float(truth["duration"]) + 1.0  # the end of the recording
    from memory_node.sim.objects import object_questions

    truth = {**truth, "object_questions": object_questions(int(truth["seed"]),
                                                           float(truth["duration"]))}
    with contextlib.ExitStack() as stack:
        if args.captions or args.clip:
            rate = args.caption_rate or (600.0 if args.captions == "standin" else 10.0)
            engine = camera_variant(memory_dir, args.out, truth, now, args.captions,
                                    args.clip, rate, echo, stack)
            memory_dir = engine.config.root
        else:
            config = MemoryConfig.from_mapping({"memory_dir": str(memory_dir)})
            engine = MemoryEngine(config, clock=lambda: now)
            stack.callback(engine.close)
        client = EngineClient(engine)
        skills = {s.name: s for s in get_skills(client, live_descriptions=False)}
        kinds = set(args.kind or QUESTION_KINDS)
        outcomes = answer_all(skills, truth, now, lambda q: q["kind"] in kinds)
    table = accuracy(outcomes)
    if args.report is not None:
        write_report(args.report, report_section(
            outcomes, table, "memory-eval " + " ".join(argv if argv is not None
                                                       else sys.argv[1:]), memory_dir.name,
            f"replayed at {args.rate:g}x into memory-node under simulated time"
            if args.replay else "imported with memory-import"))
    if args.json:
        print(json.dumps({"accuracy": table, "questions": [
            {"id": o.question["id"], "kind": o.question["kind"], "ok": o.ok,
             "expected": o.question["answer"], "answered": o.got} for o in outcomes]},
            indent=1))
        return 0
    if args.verbose:
        for o in outcomes:
            q = o.question
            echo(f"{'ok ' if o.ok else 'NO '} [{q['kind']}] {q['question']} expected "
                 f"{show(q['answer'])} (±{q['tolerance']}), answered {show(o.got)}")
            for c in o.calls:
                echo(f"      {c}")
    echo(f"memory-eval: {len(outcomes)} questions on {memory_dir}")
    echo(f"{'kind':<10} {'right':>5} / {'asked':<5} accuracy")
    for kind, row in table.items():
        echo(f"{kind:<10} {int(row['right']):>5} / {int(row['questions']):<5} "
             f"{row['accuracy']:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
