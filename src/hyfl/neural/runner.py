"""``hyfl run`` / ``hyfl compare`` for the neural algorithms: set-up, run, results folder.

The same :class:`~hyfl.experiments.runner.RunSpec` and results layout as the
linear algorithms: ``metrics.csv`` / ``metrics.parquet`` (loss and accuracy of
the global model, the clients' local accuracy, bytes and round trips per
round, cumulative), ``run.json`` (spec, resolved hyperparameters, summary,
task, machine), ``participation.csv`` (which clients took part in each round),
``model.npz`` (:mod:`hyfl.neural.model_file`) and ``accuracy.png``.
There is no centralized optimum (the objective is not convex) and nothing is
encrypted.
"""

from __future__ import annotations

import csv
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hyfl.errors import fail
from hyfl.experiments.outputs import plain_label, run_title
from hyfl.runtime.simulation import first_round_at_least

ACCURACY_PLOT = "accuracy.png"
PARTICIPATION_FILE = "participation.csv"


@dataclass(frozen=True)
class NeuralSetup:
    """Data cut into views, partition and participation shared by the runs of a comparison."""

    data: Any  # ViewData
    partition: Any
    participation: Any
    task: dict


def check_spec(spec) -> None:
    """Refuse the settings that do not apply to the neural algorithms."""
    if spec.cipher != "none":
        raise fail(
            f"--cipher {spec.cipher}",
            f"does not apply to {spec.algorithm}: the neural algorithms send plaintext models "
            "and intermediate results",
            "Leave --cipher out (encryption is HyFDCA's), or run hyfdca.",
        )
    if spec.sim_time is not None:
        raise fail(
            "--sim-time", f"does not apply to {spec.algorithm}",
            "Give the budget as --iterations.",
        )


def prepare(spec) -> NeuralSetup:
    """Load the data, build partition and participation, cut the data into views."""
    from hyfl.experiments.spec import load_split
    from hyfl.neural import require_jax
    from hyfl.neural.views import make_view_data
    from hyfl.participation import parse_participation
    from hyfl.partition import parse_partition

    spec.validated()
    check_spec(spec)
    require_jax()
    train, val, partition = load_split(spec)
    if partition is None:
        partition = parse_partition(spec.partition_spec(), train.X, seed=spec.seed,
                                    meta=train.meta, labels=train.y)
    data = make_view_data(train, val, partition)
    participation = parse_participation(spec.participation_spec(), partition.n_clients)
    task = {
        "task": "multiclass" if data.n_classes > 2 else "binary",
        "classes": [plain_label(c) for c in data.classes],
        "label_mapping": {str(plain_label(c)): k for k, c in enumerate(data.classes)},
        "loss": "cross-entropy (softmax)",
        "views": [int(v.size) for v in data.views],
        "client_views": [list(v) for v in data.client_views],
    }
    return NeuralSetup(data, partition, participation, task)


def run_prepared(setup: NeuralSetup, spec, name: str, hyper: dict, progress: bool = False,
                 label: str | None = None):
    """Run neural algorithm ``name`` on a prepared set-up; a RunOutcome."""
    from hyfl.algorithms import make_algorithm
    from hyfl.experiments.spec import RunOutcome, RunSpec
    from hyfl.neural.engine import run

    started = time.time()
    algorithm = make_algorithm(name, hyper)
    result = run(
        algorithm, setup.data, setup.participation, spec.iterations, seed=spec.seed,
        eval_every=spec.eval_every, latency=spec.latency, progress=progress,
    )
    data = setup.data
    majority = float(np.bincount(data.y).max() / data.y.size)
    result.config["majority_rate"] = majority
    val_acc, val_auc = result.column("val_accuracy"), result.column("val_auc")
    final = result.final
    summary = {
        "algorithm": label or name,
        "final": final,
        "best_val_accuracy": float(np.nanmax(val_acc)) if np.isfinite(val_acc).any() else None,
        "best_val_auc": float(np.nanmax(val_auc)) if np.isfinite(val_auc).any() else None,
        "rounds_to_val_accuracy": {
            f"{level:g}": first_round_at_least(result.column("iteration"), val_acc, level)
            for level in (0.9, 0.95, 0.98)
        },
        "median_round_seconds": float(np.median(result.round_times)),
        "budget": {"iterations": spec.iterations},
        "stopped_by": "iterations",
        "rounds": spec.iterations,
        "resumed_from": [],
        "engine": "neural",
        "cipher": "none",
        "costs": {"totals": {k: float(final.get(k, 0.0)) for k in
                             ("bytes_up", "bytes_down", "round_trips", "sim_time",
                              "time_client", "time_server", "time_latency")}},
        "majority_rate": majority,
        "n_clients": data.n_clients,
        "n_samples": int(data.X.shape[0]),
        "n_features": int(data.X.shape[1]),
        "n_views": data.n_views,
        "wall_seconds": time.time() - started,
    }
    run_spec = RunSpec(**{**asdict(spec), "algorithm": name, "hyper": hyper})
    return RunOutcome(run_spec, result, np.nan, "none", np.nan, summary, None, None)


def execute(spec, out_dir=None, progress: bool = False, overwrite: bool = False, log=None):
    """``hyfl run`` for a neural algorithm: run ``spec`` and write its results folder."""
    from hyfl._io import check_results_folder

    if out_dir is not None:
        check_results_folder(out_dir, overwrite=overwrite, resumable=False)
    setup = prepare(spec)
    if log is not None:
        log(describe(setup))
    outcome = run_prepared(setup, spec, spec.algorithm, spec.hyper_for(spec.algorithm), progress)
    if out_dir is not None:
        outcome.out_dir = write_outputs(outcome, setup, Path(out_dir))
    return outcome


def compare(spec, names: list[str], out_dir, progress: bool = False, overwrite: bool = False,
            log=None) -> list:
    """``hyfl compare`` of neural algorithms: one partition, one participation trace."""
    from hyfl._io import check_results_folder
    from hyfl.experiments.plots import plot_neural_runs

    out = Path(out_dir)
    check_results_folder(out, overwrite=overwrite, resumable=False)
    setup = prepare(spec)
    if log is not None:
        log(describe(setup))
    outcomes = []
    for name in names:
        outcome = run_prepared(setup, replace(spec, algorithm=name), name,
                               spec.hyper_for(name, only_accepted=True), progress)
        outcome.out_dir = write_outputs(outcome, setup, out / name)
        outcomes.append(outcome)
    write_comparison(outcomes, out)
    plot_neural_runs({o.spec.algorithm: o.result for o in outcomes}, out / "compare.png",
                     title=run_title(spec))
    return outcomes


SUMMARY_COLUMNS = (
    "algorithm", "seed", "final_val_accuracy", "best_val_accuracy", "final_local_val_accuracy",
    "final_val_auc", "best_val_auc", "rounds_to_0.95", "final_loss", "round_trips", "bytes_up",
    "bytes_down", "median_round_s",
)


def summary_rows(outcomes) -> list[dict[str, Any]]:
    """One row per run of a neural comparison (:data:`SUMMARY_COLUMNS`)."""
    rows = []
    for o in outcomes:
        s, final = o.summary, o.summary["final"]
        rows.append({
            "algorithm": s["algorithm"],
            "seed": o.spec.seed,
            "final_val_accuracy": final.get("val_accuracy"),
            "best_val_accuracy": s["best_val_accuracy"],
            "final_local_val_accuracy": final.get("local_val_accuracy"),
            "final_val_auc": final.get("val_auc"),
            "best_val_auc": s.get("best_val_auc"),
            "rounds_to_0.95": s["rounds_to_val_accuracy"]["0.95"],
            "final_loss": final.get("loss"),
            "round_trips": final.get("round_trips"),
            "bytes_up": final.get("bytes_up"),
            "bytes_down": final.get("bytes_down"),
            "median_round_s": s["median_round_seconds"],
        })
    return rows


def write_comparison(outcomes, out: Path) -> None:
    """``summary.csv`` and ``summary.md`` of a neural comparison."""
    from hyfl._io import atomic_write, csv_text, write_text
    from hyfl.experiments.outputs import format_cell

    rows = summary_rows(outcomes)
    with atomic_write(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        # Names may come from files: text a spreadsheet would run is escaped (OWASP).
        writer.writerows({k: "" if v is None else csv_text(v) for k, v in r.items()}
                         for r in rows)
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    lines += ["| " + " | ".join(format_cell(r[c]) for c in SUMMARY_COLUMNS) + " |" for r in rows]
    write_text(out / "summary.md", "\n".join(lines) + "\n")


def run_experiment(config, out: Path, *, progress: bool = False, say=print):
    """Every (algorithm, seed) of a config of neural algorithms; ``(outcomes, rows)``.

    Each run writes ``<label>/seed-<s>/`` like ``hyfl run``; ``summary.csv`` /
    ``summary.md`` have one row per run (with its seed) and ``compare.png``
    the first seed's runs. Neural runs keep no checkpoints: ``--resume``
    runs them again.
    """
    jobs = config.jobs()
    outcomes, setup, setup_seed = [], None, None
    for number, job in enumerate(jobs, 1):
        entry = config.algorithm(job.label)
        if setup is None or setup_seed != job.seed:
            setup = None  # free the previous seed's data first
            setup, setup_seed = prepare(job.spec), job.seed
            say(describe(setup))
        say(f"[{number}/{len(jobs)}] {job.label}, seed {job.seed}: running")
        outcome = run_prepared(setup, job.spec, entry.algorithm, dict(entry.hyper), progress,
                               label=job.label)
        outcome.out_dir = write_outputs(outcome, setup, out / job.label / f"seed-{job.seed}")
        outcomes.append(outcome)
    write_comparison(outcomes, out)
    first = [o for o in outcomes if o.spec.seed == config.experiment.seeds[0]]
    from hyfl.experiments.plots import plot_neural_runs

    plot_neural_runs({o.summary["algorithm"]: o.result for o in first}, out / "compare.png",
                     title=run_title(first[0].spec))
    return outcomes, summary_rows(outcomes)


def describe(setup: NeuralSetup) -> str:
    data = setup.data
    holds = "; ".join(
        f"client {k}: {data.client_samples[k].size} samples, views {list(vs)}"
        for k, vs in enumerate(data.client_views[:4])
    )
    more = f"; ... ({data.n_clients} clients)" if data.n_clients > 4 else ""
    return (f"task: {data.n_classes} classes, {data.n_views} views of "
            f"{[int(v.size) for v in data.views]} features; {holds}{more}")


def write_outputs(outcome, setup: NeuralSetup, out_dir: Path) -> Path:
    """Write metrics, run.json, participation.csv, model.npz and accuracy.png."""
    from hyfl.experiments.outputs import write_outputs as write_common
    from hyfl.experiments.plots import plot_neural_runs
    from hyfl.neural.model_file import save_neural_model

    write_common(outcome, out_dir, plot=False, extra={"task": setup.task})
    trace = np.asarray(outcome.result.config["participation"], dtype=np.int64)
    with open(out_dir / PARTICIPATION_FILE, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["iteration", *(f"client_{k}" for k in range(setup.data.n_clients))])
        for t, row in enumerate(trace, start=1):
            writer.writerow([t, *row.tolist()])
    save_neural_model(out_dir / "model.npz", outcome, setup)
    plot_neural_runs({outcome.spec.algorithm: outcome.result}, out_dir / ACCURACY_PLOT,
                     title=run_title(outcome.spec))
    return out_dir


