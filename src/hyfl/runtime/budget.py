"""A run's budget and evaluation schedule: one place for what the three engines share.

The stacked engine (:func:`hyfl.runtime.simulation.simulate`), the message-level
engine (:func:`hyfl.runtime.protocol.run_protocol`) and the neural engine
(:func:`hyfl.neural.engine.run`) all run outer iterations under a :class:`Budget`:

* ``iterations`` rounds at most; with ``sim_time``, until the cumulative
  simulated time reaches that many seconds (the round that crosses it is the
  last, and is evaluated);
* an evaluation every ``eval_every`` rounds, after the last round and after the
  round that crosses the ``sim_time`` budget;
* ``stop_when(row) -> str | None``, asked after each evaluation of a round (not
  of the start, iteration 0): a string is the reason to end the run there.

What ended a run is its result's ``config["stopped_by"]`` (:data:`STOPPED_BY`):
``"iterations"`` (the cap on rounds), ``"sim_time"`` (the simulated-time
budget), ``"stop_when"`` (the caller's condition; its reason is
``config["stop_reason"]``), or ``"diverged"`` (the result attached to the
divergence error, ``err.result``, of the stacked engine). When a round meets
more than one, ``stop_when`` wins over ``sim_time``, and that over ``iterations``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hyfl.errors import check_int, check_positive, fail
from hyfl.runtime.progress import ProgressBar

__all__ = ["Budget", "STOPPED_BY", "StopWhen", "budget_record", "check_sim_time_budget"]

StopWhen = Callable[[dict[str, float]], str | None]
"""``stop_when(row)``: a round's evaluated metrics row -> None to go on, or why to stop."""

STOPPED_BY = ("iterations", "sim_time", "stop_when", "diverged")
"""The values of a result's ``config["stopped_by"]`` (see the module docstring)."""


def check_sim_time_budget(stop_sim_time: float | None) -> float | None:
    """``None`` or a positive, finite number of simulated seconds."""
    if stop_sim_time is None:
        return None
    return check_positive(
        "sim_time budget",
        stop_sim_time,
        fix="Pass simulated seconds > 0, e.g. budget = { sim_time = 10800.0, ... }.",
    )


def budget_record(iterations: int, stop_sim_time: float | None) -> dict[str, float | int]:
    """The budget as recorded in results: ``{iterations}`` or ``{sim_time, max_iterations}``."""
    if stop_sim_time is None:
        return {"iterations": int(iterations)}
    return {"sim_time": float(stop_sim_time), "max_iterations": int(iterations)}


@dataclass(frozen=True)
class Budget:
    """How long a run lasts and when it is evaluated (validated on construction).

    Parameters
    ----------
    iterations : int
        Most outer iterations (rounds).
    eval_every : int, default 1
        Evaluate every this many rounds (and always after the last one).
    sim_time : float, optional
        Simulated-time budget in seconds.
    stop_when : callable, optional
        ``stop_when(row) -> str | None`` (see the module docstring).
    """

    iterations: int
    eval_every: int = 1
    sim_time: float | None = None
    stop_when: StopWhen | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "iterations", check_int("iterations", self.iterations, minimum=1))
        set_(self, "eval_every", check_int("eval_every", self.eval_every, minimum=1))
        set_(self, "sim_time", check_sim_time_budget(self.sim_time))
        if self.stop_when is not None and not callable(self.stop_when):
            raise fail("stop_when", f"is {self.stop_when!r}, not a function",
                       "Pass a function of a metrics row returning None or a reason to stop.")

    def crossed(self, sim_time: float) -> bool:
        """Whether a cumulative simulated time of ``sim_time`` uses up the budget."""
        return self.sim_time is not None and sim_time >= self.sim_time

    def evaluates(self, t: int, crossed: bool) -> bool:
        """Whether round ``t`` is evaluated (``crossed``: it used up the sim_time budget)."""
        return t % self.eval_every == 0 or t == self.iterations or crossed

    def reason(self, row: dict[str, float]) -> str | None:
        """``stop_when(row)``, checked: None, or a non-empty string."""
        if self.stop_when is None:
            return None
        reason = self.stop_when(row)
        if reason is not None and not (isinstance(reason, str) and reason):
            raise fail("stop_when", f"returned {reason!r}",
                       "Return None to go on, or the reason to stop as a non-empty string.")
        return reason

    def stopped_by(self, t: int, crossed: bool, row: dict[str, float] | None
                   ) -> tuple[str | None, str | None]:
        """After round ``t`` (``row``: its evaluation, or None): ``(stopped_by, reason)``,
        ``(None, None)`` while the run goes on."""
        reason = self.reason(row) if row is not None else None
        if reason is not None:
            return "stop_when", reason
        if crossed:
            return "sim_time", None
        if t >= self.iterations:
            return "iterations", None
        return None, None

    def record(self) -> dict[str, float | int]:
        """:func:`budget_record` of this budget."""
        return budget_record(self.iterations, self.sim_time)

    def end_record(self, rounds: int, stopped_by: str, reason: str | None) -> dict:
        """What a result's config records of how its run ended: the budget, the rounds run,
        ``stopped_by`` and, for ``stop_when``, its ``stop_reason``."""
        return {"iterations": self.iterations, "rounds": int(rounds), "budget": self.record(),
                "stopped_by": stopped_by,
                **({"stop_reason": reason} if reason is not None else {})}

    def progress_bar(self, enabled: bool, label: str) -> ProgressBar:
        """The run's progress bar: over rounds, or over simulated seconds with ``sim_time``."""
        if self.sim_time is None:
            return ProgressBar(enabled, self.iterations, label, unit="rounds")
        return ProgressBar(enabled, self.sim_time, label, unit="sim_time")
