"""What a HyFDCA step rule is: the decisions every engine asks of it.

A step rule decides how LocalDualMethod turns a round's inner products into
dual steps, and with that what the round exchanges. The engines (the stacked
simulation, the protocol with real ciphers, the Flower deployment) never
compare a rule's name: they ask the rule object, resolved once from
``HyFDCA.step_rule`` (:func:`hyfl.algorithms.step_rules.step_rule`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hyfl.losses import Loss


@dataclass(frozen=True)
class StepRule:
    """A step rule's properties (one frozen instance per rule, see each rule's module).

    Attributes
    ----------
    name : str
        The name users pass as ``step_rule``.
    subproblem : bool
        True: each active client solves a local subproblem over its draws, with a
        model of its data from remembered inner products (the ``cocoa`` rule,
        :mod:`hyfl.algorithms.hyfdca_local`); the round then needs every sample's
        inner product, refreshes every active client's weights, searches its step
        and stores the duals as states a holder made (which a party can check,
        :mod:`hyfl.privacy.tags`). False: one step per drawn sample from the
        round's inner products, aggregated with weight ``gamma_t``; the server
        keeps the duals as running sums of steps.
        Such a rule adapts the subproblem's scaling ``sigma`` from round to round.
    tests_round : bool
        The round's aggregated step is applied only after a client judges its
        dual gain (the ``safe`` rule, :mod:`hyfl.algorithms.step_rules.safe`), which
        adapts the steps' curvature ``beta`` from the verdicts.
    advice_rejected, advice_rising, advice_not_falling : str
        What a user should try when no round was accepted, when the objective
        rises, and when it overshoots or does not fall (deployment reports,
        :mod:`hyfl.deploy.report`); ``{more}`` is a larger ``--iterations`` and
        ``{participation}`` the run's participation.
    """

    name: str
    subproblem: bool = False
    tests_round: bool = False
    advice_rejected: str = ("Run more rounds ({more}) or use HyFDCA's default rule "
                            "(step_rule=cocoa).")
    advice_rising: str = ("The {name} rule takes small steps: run more rounds ({more}), or let "
                          "each party take more steps per round (--param local_steps=N, up to "
                          "one pass over its samples).")
    advice_not_falling: str = advice_rising

    def advice(self, situation: str, **values: str) -> str:
        """The advice for ``situation`` ("rejected", "rising" or "not falling")."""
        template = {"rejected": self.advice_rejected, "rising": self.advice_rising,
                    "not falling": self.advice_not_falling}[situation]
        return template.format(name=self.name, **values)

    def dual_steps(
        self,
        loss: Loss,
        *,
        alpha: np.ndarray,
        z: np.ndarray,
        y: np.ndarray,
        sq_norms: np.ndarray,
        lam: float,
        n_samples: int,
        beta: float,
        gamma_t: float,
        client_share: np.ndarray | None = None,
        weight: np.ndarray | None = None,
    ) -> np.ndarray:
        """LocalDualMethod for a batch of drawn samples (pure; shared by every engine).

        Parameters
        ----------
        loss : hyfl.losses.Loss
        alpha, z, y : ndarray, shape (D, C)
            The client's dual copies, global inner products and labels.
        sq_norms : ndarray, shape (D,)
            ``||x_i||^2`` of the full samples.
        lam : float
        n_samples : int
        beta : float
            The safe rule's curvature multiplier.
        gamma_t : float
        weight : ndarray, shape (D, C), optional
            The samples' weights (:mod:`hyfl.losses`; default 1).
        client_share : ndarray of shape (D, 1), optional
            ``c_k`` of the theory rule (see :meth:`client_shares`; 1 when omitted).

        Returns
        -------
        ndarray, shape (D, C)
        """
        raise NotImplementedError(f"the {self.name} rule takes no per-sample steps")

    def client_shares(self, client_weight: str, client_sizes: np.ndarray,
                      n_samples: int) -> np.ndarray | None:
        """``c_k`` for each draw from its client's sample count (None: the rule has none)."""
        return None

    def round_trips(self, *, refreshed: bool, horizontal: bool,
                    refresh_inner_products: bool, ahead: bool = False) -> float:
        """Round trips of one outer iteration, counted from the messages sent.

        With partial participation this is the paper's 4.5: refreshing returning
        clients 1.5 (duals down, primal part up, weights down; ``refreshed``),
        SecureInnerProduct 1, dual updates up and new duals down 1,
        PrimalAggregation 1. Section 3.1's reductions follow from what is not
        sent: nobody to refresh (full participation) gives 3, and a ``horizontal``
        partition needs no SecureInnerProduct because each client holds whole
        samples (2). The optional second SecureInnerProduct adds 1. A rule that
        tests its round adds 1: the server sends the encrypted sums of the
        clients' gain terms and ``||dw||^2`` to one client and waits for its
        verdict before it sends the new weights.
        """
        trips = 2.0 + (1.5 if refreshed else 0.0) + (0.0 if horizontal else 1.0)
        return trips + float(refresh_inner_products) + float(self.tests_round)

    def check(self, hyfdca) -> None:
        """Raise HyflError if ``hyfdca``'s other hyperparameters do not fit this rule."""
