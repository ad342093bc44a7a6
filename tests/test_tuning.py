"""Random search and Gray Relational Analysis (``hyfl.experiments.tuning``)."""

import csv
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from hyfl.errors import HyflError
from hyfl.experiments.runner import RunSpec
from hyfl.experiments.tuning import (
    DEFAULT_BOUNDS,
    LARGER_IS_BETTER,
    METRICS,
    bounds_for,
    gray_relational_grades,
    is_divergent,
    resolve_bounds,
    sample,
    trial_metrics,
    tune,
)

SPEC = RunSpec(data="breast_cancer", partition="grid:2x2", iterations=10, val_fraction=0.2)


# -- bounds and sampling -------------------------------------------------------


def test_sample_stays_in_bounds_is_log_uniform_and_reproducible():
    bounds = {"a": (1e-4, 1e2), "b": (0.5, 0.5), "local_steps": (1, 50)}
    draws = [sample(bounds, np.random.default_rng(7)) for _ in range(2)]
    assert draws[0] == draws[1]  # same seed, same values
    rng = np.random.default_rng(0)
    many = [sample(bounds, rng) for _ in range(4000)]
    a = np.array([d["a"] for d in many])
    assert np.all((a >= 1e-4) & (a <= 1e2))
    # Log-uniform: the median is near the geometric mean 1e-1 and each decade
    # of the six holds about a sixth of the draws.
    assert abs(np.log10(np.median(a)) - (-1.0)) < 0.15
    decades = np.histogram(np.log10(a), bins=6, range=(-4, 2))[0] / a.size
    assert np.allclose(decades, 1 / 6, atol=0.03)
    assert all(d["b"] == 0.5 for d in many)  # lo == hi fixes the value
    steps = [d["local_steps"] for d in many]
    assert all(isinstance(q, int) and 1 <= q <= 50 for q in steps)
    assert abs(np.median(steps) - math.sqrt(50)) <= 1.5


def test_sample_needs_a_generator():
    with pytest.raises(HyflError, match="Generator"):
        sample({"a": (1e-3, 1.0)}, 0)
    with pytest.raises(HyflError, match="problem-relative"):
        sample({"iic": ("K/N", 1.0)}, np.random.default_rng(0))


def test_default_bounds_cover_every_algorithm_and_accept_overrides():
    from hyfl.algorithms import accepted_hyperparameters, algorithm_names, is_neural

    for name in algorithm_names():
        if is_neural(name):  # not tunable (no optimum); tune() refuses them
            assert name not in DEFAULT_BOUNDS
            continue
        assert DEFAULT_BOUNDS[name]
        assert set(DEFAULT_BOUNDS[name]) <= accepted_hyperparameters(name)
    assert DEFAULT_BOUNDS["fedavg"] == {"iic": ("K/N", 5.0), "a": (1e-5, 25.0), "b": (1e-5, 25.0)}
    assert DEFAULT_BOUNDS["hyfem"]["mu"] == (1e-2, 1e4)
    nested = bounds_for("fedavg", {"fedavg": {"a": [1e-3, 1.0]}, "hyfdca": {"iic": [0.1, 1]}})
    flat = bounds_for("fedavg", {"a": [1e-3, 1.0]})
    assert nested == flat == {"iic": ("K/N", 5.0), "a": (1e-3, 1.0), "b": (1e-5, 25.0)}


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        ({"a": [0.0, 1.0]}, r"tuning bounds of fedavg a has the bound 0.0 <= 0"),
        ({"a": [-1, 1.0]}, r"<= 0"),
        ({"a": [2.0, 1.0]}, r"lo = 2.0 > hi = 1.0"),
        ({"a": [1.0]}, r"must be a pair"),
        ({"a": ["2*K/M", 1.0]}, r"neither a number nor a positive multiple"),
        ({"a": [math.inf, math.inf]}, r"not a finite number"),
        ({"local_steps": [2.2, 2.8]}, r"holds no integer"),
        ({"gamma": [0.1, 1.0]}, r"tuning bound 'gamma' names no hyperparameter of fedavg"),
        ({"fedavg": {"a": [1e-3, 1]}, "b": [1, 2]}, r"mix per-algorithm tables"),
        ({"fedvag": {"a": [1e-3, 1]}}, r"'fedvag', which is not known"),
        ({"hyfdca": {"a": [1e-3, 1]}}, r"'a' names no hyperparameter of hyfdca"),
    ],
)
def test_invalid_bounds_are_clear_errors(bounds, message):
    with pytest.raises(HyflError, match=message):
        bounds_for("fedavg", bounds)


def test_invalid_bounds_fail_before_any_data_is_loaded():
    spec = RunSpec(data="no_such_dataset_anywhere")
    with pytest.raises(HyflError, match="lo = 5.0 > hi = 1.0"):
        tune(spec, "fedavg", seconds=1, bounds={"fedavg": {"b": [5.0, 1.0]}})


def test_problem_relative_bounds_resolve_on_the_setup():
    setup = SimpleNamespace(
        problem=SimpleNamespace(n_samples=400), partition=SimpleNamespace(n_clients=4)
    )
    resolved = resolve_bounds({"iic": ("K/N", 1.0), "a": ("2*K/N", 0.5)}, setup)
    assert resolved == {"iic": (0.01, 1.0), "a": (0.02, 0.5)}
    with pytest.raises(HyflError, match=r"resolved on this problem to \[0.01, 0.005\]"):
        resolve_bounds({"iic": ("K/N", 0.005)}, setup)


# -- metrics on hand-made rows -------------------------------------------------


def _rows(loss, column="relative_loss", **final):
    """Rows at iterations 0, 2, ..., with the given loss and final cumulative costs."""
    rows = []
    val = [math.nan, 0.5, 0.7, 0.9, 0.8, 0.85, 0.8]
    for i, value in enumerate(loss):
        row = {"iteration": 2.0 * i, "primal": 1.0 + value, "relative_loss": math.nan}
        row[column] = value
        row["val_accuracy"] = val[i % len(val)]
        rows.append(row)
    rows[-1].update(final)
    return rows


def test_trial_metrics_on_hand_made_rows():
    # Iterations 0, 2, ..., 12 (T = 12); loss 10, 6, 4, 3, 2, 1.5, 1.
    rows = _rows(
        [10, 6, 4, 3, 2, 1.5, 1],
        time_client=1.2,
        time_server=0.6,
        time_encryption=2.4,
        time_latency=99.0,  # the run's own latency is replaced by 0, 0.2575, 0.8
        round_trips=54.0,  # 4.5 per outer iteration, like HyFDCA
    )
    m = trial_metrics(rows)
    assert list(m) == list(METRICS)
    # (1.2 + 0.6 + 2.4) / 12 = 0.35 s of work per iteration, plus 54 / 12 = 4.5 trips x latency.
    assert m["time_per_iter_lat0"] == pytest.approx(0.35)
    assert m["time_per_iter_lat0.2575"] == pytest.approx(0.35 + 4.5 * 0.2575)  # 1.50875
    assert m["time_per_iter_lat0.8"] == pytest.approx(0.35 + 4.5 * 0.8)  # 3.95
    assert m["loss_last5"] == pytest.approx((4 + 3 + 2 + 1.5 + 1) / 5)  # 2.3
    assert m["max_val_accuracy"] == pytest.approx(0.9)  # NaN at iteration 0 is skipped
    # Differences -4, -2, -1, -1, -0.5, -0.5: mean -1.5, squared deviations
    # 6.25 + 0.25 + 0.25 + 0.25 + 1 + 1 = 9, variance 9 / 6 = 1.5.
    assert m["volatility"] == pytest.approx(math.sqrt(1.5))
    # Total decrease 10 - 1 = 9; 90% of it (8.1) is first reached at loss 1.5,
    # recorded at iteration 10.
    assert m["iterations_to_90pct"] == 10.0


def test_trial_metrics_fall_back_to_the_primal_without_an_optimum():
    rows = _rows([4, 3, 2], column="primal", round_trips=2.0)
    for row in rows:
        row["relative_loss"] = math.nan
    m = trial_metrics(rows)
    assert m["loss_last5"] == pytest.approx(3.0)
    assert m["iterations_to_90pct"] == 4.0  # 4 - 2 = 2 = 100% of the decrease at iteration 4
    flat = trial_metrics(_rows([2.0, 2.0, 2.0]))
    assert flat["iterations_to_90pct"] == 4.0  # never progressed: the last iteration
    assert flat["volatility"] == 0.0
    assert math.isnan(
        trial_metrics([{**r, "val_accuracy": math.nan} for r in rows])["max_val_accuracy"]
    )


def test_divergence_rule():
    assert not is_divergent(_rows([3.0, 1.0, 2.0]))  # went up, but ends below the start
    assert is_divergent(_rows([3.0, 1.0, 3.5]))  # ends above the start
    assert is_divergent(_rows([3.0, math.inf, 1.0]))
    assert is_divergent(_rows([3.0, math.nan, 1.0]))


def test_divergence_is_judged_on_the_gap_of_primal_dual_runs():
    # HyFDCA-like: the primal rises early while the duality gap falls -> not divergent.
    rows = _rows([1.0, 4.0, 2.0])
    for row, gap in zip(rows, [2.0, 1.5, 0.5], strict=True):
        row["gap"] = gap
    assert not is_divergent(rows)
    for row, gap in zip(rows, [2.0, 1.5, 2.5], strict=True):
        row["gap"] = gap
    assert is_divergent(rows)
    rows[1]["gap"] = math.nan  # a gap missing anywhere: judged on the loss again
    assert is_divergent(rows)


# -- Gray Relational Analysis --------------------------------------------------


def test_gray_relational_grades_hand_example():
    # Three alternatives, metrics: runtime (smaller better), accuracy
    # (larger better), loss (smaller better).
    matrix = [
        [1.0, 0.8, 10.0],  # A
        [3.0, 0.9, 30.0],  # B
        [2.0, 0.7, 20.0],  # C
    ]
    larger = [False, True, False]
    # Normalized (1 = best): runtime (3 - x) / 2 -> A 1, B 0, C 0.5;
    # accuracy (x - 0.7) / 0.2 -> A 0.5, B 1, C 0; loss (30 - x) / 20 -> A 1, B 0, C 0.5.
    # Deviations D = 1 - normalized: A (0, 0.5, 0), B (1, 0, 1), C (0.5, 1, 0.5);
    # D_min = 0, D_max = 1, so xi = (0 + 0.5) / (D + 0.5): D 0 -> 1, 0.5 -> 0.5, 1 -> 1/3.
    # A: (1 + 0.5 + 1) / 3 = 5/6; B: (1/3 + 1 + 1/3) / 3 = 5/9; C: (0.5 + 1/3 + 0.5) / 3 = 4/9.
    grades = gray_relational_grades(matrix, larger)
    assert grades == pytest.approx([5 / 6, 5 / 9, 4 / 9])
    # Weights 2, 1, 1: A (2 + 0.5 + 1) / 4 = 7/8; B (2/3 + 1 + 1/3) / 4 = 1/2;
    # C (1 + 1/3 + 0.5) / 4 = 11/24.
    weighted = gray_relational_grades(matrix, larger, weights=[2, 1, 1])
    assert weighted == pytest.approx([7 / 8, 1 / 2, 11 / 24])
    # zeta = 1: xi = 1 / (D + 1): D 0 -> 1, 0.5 -> 2/3, 1 -> 1/2.
    # A (1 + 2/3 + 1) / 3 = 8/9; B (1/2 + 1 + 1/2) / 3 = 2/3; C (2/3 + 1/2 + 2/3) / 3 = 11/18.
    assert gray_relational_grades(matrix, larger, zeta=1.0) == pytest.approx(
        [8 / 9, 2 / 3, 11 / 18]
    )


def test_gray_relational_grades_constant_columns_and_edge_cases():
    # A fourth alternative D and a constant column: the constant column gives
    # xi = 1 to everyone; the runtime column (smaller better) 1, 2, 2, 3
    # normalizes to 1, 0.5, 0.5, 0 -> xi 1, 1/2, 1/2, 1/3.
    matrix = [[1.0, 7.0], [2.0, 7.0], [2.0, 7.0], [3.0, 7.0]]
    grades = gray_relational_grades(matrix, [False, True])
    assert grades == pytest.approx([1.0, 0.75, 0.75, 2 / 3])
    assert gray_relational_grades([[1.0, 2.0]], [False, True]) == pytest.approx([1.0])
    assert gray_relational_grades(np.zeros((0, 2)), [False, True]).shape == (0,)
    with pytest.raises(HyflError, match="non-finite"):
        gray_relational_grades([[1.0, np.nan], [2.0, 1.0]], [False, True])
    with pytest.raises(HyflError, match="larger_is_better has 1 entries for 2 metrics"):
        gray_relational_grades(matrix, [False])
    with pytest.raises(HyflError, match="weights"):
        gray_relational_grades(matrix, [False, True], weights=[-1, 1])
    with pytest.raises(HyflError, match="zeta"):
        gray_relational_grades(matrix, [False, True], zeta=0.0)
    assert len(LARGER_IS_BETTER) == len(METRICS)


# -- the search ------------------------------------------------------------------


def test_tune_respects_max_trials_and_writes_files(tmp_path):
    result = tune(SPEC, "fedavg", seconds=60, max_trials=4, seed=3, out_dir=tmp_path)
    assert len(result.trials) == 4 and result.stopped_by == "max_trials"
    lo = 4 / 455  # K / N: 4 clients, 455 training samples after the 20% hold-out
    assert result.bounds["iic"] == pytest.approx((lo, 5.0))
    assert result.best == result.trials[result.best_index].hyper
    finite = [t.grade for t in result.trials if not t.divergent]
    assert result.best_trial.grade == max(finite)
    assert set(result.metrics_used) == set(METRICS)

    rows = list(csv.DictReader(open(tmp_path / "trials.csv")))
    assert len(rows) == 4
    assert {"trial", "divergent", "grade", "wall_seconds", "iic", "a", "b", *METRICS} <= set(
        rows[0]
    )
    assert float(rows[result.best_index]["a"]) == result.best["a"]
    best = tomllib.loads((tmp_path / "best.toml").read_text())
    assert best == {"algorithms": {"fedavg": result.best}}
    record = json.loads((tmp_path / "tuning.json").read_text())
    assert record["n_trials"] == 4 and record["n_divergent"] == result.n_divergent
    assert record["seed"] == 3 and record["seconds"] == 60
    assert record["bounds"]["iic"] == ["K/N", 5.0]
    assert record["bounds_resolved"]["iic"][0] == pytest.approx(lo)
    assert record["best"]["trial"] == result.best_index

    again = tune(SPEC, "fedavg", seconds=60, max_trials=4, seed=3)
    assert [t.hyper for t in again.trials] == [t.hyper for t in result.trials]


def test_tune_stops_at_a_tiny_time_budget():
    result = tune(SPEC, "hyfdca", seconds=1e-6)
    assert len(result.trials) == 1 and result.stopped_by == "time"  # the first trial always runs
    assert result.best == result.trials[0].hyper and result.best_trial.grade == 1.0


def test_divergent_trials_are_recorded_but_excluded():
    result = tune(SPEC, "fedavg", seconds=60, max_trials=8, bounds={"a": [1e-3, 1e4]})
    divergent = [t for t in result.trials if t.divergent]
    kept = [t for t in result.trials if not t.divergent]
    assert divergent and kept
    assert all(math.isnan(t.grade) for t in divergent)
    assert all(0 < t.grade <= 1 for t in kept)
    assert not result.best_trial.divergent
    assert max(t.hyper["a"] for t in kept) < min(t.hyper["a"] for t in divergent)


def test_all_divergent_is_a_clear_error(tmp_path):
    with pytest.raises(HyflError, match=r"all 3 trial\(s\) diverged.*Narrow the bounds"):
        tune(SPEC, "fedavg", seconds=60, max_trials=3, bounds={"a": [1e4, 1e5]}, out_dir=tmp_path)
    record = json.loads((tmp_path / "tuning.json").read_text())
    assert record["n_divergent"] == 3 and record["best"] is None
    assert not (tmp_path / "best.toml").exists()


def test_fixed_and_exclusive_hyperparameters():
    spec = RunSpec(**{**SPEC.__dict__, "hyper": {"local_steps": 3, "b": 2.0}})
    result = tune(spec, "fedavg", seconds=60, max_trials=2, bounds={"iic": [0.1, 0.1]})
    assert all(t.hyper["iic"] == 0.1 for t in result.trials)  # lo == hi fixes it
    # Tuning iic drops the fixed local_steps (they exclude each other); b is tuned.
    assert "local_steps" not in result.trials[0].hyper


def test_configuration_errors_are_not_divergence():
    with pytest.raises(HyflError, match="vertical"):
        tune(SPEC, "fedbcd-p", seconds=60, max_trials=2)
    vertical = RunSpec(data="breast_cancer", partition="vertical:2", iterations=5)
    with pytest.raises(HyflError, match="invalid configuration at their upper ends"):
        tune(vertical, "fedsgd", seconds=60, max_trials=2, bounds={"local_steps": [1, 5]})


def test_invalid_budget():
    with pytest.raises(HyflError, match="seconds must be a positive time budget"):
        tune(SPEC, "hyfdca", seconds=0)
    with pytest.raises(HyflError, match="infinite"):
        tune(SPEC, "hyfdca", seconds=math.inf)
    with pytest.raises(HyflError, match="max_trials"):
        tune(SPEC, "hyfdca", seconds=1, max_trials=0)
