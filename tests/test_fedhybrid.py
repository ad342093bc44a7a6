"""FedHybrid: the engine against the slow reference, linear convergence, refusals."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_classification

from hyfl.algorithms import ALGORITHMS, make_algorithm
from hyfl.algorithms.fedhybrid import DENSE_MAX_FEATURES, FedHybrid, second_derivative
from hyfl.data.dataset import Dataset
from hyfl.errors import HyflError
from hyfl.losses import get_loss
from hyfl.participation import Full, RandomFraction
from hyfl.partition import grid, horizontal, stack, vertical
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import random_streams, simulate
from reference_fedhybrid import ReferenceFedHybrid, loss_second_derivative

# FedHybrid's variants as the central registry defines them.
VARIANTS = {name for name, entry in ALGORITHMS.items() if entry.cls is FedHybrid}


def variant(name, **overrides):
    return make_algorithm(name, overrides)


def synthetic(n=120, m=8, seed=0, classes=2):
    X, y = make_classification(
        n,
        m,
        n_informative=min(6, m),
        n_redundant=0,
        n_classes=classes,
        n_clusters_per_class=1,
        random_state=seed,
    )
    X = (X - X.mean(0)) / X.std(0)
    if classes == 2:
        return Dataset(sp.csr_matrix(X), np.where(y > 0, 1.0, -1.0), "syn")
    return Dataset(sp.csr_matrix(X), y, "syn3", task="multiclass")


def run_both(problem, partition, participation, cfg, rounds, seed=3):
    """Run engine and reference side by side; compare all iterates every round."""
    state = cfg.setup(problem, stack(partition, problem.X))
    ref = ReferenceFedHybrid(problem, partition, cfg)
    assert state.mu == pytest.approx(ref.mu, rel=1e-12)
    np.testing.assert_allclose(state.a, ref.a, rtol=1e-12)
    np.testing.assert_allclose(state.b, ref.b, rtol=1e-12)
    part_rng_e, alg_rng_e = random_streams(seed)
    part_rng_r, _ = random_streams(seed)
    for t in range(1, rounds + 1):
        active = participation.active(t, part_rng_e)
        np.testing.assert_array_equal(active, participation.active(t, part_rng_r))
        state = cfg.round(state, active, alg_rng_e)
        ref.round(active)
        np.testing.assert_allclose(state.x0, ref.x0, atol=1e-10, rtol=0)
        for c in ref.clients:
            np.testing.assert_allclose(state.x[c.k], c.x, atol=1e-10, rtol=0)
            np.testing.assert_allclose(state.lam_dual[c.k], c.dual, atol=1e-10, rtol=0)
    return state


CASES = {
    "fedh-g-logistic-full": ("logistic", Full, FedHybrid(newton_clients="none")),
    "fedh-n-logistic-random": ("logistic", RandomFraction, FedHybrid(newton_clients="all")),
    "fedh-k-squared-random": ("squared", RandomFraction, FedHybrid(newton_clients=2)),
    "fedh-k-smoothed-hinge-full": ("smoothed_hinge", Full, FedHybrid(newton_clients=(1, 3))),
    "fedh-n-squared-raw-per-client": (
        "squared",
        RandomFraction,
        FedHybrid(
            newton_clients="half",
            step_sizes="raw",
            a=(0.5, 1.0, 0.3, 0.2),
            b=(0.02, 0.05, 0.01, 0.02),
            mu=0.05,
        ),
    ),
    "fedh-n-logistic-cg": (
        "logistic",
        Full,
        FedHybrid(newton_clients="all", newton_solver="cg", cg_tolerance=1e-14),
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_engine_reproduces_the_slow_reference(case):
    loss, schedule, cfg = CASES[case]
    problem = make_problem(synthetic(), loss, 0.05)
    partition = horizontal(problem.n_samples, problem.n_features, 4, seed=0)
    participation = schedule(4, 0.5) if schedule is RandomFraction else schedule(4)
    state = run_both(problem, partition, participation, cfg, rounds=15)
    assert np.abs(state.x0).sum() > 0  # something happened


def test_engine_reproduces_the_reference_on_multiclass():
    problem = make_problem(synthetic(n=90, m=7, classes=3), "logistic", 0.05)
    assert problem.Y.shape == (90, 3)
    partition = horizontal(90, 7, 4, seed=1)
    run_both(problem, partition, RandomFraction(4, 0.6), FedHybrid(newton_clients=2), rounds=15)


def test_second_derivative_matches_the_reference_formulas():
    rng = np.random.default_rng(0)
    z = rng.normal(scale=2.0, size=200)
    y = np.where(rng.random(200) < 0.5, -1.0, 1.0)
    for name in ("logistic", "squared", "smoothed_hinge"):
        loss = get_loss(name, smoothing=0.7) if name == "smoothed_hinge" else get_loss(name)
        expected = [loss_second_derivative(name, zi, yi, 0.7) for zi, yi in zip(z, y)]
        np.testing.assert_allclose(second_derivative(loss, z, y), expected, rtol=1e-12)
        # And it is the derivative of l'.
        h = 1e-6
        numeric = (loss.derivative(z + h, y) - loss.derivative(z - h, y)) / (2 * h)
        smooth = np.abs(1 - y * z - 0.35) < 0.34 if name == "smoothed_hinge" else True
        np.testing.assert_allclose(
            second_derivative(loss, z, y)[smooth], numeric[smooth], atol=1e-6
        )


# ---------------------------------------------------------------------------
# Behaviour the paper claims
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_problems():
    """A small horizontal problem (400 x 12, 4 clients) for ridge and logistic."""
    out = {}
    for loss in ("squared", "logistic"):
        problem = make_problem(synthetic(n=400, m=12, seed=1), loss, 1e-2)
        out[loss] = (problem, solve_centralized(problem))
    return out


def relative_losses(problem, optimum, cfg, rounds, participation=None, seed=0):
    partition = horizontal(problem.n_samples, problem.n_features, 4, seed=0)
    result = simulate(
        cfg, problem, partition, participation or Full(4), rounds, seed=seed, optimum=optimum
    )
    return np.maximum(result.column("relative_loss"), 1e-16), result


def first_round_below(errors, level):
    below = np.flatnonzero(errors <= level)
    return int(below[0]) if below.size else None


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize(
    "newton_clients, window, ratio", [("none", 20, 0.6), ("all", 10, 0.3), (2, 40, 0.6)]
)
def test_converges_linearly(small_problems, loss, newton_clients, window, ratio):
    # Theorem 4.1 is Q-linear for a Lyapunov function, not for P itself: the
    # relative loss of x_0 oscillates, so its upper envelope (the largest
    # error from round t on) is what must shrink geometrically.
    problem, optimum = small_problems[loss]
    errors, _ = relative_losses(problem, optimum, FedHybrid(newton_clients=newton_clients), 450)
    start, end = first_round_below(errors, 1e-2), first_round_below(errors, 1e-9)
    assert end is not None, f"did not reach 1e-9 in 450 rounds: {errors[-1]:.1e}"
    assert first_round_below(errors, 1e-8) <= end
    envelope = np.maximum.accumulate(errors[::-1])[::-1]
    ratios = envelope[start + window : end + 1] / envelope[start : end + 1 - window]
    assert ratios.max() <= ratio
    # And log-error against rounds is close to a straight line.
    rounds = np.arange(start, end + 1)
    log_env = np.log10(envelope[start : end + 1])
    slope, intercept = np.polyfit(rounds, log_env, 1)
    assert slope < 0
    assert np.abs(log_env - (slope * rounds + intercept)).max() < 2.0


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_more_newton_clients_need_fewer_rounds(small_problems, loss):
    problem, optimum = small_problems[loss]
    rounds = {}
    for name, nc in (("G", "none"), ("K", 2), ("N", "all")):
        errors, _ = relative_losses(problem, optimum, FedHybrid(newton_clients=nc), 300)
        rounds[name] = first_round_below(errors, 1e-6)
    assert None not in rounds.values(), rounds
    assert rounds["N"] < rounds["K"] < rounds["G"], rounds
    assert rounds["N"] <= 40, rounds


@pytest.mark.parametrize("newton_clients", ["none", "all"])
def test_converges_with_random_participation(small_problems, newton_clients):
    problem, optimum = small_problems["logistic"]
    errors, result = relative_losses(
        problem, optimum, FedHybrid(newton_clients=newton_clients), 600, RandomFraction(4, 0.5)
    )
    assert errors[-1] <= 1e-6
    assert np.all(result.column("active_clients")[1:] <= 4)


def test_cg_agrees_with_the_dense_solve(small_problems):
    problem, _ = small_problems["logistic"]
    partition = horizontal(problem.n_samples, problem.n_features, 4, seed=0)
    dense = simulate(FedHybrid(newton_clients="all"), problem, partition, Full(4), 20)
    cg = simulate(
        FedHybrid(newton_clients="all", newton_solver="cg"), problem, partition, Full(4), 20
    )
    np.testing.assert_allclose(cg.weights, dense.weights, atol=1e-8)


def test_many_features_switch_to_conjugate_gradients():
    rng = np.random.default_rng(0)
    X = sp.random(100, DENSE_MAX_FEATURES + 100, density=0.01, random_state=1, format="csr")
    y = np.where(rng.random(100) < 0.5, -1.0, 1.0)
    problem = make_problem(Dataset(X, y, "wide"), "logistic", 1e-2)
    cfg = FedHybrid(newton_clients="all")
    partition = horizontal(100, X.shape[1], 2, seed=0)
    assert not cfg.setup(problem, stack(partition, problem.X)).dense
    result = simulate(cfg, problem, partition, Full(2), 5)
    primal = result.column("primal")
    assert primal[-1] < primal[0]


def test_round_trips_and_absent_rounds(small_problems):
    problem, _ = small_problems["squared"]
    cfg = FedHybrid(newton_clients=1)
    state = cfg.setup(problem, stack(horizontal(400, 12, 4, seed=0), problem.X))
    rng = np.random.default_rng(0)
    state = cfg.round(state, np.ones(4, dtype=bool), rng)
    assert state.stats["round_trips"] == 1.0 and state.stats["newton_clients"] == 1.0
    before = state.x0.copy(), state.x.copy(), state.lam_dual.copy()
    state = cfg.round(state, np.zeros(4, dtype=bool), rng)
    assert state.stats["round_trips"] == 0.0
    for old, new in zip(before, (state.x0, state.x, state.lam_dual)):
        np.testing.assert_array_equal(old, new)
    # An absent client keeps its variables; the server still averages over all.
    state = cfg.round(state, np.array([True, True, False, True]), rng)
    np.testing.assert_array_equal(state.x[2], before[1][2])
    assert not np.array_equal(state.x[0], before[1][0])


def test_variants_and_newton_client_choice():
    assert set(VARIANTS) == {"fedh-g", "fedh-n", "fedh-k"}
    assert not variant("fedh-g").newton_mask(5).any()
    assert variant("fedh-n").newton_mask(5).all()
    np.testing.assert_array_equal(variant("fedh-k").newton_mask(5), [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(
        variant("fedh-k", newton_clients=3).newton_mask(5), [1, 1, 1, 0, 0]
    )
    np.testing.assert_array_equal(FedHybrid(newton_clients=[4, 0]).newton_mask(5), [1, 0, 0, 0, 1])
    assert variant("fedh-n").name == "fedh-n"
    with pytest.raises(HyflError, match="fedh-x"):
        variant("fedh-x")


# ---------------------------------------------------------------------------
# Refusals and validation
# ---------------------------------------------------------------------------


def test_refuses_the_hinge_loss():
    problem = make_problem(synthetic(), "hinge", 0.05)
    with pytest.raises(HyflError, match="smooth loss") as err:
        FedHybrid().setup(problem, stack(horizontal(120, 8, 3), problem.X))
    message = str(err.value)
    assert "hinge loss is not differentiable" in message
    assert "hyfdca" in message and "logistic" in message


@pytest.mark.parametrize(
    "make_partition", [lambda: vertical(120, 8, 2), lambda: grid(120, 8, 2, 2)], ids=["v", "grid"]
)
def test_refuses_partitions_that_are_not_horizontal(make_partition):
    problem = make_problem(synthetic(), "logistic", 0.05)
    partition = make_partition()
    with pytest.raises(HyflError, match="needs a horizontal partition") as err:
        simulate(FedHybrid(), problem, partition, Full(partition.n_clients), 3)
    assert "horizontal:K" in str(err.value) and "hyfdca" in str(err.value)


def test_hyperparameters_are_validated():
    bad = [
        ({"step_sizes": "fast"}, "step_sizes"),
        ({"newton_solver": "lu"}, "newton_solver"),
        ({"mu": -1.0}, "mu"),
        ({"mu": "big"}, "mu"),
        ({"a": 0.0}, "a "),
        ({"b": (0.1, -0.1)}, "b "),
        ({"b": ()}, "b "),
        ({"newton_clients": "some"}, "newton_clients"),
        ({"newton_clients": -1}, "newton_clients"),
        ({"newton_clients": 1.5}, "newton_clients"),
        ({"newton_clients": (0, 0)}, "newton_clients"),
        ({"cg_tolerance": 0}, "cg_tolerance"),
    ]
    for kwargs, culprit in bad:
        with pytest.raises(HyflError, match=culprit):
            FedHybrid(**kwargs).validated()
    problem = make_problem(synthetic(), "logistic", 0.05)
    blocks = stack(horizontal(120, 8, 3), problem.X)
    for kwargs, culprit in [
        ({"newton_clients": 4}, "only 3 clients"),
        ({"newton_clients": (0, 3)}, "names client 3"),
        ({"a": (1.0, 1.0)}, "a has 2 values but there are 3 clients"),
    ]:
        with pytest.raises(HyflError, match=culprit):
            FedHybrid(**kwargs).setup(problem, blocks)


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_divergence_is_reported_with_the_culprits():
    problem = make_problem(synthetic(), "squared", 0.05)
    with pytest.raises(HyflError, match="diverged") as err:
        simulate(
            FedHybrid(step_sizes="raw", a=5.0, b=5.0, mu=1.0),
            problem,
            horizontal(120, 8, 3),
            Full(3),
            2000,
        )
    assert "Reduce a or b" in str(err.value)
