"""Paillier's big-integer work spread over threads, and a pool of precomputed obfuscators.

Almost all of Paillier's cost is modular exponentiation, which
``gmpy2.powmod_base_list`` does for a whole list of bases at once and with
the GIL released. So plain threads run exponentiations on every core: no
processes, no copies of the key or of the ciphertexts.

:func:`powmods` splits lists of exponentiations over ``workers`` threads.

:class:`ObfuscatorPool` keeps a bounded number of fresh encryption
obfuscators (``r**n mod n**2``), made ahead of time by one background
thread at the lowest scheduling priority, so that on an otherwise idle core
they cost the encryptions nothing. Each obfuscator leaves the pool exactly
once (taken under a lock); the pool lives only in the memory of the process
that made it (a forked child discards its copy, and the key that owns the
pool drops it when pickled or copied). See docs/privacy.md, "Precomputed
obfuscators", for why this leaves the scheme's security unchanged.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence

import gmpy2

#: Below this many bases per thread, starting a thread costs more than it saves.
MIN_PER_THREAD = 4


def powmods(jobs: Sequence[tuple[list, object, object]], workers: int) -> list[list]:
    """``[powmod_base_list(bases, exponent, modulus) for each job]`` over ``workers`` threads.

    Parameters
    ----------
    jobs : sequence of (bases, exponent, modulus)
    workers : int
        Threads to use, the calling one included (1: no threads).

    Returns
    -------
    list of lists
        One list of results per job, in the order of its bases.
    """
    total = sum(len(bases) for bases, _, _ in jobs)
    workers = max(1, min(int(workers), total // MIN_PER_THREAD))
    if workers == 1:
        return [gmpy2.powmod_base_list(bases, e, m) if bases else [] for bases, e, m in jobs]
    # Equal slices of every job, dealt round-robin: each thread gets about the same work.
    parts = []
    for j, (bases, e, m) in enumerate(jobs):
        if not bases:
            continue
        step = -(-len(bases) // workers)
        parts += [(j, bases[s:s + step], e, m) for s in range(0, len(bases), step)]
    results: list = [None] * len(parts)
    errors: list[BaseException] = []

    def run(first: int) -> None:
        try:
            for i in range(first, len(parts), workers):
                _, bases, e, m = parts[i]
                results[i] = gmpy2.powmod_base_list(bases, e, m)
        except BaseException as err:  # re-raised in the calling thread
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(1, workers)]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    out: list[list] = [[] for _ in jobs]
    for (j, *_), values in zip(parts, results):
        out[j].extend(values)
    return out


class ObfuscatorPool:
    """A bounded store of fresh obfuscators, each handed out once.

    Parameters
    ----------
    make : callable
        ``make(count)`` returns ``count`` fresh, independent, uniformly random
        obfuscators. It must not hold the pool (the filler thread holds it
        while computing).
    size : int
        Most obfuscators kept (memory: ``size`` integers below ``n**2``). The
        filler keeps no more than the largest single request seen so far, so
        a cipher that encrypts a few values does not precompute ``size``.
    batch : int, default 16
        Obfuscators the filler makes between two looks at the pool.

    Notes
    -----
    The filler thread starts with the first :meth:`take`, runs at the lowest
    priority the system allows for a thread (Linux: nice 19), refills the pool
    while it has room, and ends once the pool is garbage collected or
    :meth:`close` is called. After a fork the child finds the parent's
    obfuscators and discards them before its first take, so parent and child
    never use the same one.
    """

    def __init__(self, make: Callable[[int], list], size: int, batch: int = 16):
        self._make = make
        self.size = int(size)
        self.batch = max(1, int(batch))
        self._items: deque = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._want = 0  # the largest single request so far: what is worth keeping
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        # Wake the filler when the pool goes away, so that it ends at once.
        weakref.finalize(self, self._wake.set)
        _POOLS.add(self)

    def __len__(self) -> int:
        return len(self._items)

    def take(self, count: int) -> list:
        """Up to ``count`` obfuscators, removed from the pool (fewer if it has fewer)."""
        with self._lock:
            self._check_process()
            n = min(int(count), len(self._items))
            out = [self._items.popleft() for _ in range(n)]
            self._want = min(self.size, max(self._want, int(count)))
            if not self._closed and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(
                    target=_fill, args=(weakref.ref(self), self._wake), daemon=True,
                    name="hyfl-obfuscators",
                )
                self._thread.start()
        self._wake.set()
        return out

    def close(self) -> None:
        """Stop the filler and forget every obfuscator."""
        with self._lock:
            self._closed = True
            self._items.clear()
        self._wake.set()

    def _check_process(self) -> None:
        """In a forked child: drop the parent's obfuscators (and its dead filler)."""
        if self._pid != os.getpid():
            self._items.clear()
            self._pid = os.getpid()
            self._thread = None


#: Every live pool, to be emptied in a forked child (see _after_fork).
_POOLS: weakref.WeakSet = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: empty every pool, with fresh locks (a parent thread may have
    held one at the fork) and no filler (threads do not survive a fork)."""
    for pool in list(_POOLS):
        pool._lock = threading.Lock()
        pool._wake = threading.Event()
        pool._items.clear()
        pool._pid = os.getpid()
        pool._thread = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _fill(ref: weakref.ref, wake: threading.Event) -> None:
    """The filler thread: top the pool up batch by batch; sleep while it is full.

    Holds the pool only between batches, so that a pool nobody else uses is
    collected (and this thread ends) even while it sleeps.
    """
    try:  # Linux: a thread id is a valid "process" for setpriority, affecting this thread only
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass
    while True:
        pool = ref()
        if pool is None or pool._closed:
            return
        with pool._lock:
            pool._check_process()
            room = pool._want - len(pool._items)
            pid = pool._pid
        if room <= 0:
            del pool
            wake.wait(1.0)
            wake.clear()
            continue
        make, count = pool._make, min(room, pool.batch)
        del pool
        fresh = make(count)  # the GIL is released inside gmpy2
        pool = ref()
        if pool is None:
            return
        with pool._lock:
            if not pool._closed and pool._pid == pid == os.getpid():
                pool._items.extend(fresh[:max(0, pool._want - len(pool._items))])
        del pool, fresh
