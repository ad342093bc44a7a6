"""The ``cocoa`` rule's certificate (hyfl.algorithms.hyfdca_certify).

* Over random hybrid problems, partitions, losses and participation from 0.05 to 1,
  the dual of the duals the rule stands behind never falls from one round to the
  next, and the certified weights are their exact primal image.
* The certificate's arithmetic: a checkpoint is accepted exactly when its dual,
  computed from the pooled data, is no lower than the certified one.
"""

from __future__ import annotations

import numpy as np
import pytest

from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.algorithms.hyfdca_certify import checkpoint_accepted, conjugate_sums
from hyfl.participation import Full, RandomFraction
from hyfl.partition import grid, horizontal, nonzero_balanced, stack, vertical
from hyfl.problem import make_problem
from hyfl.runtime.simulation import random_streams
from synthetic_data import synthetic

LOSSES = ("hinge", "logistic", "squared", "smoothed_hinge")
FRACTIONS = (0.05, 0.1, 0.2, 0.5, 1.0)


def _random_case(seed: int):
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(40, 120)), int(rng.integers(4, 14))
    loss = LOSSES[seed % len(LOSSES)]
    data = synthetic(n=n, m=m, seed=seed, sparsity=float(rng.choice([0.0, 0.5])))
    problem = make_problem(data, loss, float(10.0 ** rng.uniform(-3.5, -1.5)))
    kind = ("grid", "nonzero", "horizontal", "vertical")[int(rng.integers(4))]
    if kind == "grid":
        partition = grid(n, m, int(rng.integers(1, 4)), int(rng.integers(2, 4)), seed=seed)
    elif kind == "nonzero":
        partition = nonzero_balanced(problem.X, int(rng.integers(1, 4)), 3, seed=seed)
    elif kind == "horizontal":
        partition = horizontal(n, m, int(rng.integers(2, 5)))
    else:
        partition = vertical(n, m, int(rng.integers(2, 4)))
    fraction = FRACTIONS[seed % len(FRACTIONS)]
    K = partition.n_clients
    participation = Full(K) if fraction == 1.0 else RandomFraction(K, fraction)
    return problem, partition, participation


@pytest.mark.parametrize("seed", range(20))
def test_the_certified_dual_never_falls(seed):
    problem, partition, participation = _random_case(seed)
    hyfdca = HyFDCA(certify=True)
    state = hyfdca.setup(problem, stack(partition, problem.X))
    part_rng, alg_rng = random_streams(seed)
    previous = problem.dual(hyfdca.duals(state))
    assert previous == 0.0
    for t in range(1, 61):
        state = hyfdca.round(state, participation.active(t, part_rng), alg_rng)
        alpha = hyfdca.duals(state)
        dual = problem.dual(alpha)
        assert dual >= previous - 1e-10 * (1.0 + abs(previous)), (t, dual, previous)
        lo, hi = problem.loss.dual_bounds(problem.Y)
        assert np.all(alpha >= lo - 1e-9) and np.all(alpha <= hi + 1e-9)  # feasible
        models = {name: w for name, w, _ in hyfdca.models(state)}
        if "certified" in models:
            np.testing.assert_allclose(models["certified"], problem.weights_of_duals(alpha),
                                       atol=1e-10, rtol=0)
        previous = dual


def _pooled_dual(problem, alpha):
    w = problem.weights_of_duals(alpha)
    return (-0.5 * problem.lam * np.sum(w * w, axis=0)
            - np.sum(problem.loss.conjugate(alpha, problem.Y), axis=0) / problem.n_samples)


@pytest.mark.parametrize("loss", LOSSES)
def test_a_checkpoint_is_accepted_exactly_when_its_pooled_dual_is_no_lower(loss):
    problem = make_problem(synthetic(n=80, m=6, seed=4, classes=3), loss, 1e-2) \
        if loss != "squared" else make_problem(synthetic(n=80, m=6, seed=4), loss, 1e-2)
    rng = np.random.default_rng(0)
    lo, hi = problem.loss.dual_bounds(problem.Y)
    lo, hi = np.maximum(lo, -2.0), np.minimum(hi, 2.0)  # the squared loss's domain is all of R
    if loss == "logistic":  # stay inside the open domain
        lo, hi = np.maximum(lo, -0.99), np.minimum(hi, 0.99)
    for trial in range(20):
        first = lo + (hi - lo) * rng.uniform(0.0, 1.0, size=problem.Y.shape)
        second = first + rng.uniform(0.0, 0.3) * (
            lo + (hi - lo) * rng.uniform(0.0, 1.0, size=problem.Y.shape) - first)
        (w0, s0), (w1, s1) = ((problem.weights_of_duals(a),
                               conjugate_sums(problem.loss, a, problem.Y)) for a in (first, second))
        accepted = checkpoint_accepted(w0, s0, w1, s1, problem.lam, problem.n_samples)
        rose = np.sum(_pooled_dual(problem, second)) >= np.sum(_pooled_dual(problem, first))
        assert accepted == rose
        if trial == 0:
            assert checkpoint_accepted(w0, s0, w0, s0, problem.lam, problem.n_samples)  # a tie
