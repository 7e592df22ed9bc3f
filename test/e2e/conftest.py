"""The sample flat (seed 7) the replay tests share: generated once per run (about 13 s), read
only by the tests that replay or import it."""

from __future__ import annotations

import pytest

from memory_node.session import load_sample


@pytest.fixture(scope="session")
def sample(tmp_path_factory):
    return load_sample(tmp_path_factory.mktemp("sample"), seed=7)
