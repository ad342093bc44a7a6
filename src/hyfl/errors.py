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


class JobRefused(HyflError):
    """A deployed party refuses the job for a reason the job's submitter must hear.

    Its text names only the job's own settings and public facts (the cipher
    the job asked for, a key fingerprint), never the party's files or data:
    it is the one kind of party error whose text goes back to the server
    (:func:`hyfl.deploy.party.server_text`).
    """


class TrivialModelWarning(UserWarning):
    """A fitted model is no better than trivial: its primal objective is not below the zero
    model's, or its accuracy not above always predicting the majority class (see
    :func:`hyfl.runtime.trivial.judge_trivial`)."""


class PartyFileWarning(UserWarning):
    """Party files that read, but look mistaken: a column name one letter off another
    party's (:func:`hyfl.data.parties.load_parties` records the text in
    ``meta["notices"]``; ``hyfl run`` prints it before training)."""


def fail(culprit: str, problem: str, fix: str, *,
         error: type[HyflError] = HyflError) -> HyflError:
    """Build the standard error: ``"<culprit> <problem>. <fix>"`` (of class ``error``).

    A ``problem`` that already ends in a period (it quotes another error's message,
    which ends in its fix's period, or a trailing ``...``) gets no second one.
    """
    problem = problem.rstrip()
    return error(f"{culprit} {problem}{'' if problem.endswith('.') else '.'} {fix}")


def clause(message: object) -> str:
    """An error's message without its final period, to quote inside another sentence.

    ``f"the run failed: {clause(err)}. See the log"`` reads "... again. See the log",
    not "... again.. See the log". An ellipsis (``...``) is kept.
    """
    text = str(message).rstrip()
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    return text


def is_finite(value: int | float) -> bool:
    """``math.isfinite``, False (not an OverflowError) for an int beyond float range."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


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
    if isinstance(value, str):  # "4" or "4.0" (an environment variable, a text field)
        try:
            v = int(value)
        except ValueError:
            v = int(float(value))
    else:
        v = int(value)
    if v < minimum:
        raise fail(name, f"must be >= {minimum}, got {v}", fix or f"Pass an integer >= {minimum}.")
    return v


def check_bool(name: str, value, *, fix: str = "") -> bool:
    """Return ``value`` if it is a boolean (``True``/``False``, NumPy's too), else raise:
    a string such as ``"no"`` is truthy and must not pass for one."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # NumPy's, unimported
        return bool(value)
    raise fail(name, f"must be true or false, got {value!r}", fix or "Pass true or false.")


def check_range(
    name: str, value: float, low: float, high: float = math.inf, *,
    low_open: bool = False, high_open: bool = True, fix: str = "",
) -> float:
    """Return ``value`` as float if it is a finite number between ``low`` and ``high``.

    ``low`` is included unless ``low_open``; ``high`` is excluded unless
    ``high_open`` is False (an infinite ``high`` is always excluded).
    """
    try:
        v = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError, OverflowError):
        v = math.nan
    above = v > low if low_open else v >= low
    below = v < high if (high_open or math.isinf(high)) else v <= high
    if not (math.isfinite(v) and above and below):
        if math.isinf(high):
            bound = f"{'>' if low_open else '>='} {low:g}"
        else:
            bound = (f"in {'(' if low_open else '['}{low:g}, {high:g}"
                     f"{')' if high_open else ']'}")
        raise fail(name, f"must be a number {bound}, got {value!r}",
                   fix or f"Pass a number {bound}.")
    return v


def check_choice(name: str, value: str, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise listing them."""
    choices = list(choices)
    if value not in choices:
        raise fail(
            name, f"is {value!r}, which is not known", f"Choose one of: {', '.join(choices)}."
        )
    return value
