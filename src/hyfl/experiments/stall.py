"""Why a run stopped moving, read from its metrics: the check behind ``hyfl run``'s
"steps rejected" warning.

A HyFDCA run records, per round, whether its step was ``accepted`` and its
``step`` size. On data in raw units (breast cancer's ``area`` in the thousands,
its ``fractal_dimension`` near 0.06) the rounds' steps are all rejected, or
accepted without the objective moving, and the run ends where it began with no
word of why. :func:`stalled_steps` finds such a tail of rounds and measures
the features' scales (largest column norm over smallest), so that the warning
can say what to change: ``--standardize``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["SCALE_RATIO", "STALL_ROUNDS", "column_norms", "stall_message", "stalled_steps"]

#: Fewest trailing rounds without progress that count as a stall.
STALL_ROUNDS = 5
#: Largest over smallest column norm beyond which the features' scales are named as the cause.
SCALE_RATIO = 100.0
_FLAT_RTOL = 1e-9
_SETTLED = 1e-2  # relative loss below which a flat objective is convergence, not a stall


def column_norms(X) -> np.ndarray:
    """Euclidean norm of every column of ``X`` (dense or scipy sparse)."""
    if hasattr(X, "multiply"):  # scipy sparse
        squares = np.asarray(X.multiply(X).sum(axis=0)).ravel()
    else:
        squares = np.sum(np.square(np.asarray(X, dtype=np.float64)), axis=0)
    return np.sqrt(np.asarray(squares, dtype=np.float64))


def _value(row: dict, key: str) -> float:
    try:
        return float(row.get(key, math.nan))
    except (TypeError, ValueError):
        return math.nan


def _rejected_tail(rows: list[dict]) -> int:
    """Trailing rounds whose step was rejected (``accepted`` 0 or ``step`` 0); rounds in
    which no client took part neither count nor end the tail."""
    count = 0
    for row in reversed(rows):
        if _value(row, "active_clients") == 0:
            continue
        accepted, step = _value(row, "accepted"), _value(row, "step")
        if accepted == 0 or step == 0:
            count += 1
        else:
            break
    return count


def _flat_tail(rows: list[dict]) -> int:
    """Trailing rounds whose primal objective equals the last one (to a relative 1e-9)."""
    end = _value(rows[-1], "primal")
    if not math.isfinite(end):
        return 0
    count = 0
    for row in reversed(rows):
        if abs(_value(row, "primal") - end) <= _FLAT_RTOL * max(1.0, abs(end)):
            count += 1
        else:
            break
    return count - 1  # rounds after the one that reached the value


def stalled_steps(metrics: Sequence[dict], X=None, feature_names: Sequence[str] | None = None,
                  *, standardized: bool = False) -> dict[str, Any] | None:
    """Whether a run's last rounds made no progress, why, and what to change; None if they did.

    Parameters
    ----------
    metrics : sequence of dict
        The run's metrics rows (iteration 0, the start, first). Only runs whose
        rows record ``accepted`` or ``step`` (HyFDCA's step acceptance) are judged.
    X : matrix, optional
        The training features the run saw (after any scaling): their column norms
        tell whether the scales differ enough to be the cause.
    feature_names : sequence of str, optional
        Names of X's columns, to name the largest and the smallest.
    standardized : bool, default False
        Whether the run already standardized the features (then the scales are not
        the advice).

    Returns
    -------
    dict or None
        ``kind`` ("rejected": every step rejected; "flat": the objective did not
        move), ``rounds`` (trailing evaluated rounds), ``relative_loss``,
        ``scale_ratio`` (largest column norm / smallest nonzero; None without X),
        ``largest``/``smallest`` (column names or numbers), ``standardize``
        (whether --standardize is the advice) and ``message``.
    """
    rows = [r for r in metrics if _value(r, "iteration") >= 1]
    if not rows or not any("accepted" in r or "step" in r for r in rows):
        return None
    rejected = _rejected_tail(rows)
    flat = _flat_tail(rows)
    relative = _value(rows[-1], "relative_loss")
    if relative <= _SETTLED:  # converged: nothing left to gain (NaN: no optimum known)
        return None
    # A flat stretch is a stall only over half the run: HyFDCA's certified objective
    # moves in steps, with plateaus of a dozen rounds on well-scaled data too.
    if rejected >= STALL_ROUNDS:
        kind, rounds = "rejected", rejected
    elif flat >= max(2 * STALL_ROUNDS, math.ceil(0.5 * len(rows))):
        kind, rounds = "flat", flat
    else:
        return None
    found: dict[str, Any] = {"kind": kind, "rounds": int(rounds),
                             "relative_loss": relative if math.isfinite(relative) else None,
                             "scale_ratio": None, "largest": None, "smallest": None}
    if X is not None:
        norms = column_norms(X)
        used = np.flatnonzero(norms > 0)
        if used.size >= 2:
            big, small = int(used[np.argmax(norms[used])]), int(used[np.argmin(norms[used])])
            names = list(feature_names) if feature_names is not None else []
            if len(names) != norms.size:
                names = [f"column {j}" for j in range(norms.size)]
            found.update(scale_ratio=float(norms[big] / norms[small]),
                         largest=(str(names[big]), float(norms[big])),
                         smallest=(str(names[small]), float(norms[small])))
    ratio = found["scale_ratio"]
    found["standardize"] = bool(not standardized and ratio is not None and ratio >= SCALE_RATIO)
    found["message"] = stall_message(found)
    return found


def stall_message(found: dict[str, Any], algorithm: str = "the run") -> str:
    """The warning for :func:`stalled_steps`' result: what happened, why and what to change."""
    rounds = found["rounds"]
    plural = "s" if rounds != 1 else ""
    if found["kind"] == "rejected":
        what = f"{algorithm}'s steps were all rejected in the last {rounds} round{plural}"
    else:
        what = f"{algorithm}'s objective did not move in the last {rounds} round{plural}"
    if found.get("relative_loss") is not None:
        what += f" (relative loss {found['relative_loss']:.3g})"
    ratio = found.get("scale_ratio")
    if found.get("standardize"):
        (big, big_norm), (small, small_norm) = found["largest"], found["smallest"]
        return (f"{what}: the features' scales differ by a factor of {ratio:.3g} (largest "
                f"column norm / smallest: {big!r} {big_norm:.3g}, {small!r} {small_norm:.3g}). "
                "Pass --standardize to divide every feature by its deviation (from a secure "
                "sum of the parties' column sums), or rescale the features in the files.")
    scales = f" (the features' scales differ by a factor of {ratio:.3g})" if ratio else ""
    return (f"{what}{scales}. Try another --step-rule (e.g. safe), a larger --lam or more "
            "--iterations.")
