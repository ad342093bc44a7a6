"""``hyfl predict``: a model file and data in, one CSV row per sample out.

The jobs are separate functions: :func:`load_any_model` reads a model file of
either kind (dispatching on its header's ``kind``); :func:`read_data_for` reads
the data as the model was trained on them (a LIBSVM file's index base, party
files' column order); :func:`linear_outputs` / :func:`neural_outputs` compute the
predicted labels and score columns; :func:`agreement` compares them with the
data's own labels (accuracy, AUC, KS, average precision); :func:`write_predictions`
writes the CSV. :func:`predict_data` and :func:`predict_neural_data` run them in
order.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hyfl._io import csv_text
from hyfl._private_files import private_write
from hyfl.errors import HyflError, fail
from hyfl.model_container import read_kind
from hyfl.model_file import Model, data_checksum, load_model
from hyfl.neural.model_file import NEURAL_MODEL_KIND, NeuralModel, load_neural_model

__all__ = ["Prediction", "agreement", "check_out", "column_mismatch", "label_text",
           "linear_outputs", "load_any_model", "neural_outputs", "original_labels_of",
           "predict_data", "predict_file", "predict_neural_data", "read_data_for",
           "read_party_rows", "write_predictions"]


@dataclass
class Prediction:
    """What a prediction wrote: counts, accuracy, ranking metrics (AUC, KS, average
    precision: :mod:`hyfl.metrics`) and whether the data are the training data."""

    out: Path
    n_samples: int
    accuracy: float | None
    same_data: bool
    ranking: dict | None = None
    n_labelled: int | None = None  # rows with a known label (party files), None: all
    notices: tuple[str, ...] = ()  # what read, but looks mistaken (labels the model lacks)


def load_any_model(path: str | os.PathLike) -> Model | NeuralModel:
    """The model in ``path``, linear or neural, as its header's ``kind`` says."""
    if read_kind(path) == NEURAL_MODEL_KIND:
        return load_neural_model(path)
    return load_model(path)  # also the errors for files that are no model at all


def predict_file(model_path: str | os.PathLike, data: str | os.PathLike,
                 out: str | os.PathLike, *, data_dir: str | os.PathLike | None = None
                 ) -> Prediction:
    """``hyfl predict``: :func:`predict_data` or :func:`predict_neural_data` by the
    model file's kind."""
    if read_kind(model_path) == NEURAL_MODEL_KIND:
        return predict_neural_data(model_path, data, out, data_dir=data_dir)
    return predict_data(model_path, data, out, data_dir=data_dir)


# --------------------------------------------------------------------------- linear


def predict_data(model_path: str | os.PathLike, data: str | os.PathLike,
                 out: str | os.PathLike, *, data_dir: str | os.PathLike | None = None
                 ) -> Prediction:
    """``hyfl predict`` for a linear model: write one CSV row per sample of ``data``.

    Columns: ``index`` (0-based row of the data; ``id``, each row's own id, for party
    files), ``prediction`` (the original
    label; the real value for regression), then ``decision`` (one output) or
    ``decision_<label>`` per class (multiclass, by original label); a logistic
    model adds ``probability_<label>`` per class (:meth:`hyfl.losses.Logistic.
    log_probabilities`).

    ``accuracy`` compares the predictions with the data's own labels in original
    label space, and ``ranking`` holds the AUC, KS and average precision of the
    decision values against them (both None for regression or data without
    original labels). The data are read by :func:`read_data_for`.
    """
    check_out(data, out)
    model = load_model(model_path)
    dataset = read_data_for(model, data, data_dir)
    predicted, columns, values, decisions = linear_outputs(model, dataset)
    accuracy, ranking = agreement(model, dataset, predicted, decisions)
    y = np.asarray(dataset.y, dtype=np.float64)
    same = (not np.isnan(y).any()
            and data_checksum(dataset.X, y) == model.provenance.get("data_sha256"))
    parties = "truth" in dataset.meta  # party files: each row's own id
    out = write_predictions(out, predicted, columns, values,
                            regression=model.task == "regression",
                            ids=dataset.meta["sample_ids"] if parties else None)
    labelled = int(np.count_nonzero(~np.isnan(y))) if parties else None
    return Prediction(out=out, n_samples=dataset.n_samples, accuracy=accuracy, same_data=same,
                      ranking=ranking, n_labelled=labelled,
                      notices=tuple(dataset.meta.get("notices", ())))


def check_out(data: str | os.PathLike, out: str | os.PathLike) -> None:
    """Refuse an ``out`` that is one of the party files to score (it would be overwritten
    by the predictions) or lies in the folder of party files scored (every later run over
    the folder would read it as one more party's file)."""
    from hyfl.data import is_party_spec, parse_party_spec
    from hyfl.data.parties import party_suffix

    if not is_party_spec(data):
        return
    target = Path(out).expanduser().resolve()
    text = os.fspath(data).strip()
    head = text.removeprefix("parties:").split(";")[0].strip()
    try:
        files, _ = parse_party_spec(data)
    except HyflError:
        return  # the data's own error comes when they are read
    if target in {Path(p).expanduser().resolve() for p in files.values()}:
        raise fail(f"--out {str(out)!r}", "is one of the party files to score: the "
                   "predictions would overwrite it", "Write the predictions to another file "
                   "(--out predictions.csv outside the data).")
    folder = Path(head).expanduser()
    if folder.is_dir() and target.parent == folder.resolve() and party_suffix(target.name):
        raise fail(f"--out {str(out)!r}", f"is in the folder of party files {str(folder)!r}: "
                   "every later run over that folder would read the predictions as one more "
                   "party's file", "Write the predictions outside the folder (e.g. --out "
                   "predictions.csv in the working folder).")


def read_data_for(model: Model, data: str | os.PathLike,
                  data_dir: str | os.PathLike | None = None):
    """``data`` read as ``model``'s training data were, and checked against its width.

    A LIBSVM file is read with the training file's index base (0- or 1-based, when
    the training data was a LIBSVM file) and, since such a file only reveals its
    largest feature index, given the model's width when it looks narrower; data
    with more features than the model, or a named dataset of another width, are
    refused. Party files are read by :func:`read_party_rows`: labelled or not,
    their columns matched to the model's by name.
    """
    from hyfl.data import dataset_names, is_party_spec, load_data
    from hyfl.data.loaders import load_libsvm, widen

    name = str(data).partition(":")[0]
    if is_party_spec(data):
        dataset = read_party_rows(model, data)
    elif name not in dataset_names() and Path(data).is_file():
        dataset = load_libsvm(data, zero_based=model.provenance.get("zero_based", "auto"))
        if dataset.n_features < model.n_features:  # trailing features the file never uses
            dataset = replace(dataset, X=widen(dataset.X, model.n_features))
    else:
        dataset = load_data(data, data_dir=data_dir)
    model.check_features(dataset.n_features, f"data {str(data)!r}")
    return dataset


def read_party_rows(model: Model, data: str | os.PathLike):
    """Party files as rows to score: every sample some file with features holds, labelled
    or not, its features in the model's order.

    The samples are numbered as :func:`hyfl.data.load_parties` numbers them (the first
    file's rows, then each later file's new ids); ``meta["sample_ids"]`` holds their
    ids. A sample's label is the first file's that labels it; ``y`` holds the encoded
    label (NaN where none is known) and ``meta["truth"]`` the original one (None
    there). The model's weight column (``;weight=`` in training) is never a feature,
    so the spec need not repeat the option. The files' feature columns must be the
    model's (any file order); a mismatch names only the differing columns
    (:func:`column_mismatch`).
    """
    import scipy.sparse as sp

    from hyfl.data import parse_party_spec
    from hyfl.data.dataset import Dataset
    from hyfl.data.loaders import clean_csr
    from hyfl.data.parties import check_files_agree, read_party_file

    files, options = parse_party_spec(data)
    id_column = options.get("id_column", "id")
    label_column = options.get("label_column", "label")
    weight = options.get("weight_column") or model.provenance.get("weight_column")
    tables = [read_party_file(path, party=party, id_column=id_column,
                              label_column=label_column) for party, path in files.items()]
    for table in tables:
        if weight and weight in table.features:  # a loss weight, not a feature
            keep = [c for c in range(len(table.features)) if table.features[c] != weight]
            table.features = [table.features[c] for c in keep]
            table.values = table.values[:, keep]
        if options.get("scope") == "party":
            table.features = [f"{table.party}.{column}" for column in table.features]
    check_files_agree(tables)  # as training refuses them: conflicting cells, labels, IDs
    trained = model.provenance.get("feature_names")
    columns = list(dict.fromkeys(c for t in tables for c in t.features))
    if trained is None:  # a model of other data: the files' own order, checked by width
        trained = columns
    trained = [str(c) for c in trained]
    if sorted(columns) != sorted(trained):
        raise column_mismatch(model, trained, columns, data)
    index: dict[str, int] = {}
    for table in tables:
        if table.features:
            for i in table.ids:
                index.setdefault(i, len(index))
    feature = {name: m for m, name in enumerate(trained)}
    rows, cols, vals = [], [], []
    held = np.zeros((len(index), len(trained)), dtype=bool)
    truth = np.full(len(index), None, dtype=object)
    for table in tables:
        g = np.array([index.get(i, -1) for i in table.ids], dtype=np.int64)
        if table.features:
            m = np.array([feature[c] for c in table.features], dtype=np.int64)
            own = ~held[np.ix_(g, m)]  # a cell two files hold: the first file's, as in training
            r, c = np.nonzero(own & (table.values != 0))
            rows.append(g[r]), cols.append(m[c]), vals.append(table.values[r, c])
            held[np.ix_(g, m)] = True
        if table.labels is not None:
            new = table.label_known & (g >= 0)
            new[new] = [truth[k] is None for k in g[new]]
            for row in np.flatnonzero(new):
                value = table.labels[row]
                truth[g[row]] = value if isinstance(value, str) else float(value)
    X = sp.csr_matrix((np.concatenate(vals or [np.empty(0)]),
                       (np.concatenate(rows or [np.empty(0, np.int64)]),
                        np.concatenate(cols or [np.empty(0, np.int64)]))),
                      shape=(len(index), len(trained)))
    y = _encoded_truth(model, truth)
    return Dataset(X=clean_csr(X), y=y, name="parties", task=model.task,
                   meta={"format": "parties", "source": "party files",
                         "feature_names": tuple(trained), "sample_ids": tuple(index),
                         "id_column": id_column, "truth": truth,
                         "notices": _unknown_label_notices(model, truth, y, label_column)})


def _unknown_label_notices(model: Model, truth: np.ndarray, y: np.ndarray,
                           label_column: str) -> tuple[str, ...]:
    """A notice for labels the model does not know (``0``/``1`` for a model of ``benign``/
    ``malignant``): their rows count as unlabelled, which no figure would show."""
    unknown = [i for i, t in enumerate(truth) if t is not None and np.isnan(y[i])]
    if not unknown:
        return ()
    found = list(dict.fromkeys(label_text(truth[i]) for i in unknown))
    shown = ", ".join(map(repr, found[:5])) + (" ..." if len(found) > 5 else "")
    if model.task == "regression":
        return (f"{len(unknown)} row{'s' if len(unknown) > 1 else ''} of column "
                f"{label_column!r} hold text ({shown}), not a number: they are not compared",)
    classes = ", ".join(repr(label_text(v)) for v in model.original_labels(model.classes))
    return (f"{len(unknown)} of {int(np.count_nonzero([t is not None for t in truth]))} "
            f"labels in column {label_column!r} ({shown}) are none of the model's classes "
            f"({classes}): those rows are scored but left out of the accuracy",)


def _encoded_truth(model: Model, truth: np.ndarray) -> np.ndarray:
    """The known labels in hyfl's encoding (as training encoded them), NaN elsewhere and
    for labels the model does not know."""
    y = np.full(truth.size, np.nan)
    known = np.array([t is not None for t in truth], dtype=bool)
    if model.task == "regression":
        for i in np.flatnonzero(known):
            y[i] = float(truth[i]) if not isinstance(truth[i], str) else np.nan
        return y
    names = [label_text(v) for v in model.original_labels(model.classes)]
    position = {name: k for k, name in enumerate(names)}
    for i in np.flatnonzero(known):
        k = position.get(label_text(truth[i]))
        if k is not None:
            y[i] = model.classes[k]
    return y


def column_mismatch(model: Model, trained, columns, data):
    """The error for files whose feature columns are not the model's: only the names that
    differ (missing ones, unexpected ones, each with its close matches)."""
    import difflib

    missing = [c for c in trained if c not in set(columns)]
    extra = [c for c in columns if c not in set(trained)]

    def named(names, among):
        shown = []
        for name in names[:8]:
            folded = {}  # close in any case: 'S' is close to 's'
            for other in among:
                folded.setdefault(other.casefold(), other)
            close = [folded[c] for c in difflib.get_close_matches(name.casefold(), folded,
                                                                  n=2, cutoff=0.5)]
            shown.append(f"{name!r}" + (f" (close: {', '.join(map(repr, close))})" if close
                                        else ""))
        more = f" and {len(names) - 8} more" if len(names) > 8 else ""
        return ", ".join(shown) + more

    parts = []
    if missing:
        parts.append(f"lack the model's feature column{'s' if len(missing) > 1 else ''} "
                     f"{named(missing, extra)}")
    if extra:
        # close to a missing column, or (none missing) to one another file holds
        parts.append(f"have column{'s' if len(extra) > 1 else ''} the model was not trained "
                     f"on: {named(extra, missing or trained)}")
    weight = model.provenance.get("weight_column")
    fix = ("Bring the training columns (rename the close matches, drop the unexpected "
           "columns, or name the id and label columns with ;id= and ;label=).")
    if weight and weight in missing:
        fix += f" The model's weight column is {weight!r}."
    return fail(f"data {str(data)!r}", "; ".join(parts), fix)


def linear_outputs(model: Model, dataset):
    """The predicted original labels, the score columns' names and values, and the raw
    decision values (for :func:`agreement`)."""
    decisions = model.decision_function(dataset.X)
    predicted = model.original_labels(model.predict_encoded(dataset.X))
    columns, values = score_columns(decisions, output_names(model),
                                    model.loss == "logistic" and model.task != "regression")
    return predicted, columns, values, decisions


def output_names(model: Model) -> tuple:
    """The original label of each score, in the model's order (binary: the label encoded
    -1, then +1; multiclass: one per class; regression: none)."""
    if model.task == "binary":
        return tuple(model.original_labels(np.array([-1.0, 1.0])))
    if model.task == "multiclass":
        return tuple(model.original_labels(model.classes))
    return ()


def score_columns(decisions: np.ndarray, names, logistic: bool) -> tuple[list[str], np.ndarray]:
    """The score columns' names and values: ``decision`` (or ``decision_<label>`` per
    class) and for a logistic model ``probability_<label>`` per class
    (:meth:`hyfl.losses.Logistic.log_probabilities`)."""
    columns = (["decision"] if decisions.ndim == 1
               else [f"decision_{label_text(v)}" for v in names])
    values = decisions
    if logistic:
        from hyfl.losses import Logistic

        columns += [f"probability_{label_text(v)}" for v in names]
        values = np.column_stack([decisions, np.exp(Logistic.log_probabilities(decisions))])
    return columns, values.reshape(len(values), -1)


def labels_of_scores(decisions: np.ndarray, task: str, names) -> np.ndarray:
    """The predicted labels of scores, as :meth:`hyfl.model_file.Model.predict` gives them
    (binary: the second label where the score is >= 0; multiclass: the largest score's)."""
    if task == "regression":
        return np.asarray(decisions, dtype=np.float64)
    names = np.asarray(list(names), dtype=object)
    if task == "binary":
        return names[(np.asarray(decisions) >= 0).astype(np.int64)]
    return names[np.argmax(decisions, axis=1)]


def agreement(model: Model, dataset, predicted: np.ndarray, decisions: np.ndarray
              ) -> tuple[float | None, dict | None]:
    """Accuracy of ``predicted`` and ranking metrics of ``decisions`` against the data's
    own labels (None, None for regression or data without original labels)."""
    if model.task == "regression" or dataset.task == "regression":
        return None, None
    if "truth" in dataset.meta:  # party files: the rows with a label the model knows
        known = ~np.isnan(np.asarray(dataset.y, dtype=np.float64))
        if not known.any():
            return None, None
        truth = model.original_labels(np.asarray(dataset.y, dtype=np.float64)[known])
        return (float(np.mean(predicted[known] == truth)),
                _ranking(model, decisions[known], truth))
    truth = original_labels_of(dataset)
    if truth is None:
        return None, None
    return float(np.mean(predicted == truth)), _ranking(model, decisions, truth)


def _ranking(model: Model, scores: np.ndarray, truth: np.ndarray) -> dict:
    """AUC, KS and average precision of a model's decision values against original labels."""
    from hyfl.metrics import ranking_metrics

    if scores.ndim == 1:  # the positive class is the one encoded +1
        positive = model.original_labels(np.array([1.0]))[0]
        return ranking_metrics(scores, np.where(truth == positive, 1, -1))
    return ranking_metrics(scores, truth, model.original_labels(model.classes))


# --------------------------------------------------------------------------- neural


def predict_neural_data(model_path, data, out, *, data_dir=None) -> Prediction:
    """``hyfl predict`` for a neural model: one CSV row per sample of ``data``.

    Columns: ``index``, ``prediction`` (the original label) and one
    ``score_<label>`` per class (the model's logit). Data of another width
    than the training data are refused.
    """
    from hyfl.data import load_data

    check_out(data, out)
    model = load_neural_model(model_path)
    dataset = load_data(data, data_dir=data_dir)
    expected = int(model.header["input_features"])
    if dataset.n_features != expected:
        raise fail(f"data {str(data)!r}", f"has {dataset.n_features} features, the model was "
                   f"trained on {expected}", "Pass data with the training data's features.")
    predicted, columns, scores, accuracy = neural_outputs(model, dataset)
    out = write_predictions(out, predicted, columns, scores)
    return Prediction(out=out, n_samples=dataset.n_samples, accuracy=accuracy, same_data=False)


def neural_outputs(model: NeuralModel, dataset):
    """The predicted labels, the score columns' names and values (logits), and the
    accuracy against the data's labels as hyfl loaded them."""
    scores = model.scores(dataset.X)
    encoded = model.classes[np.argmax(scores, axis=1)]  # labels as hyfl loaded them
    accuracy = float(np.mean(encoded == np.asarray(dataset.y, dtype=np.float64)))
    predicted = encoded
    if dataset.task == "binary":  # -1/+1 back to the file's own labels when known
        original = original_labels_of(replace(dataset, y=encoded))
        predicted = original if original is not None else encoded
    return predicted, [f"score_{label_text(c)}" for c in model.classes], scores, accuracy


# --------------------------------------------------------------------------- shared


def write_predictions(out: str | os.PathLike, predicted: np.ndarray, columns: list[str],
                      values: np.ndarray, *, regression: bool = False, ids=None) -> Path:
    """Write ``index, prediction, *columns`` per sample to ``out``, atomically; with ``ids``
    (party files' rows) ``id`` and each row's own id instead of ``index``."""
    out = Path(out)
    # One line per sample of the data: owner only (hyfl._private_files).
    with private_write(out, "w", newline="") as f:
        writer = csv.writer(f)
        # Labels and score columns are named by the data's own classes: escaped (OWASP).
        writer.writerow(["index" if ids is None else "id", "prediction",
                         *map(csv_text, columns)])
        for i in range(len(predicted)):
            label = repr(float(predicted[i])) if regression else label_text(predicted[i])
            key = i if ids is None else csv_text(str(ids[i]))
            writer.writerow([key, csv_text(label), *(repr(float(v)) for v in values[i])])
    return out


def label_text(value) -> str:
    """A label as the CSV writes it: text as it is, whole numbers without ``.0``."""
    if isinstance(value, str):
        return value
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def original_labels_of(dataset) -> np.ndarray | None:
    """The dataset's labels as its original values (None if its mapping is unknown)."""
    original = tuple(dataset.meta.get("classes") or ())
    y = np.asarray(dataset.y, dtype=np.float64)
    text = any(isinstance(label, str) for label in original)
    values = np.asarray(original, dtype=object if text else np.float64)
    if dataset.task == "binary" and len(original) == 2:
        return values[(y > 0).astype(np.int64)]
    if dataset.task == "multiclass" and original:
        return values[y.astype(np.int64)]
    return None

