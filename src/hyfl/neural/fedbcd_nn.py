"""FedBCD with neural party models: vertical FL with bottom models and a top model.

Liu et al., "A Communication-Efficient Collaborative Learning Framework for
Distributed Features" (``fedbcd.md``), Algorithms 1-3 with the neural parties
of its section 8 (MNIST-CNN). The linear version is :mod:`hyfl.algorithms.fedbcd`.

Model. Every client is a *party* and holds all training samples (a vertical
partition) and some views (feature groups); party k's input ``x_k`` is the
concatenation of its views' columns. Party k owns a *bottom model*
``H_k = f_k(theta_k; x_k)`` (an embedding of size ``E``); the *label holder*
``h`` (default the last party) alone holds the labels and the *top model*
``g(phi; [H_0, ..., H_{K-1}])`` on the concatenated embeddings (default
linear, i.e. multinomial logistic regression, as in the paper's MNIST-CNN).
The objective is the mean cross-entropy ``L = CE(g(phi; [H]), y)`` of the
stacked model.

One engine round (outer iteration ``t``) is ``exchanges`` mini-batch
exchanges (default one pass over the data, ``N // batch_size``; the batches
are :func:`hyfl.neural.base.batch_ids` of the round's random stream, drawn
whatever the participation). For each batch ``S``:

1. *Exchange.* Every party -- absent ones too, answering passively with
   their unchanged models, as in the linear FedBCD -- computes ``H_k`` for
   the batch and sends it to the label holder, which computes ``L`` and sends
   ``G_k = dL/dH_k`` (the mean over the batch is inside ``G_k``) to every
   active party ``k != h``.
2. *Local steps.* An active party ``k != h`` takes ``Q`` steps on its
   surrogate ``<G_k, f_k(theta_k; x_k)> (+ mu/2 ||theta_k - theta_k^0||^2)``,
   i.e. ``theta_k -= eta_t (J_k(theta_k)^T G_k + mu (theta_k - theta_k^0))``
   with the stale ``G_k`` and the Jacobian at the current ``theta_k``
   (:func:`passive_local_steps`, which takes no labels). An active label
   holder takes ``Q`` steps on ``L(g(phi; [H_{-h} stale, f_h(theta_h; x_h)]),
   y) (+ prox)`` over ``(theta_h, phi)`` (:func:`holder_local_steps`).
   ``theta^0`` is the parameters at the exchange; ``mu > 0`` is FedPBCD
   (equation 15).

Variants (``variant``):

``"parallel"`` (FedBCD-p, Algorithm 2)
    All active parties take their ``Q`` steps from the same exchange.
``"sequential"`` (FedBCD-s, Algorithm 3)
    Active parties in ascending order. Between consecutive active parties is
    a *hand-off*: the party just updated sends its fresh ``H_k`` to the label
    holder (nothing is sent when it is the label holder), which recomputes
    the next party's ``G`` from the fresh embeddings of all parties updated
    so far (and its possibly updated top) and sends it (nothing when the next
    party is the label holder itself, which uses the fresh embeddings of all
    parties before it). The last party's fresh ``H`` is not sent: the next
    exchange starts afresh.
``"sgd"`` (FedSGD, Algorithm 1)
    One step per exchange (``Q = 1``): with ``mu = 0`` and full participation
    it is plain mini-batch SGD on the stacked model.

Rate: ``eta_t = learning_rate / sqrt(t + 1)`` with ``t`` the round index
(``lr_decay="sqrt"``, the paper's decay, applied per round because a round
holds a pass of exchanges) or constant (``"none"``), SGD with optional
``momentum`` (the velocity of each party, and of the top, persists across
exchanges and rounds; an absent party's stays as it was).

Partial participation: an absent party does not train, but answers every
exchange with ``H_k`` of its unchanged model (the label holder needs all
embeddings to compute the loss); an absent label holder still computes the
loss and the gradients ``G_k`` for the active parties, but does not update
``theta_h`` nor ``phi``. A round with no active party sends nothing.

Communication (``round_stats()``, per round; ``B`` batch size, ``E``
embedding size, ``K`` parties, ``A`` active parties of which ``P`` are not the
label holder, ``X`` exchanges):

* ``bytes_up = X [(K - 1) B E + U B E] FLOAT_BYTES``: every party but the
  label holder uploads its embeddings at the exchange (absent ones too);
  FedBCD-s adds ``U`` fresh uploads, one per hand-off whose sending party is
  not the label holder.
* ``bytes_down = X [P B E FLOAT_BYTES + (K - 1) B ID_BYTES]``: each active
  party other than the label holder receives its ``G_k`` once per exchange
  (at the exchange, or for FedBCD-s at its hand-off if it is not the first
  active party: the hand-offs' gradients replace the exchange's rather than
  add to them), and the label holder announces the batch's sample ids to the
  ``K - 1`` other parties.
* ``round_trips = X`` for FedBCD-p and FedSGD; ``X A`` for FedBCD-s (the
  exchange plus ``A - 1`` hand-offs, each on the critical path).

Labels never leave the label holder. ``exchanges``, ``active_clients`` and
``learning_rate`` (the round's ``eta_t``) are reported too.

Simulation: the training features are put on the device once at set-up (one
array per party, its columns); one jitted function per round scans over the
exchanges (the carry holds every party's parameters, the top and the
velocities; the party loop is unrolled at trace time for the static set of
active parties, so full participation compiles once; each other set of
active parties compiles once more, which partial participation over many
parties pays for about once per distinct set).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hyfl.errors import check_choice, check_int, check_positive, check_range, fail
from hyfl.fedbcd_steps import check_local_steps, resolved_local_steps
from hyfl.neural import require_jax
from hyfl.neural.base import FLOAT_BYTES, ID_BYTES, batch_ids, validation_auc
from hyfl.neural.nets import flatten_named, make_cnn, make_mlp

VARIANTS = ("parallel", "sequential", "sgd")
BOTTOMS = ("mlp", "cnn")
LR_DECAYS = ("sqrt", "none")
EVAL_CHUNK = 10_000

DEFAULT_LEARNING_RATE = 0.01
DEFAULT_MOMENTUM = 0.9
"""SGD rate and momentum, measured on MNIST ``vertical:2`` with the default MLP
bottoms (full participation): 0.01 with momentum 0.9 reached 94.6-96.6%
validation accuracy after one round (FedBCD-p with Q = 5, FedBCD-s with
Q = 10, FedBCD-p with Q = 20 and mu = 0.1; various seeds) and 98.2% after
20 rounds of FedBCD-p (about 2 s a round on 2 CPU cores).
Larger moves diverge as Q grows (the passive surrogate ``<G_k, f_k>`` is
linear in the embeddings, so the Q stale steps add up): 0.02 / 0.9 diverged
with FedBCD-s Q = 10, 0.05 / 0.9 with Q = 10 and FedBCD-s, 0.05 without
momentum with Q = 20, and 0.3 without momentum already with Q = 5. Scale the
rate down about as 1/Q for larger Q."""

PAPER_MNIST_CNN = {"bottom": "cnn", "embedding": 256, "channels": 64, "batch_size": 256}
"""The paper's MNIST-CNN (section 8): two parties, each a conv3x3x64-conv3x3x64-dense-256
CNN on its half image, logistic regression on the 512 concatenated features, batch 256."""


@dataclass(frozen=True)
class FedBCDNNState:
    """What FedBCD-NN keeps between rounds (immutable; ``round`` returns a new one).

    ``bottoms[k]`` is party k's bottom-model parameters, ``top`` the label
    holder's top model, ``velocity`` the SGD momentum buffers ``(bottoms,
    top)``, ``t`` the number of finished rounds, ``stats`` the last round's
    figures and ``device`` the training data on the device (one feature array
    per party and the labels) with the nets and the compiled round.
    """

    bottoms: tuple
    top: Any
    velocity: tuple
    t: int = 0
    stats: dict = field(default_factory=dict)
    device: Any = None


@dataclass(frozen=True)
class FedBCDNN:
    """Hyperparameters of FedSGD / FedBCD-p / FedBCD-s / FedPBCD with neural parties.

    Parameters
    ----------
    variant : {"parallel", "sequential", "sgd"}, default "parallel"
    local_steps : int, optional
        ``Q`` per party and exchange; default 5 (parallel, sequential); the
        sgd variant takes exactly 1 and refuses any other value.
    batch_size : int, default 256
        ``B`` (the paper's MNIST-CNN batch), capped at N.
    exchanges : int, optional
        Exchanges per round; default one pass over the data (``N // B``).
    learning_rate : float, default 0.01
        ``eta0`` of SGD (see :data:`DEFAULT_LEARNING_RATE`).
    momentum : float in [0, 1), default 0.9
    lr_decay : {"sqrt", "none"}, default "sqrt"
        ``eta_t = eta0 / sqrt(t + 1)`` per round, or constant.
    mu : float, default 0.0
        Proximal weight (FedPBCD, the paper's 0.1); no effect with ``Q = 1``.
    bottom : {"mlp", "cnn"}, default "mlp"
        Party model: an MLP ``n_in -> bottom_hidden -> embedding`` (ReLU
        after both layers), or the paper's CNN (one image view per party).
    bottom_hidden : int, default 256
    embedding : int, default 128
        ``E``, size of each party's output.
    channels : int, default 64
        Filters of each convolution of the CNN bottom.
    top_hidden : tuple of int, default ()
        Hidden widths of the top MLP; ``()`` is a linear top (logistic
        regression on the ``K E`` concatenated embeddings).
    label_holder : int, optional
        The party with the labels and the top model; default the last (K - 1).
    name : str, default "fedbcd-nn"
    """

    name: str = "fedbcd-nn"
    variant: str = "parallel"
    local_steps: int | None = None
    batch_size: int = 256
    exchanges: int | None = None
    learning_rate: float = DEFAULT_LEARNING_RATE
    momentum: float = DEFAULT_MOMENTUM
    lr_decay: str = "sqrt"
    mu: float = 0.0
    bottom: str = "mlp"
    bottom_hidden: int = 256
    embedding: int = 128
    channels: int = 64
    top_hidden: tuple = ()
    label_holder: int | None = None

    # ------------------------------------------------------------ configuration
    def validated(self) -> FedBCDNN:
        """Return self after checking every hyperparameter (raises HyflError)."""
        check_choice("variant", self.variant, VARIANTS)
        check_choice("bottom", self.bottom, BOTTOMS)
        check_choice("lr_decay", self.lr_decay, LR_DECAYS)
        check_local_steps(self.variant, self.local_steps)
        for name in ("batch_size", "bottom_hidden", "embedding", "channels"):
            check_int(name, getattr(self, name), minimum=1)
        if self.exchanges is not None:
            check_int("exchanges", self.exchanges, minimum=1)
        check_positive("learning_rate", self.learning_rate,
                       fix="Pass a positive SGD rate such as 0.1.")
        check_range("momentum", self.momentum, 0.0, 1.0, fix="Pass a momentum in [0, 1), e.g. 0.9.")
        check_range("mu", self.mu, 0.0,
                    fix="Pass 0 for FedBCD or a positive proximal weight (e.g. 0.1) for FedPBCD.")
        if isinstance(self.top_hidden, (str, bytes)) or not hasattr(self.top_hidden, "__iter__"):
            raise fail("top_hidden", f"must be a sequence of widths, got {self.top_hidden!r}",
                       "Pass () for a linear top or e.g. (128,) for one hidden layer.")
        for width in self.top_hidden:
            check_int("top_hidden width", width, minimum=1)
        if self.label_holder is not None:
            check_int("label_holder", self.label_holder, minimum=0,
                      fix="Pass a party index 0..K-1, or leave it unset for the last party.")
        return self

    @property
    def steps(self) -> int:
        """``Q`` resolved from ``local_steps`` and the variant (as the linear FedBCD's)."""
        return resolved_local_steps(self.variant, self.local_steps)

    def config(self, state: FedBCDNNState | None = None) -> dict[str, Any]:
        """The resolved hyperparameters (with the nets' descriptions once set up)."""
        out = {**dataclasses.asdict(self), "top_hidden": [int(h) for h in self.top_hidden],
               "resolved_local_steps": self.steps}
        if state is not None:
            dev = state.device
            out["resolved_label_holder"] = dev["label_holder"]
            out["resolved_exchanges"] = dev["exchanges"]
            out["bottom_nets"] = [net.describe for net in dev["nets"]]
            out["top_net"] = dev["top_net"].describe
        return out

    # ------------------------------------------------------------ set-up
    def party_columns(self, data, k: int) -> np.ndarray:
        """Columns of ``data.X`` party k sees: its views' columns, view by view."""
        return np.concatenate([data.views[d] for d in data.client_views[k]]).astype(np.int64)

    def bottom_net(self, data, k: int):
        """Party k's bottom model."""
        cols = self.party_columns(data, k)
        if self.bottom == "cnn":
            views = data.client_views[k]
            if len(views) != 1 or data.view_shapes[views[0]] is None:
                what = (f"holds {len(views)} views" if len(views) != 1
                        else f"holds view {views[0]}, which is not part of an image")
                raise fail(
                    f"bottom cnn of party {k}",
                    f"needs exactly one image view, but party {k} {what}",
                    "Use --param bottom=mlp, or image data split so that each party holds "
                    "one rectangle of pixels (e.g. --data mnist --partition vertical:2).",
                )
            d = views[0]
            return make_cnn(data.view_shapes[d], self.embedding, channels=int(self.channels),
                            pool=True, positions=data.view_positions[d])
        return make_mlp(cols.size, (int(self.bottom_hidden),), int(self.embedding),
                        relu_last=True)

    def top_net(self, n_parties: int, n_classes: int):
        return make_mlp(n_parties * int(self.embedding), tuple(int(h) for h in self.top_hidden),
                        n_classes)

    def setup(self, data, seed: int) -> FedBCDNNState:
        self.validated()
        jax = require_jax()
        jnp = jax.numpy
        K, N = data.n_clients, data.X.shape[0]
        for k, rows in enumerate(data.client_samples):
            if np.asarray(rows).size != N:
                raise fail(
                    f"partition for {self.name}",
                    f"is not vertical: client {k} holds {np.asarray(rows).size} of {N} samples",
                    "FedBCD needs every party to hold all samples; use --partition vertical:Q.",
                )
        lh = K - 1 if self.label_holder is None else int(self.label_holder)
        if not 0 <= lh < K:
            raise fail("label_holder", f"is {lh}, but there are {K} parties (0..{K - 1})",
                       "Pass a party index 0..K-1, or leave it unset for the last party.")
        nets = tuple(self.bottom_net(data, k) for k in range(K))
        top_net = self.top_net(K, data.n_classes)
        keys = jax.random.split(jax.random.PRNGKey(int(seed)), K + 1)
        bottoms = tuple(net.init(keys[k]) for k, net in enumerate(nets))
        top = top_net.init(keys[K])
        zeros = lambda tree: jax.tree_util.tree_map(jnp.zeros_like, tree)  # noqa: E731
        B = min(int(self.batch_size), N)
        exchanges = N // B if self.exchanges is None else int(self.exchanges)
        columns = tuple(self.party_columns(data, k) for k in range(K))
        device = {
            "X": tuple(jnp.asarray(np.ascontiguousarray(data.X[:, c])) for c in columns),
            "y": jnp.asarray(np.asarray(data.y, dtype=np.int32)),
            "columns": columns,
            "nets": nets,
            "top_net": top_net,
            "label_holder": lh,
            "batch_size": B,
            "exchanges": exchanges,
            "round": make_round(nets, top_net, lh, self.steps, self.variant, float(self.mu),
                                float(self.momentum)),
            "logits": make_logits(nets, top_net),
        }
        return FedBCDNNState(bottoms=bottoms, top=top,
                             velocity=(tuple(zeros(b) for b in bottoms), zeros(top)),
                             device=device)

    # ------------------------------------------------------------ round
    def learning_rate_at(self, t: int) -> float:
        eta0 = float(self.learning_rate)
        return eta0 / math.sqrt(t + 1) if self.lr_decay == "sqrt" else eta0

    def round(self, state: FedBCDNNState, active: np.ndarray, rng: np.random.Generator):
        jnp = require_jax().numpy
        dev = state.device
        K = len(state.bottoms)
        active = np.asarray(active, dtype=bool).reshape(-1)
        if active.size != K:
            raise fail("active", f"has {active.size} flags for {K} parties",
                       "Pass one participation flag per party.")
        N = dev["y"].shape[0]
        # drawn every round, so the random stream does not depend on participation
        batches = batch_ids(rng, np.arange(N), dev["batch_size"], dev["exchanges"])
        eta = self.learning_rate_at(state.t)
        parties = tuple(int(k) for k in np.flatnonzero(active))
        bottoms, top, velocity = state.bottoms, state.top, state.velocity
        if parties:
            bottoms, top, velocity = dev["round"](
                bottoms, top, velocity, dev["X"], dev["y"],
                jnp.asarray(batches.astype(np.int32)), jnp.float32(eta), active=parties,
            )
            # JAX returns before it has computed; the engine times the round, so wait here
            require_jax().block_until_ready((bottoms, top, velocity))
        stats = self.traffic(K, dev["label_holder"], parties, batches.shape[1],
                             batches.shape[0])
        stats["learning_rate"] = eta
        return dataclasses.replace(state, bottoms=bottoms, top=top, velocity=velocity,
                                   t=state.t + 1, stats=stats)

    def traffic(self, K: int, lh: int, parties, B: int, exchanges: int) -> dict[str, float]:
        """Communication of one round (see the module docstring)."""
        A = len(parties)
        if A == 0:
            return {"bytes_up": 0.0, "bytes_down": 0.0, "round_trips": 0.0, "exchanges": 0.0,
                    "active_clients": 0.0}
        E = int(self.embedding)
        P = sum(1 for k in parties if k != lh)
        hand_offs = A - 1 if self.variant == "sequential" else 0
        # fresh uploads: hand-offs whose sending party is not the label holder
        fresh = sum(1 for k in parties[:-1] if k != lh) if hand_offs else 0
        up = exchanges * ((K - 1) + fresh) * B * E * FLOAT_BYTES
        down = exchanges * (P * B * E * FLOAT_BYTES + (K - 1) * B * ID_BYTES)
        return {
            "bytes_up": float(up),
            "bytes_down": float(down),
            "round_trips": float(exchanges * (1 + hand_offs)),
            "exchanges": float(exchanges),
            "active_clients": float(A),
        }

    def round_stats(self, state: FedBCDNNState) -> dict[str, float]:
        return dict(state.stats)

    # ------------------------------------------------------------ evaluation
    def evaluate(self, state: FedBCDNNState, data) -> dict[str, float]:
        dev = state.device
        N = dev["y"].shape[0]
        train = [(tuple(x[i:i + EVAL_CHUNK] for x in dev["X"]), dev["y"][i:i + EVAL_CHUNK])
                 for i in range(0, N, EVAL_CHUNK)]
        loss, acc, _ = self._scores(state, train, N)
        out = {"loss": loss, "train_accuracy": acc, "val_loss": math.nan,
               "val_accuracy": math.nan, "val_auc": math.nan, "local_val_accuracy": math.nan}
        if data.X_val is not None and len(data.y_val):
            Xv, yv = data.X_val, np.asarray(data.y_val, dtype=np.int32)
            chunks = (
                (tuple(Xv[i:i + EVAL_CHUNK][:, c] for c in dev["columns"]), yv[i:i + EVAL_CHUNK])
                for i in range(0, yv.size, EVAL_CHUNK)
            )
            out["val_loss"], out["val_accuracy"], logits = self._scores(state, chunks, yv.size)
            out["val_auc"] = validation_auc(logits, yv)
        return out

    def _scores(self, state, chunks, n: int) -> tuple[float, float, np.ndarray]:
        """Mean cross-entropy, accuracy and the class scores (n, C) of the chunks."""
        total_loss = total_correct = 0.0
        scores = []
        for xs, y in chunks:
            loss_sum, correct, logits = state.device["logits"](state.bottoms, state.top, xs, y)
            total_loss += float(loss_sum)
            total_correct += float(correct)
            scores.append(np.asarray(logits))
        return total_loss / n, total_correct / n, np.concatenate(scores)

    def scores(self, arrays: dict[str, np.ndarray], data, X) -> np.ndarray:
        """Class scores of an exported stacked model (:meth:`export`) on ``X`` (n, F)."""
        from hyfl.neural.nets import unflatten_named

        jnp = require_jax().numpy
        K = data.n_clients
        H = [self.bottom_net(data, k).apply(unflatten_named(arrays, f"bottom/{k}"),
                                             X[:, self.party_columns(data, k)])
             for k in range(K)]
        top = self.top_net(K, data.n_classes)
        return np.asarray(top.apply(unflatten_named(arrays, "top"), jnp.concatenate(H, axis=1)))

    def export(self, state: FedBCDNNState) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for k, params in enumerate(state.bottoms):
            out.update(flatten_named(params, f"bottom/{k}"))
        out.update(flatten_named(state.top, "top"))
        return out


# ---------------------------------------------------------------------------
# The parties' computations (pure JAX functions; traced inside the round)
# ---------------------------------------------------------------------------


def mean_cross_entropy(logits, y):
    jax = require_jax()
    log_p = jax.nn.log_softmax(logits)
    return -jax.numpy.mean(jax.numpy.take_along_axis(log_p, y[:, None], axis=1))


def holder_loss(top_apply, top, embeddings, y):
    """The label holder's loss ``L = CE(g(phi; [H_0, ..., H_{K-1}]), y)``."""
    return mean_cross_entropy(top_apply(top, require_jax().numpy.concatenate(embeddings, 1)), y)


def holder_gradients(top_apply, top, embeddings, y):
    """``G_k = dL/dH_k`` for every party (computed by the label holder), a list."""
    jax = require_jax()
    return list(jax.grad(lambda H: holder_loss(top_apply, top, H, y))(list(embeddings)))


def _sgd(params, velocity, grad, eta, momentum):
    tree_map = require_jax().tree_util.tree_map
    if momentum:
        velocity = tree_map(lambda v, g: momentum * v + g, velocity, grad)
        grad = velocity
    return tree_map(lambda p, g: p - eta * g, params, grad), velocity


def _prox(grad, params, anchor, mu):
    if not mu:
        return grad
    return require_jax().tree_util.tree_map(
        lambda g, p, p0: g + mu * (p - p0), grad, params, anchor
    )


def _repeat(steps: int, body, carry, in_loop: bool):
    """``body`` applied ``steps`` times: an XLA loop, or unrolled at trace time.

    XLA's CPU convolutions run 8-17x slower inside a loop than outside one
    (a CNN step: 123 ms jitted alone, 1,004 ms per step in a ``scan``), so
    convolutional models unroll their local steps.
    """
    if in_loop:
        return require_jax().lax.fori_loop(0, steps, body, carry)
    for i in range(steps):
        carry = body(i, carry)
    return carry


def passive_local_steps(apply, theta, velocity, x, G, eta, steps, mu=0.0, momentum=0.0,
                        in_loop=True):
    """``Q`` local steps of a party without labels: ``theta -= eta (J(theta)^T G + prox)``.

    ``G`` (B, E) is the stale gradient of the loss w.r.t. the party's
    embeddings sent by the label holder; the party never sees a label.
    ``in_loop=False`` unrolls the steps (see :func:`_repeat`).
    """
    jax = require_jax()
    anchor = theta

    def body(_, carry):
        theta, velocity = carry
        _, vjp = jax.vjp(lambda th: apply(th, x), theta)
        (grad,) = vjp(G)
        return _sgd(theta, velocity, _prox(grad, theta, anchor, mu), eta, momentum)

    return _repeat(steps, body, (theta, velocity), in_loop)


def holder_local_steps(apply, top_apply, lh, theta, top, velocity, x, embeddings, y, eta,
                       steps, mu=0.0, momentum=0.0, in_loop=True):
    """``Q`` local steps of the label holder on ``(theta_h, phi)`` with the others' stale ``H``."""
    jax = require_jax()
    anchor = (theta, top)
    embeddings = list(embeddings)

    def objective(params):
        H = list(embeddings)
        H[lh] = apply(params[0], x)
        return holder_loss(top_apply, params[1], H, y)

    def body(_, carry):
        params, velocity = carry
        grad = _prox(jax.grad(objective)(params), params, anchor, mu)
        return _sgd(params, velocity, grad, eta, momentum)

    (theta, top), velocity = _repeat(steps, body, ((theta, top), velocity), in_loop)
    return theta, top, velocity


def make_round(nets, top_net, lh, steps, variant, mu, momentum):
    """The round: the exchanges over batches (X, B); ``active`` is static.

    MLP parties: one jitted ``scan`` over the exchanges. Convolutional
    parties: a jitted exchange called once per batch, with the local steps
    unrolled, because XLA's CPU convolutions are slow inside loops (:func:`_repeat`).
    """
    jax = require_jax()
    in_loop = all(net.kind != "cnn" for net in (*nets, top_net))
    applies = [net.apply for net in nets]
    top_apply = top_net.apply

    def exchange(active, Xs, Y, eta, carry, idx):
        bottoms, top, (v_bottoms, v_top) = carry
        bottoms, v_bottoms = list(bottoms), list(v_bottoms)
        xs = [X[idx] for X in Xs]
        y = Y[idx]
        H = [applies[k](bottoms[k], xs[k]) for k in range(len(xs))]

        def update(k, H_now, top, v_top):
            if k == lh:
                bottoms[k], top, (v_bottoms[k], v_top) = holder_local_steps(
                    applies[k], top_apply, lh, bottoms[k], top, (v_bottoms[k], v_top), xs[k],
                    H_now, y, eta, steps, mu, momentum, in_loop,
                )
            else:
                G = holder_gradients(top_apply, top, H_now, y)[k]
                bottoms[k], v_bottoms[k] = passive_local_steps(
                    applies[k], bottoms[k], v_bottoms[k], xs[k], G, eta, steps, mu, momentum,
                    in_loop,
                )
            return top, v_top

        if variant == "sequential":
            H_now = list(H)
            for j, k in enumerate(active):
                if j:  # hand-off: the previous party's fresh embeddings
                    prev = active[j - 1]
                    H_now[prev] = applies[prev](bottoms[prev], xs[prev])
                top, v_top = update(k, H_now, top, v_top)
        else:
            top0 = top  # every party's G comes from the exchange's top
            for k in active:
                if k == lh:
                    top, v_top = update(k, H, top0, v_top)
                else:
                    update(k, H, top0, v_top)
        return (tuple(bottoms), top, (tuple(v_bottoms), v_top)), None

    def run(bottoms, top, velocity, Xs, Y, batches, eta, active):
        step = lambda carry, idx: exchange(active, Xs, Y, eta, carry, idx)  # noqa: E731
        (bottoms, top, velocity), _ = jax.lax.scan(step, (bottoms, top, velocity), batches)
        return bottoms, top, velocity

    if in_loop:
        return jax.jit(run, static_argnames=("active",))
    one = jax.jit(lambda active, Xs, Y, eta, carry, idx: exchange(active, Xs, Y, eta, carry,
                                                                   idx)[0],
                  static_argnames=("active",))

    def run_exchanges(bottoms, top, velocity, Xs, Y, batches, eta, active):
        carry = (bottoms, top, velocity)
        for idx in batches:
            carry = one(active, Xs, Y, eta, carry, idx)
        return carry

    return run_exchanges


def make_logits(nets, top_net):
    """Jitted ``(sum of CE, number correct, class scores)`` of the stacked model on a chunk."""
    jax = require_jax()
    jnp = jax.numpy

    def scores(bottoms, top, xs, y):
        H = [net.apply(b, x) for net, b, x in zip(nets, bottoms, xs)]
        logits = top_net.apply(top, jnp.concatenate(H, axis=1))
        log_p = jax.nn.log_softmax(logits)
        loss = -jnp.sum(jnp.take_along_axis(log_p, y[:, None], axis=1))
        return loss, jnp.sum(jnp.argmax(logits, axis=1) == y), logits

    return jax.jit(scores)
