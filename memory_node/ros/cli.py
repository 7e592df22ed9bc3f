"""`memory-cli`: call the memory services and print the answer.

    memory-cli search Q | save NOTE | compact | streams [--timeout S] [--json] [--ros-args ...]

On a terminal the answer is a table (search: id, stream, local time and age, x/y/yaw/frame,
score, text); with --json, or when stdout is not a terminal (a pipe, a script), the service's
JSON answer, unchanged. Exit status 0 when the answer has `"ok": true`, 1 when it is false or
nothing answered within the timeout, 2 for usage errors (a missing or extra argument).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import datetime
from typing import Any

from memory_node.core.contract import (
    CompactAnswer,
    ErrorAnswer,
    SaveAnswer,
    SearchAnswer,
    StreamsAnswer,
    VisitsAnswer,
    read_answer,
)
from memory_node.core.parameters import split_ros_args
from memory_node.ros.services import SERVICES, ServiceCaller

__all__ = ["SERVICES", "ServiceCaller", "main", "render"]  # the caller lives in ros/services.py


# ---- the readable form ---------------------------------------------------------------------

ANSWERS: dict[str, Any] = {"search": SearchAnswer, "save": SaveAnswer,
                           "compact": CompactAnswer, "streams": StreamsAnswer}
TEXT_WIDTH = 60


def _when(t: float | None, now: float) -> str:
    """Local time (with the date when not today) and age: '14:03:12 (5 min ago)'."""
    if t is None or not math.isfinite(t):
        return "-"
    when = datetime.fromtimestamp(t)
    clock = when.strftime("%H:%M:%S") if when.date() == datetime.fromtimestamp(now).date() \
        else when.strftime("%Y-%m-%d %H:%M:%S")
    d = abs(now - t)
    if d < 1:
        age = "now"
    elif d < 60:
        age = f"{int(d)} s"
    elif d < 3600:
        age = f"{int(d // 60)} min"
    elif d < 86400:
        age = f"{int(d // 3600)} h {int(d % 3600 // 60)} min"
    else:
        age = f"{int(d // 86400)} d"
    if age != "now":
        age = f"in {age}" if t > now else f"{age} ago"
    return f"{clock} ({age})"


def _num(v: float | None, places: int = 2) -> str:
    return "-" if v is None else f"{v:.{places}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def _short(text: str, width: int = TEXT_WIDTH) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def render(verb: str, raw: str, now: float | None = None) -> tuple[str, bool]:
    """(the readable form of a service's JSON answer, whether it is ok)."""
    now = time.time() if now is None else now
    answer = read_answer(raw, ANSWERS[verb])
    if isinstance(answer, ErrorAnswer):
        return f"error ({answer.error.code}): {answer.error.message}", False
    notes: list[str] = list(getattr(answer, "notes", None) or [])
    if isinstance(answer, VisitsAnswer):
        rows = [[_when(v.start, now), _when(v.end, now), f"{v.duration_s:.0f} s"]
                for v in answer.visits]
        out = _table(["start", "end", "duration"], rows)
        out += f"\n{answer.count} visit(s), {answer.total_s:.0f} s in all"
    elif isinstance(answer, SearchAnswer):
        rows = [[str(r.id), r.stream, _when(r.t, now), _num(r.pose.x), _num(r.pose.y),
                 _num(r.pose.yaw), r.pose.frame or "-",
                 "-" if r.score is None else f"{r.score:.3f}", _short(r.text)]
                for r in answer.results]
        out = _table(["id", "stream", "time (age)", "x", "y", "yaw", "frame", "score", "text"],
                     rows) if rows else "no matching observations"
        out += f"\n{answer.count} result(s)"
    elif isinstance(answer, SaveAnswer):
        p = answer.pose
        where = f"x={_num(p.x)} y={_num(p.y)} yaw={_num(p.yaw)} frame={p.frame}" \
            if p.x is not None else "no pose"
        what = "folded into" if answer.folded else "saved as"
        out = f"{what} #{answer.id} at {_when(answer.t, now)}, {where}" + (
            "" if answer.indexed else " (not indexed yet)")
    elif isinstance(answer, CompactAnswer):
        s = answer.summaries
        out = (f"thinned {answer.thinned}, folded {answer.folded}, archived in all "
               f"{answer.archived_total}; summaries: {s.status}"
               + (f" ({s.message})" if s.message else ""))
    else:
        rows = [[st.name, str(st.count), _when(st.first_t, now), _when(st.last_t, now),
                 "yes" if st.semantic else "no", st.status or ""] for st in answer.streams]
        out = _table(["stream", "count", "first", "last", "semantic", "status"], rows) \
            if rows else "memory is empty"
        for place in answer.places or ():
            out += (f"\nplace {place.name}: x={place.x:.2f} y={place.y:.2f} "
                    f"r={place.radius:g} {place.frame or ''}").rstrip()
    if notes:
        out += "\n" + "\n".join(f"note: {n}" for n in notes)
    return out, True


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memory-cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="ROS arguments go after --ros-args.")
    parser.add_argument("verb", choices=list(SERVICES))
    parser.add_argument("payload", nargs="?", help="search: text or JSON; save: the note")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument("--json", action="store_true",
                        help="print the JSON answer (the default when stdout is not a terminal)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, ros_args = split_ros_args(argv)
    parser = _parser()
    args = parser.parse_args(argv)  # an unknown option or a second payload: usage error
    if args.verb in ("search", "save") and not args.payload:
        parser.error(f"{args.verb} needs a payload")
    if args.verb in ("compact", "streams") and args.payload is not None:
        parser.error(f"{args.verb} takes no payload (got {args.payload!r})")
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    # No rclpy signal handler: Ctrl-C raises KeyboardInterrupt here (Python's own handler)
    # while the context stays valid for a clean close, instead of a traceback from a dead
    # context inside the wait.
    rclpy.init(args=["memory-cli", *ros_args], signal_handler_options=SignalHandlerOptions.NO)
    caller = ServiceCaller()
    try:
        answer = caller.call(args.verb, args.payload, args.timeout)
    except KeyboardInterrupt:
        return 130
    finally:
        caller.close()
        rclpy.try_shutdown()
    if args.json or not sys.stdout.isatty():
        print(answer)
        try:
            return 0 if json.loads(answer).get("ok") else 1
        except (ValueError, AttributeError):
            return 1
    text, ok = render(args.verb, answer)
    print(text, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
