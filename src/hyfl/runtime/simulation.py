"""The simulation engine: every client in one process, one loop for every algorithm.

The loop is owned here once: it draws the participating clients of each outer
iteration from the participation schedule, calls the algorithm's ``round``
hook, times it, and evaluates the server's model every ``eval_every`` rounds
(evaluation is timed separately, so per-round timings measure the algorithm
alone). Two independent random streams are derived from the seed: one for
participation and one for the algorithm, so algorithms compared under one
seed see the same participation trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl.algorithms.base import Algorithm
from hyfl.costs import COST_COLUMNS, TIME_COMPONENTS, CostMeter, CostModel
from hyfl.errors import check_int
from hyfl.partition import Partition, stack
from hyfl.privacy.ciphers import make_cipher
from hyfl.privacy.layout import SlotLayout
from hyfl.problem import Optimum, Problem

METRIC_COLUMNS = (
    "iteration",
    "primal",
    "dual",
    "gap",
    "relative_loss",
    "train_accuracy",
    "val_accuracy",
    "round_trips",
    "round_seconds",
    *COST_COLUMNS,
    *TIME_COMPONENTS,
)


@dataclass(frozen=True)
class Validation:
    """Held-out data for accuracy: features (n, M) and original labels (n,)."""

    X: sp.csr_matrix
    y: np.ndarray


@dataclass
class RunResult:
    """Outcome of :func:`simulate`.

    Attributes
    ----------
    metrics : list of dict
        One row per evaluated outer iteration (iteration 0 is the start);
        columns :data:`METRIC_COLUMNS` plus the algorithm's round statistics
        (of the last round). ``round_trips``, ``round_seconds``, bytes, HE
        operation counts, ``sim_time`` and its components are cumulative.
    weights : ndarray, shape (M, C)
        Final server model.
    duals : ndarray or None
        Final server duals (primal-dual methods).
    round_times : ndarray
        Wall time of each outer iteration in seconds (evaluation excluded).
    """

    metrics: list[dict[str, float]]
    weights: np.ndarray
    duals: np.ndarray | None
    round_times: np.ndarray
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> dict[str, float]:
        return self.metrics[-1]

    def column(self, name: str) -> np.ndarray:
        return np.array([row.get(name, np.nan) for row in self.metrics], dtype=float)


def random_streams(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for (participation, algorithm) derived from one seed."""
    participation_seq, algorithm_seq = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(participation_seq), np.random.default_rng(algorithm_seq)


def evaluate(
    problem: Problem,
    w: np.ndarray,
    alpha: np.ndarray | None,
    optimum: Optimum | None,
    validation: Validation | None,
    train_labels: np.ndarray | None = None,
) -> dict[str, float]:
    """Objective values and accuracies of the server's model."""
    primal = problem.primal(w)
    dual = problem.dual(alpha) if alpha is not None else np.nan
    row = {
        "primal": primal,
        "dual": dual,
        "gap": primal - dual if alpha is not None else np.nan,
        "relative_loss": (primal - optimum.primal) / abs(optimum.primal) if optimum else np.nan,
        "train_accuracy": (
            problem.accuracy(problem.X, train_labels, w) if train_labels is not None else np.nan
        ),
        "val_accuracy": (
            problem.accuracy(validation.X, validation.y, w) if validation is not None else np.nan
        ),
    }
    return row


def simulate(
    algorithm: Algorithm,
    problem: Problem,
    partition: Partition,
    participation,
    iterations: int,
    *,
    seed: int = 0,
    eval_every: int = 1,
    optimum: Optimum | None = None,
    validation: Validation | None = None,
    train_labels: np.ndarray | None = None,
    progress: bool = False,
    on_evaluate: Callable[[dict[str, float]], None] | None = None,
    cost_model: CostModel | None = None,
    cipher=None,
) -> RunResult:
    """Run ``iterations`` outer iterations of ``algorithm`` with all clients in-process.

    Parameters
    ----------
    algorithm : Algorithm
        E.g. :class:`hyfl.algorithms.hyfdca.HyFDCA`.
    problem : Problem
    partition : Partition
        Who holds which block; validated against ``problem.X``.
    participation : schedule
        Object with ``active(t, rng) -> bool mask``, see :mod:`hyfl.partition`.
    iterations : int
        Number of outer iterations.
    seed : int, default 0
    eval_every : int, default 1
        Evaluate every this many rounds (and always after the last one).
    optimum : Optimum, optional
        Centralized optimum for the relative loss ``(P - P*) / P*``.
    validation : Validation, optional
    train_labels : ndarray, optional
        Original training labels, for the training accuracy.
    progress : bool, default False
        Show a progress bar.
    on_evaluate : callable, optional
        Called with each metrics row as it is produced.
    cost_model : CostModel, optional
        Latency and HE costs for the simulated time (default: no latency, the
        paper's Paillier figures).
    cipher : hyfl.privacy.ciphers.Cipher, optional
        The cipher whose ciphertexts are counted (its slots per ciphertext and
        wire size). Default ``none``: one value per ciphertext, as the paper
        counted. This engine never encrypts; see
        :func:`hyfl.runtime.protocol.run_protocol` for real encryption.

    Returns
    -------
    RunResult
    """
    iterations = check_int("iterations", iterations, minimum=1)
    eval_every = check_int("eval_every", eval_every, minimum=1)
    blocks = stack(partition, problem.X)
    participation_rng, algorithm_rng = random_streams(seed)
    state = algorithm.setup(problem, blocks)

    metrics: list[dict[str, float]] = []
    round_times = np.zeros(iterations)
    trips = 0.0
    if cipher is None:
        cipher = make_cipher("none")
    meter = CostMeter((cost_model or CostModel()).validated(), int(cipher.ciphertext_bytes))
    totals = dict.fromkeys((*COST_COLUMNS, *TIME_COMPONENTS), 0.0)

    def record(t: int) -> None:
        row = {"iteration": float(t)}
        row.update(
            evaluate(
                problem,
                algorithm.weights(state),
                algorithm.duals(state),
                optimum,
                validation,
                train_labels,
            )
        )
        row["round_trips"] = trips
        row["round_seconds"] = float(round_times[:t].sum())
        row.update(totals)
        if t > 0:
            row.update(
                {k: v for k, v in algorithm.round_stats(state).items() if k != "round_trips"}
            )
        metrics.append(row)
        if on_evaluate is not None:
            on_evaluate(row)

    record(0)
    with _progress_bar(progress, iterations, algorithm.name) as advance:
        for t in range(1, iterations + 1):
            active = participation.active(t, participation_rng)
            start = time.perf_counter()
            state = algorithm.round(state, active, algorithm_rng)
            round_times[t - 1] = time.perf_counter() - start
            stats = algorithm.round_stats(state)
            trips += stats.get("round_trips", 0.0)
            traffic = getattr(state, "traffic", None)
            if traffic and meter.layout is None:
                meter.layout = SlotLayout.build(blocks, cipher.slots, problem.Y.shape[1])
            for key, value in meter.round_costs(stats, traffic, round_times[t - 1]).items():
                totals[key] += value
            if t % eval_every == 0 or t == iterations:
                record(t)
                advance(t, metrics[-1])
            elif progress:
                advance(t, None)

    duals = algorithm.duals(state)
    return RunResult(
        metrics=metrics,
        weights=np.array(algorithm.weights(state), copy=True),
        duals=None if duals is None else np.array(duals, copy=True),
        round_times=round_times,
        config={
            "algorithm": algorithm.config(),
            "seed": seed,
            "iterations": iterations,
            "optimum_primal": optimum.primal if optimum else None,
            "engine": "simulation",
            "cipher": cipher.describe(),
            "costs": meter.model.describe(),
        },
    )


class _progress_bar:
    """A Rich progress bar that shows the latest relative loss, or nothing."""

    def __init__(self, enabled: bool, total: int, label: str):
        self.enabled, self.total, self.label = enabled, total, label

    def __enter__(self):
        if not self.enabled:
            return lambda t, row: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=False,
        )
        self._progress.__enter__()
        task = self._progress.add_task(self.label, total=self.total, status="")

        def advance(t: int, row: dict | None) -> None:
            status = None
            if row is not None:
                rel = row.get("relative_loss", np.nan)
                status = f"rel. loss {rel:.2e}" if np.isfinite(rel) else f"P {row['primal']:.4g}"
            if status is None:
                self._progress.update(task, completed=t)
            else:
                self._progress.update(task, completed=t, status=status)

        return advance

    def __exit__(self, *exc):
        if self.enabled:
            self._progress.__exit__(*exc)
        return False
