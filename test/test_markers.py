"""The markers `make test-fast` relies on: every test that starts ROS nodes, needs PostgreSQL
or runs for minutes carries one, so the fast selection holds none of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST = "not ros and not e2e and not fleet and not slow"


def _collected(*args: str) -> set[str]:
    """The test files pytest selects with these arguments (collection only)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: nothing selected
    return {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}


def test_fast_selection_leaves_out_ros_fleet_e2e_and_slow_tests():
    every = {str(p.relative_to(ROOT)) for p in (ROOT / "test").rglob("test_*.py")}
    fast = _collected("-m", FAST, "test")
    assert fast and fast < every
    assert not {f for f in fast if f.startswith(("test/ros/", "test/e2e/", "test/fleet/",
                                                 "test/bench/"))}
    assert "test/agent/test_ros_client.py" not in fast  # starts the query server itself
    assert "test/core/test_engine.py" in fast and "test/agent/test_skills.py" in fast
    assert "test/wire/test_tf_buffer.py" in fast  # the wire codecs start no node
    slow = _collected("-m", "slow", "test")
    assert {"test/e2e/test_soak.py", "test/bench/test_bench_smoke.py",
            "test/test_robot_install.py", "test/e2e/test_import_e2e.py"} <= slow
