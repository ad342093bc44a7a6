"""``hyfl report``: one document with the paper-style figures and tables of a results folder.

:func:`build_report` discovers every setting and run under a results folder
(the layouts of :func:`hyfl.experiments.results.load_results`: a ``hyfl
compare`` folder, or folders of them, with optional ``seed-<s>`` levels) and
writes a self-contained HTML file (figures embedded as base64 PNG, plain CSS,
no script, no network) or a Markdown file whose figures are PNG files in
``report_files/`` next to it.

What it holds:

* per setting: relative loss and validation accuracy against relative outer
  iteration (eq. 15) and relative simulated time (eq. 14), smoothed as in the
  paper (section 7.4); the cost breakdown per outer iteration (Figure 4); a
  table with final relative loss, best validation accuracy, outer iterations
  to reach relative loss 1e-1 / 1e-2 / 1e-3, simulated time, bytes and
  homomorphic-encryption operations; and the best algorithms;
* with several settings: the grid of Figure 3 (rows = client counts,
  columns = participation fractions) per dataset, and the cost breakdown
  across settings (Tables 6-8);
* a neutral headline: each algorithm's final relative loss (and best
  validation accuracy next to the majority-class rate), then how often each
  algorithm is the best of a comparison (:func:`win_counts`).

The report is titled by the experiment's name (:func:`experiment_name`: the
``[experiment] name`` of the config the results came from), not by its
folder, and every figure has a caption that says what its axes are.

Comparisons
-----------
A comparison is one setting x one budget x one metric. The budgets are
*equal outer iterations* (every run cut at the smallest last iteration among
the setting's runs, which is every run's end when they ran equally long) and,
when every run carries a simulated time, *equal simulated time* (cut at the
smallest total ``sim_time`` among the runs that used their time up: a run of a
simulated-time budget that stopped at its cap on outer iterations first is
compared with its final values; the paper ran separate equal-wall-time
experiments, here the equal-iteration runs are truncated). The metrics are
the final relative loss within the budget (lower wins; the last evaluated
value, unsmoothed) and the best validation accuracy within the budget (higher
wins). The winner is the best algorithm of the setting; ties count for every
tied algorithm; an algorithm without a value loses. A comparison needs two
algorithms and one value.

The paper's "69 of 72" counts pairs: 9 client-fraction panels x 2 budgets x
2 metrics x 2 opponents (section 7.5 lists three lost pairs); the report
gives that pairwise count too.
"""

from __future__ import annotations

import base64
import html
import math
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hyfl.errors import check_choice, fail
from hyfl.experiments.outputs import accuracy_levels
from hyfl.experiments.plots import (
    carries_time,
    display_name,
    majority_rate,
    paper_window,
    plot_cost_breakdown,
    plot_cost_breakdown_settings,
    plot_setting_figure,
    plot_settings_grid,
    time_breakdown,
    window_row_count,
)
from hyfl.experiments.results import LoadedRun, load_results, setting_info, trivial_verdicts
from hyfl.runtime.simulation import first_round_below, settled_round_below

FORMATS = ("html", "markdown")
BUDGETS = {"iterations": "equal outer iterations", "sim_time": "equal simulated time"}
METRICS = {
    "final_relative_loss": "final relative loss",
    "best_val_accuracy": "best validation accuracy",
}
LOWER_IS_BETTER = {"final_relative_loss": True, "best_val_accuracy": False}
TOLERANCES = (1e-1, 1e-2, 1e-3)
FILES_DIR = "report_files"
"""Folder (next to a Markdown report) holding its figures."""


# --------------------------------------------------------------------------- numbers


@dataclass(frozen=True)
class Comparison:
    """One setting x one budget x one metric.

    ``values`` maps every algorithm of the setting to its value (NaN when it
    has none); ``winners`` are the best algorithms (several on a tie).
    """

    setting: str
    budget: str
    metric: str
    values: dict[str, float]
    winners: tuple[str, ...]


def budget_cutoffs(runs: Mapping[str, Any]) -> dict[str, float]:
    """Where each budget ends for a setting's runs.

    ``iterations``: the smallest last outer iteration among the runs;
    ``sim_time``: the smallest total simulated time, present only when every
    run has a positive simulated time. A run that had a simulated-time budget
    but stopped at its cap on outer iterations first (``stopped_by ==
    "iterations"``) did not use its time up, so it does not set the cut: it is
    compared with its final values (unless every run was capped).
    """
    cutoffs: dict[str, float] = {}
    lasts = [_last(run.column("iteration")) for run in runs.values()]
    if lasts and all(math.isfinite(v) for v in lasts):
        cutoffs["iterations"] = min(lasts)
    if runs and all(carries_time(run) for run in runs.values()):
        times = {name: _last(run.column("sim_time")) for name, run in runs.items()}
        used_up = [t for name, t in times.items() if not _capped_before_time(runs[name])]
        cutoffs["sim_time"] = min(used_up) if used_up else min(times.values())
    return cutoffs


def _capped_before_time(run: Any) -> bool:
    """Whether a run with a simulated-time budget stopped at its iteration cap first."""
    config = getattr(run, "config", None) or {}
    budget = config.get("budget") if isinstance(config.get("budget"), dict) else {}
    return bool(budget.get("sim_time")) and config.get("stopped_by") == "iterations"


def _last(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else math.nan


def values_within(run: Any, budget: str, cutoff: float) -> dict[str, float]:
    """A run's final relative loss and best validation accuracy (and AUC) within a budget.

    The rows kept are those with ``iteration`` (budget ``iterations``) or
    ``sim_time`` (budget ``sim_time``) at most ``cutoff``; the final relative
    loss is the last non-NaN one among them.
    """
    check_choice("budget", budget, BUDGETS)
    x = run.column("iteration" if budget == "iterations" else "sim_time")
    keep = np.isfinite(x) & (x <= cutoff * (1 + 1e-12) + 1e-300)
    loss = run.column("relative_loss")[keep]
    loss = loss[~np.isnan(loss)]
    acc = run.column("val_accuracy")[keep]
    acc = acc[~np.isnan(acc)]
    auc = run.column("val_auc")[keep]  # (all NaN in runs written before the column existed)
    auc = auc[~np.isnan(auc)]
    return {
        "final_relative_loss": float(loss[-1]) if loss.size else math.nan,
        "best_val_accuracy": float(acc.max()) if acc.size else math.nan,
        "best_val_auc": float(auc.max()) if auc.size else math.nan,
    }


def compare_setting(
    setting: str, runs: Mapping[str, Any], budgets: Sequence[str] = tuple(BUDGETS)
) -> list[Comparison]:
    """The comparisons of one setting (see the module docstring), on ``budgets`` only."""
    if len(runs) < 2:
        return []
    out = []
    for budget, cutoff in budget_cutoffs(runs).items():
        if budget not in budgets:
            continue
        within = {name: values_within(run, budget, cutoff) for name, run in runs.items()}
        for metric in METRICS:
            values = {name: v[metric] for name, v in within.items()}
            winners = _winners(values, LOWER_IS_BETTER[metric])
            if winners:
                out.append(Comparison(setting, budget, metric, values, winners))
    return out


def _winners(values: Mapping[str, float], lower: bool) -> tuple[str, ...]:
    present = {k: v for k, v in values.items() if not math.isnan(v)}
    if not present:
        return ()
    best = min(present.values()) if lower else max(present.values())
    return tuple(k for k, v in present.items() if _same(v, best))


def _same(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def _better_or_equal(a: float, b: float, lower: bool) -> bool | None:
    """Whether ``a`` is at least as good as ``b``; None when neither has a value."""
    if math.isnan(a) and math.isnan(b):
        return None
    if math.isnan(a):
        return False
    if math.isnan(b):
        return True
    return _same(a, b) or (a < b if lower else a > b)


def compare_settings(settings: Mapping[str, Mapping[str, Any]]) -> list[Comparison]:
    """Every comparison of every setting."""
    return [c for setting, runs in settings.items() for c in compare_setting(setting, runs)]


def win_counts(comparisons: Sequence[Comparison], algorithm: str) -> dict[str, tuple[int, int]]:
    """Metric -> (comparisons ``algorithm`` wins, comparisons it takes part in)."""
    out = {}
    for metric in METRICS:
        mine = [c for c in comparisons if c.metric == metric and algorithm in c.values]
        out[metric] = (sum(algorithm in c.winners for c in mine), len(mine))
    return out


def pairwise_counts(
    comparisons: Sequence[Comparison], algorithm: str
) -> dict[str, tuple[int, int]]:
    """Metric -> (pairs where ``algorithm`` is at least as good as the other, pairs).

    Each comparison gives one pair per other algorithm (the paper's way of
    counting); pairs where neither has a value are left out.
    """
    out = {}
    for metric in METRICS:
        wins = total = 0
        for c in comparisons:
            if c.metric != metric or algorithm not in c.values:
                continue
            for other, value in c.values.items():
                if other == algorithm:
                    continue
                result = _better_or_equal(c.values[algorithm], value, LOWER_IS_BETTER[metric])
                if result is not None:
                    total += 1
                    wins += result
        out[metric] = (wins, total)
    return out


def win_sentence(comparisons: Sequence[Comparison], algorithm: str) -> str:
    """``"HyFDCA wins N of M comparisons on final relative loss, K of M on best ..."``."""
    counts = win_counts(comparisons, algorithm)
    (n, m), (k, m2) = counts["final_relative_loss"], counts["best_val_accuracy"]
    return (
        f"{display_name(algorithm)} wins {n} of {m} comparisons on final relative loss, "
        f"{k} of {m2} on best validation accuracy"
    )


def _central_accuracy(run) -> float | None:
    """The central model's training accuracy a run's ``run.json`` records (None if not)."""
    summary = getattr(run, "config", {}).get("summary")
    optimum = summary.get("optimum") if isinstance(summary, dict) else None
    value = optimum.get("train_accuracy") if isinstance(optimum, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def setting_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per algorithm: the numbers of a setting's table.

    Keys: ``algorithm``, ``iterations`` (the run's last), ``final_relative_loss``,
    ``best_val_accuracy`` (within the equal-outer-iterations budget: the
    whole run when the runs are equally long), ``rounds_to_1e-1`` / ``1e-2`` /
    ``1e-3`` (first outer iteration with relative loss at or below it, None
    if never), ``settled_1e-1`` / ... (the outer iteration from which every
    evaluation stays at or below it, None if the last is above),
    ``rounds_to_acc_0.01`` / ``settled_acc_0.01`` / ``..._0.001`` (the same for the
    training accuracy against the central model's less 0.01 and 0.001:
    :data:`~hyfl.experiments.outputs.ACCURACY_MARGINS`; of the seeds' mean curve
    against the first seed's central accuracy when seeds are averaged), ``sim_time``,
    ``bytes`` (up + down), ``he_ops`` (encryptions + decryptions + additions),
    ``seconds_per_iteration``,
    ``final_relative_loss_equal_time`` and ``best_val_accuracy_equal_time``
    (within the equal-simulated-time budget; NaN without one), ``trivial``
    (``[(seed, TrivialResult)]`` of the runs no better than trivial,
    :func:`~hyfl.experiments.results.trivial_verdicts`; empty for none).
    """
    cutoffs = budget_cutoffs(runs)
    rows = []
    for name, run in runs.items():
        it = run.column("iteration")
        loss = run.column("relative_loss")
        whole = (
            values_within(run, "iterations", cutoffs["iterations"])
            if "iterations" in cutoffs
            else {}
        )
        timed = values_within(run, "sim_time", cutoffs["sim_time"]) if "sim_time" in cutoffs else {}
        final = run.final
        row = {
            "algorithm": name,
            "iterations": _last(it),
            "final_relative_loss": whole.get("final_relative_loss", math.nan),
            "best_val_accuracy": whole.get("best_val_accuracy", math.nan),
            "best_val_auc": whole.get("best_val_auc", math.nan),
            **{
                f"rounds_to_{tol:.0e}".replace("e-0", "e-"): first_round_below(it, loss, tol)
                for tol in TOLERANCES
            },
            **{
                f"settled_{tol:.0e}".replace("e-0", "e-"): settled_round_below(it, loss, tol)
                for tol in TOLERANCES
            },
            **accuracy_levels(it, run.column("train_accuracy"), _central_accuracy(run)),
            "sim_time": _get(final, "sim_time"),
            "bytes": _get(final, "bytes_up") + _get(final, "bytes_down"),
            "he_ops": _get(final, "encryptions")
            + _get(final, "decryptions")
            + _get(final, "additions"),
            "seconds_per_iteration": sum(time_breakdown(run).values())
            if carries_time(run)
            else math.nan,
            "final_relative_loss_equal_time": timed.get("final_relative_loss", math.nan),
            "best_val_accuracy_equal_time": timed.get("best_val_accuracy", math.nan),
            "seeds": len(getattr(run, "seeds", ()) or ()),
            "trivial": trivial_verdicts(run),
        }
        rows.append(row)
    return rows


def _get(final: Mapping[str, float], key: str) -> float:
    try:
        return float(final.get(key, math.nan))
    except (TypeError, ValueError):
        return math.nan


def focus_algorithm(settings: Mapping[str, Mapping[str, Any]], focus: str | None = None) -> str:
    """The algorithm the win counts are about: ``focus``, else HyFDCA, else the first."""
    names = [n for runs in settings.values() for n in runs]
    if focus is not None:
        if focus not in names:
            raise fail(
                "focus algorithm",
                f"{focus!r} is not among the runs",
                f"Choose one of: {', '.join(dict.fromkeys(names))}.",
            )
        return focus
    for name in names:
        if name.lower() == "hyfdca":
            return name
    for name in names:
        if name.lower().startswith("hyfdca"):
            return name
    return names[0]


# --------------------------------------------------------------------------- document model


@dataclass
class _Heading:
    level: int
    text: str


@dataclass
class _Para:
    text: str
    strong: bool = False


@dataclass
class _Table:
    columns: list[str]
    rows: list[list[tuple[str, bool]]]  # (text, highlighted)
    note: str = ""


@dataclass
class _Image:
    file: str  # name inside the figures folder
    alt: str
    caption: str = ""  # what the axes are; shown under the figure


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}" if abs(value) >= 1e4 else str(int(value))
        return f"{value:.{digits}g}"
    return str(value)


def _fmt_count(value: float) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value < 1e6:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _fmt_bytes(value: float) -> str:
    if value is None or math.isnan(value):
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def _fmt_seconds(value: float) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.4g} s"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "setting"


def _describe(info: Mapping[str, Any]) -> str:
    parts = []
    if info.get("dataset"):
        parts.append(f"dataset {info['dataset']}")
    if info.get("loss"):
        parts.append(f"loss {info['loss']}")
    if info.get("partition"):
        clients = f" ({info['n_clients']} clients)" if info.get("n_clients") else ""
        parts.append(f"partition {info['partition']}{clients}")
    elif info.get("n_clients"):
        parts.append(f"{info['n_clients']} clients")
    if info.get("participation") is not None:
        parts.append(f"participation {info['participation']}")
    if info.get("iterations") is not None:
        parts.append(f"{info['iterations']:,} outer iterations")
    if info.get("seeds"):
        parts.append(f"mean of seeds {', '.join(map(str, info['seeds']))}")
    if info.get("latency") is not None:
        parts.append(f"latency {float(info['latency']):g} s per round trip")
    if info.get("cipher"):
        parts.append(f"cipher {info['cipher']}")
    if info.get("he_costs"):
        parts.append(f"HE operations priced by: {info['he_costs']}")
    return "; ".join(parts) + "." if parts else "No run.json: setting details unknown."


def _grid_groups(
    settings: Mapping[str, Mapping[str, Any]], infos: Mapping[str, Mapping[str, Any]]
) -> list[tuple[str, dict[tuple[Any, Any], Mapping[str, Any]]]]:
    """Settings that differ only in clients and participation, as grids (2+ settings each)."""
    groups: dict[tuple, dict[tuple[Any, Any], Mapping[str, Any]]] = {}
    labels: dict[tuple, str] = {}
    for name, runs in settings.items():
        info = infos[name]
        if info.get("clients") is None or info.get("fraction") is None:
            continue
        base = tuple(str(info.get(k)) for k in ("dataset", "loss", "latency", "cipher", "he_costs"))
        key = (info["clients"], info["fraction"])
        n = 0
        while key in groups.get((*base, n), {}):  # same cell twice: another grid
            n += 1
        groups.setdefault((*base, n), {})[key] = runs
        label = ", ".join(
            f"{k} {info[k]}" for k in ("dataset", "loss", "latency", "cipher") if info.get(k)
        )
        labels[(*base, n)] = label + (f" (#{n + 1})" if n else "")
    return [(labels[k], g) for k, g in groups.items() if len(g) >= 2]


# --------------------------------------------------------------------------- building


def build_report(
    results_dir: str | Path,
    *,
    format: str = "html",
    out: str | Path | None = None,
    focus: str | None = None,
    window: float | None = None,
) -> Path:
    """Write a report of every setting and run under ``results_dir``.

    Parameters
    ----------
    results_dir : path
        A results folder (layouts: :func:`hyfl.experiments.results.load_results`).
    format : ``"html"`` or ``"markdown"``
        HTML: one self-contained file, figures embedded as base64 PNG.
        Markdown: figures written to ``report_files/`` next to the file and
        referenced relatively.
    out : path, optional
        The file to write; default ``results_dir/report.html`` or
        ``results_dir/report.md``.
    focus : str, optional
        The algorithm the win counts are about; default HyFDCA when present,
        else the first algorithm.
    window : float, optional
        Moving-average window in outer iterations for every curve; default
        the paper's (:func:`hyfl.experiments.plots.paper_window`).

    Returns
    -------
    Path of the report written.

    Raises
    ------
    HyflError
        For an unknown format, or a results folder without runs.
    """
    check_choice("format", format, FORMATS)
    results_dir = Path(results_dir)
    settings = load_results(results_dir)
    suffix = ".html" if format == "html" else ".md"
    out = Path(out) if out is not None else results_dir / f"report{suffix}"
    out.parent.mkdir(parents=True, exist_ok=True)
    if format == "markdown":
        figures = out.parent / FILES_DIR
        figures.mkdir(parents=True, exist_ok=True)
        blocks = _document(settings, results_dir, figures, focus, window)
        out.write_text(_markdown(blocks, FILES_DIR))
    else:
        with tempfile.TemporaryDirectory(prefix="hyfl-report-") as tmp:
            blocks = _document(settings, results_dir, Path(tmp), focus, window)
            out.write_text(_html(blocks, Path(tmp), title=experiment_name(results_dir, settings)))
    return out


def experiment_name(results_dir: str | Path, settings: Mapping[str, Mapping[str, Any]]) -> str:
    """The name a report is titled by.

    The ``[experiment] name`` of ``results_dir/config.toml`` (a config run);
    for a study (a config per subfolder) the names of its experiments; for
    results without a config (``hyfl compare``, ``hyfl run`` from flags) a
    description of the runs (data set, loss, partition, algorithms). The
    folder's name is the last resort only: folders are often ``out`` or
    ``runs/2``, which tell a reader nothing.
    """
    root = Path(results_dir)
    names = _config_names(root)
    if len(names) == 1:
        return names[0]
    if names:
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        return f"Study of {len(names)} experiments: {shown}"
    infos = [setting_info(runs) for runs in settings.values()]
    algorithms = list(dict.fromkeys(n for runs in settings.values() for n in runs))
    described = []
    for key, fmt in (("dataset", "{}"), ("loss", "{} loss"), ("partition", "{}")):
        values = list(dict.fromkeys(str(i[key]) for i in infos if i.get(key) is not None))
        if values:
            described.append(fmt.format("/".join(values)))
    if described:
        return ", ".join(described) + ": " + " vs ".join(display_name(a) for a in algorithms)
    return f"Results in {root.resolve().name}"


def _config_names(root: Path) -> list[str]:
    """``[experiment] name`` of the resolved config at ``root``, else of those below it."""
    import tomllib

    found = [root / "config.toml"] if (root / "config.toml").is_file() else sorted(
        p for p in root.rglob("config.toml")
        if not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    names: list[str] = []
    for path in found:
        try:
            table = tomllib.loads(path.read_text(encoding="utf-8")).get("experiment")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue  # not ours, or unreadable: the title falls back to the runs
        name = table.get("name") if isinstance(table, dict) else None
        if isinstance(name, str) and name and name not in names:
            names.append(name)
    return names


def _document(
    settings: Mapping[str, Mapping[str, LoadedRun]],
    results_dir: Path,
    figures: Path,
    focus: str | None,
    window: float | None,
) -> list:
    """The report's blocks, in order: title, summary, comparisons, the figures across
    settings, one section per setting and how to read it (figures are written to
    ``figures`` as they are placed)."""
    infos = {name: setting_info(runs) for name, runs in settings.items()}
    comparisons = compare_settings(settings)
    hero = focus_algorithm(settings, focus)
    algorithms = list(dict.fromkeys(n for runs in settings.values() for n in runs))
    blocks: list = [_Heading(1, experiment_name(results_dir, settings))]
    blocks.append(
        _Para(
            f"Results folder: {results_dir.resolve()}. {len(settings)} setting"
            f"{'s' if len(settings) != 1 else ''}; algorithms: "
            f"{', '.join(display_name(a) for a in algorithms)}."
        )
    )
    blocks += _summary_blocks(settings)
    if comparisons:
        blocks.append(_Heading(2, "Comparisons"))
        blocks += _comparison_blocks(comparisons, hero, algorithms)
    else:
        blocks.append(_Para("No comparisons: every setting has a single algorithm (or no values)."))
    blocks += _across_settings_blocks(settings, infos, figures, window)
    slugs = _unique_slugs(settings)
    for setting, runs in settings.items():
        blocks += _setting_blocks(setting, runs, infos[setting], slugs[setting], comparisons,
                                  figures, window)
    blocks.append(_Heading(2, "How to read this report"))
    blocks.append(
        _Para(
            "Curves follow the paper (section 7.4): a trailing moving average of width omega "
            "(50 / 150 / 300 outer iterations for MNIST / News20 / Covtype and their stand-ins "
            "reuters / ijcnn1, at most 2% of the run; 1% of the outer iterations against time and "
            "for other datasets; omega < 2 is not smoothed), each smoothed value placed at the "
            "start of its window. Relative outer iteration is t / (t_max - omega) (eq. 15): t the "
            "outer iteration, t_max the last outer iteration of the longest run, omega the "
            "window; "
            "relative simulated time is T / max over algorithms of the total simulated time "
            "(eq. 14). Tables are not smoothed: final relative loss is the last evaluated value, "
            "'first at 1e-k' is the first outer iteration at or below it, 'settled at 1e-k' the "
            "one from which every later evaluation stays at or below it; 'acc-1pt' is the "
            "central model's training accuracy less 0.01 (the first round at or above it, then "
            "the one from which it stays there). "
            "Plotted is the primal "
            "of the model the server reports (for HyFDCA's default rule the better certified of "
            "its last iterate and its running average). Equal simulated time cuts "
            "every run at the shortest run's total simulated time."
        )
    )
    return blocks


def _summary_blocks(settings: Mapping[str, Mapping[str, LoadedRun]]) -> list:
    """The summary: facts first (the headline, the majority-class and trivial-model
    sentences); who is best comes after, in the comparisons' tables."""
    blocks: list = [_Heading(2, "Summary"), _Para(_headline(settings), strong=True)]
    majority = _majority_sentence(settings)
    if majority:
        blocks.append(_Para(majority))
    trivial = _trivial_sentence(settings)
    if trivial:
        blocks.append(_Para(trivial, strong=True))
    return blocks


def _comparison_blocks(comparisons, hero: str, algorithms: list[str]) -> list:
    """What a comparison is and the paper's pair count for ``hero``, then two tables: each
    algorithm's share of the comparisons it wins, and each comparison's winners."""
    blocks: list = []
    pairs = pairwise_counts(comparisons, hero)
    (pl, ml), (pa, ma) = pairs["final_relative_loss"], pairs["best_val_accuracy"]
    blocks.append(
        _Para(
            "A comparison is one setting x one budget (equal outer iterations; equal simulated "
            "time when the runs carry one) x one metric. The best algorithm has the lowest "
            "final relative loss or the highest best validation accuracy within the budget; "
            "ties count for every tied algorithm. "
            f"Counted in pairs as the paper does (its 69 of 72 are pairs against each other "
            f"algorithm), {display_name(hero)} is at least as good as the other algorithm in "
            f"{pl + pa} of {ml + ma} pairs ({pl} of {ml} on final relative loss, {pa} of {ma} "
            "on best validation accuracy)."
        )
    )
    counts = {a: win_counts(comparisons, a) for a in algorithms}

    def share(a: str, metric: str) -> tuple[str, bool]:
        best, total = counts[a][metric]
        return f"{best} of {total}", False

    blocks.append(
        _Table(
            [
                "algorithm",
                "comparisons with the lowest final relative loss",
                "comparisons with the highest best validation accuracy",
            ],
            [
                [
                    (display_name(a), False),
                    share(a, "final_relative_loss"),
                    share(a, "best_val_accuracy"),
                ]
                for a in algorithms
            ],
        )
    )
    blocks.append(
        _Table(
            [
                "setting",
                "budget",
                "lowest final relative loss",
                "highest best validation accuracy",
            ],
            _winner_rows(comparisons, hero),
            f"Bold: {display_name(hero)} is among the best.",
        )
    )
    return blocks


def _across_settings_blocks(settings: Mapping[str, Mapping[str, LoadedRun]], infos: dict,
                            figures: Path, window: float | None) -> list:
    """The figures across settings: one settings grid per group (against outer
    iterations, and against simulated time when the runs carry one), and the time per
    outer iteration of each setting when the runs carry costs."""
    blocks: list = []
    grids = _grid_groups(settings, infos)
    for g, (label, grid) in enumerate(grids):
        blocks.append(_Heading(2, f"Settings grid: {label}" if label else "Settings grid"))
        for x, what in (
            ("iteration", "equal outer iterations"),
            ("sim_time", "relative simulated time"),
        ):
            if x == "sim_time" and not any(
                carries_time(r) for runs in grid.values() for r in runs.values()
            ):
                continue
            name = f"grid-{g + 1}-{'iterations' if x == 'iteration' else 'time'}.png"
            plot_settings_grid(
                grid,
                figures / name,
                x=x,
                window=window,
                title=f"{label}: {what}" if label else what,
            )
            blocks.append(
                _Image(name, f"Settings grid ({what}), {label}", GRID_CAPTION + _x_caption(x))
            )
    if len(settings) > 1 and _any_costs(settings):
        blocks.append(_Heading(2, "Time per outer iteration across settings"))
        name = "costs-settings.png"
        plot_cost_breakdown_settings(settings, figures / name)
        blocks.append(
            _Image(name, "Mean time per outer iteration by component and setting", COST_CAPTION)
        )
    return blocks


def _setting_blocks(setting: str, runs: Mapping[str, LoadedRun], info, slug: str, comparisons,
                    figures: Path, window: float | None) -> list:
    """One setting's section: its description and table, its winners, its curves and,
    when the runs carry costs, its time per outer iteration."""
    blocks: list = []
    blocks.append(_Heading(2, f"Setting: {setting}"))
    blocks.append(_Para(_describe(info) + _budget_note(runs)))
    blocks.append(_setting_table(runs, comparisons, setting))
    mine = [c for c in comparisons if c.setting == setting]
    if mine:
        blocks.append(
            _Para(
                "Best: "
                + "; ".join(
                    f"{METRICS[c.metric]} at {BUDGETS[c.budget]}: "
                    f"{', '.join(display_name(w) for w in c.winners)}"
                    for c in mine
                )
                + "."
            )
        )
    name = f"setting-{slug}-curves.png"
    plot_setting_figure(runs, figures / name, title=setting, window=window)
    blocks.append(
        _Image(name, f"Relative loss and validation accuracy, {setting}", CURVES_CAPTION)
    )
    blocks.append(_Para(_window_note(runs, info, window)))
    if _any_costs({setting: runs}):
        name = f"setting-{slug}-costs.png"
        plot_cost_breakdown(runs, figures / name, title=f"{setting}: time per outer iteration")
        blocks.append(
            _Image(name, f"Mean time per outer iteration by component, {setting}", COST_CAPTION)
        )
    return blocks


X_ITERATION = (
    "relative outer iteration t / (t_max - ω) (eq. 15): t is the outer iteration (one round in "
    "which the server hears from the participating clients), t_max the last outer iteration of "
    "the longest run, and ω (omega) the width of the moving average in outer iterations (see the "
    "window below); each smoothed value sits at the start of its window, so the curves end at 1."
)
X_TIME = (
    "relative simulated time T / max T (eq. 14): T is the simulated seconds so far (client and "
    "server compute, latency, encryption), max T the largest total over the algorithms; a dotted "
    "line marks the shortest run's end."
)
Y_CURVES = (
    "Top: relative loss (P(w) - P*) / |P*| on a log axis, where P is the training objective, w "
    "the server's model and P* the centralized optimum (0 would be the optimum). Bottom: "
    "validation accuracy (fraction of held-out samples classified correctly); the dashed line "
    "is the majority-class rate, the accuracy of always predicting the most frequent training "
    "label: a curve on it has learned nothing."
)
CURVES_CAPTION = (
    f"Left: x axis {X_ITERATION} Right (runs with costs): x axis {X_TIME} {Y_CURVES}"
)
GRID_CAPTION = (
    "Rows: number of clients; columns: fraction of clients taking part in each outer "
    "iteration. In each cell, relative loss (top, log axis) over validation accuracy (bottom) "
    "as in the per-setting figures; dashed line: majority-class rate. X axis: "
)
COST_CAPTION = (
    "Bar height: mean simulated seconds per outer iteration (total simulated time / outer "
    "iterations) on a linear axis, stacked by component: client compute, server compute, "
    "latency (round trips x the latency per round trip) and encryption (homomorphic-encryption "
    "operations at the cost model's prices). Heights are proportional to seconds, so a "
    "component far smaller than the largest is a sliver; the number on a bar is its total."
)


def _x_caption(x: str) -> str:
    return X_ITERATION if x == "iteration" else X_TIME


def _headline(settings: Mapping[str, Mapping[str, Any]]) -> str:
    """Each algorithm's final relative loss: a fact, not a verdict.

    One setting: the value per algorithm at equal outer iterations. Several:
    the median and range over the settings an algorithm ran in.
    """
    finals: dict[str, list[float]] = {}
    cutoff = None
    for runs in settings.values():
        for row in setting_rows(runs):
            finals.setdefault(row["algorithm"], []).append(row["final_relative_loss"])
        cutoff = budget_cutoffs(runs).get("iterations")
    parts = []
    for name, values in finals.items():
        v = np.array([x for x in values if np.isfinite(x)])
        if v.size == 0:
            parts.append(f"{display_name(name)} -")
        elif len(settings) == 1:
            parts.append(f"{display_name(name)} {_fmt(v[0])}")
        else:
            parts.append(
                f"{display_name(name)} {_fmt(float(np.median(v)))} "
                f"({_fmt(float(v.min()))} to {_fmt(float(v.max()))}, {v.size} settings)"
            )
    if len(settings) == 1:
        at = f" after {_fmt(cutoff)} outer iterations" if cutoff is not None else ""
        lead = f"Final relative loss{at}: "
    else:
        lead = (
            f"Final relative loss at equal outer iterations, median over {len(settings)} "
            "settings (range): "
        )
    return lead + "; ".join(parts) + ". Relative loss is (P(w) - P*) / |P*|; 0 is the optimum."


def _majority_sentence(settings: Mapping[str, Mapping[str, Any]]) -> str:
    """Best validation accuracy next to the majority-class rate, per setting that records it."""
    out = []
    for setting, runs in settings.items():
        rate = majority_rate(runs)
        if rate is None:
            continue
        best = [
            f"{display_name(r['algorithm'])} {_fmt(r['best_val_accuracy'])}"
            for r in setting_rows(runs)
        ]
        where = f" ({setting})" if len(settings) > 1 else ""
        out.append(
            f"Best validation accuracy{where}: {', '.join(best)}; always predicting the "
            f"majority class scores {_fmt(rate)}."
        )
    return " ".join(out)


TRIVIAL_MARK = "†"
"""Marks, in the tables, an algorithm whose model is no better than trivial (a dagger)."""
TRIVIAL_MEANING = (
    "no better than trivial: its final primal objective is not below the zero model's, or its "
    "accuracy (validation, else training) not above always predicting the majority class"
)


def _trivial_list(row: Mapping[str, Any]) -> str:
    """``fedavg (seed 1: primal 15 >= zero model's 1)``: a row's trivial runs and why."""
    parts = [
        (f"seed {seed}: " if seed is not None and row["seeds"] > 1 else "") + verdict.reason
        for seed, verdict in row["trivial"]
    ]
    return f"{display_name(row['algorithm'])} ({'; '.join(parts)})"


def _trivial_sentence(settings: Mapping[str, Mapping[str, Any]]) -> str:
    """The runs no better than trivial, per setting (empty when there are none)."""
    out = []
    for setting, runs in settings.items():
        flagged = [_trivial_list(r) for r in setting_rows(runs) if r["trivial"]]
        if flagged:
            where = f" in {setting}" if len(settings) > 1 else ""
            out.append(f"{', '.join(flagged)}{where}")
    if not out:
        return ""
    return (f"Warning: {'; '.join(out)} -- {TRIVIAL_MEANING}. Marked {TRIVIAL_MARK} in the "
            "setting tables.")


def _budget_note(runs: Mapping[str, Any]) -> str:
    cutoffs = budget_cutoffs(runs)
    ends = {_last(run.column("iteration")) for run in runs.values()}
    note = ""
    if len(ends) > 1 and "iterations" in cutoffs:
        note += (
            f" The runs differ in length: final relative loss and best validation accuracy "
            f"are taken up to outer iteration {_fmt(cutoffs['iterations'])}, the shortest "
            "run's end."
        )
    if "sim_time" in cutoffs:
        note += (
            f" Equal simulated time: up to {_fmt_seconds(cutoffs['sim_time'])}, the "
            "shortest run's total."
        )
    return note


def _unique_slugs(settings: Mapping[str, Any]) -> dict[str, str]:
    slugs: dict[str, str] = {}
    used: set[str] = set()
    for name in settings:
        slug = base = _slug(name)
        n = 2
        while slug in used:
            slug, n = f"{base}-{n}", n + 1
        used.add(slug)
        slugs[name] = slug
    return slugs


def _any_costs(settings: Mapping[str, Mapping[str, Any]]) -> bool:
    return any(
        sum(time_breakdown(run).values()) > 0 for runs in settings.values() for run in runs.values()
    )


def _window_note(runs: Mapping[str, Any], info: Mapping[str, Any], window: float | None) -> str:
    """The moving-average windows the curves used, in outer iterations and table rows."""

    def text(equal_time: bool) -> str:
        used = set()
        for run in runs.values():
            it = run.column("iteration")
            n_iter = _last(it) if np.isfinite(it).any() else 0.0
            omega = (
                window
                if window is not None
                else paper_window(info.get("dataset"), n_iter, equal_time)
            )
            rows = window_row_count(it, omega)
            used.add("not smoothed" if rows < 2 else f"{omega:g} outer iterations ({rows} rows)")
        return " / ".join(sorted(used))

    note = f"Moving-average window: {text(False)} against outer iterations"
    if any(carries_time(r) for r in runs.values()):
        note += f"; {text(True)} against simulated time"
    return note + "."


def _winner_rows(comparisons: Sequence[Comparison], hero: str) -> list[list[tuple[str, bool]]]:
    rows: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
    for c in comparisons:
        rows.setdefault((c.setting, c.budget), {})[c.metric] = c.winners
    out = []
    for (setting, budget), winners in rows.items():
        cells = [(setting, False), (BUDGETS[budget], False)]
        for metric in METRICS:
            names = winners.get(metric, ())
            cells.append((", ".join(display_name(n) for n in names) or "-", hero in names))
        out.append(cells)
    return out


def _setting_table(
    runs: Mapping[str, Any], comparisons: Sequence[Comparison], setting: str
) -> _Table:
    rows = setting_rows(runs)
    winners = {(c.budget, c.metric): c.winners for c in comparisons if c.setting == setting}
    has_time = any(carries_time(r) for r in runs.values())
    has_seeds = any(r["seeds"] > 1 for r in rows)
    columns = [
        "algorithm",
        "outer iterations",
        "final relative loss",
        "best validation accuracy",
        "best validation AUC",
        "first at 1e-1",
        "first at 1e-2",
        "first at 1e-3",
        "settled at 1e-2",
        "settled at 1e-3",
        "acc-1pt: first, settled",
    ]
    if has_time:
        columns += ["simulated time", "time per iteration"]
    columns += ["bytes", "HE operations"]
    if "sim_time" in budget_cutoffs(runs):
        columns += ["relative loss at equal time", "best val. accuracy at equal time"]
    if has_seeds:
        columns.append("seeds")
    table_rows = []
    for r in rows:
        name = r["algorithm"]

        def won(budget: str, metric: str, name: str = name) -> bool:
            return name in winners.get((budget, metric), ())

        mark = f" {TRIVIAL_MARK}" if r["trivial"] else ""
        cells = [
            (display_name(name) + mark, False),
            (_fmt(r["iterations"]), False),
            (_fmt(r["final_relative_loss"]), won("iterations", "final_relative_loss")),
            (_fmt(r["best_val_accuracy"]), won("iterations", "best_val_accuracy")),
            (_fmt(r["best_val_auc"]), False),
            (_fmt(r["rounds_to_1e-1"]), False),
            (_fmt(r["rounds_to_1e-2"]), False),
            (_fmt(r["rounds_to_1e-3"]), False),
            (_fmt(r["settled_1e-2"]), False),
            (_fmt(r["settled_1e-3"]), False),
            # one column for both: the table must fit a laptop's width (test_report_browser)
            (f'{_fmt(r["rounds_to_acc_0.01"])}, {_fmt(r["settled_acc_0.01"])}', False),
        ]
        if has_time:
            cells += [
                (_fmt_seconds(r["sim_time"]), False),
                (_fmt_seconds(r["seconds_per_iteration"]), False),
            ]
        cells += [(_fmt_bytes(r["bytes"]), False), (_fmt_count(r["he_ops"]), False)]
        if "sim_time" in budget_cutoffs(runs):
            cells += [
                (_fmt(r["final_relative_loss_equal_time"]), won("sim_time", "final_relative_loss")),
                (_fmt(r["best_val_accuracy_equal_time"]), won("sim_time", "best_val_accuracy")),
            ]
        if has_seeds:
            cells.append((str(r["seeds"]), False))
        table_rows.append(cells)
    note = "Bold: the best at equal outer iterations (final relative loss, best validation "
    note += "accuracy)"
    if "sim_time" in budget_cutoffs(runs):
        note += " and at equal simulated time (the 'at equal time' columns)"
    flagged = [_trivial_list(r) for r in rows if r["trivial"]]
    if flagged:
        note += f". {TRIVIAL_MARK} {TRIVIAL_MEANING}: {'; '.join(flagged)}"
    return _Table(columns, table_rows, note + ".")


# --------------------------------------------------------------------------- rendering


def _md_text(text: str) -> str:
    """Text (possibly a name from someone's results folder) as one Markdown line with no
    raw HTML: line breaks would end a table or start a block of the file's choosing, and
    ``<`` a tag a viewer renders."""
    return " ".join(str(text).splitlines()).replace("<", "&lt;")


def _md_cell(text: str, strong: bool) -> str:
    text = _md_text(text).replace("|", "\\|")
    return f"**{text}**" if strong and text != "-" else text


def _markdown(blocks: list, figures_dir: str) -> str:
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, _Heading):
            lines += ["#" * block.level + " " + _md_text(block.text), ""]
        elif isinstance(block, _Para):
            text = _md_text(block.text)
            lines += [f"**{text}**" if block.strong else text, ""]
        elif isinstance(block, _Table):
            lines.append("| " + " | ".join(_md_cell(c, False) for c in block.columns) + " |")
            lines.append("|" + "|".join("---" for _ in block.columns) + "|")
            for row in block.rows:
                lines.append("| " + " | ".join(_md_cell(t, s) for t, s in row) + " |")
            lines += ["", _md_text(block.note), ""]
        elif isinstance(block, _Image):
            lines += [f"![{block.alt}]({figures_dir}/{block.file})", ""]
            if block.caption:
                lines += [f"*{block.alt}.* {block.caption}", ""]
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto;
       max-width: 1400px; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; border-bottom: 2px solid #ddd; padding-bottom: .3em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #eee; }
/* A wide table scrolls inside its own box on a narrow window; the page never scrolls sideways. */
div.table { overflow-x: auto; max-width: 100%; margin: 1em 0; }
table { border-collapse: collapse; font-size: .85em; }
th, td { border: 1px solid #ccc; padding: .3em .5em; text-align: right; }
td { white-space: nowrap; }
th { background: #f4f4f4; }
td:first-child, th:first-child { text-align: left; }
td.best { font-weight: bold; background: #e6f4e6; }
p.lead { font-size: 1.1em; font-weight: bold; }
figure { margin: 1em 0; }
img { max-width: 100%; height: auto; border: 1px solid #eee; box-sizing: border-box; }
figcaption, p.note { color: #666; font-size: .85em; }
"""


def _html(blocks: list, figures: Path, title: str) -> str:
    esc = html.escape
    body: list[str] = []
    for block in blocks:
        if isinstance(block, _Heading):
            body.append(f"<h{block.level}>{esc(block.text)}</h{block.level}>")
        elif isinstance(block, _Para):
            cls = ' class="lead"' if block.strong else ""
            body.append(f"<p{cls}>{esc(block.text)}</p>")
        elif isinstance(block, _Table):
            head = "".join(f"<th>{esc(c)}</th>" for c in block.columns)
            rows = "".join(
                "<tr>"
                + "".join(
                    f'<td class="best">{esc(t)}</td>' if s and t != "-" else f"<td>{esc(t)}</td>"
                    for t, s in row
                )
                + "</tr>"
                for row in block.rows
            )
            body.append(
                f'<div class="table"><table><thead><tr>{head}</tr></thead>'
                f"<tbody>{rows}</tbody></table></div>"
            )
            if block.note:
                body.append(f'<p class="note">{esc(block.note)}</p>')
        elif isinstance(block, _Image):
            data = base64.b64encode((figures / block.file).read_bytes()).decode("ascii")
            body.append(
                f'<figure><img alt="{esc(block.alt, quote=True)}" '
                f'src="data:image/png;base64,{data}">'
                f"<figcaption><b>{esc(block.alt)}.</b> {esc(block.caption)}</figcaption>"
                "</figure>"
            )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


__all__ = [
    "BUDGETS",
    "FILES_DIR",
    "FORMATS",
    "METRICS",
    "Comparison",
    "budget_cutoffs",
    "build_report",
    "compare_setting",
    "compare_settings",
    "experiment_name",
    "focus_algorithm",
    "pairwise_counts",
    "setting_rows",
    "values_within",
    "win_counts",
    "win_sentence",
]
