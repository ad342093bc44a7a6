"""Results folders read back: one run, a folder of runs grouped into settings.

:func:`load_run` reads one run folder into a :class:`LoadedRun`;
:func:`load_results` discovers every run under a results folder and groups
them into settings. A run is any folder holding ``metrics.csv`` (also
``metrics.csv.gz`` or ``metrics.parquet``; Parquet wins if both exist), with
an optional ``run.json`` next to it. Understood layouts::

    RESULTS/<algorithm>/metrics.csv                    # `hyfl compare --out RESULTS`
    RESULTS/<setting>/<algorithm>/metrics.csv          # several compares side by side
    RESULTS/<setting>/<algorithm>/seed-<s>/metrics.csv # several seeds per algorithm
    RESULTS/<setting>/seed-<s>/<algorithm>/metrics.csv # one compare per seed
    RESULTS/<a>/<b>/.../<algorithm>/metrics.csv        # deeper nesting: setting "a/b/..."
    RESULTS/metrics.csv                                # a single run folder

The folder just above the metrics file names the algorithm (the label
``compare`` uses); folders named ``seed-<s>`` (also ``seed_<s>``, ``seed<s>``,
``seed=<s>``) at any depth are seeds and are averaged (mean at the outer
iterations every seed evaluated); what is left above the algorithm is the
setting's name (``RESULTS``'s own name for the flat ``compare`` layout).
Missing columns read as NaN, so older runs without cost columns still load.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hyfl._io import check_csv_shape, read_parquet
from hyfl.errors import HyflError, fail

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

METRICS_FILES = ("metrics.parquet", "metrics.csv", "metrics.csv.gz")
"""Names of a run's metrics file, in order of preference."""


_SEED_DIR = re.compile(r"^seed[-_=]?(\d+)$", re.IGNORECASE)


@dataclass
class LoadedRun:
    """One run read back from disk (or several seeds averaged).

    It quacks like :class:`~hyfl.runtime.simulation.RunResult` where plots
    need it (``column``, ``final``, ``config``), so every plot function takes
    either.

    Attributes
    ----------
    name : str
        The algorithm's label (its folder's name).
    metrics : pandas.DataFrame
        One row per evaluated outer iteration, numeric columns (see
        :data:`~hyfl.runtime.simulation.METRIC_COLUMNS`), sorted by iteration.
    config : dict
        The contents of ``run.json`` (empty without one).
    path : Path or None
        The folder it was read from.
    seeds : tuple of int
        Seeds averaged into ``metrics`` (empty for a single unseeded folder).
    """

    name: str
    metrics: pd.DataFrame
    config: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    seeds: tuple[int, ...] = ()

    def column(self, name: str) -> np.ndarray:
        """Column ``name`` as a float array (all NaN when the run lacks it)."""
        if name in self.metrics.columns:
            return self.metrics[name].to_numpy(dtype=float, na_value=np.nan)
        return np.full(len(self.metrics), np.nan)

    @property
    def final(self) -> dict[str, float]:
        """The last row (cumulative costs are totals there)."""
        if len(self.metrics) == 0:
            return {}
        return {str(k): float(v) for k, v in self.metrics.iloc[-1].items()}

    @property
    def spec(self) -> dict[str, Any]:
        spec = self.config.get("spec")
        return spec if isinstance(spec, dict) else {}

    @property
    def dataset(self) -> str | None:
        return self.spec.get("data")

    @property
    def n_iterations(self) -> float:
        """The last outer iteration evaluated."""
        it = self.column("iteration")
        return float(np.nanmax(it)) if np.isfinite(it).any() else float(len(it) - 1)

    @property
    def optimum_primal(self) -> float | None:
        return optimum_primal_of(self)


def optimum_primal_of(run) -> float | None:
    config = getattr(run, "config", None) or {}
    value = config.get("optimum_primal")
    if value is None:
        summary = config.get("summary")
        if isinstance(summary, dict) and isinstance(summary.get("optimum"), dict):
            value = summary["optimum"].get("primal")
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value != 0 else None


class _EmptyMetrics(HyflError):
    """A metrics file with a header but no rows (a run still going, or crashed)."""


def _metrics_file(folder: Path) -> Path | None:
    for name in METRICS_FILES:
        if (folder / name).is_file():
            return folder / name
    return None


def _read_metrics(path: Path) -> pd.DataFrame:
    import pandas as pd

    fix = "Re-run that algorithm or delete its folder; a run writes metrics.csv when it ends."
    try:
        # A results folder may come from someone else: bounded by the file (hyfl._io).
        if path.name.endswith(".parquet"):
            frame = read_parquet(path, f"metrics file {path}", fix)
        else:
            check_csv_shape(path, f"metrics file {path}", fix)
            frame = pd.read_csv(path)
    except HyflError:
        raise
    except Exception as exc:  # pandas/pyarrow raise many kinds
        raise fail(
            f"metrics file {path}",
            f"could not be read ({type(exc).__name__}: {exc})",
            "Re-run that algorithm or delete its folder; a run writes metrics.csv when it ends.",
        ) from None
    frame = frame.apply(pd.to_numeric, errors="coerce")
    if "iteration" not in frame.columns:
        frame.insert(0, "iteration", np.arange(len(frame), dtype=float))
    return frame.sort_values("iteration", kind="stable").reset_index(drop=True)


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "run.json"
    if not path.is_file():
        return {}
    try:
        # run.json may hold NaN (Python's json writes and reads it)
        return json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # Recursion: nested thousands deep
        raise fail(
            f"run record {path}",
            f"is not valid JSON ({exc})",
            "Fix or delete the file; plots only need metrics.csv.",
        ) from None


def _seed_of(name: str) -> int | None:
    match = _SEED_DIR.match(name)
    return int(match.group(1)) if match else None


def _algorithm_name(config: dict[str, Any]) -> str | None:
    algorithm = config.get("algorithm")
    if isinstance(algorithm, dict):
        algorithm = algorithm.get("name")
    if isinstance(algorithm, str) and algorithm:
        return algorithm
    spec = config.get("spec")
    return spec.get("algorithm") if isinstance(spec, dict) else None


def load_run(folder: str | Path, name: str | None = None) -> LoadedRun:
    """Read the run in ``folder`` (or the seeds ``folder/seed-<s>/`` averaged).

    Parameters
    ----------
    folder : path
        A folder holding ``metrics.csv`` / ``metrics.csv.gz`` /
        ``metrics.parquet`` and optionally ``run.json``; or a folder whose
        ``seed-<s>`` subfolders hold them (averaged, see :func:`average_runs`);
        or a metrics file itself.
    name : str, optional
        Label; default the folder's name (its parent's for a ``seed-<s>``
        folder).

    Raises
    ------
    HyflError
        When there is no metrics file, or it cannot be read or has no rows.
    """
    folder = Path(folder)
    if folder.is_file():
        folder, metrics_path = folder.parent, folder
    else:
        metrics_path = _metrics_file(folder)
    seed = _seed_of(folder.name)
    if name is None:
        name = folder.parent.name if seed is not None else folder.name
    if metrics_path is None:
        seed_dirs = sorted(
            (
                d
                for d in folder.glob("*")
                if d.is_dir() and _seed_of(d.name) is not None and _metrics_file(d) is not None
            ),
            key=lambda d: _seed_of(d.name),
        )
        if seed_dirs:
            return average_runs([load_run(d, name) for d in seed_dirs], name)
        raise fail(
            f"run folder {folder}",
            f"holds no {' / '.join(METRICS_FILES)}",
            "Point at a folder written by `hyfl run --out` or one algorithm folder of "
            "`hyfl compare --out`.",
        )
    frame = _read_metrics(metrics_path)
    if len(frame) == 0:
        raise _EmptyMetrics(
            f"metrics file {metrics_path} has no rows. The run may still be going or "
            "have crashed; re-run it or delete its folder."
        )
    seeds = () if seed is None else (seed,)
    return LoadedRun(
        name=name, metrics=frame, config=_read_config(folder), path=folder, seeds=seeds
    )


def average_runs(runs: Sequence[LoadedRun], name: str | None = None) -> LoadedRun:
    """Mean of several seeds' runs at the outer iterations all of them evaluated.

    NaN entries are skipped in the mean. The config is the first run's, with
    ``"seeds"`` listing the seeds averaged.
    """
    import pandas as pd

    runs = list(runs)
    if not runs:
        raise fail("average_runs", "got no runs", "Pass at least one LoadedRun.")
    if len(runs) == 1:
        return runs[0]
    frames = [r.metrics.assign(_member=i) for i, r in enumerate(runs)]
    stacked = pd.concat(frames, ignore_index=True)
    grouped = stacked.groupby("iteration", sort=True)
    complete = grouped["_member"].nunique() == len(runs)
    mean = grouped.mean(numeric_only=True)[complete].drop(columns="_member")
    mean = mean.reset_index()
    if len(mean) == 0:
        raise fail(
            f"the seeds of {name or runs[0].name}",
            "share no evaluated outer iteration",
            "Run every seed with the same --iterations and --eval-every.",
        )
    seeds = tuple(s for r in runs for s in (r.seeds or (None,)) if s is not None)
    config = dict(runs[0].config)
    config["seeds"] = list(seeds)
    # each seed's own verdict: the mean of the seeds' metrics is no run's model
    config[TRIVIAL_BY_SEED] = [pair for r in runs for pair in trivial_verdicts(r)]
    first = runs[0].path
    return LoadedRun(
        name=name or runs[0].name,
        metrics=mean,
        config=config,
        path=first.parent if first is not None and _seed_of(first.name) is not None else first,
        seeds=seeds,
    )


def natural_key(text: Any) -> tuple:
    """Sort key that orders ``grid:3x3`` before ``grid:12x12`` and numbers numerically."""
    if isinstance(text, (int, float, np.integer, np.floating)) and not isinstance(text, bool):
        return (0, float(text), ())
    parts = re.split(r"(\d+(?:\.\d+)?)", str(text))
    return (1, 0.0, tuple((0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(parts)))


def load_results(results_dir: str | Path) -> dict[str, dict[str, LoadedRun]]:
    """Discover every run under ``results_dir``, grouped by setting.

    See the module docstring for the folder layouts understood. Seeds of one
    (setting, algorithm) are averaged (:func:`average_runs`). Runs whose
    metrics file is empty (still running, crashed) are skipped with a warning.

    Returns
    -------
    dict of setting name -> dict of algorithm label -> LoadedRun
        Settings in natural order of their names; algorithms in natural
        order of their labels, with ``hyfdca`` first.

    Raises
    ------
    HyflError
        When ``results_dir`` does not exist or holds no run.
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise fail(
            f"results folder {root}",
            "does not exist" if not root.exists() else "is not a folder",
            "Pass the folder given to `hyfl compare --out` (or a folder of such folders).",
        )
    found: dict[tuple[str, str], list[tuple[int | None, Path]]] = {}
    folders = {p.parent for name in METRICS_FILES for p in root.rglob(name)}
    for folder in sorted(folders):
        rel = folder.relative_to(root).parts
        if any(part.startswith(".") for part in rel):
            continue
        seeds = [_seed_of(part) for part in rel if _seed_of(part) is not None]
        parts = [part for part in rel if _seed_of(part) is None]
        if parts:
            algorithm = parts[-1]
            setting = "/".join(parts[:-1]) or root.resolve().name
        else:  # RESULTS/metrics.csv or RESULTS/seed-0/metrics.csv: a single run folder
            algorithm = _algorithm_name(_read_config(folder)) or root.resolve().name
            setting = root.resolve().name
        found.setdefault((setting, algorithm), []).append((seeds[-1] if seeds else None, folder))

    settings: dict[str, dict[str, LoadedRun]] = {}
    for (setting, algorithm), members in found.items():
        runs = []
        for seed, folder in sorted(members, key=lambda m: (m[0] is None, m[0] or 0, str(m[1]))):
            try:
                run = load_run(folder, algorithm)
            except _EmptyMetrics as exc:
                warnings.warn(f"skipping {folder}: {exc}", stacklevel=2)
                continue
            if seed is not None:
                run.seeds = (seed,)
            runs.append(run)
        if runs:
            settings.setdefault(setting, {})[algorithm] = average_runs(runs, algorithm)
    if not settings:
        raise fail(
            f"results folder {root}",
            f"holds no runs (no {' / '.join(METRICS_FILES)} below it)",
            "Pass the folder given to `hyfl compare --out`, or a folder of such folders "
            "(<setting>/<algorithm>/[seed-<s>/]metrics.csv).",
        )
    ordered = {}
    for setting in sorted(settings, key=natural_key):
        runs = settings[setting]
        names = sorted(runs, key=lambda n: (n.lower() != "hyfdca", natural_key(n.lower())))
        ordered[setting] = {n: runs[n] for n in names}
    return ordered


def _fraction_of(participation: Any) -> float | str | None:
    if participation is None:
        return None
    if isinstance(participation, (int, float)) and not isinstance(participation, bool):
        return float(participation)
    text = str(participation).strip().lower()
    if text == "full":
        return 1.0
    if text.startswith("random:"):
        text = text.split(":", 1)[1]
    try:
        return float(text)
    except ValueError:
        return str(participation)


def _he_costs_label(config: Mapping[str, Any], spec: Mapping[str, Any]) -> str | None:
    """What priced a run's HE operations (its recorded cost model), else the spec's choice."""
    from hyfl.costs import he_label

    costs = config.get("costs")
    if isinstance(costs, dict) and isinstance(costs.get("he_costs"), dict):
        return he_label(costs)
    return spec.get("he_costs")


def setting_info(runs: Mapping[str, Any]) -> dict[str, Any]:
    """What the runs of one setting share, read from their ``run.json``.

    Keys: ``dataset``, ``loss``, ``partition``, ``participation``,
    ``n_clients``, ``clients`` (the partition spec, e.g. ``grid:3x3``, or the
    client count), ``fraction`` (participation as a number when it is one),
    ``iterations``, ``latency``, ``cipher``, ``he_costs``, ``seeds``; None
    when unknown.
    """
    info: dict[str, Any] = dict.fromkeys(
        (
            "dataset",
            "loss",
            "partition",
            "participation",
            "n_clients",
            "clients",
            "fraction",
            "iterations",
            "latency",
            "cipher",
            "he_costs",
            "seeds",
        )
    )
    for run in runs.values():
        config = getattr(run, "config", None) or {}
        spec = config.get("spec") if isinstance(config.get("spec"), dict) else {}
        summary = config.get("summary") if isinstance(config.get("summary"), dict) else {}
        for key, value in (
            ("dataset", spec.get("data")),
            ("loss", spec.get("loss")),
            ("partition", spec.get("partition")),
            ("participation", spec.get("participation")),
            ("n_clients", summary.get("n_clients")),
            ("latency", spec.get("latency")),
            ("cipher", spec.get("cipher")),
            ("he_costs", _he_costs_label(config, spec)),
        ):
            if info[key] is None and value is not None:
                info[key] = value
        iterations = getattr(run, "n_iterations", None)
        if iterations is None and hasattr(run, "column"):
            it = run.column("iteration")
            iterations = float(np.nanmax(it)) if np.isfinite(it).any() else None
        if iterations is not None:
            info["iterations"] = max(info["iterations"] or 0, int(iterations))
        seeds = getattr(run, "seeds", ())
        if seeds:
            info["seeds"] = sorted(set(info["seeds"] or ()) | set(seeds))
    info["clients"] = info["partition"] if info["partition"] is not None else info["n_clients"]
    info["fraction"] = _fraction_of(info["participation"])
    return info


TRIVIAL_BY_SEED = "trivial_by_seed"
"""Key of an averaged :class:`LoadedRun`'s config: ``[(seed, TrivialResult), ...]``."""


def trivial_verdicts(run: Any) -> list[tuple[int | None, Any]]:
    """``[(seed, TrivialResult)]`` of the runs in ``run`` no better than trivial.

    A single run's verdict is its ``run.json`` summary's ``no_better_than_trivial``;
    a folder written before hyfl recorded it is judged from its metrics
    (:func:`hyfl.runtime.trivial.judge_trivial`; with validation on its primal only, as
    such a folder does not record the validation labels' majority rate). Seeds averaged by
    :func:`average_runs` keep each seed's verdict.
    """
    from hyfl.runtime.trivial import TrivialResult, judge_trivial

    config = getattr(run, "config", None) or {}
    if TRIVIAL_BY_SEED in config:
        return list(config[TRIVIAL_BY_SEED])
    summary = config.get("summary") if isinstance(config.get("summary"), dict) else {}
    if "no_better_than_trivial" in summary:
        verdict = TrivialResult.from_dict(summary["no_better_than_trivial"])
    else:
        metrics = getattr(run, "metrics", None)
        rows = metrics.to_dict(orient="records") if hasattr(metrics, "to_dict") else metrics
        verdict = judge_trivial(rows or [], majority_rate=summary.get("majority_rate"),
                                val_majority_rate=summary.get("val_majority_rate"))
    seeds = getattr(run, "seeds", ()) or ()
    return [(seeds[0] if seeds else None, verdict)] if verdict is not None else []
