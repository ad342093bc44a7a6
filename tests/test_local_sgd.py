"""FedAvg / HyFEM (hybrid local SGD): the engine against the slow reference, and behaviour."""

import dataclasses
import math

import numpy as np
import pytest
import scipy.sparse as sp

import hyfl.algorithms as registry
from hyfl.algorithms.local_sgd import FedAvg, HyFEM
from hyfl.data.dataset import Dataset
from hyfl.errors import HyflError
from hyfl.participation import Cyclic, Full, RandomFraction
from hyfl.partition import from_blocks, grid, horizontal, nonzero_balanced, stack, vertical
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import random_streams, simulate
from reference_local_sgd import ReferenceLocalSGD
from synthetic_data import synthetic


def run_both(problem, partition, participation, cfg, rounds, seed=3):
    """Run engine and reference side by side; compare iterates every round."""
    blocks = stack(partition, problem.X)
    state = cfg.setup(problem, blocks)
    ref = ReferenceLocalSGD(problem, partition, cfg)
    part_rng_e, alg_rng_e = random_streams(seed)
    part_rng_r, alg_rng_r = random_streams(seed)
    for t in range(1, rounds + 1):
        active_e = participation.active(t, part_rng_e)
        active_r = participation.active(t, part_rng_r)
        state = cfg.round(state, active_e, alg_rng_e)
        ref.round(active_r, alg_rng_r)
        np.testing.assert_allclose(state.w, ref.w, atol=1e-10, rtol=0)
        for c in ref.clients:  # the server's stored block of every client
            block = slice(state.entry_ptr[c.k], state.entry_ptr[c.k + 1])
            np.testing.assert_allclose(state.stored[block], ref.stored[c.k], atol=1e-10, rtol=0)
        if active_e.any():
            assert state.stats["client_drift"] == pytest.approx(ref.drift, rel=1e-9, abs=1e-12)
        assert not state.scratch.any()  # the lazy weights are cleared between rounds
    return state, ref


FEDAVG = FedAvg(local_steps=6, a=0.5)
PROX = HyFEM(local_steps=6, a=0.5, mu=2.0)

CASES = {
    "grid-random-hinge": (
        "hinge",
        lambda n, m, X: grid(n, m, 3, 3, seed=1),
        lambda K: RandomFraction(K, 0.5),
    ),
    "nonzero-split-logistic": (
        "logistic",
        lambda n, m, X: nonzero_balanced(X, 3, 3, seed=0),
        lambda K: RandomFraction(K, 0.6),
    ),
    "horizontal-full-squared": (
        "squared",
        lambda n, m, X: horizontal(n, m, 4, seed=0),
        lambda K: Full(K),
    ),
    "vertical-cyclic-smoothed": (
        "smoothed_hinge",
        lambda n, m, X: vertical(n, m, 4),
        lambda K: Cyclic(K, 2),
    ),
    "uneven-blocks-logistic": (  # features held by 1 or 2 clients, uneven sample groups
        "logistic",
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
    ),
}


@pytest.mark.parametrize("cfg", [FEDAVG, PROX], ids=["fedavg", "hyfem-prox"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_engine_reproduces_the_slow_reference(case, cfg):
    loss, make_partition, make_participation = CASES[case]
    data = synthetic(sparsity=0.3 if "nonzero" in case else 0.0)
    problem = make_problem(data, loss, 0.05)
    partition = make_partition(problem.n_samples, problem.n_features, problem.X)
    state, _ = run_both(problem, partition, make_participation(partition.n_clients), cfg, 20)
    assert np.abs(state.w).sum() > 0  # something happened


@pytest.mark.parametrize("split", ["grid", "nonzero"])
@pytest.mark.parametrize("cfg", [FEDAVG, PROX], ids=["fedavg", "hyfem-prox"])
def test_engine_reproduces_reference_on_multiclass(cfg, split):
    problem = make_problem(synthetic(n=90, m=8, classes=3, sparsity=0.5), "logistic", 0.05)
    assert problem.Y.shape == (90, 3)
    if split == "grid":
        partition = grid(90, 8, 3, 2, seed=0)
    else:  # some client rows are empty: their margins must be 0
        partition = nonzero_balanced(problem.X, 3, 2, seed=0)
        assert (np.diff(stack(partition, problem.X).X.indptr) == 0).any()
    state, _ = run_both(problem, partition, RandomFraction(6, 0.5), cfg, 15)
    assert state.w.shape == (8, 3)


def test_lazy_scaling_folds_exactly_when_the_shrink_vanishes_or_underflows():
    # lam + mu = 2 and eta_1 = 1 / (1 + 1) make rho = 1 - eta (lam + mu) exactly 0
    # in round 1; afterwards |rho| ~ 0.17 and 200 steps take rho^H below 1e-150.
    problem = make_problem(synthetic(), "logistic", 0.05)
    cfg = HyFEM(local_steps=200, a=1.0, b=1.0, mu=1.95)
    assert 1.0 - cfg.step_size(1) * (problem.lam + cfg.mu) == 0.0
    run_both(problem, grid(120, 10, 2, 2, seed=0), RandomFraction(4, 0.7), cfg, 4)


def test_hyfem_avg_is_fedavg_with_another_name():
    problem = make_problem(synthetic(), "hinge", 0.05)
    part = grid(120, 10, 3, 3, seed=0)
    runs = [
        simulate(cfg, problem, part, RandomFraction(9, 0.5), 20, seed=5)
        for cfg in (FedAvg(local_steps=5), HyFEM(local_steps=5, mu=3.0, variant="avg"))
    ]
    np.testing.assert_array_equal(runs[0].weights, runs[1].weights)
    assert runs[1].config["algorithm"]["prox_mu"] == 0.0


def test_iterates_are_reproducible_for_a_seed():
    problem = make_problem(synthetic(), "logistic", 0.05)
    part = grid(120, 10, 3, 3, seed=0)
    runs = [simulate(PROX, problem, part, RandomFraction(9, 0.5), 15, seed=s) for s in (7, 7, 8)]
    np.testing.assert_array_equal(runs[0].weights, runs[1].weights)
    assert not np.array_equal(runs[0].weights, runs[2].weights)


# -- behaviour the papers describe ---------------------------------------------


@pytest.fixture(scope="module")
def horizontal_logistic():
    problem = make_problem(synthetic(n=400, m=12, seed=1), "logistic", 1e-2)
    return problem, solve_centralized(problem), horizontal(400, 12, 4, seed=0)


@pytest.mark.parametrize(
    "cfg",
    [FedAvg(local_steps=10), HyFEM(local_steps=10, mu=1.0)],
    ids=["fedavg", "hyfem-prox"],
)
def test_horizontal_full_participation_approaches_the_central_optimum(horizontal_logistic, cfg):
    # With all features on every client the local objective is the global one
    # on the client's samples; with eta_t -> 0 the client drift vanishes.
    problem, optimum, partition = horizontal_logistic
    result = simulate(cfg, problem, partition, Full(4), 2000, eval_every=200, optimum=optimum)
    rel = result.column("relative_loss")
    assert rel[-1] < 1e-2
    assert rel[-1] < 0.2 * rel[1]  # round 2000 well below round 200
    assert np.all(np.diff(result.column("round_trips")) == 200.0)  # 1 trip per round


def test_hybrid_grid_stalls_far_from_the_central_optimum():
    # Each client predicts with its own features only; the average of such
    # partial models is not the central model (the HyFDCA paper's finding).
    problem = make_problem(synthetic(n=400, m=12, seed=1), "logistic", 1e-2)
    optimum = solve_centralized(problem)
    result = simulate(
        FedAvg(local_steps=10),
        problem,
        grid(400, 12, 2, 3, seed=0),
        Full(6),
        1000,
        eval_every=250,
        optimum=optimum,
    )
    rel = result.column("relative_loss")
    assert rel[-1] > 0.05 and rel[-1] > 0.5 * rel[1]


def test_large_mu_keeps_clients_close_to_the_server_weights(horizontal_logistic):
    # client_drift: RMS over the active clients of ||w_k - w_0[M_k]|| at the end
    # of their local steps. Measured ratio prox / fedavg here: 0.35 (0.34 with
    # another seed); mu = 10 gives 0.41 (with 20 local steps, mu = 1 gives 0.9).
    problem, _, _ = horizontal_logistic
    partition = grid(400, 12, 2, 2, seed=0)
    drift = {}
    for name, cfg in {
        "fedavg": FedAvg(local_steps=50, a=0.1),
        "prox": HyFEM(local_steps=50, a=0.1, mu=15.0),
    }.items():
        result = simulate(cfg, problem, partition, RandomFraction(4, 0.5), 200, seed=2)
        drift[name] = np.nanmean(result.column("client_drift")[1:])
    assert drift["prox"] < 0.5 * drift["fedavg"]


# -- configuration -------------------------------------------------------------


def test_defaults_and_hooks():
    assert (FedAvg().a, FedAvg().b, FedAvg().default_iic) == (0.1, 1.0, 0.2)
    assert (HyFEM().mu, HyFEM().variant, HyFEM().name) == (1.0, "prox", "hyfem")
    assert FedAvg().steps_per_client(49990, 144) == math.ceil(0.2 * 49990 / 144)
    assert FedAvg(iic=0.2494).steps_per_client(49990, 144) == 87
    assert FedAvg(local_steps=3, iic=5.0).steps_per_client(100, 2) == 3
    assert FedAvg(a=2.0, b=1.0).step_size(4) == pytest.approx(2.0 / 3.0)
    problem = make_problem(synthetic(), "hinge", 0.05)
    state = FedAvg(local_steps=2).setup(problem, stack(grid(120, 10, 2, 2), problem.X))
    assert FedAvg().duals(state) is None
    assert FedAvg().weights(state).shape == (10, 1)
    state = FedAvg(local_steps=2).round(state, np.zeros(4, dtype=bool), np.random.default_rng(0))
    assert state.stats["round_trips"] == 0.0 and not state.w.any()  # nobody took part
    assert HyFEM(mu=2.0).config()["prox_mu"] == 2.0


@pytest.mark.parametrize(
    "name, preset, mu",
    [("fedavg", {}, 0.0), ("hyfem", {}, 0.5), ("hyfem-avg", {"variant": "avg"}, 0.0)],
)
def test_registry_builds_the_configurations(name, preset, mu):
    # The registry builds cls(**preset, **hyper, name=name); the fields are the
    # hyperparameter names of `hyfl run` (--iic, --local-steps, --a, --b, --mu).
    cls = HyFEM if name.startswith("hyfem") else FedAvg
    fields = {f.name for f in dataclasses.fields(cls)} - {"name"}
    expected = {"local_steps", "iic", "a", "b"} | ({"mu", "variant"} if cls is HyFEM else set())
    assert fields == expected
    hyper = {"iic": 0.25, "a": 0.3, "b": 2.0} | ({"mu": 0.5} if cls is HyFEM else {})
    built = cls(**{**preset, **hyper, "name": name}).validated()
    assert (built.prox_mu, built.name) == (mu, name)
    assert name in registry.algorithm_names(), f"{name!r} is not in hyfl.algorithms.ALGORITHMS"
    made = registry.make_algorithm(name, hyper)
    assert type(made) is cls and made.config() == built.config()


@pytest.mark.parametrize(
    "cfg, culprit",
    [
        (FedAvg(a=0.0), "a must be"),
        (FedAvg(a="fast"), "a must be"),
        (HyFEM(b=-1.0), "b must be"),
        (FedAvg(b=float("nan")), "b must be"),
        (HyFEM(mu=-0.5), "mu must be"),
        (HyFEM(mu=None), "mu must be"),
        (HyFEM(variant="matched"), "variant"),
        (FedAvg(local_steps=0), "local_steps"),
        (HyFEM(iic=-1.0), "iic"),
    ],
)
def test_invalid_hyperparameters_are_refused(cfg, culprit):
    with pytest.raises(HyflError, match=culprit):
        cfg.validated()
    problem = make_problem(synthetic(n=20, m=4), "hinge", 0.05)
    with pytest.raises(HyflError, match=culprit):  # also when handed to the engine
        simulate(cfg, problem, grid(20, 4, 2, 2), Full(4), 1)


def test_setup_with_many_clients_times_features():
    # client * n_features exceeds 2**16 (and would overflow narrow index types)
    import numpy as np

    from hyfl.algorithms.local_sgd import FedAvg
    from hyfl.participation import Full
    from hyfl.partition import grid
    from hyfl.problem import make_problem
    from hyfl.runtime.simulation import simulate

    rng = np.random.default_rng(0)
    X = sp.random(400, 700, density=0.02, random_state=0, format="csr")
    data = Dataset(X, rng.choice([-1.0, 1.0], 400), "wide")
    problem = make_problem(data, "hinge", 1e-2)
    result = simulate(FedAvg(local_steps=2), problem, grid(400, 700, 10, 20), Full(200), 3)
    assert np.isfinite(result.final["primal"])
