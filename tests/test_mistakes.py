"""Mistakes a new user makes, caught at the start with the fix (issue 43).

(a) a misspelt column in one file's header is named with its near match in another
party's file; (b) a label column named differently at one party names that party,
its file and the near miss, while a party without labels stays allowed; (c) a run
whose steps are rejected (or whose objective does not move) says why and what to
change (--standardize for raw units), and the ciphers' fixed-point bound says so too;
(d) no error message doubles its period ("again.. See").
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hyfl.data import load_parties
from hyfl.data.parties import _near_miss
from hyfl.errors import HyflError, PartyFileWarning, clause, fail
from hyfl.experiments.stall import stalled_steps

N = 30
#: Doubled period at a sentence's end (not an ellipsis, not a range such as 0..9).
DOUBLED = re.compile(r"(?<![.\d])\.\.(?![.\w])")


def _write(path: Path, columns: dict) -> Path:
    frame = pd.DataFrame({"patient": [f"P{i:03d}" for i in range(N)], **columns})
    frame.to_parquet(path) if path.suffix == ".parquet" else frame.to_csv(path, index=False)
    return path


def _cells(seed: int):
    rng = np.random.default_rng(seed)
    return np.round(rng.normal(size=N), 3)


def _labels():
    return np.where(np.arange(N) % 3 == 0, "malignant", "benign")


def breast_cancer_cut(folder: Path) -> dict[str, Path]:
    """Breast cancer in raw units as three organisations hold it: a hospital and a lab
    with labels under ``outcome`` (they share three columns), a clinic without labels;
    ids in ``patient``, rows partly shared."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    names = [c.replace(" ", "_") for c in data.feature_names]
    ids = np.array([f"P{k:05d}" for k in range(len(data.target))])
    labels = np.where(data.target == 0, "malignant", "benign")
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for party, rows, cols, labelled, file in (
            ("hospital", slice(0, 340), range(0, 13), True, "hospital.csv"),
            ("lab", slice(230, 569), range(10, 24), True, "lab.parquet"),
            ("clinic", slice(100, 500), range(24, 30), False, "clinic.csv")):
        frame = pd.DataFrame({"patient": ids[rows]})
        for j in cols:
            frame[names[j]] = data.data[rows, j]
        if labelled:
            frame["outcome"] = labels[rows]
        files[party] = folder / file
        frame.to_parquet(files[party]) if file.endswith(".parquet") else frame.to_csv(
            files[party], index=False)
    return files


def _load(files, **options):
    return load_parties(files, id_column="patient", label_column="outcome", psi=False,
                        **options)


# --------------------------------------------------------------------------- (a)


def test_a_misspelt_column_is_named_with_its_near_match(tmp_path):
    hospital = _write(tmp_path / "hospital.csv", {"age": _cells(0), "mean radius": _cells(1),
                                                  "outcome": _labels()})
    lab = _write(tmp_path / "lab.csv", {"age": _cells(0), "mean raduis": _cells(1)})
    with pytest.warns(PartyFileWarning) as caught:
        data, _ = _load({"hospital": hospital, "lab": lab})
    text = " ".join(str(w.message) for w in caught)
    assert "'mean radius'" in text and "'mean raduis'" in text
    assert str(hospital) in text and str(lab) in text and "rename one" in text
    assert data.meta["notices"] == tuple(str(w.message) for w in caught)
    assert len(data.meta["notices"]) == 1  # the pair once, not once per name


def test_a_case_and_separators_are_a_near_match(tmp_path):
    a = _write(tmp_path / "a.csv", {"Mean_Radius": _cells(1), "outcome": _labels()})
    b = _write(tmp_path / "b.csv", {"mean radius": _cells(2)})
    with pytest.warns(PartyFileWarning, match="'Mean_Radius'.*'mean radius'|'mean radius'.*"
                      "'Mean_Radius'"):
        _load({"a": a, "b": b})


def test_a_distinct_and_numbered_names_are_no_near_match(tmp_path):
    a = _write(tmp_path / "a.csv", {**{f"x{j}": _cells(j) for j in range(12)},
                                    "mean fractal dimension": _cells(20),
                                    "worst concavity": _cells(21), "outcome": _labels()})
    b = _write(tmp_path / "b.csv", {**{f"x{j}": _cells(j) for j in range(12, 24)},
                                    "worst fractal dimension": _cells(22),
                                    "worst concave points": _cells(23)})
    with warnings.catch_warnings():
        warnings.simplefilter("error", PartyFileWarning)
        data, _ = _load({"a": a, "b": b})
    assert data.meta["notices"] == ()


@pytest.mark.parametrize("a, b, near", [
    ("mean radius", "mean raduis", True),  # two letters swapped
    ("texture_error", "texture eror", True),
    ("Outcome", "outcome", True),
    ("x10", "x11", False),  # a numbered series
    ("feature_1", "feature_2", False),
    ("mean fractal dimension", "worst fractal dimension", False),
    ("age", "sex", False),
    ("bmi", "bmi", False),
])
def test_a_near_miss_rule(a, b, near):
    assert _near_miss(a, b) is near


def test_a_breast_cancer_cut_raises_no_notice_and_a_typo_raises_one(tmp_path):
    files = breast_cancer_cut(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PartyFileWarning)
        _load(files)
    lab = pd.read_parquet(files["lab"])
    lab.rename(columns={"texture_error": "texture_eror"}).to_parquet(files["lab"])
    with pytest.warns(PartyFileWarning, match="'texture_error'.*'texture_eror'"):
        _load(files)


# --------------------------------------------------------------------------- (b)


def _two_labelled_and_a_clinic(tmp_path, lab_label: str, lab_values):
    hospital = _write(tmp_path / "hospital.csv", {"age": _cells(0), "outcome": _labels()})
    lab = _write(tmp_path / "lab.parquet", {"ldl": _cells(1), lab_label: lab_values})
    clinic = _write(tmp_path / "clinic.csv", {"bmi": _cells(2)})
    return {"hospital": hospital, "lab": lab, "clinic": clinic}


@pytest.mark.parametrize("name", ["Outcome", "outcomes", "result"])
def test_b_a_label_column_named_otherwise_names_the_party_and_the_column(tmp_path, name):
    files = _two_labelled_and_a_clinic(tmp_path, name, _labels())
    with pytest.raises(HyflError) as err:
        _load(files)
    text = str(err.value)
    assert f"{files['lab']} (party 'lab')" in text
    assert "has no label column 'outcome'" in text and f"{name!r}" in text
    assert "rename it to 'outcome' in this file" in text
    assert f"label={name}" in text  # the other way round: if every file calls it so
    assert "A party without labels is fine" in text


def test_b_a_numeric_near_miss_is_the_label_misnamed_too(tmp_path):
    files = _two_labelled_and_a_clinic(tmp_path, "Outcome", np.arange(N) % 2)
    with pytest.raises(HyflError, match=r"lab.parquet \(party 'lab'\) has no label column "
                       r"'outcome', but its column 'Outcome'"):
        _load(files)


def test_b_a_party_without_labels_is_allowed(tmp_path):
    files = _two_labelled_and_a_clinic(tmp_path, "outcome", _labels())
    with warnings.catch_warnings():
        warnings.simplefilter("error", PartyFileWarning)
        data, partition = _load(files)
    assert data.meta["label_parties"] == ("hospital", "lab")
    assert partition.n_clients == 3


def test_b_unlabelled_samples_name_the_parties_without_the_label_column(tmp_path):
    hospital = _write(tmp_path / "hospital.csv", {"age": _cells(0), "outcome": _labels()})
    frame = pd.DataFrame({"patient": [f"Q{i:03d}" for i in range(N)], "age": _cells(1)})
    frame.to_csv(tmp_path / "clinic.csv", index=False)
    with pytest.raises(HyflError) as err:
        _load({"hospital": hospital, "clinic": tmp_path / "clinic.csv"}, min_common=0)
    assert f"{tmp_path / 'clinic.csv'} (party 'clinic') has no 'outcome' column" in str(err.value)


# --------------------------------------------------------------------------- (c)


def _rows(accepted, primal=None, relative=3.0, active=1.0):
    rows = [{"iteration": 0.0, "primal": 1.0, "relative_loss": 5.0}]
    for t, a in enumerate(accepted, 1):
        rows.append({"iteration": float(t), "accepted": float(a), "step": float(a),
                     "active_clients": active,
                     "primal": 1.0 / t if primal is None else primal[t - 1],
                     "relative_loss": relative})
    return rows


def _raw_units():
    rng = np.random.default_rng(0)
    return rng.normal(size=(40, 3)) * np.array([1000.0, 1.0, 0.01])


def test_c_steps_rejected_for_the_last_rounds_say_why_and_what_to_change():
    found = stalled_steps(_rows([1] * 10 + [0] * 8), _raw_units(), ["area", "radius", "fd"])
    assert found["kind"] == "rejected" and found["rounds"] == 8
    assert found["standardize"] and found["largest"][0] == "area"
    assert found["smallest"][0] == "fd" and 5e4 < found["scale_ratio"] < 2e5
    message = found["message"]
    assert "rejected in the last 8 rounds" in message and "--standardize" in message
    assert "'area'" in message and "'fd'" in message and "differ by a factor of" in message


def test_c_a_flat_objective_is_a_stall_and_rounds_without_clients_are_skipped():
    primal = [0.9] * 3 + [0.8] * 27
    found = stalled_steps(_rows([1] * 30, primal=primal), _raw_units())
    assert found["kind"] == "flat" and found["rounds"] == 26  # after the one that fell
    assert "did not move in the last 26 rounds" in found["message"]
    # rejections interrupted only by rounds in which no client took part
    rows = _rows([1] * 5 + [0] * 6)
    rows[-3]["active_clients"] = 0.0
    assert stalled_steps(rows, _raw_units())["rounds"] == 5


def test_c_no_stall_no_message():
    assert stalled_steps(_rows([1] * 20), _raw_units()) is None  # the objective falls
    assert stalled_steps(_rows([1] * 15 + [0] * 4), _raw_units()) is None  # too few rounds
    assert stalled_steps(_rows([1] * 5 + [0] * 10, relative=1e-4), _raw_units()) is None
    plateau = [0.9] * 45 + [0.8] * 15  # a plateau in a quarter of the run: HyFDCA's steps
    assert stalled_steps(_rows([1] * 60, primal=plateau), _raw_units()) is None
    others = [{"iteration": float(t), "primal": 1.0, "relative_loss": 3.0} for t in range(20)]
    assert stalled_steps(others, _raw_units()) is None  # no step acceptance to judge


def test_c_standardized_or_even_scales_get_other_advice():
    rows = _rows([1] * 3 + [0] * 7)
    found = stalled_steps(rows, _raw_units(), standardized=True)
    assert not found["standardize"] and "--standardize" not in found["message"]
    assert "--step-rule" in found["message"]
    even = np.random.default_rng(1).normal(size=(40, 3))
    assert not stalled_steps(rows, even)["standardize"]


def test_c_a_raw_unit_run_says_pass_standardize(tmp_path):
    from hyfl.experiments.runner import RunSpec, execute

    breast_cancer_cut(tmp_path / "orgs")
    spec = RunSpec(data=f"parties:{tmp_path / 'orgs'};id=patient;label=outcome;psi=no",
                   iterations=40)
    told: list[str] = []
    outcome = execute(spec, log=told.append)
    if outcome.result.final["relative_loss"] > 1.0:  # (what the run did on 2026-12-02)
        stalled = outcome.summary["stalled"]
        assert stalled["standardize"] and stalled["scale_ratio"] > 1e4
        assert any(m.startswith("warning: hyfdca's") and "--standardize" in m for m in told)
    else:  # HyFDCA learned in raw units: then there is nothing to say
        assert "stalled" not in outcome.summary


def test_c_the_fixed_point_bound_says_pass_standardize():
    from hyfl.privacy.encoding import FixedPoint

    with pytest.raises(HyflError) as err:
        FixedPoint(precision_bits=32, bound=65536.0).encode([1.8e7])
    assert "exceeds the fixed-point bound 65536" in str(err.value)
    assert "pass --standardize" in str(err.value)


# --------------------------------------------------------------------------- (d)


@pytest.mark.parametrize("problem", [
    "is broken", "is broken.", "quotes: another error. Fix that.", "lists a, b ...",
])
def test_d_fail_never_doubles_a_period(problem):
    text = str(fail("the thing", problem, "Do this."))
    assert not DOUBLED.search(text), text
    assert text.startswith("the thing ") and text.endswith("Do this.")


def test_d_an_error_quoted_in_another_reads_once():
    inner = fail("party 2", "failed on 'setup'", "Fix it and start the run again.")
    outer = fail("the deployed run", f"failed: {inner}", "See the log.")
    assert "again. See the log." in str(outer) and not DOUBLED.search(str(outer))
    assert f"failed: {clause(inner)}. See" == f"failed: {clause(str(inner))}. See"
    assert not DOUBLED.search(f"failed: {clause(inner)}. See")
    assert clause("wait ...") == "wait ..." and clause("done.") == "done"


def test_d_a_failed_deployment_records_its_error_to_be_quoted(tmp_path):
    from hyfl.deploy.coordinator import write_failure

    write_failure(str(tmp_path / "out"), fail("key file k", "is missing", "Make it again."))
    error = json.loads((tmp_path / "out" / "deploy.json").read_text())["error"]
    assert error == "key file k is missing. Make it again"
    assert not DOUBLED.search(f"the deployed run failed: {error}. See run.log")


def test_d_no_literal_problem_ends_in_a_period():
    """fail(culprit, problem, fix) adds the period after problem: none is written in it."""
    import ast

    root = Path(__file__).parent.parent / "src" / "hyfl"
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and len(node.args) >= 2
                    and getattr(node.func, "id", getattr(node.func, "attr", "")) == "fail"):
                continue
            problem = node.args[1]
            last = (problem.values[-1] if isinstance(problem, ast.JoinedStr) and problem.values
                    else problem)
            if isinstance(last, ast.Constant) and str(last.value).rstrip().endswith("."):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, found


def test_d_cli_errors_do_not_double_periods(tmp_path):
    from typer.testing import CliRunner

    from hyfl.cli import app

    files = _two_labelled_and_a_clinic(tmp_path, "result", _labels())
    done = CliRunner().invoke(app, [
        "run", "--data", f"parties:{','.join(str(p) for p in files.values())};id=patient;"
        "label=outcome;psi=no", "--iterations", "2", "--out", str(tmp_path / "r"),
        "--no-progress"])
    assert done.exit_code == 2 and "has no label column 'outcome'" in done.output
    assert not DOUBLED.search(" ".join(done.output.split())), done.output
