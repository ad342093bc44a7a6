"""How many threads hyfl's own parallel work may use: the cores, or what the user said.

One setting for the whole process and the processes it starts: ``hyfl --threads N``
(the command line) or ``$HYFL_THREADS`` sets it; :func:`limit_threads` narrows it for
a block of code (a context variable, as ``threadpoolctl`` narrows BLAS). Without
either, every core this process may run on (:func:`usable_cores`). The iterates never
depend on it: what runs in parallel (the clients of a HyFDCA round, the packed
cipher's exponentiations) is independent work whose results are put together in a
fixed order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["THREADS_VARIABLE", "check_threads", "in_parts", "limit_threads", "thread_count",
           "usable_cores", "worker_pool"]

#: The environment variable ``hyfl --threads`` sets (and its child processes read).
THREADS_VARIABLE = "HYFL_THREADS"

_LIMIT: ContextVar[int | None] = ContextVar("hyfl_threads", default=None)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` elsewhere)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_threads(value, what: str = "threads") -> int:
    """A thread count of at least 1, or the one error style."""
    from hyfl.errors import check_int

    return check_int(what, value, minimum=1,
                     fix="Pass a whole number of threads, at least 1 (e.g. --threads 2).")


def thread_count() -> int:
    """The threads to use here: :func:`limit_threads`'s, else ``$HYFL_THREADS``, else the
    usable cores."""
    limit = _LIMIT.get()
    if limit is not None:
        return limit
    given = os.environ.get(THREADS_VARIABLE, "").strip()
    return check_threads(given, f"${THREADS_VARIABLE}") if given else usable_cores()


@contextmanager
def limit_threads(threads: int) -> Iterator[int]:
    """Use ``threads`` threads inside the block (this thread and its context only)."""
    token = _LIMIT.set(check_threads(threads))
    try:
        yield _LIMIT.get()
    finally:
        _LIMIT.reset(token)


_POOL: list = []  # [ThreadPoolExecutor, its size]: made once, grown when more are asked


def worker_pool(size: int):
    """A thread pool of at least ``size`` workers, shared by hyfl's parallel kernels (the
    solver's clients, the draws' sorts); made once and grown when more are asked."""
    from concurrent.futures import ThreadPoolExecutor

    if not _POOL or _POOL[1] < size:
        if _POOL:
            _POOL[0].shutdown(wait=False)
        _POOL[:] = [ThreadPoolExecutor(max_workers=size, thread_name_prefix="hyfl-worker"), size]
    return _POOL[0]


def in_parts(work, bounds) -> list:
    """``[work(lo, hi) for consecutive lo, hi of bounds]``, each part on a thread of
    :func:`worker_pool` (on this one when there is a single part), the results in order.

    The callers split independent work (each part writes only its own results), so
    what they put together is the same whatever the number of parts.
    """
    spans = [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
    if len(spans) == 1:
        return [work(*spans[0])]
    futures = [worker_pool(len(spans)).submit(work, lo, hi) for lo, hi in spans]
    return [future.result() for future in futures]

