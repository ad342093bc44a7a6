"""Numbers as the command line shows them (seconds and bytes with their units)."""

from __future__ import annotations


def format_seconds(value: float | None) -> str:
    """``1.23 s``, ``45.6 ms``, ``7.8 µs``; ``-`` for None or NaN."""
    if value is None or value != value:
        return "-"
    if value >= 1000:
        return f"{value:,.0f} s"
    if value >= 1 or value == 0:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{1e3 * value:.3g} ms"
    return f"{1e6 * value:.3g} µs"


def format_bytes(value: float) -> str:
    """``512 B``, ``1.23 kB``, ``4.56 MB`` (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1000 or unit == "GB":
            return f"{value:.3g} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1000
    return f"{value:.4g} GB"  # pragma: no cover
