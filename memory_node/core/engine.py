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
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pydantic_core import to_json

from memory_node.core.budget import DiskBudget
from memory_node.core.catch_up import CatchUp
from memory_node.core.compaction import Compactor
from memory_node.core.config import NOTE_STREAMS, MemoryConfig
from memory_node.core.contract import (
    DEFAULT_RADIUS,
    CompactAnswer,
    ErrorAnswer,
    IndexInfo,
    PlaceInfo,
    Reply,
    SaveAnswer,
    SaveNote,
    SearchAnswer,
    SearchQuery,
    StreamInfo,
    StreamsAnswer,
    Visit,
    VisitsAnswer,
    pose_out,
    unknown_name,
)
from memory_node.core.disk import RateLimitedLog, disk_full_text, is_disk_full
from memory_node.core.errors import BadRequest, ContractError, InternalError, Unavailable
from memory_node.core.index_manager import IndexManager
from memory_node.core.ingest import Ingestor
from memory_node.core.local_backend import LocalBackend
from memory_node.core.maintenance import Maintenance
from memory_node.core.notes import NoteEntry, NotesLog, new_key
from memory_node.core.places import PLACES_STREAM, Place, Places, place_entry
from memory_node.core.planner import EMPTY_WINDOW, QueryPlanner, SearchBackend
from memory_node.core.query import (
    SaveRequest,
    SearchPlan,
    check_tag_names,
    plan_search,
    read_save,
    read_search,
)
from memory_node.core.store.pose_index import PoseExcerpt
from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.types import Observation, Pose, RowFilter
from memory_node.core.visits import VisitSpan, find_visits, find_visits_in, gap_notes

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

Clock = Callable[[], float]
PoseProvider = Callable[[], "Pose | None"]


class _StreamNames:
    """The stream names a search may use; a miss refreshes the engine's cache once (another
    process may have written a new stream), so validation stays off the database."""

    def __init__(self, engine: MemoryEngine):
        self.engine = engine

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.engine.has_stream(name)

    def __len__(self) -> int:
        return len(self.engine.known_streams())

    def __iter__(self):
        return iter(self.engine.known_streams())


def _origin(exc: BaseException) -> str:
    """file:line where an exception was raised (its innermost traceback frame)."""
    tb = exc.__traceback__
    if tb is None:
        return "?"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"


def dumps(answer: Any) -> str:
    """An answer (a model, or its dict) as the JSON text the services send: one line, UTF-8,
    compact, a NaN or infinity as null (always valid JSON). Serialized by pydantic-core, not
    `json`: a model straight to text, with no Python dict in between (several times faster:
    bench/results/NOTES.md, finding 19)."""
    if isinstance(answer, dict):
        return to_json(answer, inf_nan_mode="null").decode()
    if isinstance(answer, Reply):
        return answer.json_text()
    return answer.model_dump_json()


class MemoryEngine:
    """Store + embedders + indexes + notes behind search/save/compact/streams: `ask_search`
    and the like answer the contract's models, `search` and the like their JSON text.

    `clock` gives "now" for "seconds ago" filters and note stamps (the ROS node clock, so
    simulated time works); `pose_provider` gives the robot's current pose for `save` and
    `near_here` (TF in the ROS server), or None when unknown.
    """

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
    ):
        self.config = config or MemoryConfig.from_mapping({})
        self.clock: Clock = clock or time.time
        self.pose_provider: PoseProvider = pose_provider or (lambda: None)
        self._text_embedder = text_embedder
        self._image_embedder = image_embedder
        self._describer = describer
        self._captioner_options = dict(captioner_options or {})  # a clock, a policy (tests)
        self._llm_settings = llm_settings
        self._qcache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._qcache_lock = threading.Lock()
        self._compact_lock = threading.Lock()
        self._ingestor: Ingestor | None = None
        self._captioner: Any = None
        self._reembedder: Any = None
        self._reembed_done = False
        self._reembed_checked = -1e9
        self._reembed_count = 0
        self._captioner_lock = threading.Lock()
        self._lazy_lock = threading.RLock()  # the describer and the ingestor, built on first use
        self._streams_cache: set[str] | None = None
        # Notes: a save's Markdown append and insert, and the catch-up of notes kept in
        # Markdown but not in memory.db (a full disk), one at a time (one row per note).
        self._notes_lock = threading.Lock()
        self.catch_up = CatchUp(self._catch_up_notes, "notes")
        # A full disk said once a minute at most for the whole process (the recorder's
        # policy says its rows through this one too).
        self.disk_log = RateLimitedLog(log.warning, DISK_LOG_PERIOD_S)
        self.store: SqliteObservationStore | None = None
        self.indexes: IndexManager | None = None
        self.backend: SearchBackend[Any] | None = None  # what searches run over; None: closed
        self.notes: NotesLog | None = None
        self.places: Places | None = None
        self.disk: DiskBudget | None = None  # the store's size, and its budget when set
        self._maintenance: Maintenance | None = None
        if open_now:
            self.open()

    # ---- lifecycle ----------------------------------------------------------------------
    def open(self) -> None:
        """Create the directory, open the store, load models and build or load the indexes.

        Raises on failure (a missing model, an unwritable directory) so a lifecycle
        `configure` can refuse to activate with the reason.
        """
        cfg = self.config
        t0 = time.perf_counter()
        for d in (cfg.root, cfg.notes_dir, cfg.index_dir, cfg.blobs_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.store = SqliteObservationStore(cfg.db_path)
        self.notes = NotesLog(cfg.notes_dir)
        if self.catch_up.closed:  # opened again after close()
            self.catch_up = CatchUp(self._catch_up_notes, "notes")
        self.places = Places(self._notes)
        self._load_embedders()
        self.indexes = IndexManager(cfg, self._store)
        self._indexes.load_or_rebuild()
        self.backend = LocalBackend(self._store, self._indexes)
        picked = self._ingest_note_files()
        indexed = self._index_missing_vectors()
        self._resume_captions()
        self._start_reembed()
        self._start_maintenance()
        log.info(
            "memory opened at %s: %d observations, %d vectors, %d notes picked up from "
            "Markdown, %d rows indexed late, in %.2f s", cfg.root, self._store.count(),
            self._indexes.total(), picked, indexed, time.perf_counter() - t0)

    def _load_embedders(self) -> None:
        """The configured embedders, loaded now: a broken model must fail configure, not the
        first query (the local and the fleet engine alike)."""
        cfg = self.config
        if self._text_embedder is None:
            from memory_node.core.embedders import get_text_embedder

            self._text_embedder = get_text_embedder(cfg.text_embedder,
                                                    onnx_threads=cfg.onnx_threads)
        self._text_embedder.embed_texts(["warm-up"])
        if cfg.image_embedder == "clip" and self._image_embedder is None:
            from memory_node.core.embedders import get_image_embedder

            if cfg.clip_image_model or cfg.clip_text_model:
                options: dict[str, Any] = {
                    "image_model_path": cfg.clip_image_model or None,
                    "text_model_path": cfg.clip_text_model or None,
                    "tokenizer_path": cfg.clip_tokenizer or None}
            else:  # no paths: the model `memory-models fetch clip` put in the models dir
                from memory_node.core.model_store import clip_options

                options = clip_options()
            self._image_embedder = get_image_embedder(
                "clip", onnx_threads=cfg.onnx_threads, **options)
            self._image_embedder.load()

    @property
    def serves(self) -> str:
        """What the engine answers from, for a server's start line."""
        return f"memory at {self.config.root.resolve()}"

    def close(self) -> bool:
        """Write the index cache and close the store. Returns True when the cache was written;
        False when it was not (another process held it, or a write failed: logged), in which
        case the next start loads the previous cache and catches up from memory.db."""
        persisted = False
        if self._maintenance is not None:  # first: it writes to the store
            self._maintenance.stop()
            self._maintenance = None
        self.catch_up.close()
        if self._captioner is not None:
            self._captioner.stop()
            self._captioner = None
        if self._reembedder is not None:
            self._reembedder.stop()
            self._reembedder = None
        if self.indexes is not None and self.store is not None:
            try:
                persisted = self._indexes.persist()
            except Exception as exc:  # noqa: BLE001 - the index is a cache; log and go on
                log.warning("index cache not written (%s: %s); the next start catches up "
                            "from memory.db", type(exc).__name__, exc)
        if self.indexes is not None:
            self._indexes.close()
        if self.store is not None:
            self._store.close()
        self.store = None
        self.backend = None
        return persisted

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

    def __enter__(self) -> MemoryEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- models -------------------------------------------------------------------------
    @property
    def text_model_id(self) -> str:
        return self._text_embedder.model_id

    @property
    def describer(self) -> Any:
        if self._describer is None:
            from memory_node.core.embedders import get_describer

            with self._lazy_lock:  # importers describe on several threads
                if self._describer is None:
                    self._describer = get_describer(self.config.describer)
        return self._describer

    def captioner(self) -> Any:
        """The background captioner when the describer is a vision-language model (built on
        first use; None otherwise)."""
        if self._captioner is not None:
            return self._captioner
        if self.config.describer != "vlm" and not hasattr(self._describer, "caption"):
            return None
        with self._captioner_lock:
            if self._captioner is None:
                from memory_node.core.captioner import Captioner

                describer = self.describer
                self._captioner = Captioner(
                    self._store, self.config.root, caption=describer.caption,
                    embed_texts=self._embed_texts, text_model_id=lambda: self.text_model_id,
                    sync=self.sync, max_per_min=self.config.caption_max_per_min,
                    **self._captioner_options)
                self._captioner.prime()
            return self._captioner

    def _resume_captions(self) -> None:
        """Rows left pending by an earlier process are captioned by this one (when it holds
        the store's caption lock and the endpoint is configured)."""
        if self.config.describer != "vlm" and not hasattr(self._describer, "caption"):
            return
        if not self._store.tagged("camera", "caption", "pending", 0, limit=1):
            return
        try:
            captioner = self.captioner()
        except Exception as exc:  # noqa: BLE001 - e.g. no key in this process
            log.warning("camera rows wait for captions but no captioner can start here: %s",
                        exc)
            return
        if captioner is not None:
            captioner.start()

    def camera_model_id(self) -> str:
        """The model camera rows are embedded with now: CLIP's, else the text model's."""
        if self._image_embedder is not None:
            return self._image_embedder.model_id
        return self.text_model_id

    def _start_reembed(self) -> None:
        """Camera rows embedded by another model than the configured one (the image
        embedder changed) get the new model's vectors in the background."""
        from memory_node.core.reembed import Reembedder

        job = Reembedder(self._store, self.config.root, target=self.camera_model_id,
                         image_embedder=lambda: self._image_embedder,
                         embed_texts=self._embed_texts, sync=self.sync)
        if job.pending() and job.start():
            log.info("%d camera rows carry another model's vectors: re-embedding them with "
                     "%s in the background", job.pending(), self.camera_model_id())
            self._reembedder = job

    def reembed_pending(self) -> int:
        """Camera rows still carrying another model's vectors than the configured one.

        Counting scans the camera rows, so searches do not pay for it each time: once zero,
        it stays zero (only a process configured otherwise writes other vectors); until then
        it is counted at most once a second."""
        if self._reembed_done:
            return 0
        now = time.monotonic()
        if now - self._reembed_checked >= 1.0:
            target = self.camera_model_id()
            counts: dict[str | None, int] = self._store.model_counts("camera")
            self._reembed_count = sum(int(n) for m, n in counts.items()
                                      if m is not None and m != target)
            self._reembed_checked = now
            self._reembed_done = self._reembed_count == 0
        return self._reembed_count

    def _embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._text_embedder.embed_texts(list(texts)), np.float32)

    def query_vector(self, model_id: str, text: str) -> np.ndarray | None:
        """The query embedding for one model, cached (agents repeat their questions)."""
        key = (model_id, text)
        with self._qcache_lock:
            vec = self._qcache.get(key)
            if vec is not None:
                self._qcache.move_to_end(key)
                return vec
        if model_id == self.text_model_id:
            vec = self._embed_texts([text])[0]
        elif self._image_embedder is not None and model_id == self._image_embedder.model_id:
            vec = np.asarray(self._image_embedder.embed_texts([text]), np.float32)[0]
        else:
            return None  # vectors of a model that is not loaded now cannot be queried
        with self._qcache_lock:
            self._qcache[key] = vec
            if len(self._qcache) > 512:
                self._qcache.popitem(last=False)
        return vec

    # ---- JSON contract: the edge --------------------------------------------------------
    def _guard(self, fn: Callable[[], Any], what: str) -> Any:
        """Run one request: its typed answer with took_ms, or an ErrorAnswer; never raises."""
        t0 = time.perf_counter()
        try:
            if self.backend is None:
                raise Unavailable("the memory store is closed")
            out = fn()
        except ContractError as exc:
            if exc.message.startswith("disk full"):
                self.disk_log("disk_full", f"{what} failed: {exc.message:.300s}")
            elif not isinstance(exc, BadRequest):
                log.warning("%s failed: %.300s", what, exc.message)
            return ErrorAnswer.of(exc.code, exc.message)
        except Exception as exc:  # noqa: BLE001 - a request never takes the node down
            if is_disk_full(exc, self.config.root):
                message = (f"disk full: {what} could not be written ({disk_full_text(exc)}); "
                           "nothing was changed")
                self.disk_log("disk_full", f"{what} failed: {message}")
                return ErrorAnswer.of(Unavailable.code, message)
            # One line per failed request, whatever it sent (a traceback of a deep recursion
            # is hundreds of kilobytes); the traceback itself at debug level.
            log.error("%s failed unexpectedly: %s: %.200s (at %s)", what, type(exc).__name__,
                      exc, _origin(exc))
            log.debug("%s: traceback", what, exc_info=True)
            return ErrorAnswer.of(InternalError.code, f"{what} failed: {type(exc).__name__}")
        took = round((time.perf_counter() - t0) * 1000, 3)
        if isinstance(out, dict):
            out["took_ms"] = took
        else:
            out.took_ms = took
        return out

    # The contract's operations. One name per operation, the service's verb: search, save,
    # compact, streams.
    #   ask_<verb>(query) -> the contract's answer model (an ErrorAnswer on failure, never
    #     raises); search and save take the request model or the request text, read with
    #     this engine's limits (a parse error is the ErrorAnswer the text call answers).
    #   <verb>(text) -> docs/design.md's JSON as the ROS service carries it: ask_<verb>
    #     dumped.
    #   _<verb>(model) -> the answer model, raising ContractError (the implementation).
    # EngineClient and RosClient (agent/) answer the same ask_<verb> and <verb> names; the
    # fleet engine overrides the _<verb> it answers otherwise.
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

    # Contract fields whose feature this engine does not have: refused, never ignored.
    UNSUPPORTED_SEARCH = {
        "robot": "robot ids belong to a fleet store", "map": "maps belong to a fleet store",
    }

    def plan(self, query: SearchQuery) -> SearchPlan:
        """Resolve a search against the clock, the streams, the tags, the named places and
        the current pose."""
        for name, feature in self.UNSUPPORTED_SEARCH.items():
            value = getattr(query, name)
            if value is not None and value is not False:
                raise BadRequest(f"'{name}' is not supported by this memory ({feature})")
        cfg = self.config
        plan = plan_search(query, now=self.clock, known_streams=_StreamNames(self),
                           k_default=cfg.k_default, k_max=cfg.k_max)
        if plan.tags or plan.order_by not in ("score", "time", "-time"):
            self.check_tags(plan)
        if plan.near_here:
            pose = self.pose_provider()
            if pose is None:
                raise Unavailable("near_here: the robot's current pose is unknown (no TF "
                                  "from the world frame to the base frame yet)")
            if pose.stale:
                raise Unavailable(f"near_here: the robot's newest pose is {pose.age_s:.2f} s old "
                                  "(older than max_pose_age_s): TF is not arriving or lags")
            plan.near = (pose.x, pose.y)
        if plan.place is not None:
            self.resolve_place(plan, plan.place)
        return plan

    def check_tags(self, plan: SearchPlan) -> None:
        """Refuse tag names no row has (with the nearest known names)."""
        catalogue = self._store.tag_catalogue()
        if catalogue is not None:
            check_tag_names(plan, catalogue, self._store.has_tag)

    def resolve_place(self, plan: SearchPlan, name: str) -> None:
        """A named place becomes the plan's circle (its radius unless the query gave one)."""
        place = self.place(name)
        plan.near = (place.x, place.y)
        if not plan.radius_given:
            plan.radius = place.radius

    def place(self, name: str) -> Place:
        """The named place, or BadRequest naming the places there are."""
        place = self._places.get(name)
        if place is None:
            raise BadRequest(unknown_name("place", name, self._places.names()))
        return place

    def parse_search(self, query: str) -> SearchPlan:
        """A payload straight to a plan (benchmarks time the two halves apart)."""
        return self.plan(self.read_search(query))

    def _search(self, query: SearchQuery) -> SearchAnswer | VisitsAnswer:
        """`search`: the answer to one query; raises ContractError."""
        plan = self.plan(query)
        if plan.visits:
            return self.run_visits(plan)
        pairs, notes = self.run_search(plan)
        if plan.semantic_query and (plan.streams is None or "camera" in plan.streams):
            waiting = self.reembed_pending()
            if waiting:
                notes.append(f"{waiting} camera rows still carry vectors of an earlier model "
                             f"and are being re-embedded with {self.camera_model_id()} in the "
                             "background; until then their scores do not compare with the "
                             "others'")
        if self.disk is not None:  # rows the disk budget removed from this window
            notes += self.disk.search_notes(plan.streams, plan.t_min)
        results = [self._backend.result(row, score) for row, score in pairs]
        if plan.k_capped:
            notes.append(f"k capped at {self.config.k_max}")
        return SearchAnswer.model_validate(
            {"results": results, "count": len(results), "notes": notes or None})

    def run_search(self, req: SearchPlan) -> tuple[list[tuple[Any, float | None]], list[str]]:
        """A resolved plan's rows (the backend's: an Observation here) and scores, and notes
        for the answer: the one planner over this engine's backend."""
        return QueryPlanner(self._backend, self.query_vector).run(req)

    def run_visits(self, plan: SearchPlan) -> VisitsAnswer:
        """Visits to the plan's circle within its time window, from the pose history (kept
        and archived rows with a pose), with notes where it is missing. A fleet answers from
        each robot's own track on the circle's map, and each visit names its robot."""
        assert plan.near is not None
        if plan.empty_window:
            return VisitsAnswer(notes=[EMPTY_WINDOW])
        lo, hi = self.visit_track_window(plan)
        tracks = self._backend.pose_excerpts(plan.robots, plan.map_id, plan.near, plan.radius,
                                             lo, hi, self.config.visit_gap_s)
        spans: list[tuple[VisitSpan, dict[str, Any]]] = []
        notes: list[str] = []
        for robot, track in tracks.items():
            got, said = self.visit_spans(plan, track)
            spans += [(v, {} if robot is None else {"robot": robot}) for v in got]
            notes += said if len(tracks) == 1 else [f"{robot}: {n}" for n in said]
        if not tracks:
            notes.append(f"no robot has pose history on map {plan.map_id} in this time "
                         "window, so visits are not known")
        spans.sort(key=lambda p: (p[0].start, p[1].get("robot", "")))
        if self.disk is not None:  # pose history the disk budget downsampled
            notes += self.disk.visit_notes(plan.t_min)[0]
        return self.visits_answer(spans, notes)

    def visit_track_window(self, plan: SearchPlan) -> tuple[float | None, float | None]:
        """The stretch of pose history visits need: one sample either side of the window
        links a visit that crosses its edges."""
        gap = self.config.visit_gap_s
        lo = None if plan.t_min is None else plan.t_min - gap
        hi = None if plan.t_max is None else plan.t_max + gap
        return lo, hi

    def visit_spans(self, plan: SearchPlan, history: np.ndarray | PoseExcerpt
                    ) -> tuple[list[VisitSpan], list[str]]:
        """One robot's visits in its pose history (see visit_track_window): a whole track or
        the pose-history index's excerpt for the circle, the same visits either way; and
        notes on where its history is missing."""
        assert plan.near is not None
        gap = self.config.visit_gap_s
        if self.disk is not None:  # a pose history coarser than the gap threshold
            gap = self.disk.visit_notes(plan.t_min)[1] or gap
        if isinstance(history, PoseExcerpt):
            last_t = history.last_t
        else:
            last_t = float(history[-1, 0]) if len(history) else None
        t_max = plan.t_max
        if t_max is None and plan.t_min is not None:
            t_max = max(self.clock(), plan.t_min if last_t is None else last_t)
        # (with a window ending now or later, the track reaches now: see find_visits)
        now = self.clock()
        args = (plan.near, plan.radius, gap, plan.t_min, t_max,
                now if t_max is None or t_max >= now else None)
        spans, gaps = (find_visits_in(history, *args) if isinstance(history, PoseExcerpt)
                       else find_visits(history, *args))
        notes: list[str] = []
        if last_t is None:
            notes.append("no pose history in this time window: no odometry or other "
                         "observation with a pose is stored for it, so visits are not known")
        else:
            notes += gap_notes(gaps, gap)
        return spans, notes

    def visits_answer(self, spans: Sequence[tuple[VisitSpan, dict[str, Any]]],
                      notes: list[str]) -> VisitsAnswer:
        """The answer from visits in time order, each with extra fields (a fleet's robot)."""
        visits = [Visit(start=round(v.start, 3), end=round(v.end, 3),
                        duration_s=round(v.duration, 3), **extra) for v, extra in spans]
        shown = visits
        if len(visits) > self.config.k_max:
            shown = visits[-self.config.k_max:]
            notes.append(f"{len(visits)} visits: the newest {self.config.k_max} are listed; "
                         "count, total_s, first and last count them all")
        return VisitsAnswer(
            visits=shown, count=len(visits),
            total_s=round(sum(v.duration for v, _ in spans), 3),
            first=min(v.start for v in visits) if visits else None,
            last=max(v.end for v in visits) if visits else None, notes=notes or None)

    # ---- save -----------------------------------------------------------------------------
    def _save(self, note: SaveNote) -> SaveAnswer:
        """`save`: a note stamped with the current pose and time (or a place name); raises
        ContractError."""
        if note.place is not None:
            return self.name_place(note)
        return self._save_note(SaveRequest(text=note.text, tags=dict(note.tags or {})))

    def name_place(self, req: SaveNote) -> SaveAnswer:
        """Name the current pose (or x, y) as a place, or remove a name; written to the
        Markdown notes first, like every note."""
        assert req.place is not None
        now = self.clock()
        name = req.place
        old = self._places.get(name)
        pose = self.pose_provider()
        if req.remove:
            if old is None:
                raise BadRequest(unknown_name("place", name, self._places.names()))
            entry = place_entry(old.name, now, pose, removed=True)
            self._append_place(entry)
            return SaveAnswer(id=None, t=now, pose=pose_out(pose), indexed=True,
                              place=PlaceInfo(**old.info()), removed=True)
        if req.x is not None and req.y is not None:
            x, y = float(req.x), float(req.y)
            frame = pose.frame if pose is not None else (old.frame if old else None)
        else:
            if pose is None:
                raise Unavailable("the robot's current pose is unknown (no TF from the world "
                                  "frame to the base frame yet): give x and y to name a point")
            if pose.stale:
                raise Unavailable(f"the robot's newest pose is {pose.age_s:.2f} s old (older "
                                  "than max_pose_age_s): give x and y, or try again")
            x, y, frame = pose.x, pose.y, pose.frame or None
        radius = float(req.radius) if req.radius is not None else (
            old.radius if old is not None else DEFAULT_RADIUS)
        entry = place_entry(name, now, pose, x=x, y=y, radius=radius, frame=frame)
        self._append_place(entry)
        place = self.place(name)  # just written: there
        return SaveAnswer(id=None, t=now, pose=pose_out(pose), indexed=True,
                          place=PlaceInfo(**place.info()))

    def _append_place(self, entry: NoteEntry) -> None:
        try:
            self._places.append(entry)
        except OSError as exc:
            if is_disk_full(exc, self.config.root):
                raise Unavailable(f"disk full: the place was not saved ({exc.strerror})") \
                    from None
            raise Unavailable(f"could not write the notes file: {exc.strerror}") from None

    def _save_note(self, req: SaveRequest, stream: str = "events",
                   t: float | None = None, pose: Pose | None | str = "current") -> SaveAnswer:
        """A note on `stream` at `t` and `pose` ("current": the pose provider's), written
        to the Markdown notes first; compaction's summaries come through here too."""
        now = self.clock() if t is None else t
        if isinstance(pose, str):  # "current"
            pose = self.pose_provider()
        vec: np.ndarray | None = None
        try:
            vec = self._embed_texts([req.text])[0]
        except Exception as exc:  # noqa: BLE001 - the note is kept; indexed at next start
            log.warning("embedding the note failed (%s); storing it unindexed", exc)
        if vec is not None:
            # A later search for the same words (an agent checking what it wrote) needs no
            # second embedding.
            with self._qcache_lock:
                self._qcache[(self.text_model_id, req.text)] = vec
        if vec is not None and stream == "events":
            folded = self._fold_note(req, vec, now, pose)
            if folded is not None:
                return folded
        entry = NoteEntry(key=new_key(), stream=stream, t=now, text=req.text, pose=pose,
                          tags=req.tags)
        with self._notes_lock:
            oid = self._write_note(entry, vec)
        indexed = vec is not None
        if indexed:
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - stored; indexed by the catch-up
                log.warning("note %d stored but the index could not be updated (%s); it is "
                            "indexed in the background", oid, exc)
                indexed = False
        if not indexed:
            self.catch_up.schedule()  # embedded and indexed as soon as that works
        return SaveAnswer(id=oid, t=now, pose=pose_out(pose), indexed=indexed)

    def _write_note(self, entry: NoteEntry, vec: np.ndarray | None) -> int:
        """The note into its Markdown file (durable first: the file is the record), then its
        row into memory.db; its id. A note that could not be written at all raises
        Unavailable ("disk full: ..." on a full disk); one written to Markdown whose row
        could not be stored raises Unavailable too, and the catch-up adds the row (and
        indexes it) by itself as soon as it can: never an answer with no id."""
        try:
            self._notes.append(entry)
        except OSError as exc:
            if is_disk_full(exc, self.config.root):
                raise Unavailable(f"disk full: the note was not saved ({exc.strerror})") from None
            raise Unavailable(f"could not write the notes file: {exc.strerror}") from None
        obs = Observation(stream=entry.stream, t=entry.t, pose=entry.pose,
                          tags=dict(entry.tags), text=entry.text,
                          model_id=self.text_model_id if vec is not None else None,
                          note_key=entry.key)
        try:
            [oid] = self._store.insert([obs], [vec])
        except Exception as exc:  # noqa: BLE001 - in Markdown already: caught up later
            self.catch_up.schedule()
            where = f"notes/{entry.file}"
            if is_disk_full(exc, self.config.root):
                raise Unavailable(
                    f"disk full: the note is kept in {where} but not yet in memory.db "
                    f"({disk_full_text(exc)}); it is added and indexed by itself as soon as "
                    "there is space (no need to save it again)") from None
            log.warning("note %s is in %s but could not be added to memory.db: %s",
                        entry.key, where, exc)
            raise Unavailable(
                f"the note is kept in {where} but memory.db could not store it "
                f"({type(exc).__name__}); it is added by itself as soon as it can be") from None
        return oid

    def _catch_up_notes(self) -> int:
        """Notes in Markdown that memory.db lacks, and rows without a vector, stored and
        indexed now (the catch-up thread; raises while that still fails)."""
        if self.store is None:
            return 0
        with self._notes_lock:
            picked = self._ingest_note_files()
        indexed = self._index_missing_vectors()
        self.sync()
        return picked + indexed

    def _fold_note(self, req: SaveRequest, vec: np.ndarray, now: float,
                   pose: Pose | None) -> SaveAnswer | None:
        """A note that repeats a recent one (same meaning, same place) is folded into it."""
        cfg = self.config
        probe = RowFilter(streams=("events",), t_min=now - cfg.note_fold_window_s,
                          t_max=now + 1e-6,
                          near=None if pose is None else (pose.x, pose.y),
                          radius=cfg.note_fold_radius_m)
        self.sync()
        key = (self.text_model_id, "events")
        idx = self._indexes.get(key)
        if idx is None:
            return None
        cand = self._store.candidates(probe)
        if len(cand.ids) == 0:
            return None
        ids, scores = idx.search(vec, 1, candidates=cand.ids)
        if len(ids) == 0 or scores[0] < cfg.note_fold_similarity:
            return None
        prior = self._store.get([int(ids[0])])[int(ids[0])]
        if (prior.pose is None) != (pose is None):
            return None
        tags = dict(prior.tags)
        count = tags.get("repeats")  # a hand-edited Markdown tag may be anything
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            count = 1
        tags["repeats"] = count + 1
        tags["last_t"] = now
        self._store.update_tags(int(ids[0]), tags)
        log.info("note folded into #%d (similarity %.3f): %.60s", int(ids[0]), scores[0], req.text)
        return SaveAnswer(id=prior.id, t=prior.t, pose=pose_out(prior.pose), indexed=True,
                          folded=True)

    # ---- streams / compact ------------------------------------------------------------------
    def _streams(self) -> StreamsAnswer:
        """`streams`: each stream's counts and times, and the named places."""
        entries = [StreamInfo(**e) for e in self._store.stream_stats()]
        disk, evicted, oldest = self._disk.streams_fields()
        for entry in entries:
            entry.evicted = evicted.get(entry.name, 0)
            entry.oldest_t = oldest.get(entry.name, entry.first_t)
            if entry.name == "camera":
                self._camera_extras(entry)
        return StreamsAnswer(streams=entries,
                             places=[PlaceInfo(**p.info()) for p in self._places.all()],
                             indexes=[IndexInfo(**g) for g in self._indexes.graph_info()] or None,
                             **disk)

    def _camera_extras(self, entry: StreamInfo) -> None:
        """Caption progress and cost (describer vlm), and rows awaiting a new embedding."""
        if self.config.describer == "vlm" or hasattr(self._describer, "caption"):
            counts = self._store.tag_counts("camera", "caption")
            entry.captioned = counts.get("done", 0)
            entry.pending = counts.get("pending", 0)
            entry.failed = counts.get("failed", 0)
            entry.caption_max_per_min = self.config.caption_max_per_min
            if self._captioner is not None:
                est = self._captioner.estimate(entry.pending)
            else:
                from memory_node.core.captioner import CAPTION_TOKENS, PROMPT_TOKENS

                ceiling = int(self.config.caption_max_per_min * 60)
                reqs = ceiling if entry.pending else 0
                est = {"caption_requests_per_hour": reqs,
                       "caption_tokens_per_hour": reqs * (PROMPT_TOKENS + CAPTION_TOKENS)}
            entry.caption_requests_per_hour = est["caption_requests_per_hour"]
            entry.caption_tokens_per_hour = est["caption_tokens_per_hour"]
        pending = self.reembed_pending()
        if pending:
            entry.reembed_pending = pending

    def mark_recording_clock(self, simulated: bool) -> None:
        """Say which clock the rows are being recorded on (the recorder, at start): a store
        recorded on simulated time is compacted counting ages from its own newest row, not
        from the clock of whatever process opens it later (see compact_clock)."""
        self._store.set_meta("recorded_clock", "sim" if simulated else "wall")

    def _compact(self) -> CompactAnswer:
        """`compact`: one pass (another one running: Unavailable)."""
        if not self._compact_lock.acquire(blocking=False):
            raise Unavailable("a compaction is already running")
        try:
            job = self._maintenance
            compactor = Compactor(
                self._store, self.config, clock=self.clock, sync=self.sync,
                vector_of=self._indexes.vector, llm_settings=self._llm_settings,
                save_summary=self._save_note,
                cancelled=lambda: job is not None and job.stopping)
            answer = compactor.run()
            if self._disk.budget_bytes is not None:
                answer["budget"] = self._disk.enforce()
                self.sync()
            return CompactAnswer.model_validate(answer)
        finally:
            self._compact_lock.release()

    @property
    def _disk(self) -> DiskBudget:
        return self._open(self.disk)

    def _start_maintenance(self) -> None:
        """Compaction and the disk budget in the background (compact_interval_s > 0)."""
        cfg = self.config
        self.disk = DiskBudget(self._store, cfg)
        self._store.prepare_eviction()
        if cfg.compact_interval_s <= 0:
            return
        job = Maintenance(cfg.root, interval_s=cfg.compact_interval_s,
                          compact=self._background_compact,
                          enforce_budget=self._background_budget
                          if self._disk.budget_bytes is not None else None)
        self.disk.cancelled = lambda: job.stopping
        self._maintenance = job
        job.start()

    def _background_compact(self) -> None:
        try:
            self._compact()
        except Unavailable as exc:  # a requested compaction is running, or closing
            log.debug("background compaction skipped: %s", exc.message)

    def _background_budget(self) -> None:
        if self._compact_lock.acquire(blocking=False):  # else a compaction runs it
            try:
                if self._disk.enforce().get("rows_removed"):
                    self.sync()
            finally:
                self._compact_lock.release()

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

    # ---- start-up work ----------------------------------------------------------------------
    def _ingest_note_files(self) -> int:
        """Rows for Markdown entries memory.db lacks (written by hand, or a crash before the
        insert): the Markdown files are the record of notes."""
        known = self._store.note_keys()
        # Place entries are the place registry's (core/places.py), not observations.
        new = [e for e in self._notes.read_all()
               if e.key not in known and e.stream != PLACES_STREAM]
        if not new:
            return 0
        try:
            vecs: list[np.ndarray | None] = list(self._embed_texts([e.text for e in new]))
        except Exception as exc:  # noqa: BLE001
            log.warning("embedding notes from Markdown failed (%s); stored unindexed", exc)
            vecs = [None] * len(new)
        rows = []
        for e in new:
            stream = e.stream if e.stream in self.known_streams() else "events"
            tags = dict(e.tags)
            if e.hand_written:
                tags["hand_written"] = True
            rows.append(Observation(stream=stream, t=e.t, pose=e.pose, tags=tags, text=e.text,
                                    model_id=self.text_model_id, note_key=e.key))
        for row, vec in zip(rows, vecs, strict=True):
            if vec is None:
                row.model_id = None
        self._store.insert(rows, vecs)
        self.sync()
        return len(rows)

    def _index_missing_vectors(self) -> int:
        """Embed rows stored without a vector (indexing failed when they were saved)."""
        rows = self._store.rows_without_vectors(
            [s for s in self.known_streams() if s in NOTE_STREAMS or s == "camera"])
        if not rows:
            return 0
        vecs = self._embed_texts([r.text for r in rows])
        for r, v in zip(rows, vecs, strict=True):
            if r.id is not None:  # rows read from the store
                self._store.set_vector(r.id, v, self.text_model_id)
        self.sync()
        return len(rows)
