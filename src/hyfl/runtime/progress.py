"""The progress bar of a long run: one line per run, with its latest relative loss.

The simulation, protocol and neural engines advance it with ``advance(t, row,
sim_time)`` after each evaluation; disabled (``--no-progress``, the estimators) it
does nothing.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ProgressBar"]


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

        count = (
            MofNCompleteColumn()
            if self.unit == "rounds"
            else TextColumn("{task.completed:.4g}/{task.total:.4g} s simulated")
        )
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            count,
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=False,
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
            if status is None:
                self._progress.update(task, completed=t)
            else:
                self._progress.update(task, completed=t, status=status)

        return advance

    def __exit__(self, *exc):
        if self.enabled:
            self._progress.__exit__(*exc)
        return False
