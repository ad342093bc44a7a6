"""The ``paper`` step rule: Algorithm 5 of the HyFDCA paper as printed.

For the hinge loss the closed form of its section 5,
``y clip(lam N (1 - z) + y a, 0, 1) - a`` (which drops ``||x_i||^2`` and a
``y`` from its own derivation); for other losses the exact maximizer of
Algorithm 5's objective with ``q = 1 / (lam N)``. Kept for reproducing the
paper's figures: it diverges on some losses and data (docs/convergence.md).
"""

from __future__ import annotations

import numpy as np

from hyfl.algorithms.step_rules.base import StepRule
from hyfl.errors import fail


class PaperRule(StepRule):
    def dual_steps(self, loss, *, alpha, z, y, sq_norms, lam, n_samples, beta, gamma_t,
                   client_share=None, weight=None) -> np.ndarray:
        if weight is not None:
            raise fail("step_rule 'paper'", "reproduces the paper's formulas, which have no "
                       "sample weights", "Use the cocoa, safe or theory rule with weights.")
        N = n_samples
        if loss.name == "hinge":
            return y * np.clip(lam * N * (1.0 - z) + y * alpha, 0.0, 1.0) - alpha
        return loss.dual_step(alpha, z, np.full_like(alpha, 1.0 / (lam * N)), y)


_DIVERGES = ("The paper rule (Algorithm 5 as printed) diverges on some data "
             "(docs/convergence.md): use HyFDCA's default rule (leave step_rule out, or "
             "--param step_rule=cocoa).")
RULE = PaperRule("paper", advice_rising=_DIVERGES, advice_not_falling=_DIVERGES)
