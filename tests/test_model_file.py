"""Model files (``model.npz``) and ``hyfl predict``."""

import csv
import json
import zipfile

import numpy as np
import pytest
from typer.testing import CliRunner

from hyfl.cli import app
from hyfl.data import load_data
from hyfl.errors import HyflError
from hyfl.model_file import (
    data_checksum,
    load_model,
    model_from_problem,
    save_model,
)
from hyfl.problem import make_problem

runner = CliRunner()


def _text(result) -> str:
    return " ".join(result.output.split())


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _breast_cancer_model(tmp_path, seed=0):
    data = load_data("breast_cancer")
    problem = make_problem(data, "hinge", 1e-3)
    w = np.random.default_rng(seed).normal(size=(problem.n_features, 1))
    model = model_from_problem(problem, w, data_meta=data.meta, partition="grid:3x3",
                               algorithm="hyfdca", data="breast_cancer", data_y=data.y)
    return data, problem, w, save_model(tmp_path / "model.npz", model)


def _write_libsvm(path, X, y):
    with open(path, "w") as f:
        for row, label in zip(X, y, strict=True):
            cells = " ".join(f"{j + 1}:{v:g}" for j, v in enumerate(row) if v != 0)
            f.write(f"{label:g} {cells}\n")
    return path


def test_round_trip_keeps_the_weights_decisions_and_provenance(tmp_path):
    data, problem, w, path = _breast_cancer_model(tmp_path)
    model = load_model(path)
    np.testing.assert_array_equal(model.weights, w)
    np.testing.assert_array_equal(model.decision_function(data.X), (data.X @ w)[:, 0])
    # Predictions are the original labels (0 malignant, 1 benign), not hyfl's -1/+1.
    expected = np.where(problem.predict(data.X, w) > 0, 1.0, 0.0)
    np.testing.assert_array_equal(model.predict(data.X), expected)
    assert (model.task, model.loss, model.lam, model.n_features) == ("binary", "hinge", 1e-3, 30)
    assert (model.partition, model.algorithm) == ("grid:3x3", "hyfdca")
    assert model.provenance["data_sha256"] == data_checksum(data.X, data.y)
    assert model.provenance["hyfl_version"] and model.provenance["n_samples"] == 569
    with pytest.raises(HyflError, match="X has 29 features but the model was trained on 30"):
        model.decision_function(data.X[:, :29])


def test_run_leaves_a_model_and_predict_reproduces_its_training_accuracy(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--iterations", "5", "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert (out / "model.npz").is_file()
    final = json.loads((out / "run.json").read_text())["summary"]["final"]
    pred = tmp_path / "pred.csv"
    result = runner.invoke(app, ["predict", str(out / "model.npz"), "--data", "breast_cancer",
                                 "--out", str(pred)])
    assert result.exit_code == 0, result.output
    rows = _rows(pred)
    assert list(rows[0]) == ["index", "prediction", "decision"] and len(rows) == 569
    assert {r["prediction"] for r in rows} <= {"0", "1"}
    data = load_data("breast_cancer")
    truth = np.where(data.y > 0, 1, 0)
    accuracy = np.mean([int(r["prediction"]) == t for r, t in zip(rows, truth, strict=True)])
    assert accuracy == pytest.approx(final["train_accuracy"], abs=1e-12)
    # The AUC, KS and average precision of the decision values are printed with it.
    from hyfl.metrics import ranking_metrics

    ranking = ranking_metrics(np.array([float(r["decision"]) for r in rows]),
                              np.where(truth == 1, 1, -1))
    assert (f"{final['train_accuracy']:.4f}, AUC {ranking['auc']:.4f}, KS "
            f"{ranking['ks']:.4f}, average precision {ranking['average_precision']:.4f} "
            "(the training data)") in _text(result)
    assert ranking["auc"] == pytest.approx(final["train_auc"], abs=1e-12)
    # The sign of each decision value gives its prediction.
    assert all((float(r["decision"]) >= 0) == (r["prediction"] == "1") for r in rows)


def test_a_logistic_model_predicts_probabilities(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--loss", "logistic", "--iterations", "5", "--out",
                                 str(out), "-q"])
    assert result.exit_code == 0, result.output
    pred = tmp_path / "pred.csv"
    result = runner.invoke(app, ["predict", str(out / "model.npz"), "--data", "breast_cancer",
                                 "--out", str(pred)])
    assert result.exit_code == 0, result.output
    rows = _rows(pred)
    assert list(rows[0]) == ["index", "prediction", "decision", "probability_0",
                             "probability_1"]
    decision = np.array([float(r["decision"]) for r in rows])
    p = np.array([[float(r["probability_0"]), float(r["probability_1"])] for r in rows])
    np.testing.assert_allclose(p[:, 1], 1.0 / (1.0 + np.exp(-decision)), rtol=1e-12)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)


def test_multiclass_labels_come_back_as_the_original_labels(tmp_path):
    rng = np.random.default_rng(1)
    centers = np.array([[1.0, 0, 0, 0.2], [0, 1.0, 0, 0.2], [0, 0, 1.0, 0.2]])
    labels = np.array([3, 5, 7])
    which = rng.integers(0, 3, size=90)
    X = np.round(centers[which] + 0.1 * rng.random((90, 4)), 3)
    train = _write_libsvm(tmp_path / "three.svm", X, labels[which])
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--data", str(train), "--partition", "grid:2x2",
                                 "--lam", "0.01", "--iterations", "5", "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    model = load_model(out / "model.npz")
    assert model.task == "multiclass" and list(model.labels) == [3.0, 5.0, 7.0]
    pred = tmp_path / "pred.csv"
    result = runner.invoke(app, ["predict", str(out / "model.npz"), "--data", str(train),
                                 "--out", str(pred)])
    assert result.exit_code == 0, result.output
    rows = _rows(pred)
    assert list(rows[0]) == ["index", "prediction", "decision_3", "decision_5", "decision_7"]
    predicted = np.array([int(r["prediction"]) for r in rows])
    assert set(predicted) <= {3, 5, 7}
    scores = np.array([[float(r[f"decision_{c}"]) for c in (3, 5, 7)] for r in rows])
    np.testing.assert_array_equal(predicted, labels[np.argmax(scores, axis=1)])
    final = json.loads((out / "run.json").read_text())["summary"]["final"]
    assert np.mean(predicted == labels[which]) == pytest.approx(final["train_accuracy"])


@pytest.mark.parametrize("data, n", [("wide", 31), ("synthetic", 40)])
def test_predict_refuses_another_feature_count_naming_both(tmp_path, data, n):
    _, _, _, path = _breast_cancer_model(tmp_path)
    if data == "wide":
        data = str(_write_libsvm(tmp_path / "wide.svm", np.eye(31), [0, 1] * 15 + [1]))
    result = runner.invoke(app, ["predict", str(path), "--data", data,
                                 "--out", str(tmp_path / "p.csv")])
    assert result.exit_code == 2
    text = _text(result)
    assert f"has {n} features but the model was trained on 30" in text
    assert "training data's 30 features" in text and "'breast_cancer'" in text
    assert not (tmp_path / "p.csv").exists()


def test_a_narrower_libsvm_file_is_read_with_the_training_width_and_index_base(tmp_path):
    """A LIBSVM file only shows its largest feature index: one whose last features are
    zero reads narrower and gets the model's width; a training file read as 0-based
    makes the prediction file be read 0-based too."""
    rng = np.random.default_rng(2)
    X = np.round(rng.random((40, 6)), 3)
    X[:, 0] = np.where(np.arange(40) % 2, 1.0, 0.0)
    y = np.where(X[:, 0] > 0, 1, 0)
    with open(tmp_path / "train.svm", "w") as f:  # 0-based indices: column 0 is index 0
        for row, label in zip(X, y, strict=True):
            f.write(f"{label} " + " ".join(f"{j}:{v:g}" for j, v in enumerate(row) if v) + "\n")
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--data", str(tmp_path / "train.svm"), "--partition",
                                 "vertical:2", "--iterations", "5", "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    model = load_model(out / "model.npz")
    assert model.provenance["zero_based"] is True and model.n_features == 6
    with open(tmp_path / "narrow.svm", "w") as f:  # no index 0 and nothing beyond index 2
        f.write("1 1:0.5 2:0.25\n0 2:1\n")
    result = runner.invoke(app, ["predict", str(out / "model.npz"), "--data",
                                 str(tmp_path / "narrow.svm"), "--out", str(tmp_path / "p.csv")])
    assert result.exit_code == 0, result.output
    scores = [float(r["decision"]) for r in _rows(tmp_path / "p.csv")]
    w, b = model.weights[:, 0], model.intercept[0]
    np.testing.assert_allclose(scores, [0.5 * w[1] + 0.25 * w[2] + b, w[2] + b], rtol=1e-12)


def _rewrite(path, **arrays):
    with np.load(path, allow_pickle=False) as f:
        content = {name: f[name] for name in f.files}
    content.update(arrays)
    np.savez(path, **content)


def _header(path) -> dict:
    with np.load(path, allow_pickle=False) as f:
        return json.loads(f["__header__"].tobytes())


@pytest.mark.parametrize("damage, message", [
    ("pickle", "cannot be read as a hyfl model"),
    ("foreign", "cannot be read as a hyfl model"),
    ("not_npz", "cannot be read as a hyfl model"),
    ("kind", "is not a hyfl model file"),
    ("version", "has model format 99, this hyfl reads formats 1, 2"),
    ("weights", "does not match its checksum"),
    ("header", "does not match its checksum"),
    ("missing", "does not exist"),
])
def test_unreadable_foreign_or_tampered_model_files_are_refused(tmp_path, damage, message):
    _, _, w, path = _breast_cancer_model(tmp_path)
    header = _header(path)
    if damage == "pickle":  # an object array: loading it would need pickle
        _rewrite(path, weights=np.array([{"a": 1}, None], dtype=object))
    elif damage == "foreign":
        np.savez(path, w=w)
    elif damage == "not_npz":
        path.write_text("not a model\n")
    elif damage == "kind":
        _rewrite(path, __header__=np.frombuffer(b'{"kind": "other"}', dtype=np.uint8))
    elif damage == "version":
        header["format"] = 99
        _rewrite(path, __header__=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8))
    elif damage == "weights":
        _rewrite(path, weights=w * 2)
    elif damage == "header":
        header["lam"] = 1.0
        _rewrite(path, __header__=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8))
    else:
        path.unlink()
    assert damage != "pickle" or "weights.npy" in zipfile.ZipFile(path).namelist()
    with pytest.raises(HyflError, match=message):
        load_model(path)
    result = runner.invoke(app, ["predict", str(path), "--data", "breast_cancer",
                                 "--out", str(tmp_path / "p.csv")])
    assert result.exit_code == 2 and message in _text(result)
    assert not (tmp_path / "p.csv").exists()


def test_compare_and_config_runs_write_a_model_per_run(tmp_path):
    out = tmp_path / "cmp"
    # (without intercept: FedAvg's 3 rounds beat the majority class only then)
    result = runner.invoke(app, ["compare", "--algorithms", "hyfdca,fedavg", "--iterations", "3",
                                 "--intercept", "off", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    for name in ("hyfdca", "fedavg"):
        model = load_model(out / name / "model.npz")
        assert model.algorithm == name and model.n_features == 30
        assert model.intercept.tolist() == [0.0]
    config = tmp_path / "exp.toml"
    config.write_text('[experiment]\nname = "m"\nseeds = [0]\nbudget = { iterations = 3 }\n'
                      '[data]\ndataset = "breast_cancer"\n[partition]\nspec = "grid:2x2"\n'
                      '[algorithms.hyfdca]\n')
    result = runner.invoke(app, ["run", str(config), "--out", str(tmp_path / "exp"), "-q"])
    assert result.exit_code == 0, result.output
    model = load_model(tmp_path / "exp" / "hyfdca" / "seed-0" / "model.npz")
    assert (model.algorithm, model.partition) == ("hyfdca", "grid:2x2")
    assert model.n_features == 30 and model.intercept[0] != 0  # the default intercept
