"""Does a party see anything derived from another party's private values?

The tests of the protocol engine and of the Flower deployment collect every
private plaintext of the clients (what they encrypted and decrypted: duals,
dual steps, partial inner products, norms; their data: X entries and
labels) and everything the server receives and holds, and ask
:func:`audit` whether any number there is such a value in disguise.
A numeric array (or the scalars of one message, taken together) is flagged
when its values, after dropping zeros and small integers (indices, counts
and sizes), are, within their precision (exact for floats up to rounding;
half a unit for integers, i.e. fixed point), private values under

* a fixed scale ``c = ±1, ±2**k (k = 1..64), ±10**k (k = 1..12)``: float
  copies, negations, fixed-point encodings (``round(alpha * 2**32)`` as
  int64) -- a single value suffices;
* any scale ``c`` (three or more distinct values, at least three of them,
  and at least half of them for integers, explained by the same ``c``);
* an offset ``d`` after one of a set of common scales
  (:data:`OFFSET_SCALES`): ``v + d``, ``round((v + d) * 2**32)`` (three or
  more distinct values, likewise).

What it cannot see: values with two distinct values or fewer under an
arbitrary scale (any number is *some* multiple of a private one), binary
labels (±1 look like any sign vector), coarse quantisations (integers below
2**20 are taken as indices and counts), nonlinear transforms, and anything
inside ciphertexts (integers beyond 2**64 are skipped; the tests check that
those are residues modulo n**2 separately).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["OFFSET_SCALES", "RecordingCipher", "audit", "explain", "numeric_leaves",
           "private_values"]

REL = 1e-12  # relative precision of a float copy (float64 rounding is ~1e-16)
TINY = 1e-9  # private values smaller than this are not told apart from zero
SMALL_INT = 2**20  # integers below this are indices, counts and sizes
FIXED_SCALES = np.array([1.0, *(2.0 ** np.arange(1, 65)), *(10.0 ** np.arange(1, 13))])
OFFSET_SCALES = np.array([1.0, 2.0**16, 2.0**20, 2.0**24, 2.0**30, 2.0**31, 2.0**32, 2.0**40,
                          2.0**48, 2.0**52, 2.0**53, 2.0**62, 2.0**63, 2.0**64, 1e3, 1e6, 1e9])
_SEEDS, _FIRST, _SAMPLE = 3, 6, 64


class RecordingCipher:
    """A client cipher that keeps every plaintext it encrypts or decrypts (``secrets``)."""

    def __init__(self, cipher):
        self._cipher = cipher
        self.secrets: list[np.ndarray] = []

    def __getattr__(self, name):
        return getattr(self._cipher, name)

    def encrypt(self, chunks):
        self.secrets.append(np.array(chunks, dtype=float).ravel())
        return self._cipher.encrypt(chunks)

    def decrypt(self, ciphertexts):
        out = self._cipher.decrypt(ciphertexts)
        self.secrets.append(np.asarray(out, dtype=float).ravel())
        return out

    def public(self):
        return self._cipher.public()


def private_values(*sources: Any) -> np.ndarray:
    """Sorted distinct private values (finite, ``|v| > 1e-9``) of arrays, scalars and
    sparse matrices (their stored entries), or lists of them."""
    parts = []
    for source in sources:
        if hasattr(source, "tocoo"):  # a scipy sparse matrix: its stored entries
            source = source.tocoo().data
        if isinstance(source, (list, tuple)) and source and not np.isscalar(source[0]):
            parts.append(private_values(*source))
            continue
        values = np.asarray(source, dtype=float).ravel()
        parts.append(values[np.isfinite(values) & (np.abs(values) > TINY)])
    return np.unique(np.concatenate(parts)) if parts else np.empty(0)


def numeric_leaves(tree: Any, skip: Iterable[str] = (), path: str = "",
                   _seen: set | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Every numeric value in a tree of dicts, lists, arrays and objects, as ``(path, array)``.

    Keys (or attribute names) in ``skip`` are left out with everything below
    them; bools, strings and integers beyond 2**64 (ciphertext residues) too.
    Python and NumPy scalars come as arrays of one value.
    """
    seen = set() if _seen is None else _seen
    skip = frozenset(skip)
    if id(tree) in seen:
        return
    if isinstance(tree, (dict, list, tuple, np.ndarray)) or hasattr(tree, "__dict__"):
        seen.add(id(tree))
    if isinstance(tree, (bool, np.bool_, str, bytes)) or tree is None:
        return
    if isinstance(tree, (int, np.integer)) or (hasattr(tree, "__index__")
                                               and not isinstance(tree, np.ndarray)):
        if abs(int(tree)) < 2**64:
            yield path, np.array([float(tree)])
        return
    if isinstance(tree, (float, np.floating)):
        yield path, np.array([float(tree)])
        return
    if isinstance(tree, np.ndarray):
        if tree.dtype.kind in "iuf":
            yield path, tree
        elif tree.dtype == object:
            for i, item in enumerate(tree.ravel()):
                yield from numeric_leaves(item, skip, f"{path}[{i}]", seen)
        return
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple, set, frozenset)):
        items = ((str(i), v) for i, v in enumerate(tree))
    elif hasattr(tree, "__dict__") and not isinstance(tree, type):
        items = vars(tree).items()
    elif hasattr(tree, "__slots__"):
        items = ((s, getattr(tree, s)) for s in tree.__slots__ if hasattr(tree, s))
    else:
        return
    for key, value in items:
        if str(key) in skip:
            continue
        yield from numeric_leaves(value, skip, f"{path}.{key}" if path else str(key), seen)


def _member(b: np.ndarray, tol: np.ndarray, private: np.ndarray) -> np.ndarray:
    """Whether each ``b`` is within ``tol`` of some private value."""
    lo = np.searchsorted(private, b - tol, side="left")
    ok = lo < private.size
    ok[ok] = private[lo[ok]] <= (b + tol)[ok]
    return ok


def _prepare(values: Any) -> tuple[np.ndarray, np.ndarray, bool]:
    """Distinct nonzero values worth checking, their relative precision, integer-valued?"""
    a = np.asarray(values)
    if a.dtype.kind not in "iuf" or a.size == 0:
        return np.empty(0), np.empty(0), False
    a = a.astype(float).ravel()
    a = np.unique(a[np.isfinite(a) & (a != 0)])
    integral = bool(a.size) and bool(np.all(a == np.round(a)))
    if integral:
        a = a[np.abs(a) >= SMALL_INT]
    rel = (0.5 / np.abs(a) if integral else np.zeros(a.size)) + REL
    return a, rel, integral


def _spread(n: int, k: int) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(n, k)).round().astype(int))


def _offset_hits(b: np.ndarray, rel: np.ndarray, s: int, t: int, offsets: np.ndarray,
                 private: np.ndarray) -> np.ndarray:
    """Whether ``b[t] - offset`` is private, for each candidate offset (``b[s] - p``).

    A match only counts if ``b[t]`` and ``b[s]`` are told apart at that precision and
    beyond the ciphers' fixed-point resolution (2**-32; private values come in such
    pairs, encrypted and decrypted): otherwise tiny differences would match anywhere.
    """
    tol = (np.abs(b[t]) * rel[t] + np.abs(b[s]) * rel[s] + REL * np.abs(offsets) + TINY * 1e-3)
    apart = abs(b[t] - b[s]) > np.maximum(2 * tol, 2.0**-28)
    return _member(b[t] - offsets, tol, private) & apart


def explain(values: Any, private: np.ndarray) -> str | None:
    """How ``values`` derive from the sorted ``private`` values, or None if they do not seem to."""
    a, rel, integral = _prepare(values)
    n = a.size
    if n == 0 or private.size == 0:
        return None
    sample = _spread(n, _SAMPLE)
    a_s, rel_s = a[sample], rel[sample]
    need = min(a_s.size, 3 if not integral else max(3, -(-a_s.size // 2)))
    # 1. A fixed scale, no offset: copies, negations, fixed point (one value suffices).
    for c in FIXED_SCALES:
        for sign in (1.0, -1.0):
            b = a_s / (sign * c)
            hits = int(_member(b, np.abs(b) * rel_s + TINY * 1e-3, private).sum())
            if hits >= min(a_s.size, max(1, -(-a_s.size // 2))):
                return f"{hits} of {a_s.size} values are private values times {sign * c:g}"
    if a_s.size < 3:
        return None
    seeds = _spread(a_s.size, _SEEDS)
    # 2. Any scale: candidate scales a_seed / p, kept if they explain other values too.
    for s in seeds:
        scales = a_s[s] / private
        others = np.delete(np.arange(a_s.size), s)
        count = np.zeros(scales.size, dtype=int)
        for t in others[:_FIRST]:
            b = a_s[t] / scales
            count += _member(b, np.abs(b) * (rel_s[s] + rel_s[t]) + TINY * 1e-3, private)
        keep = np.flatnonzero(count > 0)
        for t in others[_FIRST:]:
            b = a_s[t] / scales[keep]
            count[keep] += _member(b, np.abs(b) * (rel_s[s] + rel_s[t]) + TINY * 1e-3,
                                   private)
        best = int(np.argmax(count))
        if count[best] + 1 >= need:
            return (f"{count[best] + 1} of {a_s.size} values are private values times "
                    f"{scales[best]:.6g}")
    # 3. An offset after a common scale.
    for c in OFFSET_SCALES:
        for sign in (1.0, -1.0):
            b_all = a_s / (sign * c)
            for s in seeds:
                offsets = b_all[s] - private
                others = np.delete(np.arange(a_s.size), s)
                count = np.zeros(offsets.size, dtype=int)
                for t in others[:_FIRST]:
                    count += _offset_hits(b_all, rel_s, s, t, offsets, private)
                keep = np.flatnonzero(count > 0)
                for t in others[_FIRST:]:
                    count[keep] += _offset_hits(b_all, rel_s, s, t, offsets[keep], private)
                best = int(np.argmax(count))
                if count[best] + 1 >= need:
                    return (f"{count[best] + 1} of {a_s.size} values are (private value + "
                            f"{offsets[best]:.6g}) times {sign * c:g}")
    return None


def audit(observed: Iterable[tuple[str, Any]], private: np.ndarray,
          skip: Iterable[str] = ()) -> list[str]:
    """Findings (one line each) for what a party observed; empty if nothing looks private.

    ``observed`` holds ``(label, tree)`` pairs: a message and where it came
    from, or a piece of held state. Each numeric array of each tree is
    checked (:func:`explain`), and so are the scalars of each tree together.
    ``skip`` names keys that are meant to be plaintext (the model, its parts).
    """
    findings, done = [], set()
    for label, tree in observed:
        scalars, names = [], []
        for path, array in numeric_leaves(tree, skip):
            if array.size == 1:
                scalars.append(float(array.ravel()[0]))
                names.append(path or "value")
            key = (array.dtype.str, array.shape, array.tobytes())
            if key in done:
                continue
            done.add(key)
            why = explain(array, private)
            if why is not None:
                findings.append(f"{label}: {path or 'value'} ({array.dtype}, "
                                f"{array.size} values): {why}")
        if len(scalars) > 1:
            why = explain(np.array(scalars), private)
            if why is not None:
                findings.append(f"{label}: its scalars {', '.join(names)} together: {why}")
    return findings
