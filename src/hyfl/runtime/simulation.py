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
``iterations`` rounds. The result's ``config["stopped_by"]`` says which ended it.

**Checkpoints.** With ``checkpoint=PATH`` the loop writes, atomically (temp
file, then ``os.replace``), everything needed to continue: the round number,
the algorithm's state, both generators' bit-generator states, the
participation schedule's state (hyfl's schedules keep none; a schedule with
``checkpoint_state()`` / ``restore_state(s)`` is saved and restored), the
metrics so far, the cumulative cost totals and round times. The problem, the
stacked blocks and the sparse matrices an algorithm builds at set-up are not
written: they are stored as tokens, which are re-attached on load to
a fresh ``algorithm.setup`` of the freshly prepared run. A fingerprint (data
shape, non-zeros and hash, partition, algorithm, seed, ``eval_every``,
cipher, cost model, participation, and the caller's ``run_key``) guards
against resuming from another run's checkpoint. ``resume=True`` continues from
it; the result is bit-for-bit that of an uninterrupted run in every column
except :data:`WALL_TIME_COLUMNS`. Because the budget is not part of the
fingerprint, a finished run (whose last state is always saved) can be
extended to a larger budget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl._io import read_header, read_npz
from hyfl.algorithms.base import Algorithm
from hyfl.costs import COST_COLUMNS, TIME_COMPONENTS, CostMeter, CostModel
from hyfl.errors import HyflError, check_int, check_positive, fail, is_finite
from hyfl.metrics import RANKING_METRICS
from hyfl.partition import Partition, StackedBlocks, stack
from hyfl.privacy.ciphers import make_cipher
from hyfl.problem import Optimum, Problem
from hyfl.runtime.progress import ProgressBar
from hyfl.runtime.work_clock import work_clock

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

# Raised whenever an algorithm's saved state changes shape (3: the cocoa rule's sample
# groups keep their own coordinates), so that an older checkpoint is refused with a
# clear message instead of resuming into the wrong state.
CHECKPOINT_FORMAT = 3
DEFAULT_CHECKPOINT_SECONDS = 60.0


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
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS,
    resume: bool = False,
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
        Number of outer iterations; with ``stop_sim_time``, the most to run.
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
        ``iterations`` rounds, whichever comes first. ``config["stopped_by"]``
        of the result says which (``"sim_time"`` or ``"iterations"``).
    checkpoint : path, optional
        File for checkpoints (see the module docstring). Without it nothing is
        written.
    checkpoint_every : int, optional
        Write a checkpoint every this many rounds. Default: whenever
        ``checkpoint_seconds`` of wall time have passed since the last one.
        A checkpoint is always written after the last round, so a finished
        run can be extended to a larger budget.
    checkpoint_seconds : float, default 60
    resume : bool, default False
        Continue from ``checkpoint`` if that file exists (else start afresh).
        The checkpoint must come from the same run (same data, partition,
        algorithm and hyperparameters, seed, ``eval_every``, cipher, cost
        model, participation and ``run_key``); only the budget may differ.
        Without ``resume`` an existing checkpoint file is replaced.
    run_key : dict, optional
        Anything else that identifies the run (the runner passes its
        :class:`~hyfl.experiments.runner.RunSpec`), part of the checkpoint's
        fingerprint.

    Returns
    -------
    RunResult
        The resumed part and the part run before the interruption together;
        every column but :data:`WALL_TIME_COLUMNS` is bit-for-bit what an
        uninterrupted run gives.
    """
    iterations = check_int("iterations", iterations, minimum=1)
    eval_every = check_int("eval_every", eval_every, minimum=1)
    stop_sim_time = check_sim_time_budget(stop_sim_time)
    if checkpoint_every is not None:
        checkpoint_every = check_int("checkpoint_every", checkpoint_every, minimum=1)
    blocks = stack(partition, problem.X)
    participation_rng, algorithm_rng = random_streams(seed)
    state = algorithm.setup(problem, blocks)
    if cipher is None:
        cipher = make_cipher("none")
    metering = _Metering(
        CostMeter((cost_model or CostModel()).validated(), int(cipher.ciphertext_bytes)),
        blocks, cipher, problem.Y.shape[1],
    )
    run = _RunProgress(totals=dict.fromkeys((*COST_COLUMNS, *TIME_COMPONENTS), 0.0))
    rngs = {"participation": participation_rng, "algorithm": algorithm_rng}
    evaluator = Evaluator(problem, optimum, validation, train_labels, on_evaluate)
    checkpoints = None
    if checkpoint is not None:
        fingerprint = run_fingerprint(
            problem, blocks, algorithm, seed=seed, eval_every=eval_every, cipher=cipher,
            cost_model=metering.meter.model, participation=participation, run_key=run_key,
        )
        checkpoints = _Checkpoints(
            _Checkpointer(Path(checkpoint), fingerprint, state, problem, blocks),
            checkpoint_every, float(checkpoint_seconds), rngs, participation,
        )
        state = checkpoints.start(state, run, resume)

    def result() -> RunResult:
        weights, duals = evaluator.model(algorithm, state, run)
        return RunResult(
            metrics=run.metrics,
            weights=np.array(weights, copy=True),
            duals=None if duals is None else np.array(duals, copy=True),
            round_times=np.array(run.round_times, dtype=float),
            config={
                "algorithm": algorithm.config(),
                "seed": seed,
                "iterations": iterations,
                "rounds": run.t,
                "budget": budget_record(iterations, stop_sim_time),
                "stopped_by": run.stopped_by,
                "resumed_from": list(run.resumed_from),
                "optimum_primal": optimum.primal if optimum else None,
                "engine": "simulation",
                "cipher": cipher.describe(),
                "costs": metering.meter.model.describe(),
            },
        )

    done = False
    if run.t == 0:
        evaluator.record(0, algorithm, state, run)
    else:
        done = _resumed_budget_check(run, iterations, stop_sim_time, eval_every,
                                     checkpoints.store.path)
    bar_total, bar_unit = (
        (iterations, "rounds") if stop_sim_time is None else (stop_sim_time, "sim_time")
    )
    with ProgressBar(progress and not done, bar_total, algorithm.name, unit=bar_unit) as advance:
        t = run.t
        advance(t, None, run.totals["sim_time"])
        while not done and t < iterations:
            t += 1
            active = participation.active(t, participation_rng)
            start = work_clock()
            state = algorithm.round(state, active, algorithm_rng)
            seconds = work_clock() - start
            metering.charge(run, algorithm.round_stats(state), getattr(state, "traffic", None),
                            seconds)
            run.t = t
            crossed = stop_sim_time is not None and run.totals["sim_time"] >= stop_sim_time
            if t % eval_every == 0 or t == iterations or crossed:
                try:
                    evaluator.record(t, algorithm, state, run)
                except HyflError as err:
                    run.stopped_by = "diverged"
                    err.result = result()
                    raise
                advance(t, run.metrics[-1], run.totals["sim_time"])
            elif progress:
                advance(t, None, run.totals["sim_time"])
            if crossed:
                run.stopped_by = "sim_time"
                done = True
            elif t == iterations:
                run.stopped_by = "iterations"
            if checkpoints is not None and not done and t < iterations:
                checkpoints.maybe_save(state, run)
    if checkpoints is not None:
        checkpoints.finish(state, run)
    return result()


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

    def model(self, algorithm, state, run: _RunProgress) -> tuple[np.ndarray, np.ndarray | None]:
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

    def record(self, t: int, algorithm, state, run: _RunProgress) -> dict[str, float]:
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
    for index, (name, w, alpha) in enumerate(candidates):
        primal = problem.primal(w)
        dual = problem.dual(alpha) if alpha is not None else np.nan
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

    def charge(self, run: _RunProgress, stats: dict, traffic, seconds: float) -> None:
        run.round_times.append(seconds)
        run.seconds += seconds
        run.trips += stats.get("round_trips", 0.0)
        if traffic and self.meter.layout is None:
            self.meter.build_layout(self.blocks, self.cipher, self.n_outputs)
        run.sim_time_before = run.totals["sim_time"]
        for key, value in self.meter.round_costs(stats, traffic, seconds).items():
            run.totals[key] += value


class _Checkpoints:
    """When to write checkpoints (every N rounds or every so many seconds, and at the end)."""

    def __init__(self, store, every, seconds, rngs, participation):
        self.store, self.every, self.seconds = store, every, seconds
        self.rngs, self.participation = rngs, participation
        self.last_saved = time.monotonic()

    def start(self, state, run: _RunProgress, resume: bool):
        if resume and self.store.path.exists():
            state = self.store.load(run, self.rngs, self.participation)
        elif self.store.path.exists():
            self.store.path.unlink()
        self.last_saved = time.monotonic()
        return state

    def maybe_save(self, state, run: _RunProgress) -> None:
        due = (
            run.t % self.every == 0
            if self.every is not None
            else time.monotonic() - self.last_saved >= self.seconds
        )
        if due:
            self.store.save(state, run, self.rngs, self.participation)
            self.last_saved = time.monotonic()

    def finish(self, state, run: _RunProgress) -> None:
        if self.store.saved_at != run.t:
            self.store.save(state, run, self.rngs, self.participation)


def check_sim_time_budget(stop_sim_time: float | None) -> float | None:
    """``None`` or a positive, finite number of simulated seconds."""
    if stop_sim_time is None:
        return None
    return check_positive(
        "sim_time budget",
        stop_sim_time,
        fix="Pass simulated seconds > 0, e.g. budget = { sim_time = 10800.0, ... }.",
    )


def budget_record(iterations: int, stop_sim_time: float | None) -> dict[str, float | int]:
    """The budget as recorded in results: ``{iterations}`` or ``{sim_time, max_iterations}``."""
    if stop_sim_time is None:
        return {"iterations": int(iterations)}
    return {"sim_time": float(stop_sim_time), "max_iterations": int(iterations)}


def _resumed_budget_check(
    run: _RunProgress, iterations: int, stop_sim_time: float | None, eval_every: int, path: Path
) -> bool:
    """After loading a checkpoint: whether the budget is already used up.

    Raises if the checkpoint is past the budget; otherwise, when rounds remain,
    drops the final row the earlier run evaluated only because it ended there,
    so that the rows are those of an uninterrupted run.
    """
    if run.t > iterations:
        raise fail(
            f"checkpoint {path}",
            f"is at round {run.t}, past the budget of {iterations} iterations",
            "Raise the budget to at least that, or delete the checkpoint to start over.",
        )
    crossed = stop_sim_time is not None and run.totals["sim_time"] >= stop_sim_time
    if crossed and run.sim_time_before > stop_sim_time:
        raise fail(
            f"checkpoint {path}",
            f"is at simulated time {run.totals['sim_time']:.6g} s, past the budget of "
            f"{stop_sim_time:g} s already before its last round",
            "Raise the sim_time budget, or delete the checkpoint to start over.",
        )
    if run.t == iterations or crossed:
        run.stopped_by = "sim_time" if crossed else "iterations"
        return True
    run.stopped_by = None
    last = run.metrics[-1]
    if int(last["iteration"]) == run.t and run.t % eval_every != 0:
        run.metrics.pop()
        if "model_round" in last:  # that evaluation's model is not kept either
            run.best = run.best_before
    return False


@dataclass
class _RunProgress:
    """The loop's counters: what a checkpoint holds besides the state and the generators."""

    totals: dict[str, float]
    t: int = 0
    trips: float = 0.0
    seconds: float = 0.0
    sim_time_before: float = 0.0  # cumulative sim_time before the last round
    metrics: list[dict[str, float]] = field(default_factory=list)
    round_times: list[float] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)
    stopped_by: str | None = None
    best: dict | None = None  # the best certified pair so far (see Evaluator, keep_best)
    best_before: dict | None = None  # and as it was before the last evaluation


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------


def run_fingerprint(
    problem: Problem,
    blocks: StackedBlocks,
    algorithm: Algorithm,
    *,
    seed: int,
    eval_every: int,
    cipher,
    cost_model: CostModel,
    participation,
    run_key: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What identifies a run for its checkpoints (JSON-ready; the budget is not part of it)."""
    X = problem.X
    return _jsonable(
        {
            "problem": {
                "shape": list(X.shape),
                "nnz": int(X.nnz),
                "outputs": int(problem.n_outputs),
                "loss": getattr(problem.loss, "name", str(problem.loss)),
                "lam": float(problem.lam),
                "hash": _hash_arrays(X.indptr, X.indices, X.data, problem.Y,
                                     *(() if problem.W is None else (problem.W,))),
            },
            "partition": {
                "clients": int(blocks.n_clients),
                "rows": int(blocks.X.shape[0]),
                "nnz": int(blocks.X.nnz),
                "hash": _hash_arrays(
                    blocks.client_rowptr, blocks.row_sample, blocks.X.indptr, blocks.X.indices
                ),
            },
            "algorithm": algorithm.config(),
            "seed": int(seed),
            "eval_every": int(eval_every),
            "cipher": cipher.describe(),
            "costs": cost_model.describe(),
            "participation": _describe_schedule(participation),
            "run": run_key,
        }
    )


def _hash_arrays(*arrays: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def _describe_schedule(participation) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(participation).__name__}
    if dataclasses.is_dataclass(participation):
        for f in dataclasses.fields(participation):
            value = getattr(participation, f.name)
            out[f.name] = _hash_arrays(value) if isinstance(value, np.ndarray) else value
    else:
        out["repr"] = repr(participation)
    return out


def _jsonable(obj: Any) -> Any:
    """Round-trip through JSON (numbers, strings, lists, dicts), for stable comparisons."""
    return json.loads(json.dumps(obj, sort_keys=True, default=_json_fallback))


def _json_fallback(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


STATIC_ARRAY_BYTES = 1 << 16
"""Arrays of a state at least this large that still hold their set-up values are not written
into checkpoints (e.g. FedAvg's entry index of every non-zero): a token stands for them."""


def _static_objects(state: Any, problem: Problem, blocks: StackedBlocks) -> dict[tuple, Any]:
    """Set-up data reachable from a freshly set-up ``state``, by path.

    The problem, the stacked blocks and every sparse matrix the state holds
    (algorithms build those at set-up from the data and never change them)
    are written into checkpoints as their path and taken, when loading, from a
    fresh ``algorithm.setup`` of the prepared run. Large arrays are candidates
    too, but are written as tokens only while their content (hash) is still
    that of set-up.
    """
    found: dict[tuple, Any] = {("problem",): problem, ("blocks",): blocks}
    seen = {id(problem), id(blocks)}

    def walk(obj: Any, path: tuple, depth: int) -> None:
        if depth > 8 or isinstance(obj, (str, bytes, int, float, bool, np.generic)):
            return
        if id(obj) in seen:
            return
        if isinstance(obj, np.ndarray):
            if obj.nbytes >= STATIC_ARRAY_BYTES and obj.dtype != object:
                seen.add(id(obj))
                found[path] = obj
            return
        if isinstance(obj, (Problem, StackedBlocks)) or sp.issparse(obj):
            seen.add(id(obj))
            found[path] = obj
            return
        if isinstance(obj, dict):
            seen.add(id(obj))
            for key, value in obj.items():
                walk(value, (*path, f"[{key!r}]"), depth + 1)
        elif isinstance(obj, (list, tuple)):
            seen.add(id(obj))
            for i, value in enumerate(obj):
                walk(value, (*path, f"[{i}]"), depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            seen.add(id(obj))
            for name, value in vars(obj).items():
                walk(value, (*path, f".{name}"), depth + 1)

    walk(state, ("state",), 0)
    return found


class _StateCodec:
    """Algorithm state <-> numeric arrays plus a JSON description; nothing in it runs code.

    Checkpoints live in results folders that users copy and share, so loading one must
    not be able to execute anything (pickle would). The description names, for each
    object of the state, its class as ``module:qualname``; a class is rebuilt only if it
    is defined in the ``hyfl`` package, with ``object.__new__`` and its attributes set
    one by one (no ``__init__``, ``__reduce__`` or ``__setstate__``). Arrays are stored
    as numeric or bool arrays of an ``.npz`` read with ``allow_pickle=False``. Set-up
    data (see :func:`_static_objects`) are written as their path, and large arrays as
    their path and hash while their content is still that of set-up.
    """

    def __init__(self, objects: dict[tuple, Any], hashes: dict[int, str]):
        self.objects = objects
        self.tokens = {id(obj): path for path, obj in objects.items()}
        self.hashes = hashes
        self.used: set[str] = set()  # arrays decoded so far (each may be referenced once)

    # -- writing -------------------------------------------------------------------
    def encode(self, value: Any, arrays: dict[str, np.ndarray]) -> Any:
        path = self.tokens.get(id(value))
        if path is not None:
            if not isinstance(value, np.ndarray):
                return {"ref": list(path)}
            digest = _hash_arrays(value)
            if digest == self.hashes[id(value)]:
                return {"ref": list(path), "hash": digest}
        if isinstance(value, (np.generic, np.ndarray)):  # first: np.float64 is a float
            array = np.asarray(value)
            if array.dtype.kind not in "biufc":
                raise fail("checkpoint", f"cannot hold an array of dtype {array.dtype}",
                           "Keep algorithm state numeric (or leave checkpoint unset).")
            name = f"a{len(arrays)}"
            arrays[name] = array
            return {"a": name, "scalar": isinstance(value, np.generic)}
        if value is None or isinstance(value, (bool, str, int)):
            return {"v": value}
        if isinstance(value, float):
            return {"v": value} if np.isfinite(value) else {"float": repr(value)}
        if sp.issparse(value):
            csr = value.tocsr()
            return {"csr": [self.encode(x, arrays) for x in (csr.data, csr.indices, csr.indptr)],
                    "shape": list(csr.shape)}
        if isinstance(value, dict):
            return {"d": [[self.encode(k, arrays), self.encode(v, arrays)]
                          for k, v in value.items()]}
        if isinstance(value, (list, tuple)):
            return {"t" if isinstance(value, tuple) else "l":
                    [self.encode(item, arrays) for item in value]}
        cls = type(value)
        if cls.__module__.startswith("hyfl.") and hasattr(value, "__dict__"):
            return {"o": f"{cls.__module__}:{cls.__qualname__}",
                    "f": {k: self.encode(v, arrays) for k, v in vars(value).items()}}
        raise fail("checkpoint", f"cannot hold a {cls.__module__}.{cls.__qualname__}",
                   "Algorithm state must be hyfl objects, arrays, numbers, strings, "
                   "lists, tuples and dicts.")

    # -- reading -------------------------------------------------------------------
    def decode(self, spec: Any, arrays: dict[str, np.ndarray]) -> Any:
        if not isinstance(spec, dict):
            raise ValueError("a malformed entry")
        if "ref" in spec:
            path = tuple(spec["ref"])
            obj = self.objects.get(path)
            if obj is None or ("hash" in spec and _hash_arrays(obj) != spec["hash"]):
                raise ValueError(f"the set-up data at {path!r} differ from this run's "
                                 "(set-up is not reproducible?)")
            return obj
        if "v" in spec:
            return spec["v"]
        if "float" in spec:
            return float(spec["float"])
        if "a" in spec:
            name = spec["a"]
            if not isinstance(name, str) or name in self.used:  # would copy it again
                raise ValueError(f"array {name!r} is referenced twice (each is stored once)")
            self.used.add(name)
            array = arrays[name]
            return array[()] if spec.get("scalar") else np.array(array)
        if "csr" in spec:
            data, indices, indptr = (self.decode(x, arrays) for x in spec["csr"])
            return sp.csr_matrix((data, indices, indptr), shape=tuple(spec["shape"]))
        if "d" in spec:
            return {_hashable(self.decode(k, arrays)): self.decode(v, arrays)
                    for k, v in spec["d"]}
        if "l" in spec:
            return [self.decode(item, arrays) for item in spec["l"]]
        if "t" in spec:
            return tuple(self.decode(item, arrays) for item in spec["t"])
        if "o" in spec:
            obj = object.__new__(_state_class(spec["o"]))
            for name, item in spec["f"].items():
                object.__setattr__(obj, name, self.decode(item, arrays))
            return obj
        raise ValueError("a malformed entry")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _state_class(name: str) -> type:
    """The hyfl class ``module:qualname`` names; anything outside hyfl is refused."""
    import importlib

    module_name, _, qualname = str(name).partition(":")
    if not module_name.startswith("hyfl.") or not qualname:
        raise ValueError(f"it names {name!r}, which is not a hyfl state class")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, type) or not obj.__module__.startswith("hyfl."):
        raise ValueError(f"it names {name!r}, which is not a hyfl state class")
    return obj


class _Checkpointer:
    """Writes and reads one run's checkpoint file.

    The file is an ``.npz`` (read with ``allow_pickle=False``): the state's arrays
    plus ``__header__`` (format, hyfl version, round, the run's fingerprint; read and
    checked first) and ``__body__`` (the description of the algorithm state, generator
    states, counters and metrics), both JSON (see :class:`_StateCodec`).
    ``setup_state`` must be the state as ``algorithm.setup`` returned it, before any
    round.
    """

    def __init__(self, path: Path, fingerprint: dict, setup_state: Any, problem, blocks):
        self.path = path
        self.fingerprint = fingerprint
        objects = _static_objects(setup_state, problem, blocks)
        hashes = {id(obj): _hash_arrays(obj) for obj in objects.values()
                  if isinstance(obj, np.ndarray)}
        self.codec = _StateCodec(objects, hashes)
        self.setup_state = setup_state  # what a restored state must look like (load)
        self.saved_at: int | None = None

    def save(self, state: Any, run: _RunProgress, rngs: dict, participation) -> None:
        header = {
            "format": CHECKPOINT_FORMAT,
            "hyfl_version": _hyfl_version(),
            "round": run.t,
            "written": time.time(),
            "fingerprint": self.fingerprint,
        }
        arrays: dict[str, np.ndarray] = {}
        body = self.codec.encode({
            "state": state,
            "rngs": {name: rng.bit_generator.state for name, rng in rngs.items()},
            "participation": _schedule_state(participation),
            "progress": dataclasses.asdict(run),
        }, arrays)
        arrays["__header__"] = _json_array(header)
        arrays["__body__"] = _json_array(body)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.saved_at = run.t

    def load(self, run: _RunProgress, rngs: dict, participation) -> Any:
        """Restore ``run``, the generators and the schedule; return the algorithm state."""
        start_over = "Delete it (or run without --resume) to start over."
        culprit = f"checkpoint {self.path}"
        # Not an npz, truncated, pickled objects, arrays larger than their file: refused
        # before any array is read.
        arrays = read_npz(self.path, culprit, "a hyfl checkpoint", start_over, kinds="biufc",
                          expect={"__header__": ("u", 1), "__body__": ("u", 1)})
        header = read_header(arrays.pop("__header__"), culprit, "a hyfl checkpoint",
                             start_over)
        if header.get("format") != CHECKPOINT_FORMAT:
            raise fail(f"checkpoint {self.path}", "is not a hyfl checkpoint of this version",
                       start_over)
        self._check(header.get("fingerprint"))
        try:
            self.codec.used.clear()
            body = self.codec.decode(json.loads(arrays.pop("__body__").tobytes()), arrays)
            _check_like(body["state"], self.setup_state, "state")
            rng_states = body["rngs"]
            for name, rng in rngs.items():
                rng.bit_generator.state = rng_states[name]
            if body["participation"] is not None:
                participation.restore_state(body["participation"])
            for key, value in body["progress"].items():
                setattr(run, key, value)
        except HyflError:
            raise
        except Exception as err:
            raise fail(f"checkpoint {self.path}", f"cannot be restored ({err})",
                       start_over) from None
        run.resumed_from.append(run.t)
        self.saved_at = run.t
        return body["state"]

    def _check(self, stored: dict | None) -> None:
        if stored == self.fingerprint:
            return
        stored = stored or {}
        differ = sorted(
            key
            for key in set(stored) | set(self.fingerprint)
            if stored.get(key) != self.fingerprint.get(key)
        )
        details = []
        for key in differ:
            old, new = stored.get(key), self.fingerprint.get(key)
            if isinstance(old, dict) and isinstance(new, dict):
                for sub in sorted(set(old) | set(new)):
                    if old.get(sub) == new.get(sub):
                        continue
                    if sub == "hash":
                        details.append(f"{key}: the data differ")
                    else:
                        details.append(
                            f"{key}.{sub}: checkpoint has {_short(old.get(sub))}, "
                            f"this run has {_short(new.get(sub))}"
                        )
            else:
                details.append(f"{key}: checkpoint has {_short(old)}, this run has {_short(new)}")
        raise fail(
            f"checkpoint {self.path}",
            "was written by a different run (" + "; ".join(details) + ")",
            "Resume with the configuration that wrote it, or delete the checkpoint "
            "(or run without --resume) to start over.",
        )


def _check_like(restored: Any, fresh: Any, path: str) -> None:
    """Raise ``ValueError`` naming the first place where a restored state does not fit.

    ``fresh`` is the state ``algorithm.setup`` returned for this run's problem: where
    it holds an array, the restored state must hold one of the same kind (bool, integer,
    float, complex) and shape (its first axis may have grown; finite if the fresh one
    is); where a hyfl object, one of the same class with its
    attributes; where a number, a number (finite if the fresh one is); dicts, lists
    and tuples are compared where both have the entry. So a forged or foreign
    checkpoint is refused at resume, naming the field, instead of failing rounds later
    or silently computing with NaN.
    """
    if restored is fresh or fresh is None:  # set-up data by reference; an unset slot
        return
    if isinstance(fresh, np.ndarray) or sp.issparse(fresh):
        sparse = sp.issparse(fresh)
        if sparse != sp.issparse(restored) or not (sparse or isinstance(restored, np.ndarray)):
            raise ValueError(f"{path} is a {type(restored).__name__}, not a "
                             f"{type(fresh).__name__}")
        # Buffers may grow along their first axis (WeightSnapshots.store; an empty int64
        # placeholder becomes int32 sample ids), never shrink or change kind.
        if (_KINDS[restored.dtype.kind] != _KINDS[fresh.dtype.kind]
                or restored.shape[1:] != fresh.shape[1:] or restored.ndim != fresh.ndim
                or restored.shape[:1] < fresh.shape[:1]):
            raise ValueError(f"{path} is of dtype {restored.dtype} and shape {restored.shape}, "
                             f"this run's is of {fresh.dtype} and {fresh.shape}")
        values, reference = (x.data if sparse else x for x in (restored, fresh))
        if (values.dtype.kind in "fc" and not np.all(np.isfinite(values))
                and np.all(np.isfinite(reference))):
            raise ValueError(f"{path} holds NaN or infinite values")
        return
    if isinstance(fresh, (bool, np.bool_)) or not isinstance(fresh, (int, float, np.number)):
        if isinstance(fresh, (dict, list, tuple)) or type(fresh).__module__.startswith(
                "hyfl."):
            if type(restored) is not type(fresh):
                raise ValueError(f"{path} is a {type(restored).__name__}, not a "
                                 f"{type(fresh).__name__}")
        if isinstance(fresh, dict):
            for key in fresh.keys() & restored.keys():
                _check_like(restored[key], fresh[key], f"{path}[{key!r}]")
        elif isinstance(fresh, (list, tuple)):
            if len(restored) == len(fresh):
                for i, (a, b) in enumerate(zip(restored, fresh)):
                    _check_like(a, b, f"{path}[{i}]")
        elif type(fresh).__module__.startswith("hyfl.") and hasattr(fresh, "__dict__"):
            for name, value in vars(fresh).items():
                if name not in vars(restored):
                    raise ValueError(f"{path} lacks attribute {name!r}")
                _check_like(vars(restored)[name], value, f"{path}.{name}")
        return
    if isinstance(restored, (bool, np.bool_)) or not isinstance(restored,
                                                                (int, float, np.number)):
        raise ValueError(f"{path} is a {type(restored).__name__}, not a number")
    if is_finite(fresh) and not is_finite(restored):
        raise ValueError(f"{path} is {restored:.6g}, not a finite number")


#: Dtype kinds a restored array may have instead of the fresh one's (integers of any width).
_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "f", "c": "c"}


def _json_array(tree: Any) -> np.ndarray:
    """A JSON document as a uint8 array (an ``.npz`` entry that needs no pickle)."""
    return np.frombuffer(json.dumps(tree, allow_nan=False).encode(), dtype=np.uint8)


def _short(value: Any, limit: int = 200) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _schedule_state(participation) -> Any:
    """A participation schedule's own state, if it keeps one (``checkpoint_state()``)."""
    get = getattr(participation, "checkpoint_state", None)
    return get() if callable(get) else None


def _hyfl_version() -> str:
    from hyfl import __version__

    return __version__


