"""Explicit fixed-point encoding of floats as integers for the Paillier ciphers.

A value ``v`` is encoded as the integer ``round(v * 2**precision_bits)``
(round half to even), so every value has the same absolute resolution
``2**-precision_bits`` and the rounding error of one encoding is at most half
of it. Sums of encoded values are exact integers; decoding a sum therefore
only adds the final rounding to float64. Values must be finite and satisfy
``|v| <= bound``; the largest encoded magnitude is :attr:`FixedPoint.max_int`.
"""

from __future__ import annotations

import math

import numpy as np

from hyfl.errors import check_int, check_positive, fail

# Encoded integers below this magnitude go through int64 (exact and vectorized).
_INT64_SAFE = 2**62


def check_finite(values) -> np.ndarray:
    """``values`` as a flat float64 array; raise if any is NaN or infinite."""
    v = np.asarray(values, dtype=np.float64).ravel()
    finite = np.isfinite(v)
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        raise fail(
            "value",
            f"{float(v[i])!r} at position {i} (of {v.size}) cannot be encrypted: "
            f"{int((~finite).sum())} value(s) are NaN or infinite",
            "Check the computation that produced it (a diverging step size or a "
            "division by zero); only finite numbers can be encoded.",
        )
    return v


class FixedPoint:
    """Fixed-point codec: ``int = round(v * 2**precision_bits)`` for ``|v| <= bound``."""

    def __init__(self, precision_bits: int = 32, bound: float = 2.0**16):
        self.precision_bits = check_int(
            "precision_bits",
            precision_bits,
            minimum=0,
            fix="Pass the number of fractional bits, e.g. precision_bits=32.",
        )
        if self.precision_bits > 960:
            raise fail(
                "precision_bits",
                f"is {self.precision_bits}, more than float64 values can use (960)",
                "Pass at most 960 fractional bits; 32 to 64 is typical.",
            )
        self.bound = check_positive(
            "bound", bound, fix="Pass the largest magnitude a value may have, e.g. bound=65536."
        )
        self.scale = 2**self.precision_bits
        try:
            scaled_bound = math.ldexp(self.bound, self.precision_bits)
        except OverflowError:
            scaled_bound = math.inf
        if not math.isfinite(scaled_bound):
            raise fail(
                "bound",
                f"is {self.bound:g}, too large for {self.precision_bits} fractional bits",
                "Lower bound or precision_bits.",
            )
        # Largest encoded magnitude: |round(v * scale)| <= ceil(bound * scale) for |v| <= bound.
        self.max_int = math.ceil(scaled_bound)
        self.resolution = 2.0**-self.precision_bits

    def __repr__(self) -> str:
        return f"FixedPoint(precision_bits={self.precision_bits}, bound={self.bound:g})"

    # ------------------------------------------------------------------ encoding

    def check(self, values) -> np.ndarray:
        """``values`` as a flat float64 array, after the finiteness and bound checks."""
        v = check_finite(values)
        if v.size:
            i = int(np.argmax(np.abs(v)))
            if abs(v[i]) > self.bound:
                raise fail(
                    "value",
                    f"{float(v[i])!r} at position {i} exceeds the fixed-point bound {self.bound:g} "
                    f"({int((np.abs(v) > self.bound).sum())} of {v.size} value(s) do)",
                    "Data in raw units (values in the thousands, squared norms in the "
                    "millions) overflow it: pass --standardize (hyfl run, hyfl deploy) to "
                    "divide every feature by its deviation first, or rescale the features "
                    "in the files; in Python, raise the cipher's bound "
                    "(make_cipher(..., bound=...)) or lower precision_bits to make room.",
                )
        return v

    def scaled(self, values) -> np.ndarray:
        """Checked values times ``2**precision_bits``, rounded: float64 holding integers."""
        v = self.check(values)
        return np.rint(np.ldexp(v, self.precision_bits))

    def encode(self, values) -> list[int]:
        """Python ints ``round(v * 2**precision_bits)`` of the (flattened) values."""
        s = self.scaled(values)
        if self.max_int < _INT64_SAFE:
            return s.astype(np.int64).tolist()
        # float -> int is exact, so this is exact for any magnitude.
        return [int(x) for x in s.tolist()]

    # ------------------------------------------------------------------ decoding

    def decode(self, ints) -> np.ndarray:
        """Float64 array ``int / 2**precision_bits`` (correctly rounded) of Python/gmpy2 ints."""
        a = np.asarray(ints, dtype=object)
        # float(int) rounds correctly; scaling by a power of two is then exact.
        return np.ldexp(a.astype(np.float64), -self.precision_bits)

    def describe(self) -> dict:
        return {
            "precision_bits": self.precision_bits,
            "resolution": self.resolution,
            "bound": self.bound,
            "max_int": self.max_int,
        }
