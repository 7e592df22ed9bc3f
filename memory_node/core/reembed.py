"""Re-embedding camera rows after the image embedder changed, in the background.

A store recorded with the heuristic describer holds camera rows with text-model vectors;
switching `image_embedder` to `clip` (or back) leaves them with the old model's vectors, whose
scores do not compare with the new model's. `Reembedder` walks those rows in id order, in
small batches, and gives each the configured model's vector (CLIP from the stored JPEG, the
text model from the row's text). Searches keep working throughout: a row is scored by
whichever vector it has, and the engine's answers say how many rows still wait.
One process per store does it (an exclusive lock file `reembed.lock`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from memory_node.core.captioner import FileLock

log = logging.getLogger(__name__)
LOCK_FILE = "reembed.lock"


class Reembedder:
    def __init__(self, store: Any, root: Path, *, target: Callable[[], str],
                 image_embedder: Callable[[], Any], embed_texts: Callable[[list[str]], Any],
                 sync: Callable[[], int], stream: str = "camera", batch: int = 16,
                 pause_s: float = 0.05):
        self.store = store
        self.root = Path(root)
        self.target = target
        self.image_embedder = image_embedder
        self.embed_texts = embed_texts
        self.sync = sync
        self.stream = stream
        self.batch = batch
        self.pause_s = pause_s  # between batches: the recorder's work goes first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_file = FileLock(self.root / LOCK_FILE)
        self.done = 0
        self.skipped: set[int] = set()

    def pending(self) -> int:
        counts = self.store.model_counts(self.stream)
        target = self.target()
        return sum(n for m, n in counts.items() if m is not None and m != target)

    def start(self) -> bool:
        if self._thread is not None:
            return True
        if not self._lock_file.acquire():
            return False
        self._thread = threading.Thread(target=self._run, name="reembed", daemon=True)
        self._thread.start()
        return True

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._thread = None
        self._lock_file.release()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Until the work is done (tests, tools); True when it finished."""
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        after = 0
        target = self.target()
        try:
            while not self._stop.is_set():
                rows = self.store.rows_not_of_model(self.stream, target, after, self.batch)
                if not rows:
                    break
                after = int(rows[-1].id)
                self._batch(rows, target)
                self.sync()
                self._stop.wait(self.pause_s)
        except Exception:  # noqa: BLE001 - the next start continues from memory.db
            log.exception("re-embedding %s rows stopped", self.stream)
        else:
            if self.done or self.skipped:
                log.info("%d %s rows re-embedded with %s (%d left: image unreadable)",
                         self.done, self.stream, target, len(self.skipped))
        finally:
            self._lock_file.release()

    def _batch(self, rows: list[Any], target: str) -> None:
        image_embedder = self.image_embedder()
        if image_embedder is not None and image_embedder.model_id == target:
            images, keep = [], []
            for obs in rows:
                img = _read_jpeg(self.root / obs.ref) if obs.ref else None
                if img is None:
                    self.skipped.add(int(obs.id))
                    continue
                images.append(img)
                keep.append(obs)
            if not keep:
                return
            vecs = np.asarray(image_embedder.embed_images(images), np.float32)
        else:
            keep = [o for o in rows if o.text]
            self.skipped.update(int(o.id) for o in rows if not o.text)
            if not keep:
                return
            vecs = np.asarray(self.embed_texts([o.text for o in keep]), np.float32)
        for obs, vec in zip(keep, vecs, strict=True):
            self.store.set_text(int(obs.id), obs.text, obs.tags, vec, target)
            self.done += 1


def _read_jpeg(path: Path) -> np.ndarray | None:
    import cv2

    if not path.is_file():
        return None
    data = np.fromfile(str(path), np.uint8)
    return cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
