"""FedBCD family: the vectorized engine against the slow reference, the paper's behaviour."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_classification

from hyfl.algorithms import ALGORITHMS, make_algorithm
from hyfl.algorithms.fedbcd import DEFAULT_PROX_MU, FedBCD, squared_spectral_norm
from hyfl.data.dataset import Dataset
from hyfl.errors import HyflError
from hyfl.participation import Cyclic, Full, RandomFraction
from hyfl.partition import from_blocks, grid, horizontal, nonzero_balanced, stack, vertical
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import random_streams, simulate
from reference_fedbcd import ReferenceFedBCD


def _maker(name):
    return lambda **options: make_algorithm(name, options)


# The FedBCD family as the central registry defines it.
VARIANTS = {name: _maker(name) for name, entry in ALGORITHMS.items() if entry.cls is FedBCD}
fedsgd, fedbcd_p, fedpbcd = VARIANTS["fedsgd"], VARIANTS["fedbcd-p"], VARIANTS["fedpbcd"]


def synthetic(n=120, m=10, seed=0, classes=2, unit_rows=False, flip_y=0.01):
    X, y = make_classification(
        n,
        m,
        n_informative=min(8, m),
        n_redundant=0,
        n_classes=classes,
        n_clusters_per_class=1,
        flip_y=flip_y,
        random_state=seed,
    )
    X = (X - X.mean(0)) / X.std(0)
    if unit_rows:
        X /= np.linalg.norm(X, axis=1, keepdims=True)
    if classes == 2:
        return Dataset(sp.csr_matrix(X), np.where(y > 0, 1.0, -1.0), "syn")
    return Dataset(sp.csr_matrix(X), y, "syn3", task="multiclass")


def run_both(problem, partition, participation, cfg, rounds, seed=3):
    """Run engine and reference side by side; compare the model every round."""
    state = cfg.setup(problem, stack(partition, problem.X))
    ref = ReferenceFedBCD(problem, partition, cfg)
    assert state.eta0 == pytest.approx(ref.eta0, rel=1e-12)
    part_rng_e, alg_rng_e = random_streams(seed)
    part_rng_r, alg_rng_r = random_streams(seed)
    for t in range(1, rounds + 1):
        active_e = participation.active(t, part_rng_e)
        active_r = participation.active(t, part_rng_r)
        before = state.w.copy()
        state = cfg.round(state, active_e, alg_rng_e)
        trips = ref.round(active_r, alg_rng_r)
        np.testing.assert_allclose(state.w, ref.w, atol=1e-10, rtol=0)
        assert state.stats["round_trips"] == trips
        # Absent parties do not train: their blocks stay exactly as they were.
        for k in np.flatnonzero(~active_e):
            features = partition.features[k]
            np.testing.assert_array_equal(state.w[features], before[features])
    assert np.abs(state.w).sum() > 0  # something happened
    return state, ref


CONFIGS = {
    "fedsgd": FedBCD("sgd", batch_size=24),
    "fedbcd-p": FedBCD("parallel", local_steps=4, batch_size=24),
    "fedbcd-s": FedBCD("sequential", local_steps=3, batch_size=24),
    "fedpbcd": FedBCD("parallel", local_steps=6, batch_size=24, mu=0.5),
}
PARTICIPATIONS = {"full": lambda K: Full(K), "cyclic": lambda K: Cyclic(K, 2)}
TASKS = {"binary-logistic": (2, "logistic"), "multiclass-logistic": (3, "logistic")}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("participation", PARTICIPATIONS)
@pytest.mark.parametrize("config", CONFIGS)
def test_engine_reproduces_the_slow_reference(config, participation, task):
    classes, loss = TASKS[task]
    problem = make_problem(synthetic(classes=classes), loss, 0.05)
    assert problem.Y.shape[1] == (1 if classes == 2 else 3)
    partition = vertical(problem.n_samples, problem.n_features, 3)
    run_both(problem, partition, PARTICIPATIONS[participation](3), CONFIGS[config], rounds=20)


@pytest.mark.parametrize(
    "loss, cfg",
    [
        ("hinge", FedBCD("parallel", local_steps=3, batch_size=30, eta0=0.5)),
        ("squared", FedBCD("sequential", local_steps=4, batch_size=500, mu=0.2)),
        ("smoothed_hinge", FedBCD("sgd", batch_size=1)),
    ],
)
def test_engine_reproduces_reference_for_other_losses_and_batches(loss, cfg):
    # batch_size 500 > N is capped (full-batch gradient), 1 is plain SGD.
    problem = make_problem(synthetic(classes=3 if loss == "hinge" else 2), loss, 0.05)
    partition = vertical(problem.n_samples, problem.n_features, 4)
    run_both(problem, partition, RandomFraction(4, 0.6), cfg, rounds=15)


def test_engine_reproduces_reference_on_interleaved_uneven_blocks():
    # Parties own scattered feature sets of different sizes; sparse data with
    # samples that are empty in some party's block.
    data = synthetic(n=90, m=9, seed=4)
    X = data.X.toarray()
    X[np.random.default_rng(0).random(X.shape) < 0.4] = 0.0
    problem = make_problem(Dataset(sp.csr_matrix(X), data.y, "sparse"), "logistic", 0.02)
    everyone = np.arange(90)
    partition = from_blocks(
        [(everyone, [0, 4, 8]), (everyone, [1, 2, 5, 6, 7]), (everyone, [3])], 90, 9
    )
    for cfg in (fedbcd_p(local_steps=5, batch_size=20), FedBCD("sequential", batch_size=20)):
        run_both(problem, partition, RandomFraction(3, 0.5), cfg, rounds=15)


# ---------------------------------------------------------------------------
# Behaviour the paper reports
# ---------------------------------------------------------------------------


def rounds_to(result, target):
    """Communication rounds (cumulative round trips) until the relative loss <= target."""
    reached = np.flatnonzero(result.column("relative_loss") <= target)
    return result.column("round_trips")[reached[0]] if reached.size else np.inf


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_local_steps_need_fewer_communication_rounds_than_fedsgd(seed):
    # Same rate for both, as in the paper's comparisons: the default 1 / L and
    # half of it. Measured rounds to a relative loss of 3e-2 (seeds 0, 1, 2):
    # at 1 / L FedBCD-p 15, 18, 11 against FedSGD 83, 32, 47; at 1 / (2L)
    # FedBCD-p 31, 17, 18 against FedSGD > 150, 124, > 150. (With each rate
    # tuned on a grid the two need about the same rounds on this problem:
    # FedSGD at 2-3 / L does what FedBCD-p's five steps do at 0.5-1 / L.)
    problem = make_problem(synthetic(n=600, m=20, seed=seed), "logistic", 1e-2)
    optimum = solve_centralized(problem)
    partition = vertical(600, 20, 4)
    rate = fedsgd().initial_rate(problem)

    def rounds(alg):
        result = simulate(alg, problem, partition, Full(4), 150, seed=seed, optimum=optimum)
        return rounds_to(result, 3e-2)

    local, sgd = rounds(fedbcd_p(local_steps=5)), rounds(fedsgd())
    assert np.isfinite(local) and 1.5 * local <= sgd
    local, sgd = rounds(fedbcd_p(local_steps=5, eta0=rate / 2)), rounds(fedsgd(eta0=rate / 2))
    assert np.isfinite(local) and 3 * local <= sgd


@pytest.mark.parametrize("seed", [0, 1])
def test_proximal_term_keeps_a_large_q_stable(seed):
    # Unit-norm rows, lam 1e-3, default batch 64: with Q = 100 each FedBCD-p
    # party fits its block to one batch against stale partners and the loss
    # stalls an order of magnitude higher; FedPBCD with the paper's mu = 0.1
    # stays where FedBCD-p with Q = 5 gets. Measured mean relative loss over
    # the last 50 rounds (seeds 0, 1): FedBCD-p Q=100 1.7e-1, 2.3e-1;
    # FedPBCD Q=100 4.5e-3, 7.8e-3; FedBCD-p Q=5 6.1e-3, 8.1e-3 (seeds 2-5
    # alike: FedBCD-p Q=100 1.2e-1 to 2.3e-1, FedPBCD 6.1e-3 to 9.9e-3).
    problem = make_problem(synthetic(n=400, m=16, seed=seed, unit_rows=True), "logistic", 1e-3)
    optimum = solve_centralized(problem)
    partition = vertical(400, 16, 4)

    def late_loss(alg):
        result = simulate(
            alg, problem, partition, Full(4), 200, seed=seed, optimum=optimum, eval_every=5
        )
        return result.column("relative_loss")[-10:].mean()

    plain = late_loss(fedbcd_p(local_steps=100))
    proximal = late_loss(fedpbcd(local_steps=100))
    moderate = late_loss(fedbcd_p(local_steps=5))
    assert plain >= 10 * proximal
    assert proximal <= 1.5 * moderate


def test_full_batch_iterates_reach_the_central_optimum():
    # S = N makes FedBCD-p deterministic; it must converge to P*, not just move.
    problem = make_problem(synthetic(n=200, m=12, seed=5), "logistic", 1e-2)
    optimum = solve_centralized(problem)
    result = simulate(
        fedbcd_p(batch_size=10_000),
        problem,
        vertical(200, 12, 3),
        Full(3),
        600,
        optimum=optimum,
        eval_every=600,
    )
    assert 0 <= result.final["relative_loss"] <= 1e-3


# ---------------------------------------------------------------------------
# Protocol details
# ---------------------------------------------------------------------------


def test_round_trips_per_variant():
    problem = make_problem(synthetic(), "logistic", 0.05)
    partition = vertical(problem.n_samples, problem.n_features, 4)
    for alg, schedule, per_round in (
        (fedsgd(), Full(4), 1.0),
        (fedbcd_p(), Cyclic(4, 2), 1.0),
        (FedBCD("sequential"), Full(4), 4.0),  # exchange + 3 hand-offs
        (FedBCD("sequential"), Cyclic(4, 2), 2.0),  # 2 active parties
    ):
        result = simulate(alg, problem, partition, schedule, 6)
        assert np.all(np.diff(result.column("round_trips")) == per_round)
        assert np.all(result.column("exchanges")[1:] == 1.0)
    nobody = np.zeros(4, dtype=bool)
    state = fedbcd_p().setup(problem, stack(partition, problem.X))
    state = fedbcd_p().round(state, nobody, np.random.default_rng(0))
    assert state.stats["round_trips"] == 0.0 and not state.w.any()


def test_one_step_parallel_is_fedsgd_and_one_party_sequential_is_parallel():
    problem = make_problem(synthetic(), "logistic", 0.05)
    n, m = problem.n_samples, problem.n_features
    a = simulate(fedsgd(), problem, vertical(n, m, 3), Full(3), 20, seed=1)
    b = simulate(fedbcd_p(local_steps=1), problem, vertical(n, m, 3), Full(3), 20, seed=1)
    np.testing.assert_array_equal(a.weights, b.weights)
    c = simulate(FedBCD("sequential"), problem, vertical(n, m, 1), Full(1), 20, seed=1)
    d = simulate(FedBCD("parallel"), problem, vertical(n, m, 1), Full(1), 20, seed=1)
    np.testing.assert_allclose(c.weights, d.weights, atol=1e-12, rtol=0)


def test_iterates_are_reproducible_for_a_seed():
    problem = make_problem(synthetic(), "logistic", 0.05)
    partition = vertical(problem.n_samples, problem.n_features, 3)
    runs = [
        simulate(fedbcd_p(), problem, partition, RandomFraction(3, 0.5), 15, seed=7)
        for _ in range(2)
    ]
    np.testing.assert_array_equal(runs[0].weights, runs[1].weights)
    other = simulate(fedbcd_p(), problem, partition, RandomFraction(3, 0.5), 15, seed=8)
    assert not np.array_equal(runs[0].weights, other.weights)


def test_automatic_rate_is_one_over_the_smoothness_constant():
    problem = make_problem(synthetic(), "logistic", 0.05)
    spectral = np.linalg.norm(problem.X.toarray(), 2) ** 2
    assert squared_spectral_norm(problem.X) == pytest.approx(spectral, rel=1e-12)
    expected = 1.0 / (0.25 * spectral / problem.n_samples + 0.05 + 0.1)
    assert fedpbcd().initial_rate(problem) == pytest.approx(expected, rel=1e-12)
    assert fedsgd(eta0=0.3).initial_rate(problem) == 0.3
    # Power iteration (more than 1,000 features) agrees with the dense value.
    rng = np.random.default_rng(0)
    wide = sp.random(300, 1500, density=0.01, random_state=1, format="csr")
    wide.data = rng.normal(size=wide.nnz)
    exact = np.linalg.norm(wide.toarray(), 2) ** 2
    assert squared_spectral_norm(wide) == pytest.approx(exact, rel=1e-4)


# ---------------------------------------------------------------------------
# Refusals and validation
# ---------------------------------------------------------------------------


def test_refuses_a_hybrid_grid_with_a_helpful_message():
    problem = make_problem(synthetic(), "logistic", 0.05)
    n, m = problem.n_samples, problem.n_features
    with pytest.raises(HyflError, match="vertical partition") as error:
        simulate(fedbcd_p(), problem, grid(n, m, 2, 2, seed=0), Full(4), 5)
    message = str(error.value)
    assert "hybrid" in message and "vertical:Q" in message and "hyfdca/fedavg" in message
    assert "every client holds all samples" in message


def test_refuses_a_horizontal_partition_with_a_helpful_message():
    problem = make_problem(synthetic(), "logistic", 0.05)
    n, m = problem.n_samples, problem.n_features
    with pytest.raises(HyflError, match="is horizontal") as error:
        simulate(fedsgd(), problem, horizontal(n, m, 3, seed=0), Full(3), 5)
    assert "fedsgd" in str(error.value) and "vertical:Q" in str(error.value)


def test_refuses_parties_that_share_features():
    # Every client holds all samples, but the non-zero split deals each
    # feature to several clients: there would be no block of w to own.
    data = synthetic(n=60, m=6)
    X = data.X.toarray()
    X[np.random.default_rng(0).random(X.shape) < 0.4] = 0.0
    problem = make_problem(Dataset(sp.csr_matrix(X), data.y, "sparse"), "logistic", 0.05)
    partition = nonzero_balanced(problem.X, 1, 2, seed=0)
    assert partition.is_vertical
    with pytest.raises(HyflError, match="disjoint feature blocks"):
        simulate(fedbcd_p(), problem, partition, Full(2), 5)


@pytest.mark.parametrize(
    "options, culprit",
    [
        ({"variant": "fast"}, "variant"),
        ({"local_steps": 0}, "local_steps"),
        ({"local_steps": 2.5}, "local_steps"),
        ({"variant": "sgd", "local_steps": 5}, "local_steps"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"eta0": -1.0}, "eta0"),
        ({"eta0": "fast"}, "eta0"),
        ({"eta0": float("inf")}, "eta0"),
        ({"mu": -0.1}, "mu"),
        ({"mu": float("nan")}, "mu"),
        ({"mu": "big"}, "mu"),
    ],
)
def test_hyperparameters_are_validated(options, culprit):
    with pytest.raises(HyflError, match=f"^{culprit}"):
        FedBCD(**options).validated()
    problem = make_problem(synthetic(), "logistic", 0.05)
    with pytest.raises(HyflError, match=f"^{culprit}"):  # set-up validates too
        FedBCD(**options).setup(problem, stack(vertical(120, 10, 2), problem.X))


def test_registry_names_and_defaults():
    assert set(VARIANTS) == {"fedsgd", "fedbcd-p", "fedbcd-s", "fedpbcd"}
    made = {name: make() for name, make in VARIANTS.items()}
    assert {name: alg.name for name, alg in made.items()} == {n: n for n in VARIANTS}
    assert made["fedsgd"].steps == 1 and made["fedbcd-p"].steps == 5
    assert made["fedbcd-s"].variant == "sequential"
    assert made["fedpbcd"].variant == "parallel" and made["fedpbcd"].mu == DEFAULT_PROX_MU == 0.1
    assert VARIANTS["fedpbcd"](mu=1.0, local_steps=50).mu == 1.0
    config = made["fedbcd-p"].config()
    assert config["resolved_local_steps"] == 5 and config["eta0"] == "auto"
    for alg in made.values():
        assert alg.validated() is alg
