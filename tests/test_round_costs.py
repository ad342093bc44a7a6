"""Per-round communication and compute statistics of the baselines, counted by hand.

Every baseline reports, per outer iteration, the floats and integer ids that
cross the network in each direction, the busiest active client's share of the
client work and the server's wall time (see the "Communication" paragraphs of
``hyfl.algorithms.local_sgd``, ``fedbcd`` and ``fedhybrid``). The data are a
12 x 6 matrix whose stored non-zeros per row are chosen so that the work
shares can be computed by hand.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from hyfl.algorithms import ALGORITHMS, make_algorithm
from hyfl.data.dataset import Dataset
from hyfl.partition import from_blocks, grid, horizontal, stack, vertical
from hyfl.problem import make_problem

N, M = 12, 6
COST_KEYS = (
    "round_trips",
    "floats_up",
    "floats_down",
    "ids_up",
    "ids_down",
    "client_share_max",
    "server_seconds",
)


def dense_data(classes=2):
    """12 x 6, every entry non-zero (so a row of a client holds all its features)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0.5, 1.5, size=(N, M)) * np.where(rng.random((N, M)) < 0.5, -1.0, 1.0)
    if classes == 2:
        return Dataset(sp.csr_matrix(X), np.where(np.arange(N) % 2, 1.0, -1.0), "tiny")
    return Dataset(sp.csr_matrix(X), np.arange(N) % classes, "tiny3", task="multiclass")


def problem(loss="logistic", classes=2, X=None):
    data = dense_data(classes)
    if X is not None:
        data = Dataset(sp.csr_matrix(X), data.y, data.name, task=data.task)
    return make_problem(data, loss, 0.1)


def mask(*clients, K):
    active = np.zeros(K, dtype=bool)
    active[list(clients)] = True
    return active


def one_round(name, hyper, prob, partition, *actives, seed=0):
    """Set up and run one round per given mask; return the stats of every round."""
    algorithm = make_algorithm(name, hyper)
    state = algorithm.setup(prob, stack(partition, prob.X))
    rng = np.random.default_rng(seed)
    stats = []
    for active in actives:
        state = algorithm.round(state, active, rng)
        stats.append(dict(algorithm.round_stats(state)))
    return stats


# Two clients on all samples with 4 and 2 of the 6 features: with dense data
# every row of client 0 holds 4 non-zeros and every row of client 1 holds 2.
UNEVEN = from_blocks([(range(N), range(4)), (range(N), range(4, M))], N, M)


# ---------------------------------------------------------------------------
# FedAvg / HyFEM
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fedavg", "hyfem", "hyfem-avg"])
@pytest.mark.parametrize("classes", [2, 3])
def test_local_sgd_sends_the_active_clients_feature_blocks(name, classes):
    prob = problem("hinge", classes)
    C = prob.Y.shape[1]
    partition = grid(N, M, 2, 2, seed=1)  # features {0,1,2} and {3,4,5}
    (stats,) = one_round(name, {"local_steps": 3}, prob, partition, mask(0, 3, K=4))
    size = [len(f) for f in partition.features]
    assert size == [3, 3, 3, 3]
    # w_0[M_k] down and w_k up, for k in {0, 3}; HyFEM exchanges nothing more.
    assert stats["floats_up"] == stats["floats_down"] == (size[0] + size[3]) * C == 6 * C
    assert stats["ids_up"] == stats["ids_down"] == 0.0
    assert stats["round_trips"] == 1.0
    # Both clients' rows hold 3 non-zeros and each takes 3 steps: an even split.
    assert stats["client_share_max"] == 0.5
    assert stats["server_seconds"] > 0.0


def test_local_sgd_share_follows_the_drawn_rows_non_zeros():
    prob = problem("hinge", 3)
    (stats,) = one_round("fedavg", {"local_steps": 5}, prob, UNEVEN, mask(0, 1, K=2))
    # Every draw of client 0 touches 4 non-zeros, of client 1 two: 5*4 / (5*4 + 5*2).
    assert stats["client_share_max"] == pytest.approx(2 / 3, rel=1e-15)
    assert stats["floats_up"] == stats["floats_down"] == (4 + 2) * 3


def test_local_sgd_share_counts_empty_rows_as_no_work():
    # Client 1 holds features 4, 5, which are zero in every row: it does no work.
    X = dense_data().X.toarray()
    X[:, 4:] = 0.0
    prob = problem("hinge", X=X)
    (stats,) = one_round("fedavg", {"local_steps": 2}, prob, UNEVEN, mask(0, 1, K=2))
    assert stats["client_share_max"] == 1.0
    assert stats["floats_up"] == 6.0  # the weights of feature 4, 5 still travel


# ---------------------------------------------------------------------------
# FedBCD family
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("classes", [2, 3])
def test_fedbcd_parallel_margins_and_batch_ids(classes):
    prob = problem("logistic", classes)
    C, S = prob.Y.shape[1], 4
    partition = vertical(N, M, 3)
    stats = one_round(
        "fedbcd-p",
        {"batch_size": S, "local_steps": 2},
        prob,
        partition,
        mask(0, 1, 2, K=3),
        mask(0, 2, K=3),
        mask(0, K=3),
    )
    full, two, one = stats
    # Full: every party gets the S ids, sends S x C margins, receives the sum.
    assert full["ids_down"] == 3 * S and full["ids_up"] == 0.0
    assert full["floats_up"] == full["floats_down"] == 3 * S * C
    assert full["passive_floats_up"] == 0.0 and full["round_trips"] == 1.0
    # Party 1 is absent but trained in round 1: it answers the batch query.
    assert two["floats_down"] == 2 * S * C
    assert two["floats_up"] == 3 * S * C and two["passive_floats_up"] == S * C
    assert two["ids_down"] == 3 * S
    # Parties 1 and 2 are absent and both trained before.
    assert one["floats_down"] == S * C
    assert one["floats_up"] == 3 * S * C and one["passive_floats_up"] == 2 * S * C
    assert one["ids_down"] == 3 * S
    # Every party holds 2 of the 6 features of dense rows: even shares.
    assert full["client_share_max"] == pytest.approx(1 / 3, rel=1e-15)
    assert two["client_share_max"] == 0.5 and one["client_share_max"] == 1.0
    assert all(s["server_seconds"] > 0.0 for s in stats)


def test_fedbcd_parties_that_never_trained_are_not_asked():
    prob = problem("logistic")
    S = 5
    (stats,) = one_round("fedsgd", {"batch_size": S}, prob, vertical(N, M, 3), mask(1, K=3))
    assert stats["passive_floats_up"] == 0.0  # parties 0, 2 still have zero margins
    assert stats["floats_up"] == stats["floats_down"] == stats["ids_down"] == S
    assert stats["client_share_max"] == 1.0 and stats["round_trips"] == 1.0


def test_fedbcd_sequential_hand_offs():
    prob = problem("logistic", 3)
    C, S = 3, 4
    (stats,) = one_round(
        "fedbcd-s", {"batch_size": S, "local_steps": 2}, prob, vertical(N, M, 3), mask(0, 1, 2, K=3)
    )
    # Exchange: 3 S C up; hand-offs 0 -> 1 -> 2: 2 S C more up; each party one sum down.
    assert stats["floats_up"] == (3 + 2) * S * C
    assert stats["floats_down"] == 3 * S * C
    assert stats["ids_down"] == 3 * S and stats["ids_up"] == 0.0
    assert stats["round_trips"] == 3.0


@pytest.mark.parametrize(
    "name, hyper, share",
    [
        # Passes over the batch rows: 1 (exchange) + 2 per step; 4 vs 2 non-zeros a row.
        ("fedbcd-p", {"local_steps": 2}, 4 / 6),
        ("fedpbcd", {"local_steps": 3}, 4 / 6),
        ("fedsgd", {}, 4 / 6),
        # FedBCD-s: party 0 also sends fresh margins at the hand-off (one more
        # pass): 4 S (1 + 2*2 + 1) against 2 S (1 + 2*2) = 24 / 34.
        ("fedbcd-s", {"local_steps": 2}, 12 / 17),
    ],
)
def test_fedbcd_share_by_hand(name, hyper, share):
    prob = problem("logistic")
    (stats,) = one_round(name, {"batch_size": 3, **hyper}, prob, UNEVEN, mask(0, 1, K=2))
    assert stats["client_share_max"] == pytest.approx(share, rel=1e-15)


# ---------------------------------------------------------------------------
# FedHybrid
# ---------------------------------------------------------------------------


def sparse_rows():
    """Client 0's rows (samples 0-3) hold 6 non-zeros, client 1's 3, client 2's 2."""
    X = dense_data().X.toarray()
    X[4:8, 3:] = 0.0
    X[8:, 2:] = 0.0
    return X


@pytest.mark.parametrize("name", ["fedh-g", "fedh-n", "fedh-k"])
@pytest.mark.parametrize("classes", [2, 3])
def test_fedhybrid_sends_x0_down_and_x_lambda_up(name, classes):
    prob = problem("logistic", classes)
    C = prob.Y.shape[1]
    partition = horizontal(N, M, 3, shuffle=False)
    (stats,) = one_round(name, {}, prob, partition, mask(0, 2, K=3))
    assert stats["floats_down"] == 2 * M * C  # x_0 to clients 0 and 2
    assert stats["floats_up"] == 2 * 2 * M * C  # x_i and lambda_i from each
    assert stats["ids_up"] == stats["ids_down"] == 0.0
    assert stats["round_trips"] == 1.0
    assert 0.5 <= stats["client_share_max"] <= 1.0
    assert stats["server_seconds"] > 0.0


@pytest.mark.parametrize(
    "active, share",
    [((0, 1, 2), 24 / (24 + 12 + 8)), ((1, 2), 12 / (12 + 8)), ((2,), 1.0)],
)
def test_fedhybrid_gradient_clients_share_is_their_non_zeros(active, share):
    prob = problem("logistic", X=sparse_rows())
    partition = horizontal(N, M, 3, shuffle=False)
    (stats,) = one_round("fedh-g", {}, prob, partition, mask(*active, K=3))
    assert stats["client_share_max"] == pytest.approx(share, rel=1e-9)


# ---------------------------------------------------------------------------
# Every baseline: keys, bounds, silent rounds
# ---------------------------------------------------------------------------

BASELINES = {
    name: (
        {"local_steps": 2}
        if entry.cls.__name__ in ("FedAvg", "HyFEM")
        else {"batch_size": 4}
        if entry.cls.__name__ == "FedBCD"
        else {}
    )
    for name, entry in ALGORITHMS.items()
    if name != "hyfdca" and not entry.neural  # neural accounting: tests/test_neural_*.py
}


def partition_for(name):
    cls = ALGORITHMS[name].cls.__name__
    if cls == "FedBCD":
        return vertical(N, M, 3)
    if cls in ("FedHybrid", "DiSCO"):
        return horizontal(N, M, 4)
    return grid(N, M, 2, 2, seed=0)


@pytest.mark.parametrize("name", BASELINES)
def test_every_round_reports_costs_within_bounds(name):
    prob = problem("logistic", X=sparse_rows())
    partition = partition_for(name)
    K = partition.n_clients
    rng = np.random.default_rng(5)
    masks = [rng.random(K) < 0.6 for _ in range(6)] + [np.ones(K, dtype=bool)]
    for active, stats in zip(masks, one_round(name, BASELINES[name], prob, partition, *masks)):
        A = int(active.sum())
        assert set(COST_KEYS) <= set(stats)
        if A == 0:
            assert all(stats[key] == 0.0 for key in COST_KEYS)
            continue
        assert 1.0 / A - 1e-12 <= stats["client_share_max"] <= 1.0
        assert stats["floats_up"] > 0 and stats["floats_down"] > 0
        assert stats["server_seconds"] > 0.0 and stats["round_trips"] >= 1.0


@pytest.mark.parametrize("name", BASELINES)
def test_a_round_without_active_clients_costs_nothing(name):
    prob = problem("logistic")
    partition = partition_for(name)
    K = partition.n_clients
    nobody = np.zeros(K, dtype=bool)
    # Also after a round in which everybody trained (FedBCD: no passive answers either).
    first, silent = one_round(
        name, BASELINES[name], prob, partition, np.ones(K, dtype=bool), nobody
    )
    assert first["floats_up"] > 0
    for key in COST_KEYS:
        assert silent[key] == 0.0, key
    assert silent.get("passive_floats_up", 0.0) == 0.0
