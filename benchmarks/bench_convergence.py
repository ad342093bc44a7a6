"""Convergence benchmark of HyFDCA's defaults against liblinear on the pooled data.

For every combination of dataset, partition, participation and loss it
runs ``HyFDCA()`` (no ``iic``, ``local_steps`` or ``step_rule``: the default
``cocoa`` rule) on the simulation engine
(:func:`hyfl.runtime.simulation.simulate`) with the dataset's paper lambda and
reports

* the rounds, and the process CPU seconds of the algorithm's ``setup`` plus
  its rounds (evaluation excluded), until the relative loss
  ``(P(w) - P*) / |P*|`` *settles* at 1e-2, 1e-3 and 1e-4: the first
  evaluated round from which every later evaluation stays at or below the
  level (:func:`settled_round`); also the first round that touches each
  level (:func:`first_round`);
* the final relative loss, the largest rebound (how far an evaluation rose
  above the best one before it), NaN or negative values, errors;
* the median wall and CPU time of one round;
* the CPU time of liblinear on the same pooled problem
  (:func:`hyfl.problem.solve_centralized` with ``cache=False``; it also gives
  ``P*``) and the federated/central CPU ratio at each level.

The federated CPU time is that of the whole simulated federation in one
process (every client and the server), so the ratio compares total work.
liblinear solves to ``tol=1e-10`` (for the logistic loss, then polishes with
L-BFGS), far below the levels measured here: it gives ``P*``. The baseline a user
would run is liblinear at its defaults (``tol=1e-4``; :func:`liblinear_at_its_defaults`),
timed in the same process: the ``default_ratio`` columns divide HyFDCA's CPU to settle at
a level by that CPU (its own relative loss is ``liblinear_default_relative_loss``).

``--model`` compares local models (HyFDCA's ``history``, ``history_window``, ...): every
case is run with each in turn. ``--intercept`` fits one (a constant column), as
``hyfl run`` does by default.

Partitions: ``--grids`` entries ``KxQ`` mean ``grid:KxQ`` (a full spec such as
``nonzero:3x3`` is used as given); MNIST always uses ``--mnist-partitions``
(the paper's quadrant split; 4 and 500 clients by default, the two smallest
of the paper's 5/500/5000 settings as ``configs/paper/make_configs.py``
builds them). Participation 1 is :class:`~hyfl.participation.Full`, a fraction
below 1 is :class:`~hyfl.participation.RandomFraction`, ``cyclic:C`` is
:class:`~hyfl.participation.Cyclic`, as ``hyfl run`` parses them. ``dropout:P`` is
a trace with drop-outs (:func:`dropout_trace`): each client goes offline and
comes back as a two-state Markov chain, online a fraction P of the rounds and
offline for 10 rounds on average, so some clients miss long stretches. The
trace is written next to ``--out`` and ``hyfl run --participation
trace:FILE`` replays it.

Usage::

    python benchmarks/bench_convergence.py --quick
    python benchmarks/bench_convergence.py --datasets ijcnn1,reuters --out conv.csv
    python benchmarks/bench_convergence.py --datasets ijcnn1 --grids 3x3 \\
        --participation 0.5 --losses hinge --rounds 1000 --out conv.csv --append
"""

from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from machine import cpu_model, git

LEVELS = (1e-2, 1e-3, 1e-4)
DATASETS = ("ijcnn1", "reuters", "adult", "covtype", "mnist", "breast_cancer")
MNIST_PARTITIONS = "quadrant:4,quadrant:500"
NEGATIVE_TOLERANCE = -1e-9
"""A relative loss below this means HyFDCA beat liblinear's ``P*`` (an inexact optimum)."""
MODEL_NAMES = {0.0: "last", 1.0: "average"}
"""The engine's ``model`` column: which of HyFDCA's candidates was reported."""
REBOUND_FLAG = 10.0
"""Flag a run whose relative loss rose more than this factor above its best so far."""


# --------------------------------------------------------------------------- measuring


class TimedAlgorithm:
    """Wrap an algorithm and time its ``setup`` and ``round`` calls.

    Every other attribute (``name``, ``weights``, ``models``, ...) is the
    wrapped algorithm's, so the engine runs exactly the same algorithm.

    Parameters
    ----------
    algorithm : object
        An algorithm of :mod:`hyfl.algorithms`.

    Attributes
    ----------
    setup_cpu : float
        Process CPU seconds of ``setup``.
    round_cpu, round_wall : list of float
        Process CPU and wall seconds of each ``round``.
    """

    def __init__(self, algorithm):
        self._algorithm = algorithm
        self.setup_cpu = 0.0
        self.round_cpu: list[float] = []
        self.round_wall: list[float] = []

    def __getattr__(self, name):
        return getattr(self._algorithm, name)

    def setup(self, problem, blocks):
        cpu = time.process_time()
        state = self._algorithm.setup(problem, blocks)
        self.setup_cpu = time.process_time() - cpu
        return state

    def round(self, state, active, rng):
        cpu = time.process_time()
        wall = time.perf_counter()
        state = self._algorithm.round(state, active, rng)
        self.round_wall.append(time.perf_counter() - wall)
        self.round_cpu.append(time.process_time() - cpu)
        return state


def _time_limit_error():
    """An error type that stops :func:`simulate` from its ``on_evaluate`` callback.

    The engine attaches the run so far (``error.result``) to a ``HyflError``
    raised while it evaluates, so a subclass of it ends a run early without
    losing its metrics.
    """
    from hyfl.errors import HyflError

    class TimeLimitReached(HyflError):
        """The run's wall-time limit was reached."""

    return TimeLimitReached


@dataclass
class Case:
    """One run: dataset, partition spec, participation (a fraction or ``cyclic:C``) and loss."""

    dataset: str
    partition: str
    participation: str
    loss: str
    model: str = "default"
    """HyFDCA's hyperparameters beyond the defaults, ``KEY=VALUE`` joined by ``,``."""


@dataclass
class Outcome:
    """What one run measured (one CSV row; see :func:`row_of`)."""

    case: Case
    lam: float
    n_samples: int
    n_features: int
    n_outputs: int
    clients: int
    rounds_requested: int
    rounds_done: int = 0
    status: str = "ok"
    central_cpu: float = math.nan
    central_method: str = ""
    default_cpu: float = math.nan
    default_relative_loss: float = math.nan
    setup_cpu: float = math.nan
    round_wall_ms: float = math.nan
    round_cpu_ms: float = math.nan
    eval_wall_s: float = math.nan
    run_wall_s: float = math.nan
    settled: dict[float, float | None] = field(default_factory=dict)
    first: dict[float, float | None] = field(default_factory=dict)
    settled_cpu: dict[float, float | None] = field(default_factory=dict)
    final_relative_loss: float = math.nan
    best_relative_loss: float = math.nan
    max_rebound: float = math.nan
    final_model: str = ""
    last_evaluated: float | None = None
    trajectory: list[tuple[float, float, str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def cpu_until(setup_cpu: float, round_cpu: list[float], round_number: float | None):
    """CPU seconds of ``setup`` and rounds ``1 .. round_number`` (None stays None)."""
    if round_number is None:
        return None
    return setup_cpu + float(np.sum(round_cpu[: int(round_number)]))


def max_rebound(values: np.ndarray) -> float:
    """The largest ratio of an evaluation to the best (smallest) one before it.

    Parameters
    ----------
    values : ndarray
        Relative losses in round order (positive; others are skipped).

    Returns
    -------
    float
        1 for a monotone sequence; NaN with fewer than two positive values.
    """
    positive = values[np.isfinite(values) & (values > 0)]
    if positive.size < 2:
        return math.nan
    best_before = np.minimum.accumulate(positive)[:-1]
    return float(max(1.0, np.max(positive[1:] / best_before)))


DROPOUT_MEAN_OFFLINE = 10.0  # rounds a client stays away, on average, once it drops out


def dropout_trace(n_clients: int, availability: float, rounds: int, seed: int) -> np.ndarray:
    """Masks of a participation trace where clients drop out for stretches of rounds.

    Each client is a two-state Markov chain. Offline, it comes back with
    probability ``b = 1 / DROPOUT_MEAN_OFFLINE`` a round; online, it drops out
    with probability ``a = b (1 - P) / P``, so that it is online a fraction
    ``P = b / (a + b)`` of the rounds. Round 1 draws each client's state from
    that stationary split.

    Parameters
    ----------
    n_clients : int
    availability : float
        P in (0, 1].
    rounds : int
    seed : int

    Returns
    -------
    ndarray of bool, shape (rounds, n_clients)
    """
    rng = np.random.default_rng([seed, 0xD80])
    back = 1.0 / DROPOUT_MEAN_OFFLINE
    leave = back * (1.0 - availability) / availability
    masks = np.empty((rounds, n_clients), dtype=bool)
    online = rng.random(n_clients) < availability
    for t in range(rounds):  # a loop over rounds, each a vector over clients
        masks[t] = online
        draw = rng.random(n_clients)
        online = np.where(online, draw >= leave, draw < back)
    return masks


def dropout_availability(spec: str) -> float | None:
    """P of a ``dropout:P`` spec, None for any other spec; raises ValueError if P is bad."""
    name, _, argument = spec.partition(":")
    if name.strip().lower() != "dropout":
        return None
    value = float(argument)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"P must be in (0, 1], got {value:g}")
    return value


def participation_of(case: Case, partition, args):
    """The participation schedule of a case; a ``dropout:P`` trace is also written to a file."""
    from hyfl.participation import Trace, parse_participation

    availability = dropout_availability(case.participation)
    if availability is None:
        return parse_participation(case.participation, partition.n_clients)
    masks = dropout_trace(partition.n_clients, availability, args.rounds, args.seed)
    stem = f"{case.dataset}-{case.partition}-{case.participation}-seed{args.seed}"
    path = Path(args.out).with_name(
        Path(args.out).stem + "-trace-" + "".join(c if c.isalnum() else "_" for c in stem) + ".txt"
    )
    lines = [f"# bench_convergence dropout trace: {case.participation}, seed {args.seed}"]
    lines += [" ".join(map(str, np.flatnonzero(row))) or "-" for row in masks]
    path.write_text("\n".join(lines) + "\n")
    print(f"    trace: {path} ({masks.mean():.2f} of clients online on average)", flush=True)
    return Trace(masks)


def run_case(case: Case, problem, partition, optimum, args, outcome: Outcome) -> Outcome:
    """Run HyFDCA's defaults on one case and fill ``outcome`` in.

    Parameters
    ----------
    case : Case
    problem : hyfl.problem.Problem
    partition : hyfl.partition.Partition
    optimum : hyfl.problem.Optimum
        liblinear's solution of the pooled problem (gives ``P*``).
    args : argparse.Namespace
        ``rounds``, ``eval_every``, ``seed``, ``time_limit``.
    outcome : Outcome
        Filled in place and returned.

    Returns
    -------
    Outcome
    """
    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.errors import HyflError
    from hyfl.runtime.simulation import first_round_below, settled_round_below, simulate

    algorithm = TimedAlgorithm(HyFDCA(**model_options(case.model)).validated())
    participation = participation_of(case, partition, args)
    time_limit_reached = _time_limit_error()
    started = time.perf_counter()
    eval_wall = [0.0]

    def on_evaluate(row: dict) -> None:
        # Rounds run so far take the wall time not spent in rounds: evaluation (approx.).
        eval_wall[0] = time.perf_counter() - started - float(np.sum(algorithm.round_wall))
        if args.time_limit and time.perf_counter() - started > args.time_limit:
            raise time_limit_reached(f"wall-time limit {args.time_limit:g} s reached")

    try:
        result = simulate(
            algorithm,
            problem,
            partition,
            participation,
            args.rounds,
            seed=args.seed,
            eval_every=args.eval_every,
            optimum=optimum,
            on_evaluate=on_evaluate,
        )
    except time_limit_reached as error:
        result = error.result
        outcome.status = f"time limit ({args.time_limit:g} s wall)"
    except HyflError as error:  # divergence or bad input: keep what ran
        result = getattr(error, "result", None)
        outcome.status = f"error: {error}"
    outcome.run_wall_s = time.perf_counter() - started
    outcome.eval_wall_s = eval_wall[0]
    outcome.setup_cpu = algorithm.setup_cpu
    outcome.rounds_done = len(algorithm.round_cpu)
    if algorithm.round_cpu:
        outcome.round_wall_ms = float(np.median(algorithm.round_wall) * 1e3)
        outcome.round_cpu_ms = float(np.median(algorithm.round_cpu) * 1e3)
    if result is None or not result.metrics:
        return outcome

    iterations = result.column("iteration")
    relative = result.column("relative_loss")
    for level in LEVELS:
        outcome.first[level] = first_round_below(iterations, relative, level)
        outcome.settled[level] = settled_round_below(iterations, relative, level)
        outcome.settled_cpu[level] = cpu_until(
            algorithm.setup_cpu, algorithm.round_cpu, outcome.settled[level]
        )
    outcome.final_relative_loss = float(relative[-1])
    finite = relative[np.isfinite(relative)]
    outcome.best_relative_loss = float(finite.min()) if finite.size else math.nan
    outcome.max_rebound = max_rebound(relative)
    models = [MODEL_NAMES.get(float(m), str(m)) for m in result.column("model")]
    outcome.final_model = models[-1]
    outcome.last_evaluated = float(iterations[-1])
    outcome.trajectory = [
        (float(t), float(r), m, cpu_until(algorithm.setup_cpu, algorithm.round_cpu, t))
        for t, r, m in zip(iterations, relative, models)
    ]

    if np.any(np.isnan(relative)):
        outcome.notes.append(f"NaN relative loss at {int(np.isnan(relative).sum())} evaluation(s)")
    if outcome.best_relative_loss < NEGATIVE_TOLERANCE:
        at = int(iterations[int(np.nanargmin(relative))])
        outcome.notes.append(
            f"relative loss {outcome.best_relative_loss:.2e} < 0 at round {at} "
            "(liblinear's P* inexact)"
        )
    if outcome.max_rebound > REBOUND_FLAG:
        outcome.notes.append(f"rose {outcome.max_rebound:.3g}x above its best so far")
    for level in LEVELS:
        first, settled = outcome.first[level], outcome.settled[level]
        if settled is not None and settled == outcome.last_evaluated and len(iterations) > 1:
            outcome.notes.append(f"{level:g}: below it only at the last evaluation (unconfirmed)")
        elif first is not None and settled is not None and settled > first:
            outcome.notes.append(f"{level:g}: touched at {first:g}, settled only at {settled:g}")
        elif first is not None and settled is None:
            outcome.notes.append(f"{level:g}: touched at {first:g} but ended above it")
    return outcome


# --------------------------------------------------------------------------- cases


def model_options(spec: str) -> dict:
    """HyFDCA keyword arguments of a ``--model`` spec (``default`` or ``KEY=VALUE,...``)."""
    from hyfl.experiments.spec import parse_params

    if spec == "default":
        return {}
    return parse_params([item for item in spec.split(",") if item])


def partitions_for(dataset: str, args) -> list[str]:
    """Partition specs for ``dataset``: ``--mnist-partitions`` for MNIST, else ``--grids``."""
    if dataset == "mnist":
        return args.mnist_partitions
    return [g if ":" in g else f"grid:{g}" for g in args.grids]


def warm_up(losses: list[str], seed: int) -> float:
    """Compile (or load from Numba's cache) HyFDCA's local solvers before any timing.

    Runs a few rounds of ``HyFDCA()`` per loss on scikit-learn's small breast
    cancer data, with every client and with half of them (returning clients' refresh,
    the absent holders' estimates), so that the first timed run -- with ``--model``,
    the first model -- does not pay for the just-in-time compilation.

    Returns
    -------
    float
        CPU seconds the warm-up took.
    """
    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.data import load_dataset
    from hyfl.participation import Full, RandomFraction
    from hyfl.partition import parse_partition
    from hyfl.problem import make_problem
    from hyfl.runtime.simulation import simulate

    cpu = time.process_time()
    data = load_dataset("breast_cancer")
    for loss in losses:
        problem = make_problem(data, loss, 1e-3)
        partition = parse_partition("grid:2x2", problem.X, seed=seed)
        simulate(HyFDCA(), problem, partition, Full(partition.n_clients), 2, seed=seed)
        simulate(HyFDCA(), problem, partition, RandomFraction(partition.n_clients, 0.5), 6,
                 seed=seed)
    return time.process_time() - cpu


def run_all(args) -> list[Outcome]:
    """Run every case; write the CSV after each one; return the outcomes."""
    from hyfl.data import load_dataset
    from hyfl.data.dataset import with_intercept
    from hyfl.partition import parse_partition
    from hyfl.problem import make_problem, solve_centralized

    outcomes: list[Outcome] = []
    warm_up_cpu = warm_up(args.losses, args.seed)
    print(f"warm-up (Numba compile or cache load): {warm_up_cpu:.2f} s CPU", flush=True)
    writer = CsvOut(args.out, args.append)
    trajectories = CsvOut(args.trajectories, args.append, TRAJECTORY_COLUMNS)
    for dataset in args.datasets:
        data = load_dataset(dataset)
        if args.intercept:
            data = with_intercept(data)
        lam = float(data.meta["lam"])  # the paper's value (as `hyfl run` picks it)
        for loss in args.losses:
            problem = make_problem(data, loss, lam)
            # liblinear at its defaults first, as a user's process would run it (the tight
            # solve after it then finds the data warm)
            default_cpu, default_loss = liblinear_at_its_defaults(problem)
            cpu = time.process_time()
            optimum = solve_centralized(problem, cache=False)
            central_cpu = time.process_time() - cpu
            default_relative = (default_loss - optimum.primal) / abs(optimum.primal)
            print(
                f"[{dataset} {loss} lam={lam:g}] liblinear: {central_cpu:.2f} s CPU "
                f"({optimum.method}), P* = {optimum.primal:.10g}; at its default tolerance "
                f"{default_cpu:.2f} s CPU, relative loss {default_relative:.2g}",
                flush=True,
            )
            for spec in partitions_for(dataset, args):
                partition = parse_partition(spec, problem.X, seed=args.seed, meta=data.meta)
                for p, model in itertools.product(args.participation, args.models):
                    case = Case(dataset, spec, p, loss, model)
                    outcome = Outcome(
                        case=case,
                        lam=lam,
                        n_samples=problem.n_samples,
                        n_features=problem.n_features,
                        n_outputs=problem.n_outputs,
                        clients=partition.n_clients,
                        rounds_requested=args.rounds,
                        central_cpu=central_cpu,
                        central_method=optimum.method,
                        default_cpu=default_cpu,
                        default_relative_loss=default_relative,
                    )
                    print(
                        f"  {spec} ({partition.n_clients} clients) p={p} model {model}: "
                        f"{args.rounds} rounds ...",
                        flush=True,
                    )
                    run_case(case, problem, partition, optimum, args, outcome)
                    print("    " + summary_line(outcome), flush=True)
                    outcomes.append(outcome)
                    writer.write(row_of(outcome, args))
                    for t, relative, model, cpu in outcome.trajectory:
                        trajectories.write(
                            {
                                "dataset": dataset,
                                "partition": spec,
                                "participation": p,
                                "loss": loss,
                                "iteration": t,
                                "relative_loss": relative,
                                "model": model,
                                "cpu_s": cpu,
                            }
                        )
    return outcomes


# --------------------------------------------------------------------------- reporting

CSV_COLUMNS = (
    "dataset",
    "partition",
    "clients",
    "participation",
    "loss",
    "model",
    "intercept",
    "lam",
    "n_samples",
    "n_features",
    "n_outputs",
    "rounds_requested",
    "rounds_done",
    "eval_every",
    "seed",
    "status",
    *(f"settled_round_{level:g}" for level in LEVELS),
    *(f"settled_cpu_s_{level:g}" for level in LEVELS),
    *(f"first_round_{level:g}" for level in LEVELS),
    "final_relative_loss",
    "best_relative_loss",
    "max_rebound",
    "final_model",
    "setup_cpu_s",
    "round_wall_ms_median",
    "round_cpu_ms_median",
    "eval_wall_s",
    "run_wall_s",
    "liblinear_cpu_s",
    "liblinear_method",
    *(f"cpu_ratio_{level:g}" for level in LEVELS),
    "liblinear_default_cpu_s",
    "liblinear_default_relative_loss",
    *(f"default_ratio_{level:g}" for level in LEVELS),
    "notes",
    "date",
    "machine",
    "hyfl_commit",
)


def liblinear_at_its_defaults(problem) -> tuple[float, float]:
    """CPU seconds of liblinear on the pooled problem as a user would run it (scikit-learn's
    ``LinearSVC`` or ``LogisticRegression(solver="liblinear")`` with ``C = 1 / (lam N)``, no
    intercept, every other setting its default, e.g. ``tol=1e-4``), and the primal objective
    of its model. The baseline of the ``default_ratio`` columns."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    C = 1.0 / (problem.lam * problem.n_samples)
    weights = []
    cpu = 0.0
    for c in range(problem.n_outputs):
        y = problem.Y[:, c]
        model = (LinearSVC(loss="hinge", C=C, fit_intercept=False)
                 if problem.loss.name == "hinge"
                 else LogisticRegression(solver="liblinear", C=C, fit_intercept=False))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            started = time.process_time()
            model.fit(problem.X, y)
            cpu += time.process_time() - started
        weights.append(model.coef_.ravel())
    return cpu, float(problem.primal(np.column_stack(weights)))


def _ratio(outcome: Outcome, level: float, baseline: str = "central_cpu") -> float:
    """HyFDCA's CPU to settle at ``level`` over liblinear's: the tight solve's
    (``central_cpu``) or liblinear at its defaults (``default_cpu``)."""
    cpu, central = outcome.settled_cpu.get(level), getattr(outcome, baseline)
    if cpu is None or not central > 0:
        return math.nan
    return cpu / central


def row_of(outcome: Outcome, args) -> dict:
    """The CSV row of one outcome (keys :data:`CSV_COLUMNS`)."""
    case = outcome.case
    row = {
        "dataset": case.dataset,
        "partition": case.partition,
        "clients": outcome.clients,
        "participation": case.participation,
        "loss": case.loss,
        "model": case.model,
        "intercept": args.intercept,
        "lam": outcome.lam,
        "n_samples": outcome.n_samples,
        "n_features": outcome.n_features,
        "n_outputs": outcome.n_outputs,
        "rounds_requested": outcome.rounds_requested,
        "rounds_done": outcome.rounds_done,
        "eval_every": args.eval_every,
        "seed": args.seed,
        "status": outcome.status,
        "final_relative_loss": outcome.final_relative_loss,
        "best_relative_loss": outcome.best_relative_loss,
        "max_rebound": outcome.max_rebound,
        "final_model": outcome.final_model,
        "setup_cpu_s": outcome.setup_cpu,
        "round_wall_ms_median": outcome.round_wall_ms,
        "round_cpu_ms_median": outcome.round_cpu_ms,
        "eval_wall_s": outcome.eval_wall_s,
        "run_wall_s": outcome.run_wall_s,
        "liblinear_cpu_s": outcome.central_cpu,
        "liblinear_method": outcome.central_method,
        "notes": "; ".join(outcome.notes),
        "date": args.environment["date"],
        "machine": f"{args.environment['cpu']}, {args.environment['cores']} cores",
        "hyfl_commit": args.environment["commit"] + ("+dirty" if args.environment["dirty"] else ""),
    }
    for level in LEVELS:
        row[f"settled_round_{level:g}"] = _blank(outcome.settled.get(level))
        row[f"settled_cpu_s_{level:g}"] = _blank(outcome.settled_cpu.get(level))
        row[f"first_round_{level:g}"] = _blank(outcome.first.get(level))
        row[f"cpu_ratio_{level:g}"] = _ratio(outcome, level)
        row[f"default_ratio_{level:g}"] = _ratio(outcome, level, "default_cpu")
    row["liblinear_default_cpu_s"] = outcome.default_cpu
    row["liblinear_default_relative_loss"] = outcome.default_relative_loss
    return row


def _blank(value):
    return "" if value is None else value


TRAJECTORY_COLUMNS = (
    "dataset",
    "partition",
    "participation",
    "loss",
    "iteration",
    "relative_loss",
    "model",
    "cpu_s",
)


class CsvOut:
    """Append-as-you-go CSV writer (so an interrupted run keeps its rows).

    Parameters
    ----------
    path : str or None
        None writes nothing.
    append : bool
        Append to an existing file instead of starting it afresh.
    columns : tuple of str, default :data:`CSV_COLUMNS`
    """

    def __init__(self, path: str | None, append: bool, columns: tuple[str, ...] = CSV_COLUMNS):
        self.path = None if path is None else Path(path)
        self.columns = columns
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not (append and self.path.exists()):
            with self.path.open("w", newline="") as f:
                csv.DictWriter(f, columns).writeheader()

    def write(self, row: dict) -> None:
        if self.path is None:
            return
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, self.columns).writerow(row)


def _round_and_cpu(outcome: Outcome, level: float) -> str:
    settled = outcome.settled.get(level)
    if settled is None:
        return "-"
    # *: below the level only at the last evaluation, so not seen to stay there.
    mark = "*" if settled == outcome.last_evaluated and len(outcome.trajectory) > 1 else ""
    return f"{settled:.0f}{mark} / {outcome.settled_cpu[level]:.1f}"


def summary_line(outcome: Outcome) -> str:
    """One line per run for the progress log."""
    parts = [f"settled {level:g}: {_round_and_cpu(outcome, level)}" for level in LEVELS]
    first = outcome.first.get(1e-3)
    parts.append(f"first 1e-3: {'-' if first is None else f'{first:.0f}'}")
    parts.append(f"final {outcome.final_relative_loss:.3g}")
    ratio = _ratio(outcome, 1e-3, "default_cpu")
    if not math.isnan(ratio):
        parts.append(f"{ratio:.3g}x liblinear at its defaults to 1e-3")
    parts.append(f"{outcome.round_cpu_ms:.1f} ms CPU/round ({outcome.round_wall_ms:.1f} wall)")
    parts.append(outcome.status)
    line = "; ".join(parts)
    return line + ("" if not outcome.notes else " [" + "; ".join(outcome.notes) + "]")


STAR_NOTE = (
    "*: below the level only at the last evaluation (not seen to stay there). "
    "CPU: HyFDCA's set-up plus rounds up to the settling round, evaluation excluded."
)

TABLE_HEADER = (
    "dataset",
    "partition",
    "p",
    "loss",
    "model",
    "lam",
    "rounds run",
    "settle 1e-2 (round / CPU s)",
    "settle 1e-3 (round / CPU s)",
    "settle 1e-4 (round / CPU s)",
    "first 1e-3",
    "final rel. loss",
    "ms/round CPU (wall)",
    "liblinear CPU s",
    "ratio 1e-2 / 1e-3 / 1e-4",
)


def table_rows(outcomes: list[Outcome]) -> list[list[str]]:
    """Rows of the printed and Markdown tables (columns :data:`TABLE_HEADER`)."""
    rows = []
    for o in outcomes:
        first = o.first.get(1e-3)
        ratios = " / ".join(
            "-" if math.isnan(r) else f"{r:.3g}" for r in (_ratio(o, level) for level in LEVELS)
        )
        rounds = f"{o.rounds_done}" + ("" if o.status == "ok" else f" ({o.status})")
        rows.append(
            [
                o.case.dataset,
                f"{o.case.partition} ({o.clients})",
                o.case.participation,
                o.case.loss,
                o.case.model,
                f"{o.lam:g}",
                rounds,
                *(_round_and_cpu(o, level) for level in LEVELS),
                "-" if first is None else f"{first:.0f}",
                f"{o.final_relative_loss:.3g}",
                f"{o.round_cpu_ms:.3g} ({o.round_wall_ms:.3g})",
                f"{o.central_cpu:.3g}",
                ratios,
            ]
        )
    return rows


def markdown_table(outcomes: list[Outcome]) -> str:
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(outcomes)]
    return "\n".join(lines) + "\n\n" + STAR_NOTE + "\n"


def print_table(outcomes: list[Outcome], env: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title="HyFDCA defaults (cocoa rule): rounds and CPU to settle at a relative loss",
        caption=machine_line(env),
    )
    for name in TABLE_HEADER:
        table.add_column(name, overflow="fold")
    for row in table_rows(outcomes):
        table.add_row(*row)
    Console(width=max(180, shutil.get_terminal_size().columns)).print(table)
    print(STAR_NOTE)
    notes = [(o, note) for o in outcomes for note in o.notes]
    for o, note in notes:
        c = o.case
        print(f"note: {c.dataset} {c.partition} p={c.participation} {c.loss}: {note}")


def environment() -> dict:
    """Machine, versions, date, load and the library's commit."""
    import numpy
    import scipy
    import sklearn

    cpu = cpu_model()
    try:
        import numba

        numba_version = numba.__version__
    except ImportError:
        numba_version = "-"
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "sklearn": sklearn.__version__,
        "numba": numba_version,
        "load_average": os.getloadavg(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", "src")),
    }


def machine_line(env: dict) -> str:
    load = "/".join(f"{v:.2f}" for v in env["load_average"])
    return (
        f"{env['date']}; {env['cpu']}, {env['cores']} cores; Python {env['python']}, "
        f"NumPy {env['numpy']}, SciPy {env['scipy']}, scikit-learn {env['sklearn']}, "
        f"Numba {env['numba']}; load average at start {load}; hyfl at {env['commit']}"
        + (" with uncommitted changes under src/" if env["dirty"] else "")
    )


# --------------------------------------------------------------------------- main


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (``--quick`` fills in whatever was not given)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--datasets", default=None, help=f"comma-separated, of {','.join(DATASETS)}"
    )
    parser.add_argument(
        "--grids", default=None, help="comma-separated KxQ (grid:KxQ) or full partition specs"
    )
    parser.add_argument(
        "--mnist-partitions",
        default=MNIST_PARTITIONS,
        help=f"partition specs for MNIST (default {MNIST_PARTITIONS})",
    )
    parser.add_argument("--participation", default=None,
                        help="comma-separated fractions in (0, 1], cyclic:C or dropout:P "
                             "(a trace where clients drop out for ~10 rounds)")
    parser.add_argument("--losses", default=None, help="comma-separated: hinge,logistic")
    parser.add_argument("--rounds", type=int, default=None, help="outer iterations (default 800)")
    parser.add_argument("--eval-every", type=int, default=None, help="default 5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="wall seconds per run; a run that exceeds it stops at its next evaluation",
    )
    parser.add_argument("--out", default="bench_convergence.csv", help="CSV path")
    parser.add_argument("--append", action="store_true", help="append to an existing CSV")
    parser.add_argument("--markdown", default=None, help="also write the table here")
    parser.add_argument(
        "--trajectories", default=None, help="CSV of every evaluation (relative loss, CPU)"
    )
    parser.add_argument("--quick", action="store_true", help="small subset, a few minutes")
    parser.add_argument(
        "--model", dest="models", action="append", default=None,
        help="HyFDCA's hyperparameters as KEY=VALUE,KEY=VALUE (e.g. history=8,history_window=4), "
             "or 'default'; repeat to compare models, each run on every case in turn",
    )
    parser.add_argument("--intercept", action="store_true",
                        help="fit an intercept (a constant column, as hyfl run's default)")
    args = parser.parse_args(argv)
    quick = {
        "datasets": "ijcnn1,reuters",
        "grids": "3x3",
        "participation": "0.5",
        "losses": "hinge",
        "rounds": 150,
        "eval_every": 10,
    }
    full = {
        "datasets": ",".join(DATASETS),
        "grids": "3x3,12x12",
        "participation": "0.5,1.0",
        "losses": "hinge,logistic",
        "rounds": 800,
        "eval_every": 5,
    }
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.datasets = _split(args.datasets)
    unknown = sorted(set(args.datasets) - set(DATASETS))
    if unknown or not args.datasets:
        parser.error(f"unknown dataset(s) {unknown}; choose from {', '.join(DATASETS)}")
    args.grids = _split(args.grids)
    args.mnist_partitions = _split(args.mnist_partitions)
    args.losses = _split(args.losses)
    bad_losses = sorted(set(args.losses) - {"hinge", "logistic"})
    if bad_losses or not args.losses:
        parser.error(f"unknown loss(es) {bad_losses}; choose from hinge, logistic")
    args.participation = _split(args.participation)
    args.models = args.models or ["default"]
    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.errors import HyflError

    for model in args.models:
        try:
            HyFDCA(**model_options(model)).validated()
        except (HyflError, TypeError, ValueError) as error:
            parser.error(f"--model {model!r}: {error}")
    from hyfl.participation import parse_participation

    for spec in args.participation:  # as hyfl run reads them (checked for 4 clients here)
        try:
            if dropout_availability(spec) is None:
                parse_participation(spec, 4)
        except (HyflError, ValueError) as error:
            parser.error(f"--participation {spec!r}: {error}")
    if not args.participation:
        parser.error(
            "--participation takes comma-separated fractions, cyclic:C or dropout:P, e.g. 0.5,1"
        )
    if args.rounds < 1 or args.eval_every < 1:
        parser.error("--rounds and --eval-every must be >= 1")
    if args.time_limit is not None and args.time_limit <= 0:
        parser.error("--time-limit must be > 0")
    return args


def main(argv=None) -> list[Outcome]:
    args = parse_args(argv)
    args.environment = environment()
    print(machine_line(args.environment), flush=True)
    print("command: " + " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    outcomes = run_all(args)
    print_table(outcomes, args.environment)
    print(f"CSV: {args.out}")
    if args.markdown:
        Path(args.markdown).write_text(
            f"{machine_line(args.environment)}\n\n{markdown_table(outcomes)}"
        )
    return outcomes


if __name__ == "__main__":
    main()
