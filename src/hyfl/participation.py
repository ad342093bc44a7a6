"""Participation: which clients take part in each outer iteration.

A schedule answers ``active(t, rng)`` with a bool mask over the clients for round
``t = 1, 2, ...``: everybody (:class:`Full`), a random fraction
(:class:`RandomFraction`), clients in turn (:class:`Cyclic`) or a recorded trace
(:class:`Trace`, :func:`load_trace`). :func:`parse_participation` reads the
``--participation`` text through the registry :data:`PARTICIPATIONS`. The engines
draw ``rng`` from a stream of its own, so every algorithm of a comparison sees the
same clients in every round.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hyfl.errors import fail

__all__ = ["PARTICIPATIONS", "Cyclic", "Full", "Participation", "RandomFraction", "Trace",
           "load_trace", "parse_participation"]


@runtime_checkable
class Participation(Protocol):
    """Which clients take part in outer iteration t = 1, 2, ...."""

    n_clients: int

    def active(self, t: int, rng: np.random.Generator) -> np.ndarray:
        """Bool mask of shape (n_clients,) of the clients active in round t."""
        ...


def _check_round(t: int) -> int:
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
        raise fail(
            f"round t={t!r}", "is not a round number", "Outer iterations are numbered 1, 2, ...."
        )
    return int(t)


@dataclass(frozen=True)
class Full:
    """Every client takes part in every round.

    Parameters
    ----------
    n_clients : int
    """

    n_clients: int

    def active(self, t: int, rng: np.random.Generator) -> np.ndarray:
        """All-True mask of shape (n_clients,); ``rng`` is not used."""
        _check_round(t)
        return np.ones(self.n_clients, dtype=bool)


@dataclass(frozen=True)
class RandomFraction:
    """Each client independently active with probability p (Assumption 4.7).

    Parameters
    ----------
    n_clients : int
    p : float
        In (0, 1]; the mean fraction of active clients.

    Notes
    -----
    Draws ``rng.random(n_clients)`` once per round, so a seeded generator
    reproduces the trace. A draw with no active client activates one client
    drawn uniformly (one more draw from ``rng``): a round without a party
    would cost a round trip and move nothing, and no deployment would run it.
    Each client is then active with probability ``p + (1 - p)^n / n >= p``.
    """

    n_clients: int
    p: float

    def __post_init__(self) -> None:
        # A scalar range check: cheap, and a bad p would silently skew runs.
        _check_fraction(self.p)

    def active(self, t: int, rng: np.random.Generator) -> np.ndarray:
        """Bool mask of shape (n_clients,), each entry True with probability p, never all
        False."""
        _check_round(t)
        mask = rng.random(self.n_clients) < self.p
        if not mask.any():
            mask[rng.integers(self.n_clients)] = True
        return mask


@dataclass(frozen=True)
class Cyclic:
    """Contiguous client groups take turns (Assumption 4.10).

    Parameters
    ----------
    n_clients : int
    n_groups : int
        C in 1..n_clients; groups are ``np.array_split(arange(n_clients), C)``
        and round t activates group ``(t - 1) mod C``. ``rng`` is not used.
    """

    n_clients: int
    n_groups: int

    def __post_init__(self) -> None:
        if (
            isinstance(self.n_groups, bool)
            or not isinstance(self.n_groups, (int, np.integer))
            or not 1 <= self.n_groups <= self.n_clients
        ):
            raise fail(
                "number of cyclic groups",
                f"is {self.n_groups!r} for {self.n_clients} clients",
                f"Pass an integer from 1 to {self.n_clients}, e.g. cyclic:2.",
            )

    def groups(self) -> list[np.ndarray]:
        """The client ids of each group, in turn order."""
        return np.array_split(np.arange(self.n_clients, dtype=np.int64), self.n_groups)

    def active(self, t: int, rng: np.random.Generator) -> np.ndarray:
        """Bool mask of shape (n_clients,) of group ``(t - 1) mod n_groups``."""
        t = _check_round(t)
        # np.array_split puts the extra clients in the first groups.
        base, extra = divmod(self.n_clients, self.n_groups)
        g = (t - 1) % self.n_groups
        start = g * base + min(g, extra)
        mask = np.zeros(self.n_clients, dtype=bool)
        mask[start : start + base + (g < extra)] = True
        return mask


@dataclass(frozen=True, eq=False)
class Trace:
    """An explicit participation trace, repeated when it runs out.

    Parameters
    ----------
    masks : ndarray of bool, shape (T, n_clients)
        Round t uses row ``(t - 1) mod T``; rows with no active client are
        allowed. ``rng`` is not used.
    """

    masks: np.ndarray

    def __post_init__(self) -> None:
        masks = np.asarray(self.masks, dtype=bool)
        if masks.ndim != 2 or masks.shape[0] == 0:
            raise fail(
                "participation trace",
                f"has shape {masks.shape}",
                "Give a (rounds x clients) bool array with at least one round.",
            )
        object.__setattr__(self, "masks", masks)

    @property
    def n_clients(self) -> int:
        return self.masks.shape[1]

    def active(self, t: int, rng: np.random.Generator) -> np.ndarray:
        """Bool mask of shape (n_clients,): row ``(t - 1) mod T`` of the trace."""
        t = _check_round(t)
        return self.masks[(t - 1) % self.masks.shape[0]].copy()


def load_trace(path: str | Path, n_clients: int) -> Trace:
    """Read a participation trace file.

    Parameters
    ----------
    path : str or Path
        Text file, one line per round listing the active client ids,
        separated by spaces and/or commas. A blank line or ``-`` is a round
        with no active client; lines starting with ``#`` are comments;
        trailing blank lines are ignored.
    n_clients : int

    Returns
    -------
    Trace
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise fail(
            f"trace file {str(path)!r}", f"cannot be read ({error.strerror})", "Check the path."
        ) from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    rounds: list[np.ndarray] = []
    for number, line in enumerate(lines, start=1):
        content = line.strip()
        if content.startswith("#"):
            continue
        mask = np.zeros(n_clients, dtype=bool)
        if content and content != "-":
            for token in re.split(r"[\s,]+", content.strip(", ")):
                try:
                    client = int(token)
                except ValueError:
                    raise fail(
                        f"trace file {str(path)!r} line {number}",
                        f"has {token!r}, which is not a client id",
                        "Write the active client ids of one round per line, separated by "
                        "spaces or commas (a blank line or '-' for no client).",
                    ) from None
                if not 0 <= client < n_clients:
                    raise fail(
                        f"trace file {str(path)!r} line {number}",
                        f"lists client {client}, outside 0..{n_clients - 1}",
                        f"The partition has {n_clients} clients; use ids 0 to {n_clients - 1}.",
                    )
                mask[client] = True
        rounds.append(mask)
    if not rounds:
        raise fail(
            f"trace file {str(path)!r}",
            "lists no rounds",
            "Write one line of active client ids per round.",
        )
    return Trace(np.stack(rounds))


def _check_fraction(p: Any) -> float:
    try:
        value = float(p)
    except (TypeError, ValueError):
        value = math.nan
    if not (0 < value <= 1):  # also rejects NaN
        raise fail(
            "participation fraction p",
            f"must be in (0, 1], got {p!r}",
            "Pass a fraction in (0, 1], e.g. 0.5 for half the clients per round on average.",
        )
    return value


def _fraction(p: Any, n_clients: int) -> Participation:
    p = _check_fraction(p)
    # p = 1 is full participation; Full lets engines take the cheaper path.
    return Full(n_clients) if p == 1 else RandomFraction(n_clients, p)


def _cyclic(argument: str, n_clients: int) -> Cyclic:
    try:
        n_groups = int(argument)
    except ValueError:
        raise fail(
            f"participation spec 'cyclic:{argument}'",
            "needs an integer number of groups",
            "Write cyclic:C, e.g. cyclic:2.",
        ) from None
    return Cyclic(n_clients, n_groups)


@dataclass(frozen=True)
class ParticipationKind:
    """One entry of :data:`PARTICIPATIONS`: spec form, help line, builder."""

    form: str
    help: str
    build: Callable[[str, int], Participation]


PARTICIPATIONS: dict[str, ParticipationKind] = {
    "full": ParticipationKind("full", "every client in every round", lambda a, n: Full(n)),
    "random": ParticipationKind(
        "random:P (or just P)",
        "each client independently active with probability P in (0, 1]",
        _fraction,
    ),
    "cyclic": ParticipationKind("cyclic:C", "C contiguous client groups take turns", _cyclic),
    "trace": ParticipationKind(
        "trace:PATH", "active client ids per round from a text file", load_trace
    ),
}


def _accepted_participations() -> str:
    return ", ".join(kind.form for kind in PARTICIPATIONS.values())


def parse_participation(spec: Any, n_clients: int) -> Participation:
    """Build a participation schedule from a spec.

    Parameters
    ----------
    spec : str, float or schedule
        ``"full"``, ``"1"`` or ``1.0`` -> :class:`Full`; a fraction in (0, 1)
        such as ``0.5``, ``"0.5"`` or ``"random:0.5"`` -> :class:`RandomFraction`;
        ``"cyclic:C"`` -> :class:`Cyclic`; ``"trace:PATH"`` -> :class:`Trace`
        (see :func:`load_trace`). A schedule object is returned as is after
        checking its client count.
    n_clients : int
        K, the number of clients of the partition.

    Returns
    -------
    Participation

    Raises
    ------
    HyflError
        For an unknown spec, a fraction outside (0, 1], a bad group count
        or a bad trace file.
    """
    if isinstance(spec, Participation) and not isinstance(spec, str):
        if spec.n_clients != n_clients:
            raise fail(
                "participation schedule",
                f"is for {spec.n_clients} clients but the partition has {n_clients}",
                "Build the schedule for the partition's number of clients.",
            )
        return spec
    if isinstance(spec, (int, float, np.integer, np.floating)) and not isinstance(spec, bool):
        return _fraction(spec, n_clients)
    if not isinstance(spec, str):
        raise fail(
            "participation spec",
            f"is {spec!r}",
            f"Use one of: {_accepted_participations()}.",
        )
    text = spec.strip()
    name, _, argument = text.partition(":")
    name = name.strip().lower()
    if not _:
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is not None:
            return _fraction(value, n_clients)
        if name in ("full", "all"):
            return Full(n_clients)
    elif name in PARTICIPATIONS and name != "full":
        return PARTICIPATIONS[name].build(argument.strip(), n_clients)
    raise fail(
        f"participation spec {spec!r}",
        "is not understood",
        f"Use one of: {_accepted_participations()}, e.g. 0.5 or cyclic:2.",
    )
