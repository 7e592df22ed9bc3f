"""Captions from a vision-language model, off the recording path.

With `describer: vlm`, a camera keyframe is stored at once with the heuristic describer's
text and tags (ingest never waits for a network). `CaptionPolicy` decides which keyframes
deserve a caption: a novel view, meaning no keyframe admitted earlier was taken within
`min_distance_m` facing within `min_turn_rad`, or one was but what the heuristic sees there
changed (colours, people, brightness). An admitted row carries the tag `caption: "pending"`
in the same transaction that stores it, so the queue is memory.db itself and a restart
continues where the last process stopped.

`Captioner` is one background thread per process (and one process per store: an exclusive
lock file `caption.lock` next to memory.db). It captions pending rows oldest first, within
`max_per_min` requests in any 60 s, replaces the row's text with the caption and re-embeds
it. HTTP 429, 5xx, timeouts and an unreachable endpoint back off exponentially (2 s doubling
to 5 min) and retry the same row, so an outage delays captions but loses none; a row is
marked `caption: "failed"` (with `caption_error`) after `max_attempts` tries or on an answer
that retrying cannot fix.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memory_node.core.types import Observation, Pose

log = logging.getLogger(__name__)

PENDING, DONE, FAILED = "pending", "done", "failed"
# Input tokens per request, estimated: a JPEG of at most 768 pixels a side is 4 tiles on the
# common vision APIs (85 + 4 x 170 = 765 tokens), plus the prompt.
PROMPT_TOKENS = 800
CAPTION_TOKENS = 30  # a one-sentence caption, until captions are measured
TAG = "caption"
LOCK_FILE = "caption.lock"
# Retrying cannot fix these answers (a bad request, a reply with no text): fail the row.
_PERMANENT = ("HTTP 400", "HTTP 404", "HTTP 413", "HTTP 422", "invalid JSON",
              "empty message", "without choices")


@dataclass
class _Seen:
    x: float
    y: float
    yaw: float
    colors: tuple[str, ...]
    people: int
    brightness: float


class CaptionPolicy:
    """Which keyframes get a caption: novel views only (see the module docstring)."""

    def __init__(self, min_distance_m: float = 1.5, min_turn_rad: float = math.radians(45),
                 brightness_change: float = 0.2, no_pose_interval_s: float = 60.0,
                 memory: int = 5000):
        self.min_distance_m = min_distance_m
        self.min_turn_rad = min_turn_rad
        self.brightness_change = brightness_change
        self.no_pose_interval_s = no_pose_interval_s
        self._seen: deque[_Seen] = deque(maxlen=memory)
        self._last_no_pose_t: float | None = None
        self._lock = threading.Lock()

    @staticmethod
    def _sig(pose: Pose, tags: dict[str, Any]) -> _Seen:
        colors = tags.get("colors")
        return _Seen(pose.x, pose.y, pose.yaw,
                     tuple(colors) if isinstance(colors, list) else (),
                     int(tags.get("people") or 0),
                     float(tags.get("brightness") or 0.0))

    def remember(self, obs: Observation) -> None:
        """A row admitted earlier (read back at start), so a restart does not re-admit."""
        if obs.pose is not None:
            with self._lock:
                self._seen.append(self._sig(obs.pose, obs.tags))

    def admit(self, t: float, pose: Pose | None, tags: dict[str, Any]) -> bool:
        with self._lock:
            if pose is None:
                if (self._last_no_pose_t is None
                        or abs(t - self._last_no_pose_t) >= self.no_pose_interval_s):
                    self._last_no_pose_t = t
                    return True
                return False
            new = self._sig(pose, tags)
            for old in self._seen:
                if math.hypot(new.x - old.x, new.y - old.y) > self.min_distance_m:
                    continue
                turn = abs((new.yaw - old.yaw + math.pi) % (2 * math.pi) - math.pi)
                if turn > self.min_turn_rad:
                    continue
                changed = (set(new.colors[:2]) != set(old.colors[:2])
                           or new.people != old.people
                           or abs(new.brightness - old.brightness) > self.brightness_change)
                if not changed:
                    return False
            self._seen.append(new)
            return True


class FileLock:
    """An exclusive, non-blocking lock on a file (released when the process ends)."""

    def __init__(self, path: Path):
        self.path = path
        self._fh: Any = None

    def acquire(self) -> bool:
        import fcntl

        fh = open(self.path, "a+")  # noqa: SIM115 - held until release
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            return False
        self._fh = fh
        return True

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def is_transient(message: str) -> bool:
    return not any(p in message for p in _PERMANENT)


class Captioner:
    """The background captioner (see the module docstring).

    `caption(image_bgr)` asks the model (the VLM describer's client); `embed_texts` and
    `text_model_id` re-embed the caption when the row's vector is a text vector (with CLIP
    image vectors only the text changes); `sync` updates the indexes. `clock` and `sleep`
    are the time the budget and the back-off count in (tests give a simulated clock).
    """

    def __init__(self, store: Any, root: Path, *,
                 caption: Callable[[np.ndarray], str],
                 embed_texts: Callable[[Sequence[str]], np.ndarray],
                 text_model_id: Callable[[], str],
                 sync: Callable[[], int],
                 max_per_min: float = 4.0,
                 stream: str = "camera",
                 policy: CaptionPolicy | None = None,
                 max_attempts: int = 8,
                 backoff_s: tuple[float, float] = (2.0, 300.0),
                 poll_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] | None = None,
                 prompt_tokens: int = PROMPT_TOKENS):
        if not max_per_min > 0:
            raise ValueError("caption_max_per_min must be > 0")
        self.store = store
        self.root = Path(root)
        self.caption = caption
        self.embed_texts = embed_texts
        self.text_model_id = text_model_id
        self.sync = sync
        self.max_per_min = float(max_per_min)
        self.stream = stream
        self.policy = policy or CaptionPolicy()
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.poll_s = poll_s
        self.clock = clock
        self._wake = threading.Event()
        self._sleep = sleep or (lambda s: self._wake.wait(s) and None)
        self.prompt_tokens = prompt_tokens  # image + prompt, per request (an estimate)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_file = FileLock(self.root / LOCK_FILE)
        self._owner = False
        self._attempts: dict[int, int] = {}
        self._sent: deque[float] = deque()  # request times, for the per-minute budget
        self._hour: deque[tuple[float, int]] = deque()  # (time, tokens) of the last hour
        self._backoff = 0.0
        self._after_id = 0
        self.requests = 0
        self._mutex = threading.Lock()

    # ---- admission (the ingest path: no I/O beyond memory) ----------------------------------
    def admit(self, t: float, pose: Pose | None, tags: dict[str, Any]) -> bool:
        return self.policy.admit(t, pose, tags)

    def backfill(self) -> int:
        """Admit rows stored before captions were on (through the same novel-view policy);
        returns how many were queued. The worker is woken when any were."""
        queued = 0
        for obs in sorted(self.store.rows_of([self.stream]), key=lambda o: o.t):
            if TAG in obs.tags or not self.policy.admit(obs.t, obs.pose, obs.tags):
                continue
            self.store.update_tags(obs.id, {**obs.tags, TAG: PENDING})
            queued += 1
        if queued:
            self.notify()
        return queued

    def notify(self) -> None:
        """New pending rows were stored: wake the worker."""
        self.start()
        self._wake.set()

    def prime(self) -> None:
        """Read back the views admitted before (captioned or pending), so a restarted process
        does not caption the same views again."""
        for kind in (DONE, PENDING):
            after = 0
            while rows := self.store.tagged(self.stream, TAG, kind, after):
                for obs in rows:
                    self.policy.remember(obs)
                after = int(rows[-1].id)

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self) -> bool:
        """Start the worker in this process if no other process captions this store."""
        with self._mutex:
            if self._thread is not None:
                return True
            if not self._lock_file.acquire():
                return False
            self._owner = True
            self._thread = threading.Thread(target=self._run, name="captioner", daemon=True)
            self._thread.start()
            return True

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._thread = None
        self._lock_file.release()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- the worker ------------------------------------------------------------------------
    def _next(self) -> Observation | None:
        rows = self.store.tagged(self.stream, TAG, PENDING, self._after_id, limit=1)
        if not rows:
            rows = self.store.tagged(self.stream, TAG, PENDING, 0, limit=1)
        return rows[0] if rows else None

    def _run(self) -> None:
        while not self._stop.is_set():
            # The budget first: it costs no query. A wake-up (new rows) only ends a wait early
            # when the event was cleared before it, so a set event never makes a busy loop.
            wait = self._budget_wait()
            self._wake.clear()
            if wait > 0:
                self._sleep(wait)
                continue
            try:
                obs = self._next()
            except Exception:  # noqa: BLE001 - a busy database: try again later
                log.exception("captioner: reading pending rows failed")
                obs = None
            if obs is None:
                self._sleep(self.poll_s)
                continue
            self._one(obs)

    # The budget's window: a minute, and a second more so that the endpoint, which sees each
    # request a moment after it was sent (by a varying delay), counts no more than the budget
    # in any minute of its own either.
    WINDOW_S = 61.0

    def _budget_wait(self) -> float:
        now = self.clock()
        if self._backoff > now:
            return self._backoff - now
        while self._sent and now - self._sent[0] >= self.WINDOW_S:
            self._sent.popleft()
        if len(self._sent) < self.max_per_min:
            return 0.0
        return self.WINDOW_S - (now - self._sent[0]) + 1e-3

    def _one(self, obs: Observation) -> None:
        assert obs.id is not None
        image = self._image(obs)
        if image is None:
            self._finish(obs, FAILED, error="keyframe image missing or unreadable")
            return
        self._sent.append(self.clock())
        self.requests += 1
        try:
            text = " ".join(self.caption(image).split())
        except Exception as exc:  # noqa: BLE001 - every failure is counted and logged
            message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            tries = self._attempts.get(obs.id, 0) + 1
            self._attempts[obs.id] = tries
            if not is_transient(message) or tries >= self.max_attempts:
                log.warning("caption of #%d failed for good after %d tries: %.200s", obs.id,
                            tries, message)
                self._finish(obs, FAILED, error=message[:300])
                return
            delay = min(self.backoff_s[1], self.backoff_s[0] * 2 ** (tries - 1))
            self._backoff = self.clock() + delay
            log.info("caption of #%d: %.160s; retrying in %.0f s", obs.id, message, delay)
            return
        self._backoff = 0.0
        self._record_tokens(text)
        self._finish(obs, DONE, text=text)

    def _image(self, obs: Observation) -> np.ndarray | None:
        import cv2

        if not obs.ref:
            return None
        data = np.fromfile(str(self.root / obs.ref), np.uint8) if (
            self.root / obs.ref).is_file() else None
        if data is None or data.size == 0:
            return None
        img = cv2.imdecode(data, cv2.IMREAD_COLOR)
        return img if img is not None else None

    def _finish(self, obs: Observation, state: str, text: str | None = None,
                error: str | None = None) -> None:
        assert obs.id is not None
        self._attempts.pop(obs.id, None)
        self._after_id = max(self._after_id, int(obs.id))
        tags = dict(obs.tags)
        tags[TAG] = state
        if error is not None:
            tags["caption_error"] = error
        vec = None
        model_id = None
        if text:
            model = obs.model_id
            if model is None or model == self.text_model_id():
                model_id = self.text_model_id()
                vec = np.asarray(self.embed_texts([text]), np.float32)[0]
        try:
            self.store.set_text(obs.id, text if text else obs.text, tags, vec, model_id)
            if vec is not None:
                self.sync()
        except Exception:  # noqa: BLE001 - the row stays pending: tried again later
            log.exception("captioner: storing the caption of #%d failed", obs.id)

    # ---- estimates for `streams` -------------------------------------------------------------
    def _record_tokens(self, text: str) -> None:
        now = self.clock()
        self._hour.append((now, self.prompt_tokens + max(1, len(text) // 4)))
        while self._hour and now - self._hour[0][0] > 3600.0:
            self._hour.popleft()

    def estimate(self, pending: int) -> dict[str, int]:
        """Requests and tokens per hour: the rate of the last hour's captions, or while a
        backlog waits, the budget's ceiling (max_per_min * 60)."""
        now = self.clock()
        recent = [tok for t, tok in self._hour if now - t <= 3600.0]
        per_req = (sum(recent) / len(recent)) if recent else self.prompt_tokens + CAPTION_TOKENS
        ceiling = int(self.max_per_min * 60)
        reqs = ceiling if pending > 0 else min(ceiling, len(recent))
        return {"caption_requests_per_hour": reqs,
                "caption_tokens_per_hour": int(reqs * per_req)}
