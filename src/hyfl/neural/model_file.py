"""Neural models on disk: ``model.npz`` of a neural run.

Like :mod:`hyfl.model_file` (read with ``allow_pickle=False``, a JSON header,
a SHA-256 of the content that refuses edited files), with:

``param:<path>``
    float32 arrays, the trained parameters by pytree path
    (``param:extractor/0/0/W``, ``param:inference/1/b``; FedBCD:
    ``param:bottom/<party>/...`` and ``param:top/...``).
``view:<d>``
    int64, the columns of the (bias-free) feature matrix in view d.
``classes``
    float64, the original label of each class index.
``__header__``
    JSON: ``kind`` ("hyfl-neural-model"), ``format``, ``algorithm``, its
    resolved hyperparameters (``config``), ``partition``, ``client_views``,
    ``n_features``, provenance and ``content_sha256``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hyfl._io import atomic_write
from hyfl.errors import fail

NEURAL_MODEL_KIND = "hyfl-neural-model"
NEURAL_MODEL_FORMAT = 1


@dataclass(frozen=True)
class NeuralModel:
    """A neural model read back from disk."""

    params: dict[str, np.ndarray]
    views: tuple[np.ndarray, ...]
    classes: np.ndarray
    header: dict


def _content_hash(arrays: dict[str, np.ndarray], header: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(name.encode() + str(arr.dtype).encode())
        h.update(np.asarray(arr.shape, dtype="<i8").tobytes() + arr.tobytes())
    body = {k: v for k, v in header.items() if k != "content_sha256"}
    h.update(json.dumps(body, sort_keys=True, default=str).encode())
    return h.hexdigest()


def save_neural_model(path: str | os.PathLike, outcome, setup) -> Path:
    """Write the trained parameters of a neural run (``outcome.result.weights``)."""
    from hyfl import __version__

    data = setup.data
    arrays = {f"param:{k}": np.asarray(v, dtype=np.float32)
              for k, v in outcome.result.weights.items()}
    arrays.update({f"view:{d}": np.asarray(v, dtype=np.int64) for d, v in enumerate(data.views)})
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
        "provenance": {
            "hyfl_version": __version__,
            "data": str(spec.parties if spec.parties is not None else spec.data),
            "n_samples": int(data.X.shape[0]),
            "seed": spec.seed,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    }
    header["content_sha256"] = _content_hash(arrays, header)
    arrays["__header__"] = np.frombuffer(json.dumps(header, sort_keys=True,
                                                    default=str).encode(), dtype=np.uint8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def load_neural_model(path: str | os.PathLike) -> NeuralModel:
    """Read a neural ``model.npz``; refuses other files and edited ones with a clear error."""
    path = Path(path)
    culprit = f"model file {path}"
    if not path.is_file():
        raise fail(culprit, "does not exist", "Pass the model.npz of a neural run's folder.")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {name: f[name] for name in f.files}
        header = json.loads(arrays.pop("__header__").tobytes())
    except Exception as err:
        raise fail(culprit, f"cannot be read as a hyfl model ({type(err).__name__}: {err})",
                   "Pass a model.npz written by hyfl.") from None
    if not isinstance(header, dict) or header.get("kind") != NEURAL_MODEL_KIND:
        raise fail(culprit, "is not a neural hyfl model",
                   "Pass the model.npz of a hyfem-nn or fedbcd-nn run.")
    if header.get("format") != NEURAL_MODEL_FORMAT:
        raise fail(culprit, f"has format {header.get('format')!r}, this hyfl reads "
                   f"{NEURAL_MODEL_FORMAT}", "Retrain with this hyfl version.")
    if header.get("content_sha256") != _content_hash(arrays, header):
        raise fail(culprit, "does not match its checksum (it was edited or damaged)",
                   "Retrain, or restore the file the run wrote.")
    params = {k[len("param:"):]: v for k, v in arrays.items() if k.startswith("param:")}
    n_views = sum(k.startswith("view:") for k in arrays)
    views = tuple(arrays[f"view:{d}"] for d in range(n_views))
    return NeuralModel(params, views, arrays["classes"], header)
