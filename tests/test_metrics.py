"""Ranking metrics (AUC, KS, average precision) and the logistic model's probabilities,
against slow definitions written out here."""

from __future__ import annotations

import numpy as np
import pytest

from hyfl.losses import Logistic
from hyfl.metrics import ranking_metrics


def _auc_by_pairs(score, positive):
    """P(score of a positive > score of a negative), ties counting one half."""
    pos, neg = score[positive], score[~positive]
    wins = sum(float(np.sum(p > neg)) + 0.5 * float(np.sum(p == neg)) for p in pos)
    return wins / (pos.size * neg.size)


def _ks_by_thresholds(score, positive):
    """The largest gap between the true and false positive rates over all thresholds."""
    best = 0.0
    for threshold in np.unique(score):
        predicted = score >= threshold
        tpr = np.sum(predicted & positive) / np.sum(positive)
        fpr = np.sum(predicted & ~positive) / np.sum(~positive)
        best = max(best, tpr - fpr)
    return best


def _average_precision_by_definition(score, positive):
    """sum over thresholds of (recall increase) x precision, from the highest score down."""
    total, previous_recall = 0.0, 0.0
    for threshold in np.unique(score)[::-1]:
        predicted = score >= threshold
        recall = np.sum(predicted & positive) / np.sum(positive)
        precision = np.sum(predicted & positive) / np.sum(predicted)
        total += (recall - previous_recall) * precision
        previous_recall = recall
    return total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_binary_metrics_match_their_definitions(seed):
    rng = np.random.default_rng(seed)
    labels = np.where(rng.random(200) < 0.3, 1, -1)
    score = np.round(labels * 0.8 + rng.normal(size=200), 1)  # rounded: ties happen
    found = ranking_metrics(score, labels)
    positive = labels == 1
    assert found["auc"] == pytest.approx(_auc_by_pairs(score, positive), abs=1e-12)
    assert found["ks"] == pytest.approx(_ks_by_thresholds(score, positive), abs=1e-12)
    assert found["average_precision"] == pytest.approx(
        _average_precision_by_definition(score, positive), abs=1e-12)


def test_multiclass_metrics_are_one_vs_rest_means():
    rng = np.random.default_rng(4)
    classes = np.array([3.0, 5.0, 9.0])
    labels = classes[rng.integers(3, size=150)]
    scores = rng.normal(size=(150, 3)) + (labels[:, None] == classes[None, :])
    found = ranking_metrics(scores, labels, classes)
    per_class = [ranking_metrics(scores[:, c], np.where(labels == v, 1, -1))
                 for c, v in enumerate(classes)]
    for name in found:
        assert found[name] == pytest.approx(np.mean([m[name] for m in per_class]))


def test_metrics_are_nan_when_undefined_and_shapes_are_checked():
    assert np.isnan(ranking_metrics(np.arange(4.0), np.ones(4))["auc"])  # one class only
    diverged = ranking_metrics(np.array([np.inf, 0.0, np.nan, 1.0]), np.array([1, -1, 1, -1]))
    assert all(np.isnan(v) for v in diverged.values())
    # A class absent from the labels is left out of the multiclass mean.
    scores = np.array([[2.0, 0.0, 0.1], [0.0, 2.0, 0.2], [1.0, 0.5, 0.3], [0.2, 1.5, 0.4]])
    absent = ranking_metrics(scores, np.array([0, 1, 0, 1]), np.array([0, 1, 2]))
    assert absent["auc"] == 1.0
    perfect = ranking_metrics(np.array([-2.0, -1.0, 1.0, 2.0]), np.array([-1, -1, 1, 1]))
    assert perfect == {"auc": 1.0, "ks": 1.0, "average_precision": 1.0}
    with pytest.raises(ValueError, match="3 scores for 4 labels"):
        ranking_metrics(np.zeros(3), np.ones(4))
    with pytest.raises(ValueError, match="need their classes"):
        ranking_metrics(np.zeros((4, 2)), np.ones(4))


def test_logistic_probabilities():
    scores = np.array([-800.0, -3.0, 0.0, 2.0, 800.0])
    logs = Logistic.log_probabilities(scores)
    np.testing.assert_allclose(np.exp(logs[1:4, 1]), 1.0 / (1.0 + np.exp(-scores[1:4])))
    np.testing.assert_allclose(np.exp(logs).sum(axis=1), 1.0)
    assert np.all(np.isfinite(logs)) and logs[0, 1] == pytest.approx(-800.0)
    many = np.array([[0.5, -1.0, 2.0], [-3.0, 0.0, 0.0]])
    p = np.exp(Logistic.log_probabilities(many))
    ovr = 1.0 / (1.0 + np.exp(-many))
    np.testing.assert_allclose(p, ovr / ovr.sum(axis=1, keepdims=True))


@pytest.mark.parametrize("seed", [5, 6])
def test_binary_metrics_match_scikit_learn(seed):
    from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

    rng = np.random.default_rng(seed)
    labels = np.where(rng.random(5000) < 0.1, 1, -1)
    score = np.round(labels + 2 * rng.normal(size=5000), 2)
    found = ranking_metrics(score, labels)
    fpr, tpr, _ = roc_curve(labels == 1, score)
    assert found["auc"] == pytest.approx(roc_auc_score(labels == 1, score), abs=1e-12)
    assert found["ks"] == pytest.approx(np.max(tpr - fpr), abs=1e-12)
    assert found["average_precision"] == pytest.approx(
        average_precision_score(labels == 1, score), abs=1e-12)


def test_runs_report_the_first_round_at_each_auc_target(tmp_path):
    """FedBCD's results are rounds to a target AUC: run.json and summary.csv have them."""
    import csv
    import json

    from typer.testing import CliRunner

    from hyfl.cli import app
    from hyfl.experiments.runner import AUC_TARGETS

    out = tmp_path / "cmp"
    result = CliRunner().invoke(app, ["compare", "--algorithms", "hyfdca", "--val-fraction",
                                      "0.25", "--iterations", "20", "--out", str(out),
                                      "--no-progress"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "hyfdca" / "run.json").read_text())["summary"]
    reached = summary["rounds_to_val_auc"]
    assert set(reached) == {f"{level:g}" for level in AUC_TARGETS}
    rows = list(csv.DictReader(open(out / "hyfdca" / "metrics.csv")))
    aucs = [(float(r["iteration"]), float(r["val_auc"])) for r in rows]
    for level in AUC_TARGETS:
        first = next((it for it, auc in aucs if auc >= level), None)
        assert reached[f"{level:g}"] == first
    table = list(csv.DictReader(open(out / "summary.csv")))[0]
    cell = table["rounds_to_auc_0.8"]
    assert (float(cell) if cell else None) == reached["0.8"]
