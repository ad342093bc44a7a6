"""What a neural federated algorithm provides to :func:`hyfl.neural.engine.run`.

The same hooks as the linear algorithms (:mod:`hyfl.algorithms.base`), with
the data as :class:`~hyfl.neural.views.ViewData` and evaluation done by the
algorithm (a neural model has no duality gap, and HyFEM reports its clients'
local models beside the global one):

* ``setup(data, seed)`` -> state: initial models; ``seed`` (an int drawn from
  the algorithm's random stream) seeds the parameter initialization.
* ``round(state, active, rng)`` -> state: one outer iteration for the clients
  flagged in ``active`` (bool, shape (K,)); ``rng`` (NumPy Generator) draws
  the mini-batches. States are immutable dataclasses; ``round`` returns a new one,
  computed (JAX dispatches asynchronously: a round returns only once its arrays
  are ready, so that the engine's round times are the round's).
* ``evaluate(state, data)`` -> dict with :data:`EVAL_COLUMNS` (NaN when
  not applicable).
* ``round_stats(state)`` -> dict of the last round: ``bytes_up``,
  ``bytes_down`` (what crossed the network, 4 bytes per float32 and 8 per
  sample id), ``round_trips``, ``active_clients``, and any algorithm figures.
* ``config()`` -> the resolved hyperparameters.
* ``export(state)`` -> ``{"path/to/array": ndarray}``: the trained models'
  parameters, for the model file.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

EVAL_COLUMNS = (
    "loss",  # training loss (mean cross-entropy) of the global model
    "train_accuracy",
    "val_loss",
    "val_accuracy",  # global model, all views
    "val_auc",  # its one-vs-rest AUC, averaged over the classes (hyfl.metrics)
    "local_val_accuracy",  # HyFEM: clients' local models on their own views, averaged
)
FLOAT_BYTES = 4
ID_BYTES = 8


class NeuralAlgorithm(Protocol):
    name: str

    def setup(self, data, seed: int) -> Any: ...

    def round(self, state: Any, active: np.ndarray, rng: np.random.Generator) -> Any: ...

    def evaluate(self, state: Any, data) -> dict[str, float]: ...

    def round_stats(self, state: Any) -> dict[str, float]: ...

    def config(self) -> dict[str, Any]: ...

    def export(self, state: Any) -> dict[str, np.ndarray]: ...


def validation_auc(logits, y) -> float:
    """The one-vs-rest AUC of class scores ``logits`` (n, C) for class indices ``y`` (n,),
    averaged over the classes present (:func:`hyfl.metrics.ranking_metrics`)."""
    from hyfl.metrics import ranking_metrics

    logits = np.asarray(logits, dtype=np.float64)
    return float(ranking_metrics(logits, np.asarray(y), np.arange(logits.shape[1]))["auc"])


def cross_entropy_and_accuracy(logits, y) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``logits`` (n, C) for class indices ``y`` (n,)."""
    import jax

    log_p = jax.nn.log_softmax(logits)
    loss = -np.mean(np.take_along_axis(np.asarray(log_p), np.asarray(y)[:, None], axis=1))
    accuracy = float(np.mean(np.argmax(np.asarray(logits), axis=1) == np.asarray(y)))
    return float(loss), accuracy


def batch_ids(rng: np.random.Generator, rows: np.ndarray, batch_size: int, steps: int | None):
    """Mini-batches of ``rows`` as an int array (steps, B): shuffled passes, no repeats in a batch.

    ``steps=None`` is one pass (``len(rows) // B`` batches, the remainder
    dropped so that every step has the same shape); more steps than a pass
    continue with a fresh permutation. ``B`` is ``min(batch_size, len(rows))``.
    """
    rows = np.asarray(rows)
    B = min(int(batch_size), rows.size)
    per_pass = rows.size // B
    steps = per_pass if steps is None else int(steps)
    passes = -(-steps // per_pass)
    order = np.concatenate([rng.permutation(rows)[: per_pass * B] for _ in range(passes)])
    return order[: steps * B].reshape(steps, B)
