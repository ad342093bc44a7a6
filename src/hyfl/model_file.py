"""Trained linear models on disk: ``model.npz``.

(Predicting from a model file is :mod:`hyfl.predict`; the container -- header,
checksum, safe reading -- is :mod:`hyfl.model_container`.)

Every results folder (``hyfl run``, each run of a config, ``hyfl deploy local``)
holds a ``model.npz``; ``hyfl predict`` reads it. The file is an ``.npz`` read with
``allow_pickle=False`` (nothing in it can run code, like ``checkpoint.npz``), with
numeric arrays only:

``weights``
    float64, shape (n_features, n_outputs): one column per output (one for binary
    classification and regression, one per class for one-vs-rest multiclass).
``intercept``
    float64, shape (n_outputs,): the bias of each output (zeros for a model fitted
    without an intercept; absent from format-1 files, which had none).
``classes``
    float64, shape (n_outputs,) or (2,) or (0,): the encoded label of each column
    (multiclass), ``[-1, +1]`` (binary) or empty (regression).
``labels``
    float64, same shape as ``classes``: the original label of each encoded one
    (the label mapping; e.g. breast-cancer's ``[0, 1]`` for ``[-1, +1]``).
``__header__``
    JSON bytes (uint8): ``format`` (checked on load), ``kind`` ("hyfl-model"),
    ``label_names`` (only for text labels: the text of each original label, whose
    ``labels`` entry is then its position in this list),
    ``task``, ``loss``, ``lam``, ``n_features``, ``n_outputs``, ``partition``,
    ``algorithm`` and ``provenance`` (``hyfl_version``, ``data`` (name or path),
    ``data_sha256`` (see :func:`data_checksum`), ``n_samples``, ``written`` and, for
    a LIBSVM training file, ``zero_based``), plus ``content_sha256``: the SHA-256 of
    the arrays above and the rest of the header, so an edited file is refused (a
    check against accidents and careless edits, not a signature).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from hyfl.errors import HyflError, fail
from hyfl.model_container import (
    check_content,
    content_sha256,
    read_container,
    read_kind,
    write_container,
)

MODEL_FORMAT = 2
_READABLE_FORMATS = (1, 2)  # format 1: no intercept array
MODEL_KIND = "hyfl-model"
MODEL_FILE = "model.npz"
_ARRAYS = ("weights", "classes", "labels")
_OPTIONAL_ARRAYS = ("intercept",)
_TASKS = ("binary", "multiclass", "regression")


def data_checksum(X, y) -> str:
    """SHA-256 (hex) of a training set's arrays as hyfl holds them.

    Hashes, in order, the shape ``(n_samples, n_features)`` as two little-endian
    int64, the CSR ``indptr`` and ``indices`` as int64, ``data`` as float64 (after
    ``sorted_indices``) and the labels ``y`` as float64 (the encoded labels: ±1,
    class indices or real targets). Equal data give equal checksums whatever file
    they were read from.
    """
    X = sp.csr_matrix(X, dtype=np.float64)
    if not X.has_sorted_indices:
        X = X.sorted_indices()
    h = hashlib.sha256()
    h.update(np.asarray(X.shape, dtype="<i8").tobytes())
    for arr, dtype in ((X.indptr, "<i8"), (X.indices, "<i8"), (X.data, "<f8"),
                       (np.asarray(y), "<f8")):
        h.update(np.ascontiguousarray(arr, dtype=dtype).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Model:
    """A trained linear model as read from (or written to) ``model.npz``.

    Parameters
    ----------
    weights : ndarray, shape (n_features, n_outputs)
    intercept : ndarray, shape (n_outputs,)
        Added to ``X @ weights`` (zeros for a model without intercept).
    task : {"binary", "multiclass", "regression"}
    classes : ndarray
        Encoded label of each output column (multiclass), ``[-1, 1]`` (binary),
        empty (regression).
    labels : ndarray
        Original label of each entry of ``classes`` (the label mapping).
    loss, lam, partition, algorithm
        How it was trained.
    provenance : dict
        ``hyfl_version``, ``data``, ``data_sha256``, ``n_samples``, ``written``.
    label_names : tuple of str
        For text labels (``"<=50K"``, ``">50K"``): the text of each original label,
        ``labels`` then holding positions in it. Empty for numeric labels.
    """

    weights: np.ndarray
    intercept: np.ndarray
    task: str
    classes: np.ndarray
    labels: np.ndarray
    loss: str
    lam: float
    partition: str
    algorithm: str
    provenance: dict = field(default_factory=dict)
    label_names: tuple = ()

    @property
    def n_features(self) -> int:
        return int(self.weights.shape[0])

    @property
    def n_outputs(self) -> int:
        return int(self.weights.shape[1])

    def check_features(self, n_features: int, source: str = "the data") -> None:
        """Raise unless data with ``n_features`` columns fit this model."""
        if n_features != self.n_features:
            raise fail(
                source,
                f"has {n_features} features but the model was trained on {self.n_features}",
                f"Predict on data with the training data's {self.n_features} features (same "
                f"dataset, columns and preprocessing as {self.provenance.get('data', 'it')!r}); "
                "hyfl does not pad or drop columns.",
            )

    def decision_function(self, X) -> np.ndarray:
        """Scores ``X @ weights + intercept``: shape (n_samples,) for one output, else
        (n_samples, C)."""
        X = X if sp.issparse(X) else np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise fail("X", f"must be 2-D, got shape {X.shape}", "Pass (n_samples, n_features).")
        self.check_features(X.shape[1], "X")
        scores = np.asarray(X @ self.weights, dtype=np.float64) + self.intercept
        return scores[:, 0] if self.n_outputs == 1 else scores

    def predict_encoded(self, X) -> np.ndarray:
        """Predictions in hyfl's encoded labels (±1, class index, or real values)."""
        scores = self.decision_function(X)
        if self.task == "multiclass":
            return self.classes[np.argmax(scores, axis=1)]
        if self.task == "binary":
            return np.where(scores >= 0, 1.0, -1.0)
        return scores

    def original_labels(self, encoded: np.ndarray) -> np.ndarray:
        """Map encoded labels back to the training data's original labels."""
        if self.task == "regression" or len(self.classes) == 0:
            return np.asarray(encoded, dtype=np.float64)
        position = np.searchsorted(self.classes, encoded)
        labels = self.labels[np.clip(position, 0, len(self.labels) - 1)]
        if self.label_names:
            return np.asarray(self.label_names, dtype=object)[labels.astype(np.int64)]
        return labels

    def predict(self, X) -> np.ndarray:
        """Predicted labels, as the original labels of the training data."""
        return self.original_labels(self.predict_encoded(X))


def model_from_problem(problem, weights, *, data_meta: dict | None = None,
                       partition: str = "", algorithm: str = "", data: str = "",
                       data_X=None, data_y=None, feature_scale=None) -> Model:
    """Build a :class:`Model` from a :class:`~hyfl.problem.Problem` and its weights.

    ``data_meta`` is the training dataset's ``meta`` (its ``classes`` give the
    original labels; its ``intercept_scaling``, that the last weight is the
    intercept's, :func:`hyfl.data.dataset.with_intercept`); ``data_y`` its encoded
    labels (for the checksum; default the problem's first label column), ``data_X`` its
    features as read (default the problem's); ``feature_scale`` (M,) the scales the
    problem's features were divided by (:mod:`hyfl.privacy.secure_scaling`), folded
    into the weights so that the model reads raw features.
    """
    from hyfl.data.dataset import split_intercept

    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim == 1:
        weights = weights[:, None]
    if feature_scale is not None:
        from hyfl.privacy.secure_scaling import unscale_weights

        weights = unscale_weights(weights, feature_scale)
    scaling = (data_meta or {}).get("intercept_scaling")
    weights, intercept = split_intercept(weights, scaling)
    X = problem.X if data_X is None else data_X
    X = X if scaling is None else X[:, :-1]
    original = tuple((data_meta or {}).get("classes") or ())
    names: tuple = ()
    if any(isinstance(label, str) for label in original):  # text: stored by position
        names, original = tuple(str(label) for label in original), tuple(range(len(original)))
    if problem.classes is not None:
        task = "multiclass"
        classes = np.asarray(problem.classes, dtype=np.float64)
    elif problem.Y.shape[1] > 1:  # one-vs-rest columns without their labels (party blocks)
        task, classes = "multiclass", np.arange(problem.Y.shape[1], dtype=np.float64)
    elif problem.loss.classification or bool(np.all(np.abs(problem.Y) == 1.0)):
        task, classes = "binary", np.array([-1.0, 1.0])
    else:
        task, classes = "regression", np.empty(0)
    if task == "multiclass" and len(original) >= int(classes.max(initial=-1)) + 1:
        labels = np.asarray(original, dtype=np.float64)[classes.astype(np.int64)]
    elif task == "binary" and len(original) == 2:
        labels = np.asarray(original, dtype=np.float64)
    else:
        labels, names = classes.copy(), ()
    y = problem.Y[:, 0] if data_y is None else data_y
    from hyfl import __version__

    return Model(
        weights=weights, intercept=intercept, task=task, classes=classes, labels=labels,
        loss=str(getattr(problem.loss, "name", problem.loss)), lam=float(problem.lam),
        partition=str(partition), algorithm=str(algorithm),
        provenance={"hyfl_version": __version__, "data": str(data),
                    "data_sha256": data_checksum(X, y),
                    "n_samples": int(problem.n_samples), "written": time.time(),
                    **_how_read(data_meta or {})},
        label_names=names,
    )


def _how_read(meta: dict) -> dict:
    """How the training data were read, to read others alike: a LIBSVM file's index
    base, party files' feature names (their column order)."""
    out: dict = {}
    if isinstance(meta.get("zero_based"), bool):
        out["zero_based"] = meta["zero_based"]
    if meta.get("feature_names") and meta.get("format") == "parties":
        names = meta["feature_names"]
        if meta.get("intercept_scaling") is not None:  # the constant column is not read
            names = names[:-1]
        out["feature_names"] = [str(name) for name in names]
        if meta.get("weight_column"):
            out["weight_column"] = str(meta["weight_column"])
    return out


def save_model(path: str | os.PathLike, model: Model) -> Path:
    """Write ``model`` to ``path`` (an ``.npz``; see the module docstring), atomically."""
    arrays = {name: np.asarray(getattr(model, name), dtype=np.float64)
              for name in _ARRAYS + _OPTIONAL_ARRAYS}
    header = {
        "kind": MODEL_KIND,
        "format": MODEL_FORMAT,
        "task": model.task,
        "loss": model.loss,
        "lam": model.lam,
        "n_features": model.n_features,
        "n_outputs": model.n_outputs,
        "partition": model.partition,
        "algorithm": model.algorithm,
        "provenance": model.provenance,
    }
    if model.label_names:
        header["label_names"] = list(model.label_names)
    return write_container(path, arrays, header, names=_ARRAYS)


def model_sha256(arrays: dict[str, np.ndarray], header: dict) -> str:
    """The ``content_sha256`` of a linear model file (its rule:
    :func:`hyfl.model_container.content_sha256` over ``weights``, ``classes``,
    ``labels``)."""
    return content_sha256(arrays, header, names=_ARRAYS)


def load_model(path: str | os.PathLike) -> Model:
    """Read a ``model.npz`` written by :func:`save_model`.

    Raises
    ------
    HyflError
        The file is missing, not an ``.npz``, holds pickled objects or arrays
        larger than declared, is not a hyfl model, has another format version,
        was edited (its arrays or header do not match its ``content_sha256``), or
        a field does not fit the others (see :func:`check_model_fields`).
    """
    # Another kind of model file holds members this kind never does: name the kind
    # from the header alone before the members are checked against this kind's.
    kind = read_kind(path)
    if isinstance(kind, str) and kind.startswith("hyfl-") and kind != MODEL_KIND:
        other = kind.removeprefix("hyfl-").removesuffix("-model")  # e.g. "neural"
        raise fail(f"model file {path}", f"holds a {other} model, which this reader of "
                   "linear models cannot use",
                   "Use hyfl predict, or hyfl.predict.load_any_model, which reads every kind.")
    header, arrays, culprit = read_container(
        path, "Pass the model.npz of a results folder (`hyfl run --out DIR` writes "
        "DIR/model.npz).", known=_ARRAYS + _OPTIONAL_ARRAYS)
    kind = header.get("kind")
    if kind != MODEL_KIND:
        raise fail(culprit, "is not a hyfl model file", "Pass a model.npz written by hyfl.")
    if header.get("format") not in _READABLE_FORMATS:
        provenance = header.get("provenance")
        version = provenance.get("hyfl_version") if isinstance(provenance, dict) else None
        raise fail(culprit, f"has model format {header.get('format')!r}, this hyfl "
                   f"reads formats {', '.join(map(str, _READABLE_FORMATS))}",
                   f"Use the hyfl version that wrote it ({version or 'unknown'}), or "
                   "retrain with this one.")
    missing = [name for name in _ARRAYS if name not in arrays]
    bad = [name for name in _ARRAYS + _OPTIONAL_ARRAYS
           if name in arrays and arrays[name].dtype.kind != "f"]
    if missing or bad:
        raise fail(culprit, f"lacks float arrays {missing + bad}",
                   "The file is damaged; retrain or restore it.")
    check_content(culprit, header, arrays, names=_ARRAYS)
    # The checksum catches accidents, not forgeries (anyone can recompute it): every
    # field is checked on its own too.
    return check_model_fields(culprit, header, arrays)


#: Header fields of a model file: name -> (test, what it must be).
_HEADER_FIELDS = {
    "task": (lambda v: v in _TASKS, f"one of {', '.join(_TASKS)}"),
    "loss": (lambda v: isinstance(v, str), "a string"),
    "lam": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and v >= 0, "a finite number >= 0"),
    "n_features": (lambda v: type(v) is int and v >= 1, "a positive integer"),
    "n_outputs": (lambda v: type(v) is int and v >= 1, "a positive integer"),
    "partition": (lambda v: isinstance(v, str), "a string"),
    "algorithm": (lambda v: isinstance(v, str), "a string"),
    "provenance": (lambda v: isinstance(v, dict)
                   and isinstance(v.get("zero_based", False), bool), "a mapping (with "
                   "zero_based true or false, if given)"),
}


def check_model_fields(culprit: str, header: dict, arrays: dict[str, np.ndarray]) -> Model:
    """The :class:`Model` a model file's header and arrays describe, each field checked.

    Weights finite, of shape ``(n_features, n_outputs)``; the intercept (zeros if
    absent) finite, of shape ``(n_outputs,)``; ``classes`` and
    ``labels`` finite, of one length, each without repeats, ``classes`` sorted
    (predictions look labels up in them); one output and classes ``[-1, 1]`` for
    binary classification, one output per class (at least two) for multiclass,
    one output and no classes for regression; the header's fields of their types.
    """
    fix = "The file was edited or damaged; retrain, or restore the file the run wrote."

    def refuse(field: str, problem: str) -> HyflError:
        return fail(culprit, f"has {field} {problem}", fix)

    for name, (test, described) in _HEADER_FIELDS.items():
        if not test(header.get(name)):
            raise refuse(f"header field {name!r}", f"= {short_repr(header.get(name))}, not "
                         f"{described}")
    weights, classes, labels = (np.asarray(arrays[name], dtype=np.float64) for name in _ARRAYS)
    task, n_outputs = header["task"], header["n_outputs"]
    intercept = np.asarray(arrays.get("intercept", np.zeros(n_outputs)), dtype=np.float64)
    if weights.shape != (header["n_features"], n_outputs):
        raise refuse("weights", f"of shape {weights.shape}, not (n_features, n_outputs) = "
                     f"({header['n_features']}, {n_outputs}) as its header says")
    if intercept.shape != (n_outputs,):
        raise refuse("intercept", f"of shape {intercept.shape}, not (n_outputs,) = "
                     f"({n_outputs},) as its header says")
    for name, values in zip(("weights", "intercept", "classes", "labels"),
                            (weights, intercept, classes, labels)):
        if not np.all(np.isfinite(values)):
            raise refuse(name, "that are not all finite (NaN or infinite values)")
    if classes.ndim != 1 or classes.shape != labels.shape:
        raise refuse("classes and labels", f"of shapes {classes.shape} and {labels.shape} "
                     "(they must be 1-D, one label per class)")
    if np.any(np.diff(classes) <= 0):
        raise refuse("classes", f"{short_repr(classes.tolist())} that are not sorted and distinct")
    if np.unique(labels).size != labels.size:
        raise refuse("labels", f"{short_repr(labels.tolist())} with one label for several classes")
    expected = {"binary": (1, 2), "multiclass": (n_outputs, n_outputs), "regression": (1, 0)}
    outputs, n_classes = expected[task]
    if (n_outputs, classes.size) != (outputs, n_classes) or (task == "multiclass"
                                                             and n_outputs < 2):
        raise refuse("n_outputs", f"= {n_outputs} for {classes.size} classes, which a {task} "
                     "model cannot have (binary: one output for two classes; multiclass: one "
                     "output per class, at least two; regression: one output, no classes)")
    if task == "binary" and classes.tolist() != [-1.0, 1.0]:
        raise refuse("classes", f"{classes.tolist()}, not [-1, 1] as a binary model's are")
    provenance = header["provenance"]
    columns = provenance.get("feature_names")  # party files' columns, matched by name
    if columns is not None and not (isinstance(columns, list)
                                    and all(isinstance(c, str) for c in columns)
                                    and len(set(columns)) == len(columns)
                                    == header["n_features"]):
        raise refuse("provenance field 'feature_names'", f"= {short_repr(columns)}, not "
                     f"{header['n_features']} distinct column names (one per weight row)")
    if not isinstance(provenance.get("weight_column", ""), str):
        raise refuse("provenance field 'weight_column'",
                     f"= {short_repr(provenance['weight_column'])}, not a column name")
    names = header.get("label_names", [])
    if names and not (isinstance(names, list) and all(isinstance(n, str) for n in names)
                      and len(set(names)) == len(names) == labels.size
                      and labels.tolist() == list(range(labels.size))):
        raise refuse("header field 'label_names'", f"= {short_repr(names)}, not one distinct text "
                     "per label (with labels 0, 1, ...)")
    return Model(weights=weights, intercept=intercept, task=task, classes=classes, labels=labels,
                 loss=header["loss"], lam=float(header["lam"]), partition=header["partition"],
                 algorithm=header["algorithm"], provenance=dict(header["provenance"]),
                 label_names=tuple(names))


def short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["MODEL_FILE", "MODEL_FORMAT", "MODEL_KIND", "Model", "check_model_fields",
           "data_checksum", "load_model", "model_from_problem", "model_sha256", "save_model",
           "short_repr"]
