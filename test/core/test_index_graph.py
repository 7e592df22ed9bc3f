"""Graph work in the background: queries never wait for it, and say when they ran exactly."""

from __future__ import annotations

import json
import shutil
import threading

from engine_support import FakeClock, PoseBox, make_engine

from memory_node.core.types import Pose
from memory_node.core.vectors.faiss_index import HNSWIndex

TEXTS = [f"note {i}: the {c} door near the {p}" for i, (c, p) in enumerate(
    (c, p) for c in ("red", "green", "blue", "white") for p in ("kitchen", "lab", "dock"))]
QUERY = '{"semantic_query": "a blue door", "k": 3}'


def test_queries_answer_exactly_while_a_graph_is_built(tmp_path, monkeypatch):
    root = tmp_path / "m"
    eng = make_engine(root, FakeClock(), PoseBox(Pose(0, 0)), hnsw_min_rows=5)
    for text in TEXTS:
        eng.save(text)
    assert eng.indexes.wait_for_graphs(60)
    want = json.loads(eng.search(QUERY))
    assert "notes" not in want
    eng.close()
    shutil.rmtree(root / "index")  # the next start has to build the graph again

    gate = threading.Event()
    real_work = HNSWIndex.work

    def held(self, *a, **k):  # the build takes "forever" until the test lets it go
        gate.wait(60)
        return real_work(self, *a, **k)

    monkeypatch.setattr(HNSWIndex, "work", held)
    eng = make_engine(root, FakeClock(), PoseBox(Pose(0, 0)), hnsw_min_rows=5)
    try:
        got = json.loads(eng.search(QUERY))  # answered now, not after the build
        assert got["results"] == want["results"]
        assert any("being built" in n and "events" in n for n in got["notes"])
        eng.save("the blue door of the garage")  # rows keep arriving meanwhile
        assert "garage" in json.loads(eng.search(QUERY))["results"][0]["text"]
    finally:
        gate.set()
    assert eng.indexes.wait_for_graphs(60)
    after = json.loads(eng.search(QUERY))
    assert "notes" not in after and "garage" in after["results"][0]["text"]
    eng.close()
