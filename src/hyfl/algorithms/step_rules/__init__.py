"""HyFDCA's step rules, one module each, and the one place a rule's name is resolved.

``cocoa`` (the default) solves a local subproblem per client and searches the
step; ``safe``, ``theory`` and ``paper`` take one dual step per drawn sample.
Each module defines its :class:`StepRule` instance ``RULE``; the engines ask
that object (:attr:`hyfl.algorithms.hyfdca.HyFDCA.rule`) and never compare
names.
"""

from __future__ import annotations

from hyfl.algorithms.step_rules import cocoa, paper, safe, theory
from hyfl.algorithms.step_rules.base import StepRule

RULES: dict[str, StepRule] = {module.RULE.name: module.RULE
                              for module in (cocoa, safe, theory, paper)}
"""The step rules by name, in the order of :data:`hyfl._names.STEP_RULES` (a test checks)."""

def step_rule(name: str) -> StepRule:
    """The rule called ``name`` (validate the name first: ``HyFDCA.validated``)."""
    return RULES[name]


__all__ = ["RULES", "StepRule", "step_rule"]
