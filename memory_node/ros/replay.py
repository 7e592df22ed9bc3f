"""`memory-replay BAG`: replay a rosbag2 (MCAP or sqlite3) into live nodes, with /clock.

rosbag2 (`ros2 bag play`) is not installable from pip, so the package replays with `rosbags`:
messages go out as the recorded CDR bytes (no conversion), at the recorded timing scaled by
`--rate`, with /clock for nodes running with use_sim_time, /tf_static latched (transient
local, all static transforms merged), and reliable publishers waiting for their subscribers
to acknowledge before the command exits. A robot's bag may hold vendor messages no installed
package defines, and its own /clock: without `--topics` those are left out with a warning
(the rest plays); named in `--topics`, an unplayable topic is an error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# /clock at 50 Hz of wall time, whatever the rate: every node with use_sim_time handles each
# /clock message in its executor, and at 5x a per-message clock flooded them. A replay that
# fell behind (a loaded machine) and catches up publishes it more often: whenever bag time has
# moved a period's worth (CLOCK_PERIOD_S x rate) since the last one, so no message goes out
# with /clock behind it by more than that, and a node stamping on arrival stamps on time.
CLOCK_PERIOD_S = 0.02


class ReplayError(RuntimeError):
    """A bag that cannot be replayed: missing, corrupt, or with types we cannot publish."""


def import_message_type(msgtype: str) -> Any:
    """'sensor_msgs/msg/Image' -> the rclpy message class, or ReplayError."""
    parts = msgtype.split("/")
    if len(parts) == 2:
        parts = [parts[0], "msg", parts[1]]
    if len(parts) != 3:
        raise ReplayError(f"malformed message type name {msgtype!r}")
    pkg, kind, name = parts
    try:
        module = importlib.import_module(f"{pkg}.{kind}")
    except ImportError:
        raise ReplayError(f"unknown message type {msgtype}: its Python package {pkg} is not "
                          "installed here") from None
    try:
        return getattr(module, name)
    except AttributeError:  # a package with some of the vendor's types (unitree_go here)
        raise ReplayError(f"unknown message type {msgtype}: the installed {pkg} has no "
                          f"{name}") from None


@dataclass
class BagInfo:
    path: Path
    start_ns: int
    end_ns: int
    topics: dict[str, tuple[str, int]]  # topic -> (type, count)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def open_reader(path: Path | Sequence[Path]) -> Any:
    """An opened rosbags reader of one bag, or of several read as one in time order."""
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    paths = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
    for p in paths:
        if not p.exists():
            raise ReplayError(f"bag {p} does not exist")
    try:
        from memory_node.core.front_video import register_rosbags_type

        # Go2FrontVideoData: readable even from a bag that stores no message definitions.
        typestore = register_rosbags_type(get_typestore(Stores.ROS2_KILTED))
        reader = AnyReader(paths, default_typestore=typestore)
        reader.open()
    except Exception as exc:  # noqa: BLE001 - rosbags raises several types for bad bags
        names = ", ".join(str(p) for p in paths)
        raise ReplayError(f"cannot read bag {names}: {exc}") from None
    return reader


def bag_info(path: Path) -> BagInfo:
    reader = open_reader(path)
    try:
        topics: dict[str, tuple[str, int]] = {}
        for c in reader.connections:
            typ, n = topics.get(c.topic, (c.msgtype, 0))
            topics[c.topic] = (typ, n + c.msgcount)
        return BagInfo(path, reader.start_time, reader.end_time, topics)
    finally:
        reader.close()


class Replayer:
    """Publishes a bag's messages from a node; `run()` returns the number published."""

    def __init__(self, node: Any, bag: Path, *, rate: float = 1.0, topics: list[str] | None = None,
                 start_s: float = 0.0, duration_s: float | None = None, loop: bool = False,
                 loops: int | None = None, clock: bool = True, progress: bool = False,
                 wait_subscribers_s: float = 0.0):
        if rate <= 0:
            raise ReplayError("--rate must be > 0")
        self.node, self.bag, self.rate = node, Path(bag), rate
        # loop: forever (until SIGINT); loops: that many passes.
        self.passes = loops if loops is not None else (None if loop else 1)
        self.start_s, self.duration_s = start_s, duration_s
        self.progress, self.wait_subscribers_s = progress, wait_subscribers_s
        self.info = bag_info(self.bag)
        wanted = set(topics) if topics else set(self.info.topics)
        missing = sorted(wanted - set(self.info.topics))
        if missing:
            raise ReplayError(f"topic(s) not in the bag: {', '.join(missing)}; the bag has "
                              f"{', '.join(sorted(self.info.topics))}")
        # What is left out, and why: a recorded /clock would interleave with ours (and, at
        # another rate, contradict it); a topic of a type no installed package provides cannot
        # be published, which only matters if it was asked for by name.
        self.skipped: dict[str, str] = {}
        if clock and "/clock" in wanted:
            wanted.discard("/clock")
            self.skipped["/clock"] = "the replay publishes /clock itself (--no-clock to keep it)"
        self.types = {}
        for t in sorted(wanted):
            try:
                self.types[t] = import_message_type(self.info.topics[t][0])
            except ReplayError as exc:
                if topics:
                    raise
                self.skipped[t] = str(exc)
        if not self.types:
            raise ReplayError("nothing to play: " + "; ".join(
                f"{t}: {why}" for t, why in sorted(self.skipped.items())))
        for t, why in sorted(self.skipped.items()):
            node.get_logger().warning(f"not replaying {t}: {why}")
        self.topics = sorted(self.types)
        self.publishers = {t: self._publisher(t) for t in self.topics}
        self.clock_pub = None
        if clock:
            from rosgraph_msgs.msg import Clock

            self.clock_pub = node.create_publisher(Clock, "/clock", 10)
        self.published = 0
        self.not_published = 0  # messages the middleware refused every time (see _send)
        self.loops = 0
        self._static: dict[str, Any] = {}
        self._log = node.get_logger()

    def _publisher(self, topic: str) -> Any:
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

        if topic == "/tf_static":
            qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        else:
            qos = QoSProfile(depth=100 if topic == "/tf" else 20,
                             reliability=ReliabilityPolicy.RELIABLE)
        return self.node.create_publisher(self.types[topic], topic, qos)

    def _publish_clock(self, t_ns: int) -> None:
        if self.clock_pub is None:
            return
        from rosgraph_msgs.msg import Clock

        msg = Clock()
        msg.clock.sec, msg.clock.nanosec = divmod(int(t_ns), 1_000_000_000)
        self.clock_pub.publish(msg)

    def _wait_for_subscribers(self) -> None:
        deadline = time.monotonic() + self.wait_subscribers_s
        # /tf_static is latched (a late subscriber still gets it); /clock is waited for too:
        # a node with use_sim_time that has not matched it yet would miss the start.
        waited = [p for t, p in self.publishers.items() if t != "/tf_static"]
        if self.clock_pub is not None:
            waited.append(self.clock_pub)
        while time.monotonic() < deadline:
            if all(p.get_subscription_count() > 0 for p in waited):
                return
            time.sleep(0.05)

    def _publish(self, topic: str, raw: bytes) -> None:
        if topic == "/tf_static":
            # Merge every static transform seen so far: a late subscriber gets all of them.
            from rclpy.serialization import deserialize_message

            msg = deserialize_message(bytes(raw), self.types[topic])
            for ts in msg.transforms:
                self._static[ts.child_frame_id] = ts
            msg.transforms = list(self._static.values())
            self._send(topic, msg)
        else:
            self._send(topic, bytes(raw))

    def _send(self, topic: str, msg: Any) -> None:
        """Publish, trying again a few times when the middleware refuses: a reliable writer
        whose history is full of samples a slow subscriber has not acknowledged fails after
        a short block ("cannot publish data"). A message refused every time is counted and
        said, and the replay goes on, as a player does: one slow node ends no replay."""
        for attempt in range(PUBLISH_TRIES):
            try:
                self.publishers[topic].publish(msg)
                self.published += 1
                return
            except RuntimeError as exc:  # rclpy's RCLError
                if attempt + 1 < PUBLISH_TRIES:
                    time.sleep(PUBLISH_RETRY_S)
                    continue
                self.not_published += 1
                if self.not_published == 1:
                    self._log.warning(f"{topic}: a message was not published ({exc}); the "
                                      "replay goes on (a subscriber too slow to keep up?)")

    def run(self) -> int:
        if self.wait_subscribers_s > 0:
            self._wait_for_subscribers()
        while self.passes is None or self.loops < self.passes:
            self._play_once()
            self.loops += 1
        self.finish()
        return self.published

    def _play_once(self) -> None:
        start_ns = self.info.start_ns + int(self.start_s * 1e9)
        stop_ns = (start_ns + int(self.duration_s * 1e9)) if self.duration_s else None
        reader = open_reader(self.bag)
        total = sum(self.info.topics[t][1] for t in self.topics)
        try:
            conns = [c for c in reader.connections if c.topic in self.topics]
            static = [c for c in conns if c.topic == "/tf_static"]
            if static and start_ns > self.info.start_ns:
                # Static transforms recorded before --start still hold: latch them first.
                for conn, _t, raw in reader.messages(connections=static, stop=start_ns):
                    self._publish(conn.topic, raw)
            wall0 = time.monotonic()
            last_clock_wall = -1.0
            last_clock_ns = -1
            clock_step_ns = int(CLOCK_PERIOD_S * self.rate * 1e9)
            last_t_ns = start_ns
            n = 0
            try:
                for conn, t_ns, raw in reader.messages(connections=conns, start=start_ns,
                                                       stop=stop_ns):
                    due = wall0 + (t_ns - start_ns) / 1e9 / self.rate
                    # Keep /clock moving while waiting for the next message.
                    while True:
                        now = time.monotonic()
                        bag_now = start_ns + int(min(now - wall0, due - wall0) * self.rate
                                                 * 1e9)
                        if (now - last_clock_wall >= CLOCK_PERIOD_S
                                or bag_now - last_clock_ns >= clock_step_ns):
                            self._publish_clock(bag_now)
                            last_clock_wall, last_clock_ns = now, bag_now
                        if now >= due:
                            break
                        time.sleep(min(due - now, CLOCK_PERIOD_S))
                    self._publish(conn.topic, raw)
                    last_t_ns = t_ns
                    n += 1
                    if self.progress and n % 50 == 0:
                        el = (t_ns - start_ns) / 1e9
                        sys.stderr.write(f"\rreplay {self.bag.name}: {el:7.1f} s of "
                                         f"{self.info.duration_s:.1f} s, {n}/{total} messages, "
                                         f"loop {self.loops + 1}   ")
                        sys.stderr.flush()
                self._publish_clock(last_t_ns)  # the pass ends at its last message's time
            except ReplayError:
                raise
            except Exception as exc:  # noqa: BLE001 - a truncated/corrupt chunk mid-way
                raise ReplayError(f"bag {self.bag} is unreadable after {n} messages: {exc}"
                                  ) from None
        finally:
            reader.close()
        if self.progress:
            sys.stderr.write("\n")

    def finish(self, timeout_s: float = 10.0) -> None:
        """Wait until reliable subscribers acknowledged everything (else the tail is lost)."""
        from rclpy.duration import Duration

        for pub in self.publishers.values():
            try:
                pub.wait_for_all_acked(Duration(seconds=timeout_s))
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass


# A refused publish is tried this many times, this far apart, before the message is dropped.
PUBLISH_TRIES = 5
PUBLISH_RETRY_S = 0.05


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memory-replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bag", type=Path, help="rosbag2 directory or .mcap/.db3 file")
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--loop", action="store_true", help="start over at the end (time "
                        "jumps back; the nodes reset their TF buffers)")
    parser.add_argument("--loops", type=int, metavar="N", help="play N passes, then exit")
    parser.add_argument("--topics", nargs="+", help="only these topics")
    parser.add_argument("--start", type=float, default=0.0, help="seconds into the bag")
    parser.add_argument("--duration", type=float, help="seconds of bag to play")
    parser.add_argument("--no-clock", action="store_true", help="do not publish /clock")
    parser.add_argument("--wait-subscribers", type=float, default=3.0, metavar="S",
                        help="wait up to S seconds for subscribers before playing (default 3)")
    parser.add_argument("--info", action="store_true", help="print topics and counts, then exit")
    args, ros_args = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.info:
            info = bag_info(args.bag)
            print(f"{info.path}: {info.duration_s:.1f} s")
            for topic, (typ, n) in sorted(info.topics.items()):
                print(f"  {topic:32s} {typ:36s} {n}")
            return 0
        import rclpy

        rclpy.init(args=["memory-replay", *ros_args])
        node = rclpy.create_node("memory_replay")
        try:
            rep = Replayer(node, args.bag, rate=args.rate, topics=args.topics,
                           start_s=args.start, duration_s=args.duration, loop=args.loop,
                           loops=args.loops,
                           clock=not args.no_clock, progress=sys.stderr.isatty(),
                           wait_subscribers_s=args.wait_subscribers)
            n = rep.run()
            dropped = (f"; {rep.not_published} refused by the middleware and not published"
                       if rep.not_published else "")
            print(f"memory-replay: published {n} messages from {args.bag} "
                  f"({rep.loops} pass(es), rate {args.rate:g}){dropped}", flush=True)
        finally:
            node.destroy_node()
            rclpy.try_shutdown()
    except ReplayError as exc:
        print(f"memory-replay: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
