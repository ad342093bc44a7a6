"""The ``safe`` step rule: one step per drawn sample, applied only if the dual rises.

Each step maximizes the quadratic model with ``q = beta ||x_i||^2 / (lam N)``.
The round's aggregated update is applied only if it does not decrease the dual
objective, estimated from the inner products the clients used and the realized
change of ``w`` (:func:`dual_gain`; exact without stale clients). A rejected
round doubles ``beta``, an accepted one shrinks it by 5% towards
``1 / max |B_i|`` (the exact coordinate step once the ``1/|B_i|`` averaging is
accounted for). ``beta`` never exceeds the number of draws in the round, where
every step is provably safe by Cauchy-Schwarz, so it cannot stall. Needs no
tuning.
"""

from __future__ import annotations

import numpy as np

from hyfl.algorithms.step_rules.base import StepRule

# How fast beta moves. Doubling on rejection finds a stable value in a few rounds;
# shrinking by 5% per accepted round probes for a faster one without rejecting often
# (about one round in 14 near the boundary).
_BETA_GROW = 2.0
_BETA_SHRINK = 0.95
# Relative rounding tolerance of the acceptance test: near the optimum the estimated
# gain is the difference of nearly equal sums.
_GAIN_TOLERANCE = 1e-10


class SafeRule(StepRule):
    def dual_steps(self, loss, *, alpha, z, y, sq_norms, lam, n_samples, beta, gamma_t,
                   client_share=None, weight=None) -> np.ndarray:
        q = np.maximum(beta * sq_norms[:, None] / (lam * n_samples), 1e-300)
        return loss.dual_step(alpha, z, np.broadcast_to(q, alpha.shape).copy(), y, weight)


_RISING = ("The safe rule keeps the dual objective rising, but the objective of w can rise for "
           "the first rounds while its beta adapts: run more rounds ({more}), or use HyFDCA's "
           "default rule (leave step_rule out, or --param step_rule=cocoa).")
RULE = SafeRule(
    "safe", tests_round=True,
    advice_rejected=("The safe rule rejects rounds while its beta grows (it doubles after each "
                     "rejection, up to the number of draws per round): run more rounds "
                     "({more}), let each party draw fewer samples per round (--param "
                     "local_steps=5), or use HyFDCA's default rule (leave step_rule out, or "
                     "--param step_rule=cocoa)."),
    advice_rising=_RISING, advice_not_falling=_RISING,
)


def dual_gain(
    first_order: float, full_weight: float, active_weight: float, dw_sq: float, lam: float, N: int
) -> tuple[float, float]:
    """Estimated dual gain of a round and the size of its terms.

    ``D(a + d) - D(a) = 1/N sum_i [-(l*(-(a_i + d_i)) - l*(-a_i)) - z_i d_i]
    - lam/2 ||A d||^2``. ``first_order`` is the sum; ``full_weight`` and
    ``active_weight`` are ``sum_i ||x_i||^2 ||d_i||^2`` with the full samples and
    with the active holders' parts; ``dw_sq`` is ``||dw||^2`` of the active
    holders' weight change. Absent holders add their part of ``A d`` when they
    return, so ``||A d||^2`` is estimated by scaling ``||dw||^2`` with the ratio
    of full to active squared norms.
    """
    missing = full_weight / active_weight if active_weight > 0 else 1.0
    quadratic = 0.5 * lam * dw_sq * missing
    return first_order / N - quadratic, abs(first_order) / N + quadratic


def step_verdict(gain: float, scale: float, beta: float, n_draws: int) -> bool:
    """Accept a round whose estimated dual gain is not negative.

    ``beta`` at or above the number of draws makes every step provably safe
    (Cauchy-Schwarz over the updated samples), so such a round is accepted.
    """
    return bool(gain >= -_GAIN_TOLERANCE * scale or beta >= max(1.0, float(n_draws)))


def next_beta(accepted: bool, beta: float, beta_min: float, n_draws: int) -> float:
    """Shrink ``beta`` after an accepted round, double it after a rejected one."""
    beta = beta * _BETA_SHRINK if accepted else beta * _BETA_GROW
    return float(np.clip(beta, beta_min, max(1.0, float(n_draws))))
