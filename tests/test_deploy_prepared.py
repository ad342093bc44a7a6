"""Deployed data prepared as ``hyfl run`` prepares them: an intercept and secure-sum scaling.

In process (the coordinator and per-message parties of :mod:`in_process`, cipher
``none``), on breast cancer split 2x2:

* parties that cut their block from the dataset, with the run config's
  ``intercept`` and ``standardize``, train exactly the problem of
  ``hyfl run --intercept 1 --standardize`` (:func:`hyfl.experiments.runner.prepare`):
  the deployed iterates are ``run_protocol``'s on it, bit for bit;
* block files written by ``hyfl deploy split --intercept 1 --standardize`` carry
  the same blocks, and give the same iterates;
* a job that asks for another preparation than its block files hold is refused,
  naming the files and the fix.

The party files' secure sum is tested in ``tests/test_deploy_party_files.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from hyfl.algorithms import make_algorithm
from hyfl.cli import app
from hyfl.deploy.config import DeployConfig, run_config_for
from hyfl.deploy.coordinator import Coordinator
from hyfl.errors import HyflError
from hyfl.experiments.runner import RunSpec, prepare
from hyfl.participation import parse_participation
from hyfl.privacy.ciphers import make_cipher
from hyfl.runtime.protocol import run_protocol
from in_process import RecordingTransport

ROUNDS, SEED, LAM = 3, 2, 1e-3


def _deploy(data: list[str], **run):
    config = run_config_for(parties=len(data), iterations=ROUNDS, cipher="none", seed=SEED,
                            lam=LAM, **run)
    nodes = [{"party": k, "cipher": "none", "data": source} for k, source in enumerate(data)]
    server = make_cipher("none")
    transport = RecordingTransport(nodes, config, server)
    coordinator = Coordinator(DeployConfig.from_run_config(config), transport, server,
                              log=lambda line: None)
    results = coordinator.run()
    return results, np.stack(coordinator.weights)


@pytest.fixture(scope="module")
def reference():
    """``hyfl run``'s prepared problem and run_protocol's iterates on it."""
    setup = prepare(RunSpec(data="breast_cancer", partition="grid:2x2", lam=LAM, seed=SEED,
                            intercept=1.0, standardize=True))
    history = []
    run_protocol(make_algorithm("hyfdca", {}), setup.problem, setup.partition,
                 parse_participation("full", 4), ROUNDS, make_cipher("none"), seed=SEED,
                 on_round=lambda server, clients: history.append(server.w.copy()))
    return setup, np.stack(history)


def test_parties_cutting_a_dataset_train_hyfl_runs_prepared_problem(reference):
    setup, history = reference
    results, weights = _deploy(["breast_cancer"] * 4, partition="grid:2x2", intercept=1.0,
                               standardize=True)
    assert results["status"] == "completed"
    assert results["n_features"] == setup.problem.n_features == 31  # 30 and the constant
    assert results["config"]["intercept"] == 1.0 and results["config"]["standardize"]
    np.testing.assert_array_equal(weights[1:], history)
    assert np.abs(weights[-1]).max() > 0


def test_split_block_files_hold_the_prepared_blocks(reference, tmp_path):
    setup, history = reference
    done = CliRunner().invoke(app, [
        "deploy", "split", "--data", "breast_cancer", "--partition", "grid:2x2",
        "--seed", str(SEED), "--intercept", "1", "--standardize", "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    files = [str(tmp_path / f"party-{k}.npz") for k in range(4)]
    results, weights = _deploy(files, intercept=1.0, standardize=True)
    np.testing.assert_array_equal(weights[1:], history)

    # The files say how they were prepared; a job asking otherwise is refused.
    with pytest.raises(HyflError, match=r"block file .*party-0.npz holds intercept 1, "
                       r"scaled features, but the job asks for intercept 0.*hyfl deploy split"):
        _deploy(files)
