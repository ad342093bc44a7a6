"""Figures that do not mislead (issue 15, part 4): linear cost bars, the
majority-class rate on accuracy plots, a neutral report titled by the experiment."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from hyfl.costs import TIME_COMPONENTS  # noqa: E402
from hyfl.experiments import plots, results  # noqa: E402


def _row(algorithm: str, seconds: dict[str, float]) -> dict[str, float | str]:
    return {"algorithm": algorithm, **{f"{k}_per_iter": v for k, v in seconds.items()}}


# the case: milliseconds of compute next to a thousand seconds of encryption
ENCRYPTED = dict(zip(TIME_COMPONENTS, (3.6e-3, 2e-3, 0.5, 1400.0)))
PLAIN = dict(zip(TIME_COMPONENTS, (3.6e-3, 2e-3, 0.5, 0.0)))


@pytest.fixture
def capture_figure(monkeypatch):
    """Keep the figure a plot function saves, so its artists can be inspected."""
    saved = {}

    def save(fig, path):
        saved["fig"] = fig
        return path

    monkeypatch.setattr(plots, "_save", save)
    yield saved
    if "fig" in saved:
        plt.close(saved["fig"])


def _bars(ax) -> dict[str, list]:
    out: dict[str, list] = {}
    for patch in ax.patches:
        gid = patch.get_gid() or ""
        if gid.startswith("cost:"):
            out.setdefault(gid[5:], []).append(patch)
    return out


def test_cost_bars_are_proportional_to_seconds_on_a_linear_axis(capture_figure, tmp_path):
    rows = [_row("hyfdca", ENCRYPTED), _row("fedavg", PLAIN)]
    plots.plot_cost_breakdown(rows, tmp_path / "costs.png")
    (ax,) = capture_figure["fig"].axes
    assert ax.get_yscale() == "linear"
    assert ax.get_ylim()[0] == 0
    assert "linear" in ax.get_ylabel() and "seconds" in ax.get_ylabel()
    bars = _bars(ax)
    assert set(bars) == set(TIME_COMPONENTS)
    for key in TIME_COMPONENTS:
        heights = [p.get_height() for p in bars[key]]
        assert heights == pytest.approx([ENCRYPTED[key], PLAIN[key]])
    # stacked from zero: each bar starts where the previous component ended
    bottom = np.zeros(2)
    for key in TIME_COMPONENTS:
        assert [p.get_y() for p in bars[key]] == pytest.approx(bottom)
        bottom += [p.get_height() for p in bars[key]]
    # drawn height in display units is proportional to seconds (same factor for every bar)
    to_px = ax.transData.transform
    enc, cli = bars["time_encryption"][0], bars["time_client"][0]

    def px(p):
        return to_px((0, p.get_y() + p.get_height()))[1] - to_px((0, p.get_y()))[1]

    assert px(enc) / px(cli) == pytest.approx(1400.0 / 3.6e-3, rel=1e-6)


def test_log_cost_bars_are_side_by_side_and_say_so(capture_figure, tmp_path):
    rows = [_row("hyfdca", ENCRYPTED), _row("fedavg", PLAIN)]
    plots.plot_cost_breakdown(rows, tmp_path / "costs.png", log=True)
    (ax,) = capture_figure["fig"].axes
    assert ax.get_yscale() == "log"
    assert "log scale" in ax.get_ylabel() and "side by side" in ax.get_ylabel()
    for patches in _bars(ax).values():  # no bar stands on another
        assert all(p.get_y() == 0 for p in patches)
    assert [p.get_height() for p in _bars(ax)["time_client"]] == pytest.approx([3.6e-3] * 2)
    assert len(_bars(ax)["time_encryption"]) == 1  # a zero has no bar on a log axis


def test_settings_cost_bars_default_to_linear(capture_figure, tmp_path):
    rows = [_row("hyfdca", ENCRYPTED), _row("fedavg", PLAIN)]
    plots.plot_cost_breakdown_settings({"A": rows, "B": rows}, tmp_path / "s.png")
    (ax,) = capture_figure["fig"].axes
    assert ax.get_yscale() == "linear"
    heights = [p.get_height() for p in _bars(ax)["time_encryption"]]
    assert heights == pytest.approx([1400.0, 0.0, 1400.0, 0.0])


# --------------------------------------------------------------------------- majority class


def _accuracy_run(majority: float | None, in_summary: bool = True):
    import pandas as pd

    t = np.arange(0.0, 41.0)
    metrics = pd.DataFrame(
        {
            "iteration": t,
            "relative_loss": 1.0 / (1.0 + t),
            "val_accuracy": np.full(t.size, 0.905),  # learns nothing on an ijcnn1-like set
            "sim_time": 0.1 * t,
        }
    )
    config: dict = {"spec": {"data": "ijcnn1"}}
    if majority is not None:
        if in_summary:
            config["summary"] = {"majority_rate": majority}
        else:
            config["majority_rate"] = majority
    return results.LoadedRun("hyfdca", metrics, config)


def _majority_lines(fig) -> list:
    return [ln for ax in fig.axes for ln in ax.lines if ln.get_gid() == "majority_rate"]


@pytest.mark.parametrize("in_summary", [True, False])
def test_accuracy_plots_draw_the_majority_class_rate(capture_figure, tmp_path, in_summary):
    runs = {"hyfdca": _accuracy_run(0.905, in_summary)}
    assert plots.majority_rate(runs) == 0.905
    plots.plot_runs(runs, tmp_path / "compare.png")
    lines = _majority_lines(capture_figure["fig"])
    assert len(lines) == 2  # against outer iterations and against simulated time
    for line in lines:
        assert line.get_linestyle() == "--"
        assert set(line.get_ydata()) == {0.905}
        assert "majority class" in line.get_label()
    plt.close(capture_figure.pop("fig"))

    plots.plot_setting_figure(runs, tmp_path / "setting.png", window=1)
    fig = capture_figure["fig"]
    assert len(_majority_lines(fig)) == 2
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert any(text.startswith("majority class (0.905)") for text in legend)
    plt.close(capture_figure.pop("fig"))

    plots.plot_settings_grid({(4, 0.5): runs, (8, 0.5): runs}, tmp_path / "g.png", window=1)
    assert len(_majority_lines(capture_figure["fig"])) == 2  # one accuracy panel per cell


def test_no_majority_line_without_a_recorded_rate(capture_figure, tmp_path):
    runs = {"hyfdca": _accuracy_run(None)}
    assert plots.majority_rate(runs) is None
    plots.plot_runs(runs, tmp_path / "compare.png")
    assert _majority_lines(capture_figure["fig"]) == []


def test_majority_rate_comes_from_the_training_labels():
    from types import SimpleNamespace

    from hyfl.experiments.runner import majority_rate_of

    binary = SimpleNamespace(classes=None, loss=SimpleNamespace(classification=True),
                             Y=np.array([1.0, -1.0]))
    assert majority_rate_of(binary, [0, 0, 0, 1]) == 0.75
    assert majority_rate_of(binary, ["a", "b", "b", "c", "b"]) == 0.6
    assert majority_rate_of(binary, None) is None
    regression = SimpleNamespace(classes=None, loss=SimpleNamespace(classification=False),
                                 Y=np.array([0.3, 2.0]))
    assert majority_rate_of(regression, [0.3, 2.0]) is None


# --------------------------------------------------------------------------- the report


def _write_results(root, majority: float | None = 0.905):
    """A tiny config run: two algorithms, 21 outer iterations, costs, a resolved config.toml."""
    import json

    for k, name in enumerate(("hyfdca", "fedavg")):
        folder = root / name / "seed-0"
        folder.mkdir(parents=True)
        t = np.arange(0.0, 21.0)
        columns = {
            "iteration": t,
            "relative_loss": (1.0 + k) / (1.0 + t),
            "val_accuracy": np.full(t.size, 0.905),
            "sim_time": 2.0 * t,
            **{key: share * 2.0 * t for key, share in zip(TIME_COMPONENTS, (0.1, 0.1, 0.2, 0.6))},
        }
        lines = [",".join(columns)] + [
            ",".join(repr(float(columns[c][i])) for c in columns) for i in range(t.size)
        ]
        (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
        summary = {"n_clients": 9, "optimum": {"primal": 1.0}}
        if majority is not None:
            summary["majority_rate"] = majority
        spec = {"algorithm": name, "data": "ijcnn1", "loss": "hinge", "partition": "grid:3x3"}
        (folder / "run.json").write_text(json.dumps({"spec": spec, "summary": summary}))
    (root / "config.toml").write_text('[experiment]\nname = "ijcnn1-9-half"\ndataset = "ijcnn1"\n')
    return root


def test_report_is_titled_by_the_experiment_and_neutral(tmp_path):
    from hyfl.experiments.report import build_report

    root = _write_results(tmp_path / "out")  # a folder name that says nothing
    page = build_report(root).read_text()
    assert "<title>ijcnn1-9-half</title>" in page
    assert "<h1>ijcnn1-9-half</h1>" in page
    assert "wins" not in page.lower() and "out</title>" not in page
    # the headline states each algorithm's final relative loss (c / 21 at t = 20)
    assert "Final relative loss after 20 outer iterations: HyFDCA 0.04762; FedAvg 0.09524" in page
    assert "majority class scores 0.905" in page

    md = build_report(root, format="markdown", out=tmp_path / "r.md").read_text()
    assert md.startswith("# ijcnn1-9-half\n") and "wins" not in md.lower()


def test_report_explains_every_axis(tmp_path):
    from hyfl.experiments.report import build_report

    page = build_report(_write_results(tmp_path / "out"), format="markdown",
                        out=tmp_path / "r.md").read_text()
    # t / (t_max - omega): each symbol said in words
    assert "relative outer iteration t / (t_max - ω)" in page
    assert "t is the outer iteration" in page
    assert "t_max the last outer iteration of the longest run" in page
    assert "ω (omega) the width of the moving average in outer iterations" in page
    assert "T / max T" in page and "T is the simulated seconds so far" in page
    assert "(P(w) - P*) / |P*|" in page and "P* the centralized optimum" in page
    assert "majority-class rate" in page
    assert "seconds per outer iteration" in page and "linear axis" in page
    # every figure carries a caption right after it
    lines = page.splitlines()
    images = [i for i, line in enumerate(lines) if line.startswith("![")]
    assert images
    for i in images:
        assert lines[i + 2].startswith("*") and "axis" in lines[i + 2]


def test_title_without_a_config_describes_the_runs(tmp_path):
    from hyfl.experiments.report import experiment_name
    from hyfl.experiments.results import load_results

    root = _write_results(tmp_path / "out")
    (root / "config.toml").unlink()
    assert experiment_name(root, load_results(root)) == (
        "ijcnn1, hinge loss, grid:3x3: HyFDCA vs FedAvg"
    )
