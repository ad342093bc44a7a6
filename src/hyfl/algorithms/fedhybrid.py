"""FedHybrid: hybrid primal-dual federated optimization (Niu and Wei).

The problem ``min_w P(w) = sum_i f_i(w)`` over a horizontal partition (client
``i`` holds whole samples ``I_i``) is split with the regularizer shared in
proportion to the data, so that the client objectives add up to ``P``::

    f_i(w) = 1/N sum_{j in I_i} l(x_j^T w, y_j) + (N_i / N) lam/2 ||w||^2.

Consensus form (``fedhybrid.md`` eq. 1.2): the server keeps ``x_0``; client
``i`` keeps a copy ``x_i`` and a multiplier ``lambda_i`` of the constraint
``x_0 = x_i``. One outer iteration is Algorithm 1 of the paper, with ``n``
clients, penalty ``mu`` and personalised step sizes ``a_i, b_i``:

1. The server sends ``x_0^k`` to the (active) clients.
2. Every active client forms the gradient of its augmented Lagrangian,
   ``g_i = grad f_i(x_i^k) - lambda_i^k + mu (x_i^k - x_0^k)``, and updates

   * gradient-type (``i in J_1``)::

         x_i^{k+1}      = x_i^k - a_i g_i
         lambda_i^{k+1} = lambda_i^k + b_i (x_0^k - x_i^k)

   * Newton-type (``i in J_2``), with ``D_i = hess f_i(x_i^k) + mu I``::

         x_i^{k+1}      = x_i^k - a_i D_i^{-1} g_i
         lambda_i^{k+1} = lambda_i^k + b_i D_i (x_0^k - x_i^k)

   then sends ``x_i^{k+1}, lambda_i^{k+1}`` to the server.
3. Consensus update:
   ``x_0^{k+1} = 1/n sum_i x_i^{k+1} - 1/(mu n) sum_i lambda_i^{k+1}``.

The server's model (``weights``) is ``x_0``; all variables start at zero.
Multiclass problems are one-vs-rest: every variable is (M, C) and the Hessian
is block diagonal over the classes (one M x M system per class).

**Partial participation.** The paper assumes full participation (its
conclusion leaves partial participation open). The rule used here: an absent
client does nothing -- it keeps ``x_i`` and ``lambda_i`` -- and the server's
consensus update runs over *all* ``n`` clients, with the values it last
received from the absent ones (which equal their current values, since they
did not move). The fixed point is unchanged; with full participation this is
exactly Algorithm 1.

**Newton-type clients** (``newton_clients``): ``"none"`` (FedH-G), ``"all"``
(FedH-N), ``"half"`` (the first ``n // 2``), an integer ``K`` (FedH-K: the
first ``K`` clients by index are Newton-type, the rest gradient-type; build
the partition with another seed to choose other clients) or an explicit list
of client indices.

**Step sizes.** ``step_sizes="raw"`` takes ``a`` and ``b`` literally as the
paper's ``a_i, b_i`` (one scalar for every client, or one value per client),
for reproducing tuned experiments. ``step_sizes="scaled"`` (default) derives
them per client in the shape of the paper's condition (4.2), from the local
smoothness ``L_i = sup l'' ||X_i||_2^2 / N + N_i lam / N``::

    gradient-type:  a_i = a / (L_i + mu),   b_i = b mu
    Newton-type:    a_i = a,                b_i = b mu / (L_i + mu)

(4.2) itself asks for ``a_i <= 1/(22 mu/9 + 2 l)`` and ``b_i`` below
``min(mu/9, a m^2/21)`` (over ``L_i + mu`` for Newton-type clients), which
with ``m ~ lam / n`` is far too small to be useful: the rule keeps the shape
and replaces the constants by the multipliers. ``1/(L_i + mu)`` is the safe
gradient step on the local augmented Lagrangian and ``a = 1`` the full Newton
step. ``mu="auto"`` is ``0.1 * mean_i L_i``.

Why these defaults (``a = b = 1``, ``mu = 0.1 mean L_i``): measured with
full participation, rounds to a relative loss of 1e-6, ridge and logistic, on
the bundled ``synthetic`` set (10 clients, lam 1e-3) and a standardized
400 x 12 set (4 clients, lam 1e-2), over ``mu / mean L_i`` in 0.01..1 and
``b`` in 0.3..1.5. Smaller penalties are faster until the Newton-type
clients' dual step gets too aggressive: at the defaults FedH-N takes 26-29
rounds (best found 17-21), FedH-G 92-188 (within 20% of the best found).
``b = 1`` halves FedH-N's rounds against ``b = 0.5``; ``b = 1.5`` diverges
for gradient-type clients once ``mu >= 0.06 mean L_i``, so 1 keeps a margin.
Ill-conditioned problems prefer a smaller penalty: on adult (logistic,
lam 1e-4, 10 clients) FedH-N reaches 1e-6 in 320 rounds with
``mu = 0.01 mean L_i`` (about ``sqrt(m_i L_i)``) but only 1.3e-4 in 1000
rounds with the default; tune ``mu`` there, as the paper does by grid search.

**Newton systems.** ``D_i = X_i^T diag(l''(X_i x_i)) X_i / N + (N_i lam / N +
mu) I`` is formed densely and Cholesky-factorised when ``M <= 3000``
(``newton_solver="auto"``); otherwise it is solved by conjugate gradients
with Hessian-vector products to a relative residual of ``cg_tolerance``.
``D_i (x_0 - x_i)`` is always a Hessian-vector product. For the squared loss
``D_i`` does not depend on ``x_i``, so its factor is computed once per client
and reused (while the cached factors take at most 256 MB).

**Cost.** Per round: one sparse product with the block-diagonal stack of the
active clients' blocks and one with its transpose give every active client's
gradient; each active Newton-type client then forms and factorises one
M x M matrix per class. Memory: ``x_i`` and ``lambda_i`` of every client,
``2 n M C`` floats (the algorithm gives every client its own model copy),
plus a transposed copy of each Newton-type client's block.

**Round trips:** 1 per outer iteration (``x_0`` down, ``x_i, lambda_i`` up);
0 if no client is active, since nothing is sent.

**Communication** (``round_stats()``, per round; the engine accumulates).
Algorithm 1 as implemented: the server sends ``x_0`` (all ``M`` features, the
partition is horizontal) to every active client, ``floats_down = A M C``; every
active client sends ``x_i^{k+1}`` and ``lambda_i^{k+1}``, ``floats_up = 2 A M C``.
The consensus update uses nothing else: absent clients' last values are
already at the server, and the step sizes, ``mu`` and the client sizes are
fixed at set-up. (Since the consensus only needs ``x_i - lambda_i / mu``, a
client could send that single (M, C) array and halve the upload; the paper and
this implementation send both.) The local Hessians, gradients and data never
leave a client, and no indices travel (``ids_up = ids_down = 0``).

``client_share_max`` is the busiest active client's share of the round's
client work. The gradient part of every client's update is computed for all
active clients together (one sparse product with the block-diagonal stack and
one with its transpose, plus dense O(M C) work), so its wall time is split
among them in proportion to the stored non-zeros of their blocks; each
Newton-type client's own solve (forming and factorising ``D_i``, or CG, and
``D_i (x_0 - x_i)``) is timed on its own and added to its share. A round of
gradient-type clients only thus gives exactly ``max_k nnz(X_k) / sum_k
nnz(X_k)`` over the active clients; with Newton-type clients the share is a
measured estimate (it varies slightly from run to run). ``server_seconds`` is
the wall time of storing the received ``x_i, lambda_i`` and of
:func:`server_consensus`. All of these are 0 in a round with no active client.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.special import expit

from hyfl._ragged import concat_ranges
from hyfl.algorithms.local_sgd import busiest_share
from hyfl.errors import HyflError, check_choice, check_int, check_positive, fail
from hyfl.losses import Loss
from hyfl.partition import StackedBlocks
from hyfl.problem import Problem
from hyfl.work_clock import work_clock

STEP_SIZES = ("scaled", "raw")
"""What ``a`` and ``b`` are: multipliers of the per-client steps, or the steps themselves.
(The option was called ``step_rule`` until it was renamed, since HyFDCA's ``step_rule``
names its step rules: ``cocoa``, ``safe``, ...)"""
"""How ``a`` and ``b`` become the per-client step sizes ``a_i, b_i``."""

NEWTON_SOLVERS = ("auto", "dense", "cg")
"""How Newton-type clients solve their M x M systems."""

SMOOTH_LOSSES = ("logistic", "squared", "smoothed_hinge")
"""Losses FedHybrid accepts (twice differentiable, or with a generalized Hessian)."""

NEWTON_CHOICES = ("none", "all", "half")
"""Named choices of ``newton_clients`` (besides an integer K or a list of clients)."""

# Largest M for which a Newton-type client forms and factorises its Hessian;
# above it the M x M matrix and its O(M^3) factorisation cost more than CG.
DENSE_MAX_FEATURES = 3000

# mu = this * mean_i L_i when mu="auto" (measurements in the module docstring).
_AUTO_MU_FACTOR = 0.1

# CG stops after this many iterations at the latest; mu and the regularizer
# bound the condition number of D_i, so it is rarely reached.
_CG_MAX_ITERATIONS = 1000

# Cache the squared loss's Hessian factors only while they fit in this many bytes.
_FACTOR_CACHE_BYTES = 256 * 2**20


# ---------------------------------------------------------------------------
# Curvature of the losses
# ---------------------------------------------------------------------------


def second_derivative(loss: Loss, z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``l''(z, y)``, the second derivative of the loss in the margin.

    Parameters
    ----------
    loss : Loss
        Logistic, squared or smoothed hinge.
    z, y : ndarray, same shape
        Margins and labels.

    Returns
    -------
    ndarray, shape of ``z``

    Notes
    -----
    The smoothed hinge is only once differentiable: ``l''`` is ``1/s`` where
    ``1 - s < y z < 1`` and 0 elsewhere (a generalized Hessian; 0 at the two
    kinks).
    """
    if loss.name == "logistic":
        # Labels are +-1, so y^2 = 1: l'' = sigma(yz) sigma(-yz).
        t = y * z
        return expit(t) * expit(-t)
    if loss.name == "squared":
        return np.ones_like(z)
    if loss.name == "smoothed_hinge":
        margin = 1.0 - y * z
        inside = (margin > 0.0) & (margin < loss.smoothing)
        return np.where(inside, 1.0 / loss.smoothing, 0.0)
    raise _loss_error(loss)


def max_second_derivative(loss: Loss) -> float:
    """``sup_z l''(z, y)``: 1/4 (logistic), 1 (squared), 1/smoothing (smoothed hinge)."""
    if loss.name == "logistic":
        return 0.25
    if loss.name == "squared":
        return 1.0
    if loss.name == "smoothed_hinge":
        return 1.0 / loss.smoothing
    raise _loss_error(loss)


def _loss_error(loss: Loss, name: str = "FedHybrid") -> HyflError:
    why = (
        "the hinge loss is not differentiable"
        if loss.name == "hinge"
        else f"the {loss.name} loss has no Hessian that {name} knows"
    )
    return fail(
        name,
        f"needs a smooth loss ({', '.join(SMOOTH_LOSSES)}); {why}",
        "Use --loss logistic, squared or smoothed_hinge, or use hyfdca or fedavg, "
        "which handle the hinge loss",
    )


# ---------------------------------------------------------------------------
# Hyperparameters and engine hooks
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FedHybrid:
    """Hyperparameters of FedHybrid (constructor only stores them).

    Parameters
    ----------
    newton_clients : {"none", "all", "half"}, int or sequence of int, default "none"
        Which clients perform Newton-type updates: none (FedH-G), all
        (FedH-N), the first ``n // 2``, the first ``K`` by index (FedH-K), or
        the listed client indices.
    a : float or sequence of float, default 1.0
        Primal step: the paper's ``a_i`` under ``step_sizes="raw"``, a
        multiplier of the per-client step under ``"scaled"``. A sequence
        gives one value per client.
    b : float or sequence of float, default 1.0
        Dual step, likewise.
    mu : float or "auto", default "auto"
        Penalty of the augmented Lagrangian; ``"auto"`` is ``0.1 * mean_i L_i``.
    step_sizes : {"scaled", "raw"}, default "scaled"
        ``raw``: ``a`` and ``b`` are the steps; ``scaled``: multipliers of per-client
        steps from the local smoothness (the module docstring). Formerly ``step_rule``.
    newton_solver : {"auto", "dense", "cg"}, default "auto"
        ``auto``: Cholesky when ``M <= 3000``, conjugate gradients otherwise.
    cg_tolerance : float, default 1e-10
        Relative residual at which CG stops.
    name : str, default "fedhybrid"
    """

    newton_clients: str | int | tuple[int, ...] = "none"
    a: float | tuple[float, ...] = 1.0
    b: float | tuple[float, ...] = 1.0
    mu: float | str = "auto"
    step_sizes: str = "scaled"
    newton_solver: str = "auto"
    cg_tolerance: float = 1e-10
    name: str = "fedhybrid"

    divergence_hint = "Reduce a or b, or raise mu"
    renamed_options = {"step_rule": "step_sizes"}  # old key -> its name now (errors say so)

    def __post_init__(self) -> None:
        # Frozen and hashable: lists and arrays given by callers become tuples.
        for attr in ("newton_clients", "a", "b"):
            value = getattr(self, attr)
            if isinstance(value, (list, np.ndarray)):
                object.__setattr__(self, attr, tuple(np.asarray(value).tolist()))

    # -- configuration -----------------------------------------------------
    def validated(self) -> FedHybrid:
        """Return self after checking every hyperparameter (raises HyflError)."""
        check_choice("step_sizes", self.step_sizes, STEP_SIZES)
        check_choice("newton_solver", self.newton_solver, NEWTON_SOLVERS)
        check_positive("cg_tolerance", self.cg_tolerance, fix="Pass a tolerance such as 1e-10.")
        if self.mu != "auto":
            check_positive("mu", self.mu, fix='Pass a positive penalty or "auto".')
        for attr in ("a", "b"):
            values = getattr(self, attr)
            if isinstance(values, tuple) and not values:
                raise fail(attr, "is an empty sequence", "Pass a scalar or one value per client.")
            for v in values if isinstance(values, tuple) else (values,):
                check_positive(
                    attr, v, fix=f"Pass a positive step size {attr} (or one per client)."
                )
        nc = self.newton_clients
        fix = 'Pass "none", "all", "half", a number K of Newton-type clients or a list of clients.'
        if isinstance(nc, str):
            check_choice("newton_clients", nc, NEWTON_CHOICES)
        elif isinstance(nc, tuple):
            for k in nc:
                check_int("newton_clients", k, minimum=0, fix="List client indices (>= 0).")
            if len(set(nc)) != len(nc):
                raise fail("newton_clients", f"lists a client twice: {nc}", "List each once.")
        else:
            check_int("newton_clients", nc, minimum=0, fix=fix)
        return self

    def config(self) -> dict[str, Any]:
        return asdict(self)

    def newton_mask(self, n_clients: int) -> np.ndarray:
        """Which of ``n_clients`` clients are Newton-type; bool array of shape (n,)."""
        nc = self.newton_clients
        mask = np.zeros(n_clients, dtype=bool)
        if nc == "all":
            mask[:] = True
        elif nc == "half":
            mask[: n_clients // 2] = True
        elif isinstance(nc, tuple):
            ids = np.asarray(nc, dtype=np.int64)
            if ids.size and ids.max() >= n_clients:
                raise fail(
                    "newton_clients",
                    f"names client {int(ids.max())} but there are {n_clients} clients",
                    f"Client indices run from 0 to {n_clients - 1}.",
                )
            mask[ids] = True
        elif nc != "none":
            k = int(nc)
            if k > n_clients:
                raise fail(
                    "newton_clients",
                    f"is {k} but there are only {n_clients} clients",
                    f'Pass at most {n_clients} (or "all").',
                )
            mask[:k] = True
        return mask

    # -- engine hooks --------------------------------------------------------
    def check_applicable(self, problem: Problem, blocks: StackedBlocks) -> None:
        """Refuse losses without a Hessian and partitions that are not horizontal."""
        check_applicable(problem, blocks)

    def setup(self, problem: Problem, blocks: StackedBlocks) -> FedHybridState:
        self.validated()
        self.check_applicable(problem, blocks)
        n, M, C = blocks.n_clients, problem.n_features, problem.n_outputs
        newton = self.newton_mask(n)
        reg = np.diff(blocks.client_rowptr) * problem.lam / problem.n_samples
        smoothness = client_smoothness(problem, blocks)
        mu = _AUTO_MU_FACTOR * float(np.mean(smoothness)) if self.mu == "auto" else float(self.mu)
        a = _per_client("a", self.a, n)
        b = _per_client("b", self.b, n)
        if self.step_sizes == "scaled":
            a, b = scaled_step_sizes(a, b, mu, smoothness, newton)
        dense = self.newton_solver == "dense" or (
            self.newton_solver == "auto" and M <= DENSE_MAX_FEATURES
        )
        cache = (
            dense
            and problem.loss.name == "squared"
            and np.count_nonzero(newton) * M * M * 8 <= _FACTOR_CACHE_BYTES
        )
        return FedHybridState(
            problem=problem,
            blocks=blocks,
            stacked=block_diagonal(blocks, np.arange(n)),
            newton=newton,
            a=a,
            b=b,
            mu=mu,
            reg=reg,
            dense=dense,
            cache_factors=bool(cache),
            cg_tolerance=float(self.cg_tolerance),
            local_data={int(k): _local_data(blocks, int(k)) for k in np.flatnonzero(newton)},
            x0=np.zeros((M, C)),
            x=np.zeros((n, M, C)),
            lam_dual=np.zeros((n, M, C)),
        )

    def weights(self, state: FedHybridState) -> np.ndarray:
        return state.x0

    def duals(self, state: FedHybridState) -> None:
        # The multipliers lambda_i live in weight space (one per consensus
        # constraint), not the per-sample Fenchel duals a duality gap needs.
        return None

    def round_stats(self, state: FedHybridState) -> dict[str, float]:
        return state.stats

    def round(self, state: FedHybridState, active: np.ndarray, rng: np.random.Generator):
        """One outer iteration of Algorithm 1 for the clients flagged in ``active``.

        ``rng`` is unused: FedHybrid is deterministic given the participation.
        """
        clients = np.flatnonzero(np.asarray(active, dtype=bool))
        t = state.t + 1
        traffic = dict.fromkeys(
            (
                "floats_up",
                "floats_down",
                "ids_up",
                "ids_down",
                "client_share_max",
                "server_seconds",
            ),
            0.0,
        )
        if clients.size == 0:
            stats = {"round_trips": 0.0, "active_clients": 0.0, "newton_clients": 0.0}
            return replace(state, t=t, stats={**stats, "mu": state.mu, **traffic})

        # 1-2. Every active client: gradient of its augmented Lagrangian (one
        # sparse product for all of them), then its gradient- or Newton-type step.
        x_new, dual_new, work = client_updates(state, clients)
        # x_0 down to every active client; x_i and lambda_i up from each.
        traffic["floats_down"] = float(state.x0.size * clients.size)
        traffic["floats_up"] = float(x_new.size + dual_new.size)
        traffic["client_share_max"] = busiest_share(work)
        start = work_clock()
        state.x[clients] = x_new
        state.lam_dual[clients] = dual_new

        # 3. Server: consensus over all n clients (absent ones as last sent).
        x0 = server_consensus(state.x, state.lam_dual, state.mu)
        traffic["server_seconds"] = work_clock() - start
        if not np.all(np.isfinite(x0)):
            raise fail(
                "FedHybrid",
                f"diverged in round {t} (the server's model is no longer finite) with "
                f"mu={state.mu:.3g}, a={self.a}, b={self.b}",
                "Reduce a or b, or raise mu",
            )
        stats = {
            "round_trips": 1.0,
            "active_clients": float(clients.size),
            "newton_clients": float(np.count_nonzero(state.newton[clients])),
            "mu": state.mu,
            **traffic,
        }
        return replace(state, x0=x0, t=t, stats=stats)


@dataclass
class FedHybridState:
    """Everything FedHybrid keeps between outer iterations.

    Attributes
    ----------
    x0 : ndarray, shape (M, C)
        The server's model.
    x, lam_dual : ndarray, shape (n, M, C)
        Every client's primal copy ``x_i`` and multiplier ``lambda_i`` (the
        server holds the values each client last sent, which equal these).
    stacked : csr_matrix, shape (R, n M)
        All client blocks side by side (:func:`block_diagonal`).
    newton : ndarray of bool, shape (n,)
    a, b : ndarray, shape (n,)
        Resolved step sizes ``a_i, b_i``.
    mu : float
    reg : ndarray, shape (n,)
        The regularizer's share ``N_i lam / N`` of each client.
    local_data : dict
        Newton-type clients' ``(X_i, X_i^T, entry rows)``, by client: their
        own block and its transpose, kept so that forming ``D_i`` each round
        needs no slicing or transposing.
    factors : dict
        Cholesky factors of the squared loss's constant ``D_i``, by client.
    """

    problem: Problem
    blocks: StackedBlocks
    stacked: sp.csr_matrix
    newton: np.ndarray
    a: np.ndarray
    b: np.ndarray
    mu: float
    reg: np.ndarray
    dense: bool
    cache_factors: bool
    cg_tolerance: float
    x0: np.ndarray
    x: np.ndarray
    lam_dual: np.ndarray
    local_data: dict = field(default_factory=dict)
    factors: dict = field(default_factory=dict)
    t: int = 0
    stats: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------
# Set-up helpers
# ---------------------------------------------------------------------------


def check_applicable(problem: Problem, blocks: StackedBlocks, name: str = "FedHybrid") -> None:
    """Refuse losses without a Hessian and partitions that are not horizontal (the
    second-order methods' domain; ``name`` is the algorithm the errors name)."""
    if not problem.loss.smooth or problem.loss.name not in SMOOTH_LOSSES:
        raise _loss_error(problem.loss, name)
    M = blocks.n_features
    fix = (
        "Split by samples only (partition 'horizontal:K'), or use hyfdca, which "
        "handles hybrid and vertical partitions"
    )
    for k, features in enumerate(blocks.client_features):
        if len(features) != M:
            raise fail(
                name,
                f"needs a horizontal partition (every client holds whole samples, all "
                f"{M} features); client {k} holds {len(features)} of them",
                fix,
            )
    shared = np.flatnonzero(blocks.n_holders != 1)
    if shared.size:
        i = int(shared[0])
        raise fail(
            name,
            f"needs a horizontal partition (every sample held by one client); sample {i} "
            f"is held by {int(blocks.n_holders[i])} clients",
            fix,
        )


def _per_client(name: str, value, n: int) -> np.ndarray:
    """A scalar or one value per client, as a float array of shape (n,)."""
    if isinstance(value, tuple):
        if len(value) != n:
            raise fail(
                name,
                f"has {len(value)} values but there are {n} clients",
                "Pass a scalar or exactly one value per client.",
            )
        return np.asarray(value, dtype=float)
    return np.full(n, float(value))


def _client_rows(blocks: StackedBlocks, k: int) -> slice:
    return slice(int(blocks.client_rowptr[k]), int(blocks.client_rowptr[k + 1]))


def _local_data(blocks: StackedBlocks, k: int):
    """Client k's block (N_k, M) as CSR, its transpose as CSR, and each entry's row."""
    Xk = blocks.X[_client_rows(blocks, k)]
    entry_rows = np.repeat(np.arange(Xk.shape[0], dtype=np.int64), np.diff(Xk.indptr))
    return Xk, Xk.T.tocsr(), entry_rows


def client_smoothness(problem: Problem, blocks: StackedBlocks) -> np.ndarray:
    """Local smoothness ``L_i = sup l'' ||X_i||_2^2 / N + N_i lam / N`` of every client.

    ``||X_i||_2^2``, the largest eigenvalue of ``X_i^T X_i``, is computed
    exactly from the smaller Gram matrix when ``min(N_i, M) <= 3000``, and by
    Lanczos (ARPACK, fixed start vector) otherwise.

    Returns
    -------
    ndarray, shape (n,)
    """
    N, lam = problem.n_samples, problem.lam
    curvature = max_second_derivative(problem.loss) * problem.max_weight
    out = np.empty(blocks.n_clients)
    for k in range(blocks.n_clients):
        Xk = blocks.X[_client_rows(blocks, k)]
        out[k] = curvature * _squared_norm(Xk) / N + Xk.shape[0] * lam / N
    return out


def _squared_norm(Xk: sp.csr_matrix) -> float:
    """``||X_k||_2^2`` (largest squared singular value)."""
    rows, cols = Xk.shape
    if min(rows, cols) <= DENSE_MAX_FEATURES:
        gram = (Xk @ Xk.T if rows < cols else Xk.T @ Xk).toarray()
        return float(np.linalg.eigvalsh(gram)[-1])
    import scipy.sparse.linalg as spla

    op = spla.LinearOperator((cols, cols), matvec=lambda v: Xk.T @ (Xk @ v), dtype=float)
    value = spla.eigsh(op, k=1, which="LA", v0=np.ones(cols), tol=1e-6)[0][0]
    return float(value) * (1.0 + 1e-5)  # Lanczos approaches from below


def scaled_step_sizes(a, b, mu, smoothness, newton):
    """The ``scaled`` rule: per-client ``a_i, b_i`` from the multipliers ``a, b``.

    Parameters
    ----------
    a, b : ndarray, shape (n,)
        Multipliers, one per client.
    mu : float
    smoothness : ndarray, shape (n,)
        ``L_i`` of the local objectives.
    newton : ndarray of bool, shape (n,)

    Returns
    -------
    a_i, b_i : ndarray, shape (n,)
        Gradient-type: ``a / (L_i + mu)`` and ``b mu``; Newton-type: ``a``
        and ``b mu / (L_i + mu)``.
    """
    a_i = np.where(newton, a, a / (smoothness + mu))
    b_i = np.where(newton, b * mu / (smoothness + mu), b * mu)
    return a_i, b_i


def block_diagonal(blocks: StackedBlocks, clients: np.ndarray) -> sp.csr_matrix:
    """The given clients' blocks side by side, client ``clients[j]`` at columns ``jM..jM+M``.

    Multiplying by the (A M, C) stack of those clients' ``x_i`` gives every
    one's margins ``X_i x_i`` in one sparse product.

    Parameters
    ----------
    clients : ndarray of int, shape (A,)
        Ascending client indices.

    Returns
    -------
    csr_matrix, shape (R_A, A M)
        Rows: the clients' stacked rows, client by client.
    """
    M = blocks.n_features
    sizes = np.diff(blocks.client_rowptr)[clients]
    if clients.size == blocks.n_clients:
        X = blocks.X
    else:
        X = blocks.X[concat_ranges(blocks.client_rowptr[clients], sizes)]
    position = np.repeat(np.arange(clients.size, dtype=np.int64), sizes)
    shift = np.repeat(position * M, np.diff(X.indptr))
    return sp.csr_matrix(
        (X.data, X.indices + shift, X.indptr), shape=(X.shape[0], clients.size * M)
    )


# ---------------------------------------------------------------------------
# Client and server halves
# ---------------------------------------------------------------------------


def client_updates(state: FedHybridState, clients: np.ndarray):
    """Lines 4-11 of Algorithm 1 for the active clients.

    Parameters
    ----------
    clients : ndarray of int, shape (A,)
        Active clients, ascending.

    Returns
    -------
    x_new, dual_new : ndarray, shape (A, M, C)
        ``x_i^{k+1}`` and ``lambda_i^{k+1}`` of the active clients.
    work : ndarray, shape (A,)
        Estimated seconds of client work of each active client: the wall time
        of the joint gradient part split in proportion to the clients' stored
        non-zeros, plus each Newton-type client's own timed solve.
    """
    problem, blocks = state.problem, state.blocks
    A = clients.size
    M, C = state.x0.shape
    x = state.x[clients]
    dual = state.lam_dual[clients]
    sizes = np.diff(blocks.client_rowptr)[clients]
    if A == blocks.n_clients:
        B, samples = state.stacked, blocks.row_sample
    else:
        B = block_diagonal(blocks, clients)
        samples = blocks.row_sample[concat_ranges(blocks.client_rowptr[clients], sizes)]
    # Stored non-zeros of each active client's block (its rows are contiguous).
    indptr = blocks.X.indptr
    nnz = (
        indptr[blocks.client_rowptr[clients + 1]] - indptr[blocks.client_rowptr[clients]]
    ).astype(np.float64)
    start = work_clock()
    z = np.asarray(B @ x.reshape(A * M, C))
    derivative = problem.loss.derivative(z, problem.Y[samples], problem.weights_of(samples))
    gradient = np.asarray(B.T @ derivative).reshape(A, M, C) / problem.n_samples
    gradient += state.reg[clients, None, None] * x

    # Gradient of the local augmented Lagrangian and the consensus gap.
    g = gradient - dual + state.mu * (x - state.x0)
    gap = state.x0 - x
    # Gradient-type step for everyone; Newton-type clients are overwritten below.
    x_new = x - state.a[clients, None, None] * g
    dual_new = dual + state.b[clients, None, None] * gap
    joint = work_clock() - start
    total_nnz = float(nnz.sum())
    work = joint * (nnz / total_nnz if total_nnz > 0 else np.full(A, 1.0 / A))
    rowptr = np.concatenate(([0], np.cumsum(sizes)))
    for j in np.flatnonzero(state.newton[clients]):
        k = int(clients[j])
        start = work_clock()
        step, dual_step = newton_directions(state, k, z[rowptr[j] : rowptr[j + 1]], g[j], gap[j])
        x_new[j] = x[j] - state.a[k] * step
        dual_new[j] = dual[j] + state.b[k] * dual_step
        work[j] += work_clock() - start
    return x_new, dual_new, work


def newton_directions(state: FedHybridState, k: int, z: np.ndarray, g, gap):
    """A Newton-type client's ``D_k^{-1} g`` and ``D_k gap``.

    ``D_k = hess f_k(x_k) + mu I = X_k^T diag(l''(z)) X_k / N + (N_k lam / N + mu) I``,
    one matrix per class.

    Parameters
    ----------
    k : int
    z : ndarray, shape (N_k, C)
        The client's margins ``X_k x_k``.
    g : ndarray, shape (M, C)
        Gradient of the local augmented Lagrangian.
    gap : ndarray, shape (M, C)
        ``x_0 - x_k``.

    Returns
    -------
    step, dual_step : ndarray, shape (M, C)
    """
    problem, blocks = state.problem, state.blocks
    Xk, XkT, entry_rows = state.local_data[k]
    N = problem.n_samples
    shift = state.reg[k] + state.mu
    own = blocks.row_sample[_client_rows(blocks, k)]
    d = second_derivative(problem.loss, z, problem.Y[own])
    if problem.W is not None:  # (c l)'' = c l''
        d = d * problem.W[own]

    def hess_vec(v):
        return np.asarray(XkT @ (d * np.asarray(Xk @ v))) / N + shift * v

    if not state.dense:
        return conjugate_gradients(hess_vec, g, state.cg_tolerance), hess_vec(gap)
    factors = state.factors.get(k)
    if factors is None:
        # The squared loss has one Hessian for every class (l'' = 1).
        columns = 1 if problem.loss.name == "squared" else z.shape[1]
        factors = []
        for c in range(columns):
            # X_k^T diag(d_c) X_k: scale the entries of each row by its d.
            scaled = sp.csr_matrix((Xk.data * d[entry_rows, c], Xk.indices, Xk.indptr), Xk.shape)
            H = (XkT @ scaled).toarray() / N
            H[np.diag_indices_from(H)] += shift
            factors.append(scipy.linalg.cho_factor(H, lower=True, check_finite=False))
        if state.cache_factors:
            state.factors[k] = factors
    step = np.empty_like(g)
    for c in range(g.shape[1]):
        factor = factors[c if len(factors) > 1 else 0]
        step[:, c] = scipy.linalg.cho_solve(factor, g[:, c], check_finite=False)
    return step, hess_vec(gap)


def conjugate_gradients(hess_vec, rhs: np.ndarray, tolerance: float) -> np.ndarray:
    """Conjugate gradients for all columns of ``rhs`` at once (one SPD system per column).

    Parameters
    ----------
    hess_vec : callable
        ``(M, C) -> (M, C)``, column ``c`` multiplied by the class-``c`` matrix.
    rhs : ndarray, shape (M, C)
    tolerance : float
        Stop a column when its residual norm is below ``tolerance`` times the
        norm of its right-hand side.

    Returns
    -------
    ndarray, shape (M, C)
    """
    x = np.zeros_like(rhs)
    r = rhs.copy()
    p = r.copy()
    rr = np.sum(r * r, axis=0)
    stop = tolerance**2 * rr
    for _ in range(_CG_MAX_ITERATIONS):
        running = rr > stop
        if not running.any():
            break
        Hp = hess_vec(p)
        curvature = np.sum(p * Hp, axis=0)
        # Finished columns take no further step (their p may be zero).
        step = np.where(running, rr / np.where(running, curvature, 1.0), 0.0)
        x += step * p
        r -= step * Hp
        rr_new = np.sum(r * r, axis=0)
        p = r + np.where(running, rr_new / np.where(running, rr, 1.0), 0.0) * p
        rr = rr_new
    return x


def server_consensus(x: np.ndarray, lam_dual: np.ndarray, mu: float) -> np.ndarray:
    """``x_0 = 1/n sum_i x_i - 1/(mu n) sum_i lambda_i`` (Algorithm 1, line 12).

    Parameters
    ----------
    x, lam_dual : ndarray, shape (n, M, C)
    mu : float

    Returns
    -------
    ndarray, shape (M, C)
    """
    n = x.shape[0]
    return x.sum(axis=0) / n - lam_dual.sum(axis=0) / (mu * n)
