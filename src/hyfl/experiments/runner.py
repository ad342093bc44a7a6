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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyfl import __version__
from hyfl.algorithms import algorithm_names, make_algorithm
from hyfl.data import default_lambda, train_validation
from hyfl.errors import check_choice, check_int, fail
from hyfl.losses import LOSSES
from hyfl.partition import parse_participation, parse_partition
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import METRIC_COLUMNS, RunResult, Validation, simulate

FALLBACK_LAMBDA = 1e-4


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one run; defaults are ``hyfl run``'s defaults.

    ``hyper`` holds the algorithm's hyperparameters by name (for example
    ``{"iic": 7.4e-4}`` for HyFDCA or ``{"a": 0.05, "b": 1.0}`` for FedAvg);
    ``hyfl compare`` also accepts ``"fedavg.a"``-style keys that apply to one
    algorithm only.
    """

    algorithm: str = "hyfdca"
    data: str = "breast_cancer"
    val: str | None = None
    val_fraction: float | None = None
    loss: str = "hinge"
    lam: float | None = None
    partition: str = "grid:3x3"
    participation: str = "0.5"
    hyper: dict[str, Any] = field(default_factory=dict)
    iterations: int = 2000
    eval_every: int = 1
    seed: int = 0
    data_dir: str | None = None

    def validated(self) -> RunSpec:
        check_choice("algorithm", self.algorithm, algorithm_names())
        check_choice("loss", self.loss, LOSSES)
        check_int("iterations", self.iterations, minimum=1)
        check_int("eval_every", self.eval_every, minimum=1)
        check_int("seed", self.seed, minimum=0)
        if self.hyper.get("iic") is not None and self.hyper.get("local_steps") is not None:
            raise fail("--iic and --local-steps", "were both given", "Give only one of them.")
        if self.val is not None and self.val_fraction is not None:
            raise fail("--val and --val-fraction", "were both given", "Give only one of them.")
        return self

    def hyper_for(self, name: str, *, only_accepted: bool = False) -> dict[str, Any]:
        """Hyperparameters for algorithm ``name``: shared keys, then ``name.key`` overrides.

        With ``only_accepted`` (used by ``compare``), shared keys an algorithm
        does not have are skipped instead of being an error.
        """
        from hyfl.algorithms import accepted_hyperparameters

        accepted = accepted_hyperparameters(name)
        shared = {k: v for k, v in self.hyper.items() if "." not in k}
        if only_accepted:
            shared = {k: v for k, v in shared.items() if k in accepted}
        specific = {
            k.split(".", 1)[1]: v for k, v in self.hyper.items() if k.startswith(f"{name}.")
        }
        return {**shared, **specific}


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


@dataclass(frozen=True)
class Setup:
    """Data, problem, optimum, partition and participation shared by runs."""

    train: Any
    problem: Any
    optimum: Any
    partition: Any
    participation: Any
    validation: Validation | None


def prepare(spec: RunSpec) -> Setup:
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
    return Setup(train, problem, optimum, partition, participation, validation)


def run_prepared(
    setup: Setup, spec: RunSpec, name: str, hyper: dict[str, Any], progress: bool = False
) -> RunOutcome:
    """Run algorithm ``name`` on a prepared set-up and summarize it."""
    started = time.time()
    algorithm = make_algorithm(name, hyper)
    problem, validation = setup.problem, setup.validation
    result = simulate(
        algorithm,
        problem,
        setup.partition,
        setup.participation,
        spec.iterations,
        seed=spec.seed,
        eval_every=spec.eval_every,
        optimum=setup.optimum,
        validation=validation,
        train_labels=setup.train.y,
        progress=progress,
    )
    opt_val_acc = (
        problem.accuracy(validation.X, validation.y, setup.optimum.w) if validation else np.nan
    )
    rel = result.column("relative_loss")
    summary = {
        "algorithm": name,
        "final": result.final,
        "best_val_accuracy": float(np.nanmax(result.column("val_accuracy")))
        if validation
        else None,
        "rounds_to_relative_loss": {
            f"{tol:g}": _first_reach(result.column("iteration"), rel, tol)
            for tol in (1e-1, 1e-2, 1e-3)
        },
        "median_round_seconds": float(np.median(result.round_times)),
        "optimum": {
            "primal": setup.optimum.primal,
            "method": setup.optimum.method,
            "val_accuracy": opt_val_acc,
        },
        "n_clients": setup.partition.n_clients,
        "n_samples": problem.n_samples,
        "n_features": problem.n_features,
        "lam": problem.lam,
        "wall_seconds": time.time() - started,
    }
    if hasattr(algorithm, "steps_per_client"):
        summary["local_steps"] = algorithm.steps_per_client(
            problem.n_samples, setup.partition.n_clients
        )
    run_spec = RunSpec(**{**asdict(spec), "algorithm": name, "hyper": hyper})
    return RunOutcome(
        run_spec, result, setup.optimum.primal, setup.optimum.method, opt_val_acc, summary, None
    )


def execute(spec: RunSpec, out_dir: str | Path | None = None, progress: bool = False) -> RunOutcome:
    """Run ``spec`` and, when ``out_dir`` is given, write its files there."""
    setup = prepare(spec)
    outcome = run_prepared(setup, spec, spec.algorithm, spec.hyper_for(spec.algorithm), progress)
    if out_dir is not None:
        outcome.out_dir = write_outputs(outcome, Path(out_dir))
    return outcome


def compare(
    spec: RunSpec, names: list[str], out_dir: str | Path, progress: bool = False
) -> list[RunOutcome]:
    """Run several algorithms on one partition and one participation trace.

    The participation random stream depends only on the seed, so every
    algorithm sees the same active clients in every outer iteration. Writes
    ``<name>/metrics.csv`` and ``<name>/run.json`` per algorithm,
    ``summary.csv``, ``summary.md`` and ``compare.png``.
    """
    from hyfl.experiments.plots import plot_runs

    if not names:
        raise fail("--algorithms", "is empty", "Give a comma-separated list, e.g. hyfdca,fedavg.")
    for name in names:
        check_choice("algorithm", name, algorithm_names())
    setup = prepare(spec)
    out = Path(out_dir)
    outcomes = []
    for name in names:
        outcome = run_prepared(
            setup, spec, name, spec.hyper_for(name, only_accepted=True), progress
        )
        outcome.out_dir = write_outputs(outcome, out / name, plot=False)
        outcomes.append(outcome)
    write_comparison(outcomes, out)
    plot_runs(
        {o.spec.algorithm: o.result for o in outcomes}, out / "compare.png", title=_title(spec)
    )
    return outcomes


SUMMARY_COLUMNS = (
    "algorithm",
    "final_relative_loss",
    "best_val_accuracy",
    "rounds_to_1e-1",
    "rounds_to_1e-2",
    "rounds_to_1e-3",
    "round_trips",
    "median_round_ms",
)


def summary_rows(outcomes: list[RunOutcome]) -> list[dict[str, Any]]:
    rows = []
    for o in outcomes:
        s = o.summary
        reach = s["rounds_to_relative_loss"]
        rows.append(
            {
                "algorithm": s["algorithm"],
                "final_relative_loss": s["final"]["relative_loss"],
                "best_val_accuracy": s["best_val_accuracy"],
                "rounds_to_1e-1": reach["0.1"],
                "rounds_to_1e-2": reach["0.01"],
                "rounds_to_1e-3": reach["0.001"],
                "round_trips": s["final"]["round_trips"],
                "median_round_ms": 1e3 * s["median_round_seconds"],
            }
        )
    return rows


def write_comparison(outcomes: list[RunOutcome], out: Path) -> None:
    rows = summary_rows(outcomes)
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r[c]) for c in SUMMARY_COLUMNS) + " |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _title(spec: RunSpec) -> str:
    return f"{spec.data}, {spec.partition}, participation {spec.participation}"


def _first_reach(iterations: np.ndarray, values: np.ndarray, tol: float) -> float | None:
    hit = np.flatnonzero(values <= tol)
    return float(iterations[hit[0]]) if hit.size else None


def write_outputs(outcome: RunOutcome, out_dir: Path, plot: bool = True) -> Path:
    """Write ``metrics.csv``, ``run.json`` and (with ``plot``) ``loss.png``."""
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
