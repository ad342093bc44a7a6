"""Hybrid local SGD with server averaging at the overlaps: FedAvg and HyFEM.

The two baselines of the HyFDCA paper (``hyfdca-aaai.md``, section 7.3) are one
algorithm with two configurations. One outer iteration ``t`` for the set ``A``
of active clients (1 round trip: weights down, weights up):

1. *Broadcast.* Every active client ``k`` receives the server's weights on its
   features and starts from them, ``w_k = w_0[M_k]``.
2. *Local SGD.* Every active client takes ``H`` SGD steps of batch 1 on its
   LOCAL objective, predicting with its own features only::

       F_k(w_k) = 1/N_k sum_{i in I_k} l(x_{k,i}^T w_k, y_i) + lam/2 ||w_k||^2
                  + mu/2 ||w_k - w_0[M_k]||^2                     (HyFEM-Prox only)

       w_k <- w_k - eta_t (l'(x_{k,i}^T w_k, y_i) x_{k,i} + lam w_k + mu (w_k - w_0[M_k]))

   with ``eta_t = a / (b + sqrt(t))`` held fixed inside the round. Each step
   uses one local sample per client drawn uniformly *with* replacement: all
   ``H`` draws of the round come from one :func:`draw_local_samples` call
   with a count of 1 per (step, client) pair. That is the textbook i.i.d.
   stochastic gradient (unbiased for the local objective at every step);
   every client takes exactly ``H`` steps even when ``H > N_k`` (on a K x Q
   grid ``H = IIC N_k / Q``, and the paper searched IIC up to 5); and all
   active clients stay on one shared lazy scale (see below).
3. *Averaging.* The server stores the latest block of every client (absent
   clients' blocks stay stale; a client that never took part contributes
   zeros) and sets ``w_0[m] = mean_{k in K_m} w_{k,m}``. For a linear model
   this is HyFEM's model matching with the identity matching, and FedAvg's
   averaging restricted to the clients that hold feature ``m``.

FedAvg is ``mu = 0``; HyFEM-Prox adds the proximal term (HyFEM's feature
matching distance, ``hyfem.md`` eq. 6, with ``dist = ||.||^2 / 2``); HyFEM-Avg
drops it (``hyfem.md`` eq. 9) and is therefore FedAvg with its own name.

Simulation engine. All clients' weight copies live in one stacked array of
shape ``(E, C)``, ``E = sum_k |M_k|`` (client k's block is the segment
``entry_ptr[k]:entry_ptr[k + 1]``, in the order of ``M_k``); every stored
non-zero of the stacked data matrix knows its entry (``nz_entry``, computed
once at set-up). A local step is then a few vectorized operations over all
active clients at once: gather the drawn rows' non-zeros, margins by a segment
sum, one vectorized derivative, one scatter into the stacked weights (clients'
segments are disjoint and a row has distinct columns, so the scatter has no
collisions). The dense part of the update, the shrink ``(1 - eta (lam + mu))``
and the pull ``eta mu w_0``, is applied lazily: during a round every active
client's weights are ``w_k = s u_k + r w_0[M_k]`` with scalars ``s, r`` shared
by all active clients (same ``eta`` and same number of steps), so a step costs
O(non-zeros of the drawn rows), and a round O(H nnz + active entries).

Communication. One round trip per outer iteration with an active client
(``hyfdca-aaai.md`` section 7.3 counts 1.0 for both baselines). Active client
``k`` downloads ``w_0[M_k]`` (``|M_k| C`` floats) and uploads its local
weights ``w_k`` (``|M_k| C`` floats); so ``floats_down = floats_up =
sum_{k in A} |M_k| C``. Nothing else crosses the network: the local steps use
the client's own rows and labels only (this package's data model: a client
holding sample i knows ``y_i``), the sample draws are local, and the sets
``M_k`` are fixed at set-up, so no indices travel (``ids_up = ids_down = 0``).
HyFEM-Prox's anchor of the proximal term is the same ``w_0[M_k]`` the client
downloads anyway, and HyFEM's feature-extractor / inference-model matching
(``hyfem.md`` Algorithm 1) reduces for a linear model to the identity matching
done by the server's averaging: no embeddings, matching matrices or features of
other clients are computed or exchanged, so HyFEM sends exactly what FedAvg
sends. Absent clients send nothing; the server reuses their stored blocks.

Round statistics (per round; the engine accumulates): ``round_trips`` (1, or 0
when nobody is active), ``active_clients``, ``step_size`` (``eta_t``),
``client_drift``, the RMS over the active clients of ``||w_k - w_0[M_k]||``
after their local steps (how far the clients wander from the model they
received; the proximal term of HyFEM-Prox shrinks it), the message volumes
``floats_up``, ``floats_down``, ``ids_up``, ``ids_down`` above,
``client_share_max`` and ``server_seconds``. ``client_share_max`` is the
busiest active client's share of the round's client work, where a client's
work is the number of stored non-zeros of the ``H`` rows it drew (a row drawn
twice counts twice; every step makes the same constant number of passes over
its row, so that constant drops out of the share; the O(|M_k| C) dense work of
starting and ending the round is not counted); it is ``1 / A`` when the drawn
rows hold no non-zero at all. ``server_seconds`` is the wall time of storing
the received blocks and averaging them (:func:`server_average`). All of them
are 0 in a round with no active client.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl._ragged import concat_ranges, segment_ids
from hyfl.algorithms.base import draw_local_samples
from hyfl.algorithms.hyfdca import local_steps_from_iic
from hyfl.errors import check_choice, check_int, check_positive, check_range, fail
from hyfl.partition import StackedBlocks
from hyfl.problem import Problem
from hyfl.work_clock import work_clock

HYFEM_VARIANTS = ("prox", "avg")
"""HyFEM's local problems: with the proximal matching term, or without it."""

# Defaults of the rate a / (b + sqrt(t)) and of the IIC. The paper tuned them
# per dataset and setting (Tables 2-4: a from 0.004 to 12, b from 4e-5 to 4.5,
# IIC from 0.0006 to 4.5); these are a compromise measured on the bundled data
# (FedAvg, 1000 rounds, half participation; relative loss, horizontal 4
# clients, logistic): at IIC 0.2 and b = 1, a = 0.1 gave 7e-3 (synthetic),
# 1.4e-3 (adult), 1.1e-3 (ijcnn1), 0.33 (breast_cancer, too few samples per
# client for 1000 rounds); a = 0.05 is up to 10x slower on ijcnn1, a = 0.2
# twice as noisy on synthetic. On hybrid grids FedAvg stalls at the same
# relative loss (0.2-0.9) for every a tried. b = 1 keeps eta_1 = a / 2.
DEFAULT_A = 0.1
DEFAULT_B = 1.0
DEFAULT_IIC = 0.2

# Lazy scaling: fold the common factor s into the stacked weights when it gets
# this small, so that u = w / s never overflows (|s| shrinks by
# |1 - eta (lam + mu)| per step, and is exactly 0 when eta (lam + mu) = 1).
_FOLD_BELOW = 1e-150


class LocalSGD:
    """The one implementation behind :class:`FedAvg` and :class:`HyFEM`.

    A mixin: subclasses are frozen dataclasses with the fields ``local_steps``,
    ``iic``, ``a``, ``b`` and ``name``, and say through :attr:`prox_mu` how
    strongly the local iterate is pulled towards the weights received.
    """

    default_iic = DEFAULT_IIC
    """IIC when neither ``local_steps`` nor ``iic`` is given (see :class:`FedAvg`)."""

    local_steps: int | None
    iic: float | None
    a: float
    b: float
    name: str

    @property
    def prox_mu(self) -> float:
        """Weight ``mu`` of ``mu/2 ||w_k - w_0[M_k]||^2`` in the local objective."""
        return 0.0

    # -- configuration -----------------------------------------------------
    def validated(self):
        """Return self after checking every hyperparameter (raises HyflError)."""
        if self.local_steps is not None:
            check_int("local_steps", self.local_steps, minimum=1)
        if self.iic is not None:
            check_positive("iic", self.iic, fix="Pass a positive inner iterations constant.")
        check_positive("a", self.a, fix="Pass a positive rate numerator, e.g. a=0.1.")
        check_positive("b", self.b, fix="Pass a positive rate offset, e.g. b=1.0.")
        return self

    def config(self) -> dict[str, Any]:
        return {**asdict(self), "prox_mu": self.prox_mu}

    def steps_per_client(self, n_samples: int, n_clients: int) -> int:
        """Resolve ``H`` from ``local_steps`` or the IIC."""
        if self.local_steps is not None:
            return int(self.local_steps)
        iic = self.iic if self.iic is not None else self.default_iic
        return local_steps_from_iic(iic, n_samples, n_clients)

    def step_size(self, t: int) -> float:
        """``eta_t = a / (b + sqrt(t))`` of outer iteration ``t >= 1``."""
        return float(self.a) / (float(self.b) + math.sqrt(t))

    # -- engine hooks --------------------------------------------------------
    def setup(self, problem: Problem, blocks: StackedBlocks) -> LocalSGDState:
        """Validate, lay out the stacked client weights and start from ``w_0 = 0``."""
        self.validated()
        N, C = problem.Y.shape
        M = problem.n_features
        features = blocks.client_features
        n_features_of = np.array([len(f) for f in features], dtype=np.int64)
        entry_ptr = np.zeros(blocks.n_clients + 1, dtype=np.int64)
        np.cumsum(n_features_of, out=entry_ptr[1:])
        entry_feature = np.concatenate(features).astype(np.int64)
        entry_client = segment_ids(n_features_of)
        n_entries = entry_feature.size

        # Entry of every stored non-zero: its client's position of its column in
        # M_k. Keys client * M + feature are ascending over the entries (clients
        # in order, M_k sorted), so one binary search finds them all.
        X = blocks.X
        nz_client = blocks.row_client[segment_ids(np.diff(X.indptr))].astype(np.int64)
        keys = entry_client * M + entry_feature
        nz_keys = nz_client * M + X.indices.astype(np.int64)
        nz_entry = np.searchsorted(keys, nz_keys)
        if nz_entry.size and (
            nz_entry.max() >= n_entries or np.any(keys[nz_entry] != nz_keys)
        ):  # pragma: no cover - stack() already checks that owners hold their features
            raise fail(
                "partition", "gives a client data of a feature it does not hold", "Rebuild it."
            )

        # Server averaging over K_m as one sparse (M, E) matrix of 1 / |K_m|.
        holders = np.bincount(entry_feature, minlength=M).astype(np.float64)
        averaging = sp.csr_matrix(
            (1.0 / holders[entry_feature], (entry_feature, np.arange(n_entries))),
            shape=(M, n_entries),
        )
        return LocalSGDState(
            problem=problem,
            blocks=blocks,
            steps=self.steps_per_client(N, blocks.n_clients),
            mu=self.prox_mu,
            entry_ptr=entry_ptr,
            entry_feature=entry_feature,
            nz_entry=nz_entry,
            averaging=averaging,
            stored=np.zeros((n_entries, C)),
            scratch=np.zeros((n_entries, C)),
            w=np.zeros((M, C)),
            t=0,
        )

    def weights(self, state: LocalSGDState) -> np.ndarray:
        return state.w

    def duals(self, state: LocalSGDState) -> None:
        return None

    def round_stats(self, state: LocalSGDState) -> dict[str, float]:
        return state.stats

    def round(self, state: LocalSGDState, active: np.ndarray, rng: np.random.Generator):
        """One outer iteration for the clients flagged in ``active``."""
        t = state.t + 1
        eta = self.step_size(t)
        clients = np.flatnonzero(np.asarray(active, dtype=bool))
        stats = {
            "round_trips": 1.0 if clients.size else 0.0,
            "active_clients": float(clients.size),
            "step_size": eta,
            "client_drift": 0.0,
            "floats_up": 0.0,
            "floats_down": 0.0,
            "ids_up": 0.0,
            "ids_down": 0.0,
            "client_share_max": 0.0,
            "server_seconds": 0.0,
        }
        if clients.size == 0:  # nobody to talk to: nothing is sent, nothing changes
            return replace(state, t=t, stats=stats)

        entries = concat_ranges(state.entry_ptr[clients], np.diff(state.entry_ptr)[clients])
        # Down: w_0[M_k] to every active client; up: its w_k (module docstring).
        block_floats = float(entries.size * state.w.shape[1])  # sum_{k in A} |M_k| C
        stats["floats_down"] = stats["floats_up"] = block_floats
        local, work = client_local_sgd(state, clients, entries, eta, rng)
        stats["client_share_max"] = busiest_share(work)
        received = state.w[state.entry_feature[entries]]
        stats["client_drift"] = float(np.sqrt(np.sum((local - received) ** 2) / clients.size))
        start = work_clock()
        state.stored[entries] = local
        state.w[...] = server_average(state.averaging, state.stored)
        stats["server_seconds"] = work_clock() - start
        return replace(state, t=t, stats=stats)


@dataclass(frozen=True)
class FedAvg(LocalSGD):
    """Hybrid FedAvg: local SGD on each client's own features, averaged over K_m.

    Hyperparameters only (the constructor stores them); see the module
    docstring for the algorithm.

    Parameters
    ----------
    local_steps : int, optional
        ``H``, SGD steps (batch 1) per active client and outer iteration.
    iic : float, optional
        Inner iterations constant; ``H = ceil(iic * N / n_clients)`` (eq. 13
        of the paper). Used when ``local_steps`` is not given. When neither
        is given, ``iic = 0.2``: each client makes a fifth of a pass over its
        share ``N / n_clients`` per round, close to the paper's tuned Covtype
        (12, 12, 0.9) value 0.2494. Measured on the bundled data, IIC 0.2 at
        a = 0.1 reaches lower relative losses in 1000 rounds than IIC 0.05 at
        any a tried (0.02-0.5), at 4x the local work per round.
    a, b : float, default 0.1 and 1.0
        Rate ``eta_t = a / (b + sqrt(t))`` of outer iteration ``t``, fixed
        inside the round. A compromise measured on the bundled data (see
        ``DEFAULT_A`` in the module source); like the paper, tune them per
        dataset for serious comparisons.
    name : str, default "fedavg"
    """

    local_steps: int | None = None
    iic: float | None = None
    a: float = DEFAULT_A
    b: float = DEFAULT_B
    name: str = "fedavg"


@dataclass(frozen=True)
class HyFEM(LocalSGD):
    """HyFEM for linear models: FedAvg's rounds with an optional proximal term.

    Parameters
    ----------
    local_steps, iic, a, b
        As for :class:`FedAvg` (same defaults).
    mu : float, default 1.0
        Weight of ``mu/2 ||w_k - w_0[M_k]||^2`` in the local objective of
        HyFEM-Prox (the value the HyFEM paper and the HyFDCA paper's News20
        runs use). Ignored by HyFEM-Avg.
    variant : {"prox", "avg"}, default "prox"
        ``"prox"``: HyFEM-Prox (``hyfem.md`` eq. 6); ``"avg"``: HyFEM-Avg
        (eq. 9, no proximal term, i.e. ``mu = 0`` in effect).
    name : str, default "hyfem"
    """

    local_steps: int | None = None
    iic: float | None = None
    a: float = DEFAULT_A
    b: float = DEFAULT_B
    mu: float = 1.0
    variant: str = "prox"
    name: str = "hyfem"

    @property
    def prox_mu(self) -> float:
        return float(self.mu) if self.variant == "prox" else 0.0

    def validated(self) -> HyFEM:
        super().validated()
        check_choice("variant", self.variant, HYFEM_VARIANTS)
        check_range("mu", self.mu, 0.0, fix='Pass a non-negative proximal weight such as '
                    'mu=1.0 (or variant="avg").')
        return self


@dataclass
class LocalSGDState:
    """Everything FedAvg / HyFEM keep between outer iterations.

    Attributes
    ----------
    steps : int
        ``H``.
    mu : float
        Proximal weight (0 for FedAvg and HyFEM-Avg).
    entry_ptr : ndarray of int64, shape (K + 1,)
        Client k's weights are entries ``entry_ptr[k]:entry_ptr[k + 1]``.
    entry_feature : ndarray of int64, shape (E,)
        Global feature of every entry (client k's segment is ``M_k``).
    nz_entry : ndarray of int64, shape (nnz,)
        Entry of every stored non-zero of ``blocks.X`` (CSR order).
    averaging : scipy.sparse.csr_matrix, shape (M, E)
        ``1 / |K_m|`` at (m, e) for every entry e of feature m.
    stored : ndarray, shape (E, C)
        Server side: the latest block received from every client.
    scratch : ndarray, shape (E, C)
        Client side: the lazily scaled weights ``u`` during a round; all
        zeros between rounds.
    w : ndarray, shape (M, C)
        The server's weights ``w_0``.
    t : int
        Outer iterations done.
    """

    problem: Problem
    blocks: StackedBlocks
    steps: int
    mu: float
    entry_ptr: np.ndarray
    entry_feature: np.ndarray
    nz_entry: np.ndarray
    averaging: sp.csr_matrix
    stored: np.ndarray
    scratch: np.ndarray
    w: np.ndarray
    t: int
    stats: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------
# Client and server halves (vectorized over all participating clients)
# ---------------------------------------------------------------------------


def client_local_sgd(
    state: LocalSGDState,
    clients: np.ndarray,
    entries: np.ndarray,
    eta: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """``H`` local SGD steps of every active client, all clients at once.

    Every client starts from ``w_0[M_k]`` and its weights are kept as
    ``w_k = s u_k + r w_0[M_k]`` with ``u`` in ``state.scratch`` (zero at the
    start) and scalars ``s = 1``, ``r = 1``. A step with gradient ``g x`` maps
    ``w`` to ``rho w + eta mu w_0 - eta g x`` with ``rho = 1 - eta (lam + mu)``,
    i.e. ``s <- rho s``, ``r <- rho r + eta mu`` and ``u <- u - eta g x / s``.

    All ``H x A`` samples of the round are drawn by one call, one position per
    (step, client) pair with ``sizes`` tiled ``H`` times (step-major), which is
    the same as one call per step: independent uniform draws, with
    replacement across steps. Everything that does not depend on the moving
    weights (the drawn rows' non-zeros, labels and ``x^T w_0[M_k]``) is then
    gathered once for the round, and each step touches only its own slice.

    Parameters
    ----------
    state : LocalSGDState
    clients : ndarray of int64, shape (A,)
        Active clients, ascending.
    entries : ndarray of int64, shape (E_A,)
        Their stacked weight entries, client by client.
    eta : float
        This round's rate.
    rng : numpy.random.Generator

    Returns
    -------
    local : ndarray, shape (E_A, C)
        Every active client's weights after the ``H`` steps, at ``entries``.
    work : ndarray of int64, shape (A,)
        Stored non-zeros of the rows each client drew, summed over its ``H``
        steps (its share of the round's client work, see :func:`busiest_share`).
    """
    problem, blocks = state.problem, state.blocks
    lam, mu, loss, H, A = problem.lam, state.mu, problem.loss, state.steps, clients.size
    X, u, w0, Y, W = blocks.X, state.scratch, state.w, problem.Y, problem.W
    if Y.shape[1] == 1:
        # Binary problems step on 1-D views: NumPy's fancy indexing of (n, 1)
        # arrays costs about twice that of 1-D ones, and it dominates a step.
        u, w0, Y = u[:, 0], w0[:, 0], Y[:, 0]
        W = None if W is None else W[:, 0]

    # Draw (step j, client a) at position j * A + a, then gather the round's rows.
    sizes = np.diff(blocks.client_rowptr)[clients]
    positions = draw_local_samples(rng, np.tile(sizes, H), np.ones(H * A, dtype=np.int64))
    rows = np.tile(blocks.client_rowptr[clients], H) + positions
    start = X.indptr[rows]
    lengths = X.indptr[rows + 1] - start
    nz = concat_ranges(start, lengths)
    draw_of_nz = segment_ids(lengths)
    data = X.data[nz] if u.ndim == 1 else X.data[nz][:, None]
    ent = state.nz_entry[nz]
    slot = draw_of_nz % A  # the drawing client's place among the active ones
    step_ptr = np.zeros(H + 1, dtype=np.int64)
    per_draw = lengths.reshape(H, A).astype(np.int64)
    np.cumsum(per_draw.sum(axis=1), out=step_ptr[1:])
    work = per_draw.sum(axis=0)
    y = Y[blocks.row_sample[rows]]
    y_weight = None if W is None else W[blocks.row_sample[rows]]
    # x_{k,i}^T w_0[M_k]: w_0 stays fixed during the round.
    z_received = _segment_sums(data * w0[X.indices[nz]], draw_of_nz, H * A)

    rho = 1.0 - eta * (lam + mu)
    s, r = 1.0, 1.0
    for j in range(H):
        part = slice(step_ptr[j], step_ptr[j + 1])
        e, d, sl = ent[part], data[part], slot[part]
        # Margin with the client's own features: x^T w_k = s x^T u + r x^T w_0[M_k].
        z = s * _segment_sums(d * u[e], sl, A) + r * z_received[j * A : (j + 1) * A]
        g = loss.derivative(z, y[j * A : (j + 1) * A],
                            None if y_weight is None else y_weight[j * A : (j + 1) * A])
        s_next = rho * s
        if abs(s_next) < _FOLD_BELOW:
            u[entries] *= s_next
            s_next = 1.0
        u[e] -= d * (g * (eta / s_next))[sl]
        s, r = s_next, rho * r + eta * mu
    local = s * u[entries] + r * w0[state.entry_feature[entries]]
    u[entries] = 0.0
    return local.reshape(entries.size, -1), work


def busiest_share(work: np.ndarray) -> float:
    """The busiest client's fraction of the round's client work, in ``[1/A, 1]``.

    Parameters
    ----------
    work : ndarray, shape (A,)
        Non-negative work of every active client.

    Returns
    -------
    float
        ``max(work) / sum(work)``; ``1 / A`` when nobody did any work (an even
        split of nothing), 0.0 when there is no active client.
    """
    work = np.asarray(work, dtype=np.float64)
    if work.size == 0:
        return 0.0
    total = float(work.sum())
    if total <= 0.0:
        return 1.0 / work.size
    return float(work.max()) / total


def server_average(averaging: sp.csr_matrix, stored: np.ndarray) -> np.ndarray:
    """``w_0[m] = mean over k in K_m of the stored w_{k,m}``, shape (M, C)."""
    return np.asarray(averaging @ stored)


def _segment_sums(values: np.ndarray, seg: np.ndarray, n_segments: int) -> np.ndarray:
    """Sums of the rows of ``values``, (n,) or (n, C), per segment id; empty segments give 0.

    ``seg`` must be ascending (the draws' non-zeros come in draw order).
    """
    if values.ndim == 1:
        return np.bincount(seg, weights=values, minlength=n_segments)
    out = np.zeros((n_segments, values.shape[1]))
    if seg.size:
        # One reduceat over all classes; bincount would copy every strided column.
        first = np.flatnonzero(np.concatenate(([True], seg[1:] != seg[:-1])))
        out[seg[first]] = np.add.reduceat(values, first, axis=0)
    return out
