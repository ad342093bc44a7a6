"""``ckks``: a lattice (RLWE) cipher with thousands of values per ciphertext.

HyFDCA only ever *adds* ciphertexts (the server sums what the holders of a
sample send), so the lattice scheme needs no multiplications, relinearization
or rotations: a fresh encryption, additions, and decryption by a key holder.
The cipher is CKKS as implemented by Microsoft SEAL through TenSEAL
(``tenseal.CKKSVector``); :func:`make_ckks` builds it, :class:`CKKSCipher`
gives it the same interface as the Paillier ciphers (chunks of ``slots``
values in, one ciphertext per chunk out), so the protocol engine, the
deployment and the cost accounting use it unchanged.

Parameters (see ``docs/privacy.md``, "The lattice cipher")
    Ring dimension ``N = 8192`` (``slots = N / 2 = 4096`` values per
    ciphertext) and coefficient moduli of 60 + 60 + 60 bits: the ciphertext
    modulus has 120 bits at the data level, the special prime 60 more, 180
    bits in all. The HomomorphicEncryption.org standard allows at most 218
    bits at ``N = 8192`` for 128-bit classical security (SEAL checks this
    table and refuses larger moduli). Values are encoded at scale
    ``2**scale_bits`` (default 2**60).

Precision: the fixed-point contract of the Paillier ciphers
    Values are rounded to the grid ``2**-precision_bits`` (default 32 bits,
    the Paillier default) before they are encrypted, so every sum of them is
    on the grid as well, and a key holder rounds every decrypted value back to
    the grid. While the accumulated encryption noise stays below half a grid
    step, the rounded decryption is *exactly* the sum of the encoded values,
    the same number the fixed-point Paillier ciphers decode (the tests check
    that ``ckks`` and ``packed`` give identical iterates). The cipher checks
    that *budget* (below) and refuses to add beyond it rather than return
    wrong numbers. Sums must stay below ``2**(52 - precision_bits)`` in
    magnitude for float64 to hold the grid exactly (2**20 at the defaults).

Noise budget
    A fresh encryption ``c0 + c1 s = Delta m + e`` carries noise ``e = v e0 +
    e1 + e2 s`` (``v``, ``s`` ternary, ``e_i`` Gaussian with ``sigma = 3.2``):
    about ``4N/3 sigma^2`` per coefficient, and a slot (the canonical
    embedding of the ``N`` coefficients, real part) adds up ``N/2`` of them.
    :func:`fresh_noise_std` is that standard deviation divided by the scale;
    on this SEAL build the measured value is about 16x smaller (the model is
    an upper bound, which a test checks). Sums of ``k`` independent fresh
    ciphertexts have ``sqrt(k)`` times that spread, so a sum stays correctly
    rounded with an ``Z_SIGMA``-sigma margin (a failure chance below 1e-15 per
    value) while ``Z_SIGMA * sqrt(k) * std <= 2**-(precision_bits + 1)``:
    :attr:`CKKSCipher.max_addends` is the largest such ``k``. Its magnitude
    budget is ``k * bound < 2**(data_bits - scale_bits - 1)`` (a sum must not
    wrap the modulus). Each ciphertext carries its addend count, as in the
    packed Paillier cipher; an addition past the budget raises.

Key-recovery risk of CKKS decryptions (Li and Micciancio, EUROCRYPT 2021)
    An approximate decryption reveals ``m + e``; whoever sees that value *and*
    the ciphertext can learn the noise ``e``, and enough such equations give
    the secret key. In HyFDCA only the clients hold the secret key and only
    they decrypt; what leaves a client is computed from the *rounded* values,
    and since the encrypted sums lie exactly on the grid and the noise is
    within the budget, a rounded value is the exact sum -- a function of the
    messages alone, which carries no information about the noise or the key
    (the budget's failure chance, below 1e-15 per value, bounds what could
    leak). The server therefore never sees a raw CKKS decryption. See
    ``docs/privacy.md`` for the message-by-message argument.

Received ciphertexts are checked before anything decrypts them
    That argument holds for ciphertexts made the way this cipher makes them,
    and a forged scale breaks it: a ciphertext of zeros at scale 2**20, made
    with the public key, decrypts through the rounding to raw noise in every
    slot. HyFDCA only encrypts at the global scale ``2**scale_bits`` and adds,
    so every genuine ciphertext -- fresh, a sum of any number of them, or one
    read back from the wire -- has exactly one SEAL ciphertext of ``slots``
    values, of size 2 (no unrelinearized product), at the data level (the
    context's ``first_parms_id``: its two data primes, no modulus switch or
    rescale) and at scale exactly ``2**scale_bits``; its serialized form is
    the canonical TenSEAL one. :meth:`CKKSCipher.deserialize` and
    :meth:`CKKSCipher.decrypt` refuse anything else, deciding on this
    metadata alone (never on a decrypted value, so a refusal tells the sender
    nothing it did not know). Genuine metadata is necessary, not sufficient:
    an encryption of zero at scale 2**20, multiplied twice by the plaintext 1
    encoded at scale 2**20, has size 2, the data level and scale 2**60, and
    decrypts through the rounding to its noise times 2**-20; a ciphertext
    under another key of the same parameters decrypts to a linear function of
    the secret key. No check of a ciphertext alone can tell those from a
    genuine sum; the protection against them is that nothing a key holder
    computes from a decryption of a ciphertext the server chose reaches the
    server (``tests/test_hostile_ciphertexts.py`` marks this limit).
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct

import numpy as np

from hyfl.errors import check_int, check_positive, fail
from hyfl.privacy.cipher_base import (
    DEFAULT_BOUND,
    DEFAULT_PRECISION_BITS,
    Cipher,
    OpCounts,
    check_ciphertexts,
    object_array,
)
from hyfl.privacy.encoding import FixedPoint

POLY_MODULUS_DEGREE = 8192
COEFF_MOD_BITS = (60, 60, 60)
DEFAULT_SCALE_BITS = 60
#: Largest total coefficient modulus (bits) for 128-bit classical security, by ring
#: dimension: the HomomorphicEncryption.org standard's table (uniform ternary secret),
#: the one SEAL enforces.
MAX_MODULUS_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
SECURITY_BITS = 128
NOISE_SIGMA = 3.2  # SEAL's error standard deviation
Z_SIGMA = 8.0  # margin of the noise budget, in standard deviations


_FORGED = ("Discard the message: it was forged or corrupted (or its sender runs other cipher "
           "parameters: run every party with the same ones).")


def _varint(n: int) -> bytes:
    """Protocol buffers' base-128 varint of ``n >= 0``."""
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tenseal_frame(slots: int, scale: float) -> tuple[bytes, bytes]:
    """What TenSEAL writes before and after the SEAL ciphertext of one ``CKKSVector``."""
    sizes = _varint(slots)
    return (b"\x0a" + _varint(len(sizes)) + sizes + b"\x12",
            b"\x19" + struct.pack("<d", scale))


def _scale_text(scale: float) -> str:
    """``2**k`` for a power of two, else the float itself (one ulp off 2**60 shows)."""
    if math.isfinite(scale) and scale > 0 and math.frexp(scale)[0] == 0.5:
        return f"2**{math.frexp(scale)[1] - 1}"
    return repr(scale)


def _tenseal():
    try:
        import tenseal
    except ImportError:  # pragma: no cover - tenseal is a declared dependency
        raise fail("cipher 'ckks'", "needs the tenseal package, which is not installed",
                   "pip install tenseal (it is a dependency of hyfl).") from None
    return tenseal


def fresh_noise_std(poly_modulus_degree: int, scale_bits: int) -> float:
    """Model (upper bound) of one slot's decryption-noise std of a fresh ciphertext."""
    n = poly_modulus_degree
    per_coefficient = NOISE_SIGMA * math.sqrt(4.0 * n / 3.0)
    return per_coefficient * math.sqrt(n / 2.0) / 2.0**scale_bits


def noise_budget(*, precision_bits: int, scale_bits: int, bound: float,
                 poly_modulus_degree: int = POLY_MODULUS_DEGREE,
                 data_bits: int = sum(COEFF_MOD_BITS[:-1])) -> int:
    """Most fresh ciphertexts one sum may hold and still decrypt to the fixed-point grid.

    The smaller of the noise budget (``Z_SIGMA`` sigmas of ``sqrt(k)`` fresh noises
    below half a grid step) and the magnitude budget (``k * bound`` below the
    decryptable range; ``data_bits`` are the modulus bits at the data level, all
    primes but the special key-switching one). 0 means not even a fresh ciphertext fits.
    """
    std = fresh_noise_std(poly_modulus_degree, scale_bits)
    half_step = 2.0 ** -(precision_bits + 1)
    by_noise = math.floor((half_step / (Z_SIGMA * std)) ** 2)
    by_magnitude = math.floor(2.0 ** (data_bits - scale_bits - 1) / bound)
    return int(min(by_noise, by_magnitude))


class LatticeCiphertext:
    """One CKKS ciphertext (a ``tenseal.CKKSVector``) of ``slots`` values.

    ``vector`` is ``None`` for the public zero (see :meth:`CKKSCipher.zeros`);
    ``addends`` counts the fresh encryptions summed into it (the noise budget);
    ``tag`` identifies the cipher and key that made it.
    """

    __slots__ = ("vector", "addends", "tag")

    def __init__(self, vector, addends: int, tag: int):
        self.vector = vector
        self.addends = addends
        self.tag = tag

    def __repr__(self) -> str:
        return f"<LatticeCiphertext of {self.addends} addend(s)>"

    def __deepcopy__(self, memo) -> LatticeCiphertext:
        # Immutable: every operation makes a new ciphertext, so a copy of a state that
        # holds ciphertexts (the coordinator's snapshot of the server at each round's
        # start) can share them; copying them took half the server's time a round.
        return self


class CKKSCipher(Cipher):
    """``ckks``: CKKS (SEAL via TenSEAL), ``slots`` values per ciphertext, additions only.

    Build it with :func:`make_ckks` (or ``make_cipher("ckks")``); clients share it,
    the server gets :meth:`public` (the same context without the secret key).

    Attributes
    ----------
    slots : int
        Values per ciphertext (``poly_modulus_degree / 2``).
    max_addends : int
        Noise budget: most fresh ciphertexts one sum may hold (:func:`noise_budget`).
    key_bits : int
        Bits of the ciphertext modulus (all coefficient primes).
    ciphertext_bytes : int
        Serialized size of one ciphertext (measured once, compressed as sent).
    """

    name = "ckks"

    def __init__(self, context, fixed_point: FixedPoint, *, scale_bits: int,
                 _tag: int | None = None):
        self._context = context
        self.fixed_point = fixed_point
        self.scale_bits = scale_bits
        seal = context.seal_context().data
        self.poly_modulus_degree = int(seal.key_context_data().parms().poly_modulus_degree())
        self.slots = self.poly_modulus_degree // 2
        self.key_bits = int(seal.key_context_data().total_coeff_modulus_bit_count())
        self.data_bits = int(seal.first_context_data().total_coeff_modulus_bit_count())
        # What every genuine ciphertext has (the module doc): fresh encryptions are at the
        # data level (first_parms_id, a hash of the parameters and of that level's primes;
        # SEAL's chain index is the prime count minus one) and the global scale.
        self._parms_id = list(seal.first_parms_id())
        self._data_primes = int(seal.first_context_data().chain_index()) + 1
        self._scale = 2.0**scale_bits
        self._frame = _tenseal_frame(self.slots, self._scale)
        self.has_private_key = bool(context.is_private())
        self.counts = OpCounts()
        self._tag = secrets.randbits(64) if _tag is None else _tag
        self.max_addends = noise_budget(
            precision_bits=fixed_point.precision_bits, scale_bits=scale_bits,
            bound=fixed_point.bound, poly_modulus_degree=self.poly_modulus_degree,
            data_bits=self.data_bits)
        if self.max_addends < 1:
            raise fail(
                "precision_bits",
                f"({fixed_point.precision_bits}) is finer than the noise of cipher 'ckks' at "
                f"scale 2**{scale_bits} allows even for a fresh ciphertext (noise std about "
                f"2**{math.log2(fresh_noise_std(self.poly_modulus_degree, scale_bits)):.1f})",
                "Lower precision_bits (32 is the default) or raise scale_bits (at most 60).",
            )
        self._ciphertext_bytes: int | None = None

    @property
    def ciphertext_bytes(self) -> int:
        """Serialized (compressed) size of one ciphertext, measured once on first use."""
        if self._ciphertext_bytes is None:
            row = np.random.default_rng(0).uniform(-1.0, 1.0, self.slots)
            self._ciphertext_bytes = len(self._encrypt_one(row).serialize())
        return self._ciphertext_bytes

    # ------------------------------------------------------------------ operations

    def _encrypt_one(self, row: np.ndarray):
        return _tenseal().ckks_vector(self._context, row.tolist())

    def encrypt(self, chunks: np.ndarray) -> np.ndarray:
        x = self._chunks(chunks)
        # Encrypt the values on the fixed-point grid: sums are then exactly on the grid too,
        # and rounding a decryption removes its noise entirely (see the module doc).
        p = self.fixed_point.precision_bits
        grid = np.ldexp(self.fixed_point.scaled(x), -p).reshape(x.shape)
        # One call at a time: TenSEAL holds the GIL, so threads would not run in parallel.
        vectors = [self._encrypt_one(row) for row in grid]
        self.counts.encryptions += len(vectors)
        tag = self._tag
        return object_array([LatticeCiphertext(v, 1, tag) for v in vectors])

    def decrypt(self, ciphertexts: np.ndarray) -> np.ndarray:
        if not self.has_private_key:
            raise self._no_private_key()
        a = self._ciphertexts(ciphertexts)
        self._check(a, "ciphertexts")
        out = np.zeros((a.size, self.slots))
        live = [i for i, x in enumerate(a) if x.vector is not None]
        for i in live:  # all of them, before decrypting any
            self._check_vector(a[i].vector, f"ciphertexts[{i}]")
        # With the secret key given: a vector may be bound to another view's context (an
        # in-process server's sum), and the key is what decrypts.
        key = self._context.secret_key()
        for i in live:
            out[i] = a[i].vector.decrypt(secret_key=key)
        self.counts.decryptions += a.size
        # Round to the fixed-point grid: what a key holder uses is then the encrypted sum
        # to that resolution, and not the noisy value (see the module doc).
        return np.ldexp(np.rint(np.ldexp(out, self.fixed_point.precision_bits)),
                        -self.fixed_point.precision_bits)

    def decrypt_integers(self, ciphertexts: np.ndarray) -> np.ndarray:
        # Exact: sums stay below 2**16 (the noise budget's bound), so their integers below
        # 2**(16 + precision_bits) <= 2**53.
        grid = np.ldexp(self.decrypt(ciphertexts), self.fixed_point.precision_bits)
        return np.vectorize(int, otypes=[object])(grid)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._pair(a, b)
        self._check(a, "a")
        self._check(b, "b")
        tag, limit = self._tag, self.max_addends
        out = []
        for x, y in zip(a, b):
            k = x.addends + y.addends
            if k > limit:
                raise fail(
                    "add",
                    f"would sum {k} ciphertexts into one ckks ciphertext, beyond its noise "
                    f"budget of {limit} (precision_bits={self.fixed_point.precision_bits}, "
                    f"scale 2**{self.scale_bits}, bound {self.fixed_point.bound:g})",
                    "Lower precision_bits or bound (make_cipher('ckks', precision_bits=...)): "
                    "each bit fewer of precision multiplies the budget by 4.",
                )
            if x.vector is None or y.vector is None:
                vector = y.vector if x.vector is None else x.vector
            else:
                vector = x.vector + y.vector
            out.append(LatticeCiphertext(vector, k, tag))
        self.counts.additions += len(out)
        return object_array(out)

    def public(self) -> CKKSCipher:
        context = self._context.copy()
        if context.is_private():
            context.make_context_public()
        return CKKSCipher(context, self.fixed_point, scale_bits=self.scale_bits, _tag=self._tag)

    def zeros(self, n: int) -> np.ndarray:
        # The public zero needs no encryption: an absent vector, added as the identity.
        return object_array([LatticeCiphertext(None, 0, self._tag) for _ in range(int(n))])

    def describe(self) -> dict:
        fp = self.fixed_point
        return {
            "name": self.name,
            "slots": self.slots,
            "key_bits": self.key_bits,
            "ciphertext_bytes": self.ciphertext_bytes,
            "precision": {"precision_bits": fp.precision_bits, "resolution": fp.resolution},
            "bounds": {"value": fp.bound, "addends": self.max_addends},
            "scheme": "CKKS (Microsoft SEAL via TenSEAL)",
            "poly_modulus_degree": self.poly_modulus_degree,
            "modulus_bits": self.key_bits,
            "data_modulus_bits": self.data_bits,
            "scale_bits": self.scale_bits,
            "security_bits": SECURITY_BITS,
        }

    # ------------------------------------------------------------------ wire format

    def serialize(self, ciphertexts: np.ndarray) -> tuple[list[bytes], list[int]]:
        """Bytes of each ciphertext (``b""`` for the public zero) and its addend count."""
        a = self._ciphertexts(ciphertexts)
        self._check(a, "ciphertexts")
        return [b"" if x.vector is None else x.vector.serialize() for x in a], [
            x.addends for x in a]

    def deserialize(self, blobs: list[bytes], addends: list[int]) -> np.ndarray:
        """Ciphertexts from :meth:`serialize`'s output, checked and bound to this cipher."""
        ts = _tenseal()
        tag, limit = self._tag, self.max_addends
        out = []
        for i, (blob, k) in enumerate(zip(blobs, addends)):
            if type(k) is not int or not 0 <= k <= limit or (k == 0) != (len(blob) == 0):
                raise fail(f"ciphertexts[{i}]",
                           f"carries an addend count of {k!r}; a genuine one is an integer in "
                           f"0..{limit} (0 exactly for the empty public zero)",
                           "The message was altered or corrupted in transit: discard it.")
            if not blob:
                out.append(LatticeCiphertext(None, 0, tag))
                continue
            # A genuine ciphertext is incompressible (uniform mod q): a much shorter blob would
            # be inflated by SEAL to a full ciphertext, a small message to gigabytes.
            if not self.ciphertext_bytes // 2 <= len(blob) <= 2 * self.ciphertext_bytes:
                raise fail(f"ciphertexts[{i}]", f"is not a CKKS ciphertext of this context "
                           f"({len(blob)} bytes; one takes {self.ciphertext_bytes})",
                           "The message was altered, or the parties use different parameters.")
            if not self._canonical(blob):
                raise fail(f"ciphertexts[{i}]", "is not a CKKS ciphertext of this context: "
                           f"not one serialized vector of {self.slots} values at scale "
                           f"2**{self.scale_bits}, the only form this cipher writes", _FORGED)
            try:
                vector = ts.ckks_vector_from(self._context, blob)
            except Exception:  # SEAL raises plain exceptions on malformed input
                raise fail(f"ciphertexts[{i}]", "is not a CKKS ciphertext of this context",
                           "The message was altered, or the parties use different keys.") from None
            self._check_vector(vector, f"ciphertexts[{i}]")
            out.append(LatticeCiphertext(vector, k, tag))
        return object_array(out)

    # ------------------------------------------------------------------ keys

    def context_bytes(self, *, secret: bool) -> bytes:
        """The serialized context: with the secret key (parties) or public only (server)."""
        if secret and not self.has_private_key:
            raise self._no_private_key()
        return self._context.serialize(save_public_key=True, save_secret_key=secret,
                                       save_galois_keys=False, save_relin_keys=False)

    def fingerprint(self) -> str:
        """SHA-256 (first 32 hex digits) of the public key: names the key pair."""
        return hashlib.sha256(self.context_bytes(secret=False)).hexdigest()[:32]

    # ------------------------------------------------------------------ helpers

    def _check(self, a: np.ndarray, what: str) -> None:
        check_ciphertexts(a, LatticeCiphertext, self._tag, self.name, what, self.max_addends)

    def _canonical(self, blob: bytes) -> bool:
        """Whether ``blob`` is TenSEAL's serialization of one ciphertext of ``slots`` values.

        ``CKKSVectorProto``: field 1 the chunk sizes (packed: exactly ``[slots]``), field 2
        one SEAL ciphertext, field 3 TenSEAL's scale (``2**scale_bits``), in that order and
        nothing else. (TenSEAL would accept several chunks, and decrypts each with the size
        the message gives, unchecked against the ciphertext.)
        """
        head, tail = self._frame
        body = len(blob) - len(head) - len(tail)
        if body < 2 or not (blob.startswith(head) and blob.endswith(tail)):
            return False
        # The body is the SEAL ciphertext's byte count (a minimal varint) and its bytes.
        return any(blob[len(head):len(head) + k] == _varint(body - k) for k in range(1, 6))

    def _check_vector(self, vector, what: str) -> None:
        """Refuse a CKKS vector whose metadata no genuine ciphertext of this cipher has.

        Size, level, scale and parameters against this cipher's own context (see the
        module doc); it reads metadata only, so it runs before any decryption and its
        verdict depends on nothing the secret key would reveal.
        """
        cts = vector.ciphertext()
        if len(cts) != 1 or vector.size() != self.slots:
            raise fail(what, f"holds {len(cts)} ciphertexts of {vector.size()} values, not one "
                       f"of {self.slots}", _FORGED)
        ct = cts[0]
        if (ct.poly_modulus_degree() != self.poly_modulus_degree or not ct.is_ntt_form()
                or ct.coeff_modulus_size() != self._data_primes
                or list(ct.parms_id()) != self._parms_id):
            raise fail(what, f"is at another level or under other parameters "
                       f"({ct.coeff_modulus_size()} of {self._data_primes} data primes, ring "
                       f"dimension {ct.poly_modulus_degree()}) than every fresh or summed "
                       "ciphertext of this cipher; refused before decrypting", _FORGED)
        if ct.size() != 2:
            raise fail(what, f"has {ct.size()} polynomials, not 2 (a product of ciphertexts, "
                       "which this protocol never makes); refused before decrypting", _FORGED)
        if not ct.scale == self._scale:  # exact: every genuine ciphertext has this very scale
            raise fail(what, f"has CKKS scale {_scale_text(ct.scale)}, not this cipher's "
                       f"2**{self.scale_bits} (decrypting it would expose raw noise, the "
                       "material of key recovery); refused before decrypting", _FORGED)


def make_ckks(*, key_bits: int | None = None, precision_bits: int | None = None,
              bound: float = DEFAULT_BOUND, scale_bits: int = DEFAULT_SCALE_BITS,
              context: bytes | None = None) -> CKKSCipher:
    """A CKKS cipher with a fresh key (or the serialized ``context`` of a key file).

    ``key_bits`` is accepted for symmetry with the Paillier ciphers and ignored
    out (the ring and moduli are fixed at 128-bit security); ``precision_bits``
    (default 32) is the fixed-point grid decrypted values are rounded to, ``bound``
    the largest magnitude of an encrypted value, ``scale_bits`` the CKKS scale.
    """
    ts = _tenseal()
    fp = FixedPoint(DEFAULT_PRECISION_BITS if precision_bits is None else precision_bits, bound)
    scale_bits = check_int("scale_bits", scale_bits, minimum=20,
                           fix="Pass the CKKS scale's bits, 20..60 (default 60).")
    if scale_bits > COEFF_MOD_BITS[0]:
        raise fail("scale_bits", f"is {scale_bits}, beyond the 60-bit primes of the modulus",
                   "Pass at most 60.")
    check_positive("bound", bound, fix="Pass the largest magnitude a value may have.")
    if context is None:
        if sum(COEFF_MOD_BITS) > MAX_MODULUS_BITS_128[POLY_MODULUS_DEGREE]:
            raise AssertionError("parameters beyond 128-bit security")  # pragma: no cover
        ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=POLY_MODULUS_DEGREE,
                         coeff_mod_bit_sizes=list(COEFF_MOD_BITS))
    else:
        try:
            ctx = ts.context_from(bytes(context))
        except Exception:
            raise fail("ckks key", "is not a serialized TenSEAL CKKS context",
                       "Pass a key file written by `hyfl deploy keys --cipher ckks`.") from None
    ctx.global_scale = 2.0**scale_bits
    ctx.auto_relin = ctx.auto_rescale = ctx.auto_mod_switch = False
    return CKKSCipher(ctx, fp, scale_bits=scale_bits)
