"""FedBCD: federated stochastic block coordinate descent for vertical partitions.

Liu et al., "A Communication-Efficient Collaborative Learning Framework for
Distributed Features" (``fedbcd.md``). Every party (client) holds all samples
and a disjoint block of the features; party k owns the block ``w_k`` of the
model, and the server's model ``w`` (M, C) is the concatenation of the
blocks. For a linear model the *intermediate result* of party k for sample i
is its partial margin ``H_i^k = x_{k,i}^T w_k``; the loss gradient of every
block needs the full margin ``H_i = sum_k H_i^k``.

One outer iteration ``t = 0, 1, ...`` with rate ``eta_t = eta0 / sqrt(t + 1)``
(the paper's decay, one value for all local steps of the iteration):

1. *Mini-batch.* ``S`` sample ids are drawn without replacement with the
   algorithm's random stream. In vertical FL the batch is aligned: all
   parties use the same ids.
2. *Exchange* (Algorithm 1's ``Exchange``). Every party sends ``H^k`` for the
   batch; the server sums them and returns ``H`` -- one round trip. Each
   party keeps ``H_{-k} = H - H^k``, the *stale* sum of the others.
3. *Local steps.* Each active party takes ``Q`` gradient steps on its block::

       z   = H_{-k} + X_{k,S} w_k                 (stale others + fresh own part)
       g_k = 1/S X_{k,S}^T l'(z, y_S) + lam w_k + mu (w_k - w_k^start)
       w_k = w_k - eta_t g_k

   ``mu > 0`` adds the proximal term ``mu/2 ||w_k - w_k^start||^2`` of
   equation (15) (FedPBCD), which keeps the block near its value at the
   exchange when ``Q`` is large. As in the paper's formulation (7) the local
   gradient is a function of ``(H_{-k}, w_k)`` and the batch labels. Every
   party uses the labels of the batch; like every algorithm of this package
   (FedAvg's and HyFDCA's clients use ``y_i`` of their own samples) the data
   model is that a client holding sample ``i`` knows ``y_i``, so in vertical
   FL every party has all labels and none travel (the paper's single label
   holder would have to send them with the exchange, see Communication).

Variants (``variant``):

``"parallel"`` (FedBCD-p, Algorithm 2)
    All active parties run their ``Q`` steps simultaneously from the same
    stale information.
``"sequential"`` (FedBCD-s, Algorithm 3)
    Active parties run one after another (ascending client id); after its
    ``Q`` steps a party sends its new ``H^k`` for the batch and the server
    passes the refreshed sum to the next party (``Exchange({k, K})``), so each
    party sees the fresh margins of the parties before it.
``"sgd"`` (FedSGD, Algorithm 1)
    One step per exchange (``Q = 1``); then stale and fresh coincide.

Partial participation: an absent party does not train in the round, so its
block -- and with it every partial margin ``x_{k,i}^T w_k`` -- is exactly what
it was when the party last trained. The exchange uses those values: the
absent party answers the batch query passively (one sparse mat-vec, no
training), or equivalently uploads ``X_k w_k`` once when it leaves and the
server serves the table; the iterates are the same either way. Absent
intermediate results are therefore never staler than the model itself; the
only staleness is the one the algorithm introduces on purpose (during the
``Q`` local steps).

Round trips (``round_stats()["round_trips"]``): the exchange is one round
trip (partial margins up, sums down). FedSGD and FedBCD-p need exactly one
per outer iteration. FedBCD-s needs one more per hand-off between
consecutive active parties (a party's new margins up, the refreshed sums
down to the next party, on the critical path), ``A`` in all with ``A``
active parties; the last party's refresh is not sent because the next
iteration draws a new batch and exchanges afresh. ``exchanges`` counts the
paper's "communication rounds" (one per outer iteration, as in its Table 1)
for comparison. A round with no active party sends nothing.

Communication (``round_stats()``, per round; the engine accumulates). With
``A`` active parties, batch size ``S``, ``C`` outputs and ``P`` *passive*
parties (absent in the round, but with a block that is no longer zero because
they trained in an earlier round):

* ``ids_down = (A + P) S``: the server draws the batch (the engine draws it
  from the algorithm's stream) and announces its ``S`` sample ids to every
  party that must send margins for it. No other integers travel
  (``ids_up = 0``); the feature blocks are fixed at set-up.
* ``floats_up = (A + P) S C`` for the exchange, plus ``(A - 1) S C`` for
  FedBCD-s (the fresh margins of every active party but the last, which
  refresh the sum for the next party). The ``P`` passive answers are the
  absent parties' current margins, which the algorithm as implemented adds to
  the sum (see Partial participation); they are reported on their own as
  ``passive_floats_up`` (part of ``floats_up``) so that a cost model assuming
  another way to obtain them (e.g. a table ``X_k w_k``, ``N C`` floats,
  uploaded when a party leaves) can swap them out. Parties that never
  trained have zero margins, which the server knows without asking.
* ``floats_down = A S C``: each active party receives the sum ``H`` of the
  batch once (at the exchange for FedSGD / FedBCD-p; the refreshed sum at its
  turn for FedBCD-s) and forms ``H_{-k} = H - H^k`` itself.
* Labels: none (see step 3). Under the paper's setting, where only one party
  holds the labels, add ``S C`` label values (or ``S`` class ids) down per
  active party other than the label holder.

Strictly, announcing the batch before the margins come back is half a round
trip more per exchange; ``round_trips`` (above) follows the paper in counting
the exchange as one round trip (the ids can ride on the previous round's last
message, or come from a shared seed, in which case ``ids_down`` is 0 too).

``client_share_max`` is the busiest active party's share of the round's
client work, counted as passes over the stored non-zeros of the party's batch
rows ``n_k``: one for its exchange margins, two per local step (``X w`` and
``X^T l'``), one more for the fresh margins of FedBCD-s hand-offs, i.e.
``n_k (1 + 2 Q [+ 1])``; ``1 / A`` when the batch rows hold no non-zero. The
passive parties' one product each is not counted (they do no training). For
FedBCD-s the parties run one after another, so the round's client time is the
sum over the parties, not the busiest one's. ``server_seconds`` is the wall
time of summing the margins (:func:`server_sum_margins`) and, for FedBCD-s,
refreshing the sum at the hand-offs. All of these are 0 in a round with no
active party.

Simulation: the parties' rows of the batch are taken from the stacked blocks
(:class:`hyfl.partition.StackedBlocks`) as one sparse matrix with global
feature columns; since the blocks are disjoint, ``X_batch @ w`` gives every
party's partial margin for every batch sample in one product and
``X_batch^T @ d`` gives every party's gradient in another. The ``Q`` local
steps are a Python loop (and, for FedBCD-s only, so are the parties).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl.algorithms.local_sgd import busiest_share
from hyfl.errors import check_choice, check_int, check_positive, fail
from hyfl.fedbcd_steps import check_local_steps, resolved_local_steps
from hyfl.losses import Loss
from hyfl.partition import StackedBlocks
from hyfl.problem import Problem
from hyfl.work_clock import work_clock

VARIANT_MODES = ("parallel", "sequential", "sgd")
"""Values of :attr:`FedBCD.variant`."""

DEFAULT_BATCH_SIZE = 64
"""S: the paper's batch size for MIMIC-LR (its logistic-regression task)."""

DEFAULT_PROX_MU = 0.1
"""mu of FedPBCD: the value of the paper's NUS-FTL experiment (Figure 4b)."""

# Curvature bound of each loss in the margin (sup |l''|), for the automatic
# rate. The hinge loss has none; 1 is the curvature of its smoothed version
# with unit width, the natural scale of its subgradient steps.
_LOSS_CURVATURE = {"logistic": 0.25, "squared": 1.0, "hinge": 1.0}


def loss_curvature(loss: Loss) -> float:
    """Bound on ``|l''(z)|`` used by the automatic rate (1.0 for unknown losses)."""
    if loss.name == "smoothed_hinge":
        return 1.0 / float(getattr(loss, "smoothing", 1.0))
    return _LOSS_CURVATURE.get(loss.name, 1.0)


@dataclass(frozen=True)
class FedBCD:
    """Hyperparameters of FedSGD / FedBCD-p / FedBCD-s / FedPBCD (constructor only stores).

    Parameters
    ----------
    variant : {"parallel", "sequential", "sgd"}, default "parallel"
        FedBCD-p, FedBCD-s or FedSGD (see the module docstring).
    local_steps : int, optional
        ``Q``, local gradient steps per party and exchange. Default 5
        (:data:`hyfl.fedbcd_steps.DEFAULT_LOCAL_STEPS`) for ``parallel`` / ``sequential``; the
        ``sgd`` variant takes exactly 1 and refuses any other value.
    batch_size : int, default 64
        ``S``, mini-batch size (capped at the number of samples N; ``S = N``
        is full-batch gradient descent).
    eta0 : float or "auto", default "auto"
        Initial rate; iteration t uses ``eta0 / sqrt(t + 1)``. ``"auto"`` is
        ``1 / L`` with ``L = c ||X||_2^2 / N + lam + mu`` the smoothness
        constant of the objective (``c`` bounds the loss curvature: 1/4
        logistic, 1 squared and hinge, 1/width smoothed hinge). ``mu`` is
        part of ``L`` because the proximal term is part of every party's
        local objective: with ``eta mu > 2`` the local steps would oscillate.
        ``||X||_2`` is computed at set-up (:func:`squared_spectral_norm`); in a
        deployment by power iteration, each iteration one exchange of partial
        products ``X v = sum_k X_k v_k`` and local products ``X_k^T u`` (a
        set-up cost, not counted in ``round_trips``). Measured over 300 rounds with 4 parties on the
        bundled data (breast_cancer, synthetic) and ijcnn1, logistic, hinge
        and squared loss: ``3 / L`` diverges for the squared loss on
        breast_cancer, while ``1 / L`` is stable everywhere and within a
        factor of about 10 of the best value of a grid (often within 3, and
        near the best for FedBCD-p, whose ``Q`` steps already enlarge the
        move). The paper tunes ``eta0`` per experiment.
    mu : float, default 0.0
        Proximal weight; ``mu > 0`` gives FedPBCD (paper: 0.1). Has no effect
        with ``Q = 1``.
    name : str, default "fedbcd"
        Label of the run (``hyfl.algorithms.ALGORITHMS`` sets ``fedsgd``,
        ``fedbcd-p``, ``fedbcd-s``, ``fedpbcd``).
    """

    variant: str = "parallel"
    local_steps: int | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    eta0: float | str = "auto"
    mu: float = 0.0
    name: str = "fedbcd"

    # -- configuration -----------------------------------------------------
    def validated(self) -> FedBCD:
        """Return self after checking every hyperparameter (raises HyflError)."""
        check_choice("variant", self.variant, VARIANT_MODES)
        check_local_steps(self.variant, self.local_steps)
        check_int("batch_size", self.batch_size, minimum=1)
        if self.eta0 != "auto":
            check_positive("eta0", self.eta0, fix='Pass a positive initial rate or "auto".')
        try:
            mu = float(self.mu)
        except (TypeError, ValueError):
            mu = math.nan
        if not (math.isfinite(mu) and mu >= 0):
            raise fail(
                "mu",
                f"must be a number >= 0, got {self.mu!r}",
                "Pass 0 for FedBCD or a positive proximal weight (e.g. 0.1) for FedPBCD.",
            )
        return self

    @property
    def steps(self) -> int:
        """``Q`` resolved from ``local_steps`` and the variant."""
        return resolved_local_steps(self.variant, self.local_steps)

    def config(self) -> dict[str, Any]:
        return {**asdict(self), "resolved_local_steps": self.steps}

    def initial_rate(self, problem: Problem) -> float:
        """``eta0``, resolving ``"auto"`` to ``1 / L`` (see the class docstring)."""
        if self.eta0 != "auto":
            return float(self.eta0)
        smoothness = (loss_curvature(problem.loss) * problem.max_weight
                      * squared_spectral_norm(problem.X))
        return 1.0 / (smoothness / problem.n_samples + problem.lam + float(self.mu))

    # -- engine hooks --------------------------------------------------------
    def check_applicable(self, problem: Problem, blocks: StackedBlocks) -> None:
        """Refuse partitions that are not vertical with disjoint feature blocks."""
        _require_vertical(blocks, self.name)

    def setup(self, problem: Problem, blocks: StackedBlocks) -> FedBCDState:
        self.validated()
        self.check_applicable(problem, blocks)
        N, C = problem.Y.shape
        return FedBCDState(
            problem=problem,
            blocks=blocks,
            w=np.zeros((problem.n_features, C)),
            batch_size=min(int(self.batch_size), N),
            eta0=self.initial_rate(problem),
            t=0,
            trained=np.zeros(blocks.n_clients, dtype=bool),
        )

    def weights(self, state: FedBCDState) -> np.ndarray:
        return state.w

    def duals(self, state: FedBCDState) -> None:
        return None

    def round_stats(self, state: FedBCDState) -> dict[str, float]:
        return state.stats

    def round(self, state: FedBCDState, active: np.ndarray, rng: np.random.Generator):
        """One outer iteration for the parties flagged in ``active`` (updates ``w`` in place)."""
        blocks, problem = state.blocks, state.problem
        K, N = blocks.n_clients, problem.n_samples
        eta = state.eta0 / math.sqrt(state.t + 1)
        active = np.asarray(active, dtype=bool)
        parties = np.flatnonzero(active)

        # 1. The aligned mini-batch (drawn every iteration, so the algorithm's
        # random stream does not depend on participation).
        batch = draw_batch(rng, N, state.batch_size)
        S = batch.size
        C = state.w.shape[1]
        trips = 0.0
        traffic = dict.fromkeys(
            ("floats_up", "floats_down", "ids_up", "ids_down", "passive_floats_up"), 0.0
        )
        share = server_seconds = 0.0
        if parties.size:
            A = parties.size
            # Absent parties whose block moved once: the server needs their margins.
            passive = int(np.count_nonzero(state.trained & ~active))
            # Vertical: party k's rows are client_rowptr[k] + sample id, so
            # row (k, s) of X_batch is party k's part of batch sample s.
            rows = blocks.client_rowptr[:-1, None] + batch[None, :]  # (K, S)
            X_batch = blocks.X[rows.ravel()]
            y, y_weight = problem.Y[batch], problem.weights_of(batch)
            # Stored non-zeros of each party's S batch rows (contiguous rows).
            batch_nnz = np.diff(X_batch.indptr[np.arange(K + 1) * S]).astype(np.int64)

            # 2. Exchange: partial margins of every party (absent ones with
            # their unchanged blocks), summed by the server.
            partial = client_partial_margins(X_batch, state.w).reshape(K, S, -1)
            start = work_clock()
            total = server_sum_margins(partial)
            server_seconds += work_clock() - start
            trips = 1.0
            # Ids down to every party asked for margins; margins up; sums down.
            traffic["ids_down"] = float((A + passive) * S)
            traffic["floats_up"] = float((A + passive) * S * C)
            traffic["passive_floats_up"] = float(passive * S * C)
            traffic["floats_down"] = float(A * S * C)
            passes = np.full(A, 1 + 2 * self.steps, dtype=np.int64)

            # 3. Local steps.
            if self.variant == "sequential":
                for j, k in enumerate(parties):
                    cols = blocks.client_features[k]
                    X_k = X_batch[k * S : (k + 1) * S]
                    others = total - partial[k]
                    client_local_steps(self, problem, state.w, X_k, others, y, cols, eta, S,
                                       y_weight)
                    if j < A - 1:
                        # Hand-off: k's fresh margins replace its stale ones in
                        # the sum, which goes to the next party (the last
                        # party's refresh is not sent: the next round exchanges afresh).
                        fresh = client_partial_margins(X_k, state.w)
                        start = work_clock()
                        total = others + fresh
                        server_seconds += work_clock() - start
                traffic["floats_up"] += float((A - 1) * S * C)
                passes[:-1] += 1
                trips = float(parties.size)
            else:
                if parties.size == K:
                    X_active, others = X_batch, (total[None] - partial).reshape(K * S, -1)
                    cols = None
                else:
                    X_active = X_batch[(parties[:, None] * S + np.arange(S)).ravel()]
                    others = (total[None] - partial[parties]).reshape(parties.size * S, -1)
                    cols = np.concatenate([blocks.client_features[k] for k in parties])
                y_active = np.tile(y, (parties.size, 1))
                weight_active = None if y_weight is None else np.tile(y_weight, (parties.size, 1))
                client_local_steps(self, problem, state.w, X_active, others, y_active, cols, eta, S,
                                   weight_active)
            share = busiest_share(passes * batch_nnz[parties])
            state.trained[parties] = True

        stats = {
            "round_trips": trips,
            "exchanges": float(trips > 0),
            "active_clients": float(parties.size),
            "eta": eta,
            "batch_size": float(S),
            "local_steps": float(self.steps),
            **traffic,
            "client_share_max": share,
            "server_seconds": server_seconds,
        }
        return replace(state, t=state.t + 1, stats=stats)


@dataclass
class FedBCDState:
    """What FedBCD keeps between outer iterations.

    ``w`` (M, C) is the concatenation of the parties' blocks (party k owns the
    rows ``blocks.client_features[k]``); it is both the server's model and,
    restricted to a block, that party's parameters. ``eta0`` is resolved at
    set-up; ``t`` counts finished outer iterations. ``trained`` (K,) flags the
    parties that have trained at least once (the others' margins are zero,
    which the server knows without asking them).
    """

    problem: Problem
    blocks: StackedBlocks
    w: np.ndarray
    batch_size: int
    eta0: float
    t: int
    trained: np.ndarray
    stats: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------
# Client and server halves (vectorized over the participating parties)
# ---------------------------------------------------------------------------


def draw_batch(rng: np.random.Generator, n_samples: int, batch_size: int) -> np.ndarray:
    """The aligned mini-batch: ``batch_size`` distinct sample ids, sorted, shape (S,).

    ``Generator.choice`` without replacement costs O(S) for S much smaller
    than N (about 16 us on ijcnn1); the engine and the slow reference both
    call this function, so a seed fixes the same batches in both.
    """
    return np.sort(rng.choice(n_samples, size=batch_size, replace=False))


def client_partial_margins(X_rows: sp.csr_matrix, w: np.ndarray) -> np.ndarray:
    """Partial margins ``x_{k,i}^T w_k`` of the given stacked rows, shape (rows, C).

    Each stacked row holds only its party's features (at global columns), so
    a product with the full ``w`` picks each party's own block.
    """
    return np.asarray(X_rows @ w)


def server_sum_margins(partial: np.ndarray) -> np.ndarray:
    """Full margins ``H_i = sum_k H_i^k`` of the batch: (K, S, C) -> (S, C)."""
    return partial.sum(axis=0)


def client_local_steps(
    cfg: FedBCD,
    problem: Problem,
    w: np.ndarray,
    X_rows: sp.csr_matrix,
    others: np.ndarray,
    y: np.ndarray,
    cols: np.ndarray | None,
    eta: float,
    batch_size: int,
    y_weight: np.ndarray | None = None,
) -> None:
    """``Q`` local gradient steps of one or more parties, in place on ``w[cols]``.

    Parameters
    ----------
    cfg : FedBCD
        Supplies ``Q`` and ``mu``.
    problem : Problem
        Supplies the loss and ``lam``.
    w : ndarray, shape (M, C)
        The model; only the rows ``cols`` change.
    X_rows : csr_matrix, shape (P * S, M)
        The training parties' stacked rows of the batch, party by party.
    others : ndarray, shape (P * S, C)
        For each row, the stale sum ``H_{-k}`` of the other parties' margins.
    y : ndarray, shape (P * S, C)
        Labels of each row's sample.
    cols : ndarray of int or None
        The training parties' features (None: all features).
    eta : float
    batch_size : int
        ``S``, the divisor of the mini-batch gradient.
    y_weight : ndarray, shape (P * S, C), optional
        Sample weights of each row's sample (default 1).
    """
    loss, lam, mu = problem.loss, problem.lam, float(cfg.mu)
    if cols is not None:
        # Local coordinates: the parties' steps touch only their own blocks.
        X_rows = X_rows[:, cols]
        w_local = w[cols]
    else:
        w_local = w.copy()
    X_t = X_rows.T.tocsr()
    start = w_local.copy()
    for _ in range(cfg.steps):
        z = others + X_rows @ w_local
        grad = (X_t @ loss.derivative(z, y, y_weight)) / batch_size + lam * w_local
        if mu:
            grad += mu * (w_local - start)
        w_local -= eta * grad
    if cols is None:
        w[:] = w_local
    else:
        w[cols] = w_local


def squared_spectral_norm(X: sp.spmatrix, iterations: int = 500, tol: float = 1e-6) -> float:
    """``||X||_2^2``, the largest eigenvalue of ``X^T X``.

    Exact (dense eigenvalues of the Gram matrix) for up to 1,000 features;
    otherwise power iteration from a fixed start (no random numbers), which
    approaches the value from below to relative accuracy ``tol``.
    """
    n_features = X.shape[1]
    if n_features <= 1000:
        gram = (X.T @ X).toarray() if sp.issparse(X) else X.T @ X
        return float(max(np.linalg.eigvalsh(gram)[-1], 0.0))
    # A start with distinct entries is not orthogonal to the top singular
    # vector except by accident.
    v = 1.0 + np.arange(n_features) / n_features
    v /= np.linalg.norm(v)
    value = 0.0
    for _ in range(iterations):
        u = X.T @ (X @ v)
        new = float(np.linalg.norm(u))
        if new == 0.0:
            return 0.0
        v = u / new
        if abs(new - value) <= tol * new:
            return new
        value = new
    return value


def _require_vertical(blocks: StackedBlocks, name: str) -> None:
    """Refuse partitions where a party lacks samples or parties share features."""
    sizes = np.diff(blocks.client_rowptr)
    short = np.flatnonzero(sizes != blocks.n_samples)
    if short.size:
        k = int(short[0])
        layout = (
            "horizontal"
            if all(len(f) == blocks.n_features for f in blocks.client_features)
            else "hybrid"
        )
        raise fail(
            f"partition for {name}",
            f"is {layout}: client {k} holds {int(sizes[k])} of {blocks.n_samples} samples",
            "FedBCD needs a vertical partition (every client holds all samples); use "
            f"--partition vertical:Q, or hyfdca/fedavg for {layout} partitions.",
        )
    owners = np.bincount(
        np.concatenate(blocks.client_features).astype(np.int64), minlength=blocks.n_features
    )
    shared = np.flatnonzero(owners > 1)
    if shared.size:
        m = int(shared[0])
        holders = [k for k, f in enumerate(blocks.client_features) if np.isin(m, f)]
        raise fail(
            f"partition for {name}",
            f"shares feature {m} between clients {', '.join(map(str, holders))} "
            f"({shared.size} shared feature{'s' if shared.size > 1 else ''} in all)",
            "FedBCD needs disjoint feature blocks (each party owns its block of w); use "
            "--partition vertical:Q, or hyfdca for splits that share features.",
        )
