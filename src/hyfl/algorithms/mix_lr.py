"""Mix-LR: SecretFlow's logistic regression for mixed (hybrid) partitions.

SecretFlow's ``FlLogisticRegressionMix`` splits hybrid data into *row groups*:
the clients that hold the same samples form a group, and each group is a vertical
federation over all the features (its clients' feature blocks). One outer
iteration (SecretFlow's epoch with ``agg_epochs=1``):

1. Every group runs one epoch of vertical mini-batch SGD on its own samples, in
   batches of ``batch_size``: for each batch the clients send their partial
   margins ``x_{k,i}^T w_k``, the label holder returns the loss derivatives, and
   every client steps its own block,
   ``w_k <- w_k - learning_rate (X_{B,k}^T l'(z_B) / |B| + lam w_k)``.
   Inside a group nothing is stale: every step sees the group's current weights.
2. The server averages the groups' weights (SecretFlow's secure aggregation, an
   unweighted mean over the groups) and every group continues from the average,
   which is the server's model.

So it is FedAvg across row groups with exact vertical SGD inside each: with a
constant step it settles in SGD's noise around the optimum, and once groups take
many steps on data unlike each other's, their average drifts from it
(docs/baselines.md measures both).

Differences from SecretFlow, each to compare on hyfl's problem: the gradient has
hyfl's ``lam w`` term (SecretFlow's has no regularizer), any of hyfl's losses may
be used (SecretFlow's is logistic only; an intercept is hyfl's constant column
here), every group's batches are drawn in a fresh random order each epoch, and one
batch is one exchange (SecretFlow's encrypted residual and masked gradient take two
messages more per party, which a cost model would add as latency).

**Partial participation.** An absent client does not step its block but still
answers its group's margin queries (as FedBCD's absent parties do); a group with no
active client does not train. The average runs over all groups, absent ones with
the weights they last received.

**Partitions.** Clients must form row groups: clients with the same samples, whose
feature blocks are disjoint and cover every feature (``grid:KxQ``, ``vertical:Q``,
``horizontal:K``, or party files laid out so). Other splits are refused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl.algorithms.local_sgd import busiest_share
from hyfl.errors import check_int, check_positive, fail
from hyfl.partition import StackedBlocks
from hyfl.problem import Problem
from hyfl.work_clock import work_clock


@dataclass(frozen=True)
class MixLR:
    """Hyperparameters of mix-LR (constructor only stores them).

    Parameters
    ----------
    learning_rate : float, default 0.1
        SGD's step (SecretFlow's default).
    batch_size : int, default 64
        Samples per step (a group's last batch of an epoch may be smaller).
    local_epochs : int, default 1
        Epochs every group trains between averages (SecretFlow's ``agg_epochs``).
    name : str, default "mix-lr"
    """

    learning_rate: float = 0.1
    batch_size: int = 64
    local_epochs: int = 1
    name: str = "mix-lr"

    divergence_hint = "Lower learning_rate"

    def validated(self) -> MixLR:
        """Return self after checking every hyperparameter (raises HyflError)."""
        check_positive("learning_rate", self.learning_rate, fix="Pass a step such as 0.1.")
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("local_epochs", self.local_epochs, minimum=1)
        return self

    def config(self) -> dict[str, Any]:
        return asdict(self)

    # -- engine hooks --------------------------------------------------------
    def check_applicable(self, problem: Problem, blocks: StackedBlocks) -> None:
        """Refuse partitions whose clients do not form row groups."""
        row_groups(blocks)

    def setup(self, problem: Problem, blocks: StackedBlocks) -> MixLRState:
        self.validated()
        groups = row_groups(blocks)
        M, C = problem.n_features, problem.n_outputs
        owner = np.empty((len(groups), M), dtype=np.int64)  # client of (group, feature)
        for g, clients in enumerate(groups):
            for k in clients:
                owner[g, blocks.client_features[k]] = k
        samples = [blocks.row_sample[blocks.client_rowptr[c[0]]:blocks.client_rowptr[c[0] + 1]]
                   .astype(np.int64) for c in groups]
        return MixLRState(problem=problem, blocks=blocks, groups=groups, owner=owner,
                          samples=samples, w=np.zeros((M, C)))

    def weights(self, state: MixLRState) -> np.ndarray:
        return state.w

    def duals(self, state: MixLRState) -> None:
        return None

    def round_stats(self, state: MixLRState) -> dict[str, float]:
        return state.stats

    def round(self, state: MixLRState, active: np.ndarray, rng: np.random.Generator):
        """One epoch of vertical SGD per group with an active client, then the average."""
        active = np.asarray(active, dtype=bool)
        t = state.t + 1
        training = [g for g, clients in enumerate(state.groups) if active[clients].any()]
        if not training:
            stats = {"round_trips": 0.0, "active_clients": 0.0, "steps": 0.0,
                     "floats_up": 0.0, "floats_down": 0.0, "ids_up": 0.0, "ids_down": 0.0,
                     "client_share_max": 0.0, "server_seconds": 0.0}
            return replace(state, t=t, stats=stats)
        problem = state.problem
        M, C = state.w.shape
        # Each training group's copy of the model, and the features its active clients step.
        copies = np.repeat(state.w[None], len(training), axis=0)
        steps_mask = active[state.owner[training]]  # (G, M)
        batches = [group_batches(rng, state.samples[g], int(self.batch_size),
                                 int(self.local_epochs)) for g in training]
        n_steps = max(len(b) for b in batches)
        work = np.zeros(state.blocks.n_clients)
        for j in range(n_steps):
            rows = [b[j] if j < len(b) else np.empty(0, dtype=np.int64) for b in batches]
            sgd_step(problem, copies, steps_mask, rows, float(self.learning_rate), work,
                     state.owner[training])
        start = work_clock()
        # The average over all groups: the trained copies, and w where a group did not train.
        idle = len(state.groups) - len(training)
        w = (copies.sum(axis=0) + idle * state.w) / len(state.groups)
        server_seconds = work_clock() - start
        if not np.all(np.isfinite(w)):
            raise fail("mix-lr", f"diverged in round {t} (the model is no longer finite) with "
                       f"learning_rate={self.learning_rate:g}", self.divergence_hint)
        # Per step every client of a training group sends its batch's partial margins and
        # receives the derivatives; then the groups send their blocks (M C values a group)
        # and every group receives the average.
        batch_rows = sum(sum(len(r) for r in b) * len(state.groups[g])
                         for g, b in zip(training, batches))
        batch_floats = batch_rows * C
        stats = {
            "round_trips": float(n_steps + 1),
            "active_clients": float(np.count_nonzero(active)),
            "steps": float(n_steps),
            "floats_up": float(batch_floats + M * C * len(training)),
            "floats_down": float(batch_floats + M * C * len(state.groups)),
            "ids_up": 0.0,
            "ids_down": float(batch_rows),  # each batch's sample ids, to every group member
            # (the stepping clients' work; absent ones only answer margin queries)
            "client_share_max": busiest_share(work[active]),
            "server_seconds": server_seconds,
        }
        return replace(state, w=w, t=t, stats=stats)


@dataclass
class MixLRState:
    """The server's model and the row groups.

    Attributes
    ----------
    groups : list of ndarray
        The clients of each row group.
    owner : ndarray of int, shape (G, M)
        The client of each group that holds each feature.
    samples : list of ndarray
        Each group's samples.
    w : ndarray, shape (M, C)
        The average: the server's model, every group's start.
    """

    problem: Problem
    blocks: StackedBlocks
    groups: list
    owner: np.ndarray
    samples: list
    w: np.ndarray
    t: int = 0
    stats: dict = field(default_factory=dict)


def row_groups(blocks: StackedBlocks) -> list[np.ndarray]:
    """The clients grouped by their samples; each group's features must cover all, once."""
    keyed: dict[bytes, list[int]] = {}
    for k in range(blocks.n_clients):
        ids = np.sort(blocks.row_sample[blocks.client_rowptr[k]:blocks.client_rowptr[k + 1]])
        keyed.setdefault(ids.astype(np.int64).tobytes(), []).append(k)
    fix = ("Use a grid (grid:KxQ), a vertical or a horizontal split: clients with the same "
           "samples, whose features together are every feature once")
    groups = []
    for clients in keyed.values():
        features = np.concatenate([blocks.client_features[k] for k in clients])
        if features.size != blocks.n_features or np.unique(features).size != features.size:
            raise fail("mix-lr", f"needs row groups, but clients {clients} share their samples "
                       f"and hold {np.unique(features).size} of the {blocks.n_features} features"
                       + (" (some twice)" if np.unique(features).size != features.size else ""),
                       fix)
        groups.append(np.asarray(clients, dtype=np.int64))
    covered = np.zeros(blocks.n_samples, dtype=np.int64)
    for clients in groups:
        k = clients[0]
        covered[blocks.row_sample[blocks.client_rowptr[k]:blocks.client_rowptr[k + 1]]] += 1
    if np.any(covered != 1):
        raise fail("mix-lr", "needs every sample in exactly one row group", fix)
    return groups


def group_batches(rng: np.random.Generator, samples: np.ndarray, batch_size: int,
                  epochs: int) -> list[np.ndarray]:
    """A group's batches for ``epochs`` epochs, each epoch in a fresh random order."""
    out = []
    for _ in range(epochs):
        order = samples[rng.permutation(samples.size)]
        out.extend(order[i:i + batch_size] for i in range(0, order.size, batch_size))
    return out


def sgd_step(problem: Problem, copies: np.ndarray, steps_mask: np.ndarray,
             rows: list[np.ndarray], learning_rate: float, work: np.ndarray,
             owner: np.ndarray) -> None:
    """One SGD step of every training group on its batch, in place on ``copies`` (G, M, C).

    The groups' batches are stacked into one matrix whose columns are shifted by
    ``g M`` for group ``g``, so that all groups' margins and gradients are two sparse
    products against the stacked copies.
    """
    G, M, C = copies.shape
    sizes = np.array([r.size for r in rows])
    if not sizes.any():
        return
    all_rows = np.concatenate(rows)
    group_of_row = np.repeat(np.arange(G), sizes)
    X = problem.X[all_rows]
    shifted = sp.csr_matrix(
        (X.data, X.indices + np.repeat(group_of_row * M, np.diff(X.indptr)), X.indptr),
        shape=(all_rows.size, G * M))
    stacked = copies.reshape(G * M, C)
    z = np.asarray(shifted @ stacked)
    y, weight = problem.Y[all_rows], problem.weights_of(all_rows)
    slope = problem.loss.derivative(z, y, weight) / np.maximum(sizes, 1)[group_of_row][:, None]
    gradient = np.asarray(shifted.T @ slope).reshape(G, M, C) + problem.lam * copies
    trains = (sizes > 0)[:, None] & steps_mask  # (G, M): the active clients' features
    copies -= learning_rate * gradient * trains[:, :, None]
    # Each client's work: its non-zeros of the batch, twice (margins and gradient).
    np.add.at(work, owner[group_of_row[np.repeat(np.arange(all_rows.size), np.diff(X.indptr))],
                          X.indices], 2.0)

