"""Losses of linear models and everything the primal-dual methods need from them.

Conventions (DESIGN.md section 1). A loss ``l(z, y)`` is applied to the margin
``z = x^T w`` of a sample with label ``y``. The dual objective uses the convex
conjugate evaluated at ``-alpha``::

    D(alpha) = -lam/2 ||A alpha||^2 - 1/N sum_i l*(-alpha_i)

so at the optimum ``alpha_i = -l'(z_i)`` (Fenchel-Young holds with equality:
``l(z) + l*(-alpha) = -alpha z``).

Every method works elementwise on arrays of any shape; ``y`` must have the
same shape as ``z``/``alpha`` (no silent broadcasting). Multiclass one-vs-rest
problems simply pass (N, C) arrays with ``y`` in {-1, +1}.

Sample weights. Every method takes an optional ``weight`` of ``y``'s shape: the
loss of a sample of weight ``c > 0`` is ``c l(z, y)``, whose conjugate is
``c l*(-alpha / c)`` on the dual domain scaled by ``c`` (``y alpha in [0, c]`` for
the margin losses); the dual step of the weighted loss is ``c`` times the
unweighted step from ``alpha / c`` with curvature ``c q`` (substitute
``d = c e``). So the certificate stays exact, and subclasses implement the
unweighted formulas only (``_value``, ``_derivative``, ``_conjugate``,
``_dual_bounds``, ``_dual_step``).

The one-dimensional dual step is the workhorse of HyFDCA::

    delta = argmax_d  -l*(-(alpha + d)) - d * z - q * d^2 / 2

with a closed form for hinge, smoothed hinge and squared loss and a
safeguarded Newton method for logistic loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit, xlogy

from hyfl.errors import check_choice, check_positive, fail


def _same_shape(*arrays: np.ndarray) -> None:
    shape = np.shape(arrays[0])
    for a in arrays[1:]:
        if np.shape(a) != shape:
            raise fail(
                "loss arguments",
                f"have shapes {[np.shape(x) for x in arrays]}",
                "Pass arrays of one shape; hyfl never broadcasts labels silently.",
            )


def _weighted(weight: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Sample weights as an array of ``y``'s shape (no silent broadcasting)."""
    weight = np.asarray(weight, dtype=np.float64)
    _same_shape(weight, y)
    return weight


@dataclass(frozen=True)
class Loss:
    """Base class: subclasses implement the elementwise formulas.

    Attributes
    ----------
    name : str
        Registry name.
    smooth : bool
        True when the loss is differentiable with Lipschitz gradient.
    classification : bool
        True when labels must be in {-1, +1}.
    quadratic_conjugate : bool
        True when ``l*(-alpha)`` is a polynomial of degree at most 2 on the dual
        domain, so that the dual objective along a segment is an exact quadratic
        (HyFDCA's line search then has a closed form).
    """

    name: str = "loss"
    smooth: bool = False
    classification: bool = True
    quadratic_conjugate: bool = True

    # -- primal -----------------------------------------------------------
    def value(self, z: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None
              ) -> np.ndarray:
        """Loss value ``c l(z, y)`` (``c = weight``, default 1), same shape as ``z``."""
        value = self._value(z, y)
        return value if weight is None else _weighted(weight, y) * value

    def derivative(self, z: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None
                   ) -> np.ndarray:
        """A (sub)gradient ``c l'(z, y)`` with respect to the margin."""
        slope = self._derivative(z, y)
        return slope if weight is None else _weighted(weight, y) * slope

    # -- dual -------------------------------------------------------------
    def conjugate(self, alpha: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None
                  ) -> np.ndarray:
        """``(c l)*(-alpha) = c l*(-alpha / c)``; ``+inf`` outside the dual domain."""
        if weight is None:
            return self._conjugate(alpha, y)
        c = _weighted(weight, y)
        return c * self._conjugate(alpha / c, y)

    def dual_bounds(self, y: np.ndarray, weight: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Closed interval ``[lo, hi]`` of feasible ``alpha`` (may be infinite)."""
        lo, hi = self._dual_bounds(y)
        if weight is None:
            return lo, hi
        c = _weighted(weight, y)
        return c * lo, c * hi

    def dual_step(
        self, alpha: np.ndarray, z: np.ndarray, q: np.ndarray, y: np.ndarray,
        weight: np.ndarray | None = None,
    ) -> np.ndarray:
        """Exact maximizer ``delta`` of ``-(c l)*(-(alpha+d)) - d z - q d^2 / 2``.

        Parameters
        ----------
        alpha : ndarray
            Current feasible dual variables.
        z : ndarray
            Margins ``x_i^T w`` the step is computed from.
        q : ndarray
            Curvature of the quadratic term, > 0 (broadcast against ``alpha``
            only when it is a scalar or has the same shape).
        y : ndarray
            Labels, same shape as ``alpha``.
        weight : ndarray, optional
            Sample weights ``c > 0``, same shape as ``alpha`` (default 1).
        """
        if weight is None:
            return self._dual_step(alpha, z, q, y)
        c = _weighted(weight, y)
        return c * self._dual_step(alpha / c, z, q * c, y)

    def dual_target(self, z: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None
                    ) -> np.ndarray:
        """``u = -c l'(z)``: the dual value that is optimal for margin ``z``.

        Algorithm 3 of the paper moves ``alpha`` towards this point (the paper
        prints ``u in dl(z)``; its own proof uses Fenchel-Young in the form
        ``l(z) = -l*(-u) - u z``, which requires ``u = -l'(z)``).
        """
        return -self.derivative(z, y, weight)

    # -- the unweighted formulas (subclasses) ------------------------------
    def _value(self, z, y):
        raise NotImplementedError

    def _derivative(self, z, y):
        raise NotImplementedError

    def _conjugate(self, alpha, y):
        raise NotImplementedError

    def _dual_bounds(self, y):
        raise NotImplementedError

    def _dual_step(self, alpha, z, q, y):
        raise NotImplementedError

    def check_labels(self, y: np.ndarray) -> None:
        """Raise if ``y`` does not suit this loss."""
        if not np.all(np.isfinite(y)):
            raise fail("labels", "contain NaN or inf", "Clean the label column.")
        if self.classification:
            bad = np.setdiff1d(np.unique(y), [-1.0, 1.0])
            if bad.size:
                raise fail(
                    "labels",
                    f"for the {self.name} loss must be -1 or +1, found {bad[:5].tolist()}",
                    "Map binary labels to {-1, +1} or use the squared loss for regression.",
                )


@dataclass(frozen=True)
class Hinge(Loss):
    """SVM hinge loss ``max(0, 1 - y z)``; dual domain ``y alpha in [0, 1]``."""

    name: str = "hinge"

    def _value(self, z, y):
        return np.maximum(0.0, 1.0 - y * z)

    def _derivative(self, z, y):
        return np.where(y * z < 1.0, -y, 0.0)

    def _conjugate(self, alpha, y):
        s = y * alpha
        inside = (s >= -1e-12) & (s <= 1.0 + 1e-12)
        return np.where(inside, -s, np.inf)

    def _dual_bounds(self, y):
        return np.minimum(0.0, y), np.maximum(0.0, y)

    def _dual_step(self, alpha, z, q, y):
        _same_shape(alpha, z, y)
        s = np.clip(y * alpha + (1.0 - y * z) / q, 0.0, 1.0)
        return y * s - alpha


@dataclass(frozen=True)
class SmoothedHinge(Loss):
    """Smoothed hinge with smoothing width ``smoothing`` (Shalev-Shwartz & Zhang).

    ``l = 0`` for ``yz >= 1``, ``1 - yz - s/2`` for ``yz <= 1 - s`` and
    ``(1 - yz)^2 / (2 s)`` in between. Its conjugate is
    ``l*(-alpha) = -y alpha + s/2 (y alpha)^2`` on ``y alpha in [0, 1]``.
    """

    name: str = "smoothed_hinge"
    smooth: bool = True
    smoothing: float = 1.0

    def _value(self, z, y):
        m = 1.0 - y * z
        s = self.smoothing
        return np.where(m <= 0, 0.0, np.where(m >= s, m - s / 2, m * m / (2 * s)))

    def _derivative(self, z, y):
        m = 1.0 - y * z
        return -y * np.clip(m / self.smoothing, 0.0, 1.0)

    def _conjugate(self, alpha, y):
        s = y * alpha
        inside = (s >= -1e-12) & (s <= 1.0 + 1e-12)
        return np.where(inside, -s + self.smoothing / 2 * s * s, np.inf)

    def _dual_bounds(self, y):
        return np.minimum(0.0, y), np.maximum(0.0, y)

    def _dual_step(self, alpha, z, q, y):
        _same_shape(alpha, z, y)
        # Stationarity in s = y (alpha + d):  1 - s*smoothing - y z - q (s - y alpha) = 0.
        s = np.clip((1.0 - y * z + q * y * alpha) / (self.smoothing + q), 0.0, 1.0)
        return y * s - alpha


@dataclass(frozen=True)
class Squared(Loss):
    """Ridge regression loss ``(z - y)^2 / 2``; the dual is unconstrained."""

    name: str = "squared"
    smooth: bool = True
    classification: bool = False

    def _value(self, z, y):
        return 0.5 * (z - y) ** 2

    def _derivative(self, z, y):
        return z - y

    def _conjugate(self, alpha, y):
        return 0.5 * alpha * alpha - alpha * y

    def _dual_bounds(self, y):
        inf = np.full(np.shape(y), np.inf)
        return -inf, inf

    def _dual_step(self, alpha, z, q, y):
        _same_shape(alpha, z, y)
        return (y - z - alpha) / (1.0 + q)


@dataclass(frozen=True)
class Logistic(Loss):
    """Logistic loss ``log(1 + exp(-y z))``; dual domain ``y alpha in [0, 1]``.

    The conjugate is the binary entropy ``s log s + (1-s) log(1-s)`` of
    ``s = y alpha``. The dual step has no closed form: it is solved by a
    bracketed Newton method on ``t = logit(s)`` (see :meth:`dual_step`).
    """

    name: str = "logistic"
    smooth: bool = True
    quadratic_conjugate: bool = False
    newton_iterations: int = 100
    newton_tolerance: float = 1e-13

    def _value(self, z, y):
        return np.logaddexp(0.0, -y * z)

    def _derivative(self, z, y):
        return -y * expit(-y * z)

    @staticmethod
    def log_probabilities(scores: np.ndarray) -> np.ndarray:
        """Log class probabilities of decision values ``scores = X @ w``.

        Two classes (``scores`` of shape (n,)): columns ``log P(-1)``,
        ``log P(+1)`` with ``P(+1 | x) = 1 / (1 + exp(-x^T w))``, the model
        this loss fits. More (shape (n, C), one-vs-rest models): each class's
        one-vs-rest probability, normalized over the classes (as scikit-learn's
        one-vs-rest logistic regression). Returns shape (n, 2) or (n, C).
        """
        from scipy.special import log_expit, logsumexp

        scores = np.asarray(scores, dtype=np.float64)
        if scores.ndim == 1:  # (no log of 1 - p: exact where p rounds to 1)
            return np.column_stack([log_expit(-scores), log_expit(scores)])
        logs = log_expit(scores)
        return logs - logsumexp(logs, axis=1, keepdims=True)

    def _conjugate(self, alpha, y):
        s = y * alpha
        inside = (s >= -1e-12) & (s <= 1.0 + 1e-12)
        sc = np.clip(s, 0.0, 1.0)
        return np.where(inside, xlogy(sc, sc) + xlogy(1.0 - sc, 1.0 - sc), np.inf)

    def _dual_bounds(self, y):
        return np.minimum(0.0, y), np.maximum(0.0, y)

    def _dual_step(self, alpha, z, q, y):
        _same_shape(alpha, z, y)
        q = np.broadcast_to(np.asarray(q, dtype=float), np.shape(alpha))
        s0 = y * alpha
        yz = y * z
        # With s = sigmoid(t), the maximizer solves g(t) = t + yz + q (s - s0) = 0.
        # g is increasing with 1 <= g' <= 1 + q/4, and since s - s0 lies in
        # (-s0, 1 - s0) the root is bracketed by [-yz - q(1-s0), -yz + q s0].
        lo = -yz - q * (1.0 - s0)
        hi = -yz + q * s0
        # Start from the better of the two limits: t = -yz (q -> 0) and
        # t = logit(s0) (q -> inf, the step vanishes).
        with np.errstate(divide="ignore"):
            t_stay = np.clip(np.log(s0) - np.log1p(-s0), lo, hi)
        t_free = np.clip(-yz, lo, hi)
        g_stay = t_stay + yz + q * (expit(t_stay) - s0)
        g_free = t_free + yz + q * (expit(t_free) - s0)
        t = np.where(np.abs(g_stay) < np.abs(g_free), t_stay, t_free)
        for _ in range(self.newton_iterations):
            s = expit(t)
            g = t + yz + q * (s - s0)
            lo = np.where(g < 0, t, lo)
            hi = np.where(g > 0, t, hi)
            t_new = t - g / (1.0 + q * s * (1.0 - s))
            # Fall back to bisection whenever Newton leaves the bracket.
            outside = (t_new <= lo) | (t_new >= hi)
            t_new = np.where(outside, 0.5 * (lo + hi), t_new)
            done = np.max(np.abs(t_new - t), initial=0.0) <= self.newton_tolerance * (
                1.0 + np.max(np.abs(t), initial=0.0)
            )
            t = t_new
            if done:
                break
        return y * expit(t) - alpha


LOSSES: dict[str, Loss] = {
    "hinge": Hinge(),
    "logistic": Logistic(),
    "squared": Squared(),
    "smoothed_hinge": SmoothedHinge(),
}
"""Registry of losses; drives validation and the CLI choices."""


def get_loss(name: str | Loss, *, smoothing: float | None = None) -> Loss:
    """Look a loss up by registry name (or pass a :class:`Loss` through).

    Parameters
    ----------
    name : str or Loss
        One of ``LOSSES``.
    smoothing : float, optional
        Smoothing width for ``smoothed_hinge`` (default 1.0).
    """
    if isinstance(name, Loss):
        return name
    check_choice("loss", name, LOSSES)
    if name == "smoothed_hinge" and smoothing is not None:
        return SmoothedHinge(smoothing=check_positive("smoothing", smoothing))
    return LOSSES[name]
