"""Graph work in the background: queries never wait for it, and say when they ran exactly."""

from __future__ import annotations

import json
import shutil
import threading

from engine_support import FakeClock, PoseBox, make_engine

from memory_node.core.types import Pose
from memory_node.core.vectors.faiss_index import GraphIndex

TEXTS = [f"note {i}: the {c} door near the {p}" for i, (c, p) in enumerate(
    (c, p) for c in ("red", "green", "blue", "white") for p in ("kitchen", "lab", "dock"))]
QUERY = '{"semantic_query": "a blue door", "k": 3}'


def saved_with_graph(root) -> dict:
    """A store of TEXTS whose graph is built and cached; QUERY's answer from it."""
    eng = make_engine(root, FakeClock(), PoseBox(Pose(0, 0)), hnsw_min_rows=5)
    for text in TEXTS:
        eng.save(text)
    assert eng.indexes.wait_for_graphs(60)
    want = json.loads(eng.search(QUERY))
    assert "notes" not in want
    eng.close()
    return want


def test_queries_answer_exactly_while_a_graph_is_built(tmp_path, monkeypatch):
    root = tmp_path / "m"
    want = saved_with_graph(root)
    shutil.rmtree(root / "index")  # the next start has to build the graph again

    gate = threading.Event()
    real_work = GraphIndex.work

    def held(self, *a, **k):  # the build takes "forever" until the test lets it go
        gate.wait(60)
        return real_work(self, *a, **k)

    monkeypatch.setattr(GraphIndex, "work", held)
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


def test_observations_with_precomputed_vectors(tmp_path):
    """`add_embedded`: rows embedded elsewhere (an import, a fleet peer) are stored and ranked
    like the engine's own; bad vectors store nothing."""
    import numpy as np
    import pytest
    from engine_support import minilm

    from memory_node.core.types import Observation

    eng = make_engine(tmp_path / "m", FakeClock(), PoseBox())
    texts = ["a red door in the hall", "a green plant by the window", "the charging dock"]
    vecs = np.asarray(minilm().embed_texts(texts)) * 3.0  # not unit length: normalised
    rows = [Observation(stream="imported", t=1000.0 + i, pose=Pose(i, 0), text=t)
            for i, t in enumerate(texts)]
    ids = eng.add_embedded(rows, vecs, minilm().model_id)
    res = json.loads(eng.search('{"stream": "imported", "semantic_query": "plant", "k": 1}'))
    assert res["results"][0]["id"] == ids[1]
    assert res["results"][0]["score"] == pytest.approx(
        float(vecs[1] / np.linalg.norm(vecs[1]) @ minilm().embed_texts(["plant"])[0]), abs=1e-5)
    assert [s["name"] for s in json.loads(eng.streams())["streams"]] == ["imported"]
    bad = [Observation(stream="imported", t=2000.0, pose=None, text="x")]
    with pytest.raises(ValueError, match="dimensions"):
        eng.add_embedded(bad, np.ones((1, 8)), minilm().model_id)
    with pytest.raises(ValueError, match="finite"):
        eng.add_embedded(bad, np.full((1, 384), np.nan), minilm().model_id)
    with pytest.raises(ValueError, match="one row per observation"):
        eng.add_embedded(bad, np.ones((2, 384)), minilm().model_id)
    assert json.loads(eng.streams())["streams"][0]["count"] == 3
    eng.close()
