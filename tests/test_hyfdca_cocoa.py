"""HyFDCA's default ``cocoa`` rule (hyfl.algorithms.hyfdca_local).

* The vectorized engine equals a slow per-client reference (tests/reference_hyfdca.py)
  to 1e-10: duals, weights, the running averages and the subproblem scaling, every
  round, over partitions, participation schedules (with empty rounds), losses,
  multiclass problems, history depths and local step counts.
* With no tuning it reaches relative loss 1e-3 with a valid certificate (the duality
  gap bounds P - P*) on hybrid, horizontal and vertical splits with partial
  participation, and the model a run returns is the one it reports.
* A run whose objective stops being finite raises a clear error naming the rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from hyfl.algorithms import hyfdca as hyfdca_module
from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.algorithms.hyfdca_local import RunningAverage, SpanHistory, direction_pairs
from hyfl.errors import HyflError
from hyfl.participation import Cyclic, Full, RandomFraction, Trace
from hyfl.partition import grid, horizontal, nonzero_balanced, stack, vertical
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import random_streams, simulate
from reference_hyfdca import ReferenceCocoa
from synthetic_data import synthetic

CASES = {
    "grid, half, hinge": (
        "hinge", {}, lambda n, m, X: grid(n, m, 3, 3, seed=1), lambda K: RandomFraction(K, 0.5),
        HyFDCA(),
    ),
    "horizontal, full, logistic": (
        "logistic", {}, lambda n, m, X: horizontal(n, m, 3), lambda K: Full(K), HyFDCA(),
    ),
    "vertical, cyclic, squared": (
        "squared", {}, lambda n, m, X: vertical(n, m, 4), lambda K: Cyclic(K, 2), HyFDCA(),
    ),
    "nonzero split, smoothed hinge, history 3, 4 local steps": (
        "smoothed_hinge", {"sparsity": 0.3}, lambda n, m, X: nonzero_balanced(X, 3, 3, seed=0),
        lambda K: RandomFraction(K, 0.7), HyFDCA(history=3, local_steps=4),
    ),
    # four own features a client against two directions: the solver keeps the own-feature
    # residual in its expanded form (hyfdca_compiled.solve), the other cases densely
    "vertical, more own features than directions, history 2": (
        "hinge", {}, lambda n, m, X: vertical(n, m, 2), lambda K: RandomFraction(K, 0.5),
        HyFDCA(history=2),
    ),
    # twelve own features a client and, in the first rounds, a few directions of its 25
    # (the solver cuts the unused ones; the residual stays dense); one local pass, as the
    # reference makes
    "vertical, a dozen own features, a filling history": (
        "logistic", {"m": 24}, lambda n, m, X: vertical(n, m, 2),
        lambda K: RandomFraction(K, 0.5), HyFDCA(local_passes=1),
    ),
    "multiclass, grid, no momentum": (
        "hinge", {"classes": 3}, lambda n, m, X: grid(n, m, 2, 2, seed=0),
        lambda K: RandomFraction(K, 0.6), HyFDCA(momentum=0.0),
    ),
    "grid, low participation, hinge, certified": (
        "hinge", {}, lambda n, m, X: grid(n, m, 3, 3, seed=1), lambda K: RandomFraction(K, 0.2),
        HyFDCA(certify=True),
    ),
    "vertical, cyclic, logistic, certified": (
        "logistic", {}, lambda n, m, X: vertical(n, m, 3), lambda K: Cyclic(K, 3),
        HyFDCA(certify=True),
    ),
    "multiclass, nonzero split, certified": (
        "smoothed_hinge", {"classes": 3, "sparsity": 0.3},
        lambda n, m, X: nonzero_balanced(X, 2, 2, seed=0), lambda K: RandomFraction(K, 0.4),
        HyFDCA(certify=True),
    ),
    "grid, half, hinge, without the certificate": (
        "hinge", {}, lambda n, m, X: grid(n, m, 3, 3, seed=1), lambda K: RandomFraction(K, 0.5),
        HyFDCA(certify=False),
    ),
    "empty rounds": (
        "hinge", {}, lambda n, m, X: grid(n, m, 2, 2, seed=3),
        lambda K: Trace(np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 1], [0, 1, 1, 0],
                                  [0, 0, 0, 0], [1, 1, 0, 0]] * 6, dtype=bool)),
        HyFDCA(),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_engine_equals_the_per_client_reference(case, monkeypatch):
    loss, data_options, make_partition, make_participation, hyfdca = CASES[case]
    data = synthetic(**{"n": 90, "m": 8, **data_options})
    problem = make_problem(data, loss, 0.02)
    partition = make_partition(problem.n_samples, problem.n_features, problem.X)
    participation = make_participation(partition.n_clients)
    state = hyfdca.setup(problem, stack(partition, problem.X))
    reference = ReferenceCocoa(problem, partition, hyfdca)
    if hyfdca.certified:
        # Every second checkpoint is declared fallen in both, whatever its dual: small
        # problems rarely overshoot, and the restart must be exercised.
        rejected = []

        def schedule():
            count = 0
            while True:
                count += 1
                rejected.append(count % 2 == 0)
                yield count % 2 != 0

        engine_verdicts, reference_verdicts = schedule(), schedule()
        monkeypatch.setattr(hyfdca_module, "checkpoint_accepted",
                            lambda *args: next(engine_verdicts))
        reference.decide = lambda ok: next(reference_verdicts)
    engine_rngs, reference_rngs = random_streams(5), random_streams(5)
    trusts = []
    # The certified cases run 30 rounds (certifications are rare at low participation).
    # After round 12 the forced restarts have cut the line search's range to 1/64: its
    # steps on nearly flat directions turn rounding into differences up to 1e-8 (every
    # verdict, trust and sigma still agree).
    for t in range(1, 31 if hyfdca.certified else 13):
        tol = 1e-10 if t <= 12 else 1e-7
        state = hyfdca.round(state, participation.active(t, engine_rngs[0]), engine_rngs[1])
        reference.round(participation.active(t, reference_rngs[0]), reference_rngs[1])
        np.testing.assert_allclose(state.alpha, reference.alpha, atol=tol, rtol=0)
        np.testing.assert_allclose(state.w, reference.w, atol=tol, rtol=0)
        assert state.local.sigma == pytest.approx(reference.sigma, rel=1e-9 if t <= 12 else 1e-7)
        models = dict((name, (w, a)) for name, w, a in hyfdca.models(state))
        np.testing.assert_allclose(models["average"][0], reference.avg_w, atol=tol, rtol=0)
        if not hyfdca.certified:
            np.testing.assert_allclose(models["average"][1], reference.avg_alpha, atol=tol,
                                       rtol=0)
            continue
        # The certified duals and their exact image (hyfl.algorithms.hyfdca_certify).
        certified = reference.certified()
        np.testing.assert_allclose(hyfdca.duals(state), certified, atol=tol, rtol=0)
        np.testing.assert_allclose(models["certified"][0], reference.image_of(certified),
                                   atol=tol, rtol=0)
        assert state.local.certificate.trust == reference.trust
        trusts.append(reference.trust)
    if hyfdca.certified and any(rejected[::2]):  # the engine's verdicts (every other call)
        assert any(trust < 1.0 for trust in trusts)  # the exploration restarted


@pytest.mark.parametrize("case", list(CASES))
def test_the_clients_solved_on_threads_give_the_same_bits(case, monkeypatch):
    """The clients of a round split over 1, 2 or 3 threads (every round, however small:
    the size threshold set to one row), and SecureInnerProduct's samples too: the
    iterates, duals and averages are the same bits, and the threads really ran
    (``client_chunks`` made several runs)."""
    from hyfl._threads import limit_threads
    from hyfl.algorithms import hyfdca_kernels, hyfdca_local

    loss, data_options, make_partition, make_participation, hyfdca = CASES[case]
    data = synthetic(**{"n": 90, "m": 8, **data_options})
    problem = make_problem(data, loss, 0.02)
    partition = make_partition(problem.n_samples, problem.n_features, problem.X)
    participation = make_participation(partition.n_clients)
    monkeypatch.setattr(hyfdca_local, "MIN_ROWS_PER_THREAD", 1)
    monkeypatch.setattr(hyfdca_kernels, "MIN_SAMPLES_PER_THREAD", 1)
    chunked = []
    real_chunks = hyfdca_local.client_chunks
    monkeypatch.setattr(hyfdca_local, "client_chunks",
                        lambda work, parts: chunked.append((parts, len(work)))
                        or real_chunks(work, parts))
    runs = []
    for threads in (1, 2, 3):
        chunked.clear()  # (the last run's, on three threads, are checked below)
        state = hyfdca.setup(problem, stack(partition, problem.X))
        rngs = random_streams(5)
        with limit_threads(threads):
            for t in range(1, 13):
                state = hyfdca.round(state, participation.active(t, rngs[0]), rngs[1])
        runs.append((state.w, state.alpha, [m for _, m, _ in hyfdca.models(state)]))
    for w, alpha, models in runs[1:]:
        assert np.array_equal(w, runs[0][0]) and np.array_equal(alpha, runs[0][1])
        assert all(np.array_equal(a, b) for a, b in zip(models, runs[0][2]))
    # On three threads, several runs whenever a round had several clients (one client a
    # round in the cyclic vertical case: nothing to share).
    assert all(parts > 1 for parts, clients in chunked if clients > 1)


def test_client_chunks_split_consecutive_clients_by_their_work():
    from hyfl.algorithms.hyfdca_local import client_chunks

    work = np.array([5, 1, 1, 1, 1, 1, 5, 0])
    bounds = client_chunks(work, 2)
    assert bounds[0] == 0 and bounds[-1] == work.size and np.all(np.diff(bounds) > 0)
    halves = [work[lo:hi].sum() for lo, hi in zip(bounds[:-1], bounds[1:])]
    assert len(halves) == 2 and abs(halves[0] - halves[1]) <= 5
    assert client_chunks(work, 1).tolist() == [0, work.size]
    assert client_chunks(np.zeros(3), 2).tolist() == [0, 3]
    assert client_chunks(work, 50)[-1] == work.size  # never more runs than clients
    assert len(client_chunks(work, 50)) <= work.size + 1


SPLITS = {
    "hybrid": (lambda n, m: grid(n, m, 3, 3, seed=0), 0.5),
    "horizontal": (lambda n, m: horizontal(n, m, 4), 0.5),
    "vertical": (lambda n, m: vertical(n, m, 3), 0.7),
}


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_the_default_reaches_the_optimum_with_a_valid_certificate(split, loss):
    make_partition, fraction = SPLITS[split]
    problem = make_problem(synthetic(n=400, m=12, seed=2), loss, 1e-2)  # lam N = 4
    optimum = solve_centralized(problem, cache=False)
    partition = make_partition(problem.n_samples, problem.n_features)
    result = simulate(HyFDCA(), problem, partition, RandomFraction(partition.n_clients, fraction),
                      400, seed=1, eval_every=10, optimum=optimum)
    primal, gap, relative = (result.column(c) for c in ("primal", "gap", "relative_loss"))
    # The certificate: the gap bounds the distance to the optimum at every evaluation.
    assert np.all(gap >= primal - optimum.primal - 1e-12)
    # Settled: the last 100 rounds' evaluations all within 1e-3.
    assert np.all(relative[-10:] <= 1e-3), relative[-10:]
    # The model returned is the model reported.
    assert problem.primal(result.weights) == pytest.approx(primal[-1], rel=1e-12)
    assert problem.dual(result.duals) == pytest.approx(result.column("dual")[-1], rel=1e-12)


def test_a_diverging_run_stops_with_an_error_naming_the_rule():
    # The printed paper rule adds every holder's full step on the squared loss.
    problem = make_problem(synthetic(n=200, m=10), "squared", 1e-3)
    partition = grid(problem.n_samples, problem.n_features, 3, 3, seed=0)
    with pytest.raises(HyflError, match=r"step_rule='paper'.*diverged") as err:
        simulate(HyFDCA(step_rule="paper", local_steps=20, iic=1.0), problem, partition,
                 Full(9), 500, eval_every=5)
    assert "cocoa" in str(err.value)  # the fix: the default rule
    assert err.value.result.config["stopped_by"] == "diverged"


def test_history_gram_matrices_equal_the_directions_products():
    # Column 0 of a client's directions is the current w; column j > 0 the model's
    # move between two of its active rounds. Their Gram matrix comes from range sums
    # of the per-round moves; here it is recomputed from the models themselves.
    rng = np.random.default_rng(0)
    M, C, K = 7, 2, 3
    history = SpanHistory.empty(K, None, M, C, 4)
    models = {}
    for t in range(1, 16):
        models[t] = rng.normal(size=(M, C))
        active = np.flatnonzero(rng.random(K) < 0.7)
        history.record(t, models[t], active)
        if not active.size:
            continue
        pairs, grams = history.directions(active)
        for a in range(active.size):
            columns = []
            for newer, older in pairs[a]:
                if newer < 0:
                    columns.append(np.zeros((M, C)))
                    continue
                w = models[int(history.slot_round[newer])]
                base = models[int(history.slot_round[older])] if older >= 0 else 0.0
                columns.append(w - base)
            D = np.stack(columns, axis=1)  # (M, R, C)
            np.testing.assert_allclose(grams[a], np.einsum("mrc,msc->crs", D, D), atol=1e-9)


@pytest.mark.parametrize("participation", [0.1, 0.4, 1.0])
def test_history_direction_vectors_and_products_equal_the_models_differences(participation):
    # The directions' vectors and their products with a vector are sums of the moves of
    # the rounds their slots span (cumulative sums from the oldest slot named); here they
    # are recomputed from the models themselves, over many wraps of a small window.
    rng = np.random.default_rng(2)
    M, C, K, depth, window = 6, 2, 5, 3, 9
    history = SpanHistory.empty(K, None, M, C, depth, window)
    models = {}
    for t in range(1, 80):
        models[t] = rng.normal(size=(M, C))
        active = np.flatnonzero(rng.random(K) < participation)
        history.record(t, models[t], active)
        for k in active:
            pairs = direction_pairs(history.slots[[k]])[0]
            expected = []
            for newer, older in pairs:
                if newer < 0:
                    expected.append(np.zeros((M, C)))
                    continue
                w = models[int(history.slot_round[newer])]
                expected.append(w - (models[int(history.slot_round[older])] if older >= 0
                                     else 0.0))
            D = np.stack(expected, axis=1)  # (M, R, C)
            features = np.sort(rng.choice(M, size=4, replace=False))
            np.testing.assert_allclose(history.direction_vectors(pairs, features),
                                       D[features], atol=1e-12)
            v = rng.normal(size=(M, C))
            np.testing.assert_allclose(history.direction_products(v, pairs),
                                       np.einsum("mc,mrc->cr", v, D), atol=1e-11)


@pytest.mark.parametrize("participation", [0.1, 0.5, 1.0])
def test_the_ring_keeps_exactly_the_inner_products_of_the_slots_clients_list(participation):
    # SpanHistory and ClientMemory keep a column only for the slots some client still
    # lists; read through their columns, a client's directions give what a ring of every
    # slot of the window (slot t mod W, written every round) gives.
    from hyfl.algorithms.hyfdca_local import ClientMemory

    rng = np.random.default_rng(1)
    N, M, C, K, depth, window = 30, 5, 2, 6, 4, 24
    history = SpanHistory.empty(K, N, M, C, depth, window)
    memories = [ClientMemory(N, M, C, depth, window) for _ in range(K)]
    full = np.zeros((N, window, C))
    most_live = 0
    for t in range(1, 120):
        w = rng.normal(size=(M, C))
        active = np.flatnonzero(rng.random(K) < participation)
        z = rng.normal(size=(N, C))
        history.record(t, w, active, np.arange(N), z)
        full[:, t % window] = z
        for k in active:
            memories[k].record(t, z, w)
        live = np.union1d(history.slots[history.slots >= 0], [t % window])
        most_live = max(most_live, live.size)
        assert history.z.shape[1] <= max(most_live + 3, depth)  # widened 4 at a time here
        assert np.array_equal(np.flatnonzero(history.z_column >= 0), live)
        for k in active:
            pairs = direction_pairs(history.slots[[k]])[0]
            np.testing.assert_array_equal(pairs, memories[k].pairs()[0])
            for ring, columns in ((history.z, history.ring_pairs(pairs)),
                                  (memories[k].z, memories[k].ring_pairs()[0])):
                valid = pairs >= 0
                np.testing.assert_array_equal(ring[:, columns[valid]], full[:, pairs[valid]])
    assert memories[0].z.shape[1] == depth


def _numpy_direction_grams(history, pairs, t):
    """The NumPy ``SpanHistory.direction_grams`` the compiled kernel replaced, kept as
    the reference it must equal bit for bit (the golden traces depend on it)."""
    C = history.w.shape[1]
    named = pairs[pairs >= 0]
    position, chrono = history._chronology(t, int(history.slot_round[named].min()))
    W = chrono.size
    gram = history.move_gram[:, chrono][:, :, chrono]
    box = np.zeros((C, W + 1, W + 1))
    box[:, 1:, 1:] = gram.cumsum(axis=1).cumsum(axis=2)
    with_w = np.einsum("mc,smc->cs", history.w, history.moves)[:, chrono]
    line = np.zeros((C, W + 1))
    line[:, 1:] = with_w.cumsum(axis=1)
    p, b = pairs[..., 0], pairs[..., 1]
    hi = np.where(p >= 0, position[np.maximum(p, 0)] + 1, 0)
    lo = np.where(b >= 0, position[np.maximum(b, 0)] + 1, 0)
    is_move = (b >= 0)[..., :, None] & (b >= 0)[..., None, :]
    hi_i, lo_i, hi_j, lo_j = hi[..., :, None], lo[..., :, None], hi[..., None, :], lo[..., None, :]
    moves = (box[:, hi_i, hi_j] - box[:, lo_i, hi_j] - box[:, hi_i, lo_j] + box[:, lo_i, lo_j])
    w_with = line[:, hi] - line[:, lo]
    grams = np.where(is_move[None], moves, 0.0)
    first = (p >= 0) & (b < 0)
    grams[:, :, 0, :] = np.where((b >= 0)[None], w_with, 0.0)
    grams[:, :, :, 0] = grams[:, :, 0, :]
    grams[:, :, 0, 0] = np.where(first[None, :, 0], np.sum(history.w * history.w, axis=0)[:, None],
                                 0.0)
    return np.moveaxis(grams, 0, 1)


@pytest.mark.parametrize("depth", [1, 4, 23])
def test_the_compiled_direction_grams_equal_the_numpy_ones_bit_for_bit(depth):
    rng = np.random.default_rng(depth)
    M, C, K = 9, 3, 5
    history = SpanHistory.empty(K, None, M, C, depth)
    checked = 0
    for t in range(1, 40):
        active = np.flatnonzero(rng.random(K) < 0.6)
        history.record(t, rng.normal(size=(M, C)) * 10.0 ** rng.integers(-6, 3), active)
        if not active.size:
            continue
        pairs, grams = history.directions(active)
        assert np.array_equal(grams, _numpy_direction_grams(history, pairs, t))
        checked += 1
    assert checked > 20


@pytest.mark.parametrize("depth", [2, 5, 12])
def test_the_grams_from_the_oldest_named_slot_equal_the_whole_windows_to_rounding(depth):
    # direction_grams sums its boxes from the oldest slot the directions name; the sums
    # over the whole window (what it did before) give the same matrices up to rounding.
    from hyfl.algorithms import hyfdca_compiled

    rng = np.random.default_rng(depth + 100)
    M, C, K = 7, 2, 6
    history = SpanHistory.empty(K, None, M, C, depth, size=8 * depth)
    compared = 0
    for t in range(1, 120):
        active = np.flatnonzero(rng.random(K) < 0.3)
        history.record(t, rng.normal(size=(M, C)) * 0.97 ** t, active)
        if not active.size:
            continue
        pairs, grams = history.directions(active)
        position, chrono = history._chronology(t)  # every slot of the window
        whole = hyfdca_compiled.direction_grams(
            history.move_gram, np.ascontiguousarray(chrono), np.ascontiguousarray(position),
            np.ascontiguousarray(np.einsum("mc,smc->cs", history.w, history.moves)[:, chrono]),
            np.sum(history.w * history.w, axis=0), np.ascontiguousarray(pairs))
        scale = np.abs(whole).max(axis=(-2, -1), keepdims=True)
        assert np.all(np.abs(grams - whole) <= 1e-13 * scale)
        compared += 1
    assert compared > 50


def test_running_average_equals_the_dense_recursion():
    rng = np.random.default_rng(1)
    x = np.zeros((6, 2))
    lazy, dense = RunningAverage(x), x.copy()
    for t in range(1, 30):
        lazy.advance(t)
        rows = np.flatnonzero(rng.random(6) < 0.3)
        before = x[rows].copy()
        x[rows] += rng.normal(size=(rows.size, 2))
        lazy.update(rows, before, x[rows])
        rho = max(2.0 / (t + 1.0), 0.1)
        dense = (1 - rho) * dense + rho * x
        np.testing.assert_allclose(lazy.value(x), dense, atol=1e-12)


@pytest.mark.parametrize("loss_name", ["hinge", "logistic", "squared"])
def test_a_client_holding_whole_samples_solves_the_exact_cocoa_subproblem(loss_name):
    """One client with every feature: the model is the true Gram matrix, so the local
    solve is plain sequential SDCA on CoCoA+'s subproblem
    ``max -sum l*(-(a+d)) - z.d - coef/2 d^T X X^T d``, whatever the history spans."""
    import scipy.sparse as sp

    from hyfl.algorithms.hyfdca_local import solve_subproblems, span_transforms
    from hyfl.losses import get_loss

    rng = np.random.default_rng(4)
    n, m = 40, 6
    X = sp.random(n, m, density=0.6, random_state=5, format="csr")
    X.data = rng.standard_normal(X.data.size)
    y = np.where(rng.random(n) < 0.5, -1.0, 1.0)[:, None]
    if loss_name == "squared":
        y = rng.standard_normal((n, 1))
    loss = get_loss(loss_name)
    lo, hi = loss.dual_bounds(y)
    alpha = np.clip(0.3 * rng.standard_normal((n, 1)), lo, hi)
    # A history of two rounds: w_1 and w_2; directions w_2 and w_2 - w_1 (slots 1, 0).
    w1, w2 = rng.standard_normal((m, 1)), rng.standard_normal((m, 1))
    z_ring = np.zeros((n, 4, 1))
    z_ring[:, 0], z_ring[:, 1] = X @ w1, X @ w2
    pairs = np.array([[[1, -1], [1, 0]]])
    D = np.column_stack([w2[:, 0], (w2 - w1)[:, 0]])
    transforms = span_transforms((D.T @ D)[None, None])
    order = rng.permutation(n)
    coef = 0.7
    sq_norms = np.asarray(X.multiply(X).sum(axis=1)).ravel()
    got = solve_subproblems(
        loss, segments=np.array([0, n]), row_sample=order, alpha=alpha, z_ring=z_ring,
        pairs=pairs, transforms=transforms, Y=y, sq_norms=sq_norms, coef=coef, X=X,
        rows=order, feature_ptr=np.array([0, m]), features=np.arange(m),
        directions=D[:, :, None],
    )
    # Reference: sequential dual coordinate ascent with the true Gram matrix.
    G = (X @ X.T).toarray()
    delta = np.zeros(n)
    for i in order:
        margin = float((X[i] @ w2)[0, 0]) + coef * float(G[i] @ delta)
        delta[i] += loss.dual_step(alpha[i] + delta[i], np.array([margin]),
                                   np.array([coef * G[i, i]]), y[i])[0]
    np.testing.assert_allclose(got[:, 0], delta[order], rtol=1e-9, atol=1e-12)
    # Reading the remembered inner products in ascending sample order changes nothing.
    again = solve_subproblems(
        loss, segments=np.array([0, n]), row_sample=order, alpha=alpha, z_ring=z_ring,
        pairs=pairs, transforms=transforms, Y=y, sq_norms=sq_norms, coef=coef, X=X,
        rows=order, feature_ptr=np.array([0, m]), features=np.arange(m),
        directions=D[:, :, None], ascending=np.argsort(order),
    )
    np.testing.assert_array_equal(again, got)

    # With margin offsets (sample groups): each row's margin moves by m . h, m its
    # margins on the directions -- the reference adds the same offsets.
    from hyfl.algorithms.hyfdca_groups import directions_margins

    h = rng.standard_normal((1, 1, 2))
    shifted = solve_subproblems(
        loss, segments=np.array([0, n]), row_sample=order, alpha=alpha, z_ring=z_ring,
        pairs=pairs, transforms=transforms, Y=y, sq_norms=sq_norms, coef=coef, X=X,
        rows=order, feature_ptr=np.array([0, m]), features=np.arange(m),
        directions=D[:, :, None], offset_weights=h,
    )
    m_dirs = directions_margins(z_ring, np.arange(n), pairs[0])  # (n, R, 1)
    offsets = np.einsum("nrc,cr->nc", m_dirs, h[0])[:, 0]
    delta = np.zeros(n)
    for i in order:
        margin = float((X[i] @ w2)[0, 0]) + offsets[i] + coef * float(G[i] @ delta)
        delta[i] += loss.dual_step(alpha[i] + delta[i], np.array([margin]),
                                   np.array([coef * G[i, i]]), y[i])[0]
    np.testing.assert_allclose(shifted[:, 0], delta[order], rtol=1e-9, atol=1e-12)


def test_the_solver_reads_only_the_directions_and_coordinates_in_use():
    """Clients whose lists hold unused directions (-1 padded) and whose spans have other
    ranks (one repeats a direction, so an eigenvalue is dropped) solve the model of
    hyfl.algorithms.hyfdca_local written out densely here -- <x_i, x_j> ~ phi_i.phi_j +
    r_i[own].r_j[own] + [i = j] rest_i -- although the solver compacts the unused
    directions and coordinates away."""
    import scipy.sparse as sp

    from hyfl.algorithms.hyfdca_local import solve_subproblems, span_transforms
    from hyfl.losses import get_loss

    rng = np.random.default_rng(7)
    n, m, own = 30, 6, np.array([0, 1, 2])  # each client holds 3 of the 6 features
    X = sp.random(2 * n, m, density=0.8, random_state=2, format="csr")
    X.data = rng.standard_normal(X.data.size)
    X_own = X[:, own]
    y = np.where(rng.random(2 * n) < 0.5, -1.0, 1.0)[:, None]
    loss = get_loss("hinge")
    alpha = np.clip(0.3 * rng.standard_normal((2 * n, 1)), *loss.dual_bounds(y))
    w = rng.standard_normal((4, m, 1))
    z_ring = np.stack([X @ w[s] for s in range(4)], axis=1)  # (2n, 4, 1)
    R, coef = 6, 0.6

    def client(slots):  # directions of a client's slots (most recent first), R padded
        pairs = np.full((R, 2), -1)
        pairs[0, 0] = slots[0]
        for j in range(1, len(slots)):
            pairs[j] = slots[j - 1], slots[j]
        D = np.zeros((m, R))
        for j, (p, b) in enumerate(pairs):
            if p >= 0:
                D[:, j] = w[p, :, 0] - (w[b, :, 0] if b >= 0 else 0.0)
        return pairs, D

    clients = [client([3, 2, 3]), client([3, 2, 1, 0])]  # ranks 2 (of 3 live) and 4
    pairs = np.stack([p for p, _ in clients])
    transforms = span_transforms(np.stack([(D.T @ D)[None] for _, D in clients]))
    assert [np.count_nonzero(np.any(T[0] != 0, axis=0)) for T in transforms] == [2, 4]
    sq_norms = np.asarray(X.multiply(X).sum(axis=1)).ravel()
    order = np.concatenate([rng.permutation(n), n + rng.permutation(n)])
    got = solve_subproblems(
        loss, segments=np.array([0, n, 2 * n]), row_sample=order, alpha=alpha,
        z_ring=z_ring, pairs=pairs, transforms=transforms, Y=y, sq_norms=sq_norms,
        coef=coef, X=X_own, rows=order, feature_ptr=np.array([0, 3, 6]),
        features=np.tile(np.arange(3), 2),
        directions=np.concatenate([D[own] for _, D in clients])[:, :, None])
    delta = np.zeros(2 * n)
    for a, (_, D) in enumerate(clients):
        samples = np.arange(a * n, (a + 1) * n)
        T = transforms[a, 0]
        phi = (X[samples] @ D) @ T  # the rows' coordinates in the span
        residual = X_own[samples].toarray() - phi @ (D[own] @ T).T
        pn = np.sum(phi * phi, axis=1)
        rest = np.maximum(sq_norms[samples] - pn, 0.0)
        diagonal = rest - np.minimum(np.sum(residual * residual, axis=1), rest)
        G = phi @ phi.T + residual @ residual.T + np.diag(diagonal)
        for i in order[a * n:(a + 1) * n] - a * n:
            margin = z_ring[samples[i], 3, 0] + coef * float(G[i] @ delta[samples])
            delta[samples[i]] += loss.dual_step(
                alpha[samples[i]] + delta[samples[i]], np.array([margin]),
                np.array([coef * (pn[i] + rest[i])]), y[samples[i]])[0]
    np.testing.assert_allclose(got[:, 0], delta[order], rtol=1e-9, atol=1e-12)


def test_ascending_draws_orders_a_full_pass_by_its_stored_rows():
    from hyfl.algorithms.hyfdca_local import ascending_draws

    # Client 0 draws all 4 of its rows, client 1 two of its 5, client 2 all 3.
    positions = np.array([2, 0, 3, 1, 4, 1, 1, 2, 0])
    counts, sizes = np.array([4, 2, 3]), np.array([4, 5, 3])
    order = ascending_draws(positions, counts, sizes)
    np.testing.assert_array_equal(order, [1, 3, 0, 2, 0, 1, 2, 0, 1])
    starts = np.repeat([0, 4, 6], counts)
    np.testing.assert_array_equal(positions[starts + order][:4], np.arange(4))
    np.testing.assert_array_equal(positions[starts + order][6:], np.arange(3))


def test_ring_margin_offsets_are_the_offsets_of_the_margins():
    """The fast offsets and span sums (weighted sums of ring slots) equal margin_offsets
    and span_sums of the directions' margins, with absent (-1) and repeated slots."""
    from hyfl.algorithms.hyfdca_groups import (
        directions_margins,
        margin_offsets,
        ring_margin_offsets,
        ring_span_sums,
        span_sums,
    )

    rng = np.random.default_rng(0)
    ring = rng.normal(size=(50, 6, 3))
    samples = rng.choice(50, size=20, replace=False)
    pairs = np.array([[0, -1], [1, 0], [3, 1], [-1, -1], [5, 3]])
    transforms = rng.normal(size=(3, 5, 5))
    g = rng.normal(size=(3, 5))
    expected = margin_offsets(directions_margins(ring, samples, pairs), transforms, g)
    column = np.arange(ring.shape[1])  # every slot in its own column
    np.testing.assert_allclose(ring_margin_offsets(ring, samples, pairs, transforms, g, column),
                               expected, rtol=1e-12, atol=1e-12)
    change = rng.normal(size=(20, 3))
    np.testing.assert_allclose(
        ring_span_sums(ring, samples, pairs, change, 7.0, column),
        span_sums(directions_margins(ring, samples, pairs), change, 7.0), rtol=1e-12,
        atol=1e-12)


@pytest.mark.parametrize("outputs", [1, 3])
def test_the_ring_widens_in_place_to_what_a_copy_gives(outputs):
    # SpanHistory.record widens its ring z in place (realloc, then each sample's columns
    # moved up): the result must be what the plain copy gives -- the old columns, then
    # zeros -- and the same array, so no second ring is held at once.
    rng = np.random.default_rng(outputs)
    history = SpanHistory.empty(4, 50, 6, outputs, 3)
    widened = 0
    for t in range(1, 80):
        active = np.flatnonzero(rng.random(4) < 0.3)
        before, old = id(history.z), history.z.copy()
        history.record(t, rng.normal(size=(6, outputs)), active, np.arange(50),
                       rng.normal(size=(50, outputs)))
        if history.z.shape != old.shape:
            widened += 1
            assert id(history.z) == before
            expected = np.zeros((50, history.z.shape[1], outputs))
            expected[:, :old.shape[1]] = old
            written = np.zeros(history.z.shape[1], dtype=bool)
            written[history.z_column[t % history.size]] = True
            np.testing.assert_array_equal(history.z[:, ~written], expected[:, ~written])
    assert widened >= 1


def _widen_once(history, rng, outputs=1):
    """Record rounds until ``history``'s ring widens; return its shape before."""
    for t in range(history.slot_round.max() + 1, history.slot_round.max() + 200):
        shape = history.z.shape
        history.record(t, rng.normal(size=(6, outputs)), np.flatnonzero(rng.random(4) < 0.3),
                       np.arange(50), rng.normal(size=(50, outputs)))
        if history.z.shape != shape:
            return shape
    raise AssertionError("the ring never widened")


@pytest.mark.parametrize("hold", ["view", "weak reference"])
def test_the_ring_is_copied_not_resized_while_something_else_refers_to_it(hold):
    # A view of the ring alive when it widens would dangle after a realloc, and numpy
    # refuses to resize a weakly referenced array: either way the copy is taken, and a
    # view keeps reading the old values.
    import weakref

    rng = np.random.default_rng(7)
    history = SpanHistory.empty(4, 50, 6, 1, 6, size=60)  # widens 6 -> 10 -> ... -> 22
    _widen_once(history, rng)
    ring = history.z
    held = ring[:, :2] if hold == "view" else weakref.ref(ring)
    kept, before = ring.copy(), id(ring)
    del ring
    width = _widen_once(history, rng)[1]
    assert id(history.z) != before and history.z.shape[1] > width
    if hold == "view":
        np.testing.assert_array_equal(held, kept[:, :2])
    else:
        assert held() is None  # the old ring, copied and let go
    del held
    before = id(history.z)
    _widen_once(history, rng)  # nothing else holds it now: in place again
    assert id(history.z) == before


def test_the_engine_widens_its_ring_in_place(monkeypatch):
    # The simulation engine keeps no other reference to the ring when a round records
    # it, so the in-place path is the one taken (the copy would double the ring's peak).
    from hyfl.algorithms import hyfdca_compiled

    calls = []
    spread = hyfdca_compiled.spread_rows
    monkeypatch.setattr(hyfdca_compiled, "spread_rows",
                        lambda *args: (calls.append(args[1:]), spread(*args))[1])
    data = synthetic(seed=3)
    problem = make_problem(data, "hinge", 1e-2)
    partition = grid(problem.n_samples, problem.n_features, 3, 3, seed=0)
    simulate(HyFDCA(history=3), problem, partition, RandomFraction(9, 0.3), 40, seed=0,
             progress=False, eval_every=40)
    assert calls


def test_spread_rows_refuses_a_buffer_too_small():
    from hyfl.algorithms import hyfdca_compiled

    with pytest.raises(IndexError):
        hyfdca_compiled.spread_rows(np.zeros(10), 3, 3, 4)
    flat = np.zeros(12)
    flat[:9] = np.arange(1.0, 10.0)
    hyfdca_compiled.spread_rows(flat, 3, 3, 4)
    np.testing.assert_array_equal(flat, [1, 2, 3, 0, 4, 5, 6, 0, 7, 8, 9, 0])
