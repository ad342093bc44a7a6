"""HyFDCA: the vectorized engine against the slow reference, and convergence."""

import numpy as np
import pytest
import scipy.sparse as sp

from hyfl.algorithms.base import draw_local_samples
from hyfl.algorithms.hyfdca import HyFDCA, local_steps_from_iic
from hyfl.data.dataset import Dataset
from hyfl.errors import HyflError
from hyfl.participation import Cyclic, Full, RandomFraction
from hyfl.partition import from_blocks, grid, horizontal, nonzero_balanced, stack, vertical
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import random_streams, simulate
from reference_hyfdca import ReferenceHyFDCA
from synthetic_data import synthetic


def run_both(problem, partition, participation, cfg, rounds, seed=3):
    """Run engine and reference side by side; compare iterates every round."""
    blocks = stack(partition, problem.X)
    state = cfg.setup(problem, blocks)
    ref = ReferenceHyFDCA(problem, partition, cfg)
    part_rng_e, alg_rng_e = random_streams(seed)
    part_rng_r, alg_rng_r = random_streams(seed)
    accepted = []
    for t in range(1, rounds + 1):
        active_e = participation.active(t, part_rng_e)
        active_r = participation.active(t, part_rng_r)
        state = cfg.round(state, active_e, alg_rng_e)
        accepted.append(ref.round(active_r, alg_rng_r))
        np.testing.assert_allclose(state.alpha, ref.alpha, atol=1e-10, rtol=0)
        np.testing.assert_allclose(state.w, ref.w, atol=1e-10, rtol=0)
        for c in ref.clients:  # each client's copy of its own duals
            rows = slice(blocks.client_rowptr[c.k], blocks.client_rowptr[c.k + 1])
            np.testing.assert_allclose(state.alpha_local[rows], c.alpha, atol=1e-10, rtol=0)
        if cfg.step_rule == "safe":
            assert state.beta == pytest.approx(ref.beta, rel=1e-12)
    return state, ref, accepted


CASES = {
    "grid-half-safe-hinge": (
        "hinge",
        lambda n, m, X: grid(n, m, 3, 3, seed=1),
        lambda K: RandomFraction(K, 0.5),
        HyFDCA(local_steps=4, step_rule="safe"),
    ),
    "grid-half-theory-logistic": (
        "logistic",
        lambda n, m, X: grid(n, m, 3, 2, seed=1),
        lambda K: RandomFraction(K, 0.6),
        HyFDCA(local_steps=5, step_rule="theory", gamma="1/t"),
    ),
    "grid-paper-hinge-refresh": (
        "hinge",
        lambda n, m, X: grid(n, m, 2, 3, seed=2),
        lambda K: RandomFraction(K, 0.5),
        HyFDCA(local_steps=6, step_rule="paper", refresh_inner_products=True),
    ),
    "nonzero-split-squared": (
        "squared",
        lambda n, m, X: nonzero_balanced(X, 3, 3, seed=0),
        lambda K: RandomFraction(K, 0.7),
        HyFDCA(local_steps=5, step_rule="safe"),
    ),
    "vertical-cyclic-smoothed": (
        "smoothed_hinge",
        lambda n, m, X: vertical(n, m, 4),
        lambda K: Cyclic(K, 2),
        HyFDCA(local_steps=8, step_rule="safe"),
    ),
    "horizontal-full-logistic": (
        "logistic",
        lambda n, m, X: horizontal(n, m, 4, seed=0),
        lambda K: Full(K),
        HyFDCA(iic=0.2, step_rule="theory", client_weight="1"),
    ),
    "uneven-blocks-paper-squared": (
        "squared",
        lambda n, m, X: from_blocks(
            [
                (np.arange(0, 70), np.arange(0, 4)),
                (np.arange(0, 70), np.arange(4, m)),
                (np.arange(70, n), np.arange(0, 7)),
                (np.arange(70, n), np.arange(7, m)),
            ],
            n,
            m,
        ),
        lambda K: RandomFraction(K, 0.5),
        HyFDCA(local_steps=2, step_rule="paper"),
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_engine_reproduces_the_slow_reference(case):
    loss, make_partition, make_participation, cfg = CASES[case]
    data = synthetic(sparsity=0.3 if "nonzero" in case else 0.0)
    problem = make_problem(data, loss, 0.05)
    partition = make_partition(problem.n_samples, problem.n_features, problem.X)
    state, ref, accepted = run_both(
        problem, partition, make_participation(partition.n_clients), cfg, rounds=25
    )
    assert np.abs(state.alpha).sum() > 0  # something happened


def test_engine_reproduces_reference_on_multiclass():
    data = synthetic(n=90, m=8, classes=3)
    problem = make_problem(data, "hinge", 0.05)
    assert problem.Y.shape == (90, 3)
    partition = grid(90, 8, 3, 2, seed=0)
    run_both(problem, partition, RandomFraction(6, 0.5), HyFDCA(local_steps=5, step_rule="safe"),
             rounds=20)


def test_safe_rule_rejects_and_recovers_on_a_step_that_overshoots():
    # Highly aligned rows and many simultaneous steps: beta = 1 overshoots for
    # the squared loss, so the acceptance test must reject and raise beta.
    rng = np.random.default_rng(0)
    direction = rng.normal(size=8)
    X = np.outer(1 + rng.random(200), direction) + 0.01 * rng.normal(size=(200, 8))
    data = Dataset(sp.csr_matrix(X), rng.normal(size=200), "aligned", task="regression")
    problem = make_problem(data, "squared", 1e-3)
    _, _, accepted = run_both(
        problem, horizontal(200, 8, 4, seed=0), Full(4), HyFDCA(local_steps=20,
                                                                step_rule="safe"), rounds=15
    )
    assert not all(accepted)


def relative_loss_after(problem, partition, participation, cfg, rounds, seed=0):
    optimum = solve_centralized(problem)
    result = simulate(
        cfg,
        problem,
        partition,
        participation,
        rounds,
        seed=seed,
        eval_every=rounds,
        optimum=optimum,
    )
    return result.final


@pytest.mark.parametrize("loss", ["hinge", "logistic", "squared"])
def test_safe_reaches_the_central_optimum_on_a_hybrid_grid(loss):
    problem = make_problem(synthetic(n=400, m=12, seed=1), loss, 1e-2)
    final = relative_loss_after(
        problem, grid(400, 12, 3, 3, seed=0), RandomFraction(9, 0.5), HyFDCA(local_steps=20,
                                                                             step_rule="safe"), 1500
    )
    assert final["relative_loss"] <= 1e-3
    # P - D >= 0 (weak duality), up to the rounding of two sums at the optimum (-4e-17 seen)
    assert -1e-12 <= final["gap"] <= 1e-2 * final["primal"]


@pytest.mark.parametrize("loss", ["hinge", "logistic", "squared"])
def test_safe_reaches_the_optimum_horizontal_random_half(loss):
    problem = make_problem(synthetic(n=400, m=12, seed=1), loss, 1e-2)
    final = relative_loss_after(
        problem,
        horizontal(400, 12, 4, seed=0),
        RandomFraction(4, 0.5),
        HyFDCA(local_steps=20, step_rule="safe"),
        1500,
    )
    assert final["relative_loss"] <= 1e-3


@pytest.mark.parametrize("loss", ["hinge", "logistic", "squared"])
def test_safe_reaches_the_optimum_vertical_cyclic(loss):
    problem = make_problem(synthetic(n=400, m=12, seed=1), loss, 1e-2)
    final = relative_loss_after(
        problem, vertical(400, 12, 4), Cyclic(4, 2), HyFDCA(local_steps=40, step_rule="safe"), 1500
    )
    assert final["relative_loss"] <= 1e-3


def test_theory_rule_increases_the_dual_monotonically_with_full_participation():
    problem = make_problem(synthetic(n=200, m=10, seed=2), "hinge", 1e-2)
    cfg = HyFDCA(local_steps=10, step_rule="theory")
    result = simulate(cfg, problem, grid(200, 10, 2, 2, seed=0), Full(4), 60, eval_every=1)
    dual = result.column("dual")
    assert np.all(np.diff(dual) >= -1e-12)
    assert dual[-1] > dual[0]


def test_iterates_are_reproducible_for_a_seed():
    problem = make_problem(synthetic(), "hinge", 0.05)
    part = grid(problem.n_samples, problem.n_features, 3, 3, seed=0)
    runs = [
        simulate(HyFDCA(local_steps=3, step_rule="safe"), problem, part, RandomFraction(9, 0.5),
                 30, seed=7)
        for _ in range(2)
    ]
    np.testing.assert_array_equal(runs[0].weights, runs[1].weights)
    other = simulate(HyFDCA(local_steps=3, step_rule="safe"), problem, part,
                     RandomFraction(9, 0.5), 30, seed=8)
    assert not np.array_equal(runs[0].weights, other.weights)


def test_local_sampling_is_uniform_without_replacement():
    rng = np.random.default_rng(0)
    sizes = np.array([5, 7, 3, 40, 400, 90])
    # "take all", most of a client (sort keys), and many draws (first distinct)
    counts = np.array([2, 7, 1, 35, 60, 0])
    hits = [np.zeros(n) for n in sizes]
    for _ in range(3000):
        pos = draw_local_samples(rng, sizes, counts)
        start = 0
        for k, (n, h) in enumerate(zip(sizes, counts)):
            chunk = pos[start : start + h]
            start += h
            assert len(set(chunk.tolist())) == h and np.all((chunk >= 0) & (chunk < n))
            hits[k][chunk] += 1
    for k, (n, h) in enumerate(zip(sizes, counts)):
        np.testing.assert_allclose(hits[k] / 3000, h / n, atol=0.04)


def test_round_trips_follow_the_paper_counts():
    problem = make_problem(synthetic(), "hinge", 0.05)
    n, m = problem.n_samples, problem.n_features
    paper = HyFDCA(local_steps=2, step_rule="paper")
    hybrid = simulate(paper, problem, grid(n, m, 3, 3), RandomFraction(9, 0.5), 40)
    per_round = np.diff(hybrid.column("round_trips"))
    assert np.median(per_round) == 4.5  # the paper's count with partial participation
    full = simulate(paper, problem, grid(n, m, 3, 3), Full(9), 10)
    assert np.all(np.diff(full.column("round_trips"))[1:] == 3.0)
    horiz = simulate(paper, problem, horizontal(n, m, 3), Full(3), 10)
    assert np.all(np.diff(horiz.column("round_trips"))[1:] == 2.0)


def test_hyperparameters_are_validated():
    with pytest.raises(HyflError, match="step_rule"):
        HyFDCA(step_rule="fast").validated()
    with pytest.raises(HyflError, match="local_steps"):
        HyFDCA(local_steps=0).validated()
    with pytest.raises(HyflError, match="gamma"):
        HyFDCA(gamma=2.0).validated()
    with pytest.raises(HyflError, match="iic"):
        HyFDCA(iic=-1).validated()
    with pytest.raises(HyflError, match="history_window.*history_window=4"):
        HyFDCA(history_window=1).validated()
    # a huge window would ask for gigabytes of Gram boxes: refused, not allocated
    with pytest.raises(HyflError, match="history_window must be <= 64"):
        HyFDCA(history_window=10**9).validated()
    with pytest.raises(HyflError, match="history_window must be <= 64"):
        HyFDCA(history_window="1e9").validated()  # a numeric string is a number
    assert HyFDCA(history_window="4.0").validated().history_slots(1000, 30, 1) == 124
    # a string is truthy: "no" must not switch the certificate on
    with pytest.raises(HyflError, match="certify must be true or false, got 'no'"):
        HyFDCA(certify="no").validated()
    with pytest.raises(HyflError, match="refresh_inner_products must be true or false"):
        HyFDCA(refresh_inner_products=1).validated()
    assert local_steps_from_iic(7.434e-4, 49990, 144) == 1
    assert local_steps_from_iic(0.07564, 7770, 144) == 5


def test_the_history_window_sets_the_ring_of_remembered_rounds():
    """``history_window`` is the ring's multiple of ``history`` (at least two), capped where
    the ring would exceed HISTORY_RING_BYTES; the ring never has a multiple of 64 slots."""
    from hyfl.algorithms.hyfdca import HISTORY_RING_BYTES, HISTORY_WINDOW

    assert HyFDCA().history_slots(1000, 30, 1) == HISTORY_WINDOW * 31
    assert HyFDCA(history_window=4).history_slots(1000, 30, 1) == 4 * 31
    assert HyFDCA(history=8, history_window=3).history_slots(1000, 30, 1) == 24
    assert HyFDCA(history=16, history_window=4).history_slots(1000, 30, 1) == 65  # not 64
    huge = HISTORY_RING_BYTES // 8  # samples whose ring of even 2 slots is too big
    assert HyFDCA(history=5, history_window=4).history_slots(huge, 30, 1) == 10


def test_distinct_equals_np_unique_dense_or_sparse():
    """The compiled distinct (a mark-and-scan for dense ids, a sort otherwise) returns
    what np.unique does: ascending distinct values, same dtype."""
    from hyfl.algorithms import hyfdca_kernels

    rng = np.random.default_rng(0)
    cases = [rng.integers(0, N, size=n) for n, N in
             [(10, 10**6), (300_000, 50_000), (5, 5), (0, 1), (1, 7), (1000, 2000)]]
    cases += [np.array([-5, 3, -5, 2]), np.arange(10), np.arange(10)[::-1].copy(),
              rng.integers(0, 100, size=50).astype(np.int32)]
    for values in cases:
        got, expected = hyfdca_kernels.distinct(values), np.unique(values)
        assert got.dtype == expected.dtype and np.array_equal(got, expected)


def test_positions_in_equals_searchsorted_for_present_queries():
    """The lookup-table positions equal np.searchsorted's where every query occurs."""
    from hyfl.algorithms import hyfdca_kernels

    rng = np.random.default_rng(1)
    for N, n, q in [(50_000, 20_000, 300_000), (10**7, 50, 200), (10, 10, 0), (5, 3, 7)]:
        values = np.unique(rng.integers(0, N, size=n))
        queries = rng.choice(values, size=q)
        np.testing.assert_array_equal(hyfdca_kernels.positions_in(values, queries),
                                      np.searchsorted(values, queries))
    with pytest.raises(IndexError):  # a query past the values is refused, not read astray
        hyfdca_kernels.positions_in(np.arange(100, 200), np.array([150, 250]))


def test_distinct_in_runs_equals_np_unique_of_the_joined_runs():
    """The active clients' distinct samples, read in their runs of rows in place, equal
    np.unique of the joined rows (same dtype), empty runs and overlaps included."""
    from hyfl.algorithms import hyfdca_kernels

    rng = np.random.default_rng(2)
    values = rng.integers(0, 400, size=3000).astype(np.int32)
    for starts, sizes in [([0, 1000, 2500], [300, 0, 500]), ([10, 20], [50, 50]), ([5], [0]),
                          ([0], [3000]), ([], [])]:
        starts, sizes = np.array(starts, dtype=np.int64), np.array(sizes, dtype=np.int64)
        joined = np.concatenate([values[a:a + n] for a, n in zip(starts, sizes)] + [values[:0]])
        got = hyfdca_kernels.distinct_in_runs(values, starts, sizes, 400)
        assert got.dtype == values.dtype and np.array_equal(got, np.unique(joined))
    with pytest.raises(IndexError):  # a value past the bound is refused, not written astray
        hyfdca_kernels.distinct_in_runs(values, np.array([0]), np.array([3000]), 399)


def test_local_passes_through_the_samples_equal_the_gathered_norms():
    """Reading every sample's norm through the drawn samples gives the passes of the
    gathered norms, and its per-client sums add in np.bincount's order (same bits)."""
    from hyfl.algorithms import hyfdca_compiled
    from hyfl.algorithms.hyfdca_local import local_passes

    rng = np.random.default_rng(3)
    sq_norms = rng.gamma(2.0, 30.0, size=500)
    samples = rng.integers(0, 500, size=900).astype(np.int32)
    segments = np.array([0, 0, 100, 850, 900])
    for lam_n in (0.5, 7.0, 400.0):
        np.testing.assert_array_equal(
            local_passes(sq_norms, segments, lam_n, samples=samples),
            local_passes(sq_norms[samples], segments, lam_n))
    counts = np.diff(segments)
    np.testing.assert_array_equal(
        hyfdca_compiled.segment_gather_sums(sq_norms, samples, segments),
        np.bincount(np.repeat(np.arange(counts.size), counts), weights=sq_norms[samples],
                    minlength=counts.size))


def test_busiest_client_share_equals_the_share_of_their_rows():
    """The busiest client's share from its runs of rows equals _busiest_share of the
    joined rows (every row of the given clients)."""
    from hyfl.algorithms.hyfdca import _busiest_client_share, _busiest_share

    X = sp.random(60, 12, density=0.3, random_state=5, format="csr")
    blocks = stack(grid(60, 12, 3, 2, seed=0), X)
    rowptr = blocks.client_rowptr
    for clients in ([0, 2, 5], [4], [], list(range(blocks.n_clients))):
        clients = np.array(clients, dtype=np.int64)
        rows = np.concatenate([np.arange(rowptr[k], rowptr[k + 1]) for k in clients]
                              + [np.zeros(0, dtype=np.int64)])
        assert _busiest_client_share(blocks, clients) == _busiest_share(blocks, rows,
                                                                       clients.size)


def test_rows_updated_after_equals_the_scan_of_every_row():
    """The clients' rows whose sample changed after a per-client round, read in their
    runs, equal the NumPy scan of every row of theirs (ascending, int64)."""
    from hyfl.algorithms import hyfdca_kernels

    rng = np.random.default_rng(6)
    X = sp.random(80, 10, density=0.4, random_state=7, format="csr")
    blocks = stack(grid(80, 10, 4, 2, seed=1), X)
    updated_at = rng.integers(0, 9, size=80)
    rowptr = blocks.client_rowptr
    for clients in ([1, 4, 6], [0], [], list(range(blocks.n_clients))):
        clients = np.array(clients, dtype=np.int64)
        after = rng.integers(0, 9, size=clients.size)
        rows = [np.arange(rowptr[k], rowptr[k + 1]) for k in clients]
        expected = np.concatenate(
            [r[updated_at[blocks.row_sample[r]] > a] for r, a in zip(rows, after)]
            + [np.zeros(0, dtype=np.int64)])
        got = hyfdca_kernels.rows_updated_after(blocks, clients, after, updated_at)
        assert got.dtype == np.int64 and np.array_equal(got, expected)


def test_compiled_row_kernels_equal_numpy_bit_for_bit():
    """The in-place gathers of the cocoa round equal the NumPy they replace exactly:
    X[rows].T @ values[slot], target[rows] += values[slot], the clients holding some
    samples, each sample's first active holder and the weighted ring slots."""
    import scipy.sparse as sp

    from hyfl.algorithms import hyfdca_kernels
    from hyfl.partition import grid, stack

    rng = np.random.default_rng(2)
    X = sp.random(60, 9, density=0.5, random_state=3, format="csr")
    blocks = stack(grid(60, 9, 3, 3, seed=0), X)
    rows = rng.choice(blocks.X.shape[0], size=40, replace=False)
    values = rng.normal(size=(25, 2))
    slot = rng.integers(0, 25, size=40)
    np.testing.assert_array_equal(
        hyfdca_kernels.rows_transpose_product(blocks.X, rows, values, slot),
        hyfdca_kernels.rows_transpose_product(blocks.X, rows, values[slot]))
    np.testing.assert_array_equal(
        hyfdca_kernels.rows_transpose_product(blocks.X, rows, values[slot]),
        np.asarray(blocks.X[rows].T @ values[slot]))
    target = rng.normal(size=(blocks.X.shape[0], 2))
    expected = target.copy()
    expected[rows] += values[slot]
    hyfdca_kernels.add_rows(target, rows, values, slot)
    np.testing.assert_array_equal(target, expected)

    samples = rng.choice(60, size=7, replace=False)
    holder, holder_slot, client = hyfdca_kernels.holder_rows(blocks, samples)
    for j, s in enumerate(samples):  # the holders' rows in sample_rows order, sample by sample
        mine = blocks.sample_rows[blocks.sample_rowptr[s]:blocks.sample_rowptr[s + 1]]
        at = np.flatnonzero(holder_slot == j)
        np.testing.assert_array_equal(holder[at], mine)
        np.testing.assert_array_equal(
            client[at], np.searchsorted(blocks.client_rowptr, mine, side="right") - 1)
    some = rng.random(blocks.n_clients) < 0.5  # only some clients' rows: the masked ones
    for got, full in zip(hyfdca_kernels.holder_rows(blocks, samples, some),
                         (holder, holder_slot, client)):
        np.testing.assert_array_equal(got, full[some[client]])
    held = np.zeros(blocks.n_clients, dtype=bool)
    held[client] = True
    np.testing.assert_array_equal(hyfdca_kernels.holding_clients(blocks, samples), held)
    active = rng.random(blocks.n_clients) < 0.5
    first_rows, first_clients = hyfdca_kernels.first_active_holders(blocks, samples, active)
    for j, s in enumerate(samples):  # the first of the sample's holder rows that is active
        mine = blocks.sample_rows[blocks.sample_rowptr[s]:blocks.sample_rowptr[s + 1]]
        owners = np.searchsorted(blocks.client_rowptr, mine, side="right") - 1
        on = np.flatnonzero(active[owners])
        assert (first_rows[j], first_clients[j]) == ((mine[on[0]], owners[on[0]]) if on.size
                                                     else (-1, -1))

    ring = rng.normal(size=(60, 8, 2))
    slots = np.array([0, 3, 5])
    weights = rng.normal(size=(8, 2))
    out = np.zeros((samples.size, 2))
    for s in slots:
        out += ring[samples, s] * weights[s]
    np.testing.assert_array_equal(
        hyfdca_kernels.weighted_slot_sums(ring, samples, slots, weights), out)


@pytest.mark.parametrize("n_outputs", [1, 3])
@pytest.mark.parametrize("n", [3, 9, 130, 1000])
def test_slot_change_sums_add_as_numpy_does(n, n_outputs):
    """The compiled span sums equal the NumPy loop over the ring's columns bit for bit:
    pairwise for one output (np.sum's order), row after row for several."""
    from hyfl.algorithms import hyfdca_compiled, hyfdca_kernels

    rng = np.random.default_rng(n)
    ring = rng.normal(size=(2000, 12, n_outputs))
    samples = rng.choice(2000, n, replace=False)
    columns = np.array([3, 0, 7, 11])
    change = rng.normal(size=(n, n_outputs))
    expected = np.stack([np.sum(ring[samples, c] * change, axis=0) for c in columns])
    np.testing.assert_array_equal(
        hyfdca_kernels.slot_change_sums(ring, samples, columns, change), expected)
    for size in (1, 7, 8, 127, 128, 129, 257, 1000, 4167, 100_003):
        values = rng.normal(size=size)
        assert hyfdca_compiled.pairwise_sum(values, 0, size) == np.sum(values)
