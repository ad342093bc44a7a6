"""The simulation engine: every client in one process, one loop for every algorithm.

The loop is owned here once: it draws the participating clients of each outer
iteration from the participation schedule, calls the algorithm's ``round``
hook, times it, and evaluates the server's model every ``eval_every`` rounds
(evaluation is timed separately, so per-round timings measure the algorithm
alone). Two independent random streams are derived from the seed: one for
participation and one for the algorithm, so algorithms compared under one
seed see the same participation trace.

**Budgets.** A run lasts ``iterations`` outer iterations, or, with
``stop_sim_time``, until the cumulative simulated time reaches that many
seconds (the round that crosses it is the last, and is evaluated), at most
``iterations`` rounds; ``stop_when(row)`` may end it earlier, after an
evaluation (:class:`hyfl.runtime.budget.Budget`, shared with the other
engines). The result's ``config["stopped_by"]`` says which ended it.

**Checkpoints.** With ``checkpointing=Checkpointing(PATH)`` the loop writes
checkpoints from which ``Checkpointing(PATH, resume=True)`` continues, bit for
bit but for :data:`WALL_TIME_COLUMNS` (:mod:`hyfl.runtime.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl.algorithms.base import Algorithm
from hyfl.costs import COST_COLUMNS, TIME_COMPONENTS, CostMeter, CostModel
from hyfl.errors import HyflError, fail
from hyfl.metrics import RANKING_METRICS
from hyfl.partition import Partition, StackedBlocks, stack
from hyfl.privacy.ciphers import make_cipher
from hyfl.problem import Optimum, Problem
from hyfl.runtime.budget import Budget, StopWhen, budget_record, check_sim_time_budget
from hyfl.runtime.checkpoint import (
    CHECKPOINT_FORMAT,
    DEFAULT_CHECKPOINT_SECONDS,
    Checkpointing,
    Checkpoints,
    RunProgress,
    run_fingerprint,
)
from hyfl.work_clock import work_clock

__all__ = [
    "METRIC_COLUMNS",
    "WALL_TIME_COLUMNS",
    "Evaluator",
    "RunResult",
    "Validation",
    "best_certified",
    "evaluate",
    "first_round_at_least",
    "first_round_below",
    "keep_best",
    "random_streams",
    "settled_round_below",
    "simulate",
    # from hyfl.runtime.budget and hyfl.runtime.checkpoint, importable from here too
    "CHECKPOINT_FORMAT",
    "DEFAULT_CHECKPOINT_SECONDS",
    "Checkpointing",
    "budget_record",
    "check_sim_time_budget",
]

METRIC_COLUMNS = (
    "iteration",
    "primal",
    "dual",
    "gap",
    "relative_loss",
    "train_accuracy",
    "val_accuracy",
    "train_auc",
    "val_auc",
    "val_ks",
    "val_average_precision",
    "round_trips",
    "round_seconds",
    *COST_COLUMNS,
    *TIME_COMPONENTS,
)

WALL_TIME_COLUMNS = (
    "round_seconds",
    "sim_time",
    "time_client",
    "time_server",
    "server_seconds",
    "client_share_max",
)
"""Columns derived from measured wall time. They differ between two runs of one seed (and
between an interrupted-and-resumed run and an uninterrupted one); all others are reproducible.
(``client_share_max`` is a ratio of measured times for FedHybrid, exact for the others.)"""


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


def first_round_below(iterations: np.ndarray, values: np.ndarray, level: float) -> float | None:
    """The first evaluated round whose value is at or below ``level`` (None if none)."""
    hit = np.flatnonzero(np.asarray(values) <= level)
    return float(iterations[hit[0]]) if hit.size else None


def first_round_at_least(iterations: np.ndarray, values: np.ndarray, level: float
                         ) -> float | None:
    """The first evaluated round whose value is at or above ``level`` (None if none)."""
    hit = np.flatnonzero(np.asarray(values) >= level)
    return float(iterations[hit[0]]) if hit.size else None


def settled_round_below(iterations: np.ndarray, values: np.ndarray, level: float) -> float | None:
    """The round from which every evaluation stays at or below ``level`` (None if the last
    one is above it, or NaN): an honest "rounds to reach", unlike the first touch."""
    above = np.flatnonzero(~(np.asarray(values) <= level))
    start = above[-1] + 1 if above.size else 0
    return float(iterations[start]) if start < len(iterations) else None


def evaluate(
    problem: Problem,
    w: np.ndarray,
    alpha: np.ndarray | None,
    optimum: Optimum | None,
    validation: Validation | None,
    train_labels: np.ndarray | None = None,
    *,
    primal: float | None = None,
    dual: float | None = None,
) -> dict[str, float]:
    """Objective values, accuracies and ranking metrics (AUC, KS, average precision:
    :mod:`hyfl.metrics`) of the server's model (objectives may be given)."""
    primal = problem.primal(w) if primal is None else primal
    if dual is None:
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
    nan = dict.fromkeys(RANKING_METRICS, np.nan)
    train = problem.ranking(problem.X, train_labels, w) if train_labels is not None else nan
    val = problem.ranking(validation.X, validation.y, w) if validation is not None else nan
    row.update({"train_auc": train["auc"], "val_auc": val["auc"], "val_ks": val["ks"],
                "val_average_precision": val["average_precision"]})
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
    stop_sim_time: float | None = None,
    stop_when: StopWhen | None = None,
    checkpointing: Checkpointing | None = None,
    run_key: dict[str, Any] | None = None,
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
        Number of outer iterations; with ``stop_sim_time`` or ``stop_when``, the most
        to run.
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
        wire size; ``cost_model.layout`` may count another layout, see
        :func:`hyfl.costs.counting_layout`). Default ``none``: one value per
        ciphertext. This engine never encrypts; see
        :func:`hyfl.runtime.protocol.run_protocol` for real encryption.
    stop_sim_time : float, optional
        Simulated-time budget in seconds: stop after the round in which the
        cumulative ``sim_time`` reaches it (that round is evaluated), or after
        ``iterations`` rounds, whichever comes first.
    stop_when : callable, optional
        ``stop_when(row) -> str | None``, called with the metrics row of each
        evaluated round (after ``on_evaluate``; not with the start's row): a
        string ends the run after that round, with ``config["stopped_by"] ==
        "stop_when"`` and the string as ``config["stop_reason"]``. The
        estimators stop at their tolerance this way.
    checkpointing : Checkpointing, optional
        Where and when to write checkpoints, and whether to resume from one
        (:class:`hyfl.runtime.checkpoint.Checkpointing`). Without it nothing is
        written.
    run_key : dict, optional
        Anything else that identifies the run (the runner passes its
        :class:`~hyfl.experiments.runner.RunSpec`), part of the checkpoint's
        fingerprint.

    Returns
    -------
    RunResult
        The resumed part and the part run before the interruption together;
        every column but :data:`WALL_TIME_COLUMNS` is bit-for-bit what an
        uninterrupted run gives. ``config["stopped_by"]`` says what ended the
        run: ``"iterations"``, ``"sim_time"`` or ``"stop_when"`` (see
        :mod:`hyfl.runtime.budget`); the result attached to the error of a
        diverging run (``err.result``) says ``"diverged"``.
    """
    budget = Budget(iterations, eval_every, stop_sim_time, stop_when)
    blocks = stack(partition, problem.X)
    participation_rng, algorithm_rng = random_streams(seed)
    state = algorithm.setup(problem, blocks)
    if cipher is None:
        cipher = make_cipher("none")
    metering = _Metering(
        CostMeter((cost_model or CostModel()).validated(), int(cipher.ciphertext_bytes)),
        blocks, cipher, problem.Y.shape[1],
    )
    run = RunProgress(totals=dict.fromkeys((*COST_COLUMNS, *TIME_COMPONENTS), 0.0))
    evaluator = Evaluator(problem, optimum, validation, train_labels, on_evaluate)
    checkpoints = None
    if checkpointing is not None:
        fingerprint = run_fingerprint(
            problem, blocks, algorithm, seed=seed, eval_every=budget.eval_every, cipher=cipher,
            cost_model=metering.meter.model, participation=participation, run_key=run_key,
        )
        rngs = {"participation": participation_rng, "algorithm": algorithm_rng}
        checkpoints = Checkpoints(checkpointing, fingerprint, state, problem, blocks, rngs,
                                  participation)
        state = checkpoints.start(state, run)

    def result(state) -> RunResult:
        return _run_result(algorithm, state, run, evaluator, budget, seed=seed, optimum=optimum,
                           cipher=cipher, metering=metering)

    done = False
    if run.t == 0:
        evaluator.record(0, algorithm, state, run)
    else:
        done = checkpoints.resumed(run, budget)
    state = _run_rounds(algorithm, state, run, budget, participation,
                        (participation_rng, algorithm_rng), metering, evaluator, checkpoints,
                        progress=progress, done=done, result=result)
    if checkpoints is not None:
        checkpoints.finish(state, run)
    return result(state)


def _run_result(algorithm: Algorithm, state, run: RunProgress, evaluator: Evaluator,
                budget: Budget, *, seed: int, optimum: Optimum | None, cipher,
                metering: _Metering) -> RunResult:
    """What :func:`simulate` returns for ``state``: the evaluator's model (the best
    certified one), the metrics so far and the run's configuration and end record."""
    weights, duals = evaluator.model(algorithm, state, run)
    return RunResult(
        metrics=run.metrics,
        weights=np.array(weights, copy=True),
        duals=None if duals is None else np.array(duals, copy=True),
        round_times=np.array(run.round_times, dtype=float),
        config={
            "algorithm": algorithm.config(),
            "seed": seed,
            **budget.end_record(run.t, run.stopped_by, run.stop_reason),
            "resumed_from": list(run.resumed_from),
            "optimum_primal": optimum.primal if optimum else None,
            "engine": "simulation",
            "cipher": cipher.describe(),
            "costs": metering.meter.model.describe(),
        },
    )


def _run_rounds(algorithm: Algorithm, state, run: RunProgress, budget: Budget, participation,
                rngs: tuple[np.random.Generator, np.random.Generator], metering: _Metering,
                evaluator: Evaluator, checkpoints: Checkpoints | None, *, progress: bool,
                done: bool, result: Callable[[Any], RunResult]):
    """:func:`simulate`'s loop, from round ``run.t + 1`` until the budget says stop: draw
    the active clients, run the algorithm's round, meter it, evaluate when due (a
    diverging round raises with ``err.result = result(state)``) and checkpoint.
    Returns the last state."""
    participation_rng, algorithm_rng = rngs
    with budget.progress_bar(progress and not done, algorithm.name) as advance:
        t = run.t
        advance(t, None, run.totals["sim_time"])
        while not done and t < budget.iterations:
            t += 1
            active = participation.active(t, participation_rng)
            start = work_clock()
            state = algorithm.round(state, active, algorithm_rng)
            seconds = work_clock() - start
            metering.charge(run, algorithm.round_stats(state), getattr(state, "traffic", None),
                            seconds)
            run.t = t
            crossed = budget.crossed(run.totals["sim_time"])
            row = None
            if budget.evaluates(t, crossed):
                try:
                    row = evaluator.record(t, algorithm, state, run)
                except HyflError as err:
                    run.stopped_by = "diverged"
                    err.result = result(state)
                    raise
                advance(t, row, run.totals["sim_time"])
            elif progress:
                advance(t, None, run.totals["sim_time"])
            run.stopped_by, run.stop_reason = budget.stopped_by(t, crossed, row)
            done = run.stopped_by is not None
            if checkpoints is not None and not done:
                checkpoints.maybe_save(state, run)
    return state


class Evaluator:
    """Evaluates the server's model for the loop and keeps the model a run returns.

    An algorithm may offer several candidate models (``models(state)`` giving
    ``(name, weights, duals)``; HyFDCA's default rule offers its last iterate,
    its running average and the image of its certified duals). The evaluator
    reports, and the run returns, the candidate with the smallest duality gap
    -- the best certified one -- and for algorithms with duals it keeps the
    best certified pair seen so far (the zero model of round 0 included): the
    gap a run reports never rises, and the model it returns is never worse than
    one it has certified (column ``model_round``: the round the reported model
    is from). A model whose objective is NaN or infinite stops the run with an
    error naming the algorithm and its settings.
    """

    def __init__(self, problem, optimum, validation, train_labels, on_evaluate=None):
        self.problem, self.optimum = problem, optimum
        self.validation, self.train_labels = validation, train_labels
        self.on_evaluate = on_evaluate
        self.chosen: int | None = None  # index of the candidate chosen last

    def candidates(self, algorithm, state) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
        models = getattr(algorithm, "models", None)
        if callable(models):
            return list(models(state))
        return [("last", algorithm.weights(state), algorithm.duals(state))]

    def model(self, algorithm, state, run: RunProgress) -> tuple[np.ndarray, np.ndarray | None]:
        """The weights and duals of the candidate chosen at the last evaluation.

        (A resumed run that had nothing left to do reads the choice from its metrics.)
        """
        if run.best is not None:
            return run.best["w"], run.best["alpha"]
        candidates = self.candidates(algorithm, state)
        index = self.chosen
        if index is None:
            index = int(run.metrics[-1].get("model", 0)) if run.metrics else 0
        _, w, alpha = candidates[min(index, len(candidates) - 1)]
        return w, alpha

    def record(self, t: int, algorithm, state, run: RunProgress) -> dict[str, float]:
        problem = self.problem
        index, _, w, alpha, primal, dual = best_certified(
            problem, algorithm, t, self.candidates(algorithm, state)
        )
        self.chosen = index
        row = {"iteration": float(t)}
        if alpha is not None:
            run.best_before = run.best
            run.best = keep_best(run.best, t, index, w, alpha, primal, dual)
            index, w, alpha, primal, dual = (run.best[k] for k in
                                             ("index", "w", "alpha", "primal", "dual"))
            row["model_round"] = float(run.best["round"])
        row.update(evaluate(problem, w, alpha, self.optimum, self.validation,
                            self.train_labels, primal=primal, dual=dual))
        row["model"] = float(index)  # which candidate: 0 the last iterate, 1 the average
        row["round_trips"] = run.trips
        row["round_seconds"] = run.seconds
        row.update(run.totals)
        if t > 0:
            row.update(
                {k: v for k, v in algorithm.round_stats(state).items() if k != "round_trips"}
            )
        run.metrics.append(row)
        if self.on_evaluate is not None:
            self.on_evaluate(row)
        return row


def keep_best(best: dict | None, t: int, index: int, w, alpha, primal: float, dual: float):
    """The best weights and the best duals seen so far, this round's included (copied).

    Any weights and any feasible duals certify each other (``P(w) - P* <=
    P(w) - D(alpha)``), so the pair of the lowest primal and the highest dual
    seen has the smallest gap of all pairs seen: the primal, the dual and the
    gap a run reports never get worse, and the model it returns is never
    worse than one it has seen (the zero model of round 0 included).
    """
    best = {} if best is None else dict(best)
    if not best or primal <= best["primal"]:
        best.update(round=int(t), index=int(index), w=np.array(w, copy=True),
                    primal=float(primal))
    if "dual" not in best or dual >= best["dual"]:
        best.update(alpha=np.array(alpha, copy=True), dual=float(dual))
    return best


def best_certified(problem: Problem, algorithm, t: int, candidates):
    """The candidate model with the smallest duality gap (the primal alone without duals).

    ``candidates`` are ``(name, weights, duals)``; returns ``(index, name, weights,
    duals, primal, dual)``. Raises the divergence error if an objective is not finite.
    """
    best = None
    duals: dict[int, float] = {}  # HyFDCA's candidates share one certified alpha: one pass
    for index, (name, w, alpha) in enumerate(candidates):
        primal = problem.primal(w)
        if alpha is None:
            dual = np.nan
        elif id(alpha) in duals:
            dual = duals[id(alpha)]
        else:
            dual = duals[id(alpha)] = problem.dual(alpha)
        _check_finite_objective(algorithm, t, name, primal, dual)
        gap = primal - dual if alpha is not None else primal
        if best is None or gap < best[0]:
            best = (gap, index, name, w, alpha, primal, dual)
    return best[1:]


def _check_finite_objective(algorithm, t: int, model: str, primal: float, dual: float) -> None:
    bad = [f"{what} {value!r}" for what, value in (("primal", primal), ("dual", dual))
           if not np.isfinite(value) and not (what == "dual" and np.isnan(value))]
    if not bad:
        return
    settings = ", ".join(f"{k}={v!r}" for k, v in algorithm.config().items()
                         if k in ("step_rule", "local_steps", "iic", "a", "b", "eta0", "mu")
                         and v is not None)
    raise fail(
        f"{algorithm.name} ({settings})" if settings else algorithm.name,
        f"diverged: at round {t} the {model} model's objective is {' and '.join(bad)}",
        getattr(algorithm, "divergence_hint", "Use smaller step sizes"),
    )


class _Metering:
    """Charges each round's bytes, HE operations and simulated time to the run's totals."""

    def __init__(self, meter: CostMeter, blocks: StackedBlocks, cipher, n_outputs: int):
        self.meter, self.blocks, self.cipher, self.n_outputs = meter, blocks, cipher, n_outputs

    def charge(self, run: RunProgress, stats: dict, traffic, seconds: float) -> None:
        run.round_times.append(seconds)
        run.seconds += seconds
        run.trips += stats.get("round_trips", 0.0)
        if traffic and self.meter.layout is None:
            self.meter.build_layout(self.blocks, self.cipher, self.n_outputs)
        run.sim_time_before = run.totals["sim_time"]
        for key, value in self.meter.round_costs(stats, traffic, seconds).items():
            run.totals[key] += value
