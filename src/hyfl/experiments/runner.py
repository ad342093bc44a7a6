"""Turn a run description into a finished run with its files.

:class:`RunSpec` is the full configuration of one run (what ``hyfl run``'s
flags describe); :func:`execute` resolves data, problem, centralized optimum,
partition, participation and algorithm, runs the simulation and writes
``metrics.csv``, ``run.json`` and ``loss.png`` into the output folder.
"""

from __future__ import annotations

import csv
import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hyfl import __version__
from hyfl.algorithms.hyfdca import STEP_RULES, HyFDCA
from hyfl.data import default_lambda, train_validation
from hyfl.errors import check_choice, check_int, fail
from hyfl.losses import LOSSES
from hyfl.partition import parse_participation, parse_partition
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import METRIC_COLUMNS, RunResult, Validation, simulate

ALGORITHMS = {"hyfdca": HyFDCA}
"""Registry of federated algorithms (drives validation and CLI choices)."""

FALLBACK_LAMBDA = 1e-4


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one run; defaults are ``hyfl run``'s defaults."""

    algorithm: str = "hyfdca"
    data: str = "breast_cancer"
    val: str | None = None
    val_fraction: float | None = None
    loss: str = "hinge"
    lam: float | None = None
    partition: str = "grid:3x3"
    participation: str = "0.5"
    iic: float | None = None
    local_steps: int | None = None
    step_rule: str = "safe"
    refresh_inner_products: bool = False
    iterations: int = 2000
    eval_every: int = 1
    seed: int = 0
    data_dir: str | None = None

    def validated(self) -> RunSpec:
        check_choice("algorithm", self.algorithm, ALGORITHMS)
        check_choice("loss", self.loss, LOSSES)
        check_choice("step_rule", self.step_rule, STEP_RULES)
        check_int("iterations", self.iterations, minimum=1)
        check_int("eval_every", self.eval_every, minimum=1)
        check_int("seed", self.seed, minimum=0)
        if self.iic is not None and self.local_steps is not None:
            raise fail("--iic and --local-steps", "were both given", "Give only one of them.")
        if self.val is not None and self.val_fraction is not None:
            raise fail("--val and --val-fraction", "were both given", "Give only one of them.")
        return self

    def make_algorithm(self):
        return ALGORITHMS[self.algorithm](
            local_steps=self.local_steps,
            iic=self.iic,
            step_rule=self.step_rule,
            refresh_inner_products=self.refresh_inner_products,
        ).validated()


@dataclass
class RunOutcome:
    """What :func:`execute` produced."""

    spec: RunSpec
    result: RunResult
    optimum_primal: float
    optimum_method: str
    optimum_val_accuracy: float
    summary: dict[str, Any]
    out_dir: Path | None


def prepare(spec: RunSpec):
    """Load data and build problem, optimum, partition and participation."""
    spec.validated()
    train, val = train_validation(
        spec.data,
        val=spec.val,
        val_fraction=spec.val_fraction,
        seed=spec.seed,
        data_dir=spec.data_dir,
    )
    lam = spec.lam if spec.lam is not None else (default_lambda(spec.data) or FALLBACK_LAMBDA)
    problem = make_problem(train, spec.loss, lam)
    optimum = solve_centralized(problem)
    partition = parse_partition(spec.partition, problem.X, seed=spec.seed, meta=train.meta)
    participation = parse_participation(spec.participation, partition.n_clients)
    validation = Validation(val.X, val.y) if val is not None else None
    return train, problem, optimum, partition, participation, validation


def execute(spec: RunSpec, out_dir: str | Path | None = None, progress: bool = False) -> RunOutcome:
    """Run ``spec`` and, when ``out_dir`` is given, write its files there."""
    started = time.time()
    train, problem, optimum, partition, participation, validation = prepare(spec)
    algorithm = spec.make_algorithm()
    result = simulate(
        algorithm,
        problem,
        partition,
        participation,
        spec.iterations,
        seed=spec.seed,
        eval_every=spec.eval_every,
        optimum=optimum,
        validation=validation,
        train_labels=train.y,
        progress=progress,
    )
    opt_val_acc = (
        problem.accuracy(validation.X, validation.y, optimum.w) if validation else float("nan")
    )
    final = result.final
    rel = result.column("relative_loss")
    summary = {
        "final": final,
        "best_val_accuracy": float(np.nanmax(result.column("val_accuracy")))
        if validation
        else None,
        "rounds_to_relative_loss": {
            f"{tol:g}": _first_reach(result.column("iteration"), rel, tol)
            for tol in (1e-1, 1e-2, 1e-3)
        },
        "median_round_seconds": float(np.median(result.round_times)),
        "optimum": {
            "primal": optimum.primal,
            "method": optimum.method,
            "val_accuracy": opt_val_acc,
        },
        "n_clients": partition.n_clients,
        "n_samples": problem.n_samples,
        "n_features": problem.n_features,
        "lam": problem.lam,
        "local_steps": algorithm.steps_per_client(problem.n_samples, partition.n_clients),
        "wall_seconds": time.time() - started,
    }
    outcome = RunOutcome(spec, result, optimum.primal, optimum.method, opt_val_acc, summary, None)
    if out_dir is not None:
        outcome.out_dir = write_outputs(outcome, Path(out_dir))
    return outcome


def _first_reach(iterations: np.ndarray, values: np.ndarray, tol: float) -> float | None:
    hit = np.flatnonzero(values <= tol)
    return float(iterations[hit[0]]) if hit.size else None


def write_outputs(outcome: RunOutcome, out_dir: Path) -> Path:
    """Write ``metrics.csv``, ``run.json`` and ``loss.png``."""
    from hyfl.experiments.plots import plot_runs

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = outcome.result.metrics
    extra = sorted({k for row in rows for k in row} - set(METRIC_COLUMNS))
    columns = list(METRIC_COLUMNS) + extra
    with open(out_dir / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(row.get(k, np.nan)) for k in columns})
    record = {
        "hyfl_version": __version__,
        "spec": asdict(outcome.spec),
        "algorithm": outcome.result.config["algorithm"],
        "summary": outcome.summary,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "numpy": np.__version__,
        },
    }
    (out_dir / "run.json").write_text(json.dumps(record, indent=2, default=_json_default) + "\n")
    plot_runs(
        {outcome.spec.algorithm: outcome.result},
        out_dir / "loss.png",
        title=f"{outcome.spec.data}, {outcome.spec.partition}, "
        f"participation {outcome.spec.participation}",
    )
    return out_dir


def _csv_value(v: float) -> str:
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else repr(float(v))


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)
