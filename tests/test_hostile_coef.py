"""The cocoa subproblem's scaling ``coef`` a server sends is range-checked (issue 42, point 7).

An honest server sends ``sigma / (lam * N)`` with ``sigma`` between
:data:`~hyfl.algorithms.hyfdca_local.SIGMA_FLOOR` and its ceiling (at most
``n_parties * N``). A party solved its subproblem with whatever ``coef`` came --
zero, negative, huge, NaN -- and sent back proposals computed from it (a server
choosing the curvature of each party's subproblem). Each forged value below was
answered before the check.
"""

from __future__ import annotations

import numpy as np
import pytest

from hyfl.errors import HyflError
from synthetic_data import synthetic

PARTIES = 2


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    from hyfl.deploy.blocks import write_blocks
    from hyfl.deploy.config import DeployConfig, run_config_for
    from hyfl.deploy.keys import generate_keys, server_cipher
    from hyfl.partition import grid
    from hyfl.problem import make_problem

    tmp = tmp_path_factory.mktemp("coef")
    private, public = generate_keys(tmp / "keys", 256, insecure_test_keys=True)
    problem = make_problem(synthetic(n=40, m=4), "hinge", 0.05)
    files = write_blocks(problem, grid(40, 4, 1, PARTIES), tmp / "blocks")
    nodes = [{"party": k, "key": str(private), "cipher": "paillier", "insecure-test-keys": True,
              "data": str(f)} for k, f in enumerate(files)]
    config = run_config_for(parties=PARTIES, iterations=3, cipher="paillier",
                            public_key=str(public), seed=1, insecure_test_keys=True)
    job = DeployConfig.from_run_config(config)
    cipher = server_cipher("paillier", public, **job.cipher_options(), insecure_test_keys=True)
    return {"nodes": nodes, "config": config, "job": job, "cipher": cipher,
            "lam": problem.lam, "n": problem.n_samples}


def _run(setting, coef=None):
    """A run whose server sends ``coef`` (None: the honest one) in every proposals request."""
    from hyfl.deploy.coordinator import Coordinator
    from in_process import RecordingTransport

    seen = []

    def forge(k, kind, payload):
        model = payload if kind == "proposals" else (payload.get("model") if kind == "round"
                                                      else None)
        if isinstance(model, dict) and "coef" in model:
            seen.append(float(model["coef"]))
            if coef is not None:
                model["coef"] = coef
        return payload

    transport = RecordingTransport(setting["nodes"], setting["config"], setting["cipher"],
                                   forge=forge)
    Coordinator(setting["job"], transport, setting["cipher"], log=lambda line: None).run()
    return seen


def test_the_honest_coef_is_inside_the_bounds(setting):
    from hyfl.deploy.guard import check_coef, coef_bounds

    seen = _run(setting)
    low, high = coef_bounds(PARTIES, setting["n"], setting["lam"])
    assert seen and all(low <= c <= high for c in seen)
    for c in seen:
        assert check_coef(c, PARTIES, setting["n"], setting["lam"], "proposals", 0) == c


@pytest.mark.parametrize("coef", [0.0, -1.0, 1e300, float("nan"), float("inf"), 1e-300])
def test_a_forged_coef_is_refused(setting, coef):
    with pytest.raises(HyflError, match="coef"):
        _run(setting, coef)


def test_the_bounds_follow_sigma():
    from hyfl.algorithms.hyfdca_local import SIGMA_FLOOR
    from hyfl.deploy.guard import coef_bounds

    low, high = coef_bounds(3, 100, 0.01)
    assert low == pytest.approx(SIGMA_FLOOR / 1.0) and high == pytest.approx(3 * 100 / 1.0)
    assert np.isfinite(low) and low > 0
