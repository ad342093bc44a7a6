"""Hostile and malformed inputs to ``hyfl predict`` on party files (and the model files
it reads), each a few rows.

* Files that disagree are refused as training refuses them: a cell two files hold
  with other values, a sample two files label differently. Scoring used to take the
  first file's silently (and called a changed file "the training data").
* IDs that are one sample spelt two ways (``007`` / ``7`` / ``7.0``; ``c0`` / ``C0``;
  composed or decomposed Unicode) are refused: matched as text they would make two
  half-empty samples of each.
* Labels that are none of the model's classes are scored but named in a warning.
* A model file whose ``feature_names`` or ``weight_column`` are forged is refused
  naming the field (a number there was a traceback).
* A feature column of numbers with one stray word names that cell, and a copy of the
  ID column is a feature with text, not "labels".
* A column named like a shared feature gets that feature as its close match.
* IDs that a spreadsheet would run as formulas are neutralised in predictions.csv.
* ``--out`` that is one of the party files (it was overwritten with the predictions)
  or lies in their folder (the next run would read it as a party) is refused.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from hyfl.cli import app
from hyfl.data import load_party_spec
from hyfl.errors import HyflError
from hyfl.model_file import load_model, model_from_problem, model_sha256, save_model
from hyfl.predict import predict_data
from hyfl.problem import make_problem, solve_centralized

N = 24


def _frames(ids=None):
    """Two parties' rows: ``a`` holds x1, x2, the shared s and the label; ``b`` x3, s."""
    rng = np.random.default_rng(0)
    ids = ids or [f"c{i}" for i in range(N)]
    x = rng.normal(size=(N, 4)).round(3)
    label = np.where(x[:, 0] + x[:, 2] > 0, "yes", "no")
    a = pd.DataFrame({"id": ids, "x1": x[:, 0], "x2": x[:, 1], "s": x[:, 3], "y": label})
    b = pd.DataFrame({"id": ids, "x3": x[:, 2], "s": x[:, 3]})
    return a, b


def _write(folder, a, b):
    folder.mkdir(parents=True, exist_ok=True)
    a.to_csv(folder / "a.csv", index=False)
    b.to_csv(folder / "b.csv", index=False)
    return f"parties:{folder / 'a.csv'},{folder / 'b.csv'};label=y"


@pytest.fixture
def model(tmp_path):
    spec = _write(tmp_path / "train", *_frames())
    dataset, _ = load_party_spec(spec, psi=False)
    problem = make_problem(dataset, "hinge", 0.05)
    w = solve_centralized(problem, cache=False).w
    return save_model(tmp_path / "model.npz",
                      model_from_problem(problem, w, data_meta=dataset.meta))


def test_the_genuine_files_score(tmp_path, model):
    done = predict_data(model, _write(tmp_path / "new", *_frames()), tmp_path / "p.csv")
    assert done.n_samples == N and done.same_data and done.notices == ()


def test_a_shared_cell_with_another_value_in_each_file_is_refused(tmp_path, model):
    a, b = _frames()
    b.loc[5, "s"] = 999.0
    with pytest.raises(HyflError, match=r"sample ID 'c5', feature 's' is .* in party file "
                       r".*a\.csv.* but 999 in party file .*b\.csv.* at line 7"):
        predict_data(model, _write(tmp_path / "new", a, b), tmp_path / "p.csv")
    assert not (tmp_path / "p.csv").exists()


def test_a_sample_labelled_differently_in_two_files_is_refused(tmp_path, model):
    a, b = _frames()
    b["y"] = a["y"]
    b.loc[3, "y"] = "no" if a.loc[3, "y"] == "yes" else "yes"
    with pytest.raises(HyflError, match=r"sample ID 'c3' has label .* in party file .*a\.csv"
                       r".* but label .* in party file .*b\.csv .*at line 5"):
        predict_data(model, _write(tmp_path / "new", a, b), tmp_path / "p.csv")


@pytest.mark.parametrize("spelling", [lambda i: f"{i:03d}", lambda i: f"{i}.0"])
def test_ids_that_are_one_number_spelt_two_ways_are_refused(tmp_path, spelling):
    a, b = _frames([str(i) for i in range(1, N + 1)])
    spec = _write(tmp_path / "train", a, b)
    dataset, _ = load_party_spec(spec, psi=False)
    problem = make_problem(dataset, "hinge", 0.05)
    path = save_model(tmp_path / "m.npz", model_from_problem(
        problem, solve_centralized(problem, cache=False).w, data_meta=dataset.meta))
    b["id"] = [spelling(i) for i in range(1, N + 1)]
    with pytest.raises(HyflError, match=r"b\.csv.* has ID '(001|1\.0)' where party file "
                       rf".*a\.csv.* has '1' \({N} such IDs\): IDs are matched as text"):
        predict_data(path, _write(tmp_path / "new", a, b), tmp_path / "p.csv")
    b["id"] = [f"x{i:03d}" for i in range(1, N + 1)]  # other IDs, not a number: scored
    assert predict_data(path, _write(tmp_path / "new", a, b), tmp_path / "p.csv"
                        ).n_samples == 2 * N


@pytest.mark.parametrize("trained, spelt", [
    ("c{}", "C{}"),  # c0 in one file, C0 in the other
    ("\u00e7{}", "c\u0327{}"),  # ç composed (NFC) in one, c + combining cedilla in the other
])
def test_ids_of_one_text_in_other_case_or_unicode_form_are_refused(tmp_path, trained, spelt):
    a, b = _frames([trained.format(i) for i in range(N)])
    spec = _write(tmp_path / "train", a, b)
    dataset, _ = load_party_spec(spec, psi=False)
    problem = make_problem(dataset, "hinge", 0.05)
    path = save_model(tmp_path / "m.npz", model_from_problem(
        problem, solve_centralized(problem, cache=False).w, data_meta=dataset.meta))
    b["id"] = [spelt.format(i) for i in range(N)]
    with pytest.raises(HyflError, match="IDs are matched as text") as caught:
        predict_data(path, _write(tmp_path / "new", a, b), tmp_path / "p.csv")
    assert repr(spelt.format(0)) in str(caught.value)


def test_labels_the_model_lacks_are_named_in_a_warning(tmp_path, model):
    a, b = _frames()
    a["y"] = np.where(a["y"] == "yes", 1, 0)  # 0/1 for a model of no/yes
    spec = _write(tmp_path / "new", a, b)
    done = predict_data(model, spec, tmp_path / "p.csv")
    assert done.accuracy is None and len(done.notices) == 1
    assert (f"{N} of {N} labels in column 'y' ('" in done.notices[0]
            and "none of the model's classes ('no', 'yes')" in done.notices[0])
    result = CliRunner().invoke(app, ["predict", str(model), "--data", spec,
                                      "--out", str(tmp_path / "q.csv")])
    assert result.exit_code == 0 and "warning:" in result.output
    assert "of the model's classes" in " ".join(result.output.split())


def _forge_provenance(path, **fields):
    with np.load(path, allow_pickle=False) as f:
        content = {name: f[name] for name in f.files}
    head = json.loads(content.pop("__header__").tobytes())
    head["provenance"].update(fields)
    head["content_sha256"] = model_sha256(content, head)
    np.savez(path, __header__=np.frombuffer(json.dumps(head).encode(), np.uint8), **content)


@pytest.mark.parametrize("fields, field", [
    ({"feature_names": 5}, "feature_names"),  # was a TypeError traceback in predict
    ({"feature_names": ["x1", "x1", "x2", "x3"]}, "feature_names"),
    ({"feature_names": ["x1", "x2"]}, "feature_names"),
    ({"feature_names": "x1x2"}, "feature_names"),
    ({"feature_names": [1, 2, 3, 4]}, "feature_names"),
    ({"weight_column": ["w"]}, "weight_column"),
])
def test_a_forged_provenance_is_refused_naming_the_field(tmp_path, model, fields, field):
    _forge_provenance(model, **fields)
    with pytest.raises(HyflError, match=f"has provenance field '{field}'.*retrain"):
        load_model(model)


def test_a_stray_word_among_numbers_names_its_cell_not_labels(tmp_path, model):
    a, b = _frames()
    b["x3"] = b["x3"].astype(object)
    b.loc[4, "x3"] = "high"
    with pytest.raises(HyflError, match=r"non-numeric value 'high' in feature column 'x3' "
                       r"at line 6") as caught:
        predict_data(model, _write(tmp_path / "new", a, b), tmp_path / "p.csv")
    assert "looks like labels" not in str(caught.value)


def test_a_copy_of_the_id_column_is_a_text_feature_not_labels(tmp_path, model):
    a, b = _frames()
    b["ID"] = b["id"]
    with pytest.raises(HyflError, match=r"non-numeric value 'c0' in feature column 'ID'") \
            as caught:
        predict_data(model, _write(tmp_path / "new", a, b), tmp_path / "p.csv")
    assert "looks like labels" not in str(caught.value)


def test_a_column_named_like_a_shared_feature_gets_it_as_close_match(tmp_path, model):
    a, b = _frames()
    b = b.rename(columns={"s": "S"})  # a still holds s
    with pytest.raises(HyflError, match=r"not trained on: 'S' \(close: 's'"):
        predict_data(model, _write(tmp_path / "new", a, b), tmp_path / "p.csv")


def test_ids_a_spreadsheet_would_run_are_neutralised(tmp_path, model):
    hostile = ['=HYPERLINK("http://x","y")', "+1+1", "@SUM(A1)", "-2+3", "-7"]
    ids = hostile + [f"c{i}" for i in range(len(hostile), N)]
    predict_data(model, _write(tmp_path / "new", *_frames(ids)), tmp_path / "p.csv")
    written = pd.read_csv(tmp_path / "p.csv", dtype={"id": str})["id"].tolist()
    assert written[:5] == ["'" + i for i in hostile[:4]] + ["-7"]  # a number stays


def test_out_that_is_a_party_file_or_in_their_folder_is_refused(tmp_path, model):
    a, b = _frames()
    spec = _write(tmp_path / "new", a, b)
    before = (tmp_path / "new" / "b.csv").read_bytes()
    with pytest.raises(HyflError, match="is one of the party files to score"):
        predict_data(model, spec, tmp_path / "new" / "b.csv")  # was overwritten
    assert (tmp_path / "new" / "b.csv").read_bytes() == before
    folder = f"parties:{tmp_path / 'new'};label=y"
    with pytest.raises(HyflError, match="is in the folder of party files"):
        predict_data(model, folder, tmp_path / "new" / "predictions.csv")
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["a.csv", "b.csv"]
    assert predict_data(model, folder, tmp_path / "predictions.csv").n_samples == N
