"""Test-wide setup: ROS 2 isolation for every test, in-process and in subprocesses.

Runs before any test module imports rclpy, so plain `pytest` is isolated as well as `make test`:
ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST (plus ROS_LOCALHOST_ONLY=1 on Humble) and a
ROS_DOMAIN_ID of this run (1..100, from the pid; MEMORY_NODE_TEST_DOMAIN_ID overrides), stepped
for each test module. Subprocesses inherit os.environ, so nodes spawned by a test join its
module's domain.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator

import pytest
import secret_guard
from ros_helpers import STARTED, Process, isolate_ros_environment, module_domain_id, spawn, stop
from stream_support import range_stream  # noqa: F401 - a fixture for the tests that use it

_ISOLATION = isolate_ros_environment()
# rclpy's log files go to a folder of this run (removed at exit), not ~/.ros/log.
if "ROS_LOG_DIR" not in os.environ:
    os.environ["ROS_LOG_DIR"] = tempfile.mkdtemp(prefix="memory_node-test-roslog-")
    atexit.register(shutil.rmtree, os.environ["ROS_LOG_DIR"], ignore_errors=True)
# A run started in the background of a non-interactive shell (`cmd &`) inherits SIGINT
# ignored, and so would every process the tests spawn: `launch` then never hears the Ctrl-C
# the tests send it. Catching it here gives children the default, as a terminal would.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Markers by where a test lives and what it starts (registered in pyproject.toml). `make test`
# deselects none; `make test-fast` leaves out every marked test.
_FOLDER_MARKS = {"ros": {"ros"}, "e2e": {"e2e", "ros"}, "fleet": {"fleet"}}
_ROS_FILES = {"agent/test_ros_client.py", "test_interfaces.py"}  # nodes without ros_process
# slow: runs of ten seconds or more on an idle 2-core machine (files, or single tests).
_SLOW = {"e2e/test_soak.py", "e2e/test_import_e2e.py", "bench/test_bench_smoke.py",
         "bench/test_import_bench_smoke.py", "bench/test_week_bench_smoke.py",
         "e2e/test_full_disk_recording.py",  # memory-node on a tmpfs that fills (~40 s)
         "ros/test_full_disk_import.py",  # three imports, one into a full tmpfs (~25 s)
         "core/test_index_startup.py",  # a store over the graph threshold, per test module
         "core/test_index_cache.py::test_sigkill_mid_persist_leaves_a_valid_cache_or_none",
         "core/test_index_cache.py::test_processes_persisting_to_one_directory_all_succeed"}
_TEST_ROOT = os.path.dirname(os.path.abspath(__file__))
_SECRET_SCAN = pytest.StashKey[tuple[float, int]]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        rel = os.path.relpath(str(item.path), _TEST_ROOT).replace(os.sep, "/")
        marks = set(_FOLDER_MARKS.get(rel.split("/")[0], ()))
        if rel in _ROS_FILES or "ros_process" in getattr(item, "fixturenames", ()):
            marks.add("ros")
        test = f"{rel}::{getattr(item, 'originalname', item.name)}"
        if rel in _SLOW or test in _SLOW or item.get_closest_marker("robot_install"):
            marks.add("slow")
        for name in sorted(marks):
            item.add_marker(name)


secret_guard.install()
_MODULES_RUN = [0]


@pytest.fixture(scope="module", autouse=True)
def _ros_domain_per_module() -> Iterator[None]:
    """Each test module in a ROS domain of its own (see ros_helpers.module_domain_id); set
    before the module's fixtures start contexts or nodes, which read it at init.
    MEMORY_NODE_TEST_DOMAIN_ID pins one domain for the whole run."""
    if os.environ.get("MEMORY_NODE_TEST_DOMAIN_ID"):
        yield
        return
    before = os.environ["ROS_DOMAIN_ID"]
    os.environ["ROS_DOMAIN_ID"] = str(module_domain_id(_MODULES_RUN[0],
                                                       int(_ISOLATION["ROS_DOMAIN_ID"])))
    _MODULES_RUN[0] += 1
    try:
        yield
    finally:
        os.environ["ROS_DOMAIN_ID"] = before


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_SECRET_SCAN] = (secret_guard.now(), len(STARTED))
    secret_guard.take_outputs()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """No secret a test used may reach what it printed, what its processes printed or the
    ROS log files written meanwhile: such a test fails at teardown, naming where."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "teardown" or _SECRET_SCAN not in item.stash:
        return
    since, first = item.stash[_SECRET_SCAN]
    places = {
        "captured output": [content for _, content in report.sections],
        "spawned processes": [proc.output for proc in STARTED[first:]],
        "subprocess.run output": secret_guard.take_outputs(),
        "ROS log files": secret_guard.log_files_since(os.environ.get("ROS_LOG_DIR"), since),
    }
    found = {where: secret_guard.leaks(texts) for where, texts in places.items()}
    found = {where: hits for where, hits in found.items() if hits}
    if found and report.passed:
        report.outcome = "failed"
        report.longrepr = "a secret reached an output or a log: " + "; ".join(
            f"{', '.join(hits)} in {where}" for where, hits in found.items())


def pytest_report_header(config: pytest.Config) -> str:
    return "ros isolation: " + " ".join(f"{k}={v}" for k, v in sorted(_ISOLATION.items()))


@pytest.fixture
def ros_process() -> Iterator:
    """Factory: `ros_process(args, env=..., cwd=...)` spawns a process; all are stopped after.

    Stop order is SIGINT, then SIGKILL of the process group (see ros_helpers.stop).
    """
    started: list[Process] = []

    def start(args, **kwargs) -> Process:
        proc = spawn(args, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        stop(proc)
