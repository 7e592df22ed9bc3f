"""Whether a graph may link and walk the vectors' projections on their principal axes (a
PCA) instead of the whole vectors: a walk reads fewer components a hop, but it cannot find
what the projection ranks too low, so the projection is checked on a sample before a graph
is built over it.
"""

from __future__ import annotations

import logging

import faiss
import numpy as np

log = logging.getLogger(__name__)

# A graph built over fewer rows walks whole vectors, whatever `dims` says: a projection
# fitted on so few would cost it more recall than it saves time.
PROJECTION_MIN_ROWS = 1000
# Before a graph is built over projections, rows of its training sample are asked for as
# queries: the projection is kept when their exact top 5 lie among the PROJECTION_REACH best
# by projection as often as the recall target asks (a walk cannot find what the projection
# ranks lower). Data whose near-alike rows differ in few components (MiniLM captions) fail
# it; overlapping clusters pass.
PROJECTION_REACH = 32
PROJECTION_QUERIES = 200


def fitted_projection(sample: np.ndarray, dims: int, target: float, reach: int,
                      queries: int = PROJECTION_QUERIES) -> faiss.PCAMatrix | None:
    """A PCA of `sample` onto `dims` axes when it ranks the sample's neighbours well enough
    for `target` (see `PROJECTION_REACH`); None when the graph should walk whole vectors."""
    dim = sample.shape[1]
    # Fitted once: the check ranks by it and the graph (each half) projects with it.
    pca = faiss.PCAMatrix(dim, dims)
    pca.train(sample)
    got = projection_recall(sample, dims, reach, queries, pca)
    if got < target:
        log.info("graph over whole %d-d vectors: their exact top 5 lie among the %d best by "
                 "%d-component projections for %.3f of sampled rows (target %.2f)",
                 dim, reach, dims, got, target)
        return None
    return pca


def projection_recall(sample: np.ndarray, dims: int, reach: int, queries: int,
                      pca: faiss.PCAMatrix | None = None) -> float:
    """How often a row's exact top 5 (itself left out) lie among its `reach` best by the
    sample's projection on `dims` principal axes (`pca`, fitted on `sample`, or fitted here):
    for `queries` rows of `sample`, as recall@5 (what a graph over the projection can find at
    best, re-scoring `reach` candidates)."""
    at = np.random.default_rng(len(sample)).choice(len(sample), min(queries, len(sample)),
                                                    replace=False)
    if pca is None:
        pca = faiss.PCAMatrix(sample.shape[1], dims)
        pca.train(sample)
    proj = pca.apply(sample)
    want = _best_rows(sample, at, 5)
    got = _best_rows(proj, at, reach)
    found = sum(len(np.intersect1d(w, g)) for w, g in zip(want, got, strict=True))
    return found / (5 * len(at))


def _best_rows(rows: np.ndarray, at: np.ndarray, n: int, chunk: int = 50_000) -> np.ndarray:
    """Per query row `at[j]`, the positions of its `n` best rows by inner product, itself
    left out (a chunk of rows at a time, so the scores stay small)."""
    q = rows[at]
    best_s = np.empty((len(at), 0), np.float32)
    best_i = np.empty((len(at), 0), np.int64)
    for start in range(0, len(rows), chunk):
        s = q @ rows[start:start + chunk].T
        mine = (at >= start) & (at < start + s.shape[1])
        s[np.nonzero(mine)[0], at[mine] - start] = -np.inf  # not itself
        all_s = np.concatenate([best_s, s], axis=1)
        all_i = np.concatenate([best_i, np.broadcast_to(
            np.arange(start, start + s.shape[1]), s.shape)], axis=1)
        keep = np.argpartition(-all_s, min(n, all_s.shape[1] - 1), axis=1)[:, :n]
        best_s = np.take_along_axis(all_s, keep, 1)
        best_i = np.take_along_axis(all_i, keep, 1)
    return best_i
