"""Paper-style plots and ``hyfl report`` (hyfl.experiments.plots / report).

* The moving average matches a slow reference loop (NaN-safe, trailing).
* The paper's window rules, eq. 14 (relative time) and eq. 15 (relative
  outer iteration).
* ``load_results`` finds the ``compare`` layout, nested settings and seeds.
* ``build_report`` on a fake results folder (2 settings x 3 algorithms with
  synthetic curves) writes HTML and Markdown with the win counts worked out
  by hand below, and valid PNG figures.
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

from hyfl.costs import TIME_COMPONENTS
from hyfl.errors import HyflError
from hyfl.experiments.plots import (
    moving_average,
    paper_window,
    plot_cost_breakdown,
    plot_cost_breakdown_settings,
    plot_setting,
    plot_settings_grid,
    relative_iteration,
    relative_time,
)
from hyfl.experiments.report import (
    build_report,
    compare_settings,
    pairwise_counts,
    setting_rows,
    win_counts,
)
from hyfl.experiments.results import LoadedRun, load_results, load_run

PNG = b"\x89PNG\r\n\x1a\n"
ITERATIONS = np.arange(0, 101, 10, dtype=float)  # 11 evaluations, t = 0..100


def _reference_average(values, window):
    out = []
    for i in range(len(values)):
        seg = np.asarray(values[max(0, i - window + 1) : i + 1], dtype=float)
        seg = seg[np.isfinite(seg)]
        out.append(seg.mean() if seg.size else np.nan)
    return np.array(out)


# --------------------------------------------------------------------------- the paper's maths


@pytest.mark.parametrize("n", [0, 1, 2, 9, 50, 333])
@pytest.mark.parametrize("window", [1, 2, 3, 7, 10, 64, 500])
def test_moving_average_matches_slow_loop(n, window):
    rng = np.random.default_rng(n * 1000 + window)
    noisy = rng.random(n) * 10
    noisy[rng.random(n) < 0.2] = np.nan
    decaying = np.exp(-0.05 * np.arange(n)) * (1 + 0.3 * rng.random(n))  # several decades
    for values in (noisy, decaying):
        got = moving_average(values, window)
        want = values if window < 2 else _reference_average(values, window)
        assert got.shape == values.shape
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=0)


def test_moving_average_edge_cases():
    values = [1.0, np.nan, np.nan, np.nan, 5.0]
    np.testing.assert_allclose(moving_average(values, 2), [1.0, 1.0, np.nan, np.nan, 5.0])
    assert moving_average([3.0, 4.0], 0).tolist() == [3.0, 4.0]  # < 2: unchanged
    assert moving_average([], 5).size == 0
    # trailing: the last value averages the last `window` values only
    assert moving_average(np.arange(10.0), 4)[-1] == pytest.approx((6 + 7 + 8 + 9) / 4)


def test_paper_windows():
    # equal outer iterations, at the paper's run lengths (2,500 / 10,000 / 30,000)
    assert paper_window("mnist", 2500, equal_time=False) == 50
    assert paper_window("news20", 10_000, equal_time=False) == 150
    assert paper_window("reuters", 10_000, equal_time=False) == 150  # News20 stand-in
    assert paper_window("covtype", 30_000, equal_time=False) == 300
    assert paper_window("ijcnn1", 30_000, equal_time=False) == 300  # Covtype stand-in
    assert paper_window("covtype", 30_000, equal_time=False, cap=False) == 300
    # shorter runs: at most 2% of the run unless cap=False
    assert paper_window("covtype", 1000, equal_time=False) == 20
    assert paper_window("covtype", 1000, equal_time=False, cap=False) == 300
    # equal wall time: rounded 1% of the run; < 2 is not smoothed (1)
    assert paper_window("mnist", 11_605_640, equal_time=True) == 116_056
    assert paper_window("mnist", 250, equal_time=True) == 3  # 2.5 rounds half up
    assert paper_window("covtype", 149, equal_time=True) == 1
    assert paper_window("covtype", 44, equal_time=True) == 1
    # unknown datasets use the 1% rule
    assert paper_window("breast_cancer", 5000, equal_time=False) == 50


def test_relative_time_eq14():
    runs = {"a": np.array([0.0, 2.0, 4.0]), "b": np.array([0.0, 5.0, 10.0, np.nan])}
    rel = relative_time(runs)
    np.testing.assert_allclose(rel["a"], [0.0, 0.2, 0.4])
    np.testing.assert_allclose(rel["b"], [0.0, 0.5, 1.0, np.nan])
    with pytest.raises(HyflError, match="no simulated time"):
        relative_time({"a": np.zeros(3)})


def test_relative_iteration_eq15():
    assert relative_iteration(450, 1000, 100) == pytest.approx(0.5)
    np.testing.assert_allclose(relative_iteration([0, 900], 1000, 100), [0.0, 1.0])
    assert relative_iteration(500, 1000, 1) == pytest.approx(0.5)  # omega < 2: not smoothed
    with pytest.raises(HyflError):
        relative_iteration(1, 100, 100)


# --------------------------------------------------------------------------- fake results

# Two settings x three algorithms, t = 0, 10, ..., 100; curves chosen so that the
# winners can be read off by hand:
#
# grid:3x3, participation 0.5 ("A"); seconds per outer iteration hyfdca 2, fedavg 1,
# hyfem 1.5 -> totals 200 / 100 / 150, equal-time budget T* = 100, where hyfdca
# stops at t = 50, fedavg at 100, hyfem at 60.
#   relative loss c / (1 + t): hyfdca c=1, fedavg c=1.5, hyfem c=3
#     equal iterations (t=100): 0.0099 / 0.0149 / 0.0297     -> hyfdca
#     equal time:               0.0196 / 0.0149 / 0.0492     -> fedavg
#   val accuracy 0.5 + s t:     hyfdca s=0.004, fedavg 0.0019, hyfem 0.003
#     equal iterations: 0.90 / 0.69 / 0.80                    -> hyfdca
#     equal time:       0.70 / 0.69 / 0.68                    -> hyfdca
# grid:5x5, participation 0.1 ("B"); 1 s per iteration for all (T* = 100 = the end)
#   loss c = 1 / 2 / 1.2 -> hyfdca at both budgets
#   accuracy s = 0.004 / 0.002 / 0.0045 -> hyfem (0.95) at both budgets
#
# HyFDCA: loss 3 of 4 (A-iter, B-iter, B-time), accuracy 2 of 4 (A-iter, A-time).
# Pairwise: loss 2 + 1 + 2 + 2 = 7 of 8, accuracy 2 + 2 + 1 + 1 = 6 of 8.
SETTINGS = {
    "A": {
        "partition": "grid:3x3",
        "participation": "0.5",
        "n_clients": 9,
        "algorithms": {
            "hyfdca": dict(c=1.0, s=0.004, sec=2.0),
            "fedavg": dict(c=1.5, s=0.0019, sec=1.0),
            "hyfem": dict(c=3.0, s=0.003, sec=1.5),
        },
    },
    "B": {
        "partition": "grid:5x5",
        "participation": "0.1",
        "n_clients": 25,
        "algorithms": {
            "hyfdca": dict(c=1.0, s=0.004, sec=1.0),
            "fedavg": dict(c=2.0, s=0.002, sec=1.0),
            "hyfem": dict(c=1.2, s=0.0045, sec=1.0),
        },
    },
}
HEADLINE = (  # final relative loss c / 101, median (range) over settings A and B
    "Final relative loss at equal outer iterations, median over 2 settings (range): "
    "HyFDCA 0.009901 (0.009901 to 0.009901, 2 settings)"
)
WIN_SENTENCE = (
    "HyFDCA wins 3 of 4 comparisons on final relative loss, 2 of 4 on best validation accuracy"
)


def _metrics_csv(c: float, s: float, sec: float, offset: float = 0.0) -> str:
    t = ITERATIONS
    columns = {
        "iteration": t,
        "primal": 1.0 + c / (1 + t),
        "relative_loss": c / (1 + t) + offset,
        "val_accuracy": 0.5 + s * t,
        "round_trips": 2 * t,
        "bytes_up": 100.0 * t,
        "bytes_down": 50.0 * t,
        "encryptions": 3.0 * t,
        "decryptions": 2.0 * t,
        "additions": 1.0 * t,
        "sim_time": sec * t,
    }
    shares = dict(zip(TIME_COMPONENTS, (0.1, 0.05, 0.25, 0.6)))
    columns.update({name: share * sec * t for name, share in shares.items()})
    names = list(columns)
    lines = [",".join(names)]
    for i in range(t.size):
        lines.append(",".join(repr(float(columns[n][i])) for n in names))
    return "\n".join(lines) + "\n"


def _run_json(algorithm: str, setting: dict, seed: int = 0) -> str:
    return json.dumps(
        {
            "spec": {
                "algorithm": algorithm,
                "data": "synthetic",
                "loss": "hinge",
                "partition": setting["partition"],
                "participation": setting["participation"],
                "iterations": 100,
                "seed": seed,
                "latency": 0.25,
                "cipher": "none",
                "he_costs": "paper",
            },
            "algorithm": {"name": algorithm},
            "summary": {"n_clients": setting["n_clients"], "optimum": {"primal": 1.0}},
        }
    )


def _write_run(folder, algorithm, setting, params, seed=0, offset=0.0):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.csv").write_text(_metrics_csv(**params, offset=offset))
    (folder / "run.json").write_text(_run_json(algorithm, setting, seed))


def _fake_results(root):
    for name, setting in SETTINGS.items():
        for algorithm, params in setting["algorithms"].items():
            _write_run(root / name / algorithm, algorithm, setting, params)
    return root


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return _fake_results(tmp_path_factory.mktemp("results"))


# --------------------------------------------------------------------------- loading


def test_load_results_nested_layout(results):
    settings = load_results(results)
    assert list(settings) == ["A", "B"]
    assert list(settings["A"]) == ["hyfdca", "fedavg", "hyfem"]  # HyFDCA first
    run = settings["A"]["fedavg"]
    assert isinstance(run, LoadedRun)
    assert run.column("sim_time")[-1] == pytest.approx(100.0)
    assert np.isnan(run.column("gap")).all()  # missing columns read as NaN
    assert run.dataset == "synthetic" and run.optimum_primal == 1.0


def test_load_results_compare_layout_and_parquet(tmp_path):
    setting = SETTINGS["A"]
    out = tmp_path / "cmp"
    for algorithm, params in setting["algorithms"].items():
        _write_run(out / algorithm, algorithm, setting, params)
    (out / "summary.csv").write_text("algorithm\nhyfdca\n")  # compare's other files are ignored
    # Parquet instead of CSV is read too
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    csv = out / "hyfem" / "metrics.csv"
    pd.read_csv(csv).to_parquet(out / "hyfem" / "metrics.parquet")
    csv.unlink()
    settings = load_results(out)
    assert list(settings) == ["cmp"]
    assert set(settings["cmp"]) == {"hyfdca", "fedavg", "hyfem"}
    assert settings["cmp"]["hyfem"].column("relative_loss")[0] == pytest.approx(3.0)
    # a single run folder is a setting of one run
    single = load_results(out / "fedavg")
    assert list(single) == ["fedavg"] and list(single["fedavg"]) == ["fedavg"]


def test_load_results_averages_seeds_in_both_seed_layouts(tmp_path):
    setting = SETTINGS["B"]
    params = setting["algorithms"]["hyfdca"]
    # <setting>/<algorithm>/seed-<s>/ and <setting>/seed-<s>/<algorithm>/
    for s, offset in ((0, 0.0), (1, 0.5)):
        _write_run(
            tmp_path / "r1" / "B" / "hyfdca" / f"seed-{s}",
            "hyfdca",
            setting,
            params,
            seed=s,
            offset=offset,
        )
        _write_run(
            tmp_path / "r2" / "B" / f"seed_{s}" / "hyfdca",
            "hyfdca",
            setting,
            params,
            seed=s,
            offset=offset,
        )
    for root in ("r1", "r2"):
        run = load_results(tmp_path / root)["B"]["hyfdca"]
        assert run.seeds == (0, 1)
        assert run.column("relative_loss")[0] == pytest.approx(1.0 + 0.25)  # mean of seeds
    assert load_run(tmp_path / "r1" / "B" / "hyfdca").seeds == (0, 1)


def test_run_still_going_is_skipped_with_a_warning(tmp_path):
    setting = SETTINGS["A"]
    _write_run(tmp_path / "A" / "hyfdca", "hyfdca", setting, setting["algorithms"]["hyfdca"])
    (tmp_path / "A" / "fedavg").mkdir()
    (tmp_path / "A" / "fedavg" / "metrics.csv").write_text("iteration,relative_loss\n")
    with pytest.warns(UserWarning, match="has no rows"):
        settings = load_results(tmp_path)
    assert list(settings["A"]) == ["hyfdca"]


def test_empty_results_folder_is_a_clear_error(tmp_path):
    (tmp_path / "empty" / "nothing-here").mkdir(parents=True)
    with pytest.raises(HyflError, match="holds no runs"):
        load_results(tmp_path / "empty")
    with pytest.raises(HyflError, match="holds no runs"):
        build_report(tmp_path / "empty")
    with pytest.raises(HyflError, match="does not exist"):
        load_results(tmp_path / "missing")
    with pytest.raises(HyflError, match="format"):
        build_report(tmp_path / "empty", format="pdf")


# --------------------------------------------------------------------------- numbers


def test_win_counts_by_hand(results):
    settings = load_results(results)
    comparisons = compare_settings(settings)
    assert len(comparisons) == 8  # 2 settings x 2 budgets x 2 metrics
    winners = {(c.setting, c.budget, c.metric): c.winners for c in comparisons}
    assert winners["A", "iterations", "final_relative_loss"] == ("hyfdca",)
    assert winners["A", "sim_time", "final_relative_loss"] == ("fedavg",)
    assert winners["A", "sim_time", "best_val_accuracy"] == ("hyfdca",)
    assert winners["B", "iterations", "best_val_accuracy"] == ("hyfem",)
    assert win_counts(comparisons, "hyfdca") == {
        "final_relative_loss": (3, 4),
        "best_val_accuracy": (2, 4),
    }
    assert win_counts(comparisons, "fedavg")["final_relative_loss"] == (1, 4)
    assert win_counts(comparisons, "hyfem")["best_val_accuracy"] == (2, 4)
    assert pairwise_counts(comparisons, "hyfdca") == {
        "final_relative_loss": (7, 8),
        "best_val_accuracy": (6, 8),
    }
    rows = {r["algorithm"]: r for r in setting_rows(settings["A"])}
    assert rows["hyfdca"]["final_relative_loss"] == pytest.approx(1 / 101)
    assert rows["hyfdca"]["final_relative_loss_equal_time"] == pytest.approx(1 / 51)
    assert rows["hyfdca"]["rounds_to_1e-1"] == 10.0  # 1/11 <= 0.1
    assert rows["hyfdca"]["rounds_to_1e-2"] == 100.0  # 1/101 <= 0.01
    assert rows["hyfdca"]["rounds_to_1e-3"] is None
    assert rows["hyfdca"]["settled_1e-1"] == 10.0  # monotone: first touch = settled
    assert rows["hyfdca"]["bytes"] == pytest.approx(15_000.0)
    assert rows["hyfdca"]["he_ops"] == pytest.approx(600.0)
    assert rows["hyfdca"]["seconds_per_iteration"] == pytest.approx(2.0)


# --------------------------------------------------------------------------- the report


def test_markdown_report(results, tmp_path):
    out = build_report(results, format="markdown", out=tmp_path / "rep" / "report.md")
    text = out.read_text()
    assert WIN_SENTENCE not in text and "wins" not in text  # a neutral headline (issue 15)
    assert HEADLINE in text
    assert "7 of 8 on final relative loss, 6 of 8 on best validation accuracy" in text
    assert "## Setting: A" in text and "## Setting: B" in text
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    # per setting: curves + costs (2 x 2); grid against iterations and time; costs across
    assert len(images) == 7
    for image in images:
        assert image.startswith("report_files/")
        data = (out.parent / image).read_bytes()
        assert data.startswith(PNG) and len(data) > 1000


def test_html_report_is_self_contained(results):
    out = build_report(results)  # default: html next to the results
    assert out == results / "report.html"
    text = out.read_text()
    assert HEADLINE in text and "wins" not in text
    assert "<script" not in text and "http://" not in text and "https://" not in text
    images = re.findall(r'<img [^>]*src="([^"]+)"', text)
    assert len(images) == 7
    for src in images:
        assert src.startswith("data:image/png;base64,")
        data = base64.b64decode(src.split(",", 1)[1])
        assert data.startswith(PNG) and len(data) > 1000


# --------------------------------------------------------------------------- plot functions


def test_plot_functions_accept_runs_and_summary_rows(results, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = load_results(results)
    fig, (ax_loss, ax_acc) = plt.subplots(2, 1)
    lines = plot_setting(settings["A"], ax_loss, ax_acc, x="sim_time", window=20)
    assert set(lines) == {"hyfdca", "fedavg", "hyfem"}
    plt.close(fig)
    grid = {(9, 0.5): settings["A"], (25, 0.1): settings["B"]}
    for x in ("iteration", "sim_time"):
        path = plot_settings_grid(grid, tmp_path / f"grid-{x}.png", x=x)
        assert path.read_bytes().startswith(PNG)
    rows = [
        {"algorithm": "hyfdca", **{f"{k}_per_iter": 1.0 for k in TIME_COMPONENTS}},
        {"algorithm": "fedavg", **{f"{k}_per_iter": 0.01 for k in TIME_COMPONENTS}},
    ]
    assert plot_cost_breakdown(rows, tmp_path / "rows.png").read_bytes().startswith(PNG)
    path = plot_cost_breakdown_settings(
        {"A": settings["A"], "rows": rows}, tmp_path / "settings.png"
    )
    assert path.read_bytes().startswith(PNG)
    with pytest.raises(HyflError):
        plot_setting(settings["A"], ax_loss, x="round")


def test_settled_is_the_round_from_which_every_evaluation_stays_below():
    from hyfl.runtime.simulation import first_round_below, settled_round_below

    iterations = np.array([0.0, 10, 20, 30, 40, 50])
    values = np.array([1.0, 5e-4, 2e-2, 8e-4, np.nan, 9e-4])
    assert first_round_below(iterations, values, 1e-3) == 10.0
    assert settled_round_below(iterations, values, 1e-3) == 50.0  # NaN is not below
    assert settled_round_below(iterations[:4], values[:4], 1e-3) == 30.0
    assert settled_round_below(iterations[:3], values[:3], 1e-3) is None  # ends above
    assert settled_round_below(iterations, np.full(6, 1e-5), 1e-3) == 0.0


class _Run:
    """A minimal run: columns and a run.json-like config."""

    def __init__(self, sim_time, loss, config):
        self._columns = {"iteration": np.arange(len(sim_time), dtype=float),
                         "sim_time": np.asarray(sim_time, dtype=float),
                         "relative_loss": np.asarray(loss, dtype=float),
                         "val_accuracy": np.full(len(sim_time), np.nan)}
        self.config = config

    def column(self, name):  # (as RunResult and LoadedRun: all NaN for a missing column)
        return self._columns.get(name, np.full(len(self._columns["iteration"]), np.nan))


def test_equal_time_cut_ignores_runs_stopped_by_their_iteration_cap():
    from hyfl.experiments.report import budget_cutoffs, compare_setting

    budget = {"sim_time": 100.0, "max_iterations": 3}
    runs = {
        # capped after 3 rounds at 10 s: it did not use its time up
        "fast": _Run([0, 5, 8, 10], [1.0, 0.5, 0.4, 0.3], {"budget": budget,
                                                            "stopped_by": "iterations"}),
        # crossed the budget in its second round
        "slow": _Run([0, 60, 101], [1.0, 0.2, 0.1], {"budget": budget, "stopped_by": "sim_time"}),
    }
    assert budget_cutoffs(runs)["sim_time"] == 101.0  # not the capped run's 10 s
    loss = next(c for c in compare_setting("s", runs, budgets=("sim_time",))
                if c.metric == "final_relative_loss")
    assert loss.values == {"fast": 0.3, "slow": 0.1} and loss.winners == ("slow",)
    # every run capped: the smallest total time, as before
    runs["slow"].config = {"budget": budget, "stopped_by": "iterations"}
    assert budget_cutoffs(runs)["sim_time"] == 10.0
