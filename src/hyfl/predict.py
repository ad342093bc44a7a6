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
from hyfl.errors import fail
from hyfl.model_container import read_kind
from hyfl.model_file import Model, data_checksum, load_model
from hyfl.neural.model_file import NEURAL_MODEL_KIND, NeuralModel, load_neural_model

__all__ = ["Prediction", "agreement", "label_text", "linear_outputs", "load_any_model",
           "neural_outputs", "original_labels_of", "predict_data", "predict_file",
           "predict_neural_data", "read_data_for", "write_predictions"]


@dataclass
class Prediction:
    """What a prediction wrote: counts, accuracy, ranking metrics (AUC, KS, average
    precision: :mod:`hyfl.metrics`) and whether the data are the training data."""

    out: Path
    n_samples: int
    accuracy: float | None
    same_data: bool
    ranking: dict | None = None


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

    Columns: ``index`` (0-based row of the data), ``prediction`` (the original
    label; the real value for regression), then ``decision`` (one output) or
    ``decision_<label>`` per class (multiclass, by original label); a logistic
    model adds ``probability_<label>`` per class (:meth:`hyfl.losses.Logistic.
    log_probabilities`).

    ``accuracy`` compares the predictions with the data's own labels in original
    label space, and ``ranking`` holds the AUC, KS and average precision of the
    decision values against them (both None for regression or data without
    original labels). The data are read by :func:`read_data_for`.
    """
    model = load_model(model_path)
    dataset = read_data_for(model, data, data_dir)
    predicted, columns, values, decisions = linear_outputs(model, dataset)
    accuracy, ranking = agreement(model, dataset, predicted, decisions)
    same = data_checksum(dataset.X, dataset.y) == model.provenance.get("data_sha256")
    out = write_predictions(out, predicted, columns, values,
                            regression=model.task == "regression")
    return Prediction(out=out, n_samples=dataset.n_samples, accuracy=accuracy, same_data=same,
                      ranking=ranking)


def read_data_for(model: Model, data: str | os.PathLike,
                  data_dir: str | os.PathLike | None = None):
    """``data`` read as ``model``'s training data were, and checked against its width.

    A LIBSVM file is read with the training file's index base (0- or 1-based, when
    the training data was a LIBSVM file) and, since such a file only reveals its
    largest feature index, given the model's width when it looks narrower; data
    with more features than the model, or a named dataset of another width, are
    refused. Party files must bring the training columns in the training order.
    """
    from hyfl.data import dataset_names, is_party_spec, load_data, load_party_spec
    from hyfl.data.loaders import load_libsvm, widen

    name = str(data).partition(":")[0]
    if is_party_spec(data):  # labelled party files, read together here (no alignment needed)
        dataset, _ = load_party_spec(data, psi=False)
        _check_feature_names(model, dataset.meta.get("feature_names", ()), data)
    elif name not in dataset_names() and Path(data).is_file():
        dataset = load_libsvm(data, zero_based=model.provenance.get("zero_based", "auto"))
        if dataset.n_features < model.n_features:  # trailing features the file never uses
            dataset = replace(dataset, X=widen(dataset.X, model.n_features))
    else:
        dataset = load_data(data, data_dir=data_dir)
    model.check_features(dataset.n_features, f"data {str(data)!r}")
    return dataset


def linear_outputs(model: Model, dataset):
    """The predicted original labels, the score columns' names and values, and the raw
    decision values (for :func:`agreement`)."""
    decisions = model.decision_function(dataset.X)
    predicted = model.original_labels(model.predict_encoded(dataset.X))
    if model.task == "binary":
        names = model.original_labels(np.array([-1.0, 1.0]))
    elif model.task == "multiclass":
        names = model.original_labels(model.classes)
    else:
        names = ()
    columns = (["decision"] if decisions.ndim == 1
               else [f"decision_{label_text(v)}" for v in names])
    values = decisions
    if model.loss == "logistic" and model.task != "regression":
        from hyfl.losses import Logistic

        columns += [f"probability_{label_text(v)}" for v in names]
        values = np.column_stack([decisions, np.exp(Logistic.log_probabilities(decisions))])
    return predicted, columns, values.reshape(len(values), -1), decisions


def agreement(model: Model, dataset, predicted: np.ndarray, decisions: np.ndarray
              ) -> tuple[float | None, dict | None]:
    """Accuracy of ``predicted`` and ranking metrics of ``decisions`` against the data's
    own labels (None, None for regression or data without original labels)."""
    if model.task == "regression" or dataset.task == "regression":
        return None, None
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


def _check_feature_names(model: Model, names, data) -> None:
    """Party files must bring the training columns in the training order."""
    trained = model.provenance.get("feature_names")
    if trained is None or list(trained) == list(names):
        return
    first = next((i for i, (a, b) in enumerate(zip(trained, names)) if a != b),
                 min(len(trained), len(names)))
    weight = model.provenance.get("weight_column")
    fix = ("List the party files in the training order, with the training columns."
           if weight is None or weight not in list(names) else
           f"Add the spec option ;weight={weight} (as in training), so that the weight column "
           "is not read as a feature.")
    raise fail(f"data {str(data)!r}", f"have the feature columns {list(names)[:8]}, the "
               f"model was trained on {list(trained)[:8]} (they differ at column {first + 1})",
               fix)


# --------------------------------------------------------------------------- neural


def predict_neural_data(model_path, data, out, *, data_dir=None) -> Prediction:
    """``hyfl predict`` for a neural model: one CSV row per sample of ``data``.

    Columns: ``index``, ``prediction`` (the original label) and one
    ``score_<label>`` per class (the model's logit). Data of another width
    than the training data are refused.
    """
    from hyfl.data import load_data

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
                      values: np.ndarray, *, regression: bool = False) -> Path:
    """Write ``index, prediction, *columns`` per sample to ``out``, atomically."""
    out = Path(out)
    # One line per sample of the data: owner only (hyfl._private_files).
    with private_write(out, "w", newline="") as f:
        writer = csv.writer(f)
        # Labels and score columns are named by the data's own classes: escaped (OWASP).
        writer.writerow(["index", "prediction", *map(csv_text, columns)])
        for i in range(len(predicted)):
            label = repr(float(predicted[i])) if regression else label_text(predicted[i])
            writer.writerow([i, csv_text(label), *(repr(float(v)) for v in values[i])])
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

