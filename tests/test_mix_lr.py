"""Mix-LR: the engine against the slow reference, its row groups, its costs, refusals."""

import numpy as np
import pytest

from hyfl.algorithms import make_algorithm
from hyfl.algorithms.mix_lr import MixLR
from hyfl.errors import HyflError
from hyfl.participation import Full, RandomFraction
from hyfl.partition import from_blocks, grid, horizontal, stack
from hyfl.problem import make_problem, solve_centralized
from hyfl.runtime.simulation import random_streams, simulate
from reference_mix_lr import ReferenceMixLR
from test_fedhybrid import synthetic


@pytest.mark.parametrize(("loss", "partition_of", "participation", "weighted"), [
    ("logistic", lambda n, m: grid(n, m, 3, 2, seed=0), RandomFraction(6, 0.5), False),
    ("hinge", lambda n, m: grid(n, m, 2, 3, seed=1), Full(6), True),
    ("squared", lambda n, m: horizontal(n, m, 3, seed=0), RandomFraction(3, 0.7), False),
])
def test_engine_reproduces_the_slow_reference(loss, partition_of, participation, weighted):
    data = synthetic(n=90, m=6)
    weight = np.random.default_rng(0).uniform(0.5, 2.0, 90) if weighted else None
    problem = make_problem(data, loss, 0.05, sample_weight=weight)
    partition = partition_of(90, 6)
    cfg = MixLR(learning_rate=0.2, batch_size=16, local_epochs=2)
    state = cfg.setup(problem, stack(partition, problem.X))
    reference = ReferenceMixLR(problem, partition, 0.2, 16, 2)
    part_rng, alg_rng = random_streams(3)
    ref_part_rng, ref_alg_rng = random_streams(3)
    for t in range(1, 6):
        active = participation.active(t, part_rng)
        np.testing.assert_array_equal(active, participation.active(t, ref_part_rng))
        state = cfg.round(state, active, alg_rng)
        reference.round(active, ref_alg_rng)
        np.testing.assert_allclose(state.w, reference.w, atol=1e-12, rtol=0)
    assert np.abs(state.w).sum() > 0


def test_rounds_count_an_exchange_per_step_and_one_for_the_average():
    problem = make_problem(synthetic(n=100, m=6), "logistic", 0.05)
    partition = grid(100, 6, 2, 3, seed=0)  # groups of 50 samples: 4 batches of 16
    result = simulate(MixLR(batch_size=16), problem, partition, Full(6), 3, seed=0)
    np.testing.assert_array_equal(np.diff(result.column("round_trips")), [5, 5, 5])


def test_it_approaches_the_optimum_with_a_larger_step():
    """Exact vertical SGD inside each group, the groups averaged: near the optimum within
    SGD's noise (few steps an epoch here, so the groups do not drift apart)."""
    problem = make_problem(synthetic(n=240, m=6), "logistic", 1e-2)
    optimum = solve_centralized(problem, cache=False)
    partition = grid(240, 6, 2, 2, seed=0)
    result = simulate(make_algorithm("mix-lr", {"learning_rate": 0.5}), problem, partition,
                      Full(4), 100, seed=0, optimum=optimum)
    assert result.column("relative_loss")[-1] < 1e-3


def test_refuses_splits_without_row_groups():
    problem = make_problem(synthetic(n=90, m=6), "logistic", 0.05)
    rows, left, right = np.arange(90), np.arange(3), np.arange(3, 6)
    partition = from_blocks([(rows[:60], left), (rows[30:], right), (rows[:30], right),
                             (rows[60:], left)], 90, 6)  # no two clients share their samples
    with pytest.raises(HyflError, match="mix-lr needs row groups"):
        MixLR().setup(problem, stack(partition, problem.X))


@pytest.mark.parametrize(("field", "value"), [("learning_rate", 0), ("batch_size", 0),
                                              ("local_epochs", 0)])
def test_hyperparameters_are_validated(field, value):
    with pytest.raises(HyflError, match=field):
        MixLR(**{field: value}).validated()
