"""Prototypes of fixes suggested for core, applied to a running engine from outside.

Nothing here changes core files: each fix is a monkeypatch or a library setting, so the suite
can show before/after numbers on the same data and the same run. The report names the core
change each one stands for.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

DESCRIPTIONS: dict[str, str] = {
    "blas-1-thread": (
        "Exact scoring (`ExactIndex.search` / `search_positions`: `vecs @ q`) goes through "
        "numpy's OpenBLAS, which splits one mat-vec over every core; on a busy 2-core computer "
        "the threads wait for each other, and a 5k-row product (the `events` stream, below "
        "`hnsw_min_rows`) took milliseconds instead of ~0.06 ms. Prototype: one BLAS thread for "
        "queries (`threadpoolctl.threadpool_limits(1, 'blas')` around scoring, or the library's "
        "`set_num_threads(1)` at engine start), as faiss is already pinned to one OpenMP thread."
        " Landed in core in a890afa (threadpoolctl); on a core that has it, before and after "
        "differ by noise only."),
}
# Prototypes whose fix is in core, with the commit: their "after" is the core as is, so the bars
# table does not list them as a variant of its own.
LANDED: dict[str, str] = {"blas-1-thread": "a890afa"}


def pending() -> list[str]:
    """Prototyped fixes not yet in core."""
    return [name for name in DESCRIPTIONS if name not in LANDED]


def _openblas() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """set/get thread count of the OpenBLAS numpy loaded (found through /proc/self/maps)."""
    import numpy  # noqa: F401 - make sure it is loaded

    paths: list[str] = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            p = line.split()[-1]
            if "blas" in p.lower() and ".so" in p and p not in paths:
                paths.append(p)
    for p in paths:
        lib = ctypes.CDLL(p)
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", ""):
                try:
                    setf = getattr(lib, f"{prefix}_set_num_threads{suffix}")
                    getf = getattr(lib, f"{prefix}_get_num_threads{suffix}")
                except AttributeError:
                    continue
                getf.restype = ctypes.c_int
                return (lambda n, f=setf: f(ctypes.c_int(n))), (lambda f=getf: int(f()))
    return None


def set_blas_threads(n: int) -> int | None:
    """Set numpy's BLAS threads; returns the previous count (None when not found)."""
    fns = _openblas()
    if fns is None:
        return None
    setf, getf = fns
    old = getf()
    setf(n)
    return old


def apply(eng: Any) -> Callable[[], None]:
    """Apply every prototype to `eng`; returns a function that undoes them."""
    old_threads = set_blas_threads(1)

    def undo() -> None:
        if old_threads is not None:
            set_blas_threads(old_threads)

    return undo
