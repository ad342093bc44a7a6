"""The ``cocoa`` step rule (the default): a local subproblem per client and a line search.

Every active client solves a subproblem over its draws -- by default one pass
over its samples -- with a model of its data built from the inner products it
remembers; the server aggregates the proposals, adds momentum and searches the
step along the direction (:mod:`hyfl.algorithms.hyfdca_local`), and can keep a
certified pair whose dual never falls (:mod:`hyfl.algorithms.hyfdca_certify`).

What the rule asks of a round, besides: every sample's inner product (the
model needs them), refreshed weights for every active client, and the duals
stored as states a holder made, which a party checks before use
(:mod:`hyfl.privacy.tags`).
"""

from __future__ import annotations

from hyfl.algorithms.step_rules.base import StepRule
from hyfl.errors import fail


class CocoaRule(StepRule):
    def round_trips(self, *, refreshed, horizontal, refresh_inner_products,
                    ahead: bool = False) -> float:
        """Proposals up and their average down (1), the average's primal image up and the
        momentum coefficient down (1), the direction's primal image and the encrypted
        line-search sums up (1), the summed sums down to every client, which takes the
        step, and the encrypted dual changes up (1): 4 (the new weights travel with the
        next round's message), plus the refresh (1.5) and SecureInnerProduct (1) as with
        the other rules (:mod:`hyfl.algorithms.hyfdca_round`). When the last round's step
        brought this round's inner products (``ahead``) the model rides with the
        instructions: no SecureInnerProduct exchange."""
        return 4.0 + (1.5 if refreshed else 0.0) + (0.0 if horizontal or ahead else 1.0)

    def check(self, hyfdca) -> None:
        if hyfdca.sip_scope != "all":
            raise fail(
                "sip_scope",
                f"is {hyfdca.sip_scope!r}, but the cocoa step rule models the data from the "
                "inner products of all the clients' samples",
                "Use sip_scope='all' with step_rule='cocoa' (or choose the safe or paper "
                "step rule)",
            )
        if hyfdca.gamma != 1.0:
            raise fail("gamma", f"is {hyfdca.gamma!r}, but the cocoa step rule chooses its "
                       "own step by line search", "Leave gamma at 1 with step_rule='cocoa'")


RULE = CocoaRule(
    "cocoa", subproblem=True,
    # its line search found no step that raises the dual
    advice_rejected=("Run more rounds ({more}); with --participation {participation} try full "
                     "participation, or more local steps (--param local_steps=N)."),
    advice_rising=("The cocoa rule restarts from the duals it certified whenever their dual "
                   "objective falls: run more rounds ({more}); if the objective keeps rising, "
                   "try --participation full or the safe rule (--param step_rule=safe)."),
    advice_not_falling=("The cocoa rule explores ahead of the duals it certifies and can "
                        "overshoot before it settles (docs/convergence.md): run more rounds "
                        "({more})."),
)
