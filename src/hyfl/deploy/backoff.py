"""Poll waits that start short after activity and grow while idle."""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """Poll waits that start short after activity and grow to ``cap`` while idle.

    HyFDCA's messages come in bursts (a round's exchanges follow each other
    within milliseconds to a second), so a poller that just saw a message
    looks again at once, and one that has seen nothing for a while rests.
    """

    def __init__(self, cap: float, start: float = 0.001, factor: float = 1.5):
        self.cap, self.start, self.factor = cap, min(start, cap), factor
        self.wait = self.start

    def reset(self) -> None:
        """Activity: the next waits are short again."""
        self.wait = self.start

    def next(self) -> float:
        """Seconds to wait now (each call waits longer, up to ``cap``)."""
        wait = self.wait
        self.wait = min(self.wait * self.factor, self.cap)
        return wait
