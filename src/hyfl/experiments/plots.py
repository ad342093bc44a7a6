"""Plots of runs.

* :func:`plot_runs`: relative loss (log scale) and validation accuracy against
  outer iterations and, when the runs carry costs, against simulated time.
* :func:`plot_cost_breakdown`: mean time per outer iteration split into client
  compute, server compute, latency and encryption, one stacked bar per run
  (like Figure 4 of the HyFDCA paper).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hyfl.costs import TIME_COMPONENTS
from hyfl.runtime.simulation import RunResult

COMPONENT_LABELS = {
    "time_client": "client compute",
    "time_server": "server compute",
    "time_latency": "latency",
    "time_encryption": "encryption",
}
COMPONENT_COLORS = {
    "time_client": "tab:blue",
    "time_server": "tab:orange",
    "time_latency": "tab:gray",
    "time_encryption": "tab:red",
}
LOG_SPREAD = 100.0
"""Log scale when the largest value is more than this many times the smallest."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _spread(values) -> float:
    values = np.asarray([v for v in values if np.isfinite(v) and v > 0], dtype=float)
    return float(values.max() / values.min()) if values.size else 1.0


def _has_time(run: RunResult) -> bool:
    sim = run.column("sim_time")
    return bool(np.isfinite(sim).any() and np.nanmax(sim) > 0)


def plot_runs(
    runs: dict[str, RunResult],
    path: str | Path,
    title: str = "",
    against_time: bool = True,
) -> Path:
    """Write a PNG with relative loss and (if available) validation accuracy.

    The first column is against outer iterations; with ``against_time`` and
    runs that carry a simulated time (``sim_time``), a second column shows the
    same curves against it (log-scaled when the runs' final times differ by
    more than a factor :data:`LOG_SPREAD`).

    Parameters
    ----------
    runs : dict of label -> RunResult
    path : path of the PNG to write
    title : str
    against_time : bool, default True
    """
    plt = _pyplot()
    has_val = any(np.isfinite(r.column("val_accuracy")).any() for r in runs.values())
    has_time = against_time and any(_has_time(r) for r in runs.values())
    n_rows = 2 if (has_val and has_time) else 1
    n_cols = 2 if (has_val or has_time) else 1
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(5.5 * n_cols, 4 * n_rows), squeeze=False
    )
    # (axis, x column, what) for each panel
    if has_time:
        panels = [(axes[0, 0], "iteration", "loss"), (axes[0, 1], "sim_time", "loss")]
        if has_val:
            panels += [(axes[1, 0], "iteration", "val"), (axes[1, 1], "sim_time", "val")]
    else:
        panels = [(axes[0, 0], "iteration", "loss")]
        if has_val:
            panels.append((axes[0, 1], "iteration", "val"))
    log_time = has_time and _spread(r.column("sim_time")[-1] for r in runs.values()) > LOG_SPREAD

    for ax, x_name, what in panels:
        log_x = x_name == "sim_time" and log_time
        for label, run in runs.items():
            x = run.column(x_name)
            keep = np.isfinite(x) & ((x > 0) if log_x else True)
            if what == "loss":
                _plot_loss(ax, run, label, x, keep)
            else:
                ax.plot(x[keep], run.column("val_accuracy")[keep], label=label)
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel("outer iteration" if x_name == "iteration" else "simulated time (s)")
        if what == "loss":
            ax.set_yscale("log")
            ax.set_ylabel("relative loss (P - P*) / P*")
            ax.set_ylim(bottom=max(ax.get_ylim()[0], 1e-12))
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="small")
        else:
            ax.set_ylabel("validation accuracy")
            ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_loss(ax, run: RunResult, label: str, x: np.ndarray, keep: np.ndarray) -> None:
    rel = run.column("relative_loss")
    positive = keep & (rel > 0)
    (line,) = ax.plot(x[positive], rel[positive], label=label)
    # The duality gap over P* bounds the relative loss of both iterates.
    optimum = run.config.get("optimum_primal")
    gap = run.column("gap") / optimum if optimum else np.full_like(rel, np.nan)
    shown = keep & np.isfinite(gap) & (gap > 0)
    if shown.any():
        ax.plot(
            x[shown],
            gap[shown],
            "--",
            color=line.get_color(),
            alpha=0.7,
            label=f"{label}: duality gap / P*",
        )


def time_breakdown(run: RunResult) -> dict[str, float]:
    """Mean seconds per outer iteration of each time component (from the final row)."""
    final = run.final
    iterations = max(float(final.get("iteration", 0.0)), 1.0)
    return {key: float(final.get(key, 0.0)) / iterations for key in TIME_COMPONENTS}


def plot_cost_breakdown(
    runs: dict[str, RunResult],
    path: str | Path,
    title: str = "",
    log: bool | None = None,
) -> Path:
    """Write a stacked bar chart of the mean time per outer iteration, one bar per run.

    Each bar is split into client compute, server compute, latency and
    encryption (the components of ``sim_time``) and labeled with its total.
    ``log=None`` chooses a log scale when the bar totals differ by more than
    a factor :data:`LOG_SPREAD` (e.g. encrypted HyFDCA next to plaintext
    baselines); on a log scale the segments keep their order but only the
    boundaries between them (cumulative sums) are to scale.

    Parameters
    ----------
    runs : dict of label -> RunResult
    path : path of the PNG to write
    title : str
    log : bool or None, default None (automatic)
    """
    plt = _pyplot()
    labels = list(runs)
    parts = {label: time_breakdown(run) for label, run in runs.items()}
    totals = np.array([sum(parts[label].values()) for label in labels])
    if log is None:
        log = _spread(totals) > LOG_SPREAD
    positive = [v for p in parts.values() for v in p.values() if v > 0]
    floor = min(positive) / 2 if (log and positive) else 0.0

    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(labels) + 3), 4.5))
    x = np.arange(len(labels))
    bottom = np.full(len(labels), floor)
    for key in TIME_COMPONENTS:
        heights = np.array([parts[label][key] for label in labels])
        ax.bar(
            x,
            heights,
            bottom=bottom,
            width=0.6,
            label=COMPONENT_LABELS[key],
            color=COMPONENT_COLORS[key],
        )
        bottom = bottom + heights
    for xi, total, top in zip(x, totals, bottom):
        ax.annotate(
            _seconds(total),
            (xi, top),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize="small",
        )
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=20 if len(labels) > 4 else 0)
    ax.set_ylabel("seconds per outer iteration" + (" (log scale)" if log else ""))
    if log and positive:
        ax.set_yscale("log")
        ax.set_ylim(bottom=floor, top=max(bottom.max(), floor) * 4)
    else:
        ax.set_ylim(bottom=0, top=max(float(bottom.max()), 1e-12) * 1.15)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _seconds(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f} s"
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{1e3 * value:.3g} ms"
    return f"{1e6 * value:.3g} µs"
