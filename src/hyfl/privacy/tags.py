"""Keyed linear tags: a key holder checks that an encrypted sum is exactly what it expects.

Used on every sum a party decrypts under the cocoa rule: the judged sums
(the line search's, the safe rule's gain terms, the certificate's conjugate
sums: one more value) and, per holder group or chunk, the proposals, inner
products, row norms and the stored duals' states
(:class:`hyfl.privacy.layout.TaggedLayout`).

An active server holds the public key: it can encrypt any value and add it
to a genuine sum, and a party that decrypts ``Enc(own + others + delta)``
cannot tell it from ``Enc(own + others)``. The parties share one secret the
server lacks -- the private key -- and derive from it (:func:`cipher_secret`)
a tag key. A sender appends to the fixed-point integers ``u`` of what it
encrypts one more integer::

    tau = (sum_j a_j u_j + b(context)) mod P

with coefficients ``a`` of the vector's *family* (the same for every sender:
the sums stay checkable) and an offset ``b`` of the sender's *context*
(message kind, round, attempt, sender...). Tags add up with the values, so a
sum of contributions from contexts ``c_1 .. c_m`` carries
``T = sum_i tau_i`` with ``T = a . U + sum_i b(c_i) (mod P)`` for the summed
integers ``U``. A server that adds anything else -- a chosen value, a scaled
or repeated ciphertext, another context's contribution -- must guess how
``a`` weighs it: it passes with probability about ``1/P``.

Conditions for that bound (the protocol must keep them): a context is used
for one plaintext only (else two ciphertexts of one context subtract to a
tag-free difference), and the receiver knows the contexts it expects from
facts it holds or can verify.

Runs. A context names a place within a run (kind, round, attempt, sender),
and two runs of the same parties pass through the same places: with one key
for every run, another run's sum of the same place would verify, and so
would ``2 S_B - S_A`` of two runs' sums of one place (its offsets sum to the
expected ones) -- one plaintext per context would hold within each run only.
So the key is of the secret *and* the run (:class:`TagKey` derives its
coefficients and offsets from both): the run's identity is
:func:`run_identity` of every party's fresh set-up nonce, which each party
computes itself from the nonces the set-up relays (authenticated with the
secret, its own among them), never a value the server chooses. It is no
secret (the server relays the nonces): what matters is that no two runs
share it. Another run's tags are then those of an independent key.

Chosen combinations. The server holds genuine sums ``S_j`` (each of a set
``C_j`` of contexts) and the public key: it can send ``sum_j lambda_j S_j``
plus any encryption of its own ``d`` (tag part ``d_tag``), for integers
``lambda_j`` of its choosing. Its tag exceeds the one the receiver expects
of contexts ``C`` by ``sum_c mu_c b(c) + d_tag - a . d (mod P)``, with
``mu_c = sum_j lambda_j [c in C_j] - [c in C]`` per context. One plaintext
per context makes the combination's values ``sum_c (mu_c + [c in C]) u_c``
(plus ``d``), so it is the genuine sum of ``C`` exactly when every ``mu_c``
and ``d`` are 0. Otherwise, since the offsets and coefficients are
pseudorandom per context and per run and unknown to the server, the excess
is 0 mod ``P`` with chance about ``1/P``; a refusal ends the run, and the
next run has another key, so failed tries teach nothing about the next.

Values shifted by a multiple of the prime. The check is linear modulo ``P``
over integers: ``a_j (u_j + k P) = a_j u_j (mod P)`` for any ``a_j``, so with
a public ``P`` the server could add ``k P`` to any one value unseen (an
attacker's review read a party's feature row through ``image`` that way).
So ``P`` is a secret prime of the run's key in ``[2**39, 2**40)``
(:attr:`TagKey.prime`), and :meth:`TagKey.verify` refuses a sum holding an
integer beyond what its ``m`` contributions can encode (``bound``): a shift
then is a multiple of at most one candidate prime, and passes with chance
about one in the ``2**34`` primes of the range.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np

from hyfl.errors import fail

__all__ = ["RUN_BYTES", "TAG_PRIME", "TagKey", "cipher_secret", "run_identity", "tag_key"]

#: A bound on the tags' modulus: the largest prime below 2**40 (a tag, as a fixed-point
#: value with 32 fractional bits, stays below 2**8). The modulus of a run is a secret
#: prime in [2**39, 2**40) derived from its key (:attr:`TagKey.prime`): with a public one
#: the server could add any multiple of it to a value unseen.
TAG_PRIME = 2**40 - 87
#: The size of a run's identity (a SHA-256 digest).
RUN_BYTES = 32


class TagKey:
    """Coefficients and offsets of the tags of one run, from the parties' shared secret.

    Parameters
    ----------
    secret : bytes
        What :func:`cipher_secret` returns (32 bytes).
    run : bytes
        The run's identity (:func:`run_identity`, :data:`RUN_BYTES` bytes). Every
        coefficient and offset depends on it: another run's tags do not verify.
    """

    def __init__(self, secret: bytes, run: bytes):
        run = bytes(run)
        if len(run) != RUN_BYTES:
            raise fail("the tags' run identity", f"has {len(run)} bytes, not {RUN_BYTES}",
                       "Pass run_identity() of the parties' set-up nonces.")
        self.run = run
        # The key of this run's streams: the secret alone would give every run the same
        # offsets, so another run's sums (and combinations of them) would verify.
        self._key = hashlib.blake2b(run, key=bytes(secret), digest_size=32,
                                    person=b"hyfl run tags").digest()
        # The run's prime, as secret as the key ("Values shifted by a multiple of the
        # prime" in the module's docstring): a public one let the server add k P to any value.
        self.prime = _secret_prime(self._key)
        self._streams: dict[str, np.ndarray] = {}  # family -> its longest coefficient prefix yet

    def _stream(self, label: bytes, n: int) -> list[int]:
        """``n`` integers in ``[0, TAG_PRIME)``, a deterministic function of the key and label."""
        out: list[int] = []
        block = 0
        while len(out) < n:
            digest = hashlib.blake2b(label + block.to_bytes(8, "little"), key=self._key,
                                     digest_size=64, person=b"hyfl tag stream").digest()
            # 8 values of 64 bits per block, reduced mod P (bias below 2**-24).
            out.extend(int.from_bytes(digest[i:i + 8], "little") % self.prime
                       for i in range(0, 64, 8))
            block += 1
        return out[:n]

    def coefficients(self, family: str, n: int) -> list[int]:
        """The ``a_j`` of the first ``n`` integers of a vector of ``family``."""
        return self.coefficients_at(family, np.arange(n)).tolist()

    def coefficients_at(self, family: str, positions) -> np.ndarray:
        """The ``a_j`` of the given positions (object array of ints), from a cached prefix."""
        positions = np.asarray(positions, dtype=np.int64)
        need = int(positions.max()) + 1 if positions.size else 0
        have = self._streams.get(family)
        if have is None or have.size < need:
            size = max(need, 2 * (0 if have is None else have.size))
            stream = np.empty(size, dtype=object)
            stream[:] = self._stream(b"a\0" + family.encode(), size)
            self._streams[family] = have = stream
        return have[positions]

    def offset(self, context: Sequence) -> int:
        """``b(context)`` for a context of strings and integers."""
        return self._stream(b"b\0" + _context_bytes(context), 1)[0]

    def tag(self, family: str, integers: Sequence[int], context: Sequence,
            positions=None) -> int:
        """The tag of one contribution: its fixed-point integers in ``context``.

        ``positions``: where each integer sits in the family's vectors (default
        ``0 .. n-1``); the coefficients are those of the positions.
        """
        return (self._weighted(family, integers, positions) + self.offset(context)) % self.prime

    def verify(self, family: str, integers: Sequence[int], tag: int,
               contexts: Iterable[Sequence], positions=None, bound: int | None = None
               ) -> bool:
        """Is ``tag`` the summed tag of ``integers`` summed over exactly ``contexts``?

        ``tag`` is the decrypted sum of the contributions' tags (an integer in
        ``[0, m * prime)`` for ``m`` contributions), ``integers`` the decrypted
        sum of their values (at ``positions``, as in :meth:`tag`). Each context
        counts once: a list naming one twice is refused. ``bound``: the largest
        magnitude of one contribution's integer (the encoding's ``max_int``); a sum
        with an integer beyond ``m * bound`` is refused (no honest sum has one).
        """
        contexts = [tuple(c) for c in contexts]
        tag = int(tag)
        if len(set(contexts)) < len(contexts):  # a contribution counted twice never verifies
            return False
        if not 0 <= tag < max(len(contexts), 1) * self.prime:
            return False
        if bound is not None:
            limit = len(contexts) * int(bound)
            if any(abs(int(x)) > limit for x in integers):
                return False
        expected = self._weighted(family, integers, positions)
        expected += sum(self.offset(c) for c in contexts)
        return (tag - expected) % self.prime == 0

    def _weighted(self, family: str, integers: Sequence[int], positions) -> int:
        """``sum_j a_j u_j`` over the integers (Python ints: exact at any size)."""
        u = np.empty(len(integers), dtype=object)
        u[:] = [int(x) for x in integers]
        if positions is None:
            positions = np.arange(u.size)
        nonzero = np.flatnonzero(u != 0)
        if nonzero.size == 0:
            return 0
        a = self.coefficients_at(family, np.asarray(positions, dtype=np.int64)[nonzero])
        return int(np.dot(a, u[nonzero]))


def cipher_secret(cipher) -> bytes | None:
    """32 bytes every holder of the private key derives alike, and no one else can.

    A hash of the private key (Paillier's ``p`` and ``q``; the ckks context with
    its secret key, whose serialization is deterministic): the parties share
    it, the server -- which holds only the public key -- cannot compute it.
    ``None`` for a cipher without a private key (``none``, a server's cipher).
    """
    if cipher.name == "ckks":
        if not getattr(cipher, "has_private_key", False):
            return None
        material = cipher.context_bytes(secret=True)
    else:
        private = getattr(getattr(cipher, "_key", None), "private_key", None)
        if private is None:
            return None
        material = f"{int(private.p):x}:{int(private.q):x}".encode()
    return hashlib.blake2b(material, digest_size=32, person=b"hyfl party key").digest()


def tag_key(cipher, run: bytes | None) -> TagKey | None:
    """The tag key of a key holder's cipher in run ``run`` (None without a private key:
    no tags).

    ``run`` is the run's identity (:func:`run_identity`); a key holder without one is
    refused: its tags would be those of every run.
    """
    secret = cipher_secret(cipher)
    if secret is None:
        return None
    if run is None:
        raise fail("the tag key", "has no run identity (it would be every run's key)",
                   "Give the party the run's identity from the set-up's nonces.")
    return TagKey(secret, run)


def run_identity(nonces: Sequence[bytes]) -> bytes:
    """The identity of a run: SHA-256 over every party's set-up nonce, in party order.

    Each party draws a fresh nonce for its announcement and the set-up relays
    all of them with their tags (keyed with the secret the server lacks), so
    every party computes the same identity from values it checked, its own
    fresh nonce among them: no earlier run had it, and the server cannot
    choose it.

    Parameters
    ----------
    nonces : sequence of bytes
        Party ``k``'s nonce at position ``k``.

    Returns
    -------
    bytes
        :data:`RUN_BYTES` bytes.
    """
    h = hashlib.sha256(b"hyfl run identity\0")
    h.update(len(nonces).to_bytes(8, "little"))
    for nonce in nonces:
        nonce = bytes(nonce)  # length-prefixed: the concatenation is unambiguous
        h.update(len(nonce).to_bytes(8, "little") + nonce)
    return h.digest()


#: Bases of a Miller-Rabin test that is exact below 3.3 * 10**24.
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def _secret_prime(key: bytes) -> int:
    """The tags' modulus of one run: a prime in ``[2**39, TAG_PRIME]`` only the key's
    holders know, uniform among them (the first prime of a stream of independent odd
    candidates the key draws: not the prime after a gap, which a large gap would favour)."""
    for counter in range(1 << 20):
        seed = hashlib.blake2b(counter.to_bytes(8, "little"), key=key, digest_size=8,
                               person=b"hyfl tag prime").digest()
        candidate = (2**39 + int.from_bytes(seed, "little") % 2**39) | 1
        if candidate <= TAG_PRIME and _is_prime(candidate):
            return candidate
    raise AssertionError("no prime among 2**20 candidates")  # pragma: no cover (p ~ 0)


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for the sizes :func:`_secret_prime` tests."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _context_bytes(context: Sequence) -> bytes:
    """An unambiguous encoding of a context (type-tagged, length-prefixed items)."""
    out = bytearray()
    for item in context:
        if isinstance(item, (bool, np.bool_)):
            raise TypeError("a tag context holds strings and integers, not booleans")
        if isinstance(item, (int, np.integer)):
            data = b"i" + int(item).to_bytes(16, "little", signed=True)
        elif isinstance(item, str):
            data = b"s" + item.encode()
        else:
            raise TypeError(f"a tag context holds strings and integers, not {type(item).__name__}")
        out += len(data).to_bytes(4, "little") + data
    return bytes(out)
