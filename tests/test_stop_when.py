"""``stop_when``: a run ends at the caller's condition and says so (``stopped_by ==
"stop_when"``, the reason in ``stop_reason``), never as if it had diverged.

The estimators stop at their tolerance this way: a converged fit is recorded
honestly, after as many rounds as before.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import MinMaxScaler

import hyfl.estimators as estimators
from hyfl import HyFDCAClassifier
from hyfl.algorithms import make_algorithm
from hyfl.errors import HyflError
from hyfl.neural.engine import run as run_neural
from hyfl.participation import Full
from hyfl.privacy.ciphers import make_cipher
from hyfl.runtime.budget import STOPPED_BY, Budget
from hyfl.runtime.checkpoint import Checkpointing
from hyfl.runtime.protocol import run_protocol
from test_resume import assert_same_run, run, setup_for


def stop_from(round_: int):
    """A stop condition met from round ``round_`` on; records the rounds it is asked."""
    asked = []

    def stop(row):
        asked.append(int(row["iteration"]))
        return f"enough: round {int(row['iteration'])}" if row["iteration"] >= round_ else None

    stop.asked = asked
    return stop


# ----------------------------------------------------------------------------- the engine


def test_simulate_stops_after_the_evaluation_that_meets_the_condition():
    stop = stop_from(8)
    result = run("hyfdca", 20, stop_when=stop)  # eval_every=3
    assert stop.asked == [3, 6, 9]  # after each evaluated round, not at the start
    assert result.config["stopped_by"] == "stop_when"
    assert result.config["stop_reason"] == "enough: round 9"
    assert result.config["rounds"] == 9 and len(result.round_times) == 9
    assert result.config["budget"] == {"iterations": 20}
    # Up to there, exactly the run of 9 rounds (the same rows, iterates and model).
    assert_same_run(run("hyfdca", 9), result)
    plain = run("hyfdca", 9)
    assert plain.config["stopped_by"] == "iterations" and "stop_reason" not in plain.config


def test_stop_when_wins_over_the_budget_in_the_round_that_meets_both():
    assert run("hyfdca", 9, stop_when=stop_from(9)).config["stopped_by"] == "stop_when"
    budget = Budget(10, 1, sim_time=5.0, stop_when=lambda row: "why")
    assert budget.stopped_by(10, True, {"iteration": 10.0}) == ("stop_when", "why")
    assert budget.stopped_by(10, True, None) == ("sim_time", None)
    assert budget.stopped_by(10, False, None) == ("iterations", None)
    assert budget.stopped_by(9, False, None) == (None, None)
    assert set(STOPPED_BY) == {"iterations", "sim_time", "stop_when", "diverged"}


def test_a_stop_condition_that_is_not_a_function_or_returns_no_reason_is_refused():
    with pytest.raises(HyflError, match="stop_when is 5, not a function"):
        run("hyfdca", 3, stop_when=5)
    with pytest.raises(HyflError, match="stop_when returned True"):
        run("hyfdca", 3, stop_when=lambda row: True)
    with pytest.raises(HyflError, match="stop_when returned ''"):
        run("hyfdca", 3, stop_when=lambda row: "")


def test_a_run_ended_by_stop_when_resumes_as_an_uninterrupted_run_would(tmp_path):
    path = tmp_path / "checkpoint.npz"
    first = run("hyfdca", 20, stop_when=stop_from(8), checkpointing=Checkpointing(path))
    assert first.config["rounds"] == 9 and path.exists()
    # The same condition with a larger budget: still ended at round 9, nothing runs.
    again = run("hyfdca", 30, stop_when=stop_from(8),
                checkpointing=Checkpointing(path, resume=True))
    assert_same_run(first, again)
    assert again.config["stopped_by"] == "stop_when" and again.config["resumed_from"] == [9]
    assert again.config["stop_reason"] == "enough: round 9"
    # Without it the run goes on, as an uninterrupted run of 20 rounds.
    more = run("hyfdca", 20, checkpointing=Checkpointing(path, resume=True))
    assert_same_run(run("hyfdca", 20), more)
    assert more.config["stopped_by"] == "iterations" and "stop_reason" not in more.config


def test_a_stop_at_a_round_evaluated_only_because_the_budget_ended_there_is_not_kept(
        tmp_path):
    """Round 7 was evaluated because the first budget was 7 rounds; with 20, an
    uninterrupted run evaluates rounds 6 and 9, so it stops at 9, and so does the resume."""
    path = tmp_path / "checkpoint.npz"
    first = run("hyfdca", 7, stop_when=stop_from(7), checkpointing=Checkpointing(path))
    assert first.config["stopped_by"] == "stop_when" and first.config["rounds"] == 7
    resumed = run("hyfdca", 20, stop_when=stop_from(7),
                  checkpointing=Checkpointing(path, resume=True))
    uninterrupted = run("hyfdca", 20, stop_when=stop_from(7))
    assert uninterrupted.config["rounds"] == 9
    assert_same_run(uninterrupted, resumed)
    assert resumed.config["stop_reason"] == uninterrupted.config["stop_reason"]


def test_the_protocol_engine_stops_when_asked():
    s = setup_for("hyfdca")
    result = run_protocol(make_algorithm("hyfdca", {"iic": 0.2}), s.problem, s.partition,
                          s.participation, 20, make_cipher("none"), eval_every=2,
                          monitor_duals=False, stop_when=stop_from(3))
    assert result.config["stopped_by"] == "stop_when" and result.config["rounds"] == 4
    assert result.config["stop_reason"] == "enough: round 4"
    assert [r["iteration"] for r in result.metrics] == [0, 2, 4]


class _Countdown:
    """A stand-in neural algorithm whose loss is 1 / (1 + t) after round t."""

    name = "countdown"

    def setup(self, data, seed):
        return 0

    def round(self, state, active, rng):
        return state + 1

    def round_stats(self, state):
        return {"round_trips": 1.0}

    def evaluate(self, state, data):
        return {"loss": 1.0 / (1 + state)}

    def export(self, state):
        return {"t": np.array(state)}

    def config(self):
        return {"name": self.name}


def test_the_neural_engine_stops_when_asked():
    data = SimpleNamespace(n_clients=2)
    low = run_neural(_Countdown(), data, Full(2), 10, eval_every=2,
                     stop_when=lambda row: "loss below 0.2" if row["loss"] < 0.2 else None)
    assert low.config["stopped_by"] == "stop_when" and low.config["rounds"] == 6
    assert low.config["stop_reason"] == "loss below 0.2"
    assert [r["iteration"] for r in low.metrics] == [0, 2, 4, 6]
    full = run_neural(_Countdown(), data, Full(2), 10, eval_every=2)
    assert full.config["stopped_by"] == "iterations" and full.config["rounds"] == 10
    assert full.config["budget"] == {"iterations": 10} and "stop_reason" not in full.config


# ----------------------------------------------------------------------------- the estimators


@pytest.fixture(scope="module")
def breast_cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return MinMaxScaler().fit_transform(X), y


def test_a_converged_fit_is_recorded_as_converged_not_diverged(breast_cancer, monkeypatch):
    X, y = breast_cancer
    results = []
    original = estimators.simulate

    def spy(*args, **kwargs):
        results.append(original(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(estimators, "simulate", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # converged: no warning
        clf = HyFDCAClassifier(partition="grid:2x2", random_state=0, tol=1e-2,
                               max_iter=300).fit(X, y)
    (result,) = results
    assert result.config["stopped_by"] == "stop_when"
    assert result.config["stop_reason"].startswith("converged: relative duality gap <= tol")
    assert clf.n_iter_ == result.config["rounds"] < clf.max_iter
    assert len(clf.history_["gap"]) == clf.n_iter_ + 1
    assert clf.gap_ <= 1e-2 * abs(clf.history_["primal"][-1])

    # n_iter_ as before: the first round at the tolerance in a run that does not stop.
    with pytest.warns(ConvergenceWarning):
        long = HyFDCAClassifier(partition="grid:2x2", random_state=0, tol=0.0,
                                max_iter=clf.n_iter_ + 5).fit(X, y)
    assert results[-1].config["stopped_by"] == "iterations"
    history = long.history_
    reached = np.flatnonzero(history["gap"][1:] <= 1e-2 * np.abs(history["primal"][1:])) + 1
    assert clf.n_iter_ == history["iteration"][reached[0]]
    for column in ("primal", "dual", "gap"):
        np.testing.assert_array_equal(clf.history_[column],
                                      history[column][: clf.n_iter_ + 1])


def test_a_fit_that_ends_at_max_iter_still_warns(breast_cancer):
    X, y = breast_cancer
    with pytest.warns(ConvergenceWarning, match="max_iter=5"):
        clf = HyFDCAClassifier(partition="grid:2x2", random_state=0, tol=1e-8,
                               max_iter=5).fit(X, y)
    assert clf.n_iter_ == 5
