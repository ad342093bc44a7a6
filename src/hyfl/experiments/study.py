"""``hyfl study``: run a folder of experiment configs and summarize them as one study.

A study is a folder tree of configs (``configs/paper/<dataset>/<budget>/<setting>.toml``
for the paper's). :func:`run_study` runs every config whose data set is
available (others are listed with the file to provide) in parallel worker
processes, each into ``OUT/<same relative path>/`` (the layout of ``hyfl run
CONFIG``), and resumes: finished runs are read back, interrupted ones continue
from their checkpoints. ``scale`` multiplies every budget (outer iterations,
simulated time and its iteration cap) for a quick variant; ``full`` runs each
config's ``full_budget`` (the paper's own budgets in ``configs/paper``)
instead of its ``budget``.

:func:`summarize_study` then writes ``OUT/study.md`` (figures in
``OUT/study_files/``): the centralized optimum P* per data set, a grid of the
nine client-fraction settings per data set and budget (Figure 3 style), a
table per setting, and the win counts. Each experiment is compared on the
budget it was run for: equal outer iterations for ``budget = {iterations}``
configs, equal simulated time for ``budget = {sim_time}`` ones.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hyfl.errors import HyflError, check_int, fail

SUMMARY_FILE = "study.md"
FILES_DIR = "study_files"
BUDGET_NAMES = {"iterations": "equal outer iterations", "sim_time": "equal simulated time"}


# --------------------------------------------------------------------------- running


def find_configs(root: str | Path) -> list[Path]:
    """Every ``*.toml`` config below ``root`` (or ``root`` itself), in sorted order."""
    root = Path(root)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise fail(
            f"study folder {root}",
            "does not exist",
            "Pass a folder of experiment configs, e.g. configs/paper.",
        )
    found = sorted(root.rglob("*.toml"))
    if not found:
        raise fail(f"study folder {root}", "holds no *.toml configs", "Pass a folder of configs.")
    return found


def check_scale(factor: Any) -> float:
    """A budget factor in (0, 1]."""
    if not (isinstance(factor, int | float) and math.isfinite(factor) and 0 < factor <= 1):
        raise fail("--scale", f"must be in (0, 1], got {factor!r}", "Pass e.g. --scale 0.1.")
    return float(factor)


def scaled(config, factor: float):
    """``config`` with its budget (iterations, sim_time, max_iterations) times ``factor``.

    Evaluation every ``eval_every`` rounds is scaled too (at least 1), so a
    quick run keeps about as many evaluated points per run.
    """
    check_scale(factor)
    if factor == 1:
        return config
    e = config.experiment
    b = e.budget

    def rounds(n):
        return None if n is None else max(1, int(round(n * factor)))

    budget = replace(
        b,
        iterations=rounds(b.iterations),
        max_iterations=rounds(b.max_iterations),
        sim_time=None if b.sim_time is None else b.sim_time * factor,
    )
    experiment = replace(e, budget=budget, eval_every=max(1, int(round(e.eval_every * factor))))
    return replace(config, experiment=experiment)


def full_budget(config):
    """``config`` with its ``full_budget`` as the budget (unchanged when it has none).

    Evaluation every ``eval_every`` rounds grows in proportion (equal-iteration
    budgets), so a full run keeps about as many evaluated points.
    """
    e = config.experiment
    full = e.full_budget
    if full is None:
        return config
    eval_every = e.eval_every
    if full.iterations is not None and e.budget.iterations is not None:
        eval_every = max(1, int(round(e.eval_every * full.iterations / e.budget.iterations)))
    return replace(config, experiment=replace(e, budget=full, eval_every=eval_every))


def missing_data(config) -> list[str]:
    """Files a config's registered data set lacks (empty when it can run)."""
    from hyfl.data import check_files, dataset_names

    dataset = config.data.dataset.split(":")[0]
    if dataset not in dataset_names():
        return []
    rows = check_files(dataset, config.data.data_dir)
    if any(row["path"] is not None for row in rows):
        # Alternatives (e.g. a compressed or uncompressed copy): one present is enough
        # per split; the loader names anything else that is missing.
        return []
    return [row["file"] for row in rows]


@dataclass(frozen=True)
class StudyRun:
    """One config of a study and where its results go."""

    config_path: Path
    out_dir: Path
    missing: tuple[str, ...] = ()


def plan_study(root: str | Path, out: str | Path) -> list[StudyRun]:
    """The configs under ``root`` with their output folders and missing data files."""
    from hyfl.experiments.config import load_config

    root = Path(root)
    base = root if root.is_dir() else root.parent
    plan = []
    for path in find_configs(root):
        config = load_config(path)
        target = Path(out) / path.relative_to(base).with_suffix("")
        plan.append(StudyRun(path, target, tuple(missing_data(config))))
    return plan


def _run_one(config_path: str, out_dir: str, factor: float,
             full: bool = False, progress: bool = False,
             log: Callable[[str], None] | None = None) -> tuple[str, float, str | None]:
    """Worker: run one config (resuming) on one thread; returns (path, seconds, error).

    ``progress`` and ``log`` are :func:`~hyfl.experiments.runner.run_experiment`'s (a
    study of one config runs it in the calling process, with its runs' progress bars).
    """
    from threadpoolctl import threadpool_limits

    from hyfl.experiments.config import load_config
    from hyfl.experiments.runner import run_experiment

    started = time.perf_counter()
    try:
        with threadpool_limits(1):  # one core per worker: the workers are the parallelism
            config = load_config(config_path)
            config = scaled(full_budget(config) if full else config, factor)
            run_experiment(config, out_dir, resume=True, progress=progress, log=log)
    except HyflError as err:
        return config_path, time.perf_counter() - started, str(err)
    return config_path, time.perf_counter() - started, None


def run_study(
    root: str | Path,
    out: str | Path,
    *,
    scale: float = 1.0,
    full: bool = False,
    jobs: int | None = None,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> list[StudyRun]:
    """Run every available config under ``root`` into ``out`` and write the summary.

    Parameters
    ----------
    root : path
        A folder of configs (searched recursively) or one config.
    out : path
        Results folder; each config's results go to its relative path there.
    scale : float in (0, 1], default 1
        Budget factor (:func:`scaled`); 1 runs the configs as written.
    full : bool, default False
        Run each config's ``full_budget`` (:func:`full_budget`; the paper's
        budgets for ``configs/paper``), then apply ``scale``.
    jobs : int, optional
        Worker processes; default the number of CPUs.
    log : callable, optional
        Hears one line per event.
    progress : bool, default False
        Show a progress bar over configs; a study of one config runs it in this
        process instead, with a progress bar over each of its runs' rounds.

    Returns
    -------
    list of StudyRun
        The runs that ran (configs without their data are skipped).

    Raises
    ------
    HyflError
        For a bad folder or config, or when a run fails (after the others
        finished; their results stay and ``hyfl study`` resumes them).
    """
    say = log or (lambda message: None)
    jobs = check_int("--jobs", jobs if jobs is not None else (os.cpu_count() or 1), minimum=1)
    check_scale(scale)
    plan = plan_study(root, out)
    runnable = [run for run in plan if not run.missing]
    for run in plan:
        if run.missing:
            say(
                f"skipped {run.config_path}: data file(s) {', '.join(run.missing)} not found; "
                "put them in ../shared/data, $HYFL_DATA or the folder given as data_dir"
            )
    if not runnable:
        raise fail(
            f"study {root}",
            "has no config whose data are available",
            "Run `hyfl datasets` to see which files are missing and where to put them.",
        )
    Path(out).mkdir(parents=True, exist_ok=True)
    errors = []
    if len(runnable) == 1:
        # One config: run here, with a progress bar per run (over its rounds) and a line
        # per run, instead of one worker behind a bar that stays at 0/1 until the end.
        run = runnable[0]
        path, seconds, error = _run_one(str(run.config_path), str(run.out_dir), float(scale),
                                        full, progress=progress, log=log)
        if error is not None:
            say(f"failed {path} after {seconds:.0f} s: {error}")
            raise fail(f"study {root}", f"had 1 failing config: {path}: {error}",
                       "Fix it and run the same command again: finished runs are kept and "
                       "read back.")
        say(f"finished {path} in {seconds:.0f} s")
        summarize_study(out)
        return runnable
    with _bar(progress, len(runnable)) as advance, ProcessPoolExecutor(jobs) as pool:
        futures = [
            pool.submit(_run_one, str(run.config_path), str(run.out_dir), float(scale), full)
            for run in runnable
        ]
        for future in as_completed(futures):
            path, seconds, error = future.result()
            if error is not None:
                errors.append(f"{path}: {error}")
                say(f"failed {path} after {seconds:.0f} s: {error}")
            else:
                say(f"finished {path} in {seconds:.0f} s")
            advance()
    if errors:
        raise fail(
            f"study {root}",
            f"had {len(errors)} failing config(s): " + "; ".join(errors),
            "Fix them and run the same command again: finished runs are kept and read back.",
        )
    summarize_study(out)
    return runnable


class _bar:
    """A Rich progress bar over configs (or nothing)."""

    def __init__(self, show: bool, total: int):
        self.show, self.total = show, total

    def __enter__(self):
        if not self.show:
            return lambda: None
        from rich.progress import Progress

        self._progress = Progress()
        self._progress.start()
        task = self._progress.add_task("study: configs", total=self.total)
        return lambda: self._progress.advance(task)

    def __exit__(self, *exc):
        if self.show:
            self._progress.stop()
        return False


# --------------------------------------------------------------------------- summary


def designed_budget(runs) -> str:
    """``"sim_time"`` when the runs had a simulated-time budget, else ``"iterations"``."""
    specs = [getattr(run, "spec", {}) or {} for run in runs.values()]
    return "sim_time" if specs and all(s.get("sim_time") for s in specs) else "iterations"


@dataclass
class StudyGroup:
    """One data set x one budget: its settings' runs and comparisons."""

    dataset: str
    budget: str
    folder: Path
    settings: dict[str, dict[str, Any]]
    infos: dict[str, dict[str, Any]]
    comparisons: list


def load_study(out: str | Path) -> list[StudyGroup]:
    """Every (data set, budget) group of settings under a study's results folder."""
    from hyfl.experiments.report import compare_setting
    from hyfl.experiments.results import load_results, setting_info

    out = Path(out)
    # OUT/.../<group>/<setting>/<algorithm>/seed-<s>/run.json
    folders = sorted({p.parents[3] for p in out.rglob("run.json") if len(p.parts) > 4})
    groups: dict[tuple[str, str], StudyGroup] = {}
    for folder in folders:
        if folder != out and out not in folder.parents:
            continue
        settings = load_results(folder)
        for name, runs in settings.items():
            if "/" in name:  # deeper levels belong to another group folder
                continue
            info = setting_info(runs)
            budget = designed_budget(runs)
            key = (str(info["dataset"]), budget)
            group = groups.setdefault(key, StudyGroup(key[0], budget, folder, {}, {}, []))
            group.settings[name] = runs
            group.infos[name] = info
            group.comparisons += compare_setting(name, runs, budgets=(budget,))
    return [groups[k] for k in sorted(groups)]


def summarize_study(out: str | Path, focus: str = "hyfdca") -> Path:
    """Write ``OUT/study.md`` and its figures; returns the file's path."""
    from hyfl.experiments.plots import plot_cost_breakdown_settings, plot_settings_grid
    from hyfl.experiments.report import pairwise_counts, win_counts

    out = Path(out)
    groups = load_study(out)
    if not groups:
        raise fail(f"study results {out}", "hold no runs", "Run `hyfl study CONFIGS --out DIR`.")
    figures = out / FILES_DIR
    figures.mkdir(parents=True, exist_ok=True)
    lines = ["# Study summary", "", f"Results folder: `{out}`.", ""]
    lines += [
        "## Centralized optimum",
        "",
        "| data set | loss | lambda | P* |",
        "|---|---|---|---|",
    ]
    seen = set()
    for group in groups:
        for runs in group.settings.values():
            run = next(iter(runs.values()))
            if group.dataset in seen:
                break
            seen.add(group.dataset)
            lines.append(
                f"| {group.dataset} | {run.spec.get('loss')} | {run.spec.get('lam')} | "
                f"{_num(run.optimum_primal, 6)} |"
            )
    lines.append("")

    totals = {"pairs": {}, "wins": {}}
    lines += ["## Win counts", ""]
    lines += [
        f"| data set | budget | {focus} best (final loss) | {focus} best (best accuracy) | "
        "pairs won (final loss) | pairs won (best accuracy) |",
        "|---|---|---|---|---|---|",
    ]
    for group in groups:
        wins = win_counts(group.comparisons, focus)
        pairs = pairwise_counts(group.comparisons, focus)
        for metric in wins:
            for kind, counts in (("wins", wins), ("pairs", pairs)):
                a, b = totals[kind].get(metric, (0, 0))
                totals[kind][metric] = (a + counts[metric][0], b + counts[metric][1])
        lines.append(
            f"| {group.dataset} | {BUDGET_NAMES[group.budget]} | "
            f"{_ratio(wins['final_relative_loss'])} | {_ratio(wins['best_val_accuracy'])} | "
            f"{_ratio(pairs['final_relative_loss'])} | {_ratio(pairs['best_val_accuracy'])} |"
        )
    won = sum(v[0] for v in totals["pairs"].values())
    total = sum(v[1] for v in totals["pairs"].values())
    lines += [
        f"| **all** | both | {_ratio(totals['wins']['final_relative_loss'])} | "
        f"{_ratio(totals['wins']['best_val_accuracy'])} | "
        f"{_ratio(totals['pairs']['final_relative_loss'])} | "
        f"{_ratio(totals['pairs']['best_val_accuracy'])} |",
        "",
        f"Pairwise, as the paper counts (setting x budget x metric x opponent): {focus} is at "
        f"least as good as its opponent in **{won} of {total}** pairs (the paper: 69 of 72, "
        "over the nine panels of its Figures 3 and 5).",
        "",
    ]

    for group in groups:
        title = f"{group.dataset}, {BUDGET_NAMES[group.budget]}"
        slug = f"{group.dataset}-{'time' if group.budget == 'sim_time' else 'iterations'}"
        lines += [f"## {title}", ""]
        priced = sorted({str(info.get("he_costs")) for info in group.infos.values()
                         if info.get("he_costs")})
        latency = sorted({float(info["latency"]) for info in group.infos.values()
                          if info.get("latency") is not None})
        if priced or latency:
            lines += [
                "Simulated time: "
                + (f"{', '.join(f'{x:g}' for x in latency)} s per round trip; " if latency else "")
                + (f"HE operations priced by: {'; '.join(priced)}." if priced else ""),
                "",
            ]
        grid = {
            (info["clients"], info["fraction"]): group.settings[name]
            for name, info in group.infos.items()
        }
        x = "sim_time" if group.budget == "sim_time" else "iteration"
        image = plot_settings_grid(
            grid, figures / f"{slug}.png", x=x, title=title, dataset=group.dataset
        )
        lines += [f"![{title}]({FILES_DIR}/{image.name})", ""]
        if group.budget == "iterations":
            costs = plot_cost_breakdown_settings(
                {_setting_key(info): group.settings[n] for n, info in group.infos.items()},
                figures / f"{slug}-costs.png",
                title=f"{group.dataset}: simulated time per outer iteration",
            )
            lines += [f"![{group.dataset} costs]({FILES_DIR}/{costs.name})", ""]
        lines += _setting_table(group)
    path = out / SUMMARY_FILE
    path.write_text("\n".join(lines) + "\n")
    return path


def _setting_key(info) -> str:
    return f"{info['clients']}, {info['fraction']}"


def _setting_table(group: StudyGroup) -> list[str]:
    lines = [
        "| clients | fraction | algorithm | outer iterations | simulated s | final relative loss "
        "| best val. accuracy | best |",
        "|---|---|---|---|---|---|---|---|",
    ]
    best: dict[tuple[str, str], tuple[str, ...]] = {}
    for c in group.comparisons:
        best[(c.setting, c.metric)] = c.winners
    for name in sorted(group.settings, key=lambda n: _order(group.infos[n])):
        info = group.infos[name]
        for alg, run in group.settings[name].items():
            final = run.final
            marks = [
                label
                for metric, label in (("final_relative_loss", "loss"), ("best_val_accuracy", "acc"))
                if alg in best.get((name, metric), ())
            ]
            acc = run.column("val_accuracy")
            loss = run.column("relative_loss")
            lines.append(
                f"| {info['clients']} | {info['fraction']} | {alg} | {int(run.n_iterations)} | "
                f"{_num(final.get('sim_time'), 4)} | {_num(_last_finite(loss), 4)} | "
                f"{_num(_max_finite(acc), 4)} | {', '.join(marks)} |"
            )
    return lines + [""]


def _order(info) -> tuple:
    from hyfl.experiments.results import natural_key

    return (natural_key(str(info["clients"])), float(info["fraction"] or 0))


def _last_finite(values) -> float:
    import numpy as np

    finite = values[np.isfinite(values)]
    return float(finite[-1]) if finite.size else math.nan


def _max_finite(values) -> float:
    import numpy as np

    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else math.nan


def _num(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{float(value):.{digits}g}"


def _ratio(pair: Sequence[int]) -> str:
    return f"{pair[0]} of {pair[1]}"
