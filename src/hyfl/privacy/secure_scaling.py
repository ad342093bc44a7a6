"""Feature scaling across parties from a secure sum of their column statistics.

Users scale features before training, but in a vertical or hybrid split no party
holds a whole column. Here every client computes, for the features it holds, the
sum and the sum of squares of its own entries; a *secure sum* adds them over the
clients, so that the totals -- and nothing else -- become known:

* **Secure sum by pairwise masks** (the core of Bonawitz et al.'s secure
  aggregation). Values are fixed-point integers modulo ``2**64``. Every pair of
  clients ``j < k`` shares a random mask ``m_jk`` (from a seed they agree on);
  client ``k`` sends ``encode(v_k) + sum_{j > k} m_kj - sum_{j < k} m_jk``. Each
  message alone is uniformly distributed; the server adds them and the masks
  cancel, leaving ``encode(sum_k v_k)`` exactly. (No dropout recovery: every
  client must send, which holds before training.) In a deployment the masks are
  per cell (:func:`cell_masks`: the pair's key, the run, the global column and
  the moment), never a stream a feature count could shift, and every party adds a
  keyed linear check sum (:func:`masked_check`), so that totals the server altered
  are refused (:func:`verify_totals`).
* **What it reveals.** Every party and the server learn each feature's mean and
  standard deviation over all samples (cells no party holds count as 0), and
  nothing about any one party's entries beyond what those totals imply -- for a
  feature held by a single client, its own column statistics.

The scaling divides every feature by its standard deviation (features that do not
vary keep scale 1). It does not centre: centring would turn the zeros of sparse data
into non-zeros (which also have no owner in a non-rectangular split), and with an
intercept the means are absorbed by the bias. A model trained on scaled features
is turned back into one for the raw features by dividing its weights by the scales
(:func:`unscale_weights`), so its model file predicts on raw data.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from hyfl.errors import fail
from hyfl.partition import Partition, stack

FRACTION_BITS = 24
"""Fixed-point resolution of the secure sum: ``2**-24`` (about 6e-8) per value."""

_LIMIT = 2.0 ** (63 - FRACTION_BITS)


def encode(values: np.ndarray) -> np.ndarray:
    """Floats as fixed-point integers modulo ``2**64`` (two's complement), exactly summable."""
    values = np.asarray(values, dtype=np.float64)
    if not np.all(np.abs(values) < _LIMIT):
        raise fail("feature statistics", f"exceed the secure sum's range (|v| < 2**"
                   f"{63 - FRACTION_BITS})", "Rescale the data (e.g. to thousands) before "
                   "training, or train without --standardize.")
    return np.round(values * 2.0**FRACTION_BITS).astype(np.int64).view(np.uint64)


def decode(integers: np.ndarray) -> np.ndarray:
    """The inverse of :func:`encode`."""
    return np.asarray(integers, dtype=np.uint64).view(np.int64).astype(np.float64) \
        / 2.0**FRACTION_BITS


def masked_messages(parts: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    """What each client sends: its encoded values plus its pairwise masks (uint64)."""
    n = len(parts)
    messages = [encode(p) for p in parts]
    for j in range(n):
        for k in range(j + 1, n):
            mask = rng.integers(0, 2**64, size=messages[j].shape, dtype=np.uint64,
                                endpoint=False)
            messages[j] = messages[j] + mask  # wraps modulo 2**64
            messages[k] = messages[k] - mask
    return messages


def cell_masks(pair_key: bytes, run: bytes, columns: np.ndarray, moments: int = 2,
               first_moment: int = 0) -> np.ndarray:
    """The masks two parties derive for the given global columns: (2, n) uint64, uniform.

    Cell ``(moment, column)`` gets its own pseudorandom value: AES-256 (a key
    derived by HKDF from the pair's key, with the run's identity as salt) of the
    block ``(moment, column)``, its first 8 bytes read as a little-endian
    integer. A mask is thus a function of the pair, the run, the global column
    and the moment alone -- never of a position in a stream the server's feature
    count or numbering would shape, so a party told other numbers than its peer
    masks other cells with other values and carries none of its peer's masks
    (tests/test_secure_scaling.py). Both ends of a pair get the same values, and
    nobody without the key can tell them from random (the deployment's pairs share
    X25519 keys, :meth:`hyfl.privacy.alignment.ChannelKey.shared`; the run's
    identity is :func:`hyfl.privacy.alignment.alignment_identity`).
    """
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    columns = np.asarray(columns, dtype=np.int64)
    if columns.ndim != 1 or (columns.size and columns.min() < 0):
        raise fail("the secure sum's columns", "are not a list of global feature ids",
                   "Both sides must run the same hyfl version.")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=bytes(run),
               info=b"hyfl secure-sum cell masks v2").derive(bytes(pair_key))
    blocks = np.zeros((moments, columns.size, 2), dtype="<u8")  # one 16-byte block per cell
    blocks[:, :, 0] = (first_moment + np.arange(moments, dtype=np.uint64))[:, None]  # moment
    blocks[:, :, 1] = columns.astype(np.uint64)[None, :]  # the global column
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()  # a PRF of distinct blocks
    out = encryptor.update(blocks.tobytes()) + encryptor.finalize()
    return np.frombuffer(out, dtype="<u8").reshape(moments, columns.size, 2)[:, :, 0] \
        .astype(np.uint64)


def masked_message(values: np.ndarray, party: int, pair_keys: dict[int, bytes], run: bytes,
                   columns: np.ndarray | None = None) -> np.ndarray:
    """What ``party`` sends of its ``values`` to a secure sum with keyed pairwise masks.

    ``values`` (2, n) are the moments of the global ``columns`` (default ``0 .. n-1``);
    ``pair_keys`` maps every other party to the key the two share; ``run`` is the run's
    identity. The mask of the pair ``j < k`` (:func:`cell_masks`) is added by ``j`` and
    subtracted by ``k``, so the masks cancel in the server's sum (:func:`sum_messages`)
    when every party sends the same cells.
    """
    message = encode(values)
    if columns is None:
        columns = np.arange(message.shape[1])
    for peer, key in pair_keys.items():
        if peer == party:
            continue
        mask = cell_masks(key, run, columns)
        message = message + mask if party < peer else message - mask  # modulo 2**64
    return message


#: The check sum's field: the Mersenne prime 2**127 - 1, larger than any difference of two
#: totals (each below 2**64), so no change of the totals is a multiple of it.
CHECK_PRIME = 2**127 - 1
#: The check sum travels as this many 32-bit limbs, one uint64 cell each: the server's sum
#: of the cells is then the exact sum of the parties' limbs (no carry is lost mod 2**64).
CHECK_LIMBS = 4
#: The moment number of the check sum's cells in :func:`cell_masks` (the moments are 0, 1).
_CHECK_MOMENT = 2


def check_key(secret: bytes, run: bytes) -> bytes:
    """The key of the secure sum's check sum: the key holders' ``secret`` and the run's
    identity (a server lacks the first; another run has another second)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=bytes(run),
                info=b"hyfl secure-sum check v1").derive(bytes(secret))


def _field_elements(key: bytes, first: int, columns: np.ndarray) -> list[int]:
    """Pseudorandom elements of ``GF(CHECK_PRIME)``: AES-256 under ``key`` of the blocks
    ``(first, c)``, read as 128-bit integers (reduced; bias below 2**-126)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    blocks = np.zeros((np.size(columns), 2), dtype="<u8")
    blocks[:, 0], blocks[:, 1] = first, np.asarray(columns, dtype=np.uint64)
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    out = encryptor.update(blocks.tobytes()) + encryptor.finalize()
    return [int.from_bytes(out[16 * i:16 * i + 16], "little") % CHECK_PRIME
            for i in range(np.size(columns))]


def _check_of(key: bytes, encoded: np.ndarray, offsets: list[int]) -> int:
    """``sum_c r_c v_c + sum(offsets) mod CHECK_PRIME`` of encoded (2, n) values ``v`` read
    as signed integers, with ``r`` per cell (moment, column) from ``key``."""
    values = np.asarray(encoded, dtype=np.uint64).view(np.int64)
    n = values.shape[1]
    total = sum(offsets)
    for moment in range(2):
        r = _field_elements(key, moment, np.arange(n))
        total += sum(a * int(v) for a, v in zip(r, values[moment].tolist()))
    return total % CHECK_PRIME


def _offset(key: bytes, party: int) -> int:
    return _field_elements(key, 3, np.array([party]))[0]


def masked_check(values: np.ndarray, party: int, pair_keys: dict[int, bytes], run: bytes,
                 key: bytes) -> np.ndarray:
    """The check sum ``party`` adds to its :func:`masked_message` of ``values`` (2, n):
    ``t = r . encode(values) + b_party mod CHECK_PRIME`` with ``r`` per cell and ``b`` per
    party from :func:`check_key` (which the server lacks), as ``CHECK_LIMBS`` 32-bit limbs
    masked with the pairs' keys like every other cell (moment 2 of :func:`cell_masks`).

    The server's sum of the limbs is ``sum_k t_k``, which equals ``r . T + sum_k b_k`` for
    the true totals ``T``. Totals altered by ``d != 0`` pass only if the check sum is
    altered by ``r . d`` (mod the prime), which the server cannot compute without ``r``:
    chance ``2**-127``, and ``b`` refuses a multiple ``lambda T`` of the totals
    (:func:`verify_totals`; tests/test_review_alignment.py).
    """
    t = _check_of(key, encode(values), [_offset(key, party)])
    limbs = np.array([(t >> (32 * i)) & 0xFFFFFFFF for i in range(CHECK_LIMBS)],
                     dtype=np.uint64)
    for peer, pair in pair_keys.items():
        if peer == party:
            continue
        mask = cell_masks(pair, run, np.arange(CHECK_LIMBS), moments=1,
                          first_moment=_CHECK_MOMENT)[0]
        limbs = limbs + mask if party < peer else limbs - mask  # modulo 2**64
    return limbs


def verify_totals(totals: np.ndarray, check: np.ndarray, n_parties: int, key: bytes) -> bool:
    """Whether the summed ``totals`` (2, n) uint64 carry the summed check sum ``check``
    (``CHECK_LIMBS`` uint64) of ``n_parties`` parties' :func:`masked_check`."""
    check = np.asarray(check, dtype=np.uint64)
    if check.shape != (CHECK_LIMBS,):
        return False
    summed = sum(int(limb) << (32 * i) for i, limb in enumerate(check.tolist()))
    expected = _check_of(key, totals, [_offset(key, k) for k in range(n_parties)])
    return summed % CHECK_PRIME == expected


def sum_messages(messages: list[np.ndarray]) -> np.ndarray:
    """The server's sum of masked messages (uint64, wrapping); :func:`decode` reads it."""
    total = np.zeros_like(np.asarray(messages[0], dtype=np.uint64))
    for message in messages:
        total = total + np.asarray(message, dtype=np.uint64)
    return total


def secure_sum(parts: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """``sum(parts)`` as the server computes it from the masked messages alone."""
    messages = masked_messages(parts, rng)
    total = np.zeros_like(messages[0])
    for message in messages:
        total = total + message
    return decode(total)


def column_moments(X, columns: np.ndarray | None = None, n_features: int | None = None
                   ) -> np.ndarray:
    """``[sum of x, sum of x^2]`` of each column of ``X``, shape (2, n_features).

    ``columns`` are the global features of ``X``'s columns (default: the
    columns themselves); the others are 0.
    """
    X = sp.csr_matrix(X, dtype=np.float64)
    local = np.vstack([np.asarray(X.sum(axis=0)).ravel(),
                       np.asarray(X.multiply(X).sum(axis=0)).ravel()])
    if columns is None:
        return local
    out = np.zeros((2, int(n_features)))
    out[:, np.asarray(columns, dtype=np.int64)] = local
    return out


def client_column_sums(partition: Partition, X) -> list[np.ndarray]:
    """Each client's ``[sum of x, sum of x^2]`` over its own entries, per feature (2, M)."""
    blocks = stack(partition, X)
    return [column_moments(blocks.X[blocks.client_rowptr[k]:blocks.client_rowptr[k + 1]])
            for k in range(blocks.n_clients)]


def secure_feature_scales(partition: Partition, X, rng: np.random.Generator,
                          keep: np.ndarray | None = None) -> np.ndarray:
    """Every feature's standard deviation from the clients' secure sum (1 where constant).

    Parameters
    ----------
    partition : Partition
        Who holds which entries of ``X``.
    X : sparse matrix, shape (N, M)
    rng : Generator
        The pairwise masks' source (the parties' shared seeds, simulated).
    keep : array of int, optional
        Columns to leave unscaled (scale 1), e.g. the intercept's constant column.

    Returns
    -------
    ndarray, shape (M,)
    """
    totals = secure_sum(client_column_sums(partition, X), rng)
    return scales_from_moments(totals, X.shape[0], keep)


def scales_from_moments(totals: np.ndarray, n_samples: int,
                        keep: np.ndarray | None = None) -> np.ndarray:
    """Every feature's standard deviation from its summed ``[sum x, sum x^2]`` (2, M) over
    ``n_samples`` samples; 1 where a feature does not vary and for the ``keep`` columns."""
    totals = np.asarray(totals, dtype=np.float64)
    mean = totals[0] / n_samples
    variance = np.maximum(totals[1] / n_samples - mean * mean, 0.0)
    scale = np.sqrt(variance)
    scale[scale <= 1e-12 * np.maximum(1.0, np.abs(mean))] = 1.0
    if keep is not None:
        scale[np.asarray(keep, dtype=np.int64)] = 1.0
    return scale


def scale_columns(X, scale: np.ndarray) -> sp.csr_matrix:
    """``X`` with column ``m`` divided by ``scale[m]`` (the sparsity pattern is kept)."""
    X = sp.csr_matrix(X, dtype=np.float64, copy=True)
    X.data /= scale[X.indices]
    return X


def unscale_weights(weights: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Weights of a model of scaled features as weights of the raw features (M, C)."""
    return np.asarray(weights, dtype=np.float64) / np.asarray(scale)[:, None]
