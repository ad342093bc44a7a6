"""DiSCO: distributed inexact damped Newton (Zhang and Lin, ICML 2015).

FedHybrid's second-order baseline (``fedhybrid.md``, section 5). Over a horizontal
partition (client ``i`` holds whole samples ``I_i``), one outer iteration is one
inexact damped Newton step on ``P(w) = lam/2 ||w||^2 + 1/N sum_j l(x_j^T w, y_j)``:

1. The server sends ``w`` to the active clients; each returns its part of the
   gradient, ``X_i^T l'(X_i w) / N``; the server adds ``lam w``: ``g``.
2. The Newton system ``H v = g`` (``H`` the Hessian at ``w``) is solved to the
   relative residual ``||H v - g|| <= beta sqrt(lam / L) ||g||`` (the paper's
   tolerance, ``L`` the smoothness of ``P``) by preconditioned conjugate gradients.
   Each PCG iteration is an exchange: the server sends the search direction
   ``u``, every active client returns ``X_i^T D_i X_i u / N`` (``D_i`` its
   samples' ``l''``), the server adds ``lam u``. The preconditioner is the
   first active client's own Hessian, ``P = X_1^T D_1 X_1 / N_1 + (lam + mu) I``
   (the "master" machine of the paper; ``mu`` is the ``shift`` hyperparameter here, so
   that ``--mu`` of the other algorithms does not reach it): the server sends it the
   residual and it
   returns ``P^{-1} r``, one more exchange with that client only.
3. The damped step: ``w <- w - v / (1 + delta)``, ``delta = sqrt(v^T H v)`` (the
   Newton decrement, which PCG yields without another product).

Each outer iteration therefore costs ``2 + 2 k`` exchanges for ``k`` PCG
iterations (the last preconditioning is skipped once the residual is small):
the ``round_trips`` figure counts them all, so DiSCO's few Newton steps are
compared with the others at their real number of messages.

**Partial participation.** The paper assumes every machine answers. Here the
round's Newton system is built from the active clients' samples only, their
sums scaled by ``N / N_A`` (a subsampled Newton step); with full participation it
is exactly DiSCO. The preconditioner belongs to the first active client.

Multiclass problems are one-vs-rest: every column is its own Newton system,
solved side by side (the exchanges are shared). Sample weights scale ``l'`` and
``l''`` (:mod:`hyfl.losses`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from hyfl.algorithms.fedhybrid import (
    DENSE_MAX_FEATURES,
    check_applicable,
    conjugate_gradients,
    max_second_derivative,
    second_derivative,
)
from hyfl.algorithms.local_sgd import busiest_share
from hyfl.errors import check_int, check_positive, check_range, fail
from hyfl.partition import StackedBlocks
from hyfl.problem import Problem
from hyfl.work_clock import work_clock

DEFAULT_BETA = 0.05
"""The paper's ``beta`` (1/20) of the PCG tolerance ``beta sqrt(lam / L) ||g||``."""

INNER_TOLERANCE = 1e-12
"""Relative residual of the master's own solve with ``P`` when it is too large to factor."""


@dataclass(frozen=True)
class DiSCO:
    """Hyperparameters of DiSCO (constructor only stores them).

    Parameters
    ----------
    beta : float, default 0.05
        PCG stops at the relative residual ``beta sqrt(lam / L)``.
    shift : float, default 0.0
        Added to the preconditioner's diagonal (the paper's ``mu``); the
        regularizer ``lam`` already makes it positive definite.
    max_pcg_iterations : int, default 100
        Most PCG iterations (exchanges) of one Newton step.
    name : str, default "disco"
    """

    beta: float = DEFAULT_BETA
    shift: float = 0.0
    max_pcg_iterations: int = 100
    name: str = "disco"

    divergence_hint = "Lower beta (solve the Newton systems more exactly)"

    def validated(self) -> DiSCO:
        """Return self after checking every hyperparameter (raises HyflError)."""
        check_positive("beta", self.beta, fix="Pass a positive tolerance factor such as 0.05.")
        check_range("shift", self.shift, 0.0,
                    fix="Pass the preconditioner's extra diagonal, e.g. 0.")
        check_int("max_pcg_iterations", self.max_pcg_iterations, minimum=1)
        return self

    def config(self) -> dict[str, Any]:
        return asdict(self)

    # -- engine hooks --------------------------------------------------------
    def check_applicable(self, problem: Problem, blocks: StackedBlocks) -> None:
        """Refuse losses without a Hessian and partitions that are not horizontal."""
        check_applicable(problem, blocks, "DiSCO")

    def setup(self, problem: Problem, blocks: StackedBlocks) -> DiSCOState:
        self.validated()
        self.check_applicable(problem, blocks)
        # L of P: sup l'' * max ||x_j||^2 bounds ||X^T D X|| / N from above row by row.
        X = blocks.X
        row_norms = np.asarray(X.multiply(X).sum(axis=1)).ravel()
        L = (max_second_derivative(problem.loss) * problem.max_weight
             * float(row_norms.max(initial=0.0)) + problem.lam)
        return DiSCOState(
            problem=problem,
            blocks=blocks,
            tolerance=float(self.beta) * float(np.sqrt(problem.lam / L)),
            w=np.zeros((problem.n_features, problem.n_outputs)),
        )

    def weights(self, state: DiSCOState) -> np.ndarray:
        return state.w

    def duals(self, state: DiSCOState) -> None:
        return None

    def round_stats(self, state: DiSCOState) -> dict[str, float]:
        return state.stats

    def round(self, state: DiSCOState, active: np.ndarray, rng: np.random.Generator):
        """One damped Newton step from the active clients' samples (``rng`` unused)."""
        clients = np.flatnonzero(np.asarray(active, dtype=bool))
        t = state.t + 1
        if clients.size == 0:
            stats = {"round_trips": 0.0, "active_clients": 0.0, "pcg_iterations": 0.0,
                     "newton_decrement": 0.0, "floats_up": 0.0, "floats_down": 0.0,
                     "ids_up": 0.0, "ids_down": 0.0, "client_share_max": 0.0,
                     "server_seconds": 0.0}
            return replace(state, t=t, stats=stats)
        problem, blocks = state.problem, state.blocks
        local = active_system(problem, blocks, clients, state.w)
        M, C = state.w.shape
        step, decrement, iterations, exchanges, server_seconds = newton_step(
            local, state.w, state.tolerance, float(self.shift), int(self.max_pcg_iterations))
        w = state.w - step
        if not np.all(np.isfinite(w)):
            raise fail("DiSCO", f"diverged in round {t} (the model is no longer finite)",
                       self.divergence_hint)
        # Every exchange with all active clients sends a vector down and one up each; the
        # master's preconditioning exchanges send the residual down and P^-1 r up.
        all_clients = 1 + iterations  # the gradient, then one product per PCG iteration
        master = exchanges - all_clients
        floats = float(M * C * (all_clients * clients.size + master))
        work = local.nnz * (1 + 2 * iterations)  # a gradient, then two products per iteration
        work[0] += local.nnz[0] * 2 * master  # the master's own solves (at least its products)
        stats = {
            "round_trips": float(exchanges),
            "active_clients": float(clients.size),
            "pcg_iterations": float(iterations),
            "newton_decrement": float(np.mean(decrement)),
            "floats_up": floats,
            "floats_down": floats,
            "ids_up": 0.0,  # every exchange covers all of a client's samples: no ids travel
            "ids_down": 0.0,
            "client_share_max": busiest_share(work.astype(np.float64)),
            "server_seconds": server_seconds,
        }
        return replace(state, w=w, t=t, stats=stats)


@dataclass
class DiSCOState:
    """What DiSCO keeps between outer iterations: the model and the PCG tolerance."""

    problem: Problem
    blocks: StackedBlocks
    tolerance: float
    w: np.ndarray
    t: int = 0
    stats: dict = field(default_factory=dict)


@dataclass
class ActiveSystem:
    """The round's data: the active clients' rows, curvatures and gradient.

    Attributes
    ----------
    X : csr_matrix, shape (n_A, M)
        The active clients' samples, client after client (the master's first).
    curvature : ndarray, shape (n_A, C)
        ``l''`` (times the sample weights) of each row at ``w``.
    gradient : ndarray, shape (M, C)
        ``X_A^T l' / n_A + lam w``: the gradient of ``P`` estimated from the active
        samples (exact with every client active).
    master_rows : int
        The first active client's number of rows (the first rows of ``X``).
    nnz : ndarray of int, shape (A,)
        Stored non-zeros of every active client (its work per product).
    lam : float
    """

    X: sp.csr_matrix
    curvature: np.ndarray
    gradient: np.ndarray
    master_rows: int
    nnz: np.ndarray
    lam: float

    def hessian_product(self, u: np.ndarray) -> np.ndarray:
        """``H u = X^T D X u / n_A + lam u`` for every column of ``u`` (M, C): the sum of
        the active clients' answers."""
        return (np.asarray(self.X.T @ (self.curvature * np.asarray(self.X @ u)))
                / self.X.shape[0] + self.lam * u)


def active_system(problem: Problem, blocks: StackedBlocks, clients: np.ndarray,
                  w: np.ndarray) -> ActiveSystem:
    """The active clients' gradient and curvature at ``w`` (their client halves, stacked)."""
    starts, ends = blocks.client_rowptr[clients], blocks.client_rowptr[clients + 1]
    rows = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends)])
    X = blocks.X[rows]
    samples = blocks.row_sample[rows]
    z = np.asarray(X @ w)
    y, weight = problem.Y[samples], problem.weights_of(samples)
    curvature = second_derivative(problem.loss, z, y)
    if weight is not None:  # (c l)'' = c l''
        curvature = curvature * weight
    slope = problem.loss.derivative(z, y, weight)
    gradient = np.asarray(X.T @ slope) / X.shape[0] + problem.lam * w
    nnz = (blocks.X.indptr[ends] - blocks.X.indptr[starts]).astype(np.int64)
    return ActiveSystem(X=X, curvature=curvature, gradient=gradient,
                        master_rows=int(ends[0] - starts[0]), nnz=nnz, lam=problem.lam)


def master_preconditioner(system: ActiveSystem, shift: float):
    """``r -> P^{-1} r`` with ``P = X_1^T D_1 X_1 / N_1 + (lam + shift) I`` (the first active
    client's Hessian; Cholesky per column up to :data:`DENSE_MAX_FEATURES` features,
    conjugate gradients beyond)."""
    X1 = system.X[: system.master_rows]
    D1 = system.curvature[: system.master_rows]
    n1, M = X1.shape
    diagonal = system.lam + shift
    if M > DENSE_MAX_FEATURES:
        def product(v):
            return np.asarray(X1.T @ (D1 * np.asarray(X1 @ v))) / n1 + diagonal * v

        return lambda r: conjugate_gradients(product, r, INNER_TOLERANCE)
    factors = []
    for c in range(D1.shape[1]):
        scaled = sp.diags(D1[:, c]) @ X1
        P = np.asarray((X1.T @ scaled).todense()) / n1
        P[np.diag_indices_from(P)] += diagonal
        factors.append(scipy.linalg.cho_factor(P, lower=True, check_finite=False))

    def solve(r):
        return np.column_stack([scipy.linalg.cho_solve(f, r[:, c], check_finite=False)
                                for c, f in enumerate(factors)])

    return solve


def newton_step(system: ActiveSystem, w: np.ndarray, tolerance: float, shift: float,
                max_iterations: int):
    """DiSCO's damped step from the round's system: PCG on ``H v = g`` per column.

    Returns
    -------
    step : ndarray, shape (M, C)
        ``v / (1 + delta)`` per column.
    decrement : ndarray, shape (C,)
        ``delta = sqrt(v^T H v)``.
    iterations : int
        PCG iterations (products with ``H``, one exchange each).
    exchanges : int
        All exchanges of the round: the gradient, the products and the master's
        preconditioning.
    server_seconds : float
        The server's work (the PCG updates), measured.
    """
    g = system.gradient
    precondition = master_preconditioner(system, shift)
    v = np.zeros_like(g)
    Hv = np.zeros_like(g)
    r = g.copy()
    stop = tolerance * np.sqrt(np.sum(g * g, axis=0))
    running = np.sqrt(np.sum(r * r, axis=0)) > stop
    exchanges, iterations, server_seconds = 1, 0, 0.0
    if running.any():
        s = precondition(r)
        exchanges += 1
        u = s.copy()
        rs = np.sum(r * s, axis=0)
        while iterations < max_iterations:
            Hu = system.hessian_product(u)
            exchanges += 1
            iterations += 1
            start = work_clock()
            curvature = np.sum(u * Hu, axis=0)
            # Finished columns take no further step (their u may be zero).
            alpha = np.where(running, rs / np.where(running, curvature, 1.0), 0.0)
            v += alpha * u
            Hv += alpha * Hu
            r -= alpha * Hu
            running &= np.sqrt(np.sum(r * r, axis=0)) > stop
            server_seconds += work_clock() - start
            if not running.any():
                break
            s = precondition(r)
            exchanges += 1
            start = work_clock()
            rs_new = np.sum(r * s, axis=0)
            u = s + np.where(running, rs_new / np.where(running, rs, 1.0), 0.0) * u
            rs = rs_new
            server_seconds += work_clock() - start
    decrement = np.sqrt(np.maximum(np.sum(v * Hv, axis=0), 0.0))
    return v / (1.0 + decrement), decrement, iterations, exchanges, server_seconds
