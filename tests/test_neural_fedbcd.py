"""FedBCD with neural parties (hyfl.neural.fedbcd_nn) on small synthetic vertical data."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
from jax.flatten_util import ravel_pytree  # noqa: E402

from hyfl.errors import HyflError  # noqa: E402
from hyfl.neural.base import FLOAT_BYTES, ID_BYTES  # noqa: E402
from hyfl.neural.fedbcd_nn import (  # noqa: E402
    PAPER_MNIST_CNN,
    FedBCDNN,
    holder_gradients,
    holder_loss,
    passive_local_steps,
)
from hyfl.neural.views import ViewData  # noqa: E402

N, F, C = 64, 12, 3
SMALL = dict(bottom_hidden=8, embedding=4)


def vertical_data(n_parties: int = 3, seed: int = 0, image: bool = False) -> ViewData:
    """N samples, F features cut into ``n_parties`` contiguous views, C classes."""
    rng = np.random.default_rng(seed)
    n_features = 64 if image else F
    X = rng.normal(size=(N, n_features)).astype(np.float32)
    W = rng.normal(size=(n_features, C))
    y = np.argmax(X @ W + 0.5 * rng.normal(size=(N, C)), axis=1).astype(np.int32)
    if image:  # 8 x 8 images, left and right halves (8 x 4 each)
        cols = np.arange(64).reshape(8, 8)
        views = (np.sort(cols[:, :4].ravel()), np.sort(cols[:, 4:].ravel()))
        shapes, positions = ((8, 4), (8, 4)), (np.arange(32), np.arange(32))
    else:
        views = tuple(np.array_split(np.arange(n_features), n_parties))
        shapes, positions = (None,) * n_parties, (None,) * n_parties
    Xv = rng.normal(size=(20, n_features)).astype(np.float32)
    yv = np.argmax(Xv @ W, axis=1).astype(np.int32)
    return ViewData(
        X=X, y=y, classes=np.arange(C), views=views, view_shapes=shapes,
        view_positions=positions,
        client_samples=tuple(np.arange(N) for _ in views),
        client_views=tuple((d,) for d in range(len(views))), X_val=Xv, y_val=yv,
    )


def leaves(tree):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


def assert_trees_close(a, b, atol=1e-5, rtol=1e-5):
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb)
    for x, z in zip(la, lb):
        np.testing.assert_allclose(x, z, atol=atol, rtol=rtol)


def trees_differ(a, b, tol=1e-6):
    return any(np.max(np.abs(x - z)) > tol for x, z in zip(leaves(a), leaves(b)))


def run(alg, data, rounds=1, active=None, seed=0, state=None):
    state = alg.setup(data, seed) if state is None else state
    rng = np.random.default_rng(seed)
    active = np.ones(data.n_clients, bool) if active is None else np.asarray(active)
    for _ in range(rounds):
        state = alg.round(state, active, rng)
    return state




# --------------------------------------------------------------------------- correctness


@pytest.mark.parametrize("variant", ["parallel", "sgd"])
def test_q1_full_batch_equals_centralized_gradient_descent(variant):
    data = vertical_data(3)
    steps = None if variant == "sgd" else 1
    alg = FedBCDNN(variant=variant, local_steps=steps, batch_size=N, exchanges=1,
                   lr_decay="none", learning_rate=0.3, momentum=0.0, label_holder=1, **SMALL)
    state0 = alg.setup(data, 7)
    state = run(alg, data, rounds=6, state=state0)

    # Reference: the stacked model as one function of all parameters, plain GD.
    nets, top_net = state0.device["nets"], state0.device["top_net"]
    X, y = jnp.asarray(data.X), jnp.asarray(data.y)

    def loss(params):
        bottoms, top = params
        H = [net.apply(b, X[:, data.views[k]]) for k, (net, b) in enumerate(zip(nets, bottoms))]
        logits = top_net.apply(top, jnp.concatenate(H, axis=1))
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(N), y])

    params = (state0.bottoms, state0.top)
    gradient = jax.jit(jax.grad(loss))
    for _ in range(6):
        grad = gradient(params)
        params = jax.tree_util.tree_map(lambda p, g: p - 0.3 * g, params, grad)
    assert_trees_close((state.bottoms, state.top), params)
    assert trees_differ(params, (state0.bottoms, state0.top))


def test_passive_surrogate_gradient_matches_finite_differences(x64):
    data = vertical_data(2)
    alg = FedBCDNN(**SMALL)
    state = alg.setup(data, 3)
    to64 = lambda t: jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), t)  # noqa: E731
    bottoms, top = to64(state.bottoms), to64(state.top)
    nets, top_apply = state.device["nets"], state.device["top_net"].apply
    xs = [jnp.asarray(data.X[:, v], jnp.float64) for v in data.views]
    y = jnp.asarray(data.y)
    H = [net.apply(b, x) for net, b, x in zip(nets, bottoms, xs)]
    G = holder_gradients(top_apply, top, H, y)[0]
    zero = jax.tree_util.tree_map(jnp.zeros_like, bottoms[0])
    stepped, _ = passive_local_steps(nets[0].apply, bottoms[0], zero, xs[0], G, 1.0, 1)
    surrogate = jax.tree_util.tree_map(lambda a, b: a - b, bottoms[0], stepped)

    flat, unravel = ravel_pytree(bottoms[0])

    @jax.jit
    def full_loss(theta_flat):
        return holder_loss(top_apply, top, [nets[0].apply(unravel(theta_flat), xs[0]), H[1]], y)

    g_flat, _ = ravel_pytree(surrogate)
    rng = np.random.default_rng(0)
    eps = 1e-6
    for i in rng.choice(flat.size, size=12, replace=False):
        e = jnp.zeros_like(flat).at[i].set(eps)
        fd = (full_loss(flat + e) - full_loss(flat - e)) / (2 * eps)
        np.testing.assert_allclose(float(g_flat[i]), float(fd), rtol=1e-5, atol=1e-9)
    assert float(jnp.max(jnp.abs(g_flat))) > 0


def test_passive_parties_never_see_labels():
    # the passive update takes no labels at all ...
    params = inspect.signature(passive_local_steps).parameters
    assert not {"y", "labels", "Y"} & set(params)
    # ... and a round's passive update is exactly J^T G with the label holder's G
    data = vertical_data(2)
    alg = FedBCDNN(local_steps=3, batch_size=N, exchanges=1, learning_rate=0.2, momentum=0.5,
                   **SMALL)
    state0 = alg.setup(data, 1)
    state = run(alg, data, active=[True, False], state=state0)
    nets, top_apply = state0.device["nets"], state0.device["top_net"].apply
    xs = [jnp.asarray(data.X[:, v]) for v in data.views]
    H = [net.apply(b, x) for net, b, x in zip(nets, state0.bottoms, xs)]
    G = holder_gradients(top_apply, state0.top, H, jnp.asarray(data.y))[0]
    zero = jax.tree_util.tree_map(jnp.zeros_like, state0.bottoms[0])
    # the batch is a permutation of all rows: G's rows follow the samples
    expected, _ = passive_local_steps(
        nets[0].apply, state0.bottoms[0], zero, xs[0], G, 0.2, 3, momentum=0.5
    )
    assert_trees_close(state.bottoms[0], expected)
    assert_trees_close(state.top, state0.top, atol=0, rtol=0)  # absent label holder


def test_sequential_and_parallel():
    data = vertical_data(3)
    base = dict(local_steps=4, batch_size=16, learning_rate=0.2, **SMALL)
    par = run(FedBCDNN(variant="parallel", **base), data, rounds=2)
    seq = run(FedBCDNN(variant="sequential", **base), data, rounds=2)
    assert trees_differ(par.bottoms, seq.bottoms)
    # the first active party sees the same exchange in both variants
    one = [False, True, False]
    par1 = run(FedBCDNN(variant="parallel", **base), data, rounds=2, active=one)
    seq1 = run(FedBCDNN(variant="sequential", **base), data, rounds=2, active=one)
    assert_trees_close((par1.bottoms, par1.top), (seq1.bottoms, seq1.top))
    # FedSGD is FedBCD-p with Q = 1
    sgd = run(FedBCDNN(variant="sgd", **{**base, "local_steps": None}), data, rounds=2)
    p1 = run(FedBCDNN(variant="parallel", **{**base, "local_steps": 1}), data, rounds=2)
    assert_trees_close((sgd.bottoms, sgd.top), (p1.bottoms, p1.top))


def test_absent_party_unchanged_but_answers():
    data = vertical_data(3)
    alg = FedBCDNN(local_steps=2, batch_size=16, learning_rate=0.2, momentum=0.5, **SMALL)
    active = [True, False, True]
    state0 = alg.setup(data, 0)
    state = run(alg, data, rounds=2, active=active, state=state0)
    assert_trees_close(state.bottoms[1], state0.bottoms[1], atol=0, rtol=0)
    assert_trees_close(state.velocity[0][1], state0.velocity[0][1], atol=0, rtol=0)
    assert trees_differ(state.bottoms[0], state0.bottoms[0])
    assert trees_differ(state.top, state0.top)
    # the absent party's embeddings enter the others' updates
    moved = jax.tree_util.tree_map(lambda a: a * 1.5, state0.bottoms[1])
    other0 = dataclasses.replace(state0, bottoms=(state0.bottoms[0], moved, state0.bottoms[2]))
    other = run(alg, data, rounds=2, active=active, state=other0)
    assert trees_differ(state.bottoms[0], other.bottoms[0])
    # a round with nobody active changes nothing and sends nothing
    idle = run(alg, data, active=[False, False, False], state=state)
    assert_trees_close((idle.bottoms, idle.top), (state.bottoms, state.top), atol=0, rtol=0)
    assert alg.round_stats(idle)["bytes_up"] == 0 and alg.round_stats(idle)["round_trips"] == 0


def test_training_improves_and_evaluates():
    data = vertical_data(3)
    alg = FedBCDNN(batch_size=16, learning_rate=0.1, momentum=0.9, **SMALL)
    state0 = alg.setup(data, 0)
    before = alg.evaluate(state0, data)
    after = alg.evaluate(run(alg, data, rounds=4, state=state0), data)
    assert set(after) == {"loss", "train_accuracy", "val_loss", "val_accuracy", "val_auc",
                          "local_val_accuracy"}
    assert after["val_auc"] > max(before["val_auc"], 0.5)
    assert after["loss"] < 0.7 * before["loss"]
    assert after["train_accuracy"] > before["train_accuracy"]
    assert 0 <= after["val_accuracy"] <= 1 and np.isnan(after["local_val_accuracy"])
    no_val = alg.evaluate(state0, dataclasses.replace(data, X_val=None, y_val=None))
    assert np.isnan(no_val["val_accuracy"])


def test_cnn_bottom_on_image_halves():
    data = vertical_data(image=True)
    alg = FedBCDNN(bottom="cnn", embedding=8, channels=4, batch_size=16, learning_rate=0.05)
    state = run(alg, data)
    assert np.isfinite(alg.evaluate(state, data)["loss"])
    assert alg.config(state)["bottom_nets"][0].startswith("cnn 8x4")
    assert PAPER_MNIST_CNN == {"bottom": "cnn", "embedding": 256, "channels": 64,
                               "batch_size": 256}


@pytest.mark.parametrize("variant", ["parallel", "sequential"])
def test_cnn_rounds_outside_xla_loops_equal_the_scanned_round(variant, monkeypatch):
    """The CNN path (a jitted exchange per batch, local steps unrolled) computes what the
    scanned round computes; only where XLA loops differ."""
    import hyfl.neural.fedbcd_nn as module

    data = vertical_data(image=True)
    alg = FedBCDNN(variant=variant, bottom="cnn", embedding=8, channels=4, batch_size=16,
                   local_steps=3, learning_rate=0.05, momentum=0.5)
    unrolled = run(alg, data, rounds=2)
    real_make_round = module.make_round

    def scanned(nets, *args):  # the same nets, but claimed non-convolutional: scan path
        fake = [dataclasses.replace(net, kind="mlp") for net in nets]
        return real_make_round(fake, *args)

    monkeypatch.setattr(module, "make_round", scanned)
    looped = run(alg, data, rounds=2)
    assert_trees_close((unrolled.bottoms, unrolled.top), (looped.bottoms, looped.top),
                       atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- accounting


@pytest.mark.parametrize(
    "variant, label_holder, active, up_parties, down_parties, trips",
    [
        # up: (K - 1) exchange uploads + fresh hand-off uploads; down: P gradients
        ("parallel", 2, [1, 1, 1], 2, 2, 1),
        ("parallel", 2, [1, 0, 1], 2, 1, 1),
        ("sgd", 0, [0, 1, 1], 2, 2, 1),
        ("sequential", 2, [1, 1, 1], 2 + 2, 2, 3),
        ("sequential", 0, [1, 1, 1], 2 + 1, 2, 3),  # the label holder's hand-off is local
        ("sequential", 1, [1, 0, 1], 2 + 1, 2, 2),  # absent label holder answers
    ],
)
def test_round_accounting(variant, label_holder, active, up_parties, down_parties, trips):
    data = vertical_data(3)
    B, E, X = 16, 4, 3
    alg = FedBCDNN(variant=variant, batch_size=B, exchanges=X, label_holder=label_holder,
                   learning_rate=0.5, **SMALL)
    state = run(alg, data, rounds=2, active=np.array(active, bool))
    stats = alg.round_stats(state)
    assert stats["bytes_up"] == X * up_parties * B * E * FLOAT_BYTES
    assert stats["bytes_down"] == X * (down_parties * B * E * FLOAT_BYTES + 2 * B * ID_BYTES)
    assert stats["round_trips"] == X * trips
    assert stats["exchanges"] == X and stats["active_clients"] == sum(active)
    assert stats["learning_rate"] == pytest.approx(0.5 / np.sqrt(2))


def test_export_and_config():
    data = vertical_data(2)
    alg = FedBCDNN(**SMALL)
    state = alg.setup(data, 0)
    out = alg.export(state)
    assert out["bottom/0/0/W"].shape == (6, 8) and out["bottom/1/1/W"].shape == (8, 4)
    assert out["top/0/W"].shape == (8, C) and out["top/0/b"].shape == (C,)
    cfg = alg.config(state)
    assert cfg["resolved_local_steps"] == 5 and cfg["resolved_label_holder"] == 1
    assert cfg["resolved_exchanges"] == 1 and cfg["top_net"] == "mlp 8-3"
    assert alg.config()["variant"] == "parallel"


# --------------------------------------------------------------------------- bad input


def test_refuses_non_vertical_partition():
    data = vertical_data(3)
    samples = list(data.client_samples)
    samples[1] = samples[1][:40]
    bad = dataclasses.replace(data, client_samples=tuple(samples))
    with pytest.raises(HyflError, match="client 1 holds 40 of 64 samples.*vertical:Q"):
        FedBCDNN(**SMALL).setup(bad, 0)


def test_refuses_cnn_without_image_views():
    with pytest.raises(HyflError, match="bottom cnn of party 0.*not part of an image"):
        FedBCDNN(bottom="cnn").setup(vertical_data(2), 0)
    data = vertical_data(image=True)
    two_views = dataclasses.replace(data, client_views=((0, 1), (1,)))
    with pytest.raises(HyflError, match="party 0 holds 2 views"):
        FedBCDNN(bottom="cnn").setup(two_views, 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"variant": "async"}, "variant is 'async'"),
        ({"learning_rate": -1}, "learning_rate must be > 0"),
        ({"local_steps": 0}, "local_steps must be >= 1"),
        ({"variant": "sgd", "local_steps": 3}, "exactly one step"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"exchanges": 0}, "exchanges must be >= 1"),
        ({"mu": -0.1}, "mu must be a number >= 0"),
        ({"momentum": 1.0}, "momentum must be a number in"),
        ({"bottom": "rnn"}, "bottom is 'rnn'"),
        ({"lr_decay": "cosine"}, "lr_decay is 'cosine'"),
        ({"top_hidden": "64"}, "top_hidden must be a sequence"),
        ({"top_hidden": (0,)}, "top_hidden width must be >= 1"),
        ({"label_holder": -1}, "label_holder must be >= 0"),
    ],
)
def test_invalid_hyperparameters(kwargs, match):
    with pytest.raises(HyflError, match=match):
        FedBCDNN(**kwargs).validated()


def test_label_holder_out_of_range():
    with pytest.raises(HyflError, match="label_holder is 3, but there are 3 parties"):
        FedBCDNN(label_holder=3, **SMALL).setup(vertical_data(3), 0)


def test_import_needs_no_jax():
    code = (
        "import sys; sys.modules['jax'] = None; sys.modules['optax'] = None\n"
        "from hyfl.neural.fedbcd_nn import FedBCDNN\n"
        "print(FedBCDNN(variant='sequential').validated().steps)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "5"
