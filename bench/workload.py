"""The benchmark workload: a robot's memory over a few days, and the queries an agent asks.

Rows follow one trajectory through a 50 m x 50 m area during working hours on three days, in
streams camera / lidar / odom / events, times increasing. Every row carries a 384-d vector:
either MiniLM embeddings of generated texts (describer-like captions, scan and odometry
summaries, notes) or synthetic vectors drawn from a low-dimensional clustered model (used at
1M, where embedding a million texts on two cores is out of reach), or ("overlap") the same
model with clusters that overlap: harder for an approximate index, so that a recall of 1.000
cannot come from clusters being far apart alone, or ("separated") well-separated clusters (a
row's 10 nearest rows lie in its own cluster). Stores are generated once
and cached under `bench/.cache/` keyed by vectors + scale + seed.
"""

from __future__ import annotations

import json
import math
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.common import CACHE_DIR

DIM = 384
STREAMS = ("camera", "lidar", "odom", "events")
STREAM_P = (0.35, 0.25, 0.35, 0.05)
T0 = 1_764_000_000.0  # 2025-11-24 16:00 UTC; only differences matter
DAYS = 3
ACTIVE_H = 12.0  # the robot works 12 h a day
AREA = 25.0  # positions in [-25, 25] m on both axes
SYNTH_MODEL_ID = "bench-synthetic-384"
OVERLAP_MODEL_ID = "bench-overlap-384"
SEPARATED_MODEL_ID = "bench-separated-384"
VECTOR_KINDS = ("minilm", "synthetic", "overlap", "separated")
SYNTHETIC_KINDS = {"synthetic": SYNTH_MODEL_ID, "overlap": OVERLAP_MODEL_ID,
                   "separated": SEPARATED_MODEL_ID}
STORE_VERSION = "3"  # memory.db schema 2: vectors in their own table

_BRIGHT = ("bright", "dim", "dark")
_COLORS = ("red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink", "brown",
           "white", "grey", "black")
_PEOPLE = ("no people", "one person", "two people", "a group of people")
_OBJECTS = ("door", "chair", "table", "box", "shelf", "plant", "window", "robot charger",
            "trash bin", "sofa", "desk", "monitor", "fridge", "sink", "cabinet", "ladder",
            "cart", "pallet", "fire extinguisher", "bicycle", "backpack", "umbrella", "lamp",
            "whiteboard", "printer", "coffee machine", "toolbox", "cable reel", "cone", "sign")
_PLACES = ("kitchen", "hallway", "lab", "charging dock", "front door", "office", "workshop",
           "storage room", "meeting room", "lobby", "corridor B", "loading bay", "stairwell",
           "server room", "break room", "garden door", "reception", "mail room")
_ACTIONS = ("checked it", "it was blocking the way", "someone asked about it",
            "moved it aside", "took a photo", "will come back later", "reported it",
            "looked fine", "needs cleaning", "left it as it was")


@dataclass
class Dataset:
    """Parallel arrays, one entry per row; row i has observation id i + 1 in the store."""

    n: int
    seed: int
    vectors_kind: str
    model_id: str
    stream: np.ndarray  # int8 code into STREAMS
    t: np.ndarray  # float64 seconds
    x: np.ndarray
    y: np.ndarray
    yaw: np.ndarray
    vecs: np.ndarray  # (n, DIM) float32, unit rows
    texts: list[str] | None = None

    @property
    def ids(self) -> np.ndarray:
        return np.arange(1, self.n + 1, dtype=np.int64)

    @property
    def now(self) -> float:
        """The engine clock during queries: one minute after the last row."""
        return float(self.t[-1]) + 60.0


# ---- geometry and time ------------------------------------------------------------------------
def _times(n: int, rng: np.random.Generator) -> np.ndarray:
    """n increasing stamps spread over the working hours of DAYS days."""
    active = DAYS * ACTIVE_H * 3600.0
    u = np.sort(rng.uniform(0.0, active, n))
    day = np.floor(u / (ACTIVE_H * 3600.0))
    return T0 + day * 86400.0 + (u - day * ACTIVE_H * 3600.0)


def _trajectory(t: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A smooth random walk at ~0.4 m/s, reflected at the walls, sampled at the row times."""
    active_s = (t - T0) % 86400.0 + np.floor((t - T0) / 86400.0) * ACTIVE_H * 3600.0
    step = 2.0  # seconds per integration step
    nsteps = int(active_s[-1] / step) + 2
    turn = rng.normal(0.0, 0.15, nsteps)
    heading = np.cumsum(turn)
    speed = 0.4 * (rng.uniform(size=nsteps) > 0.2)  # stops now and then
    dx = np.cos(heading) * speed * step
    dy = np.sin(heading) * speed * step
    px = _reflect(np.cumsum(dx) + rng.uniform(-AREA, AREA))
    py = _reflect(np.cumsum(dy) + rng.uniform(-AREA, AREA))
    idx = np.minimum((active_s / step).astype(np.int64), nsteps - 1)
    x = px[idx] + rng.normal(0.0, 0.05, len(t))
    y = py[idx] + rng.normal(0.0, 0.05, len(t))
    yaw = np.mod(heading[idx] + math.pi, 2 * math.pi) - math.pi
    return x, y, yaw


def _reflect(v: np.ndarray) -> np.ndarray:
    """Fold an unbounded coordinate into [-AREA, AREA] (a walk bouncing off the walls)."""
    w = 4 * AREA
    m = np.mod(v + AREA, w)
    return np.where(m <= 2 * AREA, m, w - m) - AREA


# ---- texts ----------------------------------------------------------------------------------
def row_text(i: int, stream: str, rng: np.random.Generator) -> str:
    """A caption like the ones the recorder stores for each stream."""
    place = _PLACES[rng.integers(len(_PLACES))]
    if stream == "camera":
        cols = rng.choice(len(_COLORS), size=int(rng.integers(1, 4)), replace=False)
        objs = rng.choice(len(_OBJECTS), size=int(rng.integers(1, 3)), replace=False)
        return (f"{_BRIGHT[rng.integers(3)]} scene; {', '.join(_COLORS[c] for c in cols)}; "
                f"{_PEOPLE[rng.integers(len(_PEOPLE))]}; "
                f"{' and '.join(_OBJECTS[o] for o in objs)} near the {place}")
    if stream == "lidar":
        kind = ("open", "cluttered", "narrow")[rng.integers(3)]
        side = ("ahead", "left", "right", "behind")[rng.integers(4)]
        return (f"lidar scan: {kind} space in the {place}, nearest obstacle "
                f"{rng.uniform(0.2, 8):.1f} m {side}, {int(rng.integers(2000, 30000))} points")
    if stream == "odom":
        motion = ("moving forward", "turning left", "turning right", "stopped", "reversing")
        return (f"odometry: {motion[rng.integers(5)]} at {rng.uniform(0, 1.2):.2f} m/s "
                f"heading {int(rng.integers(0, 360))} degrees in the {place}")
    obj = _OBJECTS[rng.integers(len(_OBJECTS))]
    return f"Saw a {_COLORS[rng.integers(12)]} {obj} near the {place}; " \
           f"{_ACTIONS[rng.integers(len(_ACTIONS))]}. (note {i})"


def query_texts(n: int, seed: int) -> list[str]:
    """Questions an agent asks; every one names things the captions can contain."""
    rng = np.random.default_rng(seed + 7)
    out = []
    forms = ("where did I see a {c} {o}", "{p} near the {o} in the {pl}",
             "{o} by the {pl}", "a {b} room with a {c} {o}", "did someone leave a {o} at the {pl}")
    seen: set[str] = set()
    while len(out) < n:
        f = forms[rng.integers(len(forms))]
        text = f.format(c=_COLORS[rng.integers(12)], o=_OBJECTS[rng.integers(30)],
                        pl=_PLACES[rng.integers(len(_PLACES))],
                        p=_PEOPLE[1 + rng.integers(3)], b=_BRIGHT[rng.integers(3)])
        if text not in seen:  # one vector per text: the engine looks queries up by text
            seen.add(text)
            out.append(text)
    return out


# ---- vectors --------------------------------------------------------------------------------
class SyntheticModel:
    """Clustered vectors on a low-dimensional manifold: centres plus a 32-d latent spread
    and a little isotropic noise, so neighbourhoods look like sentence embeddings (unlike
    uniform noise, on which no ANN index can do well).

    `overlap`: centres at a third of the distance (norm 0.35 instead of 1) and three times
    the isotropic noise, so a row's cluster no longer decides its neighbours (2% of a query's
    10 nearest rows share its cluster, against 43% without overlap, at 30k rows), and the
    noise adds dimensions the graph must resolve.

    `separated`: a third of the latent spread, so clusters stand apart (99% of a query's 10
    nearest rows share its cluster at 30k rows, against 50% for the default)."""

    def __init__(self, seed: int, clusters: int = 1024, latent: int = 32,
                 overlap: bool = False, separated: bool = False):
        rng = np.random.default_rng(seed + 1)
        self.centers = _unit(rng.normal(size=(clusters, DIM)).astype(np.float32))
        self.basis = (rng.normal(size=(latent, DIM)) / math.sqrt(DIM)).astype(np.float32)
        pop = 1.0 / np.arange(1, clusters + 1) ** 0.7  # some topics are common
        self.pop = pop / pop.sum()
        self.latent = latent
        self.centre_norm, self.noise = (0.35, 0.45) if overlap else (1.0, 0.15)
        self.spread = 0.1 if separated else 0.3

    @classmethod
    def of_kind(cls, seed: int, kind: str) -> SyntheticModel:
        return cls(seed, overlap=kind == "overlap", separated=kind == "separated")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        c = rng.choice(len(self.centers), size=n, p=self.pop)
        z = rng.normal(size=(n, self.latent)).astype(np.float32) * self.spread
        noise = rng.normal(size=(n, DIM)).astype(np.float32) * (self.noise / math.sqrt(DIM))
        return _unit(self.centre_norm * self.centers[c] + z @ self.basis + noise)


def _unit(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float32)
    return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)


def minilm_embedder(threads: int = 2):  # noqa: ANN201 - MiniLMEmbedder, imported lazily
    from memory_node.core.embedders.minilm import MiniLMEmbedder

    return MiniLMEmbedder(onnx_threads=threads, batch_size=64)


def embed_cached(texts: list[str], tag: str, log=print) -> np.ndarray:  # noqa: ANN001
    """MiniLM vectors of `texts`, cached by tag: embedding 100k texts takes minutes here."""
    path = CACHE_DIR / f"emb_{tag}.npy"
    if path.exists():
        arr = np.load(path)
        if len(arr) == len(texts):
            return arr
    emb = minilm_embedder()
    out = np.empty((len(texts), DIM), np.float32)
    t0 = time.perf_counter()
    chunk = 4096
    for s in range(0, len(texts), chunk):
        out[s:s + chunk] = emb.embed_texts(texts[s:s + chunk])
        done = min(s + chunk, len(texts))
        if len(texts) > chunk:
            rate = done / (time.perf_counter() - t0)
            log(f"  embedded {done}/{len(texts)} texts ({rate:.0f}/s)")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    np.save(path, out)
    return out


# ---- dataset --------------------------------------------------------------------------------
def make_dataset(n: int, seed: int, vectors_kind: str, log=print) -> Dataset:  # noqa: ANN001
    rng = np.random.default_rng(seed)
    t = _times(n, rng)
    x, y, yaw = _trajectory(t, rng)
    stream = rng.choice(len(STREAMS), size=n, p=STREAM_P).astype(np.int8)
    texts: list[str] | None = None
    if vectors_kind == "minilm":
        trng = np.random.default_rng(seed + 3)
        texts = [row_text(i, STREAMS[s], trng) for i, s in enumerate(stream.tolist())]
        vecs = embed_cached(texts, f"rows_{seed}_{n}", log)
        from memory_node.core.embedders.minilm import MODEL_ID

        model_id = MODEL_ID
    elif vectors_kind in SYNTHETIC_KINDS:
        model = SyntheticModel.of_kind(seed, vectors_kind)
        vrng = np.random.default_rng(seed + 5)
        vecs = np.empty((n, DIM), np.float32)
        for s in range(0, n, 100_000):
            vecs[s:s + 100_000] = model.sample(min(100_000, n - s), vrng)
        model_id = SYNTHETIC_KINDS[vectors_kind]
    else:
        raise ValueError(f"unknown vectors kind {vectors_kind!r}")
    return Dataset(n=n, seed=seed, vectors_kind=vectors_kind, model_id=model_id, stream=stream,
                   t=t, x=x, y=y, yaw=yaw, vecs=vecs, texts=texts)


def query_vectors(ds: Dataset, nq: int) -> tuple[list[str], np.ndarray]:
    """Query strings and their vectors (MiniLM for text datasets, the model otherwise)."""
    texts = query_texts(nq, ds.seed)
    if ds.vectors_kind == "minilm":
        return texts, embed_cached(texts, f"queries_{ds.seed}_{nq}")
    model = SyntheticModel.of_kind(ds.seed, ds.vectors_kind)
    return texts, model.sample(nq, np.random.default_rng(ds.seed + 11))


# ---- the store ------------------------------------------------------------------------------
def store_dir(n: int, seed: int, vectors_kind: str) -> Path:
    return CACHE_DIR / f"store_v{STORE_VERSION}_{vectors_kind}_{n}_{seed}"


def save_arrays(ds: Dataset, d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    np.savez(d / "arrays.npz", stream=ds.stream, t=ds.t, x=ds.x, y=ds.y, yaw=ds.yaw)
    np.save(d / "vectors.npy", ds.vecs)
    (d / "model_id").write_text(ds.model_id)


def load_dataset(n: int, seed: int, vectors_kind: str) -> Dataset:
    d = store_dir(n, seed, vectors_kind)
    a = np.load(d / "arrays.npz")
    vecs = np.load(d / "vectors.npy", mmap_mode="r")
    return Dataset(n=n, seed=seed, vectors_kind=vectors_kind,
                   model_id=(d / "model_id").read_text(), stream=a["stream"], t=a["t"],
                   x=a["x"], y=a["y"], yaw=a["yaw"], vecs=np.ascontiguousarray(vecs))


class LookupEmbedder:
    """A text embedder that answers known query strings from a table (any other text gets a
    deterministic pseudo-random unit vector): engine-level figures then exclude embedding,
    which is measured on its own."""

    dim = DIM

    def __init__(self, model_id: str, table: dict[str, np.ndarray] | None = None):
        self.model_id = model_id
        self.table = dict(table or {})

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        out = np.empty((len(texts), DIM), np.float32)
        for i, text in enumerate(texts):
            v = self.table.get(text)
            if v is None:
                rng = np.random.default_rng(zlib.crc32(text.encode("utf-8")))
                v = _unit(rng.normal(size=(1, DIM)))[0]
            out[i] = v
        return out


def build_store(n: int, seed: int, vectors_kind: str, log=print) -> Path:  # noqa: ANN001
    """Generate (or reuse) the cached store: memory.db + a persisted index/ + the arrays."""
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine
    from memory_node.core.types import Observation, Pose

    d = store_dir(n, seed, vectors_kind)
    if (d / "complete").exists():
        _refresh_index(d, log)
        return d
    if d.exists():
        shutil.rmtree(d)
    t0 = time.perf_counter()
    ds = make_dataset(n, seed, vectors_kind, log)
    log(f"  dataset generated in {time.perf_counter() - t0:.1f} s")
    mem = d / "memory"
    cfg = MemoryConfig.from_mapping({"memory_dir": str(mem)})
    emb = LookupEmbedder(ds.model_id)
    eng = MemoryEngine(cfg, clock=lambda: ds.now, text_embedder=emb, llm_settings=None)
    t1 = time.perf_counter()
    batch = 50_000
    texts = ds.texts
    for s in range(0, n, batch):
        e = min(n, s + batch)
        rows = []
        for i in range(s, e):
            st = STREAMS[ds.stream[i]]
            rows.append(Observation(
                stream=st, t=float(ds.t[i]),
                pose=Pose(x=float(ds.x[i]), y=float(ds.y[i]), yaw=float(ds.yaw[i]),
                          source="tf"),
                tags={"brightness": round(float((i * 7919) % 1000) / 1000, 3)},
                text=texts[i] if texts else f"{st} observation {i}"))
        ids = eng.add_embedded(rows, ds.vecs[s:e], ds.model_id)
        if ids[0] != s + 1:
            raise RuntimeError(f"store ids do not start at 1 (got {ids[0]} for row {s})")
    log(f"  inserted {n} rows in {time.perf_counter() - t1:.1f} s")
    t2 = time.perf_counter()
    eng.close()
    shutil.rmtree(mem / "index", ignore_errors=True)
    # Reopen: the index is rebuilt from memory.db (HNSW above hnsw_min_rows), then persisted.
    eng = MemoryEngine(cfg, clock=lambda: ds.now, text_embedder=emb, llm_settings=None)
    build_graphs(eng)
    eng.close()
    rebuild_s = time.perf_counter() - t2
    log(f"  index built and persisted in {rebuild_s:.1f} s")
    save_arrays(ds, d)
    (d / "index_settings.json").write_text(json.dumps(_index_settings()))
    (d / "build.json").write_text(json.dumps({
        "insert_s": round(t2 - t1, 1), "rebuild_and_persist_s": round(rebuild_s, 1),
        "note": "measured when this cached store was built"}))
    (d / "complete").write_text(f"{time.time()}\n")
    return d


def build_graphs(eng) -> None:  # noqa: ANN001 - a MemoryEngine, imported lazily
    """Build every graph now on this thread, on every core. The engine's background worker
    runs at the lowest priority, which on a busy shared machine (a load of 10 on 2 cores)
    stretched a 25k-row build to 8 minutes; a benchmark's set-up need not yield."""
    eng.indexes.close()  # stop the worker: one build at a time
    for graph in eng.indexes.graphs().values():
        if len(graph) >= graph.min_rows:
            graph.build()


def _index_settings() -> dict[str, object]:
    from memory_node.core.config import MemoryConfig

    c = MemoryConfig()
    return {"m": c.hnsw_m, "ef_construction": c.hnsw_ef_construction,
            "storage": c.hnsw_storage, "min_rows": c.hnsw_min_rows}


def _refresh_index(d: Path, log=print) -> None:  # noqa: ANN001
    """A cached store whose index/ was persisted with other HNSW settings gets its graphs
    rebuilt and persisted once, instead of in every section that opens it."""
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    marker = d / "index_settings.json"
    want = _index_settings()
    if marker.exists() and json.loads(marker.read_text()) == want:
        return
    ds_model = (d / "model_id").read_text().strip()
    t0 = time.perf_counter()
    cfg = MemoryConfig.from_mapping({"memory_dir": str(d / "memory")})
    eng = MemoryEngine(cfg, text_embedder=LookupEmbedder(ds_model), llm_settings=None)
    build_graphs(eng)
    eng.close()  # persists the index
    log(f"  index of {d.name} refreshed for {want} in {time.perf_counter() - t0:.1f} s")
    marker.write_text(json.dumps(want))


def copy_store(src: Path, dst: Path, with_index: bool = True) -> Path:
    """A scratch copy of a cached store's memory directory (sections that write use it)."""
    if dst.exists():
        shutil.rmtree(dst)
    ignore = None if with_index else shutil.ignore_patterns("index", "index.*")
    shutil.copytree(src / "memory", dst, ignore=ignore)
    return dst
