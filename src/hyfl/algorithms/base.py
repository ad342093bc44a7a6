"""What every federated algorithm provides to the engine that runs it.

An algorithm is a handful of hooks around a loop that the runtime owns once
(:func:`hyfl.runtime.simulation.simulate`): ``setup`` builds the initial
state from the problem and the stacked client blocks, ``round`` performs one
outer iteration for the clients that are active in it, and ``weights`` /
``duals`` expose the server's model for evaluation. Client and server halves
live inside the algorithm module as separate, named functions.

State objects are owned by the engine; for speed their arrays are updated in
place by ``round`` (copying (N, C) arrays every round would dominate the
cost), while their scalar fields are replaced.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from hyfl.partition import StackedBlocks
from hyfl.problem import Problem


class Algorithm(Protocol):
    """Interface of a federated algorithm run by the simulation engine."""

    name: str

    def setup(self, problem: Problem, blocks: StackedBlocks) -> Any:
        """Return the initial state."""

    def round(self, state: Any, active: np.ndarray, rng: np.random.Generator) -> Any:
        """Run one outer iteration for the clients flagged in ``active``; return the state."""

    def weights(self, state: Any) -> np.ndarray:
        """The server's model ``w``, shape (M, C)."""

    def duals(self, state: Any) -> np.ndarray | None:
        """The server's dual variables (N, C), or None for primal methods."""

    def round_stats(self, state: Any) -> dict[str, float]:
        """Per-round figures of the last round (e.g. round trips, step size)."""

    def config(self) -> dict[str, Any]:
        """The resolved hyperparameters, for run records."""

    # Optional: ``divergence_hint: str``, what to change when the objective turns
    # non-finite (the engine's error repeats it); ``models(state)``, candidate
    # ``(name, weights, duals)`` models of which the engine reports the best certified;
    # and ``check_applicable(problem, blocks)``, which raises when the algorithm cannot
    # run on this problem or partition (``setup`` calls it; a comparison calls it for
    # every algorithm before running any, so a bad choice costs no finished run).


def draw_local_samples(
    rng: np.random.Generator, sizes: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """Draw, for every client, ``counts[k]`` distinct local positions in ``[0, sizes[k])``.

    Sampling is uniform without replacement and vectorized across clients:
    Floyd's algorithm (one vectorized draw per position) when the counts are
    small; otherwise the first distinct values of an oversampled uniform
    stream, or random sort keys for clients that want most of their samples.
    Both the engine and the slow reference implementations in the tests call
    this one function, so a seed fixes the same draws in both.

    Parameters
    ----------
    rng : numpy.random.Generator
    sizes : ndarray of int, shape (A,)
        Number of local samples of each drawing client.
    counts : ndarray of int, shape (A,)
        How many to draw per client, ``0 <= counts <= sizes``.

    Returns
    -------
    ndarray of int, shape (counts.sum(),)
        Positions, client by client (the first ``counts[0]`` belong to client 0).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if sizes.size == 0:
        return np.empty(0, dtype=np.int64)
    h = int(counts.max())
    if h <= 32:
        chosen = np.empty((sizes.size, h), dtype=np.int64)
        for step in range(h):
            # Floyd: j runs over n-h_k .. n-1; pick t uniform in [0, j]; if t is
            # already chosen take j instead. Rows with step >= h_k are ignored.
            j = np.maximum(sizes - counts + step, 0)
            t = rng.integers(0, j + 1)
            if step == 0:  # nothing taken yet (saves calls in a one-step round)
                chosen[:, 0] = t
                continue
            taken = (chosen[:, :step] == t[:, None]).any(axis=1)
            chosen[:, step] = np.where(taken, j, t)
        if np.all(counts == h):  # every row full: all of them, row by row
            return chosen.reshape(-1)
        valid = np.arange(h)[None, :] < counts[:, None]
        return chosen[valid]
    # Many draws per client: take the first `count` distinct values of an iid
    # uniform stream (a uniform subset, like sequential rejection of repeats),
    # oversampling so that one pass almost always suffices. Clients that want
    # more than half their samples, or that still fall short, use random keys.
    dense = 2 * counts > sizes
    picked = _first_distinct(rng, sizes, np.where(dense, 0, counts))
    short = ~dense & (np.bincount(picked[0], minlength=sizes.size) < counts)
    keys_for = dense | short
    if keys_for.all():  # (a full local pass) already grouped by client, in order
        return _random_keys(rng, sizes, counts)[1]
    if keys_for.any():
        extra = _random_keys(rng, sizes, np.where(keys_for, counts, 0))
        owners = np.concatenate([picked[0][~keys_for[picked[0]]], extra[0]])
        values = np.concatenate([picked[1][~keys_for[picked[0]]], extra[1]])
        order = np.argsort(owners, kind="stable")
        return values[order]
    return picked[1]


def _first_distinct(rng, sizes, counts):
    """(owner, position) of the first ``counts[k]`` distinct uniform draws per client."""
    m = counts + counts // 4 + 8 * (counts > 0)
    owner = np.repeat(np.arange(sizes.size), m)
    position = rng.integers(0, np.maximum(sizes[owner], 1))
    key = owner * (int(sizes.max()) + 1) + position
    _, first = np.unique(key, return_index=True)
    first.sort()  # draw order, grouped by owner
    owner_kept = owner[first]
    starts = np.searchsorted(owner_kept, np.arange(sizes.size))
    rank = np.arange(first.size) - starts[owner_kept]
    keep = rank < counts[owner_kept]
    return owner_kept[keep], position[first[keep]]


#: Fewest keys a thread sorts in ``_sort_runs`` (below, a hand-off costs more than it saves).
MIN_KEYS_PER_THREAD = 200_000


def _sort_runs(keys, starts, lengths, positions) -> None:
    """``positions[run] = np.argsort(keys[run])`` for each client's run, the runs split
    over :func:`hyfl._threads.thread_count` threads (NumPy's sort releases the GIL; each
    run's order is the same whoever sorts it: a full local pass on Covtype 12x12 sorts
    6.3 million keys, 0.45 s on one core)."""
    from hyfl._threads import in_parts, thread_count

    runs = np.flatnonzero(lengths)

    def sort(lo: int, hi: int) -> None:  # the runs runs[lo:hi]
        for k in runs[lo:hi]:
            run = slice(starts[k], starts[k] + lengths[k])
            positions[run] = np.argsort(keys[run])

    parts = min(thread_count(), runs.size, int(lengths.sum()) // MIN_KEYS_PER_THREAD)
    if parts <= 1:
        sort(0, runs.size)
        return
    total = np.cumsum(lengths[runs])
    cuts = np.searchsorted(total, total[-1] * np.arange(1, parts) / parts) + 1
    in_parts(sort, np.unique(np.concatenate(([0], np.minimum(cuts, runs.size), [runs.size]))))


def _random_keys(rng, sizes, counts):
    """(owner, position) of ``counts[k]`` positions per client by sorting random keys."""
    lengths = np.where(counts > 0, sizes, 0)
    owner = np.repeat(np.arange(sizes.size), lengths)
    keys = rng.random(owner.size)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    # The order of np.lexsort((keys, owner)): owners are already grouped in
    # ascending runs, so a sort of each run's keys gives the same permutation, at a
    # fraction of lexsort's cost (5.7 s of a 21 s full-pass round on Covtype 12x12).
    # NumPy's default (SIMD) sort, half the stable sort's time: it orders equal keys
    # differently, but 53-bit uniform keys tie with chance ~n^2 / 2^54.
    positions = np.empty(owner.size, dtype=np.int64)  # each run's order, from 0
    _sort_runs(keys, starts, lengths, positions)
    if np.array_equal(counts[lengths > 0], lengths[lengths > 0]):
        # Every drawing client wants all its samples (a full local pass): the
        # orders are the answer; skip the ranks and their copies (a few int64 per
        # stacked row).
        return owner, positions
    order = positions + starts[owner]
    rank = np.arange(owner.size) - starts[owner[order]]
    chosen = order[rank < counts[owner[order]]]
    return owner[chosen], chosen - starts[owner[chosen]]
