"""The ``theory`` step rule: Algorithm 3 with the correction its own proof implies.

With ``u = -l'(z)`` and the quadratic ``gamma_t ||x_i||^2 / (2 lam)``, a step
along the segment from ``a`` towards ``c_k (u - a)``, with ``c_k = N_k / N``
(Theorem 4.4) or 1 (Theorems 4.8 and 4.11). Provably convergent and very slow.
"""

from __future__ import annotations

import numpy as np

from hyfl.algorithms.step_rules.base import StepRule


class TheoryRule(StepRule):
    def dual_steps(self, loss, *, alpha, z, y, sq_norms, lam, n_samples, beta, gamma_t,
                   client_share=None, weight=None) -> np.ndarray:
        q = np.maximum(gamma_t * sq_norms[:, None] / lam, 1e-300)
        best = loss.dual_step(alpha, z, np.broadcast_to(q, alpha.shape).copy(), y, weight)
        c = client_share if client_share is not None else 1.0
        end = c * (loss.dual_target(z, y, weight) - alpha)
        return np.clip(best, np.minimum(0.0, end), np.maximum(0.0, end))

    def client_shares(self, client_weight, client_sizes, n_samples):
        if client_weight != "N_k/N":
            return None
        return (np.asarray(client_sizes, dtype=float) / n_samples)[:, None]


RULE = TheoryRule("theory")
