"""Engine configuration: one typed record, filled from YAML/ROS parameters with env fallbacks."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memory_node.core.streams import BUILTIN_STREAMS

NOTE_STREAMS = ("events", "summaries")
# The names a memory knows before any row exists: the built-in sensor kinds and the notes'.
# Which streams are sensor streams (thinned, evictable) is the registry's to say
# (core.streams.sensor_stream_names), not this default's.
DEFAULT_STREAMS = (*(k.name for k in BUILTIN_STREAMS), *NOTE_STREAMS)


# The fewest principal axes a graph may walk (hnsw_dims); as the graph index's.
MIN_GRAPH_DIMS = 8


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


# Settings that take one of a few values, and those values.
_CHOICES = {"hnsw_storage": ("sq8", "flat"), "hnsw_halves": (1, 2),
            "hnsw_ivf": ("auto", "prefer", "off"), "compact_clock": ("store", "clock")}


@dataclass(frozen=True)
class MemoryConfig:
    """Everything the engine needs; `identity()` is what makes two configurations 'the same'."""

    memory_dir: str = "./agent_memory"
    onnx_threads: int = 1
    # Embedding: a text model for notes and descriptions; camera frames are described by the
    # OpenCV heuristic describer and the description is embedded, unless `image_embedder` is
    # "clip" (then frames get CLIP image vectors from the configured ONNX files).
    text_embedder: str = "minilm"
    image_embedder: str = ""
    describer: str = "opencv"
    clip_image_model: str = ""
    clip_text_model: str = ""
    clip_tokenizer: str = ""
    # With describer "vlm": keyframes are stored with the heuristic text at once and a
    # background captioner replaces it with the model's caption for novel views, at most this
    # many requests in any minute.
    caption_max_per_min: float = 4.0
    # Query limits.
    k_default: int = 5
    k_max: int = 100
    max_query_bytes: int = 65536
    max_note_bytes: int = 32768
    streams: tuple[str, ...] = DEFAULT_STREAMS
    # Planner: exact scoring of candidate sets up to this size by gathering their vectors;
    # larger sets are scored by one matrix-vector product over the whole stream, then masked.
    exact_gather_max: int = 20000
    # Unfiltered semantic search uses one HNSW graph per embedding model, over all its
    # streams, once the model holds at least this many vectors; a `stream` restriction uses it
    # when those streams hold this many and a fifth of the graph, else scans them exactly
    # (efSearch grows with the graph: 1.5x above 50k vectors, 2.5x above 150k, 3x above
    # 500k). Storage "sq8": 8-bit codes in the graph (one value range for every dimension),
    # its best hnsw_rerank candidates re-scored with the float vectors; "flat": float copies.
    # Each graph calibrates itself in the background (once built, again after growing by a
    # quarter): it keeps the smallest efSearch and rerank depth whose recall@5, measured
    # against exact search on rows held out of it and recent queries, holds
    # hnsw_recall_target (0: no calibration). Until then, and for searches within some
    # streams, the grown hnsw_ef_search and hnsw_rerank serve.
    # hnsw_ivf: above 20k vectors an inverted file of 8-bit codes is kept beside the graph and
    # calibrated with it; "auto" lets the faster of the two that holds the target serve
    # unfiltered searches (the file is freed once the walk wins on 256 real queries),
    # "prefer" the file whenever it holds it, "off" keeps none (its 8-bit codes: 384 bytes a
    # 384-d vector).
    hnsw_ivf: str = "auto"
    hnsw_min_rows: int = 20000
    hnsw_m: int = 48
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 128
    hnsw_storage: str = "sq8"
    # The graph links and walks each vector's projection on its hnsw_dims principal axes
    # (fitted when it is built; 0: the whole vector); its candidates are re-scored with the
    # float vectors, and the calibration measures the recall that gives.
    hnsw_dims: int = 96
    # 2: each graph is two halves over alternate vectors, walked at once on two cores (a
    # machine with one core gets one graph); 1: one graph. Two pay for walks of whole
    # 384-d vectors (hnsw_dims 0), not for projected ones: handing a half over costs more.
    hnsw_halves: int = 1
    hnsw_rerank: int = 40
    hnsw_recall_target: float = 0.99
    index_persist_interval_s: float = 300.0
    # Near-duplicate notes (same meaning, same place, within a window) are folded on save.
    note_fold_similarity: float = 0.9
    note_fold_radius_m: float = 1.0
    note_fold_window_s: float = 60.0
    # Compaction.
    retention_s: float = 86400.0
    thin_cell_m: float = 1.0
    thin_cell_s: float = 300.0
    fold_similarity: float = 0.985
    fold_radius_m: float = 0.5
    fold_window_s: float = 30.0
    summary_age_s: float = 86400.0
    summary_max_notes: int = 200
    llm_timeout_s: float = 60.0
    # Compaction counts ages from "store": the newest recorded row (or the node clock when
    # that is earlier), so a replayed day-old recording is not all "old"; "clock": the node
    # clock as it is.
    compact_clock: str = "store"
    # Visits: pose samples further apart than this are a gap in the pose history (a visit
    # never spans one); also what splits a compaction cell's rows into visits.
    visit_gap_s: float = 30.0
    # Free space (MB) left on the memory directory's filesystem for everyone else: sensor rows
    # (camera, lidar, odom) are not stored while there is less; notes still are. 0 = none.
    disk_reserve_mb: float = 0.0
    # Running for weeks: the memory directory's size on disk in MiB (0: no budget; over it,
    # the oldest sensor data goes first, see core/budget.py), and how often compaction and
    # the budget run in the background (0: only on request).
    disk_budget_mb: float = 0.0
    compact_interval_s: float = 3600.0

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> MemoryConfig:
        """Build from a mapping (YAML, ROS parameters); unset keys fall back to env, then defaults.

        Unknown keys and wrong types raise ConfigError naming the key, so a typo in a YAML
        file is reported instead of silently ignored.
        """
        env = os.environ if env is None else env
        values = dict(values or {})
        kwargs: dict[str, Any] = {}
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"unknown configuration key(s): {', '.join(unknown)}")
        for name, fld in known.items():
            if name in values and values[name] is not None and values[name] != "":
                kwargs[name] = coerce_value(name, values[name], fld.default)
        if "memory_dir" not in kwargs and env.get("AGENT_MEMORY_DIR"):
            kwargs["memory_dir"] = env["AGENT_MEMORY_DIR"]
        if "onnx_threads" not in kwargs and env.get("MEMSEARCH_ONNX_THREADS"):
            kwargs["onnx_threads"] = coerce_value("onnx_threads", env["MEMSEARCH_ONNX_THREADS"], 1)
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    def replace(self, **changes: Any) -> MemoryConfig:
        cfg = dataclasses.replace(self, **changes)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.onnx_threads < 1:
            raise ConfigError("onnx_threads must be >= 1")
        if not 1 <= self.k_default <= self.k_max:
            raise ConfigError("k_default must be between 1 and k_max")
        if self.max_note_bytes < 1 or self.max_query_bytes < 1:
            raise ConfigError("max_note_bytes and max_query_bytes must be positive")
        for name in ("events", "summaries"):
            if name not in self.streams:
                raise ConfigError(f"streams must include '{name}'")
        for s in self.streams:
            if not s or not all(c.isalnum() or c in "_-" for c in s):
                raise ConfigError(f"stream name {s!r} must be letters, digits, '_' or '-'")
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                words = [f"'{a}'" for a in allowed]
                raise ConfigError(f"{name} must be {', '.join(words[:-1])} or {words[-1]}")
        self._validate_graph()
        if not self.visit_gap_s > 0:
            raise ConfigError("visit_gap_s must be > 0")
        if self.disk_reserve_mb < 0:
            raise ConfigError("disk_reserve_mb must be >= 0 (0: no reserve)")
        if self.disk_budget_mb < 0 or self.compact_interval_s < 0:
            raise ConfigError("disk_budget_mb and compact_interval_s must be >= 0 (0: off)")
        if not self.caption_max_per_min > 0:
            raise ConfigError("caption_max_per_min must be > 0")
        if self.image_embedder not in ("", "clip"):
            raise ConfigError("image_embedder must be '' (describe + text model) or 'clip'")

    def _validate_graph(self) -> None:
        if min(self.hnsw_m, self.hnsw_ef_construction, self.hnsw_ef_search,
               self.hnsw_rerank) < 1:
            raise ConfigError("hnsw_m, hnsw_ef_construction, hnsw_ef_search and hnsw_rerank "
                              "must be >= 1")
        if self.hnsw_dims < 0 or 0 < self.hnsw_dims < MIN_GRAPH_DIMS:
            raise ConfigError(f"hnsw_dims must be 0 (whole vectors) or >= {MIN_GRAPH_DIMS}")
        if not 0 <= self.hnsw_recall_target <= 1:
            raise ConfigError("hnsw_recall_target must be between 0 (no calibration) and 1")

    # ---- derived ------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return Path(self.memory_dir).expanduser()

    @property
    def db_path(self) -> Path:
        return self.root / "memory.db"

    @property
    def notes_dir(self) -> Path:
        return self.root / "notes"

    @property
    def index_dir(self) -> Path:
        return self.root / "index"

    @property
    def blobs_dir(self) -> Path:
        return self.root / "blobs"

    def identity(self) -> dict[str, Any]:
        """The values that decide whether a second configure is a no-op (all of them)."""
        d = dataclasses.asdict(self)
        d["memory_dir"] = str(self.root.resolve())
        return d


def coerce_value(name: str, value: Any, default: Any) -> Any:
    """Convert a YAML/parameter value to the type of the field's default, strictly."""
    try:
        if isinstance(default, bool):
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                return value.lower() in ("true", "1")
            raise TypeError
        if isinstance(default, int):
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, float) and not value.is_integer():
                raise TypeError
            return int(value)
        if isinstance(default, float):
            if isinstance(value, bool):
                raise TypeError
            out = float(value)
            if not math.isfinite(out):
                raise TypeError
            return out
        if isinstance(default, tuple):
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            return tuple(str(v) for v in value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"configuration key {name!r}: {value!r} is not a valid {type(default).__name__}"
        ) from None

