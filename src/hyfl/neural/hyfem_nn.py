"""HyFEM with neural models: feature extractors per view, matched averaging of inference models.

Zhang et al., "Hybrid Federated Learning: Algorithms and Implementation"
(``hyfem.md``, Algorithm 1). Client m holds some samples and some views
(:class:`~hyfl.neural.views.ViewData`). Its model is

* one *feature extractor* ``theta_{m,d}`` per view d it holds: an MLP (or a
  CNN on image views) from the view's features to an embedding of size E;
* an *inference model* ``w_m``: an MLP from the concatenated embeddings of
  its views to the C class scores.

The server keeps a global extractor ``theta_{0,d}`` per view and a global
inference model ``theta_0`` whose input is the concatenation of ALL views'
embeddings (view d at rows ``d*E .. (d+1)*E - 1``), so each client's
inference model corresponds to a subset of the global first-layer rows.

One outer iteration with the active clients A:

1. *Distribute.* Each m in A starts from the global extractors of its views
   and ``Pi_m theta_0``: the global inference model restricted to the rows of
   its views (hidden neurons in the global order; every client has the
   global hidden sizes, so ``Pi_m`` is the identity up to a relabelling).
2. *Local updates* (Algorithm 1, eq. 6). ``local_epochs`` passes (or
   ``local_steps`` mini-batch steps) of SGD on its own samples and views::

       f_m = mean CE + mu/2 (||w_m - Pi_m theta_0||^2 + sum_d ||theta_{m,d} - theta_{0,d}||^2)

   ``variant="prox"`` is HyFEM-Prox (``mu > 0``); ``variant="avg"`` is
   HyFEM-Avg (``mu = 0``). The paper weighs the extractors' distance by 1
   and the inference model's by mu with the loss summed over samples; here
   the loss is a mean and both distances get mu, which makes one client
   holding every view exactly FedProx (tested).
3. *Extractors* (eq. 7, squared distance): ``theta_{0,d}`` = the mean of the
   active holders' ``theta_{m,d}``; a view with no active holder keeps its value.
4. *Inference model* (eq. 8): matched averaging
   (:func:`hyfl.neural.matching.matched_average`) of the active clients'
   inference models, layer by layer, with Hungarian matching and
   ``matching_rounds`` (P) rounds; ``matching="identity"`` averages
   neuron j with neuron j (FedAvg of the inference models).

*Fusion.* With ``fusion="mean"`` (default) the concatenated embeddings are
scaled by ``1/|views present|``, so a first-layer pre-activation is the mean
of per-view contributions: a client holding one quadrant and the global
model holding all four see inputs of the same scale. ``"concat"`` is the
plain concatenation (the paper's wording); with clients that each hold one
view, the global model then adds four contributions each trained alone
(MNIST quadrant:8, 20 rounds: 0.955 against mean fusion's 0.961, two seeds;
docs/neural.md).

Evaluation (the paper's Figures 3-4): the *global* model (global extractors
and ``theta_0``) on all views; the *local* accuracy is the mean over all
clients of each client's last local model (its extractors and ``w_m``, on
its own views) on the validation samples.

Communication per round (``round_stats``): each active client downloads
its extractors and ``Pi_m theta_0`` and uploads them after training, 4
bytes per parameter; one round trip.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hyfl.errors import check_choice, check_int, check_positive, check_range, fail
from hyfl.neural import require_jax
from hyfl.neural.base import (
    FLOAT_BYTES,
    batch_ids,
    cross_entropy_and_accuracy,
    validation_auc,
)
from hyfl.neural.nets import flatten_named, make_cnn, make_mlp, mlp_apply, n_parameters

VARIANTS = ("prox", "avg")
MATCHINGS = ("hungarian", "identity")
FUSIONS = ("mean", "concat")
EVAL_CHUNK = 10_000


@dataclass(frozen=True)
class HyFEMNNState:
    """Global and local models of one HyFEM run (immutable; ``round`` returns a new one)."""

    extractors: tuple  # global theta_{0,d}, one pytree per view
    inference: tuple  # global theta_0: MLP layers as {"W", "b"} dicts
    local: tuple  # per client: its last local model {"extractors": {d: ...}, "inference": [...]}
    t: int = 0
    stats: dict = field(default_factory=dict)
    data: Any = None  # the ViewData (not part of the model)
    device: Any = None  # the training features and labels on the device
    cache: dict = field(default_factory=dict)  # compiled functions, by client views


@dataclass(frozen=True)
class HyFEMNN:
    """HyFEM (Algorithm 1) with neural feature extractors and inference models.

    Parameters
    ----------
    variant : {"prox", "avg"}, default "prox"
        HyFEM-Prox (proximal local objective) or HyFEM-Avg (``mu = 0``).
    mu : float, default 0.1
        Proximal weight of HyFEM-Prox (the paper tries 0.1 and 0.5).
    learning_rate : float, default 0.05
    momentum : float, default 0.9
        SGD momentum; the optimizer state starts afresh each round.
    lr_decay : float, default 0.2
        Multiply the learning rate by this every ``lr_decay_every`` rounds
        (the paper: 0.2 every 8 rounds).
    lr_decay_every : int, default 8
    batch_size : int, default 64
    local_epochs : int, default 1
        Passes over the client's samples per round (ignored with ``local_steps``).
    local_steps : int, optional
        Q mini-batch steps per round instead (the paper: Q = 32, batch 32).
    extractor : {"mlp", "cnn"}, default "mlp"
    extractor_hidden : int, default 128
        Hidden width of an MLP extractor (channels of a CNN extractor).
    embedding : int, default 64
        E, the size of each view's embedding.
    inference_hidden : int, default 128
        Hidden width of the inference MLP (one hidden layer).
    matching : {"hungarian", "identity"}, default "hungarian"
    matching_rounds : int, default 5
        P, re-matching rounds per layer.
    fusion : {"mean", "concat"}, default "mean"
    """

    name: str = "hyfem-nn"
    variant: str = "prox"
    mu: float = 0.1
    learning_rate: float = 0.05
    momentum: float = 0.9
    lr_decay: float = 0.2
    lr_decay_every: int = 8
    batch_size: int = 64
    local_epochs: int = 1
    local_steps: int | None = None
    extractor: str = "mlp"
    extractor_hidden: int = 128
    embedding: int = 64
    inference_hidden: int = 128
    matching: str = "hungarian"
    matching_rounds: int = 5
    fusion: str = "mean"

    def validated(self) -> HyFEMNN:
        check_choice("variant", self.variant, VARIANTS)
        check_choice("matching", self.matching, MATCHINGS)
        check_choice("fusion", self.fusion, FUSIONS)
        check_choice("extractor", self.extractor, ("mlp", "cnn"))
        check_positive("learning_rate", self.learning_rate)
        check_range("momentum", self.momentum, 0.0, 1.0, fix="Pass a momentum in [0, 1), e.g. 0.9.")
        check_range("lr_decay", self.lr_decay, 0.0, 1.0, low_open=True, high_open=False)
        check_range("mu", self.mu, 0.0)
        if self.variant == "avg" and self.mu != 0:
            raise fail(
                "mu", f"is {self.mu}, but HyFEM-Avg (hyfem-nn-avg) has no proximal term",
                "Leave mu out with the avg variant, or use hyfem-nn (HyFEM-Prox).",
            )
        for name in ("lr_decay_every", "batch_size", "local_epochs", "extractor_hidden",
                     "embedding", "inference_hidden"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("matching_rounds", self.matching_rounds, minimum=0)
        if self.local_steps is not None:
            check_int("local_steps", self.local_steps, minimum=1)
        return self

    # ------------------------------------------------------------------ set-up
    def extractor_net(self, data, view: int):
        """The feature extractor of view ``view``."""
        n_in = data.views[view].size
        if self.extractor == "cnn":
            if data.view_shapes[view] is None:
                raise fail(
                    "extractor cnn", f"needs image views, but view {view} is not part of an image",
                    "Use --param extractor=mlp for non-image data.",
                )
            return make_cnn(data.view_shapes[view], self.embedding,
                            channels=self.extractor_hidden, positions=data.view_positions[view])
        return make_mlp(n_in, (self.extractor_hidden,), self.embedding, relu_last=True)

    def inference_net(self, n_views: int, n_classes: int):
        return make_mlp(n_views * self.embedding, (self.inference_hidden,), n_classes)

    def input_rows(self, views) -> np.ndarray:
        """Global first-layer rows of the embeddings of ``views``."""
        E = self.embedding
        return np.concatenate([np.arange(d * E, (d + 1) * E) for d in views]).astype(np.int64)

    def setup(self, data, seed: int) -> HyFEMNNState:
        jax = require_jax()
        key = jax.random.PRNGKey(seed)
        keys = jax.random.split(key, data.n_views + 1)
        extractors = tuple(
            self.extractor_net(data, d).init(keys[d]) for d in range(data.n_views)
        )
        inference = tuple(self.inference_net(data.n_views, data.n_classes).init(keys[-1]))
        state = HyFEMNNState(
            extractors=extractors, inference=inference, local=(), data=data,
            device={"X": jax.numpy.asarray(data.X), "y": jax.numpy.asarray(data.y)},
        )
        local = tuple(self.distribute(state, vs) for vs in data.client_views)
        return dataclasses.replace(state, local=local)

    def distribute(self, state: HyFEMNNState, views) -> dict:
        """Client model at the start of a round: its views' extractors and Pi_m theta_0."""
        rows = self.input_rows(views)
        first = state.inference[0]
        inference = [{"W": first["W"][rows], "b": first["b"]}, *state.inference[1:]]
        return {"extractors": {d: state.extractors[d] for d in views}, "inference": inference}

    # ------------------------------------------------------------------ model
    def scale(self, n_present: int) -> float:
        """Factor on the concatenated embeddings of ``n_present`` views (see Fusion)."""
        return 1.0 / n_present if self.fusion == "mean" else 1.0

    def logits(self, data, model: dict, views, X):
        """Class scores of a (local or global) model on the features ``X`` (n, F)."""
        jnp = require_jax().numpy
        embeddings = [
            self.extractor_net(data, d).apply(model["extractors"][d], X[:, data.views[d]])
            for d in views
        ]
        z = jnp.concatenate(embeddings, axis=1) * self.scale(len(views))
        return mlp_apply(model["inference"], z)

    def objective(self, data, views, model, anchor, X, y, mu):
        """Client m's local objective (eq. 6): mean cross-entropy + mu/2 ||model - anchor||^2."""
        jax = require_jax()
        import optax

        logits = self.logits(data, model, views, X)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        diff = jax.tree_util.tree_map(lambda a, b: ((a - b) ** 2).sum(), model, anchor)
        return ce + 0.5 * mu * sum(jax.tree_util.tree_leaves(diff))

    def local_trainer(self, data, views):
        """A jitted ``(model, anchor, X, y, batches, lr, mu) -> (model, mean loss)``."""
        jax = require_jax()
        import optax

        def step(carry, ids, anchor, X, y, lr, mu):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(self.objective, argnums=2)(
                data, views, params, anchor, X[ids], y[ids], mu
            )
            updates, opt_state = optax.sgd(lr, momentum=self.momentum or None).update(
                grads, opt_state, params
            )
            return (optax.apply_updates(params, updates), opt_state), loss

        def start(model):
            return optax.sgd(0.0, momentum=self.momentum or None).init(model)

        if self.extractor != "cnn":
            def train(model, anchor, X, y, batches, lr, mu):
                (model, _), losses = jax.lax.scan(
                    lambda carry, ids: step(carry, ids, anchor, X, y, lr, mu),
                    (model, start(model)), batches,
                )
                return model, losses.mean()

            return jax.jit(train)
        # XLA's CPU convolutions are many times slower inside a loop (see
        # hyfl.neural.fedbcd_nn._repeat): one jitted step per mini-batch instead.
        one = jax.jit(step)

        def train_stepwise(model, anchor, X, y, batches, lr, mu):
            carry, losses = (model, start(model)), []
            for ids in batches:
                carry, loss = one(carry, ids, anchor, X, y, lr, mu)
                losses.append(loss)
            return carry[0], jax.numpy.mean(jax.numpy.asarray(losses))

        return train_stepwise

    # ------------------------------------------------------------------ round
    def learning_rate_at(self, t: int) -> float:
        """Step size of round ``t`` (0-based): decayed every ``lr_decay_every`` rounds."""
        return float(self.learning_rate * self.lr_decay ** (t // self.lr_decay_every))

    def steps(self, n_local: int) -> int:
        if self.local_steps is not None:
            return int(self.local_steps)
        return self.local_epochs * max(n_local // min(self.batch_size, n_local), 1)

    def round(self, state: HyFEMNNState, active: np.ndarray, rng: np.random.Generator):
        """One outer iteration of Algorithm 1 for the clients flagged in ``active``."""
        jax = require_jax()
        from hyfl.neural.matching import matched_average

        data, device, cache = state.data, state.device, state.cache
        clients = np.flatnonzero(np.asarray(active, dtype=bool))
        lr = self.learning_rate_at(state.t)
        local = list(state.local)
        trained, losses, sent, client_seconds = {}, [], 0, [0.0]
        for m in clients:
            began = time.perf_counter()
            views = data.client_views[m]
            start = self.distribute(state, views)
            if views not in cache:
                cache[views] = self.local_trainer(data, views)
            batches = batch_ids(rng, data.client_samples[m], self.batch_size,
                                self.steps(data.client_samples[m].size))
            model, loss = cache[views](start, start, device["X"], device["y"],
                                       jax.numpy.asarray(batches), lr, self.mu)
            trained[m], local[m] = model, model
            losses.append(float(loss))  # also waits for the client's training (JAX is async)
            sent += n_parameters(start)
            client_seconds.append(time.perf_counter() - began)
        server_began = time.perf_counter()
        extractors = list(state.extractors)
        inference = state.inference
        if clients.size:
            for d in range(data.n_views):
                holders = [m for m in clients if d in data.client_views[m]]
                if holders:
                    extractors[d] = jax.tree_util.tree_map(
                        lambda *xs: sum(xs) / len(xs),
                        *(trained[m]["extractors"][d] for m in holders),
                    )
            result = matched_average(
                [_layers(trained[m]["inference"]) for m in clients],
                [self.input_rows(data.client_views[m]) for m in clients],
                _layers(state.inference),
                rounds=self.matching_rounds, rng=rng, matching=self.matching,
            )
            inference = tuple(
                {"W": jax.numpy.asarray(W), "b": jax.numpy.asarray(b)} for W, b in result.layers
            )
        stats = {
            "bytes_up": float(sent * FLOAT_BYTES),
            "bytes_down": float(sent * FLOAT_BYTES),
            "round_trips": float(clients.size > 0),
            "active_clients": float(clients.size),
            "learning_rate": lr,
            "local_loss": float(np.mean(losses)) if losses else np.nan,
            # clients train side by side in a deployment: the round waits for the slowest
            "client_seconds_max": max(client_seconds),
            "server_seconds": time.perf_counter() - server_began,
        }
        return dataclasses.replace(
            state, extractors=tuple(extractors), inference=inference, local=tuple(local),
            t=state.t + 1, stats=stats,
        )

    def round_stats(self, state: HyFEMNNState) -> dict[str, float]:
        return dict(state.stats)

    # ------------------------------------------------------------------ evaluation
    def global_model(self, state: HyFEMNNState) -> dict:
        return {"extractors": dict(enumerate(state.extractors)), "inference": list(state.inference)}

    def predict_logits(self, state, model, views, X) -> np.ndarray:
        """Scores of ``model`` on ``X`` in chunks (bounded memory)."""
        jnp = require_jax().numpy
        key = ("predict", tuple(views))
        if key not in state.cache:
            jax = require_jax()
            state.cache[key] = jax.jit(
                lambda model, X, views=tuple(views): self.logits(state.data, model, views, X)
            )
        fn = state.cache[key]
        parts = [np.asarray(fn(model, jnp.asarray(X[i:i + EVAL_CHUNK])))
                 for i in range(0, X.shape[0], EVAL_CHUNK)]
        return np.concatenate(parts)

    def evaluate(self, state: HyFEMNNState, data) -> dict[str, float]:
        everything = tuple(range(data.n_views))
        model = self.global_model(state)
        loss, acc = cross_entropy_and_accuracy(
            self.predict_logits(state, model, everything, data.X), data.y
        )
        row = {"loss": loss, "train_accuracy": acc, "val_loss": np.nan, "val_accuracy": np.nan,
               "val_auc": np.nan, "local_val_accuracy": np.nan}
        if data.X_val is not None:
            logits = self.predict_logits(state, model, everything, data.X_val)
            row["val_loss"], row["val_accuracy"] = cross_entropy_and_accuracy(logits, data.y_val)
            row["val_auc"] = validation_auc(logits, data.y_val)
            local = [
                cross_entropy_and_accuracy(
                    self.predict_logits(state, state.local[m], views, data.X_val), data.y_val
                )[1]
                for m, views in enumerate(data.client_views)
            ]
            row["local_val_accuracy"] = float(np.mean(local))
        return row

    def config(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def scores(self, arrays: dict[str, np.ndarray], data, X) -> np.ndarray:
        """Class scores of an exported global model (:meth:`export`) on ``X`` (n, F)."""
        from hyfl.neural.nets import unflatten_named

        model = {
            "extractors": {d: unflatten_named(arrays, f"extractor/{d}")
                           for d in range(data.n_views)},
            "inference": unflatten_named(arrays, "inference"),
        }
        return np.asarray(self.logits(data, model, tuple(range(data.n_views)), X))

    def export(self, state: HyFEMNNState) -> dict[str, np.ndarray]:
        """The global model's parameters (extractor/<view>/..., inference/...)."""
        arrays = flatten_named(list(state.extractors), "extractor")
        arrays.update(flatten_named(list(state.inference), "inference"))
        return arrays


def _layers(inference) -> list[tuple[np.ndarray, np.ndarray]]:
    """MLP layers as NumPy ``(W, b)`` pairs (the form matching works on)."""
    return [(np.asarray(layer["W"], dtype=np.float64), np.asarray(layer["b"], dtype=np.float64))
            for layer in inference]
