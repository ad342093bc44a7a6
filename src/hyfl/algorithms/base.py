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


def draw_local_samples(
    rng: np.random.Generator, sizes: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """Draw, for every client, ``counts[k]`` distinct local positions in ``[0, sizes[k])``.

    Sampling is uniform without replacement and vectorized across clients:
    Floyd's algorithm (one vectorized draw per position) when the counts are
    small, random sort keys otherwise. Both the engine and the slow reference
    implementations in the tests call this one function, so a seed fixes the
    same draws in both.

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
            taken = (chosen[:, :step] == t[:, None]).any(axis=1)
            chosen[:, step] = np.where(taken, j, t)
        valid = np.arange(h)[None, :] < counts[:, None]
        return chosen[valid]
    owner = np.repeat(np.arange(sizes.size), sizes)
    keys = rng.random(owner.size)
    order = np.lexsort((keys, owner))
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    rank = np.arange(owner.size) - starts[owner[order]]
    picked = order[rank < counts[owner[order]]]
    return picked - starts[owner[picked]]
