"""`MemoryEngine`: the one object that owns a memory directory and answers the JSON contract.

The ROS query server and the in-process agent client both wrap it, so docs/design.md's JSON
is implemented here once. Each operation has one name, the service's verb (search, save,
compact, streams): `ask_<verb>` answers the contract's models and `<verb>` the JSON text
(see "The contract's operations" below and docs/architecture.md). Sensor ingestion (the
recorder) goes through `add_stream_rows`, one method for every registered stream kind, and
`add_observation`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from memory_node.core.budget import DiskBudget
from memory_node.core.config import MemoryConfig
from memory_node.core.contract import (
    CompactAnswer,
    ErrorAnswer,
    SaveAnswer,
    SaveNote,
    SearchAnswer,
    SearchQuery,
    StreamsAnswer,
    VisitsAnswer,
)
from memory_node.core.disk import RateLimitedLog
from memory_node.core.errors import Unavailable
from memory_node.core.index_manager import IndexManager
from memory_node.core.ingest import Ingestor
from memory_node.core.notes import NotesLog
from memory_node.core.operations.edge import dumps, guard
from memory_node.core.operations.host import Clock, PoseProvider
from memory_node.core.operations.models import Models
from memory_node.core.operations.parts import EngineParts, local_parts
from memory_node.core.operations.repair import StartupRepair
from memory_node.core.places import Place, Places
from memory_node.core.planner import SearchBackend
from memory_node.core.query import SearchPlan, read_save, read_search
from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.types import Observation, Pose

log = logging.getLogger(__name__)
# A full disk is logged at most once per this many seconds, however many requests meet it.
DISK_LOG_PERIOD_S = 60.0


def _one_blas_thread() -> None:
    """Exact scoring is one matrix-vector product per query: split over threads it mostly
    waits for the other core, many times slower on a busy machine (bench/results/NOTES.md,
    finding 3)."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1, user_api="blas")
    except ImportError:  # optional: only speed depends on it
        log.debug("threadpoolctl not installed: BLAS keeps its default thread count")


_one_blas_thread()

PartsFactory = Callable[["MemoryEngine"], EngineParts]


class MemoryEngine:
    """Store + embedders + indexes + notes behind search/save/compact/streams: `ask_search`
    and the like answer the contract's models, `search` and the like their JSON text.

    A facade: it holds the open parts and the contract's names, and each operation is done
    by a part of core/operations/ (search resolution, visits, saving, streams, upkeep,
    storage, models). `parts` builds the parts that differ for a memory served from
    elsewhere (the fleet's); by default, those of a robot's own memory directory.

    `clock` gives "now" for "seconds ago" filters and note stamps (the ROS node clock, so
    simulated time works); `pose_provider` gives the robot's current pose for `save` and
    `near_here` (TF in the ROS server), or None when unknown.
    """

    # Contract fields whose feature this engine does not have: refused, never ignored.
    UNSUPPORTED_SEARCH = {
        "robot": "robot ids belong to a fleet store", "map": "maps belong to a fleet store",
    }

    def __init__(
        self,
        config: MemoryConfig | None = None,
        *,
        clock: Clock | None = None,
        pose_provider: PoseProvider | None = None,
        text_embedder: Any = None,
        image_embedder: Any = None,
        describer: Any = None,
        llm_settings: Any = "env",
        open_now: bool = True,
        captioner_options: dict[str, Any] | None = None,
        parts: PartsFactory | None = None,
    ):
        self.config = config or MemoryConfig.from_mapping({})
        self.clock: Clock = clock or time.time
        self.pose_provider: PoseProvider = pose_provider or (lambda: None)
        # Through the engine's own methods: a wrapper set on the engine applies everywhere.
        self.models = Models(lambda: self.config, text_embedder=text_embedder,
                             image_embedder=image_embedder, describer=describer,
                             captioner_options=captioner_options, store=lambda: self._store,
                             embed_texts=lambda texts: self._embed_texts(texts),
                             sync=lambda: self.sync())
        self._ingestor: Ingestor | None = None
        self._lazy_lock = threading.RLock()  # the ingestor, built on first use
        self._streams_cache: set[str] | None = None
        # A full disk said once a minute at most for the whole process (the recorder's
        # policy says its rows through this one too).
        self.disk_log = RateLimitedLog(log.warning, DISK_LOG_PERIOD_S)
        self.store: SqliteObservationStore | None = None
        self.indexes: IndexManager | None = None
        self.backend: SearchBackend[Any] | None = None  # what searches run over; None: closed
        self.notes: NotesLog | None = None
        self.places: Places | None = None
        self.disk: DiskBudget | None = None  # the store's size, and its budget when set
        self.repair = StartupRepair(self)  # what a crash or a full disk left half done
        self.parts: EngineParts = (parts or self._local_parts(llm_settings))(self)
        if open_now:
            self.open()

    @staticmethod
    def _local_parts(llm_settings: Any) -> PartsFactory:
        return lambda engine: local_parts(engine, engine.models, engine.repair, llm_settings)

    # ---- lifecycle ----------------------------------------------------------------------
    def open(self) -> None:
        """Open the memory: the store, the models and the indexes (see the storage part).

        Raises on failure (a missing model, an unwritable directory) so a lifecycle
        `configure` can refuse to activate with the reason.
        """
        self.parts.storage.open()

    @property
    def serves(self) -> str:
        """What the engine answers from, for a server's start line."""
        return self.parts.storage.serves

    def close(self) -> bool:
        """Close the memory. True when the index cache was written; False when it was not
        (another process held it, a write failed, or there is none), in which case the next
        start loads the previous cache and catches up from memory.db."""
        return self.parts.storage.close()

    # What an open engine holds: each raises Unavailable once the engine is closed (a request
    # that races close() answers "unavailable" instead of failing on None).
    def _open(self, part: Any) -> Any:
        if part is None:
            raise Unavailable("the memory store is closed")
        return part

    @property
    def _backend(self) -> SearchBackend[Any]:
        return self._open(self.backend)

    @property
    def _store(self) -> SqliteObservationStore:
        return self._open(self.store)

    @property
    def _indexes(self) -> IndexManager:
        return self._open(self.indexes)

    @property
    def _notes(self) -> NotesLog:
        return self._open(self.notes)

    @property
    def _places(self) -> Places:
        return self._open(self.places)

    @property
    def _disk(self) -> DiskBudget:
        return self._open(self.disk)

    @property
    def _maintenance(self) -> Any:
        """The background compaction job, when one runs (compact_interval_s > 0)."""
        return getattr(self.parts.compact, "job", None)

    def __enter__(self) -> MemoryEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- models -------------------------------------------------------------------------
    @property
    def text_model_id(self) -> str:
        return self.models.text_model_id

    @property
    def _image_embedder(self) -> Any:
        return self.models.image_embedder

    @property
    def describer(self) -> Any:
        return self.models.describer

    def captioner(self) -> Any:
        """The background captioner when the describer is a vision-language model (built on
        first use; None otherwise)."""
        return self.models.captioner()

    def camera_model_id(self) -> str:
        """The model camera rows are embedded with now: CLIP's, else the text model's."""
        return self.models.camera_model_id()

    def reembed_pending(self) -> int:
        """Camera rows still carrying another model's vectors than the configured one."""
        return self.parts.storage.reembed_pending()

    def _embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return self.models.embed_texts(texts)

    def query_vector(self, model_id: str, text: str) -> np.ndarray | None:
        """The query embedding for one model, cached (agents repeat their questions)."""
        return self.models.query_vector(model_id, text)

    # ---- JSON contract: the edge --------------------------------------------------------
    def _guard(self, fn: Callable[[], Any], what: str) -> Any:
        """Run one request: its typed answer with took_ms, or an ErrorAnswer; never raises."""
        return guard(self, fn, what)

    # The contract's operations. One name per operation, the service's verb: search, save,
    # compact, streams.
    #   ask_<verb>(query) -> the contract's answer model (an ErrorAnswer on failure, never
    #     raises); search and save take the request model or the request text, read with
    #     this engine's limits (a parse error is the ErrorAnswer the text call answers).
    #   <verb>(text) -> docs/design.md's JSON as the ROS service carries it: ask_<verb>
    #     dumped.
    #   _<verb>(model) -> the answer model, raising ContractError: the part's (`parts`).
    # EngineClient and RosClient (agent/) answer the same ask_<verb> and <verb> names; the
    # fleet engine passes the parts it answers otherwise with.
    def ask_search(self, query: SearchQuery | str
                   ) -> SearchAnswer | VisitsAnswer | ErrorAnswer:
        """A search as the contract's models; `query` as a model or the request text."""
        return self._guard(lambda: self._search(
            query if isinstance(query, SearchQuery) else self.read_search(query)), "search")

    def ask_save(self, note: SaveNote | str) -> SaveAnswer | ErrorAnswer:
        """A save as the contract's models; `note` as a model or the request text."""
        return self._guard(lambda: self._save(
            note if isinstance(note, SaveNote) else self.read_save(note)), "save")

    def ask_compact(self) -> CompactAnswer | ErrorAnswer:
        """One compaction pass as the contract's model."""
        return self._guard(self._compact, "compact")

    def ask_streams(self) -> StreamsAnswer | ErrorAnswer:
        """The streams and named places as the contract's model."""
        return self._guard(self._streams, "streams")

    # The JSON strings of docs/design.md (the ROS server's and ROS clients' path).
    def search(self, query: str) -> str:
        return dumps(self.ask_search(query))

    def save(self, note: str) -> str:
        return dumps(self.ask_save(note))

    def compact(self) -> str:
        return dumps(self.ask_compact())

    def streams(self) -> str:
        return dumps(self.ask_streams())

    def read_search(self, query: str) -> SearchQuery:
        return read_search(query, max_bytes=self.config.max_query_bytes)

    def read_save(self, note: str) -> SaveNote:
        return read_save(note, max_bytes=self.config.max_note_bytes)

    def _search(self, query: SearchQuery) -> SearchAnswer | VisitsAnswer:
        return self.parts.search.answer(query)

    def _save(self, note: SaveNote) -> SaveAnswer:
        return self.parts.save.save(note)

    def _compact(self) -> CompactAnswer:
        return self.parts.compact.compact()

    def _streams(self) -> StreamsAnswer:
        return self.parts.streams.answer()

    # ---- search ---------------------------------------------------------------------------
    def known_streams(self) -> set[str]:
        """Configured streams and every stream with rows. Cached: a search only looks the
        database up again when it names a stream the cache does not know."""
        if self._streams_cache is None:
            self._streams_cache = set(self.config.streams) | self._backend.stream_names()
        return self._streams_cache

    def has_stream(self, name: str) -> bool:
        """Whether `name` is a stream; a miss refreshes the cache once (another process may
        have written a new stream)."""
        if name in self.known_streams():
            return True
        self._streams_cache = None
        return name in self.known_streams()

    def plan(self, query: SearchQuery) -> SearchPlan:
        """Resolve a search against the clock, the streams, the tags, the named places and
        the current pose."""
        return self.parts.search.plan(query)

    def place(self, name: str) -> Place:
        """The named place, or BadRequest naming the places there are."""
        return self.parts.search.place(name)

    def parse_search(self, query: str) -> SearchPlan:
        """A payload straight to a plan (benchmarks time the two halves apart)."""
        return self.plan(self.read_search(query))

    def run_search(self, req: SearchPlan) -> tuple[list[tuple[Any, float | None]], list[str]]:
        """A resolved plan's rows (the backend's: an Observation here) and scores, and notes
        for the answer: the one planner over this engine's backend."""
        return self.parts.search.run(req)

    def run_visits(self, plan: SearchPlan) -> VisitsAnswer:
        """Visits to the plan's circle within its time window: the planner over this
        engine's backend, as search."""
        return self.parts.visits.run(plan)

    def mark_recording_clock(self, simulated: bool) -> None:
        """Say which clock the rows are being recorded on (the recorder, at start): a store
        recorded on simulated time is compacted counting ages from its own newest row, not
        from the clock of whatever process opens it later (see compact_clock)."""
        self._store.set_meta("recorded_clock", "sim" if simulated else "wall")

    # ---- ingestion (recorder) ---------------------------------------------------------------
    def sync(self) -> int:
        """Catch up with rows other threads or processes added; returns vectors applied."""
        return self._indexes.sync()

    @property
    def ingestor(self) -> Ingestor:
        if self._ingestor is not None:
            return self._ingestor
        with self._lazy_lock:
            if self._ingestor is None:
                self._ingestor = Ingestor(
                    self._store, self.config.root, embed_texts=self._embed_texts,
                    text_model_id=lambda: self.text_model_id,
                    image_embedder=lambda: self._image_embedder,
                    describer=lambda: self.describer, sync=self.sync,
                    captioner=self.captioner)
        return self._ingestor

    def write_blob(self, stream: str, t: float, data: bytes, ext: str) -> str:
        return self.ingestor.write_blob(stream, t, data, ext)

    def add_observation(self, stream: str, t: float, pose: Pose | None,
                        tags: dict[str, Any] | None = None, text: str = "",
                        blob: bytes | None = None, blob_ext: str = "bin",
                        embed: bool = True) -> int:
        """Store one observation; its text (if any) is embedded with the text model."""
        return self.ingestor.add_observation(stream, t, pose, tags, text, blob, blob_ext, embed)

    def add_embedded(self, observations: Sequence[Observation], vectors: Any,
                     model_id: str) -> list[int]:
        """Store observations whose vectors were computed elsewhere (an import from another
        store, a fleet peer, a benchmark), in one transaction, and index them.

        `vectors` is an (n, dim) array, one row per observation, from the embedding model
        `model_id` (vectors of one model share an index; searches with a `semantic_query`
        rank them when that model is loaded here). Rows are L2-normalised here (scores are
        cosine similarities); a dimension other than the model's existing vectors, a
        non-finite or zero row raise ValueError and store nothing. Returns the new ids."""
        vecs = np.asarray(vectors, np.float32)
        if vecs.ndim != 2 or len(vecs) != len(observations):
            raise ValueError("vectors must be an (n, dim) array, one row per observation")
        if not isinstance(model_id, str) or not model_id:
            raise ValueError("model_id must be a non-empty string")
        if len(vecs) == 0:
            return []
        if not np.isfinite(vecs).all():
            raise ValueError("vectors must be finite")
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        if (norms == 0).any():
            raise ValueError("a zero vector has no direction to rank by")
        dim = self._indexes.dim_of(model_id)
        if dim is not None and vecs.shape[1] != dim:
            raise ValueError(f"{model_id} vectors here have {dim} dimensions, not "
                             f"{vecs.shape[1]}")
        vecs = vecs / norms
        for obs in observations:
            obs.model_id = model_id
        ids = self._store.insert(list(observations), list(vecs))
        self._streams_cache = None
        self.sync()
        return ids

    def add_stream_rows(self, stream: str, payloads: Sequence[Any]) -> list[int]:
        """Store payloads of a registered sensor stream the way its kind says
        (core/streams.py, core/stream_rows.py): `CameraFrame`s (one batch: one embed call, one
        transaction), `LidarScan`s or `SensorRow`s. One path for every kind, so a new one adds
        no method here. Returns the new ids."""
        return self.ingestor.add(stream, payloads)

    def prepare_stream_row(self, stream: str, payload: Any) -> None:
        """The CPU-heavy part of storing one payload (a frame's description and JPEG) now, on
        the calling thread (thread-safe); `add_stream_rows` then only embeds and stores it."""
        self.ingestor.prepare(stream, payload)
