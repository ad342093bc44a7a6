"""hyfem-nn (HyFEM with neural models): FedProx equivalence, gradients, server step, errors."""

import copy

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from hyfl.errors import HyflError  # noqa: E402
from hyfl.neural.base import batch_ids  # noqa: E402
from hyfl.neural.hyfem_nn import HyFEMNN  # noqa: E402
from hyfl.neural.matching import matched_average  # noqa: E402
from hyfl.neural.views import ViewData  # noqa: E402

SMALL = dict(extractor_hidden=6, embedding=4, inference_hidden=5)


def view_data(client_samples, client_views, n=48, views=((0, 1, 2, 3, 4), (5, 6, 7, 8, 9)),
              n_classes=3, n_val=20, seed=0):
    """A tiny ViewData built by hand: Gaussian features, labels from a random linear map."""
    rng = np.random.default_rng(seed)
    F = sum(len(v) for v in views)
    W = rng.normal(size=(F, n_classes))
    X = rng.normal(size=(n, F)).astype(np.float32)
    X_val = rng.normal(size=(n_val, F)).astype(np.float32)
    return ViewData(
        X=X, y=np.argmax(X @ W, axis=1).astype(np.int32), classes=np.arange(n_classes),
        views=tuple(np.asarray(v, dtype=np.int64) for v in views),
        view_shapes=(None,) * len(views), view_positions=(None,) * len(views),
        client_samples=tuple(np.asarray(s, dtype=np.int64) for s in client_samples),
        client_views=tuple(tuple(v) for v in client_views),
        X_val=X_val, y_val=np.argmax(X_val @ W, axis=1).astype(np.int32),
    )


# ---------------------------------------------------------------- the slow reference
def as_dict(extractors, inference):
    """The whole model as ONE flat parameter dict of float32 arrays."""
    p = {}
    for d, ext in enumerate(extractors):
        for i, layer in enumerate(ext):
            p[f"ext{d}.W{i}"] = np.asarray(layer["W"], dtype=np.float32)
            p[f"ext{d}.b{i}"] = np.asarray(layer["b"], dtype=np.float32)
    for i, layer in enumerate(inference):
        p[f"inf.W{i}"] = np.asarray(layer["W"], dtype=np.float32)
        p[f"inf.b{i}"] = np.asarray(layer["b"], dtype=np.float32)
    return p


def reference_logits(p, X, views, n_views, fusion):
    """Extractor per view (dense-ReLU-dense-ReLU), concatenation times the fusion factor,
    inference MLP (dense-ReLU-dense)."""
    embeddings = []
    for d, cols in zip(range(n_views), views):
        h = jax.nn.relu(X[:, cols] @ p[f"ext{d}.W0"] + p[f"ext{d}.b0"])
        embeddings.append(jax.nn.relu(h @ p[f"ext{d}.W1"] + p[f"ext{d}.b1"]))
    z = jnp.concatenate(embeddings, axis=1)
    if fusion == "mean":
        z = z / n_views
    h = jax.nn.relu(z @ p["inf.W0"] + p["inf.b0"])
    return h @ p["inf.W1"] + p["inf.b1"]


def reference_objective(p, anchor, X, y, views, n_views, fusion, mu):
    """Mean cross-entropy + mu/2 ||p - anchor||^2, written out."""
    logits = reference_logits(p, X, views, n_views, fusion)
    log_softmax = logits - jax.scipy.special.logsumexp(logits, axis=1, keepdims=True)
    ce = -jnp.mean(log_softmax[jnp.arange(y.shape[0]), y])
    prox = sum(jnp.sum((p[k] - anchor[k]) ** 2) for k in p)
    return ce + 0.5 * mu * prox


def reference_round(p, X, y, batches, lr, mu, momentum, views, n_views, fusion):
    """FedProx's local SGD with heavy-ball momentum (v = m v + g; p -= lr v), fresh v."""
    anchor = {k: v.copy() for k, v in p.items()}
    v = {k: np.zeros_like(a) for k, a in p.items()}
    grad = jax.jit(jax.grad(  # jitted for speed only
        lambda p, X, y: reference_objective(p, anchor, X, y, views, n_views, fusion, mu)))
    for ids in batches:
        g = grad(p, X[ids], y[ids])
        for k in p:
            v[k] = momentum * v[k] + np.asarray(g[k])
            p[k] = p[k] - lr * v[k]
    return p  # the server step of one client holding everything is the identity


@pytest.mark.parametrize(
    "momentum, local_steps, fusion",
    [(0.0, 5, "mean"), (0.9, 5, "mean"), (0.9, 8, "concat")],
)
def test_one_client_with_every_view_is_fedprox(momentum, local_steps, fusion):
    N = 48
    data = view_data([np.arange(N)], [(0, 1)], n=N)
    alg = HyFEMNN(matching="identity", mu=0.3, momentum=momentum, batch_size=8,
                  local_steps=local_steps, learning_rate=0.1, lr_decay=0.5, lr_decay_every=2,
                  fusion=fusion, **SMALL).validated()
    state = alg.setup(data, seed=7)
    p = as_dict(state.extractors, state.inference)
    rng_alg, rng_ref = np.random.default_rng(11), np.random.default_rng(11)
    active = np.array([True])
    X, y = data.X, data.y
    for t in range(3):
        state = alg.round(state, active, rng_alg)
        batches = batch_ids(rng_ref, data.client_samples[0], 8, local_steps)
        lr = 0.1 * 0.5 ** (t // 2)
        assert state.stats["learning_rate"] == pytest.approx(lr)
        p = reference_round(p, X, y, batches, lr, 0.3, momentum, data.views, 2, fusion)
        got = as_dict(state.extractors, state.inference)
        assert got.keys() == p.keys()
        for k in p:
            np.testing.assert_allclose(got[k], p[k], rtol=1e-5, atol=1e-6, err_msg=f"{k} @ {t}")
        # the client's local model is the trained model, which is the new global one
        local = state.local[0]
        local_dict = as_dict([local["extractors"][0], local["extractors"][1]], local["inference"])
        for k in p:
            np.testing.assert_allclose(local_dict[k], got[k], rtol=1e-6, atol=1e-7)
    # a parameter moved, so the comparison is not vacuous
    start = as_dict(*(lambda s: (s.extractors, s.inference))(alg.setup(data, seed=7)))
    assert max(np.abs(p[k] - start[k]).max() for k in p) > 1e-3


# ---------------------------------------------------------------- gradient


def test_objective_gradient_matches_finite_differences(x64):
    data = view_data([np.arange(30), np.arange(20, 48)], [(0, 1), (1,)])
    alg = HyFEMNN(mu=0.7, **SMALL).validated()
    state = alg.setup(data, seed=3)
    f64 = lambda tree: jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype=jnp.float64), tree)  # noqa: E731
    rng = np.random.default_rng(0)
    for m, views in enumerate(data.client_views):
        anchor = f64(alg.distribute(state, views))
        # a model away from the anchor, so the proximal term has a gradient too
        model = jax.tree_util.tree_map(
            lambda a: a + 0.05 * rng.normal(size=a.shape), anchor
        )
        ids = data.client_samples[m]
        X = jnp.asarray(data.X[ids], dtype=jnp.float64)
        y = jnp.asarray(data.y[ids])

        @jax.jit
        def f(model):
            return alg.objective(data, views, model, anchor, X, y, 0.7)

        grad = jax.grad(f)(model)
        leaves, treedef = jax.tree_util.tree_flatten(model)
        g_leaves = jax.tree_util.tree_leaves(grad)
        assert all(g.dtype == jnp.float64 for g in g_leaves)
        h = 1e-6
        for i, leaf in enumerate(leaves):
            for _ in range(2):  # two random entries of every array
                j = tuple(int(rng.integers(s)) for s in leaf.shape)
                plus = [a.at[j].add(h) if n == i else a for n, a in enumerate(leaves)]
                minus = [a.at[j].add(-h) if n == i else a for n, a in enumerate(leaves)]
                fd = (f(jax.tree_util.tree_unflatten(treedef, plus))
                      - f(jax.tree_util.tree_unflatten(treedef, minus))) / (2 * h)
                assert float(g_leaves[i][j]) == pytest.approx(float(fd), rel=1e-5, abs=1e-8)


# ---------------------------------------------------------------- server step
def three_clients():
    """Client 0: views 0 and 1; client 1: view 0 only; client 2: view 2 only."""
    return view_data(
        [np.arange(0, 20), np.arange(15, 40), np.arange(30, 48)], [(0, 1), (0,), (2,)],
        views=((0, 1, 2, 3), (4, 5, 6), (7, 8, 9)), n_classes=3,
    )


def test_server_averages_extractors_and_matches_inference_models():
    data = three_clients()
    alg = HyFEMNN(mu=0.2, batch_size=8, local_steps=4, learning_rate=0.1, matching_rounds=3,
                  **SMALL).validated()
    state0 = alg.setup(data, seed=5)
    rng = np.random.default_rng(2)
    replay = copy.deepcopy(rng)
    active = np.array([True, True, False])
    state = alg.round(state0, active, rng)
    # the same random draws, in the same order: client 0's batches, client 1's, then matching
    for m in (0, 1):
        batch_ids(replay, data.client_samples[m], 8, 4)

    trained = state.local
    ext = lambda tree: np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(tree)])  # noqa: E731
    # view 0: held by both active clients -> their mean
    mean0 = (ext(trained[0]["extractors"][0]) + ext(trained[1]["extractors"][0])) / 2
    np.testing.assert_allclose(ext(state.extractors[0]), mean0, rtol=1e-6, atol=1e-7)
    # view 1: client 0 alone
    np.testing.assert_array_equal(ext(state.extractors[1]), ext(trained[0]["extractors"][1]))
    # view 2: no active holder -> unchanged
    np.testing.assert_array_equal(ext(state.extractors[2]), ext(state0.extractors[2]))
    assert not np.array_equal(ext(state.extractors[0]), ext(state0.extractors[0]))

    layers = lambda inf: [(np.asarray(lay["W"], np.float64), np.asarray(lay["b"], np.float64))  # noqa: E731
                          for lay in inf]
    expected = matched_average(
        [layers(trained[0]["inference"]), layers(trained[1]["inference"])],
        [alg.input_rows((0, 1)), alg.input_rows((0,))],
        layers(state0.inference), rounds=3, rng=replay, matching="hungarian",
    )
    assert len(state.inference) == len(expected.layers)
    for lay, (W, b) in zip(state.inference, expected.layers):
        np.testing.assert_allclose(np.asarray(lay["W"]), W, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(lay["b"]), b, rtol=1e-6, atol=1e-7)
    # client 1 holds only view 0: its first layer has E rows
    assert trained[1]["inference"][0]["W"].shape == (SMALL["embedding"], SMALL["inference_hidden"])
    # communication: each active client downloads and uploads its share
    n_par = sum(np.size(a) for m in (0, 1)
                for a in jax.tree_util.tree_leaves(alg.distribute(state0, data.client_views[m])))
    assert state.stats["bytes_up"] == state.stats["bytes_down"] == 4.0 * n_par
    assert state.stats["round_trips"] == 1.0 and state.stats["active_clients"] == 2.0


def test_identity_matching_with_equal_views_is_plain_averaging():
    data = view_data([np.arange(24), np.arange(24, 48)], [(0, 1), (0, 1)])
    alg = HyFEMNN(matching="identity", batch_size=8, local_steps=3, **SMALL).validated()
    state = alg.round(alg.setup(data, seed=1), np.array([True, True]), np.random.default_rng(0))
    for d in (0, 1):
        for i, layer in enumerate(state.extractors[d]):
            for key in ("W", "b"):
                mean = (np.asarray(state.local[0]["extractors"][d][i][key])
                        + np.asarray(state.local[1]["extractors"][d][i][key])) / 2
                np.testing.assert_allclose(np.asarray(layer[key]), mean, rtol=1e-6, atol=1e-7)
    for i, layer in enumerate(state.inference):
        for key in ("W", "b"):
            mean = (np.asarray(state.local[0]["inference"][i][key])
                    + np.asarray(state.local[1]["inference"][i][key])) / 2
            np.testing.assert_allclose(np.asarray(layer[key]), mean, rtol=1e-6, atol=1e-7)


def test_round_without_active_clients_changes_nothing():
    data = three_clients()
    alg = HyFEMNN(batch_size=8, local_steps=2, **SMALL).validated()
    state0 = alg.setup(data, seed=5)
    state = alg.round(state0, np.zeros(3, dtype=bool), np.random.default_rng(0))
    assert state.t == 1 and state.stats["round_trips"] == 0.0 and state.stats["bytes_up"] == 0.0
    for a, b in zip(jax.tree_util.tree_leaves((state.extractors, state.inference, state.local)),
                    jax.tree_util.tree_leaves((state0.extractors, state0.inference,
                                               state0.local))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---------------------------------------------------------------- local vs global accuracy
def accuracy(alg, data, model, views):
    """Accuracy of a model on the validation data, with the reference forward pass."""
    # reference_logits walks views 0..n-1: give the held views consecutive names
    q = as_dict([model["extractors"][d] for d in views], model["inference"])
    cols = [data.views[d] for d in views]
    logits = reference_logits(q, data.X_val, cols, len(views), alg.fusion)
    return float(np.mean(np.argmax(np.asarray(logits), axis=1) == data.y_val))


def test_local_models_and_local_accuracy():
    data = three_clients()
    alg = HyFEMNN(batch_size=8, local_steps=6, learning_rate=0.2, **SMALL).validated()
    state0 = alg.setup(data, seed=4)
    # before any round every client holds the distributed initial model
    for m, views in enumerate(data.client_views):
        start = alg.distribute(state0, views)
        for a, b in zip(jax.tree_util.tree_leaves(state0.local[m]),
                        jax.tree_util.tree_leaves(start)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    state = alg.round(state0, np.array([True, True, False]), np.random.default_rng(3))
    # client 2 did not take part: it still holds the initial model
    for a, b in zip(jax.tree_util.tree_leaves(state.local[2]),
                    jax.tree_util.tree_leaves(alg.distribute(state0, (2,)))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the ones that did hold their trained model, not the new global share
    moved = jax.tree_util.tree_leaves(state.local[1]["extractors"][0])
    assert not all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                   zip(moved, jax.tree_util.tree_leaves(state0.extractors[0])))

    row = alg.evaluate(state, data)
    local = [accuracy(alg, data, state.local[m], views)
             for m, views in enumerate(data.client_views)]
    assert row["local_val_accuracy"] == pytest.approx(np.mean(local), abs=1e-12)
    glob = {"extractors": dict(enumerate(state.extractors)), "inference": state.inference}
    assert row["val_accuracy"] == pytest.approx(accuracy(alg, data, glob, (0, 1, 2)), abs=1e-12)
    logits = reference_logits(as_dict(state.extractors, state.inference), data.X, data.views, 3,
                              "mean")
    log_p = np.asarray(jax.nn.log_softmax(logits))
    assert row["loss"] == pytest.approx(-np.mean(log_p[np.arange(data.y.size), data.y]), rel=1e-5)
    assert row["train_accuracy"] == pytest.approx(
        np.mean(np.argmax(np.asarray(logits), axis=1) == data.y), abs=1e-12)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "hyper, culprit",
    [
        ({"variant": "fedprox"}, "variant"),
        ({"matching": "greedy"}, "matching"),
        ({"fusion": "sum"}, "fusion"),
        ({"extractor": "resnet"}, "extractor"),
        ({"mu": -0.1}, "mu"),
        ({"mu": float("nan")}, "mu"),
        ({"variant": "avg", "mu": 0.1}, "mu"),
        ({"momentum": 1.0}, "momentum"),
        ({"momentum": -0.5}, "momentum"),
        ({"lr_decay": 0.0}, "lr_decay"),
        ({"lr_decay": 1.5}, "lr_decay"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"local_steps": 0}, "local_steps"),
        ({"local_epochs": 0}, "local_epochs"),
        ({"embedding": 0}, "embedding"),
        ({"matching_rounds": -1}, "matching_rounds"),
        ({"lr_decay_every": 0}, "lr_decay_every"),
    ],
)
def test_bad_hyperparameters_name_the_culprit(hyper, culprit):
    with pytest.raises(HyflError, match=f"^{culprit} "):
        HyFEMNN(**hyper).validated()


def test_registry_builds_and_refuses():
    from hyfl.algorithms import is_neural, make_algorithm

    assert is_neural("hyfem-nn") and is_neural("hyfem-nn-avg") and not is_neural("hyfem")
    avg = make_algorithm("hyfem-nn-avg", {})
    assert avg.variant == "avg" and avg.mu == 0.0 and avg.name == "hyfem-nn-avg"
    with pytest.raises(HyflError, match="mu"):
        make_algorithm("hyfem-nn-avg", {"mu": 0.5})
    with pytest.raises(HyflError, match="hyperparameter 'iic' does not apply to hyfem-nn"):
        make_algorithm("hyfem-nn", {"iic": 0.1})


def test_cnn_extractor_needs_image_views():
    data = view_data([np.arange(48)], [(0, 1)])
    with pytest.raises(HyflError, match="extractor cnn .*view 0 is not part of an image"):
        HyFEMNN(extractor="cnn", **SMALL).validated().setup(data, seed=0)


def test_validation_auc_is_scikit_learns_one_vs_rest_macro_auc():
    from sklearn.metrics import roc_auc_score

    from hyfl.neural.base import validation_auc

    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 300)
    logits = rng.normal(size=(300, 4)) + 1.5 * np.eye(4)[y]
    expected = np.mean([roc_auc_score(y == c, logits[:, c]) for c in range(4)])
    assert validation_auc(logits, y) == pytest.approx(expected, abs=1e-12)
