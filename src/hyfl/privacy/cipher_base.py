"""What every cipher provides: the :class:`Cipher` interface, its operation counts, the
shared encoding defaults and the check of received ciphertexts.

The implementations are :mod:`hyfl.privacy.ciphers` (none, Paillier, packed
Paillier; the registry :data:`~hyfl.privacy.ciphers.CIPHERS`) and
:mod:`hyfl.privacy.lattice` (CKKS); both build on this module, so neither
imports the other's internals.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields

import numpy as np

from hyfl.errors import HyflError, fail

__all__ = ["DEFAULT_BOUND", "DEFAULT_GUARD_BITS", "DEFAULT_KEY_BITS", "DEFAULT_POOL_SIZE",
           "DEFAULT_PRECISION_BITS", "MIN_KEY_BITS", "Cipher", "OpCounts", "check_ciphertexts",
           "object_array"]

DEFAULT_KEY_BITS = 2048
DEFAULT_PRECISION_BITS = 32
DEFAULT_BOUND = 2.0**16
DEFAULT_GUARD_BITS = 24
DEFAULT_POOL_SIZE = 1024  # precomputed obfuscators per packed cipher (0.5 MB at 2048 bits)
MIN_KEY_BITS = 128


# --------------------------------------------------------------------------- counts


@dataclass
class OpCounts:
    """Homomorphic operations done, counted in ciphertexts."""

    encryptions: int = 0
    decryptions: int = 0
    additions: int = 0

    def snapshot(self) -> OpCounts:
        """A copy (later operations do not change it)."""
        return OpCounts(self.encryptions, self.decryptions, self.additions)

    def __sub__(self, other: OpCounts) -> OpCounts:
        return OpCounts(
            self.encryptions - other.encryptions,
            self.decryptions - other.decryptions,
            self.additions - other.additions,
        )

    def restore(self, snapshot: OpCounts) -> None:
        """Set the counts back to ``snapshot`` (a :meth:`snapshot`): operations done
        since then are not counted (e.g. a check or monitoring that is not part of the
        protocol)."""
        for f in fields(self):
            setattr(self, f.name, getattr(snapshot, f.name))


# --------------------------------------------------------------------------- base


class Cipher(ABC):
    """An additively homomorphic cipher over chunks of ``slots`` float values."""

    name: str
    slots: int
    key_bits: int
    ciphertext_bytes: int
    counts: OpCounts
    has_private_key: bool

    @abstractmethod
    def encrypt(self, chunks: np.ndarray) -> np.ndarray:
        """Float chunks ``(n, slots)`` -> 1-D object array of ``n`` ciphertexts."""

    @abstractmethod
    def decrypt(self, ciphertexts: np.ndarray) -> np.ndarray:
        """1-D object array of ``n`` ciphertexts -> float array ``(n, slots)``."""

    def decrypt_integers(self, ciphertexts: np.ndarray) -> np.ndarray:
        """Like :meth:`decrypt`, as the exact fixed-point integers ``round(v * 2**p)`` of the
        decrypted sums (object array ``(n, slots)``), where the cipher encodes values so;
        ``decrypt`` equals their ``int / 2**p``. For checks that need every bit
        (:mod:`hyfl.privacy.tags`) of sums beyond float64's 53."""
        raise NotImplementedError(f"the {self.name!r} cipher has no fixed-point integers")

    @abstractmethod
    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Elementwise homomorphic sum of two equal-length ciphertext arrays."""

    @abstractmethod
    def public(self) -> Cipher:
        """The server's view: same scheme and public key, no private key, own counts."""

    @abstractmethod
    def zeros(self, n: int) -> np.ndarray:
        """``n`` trivial ciphertexts of zero (not counted as encryptions).

        The server starts from duals and inner products that everyone knows
        are zero; a deterministic encryption of that public value hides
        nothing and costs nothing, and sums with it are ordinary ciphertexts.
        """

    @abstractmethod
    def describe(self) -> dict:
        """JSON-ready parameters: name, slots, key_bits, precision, bounds, ..."""

    def __repr__(self) -> str:
        role = "private" if self.has_private_key else "public view"
        return (
            f"<{type(self).__name__} {self.name!r}, {self.key_bits}-bit, "
            f"{self.slots} slots, {role}>"
        )

    # ------------------------------------------------------------------ helpers

    def _chunks(self, chunks) -> np.ndarray:
        try:
            x = np.asarray(chunks, dtype=np.float64)
        except (TypeError, ValueError):
            raise fail(
                "chunks",
                f"cannot be read as a float array (got {type(chunks).__name__})",
                f"Pass a float array of shape (n, {self.slots}).",
            ) from None
        if x.ndim != 2 or x.shape[1] != self.slots:
            raise fail(
                "chunks",
                f"have shape {x.shape}, but cipher {self.name!r} takes (n, {self.slots})",
                f"Lay the values out in rows of cipher.slots = {self.slots} "
                "(zero-pad the last row).",
            )
        return x

    def _ciphertexts(self, ciphertexts, what: str = "ciphertexts") -> np.ndarray:
        if isinstance(ciphertexts, np.ndarray) and ciphertexts.dtype == object:
            a = ciphertexts
        else:
            a = np.empty(len(ciphertexts), dtype=object)
            a[:] = list(ciphertexts)
        if a.ndim != 1:
            raise fail(
                what,
                f"have shape {a.shape}, but ciphertext arrays are 1-D",
                "Pass the 1-D object array returned by encrypt() or add().",
            )
        return a

    def _pair(self, a, b) -> tuple[np.ndarray, np.ndarray]:
        a = self._ciphertexts(a, "a")
        b = self._ciphertexts(b, "b")
        if a.shape != b.shape:
            raise fail(
                "add",
                f"got {a.size} and {b.size} ciphertexts",
                "Add two arrays of equal length (one ciphertext per chunk each).",
            )
        return a, b

    def _no_private_key(self) -> HyflError:
        return fail(
            f"decrypt on the public view of cipher {self.name!r}",
            "is impossible: the server holds no private key",
            "Decrypt on a client's cipher (the one make_cipher returned), not on cipher.public().",
        )


def object_array(items: list) -> np.ndarray:
    """``items`` as a 1-D object array (ciphertexts are Python objects)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def check_ciphertexts(a: np.ndarray, kind: type, tag: int, cipher: str, what: str,
                      max_addends: int | None) -> None:
    """Refuse ciphertexts of another cipher or key, and addend counts that cannot be genuine.

    The addend count travels with a ciphertext (the packed cipher subtracts that many
    offsets on decryption, the lattice cipher bounds its noise with it), so a tampered
    count must not pass: it must be an integer in ``0..max_addends`` (``None``: no
    upper bound).
    """
    for i, x in enumerate(a):
        if type(x) is not kind or x.tag != tag:
            raise fail(
                what,
                f"hold {x!r}, which was not made by this {cipher!r} cipher or its public view",
                "Only combine ciphertexts made under the same cipher and key pair.",
            )
        k = x.addends
        if type(k) is not int or k < 0 or (max_addends is not None and k > max_addends):
            raise fail(
                f"{what}[{i}]",
                f"carries an addend count of {k!r}; a genuine one is an integer in "
                f"0..{'any' if max_addends is None else max_addends}",
                "The ciphertext's metadata was altered or corrupted in transit: discard the "
                "message and have the sender send it again.",
            )
