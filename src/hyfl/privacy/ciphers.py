"""Additively homomorphic ciphers behind one small interface.

Four ciphers, chosen by name through :func:`make_cipher` (registry
:data:`CIPHERS`):

``none``
    Plaintext pass-through: ciphertexts are the exact Python floats, one value
    per "ciphertext". Every operation is still counted and the server's view
    (:meth:`Cipher.public`) still cannot decrypt, so protocol code runs the
    same paths as with real encryption.
``paillier``
    Real Paillier (python-paillier keys, gmpy2 arithmetic), one fixed-point
    value per ciphertext (:class:`~hyfl.privacy.encoding.FixedPoint`; negative
    values are ``n - |x|`` modulo ``n``).
``packed``
    Paillier with the same key, several fixed-point values packed into one
    plaintext (see :class:`PackedPaillierCipher`), so one encryption,
    decryption or addition handles ``slots`` values at once.
``ckks``
    The CKKS lattice scheme (:mod:`hyfl.privacy.lattice`): 4096 values per
    ciphertext, decrypted values rounded to the same fixed-point grid.

All ciphers take ``chunks`` of shape ``(n, slots)`` and produce a 1-D object
array of ``n`` ciphertexts; :class:`OpCounts` counts ciphertexts (one
encryption of a packed chunk is one encryption).

Arithmetic. Ciphertexts of the Paillier ciphers are :class:`PaillierCiphertext`
objects around a gmpy2 integer ``c`` modulo ``n**2`` (addition is the
ciphertext product mod ``n**2``). Encryption and decryption are the textbook
Paillier operations with ``g = n + 1`` as in python-paillier (its
``raw_encrypt`` / ``raw_decrypt`` give and accept the same integers; the tests
check this), done directly in gmpy2 to avoid per-call int conversions:

* decryption uses the CRT over ``p**2`` and ``q**2`` exactly as
  python-paillier's ``raw_decrypt``;
* encryption with the private key (the clients hold it) draws the random
  ``n``-th residue ``r**n mod n**2`` through the CRT as well: modulo ``p**2``
  the ``n``-th residues are the order-``(p - 1)`` subgroup, whose uniformly
  random element is ``u**p mod p**2`` for uniform ``u`` in ``[1, p)`` (and
  likewise for ``q``). This gives exactly the distribution of ``r**n mod n**2``
  for uniform ``r`` (valid keys have ``gcd(n, phi(n)) = 1``) at about a third
  of the cost. The server's public view has no factors and computes
  ``r**n mod n**2`` directly.

Randomness for encryption comes from the operating system (:mod:`secrets`),
never from NumPy's generators.
"""

from __future__ import annotations

import functools
import inspect
import secrets
import time
from collections.abc import Callable

import gmpy2
import numpy as np
from gmpy2 import mpz
from phe import paillier as _phe

from hyfl._threads import thread_count
from hyfl.errors import check_choice, check_int, fail
from hyfl.privacy._workers import ObfuscatorPool, powmods
from hyfl.privacy.cipher_base import (  # noqa: F401  (the interface, re-exported)
    DEFAULT_BOUND,
    DEFAULT_GUARD_BITS,
    DEFAULT_KEY_BITS,
    DEFAULT_POOL_SIZE,
    DEFAULT_PRECISION_BITS,
    MIN_KEY_BITS,
    Cipher,
    OpCounts,
    check_ciphertexts,
    object_array,
)
from hyfl.privacy.encoding import FixedPoint, check_finite

# --------------------------------------------------------------------------- none


class PlainCipher(Cipher):
    """``none``: exact floats as ciphertexts, one value each; operations still counted."""

    name = "none"
    slots = 1
    key_bits = 0
    ciphertext_bytes = 8

    def __init__(self, *, _private: bool = True):
        self.counts = OpCounts()
        self.has_private_key = _private

    def encrypt(self, chunks: np.ndarray) -> np.ndarray:
        x = self._chunks(chunks)
        check_finite(x)
        self.counts.encryptions += x.shape[0]
        return object_array(x[:, 0].tolist())

    def decrypt(self, ciphertexts: np.ndarray) -> np.ndarray:
        if not self.has_private_key:
            raise self._no_private_key()
        a = self._ciphertexts(ciphertexts)
        self.counts.decryptions += a.size
        return a.astype(np.float64).reshape(a.size, 1)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._pair(a, b)
        self.counts.additions += a.size
        return a + b

    def public(self) -> PlainCipher:
        return PlainCipher(_private=False)

    def zeros(self, n: int) -> np.ndarray:
        return object_array([0.0] * int(n))

    def describe(self) -> dict:
        return {
            "name": self.name,
            "slots": self.slots,
            "key_bits": self.key_bits,
            "ciphertext_bytes": self.ciphertext_bytes,
            "precision": None,  # exact float64, not encoded
            "bounds": None,
        }


# --------------------------------------------------------------------------- Paillier core


class PaillierCiphertext:
    """One Paillier ciphertext ``c`` (gmpy2 integer mod ``n**2``).

    ``addends`` is how many fresh encryptions were summed into it (1 when
    fresh); ``tag`` identifies the cipher (and key) that made it: a random
    64-bit integer shared by a cipher and its public views (it survives pickling).
    """

    __slots__ = ("c", "addends", "tag")

    def __init__(self, c, addends: int, tag: int):
        self.c = c
        self.addends = addends
        self.tag = tag

    def __repr__(self) -> str:
        return f"<PaillierCiphertext of {self.addends} addend(s), {self.c.bit_length()} bits>"

    def __deepcopy__(self, memo) -> PaillierCiphertext:
        # Immutable: every operation makes a new ciphertext, so a copy of a state that
        # holds ciphertexts (the coordinator's snapshot of the server at each round's
        # start) can share them; copying them took half the server's time a round.
        return self


class _PaillierKey:
    """Paillier arithmetic on raw integers with a python-paillier key pair (gmpy2).

    Parameters
    ----------
    public_key, private_key
        A python-paillier key pair (``private_key`` None: the public view).
    workers : int, default 1
        Threads for the modular exponentiations of one call (1: none).
    pool_size : int, default 0
        Obfuscators kept precomputed by a background thread (0: none); see
        :class:`~hyfl.privacy._workers.ObfuscatorPool`. The pool never leaves
        this object's memory: pickling or copying the key drops it.
    """

    def __init__(self, public_key, private_key=None, *, workers: int = 1, pool_size: int = 0):
        self.public_key = public_key
        self.private_key = private_key
        self.n = mpz(public_key.n)
        self.nsq = self.n * self.n
        self.key_bits = int(self.n.bit_length())
        self.max_int = mpz(public_key.max_int)  # python-paillier's safe signed range
        self.workers = check_int("workers", workers, minimum=1,
                                 fix="Pass how many threads may encrypt and decrypt, e.g. 2.")
        self.pool_size = check_int("pool_size", pool_size, minimum=0,
                                   fix="Pass how many obfuscators to precompute, or 0 for none.")
        if private_key is not None:
            p, q = mpz(private_key.p), mpz(private_key.q)
            self.p, self.q = p, q
            self.psq, self.qsq = p * p, q * q
            self.p_inverse = mpz(private_key.p_inverse)  # p^-1 mod q
            self.hp, self.hq = mpz(private_key.hp), mpz(private_key.hq)
            self.psq_inverse = gmpy2.invert(self.psq, self.qsq)  # (p^2)^-1 mod q^2
            self._residue_key = (p, q, self.psq, self.qsq, self.psq_inverse)
        else:
            self._residue_key = (self.n, self.nsq)
        self._pool = self._new_pool()

    def _new_pool(self) -> ObfuscatorPool | None:
        if not self.pool_size:
            return None
        # The filler gets the numbers it needs, not this key (nor, so, the pool itself).
        make = functools.partial(_PaillierKey._fresh_obfuscators, self._residue_key, 1)
        return ObfuscatorPool(make, self.pool_size)

    def __getstate__(self) -> dict:
        # Obfuscators are as secret as the plaintexts they will hide: never pickled or copied.
        state = dict(self.__dict__)
        state["_pool"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pool = self._new_pool()

    @property
    def has_private_key(self) -> bool:
        return self.private_key is not None

    def public(self) -> _PaillierKey:
        # The server adds; it has no use for precomputed obfuscators.
        return _PaillierKey(self.public_key, workers=self.workers)

    @staticmethod
    def _fresh_obfuscators(residue_key: tuple, workers: int, count: int) -> list:
        """``count`` new uniformly random ``n``-th residues mod ``n**2`` (see module doc).

        ``residue_key`` is ``(p, q, p**2, q**2, (p**2)^-1 mod q**2)`` with the
        private key (CRT), else ``(n, n**2)``.
        """
        if count == 0:
            return []
        if len(residue_key) == 2:
            n, nsq = residue_key
            rs = [secrets.randbelow(int(n) - 1) + 1 for _ in range(count)]
            return powmods([(rs, n, nsq)], workers)[0]
        p, q, psq, qsq, inv = residue_key
        up = [secrets.randbelow(int(p) - 1) + 1 for _ in range(count)]
        uq = [secrets.randbelow(int(q) - 1) + 1 for _ in range(count)]
        sp, sq = powmods([(up, p, psq), (uq, q, qsq)], workers)
        return [a + psq * (((b - a) * inv) % qsq) for a, b in zip(sp, sq)]

    def obfuscators(self, count: int) -> list:
        """``count`` uniformly random ``n``-th residues mod ``n**2``, each used once.

        Taken from the pool of precomputed ones first (each leaves the pool as
        it is taken), the rest made now over ``workers`` threads.
        """
        pooled = self._pool.take(count) if self._pool is not None and count else []
        missing = count - len(pooled)
        return pooled + self._fresh_obfuscators(self._residue_key, self.workers, missing)

    def encrypt_ints(self, plaintexts: list) -> list:
        """Ciphertexts ``(1 + n*m) * r**n mod n**2`` of integers ``m`` (taken mod ``n``)."""
        n, nsq = self.n, self.nsq
        rn = self.obfuscators(len(plaintexts))
        return [((1 + n * m) % nsq) * s % nsq for m, s in zip(plaintexts, rn)]

    def decrypt_ints(self, cs: list) -> list:
        """Plaintexts in ``[0, n)`` of raw ciphertexts (python-paillier's ``raw_decrypt``)."""
        if not cs:
            return []
        p, q, psq, qsq = self.p, self.q, self.psq, self.qsq
        xp, xq = powmods([(cs, p - 1, psq), (cs, q - 1, qsq)], self.workers)
        hp, hq, p_inv = self.hp, self.hq, self.p_inverse
        out = []
        for a, b in zip(xp, xq):
            mp = ((a - 1) // p) * hp % p
            mq = ((b - 1) // q) * hq % q
            out.append(mp + ((mq - mp) * p_inv % q) * p)
        return out


def _keypair(key_bits: int | None, keypair) -> tuple:
    """A python-paillier key pair: the given one, or a fresh one of ``key_bits``."""
    if keypair is not None:
        try:
            public_key, private_key = keypair
            n = int(public_key.n)
        except (TypeError, ValueError, AttributeError):
            raise fail(
                "keypair",
                f"is {type(keypair).__name__}, not a python-paillier (public, private) pair",
                "Pass the pair returned by phe.paillier.generate_paillier_keypair().",
            ) from None
        # (public, None) builds the public view directly: a server that only has the
        # public key (a deployment) never holds a private one, even briefly.
        if private_key is not None and int(private_key.p) * int(private_key.q) != n:
            raise fail(
                "keypair",
                "has a private key that does not match its public key",
                "Pass the pair returned by phe.paillier.generate_paillier_keypair().",
            )
        if key_bits is not None and n.bit_length() != key_bits:
            raise fail(
                "key_bits",
                f"is {key_bits}, but the given keypair has {n.bit_length()} bits",
                "Leave key_bits out when passing keypair.",
            )
        return public_key, private_key
    bits = check_keybits(DEFAULT_KEY_BITS if key_bits is None else key_bits)
    return _phe.generate_paillier_keypair(n_length=bits)


def check_keybits(key_bits: int) -> int:
    """Validate a Paillier modulus size (an even number of bits >= 128)."""
    bits = check_int(
        "key_bits",
        key_bits,
        minimum=MIN_KEY_BITS,
        fix="Pass a modulus size in bits such as 2048 (tests may use 512 or 1024).",
    )
    if bits % 2:
        raise fail("key_bits", f"is {bits}, an odd number", "Pass an even size such as 2048.")
    return bits


def _check_tags(a: np.ndarray, tag: int, cipher: str, what: str, nsq,
                max_addends: int | None) -> None:
    """:func:`check_ciphertexts` for Paillier, and each ciphertext in ``[1, n^2)``."""
    check_ciphertexts(a, PaillierCiphertext, tag, cipher, what, max_addends)
    for i, x in enumerate(a):
        if not 0 < x.c < nsq:
            raise fail(
                f"{what}[{i}]",
                "is not an integer in [1, n^2) of this key",
                "The ciphertext was altered or corrupted in transit: discard the message.",
            )


class _PaillierBase(Cipher):
    """Shared state of the two Paillier ciphers."""

    #: Largest genuine addend count: unbounded for per-value Paillier (decryption does not
    #: use it), 2**guard_bits for the packed cipher (it subtracts that many offsets).
    _max_count: int | None = None


    def _init_key(self, key: _PaillierKey, tag: int | None) -> None:
        self._key = key
        self._tag = secrets.randbits(64) if tag is None else tag
        self.key_bits = key.key_bits
        self.has_private_key = key.has_private_key
        self.counts = OpCounts()
        self._wire_bytes = (2 * self.key_bits + 7) // 8  # one integer mod n^2

    def _description(self, bounds: dict, **more) -> dict:
        """What :meth:`describe` reports: the key, the encoding and ``bounds``."""
        fp = self.fixed_point
        return {"name": self.name, "slots": self.slots, "key_bits": self.key_bits,
                "ciphertext_bytes": self.ciphertext_bytes,
                "precision": {"precision_bits": fp.precision_bits, "resolution": fp.resolution},
                "bounds": bounds, **more}

    def zeros(self, n: int) -> np.ndarray:
        # g^0 r^n with r = 1: the integer 1, a sum of no fresh encryptions.
        return object_array([PaillierCiphertext(mpz(1), 0, self._tag) for _ in range(int(n))])

    def _decrypt_raw(self, ciphertexts) -> tuple[np.ndarray, list, list]:
        if not self.has_private_key:
            raise self._no_private_key()
        a = self._ciphertexts(ciphertexts)
        _check_tags(a, self._tag, self.name, "ciphertexts", self._key.nsq, self._max_count)
        plain = self._key.decrypt_ints([x.c for x in a])
        self.counts.decryptions += a.size
        return a, plain, [x.addends for x in a]


# --------------------------------------------------------------------------- paillier


class PaillierCipher(_PaillierBase):
    """``paillier``: one fixed-point value per Paillier ciphertext."""

    name = "paillier"
    slots = 1

    def __init__(
        self,
        key: _PaillierKey,
        fixed_point: FixedPoint,
        *,
        _tag: int | None = None,
    ):
        self._init_key(key, _tag)
        self.fixed_point = fixed_point
        self.ciphertext_bytes = self._wire_bytes
        if fixed_point.max_int > key.max_int:
            raise fail(
                "precision_bits",
                f"({fixed_point.precision_bits}) with bound {fixed_point.bound:g} encodes values "
                f"of up to {fixed_point.max_int.bit_length()} bits, beyond the safe range of "
                f"the {self.key_bits}-bit key",
                "Lower precision_bits or bound, or use a larger key_bits.",
            )

    def encrypt(self, chunks: np.ndarray) -> np.ndarray:
        x = self._chunks(chunks)
        ints = self.fixed_point.encode(x)
        cs = self._key.encrypt_ints(ints)
        self.counts.encryptions += len(cs)
        tag = self._tag
        return object_array([PaillierCiphertext(c, 1, tag) for c in cs])

    def decrypt(self, ciphertexts: np.ndarray) -> np.ndarray:
        return self.fixed_point.decode(self.decrypt_integers(ciphertexts)).reshape(-1, 1)

    def decrypt_integers(self, ciphertexts: np.ndarray) -> np.ndarray:
        a, plain, _ = self._decrypt_raw(ciphertexts)
        n, max_int = self._key.n, self._key.max_int
        signed = []
        for i, m in enumerate(plain):
            if m <= max_int:
                signed.append(m)
            elif m >= n - max_int:
                signed.append(m - n)
            else:
                raise fail(
                    "decrypt",
                    f"found ciphertext {i} (a sum of {a[i].addends}) outside the safe range "
                    f"|encoded| <= n/3 of the {self.key_bits}-bit key: the homomorphic sum "
                    "overflowed",
                    "Keep sums within range: lower precision_bits or the number of additions, "
                    "or use a larger key_bits.",
                )
        return np.array(signed, dtype=object).reshape(a.size, 1)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._pair(a, b)
        _check_tags(a, self._tag, self.name, "a", self._key.nsq, self._max_count)
        _check_tags(b, self._tag, self.name, "b", self._key.nsq, self._max_count)
        nsq, tag = self._key.nsq, self._tag
        out = [
            PaillierCiphertext(x.c * y.c % nsq, x.addends + y.addends, tag) for x, y in zip(a, b)
        ]
        self.counts.additions += len(out)
        return object_array(out)

    def public(self) -> PaillierCipher:
        return PaillierCipher(self._key.public(), self.fixed_point, _tag=self._tag)

    def describe(self) -> dict:
        fp = self.fixed_point
        # Sums stay decodable while |encoded sum| <= n/3 (python-paillier's max_int).
        return self._description({"value": fp.bound, "encoded_bits": fp.max_int.bit_length(),
                                  "sum_encoded_bits": int(self._key.max_int.bit_length())})


# --------------------------------------------------------------------------- packed


class PackedPaillierCipher(_PaillierBase):
    """``packed``: ``slots`` fixed-point values in one Paillier plaintext.

    Layout. With ``M = fixed_point.max_int`` (largest encoded magnitude) and
    ``K = 2**guard_bits`` (most fresh ciphertexts a sum may contain), every
    slot is ``w = bit_length(2*K*M)`` bits wide and slot ``j`` of a chunk
    occupies bits ``[j*w, (j+1)*w)`` of the plaintext. ``slots`` is the largest
    count with ``slots * w <= key_bits - 3``, so every packed plaintext stays
    below ``2**(key_bits - 3) < n / 3`` (python-paillier's safe range), far from
    the modulus.

    Negative numbers use an offset encoding: a fresh slot holds
    ``x + M`` in ``[0, 2M]`` where ``x = round(v * 2**precision_bits)``. Slots
    never go negative, so additions never borrow or carry across slots: the
    sum of ``k`` ciphertexts holds ``sum(x) + k*M`` in ``[0, 2kM]`` in every
    slot, which fits ``w`` bits while ``k <= K``. Each ciphertext carries its
    addend count ``k`` (sent with it on the wire, ``ciphertext_bytes``
    includes it); decryption subtracts ``k*M`` per slot, and an addition
    whose result would exceed ``K`` addends raises instead of corrupting the
    neighbouring slot.

    Speed. The key's ``workers`` threads share each call's modular
    exponentiations (gmpy2 releases the GIL), and with ``pool_size > 0`` a
    background thread keeps that many obfuscators precomputed, each used
    once (:class:`~hyfl.privacy._workers.ObfuscatorPool`; the security
    argument is in docs/privacy.md). ``make_cipher("packed")`` uses every
    usable core and a pool of :data:`DEFAULT_POOL_SIZE`; ``workers=1,
    pool_size=0`` is the serial cipher.
    """

    name = "packed"

    def __init__(
        self,
        key: _PaillierKey,
        fixed_point: FixedPoint,
        guard_bits: int = DEFAULT_GUARD_BITS,
        *,
        _tag: int | None = None,
    ):
        self._init_key(key, _tag)
        self.fixed_point = fixed_point
        self.guard_bits = check_int(
            "guard_bits",
            guard_bits,
            minimum=1,
            fix="Pass log2 of the number of ciphertexts a sum may contain, e.g. guard_bits=24.",
        )
        self.max_addends = 2**self.guard_bits
        self._max_count = self.max_addends
        self._offset = fixed_point.max_int
        self.slot_bits, self.slots = packed_slot_layout(self.key_bits, fixed_point,
                                                        self.guard_bits)
        if self.slots < 1:
            raise fail(
                "key_bits",
                f"is {self.key_bits}, too small for one {self.slot_bits}-bit slot "
                f"(precision_bits={fixed_point.precision_bits}, bound={fixed_point.bound:g}, "
                f"guard_bits={self.guard_bits})",
                "Use a larger key_bits, or lower precision_bits, bound or guard_bits.",
            )
        self._plain_limit = mpz(1) << (self.slots * self.slot_bits)
        # The addend count travels with the ciphertext: it is at most 2**guard_bits.
        self.count_bytes = (self.guard_bits + 1 + 7) // 8
        self.ciphertext_bytes = self._wire_bytes + self.count_bytes

    @property
    def workers(self) -> int:
        """Threads that share one call's exponentiations."""
        return self._key.workers

    @property
    def pool_size(self) -> int:
        """Most precomputed obfuscators kept (0: none)."""
        return self._key.pool_size

    def encrypt(self, chunks: np.ndarray) -> np.ndarray:
        x = self._chunks(chunks)
        scaled = self.fixed_point.scaled(x).reshape(x.shape)
        offset, w = self._offset, self.slot_bits
        if 2 * offset < 2**63:
            rows = (scaled.astype(np.int64) + np.int64(offset)).tolist()
        else:
            rows = [[int(v) + offset for v in row] for row in scaled.tolist()]
        plaintexts = [gmpy2.pack(row, w) for row in rows]
        cs = self._key.encrypt_ints(plaintexts)
        self.counts.encryptions += len(cs)
        tag = self._tag
        return object_array([PaillierCiphertext(c, 1, tag) for c in cs])

    def decrypt(self, ciphertexts: np.ndarray) -> np.ndarray:
        return self.fixed_point.decode(self.decrypt_integers(ciphertexts)).reshape(
            -1, self.slots)

    def decrypt_integers(self, ciphertexts: np.ndarray) -> np.ndarray:
        a, plain, addends = self._decrypt_raw(ciphertexts)
        slots, w, limit = self.slots, self.slot_bits, self._plain_limit
        flat = []
        for i, m in enumerate(plain):
            if m >= limit:
                raise fail(
                    "decrypt",
                    f"found ciphertext {i} (a sum of {addends[i]}) decrypting beyond the "
                    f"{slots} packed slots: it was not packed by this cipher or its sum "
                    "overflowed",
                    "Only decrypt ciphertexts made and added by this cipher (same key and "
                    "guard_bits); raise guard_bits if sums contain many ciphertexts.",
                )
            parts = gmpy2.unpack(m, w)
            flat.extend(parts)
            flat.extend([0] * (slots - len(parts)))
        values = np.array(flat, dtype=object).reshape(a.size, slots)
        shift = np.array([k * self._offset for k in addends], dtype=object).reshape(a.size, 1)
        return values - shift

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._pair(a, b)
        _check_tags(a, self._tag, self.name, "a", self._key.nsq, self._max_count)
        _check_tags(b, self._tag, self.name, "b", self._key.nsq, self._max_count)
        nsq, tag, limit = self._key.nsq, self._tag, self.max_addends
        out = []
        for x, y in zip(a, b):
            k = x.addends + y.addends
            if k > limit:
                raise fail(
                    "add",
                    f"would sum {k} ciphertexts into one packed ciphertext, more than the "
                    f"2**guard_bits = {limit} its slots have room for (guard_bits="
                    f"{self.guard_bits})",
                    "Raise guard_bits (make_cipher('packed', guard_bits=...)); every extra "
                    "bit doubles the room and costs one bit per slot.",
                )
            out.append(PaillierCiphertext(x.c * y.c % nsq, k, tag))
        self.counts.additions += len(out)
        return object_array(out)

    def public(self) -> PackedPaillierCipher:
        return PackedPaillierCipher(
            self._key.public(), self.fixed_point, self.guard_bits, _tag=self._tag
        )

    def describe(self) -> dict:
        return self._description({"value": self.fixed_point.bound, "addends": self.max_addends},
                                 guard_bits=self.guard_bits, slot_bits=self.slot_bits)


# --------------------------------------------------------------------------- registry


def _make_none(*, key_bits: int | None = None, precision_bits: int | None = None) -> Cipher:
    # key_bits and precision_bits are accepted (CLI passes them for every cipher) and unused.
    return PlainCipher()


def _make_paillier(
    *,
    key_bits: int | None = None,
    precision_bits: int | None = None,
    bound: float = DEFAULT_BOUND,
    keypair=None,
) -> Cipher:
    fp = FixedPoint(DEFAULT_PRECISION_BITS if precision_bits is None else precision_bits, bound)
    return PaillierCipher(_PaillierKey(*_keypair(key_bits, keypair)), fp)


def _make_packed(
    *,
    key_bits: int | None = None,
    precision_bits: int | None = None,
    bound: float = DEFAULT_BOUND,
    guard_bits: int = DEFAULT_GUARD_BITS,
    keypair=None,
    workers: int | None = None,
    pool_size: int = DEFAULT_POOL_SIZE,
) -> Cipher:
    fp = FixedPoint(DEFAULT_PRECISION_BITS if precision_bits is None else precision_bits, bound)
    key = _PaillierKey(*_keypair(key_bits, keypair),
                       workers=thread_count() if workers is None else workers, pool_size=pool_size)
    return PackedPaillierCipher(key, fp, guard_bits)


from hyfl.privacy.lattice import POLY_MODULUS_DEGREE, make_ckks  # noqa: E402  (it builds on cipher_base)

CIPHERS: dict[str, tuple[Callable[..., Cipher], str]] = {
    "none": (_make_none, "no encryption: exact floats, operations still counted"),
    "paillier": (
        _make_paillier,
        "Paillier (python-paillier + gmpy2), one fixed-point value per ciphertext",
    ),
    "packed": (
        _make_packed,
        "Paillier with many fixed-point values packed per ciphertext (same key, faster)",
    ),
    "ckks": (
        make_ckks,
        "CKKS lattice cipher (SEAL via TenSEAL), 4096 values per ciphertext, 128-bit security",
    ),
}


def packed_slot_layout(key_bits: int, fixed_point: FixedPoint, guard_bits: int
                       ) -> tuple[int, int]:
    """Bits per slot and slots per ciphertext of the packed cipher.

    A slot holds a sum of up to ``2**guard_bits`` values, each offset by the
    fixed point's largest magnitude to make it non-negative; three bits of the
    modulus stay free.
    """
    slot_bits = (2 * 2**guard_bits * fixed_point.max_int).bit_length()
    return slot_bits, (key_bits - 3) // slot_bits


def cipher_slots(name: str, *, key_bits: int | None = None) -> int:
    """Values per ciphertext of cipher ``name`` at its default encoding, without making
    a key (``packed``: from the key size; ``ckks``: half the ring dimension)."""
    check_choice("cipher", name, CIPHERS)
    if name == "packed":
        bits = DEFAULT_KEY_BITS if key_bits is None else check_keybits(key_bits)
        _, slots = packed_slot_layout(bits, FixedPoint(DEFAULT_PRECISION_BITS, DEFAULT_BOUND),
                                      DEFAULT_GUARD_BITS)
        if slots < 1:
            raise fail("key_bits", f"is {bits}, too small for one packed slot",
                       "Use a larger key (2048 bits).")
        return slots
    if name == "ckks":
        return POLY_MODULUS_DEGREE // 2
    return 1


def make_cipher(
    name: str,
    *,
    key_bits: int | None = None,
    precision_bits: int | None = None,
    **options,
) -> Cipher:
    """Build cipher ``name`` with a fresh key pair; clients share it, the server gets ``.public()``.

    ``key_bits`` (default 2048) and ``precision_bits`` (default 32) apply to
    the Paillier ciphers and are ignored by ``none``. Options: ``bound``
    (largest value magnitude, default 2**16; ``paillier``, ``packed``),
    ``guard_bits`` (log2 of the most ciphertexts one sum may hold, default 24;
    ``packed``), ``keypair`` (a python-paillier ``(public, private)`` pair
    to use instead of generating one; ``(public, None)`` gives the public view
    directly, as ``.public()`` would), and for ``packed`` ``workers`` (threads
    per encryption or decryption call, default every usable core) and
    ``pool_size`` (obfuscators precomputed in the background, default
    1024; 0 turns the pool off).
    """
    check_choice("cipher", name, CIPHERS)
    factory = CIPHERS[name][0]
    accepted = [
        p for p in inspect.signature(factory).parameters if p not in ("key_bits", "precision_bits")
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise fail(
            f"option {unknown[0]!r}",
            f"is not known to cipher {name!r}",
            f"Options of {name!r}: {', '.join(accepted) or 'none besides key_bits'}.",
        )
    return factory(key_bits=key_bits, precision_bits=precision_bits, **options)


# --------------------------------------------------------------------------- calibration


def _seconds_per_op(fn: Callable[[], object], ops: int, min_seconds: float = 0.02) -> float:
    """Mean seconds per operation of ``fn`` (``ops`` operations a call), repeated to >= min."""
    calls, total = 0, 0.0
    while calls == 0 or total < min_seconds:
        tic = time.perf_counter()
        fn()
        total += time.perf_counter() - tic
        calls += 1
    return total / (calls * ops)


def calibrate(cipher: Cipher, n_values: int = 200, seed: int = 0) -> dict:
    """Measure this machine's seconds per ciphertext (and per value) of each operation.

    Encrypts ``n_values`` chunks (ciphertexts) of random values, decrypts them
    and adds them pairwise, after one warm-up operation each; cheap operations
    are repeated until at least 20 ms have been timed. ``decrypt`` is ``None``
    on a public view. The cipher's :class:`OpCounts` are left as they were.
    The figures are wall time with the cipher's own ``workers`` threads, and
    without its pool of precomputed obfuscators (a pooled encryption would
    look almost free, but the pool is refilled at the full price).
    """
    n = check_int("n_values", n_values, minimum=1)
    rng = np.random.default_rng(seed)
    bound = getattr(getattr(cipher, "fixed_point", None), "bound", 1.0)
    chunks = rng.uniform(-1.0, 1.0, size=(n, cipher.slots)) * min(1.0, bound)
    saved = cipher.counts.snapshot()
    key = getattr(cipher, "_key", None)
    pooled = getattr(key, "_pool", None)
    if pooled is not None:  # set aside while measuring (see above)
        key._pool = None
    try:
        cipher.add(*([cipher.encrypt(chunks[:1])] * 2))  # warm-up
        ops: dict[str, float | None] = {}
        cts = None

        def encrypt():
            nonlocal cts
            cts = cipher.encrypt(chunks)

        ops["encrypt"] = _seconds_per_op(encrypt, n)
        if cipher.has_private_key:
            cipher.decrypt(cts[:1])
            ops["decrypt"] = _seconds_per_op(lambda: cipher.decrypt(cts), n)
        else:
            ops["decrypt"] = None
        ops["add"] = _seconds_per_op(lambda: cipher.add(cts, cts), n)
    finally:
        cipher.counts.restore(saved)
        if pooled is not None:
            key._pool = pooled
    result = {"cipher": cipher.name, "key_bits": cipher.key_bits, "slots": cipher.slots}
    result.update(ops)
    for op, seconds in ops.items():
        result[f"{op}_per_value"] = None if seconds is None else seconds / cipher.slots
    return result
