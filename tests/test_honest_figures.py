"""Figures that do not mislead (issue 15, part 4): linear cost bars, the
majority-class rate on accuracy plots, a neutral report titled by the experiment."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from hyfl.costs import TIME_COMPONENTS  # noqa: E402
from hyfl.experiments import plots  # noqa: E402


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
