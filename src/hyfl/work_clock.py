"""A clock that stops while Numba compiles: simulated time charges work, not compilation.

The first rounds of every new process call HyFDCA's compiled kernels for the
first time, and Numba compiles them (or loads them from its on-disk cache)
then. Timed with ``time.perf_counter``, that was charged as client and server
compute: on breast cancer ``grid:3x3`` with a cold cache, round 1 charged
1.6 s of client compute where a round's work is about 1 ms, which skews every
comparison at equal simulated time and depended on whether the cache was warm.

:func:`work_clock` is ``time.perf_counter()`` minus the seconds this process
has spent holding Numba's compiler lock -- compiling, or loading a compiled
kernel from the cache -- so a difference of two readings is the work done in
between. JAX's compilation (the neural algorithms) is not excluded.
"""

from __future__ import annotations

import threading
import time

__all__ = ["compiling_seconds", "work_clock"]

_lock = threading.Lock()
_listener = None


def compiling_seconds() -> float:
    """Seconds this process has spent in Numba's compiler lock since the first call.

    The first call registers a listener for Numba's ``numba:compiler_lock``
    event (it fires only around compilation and cache loading, never when a
    compiled kernel runs).
    """
    global _listener
    if _listener is None:
        with _lock:
            if _listener is None:
                from numba.core import event

                listener = event.TimingListener()
                event.register("numba:compiler_lock", listener)
                _listener = listener
    return _listener.duration if _listener.done else 0.0


def work_clock() -> float:
    """``time.perf_counter()`` with the time spent compiling taken out (seconds)."""
    compiling = compiling_seconds()  # first: its first call imports Numba
    return time.perf_counter() - compiling
