# Developer and CI entry points. Everything runs from .venv at the repository root, which
# `make setup` creates and keeps in step with requirements/, setup.py, srv/ and interfaces/.
#
#   make setup   create/update .venv (pinned deps, package installed editable, types generated)
#   make test    setup, then pytest over test/ (ROS-isolated: see test/conftest.py)
#   make test-fast  core, wire and agent tests without the ros/e2e/fleet/slow ones (markers)
#   make demo    setup, then the demo
#   make lint    the checks (same as make check)
#   make check   ruff (pyproject.toml [tool.ruff]), mypy over memory_node/ ([tool.mypy]),
#                vermin (the shipped code runs on Python 3.10) and lint-imports (the layer
#                contract, [tool.importlinter]: imports point down, no rclpy in core or wire)
#   make bench   the benchmark suite
#   make clean   remove build output and generated types (keeps .venv)
#   make setup-jazzy  create/update .venv-jazzy: ROS 2 Jazzy wheels, the package installed
#                editable from a copy of the checkout in build/jazzy/src (types for Jazzy)
#   make test-jazzy   setup-jazzy, then the ROS and end-to-end tests on Jazzy
#   make test-install the robot-workspace install test alone (it also runs in make test)
#   make check-apt-pins  requirements/apt.txt resolves to wheels under apt-humble.txt (Python
#                3.10) and apt-jazzy.txt (3.12) for x86_64 and aarch64 (package index only)
#   make test-numpy1  the core, ROS and end-to-end tests as on a robot with ROS from apt
#                (CI's Jazzy run):
#                Debian's python3 with apt's numpy 1 and cv2, numpy 1.26.4 and the
#                requirements/apt-$(APT_PINS).txt pins in .venv-numpy1, ROS 2 Jazzy wheels
#   make test-aarch64 the core tests on Debian's arm64 Python under QEMU user-mode emulation
#                with the aarch64 wheels of the Humble pins (tools/aarch64-core-tests.sh; slow)

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CONSTRAINTS := requirements/constraints.txt
STAMP := $(VENV)/.memory_node-setup
# What a setup depends on: change any of these and the next `make setup` reinstalls.
# Run from outside the checkout, so it proves the installed package provides the types.
IMPORT_CHECK := cd /tmp && $(abspath $(PY)) -c 'from memory_node.srv import Search, Save, \
	Compact, Streams; from tf2_msgs.msg import TFMessage; \
	from unitree_go.msg import Go2FrontVideoData'
SETUP_INPUTS := $(sort $(wildcard requirements/*.txt) $(wildcard test/wheels/*.whl) setup.py setup.cfg pyproject.toml \
	package.xml $(wildcard srv/*.srv) $(shell find interfaces -type f 2>/dev/null))
PYTEST_ARGS ?=
# The suite runs on two workers (pytest-xdist), each test file on one of them, so a file's
# module fixtures (a replayed store, a node) are built once: on a 2-core machine half the time
# of one worker, since most ROS tests wait on discovery and replays. PYTEST_WORKERS=0: one
# process, as before. Each worker is a ROS domain of its own (test/conftest.py).
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile
# The end-to-end tests (live replays timed against the clock) then run one at a time, after
# the rest: two of them at once on two cores made a live 1x recording's first camera view
# differ from the import's. PYTEST_SPLIT PYTHON, TESTS: each half may select nothing (exit
# 5); both selecting nothing is exit 5, any other failure is the exit status.
define PYTEST_SPLIT
a=0; b=0; $(1) -m pytest $(XDIST) -m "not e2e" $(PYTEST_ARGS) $(2) || a=$$?; \
	$(1) -m pytest -m e2e $(PYTEST_ARGS) $(2) || b=$$?; \
	if [ $$a -eq 5 ] && [ $$b -eq 5 ]; then exit 5; fi; \
	for rc in $$a $$b; do [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit $$rc; done
endef

# ROS 2 Jazzy: a venv of its own and a copy of the checkout of its own, since an editable
# install writes the generated types (built against one distro) into its source tree.
JAZZY_VENV := .venv-jazzy
JAZZY_PY := $(abspath $(JAZZY_VENV)/bin/python)
JAZZY_TREE := build/jazzy/src
JAZZY_CONSTRAINTS := requirements/jazzy-constraints.txt
JAZZY_STAMP := $(JAZZY_VENV)/.memory_node-setup
JAZZY_IMPORT_CHECK := cd /tmp && $(JAZZY_PY) -c 'import importlib.metadata as m, memory_node; \
	from memory_node.srv import Search, Save, Compact, Streams; from tf2_msgs.msg import TFMessage; \
	from unitree_go.msg import Go2FrontVideoData; \
	assert m.version("ros-jazzy-rclpy") == m.version("ros-rclpy"), "rclpy is not Jazzy'"'"'s"; \
	assert "$(abspath $(JAZZY_TREE))" in memory_node.__file__, memory_node.__file__'
JAZZY_SETUP_INPUTS := $(sort requirements/jazzy.txt $(JAZZY_CONSTRAINTS) requirements/dev.txt \
	requirements/nodeps.txt $(wildcard test/wheels/*.whl) setup.py setup.cfg pyproject.toml package.xml $(wildcard srv/*.srv) \
	$(shell find interfaces -type f 2>/dev/null))
# Every test that talks ROS, reads its wire formats or runs the nodes.
JAZZY_TESTS ?= test/wire test/ros test/e2e test/test_interfaces.py test/test_help.py \
	test/agent/test_ros_client.py

# A robot with ROS 2 from apt: numpy 1 and the apt pins (requirements/apt*.txt).
# The Python 3 of Debian/Ubuntu (apt's python3-numpy and python3-opencv are built for it).
SYSTEM_PYTHON ?= /usr/bin/python3
APT_PINS ?= humble
NUMPY1_VENV := .venv-numpy1
NUMPY1_PY := $(abspath $(NUMPY1_VENV)/bin/python)
NUMPY1_TREE := build/numpy1/src
NUMPY1_CONSTRAINTS := build/numpy1/constraints.txt
NUMPY1_STAMP := $(NUMPY1_VENV)/.memory_node-setup
NUMPY1_IMPORT_CHECK := cd /tmp && $(NUMPY1_PY) -c 'import numpy, cv2, memory_node; \
	from memory_node.srv import Search; from tf2_msgs.msg import TFMessage; \
	from unitree_go.msg import Go2FrontVideoData; \
	assert numpy.__version__.startswith("1."), numpy.__version__; \
	assert cv2.__file__.startswith("/usr/"), cv2.__file__; \
	assert "$(abspath $(NUMPY1_TREE))" in memory_node.__file__, memory_node.__file__'
NUMPY1_SETUP_INPUTS := $(sort requirements/apt.txt requirements/apt-$(APT_PINS).txt \
	requirements/apt-test.txt requirements/jazzy.txt $(JAZZY_CONSTRAINTS) requirements/nodeps.txt \
	$(wildcard test/wheels/*.whl) setup.py setup.cfg pyproject.toml package.xml \
	$(wildcard srv/*.srv) $(shell find interfaces -type f 2>/dev/null))
# The core tests and every test that talks ROS or runs the nodes (JAZZY_TESTS' list).
NUMPY1_TESTS ?= test/core $(JAZZY_TESTS)
# Interpreter-free resolution of the apt pins: (Python, newest glibc of the distro's Ubuntu).
APT_PIN_TARGETS := humble:3.10:35 jazzy:3.12:39

.PHONY: setup _setup test demo lint bench clean setup-jazzy _setup_jazzy test-jazzy test-install
.PHONY: check-apt-pins setup-numpy1 _setup_numpy1 test-numpy1 test-aarch64

setup:
	@mkdir -p build
	@flock build/.setup.lock $(MAKE) --no-print-directory _setup

_setup:
	@hash=$$(sha256sum $(SETUP_INPUTS) | sha256sum | cut -c1-32); \
	if [ "$$(cat $(STAMP) 2>/dev/null)" = "$$hash" ] && ($(IMPORT_CHECK)) 2>/dev/null; then \
	  echo "setup: $(VENV) is up to date"; exit 0; fi; \
	command -v cmake >/dev/null && command -v c++ >/dev/null || { \
	  echo "setup: cmake and a C++ compiler are needed (Debian: apt-get install cmake g++ make)" >&2; \
	  exit 1; }; \
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
	  echo "setup: $(PYTHON) is older than 3.11 (the pinned numpy needs 3.11)" >&2; exit 1; }; \
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV); \
	rm -f $(STAMP); \
	$(PIP) install -q -c $(CONSTRAINTS) pip setuptools wheel; \
	$(PIP) install -q -c $(CONSTRAINTS) -r requirements/build.txt -r requirements/runtime.txt \
	  -r requirements/dev.txt; \
	$(PIP) install -q --no-deps -c $(CONSTRAINTS) -r requirements/nodeps.txt; \
	$(PIP) install -q --no-deps --no-build-isolation -e .; \
	$(PIP) install -q --no-deps test/wheels/*.whl; \
	($(IMPORT_CHECK)); \
	echo "$$hash" > $(STAMP); \
	echo "setup: $(VENV) ready"

test: setup
	$(call PYTEST_SPLIT,$(PY),)

# The quick loop: pure core, wire and agent tests, no ROS nodes, PostgreSQL or minute-long runs.
.PHONY: test-fast
test-fast: setup
	$(PY) -m pytest -m "not ros and not e2e and not fleet and not slow" $(PYTEST_ARGS) \
	  test/core test/wire test/agent

test-install: setup
	$(PY) -m pytest -m robot_install $(PYTEST_ARGS) test/test_robot_install.py

setup-jazzy:
	@mkdir -p build
	@flock build/.setup-jazzy.lock $(MAKE) --no-print-directory _setup_jazzy

_setup_jazzy:
	@$(PYTHON) tools/sync_tree.py $(JAZZY_TREE)
	@hash=$$(sha256sum $(JAZZY_SETUP_INPUTS) | sha256sum | cut -c1-32); \
	if [ "$$(cat $(JAZZY_STAMP) 2>/dev/null)" = "$$hash" ] && ($(JAZZY_IMPORT_CHECK)) 2>/dev/null; \
	then echo "setup-jazzy: $(JAZZY_VENV) is up to date"; exit 0; fi; \
	command -v cmake >/dev/null && command -v c++ >/dev/null || { \
	  echo "setup-jazzy: cmake and a C++ compiler are needed (Debian: apt-get install cmake g++ make)" >&2; \
	  exit 1; }; \
	[ -x $(JAZZY_PY) ] || $(PYTHON) -m venv $(JAZZY_VENV); \
	rm -f $(JAZZY_STAMP); \
	$(JAZZY_PY) -m pip install -q -c $(JAZZY_CONSTRAINTS) pip setuptools wheel; \
	$(JAZZY_PY) -m pip install -q -c $(JAZZY_CONSTRAINTS) -r requirements/jazzy.txt \
	  -r requirements/dev.txt; \
	$(JAZZY_PY) -m pip install -q --no-deps -c $(JAZZY_CONSTRAINTS) -r requirements/nodeps.txt; \
	(cd $(JAZZY_TREE) && $(JAZZY_PY) -m pip install -q --no-deps --no-build-isolation -e .); \
	$(JAZZY_PY) -m pip install -q --no-deps test/wheels/*.whl; \
	($(JAZZY_IMPORT_CHECK)); \
	echo "$$hash" > $(JAZZY_STAMP); \
	echo "setup-jazzy: $(JAZZY_VENV) ready (ROS 2 Jazzy, sources in $(JAZZY_TREE))"

# Runs in the copy (its conftest, its generated types); the copy is synced by setup-jazzy.
# The venv's bin/ on PATH as if activated: tests that start commands by name find Jazzy's.
test-jazzy: setup-jazzy
	cd $(JAZZY_TREE) && PATH="$(abspath $(JAZZY_VENV))/bin:$$PATH" \
	  $(call PYTEST_SPLIT,$(JAZZY_PY),$(JAZZY_TESTS))

# pip resolves for another interpreter and machine with --target and --platform; every
# manylinux tag up to the distro's glibc is allowed, as pip on that robot would.
check-apt-pins: setup
	@for target in $(APT_PIN_TARGETS); do \
	  IFS=: read -r distro version glibc <<< "$$target"; \
	  for arch in x86_64 aarch64; do \
	    platforms="--platform manylinux2014_$$arch"; \
	    for v in $$(seq 17 $$glibc); do platforms="$$platforms --platform manylinux_2_$${v}_$$arch"; done; \
	    for spec in "-r requirements/apt.txt -c requirements/apt-$$distro.txt" \
	                "--no-deps -r requirements/nodeps.txt"; do \
	      $(PIP) install -q --dry-run --ignore-installed --only-binary=:all: \
	        --target build/apt-pins-dry-run --python-version $$version $$platforms $$spec \
	        || { echo "check-apt-pins: $$distro (Python $$version, $$arch): $$spec does not resolve" >&2; \
	             exit 1; }; \
	    done; \
	    echo "check-apt-pins: $$distro, Python $$version, $$arch: resolves"; \
	  done; \
	done

setup-numpy1:
	@mkdir -p build/numpy1
	@flock build/.setup-numpy1.lock $(MAKE) --no-print-directory _setup_numpy1

# The ROS wheels of requirements/jazzy.txt (their dependencies pinned by jazzy-constraints.txt
# where the apt pins do not pin them), then requirements/apt.txt and the test tools.
_setup_numpy1:
	@$(PYTHON) tools/sync_tree.py $(NUMPY1_TREE)
	@hash=$$(sha256sum $(NUMPY1_SETUP_INPUTS) | sha256sum | cut -c1-32); \
	if [ "$$(cat $(NUMPY1_STAMP) 2>/dev/null)" = "$$hash" ] && ($(NUMPY1_IMPORT_CHECK)) 2>/dev/null; \
	then echo "setup-numpy1: $(NUMPY1_VENV) is up to date"; exit 0; fi; \
	$(SYSTEM_PYTHON) -c 'import numpy, cv2, sys; sys.exit(not numpy.__version__.startswith("1."))' || { \
	  echo "setup-numpy1: $(SYSTEM_PYTHON) needs apt's numpy 1 and cv2 (Debian/Ubuntu: apt-get" \
	    "install python3-numpy python3-opencv opencv-data python3-venv python3-dev)" >&2; exit 1; }; \
	[ -x $(NUMPY1_PY) ] || $(SYSTEM_PYTHON) -m venv --system-site-packages $(NUMPY1_VENV); \
	touch $(NUMPY1_VENV)/COLCON_IGNORE; \
	rm -f $(NUMPY1_STAMP); \
	awk -F'==' 'NR == FNR { if (NF == 2 && $$1 !~ /^#/) pinned[tolower($$1)] = 1; next } \
	  NF == 2 && !(tolower($$1) in pinned) && $$1 !~ /^(numpy|onnx|ml-dtypes|opencv-python-headless)$$/' \
	  requirements/apt-$(APT_PINS).txt $(JAZZY_CONSTRAINTS) > $(NUMPY1_CONSTRAINTS); \
	grep -E '^(ros-|setuptools|wheel|catkin-pkg)' requirements/jazzy.txt > build/numpy1/ros.txt; \
	$(NUMPY1_PY) -m pip install -q -c $(NUMPY1_CONSTRAINTS) pip setuptools wheel; \
	$(NUMPY1_PY) -m pip install -q -c requirements/apt-$(APT_PINS).txt -c $(NUMPY1_CONSTRAINTS) \
	  -r build/numpy1/ros.txt -r requirements/apt.txt -r requirements/apt-test.txt; \
	$(NUMPY1_PY) -m pip install -q --no-deps -r requirements/nodeps.txt; \
	(cd $(NUMPY1_TREE) && $(NUMPY1_PY) -m pip install -q --no-deps --no-build-isolation -e .); \
	$(NUMPY1_PY) -m pip install -q --no-deps test/wheels/*.whl; \
	($(NUMPY1_IMPORT_CHECK)); \
	echo "$$hash" > $(NUMPY1_STAMP); \
	echo "setup-numpy1: $(NUMPY1_VENV) ready (numpy 1, apt's cv2, apt-$(APT_PINS) pins, ROS 2 Jazzy wheels)"

test-numpy1: setup-numpy1
	cd $(NUMPY1_TREE) && PATH="$(abspath $(NUMPY1_VENV))/bin:$$PATH" \
	  $(call PYTEST_SPLIT,$(NUMPY1_PY),$(NUMPY1_TESTS))

test-aarch64: setup
	tools/aarch64-core-tests.sh $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/memory-demo

.PHONY: check
lint: check

# vermin: the shipped code (not the tests, which use 3.11's tomllib) runs on Python 3.10.
check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/vermin -q -t=3.10- --no-tips --eval-annotations --backport typing_extensions \
	  --violations memory_node launch tools setup.py
	$(VENV)/bin/lint-imports

bench: setup
	$(PY) -m bench

clean:
	rm -rf build memory_node/srv memory_node/msg tf2_msgs unitree_go
	rm -f memory_node/memory_node_s__rosidl_typesupport_*.so
