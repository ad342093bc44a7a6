"""Plots of runs: relative loss (log scale) and validation accuracy per outer iteration."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hyfl.runtime.simulation import RunResult


def plot_runs(runs: dict[str, RunResult], path: str | Path, title: str = "") -> Path:
    """Write a PNG with relative loss and (if available) validation accuracy.

    Parameters
    ----------
    runs : dict of label -> RunResult
    path : path of the PNG to write
    title : str
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_val = any(np.isfinite(r.column("val_accuracy")).any() for r in runs.values())
    fig, axes = plt.subplots(
        1, 2 if has_val else 1, figsize=(11 if has_val else 6, 4), squeeze=False
    )
    ax_loss = axes[0, 0]
    for label, run in runs.items():
        it = run.column("iteration")
        rel = run.column("relative_loss")
        positive = rel > 0
        (line,) = ax_loss.plot(it[positive], rel[positive], label=label)
        # The duality gap over P* bounds the relative loss of both iterates.
        optimum = run.config.get("optimum_primal")
        gap = run.column("gap") / optimum if optimum else np.full_like(rel, np.nan)
        shown = np.isfinite(gap) & (gap > 0)
        if shown.any():
            ax_loss.plot(
                it[shown],
                gap[shown],
                "--",
                color=line.get_color(),
                alpha=0.7,
                label=f"{label}: duality gap / P*",
            )
        if has_val:
            axes[0, 1].plot(it, run.column("val_accuracy"), label=label)
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("outer iteration")
    ax_loss.set_ylabel("relative loss (P - P*) / P*")
    ax_loss.set_ylim(bottom=max(ax_loss.get_ylim()[0], 1e-12))
    ax_loss.grid(True, which="both", alpha=0.3)
    ax_loss.legend()
    if has_val:
        axes[0, 1].set_xlabel("outer iteration")
        axes[0, 1].set_ylabel("validation accuracy")
        axes[0, 1].grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
