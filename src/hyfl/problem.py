"""The regularized problem, its Fenchel dual, and the centralized reference.

    P(w) = lam/2 ||w||^2 + 1/N sum_i c_i l(x_i^T w, y_i)
    D(a) = -lam/2 ||A a||^2 - 1/N sum_i c_i l*(-a_i / c_i),   A a = X^T a / (lam N)

with sample weights ``c_i > 0`` (all 1 unless given; see :mod:`hyfl.losses`).

Labels are always stored as a matrix ``Y`` of shape (N, C): binary problems
have C = 1; multiclass problems are one-vs-rest with ``Y[i, c] = +1`` for the
true class and -1 otherwise, so the weights are (M, C) and the duals (N, C).
The objective of a one-vs-rest problem is the sum over classes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from hyfl._io import read_npz
from hyfl.data.dataset import Dataset
from hyfl.errors import HyflError, check_positive, fail
from hyfl.losses import Loss, get_loss
from hyfl.metrics import RANKING_METRICS, ranking_metrics


@dataclass(frozen=True)
class Problem:
    """A training problem: data, labels, loss and regularization.

    Parameters
    ----------
    X : csr_matrix, shape (N, M)
    Y : ndarray, shape (N, C)
        Encoded labels (see module docstring).
    loss : Loss
    lam : float
        Regularization strength, > 0.
    classes : ndarray, shape (C,) or None
        Original class labels of a multiclass problem (column order of Y).
    W : ndarray, shape (N, C) or None
        Sample weights ``c_i > 0``, repeated over the one-vs-rest columns (the
        shape of ``Y``, so that every slice of ``Y`` has its slice of ``W``);
        None: all 1.
    """

    X: sp.csr_matrix
    Y: np.ndarray
    loss: Loss
    lam: float
    classes: np.ndarray | None = None
    W: np.ndarray | None = None

    @property
    def n_samples(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    @property
    def n_outputs(self) -> int:
        return self.Y.shape[1]

    # -- objectives --------------------------------------------------------
    def primal(self, w: np.ndarray) -> float:
        """``P(w)`` for weights of shape (M, C)."""
        z = self.X @ w
        return float(0.5 * self.lam * np.sum(w * w)
                     + np.sum(self.loss.value(z, self.Y, self.W)) / self.n_samples)

    def primal_gradient(self, w: np.ndarray) -> np.ndarray:
        """(Sub)gradient of ``P`` at ``w``, shape (M, C)."""
        z = self.X @ w
        return self.lam * w + self.X.T @ self.loss.derivative(z, self.Y, self.W) / self.n_samples

    def weights_of_duals(self, alpha: np.ndarray) -> np.ndarray:
        """``w(alpha) = X^T alpha / (lam N)``, shape (M, C)."""
        return np.asarray(self.X.T @ alpha) / (self.lam * self.n_samples)

    def dual(self, alpha: np.ndarray) -> float:
        """``D(alpha)`` for duals of shape (N, C); ``-inf`` if infeasible."""
        v = self.weights_of_duals(alpha)
        return float(
            -0.5 * self.lam * np.sum(v * v)
            - np.sum(self.loss.conjugate(alpha, self.Y, self.W)) / self.n_samples
        )

    @property
    def max_weight(self) -> float:
        """The largest sample weight (1 unweighted): it scales the losses' curvature bounds."""
        return 1.0 if self.W is None else float(np.max(self.W))

    def weights_of(self, rows) -> np.ndarray | None:
        """The sample weights of ``rows`` (shape of ``Y[rows]``), None when unweighted."""
        return None if self.W is None else self.W[rows]

    def duality_gap(self, w: np.ndarray, alpha: np.ndarray) -> float:
        """``P(w) - D(alpha)``: an upper bound on both suboptimalities."""
        return self.primal(w) - self.dual(alpha)

    # -- prediction --------------------------------------------------------
    def predict(self, X: sp.spmatrix, w: np.ndarray) -> np.ndarray:
        """Predicted labels (±1, class labels, or real values for regression)."""
        scores = np.asarray(X @ w)
        if self.classes is not None:
            return self.classes[np.argmax(scores, axis=1)]
        if self.loss.classification or _is_pm1(self.Y):
            return np.where(scores[:, 0] >= 0, 1.0, -1.0)
        return scores[:, 0]

    def accuracy(self, X: sp.spmatrix, y: np.ndarray, w: np.ndarray) -> float:
        """Fraction of correct predictions; NaN for a regression target."""
        if not self.has_classes:
            return float("nan")
        return float(np.mean(self.predict(X, w) == y))

    def ranking(self, X: sp.spmatrix, y: np.ndarray, w: np.ndarray) -> dict[str, float]:
        """AUC, KS and average precision of the decision values ``X @ w`` against the
        labels ``y`` (:func:`hyfl.metrics.ranking_metrics`); NaN for a regression target."""
        if not self.has_classes:
            return dict.fromkeys(RANKING_METRICS, float("nan"))
        return ranking_metrics(np.asarray(X @ w), y, self.classes)

    @property
    def has_classes(self) -> bool:
        """Whether the labels are classes (accuracy and ranking metrics are defined)."""
        return self.classes is not None or self.loss.classification or _is_pm1(self.Y)


def _is_pm1(Y: np.ndarray) -> bool:
    return bool(np.all((Y == 1.0) | (Y == -1.0)))


def make_problem(data: Dataset, loss: str | Loss = "hinge", lam: float = 1e-4, *,
                 sample_weight=None, **loss_options):
    """Encode a dataset's labels for ``loss`` and bundle the problem.

    Parameters
    ----------
    data : Dataset
    loss : str or Loss, default "hinge"
        Registry name (``hyfl.losses.LOSSES``) or instance.
    lam : float, default 1e-4
        Regularization strength.
    sample_weight : array of shape (N,), optional
        Positive finite weight of each sample's loss (see :func:`check_sample_weight`).

    Returns
    -------
    Problem
    """
    loss = get_loss(loss, **loss_options)
    lam = check_positive("lam", lam, fix="Pass a positive regularization strength, e.g. 1e-4.")
    if data.n_samples == 0:
        raise fail(f"dataset {data.name!r}", "has no samples", "Check the input file.")
    from hyfl.data.loaders import check_values  # the loaders' one finiteness rule

    X = sp.csr_matrix(data.X, dtype=np.float64)
    source = f"dataset {data.name!r}"
    check_values(
        X.data,
        source,
        lambda e: f"in row {int(np.searchsorted(X.indptr, e, side='right'))} (1-based)",
        "feature value",
    )
    y = np.asarray(data.y, dtype=np.float64)
    check_values(y, source, lambda r: f"in row {r + 1} (1-based)", "label")
    classes = None
    if data.task == "multiclass":
        classes = np.unique(data.y)
        Y = np.where(np.asarray(data.y)[:, None] == classes[None, :], 1.0, -1.0)
    elif data.task == "regression":
        if loss.classification:
            raise fail(
                f"loss {loss.name!r}",
                f"needs class labels but dataset {data.name!r} is a regression target",
                "Use --loss squared for real-valued targets.",
            )
        Y = y[:, None]
    else:
        Y = y[:, None]
    loss.check_labels(Y)
    W = None
    if sample_weight is not None:
        weight = check_sample_weight(sample_weight, data.n_samples, source)
        W = np.repeat(weight[:, None], Y.shape[1], axis=1)
    return Problem(X=X, Y=Y, loss=loss, lam=lam, classes=classes, W=W)


def check_sample_weight(weight, n_samples: int, source: str = "the data") -> np.ndarray:
    """``weight`` as a float array of shape (n_samples,), every entry finite and > 0.

    A zero weight would leave a sample's dual without a domain; drop such samples
    instead (their loss counts for nothing).
    """
    try:
        weight = np.asarray(weight, dtype=np.float64)
    except (TypeError, ValueError):
        raise fail("sample weights", f"of {source} are not numbers",
                   "Pass one positive number per sample.") from None
    if weight.shape != (n_samples,):
        raise fail("sample weights", f"have shape {weight.shape}, but {source} has "
                   f"{n_samples} samples", "Pass one weight per sample.")
    bad = np.flatnonzero(~np.isfinite(weight) | (weight <= 0))
    if bad.size:
        raise fail("sample weights", f"must be finite and > 0, but row {bad[0] + 1} "
                   f"(1-based) has {weight[bad[0]]!r}"
                   + (f" ({bad.size} such rows)" if bad.size > 1 else ""),
                   "Drop the samples of weight 0 (they count for nothing) and fix the others.")
    return weight


# ---------------------------------------------------------------------------
# Centralized reference solver
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Optimum:
    """Result of the centralized reference solver.

    Attributes
    ----------
    w : ndarray, shape (M, C)
    primal : float
        ``P* = P(w)``.
    method : str
        Which solver produced it.
    info : dict
        Solver diagnostics (e.g. the norm of the gradient for smooth losses).
    """

    w: np.ndarray
    primal: float
    method: str
    info: dict = field(default_factory=dict)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hyfl" / "optimum"


def _problem_key(problem: Problem, tol: float) -> str:
    h = hashlib.sha256()
    X = problem.X
    for arr in (X.indptr, X.indices, X.data, problem.Y):
        h.update(np.ascontiguousarray(arr).tobytes())
    if problem.W is not None:
        h.update(b"weights" + np.ascontiguousarray(problem.W).tobytes())
    h.update(repr((problem.loss, problem.lam, tol, X.shape)).encode())
    return h.hexdigest()[:32]


def solve_centralized(problem: Problem, tol: float = 1e-10, cache: bool = True) -> Optimum:
    """Solve the problem on pooled data to high accuracy.

    Hinge loss uses liblinear's dual coordinate descent (scikit-learn
    ``LinearSVC`` with ``C = 1/(lam N)``, no intercept); logistic loss uses
    liblinear and is then polished with L-BFGS; the smoothed hinge uses
    L-BFGS; the squared loss is solved exactly (dense Cholesky for few
    features, conjugate gradients otherwise). Multiclass problems are solved
    one class at a time (one-vs-rest). Results are cached per problem in
    ``~/.cache/hyfl/optimum`` (set ``HYFL_NO_CACHE=1`` to disable).

    Parameters
    ----------
    problem : Problem
    tol : float, default 1e-10
        Solver tolerance.
    cache : bool, default True

    Returns
    -------
    Optimum
    """
    use_cache = cache and os.environ.get("HYFL_NO_CACHE", "") in ("", "0")
    path = _cache_dir() / f"{_problem_key(problem, tol)}.npz"
    cached = _read_optimum(path, problem) if use_cache and path.exists() else None
    if cached is not None:
        w, method = cached
        return Optimum(w=w, primal=problem.primal(w), method=method, info={"cached": True})
    columns, method = [], ""
    for c in range(problem.n_outputs):
        w_c, method = _solve_column(problem, c, tol)
        columns.append(w_c)
    w = np.column_stack(columns)
    info = {}
    if problem.loss.smooth:
        info["gradient_norm"] = float(np.linalg.norm(problem.primal_gradient(w)))
    opt = Optimum(w=w, primal=problem.primal(w), method=method, info=info)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A temporary name of this process's own: parallel runs may solve the same problem.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp.npz")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, w=w, method=np.array(method))
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return opt


def _read_optimum(path: Path, problem: Problem) -> tuple[np.ndarray, str] | None:
    """A cached optimum's ``(w, method)``; None (solve again) if the file does not fit."""
    try:
        f = read_npz(path, f"cached optimum {path}", "a cached optimum", "",
                     kinds="fU", expect={"w": ("f", 2), "method": ("U", 0)})
    except HyflError:
        return None
    w = f["w"]
    if w.shape != (problem.n_features, problem.n_outputs) or not np.all(np.isfinite(w)):
        return None
    return w, str(f["method"])


def _solve_column(problem: Problem, c: int, tol: float) -> tuple[np.ndarray, str]:
    X, y, lam, n = problem.X, problem.Y[:, c], problem.lam, problem.n_samples
    weight = None if problem.W is None else problem.W[:, c]
    name = problem.loss.name
    if name == "squared":
        return _ridge_exact(X, y, lam, weight), "exact ridge solve"
    if name == "hinge":
        from sklearn.svm import LinearSVC

        svc = LinearSVC(
            loss="hinge",
            C=1.0 / (lam * n),
            fit_intercept=False,
            dual=True,
            tol=tol,
            max_iter=1_000_000,
        )
        _fit_quietly(svc, X, y, weight)
        return svc.coef_.ravel().astype(np.float64), "liblinear (LinearSVC, hinge, dual CD)"
    w0 = np.zeros(X.shape[1])
    method = "L-BFGS"
    if name == "logistic":
        from sklearn.linear_model import LogisticRegression

        lr = LogisticRegression(
            solver="liblinear", C=1.0 / (lam * n), fit_intercept=False, tol=tol, max_iter=10_000
        )
        _fit_quietly(lr, X, y, weight)
        w0 = lr.coef_.ravel().astype(np.float64)
        method = "liblinear (LogisticRegression) polished by L-BFGS"
    return _lbfgs(problem, c, w0, tol), method


def _fit_quietly(model, X, y, sample_weight=None) -> None:
    """Fit a liblinear model (whose ``sample_weight`` scales each sample's C, as ``W`` does
    the loss) without its convergence warnings."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y, sample_weight=sample_weight)


def _lbfgs(problem: Problem, c: int, w0: np.ndarray, tol: float) -> np.ndarray:
    X, lam, n, loss = problem.X, problem.lam, problem.n_samples, problem.loss
    y = problem.Y[:, c]
    weight = None if problem.W is None else problem.W[:, c]

    def fun(w):
        z = X @ w
        f = 0.5 * lam * w @ w + np.sum(loss.value(z, y, weight)) / n
        g = lam * w + X.T @ loss.derivative(z, y, weight) / n
        return f, g

    import scipy.optimize  # deferred: slow to import

    res = scipy.optimize.minimize(
        fun,
        w0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 100_000, "gtol": tol, "ftol": 1e-16, "maxcor": 30},
    )
    return res.x


def _ridge_exact(X: sp.csr_matrix, y: np.ndarray, lam: float,
                 weight: np.ndarray | None = None) -> np.ndarray:
    """``argmin lam/2 ||w||^2 + 1/(2n) sum_i c_i (x_i^T w - y_i)^2``: (X^T C X / n + lam I) w
    = X^T C y / n."""
    n, m = X.shape
    c = np.ones(n) if weight is None else weight
    CX = sp.diags(c) @ X
    if m <= 3000:
        G = (X.T @ CX).toarray() / n + lam * np.eye(m)
        return np.linalg.solve(G, X.T @ (c * y) / n)
    op = spla.LinearOperator((m, m), matvec=lambda v: X.T @ (CX @ v) / n + lam * v,
                             dtype=float)
    w, info = spla.cg(op, X.T @ (c * y) / n, rtol=1e-14, maxiter=100_000)
    return w
