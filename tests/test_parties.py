"""Tests for hyfl.data.parties: party files (CSV/Parquet) -> Dataset + Partition."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.data import is_party_spec, load_parties, load_party_spec, parse_party_spec
from hyfl.errors import HyflError
from hyfl.participation import Full
from hyfl.partition import stack
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import simulate

N, M = 160, 10
NAMES = [f"f{m}" for m in range(M)]
C_FEATURES = [1, 3, 6, 8]  # C overlaps A on f1, f3 and B on f6, f8


# --------------------------------------------------------------------------- fixtures


def reference(seed: int = 0):
    """The full matrix and labels every party's file is cut from."""
    rng = np.random.default_rng(seed)
    X = np.round(rng.normal(size=(N, M)), 3) * (rng.random((N, M)) < 0.6)
    y = np.where(rng.random(N) < 0.5, 0, 1)
    return X, y


def frame(ids, X, cols, labels=None, id_name="id") -> pd.DataFrame:
    df = pd.DataFrame(X[np.ix_(ids, cols)], columns=[NAMES[c] for c in cols])
    df.insert(0, id_name, ids)
    if labels is not None:
        df["label"] = labels[ids]
    return df


@pytest.fixture
def hybrid(tmp_path):
    """A: ids 0-99, f0-f4 + labels (CSV); B: ids 50-149, f5-f9 + labels (Parquet,
    shuffled rows); C: ids 0-19 and 140-159, f1 f3 f6 f8, no labels (CSV, shuffled)."""
    X, y = reference()
    rng = np.random.default_rng(1)
    a_ids = np.arange(100)
    b_ids = rng.permutation(np.arange(50, 150))
    c_ids = rng.permutation(np.r_[0:20, 140:160])
    files = {
        "A": tmp_path / "a.csv",
        "B": tmp_path / "b.parquet",
        "C": tmp_path / "c.csv",
    }
    frame(a_ids, X, range(5), y).to_csv(files["A"], index=False)
    frame(b_ids, X, range(5, 10), y).to_parquet(files["B"], index=False)
    frame(c_ids, X, C_FEATURES).to_csv(files["C"], index=False)
    return files, X, y, (a_ids, b_ids, c_ids)


def expected(X, y, ids):
    """Hand-built reference for the hybrid fixture with unlabelled samples dropped."""
    a_ids, b_ids, c_ids = ids
    # Global order: A's rows in file order, then B's new ids in file order, then C's.
    order = list(a_ids) + [i for i in b_ids if i not in set(a_ids)]
    order += [i for i in c_ids if i not in set(order)]
    order = [i for i in order if i < 150]  # 150..159 have no label: dropped
    position = {sample: g for g, sample in enumerate(order)}
    held = np.zeros((N, M), dtype=bool)
    owner = np.full((N, M), -1)
    for k, (sample_ids, cols) in enumerate(
        [(a_ids, range(5)), (b_ids, range(5, 10)), (c_ids, C_FEATURES)]
    ):
        for i in sample_ids:
            for m in cols:
                held[i, m] = True
                if owner[i, m] < 0:
                    owner[i, m] = k
    X_expected = np.where(held, X, 0.0)[order]
    y_expected = np.where(y[order] == 1, 1.0, -1.0)
    blocks = [
        (sorted(position[i] for i in a_ids), list(range(5))),
        (sorted(position[i] for i in b_ids), list(range(5, 10))),
        (sorted(position[i] for i in c_ids if i < 150), C_FEATURES),
    ]
    return order, X_expected, y_expected, blocks, owner[order]


# --------------------------------------------------------------------------- happy path


@pytest.mark.parametrize("psi", [True, False])
def test_hybrid_parties_match_hand_built_reference(hybrid, psi):
    files, X, y, ids = hybrid
    data, partition = load_parties(files, unlabeled="drop", psi=psi)
    order, X_expected, y_expected, blocks, owner = expected(X, y, ids)

    assert data.X.shape == (150, M) and data.task == "binary"
    assert data.X.has_sorted_indices and np.all(data.X.data != 0)
    np.testing.assert_array_equal(data.X.toarray(), X_expected)
    np.testing.assert_array_equal(data.y, y_expected)
    assert data.meta["sample_ids"] == tuple(str(i) for i in order)
    assert data.meta["feature_names"] == tuple(NAMES)
    assert data.meta["clients"] == ("A", "B", "C")
    assert data.meta["classes"] == (0.0, 1.0)
    assert data.meta["dropped_unlabeled"] == 10
    assert (data.meta["psi_bytes"] or 0) > 0 if psi else data.meta["psi_bytes"] is None

    assert partition.n_clients == 3 and partition.n_samples == 150
    for k, (samples, features) in enumerate(blocks):
        np.testing.assert_array_equal(partition.samples[k], samples)
        np.testing.assert_array_equal(partition.features[k], features)
    # Shared cells (C with A on f1/f3, C with B on f6/f8) belong to A or B.
    rows = np.repeat(np.arange(150), np.diff(data.X.indptr))
    np.testing.assert_array_equal(partition.entry_owner, owner[rows, data.X.indices])
    assert partition.entry_owner.tolist().count(2) > 0
    stack(partition, data.X)  # the simulation engine accepts it


def test_psi_and_plain_alignment_agree(hybrid):
    files, *_ = hybrid
    with_psi, part_psi = load_parties(files, unlabeled="drop")
    plain, part_plain = load_parties(files, unlabeled="drop", psi=False)
    assert (with_psi.X != plain.X).nnz == 0
    np.testing.assert_array_equal(with_psi.y, plain.y)
    np.testing.assert_array_equal(part_psi.entry_owner, part_plain.entry_owner)


def test_hyfdca_runs_on_party_data(hybrid):
    files, *_ = hybrid
    data, partition = load_parties(files, unlabeled="drop", psi=False)
    problem = make_problem(data, "hinge", 1e-2)
    optimum = solve_centralized(problem, cache=False)
    result = simulate(
        HyFDCA(local_steps=10, step_rule="safe"),
        problem,
        partition,
        Full(partition.n_clients),
        30,
        optimum=optimum,
    )
    gap = result.column("gap")
    assert np.all(np.isfinite(gap)) and gap[-1] < gap[0]
    assert result.column("relative_loss")[-1] < 0.5


def test_unlabelled_samples_are_an_error_by_default(hybrid):
    files, *_ = hybrid
    with pytest.raises(HyflError) as error:
        load_parties(files, psi=False)
    message = str(error.value)
    assert "'150' (in C)" in message and "and 5 more" in message
    assert "no label" in message and "unlabeled='drop'" in message


def test_rectangular_parties_without_shared_cells(tmp_path):
    X, y = reference()
    frame(np.arange(100), X, range(5), y).to_csv(tmp_path / "left.csv", index=False)
    frame(np.arange(100), X, range(5, 10)).to_csv(tmp_path / "right.csv", index=False)
    data, partition = load_parties([tmp_path / "left.csv", tmp_path / "right.csv"], psi=False)
    assert partition.entry_owner is None and partition.is_vertical
    np.testing.assert_array_equal(data.X.toarray(), X[:100])
    assert data.meta["clients"] == ("left", "right")


def test_label_only_party_is_not_a_client(tmp_path):
    X, y = reference()
    frame(np.arange(40), X, range(4)).to_csv(tmp_path / "features.csv", index=False)
    labels = pd.DataFrame({"id": np.arange(40)[::-1], "label": np.where(y[:40][::-1], "yes", "no")})
    labels.to_parquet(tmp_path / "labels.parquet")
    data, partition = load_parties(
        {"f": tmp_path / "features.csv", "l": tmp_path / "labels.parquet"}, psi=False
    )
    assert partition.n_clients == 1 and data.meta["clients"] == ("f",)
    assert data.meta["label_parties"] == ("l",)
    assert data.meta["classes"] == ("no", "yes")
    np.testing.assert_array_equal(data.y, np.where(y[:40] == 1, 1.0, -1.0))


def test_text_labels_declared_classes_and_multiclass(tmp_path):
    df = pd.DataFrame({"id": ["a", "b", "c", "d"], "x": [1.0, 2.0, 3.0, 4.0]})
    df["label"] = ["pos", "neg", "pos", "neg"]
    df.to_csv(tmp_path / "p.csv", index=False)
    data, _ = load_parties([tmp_path / "p.csv"], psi=False, classes=["pos", "neg"])
    np.testing.assert_array_equal(data.y, [-1.0, 1.0, -1.0, 1.0])  # first class -> -1
    df["label"] = ["cat", "dog", "emu", "dog"]
    df.to_csv(tmp_path / "p.csv", index=False)
    data, _ = load_parties([tmp_path / "p.csv"], psi=False)
    assert data.task == "multiclass" and data.meta["classes"] == ("cat", "dog", "emu")
    np.testing.assert_array_equal(data.y, [0, 1, 2, 1])


def test_ids_match_across_text_and_integer_columns(tmp_path):
    pd.DataFrame({"pid": ["7", " 8", "9"], "a": [1, 2, 3], "y": [1, -1, 1]}).to_csv(
        tmp_path / "one.csv", index=False
    )
    pd.DataFrame({"pid": [9, 8, 7], "b": [0.5, 0.0, 1.5]}).to_parquet(tmp_path / "two.parquet")
    data, partition = load_parties(
        [tmp_path / "one.csv", tmp_path / "two.parquet"], id_column="pid", label_column="y"
    )
    assert data.meta["sample_ids"] == ("7", "8", "9")
    np.testing.assert_array_equal(data.X.toarray(), [[1, 1.5], [2, 0], [3, 0.5]])
    assert partition.is_vertical


def test_compressed_csv_and_declared_features(tmp_path):
    content = "id,b,a,label\n1,2,0,1\n2,0,3,-1\n"
    (tmp_path / "p.csv.gz").write_bytes(gzip.compress(content.encode()))
    data, partition = load_parties(
        {"p": tmp_path / "p.csv.gz"}, features=["a", "b"], columns={"p": ["b", "a"]}
    )
    np.testing.assert_array_equal(data.X.toarray(), [[0, 2], [3, 0]])
    assert data.meta["feature_names"] == ("a", "b")


# --------------------------------------------------------------------------- specs


def test_party_specs(hybrid, tmp_path):
    files, *_ = hybrid
    spec = f"parties:A={files['A']},B={files['B']},C={files['C']};unlabeled=drop;psi=no"
    assert is_party_spec(spec)
    parsed, options = parse_party_spec(spec)
    assert list(parsed) == ["A", "B", "C"]
    assert options == {"unlabeled": "drop", "psi": False}
    data, partition = load_party_spec(spec)
    reference_data, _ = load_parties(files, unlabeled="drop", psi=False)
    assert (data.X != reference_data.X).nnz == 0

    # A folder of party files: parties named after the files, sorted.
    assert is_party_spec(tmp_path) and is_party_spec(str(tmp_path))
    parsed, _ = parse_party_spec(str(tmp_path))
    assert list(parsed) == ["a", "b", "c"]
    data, _ = load_party_spec(f"parties:{tmp_path};unlabeled=drop", psi=False)
    assert data.X.shape == (150, M)

    feature_file = tmp_path / "features.txt"
    feature_file.write_text("\n".join(NAMES) + "\n")
    _, options = parse_party_spec(
        f"parties:{files['A']};id=key;label=y;task=binary;classes=0|1;features={feature_file}"
    )
    assert options == {
        "id_column": "key",
        "label_column": "y",
        "task": "binary",
        "classes": ["0", "1"],
        "features": NAMES,
    }
    assert parse_party_spec("parties:x.csv;features=3")[1]["features"] == 3
    assert parse_party_spec("parties:x.csv;features=a|b")[1]["features"] == ["a", "b"]


def test_is_party_spec_rejects_other_data(tmp_path):
    assert not is_party_spec("mnist") and not is_party_spec("covtype:train")
    assert not is_party_spec(tmp_path / "data.svm") and not is_party_spec(tmp_path)
    assert not is_party_spec(None) and not is_party_spec(3)
    assert is_party_spec("somewhere/party.parquet") and is_party_spec("p.CSV")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("parties:a.csv;colour=red", r"option 'colour=red' is not known.*id=\.\.\."),
        ("parties:a.csv;psi=maybe", "psi is 'maybe'. Use yes or no"),
        ("parties:;id=x", "names no party files"),
        ("parties:a.csv;features=nowhere/list.txt", "list.txt does not exist"),
    ],
)
def test_bad_party_specs(spec, match):
    with pytest.raises(HyflError, match=match):
        parse_party_spec(spec)


def test_spec_folder_and_name_clashes(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(HyflError, match=r"empty holds no party files\. Put one file per party"):
        parse_party_spec(f"parties:{empty}")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    (tmp_path / "one" / "p.csv").write_text("id,x\n1,1\n")
    (tmp_path / "two" / "p.csv").write_text("id,x\n1,1\n")
    with pytest.raises(HyflError, match=r"two parties called 'p'.*parties:a=<file>"):
        parse_party_spec(f"parties:{tmp_path / 'one'},{tmp_path / 'two'}")


# --------------------------------------------------------------------------- malformed files


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_missing_id_column_names_file_and_hint(tmp_path):
    path = write(tmp_path, "p.csv", "ID,x,label\n1,2,1\n")
    with pytest.raises(HyflError) as error:
        load_parties([path], psi=False)
    message = str(error.value)
    assert "p.csv (party 'p') has no ID column 'id'" in message
    assert "there is 'ID'" in message and "id_column=<name>" in message


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        (
            "dup.csv",
            "id,x,label\n1,2,1\n2,3,-1\n1,4,1\n",
            r"dup\.csv.*ID '1' twice \(line 2 and line 4\).*one row per sample",
        ),
        (
            "noid.csv",
            "id,x,label\n1,2,1\n,3,-1\n",
            r"noid\.csv.*no ID in column 'id' at line 3.*Give every row an ID",
        ),
        ("empty.csv", "", r"empty\.csv.*is empty \(0 bytes\).*header line"),
        ("header.csv", "id,x,label\n", r"header\.csv.*has a header but no data rows"),
        (
            "nan.csv",
            "id,x,z,label\n1,2,,1\n",
            r"nan\.csv.*feature column 'z' is empty \(or NaN\) at line 2.*finite number",
        ),
        (
            "nan2.csv",
            "id,x,label\n1,2,1\n2,NaN,1\n",
            r"feature column 'x' is empty \(or NaN\) at line 3",
        ),
        (
            "inf.csv",
            "id,x,label\n1,inf,1\n",
            r"inf\.csv.*infinite feature value in feature column 'x' at line 2",
        ),
        (
            "text.csv",
            "id,x,label\n1,2,1\n2,abc,-1\n",
            r"text\.csv.*non-numeric value 'abc' in feature column 'x' at line 3.*numeric",
        ),
        (
            "nolabel.csv",
            "id,x,label\n1,2,1\n2,3,\n",
            r"nolabel\.csv.*no label in column 'label' at line 3 \(ID '2'\).*unlabeled='drop'",
        ),
        (
            "twice.csv",
            "id,x,x,label\n1,2,3,1\n",
            r"twice\.csv.*column 'x' twice \(columns 2 and 3\).*distinct name",
        ),
        (
            "ragged.csv",
            "id,x,label\n1,2,1\n2,3,4,5,6\n",
            r"ragged\.csv.*is not a valid CSV.*as many comma-separated fields",
        ),
        (
            "idonly.csv",
            "id\n1\n2\n",
            r"idonly\.csv.*only the ID column 'id'.*Add the party's feature columns",
        ),
        (
            "infl.csv",
            "id,x,label\n1,2,inf\n",
            r"infl\.csv.*infinite label in column 'label' at line 2",
        ),
    ],
)
def test_malformed_csv_party_file(tmp_path, name, text, match):
    path = write(tmp_path, name, text)
    with pytest.raises(HyflError, match=match):
        load_parties([path], psi=False)


def test_malformed_parquet_party_files(tmp_path):
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(HyflError, match=r"broken\.parquet.*could not be read as Parquet"):
        load_parties([broken], psi=False)
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"id": [1, 2], "x": [1.0, np.nan], "label": [1, -1]}).to_parquet(bad)
    with pytest.raises(HyflError, match=r"bad\.parquet.*'x' is empty \(or NaN\) at row 2"):
        load_parties([bad], psi=False)
    dup = tmp_path / "dup.parquet"
    pd.DataFrame({"id": ["a", "a"], "x": [1.0, 2.0], "label": [1, -1]}).to_parquet(dup)
    with pytest.raises(HyflError, match=r"dup\.parquet.*ID 'a' twice \(row 1 and row 2\)"):
        load_parties([dup], psi=False)
    floats = tmp_path / "floats.parquet"
    pd.DataFrame({"id": [1.0, 2.5], "x": [1.0, 2.0], "label": [1, -1]}).to_parquet(floats)
    with pytest.raises(HyflError, match=r"floats\.parquet.*ID 2\.5 at row 2.*not a whole number"):
        load_parties([floats], psi=False)
    when = tmp_path / "when.parquet"
    frame_with_dates = pd.DataFrame({"id": [1, 2], "label": [1, -1]})
    frame_with_dates["t"] = pd.to_datetime(["2024-01-01", "2024-01-02"])
    frame_with_dates.to_parquet(when)
    with pytest.raises(HyflError, match=r"when\.parquet.*non-numeric value .* column 't' at row 1"):
        load_parties([when], psi=False)
    empty = tmp_path / "empty.parquet"
    pd.DataFrame({"id": pd.Series([], dtype="int64"), "x": pd.Series([], dtype=float)}).to_parquet(
        empty
    )
    with pytest.raises(HyflError, match=r"empty\.parquet.*no data rows"):
        load_parties([empty], psi=False)


def test_unknown_extension_and_missing_file(tmp_path):
    with pytest.raises(HyflError, match=r"p\.xlsx.*unknown extension.*\.csv"):
        load_parties([tmp_path / "p.xlsx"])
    with pytest.raises(HyflError, match=r"gone\.csv.*does not exist"):
        load_parties([tmp_path / "gone.csv"])


def test_third_class_in_binary_problem(tmp_path):
    a = write(tmp_path, "a.csv", "id,x,label\n1,1,0\n2,2,1\n3,3,0\n4,4,1\n")
    b = write(tmp_path, "b.csv", "id,z,label\n5,1,1\n6,2,2\n")
    with pytest.raises(HyflError) as error:
        load_parties([a, b], task="binary", psi=False, min_common=0)
    message = str(error.value)
    assert "take 3 values but a binary task needs 2" in message
    assert "e.g. 2 in party file" in message and "b.csv" in message and "line 3 (ID '6')" in message
    with pytest.raises(HyflError, match=r"include 2, which is not among the declared classes"):
        load_parties([a, b], classes=[0, 1], psi=False, min_common=0)
    data, _ = load_parties([a, b], psi=False, min_common=0)  # three integer classes: multiclass
    assert data.task == "multiclass"


def test_text_and_number_labels_do_not_mix(tmp_path):
    a = write(tmp_path, "a.csv", "id,x,label\n1,1,0\n2,2,1\n")
    b = write(tmp_path, "b.csv", "id,z,label\n3,1,spam\n")
    with pytest.raises(HyflError) as error:
        load_parties([a, b], psi=False, min_common=0)
    message = str(error.value)
    assert "b.csv" in message and "text labels (e.g. 'spam')" in message
    assert "a.csv" in message and "number labels" in message and "one kind of label" in message
    # Text that reads as numbers is fine.
    c = tmp_path / "c.parquet"
    pd.DataFrame({"id": ["4"], "z": [2.0], "label": ["1"]}).to_parquet(c)
    data, _ = load_parties([a, c], psi=False, min_common=0)
    np.testing.assert_array_equal(data.y, [-1.0, 1.0, 1.0])


def test_labels_that_disagree_name_sample_and_both_parties(tmp_path):
    a = write(tmp_path, "a.csv", "id,x,label\n1,1,0\n2,2,1\n")
    b = write(tmp_path, "b.csv", "id,z,label\n2,5,0\n1,6,0\n")
    with pytest.raises(HyflError) as error:
        load_parties([a, b])
    message = str(error.value)
    assert message.startswith("sample ID '2' has label 1 in party file")
    assert "a.csv (party 'a') at line 3" in message and "b.csv (party 'b') at line 2" in message
    assert "must give the same label" in message


def test_shared_cell_with_different_values(tmp_path):
    a = write(tmp_path, "a.csv", "id,x,y,label\n1,1,2,1\n2,3,4,-1\n")
    b = write(tmp_path, "b.csv", "id,y\n2,4.5\n1,2\n")
    with pytest.raises(HyflError) as error:
        load_parties({"A": a, "B": b}, psi=False)
    message = str(error.value)
    assert message.startswith("sample ID '2', feature 'y' is 4 in party file")
    assert "(party 'A') at line 3" in message and "4.5 in party file" in message
    assert "(party 'B') at line 2" in message and "same value in each" in message
    # Equal values are fine: the first party owns the cell.
    b.write_text("id,y\n2,4\n1,2\n")
    data, partition = load_parties({"A": a, "B": b}, psi=False)
    assert set(partition.entry_owner.tolist()) == {0}


def test_declared_columns_and_features(tmp_path):
    a = write(tmp_path, "a.csv", "id,f0,f1,label\n1,1,2,1\n2,3,4,-1\n")
    b = write(tmp_path, "b.csv", "id,f2,extra\n1,1,1\n")
    with pytest.raises(HyflError) as error:
        load_parties({"a": a, "b": b}, columns={"b": ["f2", "f3"]}, psi=False)
    message = str(error.value)
    assert "b.csv (party 'b') lacks declared feature columns ['f3']" in message
    assert "has undeclared columns ['extra']" in message and "exactly the declared ones" in message
    with pytest.raises(HyflError, match=r"columns names parties \['c'\]"):
        load_parties({"a": a}, columns={"c": ["f0"]}, psi=False)
    with pytest.raises(HyflError, match=r"b\.csv.*columns \['extra'\] that are not among the 4"):
        load_parties({"a": a, "b": b}, features=["f0", "f1", "f2", "f3"], psi=False)
    with pytest.raises(HyflError, match=r"hold 2 of the 3 declared features; no file has \['f9'\]"):
        load_parties({"a": a}, features=["f0", "f9", "f1"], psi=False)
    with pytest.raises(HyflError, match="hold 2 distinct feature columns but 3 were declared"):
        load_parties({"a": a}, features=3, psi=False)
    with pytest.raises(HyflError, match="includes 'id'"):
        load_parties({"a": a}, features=["id", "f0"], psi=False)


def test_samples_without_features_or_labelled_rows(tmp_path):
    feats = write(tmp_path, "feats.csv", "id,x\n1,1\n2,2\n")
    labels = write(tmp_path, "labels.csv", "id,label\n1,1\n2,-1\n3,1\n")
    with pytest.raises(HyflError, match=r"sample ID '3' appear only in files without feature"):
        load_parties([feats, labels], psi=False)
    with pytest.raises(HyflError, match="have no feature columns at all"):
        load_parties([labels], psi=False)
    unlabeled = write(tmp_path, "u.csv", "id,z\n9,1\n")
    with pytest.raises(HyflError, match=r"u\.csv.*no labelled sample left"):
        load_parties([feats, labels, unlabeled], unlabeled="drop", psi=False)


def test_bad_arguments(tmp_path):
    a = write(tmp_path, "a.csv", "id,x,label\n1,1,1\n2,2,-1\n")
    with pytest.raises(HyflError, match="unlabeled"):
        load_parties([a], unlabeled="ignore")
    with pytest.raises(HyflError, match="task"):
        load_parties([a], task="ranking")
    with pytest.raises(HyflError, match="label_column is the ID column"):
        load_parties([a], label_column="id")
    with pytest.raises(HyflError, match="files is empty"):
        load_parties([])
    with pytest.raises(HyflError, match="text, which cannot be a regression target"):
        load_parties([write(tmp_path, "t.csv", "id,x,label\n1,1,a\n2,1,b\n")], task="regression")


def test_semicolon_csv_gets_a_hint(tmp_path):
    path = write(tmp_path, "excel.csv", "id;x;label\n1;2;1\n")
    with pytest.raises(HyflError, match=r"separated by ';'; party CSVs use commas"):
        load_parties([path], psi=False)


def test_load_data_points_party_specs_to_load_party_spec(tmp_path):
    from hyfl.data import load_data

    path = write(tmp_path, "p.csv", "id,x,label\n1,2,1\n")
    for value in (path, f"parties:{path}", tmp_path):
        with pytest.raises(HyflError, match="describes party files.*load_party_spec"):
            load_data(value)


# --------------------------------------------------------------------------- runs on party files


def test_restrict_samples_matches_partition_of_kept_rows(hybrid):
    from hyfl.partition import restrict_samples

    files, *_ = hybrid
    data, partition = load_parties(files, unlabeled="drop", psi=False)
    rows = np.sort(np.random.default_rng(3).choice(data.n_samples, 100, replace=False))
    kept = restrict_samples(partition, data.X, rows)
    X_kept = data.X[rows]
    kept.validate(X_kept)
    # Slow reference: every kept entry keeps its owner, every client keeps its kept samples.
    owner = {}
    rows_of = np.repeat(np.arange(data.n_samples), np.diff(data.X.indptr))
    for e, (i, m) in enumerate(zip(rows_of, data.X.indices, strict=True)):
        owner[(int(i), int(m))] = int(partition.entry_owner[e])
    new_rows = np.repeat(np.arange(len(rows)), np.diff(X_kept.indptr))
    for e, (r, m) in enumerate(zip(new_rows, X_kept.indices, strict=True)):
        assert kept.entry_owner[e] == owner[(int(rows[r]), int(m))]
    for k in range(partition.n_clients):
        expected_ids = [r for r, i in enumerate(rows) if i in set(partition.samples[k])]
        np.testing.assert_array_equal(kept.samples[k], expected_ids)
        np.testing.assert_array_equal(kept.features[k], partition.features[k])


def party_spec(files) -> str:
    return "parties:" + ",".join(f"{name}={path}" for name, path in files.items())


def test_run_on_party_spec_with_held_out_rows(hybrid, tmp_path):
    from hyfl.data import load_party_data
    from hyfl.experiments.runner import RunSpec, execute

    files, *_ = hybrid
    spec_text = party_spec(files) + ";unlabeled=drop;psi=no"
    train, val, partition = load_party_data(spec_text, val_fraction=0.2, seed=4)
    assert (train.n_samples, val.n_samples) == (120, 30)
    assert partition.n_samples == 120 and partition.n_clients == 3
    spec = RunSpec(
        data=spec_text,
        val_fraction=0.2,
        seed=4,
        iterations=30,
        lam=1e-2,
        participation="full",
        hyper={"local_steps": 10},
    )
    outcome = execute(spec, tmp_path / "run")
    assert outcome.summary["n_clients"] == 3
    metrics = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert metrics["val_accuracy"].notna().all()
    assert metrics["gap"].iloc[-1] < metrics["gap"].iloc[0]


def test_party_validation_files_use_training_columns_and_classes(hybrid, tmp_path):
    from hyfl.data import load_party_data

    files, X, y, _ = hybrid
    # Validation parties: columns in another order, labels present at one party only.
    ids = np.arange(10)
    val_a = frame(ids, X, [4, 0, 2, 1, 3], y)
    val_b = frame(ids, X, [9, 5, 6, 7, 8])
    val_a.to_csv(tmp_path / "va.csv", index=False)
    val_b.to_csv(tmp_path / "vb.csv", index=False)
    val_spec = f"parties:{tmp_path / 'va.csv'},{tmp_path / 'vb.csv'};psi=no"
    train, val, _ = load_party_data(party_spec(files) + ";unlabeled=drop;psi=no", val=val_spec)
    np.testing.assert_array_equal(val.X.toarray(), X[:10])
    np.testing.assert_array_equal(val.y, np.where(y[:10] == 1, 1.0, -1.0))


def test_party_files_refuse_a_partition_spec(hybrid):
    from hyfl.experiments.runner import RunSpec

    files, *_ = hybrid
    with pytest.raises(HyflError, match="party files bring their own partition"):
        RunSpec(data=party_spec(files), partition="grid:2x2").validated()
    with pytest.raises(HyflError, match="not party files"):
        RunSpec(data="breast_cancer", partition="parties").validated()


def test_config_with_party_table_runs_and_round_trips(hybrid, tmp_path):
    from hyfl.experiments.config import load_config
    from hyfl.experiments.runner import run_experiment

    files, *_ = hybrid
    text = f"""
[experiment]
name = "parties"
budget = {{ iterations = 15 }}

[data]
lam = 0.01
val_fraction = 0.25

[data.parties]
files = {{ A = "{files["A"].name}", B = "{files["B"].name}", C = "{files["C"].name}" }}
unlabeled = "drop"
psi = false

[algorithms.hyfdca]
local_steps = 5
"""
    path = files["A"].parent / "parties.toml"
    path.write_text(text)
    config = load_config(path)
    assert config.partition.spec == "parties"
    assert Path(config.data.parties["files"]["B"]) == files["B"]
    out = tmp_path / "results"
    run_experiment(config, out, progress=False)
    resolved = load_config(out / "config.toml")
    assert resolved.data.parties["files"] == config.data.parties["files"]
    metrics = pd.read_csv(out / "hyfdca" / "seed-0" / "metrics.csv")
    assert len(metrics) == 16 and metrics["val_accuracy"].notna().all()


def test_config_party_errors(hybrid):
    from hyfl.experiments.config import parse_config

    files, *_ = hybrid
    experiment = {"name": "p", "budget": {"iterations": 3}}
    base = {"experiment": experiment, "algorithms": {"hyfdca": {}}}
    table = {"files": {k: str(v) for k, v in files.items()}}
    with pytest.raises(HyflError, match=r"\[partition\] spec.*own partition"):
        parse_config({**base, "data": {"parties": table}, "partition": {"spec": "grid:2x2"}})
    with pytest.raises(HyflError, match="both given"):
        parse_config({**base, "data": {"parties": table, "dataset": "mnist"}})
    with pytest.raises(HyflError, match="id_colum"):
        parse_config({**base, "data": {"parties": {**table, "id_colum": "x"}}})
    with pytest.raises(HyflError, match="must name party files"):
        parse_config({**base, "data": {"parties": {"files": 3}}})


def test_files_sharing_no_id_blame_the_overlap(tmp_path):
    a = write(tmp_path, "a.csv", "id,x,label\n1,1,0\n2,2,1\n")
    b = write(tmp_path, "b.csv", "id,z\n7,1\n8,2\n9,3\n")
    with pytest.raises(HyflError) as error:
        load_parties({"hospital": a, "lab": b}, psi=False)
    message = str(error.value)
    assert "'hospital' (2 IDs, 0 shared)" in message and "'lab' (3 IDs, 0 shared)" in message
    assert "min_common=1" in message and "label" not in message.split(".")[0]
    c = write(tmp_path, "c.csv", "id,z\n1,1\n8,2\n9,3\n")
    with pytest.raises(HyflError, match=r"share 1 sample ID .* fewer than min_common=2"):
        load_parties({"hospital": a, "lab": c}, psi=False, min_common=2)
    data, _ = load_parties({"hospital": a, "lab": c}, psi=False, unlabeled="drop")
    assert data.meta["shared_ids"] == {"hospital": 1, "lab": 1}
    # Same columns everywhere (horizontal split): disjoint IDs are expected.
    d = write(tmp_path, "d.csv", "id,x,label\n5,1,0\n6,2,1\n")
    data, _ = load_parties([a, d], psi=False)
    assert data.meta["shared_ids"] == {"a": 0, "d": 0}
    spec_files, options = parse_party_spec(f"parties:{a},{b};min_common=0")
    assert options["min_common"] == 0


def _fate_files(tmp_path):
    """Breast cancer laid out as FATE's breast_hetero_guest/host example files: the guest
    has id, y and x0..x9, the host id and x0..x19 -- the same names, other measurements."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    ids = np.random.default_rng(0).permutation(len(y))
    guest = pd.DataFrame(X[:, :10], columns=[f"x{j}" for j in range(10)])
    guest.insert(0, "y", y)
    guest.insert(0, "id", ids)
    host = pd.DataFrame(X[:, 10:], columns=[f"x{j}" for j in range(20)])
    host.insert(0, "id", ids)
    guest.to_csv(tmp_path / "breast_hetero_guest.csv", index=False, float_format="%.6f")
    host.sample(frac=1.0, random_state=1).to_csv(tmp_path / "breast_hetero_host.csv",
                                                  index=False, float_format="%.6f")
    return X, y, ids


def test_fate_guest_and_host_files_read_with_party_scoped_names(tmp_path):
    X, y, ids = _fate_files(tmp_path)
    spec = (f"parties:guest={tmp_path / 'breast_hetero_guest.csv'},"
            f"host={tmp_path / 'breast_hetero_host.csv'};id=id;label=y")
    with pytest.raises(HyflError, match="scope=party"):  # x0 of the guest is not the host's
        load_party_spec(spec, psi=False)
    data, partition = load_party_spec(spec + ";scope=party", psi=False)
    names = list(data.meta["feature_names"])
    assert names[:10] == [f"guest.x{j}" for j in range(10)]
    assert names[10:] == [f"host.x{j}" for j in range(20)]
    rows = {str(i): r for r, i in enumerate(ids)}
    expected = X[[rows[str(i)] for i in data.meta["sample_ids"]]]
    np.testing.assert_allclose(data.X.toarray(), np.round(expected, 6), atol=1e-12)
    assert partition.n_clients == 2 and [len(f) for f in partition.features] == [10, 20]
