"""A run's files: metrics, run records, summaries and their text.

:func:`write_outputs` writes one run's ``metrics.csv``/``.parquet``, ``run.json``,
model and plot; :func:`write_comparison` and :func:`write_experiment_summary` the
tables of several; the formatters give the numbers and titles those files and the
console show.
"""

from __future__ import annotations

import csv
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from hyfl import __version__
from hyfl._io import atomic_write, csv_text, write_json, write_text
from hyfl.costs import (
    TIME_COMPONENTS,
    he_label,
)
from hyfl.experiments.spec import RunOutcome, RunSpec
from hyfl.runtime.simulation import (
    METRIC_COLUMNS,
)

AUC_TARGETS = (0.7, 0.75, 0.8)
"""Validation AUCs whose first round the summaries report (FedBCD's Table 2 targets)."""

ACCURACY_MARGINS = (0.01, 0.001)
"""How far below the central model's training accuracy the summaries' accuracy levels are.

For each margin ``m`` (1 point and 0.1 point) a summary reports the first
evaluated round whose training accuracy is at least the central optimum's
minus ``m`` (``rounds_to_acc_<m>``) and the round from which every evaluation
stays there (``settled_acc_<m>``; none if the last one is below), beside the
relative loss levels (``rounds_to_1e-k``, ``settled_1e-k``). Relative to the
central model's accuracy, not a fixed level: what a federated run can reach
on the data is what the pooled data reach. Empty for a regression.
"""


def accuracy_reach(outcome) -> dict[str, float | None]:
    """The first and settled rounds at the central model's training accuracy minus each
    margin of :data:`ACCURACY_MARGINS` (``rounds_to_acc_0.01``, ``settled_acc_0.01``, ...).

    Read from the run's metrics and the central model's accuracy in its summary
    (``summary["optimum"]["train_accuracy"]``); None where either is unknown or the
    level is not reached.
    """
    central = (outcome.summary.get("optimum") or {}).get("train_accuracy")
    try:
        iterations = outcome.result.column("iteration")
        accuracy = outcome.result.column("train_accuracy")
    except (AttributeError, KeyError):
        return accuracy_levels(np.zeros(0), np.zeros(0), None)
    return accuracy_levels(iterations, accuracy, central)


def accuracy_levels(iterations, accuracy, central: float | None) -> dict[str, float | None]:
    """:func:`accuracy_reach` of a training accuracy curve and the central model's accuracy."""
    from hyfl.runtime.simulation import first_round_at_least, settled_round_below

    keys = [f"{kind}_acc_{m:g}" for m in ACCURACY_MARGINS for kind in ("rounds_to", "settled")]
    accuracy = np.asarray(accuracy, dtype=float)
    if (central is None or not np.isfinite(central) or accuracy.size == 0
            or not np.isfinite(accuracy).any()):
        return dict.fromkeys(keys)
    reach: dict[str, float | None] = {}
    for m in ACCURACY_MARGINS:
        level = float(central) - m - 1e-12  # an accuracy is k/N: equal is reached
        reach[f"rounds_to_acc_{m:g}"] = first_round_at_least(iterations, accuracy, level)
        # at least the level throughout <=> -accuracy at most -level throughout (NaN: not)
        reach[f"settled_acc_{m:g}"] = settled_round_below(iterations, -accuracy, -level)
    return reach


def plain_label(value):
    """A class label as an int when it is a whole number (1.0 -> 1); text stays text."""
    if isinstance(value, str):
        return value
    number = float(value)
    return int(number) if number.is_integer() else number


CONVERGENCE_COLUMNS = (
    "algorithm",
    "final_relative_loss",
    "best_val_accuracy",
    "best_val_auc",
    "rounds_to_1e-1",
    "rounds_to_1e-2",
    "rounds_to_1e-3",
    "settled_1e-2",
    "settled_1e-3",
    "round_trips",
    "median_round_ms",
    *(f"rounds_to_auc_{level:g}" for level in AUC_TARGETS),
    *(f"{kind}_acc_{m:g}" for m in ACCURACY_MARGINS for kind in ("rounds_to", "settled")),
)


COST_SUMMARY_COLUMNS = (
    "algorithm",
    "engine",
    "sim_time",
    "bytes_up",
    "bytes_down",
    "encryptions",
    "decryptions",
    *(f"{component}_per_iter" for component in TIME_COMPONENTS),
)
"""Final cumulative costs, then the mean seconds per outer iteration of each component."""


SUMMARY_COLUMNS = CONVERGENCE_COLUMNS + COST_SUMMARY_COLUMNS[1:]


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
                "best_val_auc": s.get("best_val_auc"),  # (absent from older run.json files)
                "rounds_to_1e-1": reach["0.1"],
                "rounds_to_1e-2": reach["0.01"],
                "rounds_to_1e-3": reach["0.001"],
                "settled_1e-2": s["settled_at_relative_loss"]["0.01"],
                "settled_1e-3": s["settled_at_relative_loss"]["0.001"],
                "round_trips": s["final"]["round_trips"],
                "median_round_ms": 1e3 * s["median_round_seconds"],
                **{f"rounds_to_auc_{level:g}": s.get("rounds_to_val_auc", {}).get(f"{level:g}")
                   for level in AUC_TARGETS},
                **accuracy_reach(o),
                "engine": s["engine"],
                **{
                    key: s["costs"]["totals"][key]
                    for key in ("sim_time", "bytes_up", "bytes_down", "encryptions", "decryptions")
                },
                **{f"{key}_per_iter": s["costs"]["per_iteration"][key] for key in TIME_COMPONENTS},
            }
        )
    return rows


def write_comparison(outcomes: list[RunOutcome], out: Path) -> None:
    rows = summary_rows(outcomes)
    with atomic_write(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows({k: _summary_value(k, v) for k, v in r.items()} for r in rows)
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(format_cell(r[c]) for c in SUMMARY_COLUMNS) + " |")
    write_text(out / "summary.md", "\n".join(lines) + "\n")


def format_cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def run_title(spec: RunSpec, encrypted: bool = False) -> str:
    """Plot title; names the cipher when (some) runs are really encrypted. A data file is
    named by its file name, not its whole path."""
    data = Path(spec.data).name if Path(spec.data).is_file() else spec.data
    title = f"{data}, {spec.partition_spec()}, participation {spec.participation_spec()}"
    return f"{title}, HyFDCA encrypted with {spec.cipher}" if encrypted else title


def cost_title(outcomes: list[RunOutcome], spec: RunSpec, title: str) -> str:
    """Cost plot title: the latency and what priced the HE operations (one line per source)."""
    labels = []
    for o in outcomes:
        label = he_label(o.result.config.get("costs"), spec.he_costs)
        if label not in labels:
            labels.append(label)
    return f"{title}\nlatency {float(spec.latency):g} s per round trip, {'; '.join(labels)}"


SEED_AGGREGATED_COLUMNS = tuple(c for c in SUMMARY_COLUMNS if c not in ("algorithm", "engine"))


def write_experiment_summary(config, outcomes: list[RunOutcome], out: Path) -> list[dict[str, Any]]:
    """``summary.csv``/``summary.md`` (and ``summary_seeds.csv``), ``compare.png``, ``costs.png``.

    With one seed the summary is :func:`write_comparison`'s. With several,
    ``summary_seeds.csv`` has every run's row (with its seed) and
    ``summary.csv`` one row per algorithm: ``n_seeds`` and, for every numeric
    column, ``<column>_mean`` and ``<column>_std`` (sample standard deviation,
    0 for one value), empty when some seed has no value (e.g. a tolerance not
    reached). The plots show the first seed's runs.
    """
    from hyfl.experiments.plots import plot_cost_breakdown, plot_runs

    seeds = list(config.experiment.seeds)
    if len(seeds) == 1:
        write_comparison(outcomes, out)
        rows = summary_rows(outcomes)
    else:
        per_run = [{"seed": o.spec.seed, **row} for o, row in zip(outcomes, summary_rows(outcomes))]
        columns = ["algorithm", "seed", *SUMMARY_COLUMNS[1:]]
        _write_csv(out / "summary_seeds.csv", columns, per_run)
        rows = aggregate_seeds(per_run)
        agg_columns = ["algorithm", "engine", "n_seeds"] + [
            f"{c}_{stat}" for c in SEED_AGGREGATED_COLUMNS for stat in ("mean", "std")
        ]
        _write_csv(out / "summary.csv", agg_columns, rows)
        header = ["algorithm", "engine", "seeds", *SEED_AGGREGATED_COLUMNS]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in rows:
            cells = [r["algorithm"], r["engine"], str(r["n_seeds"])]
            for c in SEED_AGGREGATED_COLUMNS:
                mean, std = r[f"{c}_mean"], r[f"{c}_std"]
                cells.append("-" if mean is None else f"{format_cell(mean)} ± {format_cell(std)}")
            lines.append("| " + " | ".join(cells) + " |")
        write_text(
            out / "summary.md",
            f"Mean ± sample standard deviation over seeds {seeds}.\n\n" + "\n".join(lines) + "\n"
        )
    first = [o for o in outcomes if o.spec.seed == seeds[0]]
    if first:
        runs = {o.summary["algorithm"]: o.result for o in first}
        encrypted = any(o.summary.get("engine") == "protocol" for o in first)
        title = run_title(first[0].spec, encrypted)
        if len(seeds) > 1:
            title += f", seed {seeds[0]}"
        plot_runs(runs, out / "compare.png", title=title)
        plot_cost_breakdown(runs, out / "costs.png",
                            title=cost_title(first, first[0].spec, title))
    return rows


def aggregate_seeds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per algorithm: mean and sample std of every numeric summary column."""
    by_algorithm: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_algorithm.setdefault(row["algorithm"], []).append(row)
    out = []
    for name, group in by_algorithm.items():
        agg: dict[str, Any] = {
            "algorithm": name,
            "engine": group[0].get("engine"),
            "n_seeds": len(group),
        }
        for column in SEED_AGGREGATED_COLUMNS:
            values = [row.get(column) for row in group]
            if any(v is None or not np.isfinite(v) for v in values):
                agg[f"{column}_mean"] = agg[f"{column}_std"] = None
                continue
            values = np.asarray(values, dtype=float)
            agg[f"{column}_mean"] = float(values.mean())
            agg[f"{column}_std"] = float(values.std(ddof=1)) if values.size > 1 else 0.0
        out.append(agg)
    return out


def _write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    with atomic_write(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows({k: _summary_value(k, r.get(k)) for k in columns} for r in rows)


def _summary_value(column: str, value: Any) -> Any:
    """A summary cell for the CSV: counts (rounds, bytes, HE operations) as integers."""
    if value is None:
        return ""
    counts = column in INTEGER_COLUMNS or column in ("n_seeds", "seed") or column.startswith(
        ("rounds_to_", "settled_"))
    counts = counts and not column.endswith(("_mean", "_std"))
    if counts and isinstance(value, float) and value.is_integer():
        return int(value)
    # Text (an algorithm's, a data set's or a party's name) may come from a file: no
    # formula a spreadsheet would run (OWASP).
    return csv_text(value)


def environment() -> dict[str, Any]:
    """Versions, machine and source revision, for ``environment.json``."""
    from importlib import metadata

    versions = {}
    for package in ("hyfl", "numpy", "scipy", "scikit-learn", "phe", "gmpy2", "pandas", "pyarrow"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    versions["hyfl"] = versions["hyfl"] or __version__
    try:
        available = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        available = os.cpu_count()
    return {
        "date": timestamp(),
        "versions": versions,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_available": available,
        "git": _git_revision(),
    }


def timestamp() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_revision() -> dict[str, Any] | None:
    """Commit (and whether tracked files differ from it) of hyfl's source, if in a git checkout."""
    import subprocess

    source = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())} if commit else None


def metric_columns(rows: list[dict[str, float]], first=METRIC_COLUMNS) -> list[str]:
    """``first`` (default :data:`METRIC_COLUMNS`) in order, then the other columns of
    ``rows`` alphabetically."""
    extra = sorted({k for row in rows for k in row} - set(first))
    return list(first) + extra


def write_outputs(
    outcome: RunOutcome, out_dir: Path, plot: bool = True, extra: dict | None = None
) -> Path:
    """Write ``metrics.csv``, ``metrics.parquet``, ``model.npz``, ``run.json`` and ``loss.png``.

    ``loss.png`` only with ``plot``; ``model.npz`` (the final weights, see
    :mod:`hyfl.model_file`) when the outcome has a model (a run loaded back from
    its folder has none, and its ``model.npz`` is left as it is).

    ``metrics.csv`` and ``metrics.parquet`` hold the same table: the columns
    :data:`METRIC_COLUMNS` in that order (the cumulative costs among them),
    then the engine's extra round statistics in alphabetical order, as
    int64 for the counts of :data:`INTEGER_COLUMNS` (written ``10``, not
    ``10.0``) and float64 for the others (missing values empty in the CSV, NaN
    in Parquet). ``run.json``
    records the spec, the algorithm, the engine, the cipher, the cost model,
    the budget and what ended the run (``stopped_by``: ``iterations`` or
    ``sim_time``), the rounds at which it was resumed, and, for protocol
    runs, the set-up costs (encryptions, bytes) that precede the first round;
    ``extra`` adds entries (config runs: ``overrides``, the values that
    command-line flags set over the config file).
    """
    import pandas as pd

    from hyfl.experiments.plots import plot_runs

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = outcome.result.metrics
    # the neural engine has its own columns (no objective gap, no HE counts)
    columns = metric_columns(rows, outcome.result.config.get("metric_columns", METRIC_COLUMNS))
    values = {k: np.array([_float(row.get(k)) for row in rows], dtype=float) for k in columns}
    for k in integer_columns(values):
        values[k] = values[k].astype(np.int64)
    with atomic_write(out_dir / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for i in range(len(rows)):
            writer.writerow({k: _csv_value(values[k][i]) for k in columns})
    table = pd.DataFrame(values, columns=columns)
    _atomic_parquet(table, out_dir / "metrics.parquet")
    config = outcome.result.config
    record = {
        "hyfl_version": __version__,
        "label": outcome.summary.get("algorithm", outcome.spec.algorithm),
        "seed": outcome.spec.seed,
        "spec": asdict(outcome.spec),
        "algorithm": config["algorithm"],
        "engine": config.get("engine", "simulation"),
        "cipher": config.get("cipher"),
        "costs": config.get("costs"),
        "budget": config.get("budget", outcome.spec.budget()),
        "stopped_by": config.get("stopped_by", "iterations"),
        "rounds": config.get("rounds", len(outcome.result.round_times)),
        "resumed_from": config.get("resumed_from", []),
        "optimum_primal": config.get("optimum_primal"),
        "summary": outcome.summary,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "numpy": np.__version__,
        },
    }
    if "setup" in outcome.result.config:
        record["setup"] = outcome.result.config["setup"]
    if outcome.model is not None:
        from hyfl.model_file import MODEL_FILE, save_model

        save_model(out_dir / MODEL_FILE, outcome.model)
    record.update(extra or {})
    write_json(out_dir / "run.json", record)
    if plot:
        plot_runs(
            {outcome.spec.algorithm: outcome.result},
            out_dir / "loss.png",
            title=run_title(outcome.spec, encrypted=record["engine"] == "protocol"),
        )
    return out_dir


def _float(v: Any) -> float:
    return np.nan if v is None else float(v)


def _atomic_parquet(table, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    table.to_parquet(tmp, index=False)
    os.replace(tmp, path)


#: Metric columns that count things (iterations, round trips, bytes, HE operations).
INTEGER_COLUMNS = (
    "iteration", "round_trips", "bytes_up", "bytes_down", "encryptions", "decryptions",
    "additions",
)


def integer_columns(values: dict[str, np.ndarray]) -> list[str]:
    """The columns of :data:`INTEGER_COLUMNS` in ``values`` whose every value is a whole number.

    Parameters
    ----------
    values : dict of str to ndarray
        Column name -> float values (NaN where missing).

    Returns
    -------
    list of str
        The columns to write as integers (a column with a missing value stays float).
    """
    return [
        k for k in INTEGER_COLUMNS
        if k in values and np.all(np.isfinite(values[k])) and np.all(values[k] % 1 == 0)
    ]


def _csv_value(v) -> str:
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else repr(float(v))


def json_default(obj):
    """``json.dumps`` fallback for NumPy scalars and arrays (anything else as text)."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)
