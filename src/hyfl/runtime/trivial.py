"""Is a finished run better than doing nothing?

A federated run can end with a model no better than the trivial ones: the zero
model (``w = 0``, where every engine starts; the metrics row of round 0 is its
evaluation) and, for classification, always predicting the majority class.
:func:`judge_trivial` is the one place that decides it, for ``hyfl run``,
``hyfl compare``, ``hyfl demo``, config runs, ``hyfl report`` and the
scikit-learn estimators. A run is *no better than trivial* when

* its final primal objective is not below the zero model's (round 0), or
* (classification) its final accuracy -- validation when the run has a
  validation set, else training -- is not above the majority class's rate on
  those same labels.

It returns None for a run that beats both, else a :class:`TrivialResult`
naming each failed check with its figures, e.g. ``primal 0.85 >= zero model's
0.69`` or ``validation accuracy 0.902 <= majority class 0.904``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyfl._names import STEP_RULES

PRIMAL_RTOL = 1e-9
"""A final primal within this relative distance of the zero model's counts as not below it
(float noise of a model that has not moved)."""
ACCURACY_ATOL = 1e-12
"""An accuracy within this of the majority-class rate counts as not above it."""

_LABELS = {
    "primal": "primal",
    "val_accuracy": "validation accuracy",
    "train_accuracy": "training accuracy",
}


@dataclass(frozen=True)
class TrivialCheck:
    """One failed check: the run's ``metric`` against the trivial model's ``baseline``.

    ``metric`` is ``"primal"`` (against the zero model's primal),
    ``"val_accuracy"`` or ``"train_accuracy"`` (against the majority-class rate
    on the same labels).
    """

    metric: str
    value: float
    baseline: float

    def __str__(self) -> str:
        if self.metric == "primal":
            return f"primal {self.value:.4g} >= zero model's {self.baseline:.4g}"
        return (f"{_LABELS.get(self.metric, self.metric)} {self.value:.3f} <= majority class "
                f"{self.baseline:.3f}")

    def to_dict(self) -> dict[str, Any]:
        against = "zero_model" if self.metric == "primal" else "majority_class"
        return {"metric": self.metric, "value": float(self.value),
                "baseline": float(self.baseline), "against": against, "text": str(self)}


@dataclass(frozen=True)
class TrivialResult:
    """Why a run is no better than trivial: its failed checks at outer iteration ``iteration``."""

    failed: tuple[TrivialCheck, ...]
    iteration: int | None = None

    @property
    def reason(self) -> str:
        """The failed checks with their figures, ``"; "``-joined."""
        return "; ".join(str(check) for check in self.failed)

    def __str__(self) -> str:
        return self.reason

    def to_dict(self) -> dict[str, Any]:
        """The JSON form recorded in ``run.json``'s summary (``no_better_than_trivial``)."""
        return {"reason": self.reason, "iteration": self.iteration,
                "checks": [check.to_dict() for check in self.failed]}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any] | None) -> TrivialResult | None:
        """Read :meth:`to_dict`'s form back (None for None or a record without checks)."""
        if not isinstance(record, Mapping):
            return None
        checks = tuple(
            TrivialCheck(str(c["metric"]), float(c["value"]), float(c["baseline"]))
            for c in record.get("checks") or () if isinstance(c, Mapping)
        )
        if not checks:
            return None
        iteration = record.get("iteration")
        return cls(checks, None if iteration is None else int(iteration))


def judge_trivial(
    metrics: Iterable[Mapping[str, Any]],
    *,
    majority_rate: float | None = None,
    val_majority_rate: float | None = None,
) -> TrivialResult | None:
    """Judge a finished run: None when it beats the trivial models, else why not.

    Parameters
    ----------
    metrics : iterable of mappings
        The run's metrics rows in order (``RunResult.metrics``): the last row is
        the finished model; the row with ``iteration`` 0 is the zero model's
        evaluation. Keys used: ``iteration``, ``primal``, ``val_accuracy``,
        ``train_accuracy`` (missing or NaN values skip their check).
    majority_rate : float, optional
        The majority class's rate on the training labels (None: regression,
        no accuracy check on training accuracy).
    val_majority_rate : float, optional
        The majority class's rate on the validation labels, the baseline of the
        validation accuracy (None: that check is skipped).

    Returns
    -------
    TrivialResult or None
        The failed checks (primal first, then accuracy), or None.
    """
    rows = list(metrics)
    if not rows:
        return None
    final = rows[-1]
    zero = next((row for row in rows if _number(row.get("iteration")) == 0.0), None)
    failed: list[TrivialCheck] = []
    primal = _number(final.get("primal"))
    zero_primal = _number(zero.get("primal")) if zero is not None else math.nan
    if math.isfinite(primal) and math.isfinite(zero_primal):
        if primal >= zero_primal - PRIMAL_RTOL * abs(zero_primal):
            failed.append(TrivialCheck("primal", primal, zero_primal))
    val = _number(final.get("val_accuracy"))
    if math.isfinite(val):
        metric, accuracy, rate = "val_accuracy", val, val_majority_rate
    else:
        metric, accuracy, rate = "train_accuracy", _number(final.get("train_accuracy")), \
            majority_rate
    rate = _number(rate)
    if math.isfinite(accuracy) and math.isfinite(rate) and accuracy <= rate + ACCURACY_ATOL:
        failed.append(TrivialCheck(metric, accuracy, rate))
    if not failed:
        return None
    iteration = _number(final.get("iteration"))
    return TrivialResult(tuple(failed), int(iteration) if math.isfinite(iteration) else None)


def majority_rate(labels: Any) -> float | None:
    """The fraction of ``labels`` in the most frequent class (None for no labels).

    The accuracy of always predicting that class on these labels. Whether the
    labels are classes at all is the caller's question
    (:func:`hyfl.experiments.runner.majority_rate_of` asks it of a problem).
    """
    if labels is None:
        return None
    y = np.asarray(labels).ravel()
    if y.size == 0:
        return None
    _, counts = np.unique(y, return_counts=True)
    return float(counts.max() / y.size)


def advice(hyperparameters: Iterable[str] = (), step_rule: str | None = None) -> str:
    """What to try after a trivial run, given the algorithm's hyperparameter names (and
    the ``step_rule`` it ran, if it has one: the advice names another)."""
    names = set(hyperparameters)
    tries = ["more rounds (--iterations)", "a higher --participation"]
    if "step_rule" in names:
        ran = step_rule or STEP_RULES[0]  # not given: the default, listed first
        other = next(name for name in STEP_RULES if name != ran)
        tries.append(f"another --step-rule (e.g. {other})")
    if {"a", "b"} <= names:
        tries.append("another learning rate (--a, --b)")
    elif "eta0" in names:
        tries.append("another learning rate (--eta0)")
    return "Try " + ", ".join(tries[:-1]) + " or " + tries[-1] + "."


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


__all__ = [
    "TrivialCheck",
    "TrivialResult",
    "advice",
    "judge_trivial",
    "majority_rate",
]
