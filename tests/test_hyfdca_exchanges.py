"""The protocol engine records how many sequential exchanges each round took.

``play_round`` (:mod:`hyfl.algorithms.hyfdca_round`) returns a round's verdict and its
exchanges; :func:`hyfl.runtime.protocol.run_protocol` keeps them as the per-round stats
column ``exchanges`` (the stacked engine has no such column: its metrics stay as they
were).
"""

from __future__ import annotations

import numpy as np
import pytest

from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.participation import Full, RandomFraction
from hyfl.partition import grid, horizontal
from hyfl.privacy.ciphers import make_cipher
from hyfl.problem import make_problem
from hyfl.runtime.protocol import run_protocol
from hyfl.runtime.simulation import simulate
from synthetic_data import synthetic

N, M = 60, 8


@pytest.fixture(scope="module")
def problem():
    return make_problem(synthetic(n=N, m=M, seed=3), "logistic", 0.05)


@pytest.mark.parametrize("rule, split, first, steady", [
    # round 1: round, proposals, image, direction, step; then the inner products come
    # ahead with the step (every party active) and the model rides along with round
    ("cocoa", "hybrid", 5, 4),
    ("cocoa", "horizontal", 4, 4),  # the model rides along with round: no proposals
    ("safe", "hybrid", 4, 4),  # round, steps, duals, verdict
    ("paper", "hybrid", 3, 3),  # round, steps, duals
])
def test_a_protocol_run_records_each_rounds_exchanges(problem, rule, split, first, steady):
    partition = grid(N, M, 2, 2) if split == "hybrid" else horizontal(N, M, 3)
    K = partition.n_clients
    algorithm = HyFDCA(local_steps=4, step_rule=rule)
    full = run_protocol(algorithm, problem, partition, Full(K), 3, make_cipher("none"), seed=0)
    assert "exchanges" not in full.metrics[0]  # the evaluation before any round
    np.testing.assert_array_equal([row["exchanges"] for row in full.metrics[1:]],
                                  [first, steady, steady])
    # Returning parties add the weights exchange (and the cocoa rule's certificate its
    # judge's): never fewer than the steady state.
    partial = run_protocol(algorithm, problem, partition, RandomFraction(K, 0.5), 5,
                           make_cipher("none"), seed=0)
    exchanges = np.array([row["exchanges"] for row in partial.metrics[1:]])
    assert exchanges.min() >= steady and exchanges.max() > steady
    stacked = simulate(algorithm, problem, partition, Full(K), 3, seed=0)
    assert all("exchanges" not in row for row in stacked.metrics)
