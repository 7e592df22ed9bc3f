# Developer and CI entry points. Everything runs from .venv at the repository root, which
# `make setup` creates and keeps in step with requirements/, setup.py, srv/ and interfaces/.
#
#   make setup   create/update .venv (pinned deps, package installed editable, types generated)
#   make test    setup, then pytest over test/ (ROS-isolated: see test/conftest.py)
#   make demo    setup, then the demo
#   make lint    the checks (same as make check)
#   make check   ruff (pyproject.toml [tool.ruff]) and mypy over memory_node/ ([tool.mypy])
#   make bench   the benchmark suite
#   make clean   remove build output and generated types (keeps .venv)

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

.PHONY: setup _setup test demo lint bench clean

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
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { \
	  echo "setup: $(PYTHON) is older than 3.10" >&2; exit 1; }; \
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
