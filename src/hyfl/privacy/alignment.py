"""Aligning the parties' own files over the network: a join the server computes blind.

Each party of a deployment brings its own file, keyed by its own sample ids
(:mod:`hyfl.deploy.party_files`). Before the first round every sample must get
one global index, the server must learn which party holds which sample (HyFDCA
aggregates over each sample's holders, ``|B_i|``), and no raw id may leave its
party. This module has the mathematics of that step; the deployment carries
its messages.

The join (Diffie-Hellman private set intersection, after Meadows 1986 and
Huberman, Franklin and Hogg 1999)
---------------------------------------------------------------------------
Every party ``k`` draws a secret scalar ``a_k`` and hashes each id to a point
``H(x)`` of Curve25519 (SHA-256 of the id under a domain label, read as an
X25519 u-coordinate). Blinding is X25519 scalar multiplication, which
commutes: ``(H(x)^a)^b = (H(x)^b)^a``.

1. Each party sends its blinded ids ``H(x)^a_k``, in a fresh secret order (not
   its file's), with a tag (:func:`hello_tag`) over them, its nonce, its
   channel key and its columns' keys.
2. The server hands each party its peers' lists; the party checks each
   list's tag for its place, and only then blinds them again with its own
   scalar and sends them back, in the peer's order.
3. For a pair ``(j, k)`` the server now holds ``H(x)^(a_j a_k)`` for the rows
   of ``j`` and for the rows of ``k``, each in its owner's list order; equal
   values are the same sample (:func:`join`). It numbers the samples
   (:func:`number_samples`) in an order drawn afresh each run.

What each side learns (the decisional Diffie-Hellman assumption on
Curve25519 and its twist, which the curve was chosen to make hard; SHA-256 as
a random oracle; no collusion of the server with a party):

* the **server**: every party's number of ids and, per pair, which position of
  one list is which of the other -- the layout HyFDCA's server needs anyway,
  not the files' row orders (the lists go out shuffled). It never sees an id.
  An active server **cannot test a guessed id**: that needs a party to blind a
  point of the server's choosing, and a party blinds only lists under their
  owner's tag for their place. Refused: guesses appended to a list, a list in another peer's place
  (``tests/test_relayed_values.py::test_the_server_cannot_test_guessed_ids_against_a_partys_file``,
  ``::test_a_peer_list_in_another_peers_place_is_refused``).
* a **party**: its peers' numbers of ids, the keys of their column names
  (:func:`column_keys`: which columns two parties share, and whether a peer
  has a name it guesses), and then what the deployment tells it: for each
  peer, which of its rows that peer holds too (to seal their labels), its
  samples' global indices and the holder counts of the set-up.

The run's identity (:func:`alignment_identity`) is SHA-256 of every party's
``hello`` nonce in party order; each party computes it from the nonces it
checked (its own fresh one among them), and it enters every seal and mask of
the alignment: values of another run, or of a run the server showed some
parties otherwise, neither open nor cancel.

Re-blinded lists go to the server, which cannot check them (it lacks the tag
key), and each party's re-blinding of a peer's list goes back to that peer
under a tag keyed with the secret and the run (:func:`reblinded_tag`): the
peer computes its join with the party itself and refuses a ``labels``
message whose pairs are not exactly that join (a shared sample left out
could otherwise be numbered twice unnoticed). That join is what the message
tells the party anyway: which of its rows the peer holds, at which of the
peer's positions. Each party's own re-blinding of its peers' tagged lists is
what binds the labels to their rows (below), with each side's own global
number of the row: two holders of one sample given two numbers do not open
each other's labels.

Cost: a party blinds its own ids once and each peer's once: ``n_k + sum_j
n_j`` X25519 operations (OpenSSL's, about 30-60 microseconds each here, see
docs/deployment.md), 32 bytes per id per message.

The label channel
-----------------
A sample's holders all need its label, which often only one of them has. Two
parties ``j`` and ``k`` agree a pairwise key by X25519 (:class:`ChannelKey`),
its public halves relayed by the server under their owners' tags (the server
cannot substitute its own halves), and send each other labels sealed with
AES-GCM (:func:`seal`, :func:`unseal`), in an order the server gives both.
The seal's associated data (:func:`label_context`) holds the run's identity,
sender, receiver, the task and classes, and :func:`pairing_digest` of the
rows: per row, the sender's and the receiver's blinded ids and the doubly
blinded id each computes itself from the other's -- equal only for one
sample. A label opens only on the receiver's row of the same sample, in the
same order: a server that reorders or swaps rows stops the run
(``tests/test_relayed_values.py::test_the_server_cannot_put_labels_on_the_wrong_samples``).

Point-hashing note: about half of all 32-byte strings are u-coordinates of
the quadratic twist rather than the curve. X25519 is defined on both and
clears the small cofactors by its scalar clamping; the twist's large prime
subgroup (about 2^252) keeps the discrete logarithm as hard there.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from hyfl.errors import fail

__all__ = ["POINT_BYTES", "BlindingKey", "ChannelKey", "alignment_identity", "column_keys",
           "hash_ids", "hello_tag", "join", "label_context", "number_features", "number_samples",
           "pairing_digest", "reblinded_tag", "relay_key", "seal", "unseal"]

#: Bytes of a blinded id (an X25519 u-coordinate).
POINT_BYTES = 32
_DOMAIN = b"hyfl sample id v1\0"
#: Ids per progress report while blinding.
_BATCH = 4096

Progress = Callable[[int], None]


def hash_ids(ids: Sequence[str]) -> np.ndarray:
    """``H(x)`` of each id (its UTF-8 text), as an ``(n, 32)`` uint8 array."""
    out = np.empty((len(ids), POINT_BYTES), dtype=np.uint8)
    buffer = bytearray()
    for value in ids:
        buffer += hashlib.sha256(_DOMAIN + str(value).encode()).digest()
    if ids:
        out[:] = np.frombuffer(bytes(buffer), dtype=np.uint8).reshape(-1, POINT_BYTES)
    return out


class BlindingKey:
    """A party's secret scalar for one alignment (never leaves the party).

    Parameters
    ----------
    secret : bytes, optional
        32 bytes; a fresh random scalar by default.
    """

    def __init__(self, secret: bytes | None = None):
        self.secret = secrets.token_bytes(32) if secret is None else bytes(secret)

    def apply(self, points: np.ndarray, progress: Progress | None = None,
              what: str = "the blinded ids") -> np.ndarray:
        """Raise every point to this scalar: ``(n, 32)`` uint8 in, ``(n, 32)`` out.

        ``progress`` is called with the number of points done after each batch.
        A point of low order (which no hashed id is; only a forged list has one)
        is refused, naming ``what``.
        """
        points = np.ascontiguousarray(points, dtype=np.uint8)
        if points.ndim != 2 or points.shape[1] != POINT_BYTES:
            raise fail(what, f"have shape {points.shape}, not (n, {POINT_BYTES})",
                       "Both sides must run the same hyfl version.")
        key = X25519PrivateKey.from_private_bytes(self.secret)
        load = X25519PublicKey.from_public_bytes
        out = bytearray()
        n = points.shape[0]
        raw = points.tobytes()
        for start in range(0, n, _BATCH):
            stop = min(n, start + _BATCH)
            try:
                for i in range(start, stop):
                    out += key.exchange(load(raw[i * POINT_BYTES:(i + 1) * POINT_BYTES]))
            except ValueError:  # OpenSSL refuses an all-zero result: a low-order point
                raise fail(what, "contain a point of low order (a forged list)",
                           "The alignment stops: restart it with honest parties.") from None
            if progress is not None:
                progress(stop)
        result = np.frombuffer(bytes(out), dtype=np.uint8).reshape(n, POINT_BYTES)
        return result.copy()


def join(double_a: np.ndarray, double_b: np.ndarray, names: tuple[str, str]
         ) -> tuple[np.ndarray, np.ndarray]:
    """The rows of two parties that hold the same sample, from their doubly blinded ids.

    Parameters
    ----------
    double_a, double_b : ndarray of uint8, shape (n_a, 32) and (n_b, 32)
        ``H(x)^(a b)`` of each party's ids, in its row order.
    names : (str, str)
        The two parties, for errors.

    Returns
    -------
    rows_a, rows_b : ndarray of int64
        Matching row numbers (``rows_a`` ascending).
    """
    keys = []
    for points, name in zip((double_a, double_b), names):
        points = np.ascontiguousarray(points, dtype=np.uint8)
        if points.ndim != 2 or points.shape[1] != POINT_BYTES:
            raise fail(f"the blinded ids of {name}", f"have shape {points.shape}",
                       "Both sides must run the same hyfl version.")
        key = points.view(np.dtype((np.void, POINT_BYTES))).ravel()
        if np.unique(key).size != key.size:
            raise fail(f"the blinded ids of {name}", "repeat a value: the party sent an id "
                       "twice, or blinded a peer's list wrongly",
                       "Every party's ids must be unique; run every party with the same hyfl "
                       "version.")
        keys.append(key)
    _, rows_a, rows_b = np.intersect1d(keys[0], keys[1], assume_unique=True,
                                       return_indices=True)
    order = np.argsort(rows_a)
    return rows_a[order].astype(np.int64), rows_b[order].astype(np.int64)


def number_samples(sizes: Sequence[int],
                   matches: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]],
                   rng: np.random.Generator) -> tuple[list[np.ndarray], int]:
    """Give every sample one global index, from the pairwise matches.

    Parameters
    ----------
    sizes : sequence of int
        Each party's number of rows.
    matches : dict
        ``(j, k)`` with ``j < k`` -> matching rows of ``j`` and of ``k`` (:func:`join`).
    rng : numpy.random.Generator
        Draws the order of the samples (fresh each run: the indices then reveal
        no party's file order).

    Returns
    -------
    index : list of ndarray of int64
        Each party's rows' global indices.
    n_samples : int
    """
    index: list[np.ndarray] = []
    n = 0
    for k, size in enumerate(sizes):
        g = np.full(size, -1, dtype=np.int64)
        for j in range(k):
            rows_j, rows_k = matches.get((j, k), (np.empty(0, np.int64), np.empty(0, np.int64)))
            earlier = index[j][rows_j]
            if np.any((g[rows_k] >= 0) & (g[rows_k] != earlier)):
                raise fail(f"party {k}'s alignment", "matched one row to two different "
                           "samples of earlier parties",
                           "Blinded ids were altered on the way; restart the alignment.")
            g[rows_k] = earlier
        new = g < 0
        g[new] = np.arange(n, n + int(new.sum()))
        n += int(new.sum())
        index.append(g)
    shuffle = rng.permutation(n)
    return [shuffle[g] for g in index], n


class ChannelKey:
    """One party's half of the pairwise label channels (X25519 key agreement)."""

    def __init__(self, secret: bytes | None = None):
        self.secret = secrets.token_bytes(32) if secret is None else bytes(secret)

    @property
    def public(self) -> bytes:
        return X25519PrivateKey.from_private_bytes(self.secret).public_key().public_bytes_raw()

    def shared(self, peer_public: bytes, pair: tuple[int, int]) -> bytes:
        """The AES-GCM key this party shares with the peer of ``pair`` (sorted party pair)."""
        try:
            point = X25519PrivateKey.from_private_bytes(self.secret).exchange(
                X25519PublicKey.from_public_bytes(bytes(peer_public)))
        except ValueError:
            raise fail(f"the channel key of party {pair}", "is not a valid X25519 key",
                       "Both sides must run the same hyfl version.") from None
        info = b"hyfl label channel %d %d" % tuple(sorted(pair))
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(point)


def column_keys(names: Sequence[str], secret: bytes | None) -> np.ndarray:
    """A digest of each column name, keyed with the key holders' secret: ``(n, 32)`` uint8.

    The parties number the features themselves from these (:func:`number_features`),
    so the numbering the server sends each party can be checked; a peer sees which
    names two parties share, not the names (unless it guesses one). Without a secret
    (cipher ``none``) the digest is unkeyed.
    """
    out = np.empty((len(names), POINT_BYTES), dtype=np.uint8)
    for i, name in enumerate(names):
        mac = hashlib.blake2b(str(name).encode(), key=secret or b"", digest_size=POINT_BYTES,
                              person=b"hyfl column")
        out[i] = np.frombuffer(mac.digest(), dtype=np.uint8)
    return out


def number_features(keys: Sequence[np.ndarray]) -> tuple[list[np.ndarray], int]:
    """Global feature ids of every party's columns: by first appearance, in party order.

    Parameters
    ----------
    keys : sequence of ndarray of uint8, shape (n_k, 32)
        Each party's :func:`column_keys`, in its column order.

    Returns
    -------
    features : list of ndarray of int64
        Each party's columns' global ids (as the server numbers the names).
    n_features : int
    """
    seen: dict[bytes, int] = {}
    features = []
    for party in keys:
        ids = [seen.setdefault(bytes(row), len(seen)) for row in np.asarray(party, np.uint8)]
        features.append(np.asarray(ids, dtype=np.int64))
    return features, len(seen)


def hello_tag(secret: bytes, party: int, nonce: bytes, public: bytes, blinded: np.ndarray,
              columns: np.ndarray) -> bytes:
    """A party's tag over everything its ``hello`` gives the server to relay to its peers.

    Keyed with the key holders' secret (the server lacks it): the party's index, its
    fresh nonce, its channel key's public half, its number of ids and its blinded ids
    (by their SHA-256), its columns' keys (:func:`column_keys`). A peer checks it before
    it re-blinds a list or uses a key: the server can add no point to a list, move a
    list to another party's place, or replace a key (tests/test_relayed_values.py).
    """
    blinded = np.ascontiguousarray(blinded, dtype=np.uint8)
    columns = np.ascontiguousarray(columns, dtype=np.uint8)
    mac = hashlib.blake2b(key=secret, digest_size=32, person=b"hyfl hello v2")
    for item in (int(party).to_bytes(8, "little"), bytes(nonce), bytes(public),
                 blinded.shape[0].to_bytes(8, "little"),
                 hashlib.sha256(blinded.tobytes()).digest(),
                 columns.shape[0].to_bytes(8, "little"),
                 hashlib.sha256(columns.tobytes()).digest()):
        mac.update(len(item).to_bytes(8, "little") + item)  # length-prefixed: unambiguous
    return mac.digest()


def alignment_identity(nonces: Sequence[bytes]) -> bytes:
    """The alignment's run identity: SHA-256 over every party's ``hello`` nonce, in party
    order (each fresh, and under its party's :func:`hello_tag`). Every party computes it
    from the nonces it checked, its own among them: the server cannot choose it, and no
    other run has it."""
    h = hashlib.sha256(b"hyfl alignment identity\0")
    h.update(len(nonces).to_bytes(8, "little"))
    for nonce in nonces:
        nonce = bytes(nonce)
        h.update(len(nonce).to_bytes(8, "little") + nonce)
    return h.digest()


def relay_key(secret: bytes, run: bytes) -> bytes:
    """The key of the tags over what a party sends its peers after ``hello``
    (:func:`reblinded_tag`): the key holders' secret and the run's identity."""
    return hashlib.blake2b(bytes(run), key=secret, digest_size=32,
                           person=b"hyfl relay key").digest()


def reblinded_tag(key: bytes, blinder: int, owner: int, points: np.ndarray) -> bytes:
    """``blinder``'s tag over its re-blinding of ``owner``'s list (:func:`relay_key`): the
    server relays the list to its owner, which computes its join with that peer itself
    and so checks that the server's ``labels`` message names every shared pair and no
    other (a pair left out, or added, stops the run)."""
    points = np.ascontiguousarray(points, dtype=np.uint8)
    mac = hashlib.blake2b(key=key, digest_size=32, person=b"hyfl reblinded")
    for item in (int(blinder).to_bytes(8, "little"), int(owner).to_bytes(8, "little"),
                 points.shape[0].to_bytes(8, "little"), hashlib.sha256(points.tobytes()).digest()):
        mac.update(len(item).to_bytes(8, "little") + item)
    return mac.digest()


def pairing_digest(sender_ids: np.ndarray, receiver_ids: np.ndarray, doubles: np.ndarray,
                   numbers: np.ndarray | None = None) -> bytes:
    """SHA-256 of the rows a sealed label list is of, in its order.

    Row ``i`` is the sender's blinded id of its row, the receiver's blinded id of
    its row (both as their owners sent them in ``hello``, under their tags) and
    the doubly blinded id of the sample: the sender computes it from the
    receiver's id, the receiver from the sender's, so the two agree only if both
    rows are of one sample. Bound into the seal (:func:`label_context`), a label
    opens only on the receiver's row of the same sample, in the same order.
    ``numbers``, each side's own global sample number of its row: equal only if the
    server numbered the sample alike at both holders.
    """
    rows = np.concatenate([np.ascontiguousarray(a, dtype=np.uint8).reshape(-1, POINT_BYTES)
                           for a in (sender_ids, receiver_ids, doubles)], axis=1)
    digest = hashlib.sha256(np.ascontiguousarray(rows).tobytes())
    if numbers is not None:
        numbers = np.ascontiguousarray(numbers, dtype="<i8")
        digest.update(b"numbers" + numbers.size.to_bytes(8, "little") + numbers.tobytes())
    return digest.digest()


def label_context(run: bytes, sender: int, receiver: int, labels: bytes, pairing: bytes
                  ) -> bytes:
    """The associated data of the labels ``sender`` seals for ``receiver``: the run,
    both parties, a digest of the job's task and classes (``labels``) and
    :func:`pairing_digest` of the rows."""
    return (b"hyfl labels v2\0" + bytes(run) + int(sender).to_bytes(8, "little")
            + int(receiver).to_bytes(8, "little") + bytes(labels) + bytes(pairing))


def seal(key: bytes, values: np.ndarray, context: bytes) -> np.ndarray:
    """AES-GCM of float64 ``values``; a random nonce first. uint8 array out."""
    nonce = secrets.token_bytes(12)
    body = AESGCM(key).encrypt(nonce, np.ascontiguousarray(values, "<f8").tobytes(), context)
    return np.frombuffer(nonce + body, dtype=np.uint8).copy()


def unseal(key: bytes, sealed: np.ndarray, context: bytes, what: str) -> np.ndarray:
    """The float64 values of :func:`seal`; a changed or misdirected message is refused."""
    blob = np.ascontiguousarray(sealed, dtype=np.uint8).tobytes()
    try:
        plain = AESGCM(key).decrypt(blob[:12], blob[12:], context)
    except (InvalidTag, ValueError):
        raise fail(what, "do not open with the pairwise key (altered, or not for this party)",
                   "Restart the run; the server relayed a message that is not the peer's.") \
            from None
    return np.frombuffer(plain, dtype="<f8").copy()
