# Developer and CI entry points. Everything runs from .venv at the repository root, which
# `make setup` creates and keeps in step with requirements/, setup.py, srv/ and interfaces/.
#
#   make setup   create/update .venv (pinned deps, package installed editable, types generated)
#   make test    setup, then pytest over test/ (ROS-isolated: see test/conftest.py)
#   make test-fast  core and agent tests without the ros/e2e/fleet/slow ones (markers)
#   make demo    setup, then the demo
#   make lint    the checks (same as make check)
#   make check   ruff (pyproject.toml [tool.ruff]) and mypy over memory_node/ ([tool.mypy])
#   make bench   the benchmark suite
#   make clean   remove build output and generated types (keeps .venv)
#   make setup-jazzy  create/update .venv-jazzy: ROS 2 Jazzy wheels, the package installed
#                editable from a copy of the checkout in build/jazzy/src (types for Jazzy)
#   make test-jazzy   setup-jazzy, then the ROS and end-to-end tests on Jazzy
#   make test-install the robot-workspace install test alone (it also runs in make test)

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
	Compact, Streams; from tf2_msgs.msg import TFMessage'
SETUP_INPUTS := $(sort $(wildcard requirements/*.txt) $(wildcard test/wheels/*.whl) setup.py setup.cfg pyproject.toml \
	package.xml $(wildcard srv/*.srv) $(shell find interfaces -type f 2>/dev/null))
PYTEST_ARGS ?=

# ROS 2 Jazzy: a venv of its own and a copy of the checkout of its own, since an editable
# install writes the generated types (built against one distro) into its source tree.
JAZZY_VENV := .venv-jazzy
JAZZY_PY := $(abspath $(JAZZY_VENV)/bin/python)
JAZZY_TREE := build/jazzy/src
JAZZY_CONSTRAINTS := requirements/jazzy-constraints.txt
JAZZY_STAMP := $(JAZZY_VENV)/.memory_node-setup
JAZZY_IMPORT_CHECK := cd /tmp && $(JAZZY_PY) -c 'import importlib.metadata as m, memory_node; \
	from memory_node.srv import Search, Save, Compact, Streams; from tf2_msgs.msg import TFMessage; \
	assert m.version("ros-jazzy-rclpy") == m.version("ros-rclpy"), "rclpy is not Jazzy'"'"'s"; \
	assert "$(abspath $(JAZZY_TREE))" in memory_node.__file__, memory_node.__file__'
JAZZY_SETUP_INPUTS := $(sort requirements/jazzy.txt $(JAZZY_CONSTRAINTS) requirements/dev.txt \
	requirements/nodeps.txt $(wildcard test/wheels/*.whl) setup.py setup.cfg pyproject.toml package.xml $(wildcard srv/*.srv) \
	$(shell find interfaces -type f 2>/dev/null))
# Every test that talks ROS or runs the nodes.
JAZZY_TESTS ?= test/ros test/e2e test/test_interfaces.py test/test_help.py \
	test/agent/test_ros_client.py

.PHONY: setup _setup test demo lint bench clean setup-jazzy _setup_jazzy test-jazzy test-install

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
	$(PY) -m pytest $(PYTEST_ARGS)

# The quick loop: pure core and agent tests, no ROS nodes, PostgreSQL or minute-long runs.
.PHONY: test-fast
test-fast: setup
	$(PY) -m pytest -m "not ros and not e2e and not fleet and not slow" $(PYTEST_ARGS) \
	  test/core test/agent

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
	  $(JAZZY_PY) -m pytest $(PYTEST_ARGS) $(JAZZY_TESTS)

demo: setup
	$(VENV)/bin/memory-demo

.PHONY: check
lint: check

check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: setup
	$(PY) -m bench

clean:
	rm -rf build memory_node/srv memory_node/msg tf2_msgs
	rm -f memory_node/memory_node_s__rosidl_typesupport_*.so
