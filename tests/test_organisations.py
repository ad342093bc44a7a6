"""Three organisations' own files converge with the defaults (issue 43).

Two real datasets are cut by ``tests/organisation_cut.py`` the way a cross-organisation job
has them: a hospital and a lab with labels, a clinic without, string ids that only partly
overlap, three columns the hospital and the lab both hold, each file in its own order, a
few hundred rows (small ``N``). With the defaults (and ``--standardize``: the features are
in raw units) HyFDCA settles at relative loss 1e-3 within 300 rounds -- checked against
the duality gap of the reported pair, an upper bound on ``P(w) - P*`` that needs no
central solver, and against liblinear's optimum.
"""

from __future__ import annotations

import numpy as np
import pytest

from hyfl.experiments.runner import RunSpec, execute
from organisation_cut import breast_cancer_cut, wine_quality_cut

SPEC = "parties:{};id=patient;label=outcome"
ROUNDS = 300
CUTS = {"breast_cancer": breast_cancer_cut, "wine": wine_quality_cut}


@pytest.fixture(scope="module", params=sorted(CUTS))
def organisations(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    CUTS[request.param](folder)
    outcome = execute(RunSpec(data=SPEC.format(folder), standardize=True, iterations=ROUNDS,
                              eval_every=5))
    return folder, outcome


def test_the_defaults_settle_at_1e_3_within_300_rounds(organisations):
    _, outcome = organisations
    settled = outcome.summary["settled_at_relative_loss"]["0.001"]
    assert settled is not None and settled <= ROUNDS, outcome.summary["settled_at_relative_loss"]
    final = outcome.result.metrics[-1]
    # The certificate: P(w) - D(alpha) >= P(w) - P*, whatever the central solver says.
    assert final["gap"] <= 1e-3 * final["primal"]
    assert 0 <= final["relative_loss"] <= 1e-3


def test_the_defaults_are_the_ones_for_organisations(organisations):
    """lam = 1/N (scikit-learn's C = 1), every party every round, more than one local pass
    (standardized features at lam = 1/N: the subproblem's condition is at least the
    number of features)."""
    from hyfl.algorithms.hyfdca_local import local_passes
    from hyfl.experiments.runner import prepare

    folder, outcome = organisations
    assert outcome.summary["lam"] == pytest.approx(1.0 / outcome.summary["n_samples"])
    assert outcome.spec.participation_spec() == "full"
    active = [m["active_clients"] for m in outcome.result.metrics[1:]]
    assert active and all(a == 3 for a in active)
    setup = prepare(RunSpec(data=SPEC.format(folder), standardize=True))
    sq = np.asarray(setup.problem.X.multiply(setup.problem.X).sum(axis=1)).ravel()
    passes = local_passes(sq, np.array([0, sq.size]), setup.problem.lam * sq.size)
    assert passes[0] > 1


def test_local_passes_follow_the_subproblem_condition():
    from hyfl.algorithms.hyfdca_local import MAX_LOCAL_PASSES, local_passes

    sq = np.array([1.0, 3.0, 40.0, 40.0, 500.0])  # clients: [1, 3], [40, 40], [500], []
    segments = np.array([0, 2, 4, 5, 5])
    # kappa = mean ||x||^2 / (lam N): 2, 40, 500 -> ceil(kappa / 8) within [1, 16]
    np.testing.assert_array_equal(local_passes(sq, segments, 1.0), [1, 5, MAX_LOCAL_PASSES, 1])
    assert MAX_LOCAL_PASSES == 16
    np.testing.assert_array_equal(local_passes(sq, segments, 10.0), [1, 1, 7, 1])
    np.testing.assert_array_equal(local_passes(sq, segments, 1.0, setting=2), [2, 2, 2, 2])


def test_more_local_passes_solve_the_subproblem_better():
    """With one client the local model is exact (CoCoA+'s subproblem is the dual itself),
    so each extra pass of sequential dual coordinate ascent is more progress on the dual:
    after the same rounds the certified duality gap is smaller."""
    import scipy.sparse as sp

    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.participation import Full
    from hyfl.partition import parse_partition
    from hyfl.problem import make_problem
    from hyfl.runtime.simulation import simulate
    from synthetic_data import synthetic

    data = synthetic(n=80, m=6, seed=3)
    problem = make_problem(data, "squared", 1.0 / 80)
    partition = parse_partition("horizontal:1", problem.X, seed=0)
    gaps = []
    for passes in (1, 2, 4):
        result = simulate(HyFDCA(local_passes=passes, momentum=0.0), problem, partition,
                          Full(1), 3, seed=0)
        gaps.append(result.metrics[-1]["gap"])
    assert gaps[0] > gaps[1] > gaps[2]
    assert sp.issparse(problem.X)


def test_local_passes_are_validated():
    from hyfl.algorithms.hyfdca import HyFDCA
    from hyfl.errors import HyflError

    for bad in (0, 65, 1.5, True):
        with pytest.raises(HyflError, match="local_passes"):
            HyFDCA(local_passes=bad).validated()


def _deployed_problem(transport, n_samples, n_features, lam):
    """The pooled problem of a deployment's blocks, in its own numbering (for P only)."""
    import scipy.sparse as sp

    from hyfl.deploy.codec import decode
    from hyfl.losses import get_loss
    from hyfl.problem import Problem

    rows, cols, values, Y = [], [], [], np.zeros((n_samples, 1))
    for state in transport.states.values():
        block = decode(*state, None)["block"]
        X = sp.csr_matrix((block["data"], block["indices"], block["indptr"]),
                          shape=tuple(block["shape"])).tocoo()
        rows.append(np.asarray(block["samples"])[X.row])
        cols.append(np.asarray(block["features"])[X.col])
        values.append(X.data)
        Y[np.asarray(block["samples"])] = block["Y"]
    X = sp.csr_matrix((np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(n_samples, n_features))
    return Problem(X=X, Y=Y, loss=get_loss("hinge"), lam=lam)


@pytest.mark.parametrize("name", sorted(CUTS))
def test_deployed_the_defaults_settle_at_1e_3_within_300_rounds(name, tmp_path):
    """The deployment's own code (alignment of the files, secure standardization, the
    parties' rounds, the real message codec; no network, cipher none) with
    ``hyfl deploy local``'s defaults and hyfl run's intercept: the same convergence."""
    from hyfl.deploy.config import DeployConfig, run_config_for
    from hyfl.deploy.coordinator import Coordinator
    from hyfl.deploy.keys import server_cipher
    from hyfl.deploy.local import deployment_metrics
    from hyfl.problem import solve_centralized
    from hyfl.runtime.simulation import evaluate
    from in_process import RecordingTransport

    files, _ = CUTS[name](tmp_path)
    run = run_config_for(parties=3, iterations=ROUNDS, cipher="none", standardize=True,
                         intercept=1.0)
    nodes = [{"party": k, "cipher": "none", "data": str(path), "id-column": "patient",
              "label-column": "outcome"} for k, path in enumerate(files)]
    server = server_cipher("none", None)
    transport = RecordingTransport(nodes, run, server)
    coordinator = Coordinator(DeployConfig.from_run_config(run), transport, server,
                              log=lambda line: None)
    results = coordinator.run()
    N, M = results["n_samples"], results["n_features"]
    assert results["lam"] == pytest.approx(1.0 / N)  # the parties' default: 1/N
    problem = _deployed_problem(transport, N, M, results["lam"])
    optimum = solve_centralized(problem, cache=False)
    rows = deployment_metrics(results, np.stack(coordinator.weights), problem, optimum)
    relative = np.array([r["relative_loss"] for r in rows])
    above = np.nonzero(relative > 1e-3)[0]
    assert above.size and above[-1] + 1 <= ROUNDS, relative[-5:]
    final = evaluate(problem, coordinator.weights[int(rows[-1]["model_round"])], None, optimum,
                     None, None)
    assert 0 <= final["relative_loss"] <= 1e-3
