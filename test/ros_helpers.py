"""Isolation and process helpers for tests that talk ROS 2.

Why: tests of one run must not see another run's nodes (or a robot on the same network), and
no node process may outlive its test. conftest.py calls `isolate_ros_environment()` before any
test imports rclpy, so every in-process node and every subprocess inherits the same isolated
domain. Spawn nodes with `spawn()` (or the `ros_process` fixture) and stop them with `stop()`:
SIGINT first (rclpy shuts down cleanly on it; SIGTERM right after a service call can leave a
server running), then SIGKILL to the whole process group.

The ROS 2 wheels' bootstrapper re-executes Python once (os.execve) to set LD_LIBRARY_PATH:
the pid stays the same, so `proc.pid` is the Python process that receives the SIGINT.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

# Distros that only know ROS_LOCALHOST_ONLY (ROS_AUTOMATIC_DISCOVERY_RANGE came with Iron).
_LOCALHOST_ONLY_DISTROS = {"foxy", "galactic", "humble"}


def domain_id_for(pid: int | None = None) -> int:
    """A ROS domain id for this test run: 1..100 from the pid (0 is everyone's default).
    Under pytest-xdist each worker gets its own, from the run's (the parent's) pid and the
    worker's number, so two workers of one run never share a domain."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if pid is None and worker.startswith("gw") and worker[2:].isdigit():
        count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
        return 1 + ((os.getppid() % max(1, 100 // count)) * count + int(worker[2:])) % 100
    return 1 + (os.getpid() if pid is None else pid) % 100


def module_domain_id(index: int, first: int | None = None) -> int:
    """The ROS domain of the `index`-th test module a process runs: the run's domain stepped
    by the worker count, so a module never meets the participants an earlier module's nodes
    left behind (a reader that has not yet timed out still counts as a subscriber, and a
    replay waiting for subscribers then starts before the new node listens), and two workers
    still never share one."""
    first = domain_id_for() if first is None else first
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    return 1 + (first - 1 + index * count) % 100


def isolate_ros_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Confine ROS 2 discovery to this machine and to a domain of this run.

    MEMORY_NODE_TEST_DOMAIN_ID pins the domain (to join a run from another shell); otherwise
    it comes from the pid. Returns the variables it set.
    """
    env = os.environ if environ is None else environ
    domain = env.get("MEMORY_NODE_TEST_DOMAIN_ID") or str(domain_id_for())
    values = {"ROS_DOMAIN_ID": domain, "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}
    if env.get("ROS_DISTRO", "").lower() in _LOCALHOST_ONLY_DISTROS:
        values["ROS_LOCALHOST_ONLY"] = "1"
    env.update(values)
    env.pop("ROS_STATIC_PEERS", None)
    return values


def init_undiscovered(context, args: list[str] | None = None) -> None:
    """`rclpy.init` of a context whose participant discovers no other (rcl reads the range
    at init): for tests that only read the parameters a node is given. They create and
    destroy a context per case in one process, and Fast DDS 2.14 can deadlock destroying a
    participant while it is discovering another (a CI run hung 20 min in set_listener)."""
    import rclpy  # noqa: PLC0415 - rclpy is not imported by the helpers' other users

    before = os.environ.get("ROS_AUTOMATIC_DISCOVERY_RANGE")
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "OFF"
    try:
        rclpy.init(args=args, context=context)
    finally:
        if before is None:
            os.environ.pop("ROS_AUTOMATIC_DISCOVERY_RANGE", None)
        else:
            os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = before


class Process:
    """A spawned process with its output collected by a reader thread."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._cond:
                self._lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def output(self) -> str:
        """Everything it printed so far (stdout and stderr together)."""
        with self._cond:
            return "\n".join(self._lines)

    def wait_for_line(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """Wait until a line matches `pattern` (regex); fail with its output if it never does."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self._lines[seen:]:
                    match = regex.search(line)
                    if match:
                        return match
                seen = len(self._lines)
                left = deadline - time.monotonic()
                exited = self.popen.poll() is not None and not self._reader.is_alive()
                if left <= 0 or exited:
                    why = "exited" if exited else f"no match in {timeout:.0f} s"
                    raise AssertionError(
                        f"process {self.pid} {why} waiting for {pattern!r}; output:\n"
                        + "\n".join(self._lines)
                    )
                self._cond.wait(min(left, 0.2))

    def poll(self) -> int | None:
        return self.popen.poll()

    def read_to_end(self, timeout: float = 10.0) -> str:
        """Once the process has exited: wait until its whole output is read, and return it."""
        self._reader.join(timeout)
        return self.output


def spawn(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Process:
    """Start a process in its own process group, with the (isolated) environment of this run.

    `args` starting with "-" or ending in ".py" run under this interpreter (sys.executable).
    """
    argv = list(args)
    if argv and (argv[0].startswith("-") or argv[0].endswith(".py")):
        argv.insert(0, sys.executable)
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    popen = subprocess.Popen(
        argv,
        env=full_env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: stop() can kill children it started
    )
    proc = Process(popen)
    STARTED.append(proc)
    return proc


# Every process spawned, in order: conftest scans the output of a test's for secrets.
STARTED: list[Process] = []


def stop(proc: Process, timeout: float = 10.0) -> int:
    """SIGINT, wait up to `timeout`; then SIGKILL the process group. Returns the exit code."""
    popen = proc.popen
    if popen.poll() is None:
        try:
            os.kill(popen.pid, signal.SIGINT)
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            pass
    if popen.poll() is None:
        # Still running (and so not reaped): its pid is still its group's id.
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        popen.wait(5)
    proc.read_to_end(2)
    return popen.returncode


def service_answer(node, client, request, executor, timeout: float = 30.0,
                   retry_s: float = 10.0):
    """The response to `request`, re-sent every `retry_s` until `timeout`.

    A request that goes out as the service is first discovered can be lost before the reply
    path is matched, and its future then never completes: a client that asks again gets its
    answer (a CI run saw get_parameters unanswered for 10 s while a re-run answered at once).
    """
    import rclpy

    deadline = time.monotonic() + timeout
    while True:
        future = client.call_async(request)
        wait = max(0.1, min(retry_s, deadline - time.monotonic()))
        rclpy.spin_until_future_complete(node, future, executor=executor, timeout_sec=wait)
        if future.done() and future.result() is not None:
            return future.result()
        client.remove_pending_request(future)
        assert time.monotonic() < deadline, f"{client.srv_name}: no answer in {timeout:g} s"


def parameter_values(node, executor, target: str, names: list[str]) -> list:
    """The ParameterValues of node `target`'s parameters `names`, from its get_parameters."""
    from rcl_interfaces.srv import GetParameters

    client = node.create_client(GetParameters, f"/{target}/get_parameters")
    try:
        assert client.wait_for_service(timeout_sec=30), f"{target} has no parameter service"
        return service_answer(node, client, GetParameters.Request(names=names), executor).values
    finally:
        node.destroy_client(client)
