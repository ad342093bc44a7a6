"""Plots of runs, in the style of the HyFDCA paper (sections 5.2 and 7.4-7.5).

Quick plots of fresh runs (``hyfl run`` / ``hyfl compare``):

* :func:`plot_runs`: relative loss (log scale) and validation accuracy against
  outer iterations and, when the runs carry costs, against simulated time.
* :func:`plot_cost_breakdown`: mean time per outer iteration split into client
  compute, server compute, latency and encryption, one stacked bar per run
  on a linear axis so heights are proportional to seconds (like Figure 4 of
  the paper; ``log=True`` puts the components side by side on a log axis);
  :func:`plot_cost_breakdown_settings` does the same with one group of bars
  per setting (Tables 6-8 as a chart).

Paper-style plots of finished results (``hyfl report``):

* :func:`moving_average` and :func:`paper_window`: the paper's smoothing (a
  trailing moving average of width omega = 50 / 150 / 300 outer iterations for
  MNIST / News20 / Covtype at equal outer iterations, 1% of the outer
  iterations at equal wall time; omega < 2 is not smoothed).
* :func:`relative_time` (eq. 14, ``T_R = T / max_k T_k``) and
  :func:`relative_iteration` (eq. 15, ``t_R = t / (t_max - omega)``).
* :func:`plot_setting`: one setting's relative loss and validation accuracy
  against relative outer iteration or relative simulated time, on axes you
  give; :func:`plot_setting_figure` writes a PNG of both x axes;
  :func:`plot_settings_grid`: the grid of Figure 3 (rows = client counts,
  columns = participation fractions, a loss and an accuracy panel per cell).

Loading the results folders these draw is :mod:`hyfl.experiments.results`'.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hyfl.costs import TIME_COMPONENTS
from hyfl.errors import check_choice, fail
from hyfl.experiments.results import (
    LoadedRun,
    natural_key,
    optimum_primal_of,
)

if TYPE_CHECKING:  # pragma: no cover

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

PAPER_WINDOWS = {"mnist": 50, "news20": 150, "covtype": 300}
"""The paper's moving-average windows (outer iterations) at equal outer iterations."""
STAND_INS = {"reuters": "news20", "ijcnn1": "covtype"}
"""Datasets standing in for the paper's (see ``hyfl.data.registry``)."""
WINDOW_CAP_FRACTION = 0.02
"""At most this fraction of a run is one window (the paper's largest: 50 of MNIST's 2,500)."""
EQUAL_TIME_FRACTION = 0.01
"""At equal wall time the window is this fraction of the run's outer iterations."""

X_AXES = ("iteration", "sim_time")
ALGORITHM_COLORS = {"hyfdca": "tab:blue", "fedavg": "tab:orange", "hyfem": "tab:green"}
_OTHER_COLORS = (
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "tab:gray",
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------- the paper's maths


def moving_average(values: Iterable[float], window: int) -> np.ndarray:
    """Trailing moving average of ``window`` values, NaN-safe (the paper's smoothing).

    ``out[i]`` is the mean of the finite values among
    ``values[max(0, i - window + 1) : i + 1]`` (fewer than ``window`` at the
    start), NaN when none is finite. ``window < 2`` returns the values
    unchanged (as floats). Vectorized: running sums restarted every
    ``window`` values, so rounding errors stay relative to the values near
    ``i`` rather than to the whole history (curves fall over many decades).
    """
    v = np.array(values, dtype=float).ravel()
    window = int(window)
    if window < 2 or v.size == 0:
        return v
    n = v.size
    finite = np.isfinite(v)
    pad = (-n) % window
    blocks = np.concatenate([np.where(finite, v, 0.0), np.zeros(pad)]).reshape(-1, window)
    counts = np.concatenate([finite.astype(np.int64), np.zeros(pad, np.int64)])
    counts = counts.reshape(-1, window)
    prefix = np.cumsum(blocks, axis=1)  # sums within each block
    cprefix = np.cumsum(counts, axis=1)
    totals, ctotals = prefix[:, -1], cprefix[:, -1]
    prefix, cprefix = prefix.ravel()[:n], cprefix.ravel()[:n]
    i = np.arange(n)
    block = i // window
    lo = i - window + 1  # first index of the window (may be < 0)
    # lo <= 0 or lo == the block's start: the window is the block of i up to i.
    # Otherwise it is the tail of the previous block from lo, plus the block of i up to i.
    straddles = (lo > 0) & (lo < block * window)
    prev = np.maximum(block - 1, 0)
    before = np.maximum(lo - 1, 0)
    total = prefix + np.where(straddles, totals[prev] - prefix[before], 0.0)
    count = cprefix + np.where(straddles, ctotals[prev] - cprefix[before], 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _dataset_key(dataset: str | None) -> str | None:
    if not dataset:
        return None
    name = str(dataset).strip().lower()
    for key in (*PAPER_WINDOWS, *STAND_INS):
        if name.startswith(key):  # also news20.binary, covtype_binary, mnist-quadrant, ...
            return STAND_INS.get(key, key)
    return None


def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def paper_window(
    dataset: str | None, n_iterations: float, equal_time: bool, *, cap: bool = True
) -> int:
    """The paper's moving-average window omega, in outer iterations (1 = not smoothed).

    * Equal outer iterations: 50 for MNIST, 150 for News20 (and its stand-in
      ``reuters``), 300 for Covtype (and its stand-in ``ijcnn1``). With
      ``cap`` (default) the window is at most :data:`WINDOW_CAP_FRACTION`
      (2%) of the run, the largest share the paper used (50 of MNIST's 2,500;
      150 of News20's 10,000 and 300 of Covtype's 30,000 are below it), so
      the paper's runs get exactly the paper's windows and shorter runs are
      not flattened. Another dataset gets the equal-time rule.
    * Equal wall time: the rounded integer of 1% of ``n_iterations``.

    A window below 2 means no smoothing and is returned as 1.
    """
    n = max(float(n_iterations), 0.0)
    key = _dataset_key(dataset)
    if equal_time or key is None:
        window = _round_half_up(EQUAL_TIME_FRACTION * n)
    else:
        window = PAPER_WINDOWS[key]
        if cap:
            window = min(window, _round_half_up(WINDOW_CAP_FRACTION * n))
    return window if window >= 2 else 1


def relative_time(runs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Eq. 14: each run's simulated time over the longest run's total time.

    ``T_R = T / max_k T_k`` where ``T_k`` is run k's total (final) simulated
    time (``sim_time``). ``runs`` maps labels to runs (``LoadedRun``,
    ``RunResult``) or directly to arrays of times.

    Raises
    ------
    HyflError
        When no run has a positive simulated time.
    """
    times = {}
    for name, run in runs.items():
        times[name] = (
            run.column("sim_time") if hasattr(run, "column") else np.asarray(run, dtype=float)
        )
    totals = [np.nanmax(t) for t in times.values() if np.isfinite(t).any()]
    longest = max(totals, default=math.nan)
    if not (math.isfinite(longest) and longest > 0):
        raise fail(
            "runs",
            "have no simulated time (sim_time is missing or zero)",
            "Plot against outer iterations, or re-run with the cost model on "
            "(--latency, --he-costs).",
        )
    return {name: t / longest for name, t in times.items()}


def relative_iteration(t: Any, t_max: float, window: float) -> np.ndarray | float:
    """Eq. 15: ``t_R = t / (t_max - omega)``, the share of outer iterations completed.

    ``window`` is omega, the moving average's width in outer iterations;
    below 2 (not smoothed) it counts as 0. The smoothed curve, placed at the
    start of each window (the 'valid' part of the moving average), then runs
    from 0 to 1.
    """
    omega = float(window) if float(window) >= 2 else 0.0
    span = float(t_max) - omega
    if not span > 0:
        raise fail(
            "relative_iteration",
            f"needs t_max > window, got t_max={t_max!r}, window={window!r}",
            "Use a smaller moving-average window or a longer run.",
        )
    out = np.asarray(t, dtype=float) / span
    return float(out) if out.ndim == 0 else out


# --------------------------------------------------------------------------- helpers


def _spread(values) -> float:
    values = np.asarray([v for v in values if np.isfinite(v) and v > 0], dtype=float)
    return float(values.max() / values.min()) if values.size else 1.0


def carries_time(run) -> bool:
    sim = run.column("sim_time")
    return bool(np.isfinite(sim).any() and np.nanmax(sim) > 0)


def _has_values(run, name: str) -> bool:
    return bool(np.isfinite(run.column(name)).any())


def algorithm_colors(names: Iterable[str]) -> dict[str, str]:
    """A fixed color per algorithm: HyFDCA blue, FedAvg orange, HyFEM green, others after."""
    colors: dict[str, str] = {}
    others = iter(_OTHER_COLORS * 10)
    for name in names:
        if name in colors:
            continue
        colors[name] = ALGORITHM_COLORS.get(name.lower()) or next(others)
    return colors


def display_name(name: str) -> str:
    """``hyfdca`` -> ``HyFDCA`` etc. for the paper's algorithms; others unchanged."""
    return {"hyfdca": "HyFDCA", "fedavg": "FedAvg", "hyfem": "HyFEM"}.get(name.lower(), name)


def _save(fig, path: str | Path) -> Path:
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- quick plots


def majority_rate(runs: Mapping[str, Any] | Any) -> float | None:
    """The accuracy of always predicting the training set's most frequent class.

    Read from a run's ``config["majority_rate"]`` (a fresh
    :class:`~hyfl.runtime.simulation.RunResult` of :func:`hyfl.experiments.runner.run_prepared`)
    or ``config["summary"]["majority_rate"]`` (``run.json``); given a mapping
    of runs, the first one that records it. None when no run records it
    (regression, or results written before it was recorded).
    """
    items = runs.values() if isinstance(runs, Mapping) else (runs,)
    for run in items:
        config = getattr(run, "config", None) or {}
        summary = config.get("summary") if isinstance(config.get("summary"), dict) else {}
        value = config.get("majority_rate", summary.get("majority_rate"))
        try:
            value = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            return value
    return None


def _draw_majority(ax, runs: Mapping[str, Any], text: bool = True) -> Any:
    """A dashed line at the majority-class rate on an accuracy axis (None without one).

    A run whose accuracy sits on this line has learned nothing beyond the
    class balance (ijcnn1: 0.905), which a bare accuracy curve hides.
    """
    rate = majority_rate(runs)
    if rate is None:
        return None
    line = ax.axhline(
        rate,
        color="0.35",
        linestyle="--",
        linewidth=1,
        label=f"majority class ({rate:.3g})",
        gid="majority_rate",
        zorder=1,
    )
    if text:
        ax.annotate(
            f"majority class {rate:.3g}",
            (0.01, rate),
            xycoords=("axes fraction", "data"),
            xytext=(0, 2),
            textcoords="offset points",
            fontsize="x-small",
            color="0.35",
            va="bottom",
        )
    return line


def _with_majority(handles: list, names: list[str], *groups: Mapping[str, Any]):
    """Legend entries plus one for the dashed majority-class line when a run records it."""
    rates = {r for g in groups if (r := majority_rate(g)) is not None}
    if not rates:
        return handles, names
    from matplotlib.lines import Line2D

    shown = f"{rates.pop():.3g}" if len(rates) == 1 else "per panel"
    handle = Line2D([], [], color="0.35", linestyle="--", linewidth=1)
    return [*handles, handle], [*names, f"majority class ({shown}), dashed"]


def plot_runs(
    runs: Mapping[str, RunResult | LoadedRun],
    path: str | Path,
    title: str = "",
    against_time: bool = True,
) -> Path:
    """Write a PNG with relative loss and (if available) validation accuracy.

    The first column is against outer iterations; with ``against_time`` and
    runs that carry a simulated time (``sim_time``), a second column shows the
    same curves against it (log-scaled when the runs' final times differ by
    more than a factor :data:`LOG_SPREAD`). Curves are not smoothed (see
    :func:`plot_setting` for the paper's style).

    Parameters
    ----------
    runs : dict of label -> RunResult or LoadedRun
    path : path of the PNG to write
    title : str
    against_time : bool, default True
    """
    plt = _pyplot()
    has_val = any(_has_values(r, "val_accuracy") for r in runs.values())
    has_time = against_time and any(carries_time(r) for r in runs.values())
    n_rows = 2 if (has_val and has_time) else 1
    n_cols = 2 if (has_val or has_time) else 1
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(5.5 * n_cols, 4 * n_rows), squeeze=False)
    # (axis, x column, what) for each panel
    if has_time:
        panels = [(axes[0, 0], "iteration", "loss"), (axes[0, 1], "sim_time", "loss")]
        if has_val:
            panels += [(axes[1, 0], "iteration", "val"), (axes[1, 1], "sim_time", "val")]
    else:
        panels = [(axes[0, 0], "iteration", "loss")]
        if has_val:
            panels.append((axes[0, 1], "iteration", "val"))
    log_time = (
        has_time
        and _spread(
            np.nanmax(r.column("sim_time")) if carries_time(r) else np.nan for r in runs.values()
        )
        > LOG_SPREAD
    )

    for ax, x_name, what in panels:
        log_x = x_name == "sim_time" and log_time
        for label, run in runs.items():
            x = run.column(x_name)
            keep = np.isfinite(x) & ((x > 0) if log_x else True)
            if what == "loss":
                _plot_loss(ax, run, label, x, keep)
            else:
                (line,) = ax.plot(x[keep], run.column("val_accuracy")[keep], label=label)
                if _has_values(run, "val_auc"):  # the same run's AUC, dashed in its colour
                    ax.plot(x[keep], run.column("val_auc")[keep], linestyle="--",
                            color=line.get_color(), alpha=0.8)
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel("outer iteration" if x_name == "iteration" else "simulated time (s)")
        if what == "loss":
            ax.set_yscale("log")
            ax.set_ylabel("relative loss (P(w) - P*) / P*")  # (w: the footnote says)
            ax.set_ylim(bottom=max(ax.get_ylim()[0], 1e-12))
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="small")
        else:
            _draw_majority(ax, runs, text=False)  # the legend below names it
            with_auc = any(_has_values(r, "val_auc") for r in runs.values())
            ax.set_ylabel("validation accuracy" + (" (solid), AUC (dashed)" if with_auc
                                                   else ""))
            ax.set_ylim(*_accuracy_limits(runs))
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if any(_has_values(r, "model") and np.nanmax(r.column("model")) > 0 for r in runs.values()):
        fig.text(0.01, 0.005, "w is the model the run returns (the server's): HyFDCA's default "
                 "reports the better certified of its last iterate and its running average.",
                 fontsize="x-small", alpha=0.8)
        fig.subplots_adjust(bottom=max(fig.subplotpars.bottom, 0.12))
    return _save(fig, path)


def _accuracy_limits(runs: Mapping[str, Any]) -> tuple[float, float]:
    """Accuracy axis limits that show where the runs spend their rounds: from a little
    below the majority-class rate or the runs' 5th percentile of accuracy and AUC (not the
    zero model's first-round values, e.g. 0.1 on MNIST, which would flatten every curve)
    to 1."""
    values = np.concatenate([r.column(name)[1:] for r in runs.values()
                             for name in ("val_accuracy", "val_auc") if _has_values(r, name)])
    values = values[np.isfinite(values)]
    low = float(np.percentile(values, 5)) if values.size else 0.0
    majority = majority_rate(runs)
    if majority is not None:
        low = min(low, majority)
    return max(0.0, low - 0.02), 1.0


def _plot_loss(ax, run, label: str, x: np.ndarray, keep: np.ndarray) -> None:
    rel = run.column("relative_loss")
    positive = keep & (rel > 0)
    (line,) = ax.plot(x[positive], rel[positive], label=label)
    # The duality gap over P* bounds the relative loss of both iterates.
    optimum = optimum_primal_of(run)
    gap = run.column("gap") / abs(optimum) if optimum else np.full_like(rel, np.nan)
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


# --------------------------------------------------------------------------- paper-style curves


def window_row_count(iterations: np.ndarray, window: float) -> int:
    """Rows of the metrics table one window of ``window`` outer iterations spans."""
    if window < 2 or iterations.size < 2:
        return 1
    steps = np.diff(iterations[np.isfinite(iterations)])
    steps = steps[steps > 0]
    step = float(np.median(steps)) if steps.size else 1.0
    return int(min(max(_round_half_up(window / step), 1), iterations.size))


def smoothed_curve(
    run, y: str, x: str = "iteration", window: float = 1.0
) -> tuple[np.ndarray, np.ndarray, float]:
    """A run's column ``y`` smoothed the paper's way, against the window starts.

    Returns ``(x_start, y_smoothed, span)``: the trailing moving average of
    ``y`` over ``window`` outer iterations (converted to rows of the metrics
    table, which may be evaluated every few iterations), keeping full windows
    only, each placed at the ``x`` value (iteration or simulated time) where
    its window starts; ``span`` is the outer iterations from the first to the
    last window start's distance to the run's end (omega as eq. 15 uses it;
    0 when not smoothed).
    """
    it = run.column("iteration")
    values = run.column(y)
    xs = it if x == "iteration" else run.column(x)
    rows = window_row_count(it, window)
    smooth = moving_average(values, rows)
    n = values.size
    if n == 0:
        return np.array([]), np.array([]), 0.0
    span = float(it[-1] - it[n - rows]) if rows > 1 else 0.0
    return xs[: n - rows + 1], smooth[rows - 1 :], span


def _run_window(run, x: str, window: float | None, dataset: str | None) -> float:
    if window is not None:
        return float(window)
    ds = dataset or getattr(run, "dataset", None)
    if ds is None:
        spec = (getattr(run, "config", None) or {}).get("spec") or {}
        ds = spec.get("data") if isinstance(spec, dict) else None
    it = run.column("iteration")
    n_iter = float(np.nanmax(it)) if np.isfinite(it).any() else 0.0
    return paper_window(ds, n_iter, equal_time=x == "sim_time")


def plot_setting(
    runs: Mapping[str, RunResult | LoadedRun],
    ax_loss,
    ax_acc=None,
    x: str = "iteration",
    window: float | None = None,
    *,
    dataset: str | None = None,
    colors: Mapping[str, str] | None = None,
    labels: bool = True,
    log_time: bool | None = None,
) -> dict[str, Any]:
    """Draw one setting's curves the paper's way on the given Matplotlib axes.

    Relative loss (log scale, non-positive values left out) on ``ax_loss``
    and validation accuracy on ``ax_acc`` (skipped when None), both smoothed
    with a trailing moving average and plotted at the start of each window:

    * ``x="iteration"``: against relative outer iteration, eq. 15
      ``t / (t_max - omega)`` (``t_max`` the longest run's last iteration);
    * ``x="sim_time"``: against relative simulated time, eq. 14
      ``T / max_k T_k``.

    ``window`` is omega in outer iterations; None picks
    :func:`paper_window` per run from its dataset (``dataset`` overrides the
    one in ``run.json``) and length.

    Against time, ``log_time=None`` uses a log x axis when the runs' total
    times differ by more than a factor :data:`LOG_SPREAD` (runs of equal
    outer iterations, encrypted HyFDCA next to plaintext baselines), and a
    dotted line marks the shortest run's end (the equal-simulated-time
    budget of ``hyfl report``).

    Returns the line of each run (label -> Line2D) for a legend.
    """
    check_choice("x", x, X_AXES)
    colors = dict(colors or algorithm_colors(runs))
    rel_time = relative_time(runs) if x == "sim_time" else None
    finals = [np.nanmax(r.column("iteration")) for r in runs.values()]
    t_max = max((f for f in finals if np.isfinite(f)), default=1.0)
    ends: list[float] = []
    if rel_time is not None:
        ends = [float(np.nanmax(t)) for t in rel_time.values() if np.isfinite(t).any()]
        if log_time is None:
            log_time = _spread(ends) > LOG_SPREAD
    log_x = bool(log_time) and x == "sim_time"
    lines: dict[str, Any] = {}
    for name, run in runs.items():
        omega = _run_window(run, x, window, dataset)
        color = colors.get(name) or algorithm_colors([name])[name]
        xs, loss, span = smoothed_curve(run, "relative_loss", "iteration", omega)
        if x == "iteration":
            xr = relative_iteration(xs, t_max, span) if t_max - span > 0 else xs / max(t_max, 1)
        else:
            xr = rel_time[name][: xs.size]
        shown = np.isfinite(xr) & ((xr > 0) if log_x else True)
        keep = shown & np.isfinite(loss) & (loss > 0)
        marker = "o" if keep.sum() <= 2 else None
        (lines[name],) = ax_loss.plot(
            xr[keep], loss[keep], color=color, label=display_name(name), marker=marker
        )
        if ax_acc is not None:
            _, acc, _ = smoothed_curve(run, "val_accuracy", "iteration", omega)
            keep = shown & np.isfinite(acc)
            ax_acc.plot(
                xr[keep],
                acc[keep],
                color=color,
                label=display_name(name),
                marker="o" if keep.sum() <= 2 else None,
            )
    ax_loss.set_yscale("log")
    ax_loss.grid(True, which="both", alpha=0.3)
    if ends and min(ends) < 0.999:
        for ax in (ax_loss, ax_acc):
            if ax is not None:
                ax.axvline(min(ends), color="0.5", linestyle=":", linewidth=1)
    for ax in (ax_loss, ax_acc):
        if ax is not None and log_x:
            ax.set_xscale("log")
    xlabel = (
        "relative outer iteration t / (t_max - ω)"
        if x == "iteration"
        else "relative simulated time T / max T" + (" (log)" if log_x else "")
    )
    if labels:
        ax_loss.set_ylabel("relative loss")
    if ax_acc is not None:
        _draw_majority(ax_acc, runs, text=labels)
        ax_acc.grid(True, alpha=0.3)
        if not any(_has_values(r, "val_accuracy") for r in runs.values()):
            ax_acc.text(
                0.5,
                0.5,
                "no validation data",
                transform=ax_acc.transAxes,
                ha="center",
                va="center",
                color="gray",
            )
        if labels:
            ax_acc.set_ylabel("validation accuracy")
            ax_acc.set_xlabel(xlabel)
    elif labels:
        ax_loss.set_xlabel(xlabel)
    return lines


def plot_setting_figure(
    runs: Mapping[str, RunResult | LoadedRun],
    path: str | Path,
    title: str = "",
    window: float | None = None,
    *,
    dataset: str | None = None,
    against_time: bool = True,
) -> Path:
    """Write one setting's paper-style PNG: loss (top) and accuracy (bottom),
    against relative outer iteration (left) and, when the runs carry a
    simulated time and ``against_time``, relative simulated time (right).

    ``window`` (omega, outer iterations) applies to both columns; None uses
    :func:`paper_window` (equal-iteration rule on the left, 1% rule on the
    right).
    """
    plt = _pyplot()
    xs = ["iteration"]
    if against_time and any(carries_time(r) for r in runs.values()):
        xs.append("sim_time")
    fig, axes = plt.subplots(
        2,
        len(xs),
        figsize=(5.5 * len(xs), 6.8),
        squeeze=False,
        sharex="col",
        layout="constrained",
    )
    colors = algorithm_colors(runs)
    lines = {}
    for j, x in enumerate(xs):
        lines = plot_setting(
            runs, axes[0, j], axes[1, j], x, window, dataset=dataset, colors=colors
        )
        axes[0, j].set_title(
            "equal outer iterations" if x == "iteration" else "against simulated time",
            fontsize="medium",
        )
    handles, names = _with_majority(list(lines.values()), [display_name(n) for n in lines], runs)
    fig.legend(
        handles,
        names,
        loc="outside lower center",
        ncol=min(len(handles), 3 * len(xs)),
        fontsize="small",
    )
    if title:
        fig.suptitle(title, fontsize="medium")
    return _save(fig, path)


def plot_settings_grid(
    settings: Mapping[tuple[Any, Any], Mapping[str, RunResult | LoadedRun]],
    path: str | Path,
    x: str = "iteration",
    window: float | None = None,
    *,
    title: str = "",
    dataset: str | None = None,
) -> Path:
    """Write a grid like the paper's Figure 3.

    Rows are client counts, columns participation fractions (keys
    ``(clients, fraction)`` of ``settings``, each mapping to one setting's
    runs; either may be a number or a label such as ``grid:3x3``; both are
    sorted naturally). Each cell stacks relative loss (log) over validation
    accuracy, drawn by :func:`plot_setting` against relative outer iteration
    (``x="iteration"``) or relative simulated time (``x="sim_time"``). One
    legend for the figure; each algorithm keeps its color in every cell.
    Cells without a setting stay empty.
    """
    check_choice("x", x, X_AXES)
    if not settings:
        raise fail("settings", "is empty", "Pass at least one (clients, fraction) -> runs.")
    plt = _pyplot()
    rows = sorted({k[0] for k in settings}, key=natural_key)
    cols = sorted({k[1] for k in settings}, key=natural_key)
    names = [n for runs in settings.values() for n in runs]
    colors = algorithm_colors(sorted(set(names), key=names.index))
    fig = plt.figure(figsize=(3.6 * len(cols) + 1.0, 4.2 * len(rows) + 1.0), layout="constrained")
    fig.get_layout_engine().set(hspace=0.02, wspace=0.04)
    outer = fig.add_gridspec(len(rows), len(cols))
    lines: dict[str, Any] = {}
    for i, clients in enumerate(rows):
        for j, fraction in enumerate(cols):
            runs = settings.get((clients, fraction))
            inner = outer[i, j].subgridspec(2, 1)
            ax_loss = fig.add_subplot(inner[0])
            ax_acc = fig.add_subplot(inner[1], sharex=ax_loss)
            if i == 0:
                ax_loss.set_title(_fraction_label(fraction), fontsize="medium")
            if j == 0:
                ax_loss.set_ylabel(f"{_clients_label(clients)}\nrelative loss", fontsize="small")
                ax_acc.set_ylabel("val. accuracy", fontsize="small")
            if i == len(rows) - 1:
                ax_acc.set_xlabel(
                    "relative outer iteration" if x == "iteration" else "relative simulated time",
                    fontsize="small",
                )
            ax_loss.tick_params(labelbottom=False, labelsize="small")
            ax_acc.tick_params(labelsize="small")
            if not runs:
                for ax in (ax_loss, ax_acc):
                    ax.set_facecolor("0.96")
                    ax.set_xticks([])
                    ax.set_yticks([])
                ax_loss.text(
                    0.5,
                    0.5,
                    "not run",
                    transform=ax_loss.transAxes,
                    ha="center",
                    va="center",
                    color="gray",
                )
            elif x == "sim_time" and not any(carries_time(r) for r in runs.values()):
                ax_loss.text(
                    0.5,
                    0.5,
                    "no simulated time",
                    transform=ax_loss.transAxes,
                    ha="center",
                    va="center",
                    color="gray",
                )
            else:
                lines.update(
                    plot_setting(
                        runs,
                        ax_loss,
                        ax_acc,
                        x,
                        window,
                        dataset=dataset,
                        colors=colors,
                        labels=False,
                    )
                )
    order = [n for n in colors if n in lines]
    handles, names = _with_majority(
        [lines[n] for n in order],
        [display_name(n) for n in order],
        *settings.values(),
    )
    fig.legend(
        handles,
        names,
        loc="outside lower center",
        ncol=max(min(len(handles), 2 * len(cols) + 1), 1),
        fontsize="small",
    )
    heading = title or (
        "Equal outer iterations (t / (t_max - ω))"
        if x == "iteration"
        else "Against simulated time (T / max T)"
    )
    fig.suptitle(heading, fontsize="medium")
    return _save(fig, path)


def _clients_label(clients: Any) -> str:
    if isinstance(clients, (int, np.integer)):
        return f"{clients} clients"
    return str(clients)


def _fraction_label(fraction: Any) -> str:
    if isinstance(fraction, (int, float, np.integer, np.floating)):
        return f"participation {float(fraction):g}"
    return f"participation {fraction}"


# --------------------------------------------------------------------------- costs


def time_breakdown(run: Any) -> dict[str, float]:
    """Mean seconds per outer iteration of each time component.

    ``run`` is a run (``RunResult`` / ``LoadedRun``: its final row's
    cumulative times over its final iteration), a final metrics row (a
    mapping with ``time_*`` and ``iteration``), or a summary row (a mapping
    with ``time_*_per_iter``, as in ``summary.csv``). Missing or non-finite
    values count as 0.
    """
    if isinstance(run, Mapping):
        if any(f"{key}_per_iter" in run for key in TIME_COMPONENTS):
            return {key: _float0(run.get(f"{key}_per_iter")) for key in TIME_COMPONENTS}
        final = run
    else:
        final = run.final
    iterations = max(_float0(final.get("iteration", 0.0)), 1.0)
    return {key: _float0(final.get(key, 0.0)) / iterations for key in TIME_COMPONENTS}


def _float0(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) else 0.0


def _breakdowns(runs: Any) -> dict[str, dict[str, float]]:
    """Label -> components from a mapping of runs or a sequence of summary rows."""
    if isinstance(runs, Mapping):
        return {str(label): time_breakdown(run) for label, run in runs.items()}
    out = {}
    for i, row in enumerate(runs):
        if not isinstance(row, Mapping):
            raise fail(
                "plot_cost_breakdown",
                f"got a {type(row).__name__} among the summary rows",
                "Pass a dict of label -> run, or rows of summary.csv (dicts with 'algorithm').",
            )
        out[str(row.get("algorithm", f"run {i + 1}"))] = time_breakdown(row)
    return out


def plot_cost_breakdown(
    runs: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    path: str | Path,
    title: str = "",
    log: bool | None = False,
) -> Path:
    """Write a bar chart of the mean time per outer iteration, one bar (group) per run.

    The default is one stacked bar per run on a *linear* axis, split into
    client compute, server compute, latency and encryption (the components of
    ``sim_time``) and labeled with its total, so every segment's height is
    proportional to its seconds: milliseconds of client compute next to
    minutes of encryption are (correctly) invisible slivers. ``log=True``
    draws the components side by side (unstacked, one thin bar each) on a
    log axis, so small components can be read off without a stacked log bar
    suggesting they are as large as the others.

    Parameters
    ----------
    runs : dict of label -> RunResult or LoadedRun, or summary rows
        Summary rows are mappings with ``algorithm`` and
        ``time_*_per_iter`` (the rows of ``summary.csv``).
    path : path of the PNG to write
    title : str
    log : bool, default False
        Side-by-side bars on a log axis instead of stacked bars on a linear
        one. None means False (it used to pick a stacked log axis, which
        misdraws the segments).
    """
    plt = _pyplot()
    parts = _breakdowns(runs)
    labels = list(parts)
    totals = np.array([sum(parts[label].values()) for label in labels])
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(labels) + 3), 4.5))
    x = np.arange(len(labels))
    rows = [parts[label] for label in labels]
    if log:
        tops = _side_by_side_bars(ax, x, rows, width=0.8)
    else:
        tops = _stack_bars(ax, x, rows, width=0.6)
    for xi, total, top in zip(x, totals, tops):
        ax.annotate(
            ("total " if log else "") + _seconds(total),
            (xi, top),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize="small",
        )
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=20 if len(labels) > 4 else 0)
    _finish_cost_axis(ax, rows, tops, bool(log))
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    return _save(fig, path)


def _stack_bars(
    ax, x, parts: list[dict[str, float]], width: float, legend: bool = True
) -> np.ndarray:
    """Stacked bars from 0; returns each bar's top (its total)."""
    bottom = np.zeros(len(parts))
    for key in TIME_COMPONENTS:
        heights = np.array([p[key] for p in parts])
        ax.bar(
            x,
            heights,
            bottom=bottom,
            width=width,
            label=COMPONENT_LABELS[key] if legend else None,
            color=COMPONENT_COLORS[key],
            gid=f"cost:{key}",
        )
        bottom = bottom + heights
    return bottom


def _side_by_side_bars(
    ax, x, parts: list[dict[str, float]], width: float, legend: bool = True
) -> np.ndarray:
    """One thin bar per component next to each other; returns each group's tallest bar.

    Zero components get no bar: a log axis has no place for 0.
    """
    step = width / len(TIME_COMPONENTS)
    tallest = np.zeros(len(parts))
    for k, key in enumerate(TIME_COMPONENTS):
        heights = np.array([p[key] for p in parts])
        shown = heights > 0
        ax.bar(
            np.asarray(x, dtype=float)[shown] + (k - (len(TIME_COMPONENTS) - 1) / 2) * step,
            heights[shown],
            width=step,
            label=COMPONENT_LABELS[key] if legend else None,
            color=COMPONENT_COLORS[key],
            gid=f"cost:{key}",
        )
        tallest = np.maximum(tallest, heights)
    return tallest


def _finish_cost_axis(ax, parts: list[dict[str, float]], tops: np.ndarray, log: bool) -> None:
    positive = [v for p in parts for v in p.values() if v > 0]
    top = float(tops.max()) if tops.size else 0.0
    if log and positive:
        ax.set_ylabel("seconds per outer iteration\n(log scale; components side by side)")
        ax.set_yscale("log")
        ax.set_ylim(bottom=min(positive) / 2, top=max(top, min(positive)) * 4)
    else:
        ax.set_ylabel("seconds per outer iteration (linear; stacked)")
        ax.set_ylim(bottom=0, top=max(top, 1e-12) * 1.15)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize="small")


def plot_cost_breakdown_settings(
    settings: Mapping[Any, Mapping[str, Any] | Sequence[Mapping[str, Any]]],
    path: str | Path,
    title: str = "",
    log: bool | None = False,
) -> Path:
    """Write grouped stacked bars of the mean time per outer iteration, one group per setting.

    ``settings`` maps a setting label (any printable key, e.g. ``(clients,
    fraction)``) to its runs or summary rows as :func:`plot_cost_breakdown`
    takes them. Within a group there is one bar per algorithm (labeled under
    it), split into client compute, server compute, latency and encryption,
    like the paper's Figure 4 across settings (Tables 6-8). Linear and
    stacked by default; ``log=True`` draws the components side by side on a
    log axis, as in :func:`plot_cost_breakdown`.
    """
    if not settings:
        raise fail("settings", "is empty", "Pass at least one setting -> runs.")
    plt = _pyplot()
    groups = {_setting_label(k): _breakdowns(v) for k, v in settings.items()}
    bars: list[tuple[float, str, dict[str, float]]] = []
    centers = []
    position = 0.0
    for parts in groups.values():
        xs = [position + i for i in range(len(parts))]
        bars += [(xi, label, part) for xi, (label, part) in zip(xs, parts.items())]
        centers.append(float(np.mean(xs)) if xs else position)
        position += len(parts) + 1.0
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(bars) + 3), 5.0))
    x = np.array([b[0] for b in bars])
    rows = [b[2] for b in bars]
    tops = (_side_by_side_bars if log else _stack_bars)(ax, x, rows, width=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels([display_name(b[1]) for b in bars], rotation=90, fontsize="x-small")
    longest = max((len(display_name(b[1])) for b in bars), default=4)
    for center, label in zip(centers, groups):
        ax.annotate(
            label,
            (center, 0),
            xycoords=("data", "axes fraction"),
            xytext=(0, -(12 + 4.6 * longest)),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize="small",
        )
    _finish_cost_axis(ax, rows, tops, bool(log))
    ax.set_title(title or "Mean time per outer iteration by setting", fontsize="medium")
    fig.tight_layout()
    needed = (40 + 4.6 * longest) / (72 * fig.get_figheight())  # rotated names + group label
    fig.subplots_adjust(bottom=min(max(fig.subplotpars.bottom, needed), 0.5))
    return _save(fig, path)


def _setting_label(key: Any) -> str:
    if isinstance(key, tuple) and len(key) == 2:
        clients, fraction = key
        frac = f"{float(fraction):g}" if isinstance(fraction, (int, float)) else str(fraction)
        return f"{clients}, {frac}"
    return str(key)


def _seconds(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f} s"
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{1e3 * value:.3g} ms"
    return f"{1e6 * value:.3g} µs"


_NEURAL_COLORS = ("tab:blue", "tab:orange", "tab:green", *_OTHER_COLORS)


def plot_neural_runs(
    runs: Mapping[str, RunResult | LoadedRun], path: str | Path, title: str = ""
) -> Path:
    """Write a PNG of neural runs: validation loss, and accuracy of global and local models.

    Left: the global model's validation loss (training loss when there is no
    validation data) against outer iterations. Right: its validation accuracy
    (solid) and, for HyFEM, the clients' local models' mean accuracy on their
    own views (dashed, same colour), with the majority-class rate as a grey
    dashed line. Against outer iterations: a HyFEM iteration is one
    communication round (its Figures 3-4), a FedBCD iteration a pass of
    mini-batch exchanges (its round trips are in ``metrics.csv``).
    """
    plt = _pyplot()
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (label, run) in enumerate(runs.items()):
        colour = _NEURAL_COLORS[i % len(_NEURAL_COLORS)]
        x = run.column("iteration")
        val_loss = run.column("val_loss")
        loss = val_loss if np.isfinite(val_loss).any() else run.column("loss")
        loss_ax.plot(x, loss, color=colour, label=label)
        acc_ax.plot(x, run.column("val_accuracy"), color=colour, label=f"{label} (global)")
        local = run.column("local_val_accuracy")
        if np.isfinite(local).any():
            acc_ax.plot(x, local, color=colour, linestyle="--", label=f"{label} (local, mean)")
    _draw_majority(acc_ax, runs)
    # a HyFEM iteration is one communication round; a FedBCD one is a pass of exchanges
    # (metrics.csv counts its round trips)
    loss_ax.set_xlabel("outer iteration")
    loss_ax.set_ylabel("validation loss (cross-entropy)")
    loss_ax.set_yscale("log")
    acc_ax.set_xlabel("outer iteration")
    acc_ax.set_ylabel("validation accuracy")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
    acc_ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)
