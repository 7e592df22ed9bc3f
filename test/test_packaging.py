"""Packaging facts that drift silently: pins, the ROS manifest, the srv contract, commands."""

from __future__ import annotations

import importlib.metadata
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (Humble's)
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements"
PIN = re.compile(r"^([A-Za-z0-9._-]+)(?:\[[A-Za-z0-9,_-]+\])?==([A-Za-z0-9.+!-]+)$")

COMMANDS = {
    "memory-node": "memory_node.ros.main:main",
    "memory-recorder": "memory_node.ros.recorder:main",
    "memory-server": "memory_node.ros.server:main",
    "memory-cli": "memory_node.ros.cli:main",
    "memory-replay": "memory_node.ros.replay:main",
    "memory-import": "memory_node.ros.bag_import:main",
    "memory-mcp": "memory_node.agent.mcp_server:main",
    "memory-sample-bag": "memory_node.sim.generate:main",
    "memory-demo": "memory_node.demo:main",
    "memory-sync": "memory_node.fleet.sync:main",
    "memory-eval": "memory_node.eval:main",
    "memory-models": "memory_node.models:main",
    "memory-export": "memory_node.export:main",
    "memory-view": "memory_node.view.server:main",
}


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-r "):  # included files are checked on their own
            continue
        match = PIN.match(line)
        assert match, f"{path.name}: not pinned with ==: {raw!r}"
        pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


def test_every_requirement_is_pinned_and_agrees_with_constraints():
    constraints = _pins(REQUIREMENTS / "constraints.txt")
    for name in ("build.txt", "runtime.txt", "dev.txt", "nodeps.txt", "robot.txt"):
        for package, version in _pins(REQUIREMENTS / name).items():
            assert constraints.get(package) == version, f"{name}: {package}=={version}"


def test_robot_requirements_include_build_and_runtime():
    """The robot workspace's one install covers what colcon builds with and what runs."""
    lines = (REQUIREMENTS / "robot.txt").read_text().splitlines()
    assert {"-r build.txt", "-r runtime.txt"} <= {line.strip() for line in lines}
    assert "colcon-common-extensions" in _pins(REQUIREMENTS / "robot.txt")
    script = (ROOT / "tools" / "install-robot-deps.sh").read_text()
    assert "-r \"$reqs/robot.txt\"" in script and "--no-deps" in script


def test_jazzy_requirements_are_pinned_and_share_the_non_ros_pins():
    """.venv-jazzy differs from .venv in the ROS packages only."""
    jazzy_constraints = _pins(REQUIREMENTS / "jazzy-constraints.txt")
    jazzy = _pins(REQUIREMENTS / "jazzy.txt")
    for package, version in jazzy.items():
        assert jazzy_constraints.get(package) == version, f"jazzy.txt: {package}=={version}"
    assert "ros-jazzy-rclpy" in jazzy
    assert not [p for p in jazzy if p.startswith("ros-") and not p.startswith("ros-jazzy-")]
    runtime = _pins(REQUIREMENTS / "runtime.txt")
    build = _pins(REQUIREMENTS / "build.txt")
    expected = {p: v for p, v in {**build, **runtime}.items() if not p.startswith("ros-")}
    assert {p: v for p, v in jazzy.items() if not p.startswith("ros-")} == expected
    constraints = _pins(REQUIREMENTS / "constraints.txt")
    shared = {p for p in jazzy_constraints if not p.startswith("ros-")}
    assert {p: jazzy_constraints[p] for p in shared} == {p: constraints.get(p) for p in shared}


def test_isolated_build_requirements_match_build_txt():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    requires = pyproject["build-system"]["requires"]
    build = _pins(REQUIREMENTS / "build.txt")
    assert {r.split("==")[0].lower(): r.split("==")[1] for r in requires} == build


def test_package_xml_is_an_interface_owning_ament_python_package():
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.get("format") == "3"
    assert root.findtext("name") == "memory_node"
    assert root.findtext("export/build_type") == "ament_python"
    assert "rosidl_interface_packages" in [e.text for e in root.findall("member_of_group")]
    setup_py = (ROOT / "setup.py").read_text()
    assert f'version="{root.findtext("version")}"' in setup_py


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("Search", "std_msgs/String query\n---\nstd_msgs/String result\n"),
        ("Save", "std_msgs/String note\n---\nstd_msgs/String result\n"),
        ("Compact", "---\nstd_msgs/String result\n"),
        ("Streams", "---\nstd_msgs/String result\n"),
    ],
)
def test_service_definitions_are_the_contract(name, text):
    assert (ROOT / "srv" / f"{name}.srv").read_text() == text


def test_console_scripts_are_registered():
    try:
        dist = importlib.metadata.distribution("memory_node")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("memory_node is not installed in this environment")
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts == COMMANDS
