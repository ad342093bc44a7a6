"""Matched averaging (hyfl.neural.matching): recovery of known permutations, hybrid rows,
unequal sizes, and the vectorized update against slow loop references."""

import numpy as np
import pytest

from hyfl.errors import HyflError
from hyfl.neural.matching import (
    MatchResult,
    _average_all,
    matched_average,
    permute_hidden,
    select_for_client,
)

SIZES = [20, 16, 12, 5]  # input -> hidden -> hidden -> classes


def mlp(rng, sizes=SIZES):
    return tuple(
        (rng.normal(size=(a, b)), rng.normal(size=b)) for a, b in zip(sizes[:-1], sizes[1:])
    )


def forward(layers, x):
    for w, b in layers[:-1]:
        x = np.maximum(x @ w + b, 0.0)
    w, b = layers[-1]
    return x @ w + b


def perturb(layers, rng, scale):
    return tuple(
        (w + scale * rng.normal(size=w.shape), b + scale * rng.normal(size=b.shape))
        for w, b in layers
    )


def assert_layers_close(got, want, atol):
    assert len(got) == len(want)
    for (gw, gb), (ww, wb) in zip(got, want):
        np.testing.assert_allclose(gw, ww, rtol=0, atol=atol)
        np.testing.assert_allclose(gb, wb, rtol=0, atol=atol)


def consensus_order(res, perms):
    """sigma[l][k]: the original neuron that global neuron k of layer l holds, read off
    client 0 (its neuron j is original neuron perms[0][l][j] and sits at assignment[0][l][j])."""
    sigma = []
    for l, p in enumerate(perms[0]):
        s = np.empty_like(p)
        s[res.assignments[0][l]] = p
        sigma.append(s)
    return sigma


def slow_update(clients, input_rows, assignments, global_layers, weights):
    """The global update with explicit loops over layers, entries and clients."""
    out = []
    n_layers = len(global_layers)
    for l in range(n_layers):
        gw, gb = global_layers[l]
        new_w, new_b = gw.copy(), gb.copy()
        for r in range(gw.shape[0]):
            for k in range(gw.shape[1]):
                num = den = 0.0
                for m, model in enumerate(clients):
                    rows = input_rows[m] if l == 0 else assignments[m][l - 1]
                    cols = assignments[m][l] if l < n_layers - 1 else range(gw.shape[1])
                    rows, cols = list(rows), list(cols)
                    if r in rows and k in cols:
                        num += weights[m] * model[l][0][rows.index(r), cols.index(k)]
                        den += weights[m]
                if den > 0:
                    new_w[r, k] = num / den
        for k in range(gb.shape[0]):
            num = den = 0.0
            for m, model in enumerate(clients):
                cols = assignments[m][l] if l < n_layers - 1 else range(gb.shape[0])
                cols = list(cols)
                if k in cols:
                    num += weights[m] * model[l][1][cols.index(k)]
                    den += weights[m]
            if den > 0:
                new_b[k] = num / den
        out.append((new_w, new_b))
    return out


# --- helpers -------------------------------------------------------------------------------


def test_permute_hidden_keeps_the_function_and_select_for_client_inverts_it():
    rng = np.random.default_rng(0)
    orig = mlp(rng)
    perms = [rng.permutation(n) for n in SIZES[1:-1]]
    permuted = permute_hidden(orig, perms)
    x = rng.normal(size=(7, SIZES[0]))
    np.testing.assert_allclose(forward(permuted, x), forward(orig, x), atol=1e-12)
    # client neuron j is global neuron perms[l][j]: selecting by perms rebuilds the permuted copy
    assert_layers_close(select_for_client(orig, np.arange(SIZES[0]), perms), permuted, 0)


# --- 1. recovering known permutations ------------------------------------------------------


def test_single_permuted_client_is_matched_back_to_the_global_order():
    rng = np.random.default_rng(1)
    orig = mlp(rng)
    perms = [rng.permutation(n) for n in SIZES[1:-1]]
    client = permute_hidden(orig, perms)
    res = matched_average(
        [client], [np.arange(SIZES[0])], perturb(orig, rng, 0.05), rounds=1, rng=rng
    )
    assert isinstance(res, MatchResult)
    assert_layers_close(res.layers, orig, 1e-12)
    for got, want in zip(res.assignments[0], perms):
        np.testing.assert_array_equal(got, want)
    assert res.cost < 1e-20


def test_three_permuted_clients_agree_on_one_order_and_recover_the_model():
    rng = np.random.default_rng(2)
    orig = mlp(rng)
    perms = [[rng.permutation(n) for n in SIZES[1:-1]] for _ in range(3)]
    clients = [permute_hidden(orig, p) for p in perms]
    rows = [np.arange(SIZES[0])] * 3
    # identity start: the clients disagree, so it takes a few leave-one-out rounds to agree
    res = matched_average(clients, rows, clients[0], rounds=20, rng=np.random.default_rng(3))
    sigma = consensus_order(res, perms)
    assert_layers_close(res.layers, permute_hidden(orig, sigma), 1e-12)
    for m, p in enumerate(perms):
        for l in range(len(p)):
            # client m's neuron j (original p[l][j]) sits where the global holds p[l][j]
            np.testing.assert_array_equal(sigma[l][res.assignments[m][l]], p[l])
    assert res.cost < 1e-20


def test_three_noisy_permuted_clients_give_exact_assignments_and_a_close_model():
    rng = np.random.default_rng(4)
    orig = mlp(rng)
    perms = [[rng.permutation(n) for n in SIZES[1:-1]] for _ in range(3)]
    clients = [perturb(permute_hidden(orig, p), rng, 1e-3) for p in perms]
    rows = [np.arange(SIZES[0])] * 3
    res = matched_average(clients, rows, clients[0], rounds=20, rng=np.random.default_rng(5))
    sigma = consensus_order(res, perms)
    for m, p in enumerate(perms):
        for l in range(len(p)):
            np.testing.assert_array_equal(sigma[l][res.assignments[m][l]], p[l])
    assert_layers_close(res.layers, permute_hidden(orig, sigma), 1e-2)


# --- 2. permutation invariance ---------------------------------------------------------------


def test_global_function_is_unchanged_when_a_client_is_replaced_by_a_permuted_copy():
    rng = np.random.default_rng(6)
    # clients narrower than the global start from the Hungarian matching (not identity),
    # so the whole procedure is equivariant in each client's neuron order
    small = [20, 14, 10, 5]
    clients = [mlp(rng, small) for _ in range(3)]
    glob = mlp(rng)
    rows = [np.arange(20)] * 3
    base = matched_average(clients, rows, glob, rounds=6, rng=np.random.default_rng(7))
    perms = [rng.permutation(n) for n in small[1:-1]]
    swapped = [clients[0], permute_hidden(clients[1], perms), clients[2]]
    again = matched_average(swapped, rows, glob, rounds=6, rng=np.random.default_rng(7))
    x = rng.normal(size=(9, 20))
    np.testing.assert_allclose(forward(again.layers, x), forward(base.layers, x), atol=1e-12)
    assert again.cost == pytest.approx(base.cost, rel=1e-12)
    for l, p in enumerate(perms):
        np.testing.assert_array_equal(again.assignments[1][l], base.assignments[1][l][p])


# --- 3. identity matching is plain averaging -----------------------------------------------


def test_identity_matching_is_the_plain_row_wise_average():
    rng = np.random.default_rng(8)
    glob = mlp(rng)
    # rows 1 and 4 belong to no client
    rows = [np.array([0, 2, 3, 7, 8, 9, 15]), np.setdiff1d(np.arange(2, 20), [4]), np.arange(5, 20)]
    clients = []
    for r in rows:
        model = mlp(rng, [len(r)] + SIZES[1:])
        clients.append(model)
    weights = np.array([1.0, 2.0, 0.5])
    res = matched_average(clients, rows, glob, rng=rng, matching="identity", client_weights=weights)
    ident = [[np.arange(n) for n in SIZES[1:-1]]] * 3
    want = slow_update(clients, rows, ident, glob, weights)
    assert_layers_close(res.layers, want, 1e-12)
    for per in res.assignments:
        for a, n in zip(per, SIZES[1:-1]):
            np.testing.assert_array_equal(a, np.arange(n))
    # rows no client has keep the global value
    np.testing.assert_array_equal(res.layers[0][0][[1, 4]], glob[0][0][[1, 4]])


# --- 4. hybrid rows: disjoint views ----------------------------------------------------------


def test_disjoint_views_are_matched_by_bias_and_outgoing_weights():
    rng = np.random.default_rng(9)
    sizes = [20, 16, 5]
    orig = mlp(rng, sizes)
    # equal hidden biases: only the outgoing weights (un-permuted classes) identify a neuron
    orig = ((orig[0][0], np.full(16, 0.3)), orig[1])
    views = [np.arange(0, 10), np.arange(10, 20)]
    perms = [[rng.permutation(16)] for _ in views]
    clients = []
    for r, p in zip(views, perms):
        (w0, b0), out = orig
        clients.append(permute_hidden(((w0[r], b0), out), p))
    # a zero fallback makes the incoming part of the cost the same for every global neuron:
    # only the shared bias and outgoing weights could tell the neurons apart
    glob = tuple((np.zeros_like(w), np.zeros_like(b)) for w, b in orig)
    res = matched_average(clients, views, glob, rounds=3, rng=np.random.default_rng(10))
    sigma = consensus_order(res, perms)
    np.testing.assert_array_equal(sigma[0][res.assignments[1][0]], perms[1][0])
    assert_layers_close(res.layers, permute_hidden(orig, sigma), 1e-12)
    # each first-layer row comes from the one client that has it
    for m, r in enumerate(views):
        np.testing.assert_array_equal(
            res.layers[0][0][np.ix_(r, res.assignments[m][0])], clients[m][0][0]
        )


# --- 5. unequal sizes -----------------------------------------------------------------------


def test_smaller_client_is_matched_injectively_and_unmatched_neurons_keep_the_others():
    rng = np.random.default_rng(11)
    orig = mlp(rng)
    subset = [np.sort(rng.choice(16, 10, replace=False)), np.sort(rng.choice(12, 7, replace=False))]
    order = [rng.permutation(10), rng.permutation(7)]
    chosen = [s[o] for s, o in zip(subset, order)]  # the small client's neurons, shuffled
    rows = np.arange(20)
    small = perturb(select_for_client(orig, rows, chosen), rng, 1e-3)
    res = matched_average(
        [orig, small],
        [rows, rows],
        perturb(orig, rng, 0.1),
        rounds=4,
        rng=np.random.default_rng(12),
    )
    for l, c in enumerate(chosen):
        np.testing.assert_array_equal(res.assignments[0][l], np.arange(SIZES[l + 1]))
        np.testing.assert_array_equal(res.assignments[1][l], c)
    # neurons the small client lacks come from the full client alone
    (w0, b0), (w1, _), _ = res.layers
    rest0 = np.setdiff1d(np.arange(16), chosen[0])
    np.testing.assert_allclose(w0[:, rest0], orig[0][0][:, rest0], atol=1e-15)
    np.testing.assert_allclose(b0[rest0], orig[0][1][rest0], atol=1e-15)
    # matched neurons are the two-client mean
    np.testing.assert_allclose(
        w0[:, chosen[0]], (orig[0][0][:, chosen[0]] + small[0][0]) / 2, atol=1e-14
    )
    np.testing.assert_allclose(
        w1[np.ix_(chosen[0], chosen[1])],
        (orig[1][0][np.ix_(chosen[0], chosen[1])] + small[1][0]) / 2,
        atol=1e-14,
    )


def test_lone_smaller_client_leaves_the_unmatched_neurons_at_the_fallback():
    rng = np.random.default_rng(13)
    sizes = [6, 8, 3]
    glob = mlp(rng, sizes)
    chosen = [np.array([5, 1, 6])]
    client = perturb(select_for_client(glob, np.arange(6), chosen), rng, 1e-2)
    res = matched_average([client], [np.arange(6)], glob, rounds=2, rng=rng)
    np.testing.assert_array_equal(res.assignments[0][0], chosen[0])
    rest = np.setdiff1d(np.arange(8), chosen[0])
    np.testing.assert_array_equal(res.layers[0][0][:, rest], glob[0][0][:, rest])
    np.testing.assert_array_equal(res.layers[1][0][rest], glob[1][0][rest])
    assert_layers_close(
        select_for_client(res.layers, np.arange(6), res.assignments[0]), client, 1e-15
    )
    assert res.cost < 1e-25


# --- 6. bad input ---------------------------------------------------------------------------


def _good(rng):
    glob = mlp(rng, [6, 4, 3])
    clients = [mlp(rng, [6, 4, 3]), mlp(rng, [3, 4, 3])]
    rows = [np.arange(6), np.array([0, 2, 5])]
    return clients, rows, glob


def _nan(c):
    c[1][0][0][0, 0] = np.nan


BAD = {
    "unknown matching": (dict(matching="greedy"), "matching"),
    "negative rounds": (dict(rounds=-1), "rounds must be >= 0"),
    "wrong layer count": (
        dict(edit=lambda c, r, g: c.__setitem__(1, c[1][:1])),
        r"client 1\) has 1 layers",
    ),
    "client shape chain": (
        dict(edit=lambda c, r, g: c[1].__setitem__(1, (np.ones((5, 3)), np.ones(3)))),
        r"client 1, layer 1\) has 5 input rows",
    ),
    "bias shape": (
        dict(edit=lambda c, r, g: c[0].__setitem__(0, (np.ones((6, 4)), np.ones(3)))),
        r"client 0, layer 0\) has W of shape",
    ),
    "too many neurons": (
        dict(
            edit=lambda c, r, g: c.__setitem__(
                0, [(np.ones((6, 5)), np.ones(5)), (np.ones((5, 3)), np.ones(3))]
            )
        ),
        r"client 0, layer 0\) has 5 hidden neurons, more than",
    ),
    "wrong class count": (
        dict(edit=lambda c, r, g: c[0].__setitem__(1, (np.ones((4, 2)), np.ones(2)))),
        r"client 0, layer 1\) has 2 outputs",
    ),
    "rows out of range": (
        dict(edit=lambda c, r, g: r.__setitem__(1, np.array([0, 2, 6]))),
        r"input_rows\[1\] .*outside",
    ),
    "rows wrong length": (
        dict(edit=lambda c, r, g: r.__setitem__(1, np.array([0, 2]))),
        r"input_rows\[1\] .*has 2 rows",
    ),
    "rows repeated": (
        dict(edit=lambda c, r, g: r.__setitem__(1, np.array([0, 2, 2]))),
        r"input_rows\[1\] .*strictly increasing",
    ),
    "rows not integer": (
        dict(edit=lambda c, r, g: r.__setitem__(1, np.array([0.0, 2.0, 5.0]))),
        r"input_rows\[1\] .*integer",
    ),
    "input_rows count": (dict(edit=lambda c, r, g: r.pop()), "input_rows has 1 entries"),
    "nan weight": (dict(edit=lambda c, r, g: _nan(c)), r"client 1, layer 0\) contains NaN"),
    "inf in global": (
        dict(edit=lambda c, r, g: g.__setitem__(1, (g[1][0] * np.inf, g[1][1]))),
        r"global_layers\[1\] \(layer 1\) contains NaN or inf",
    ),
    "global chain": (
        dict(edit=lambda c, r, g: g.__setitem__(1, (np.ones((5, 3)), np.ones(3)))),
        r"global_layers\[1\] \(layer 1\) has 5 input rows",
    ),
    "bad weights": (dict(client_weights=np.array([1.0, 0.0])), "client_weights"),
    "identity with unequal sizes": (
        dict(
            matching="identity",
            edit=lambda c, r, g: c.__setitem__(
                1, [(np.ones((3, 2)), np.ones(2)), (np.ones((2, 3)), np.ones(3))]
            ),
        ),
        r"client 1, layer 0\) has 2 hidden neurons .* identity",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_names_the_culprit(case):
    kwargs, pattern = BAD[case]
    kwargs = dict(kwargs)
    clients, rows, glob = _good(np.random.default_rng(14))
    clients = [list(c) for c in clients]
    glob = list(glob)
    edit = kwargs.pop("edit", None)
    if edit is not None:
        edit(clients, rows, glob)
    with pytest.raises(HyflError, match=pattern):
        matched_average(clients, rows, glob, rng=np.random.default_rng(0), **kwargs)


def test_bad_permutation_is_refused():
    rng = np.random.default_rng(15)
    with pytest.raises(HyflError, match=r"perms\[0\] is not a permutation"):
        permute_hidden(mlp(rng), [np.zeros(16, dtype=int), np.arange(12)])


# --- 7. the vectorized update against the slow reference ------------------------------------


def test_vectorized_update_equals_the_loop_reference_for_random_assignments():
    rng = np.random.default_rng(16)
    glob = mlp(rng)
    clients, rows, assign = [], [], []
    for n_rows, hidden in [(20, (16, 12)), (9, (11, 12)), (13, (16, 5)), (4, (3, 2))]:
        r = np.sort(rng.choice(20, n_rows, replace=False))
        a = [rng.choice(16, hidden[0], replace=False), rng.choice(12, hidden[1], replace=False)]
        clients.append(mlp(rng, [n_rows, *hidden, 5]))
        rows.append(r)
        assign.append(a)
    weights = rng.uniform(0.5, 2.0, size=4)
    got = _average_all(clients, rows, assign, list(glob), weights)
    want = slow_update(clients, rows, assign, glob, weights)
    assert_layers_close(got, want, 1e-12)


def test_result_is_the_average_under_its_own_assignments_and_cost_is_the_distance():
    rng = np.random.default_rng(17)
    glob = mlp(rng)
    rows = [np.sort(rng.choice(20, n, replace=False)) for n in (20, 12, 8)]
    clients = [mlp(rng, [len(r), h1, h2, 5]) for r, h1, h2 in zip(rows, (16, 10, 13), (12, 9, 4))]
    weights = np.array([3.0, 1.0, 2.0])
    res = matched_average(clients, rows, glob, rounds=7, rng=rng, client_weights=weights)
    want = slow_update(clients, rows, res.assignments, glob, weights)
    assert_layers_close(res.layers, want, 1e-12)
    cost = 0.0
    for model, r, a in zip(clients, rows, res.assignments):
        share = select_for_client(res.layers, r, a)
        cost += sum(
            np.sum((w - sw) ** 2) + np.sum((b - sb) ** 2) for (w, b), (sw, sb) in zip(model, share)
        )
    assert res.cost == pytest.approx(cost, rel=1e-12)
