"""Neural models on disk: ``model.npz`` of a neural run.

In the container every model file uses (:mod:`hyfl.model_container`: read with
``allow_pickle=False``, a JSON header, a SHA-256 of the content that refuses
edited files), with:

``param:<path>``
    float32 arrays, the trained parameters by pytree path
    (``param:extractor/0/0/W``, ``param:inference/1/b``; FedBCD:
    ``param:bottom/<party>/...`` and ``param:top/...``).
``view:<d>``
    int64, the columns of the (bias-free) feature matrix in view d.
``view_shape:<d>``, ``view_position:<d>``
    int64, view d's image bounding box (rows, cols) and its features' flat
    positions in it (empty arrays when the data are not images).
``classes``
    float64, the original label of each class index.
``__header__``
    JSON: ``kind`` ("hyfl-neural-model"), ``format``, ``algorithm``, its
    resolved hyperparameters (``config``), ``partition``, ``client_views``,
    ``n_features`` (after dropping), ``input_features`` and ``dropped`` (the
    width of the data it was trained on and the columns dropped from it, e.g.
    MNIST's bias column), provenance and ``content_sha256``.

The container (header, checksum, safe reading) is :mod:`hyfl.model_container`'s;
:func:`hyfl.predict.predict_neural_data` is ``hyfl predict`` for these files.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hyfl.errors import HyflError, fail
from hyfl.model_container import (
    check_content,
    content_sha256,
    read_container,
    read_kind,
    write_container,
)
from hyfl.model_file import short_repr

NEURAL_MODEL_KIND = "hyfl-neural-model"
NEURAL_MODEL_FORMAT = 1


@dataclass(frozen=True)
class NeuralModel:
    """A neural model read back from disk."""

    params: dict[str, np.ndarray]
    views: tuple[np.ndarray, ...]
    classes: np.ndarray
    header: dict
    view_shapes: tuple = ()
    view_positions: tuple = ()

    def scores(self, X, chunk: int = 10_000) -> np.ndarray:
        """Class scores (logits), shape (n, C), of the samples ``X`` (n, input_features).

        ``X`` has the training data's columns (sparse or dense); the dropped
        ones (e.g. MNIST's bias column) are removed here.
        """
        from hyfl.algorithms import accepted_hyperparameters, make_algorithm
        from hyfl.neural.views import ViewData

        name = self.header["algorithm"]
        accepted = accepted_hyperparameters(name)
        algorithm = make_algorithm(name, {k: v for k, v in self.header["config"].items()
                                          if k in accepted})
        keep = np.setdiff1d(np.arange(int(self.header["input_features"])),
                            np.asarray(self.header["dropped"], dtype=np.int64))
        skeleton = ViewData(
            X=np.zeros((0, keep.size), np.float32), y=np.zeros(0, np.int32),
            classes=self.classes, views=self.views, view_shapes=self.view_shapes,
            view_positions=self.view_positions,
            client_samples=tuple(np.zeros(0, np.int64) for _ in self.header["client_views"]),
            client_views=tuple(tuple(v) for v in self.header["client_views"]),
        )
        parts = []
        for i in range(0, X.shape[0], chunk):
            block = X[i:i + chunk][:, keep]
            block = block.toarray() if hasattr(block, "toarray") else np.asarray(block)
            parts.append(algorithm.scores(self.params, skeleton, block.astype(np.float32)))
        return np.concatenate(parts) if parts else np.zeros((0, self.classes.size))


def save_neural_model(path: str | os.PathLike, outcome, setup) -> Path:
    """Write the trained parameters of a neural run (``outcome.result.weights``)."""
    from hyfl import __version__

    data = setup.data
    arrays = {f"param:{k}": np.asarray(v, dtype=np.float32)
              for k, v in outcome.result.weights.items()}
    arrays.update({f"view:{d}": np.asarray(v, dtype=np.int64) for d, v in enumerate(data.views)})
    for d in range(data.n_views):
        shape, position = data.view_shapes[d], data.view_positions[d]
        arrays[f"view_shape:{d}"] = np.asarray(shape if shape is not None else [], dtype=np.int64)
        arrays[f"view_position:{d}"] = np.asarray(position if position is not None else [],
                                                  dtype=np.int64)
    arrays["classes"] = np.asarray(data.classes, dtype=np.float64)
    spec = outcome.spec
    header = {
        "kind": NEURAL_MODEL_KIND,
        "format": NEURAL_MODEL_FORMAT,
        "algorithm": spec.algorithm,
        "config": outcome.result.config["algorithm"],
        "partition": spec.partition_spec(),
        "client_views": [list(v) for v in data.client_views],
        "n_features": int(data.X.shape[1]),
        "input_features": int(data.input_features),
        "dropped": list(data.dropped),
        "provenance": {
            "hyfl_version": __version__,
            "data": str(spec.parties if spec.parties is not None else spec.data),
            "n_samples": int(data.X.shape[0]),
            "seed": spec.seed,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    }
    return write_container(path, arrays, header)


def neural_model_sha256(arrays: dict[str, np.ndarray], header: dict) -> str:
    """The ``content_sha256`` of a neural model file (every array, with its dtype:
    :func:`hyfl.model_container.content_sha256`)."""
    return content_sha256(arrays, header)


def load_neural_model(path: str | os.PathLike) -> NeuralModel:
    """Read a neural ``model.npz``; refuses other files, edited ones and forged fields
    (see :func:`check_neural_fields`) with a clear error."""
    header, arrays, culprit = read_container(
        path, "Pass the model.npz of a neural run's folder.",
        "Pass a model.npz written by hyfl.")
    if header.get("kind") != NEURAL_MODEL_KIND:
        raise fail(culprit, "is not a neural hyfl model",
                   "Pass the model.npz of a hyfem-nn or fedbcd-nn run.")
    if header.get("format") != NEURAL_MODEL_FORMAT:
        raise fail(culprit, f"has format {header.get('format')!r}, this hyfl reads "
                   f"{NEURAL_MODEL_FORMAT}", "Retrain with this hyfl version.")
    check_content(culprit, header, arrays)
    return check_neural_fields(culprit, header, arrays)


def _ints(value, low: int, high: int) -> bool:
    """Whether ``value`` is a list of integers in ``[low, high)``."""
    return isinstance(value, list) and all(type(v) is int and low <= v < high for v in value)


def check_neural_fields(culprit: str, header: dict, arrays: dict[str, np.ndarray]
                        ) -> NeuralModel:
    """The :class:`NeuralModel` a file's header and arrays describe, each field checked.

    The checksum catches accidents, not forgeries (anyone can recompute it), so:
    header fields of their types (``input_features``, ``dropped`` columns within it,
    ``n_features`` what is left, ``client_views`` naming existing views); views of
    distinct columns within ``n_features``, image boxes and positions that fit them;
    classes finite, sorted and distinct; parameters finite floats; and one forward
    pass on a zero sample giving one score per class (parameters that do not fit
    the architecture, or a class count that does not fit the outputs, fail there).
    """
    def refuse(field: str, problem: str) -> HyflError:
        return fail(culprit, f"has {field} {problem}",
                    "The file was edited or damaged; retrain, or restore the file the run "
                    "wrote.")

    inputs = header.get("input_features")
    if type(inputs) is not int or inputs < 1:
        raise refuse("header field 'input_features'", f"= {inputs!r}, not a positive integer")
    dropped = header.get("dropped")
    if not _ints(dropped, 0, inputs) or len(set(dropped)) != len(dropped):
        raise refuse("header field 'dropped'", f"= {dropped!r}, not distinct columns below "
                     f"input_features = {inputs}")
    n_features = inputs - len(dropped)
    if header.get("n_features") != n_features:
        raise refuse("header field 'n_features'", f"= {header.get('n_features')!r}, not "
                     f"input_features - len(dropped) = {n_features}")
    for key, kind in (("algorithm", str), ("config", dict)):
        if not isinstance(header.get(key), kind):
            raise refuse(f"header field {key!r}", f"of type {type(header.get(key)).__name__}, "
                         f"not {kind.__name__}")
    n_views = sum(k.startswith("view:") for k in arrays)
    views, shapes, positions = [], [], []
    for d in range(n_views):
        view, box, where = (arrays.get(f"{name}:{d}") for name in
                            ("view", "view_shape", "view_position"))
        if view is None or box is None or where is None:
            raise refuse(f"{n_views} views", f"but lacks view:{d}, view_shape:{d} or "
                         f"view_position:{d}")
        if (view.ndim != 1 or view.dtype.kind not in "iu" or not view.size
                or np.unique(view).size != view.size or view.min() < 0
                or view.max() >= n_features):
            raise refuse(f"view:{d}", f"that is not a list of distinct columns below "
                         f"n_features = {n_features}")
        box_ok = box.ndim == 1 and box.dtype.kind in "iu" and box.size in (0, 2) \
            and bool(np.all(box > 0))
        if not box_ok or (box.size and (where.ndim != 1 or where.dtype.kind not in "iu"
                                        or where.size != view.size or where.min() < 0
                                        or where.max() >= box.prod())):
            raise refuse(f"view_shape:{d} or view_position:{d}", "that do not place the "
                         "view's columns in an image")
        views.append(view)
        shapes.append(tuple(int(v) for v in box) or None)
        positions.append(where if box.size else None)
    client_views = header.get("client_views")
    if not isinstance(client_views, list) or not client_views or not all(
            _ints(v, 0, n_views) and v for v in client_views):
        raise refuse("header field 'client_views'", f"= {short_repr(client_views)}, not a list of "
                     f"lists of view indices below {n_views}")
    classes = arrays.get("classes")
    if (classes is None or classes.ndim != 1 or classes.dtype.kind not in "iuf"
            or classes.size < 2 or not np.all(np.isfinite(classes))
            or np.any(np.diff(classes) <= 0)):
        raise refuse("classes", f"{short_repr(None if classes is None else classes.tolist())}, "
                     "not at least two finite labels, sorted and distinct")
    params = {k[len("param:"):]: v for k, v in arrays.items() if k.startswith("param:")}
    for key, value in params.items():
        if value.dtype.kind != "f" or not np.all(np.isfinite(value)):
            raise refuse(f"parameter {key!r}", f"of dtype {value.dtype} with values that are "
                         "not all finite floats")
    model = NeuralModel(params, tuple(views), classes.astype(np.float64), header,
                        tuple(shapes), tuple(positions))
    try:
        scores = model.scores(np.zeros((1, inputs), dtype=np.float32))
    except Exception as err:  # noqa: BLE001 - whatever the forged fields break, say so
        raise refuse("parameters and header fields", f"that do not make a network "
                     f"({type(err).__name__}: {short_repr(str(err))})") from None
    if np.shape(scores) != (1, classes.size):
        raise refuse("classes", f"({classes.size}) that do not match the network's "
                     f"{np.shape(scores)[-1]} outputs")
    return model


def is_neural_model(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a readable ``.npz`` whose header says it is a neural model."""
    return read_kind(path) == NEURAL_MODEL_KIND
