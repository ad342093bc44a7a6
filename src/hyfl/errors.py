"""One error style for the whole library.

Every invalid input raises :class:`HyflError` (a ``ValueError``) whose message
names the culprit and says how to fix it, e.g.::

    HyflError: lam must be > 0, got -1.0. Pass a positive regularization
    strength such as --lam 1e-4.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


class HyflError(ValueError):
    """Invalid input, configuration or data; the message names culprit and fix."""


def fail(culprit: str, problem: str, fix: str) -> HyflError:
    """Build the standard error: ``"<culprit> <problem>. <fix>"``."""
    return HyflError(f"{culprit} {problem}. {fix}")


def check_positive(name: str, value: float, *, fix: str = "") -> float:
    """Return ``value`` as float if it is finite and > 0, else raise."""
    try:
        if isinstance(value, bool):  # True would silently read as 1.0
            raise TypeError
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise fail(
            name, f"must be a number, got {value!r}", fix or "Pass a positive number."
        ) from None
    if not math.isfinite(v) or v <= 0:
        raise fail(name, f"must be > 0, got {value!r}", fix or "Pass a positive number.")
    return v


def check_int(name: str, value: int, *, minimum: int = 1, fix: str = "") -> int:
    """Return ``value`` as int if it is an integer >= ``minimum``, else raise."""
    try:
        whole = not isinstance(value, bool) and float(value).is_integer()
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole:
        raise fail(
            name, f"must be an integer, got {value!r}", fix or f"Pass an integer >= {minimum}."
        )
    v = int(value)
    if v < minimum:
        raise fail(name, f"must be >= {minimum}, got {v}", fix or f"Pass an integer >= {minimum}.")
    return v


def check_fraction(name: str, value: float, *, fix: str = "") -> float:
    """Return ``value`` if it lies in (0, 1], else raise."""
    v = check_positive(name, value, fix=fix or "Pass a fraction in (0, 1].")
    if v > 1:
        raise fail(name, f"must be in (0, 1], got {value!r}", fix or "Pass a fraction in (0, 1].")
    return v


def check_choice(name: str, value: str, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise listing them."""
    choices = list(choices)
    if value not in choices:
        raise fail(
            name, f"is {value!r}, which is not known", f"Choose one of: {', '.join(choices)}."
        )
    return value
