"""scikit-learn estimators that train HyFDCA over a simulated federation.

:class:`HyFDCAClassifier` (hinge, logistic or smoothed hinge loss; binary or
one-vs-rest multiclass) and :class:`HyFDCARegressor` (squared loss) follow the
scikit-learn conventions: the constructor only stores its arguments, ``fit``
validates them, splits ``X`` over the clients of ``partition`` and runs the
in-process simulation engine (:func:`hyfl.runtime.simulation.simulate`) until
the duality gap certifies the model (``tol``) or ``max_iter`` rounds have run.

Example::

    from hyfl import HyFDCAClassifier
    clf = HyFDCAClassifier(loss="hinge", lam=1e-3, partition="grid:3x3",
                           participation=0.5, random_state=0).fit(X, y)
    clf.predict(X), clf.score(X, y), clf.gap_, clf.n_iter_

The intercept is fitted as liblinear fits it (``fit_intercept=True``, the
default): ``X`` gains a constant column of value ``intercept_scaling`` whose
weight is regularized with the others, so the problem is
``lam/2 (||coef||^2 + (intercept / intercept_scaling)^2) + mean loss``
(:func:`hyfl.data.dataset.with_intercept`); the duality gap certifies that
objective, and ``LinearSVC``/``LogisticRegression(solver="liblinear")`` with
``C = 1 / (lam N)`` and the same ``intercept_scaling`` solve it too.

Sample weights (``fit(X, y, sample_weight)``, and the classifier's
``class_weight``) weight each sample's loss; the loss is their weighted mean
``sum_i c_i loss_i / sum_i c_i``, so integer weights act as repeated samples and
scaling every weight changes nothing. The certificate stays exact
(:mod:`hyfl.losses`); samples of weight 0 are left out.

Small data. A partition spec ``grid:KxQ``, ``horizontal:K`` or
``vertical:Q`` asks for more groups than a tiny ``X`` has rows or columns
would fail; the estimators cap ``K`` at the number of samples and ``Q`` at the
number of features (``partition_`` records the spec actually used), so that
any data scikit-learn accepts can be fitted.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from hyfl.algorithms.hyfdca import DEFAULT_MOMENTUM, HyFDCA
from hyfl.data.dataset import INTERCEPT_SCALING, Dataset, split_intercept, with_intercept
from hyfl.data.loaders import map_labels
from hyfl.errors import (
    HyflError,
    TrivialModelWarning,
    check_choice,
    check_int,
    check_positive,
    check_range,
    fail,
)
from hyfl.losses import Logistic
from hyfl.participation import parse_participation
from hyfl.partition import Partition, parse_partition
from hyfl.problem import make_problem
from hyfl.runtime.simulation import simulate
from hyfl.runtime.trivial import judge_trivial, majority_rate

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    def _validate_data(estimator, *args, **kwargs):
        return estimator._validate_data(*args, **kwargs)

__all__ = ["HyFDCAClassifier", "HyFDCARegressor"]

CLASSIFIER_LOSSES = ("hinge", "logistic", "smoothed_hinge")
"""Losses :class:`HyFDCAClassifier` accepts."""
REGRESSOR_LOSSES = ("squared",)
"""Losses :class:`HyFDCARegressor` accepts."""

DEFAULT_MAX_ITER = 5000
"""Default most outer iterations (rounds) of a fit."""
DEFAULT_TOL = 1e-4
"""Default relative duality-gap tolerance: stop once ``P - D <= tol * |P|``."""
DEFAULT_STEP_RULE = HyFDCA.step_rule
"""The estimators' step rule: the library's default (``cocoa``, certified). On the
breast-cancer acceptance case (min-max scaled, grid:3x3, half participation, hinge,
lam 1e-3) it settles at relative loss 1e-3 within 300 rounds (docs/convergence.md)."""

_CAPPABLE = re.compile(r"^\s*(grid|horizontal|vertical)\s*:\s*(\d+)\s*(?:[xX,*]\s*(\d+)\s*)?$")


def _seed(random_state) -> int:
    """An int seed for the engine: an int passes through (so a direct
    ``simulate(..., seed=random_state)`` call reproduces the fit)."""
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return int(random_state)
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def _capped_partition(spec, X, seed: int, labels=None) -> tuple[Partition, str]:
    """Build the partition, capping group counts of simple specs at the data's size
    (``labels``: for a label-skewed sample split, e.g. ``grid:4x2@dirichlet:0.5``)."""
    if isinstance(spec, Partition):
        return spec, spec.name
    if not isinstance(spec, str):
        raise fail(
            "partition",
            f"is {spec!r}",
            'Pass a spec string such as "grid:3x3" or a hyfl.partition.Partition.',
        )
    n, m = X.shape
    match = _CAPPABLE.match(spec)
    if match:
        kind, a, b = match.group(1).lower(), int(match.group(2)), match.group(3)
        if kind == "grid" and b is not None:
            spec = f"grid:{max(1, min(a, n))}x{max(1, min(int(b), m))}"
        elif kind == "horizontal" and b is None:
            spec = f"horizontal:{max(1, min(a, n))}"
        elif kind == "vertical" and b is None:
            spec = f"vertical:{max(1, min(a, m))}"
    return parse_partition(spec, X, seed=seed, labels=labels), spec


def _as_history(metrics: list[dict]) -> dict[str, np.ndarray]:
    columns: dict[str, None] = {}
    for row in metrics:
        columns.update(dict.fromkeys(row))
    return {c: np.array([row.get(c, np.nan) for row in metrics], dtype=float) for c in columns}


class _HyFDCAEstimator(BaseEstimator):
    """Fitting shared by the classifier and the regressor (not public)."""

    _losses: tuple[str, ...] = ()

    # -- validation ----------------------------------------------------------
    def _algorithm(self) -> HyFDCA:
        return HyFDCA(
            local_steps=self.local_steps,
            iic=self.iic,
            step_rule=self.step_rule,
            gamma=self.gamma,
            history=self.history,
            momentum=self.momentum,
        ).validated()

    def _check_params(self) -> None:
        check_choice("loss", self.loss, self._losses)
        check_positive("lam", self.lam, fix="Pass a positive regularization strength, e.g. 1e-3.")
        check_int("max_iter", self.max_iter, minimum=1)
        if not isinstance(self.fit_intercept, (bool, np.bool_)):
            raise fail("fit_intercept", f"must be True or False, got {self.fit_intercept!r}",
                       "Pass fit_intercept=True (learn a bias) or False.")
        if self.fit_intercept:
            check_positive("intercept_scaling", self.intercept_scaling,
                           fix="Pass a positive constant, e.g. 1.0 (liblinear's default).")
        check_range("tol", self.tol, 0.0, fix="Pass a relative duality-gap tolerance such as "
                    "1e-4 (0 runs max_iter).")

    def _validate(self, X, y=None, reset=True, **kwargs):
        """scikit-learn's input checks, re-raised in hyfl's error style."""
        try:
            if y is None and not reset:
                return _validate_data(self, X, reset=False, accept_sparse="csr",
                                      dtype=np.float64)
            return _validate_data(self, X, y, reset=reset, accept_sparse="csr",
                                  dtype=np.float64, **kwargs)
        except HyflError:
            raise
        except ValueError as err:
            raise fail("input", str(err).rstrip("."),
                       "Pass finite numeric data with one target per sample.") from err

    # -- the run -------------------------------------------------------------
    def _run(self, X, y_encoded: np.ndarray, task: str, weight: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
        """Simulate the federation; set the fitted attributes; return the weights
        (M, C) and the intercept (C,). ``weight``: the samples' weights (:func:`_weights`)."""
        algorithm = self._algorithm()
        seed = _seed(self.random_state)
        X = sp.csr_matrix(X, dtype=np.float64)
        if weight is not None:  # a sample of weight 0 counts for nothing: leave it out
            kept = weight > 0
            X, y_encoded, weight = X[kept], y_encoded[kept], weight[kept]
            weight = None if np.all(weight == weight[0]) else weight / weight.mean()
        data = Dataset(X, y_encoded, name="X", task=task)
        scaling = float(self.intercept_scaling) if self.fit_intercept else None
        if scaling is not None:
            data = with_intercept(data, scaling)
        problem = make_problem(data, self.loss, self.lam, sample_weight=weight)
        partition, spec = _capped_partition(self.partition, data.X, seed, labels=y_encoded)
        participation = parse_participation(self.participation, partition.n_clients)
        tol = float(self.tol)

        def at_tolerance(row: dict) -> str | None:
            """The engine's stop condition (asked after each round, not at the start)."""
            if row["gap"] <= tol * abs(row["primal"]):
                return f"converged: relative duality gap <= tol={tol:g}"
            return None

        result = simulate(algorithm, problem, partition, participation, int(self.max_iter),
                          seed=seed, stop_when=at_tolerance)
        converged = result.config["stopped_by"] == "stop_when"
        self.partition_ = spec
        self.n_iter_ = int(result.config["rounds"])
        self.history_ = _as_history(result.metrics)
        self.gap_ = float(result.final["gap"])
        if not converged:
            warnings.warn(
                f"HyFDCA stopped after max_iter={self.max_iter} rounds with relative duality "
                f"gap {self.gap_ / max(abs(result.final['primal']), 1e-300):.3g} > tol={tol:g}; "
                "increase max_iter (or tol).",
                ConvergenceWarning,
                stacklevel=3,
            )
        weights = np.asarray(result.weights, dtype=np.float64)
        self.trivial_ = self._judge(problem, result.metrics, weights, y_encoded, task)
        if self.trivial_ is not None:
            warnings.warn(
                f"HyFDCA's model is no better than trivial after {self.n_iter_} rounds: "
                f"{self.trivial_.reason}; try a larger max_iter, a higher participation or "
                "another step_rule.",
                TrivialModelWarning,
                stacklevel=3,
            )
        return split_intercept(weights, scaling)

    @staticmethod
    def _weights(X, y, sample_weight, class_weight=None) -> np.ndarray | None:
        """The samples' weights: ``sample_weight`` times the ``class_weight`` of each label;
        None when neither is given."""
        if sample_weight is None and class_weight is None:
            return None
        weight = np.ones(X.shape[0])
        if sample_weight is not None:
            try:
                given = np.asarray(sample_weight, dtype=np.float64)
            except (TypeError, ValueError):
                raise fail("sample_weight", "is not numeric",
                           "Pass one non-negative number per sample.") from None
            if given.ndim == 0:
                given = np.full(X.shape[0], float(given))
            if given.shape != (X.shape[0],):
                raise fail("sample_weight", f"has shape {given.shape}, but X has "
                           f"{X.shape[0]} samples", "Pass one weight per sample.")
            bad = np.flatnonzero(~np.isfinite(given) | (given < 0))
            if bad.size:
                raise fail("sample_weight", f"must be finite and >= 0, but sample {bad[0]} has "
                           f"{given[bad[0]]!r}", "Pass non-negative finite weights.")
            weight = given
        if class_weight is not None:
            from sklearn.utils.class_weight import compute_sample_weight

            try:
                weight = weight * compute_sample_weight(class_weight, y)
            except ValueError as err:
                raise fail("class_weight", str(err).rstrip("."),
                           'Pass "balanced", a dict {label: weight} or None.') from err
        if not np.any(weight > 0):
            raise fail("sample_weight", "is zero for every sample",
                       "Give some samples a positive weight.")
        return weight

    @staticmethod
    def _judge(problem, metrics, weights, y_encoded, task):
        """:func:`~hyfl.runtime.trivial.judge_trivial` of the fit: the final primal against
        round 0's (the zero model), the training accuracy against the majority class."""
        final = dict(metrics[-1])
        rate = None
        if task != "regression":  # accuracy once, at the end (the rounds do not compute it)
            final["train_accuracy"] = problem.accuracy(problem.X, y_encoded, weights)
            rate = majority_rate(y_encoded)
        return judge_trivial([*metrics[:-1], final], majority_rate=rate)

    def _decision(self, X) -> np.ndarray:
        check_is_fitted(self, "coef_")
        X = self._validate(X, reset=False)
        return np.asarray(X @ self.coef_.T) + self.intercept_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def _more_tags(self):  # scikit-learn < 1.6
        return {"X_types": ["2darray", "sparse"]}


_SHARED_PARAMETERS = """\
    lam : float, default 1e-3
        Regularization strength ``lam`` of ``lam/2 ||w||^2 + 1/N sum_i loss_i``, > 0.
    fit_intercept : bool, default True
        Learn a bias: ``X`` gains a constant column of value
        ``intercept_scaling`` (held by the clients of one feature block) whose
        weight times ``intercept_scaling`` is ``intercept_``. As in liblinear,
        that weight is regularized like the others.
    intercept_scaling : float, default 1.0
        The constant column's value, > 0. Larger values regularize the
        intercept less but slow the dual steps.
    partition : str or hyfl.partition.Partition, default "grid:2x2"
        How the rows and columns of ``X`` are split over the clients: a spec
        for :func:`hyfl.partition.parse_partition` (``"grid:3x3"``,
        ``"horizontal:4"``, ``"vertical:2"``, ``"nonzero:3x3"``) or a ready
        partition of ``X``. Group counts of ``grid``/``horizontal``/``vertical``
        are capped at the data's size (see ``partition_``).
    participation : float or str, default 1.0
        Which clients take part in each round, see
        :func:`hyfl.participation.parse_participation`: ``1.0``/``"full"``, a
        fraction such as ``0.5`` (random clients each round), ``"cyclic:C"``.
    max_iter : int, default 5000
        Most outer iterations (rounds of the federation).
    tol : float, default 1e-4
        Relative duality-gap tolerance: the run stops after the first round
        whose certified gap ``P(w) - D(alpha) <= tol * |P(w)|`` (which bounds
        the relative suboptimality ``(P(w) - P*) / |P(w)|``). 0 runs
        ``max_iter`` rounds. A run that ends above it warns
        (``ConvergenceWarning``).
    random_state : int, RandomState or None, default None
        Seed of the partition's sample permutation, the participation draws
        and the algorithm's own draws. An int ``s`` gives the same model as
        ``hyfl.simulate(..., seed=s)``.
    step_rule : {"cocoa", "safe", "theory", "paper"}, default "cocoa"
        HyFDCA's local dual method (see :class:`hyfl.algorithms.hyfdca.HyFDCA`);
        the default is the library's.
    local_steps : int or None, default None
        ``H``, dual steps per active client and round (None: the rule's default).
    iic : float or None, default None
        Inner iterations constant, used when ``local_steps`` is None.
    gamma : float or "1/t", default 1.0
        Aggregation weight of the dual updates.
    history : int or None, default None
        ``cocoa`` rule: rounds of inner products a client remembers.
    momentum : float, default 0.95
        ``cocoa`` rule: largest momentum coefficient.
"""

_SHARED_ATTRIBUTES = """\
    intercept_ : float or ndarray of shape (n_classes,)
        The bias (0 with ``fit_intercept=False``).
    n_features_in_ : int
        Number of features seen in ``fit``.
    n_iter_ : int
        Rounds run.
    gap_ : float
        Duality gap ``P(w) - D(alpha)`` of the returned model (an upper bound
        on its suboptimality ``P(w) - P*``).
    history_ : dict of str to ndarray of shape (n_iter_ + 1,)
        The metrics of every round (row 0 is the start): ``iteration``,
        ``primal``, ``dual``, ``gap``, ``train_accuracy``, the costs
        (``round_trips``, bytes, ``sim_time``, ...) and the algorithm's round
        statistics; ``pandas.DataFrame(history_)`` tabulates it.
    partition_ : str
        The partition spec used (after capping to the data's size).
    trivial_ : hyfl.runtime.trivial.TrivialResult or None
        Why the model is no better than trivial -- its primal objective not
        below the zero model's (round 0), or (classifier) its training accuracy
        not above always predicting the majority class -- or None. ``fit``
        warns (``hyfl.errors.TrivialModelWarning``) when it is not None.
"""


class HyFDCAClassifier(ClassifierMixin, _HyFDCAEstimator):
    __doc__ = f"""Linear classifier trained by HyFDCA over a simulated hybrid federation.

    Two classes are mapped to -1 (``classes_[0]``) and +1 (``classes_[1]``);
    more than two are trained one-vs-rest (one model per class, predicted by
    the largest decision value). The model fits an intercept by default
    (``fit_intercept=True``: a constant column of value ``intercept_scaling``, 1
    by default, as liblinear). With
    ``loss="logistic"`` it has ``predict_proba`` (the logistic model's
    probabilities; one-vs-rest ones normalized to sum to one, as scikit-learn's
    one-vs-rest logistic regression does).

    Parameters
    ----------
    loss : {{"hinge", "logistic", "smoothed_hinge"}}, default "hinge"
        Classification loss (SVM, logistic regression, smoothed-hinge SVM).
{_SHARED_PARAMETERS}    class_weight : dict, "balanced" or None, default None
        Weights of the classes' losses: ``{{label: weight}}``, or ``"balanced"``
        (``n_samples / (n_classes * count of the class)``); multiplies
        ``sample_weight``.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The class labels, sorted.
    coef_ : ndarray of shape (n_features,) or (n_classes, n_features)
        Weights; one row per class when ``n_classes > 2``.
{_SHARED_ATTRIBUTES}
    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from hyfl import HyFDCAClassifier
    >>> X, y = load_iris(return_X_y=True)
    >>> clf = HyFDCAClassifier(partition="grid:2x2", random_state=0).fit(X, y)
    >>> clf.coef_.shape
    (3, 4)
    """

    _losses = CLASSIFIER_LOSSES

    def __init__(
        self,
        loss="hinge",
        lam=1e-3,
        fit_intercept=True,
        intercept_scaling=INTERCEPT_SCALING,
        partition="grid:2x2",
        participation=1.0,
        max_iter=DEFAULT_MAX_ITER,
        tol=DEFAULT_TOL,
        random_state=None,
        step_rule=DEFAULT_STEP_RULE,
        local_steps=None,
        iic=None,
        gamma=1.0,
        history=None,
        momentum=DEFAULT_MOMENTUM,
        class_weight=None,
    ):
        self.loss = loss
        self.lam = lam
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.partition = partition
        self.participation = participation
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.step_rule = step_rule
        self.local_steps = local_steps
        self.iic = iic
        self.gamma = gamma
        self.history = history
        self.momentum = momentum
        self.class_weight = class_weight

    def fit(self, X, y, sample_weight=None):
        """Train over the simulated federation.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Finite feature values.
        y : array-like of shape (n_samples,)
            Class labels (at least two distinct ones).
        sample_weight : array-like of shape (n_samples,), default None
            Non-negative weight of each sample's loss (see the module docstring).

        Returns
        -------
        self : HyFDCAClassifier

        Raises
        ------
        HyflError
            For a bad parameter, non-finite or mis-shaped input, or one class.
        """
        self._check_params()
        X, y = self._validate(X, y)
        try:
            check_classification_targets(y)
        except ValueError as err:
            raise fail("y", str(err).rstrip("."), "Pass class labels.") from err
        self.classes_, index = np.unique(y, return_inverse=True)
        n_classes = len(self.classes_)
        if n_classes < 2:
            raise fail("y", "has only one class", "Pass samples of at least two classes.")
        # Labels of any type -> their sorted positions -> hyfl's encoding (the loaders'
        # map_labels: binary -1 for classes_[0], +1 for classes_[1]; multiclass 0..C-1).
        encoded, task, _ = map_labels(index, "y", task="binary" if n_classes == 2 else "multiclass")
        weight = self._weights(X, y, sample_weight, self.class_weight)
        weights, intercept = self._run(X, encoded, task, weight)
        if n_classes == 2:
            self.coef_ = weights[:, 0].copy()
            self.intercept_ = float(intercept[0])
        else:
            self.coef_ = np.ascontiguousarray(weights.T)
            self.intercept_ = intercept
        return self

    def decision_function(self, X):
        """Decision values ``X @ coef_.T + intercept_``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_classes)
            Positive values favour ``classes_[1]`` (binary).
        """
        return self._decision(X)

    def predict(self, X):
        """Predicted class labels.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        scores = self.decision_function(X)
        if scores.ndim == 1:
            return self.classes_[(scores >= 0).astype(int)]
        return self.classes_[np.argmax(scores, axis=1)]

    def _has_probabilities(self) -> bool:
        if self.loss != "logistic":
            raise AttributeError(f"predict_proba needs loss='logistic', not {self.loss!r}: the "
                                 "hinge losses give decision values, not probabilities (use "
                                 "decision_function, or train with loss='logistic')")
        return True

    @available_if(_has_probabilities)
    def predict_proba(self, X):
        """Class probabilities of the logistic model (``loss="logistic"`` only).

        ``P(classes_[1] | x) = 1 / (1 + exp(-(x @ coef_ + intercept_)))`` for two classes; for
        more, each class's one-vs-rest probability, normalized over the classes.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Rows sum to one; columns in the order of ``classes_``.
        """
        return np.exp(self.predict_log_proba(X))

    @available_if(_has_probabilities)
    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba` (``loss="logistic"`` only).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        return Logistic.log_probabilities(self.decision_function(X))


class HyFDCARegressor(RegressorMixin, _HyFDCAEstimator):
    __doc__ = f"""Ridge regression (squared loss) trained by HyFDCA over a simulated federation.

    Parameters
    ----------
    loss : {{"squared"}}, default "squared"
        The squared loss ``(x^T w - y)^2 / 2``.
{_SHARED_PARAMETERS}
    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
        Weights.
{_SHARED_ATTRIBUTES}
    """

    _losses = REGRESSOR_LOSSES

    def __init__(
        self,
        loss="squared",
        lam=1e-3,
        fit_intercept=True,
        intercept_scaling=INTERCEPT_SCALING,
        partition="grid:2x2",
        participation=1.0,
        max_iter=DEFAULT_MAX_ITER,
        tol=DEFAULT_TOL,
        random_state=None,
        step_rule=DEFAULT_STEP_RULE,
        local_steps=None,
        iic=None,
        gamma=1.0,
        history=None,
        momentum=DEFAULT_MOMENTUM,
    ):
        self.loss = loss
        self.lam = lam
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.partition = partition
        self.participation = participation
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.step_rule = step_rule
        self.local_steps = local_steps
        self.iic = iic
        self.gamma = gamma
        self.history = history
        self.momentum = momentum

    def fit(self, X, y, sample_weight=None):
        """Train over the simulated federation.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Finite feature values.
        y : array-like of shape (n_samples,)
            Finite real targets.
        sample_weight : array-like of shape (n_samples,), default None
            Non-negative weight of each sample's loss (see the module docstring).

        Returns
        -------
        self : HyFDCARegressor

        Raises
        ------
        HyflError
            For a bad parameter or non-finite or mis-shaped input.
        """
        self._check_params()
        X, y = self._validate(X, y, y_numeric=True)
        weight = self._weights(X, y, sample_weight)
        weights, intercept = self._run(X, np.asarray(y, dtype=np.float64), "regression", weight)
        self.coef_ = weights[:, 0].copy()
        self.intercept_ = float(intercept[0])
        return self

    def predict(self, X):
        """Predicted targets ``X @ coef_ + intercept_``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        return self._decision(X)
