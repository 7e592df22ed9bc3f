"""Build and install memory_node, generating its ROS 2 service types on the way.

memory_node is an ament_python package that also owns interfaces (srv/). ament_python cannot
run rosidl by itself, so build_py runs interfaces/CMakeLists.txt (rosidl_generate_interfaces)
and merges the result into the package:

- the generated Python modules (memory_node/srv/) and the typesupport extension modules
  (memory_node/memory_node_s__rosidl_typesupport_*.so) go into the package;
- the shared libraries lib<pkg>__rosidl_*.so go to <prefix>/lib, where the ROS 2 runtime looks
  for them (LD_LIBRARY_PATH on a ROS install or a colcon workspace, and the ROS 2 wheels'
  bootstrapper in a virtual environment).

tf2_msgs (TFMessage) is generated the same way from interfaces/tf2_msgs when no tf2_msgs is
importable, as with the ROS 2 wheels from PyPI; a robot's own ROS install keeps its own.
MEMORY_NODE_TF2_MSGS=build|skip overrides that choice. unitree_go (just Go2FrontVideoData, the
Go2's front camera on Unitree's own stack) likewise from interfaces/unitree_go unless a
unitree_go package (unitree_ros2's workspace) is importable; MEMORY_NODE_UNITREE_GO=build|skip.

Works under `colcon build`, `colcon build --symlink-install` (`setup.py develop`, which never
runs build_py: the develop command below generates the interfaces itself), `pip install
--no-build-isolation [-e] .` (what `make setup` runs) and plain `pip install .` (pyproject.toml
lists the build tools for the isolated build), with setuptools from 59.6 (Ubuntu 22.04's, no
editable_wheel) up. In an editable or develop install the generated files are written into
the source tree (git-ignored), so edits under memory_node/ take effect without reinstalling.

MEMORY_NODE_CMAKE_ARGS adds arguments to the interface configure step (e.g.
-DPYTHON_INSTALL_DIR=local/lib/python3.10/dist-packages, the layout Humble's ament_cmake_python
picks for Debian's system Python).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.develop import develop as _develop
from setuptools.dist import Distribution

PACKAGE = "memory_node"
ROOT = Path(__file__).resolve().parent
CMAKE_PROJECT = ROOT / "interfaces"
TF2_MSGS_SOURCE = CMAKE_PROJECT / "tf2_msgs"
UNITREE_GO_SOURCE = CMAKE_PROJECT / "unitree_go"
# Dropped into generated packages that are not ours by name (tf2_msgs), so a later build can
# tell its own output from a ROS install's package of the same name.
GENERATED_MARKER = "GENERATED_BY_MEMORY_NODE"


def _foreign_package_wanted(package: str) -> bool:
    """Generate `package` unless some other copy of it (a ROS install's) is importable."""
    variable = f"MEMORY_NODE_{package.upper()}"
    choice = os.environ.get(variable, "auto").strip().lower()
    if choice in ("build", "skip"):
        return choice == "build"
    if choice != "auto":
        raise SystemExit(f"{variable} must be auto, build or skip, not {choice!r}")
    for entry in sys.path:
        candidate = Path(entry or ".").resolve() / package
        if (candidate / "__init__.py").is_file() and not (candidate / GENERATED_MARKER).exists():
            return False
    return True


def _interface_packages() -> list[tuple[str, Path, list[str]]]:
    """(package, folder with package.xml and msg/ srv/, interface dependencies)."""
    packages = [(PACKAGE, ROOT, ["std_msgs"])]
    if TF2_MSGS_WANTED:
        packages.append(("tf2_msgs", TF2_MSGS_SOURCE, ["geometry_msgs"]))
    if UNITREE_GO_WANTED:
        packages.append(("unitree_go", UNITREE_GO_SOURCE, []))
    return packages


def _ros_prefix() -> Path:
    """The prefix whose share/ holds the rosidl CMake code: /opt/ros/<distro> or a venv.

    Found from where rosidl_generator_py is installed: under colcon sys.prefix is the system
    Python's, not the ROS install's.
    """
    spec = importlib.util.find_spec("rosidl_generator_py")
    if spec is None or spec.origin is None:
        raise SystemExit(
            "memory_node: building the service types needs the ROS 2 interface build tools "
            "(rosidl_generator_py not importable). Source a ROS 2 install, or install "
            "requirements/build.txt into this Python environment."
        )
    for parent in Path(spec.origin).resolve().parents:
        if (parent / "share" / "rosidl_generator_py" / "cmake").is_dir():
            return parent
    raise SystemExit(f"memory_node: no share/rosidl_generator_py above {spec.origin}")


def _prepend_path(env: dict[str, str], name: str, entry: str) -> None:
    parts = [p for p in env.get(name, "").split(os.pathsep) if p and p != entry]
    env[name] = os.pathsep.join([entry, *parts])


def _run(cmd: list[str], env: dict[str, str], log: Path) -> None:
    """Run one build step, keeping its output in a log that is shown only on failure."""
    with open(log, "ab") as out:
        out.write(("\n$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        result = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-6000:]
        raise SystemExit(f"memory_node: interface build step failed: {' '.join(cmd)}\n{tail}")


def generate_interfaces(package: str, source: Path, deps: list[str], work: Path) -> Path:
    """Configure, build and stage one interface package; returns the staging prefix.

    The build folder is kept between runs so an unchanged package rebuilds in seconds; it is
    wiped when the interpreter, the ROS prefix or the arguments change.
    """
    if shutil.which("cmake") is None:
        raise SystemExit("memory_node: cmake not found (Debian: apt-get install cmake g++ make)")
    prefix = _ros_prefix()
    build, stage = work / package, work / f"{package}-install"
    args = [
        f"-DIFACE_PACKAGE={package}",
        f"-DIFACE_SOURCE_DIR={source}",
        f"-DIFACE_DEPENDENCIES={';'.join(deps)}",
        # Both: FindPython3 reads the first, Humble's rosidl_generator_py (PythonInterp) the second.
        f"-DPython3_EXECUTABLE={sys.executable}",
        f"-DPYTHON_EXECUTABLE={sys.executable}",
        f"-DCMAKE_INSTALL_PREFIX={stage}",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_TESTING=OFF",
        *shlex.split(os.environ.get("MEMORY_NODE_CMAKE_ARGS", "")),
    ]
    fingerprint = hashlib.sha256(json.dumps([str(prefix), *args]).encode()).hexdigest()
    stamp = build / "memory_node-args.sha256"
    if build.exists() and (not stamp.exists() or stamp.read_text() != fingerprint):
        shutil.rmtree(build)
    build.mkdir(parents=True, exist_ok=True)
    stamp.write_text(fingerprint)

    env = dict(os.environ)
    _prepend_path(env, "AMENT_PREFIX_PATH", str(prefix))
    _prepend_path(env, "CMAKE_PREFIX_PATH", str(prefix))
    log = work / f"{package}.log"
    log.write_text("")
    jobs = str(max(1, os.cpu_count() or 1))
    _run(["cmake", "-S", str(CMAKE_PROJECT), "-B", str(build), *args], env, log)
    _run(["cmake", "--build", str(build), "--parallel", jobs], env, log)
    shutil.rmtree(stage, ignore_errors=True)
    _run(["cmake", "--install", str(build)], env, log)
    return stage


def _site_packages(stage: Path, package: str) -> Path:
    """The generated Python package in the staging prefix.

    lib/python3.X/site-packages in a venv; local/lib/python3.X/dist-packages where Humble's
    ament_cmake_python asks Debian/Ubuntu's system Python (its posix_local scheme).
    """
    found = sorted(
        [
            *stage.glob(f"lib/python*/*-packages/{package}"),
            *stage.glob(f"local/lib/python*/*-packages/{package}"),
        ]
    )
    if not found:
        raise SystemExit(f"memory_node: no generated Python package for {package} in {stage}")
    return found[0]


def merge_python(stage: Path, package: str, dest: Path) -> None:
    """Copy generated modules and typesupport extensions into the package folder `dest`.

    Only generated parts are replaced: memory_node's own modules stay as they are.
    """
    generated = _site_packages(stage, package)
    dest.mkdir(parents=True, exist_ok=True)
    if package != PACKAGE:
        # Wholly generated (tf2_msgs): start clean and keep the generated __init__.py.
        for child in dest.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        shutil.copy2(generated / "__init__.py", dest / "__init__.py")
        (dest / GENERATED_MARKER).write_text("generated by memory_node's setup.py\n")
    for old in dest.glob(f"{package}_s__rosidl_typesupport_*.so"):
        old.unlink()
    for sub in ("msg", "srv", "action"):
        shutil.rmtree(dest / sub, ignore_errors=True)
        if (generated / sub).is_dir():
            shutil.copytree(
                generated / sub, dest / sub, ignore=shutil.ignore_patterns("*.c", "__pycache__")
            )
    for ext in generated.glob(f"{package}_s__rosidl_typesupport_*.so"):
        shutil.copy2(ext, dest / ext.name)


def staged_data_files(stage: Path, package: str) -> list[tuple[str, list[str]]]:
    """Files for <prefix>: the shared libraries, the ament index entry, the .idl/.json."""
    files: list[tuple[str, list[str]]] = []
    libs = sorted(str(p) for p in stage.glob(f"lib/lib{package}__rosidl_*.so"))
    files.append(("lib", libs))
    index = stage / "share/ament_index/resource_index/rosidl_interfaces" / package
    if index.is_file():
        files.append(("share/ament_index/resource_index/rosidl_interfaces", [str(index)]))
    for sub in ("msg", "srv", "action"):
        found = sorted(
            str(p) for p in (stage / "share" / package / sub).glob("*") if p.suffix != ".srv"
        )
        if found:
            files.append((f"share/{package}/{sub}", found))
    return files


def generate_all(
    distribution: Distribution, build_base: str, build_lib: str | None, generated_dir: Path
) -> None:
    """Generate every interface package and merge it in; add the libraries to data_files.

    build_lib set (a regular build): everything goes there. None (editable and develop
    installs): memory_node's generated parts go into the source tree, whole generated packages
    (tf2_msgs) into generated_dir, which the install puts on the path.
    """
    work = Path(build_base).resolve() / "interfaces"
    work.mkdir(parents=True, exist_ok=True)
    if distribution.data_files is None:
        distribution.data_files = []
    data_files = distribution.data_files
    packages = _interface_packages()
    # The packages are independent: configure one while the other compiles.
    with ThreadPoolExecutor(max_workers=len(packages)) as pool:
        stages = list(pool.map(lambda p: generate_interfaces(*p, work), packages))
    for (package, _, _), stage in zip(packages, stages, strict=True):
        if build_lib is not None:
            dest = Path(build_lib) / package
        elif package == PACKAGE:
            dest = ROOT / package
        else:
            dest = generated_dir / package
            if distribution.packages is not None and package not in distribution.packages:
                distribution.packages.append(package)  # maps it for the editable finder
        merge_python(stage, package, dest)
        for entry in staged_data_files(stage, package):
            if entry not in data_files:
                data_files.append(entry)


class build_py(_build_py):
    """build_py that also generates the ROS 2 interfaces (see the module docstring)."""

    def run(self) -> None:
        super().run()  # memory_node's own modules first; generated ones are merged after
        build = self.get_finalized_command("build")
        # editable_mode: setuptools >= 64's editable installs (PEP 660); absent before.
        editable = getattr(self, "editable_mode", False)
        build_lib = None if editable else self.build_lib
        generate_all(self.distribution, build.build_base, build_lib, ROOT)


class develop(_develop):
    """`setup.py develop` (colcon build --symlink-install) generates the interfaces as well.

    develop never runs build_py. colcon runs it from its build folder, which it links to the
    sources and puts on PYTHONPATH: memory_node's generated parts go into the (linked) source
    tree, tf2_msgs into that folder, and the libraries join data_files before colcon's
    symlink_data installs them.
    """

    def run(self) -> None:
        if not self.uninstall:
            build = self.get_finalized_command("build")
            generate_all(self.distribution, build.build_base, None, Path.cwd())
        super().run()


def _editable_wheel_class() -> type | None:
    """editable_wheel that also installs data_files; None before setuptools 64 (no PEP 660).

    setuptools' editable_wheel looks for `has_data` (not `has_data_files`) and so never
    installs data files; without lib<pkg>__rosidl_*.so in <prefix>/lib the ROS middleware
    cannot load the service type support.
    """
    try:
        from setuptools.command.editable_wheel import editable_wheel as _editable_wheel
    except ImportError:  # Ubuntu 22.04's setuptools 59.6
        return None

    class editable_wheel(_editable_wheel):  # type: ignore[misc,valid-type]
        def _run_install(self, category: str) -> None:
            if category == "data" and self.distribution.has_data_files():
                self.run_command("install_data")
                return
            super()._run_install(category)

    return editable_wheel


class BinaryDistribution(Distribution):
    """Carries compiled type support: wheels get this interpreter's platform tag, not any."""

    def has_ext_modules(self) -> bool:
        return True


TF2_MSGS_WANTED = _foreign_package_wanted("tf2_msgs")
UNITREE_GO_WANTED = _foreign_package_wanted("unitree_go")
CMDCLASS: dict[str, type] = {"build_py": build_py, "develop": develop}
_EDITABLE_WHEEL = _editable_wheel_class()
if _EDITABLE_WHEEL is not None:
    CMDCLASS["editable_wheel"] = _EDITABLE_WHEEL

setup(
    name=PACKAGE,
    version="0.1.0",
    description="Queryable spatial, temporal and semantic memory for a ROS 2 robot and its agent",
    license="Apache-2.0",
    python_requires=">=3.10",
    # memory_node.srv is generated (build_py), never taken from a stale copy in the tree.
    packages=find_packages(
        include=[PACKAGE, f"{PACKAGE}.*"], exclude=[f"{PACKAGE}.srv", f"{PACKAGE}.msg"]
    ),
    # Runtime dependencies live in requirements/ (pinned) and package.xml (rosdep), not here:
    # colcon on a robot must not try to install PyPI copies of ROS packages.
    install_requires=["setuptools"],
    # The memory view's page (HTML, JS, CSS) ships in the package: it works with no network.
    package_data={f"{PACKAGE}.fleet": ["schema.sql"],
                  f"{PACKAGE}.view": ["static/*.html", "static/*.js", "static/*.css"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/srv", sorted(glob.glob("srv/*.srv"))),
        (f"share/{PACKAGE}/launch", sorted(glob.glob("launch/*.py"))),
        (f"share/{PACKAGE}/config", sorted(glob.glob("config/*.yaml"))),
    ],
    entry_points={
        "console_scripts": [
            "memory-node = memory_node.ros.main:main",
            "memory-recorder = memory_node.ros.recorder:main",
            "memory-server = memory_node.ros.server:main",
            "memory-cli = memory_node.ros.cli:main",
            "memory-replay = memory_node.ros.replay:main",
            "memory-import = memory_node.ros.bag_import:main",
            "memory-mcp = memory_node.agent.mcp_server:main",
            "memory-sample-bag = memory_node.sim.generate:main",
            "memory-demo = memory_node.demo:main",
            "memory-sync = memory_node.fleet.sync:main",
            "memory-eval = memory_node.eval:main",
            "memory-models = memory_node.models:main",
            "memory-export = memory_node.export:main",
            "memory-view = memory_node.view.server:main",
        ],
    },
    distclass=BinaryDistribution,
    cmdclass=CMDCLASS,
    zip_safe=False,
)
