"""Configuration: typos and impossible values are refused with the key named."""

from __future__ import annotations

import pytest

from memory_node.core.config import ConfigError, MemoryConfig


def test_defaults_and_environment_fallbacks():
    cfg = MemoryConfig.from_mapping({}, env={"AGENT_MEMORY_DIR": "/tmp/m",
                                             "MEMSEARCH_ONNX_THREADS": "3"})
    assert str(cfg.root) == "/tmp/m" and cfg.onnx_threads == 3
    assert (cfg.hnsw_storage, cfg.hnsw_m, cfg.hnsw_ef_construction) == ("sq8", 48, 200)
    given = MemoryConfig.from_mapping({"memory_dir": "/data/mem"}, env={"AGENT_MEMORY_DIR": "x"})
    assert str(given.root) == "/data/mem"  # an explicit value wins over the environment


@pytest.mark.parametrize("values, message", [
    ({"hnsw_storge": "flat"}, "unknown configuration key.*hnsw_storge"),
    ({"hnsw_storage": "pq"}, "hnsw_storage must be 'sq8' or 'flat'"),
    ({"hnsw_m": 0}, "hnsw_m.*must be >= 1"),
    ({"hnsw_rerank": -5}, "hnsw_rerank must be >= 1"),
    ({"hnsw_ivf": "always"}, "hnsw_ivf must be 'auto', 'prefer' or 'off'"),
    ({"hnsw_halves": 3}, "hnsw_halves must be '1' or '2'"),
    ({"hnsw_dims": 4}, "hnsw_dims must be 0 .whole vectors. or >= 8"),
    ({"hnsw_dims": -1}, "hnsw_dims must be 0"),
    ({"k_default": 500}, "k_default must be between 1 and k_max"),
    ({"streams": ["camera", "events"]}, "streams must include 'summaries'"),
])
def test_bad_values_are_refused_by_name(values, message):
    with pytest.raises(ConfigError, match=message):
        MemoryConfig.from_mapping(values, env={})
