"""How many local steps FedBCD takes (``Q``): the rule the linear FedBCD
(:mod:`hyfl.algorithms.fedbcd`) and the neural one (:mod:`hyfl.neural.fedbcd_nn`) share.

It sits outside both packages because the registry in ``algorithms/__init__.py``
imports the neural algorithms: were ``neural/fedbcd_nn.py`` to import from
``hyfl.algorithms``, importing it would run that registry, which imports it back
(a cycle ``tests/test_architecture.py`` rejects).
"""

from __future__ import annotations

from hyfl.errors import check_int, fail

__all__ = ["DEFAULT_LOCAL_STEPS", "check_local_steps", "resolved_local_steps"]

DEFAULT_LOCAL_STEPS = 5
"""Q of FedBCD-p / FedBCD-s: the paper's main setting (Table 1: Q = 5 cuts the
rounds to a target AUC by 4-5x against FedSGD on MIMIC-LR)."""


def check_local_steps(variant: str, local_steps: int | None) -> None:
    """``local_steps`` is None or an integer >= 1, and exactly 1 for FedSGD (``"sgd"``)."""
    if local_steps is None:
        return
    check_int("local_steps", local_steps, minimum=1)
    if variant == "sgd" and int(local_steps) != 1:
        raise fail(
            "local_steps",
            f"is {local_steps}, but FedSGD takes exactly one step per exchange",
            'Use variant="parallel" (FedBCD-p) for Q > 1, or leave local_steps unset.',
        )


def resolved_local_steps(variant: str, local_steps: int | None) -> int:
    """Q: 1 for FedSGD, else ``local_steps`` or :data:`DEFAULT_LOCAL_STEPS`."""
    if variant == "sgd":
        return 1
    return DEFAULT_LOCAL_STEPS if local_steps is None else int(local_steps)
