"""Scoring new rows: ``hyfl predict`` on party files with or without labels, and
``hyfl deploy predict``, where the parties score them without pooling them.

* Unlabelled party files are scored under their rows' own ids, with the labels'
  own text values; the scores are the model's on the pooled rows.
* A logistic model's probabilities sum to 1 and are the sigmoid of the score.
* Files whose columns are not the model's: the message names only the differing
  columns, with their close matches.
* Deployed (the coordinator and the parties in this process, the real codec and
  messages): each party's share of the margins reaches the asking party masked
  and sealed, and the asker's scores equal ``hyfl predict`` on the pooled rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hyfl.data import load_party_spec
from hyfl.errors import HyflError
from hyfl.model_file import load_model, model_from_problem, save_model
from hyfl.predict import predict_data
from hyfl.problem import make_problem, solve_centralized
from synthetic_data import organisation_files


def _model(tmp_path, files, loss="hinge"):
    """A model trained (centrally) on the organisations' labelled files."""
    spec = f"parties:{','.join(map(str, files))};id=customer;label=income"
    dataset, _ = load_party_spec(spec, psi=False)
    problem = make_problem(dataset, loss, 0.05)
    w = solve_centralized(problem, cache=False).w
    path = tmp_path / f"model-{loss}.npz"
    save_model(path, model_from_problem(problem, w, data_meta=dataset.meta))
    return path


def _unlabelled(tmp_path, files):
    """The same organisations' files without their label column (new rows to score)."""
    out = []
    for path in files:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        frame = frame.drop(columns=[c for c in ("income",) if c in frame])
        new = tmp_path / "new" / path.name
        new.parent.mkdir(exist_ok=True)
        frame.to_parquet(new) if new.suffix == ".parquet" else frame.to_csv(new, index=False)
        out.append(new)
    return out


def _pooled_scores(model_path, ids, X):
    """The model's scores of the organisations' pooled rows, by id."""
    model = load_model(model_path)
    return dict(zip(ids, model.decision_function(X)))


def test_unlabelled_party_files_are_scored_under_their_own_ids(tmp_path):
    files, ids, X, y = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files)
    new = _unlabelled(tmp_path, files)
    done = predict_data(model, f"parties:{','.join(map(str, new))};id=customer",
                        tmp_path / "p.csv")
    assert done.accuracy is None and done.n_labelled == 0 and done.n_samples == 90
    written = pd.read_csv(tmp_path / "p.csv")
    assert list(written.columns) == ["id", "prediction", "decision"]
    assert sorted(written["id"]) == sorted(ids)  # the rows' ids, not row numbers
    held = np.zeros_like(X)  # the cells some file holds
    held[0:60, 0:3], held[20:90, 3:6], held[40:90, 6:9] = (X[0:60, 0:3], X[20:90, 3:6],
                                                           X[40:90, 6:9])
    expected = _pooled_scores(model, ids, held)
    np.testing.assert_allclose(written["decision"], [expected[i] for i in written["id"]],
                               rtol=1e-12, atol=1e-12)
    assert set(written["prediction"]) == {"<=50K", ">50K"}  # the labels' own text
    assert all((d >= 0) == (p == ">50K") for d, p in zip(written["decision"],
                                                          written["prediction"]))
    # A folder of the files scores alike (party order: file names), and with the labelled
    # files the metrics are reported as before.
    again = predict_data(model, f"parties:{new[0].parent};id=customer", tmp_path / "q.csv")
    assert again.n_samples == 90
    labelled = predict_data(model, f"parties:{','.join(map(str, files))};id=customer;"
                            "label=income", tmp_path / "r.csv")
    assert labelled.accuracy is not None and labelled.same_data


def test_partly_labelled_files_report_metrics_on_their_labelled_rows(tmp_path):
    files, ids, X, y = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files)
    new = _unlabelled(tmp_path, files)
    spec = f"parties:{files[0]},{new[1]},{new[2]};id=customer;label=income"
    done = predict_data(model, spec, tmp_path / "p.csv")
    assert done.n_samples == 90 and done.n_labelled == 60  # the bank's customers
    written = pd.read_csv(tmp_path / "p.csv").set_index("id")
    truth = dict(zip(ids, y))
    bank = pd.read_csv(files[0])["customer"]
    assert done.accuracy == pytest.approx(np.mean(
        [written.loc[i, "prediction"] == truth[i] for i in bank]))


def test_logistic_probabilities_sum_to_one_and_are_the_sigmoid_of_the_score(tmp_path):
    files, *_ = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files, loss="logistic")
    new = _unlabelled(tmp_path, files)
    predict_data(model, f"parties:{','.join(map(str, new))};id=customer", tmp_path / "p.csv")
    written = pd.read_csv(tmp_path / "p.csv")
    assert list(written.columns) == ["id", "prediction", "decision", "probability_<=50K",
                                     "probability_>50K"]
    np.testing.assert_allclose(written["probability_<=50K"] + written["probability_>50K"], 1.0,
                               rtol=1e-12)
    np.testing.assert_allclose(written["probability_>50K"],
                               1.0 / (1.0 + np.exp(-written["decision"])), rtol=1e-10)


def test_a_column_mismatch_names_only_the_differing_columns(tmp_path):
    files, *_ = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files)
    new = _unlabelled(tmp_path, files)
    telco = pd.read_parquet(new[1]).rename(columns={"x4": "x4_new"})
    telco["extra"] = 1.0
    telco.to_parquet(new[1])
    with pytest.raises(HyflError) as caught:
        predict_data(model, f"parties:{','.join(map(str, new))};id=customer",
                     tmp_path / "p.csv")
    text = " ".join(str(caught.value).split())
    assert "lack the model's feature column 'x4' (close: 'x4_new')" in text
    assert "not trained on: 'x4_new' (close: 'x4'), 'extra'" in text
    for same in ("'x0'", "'x3'", "'x8'"):  # the columns that match are not listed
        assert same not in text
