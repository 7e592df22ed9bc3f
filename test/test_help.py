"""`--help` on every command: usage on stdout, exit 0, and nothing started — no ROS node, no
`./agent_memory` or other files (a robot engineer's first look at a command must be safe)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_packaging import COMMANDS

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_starts_nothing(command, flag, tmp_path):
    done = subprocess.run([str(BIN / command), flag], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {command}"), done.stdout[:200]
    assert "[INFO]" not in done.stdout + done.stderr  # no node logged anything
    assert list(tmp_path.iterdir()) == []  # no ./agent_memory, no log folder
