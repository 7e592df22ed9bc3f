"""The seeded sample and live nodes over a store: what the demo, the eval, the end-to-end
tests and the benchmarks start, replay and wait for. Its own module so that memory-demo and
memory-eval (which uses none of the demo) both import it and not each other."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Sample:
    bag: Path
    truth: dict[str, Any]

    @property
    def door(self) -> tuple[float, float]:
        d = self.truth["front_door"]
        return d["x"], d["y"]

    @property
    def window(self) -> tuple[float, float]:
        w = self.truth["window"]
        return w["x"], w["y"]

    @property
    def person(self) -> dict[str, float]:
        return self.truth["person"]


def load_sample(out_dir: Path, seed: int = 7, duration_s: float | None = None) -> Sample:
    from memory_node.sim.generate import generate_sample

    kwargs: dict[str, Any] = {"seed": seed}
    if duration_s is not None:
        kwargs["duration_s"] = duration_s
    info = generate_sample(Path(out_dir), **kwargs)
    bag = Path(info.bag_dir)
    truth = getattr(info, "ground_truth", None)
    if truth is None:
        truth = json.loads((Path(out_dir) / "ground_truth.json").read_text())
    return Sample(bag, truth)


def isolated_env(domain: int | None = None) -> dict[str, str]:
    """This run's ROS environment: localhost discovery, a domain of its own."""
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = str(domain if domain is not None else random.randint(101, 199))
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    if env.get("ROS_DISTRO", "").lower() == "humble":
        env["ROS_LOCALHOST_ONLY"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


class NodeProcess:
    """A node subprocess with its output collected; stopped with SIGINT, killed as fallback."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path,
                 python: str | None = None):
        self.log_path = log
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen([python or sys.executable, *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with open(self.log_path, "w") as log:
            for line in self.proc.stdout or ():
                log.write(line)
                log.flush()
                with self._cond:
                    self.lines.append(line.rstrip())
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 90.0) -> None:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if any(regex.search(line) for line in self.lines):
                    return
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{pattern!r} never appeared; log {self.log_path}:\n"
                                       + "\n".join(self.lines[-30:]))
                self._cond.wait(0.2)

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode


@dataclass
class Session:
    """Nodes on one memory directory (one process, or recorder and server in two)."""

    memory_dir: Path
    env: dict[str, str]
    logs: Path
    two_process: bool = False
    procs: list[NodeProcess] = field(default_factory=list)

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        common = ["--ros-args", "-p", "use_sim_time:=true", "-p",
                  f"memory_dir:={self.memory_dir}"]
        if self.two_process:
            rec = NodeProcess(["-m", "memory_node.ros.recorder", *common], self.env,
                              self.logs / "recorder.log")
            srv = NodeProcess(["-m", "memory_node.ros.server", *common], self.env,
                              self.logs / "server.log")
            self.procs = [rec, srv]
            rec.wait_for("recording")
            srv.wait_for("active:")
        else:
            node = NodeProcess(["-m", "memory_node.ros.main", "--memory-dir",
                                str(self.memory_dir), "--use-sim-time"], self.env,
                               self.logs / "memory-node.log")
            self.procs = [node]
            node.wait_for("recording")

    def replay(self, bag: Path, rate: float, extra: list[str] | None = None,
               on_wait: Callable[[], None] | None = None) -> str:
        cmd = [sys.executable, "-m", "memory_node.ros.replay", str(bag), "--rate", str(rate),
               "--wait-subscribers", "10", *(extra or [])]
        proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            while proc.poll() is None:
                if on_wait is not None:
                    on_wait()
                time.sleep(0.1)
            out = proc.stdout.read() if proc.stdout else ""
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(10)
        if proc.returncode != 0:
            raise RuntimeError(f"replay failed ({proc.returncode}):\n{out}")
        return out

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs = []


def wait_until_settled(client: Any, quiet_s: float = 3.0, timeout: float = 60.0) -> int:
    """Wait until the observation count stops growing (the recorder has drained)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        try:
            n = sum(s["count"] for s in json.loads(client.streams()).get("streams", []))
        except (ValueError, KeyError):
            n = -1
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return n
        time.sleep(0.5)
    return last


# ---- the picture ------------------------------------------------------------------------
