"""Hyperparameter tuning: time-bounded random search and Gray Relational Analysis.

The procedure of the HyFDCA paper (``hyfdca-aaai.md``, section 7.3):

1. *Random search* (Bergstra and Bengio 2012) for a fixed wall-clock budget.
   Every hyperparameter is drawn log-uniformly within its bounds,
   ``10 ** U(log10 lo, log10 hi)`` (:func:`sample`); integer hyperparameters
   (:data:`INTEGER_HYPERPARAMETERS`) are drawn the same way and rounded.
   The problem (data, centralized optimum, partition, participation) is
   prepared once and every trial runs on it with the same seed, so all
   trials see the same participation trace.
2. *Seven metrics* per trial (:data:`METRICS`, :func:`trial_metrics`): the
   average simulated runtime per outer iteration at 0, 0.2575 and 0.8 s of
   round-trip latency, the average of the last 5 loss values, the maximum
   validation accuracy, the volatility of the loss and the iterations to 90%
   of the loss decrease.
3. *Divergent trials* (:func:`is_divergent`) are recorded but excluded.
4. *Selection* by Gray Relational Analysis (Wang and Rangaiah 2017,
   :func:`gray_relational_grades`): the trial with the largest grade wins.

:func:`tune` does all of it and writes ``trials.csv``, ``best.toml`` and
``tuning.json``.

Bounds
------
:data:`DEFAULT_BOUNDS` holds the paper's search ranges for HyFDCA, FedAvg and
HyFEM and ranges for the other algorithms chosen from their modules'
documented defaults. A bound is a positive number or a *problem-relative*
string ``"<symbol>"`` or ``"<factor>*<symbol>"`` resolved from the prepared
problem (:data:`PROBLEM_SYMBOLS`):

``K/N``
    Number of clients over number of training samples: the smallest inner
    iterations constant, since ``IIC = K/N`` gives ``H = ceil(IIC N / K) = 1``
    (the paper's "min clients / samples").
``eta_auto``
    FedBCD's automatic rate ``eta0="auto"``, ``1 / L`` with
    ``L = c ||X||_2^2 / N + lam`` (:meth:`hyfl.algorithms.fedbcd.FedBCD.initial_rate`
    without a proximal term).
``mu_auto``
    FedHybrid's automatic penalty ``mu="auto"``, ``0.1 mean_i L_i``.

Callers override bounds per hyperparameter with a dict in the form of
:data:`DEFAULT_BOUNDS` (``{"fedavg": {"a": (1e-3, 1.0)}}``, what a config's
``[tune.bounds.fedavg]`` table gives) or the inner dict for the tuned
algorithm alone (``{"a": (1e-3, 1.0)}``); the algorithm's other default bounds
stay. ``lo == hi`` fixes a hyperparameter at that value.
"""

from __future__ import annotations

import csv
import math
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from hyfl._io import csv_text, write_json
from hyfl.algorithms import accepted_hyperparameters, algorithm_names, make_algorithm
from hyfl.errors import HyflError, check_choice, check_int, fail

LATENCIES = (0.0, 0.2575, 0.8)
"""Round-trip latencies (seconds) of metrics 1-3: ideal, US-Singapore, GEO satellite."""

METRICS = (
    "time_per_iter_lat0",
    "time_per_iter_lat0.2575",
    "time_per_iter_lat0.8",
    "loss_last5",
    "max_val_accuracy",
    "volatility",
    "iterations_to_90pct",
)
"""Names of the seven selection metrics, in the paper's order (see :func:`trial_metrics`)."""

LARGER_IS_BETTER = (False, False, False, False, True, False, False)
"""Direction of each metric of :data:`METRICS`: only the validation accuracy is maximized."""

INTEGER_HYPERPARAMETERS = frozenset({"local_steps", "batch_size"})
"""Hyperparameters sampled log-uniformly and then rounded to an integer."""

PROBLEM_SYMBOLS = ("K/N", "eta_auto", "mu_auto")
"""Problem-relative quantities a bound may name (see the module docstring)."""

_LOCAL_SGD = {"iic": ("K/N", 5.0), "a": (1e-5, 25.0), "b": (1e-5, 25.0)}
_FEDBCD = {"eta0": ("0.1*eta_auto", "10*eta_auto"), "local_steps": (1, 30)}
_FEDHYBRID = {"a": (0.05, 2.0), "b": (0.05, 2.0), "mu": ("0.1*mu_auto", "10*mu_auto")}

DEFAULT_BOUNDS: dict[str, dict[str, tuple[float | str, float | str]]] = {
    # The paper's ranges (section 7.3).
    "hyfdca": {"iic": ("K/N", 1.0)},
    "fedavg": dict(_LOCAL_SGD),
    "hyfem": {**_LOCAL_SGD, "mu": (1e-2, 1e4)},
    # HyFEM-Avg has no proximal term: mu would have no effect.
    "hyfem-avg": dict(_LOCAL_SGD),
    # FedBCD family: the rate around the automatic 1/L (its docstring: 1/L is
    # within ~10x of the best, 3/L can diverge); Q from FedSGD's 1 to 30
    # (the paper's default is 5); FedPBCD's mu around the paper's 0.1.
    "fedsgd": {"eta0": _FEDBCD["eta0"]},
    "fedbcd-p": dict(_FEDBCD),
    "fedbcd-s": dict(_FEDBCD),
    "fedpbcd": {**_FEDBCD, "mu": (1e-3, 10.0)},
    # FedHybrid (scaled step rule): multipliers around the safe 1, and the
    # penalty over 0.01 .. 1 mean L_i, the range its module measured.
    "fedh-g": dict(_FEDHYBRID),
    "fedh-n": dict(_FEDHYBRID),
    "fedh-k": dict(_FEDHYBRID),
    # DiSCO: the PCG tolerance factor around the paper's 1/20.
    "disco": {"beta": (0.005, 0.5)},
    # Mix-LR: SGD's step around SecretFlow's 0.1, and epochs between averages.
    "mix-lr": {"learning_rate": (1e-3, 1.0), "local_epochs": (1, 5)},
}
"""Search bounds ``(lo, hi)`` per algorithm and hyperparameter (module docstring)."""

_EXCLUSIVE = {"iic": "local_steps", "local_steps": "iic"}
"""Hyperparameters that replace each other: tuning one drops the other from the fixed ones."""

_BOUND_PATTERN = re.compile(
    r"^\s*(?:(?P<factor>[0-9.eE+-]+)\s*\*\s*)?(?P<symbol>"
    + "|".join(re.escape(s) for s in PROBLEM_SYMBOLS)
    + r")\s*$"
)


# ---------------------------------------------------------------------------
# Bounds and sampling
# ---------------------------------------------------------------------------


def bounds_for(
    algorithm: str, overrides: Mapping[str, Any] | None = None
) -> dict[str, tuple[float | str, float | str]]:
    """The search bounds of ``algorithm``: its defaults updated by ``overrides``.

    Parameters
    ----------
    algorithm : str
        A registered algorithm name.
    overrides : dict, optional
        Either in the form of :data:`DEFAULT_BOUNDS` (keyed by algorithm;
        entries of other algorithms are checked and ignored) or a dict of
        ``{hyperparameter: (lo, hi)}`` for ``algorithm``. Each bound is a
        number or a problem-relative string (module docstring).

    Returns
    -------
    dict
        ``{hyperparameter: (lo, hi)}``, possibly still with symbols (see
        :func:`resolve_bounds`).

    Raises
    ------
    HyflError
        Unknown algorithm or hyperparameter, malformed bound, ``lo <= 0`` or
        ``lo > hi``, or no bounds at all.
    """
    check_choice("algorithm", algorithm, algorithm_names())
    merged = dict(DEFAULT_BOUNDS.get(algorithm, {}))
    if overrides:
        if not isinstance(overrides, Mapping):
            raise fail(
                "tuning bounds",
                f"must be a table, got {overrides!r}",
                'Pass {"<algorithm>": {"<hyperparameter>": [lo, hi]}}.',
            )
        nested = [isinstance(v, Mapping) for v in overrides.values()]
        if all(nested):
            for name in overrides:
                check_choice("algorithm of the tuning bounds", name, algorithm_names())
            for name, table in overrides.items():
                _check_table(name, table)
            merged.update(overrides.get(algorithm, {}))
        elif any(nested):
            raise fail(
                "tuning bounds",
                "mix per-algorithm tables with hyperparameter bounds",
                'Use one form: {"fedavg": {"a": [lo, hi]}} or {"a": [lo, hi]}.',
            )
        else:
            _check_table(algorithm, overrides)
            merged.update(overrides)
    if not merged:
        raise fail(
            f"tuning {algorithm}",
            "has no hyperparameters to search",
            f"Give bounds, e.g. [tune.bounds.{algorithm}] with a hyperparameter = [lo, hi]; "
            f"{algorithm} accepts: {', '.join(sorted(accepted_hyperparameters(algorithm)))}.",
        )
    return {name: _parse_pair(algorithm, name, pair) for name, pair in merged.items()}


def _check_table(algorithm: str, table: Mapping[str, Any]) -> None:
    accepted = accepted_hyperparameters(algorithm)
    for name, pair in table.items():
        if name not in accepted:
            raise fail(
                f"tuning bound {name!r}",
                f"names no hyperparameter of {algorithm}",
                f"{algorithm} accepts: {', '.join(sorted(accepted))}.",
            )
        _parse_pair(algorithm, name, pair)


def _parse_pair(algorithm: str, name: str, pair: Any) -> tuple[float | str, float | str]:
    culprit = f"tuning bounds of {algorithm} {name}"
    fix = 'Give [lo, hi] with 0 < lo <= hi, numbers or e.g. "K/N", "10*eta_auto".'
    if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
        raise fail(culprit, f"must be a pair [lo, hi], got {pair!r}", fix)
    lo, hi = (_parse_bound(culprit, v, fix) for v in pair)
    if isinstance(lo, float) and isinstance(hi, float):
        _check_numeric(culprit, lo, hi, name)
    return lo, hi


def _parse_bound(culprit: str, value: Any, fix: str) -> float | str:
    if isinstance(value, str):
        match = _BOUND_PATTERN.match(value)
        factor = _to_float(match.group("factor")) if match and match.group("factor") else 1.0
        if match is None or not (math.isfinite(factor) and factor > 0):
            raise fail(
                culprit,
                f"has the bound {value!r}, which is neither a number nor a positive multiple "
                f"of one of {', '.join(PROBLEM_SYMBOLS)}",
                fix,
            )
        return value.strip()
    number = _to_float(value)
    if isinstance(value, bool) or not math.isfinite(number):
        raise fail(culprit, f"has the bound {value!r}, which is not a finite number", fix)
    if number <= 0:
        raise fail(
            culprit,
            f"has the bound {value!r} <= 0, which a log-uniform search cannot sample",
            fix,
        )
    return number


def _to_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _check_numeric(culprit: str, lo: float, hi: float, name: str) -> None:
    fix = "Give [lo, hi] with 0 < lo <= hi (lo == hi fixes the value)."
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise fail(culprit, f"must be finite, got [{lo!r}, {hi!r}]", fix)
    if lo <= 0:
        raise fail(culprit, f"has lo = {lo!r} <= 0, which a log-uniform search cannot sample", fix)
    if lo > hi:
        raise fail(culprit, f"has lo = {lo!r} > hi = {hi!r}", fix)
    if name in INTEGER_HYPERPARAMETERS and math.ceil(lo) > math.floor(hi):
        raise fail(culprit, f"[{lo!r}, {hi!r}] holds no integer", "Widen the bounds.")


def problem_quantities(setup, symbols: Sequence[str] = PROBLEM_SYMBOLS) -> dict[str, float]:
    """Values of the problem-relative symbols (:data:`PROBLEM_SYMBOLS`) on a prepared set-up.

    Parameters
    ----------
    setup : hyfl.experiments.runner.Setup
    symbols : sequence of str
        Which to compute (``eta_auto`` and ``mu_auto`` cost a spectral norm).

    Returns
    -------
    dict
        ``{symbol: value}``.
    """
    problem, partition = setup.problem, setup.partition
    out: dict[str, float] = {}
    if "K/N" in symbols:
        out["K/N"] = partition.n_clients / problem.n_samples
    if "eta_auto" in symbols:
        from hyfl.algorithms.fedbcd import FedBCD

        out["eta_auto"] = float(FedBCD().initial_rate(problem))
    if "mu_auto" in symbols:
        from hyfl.algorithms.fedhybrid import FedHybrid
        from hyfl.partition import stack

        state = FedHybrid().setup(problem, stack(partition, problem.X))
        out["mu_auto"] = float(state.mu)
    return out


def resolve_bounds(
    bounds: Mapping[str, tuple[float | str, float | str]], setup
) -> dict[str, tuple[float, float]]:
    """Replace problem-relative bounds by numbers computed from a prepared set-up.

    Parameters
    ----------
    bounds : dict
        ``{hyperparameter: (lo, hi)}`` as returned by :func:`bounds_for`.
    setup : hyfl.experiments.runner.Setup
        From :func:`hyfl.experiments.runner.prepare`.

    Returns
    -------
    dict
        ``{hyperparameter: (lo, hi)}`` of floats.

    Raises
    ------
    HyflError
        When a resolved range is empty (e.g. ``K/N`` above the upper bound).
    """
    needed = {
        _BOUND_PATTERN.match(v).group("symbol")
        for pair in bounds.values()
        for v in pair
        if isinstance(v, str)
    }
    values = problem_quantities(setup, sorted(needed)) if needed else {}
    resolved = {}
    for name, pair in bounds.items():
        lo, hi = (_resolve(v, values) for v in pair)
        culprit = f"tuning bounds of {name} {list(pair)!r}"
        if any(isinstance(v, str) for v in pair):
            culprit += f" (resolved on this problem to [{lo:.6g}, {hi:.6g}])"
        _check_numeric(culprit, lo, hi, name)
        resolved[name] = (lo, hi)
    return resolved


def _resolve(value: float | str, values: Mapping[str, float]) -> float:
    if not isinstance(value, str):
        return float(value)
    match = _BOUND_PATTERN.match(value)
    factor = float(match.group("factor")) if match.group("factor") else 1.0
    return factor * values[match.group("symbol")]


def sample(bounds: Mapping[str, tuple[float, float]], rng: np.random.Generator) -> dict[str, Any]:
    """Draw one set of hyperparameters log-uniformly within numeric bounds.

    Each value is ``10 ** u`` with ``u ~ U(log10 lo, log10 hi)`` (one draw per
    hyperparameter, in the order of ``bounds``); integer hyperparameters
    (:data:`INTEGER_HYPERPARAMETERS`) are rounded to the nearest integer in
    ``[ceil(lo), floor(hi)]``.

    Parameters
    ----------
    bounds : dict
        ``{hyperparameter: (lo, hi)}`` with ``0 < lo <= hi`` (resolved, see
        :func:`resolve_bounds`).
    rng : numpy.random.Generator
        The only source of randomness (never the global RNG).

    Returns
    -------
    dict
        ``{hyperparameter: value}`` (float, or int for integer ones).
    """
    if not isinstance(rng, np.random.Generator):
        raise fail(
            "rng",
            f"must be a numpy.random.Generator, got {type(rng).__name__}",
            "Pass np.random.default_rng(seed).",
        )
    out: dict[str, Any] = {}
    for name, pair in bounds.items():
        if any(isinstance(v, str) for v in pair):
            raise fail(
                f"tuning bounds of {name} {list(pair)!r}",
                "are problem-relative",
                "Resolve them first with resolve_bounds(bounds, setup).",
            )
        lo, hi = (_to_float(v) for v in pair)
        _check_numeric(f"tuning bounds of {name}", lo, hi, name)
        value = float(10.0 ** rng.uniform(math.log10(lo), math.log10(hi)))
        value = min(max(value, lo), hi)  # guard the round trip through log10
        if name in INTEGER_HYPERPARAMETERS:
            out[name] = int(min(max(round(value), math.ceil(lo)), math.floor(hi)))
        else:
            out[name] = value
    return out


# ---------------------------------------------------------------------------
# Metrics and divergence
# ---------------------------------------------------------------------------


def _column(rows: Sequence[Mapping[str, float]], name: str) -> np.ndarray:
    return np.array([_to_float(row.get(name, np.nan)) for row in rows], dtype=float)


def loss_series(rows: Sequence[Mapping[str, float]]) -> tuple[np.ndarray, np.ndarray, str]:
    """The loss a trial is judged by: relative loss when the optimum is known, else primal.

    The optimum is known when the first row's ``relative_loss`` is finite.

    Returns
    -------
    iterations : ndarray
    loss : ndarray
    kind : {"relative_loss", "primal"}
    """
    if not rows:
        raise fail("metrics rows", "are empty", "Pass the rows of a finished run.")
    kind = "relative_loss" if np.isfinite(_column(rows[:1], "relative_loss")[0]) else "primal"
    return _column(rows, "iteration"), _column(rows, kind), kind


def is_divergent(rows: Sequence[Mapping[str, float]]) -> bool:
    """Whether a finished run diverged (and is excluded from the selection).

    A run is divergent when any recorded loss (:func:`loss_series`, and the
    primal objective) is not finite, or when it ended worse than it started.
    "Worse" is judged on the duality gap when every row has a finite one
    (primal-dual methods such as HyFDCA: their primal objective may rise in
    early rounds while the gap, which bounds the suboptimality, falls), and on
    the loss otherwise. :func:`tune` also counts as divergent a run that
    raised :class:`~hyfl.errors.HyflError` or ``FloatingPointError``.
    """
    _, loss, _ = loss_series(rows)
    if not (np.all(np.isfinite(loss)) and np.all(np.isfinite(_column(rows, "primal")))):
        return True
    gap = _column(rows, "gap")
    progress = gap if np.all(np.isfinite(gap)) else loss
    return bool(progress[-1] > progress[0])


def trial_metrics(
    rows: Sequence[Mapping[str, float]], latencies: Sequence[float] = LATENCIES
) -> dict[str, float]:
    """The seven selection metrics of one run, from its metrics rows.

    ``rows`` are the run's evaluated outer iterations (first row iteration 0,
    last row the final iteration ``T``; cumulative cost columns as written by
    the engines). With ``loss`` the series of :func:`loss_series`
    (``P_0 .. P_T`` below, at the recorded iterations):

    1-3. ``time_per_iter_lat<L>`` for ``L`` in ``latencies`` (0, 0.2575 and
         0.8 s): the average simulated runtime per outer iteration with a
         round-trip latency of ``L`` seconds, computed from the one run as
         ``(time_client + time_server + time_encryption) / T + round_trips / T * L``
         with the final (cumulative) values. The run's own latency
         (``time_latency``) is left out and replaced by ``L``.
    4. ``loss_last5``: mean of the last 5 recorded loss values (all of them
       when fewer are recorded).
    5. ``max_val_accuracy``: maximum validation accuracy over the recorded
       iterations (NaN without validation data).
    6. ``volatility``: standard deviation (``ddof=0``) of the differences of
       consecutive recorded loss values.
    7. ``iterations_to_90pct``: the first recorded iteration ``t`` with
       ``P_0 - P_t >= 0.9 (P_0 - min_s P_s)``; ``T`` when the loss never fell
       below ``P_0`` (no progress at all).

    Smaller is better for all but metric 5 (:data:`LARGER_IS_BETTER`).

    Parameters
    ----------
    rows : sequence of dict
        ``RunResult.metrics`` (or rows read back from ``metrics.csv``).
    latencies : sequence of float, default (0, 0.2575, 0.8)

    Returns
    -------
    dict
        ``{metric: value}``; the keys are :data:`METRICS` for the default
        latencies.
    """
    iterations, loss, _ = loss_series(rows)
    final = rows[-1]
    T = max(_to_float(final.get("iteration", np.nan)), 1.0)
    compute = sum(
        _to_float(final.get(k, np.nan)) for k in ("time_client", "time_server", "time_encryption")
    )
    trips = _to_float(final.get("round_trips", np.nan))
    out = {f"time_per_iter_lat{lat:g}": compute / T + trips / T * float(lat) for lat in latencies}
    out["loss_last5"] = float(np.mean(loss[-5:]))
    val = _column(rows, "val_accuracy")
    out["max_val_accuracy"] = (
        float(np.max(val[np.isfinite(val)])) if np.isfinite(val).any() else (math.nan)
    )
    out["volatility"] = float(np.std(np.diff(loss))) if loss.size > 1 else 0.0
    out["iterations_to_90pct"] = _iterations_to_progress(iterations, loss, 0.9)
    return out


def _iterations_to_progress(iterations: np.ndarray, loss: np.ndarray, fraction: float) -> float:
    if not np.all(np.isfinite(loss)):
        return math.nan
    decrease = loss[0] - np.min(loss)
    if decrease <= 0:
        return float(iterations[-1])
    hit = np.flatnonzero(loss[0] - loss >= fraction * decrease)
    return float(iterations[hit[0]])


# ---------------------------------------------------------------------------
# Gray Relational Analysis
# ---------------------------------------------------------------------------


def gray_relational_grades(
    matrix: np.ndarray,
    larger_is_better: Sequence[bool],
    weights: Sequence[float] | None = None,
    zeta: float = 0.5,
) -> np.ndarray:
    """Grey relational grades of alternatives (rows) over metrics (columns).

    Gray Relational Analysis as in Wang and Rangaiah (2017):

    1. Normalize each column to [0, 1], 1 being the best value: larger-better
       ``(x - min) / (max - min)``, smaller-better ``(max - x) / (max - min)``.
       A constant column is 1 for every alternative (nobody is worse).
    2. Deviation from the ideal: ``D = 1 - normalized``.
    3. Grey relational coefficient
       ``xi = (D_min + zeta D_max) / (D + zeta D_max)`` with ``D_min`` and
       ``D_max`` taken over the whole matrix (after min-max normalization
       they are 0 and 1 unless every column is constant, in which case
       ``xi = 1``).
    4. Grade: weighted mean of ``xi`` over the metrics (equal weights by
       default). The alternative with the largest grade is selected.

    Parameters
    ----------
    matrix : array_like, shape (n_alternatives, n_metrics)
        Finite metric values.
    larger_is_better : sequence of bool, length n_metrics
    weights : sequence of float, optional
        Non-negative weights of the metrics, not all zero.
    zeta : float, default 0.5
        Distinguishing coefficient in (0, 1].

    Returns
    -------
    ndarray, shape (n_alternatives,)
        Grades in (0, 1].
    """
    X = np.asarray(matrix, dtype=float)
    if X.ndim != 2:
        raise fail(
            "GRA matrix",
            f"must be 2-D (alternatives x metrics), got shape {X.shape}",
            "Pass one row per alternative and one column per metric.",
        )
    n, m = X.shape
    larger = np.asarray(larger_is_better, dtype=bool).reshape(-1)
    if larger.size != m:
        raise fail(
            "larger_is_better",
            f"has {larger.size} entries for {m} metrics",
            "Give one direction per column.",
        )
    if weights is None:
        w = np.ones(m)
    else:
        w = np.asarray(weights, dtype=float).reshape(-1)
        if w.size != m or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise fail(
                "GRA weights",
                f"must be {m} non-negative numbers, not all 0, got {weights!r}",
                "Give one weight per metric, e.g. all 1.",
            )
    if not (0 < zeta <= 1):
        raise fail("zeta", f"must be in (0, 1], got {zeta!r}", "The usual value is 0.5.")
    if n == 0:
        return np.zeros(0)
    if not np.all(np.isfinite(X)):
        raise fail(
            "GRA matrix",
            "has non-finite values",
            "Leave divergent alternatives and undefined metrics out.",
        )
    lo, hi = X.min(axis=0), X.max(axis=0)
    span = hi - lo
    constant = span == 0
    safe = np.where(constant, 1.0, span)
    normalized = np.where(larger, X - lo, hi - X) / safe
    normalized[:, constant] = 1.0
    delta = 1.0 - normalized
    d_min, d_max = delta.min(), delta.max()
    if d_max == 0:
        xi = np.ones_like(delta)
    else:
        xi = (d_min + zeta * d_max) / (delta + zeta * d_max)
    return xi @ w / w.sum()


# ---------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One random-search trial.

    Attributes
    ----------
    index : int
        0-based, in the order run.
    hyper : dict
        The sampled hyperparameters.
    metrics : dict
        :data:`METRICS` (NaN when the run raised).
    divergent : bool
    grade : float
        Grey relational grade, NaN for divergent trials.
    wall_seconds : float
    error : str or None
        Message of the exception a failed run raised.
    """

    index: int
    hyper: dict[str, Any]
    metrics: dict[str, float]
    divergent: bool
    grade: float
    wall_seconds: float
    error: str | None = None


@dataclass(frozen=True)
class TuneResult:
    """Outcome of :func:`tune`.

    Attributes
    ----------
    algorithm : str
    trials : tuple of Trial
        Every trial, divergent ones included.
    best : dict
        Hyperparameters of the trial with the largest grade.
    best_index : int
        Its :attr:`Trial.index`.
    bounds : dict
        The resolved numeric bounds searched.
    metrics_used : tuple of str
        Metrics that entered the GRA (those defined for every non-divergent
        trial; e.g. no validation accuracy without validation data).
    seconds : float
        The time budget.
    elapsed : float
        Wall seconds of the search (preparation excluded).
    seed : int
    stopped_by : str
        ``"time"``, ``"max_trials"`` or ``"interrupt"``.
    out_dir : Path or None
    """

    algorithm: str
    trials: tuple[Trial, ...]
    best: dict[str, Any]
    best_index: int
    bounds: dict[str, tuple[float, float]]
    metrics_used: tuple[str, ...]
    seconds: float
    elapsed: float
    seed: int
    stopped_by: str
    out_dir: Path | None = field(default=None)

    @property
    def n_divergent(self) -> int:
        return sum(t.divergent for t in self.trials)

    @property
    def best_trial(self) -> Trial:
        return self.trials[self.best_index]


def tune(
    spec,
    algorithm: str,
    *,
    seconds: float,
    max_trials: int | None = None,
    bounds: Mapping[str, Any] | None = None,
    seed: int = 0,
    out_dir: str | Path | None = None,
    progress: bool = False,
) -> TuneResult:
    """Time-bounded random search of ``algorithm``'s hyperparameters, selected by GRA.

    The problem is prepared once (:func:`~hyfl.experiments.runner.prepare`;
    not counted in the budget); then trials run one after another with
    :func:`~hyfl.experiments.runner.run_prepared` (the spec's iterations,
    ``eval_every`` and seed, hence the same participation trace for all)
    until ``seconds`` have passed or ``max_trials`` trials are done. A trial
    never starts after the budget is spent, a running one finishes, and the
    first trial always runs. Ctrl-C stops the search and selects among the
    trials finished so far.

    Each trial's hyperparameters are :func:`sample`\\ d from the bounds and
    override the spec's (``spec.hyper_for(algorithm)``), which supply the
    untuned ones (tuning ``iic`` drops a fixed ``local_steps`` and vice
    versa). Divergent trials (:func:`is_divergent`, or the run raised
    :class:`~hyfl.errors.HyflError` / ``FloatingPointError``) are recorded
    and excluded; the others are ranked by :func:`gray_relational_grades`
    over :func:`trial_metrics` with equal weights.

    Parameters
    ----------
    spec : hyfl.experiments.runner.RunSpec
        Data, partition, participation, iterations, seed, costs, ...
        (``spec.algorithm`` is ignored).
    algorithm : str
        The algorithm to tune.
    seconds : float
        Time budget in wall seconds (``inf`` only together with ``max_trials``).
    max_trials : int, optional
        Stop after this many trials.
    bounds : dict, optional
        Overrides of :data:`DEFAULT_BOUNDS` (see :func:`bounds_for`).
    seed : int, default 0
        Seed of the sampling generator (the runs use ``spec.seed``).
    out_dir : path, optional
        Where to write ``trials.csv``, ``best.toml`` and ``tuning.json``.
    progress : bool, default False
        Print one line per trial.

    Returns
    -------
    TuneResult

    Raises
    ------
    HyflError
        Invalid arguments or bounds, bounds that give an invalid
        configuration, an algorithm that does not apply to the problem, or
        every trial divergent (the files are still written).
    """
    from hyfl.experiments.runner import prepare
    from hyfl.partition import stack

    budget, max_trials, seed = _check_tune_arguments(algorithm, seconds, max_trials, seed)
    raw_bounds = bounds_for(algorithm, bounds)

    setup = prepare(spec)
    resolved = resolve_bounds(raw_bounds, setup)
    base = _fixed_hyperparameters(spec, algorithm, resolved)
    _preflight(algorithm, base, resolved, setup, stack)

    out = Path(out_dir) if out_dir is not None else None
    trials, stopped_by, elapsed = _search(
        setup, spec, algorithm, base, resolved, rng=np.random.default_rng(seed),
        budget=budget, max_trials=max_trials, progress=progress, out=out)

    graded, used = _graded(trials)
    finished = tuple(Trial(**t) for t in graded)
    candidates = [t for t in finished if not t.divergent]
    record = {
        "algorithm": algorithm,
        "spec": {**asdict(spec), "algorithm": algorithm},
        "bounds": {k: list(v) for k, v in raw_bounds.items()},
        "bounds_resolved": {k: list(v) for k, v in resolved.items()},
        "fixed_hyperparameters": base,
        "seconds": budget,
        "max_trials": max_trials,
        "seed": seed,
        "elapsed": elapsed,
        "stopped_by": stopped_by,
        "n_trials": len(finished),
        "n_divergent": len(finished) - len(candidates),
        "metrics": list(METRICS),
        "metrics_used": list(used),
        "larger_is_better": dict(zip(METRICS, LARGER_IS_BETTER)),
        "zeta": 0.5,
        "loss": _loss_kind(trials),
    }
    if not candidates:
        _fail_all_divergent(algorithm, finished, out, graded, resolved, record)
    best_trial = max(candidates, key=lambda t: t.grade)  # first of equal grades
    result = TuneResult(
        algorithm=algorithm,
        trials=finished,
        best=dict(best_trial.hyper),
        best_index=best_trial.index,
        bounds=resolved,
        metrics_used=used,
        seconds=budget,
        elapsed=elapsed,
        seed=seed,
        stopped_by=stopped_by,
        out_dir=out,
    )
    if out is not None:
        _write_tuning(out, result, best_trial, spec, graded, record)
    return result


def _check_tune_arguments(algorithm: str, seconds, max_trials, seed) -> tuple[float, int | None,
                                                                              int]:
    """:func:`tune`'s checked budget, ``max_trials`` and ``seed``: a known convex
    algorithm, a positive budget (infinite only with ``max_trials``)."""
    check_choice("algorithm", algorithm, algorithm_names())
    from hyfl.algorithms import is_neural

    if is_neural(algorithm):
        raise fail(
            f"algorithm {algorithm}",
            "cannot be tuned here: the search ranks trials by relative loss against the "
            "convex optimum, which a neural model does not have",
            "Compare settings with hyfl compare or a config (configs/neural/).",
        )
    budget = _to_float(seconds)
    if isinstance(seconds, bool) or math.isnan(budget) or budget <= 0:
        raise fail(
            "seconds",
            f"must be a positive time budget, got {seconds!r}",
            "Pass seconds of search, e.g. 3600.",
        )
    if max_trials is not None:
        max_trials = check_int("max_trials", max_trials, minimum=1)
    elif math.isinf(budget):
        raise fail(
            "seconds",
            "is infinite and max_trials is not given",
            "Give a finite budget or a number of trials.",
        )
    return budget, max_trials, check_int("seed", seed, minimum=0)


def _fixed_hyperparameters(spec, algorithm: str, resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's hyperparameters that every trial keeps: those not searched (tuning
    one of an exclusive pair, e.g. ``iic``, drops the other, ``local_steps``)."""
    base = spec.hyper_for(algorithm, only_accepted=True)
    for name in resolved:
        base.pop(name, None)
        if name in _EXCLUSIVE:
            base.pop(_EXCLUSIVE[name], None)
    return base


def _search(setup, spec, algorithm: str, base: dict[str, Any], resolved: dict, *, rng,
            budget: float, max_trials: int | None, progress: bool,
            out: Path | None) -> tuple[list[dict[str, Any]], str, float]:
    """Run trials until the budget is spent or ``max_trials`` are done (the first trial
    always runs, a running one finishes; Ctrl-C stops after the first). Returns the
    trials, why the search stopped and its wall seconds."""
    from hyfl.experiments.runner import run_prepared

    console = _console() if progress else None
    trials: list[dict[str, Any]] = []
    started = time.monotonic()
    stopped_by = "max_trials"
    while max_trials is None or len(trials) < max_trials:
        if trials and time.monotonic() - started >= budget:
            stopped_by = "time"
            break
        hyper = sample(resolved, rng)
        try:
            trial = _run_trial(run_prepared, setup, spec, algorithm, {**base, **hyper})
        except KeyboardInterrupt:
            if not trials:
                raise
            stopped_by = "interrupt"
            break
        trial.update(index=len(trials), hyper=hyper)
        trials.append(trial)
        if console is not None:
            console.print(_progress_line(trial, len(trials), time.monotonic() - started, budget))
        if out is not None:  # keep what is done on disk during long searches
            _write_trials(out, _graded(trials)[0], resolved)
    return trials, stopped_by, time.monotonic() - started


def _fail_all_divergent(algorithm: str, finished, out: Path | None, graded, resolved,
                        record: dict) -> NoReturn:
    """Every trial diverged: write the trials and the record (no best), then raise."""
    if out is not None:
        _write_trials(out, graded, resolved)
        _write_json(out / "tuning.json", {**record, "best": None})
    errors = sorted({t.error for t in finished if t.error})
    detail = f" (errors: {'; '.join(errors[:3])})" if errors else ""
    raise fail(
        f"tuning {algorithm}",
        f"found no usable hyperparameters: all {len(finished)} trial(s) diverged{detail}",
        "Narrow the bounds (e.g. smaller step sizes in [tune.bounds."
        f"{algorithm}]) or give the search more time.",
    )


def _write_tuning(out: Path, result: TuneResult, best_trial: Trial, spec, graded,
                  record: dict) -> None:
    """``trials.csv``, ``tuning.json`` (the record and the best trial) and ``best.toml``."""
    _write_trials(out, graded, result.bounds)
    _write_json(
        out / "tuning.json",
        {
            **record,
            "best": {
                "trial": best_trial.index,
                "grade": best_trial.grade,
                "hyperparameters": best_trial.hyper,
                "metrics": best_trial.metrics,
            },
        },
    )
    _write_best(out / "best.toml", result, spec)


def _preflight(algorithm, base, resolved, setup, stack) -> None:
    """Fail fast on configuration errors, which would otherwise look like divergence."""
    corners = {
        "lower": {k: lo for k, (lo, _) in resolved.items()},
        "upper": {k: hi for k, (_, hi) in resolved.items()},
    }
    for which, values in corners.items():
        values = {k: (round(v) if k in INTEGER_HYPERPARAMETERS else v) for k, v in values.items()}
        try:
            make_algorithm(algorithm, {**base, **values})
        except HyflError as error:
            raise fail(
                f"tuning bounds of {algorithm}",
                f"give an invalid configuration at their {which} ends {values} ({error})",
                "Change the bounds or the fixed hyperparameters.",
            ) from None
    middle = {
        k: (round(math.sqrt(lo * hi)) if k in INTEGER_HYPERPARAMETERS else math.sqrt(lo * hi))
        for k, (lo, hi) in resolved.items()
    }
    # Applicability (partition type, loss) is checked by the algorithm's set-up.
    make_algorithm(algorithm, {**base, **middle}).setup(
        setup.problem, stack(setup.partition, setup.problem.X)
    )


def _run_trial(run_prepared, setup, spec, algorithm, hyper) -> dict[str, Any]:
    start = time.perf_counter()
    error = None
    rows = None
    try:
        # A divergent run overflows: expected here, and detected from its losses.
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            outcome = run_prepared(setup, spec, algorithm, hyper)
        rows = outcome.result.metrics
    except (HyflError, FloatingPointError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    wall = time.perf_counter() - start
    if rows:
        with np.errstate(all="ignore"):
            metrics = trial_metrics(rows)
        divergent = is_divergent(rows)
        kind = loss_series(rows)[2]
    else:
        metrics, divergent, kind = dict.fromkeys(METRICS, math.nan), True, None
    return {
        "metrics": metrics,
        "divergent": divergent,
        "grade": math.nan,
        "wall_seconds": wall,
        "error": error,
        "_loss": kind,
    }


def _graded(trials: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """Trials (without private keys) with grades, and the metrics used for them."""
    clean = [{k: v for k, v in t.items() if not k.startswith("_")} for t in trials]
    keep = [i for i, t in enumerate(clean) if not t["divergent"]]
    if not keep:
        return clean, ()
    matrix = np.array([[clean[i]["metrics"][m] for m in METRICS] for i in keep], dtype=float)
    usable = np.all(np.isfinite(matrix), axis=0)
    used = tuple(m for m, ok in zip(METRICS, usable) if ok)
    if not used:  # pragma: no cover - the loss metrics are finite for non-divergent runs
        return clean, ()
    larger = [b for b, ok in zip(LARGER_IS_BETTER, usable) if ok]
    grades = gray_relational_grades(matrix[:, usable], larger)
    for i, g in zip(keep, grades):
        clean[i]["grade"] = float(g)
    return clean, used


def _loss_kind(trials) -> str | None:
    kinds = {t["_loss"] for t in trials if t.get("_loss")}
    return kinds.pop() if len(kinds) == 1 else None


def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, emoji=False)


def _progress_line(trial: dict, n: int, elapsed: float, budget: float) -> str:
    values = ", ".join(f"{k}={_short(v)}" for k, v in trial["hyper"].items())
    if trial["divergent"]:
        status = "divergent" + (" (error)" if trial["error"] else "")
    else:
        status = f"last-5 loss {trial['metrics']['loss_last5']:.3g}"
    left = f", {max(budget - elapsed, 0):.0f} s left" if math.isfinite(budget) else ""
    return f"trial {n}: {values} -> {status} ({trial['wall_seconds']:.1f} s{left})"


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def _write_trials(out: Path, trials: list[dict[str, Any]], bounds: Mapping[str, Any]) -> None:
    """``trials.csv``: trial, divergent, grade, wall_seconds, hyperparameters, metrics, error."""
    out.mkdir(parents=True, exist_ok=True)
    columns = ["trial", "divergent", "grade", "wall_seconds", *bounds, *METRICS, "error"]
    tmp = out / "trials.csv.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for t in trials:
            row = {
                "trial": t["index"],
                "divergent": "true" if t["divergent"] else "false",
                "grade": _csv(t["grade"]),
                "wall_seconds": _csv(t["wall_seconds"]),
                **{k: _csv(t["hyper"].get(k)) for k in bounds},
                **{k: _csv(t["metrics"].get(k)) for k in METRICS},
                # An error quotes names from the data's files: no formula (OWASP).
                "error": csv_text(t["error"] or ""),
            }
            writer.writerow(row)
    tmp.replace(out / "trials.csv")


def _csv(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, (bool, int, np.integer)):
        return str(int(v))
    v = float(v)
    return "" if math.isnan(v) else repr(v)


def _write_json(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)


def _write_best(path: Path, result: TuneResult, spec) -> None:
    """``best.toml``: the chosen values as an ``[algorithms.<name>]`` table."""
    import tomli_w

    best = result.best_trial
    header = (
        f"# hyfl tune: {result.algorithm} on {spec.data} ({spec.partition_spec()}, participation "
        f"{spec.participation_spec()}, {spec.iterations} iterations), best of {len(result.trials)} "
        f"trials ({result.n_divergent} divergent), grey relational grade {best.grade:.4f}\n"
    )
    values = {
        k: (int(v) if isinstance(v, (int, np.integer)) else float(v))
        for k, v in result.best.items()
    }
    path.write_text(header + tomli_w.dumps({"algorithms": {result.algorithm: values}}))


def tune_config(
    path: str | Path,
    *,
    algorithms: list[str] | None = None,
    seconds: float = 600.0,
    max_trials: int | None = None,
    out_dir: str | Path | None = None,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """``hyfl tune CONFIG``: tune each algorithm of an experiment config.

    Each ``[algorithms.LABEL]`` table is tuned on the config's data,
    partition, participation, budget and costs (its first seed), with the
    bounds of ``[tune.bounds]`` over the paper's defaults
    (:data:`hyfl.experiments.tuning.DEFAULT_BOUNDS`). ``[tune] seconds`` and
    ``max_trials`` in the config are used when not given here. Results go to
    ``<out>/<label>/`` (trials.csv, best.toml, tuning.json).

    Returns
    -------
    dict
        ``label -> TuneResult``.
    """
    from hyfl.experiments.config import load_config

    config = load_config(path)
    settings = dict(config.tune)
    labels = algorithms or [entry.label for entry in config.algorithms]
    out = Path(out_dir) if out_dir is not None else config.default_out() / "tuning"
    results = {}
    for label in labels:
        try:
            entry = config.algorithm(label)
        except KeyError:
            known = ", ".join(e.label for e in config.algorithms)
            raise fail(
                "--algorithm", f"{label!r} is not in {path}", f"Use one of: {known}"
            ) from None
        spec = config.spec(label, config.seeds[0])
        bounds = settings.get("bounds", {})
        bounds = bounds.get(label, bounds.get(entry.algorithm, bounds))
        results[label] = tune(
            spec,
            entry.algorithm,
            seconds=float(settings.get("seconds", seconds)),
            max_trials=settings.get("max_trials", max_trials),
            bounds={k: v for k, v in bounds.items() if not isinstance(v, dict)} or None,
            seed=seed,
            out_dir=out / label,
            progress=progress,
        )
    return results
