"""Partitions, stacked blocks and participation schedules."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import scipy.sparse as sp

from hyfl.errors import HyflError
from hyfl.participation import (
    PARTICIPATIONS,
    Cyclic,
    Full,
    RandomFraction,
    Trace,
    load_trace,
    parse_participation,
)
from hyfl.partition import (
    PARTITIONS,
    Partition,
    StackedBlocks,
    client_block,
    from_blocks,
    grid,
    horizontal,
    nonzero_balanced,
    parse_partition,
    quadrant,
    stack,
    validate,
    vertical,
)


def random_csr(n_samples: int, n_features: int, density: float, seed: int = 0) -> sp.csr_matrix:
    X = sp.random(n_samples, n_features, density=density, format="csr", random_state=seed)
    X.data += 0.5  # no accidental zeros
    return X


def rows_to_samples(stacked: StackedBlocks) -> sp.csr_matrix:
    """(N, R) 0/1 matrix summing the stacked rows of each sample."""
    R = len(stacked.row_sample)
    return sp.csr_matrix(
        (np.ones(R), (stacked.row_sample, np.arange(R))), shape=(stacked.n_samples, R)
    )


def assert_exact_cover(partition: Partition, X: sp.csr_matrix) -> StackedBlocks:
    """Every sample, feature and non-zero is covered, each non-zero once."""
    stacked = stack(partition, X)
    assert np.all(partition.sample_counts() >= 1)
    feature_indptr, _ = partition.clients_of_features()
    assert np.all(np.diff(feature_indptr) >= 1)
    # Every non-zero appears exactly once and the rows of sample i sum to X[i].
    assert stacked.X.nnz == X.nnz
    assert abs(rows_to_samples(stacked) @ stacked.X - X).max() == 0
    # Each row holds only features of its client.
    entry_row = np.repeat(np.arange(stacked.X.shape[0]), np.diff(stacked.X.indptr))
    entry_client = stacked.row_client[entry_row]
    for k in range(partition.n_clients):
        columns = stacked.X.indices[entry_client == k]
        assert np.all(np.isin(columns, partition.features[k]))
    return stacked


@pytest.fixture
def X() -> sp.csr_matrix:
    return random_csr(60, 17, 0.4, seed=1)


# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------


def builder_cases(X):
    N, M = X.shape
    return {
        "horizontal": horizontal(N, M, 7, seed=3),
        "vertical": vertical(N, M, 5),
        "grid": grid(N, M, 4, 3, seed=2),
        "grid-unshuffled": grid(N, M, 4, 3, shuffle=False),
        "nonzero": nonzero_balanced(X, 3, 2, seed=5),
        "blocks": from_blocks(
            [
                (range(0, 30), range(0, 10)),
                (range(0, 30), range(10, 17)),
                (range(30, 60), range(17)),
            ],
            N,
            M,
        ),
    }


@pytest.mark.parametrize(
    "case", ["horizontal", "vertical", "grid", "grid-unshuffled", "nonzero", "blocks"]
)
def test_builders_cover_every_sample_feature_and_nonzero_once(X, case):
    partition = builder_cases(X)[case]
    validate(partition, X)
    assert_exact_cover(partition, X)


def test_quadrant_covers_image_data_with_bias():
    rows, cols, N = 6, 5, 40
    X = random_csr(N, rows * cols, 0.5, seed=4).tolil()
    X = sp.hstack([X, np.full((N, 1), 10.0)]).tocsr()  # bias column of value 10
    partition = quadrant(N, 8, image_shape=(rows, cols), bias_feature=rows * cols, seed=1)
    assert partition.n_features == rows * cols + 1
    assert_exact_cover(partition, X)


def test_grid_layout_and_group_sizes():
    N, M, K, Q = 103, 11, 4, 3
    partition = grid(N, M, K, Q, seed=7)
    assert partition.n_clients == K * Q
    assert partition.name == "grid:4x3"
    sizes = [len(partition.samples[g * Q]) for g in range(K)]
    assert sum(sizes) == N and max(sizes) - min(sizes) <= 1
    widths = [len(partition.features[q]) for q in range(Q)]
    assert widths == [4, 4, 3]
    for g in range(K):
        for q in range(Q):
            k = g * Q + q
            assert np.array_equal(partition.samples[k], partition.samples[g * Q])
            assert np.array_equal(partition.features[k], partition.features[q])
            assert partition.samples[k].dtype == np.int64
            assert np.all(np.diff(partition.samples[k]) > 0)
    # Sample groups are disjoint and cover all samples; features contiguous.
    assert np.array_equal(
        np.sort(np.concatenate([partition.samples[g * Q] for g in range(K)])), np.arange(N)
    )
    assert np.array_equal(partition.features[0], np.arange(4))
    # Seeded: same seed same split, other seed other split, no shuffle contiguous.
    assert np.array_equal(grid(N, M, K, Q, seed=7).samples[0], partition.samples[0])
    assert not np.array_equal(grid(N, M, K, Q, seed=8).samples[0], partition.samples[0])
    assert np.array_equal(grid(N, M, K, Q, shuffle=False).samples[0], np.arange(26))


def test_horizontal_and_vertical_shapes():
    h = horizontal(10, 4, 3)
    assert h.is_horizontal and not h.is_vertical and h.name == "horizontal:3"
    assert np.array_equal(h.client_sizes(), [4, 3, 3])
    assert np.all(h.sample_counts() == 1)
    v = vertical(10, 7, 3)
    assert v.is_vertical and not v.is_horizontal and v.name == "vertical:3"
    assert [list(f) for f in v.features] == [[0, 1, 2], [3, 4], [5, 6]]
    assert np.all(v.sample_counts() == 3)


def test_nonzero_balanced_deals_each_row_evenly(X):
    K, Q = 3, 4
    partition = nonzero_balanced(X, K, Q, seed=0)
    owner = partition.entry_owner
    assert owner.shape == (X.nnz,)
    row_of_entry = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    counts = np.zeros((X.shape[0], K * Q), dtype=int)
    np.add.at(counts, (row_of_entry, owner), 1)
    n_i = np.diff(X.indptr)
    for i in range(X.shape[0]):
        group_clients = np.flatnonzero(counts[i])
        g = group_clients[0] // Q
        # All of a row's entries go to the clients of its sample group ...
        assert np.all(group_clients // Q == g)
        # ... each of the Q gets floor or ceil of n_i / Q, in contiguous chunks.
        share = counts[i, g * Q : (g + 1) * Q]
        assert share.sum() == n_i[i]
        assert share.max() - share.min() <= 1
        assert np.all(np.diff(owner[X.indptr[i] : X.indptr[i + 1]]) >= 0)
    # Every client of a group holds every sample of the group.
    for g in range(K):
        for q in range(Q):
            assert np.array_equal(partition.samples[g * Q + q], partition.samples[g * Q])
    stacked = assert_exact_cover(partition, X)
    assert np.all(stacked.n_holders == Q)


def test_nonzero_balanced_gives_empty_columns_a_holder():
    X = sp.csr_matrix(np.array([[1.0, 0, 2, 0, 3], [4, 0, 5, 6, 0]]))
    partition = nonzero_balanced(X, 1, 2, shuffle=False)
    _, clients = partition.clients_of_features()
    assert_exact_cover(partition, X)
    assert len(clients) >= X.shape[1]  # column 1 (all zero) also has a holder


def test_nonzero_balanced_client_without_entries_is_reported():
    X = sp.csr_matrix(np.array([[1.0, 0, 0, 0], [0, 2.0, 0, 0]]))
    partition = nonzero_balanced(X, 1, 3, shuffle=False)
    with pytest.raises(HyflError, match=r"client \d holds no features.*fewer feature groups"):
        stack(partition, X)


def test_quadrant_layout():
    rows, cols, N, C = 28, 28, 100, 8
    partition = quadrant(N, C, image_shape=(rows, cols), bias_feature=784, seed=0)
    assert partition.n_clients == C and partition.n_features == 785
    G = C // 4
    pixel = np.arange(784).reshape(28, 28)
    expected = [
        pixel[:14, :14].ravel(),
        pixel[:14, 14:].ravel(),
        pixel[14:, :14].ravel(),
        np.append(pixel[14:, 14:].ravel(), 784),
    ]
    for q in range(4):
        for g in range(G):
            k = q * G + g
            assert np.array_equal(partition.features[k], np.sort(expected[q]))
            assert np.array_equal(partition.samples[k], partition.samples[g])
    assert len(partition.features[0]) == 196 and len(partition.features[C - 1]) == 197
    assert 784 not in partition.features[0]
    sizes = partition.client_sizes()
    assert sizes.sum() == 4 * N and sizes.max() - sizes.min() <= 1
    assert np.all(partition.sample_counts() == 4)
    assert quadrant(N, C).n_features == 784


def test_quadrant_rejects_bad_arguments():
    with pytest.raises(HyflError, match="not a multiple of 4"):
        quadrant(100, 10)
    with pytest.raises(HyflError, match="bias_feature=784"):
        quadrant(100, 8, bias_feature=0)
    with pytest.raises(HyflError, match="only 3 samples"):
        quadrant(3, 16)


def test_from_blocks_sorts_ids():
    partition = from_blocks([([2, 0, 1], [1, 0])], 3, 2)
    assert list(partition.samples[0]) == [0, 1, 2]
    assert partition.samples[0].dtype == np.int64
    with pytest.raises(HyflError, match="dtype"):
        from_blocks([(["a"], [0])], 1, 1)


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def dense(rows) -> sp.csr_matrix:
    return sp.csr_matrix(np.array(rows, dtype=float))


def test_empty_client_is_reported():
    X = dense([[1, 2], [3, 4]])
    with pytest.raises(HyflError, match=r"^client 1 holds no samples\. "):
        validate(from_blocks([([0, 1], [0, 1]), ([], [0])], 2, 2), X)
    with pytest.raises(HyflError, match=r"^client 0 holds no features\. "):
        validate(from_blocks([([0, 1], []), ([0, 1], [0, 1])], 2, 2))


def test_uncovered_sample_and_feature_are_named():
    X = sp.csr_matrix((30, 3))
    partition = from_blocks([(range(0, 17), [0, 1, 2]), (range(18, 25), [0, 1, 2])], 30, 3)
    with pytest.raises(HyflError) as error:
        validate(partition, X)
    message = str(error.value)
    assert message.startswith("samples 17, 25, 26, 27, 28 and 1 more (6 in all) are held by no")
    assert "every sample needs at least one holder" in message
    with pytest.raises(HyflError, match=r"^sample 2 is held by no client; every sample needs"):
        validate(from_blocks([([0, 1], [0, 1])], 3, 2))
    with pytest.raises(HyflError, match=r"^feature 1 is held by no client"):
        validate(from_blocks([([0, 1], [0])], 2, 2))


def test_overlapping_blocks_on_a_nonzero_are_reported():
    X = dense([[1, 0, 2], [0, 3, 0]])
    overlap = from_blocks([([0, 1], [0, 1]), ([0], [1, 2]), ([1], [2])], 2, 3)
    # Clients 0 and 1 share (sample 0, feature 1), but X[0, 1] is zero: fine.
    assert_exact_cover(overlap, X)
    clash = from_blocks([([0, 1], [0, 1]), ([0, 1], [1, 2])], 2, 3)
    with pytest.raises(HyflError, match=r"^non-zero X\[1, 1\] is held by clients 0, 1; .*x_i\^T w"):
        stack(clash, X)


def test_uncovered_nonzero_is_reported():
    X = dense([[1, 0, 2], [0, 3, 0]])
    partition = from_blocks([([0], [0, 1, 2]), ([1], [0, 2]), ([0, 1], [])], 2, 3)
    with pytest.raises(HyflError, match="holds no features"):
        validate(partition, X)
    partition = from_blocks([([0], [0, 1, 2]), ([1], [0, 2]), ([0], [1])], 2, 3)
    with pytest.raises(
        HyflError,
        match=r"^non-zero X\[1, 1\] is held by no client.*lost\. "
        r"Give feature 1 to a client holding sample 1",
    ):
        validate(partition, X)


def test_stored_zero_need_not_be_covered():
    X = sp.csr_matrix((np.array([1.0, 0.0]), np.array([0, 1]), np.array([0, 2, 2])), shape=(2, 2))
    assert X.nnz == 2
    partition = from_blocks([([0, 1], [0]), ([1], [1])], 2, 2)
    stacked = stack(partition, X)
    assert stacked.X.nnz == 1


def test_bad_ids_are_reported():
    X = dense([[1, 2], [3, 4]])
    with pytest.raises(HyflError, match=r"^client 0 lists sample id 5, outside 0\.\.1"):
        validate(from_blocks([([0, 5], [0, 1])], 2, 2), X)
    with pytest.raises(HyflError, match=r"^client 0 lists feature id -1, outside"):
        validate(from_blocks([([0, 1], [-1, 0, 1])], 2, 2), X)
    with pytest.raises(HyflError, match=r"^client 0 lists sample 1 more than once"):
        validate(from_blocks([([0, 1, 1], [0, 1])], 2, 2), X)
    unsorted = Partition(2, 2, (np.array([1, 0]),), (np.array([0, 1]),))
    with pytest.raises(HyflError, match="not sorted"):
        validate(unsorted)


def test_shape_mismatch_is_reported():
    partition = grid(5, 3, 1, 1)
    with pytest.raises(HyflError, match=r"^X has shape \(5, 4\) but the partition is for 5"):
        stack(partition, sp.csr_matrix((5, 4)))


def test_entry_owner_is_checked(X):
    partition = nonzero_balanced(X, 2, 2)
    short = Partition(
        partition.n_samples,
        partition.n_features,
        partition.samples,
        partition.features,
        entry_owner=partition.entry_owner[:-1],
    )
    with pytest.raises(HyflError, match=r"^entry_owner has \d+ entries but X stores"):
        stack(short, X)
    owner = partition.entry_owner.copy()
    owner[0] = 99
    with pytest.raises(HyflError, match="outside 0..3"):
        stack(Partition(60, 17, partition.samples, partition.features, owner), X)
    # Entry 0 belongs to sample 0; hand it to a client of the other group.
    owner = partition.entry_owner.copy()
    group = 0 if 0 in partition.samples[0] else 1
    owner[0] = 2 if group == 0 else 0
    with pytest.raises(
        HyflError,
        match=r"^entry X\[0, \d+\] is assigned to client \d, which "
        r"does not hold sample 0",
    ):
        stack(Partition(60, 17, partition.samples, partition.features, owner), X)
    # Feature check: shrink the owner's feature set.
    features = list(partition.features)
    k = int(partition.entry_owner[0])
    features[k] = features[k][features[k] != X.indices[0]]
    with pytest.raises(HyflError, match="which does not hold feature"):
        stack(Partition(60, 17, partition.samples, tuple(features), partition.entry_owner), X)


def test_partition_constructor_sanity():
    with pytest.raises(HyflError, match="sample sets"):
        Partition(2, 2, (np.arange(2),), ())


# ---------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------


def test_parse_partition_forms(X):
    assert parse_partition("horizontal:4", X).name == "horizontal:4"
    assert parse_partition("vertical:3", X).name == "vertical:3"
    assert parse_partition("grid:3x2", X).n_clients == 6
    assert parse_partition("grid:3,2", X).name == "grid:3x2"
    nz = parse_partition("nonzero:2x3", X, seed=4)
    assert nz.entry_owner is not None and nz.n_clients == 6
    image = random_csr(20, 16, 0.5)
    q = parse_partition("quadrant:8", image, meta={"image_shape": (4, 4)})
    assert q.n_clients == 8 and q.n_features == 16
    assert set(PARTITIONS) == {"horizontal", "vertical", "grid", "nonzero", "quadrant"}
    assert all(kind.help for kind in PARTITIONS.values())


@pytest.mark.parametrize(
    "spec", ["grid", "grid:3", "grid:3x", "grid:axb", "mesh:2x2", "horizontal:2x2", "", "grid:-1x2"]
)
def test_bad_partition_specs_show_accepted_forms(X, spec):
    with pytest.raises(HyflError, match=r"horizontal:K, vertical:Q, grid:KxQ"):
        parse_partition(spec, X)


def test_partition_counts_larger_than_data(X):
    with pytest.raises(HyflError, match=r"K is 61 but the data has only 60 samples"):
        parse_partition("horizontal:61", X)
    with pytest.raises(HyflError, match=r"Q is 18 but the data has only 17 features"):
        parse_partition("grid:2x18", X)
    with pytest.raises(HyflError, match="must be >= 1"):
        parse_partition("grid:0x2", X)
    with pytest.raises(HyflError, match="no image shape"):
        parse_partition("quadrant:4", X)
    with pytest.raises(HyflError, match="expects 785 features"):
        parse_partition("quadrant:4", X, meta={"image_shape": (28, 28), "bias_feature": 784})


# ---------------------------------------------------------------------------
# Stacked blocks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["grid", "nonzero", "blocks", "vertical"])
def test_stacked_invariants(X, case):
    partition = builder_cases(X)[case]
    stacked = stack(partition, X)
    K, N = partition.n_clients, partition.n_samples
    R = stacked.X.shape[0]
    assert R == partition.client_sizes().sum()
    assert stacked.X.dtype == np.float64 and stacked.X.shape == (R, partition.n_features)
    # Rows ordered by client, then sample id; every (k, i in I_k) has a row.
    assert np.all(np.diff(stacked.row_client) >= 0)
    for k in range(K):
        rows = slice(stacked.client_rowptr[k], stacked.client_rowptr[k + 1])
        assert np.all(stacked.row_client[rows] == k)
        assert np.array_equal(stacked.row_sample[rows], partition.samples[k])
    # sample_rows lists each sample's rows, ascending.
    for n in range(N):
        rows = stacked.sample_rows[stacked.sample_rowptr[n] : stacked.sample_rowptr[n + 1]]
        assert np.all(stacked.row_sample[rows] == n)
        assert np.all(np.diff(rows) > 0)
    assert np.array_equal(np.sort(stacked.sample_rows), np.arange(R))
    indptr, clients = partition.clients_of_samples()
    assert np.array_equal(stacked.n_holders, np.diff(indptr))
    assert np.array_equal(stacked.n_holders, partition.sample_counts())
    for n in range(N):
        rows = stacked.sample_rows[stacked.sample_rowptr[n] : stacked.sample_rowptr[n + 1]]
        assert np.array_equal(stacked.row_client[rows], clients[indptr[n] : indptr[n + 1]])
    assert (stacked.n_clients, stacked.n_samples, stacked.n_features) == (K, N, X.shape[1])


def test_client_block_matches_local_data(X):
    partition = grid(*X.shape, 3, 2, seed=1)
    stacked = stack(partition, X)
    for k in range(partition.n_clients):
        samples, features, block = client_block(stacked, k)
        expected = X[partition.samples[k]][:, partition.features[k]]
        assert block.shape == (len(samples), len(features))
        assert abs(block - expected).max() == 0 if expected.nnz else block.nnz == 0
    # Non-rectangular: the client blocks put back in place sum to X.
    nz = nonzero_balanced(X, 2, 3)
    stacked = stack(nz, X)
    total = sp.csr_matrix(X.shape)
    for k in range(nz.n_clients):
        samples, features, block = client_block(stacked, k)
        coo = block.tocoo()
        total = total + sp.csr_matrix(
            (coo.data, (samples[coo.row], features[coo.col])), shape=X.shape
        )
    assert abs(total - X).max() == 0
    with pytest.raises(HyflError, match="client 6 does not exist"):
        client_block(stacked, 6)


def test_clients_of_features():
    partition = from_blocks([([0], [0, 2]), ([1], [1, 2]), ([0, 1], [3])], 2, 4)
    indptr, clients = partition.clients_of_features()
    assert list(indptr) == [0, 1, 2, 4, 5]
    assert list(clients) == [0, 1, 0, 1, 2]


def test_empty_rows_are_kept():
    X = dense([[1, 0], [0, 0], [0, 2]])
    stacked = stack(grid(3, 2, 1, 2, shuffle=False), X)
    assert stacked.X.shape == (6, 2)
    assert np.array_equal(np.diff(stacked.X.indptr), [1, 0, 0, 0, 0, 1])


def _python_calls(fn):
    """``fn()`` and the number of calls it made from Python (of Python and C functions)."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, calls


def _random_rows(N: int, M: int = 785, per_row: int = 20, seed: int = 0) -> sp.csr_matrix:
    """An N x M CSR matrix with up to ``per_row`` distinct random columns per row, built
    without a dense matrix."""
    rng = np.random.default_rng(seed)
    columns = np.sort(rng.integers(0, M, size=(N, per_row)), axis=1)
    keep = np.ones(columns.shape, dtype=bool)
    keep[:, 1:] = columns[:, 1:] != columns[:, :-1]
    indptr = np.concatenate([[0], np.cumsum(keep.sum(axis=1))])
    return sp.csr_matrix((rng.random(indptr[-1]) + 0.1, columns[keep], indptr), shape=(N, M))


def test_stack_is_vectorized_its_python_calls_do_not_grow_with_the_data():
    """stack() works on whole arrays: 16 times the samples and non-zeros make no more
    Python calls (a loop over samples, rows or entries would make thousands more); only
    the number of clients may add calls. Its time at MNIST scale is measured by
    benchmarks/bench_hyfdca.py, not here."""
    calls = {}
    for N in (500, 8000):
        X, partition = _random_rows(N), quadrant(N, 20, bias_feature=784)
        stacked, calls[N] = _python_calls(lambda: stack(partition, X))
        assert stacked.X.nnz == X.nnz and stacked.X.shape == (4 * N, X.shape[1])
    assert calls[8000] <= 1.02 * calls[500], calls
    # The counter does see a loop: four times the clients, about four times the calls.
    partition = quadrant(8000, 80, bias_feature=784)
    _, more_clients = _python_calls(lambda: stack(partition, X))
    assert more_clients > 2 * calls[8000]


# ---------------------------------------------------------------------------
# Participation
# ---------------------------------------------------------------------------


def test_full_participation():
    mask = Full(5).active(1, np.random.default_rng(0))
    assert mask.dtype == bool and mask.all() and mask.shape == (5,)


def test_random_fraction_mean_and_reproducibility():
    schedule = RandomFraction(50, 0.3)
    rng = np.random.default_rng(42)
    masks = np.array([schedule.active(t, rng) for t in range(1, 2001)])
    assert masks.shape == (2000, 50) and masks.dtype == bool
    assert abs(masks.mean() - 0.3) < 0.01
    # Each client on its own also has mean p (independent draws).
    assert np.all(np.abs(masks.mean(axis=0) - 0.3) < 0.06)
    again = np.array(
        [schedule.active(t, rng2) for rng2 in [np.random.default_rng(42)] for t in range(1, 2001)]
    )
    assert np.array_equal(masks, again)
    # Exactly one rng.random(n_clients) per round.
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    schedule.active(1, rng_a)
    rng_b.random(50)
    assert rng_a.random() == rng_b.random()


def test_cyclic_order():
    schedule = Cyclic(7, 3)
    rng = np.random.default_rng(0)
    groups = [np.flatnonzero(schedule.active(t, rng)).tolist() for t in range(1, 8)]
    assert groups[:3] == [[0, 1, 2], [3, 4], [5, 6]]
    assert groups[3:6] == groups[:3] and groups[6] == groups[0]
    assert [g.tolist() for g in schedule.groups()] == groups[:3]
    with pytest.raises(HyflError, match="from 1 to 7"):
        Cyclic(7, 8)
    with pytest.raises(HyflError, match="from 1 to 7"):
        Cyclic(7, 0)
    with pytest.raises(HyflError, match="numbered 1, 2"):
        schedule.active(0, rng)


def test_trace_file(tmp_path):
    path = tmp_path / "trace.txt"
    path.write_text("# round per line\n0 2\n1,3\n\n-\n 3, 0 ,1\n\n")
    trace = load_trace(path, 4)
    assert trace.n_clients == 4 and trace.masks.shape == (5, 4)
    rng = np.random.default_rng(0)
    rounds = [np.flatnonzero(trace.active(t, rng)).tolist() for t in range(1, 7)]
    assert rounds == [[0, 2], [1, 3], [], [], [0, 1, 3], [0, 2]]
    schedule = parse_participation(f"trace:{path}", 4)
    assert isinstance(schedule, Trace) and np.array_equal(schedule.masks, trace.masks)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0 1\n2 x\n", r"line 2 has 'x', which is not a client id"),
        ("0 1\n\n4\n", r"line 3 lists client 4, outside 0\.\.3"),
        ("-1\n", r"line 1 lists client -1"),
        ("\n\n", "lists no rounds"),
    ],
)
def test_bad_trace_lines(tmp_path, text, message):
    path = tmp_path / "trace.txt"
    path.write_text(text)
    with pytest.raises(HyflError, match=message):
        load_trace(path, 4)


def test_missing_trace_file(tmp_path):
    with pytest.raises(HyflError, match="cannot be read"):
        parse_participation(f"trace:{tmp_path / 'nope.txt'}", 3)


def test_parse_participation():
    assert isinstance(parse_participation("full", 4), Full)
    assert isinstance(parse_participation("1", 4), Full)
    assert isinstance(parse_participation(1.0, 4), Full)
    assert isinstance(parse_participation(1, 4), Full)
    schedule = parse_participation(0.25, 4)
    assert isinstance(schedule, RandomFraction) and schedule.p == 0.25
    assert parse_participation("0.5", 4) == RandomFraction(4, 0.5)
    assert parse_participation("random:0.5", 4) == RandomFraction(4, 0.5)
    assert parse_participation("cyclic:2", 4) == Cyclic(4, 2)
    assert parse_participation(Cyclic(4, 2), 4) == Cyclic(4, 2)
    assert set(PARTICIPATIONS) == {"full", "random", "cyclic", "trace"}


@pytest.mark.parametrize("p", [0, -0.5, 1.5, float("nan"), "nan", "random:2", "random:x"])
def test_invalid_participation_fraction(p):
    with pytest.raises(HyflError, match=r"^participation fraction p must be in \(0, 1\], got"):
        parse_participation(p, 4)


@pytest.mark.parametrize("spec", ["sometimes", "cyclic:x", "cyclic:9", "full:2", None])
def test_bad_participation_specs(spec):
    with pytest.raises(HyflError):
        parse_participation(spec, 4)


def test_schedule_for_other_client_count_is_refused():
    with pytest.raises(HyflError, match="is for 3 clients but the partition has 4"):
        parse_participation(Full(3), 4)


# ----------------------------------------------------------------------------- skewed samples


def _skew_labels(n=3000, n_classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, n_classes, size=n).astype(float)


def _groups(partition, Q):
    """The sample groups of a grid (every Q-th client) as arrays."""
    return [partition.samples[g * Q] for g in range(partition.n_clients // Q)]


def _assert_covers_once(groups, n):
    everything = np.concatenate(groups)
    np.testing.assert_array_equal(np.sort(everything), np.arange(n))
    assert all(g.size > 0 for g in groups)


def test_label_skew_gives_each_group_k_classes():
    y = _skew_labels()
    p = parse_partition("grid:5x2@classes:2", np.zeros((y.size, 6)), seed=3, labels=y)
    groups = _groups(p, 2)
    _assert_covers_once(groups, y.size)
    assert [np.unique(y[g]).size for g in groups] == [2] * 5
    assert p.name == "grid:5x2@classes:2" and p.n_clients == 10
    # Every class is held, and its samples are divided evenly among its holders.
    for c in range(10):
        sizes = [np.sum(y[g] == c) for g in groups if np.sum(y[g] == c)]
        assert sum(sizes) == np.sum(y == c) and max(sizes) - min(sizes) <= 1
    again = parse_partition("grid:5x2@classes:2", np.zeros((y.size, 6)), seed=3, labels=y)
    assert all(np.array_equal(a, b) for a, b in zip(p.samples, again.samples, strict=True))


def test_dirichlet_alpha_moves_from_skewed_to_uniform():
    y = _skew_labels()
    X = np.zeros((y.size, 3))

    def classes_per_group(alpha):
        p = parse_partition(f"horizontal:8@dirichlet:{alpha}", X, seed=0, labels=y)
        _assert_covers_once(list(p.samples), y.size)
        return np.mean([np.unique(y[g]).size for g in p.samples]), p

    few, _ = classes_per_group(0.05)
    many, uniform = classes_per_group(1000)
    assert few < 5 and many == 10
    # With a large alpha each class is split almost evenly: every group gets about 1/8.
    for c in range(10):
        shares = np.array([np.sum(y[g] == c) for g in uniform.samples]) / np.sum(y == c)
        assert np.max(np.abs(shares - 1 / 8)) < 0.03


def test_lognormal_sizes_vary_and_cover():
    y = _skew_labels(4000)
    p = parse_partition("horizontal:20@lognormal:1.5", np.zeros((y.size, 2)), seed=0)
    sizes = np.array([g.size for g in p.samples])
    _assert_covers_once(list(p.samples), y.size)
    assert sizes.max() > 4 * sizes.min()  # skewed; the balanced split differs by at most 1
    assert p.name == "horizontal:20@lognormal:1.5"


def test_a_tiny_share_still_leaves_no_group_empty():
    y = np.array([0.0] * 30 + [1.0] * 2)
    p = parse_partition("horizontal:12@dirichlet:0.01", np.zeros((32, 2)), seed=1, labels=y)
    _assert_covers_once(list(p.samples), 32)


@pytest.mark.parametrize("spec, labels, needle", [
    ("grid:2x2@dirichlet:0.5", None, "needs the training labels"),
    ("grid:2x2@classes:0", np.zeros(40), "is not understood"),
    ("grid:2x2@classes:1.5", np.zeros(40), "is not understood"),
    ("grid:2x2@zipf:2", np.zeros(40), "is not understood"),
    ("grid:2x2@classes:3", np.repeat([0.0, 1.0], 20), "asks for 3 classes per group"),
    ("vertical:2@lognormal:1", None, "has no skewed sample split"),
])
def test_sample_split_errors_name_the_fix(spec, labels, needle):
    with pytest.raises(HyflError, match=needle):
        parse_partition(spec, np.zeros((40, 4)), labels=labels)
