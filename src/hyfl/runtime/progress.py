"""The progress bar of a long run: one line per run, with its latest relative loss and
which model it is of (:func:`reported_model`).

The simulation, protocol and neural engines advance it with ``advance(t, row,
sim_time)`` after each evaluation; disabled (``--no-progress``, the estimators) it
does nothing.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MODEL_NAMES", "ProgressBar", "reported_model"]

MODEL_NAMES = ("last iterate", "average", "certified")
"""The candidate models by the ``model`` column's value (HyFDCA's: its last iterate, its
running average and the image of its certified duals; other algorithms: the last iterate)."""


def reported_model(row: dict) -> str:
    """Which model a metrics row reports, in words: ``last iterate``, ``round 3's average
    (no better pair since)``.

    ``model`` names the candidate (:data:`MODEL_NAMES`); ``model_round`` (primal-dual
    algorithms) the round it is from: the engines keep the best certified pair seen,
    so an earlier round's model stays reported until a round brings a lower objective.
    """
    index = row.get("model", 0)
    index = 0 if index is None or not np.isfinite(index) else int(index)
    name = MODEL_NAMES[index] if 0 <= index < len(MODEL_NAMES) else f"model {index}"
    kept, t = row.get("model_round"), row.get("iteration")
    if kept is None or not np.isfinite(kept) or t is None or int(kept) == int(t):
        return name
    if int(kept) == 0:
        return "the start's w = 0 (no better pair since)"
    return f"round {int(kept)}'s {name} (no better pair since)"


class ProgressBar:
    """A Rich progress bar that shows the latest relative loss, or nothing (``enabled``
    false); a context manager whose value is ``advance(t, row, sim_time=None)``."""

    def __init__(self, enabled: bool, total: float, label: str, unit: str = "rounds"):
        self.enabled, self.total, self.label, self.unit = enabled, total, label, unit

    def __enter__(self):
        if not self.enabled:
            return lambda t, row, sim_time=None: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.table import Column

        count = (
            MofNCompleteColumn()
            if self.unit == "rounds"
            else TextColumn("{task.completed:.4g}/{task.total:.4g} s simulated")
        )
        # The status last, cut at the terminal's edge: the bar, counts and times stay whole.
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=20),
            count,
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}",
                       table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
            transient=False,
            expand=True,
        )
        self._progress.__enter__()
        task = self._progress.add_task(self.label, total=self.total, status="")

        def advance(t: int, row: dict | None, sim_time: float | None = None) -> None:
            if self.unit != "rounds":
                t = min(float(sim_time or 0.0), self.total)
            status = None
            if row is not None and "status" in row:  # an engine's own words
                status = row["status"]
            elif row is not None:
                rel = row.get("relative_loss", np.nan)
                status = f"rel. loss {rel:.2e}" if np.isfinite(rel) else f"P {row['primal']:.4g}"
                status += f", {reported_model(row)}" if "model" in row else ""
            if status is None:
                self._progress.update(task, completed=t)
            else:
                self._progress.update(task, completed=t, status=status)

        return advance

    def __exit__(self, *exc):
        if self.enabled:
            self._progress.__exit__(*exc)
        return False
