"""What a deployed run reports: its defaults, its progress per round, its summary, and
whether it learned (``hyfl deploy local`` and ``hyfl deploy run``)."""

from __future__ import annotations

import dataclasses

from hyfl.algorithms.hyfdca import HyFDCA
from hyfl.deploy.config import DEPLOYED_STEP_RULES, RUN_DEFAULTS, DeployConfig, run_config_for


def test_an_empty_hyper_is_hyfdcas_defaults_with_the_deployable_step_rule():
    # The Flower messages carry the per-sample rules only; everything else is HyFDCA's.
    assert RUN_DEFAULTS["hyper"] == ""
    config = DeployConfig.from_run_config(run_config_for(parties=4, cipher="none"))
    assert config.algorithm == dataclasses.replace(HyFDCA(), step_rule=DEPLOYED_STEP_RULES[0])
    assert config.algorithm.step_rule == "theory" and config.iterations == 10
    chosen = DeployConfig.from_run_config(run_config_for(parties=4, cipher="none",
                                                         hyper="step_rule=safe"))
    assert chosen.algorithm == dataclasses.replace(HyFDCA(), step_rule="safe")
