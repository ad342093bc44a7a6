"""Private set intersection (PSI) for aligning sample ids across parties.

In hybrid federated learning every client holds some rows (samples, keyed by
an id such as a patient number) and some columns (features). Before training,
the clients must learn which samples they share, so that a sample held by
several clients gets one global index and the server can aggregate over its
holders -- without a client learning ids that another client holds and it does
not, and without the coordinating server ever seeing a raw id.

Protocol
--------
Two-party runs use ECDH-PSI from OpenMined's ``openmined-psi`` (import name
``private_set_intersection.python``), with ``reveal_intersection=True``:

1. the PSI *client* blinds its ids with a secret key, ``H(x)^c``, and sends
   them (the *request*);
2. the PSI *server* answers with the request re-blinded under its own key,
   ``H(x)^(cs)``, in request order (the *response*), and with its own ids
   blinded, ``H(y)^s`` (the *setup*);
3. the client removes ``c`` from the response and checks which ``H(x)^s``
   occur in the setup.

The parties talk only through serialized protobuf bytes
(:class:`PSIClient` and :class:`PSIServer` exchange nothing else), so the
same calls work over a network. Under the decisional Diffie-Hellman
assumption in the random-oracle model and against semi-honest parties:

* the PSI client learns which of *its* ids the server holds, and the
  server's set size (the setup has one entry per server id);
* the PSI server learns the client's set size (the request has one entry per
  client id) and nothing else, not even the intersection size;
* a relay that forwards the messages (the coordinator) learns the two set
  sizes and nothing else: it can neither unblind nor re-blind a guessed id.

Exactness and false positives
-----------------------------
By default (``exact=True``) the setup carries the blinded server ids as they
are (``DataStructure.RAW``, sorted by the library so their order does not
reveal the server's file order). The result is then exact: no false
positives and no false negatives. With ``exact=False`` the setup is a Golomb
compressed set (``DataStructure.GCS``), about 6x smaller (33 bytes per server
id become about 5.6 at ``fpr=1e-9``), but the client then wrongly "finds" an id
the server does not hold with probability ``fpr`` *per run* (openmined-psi
sizes the filter so that the whole query of ``len(client_ids)`` ids has total
false-positive probability ``fpr``). There are never false negatives.
``fpr`` is ignored by the exact structure but is always validated.

Multi-party alignment (:func:`align`)
-------------------------------------
Parties are taken in the given order. For every pair ``j < k`` PSI runs in
*both* directions, so each of ``j`` and ``k`` learns which of its own rows the
other holds, i.e. both learn the same intersection ``S_jk`` (each as rows of
its own file). Both directions are needed because the coordinator must learn
*which row of j is which row of k*, and only a party that knows which of its
rows are shared can say so; a single run tells only the PSI client. Running
PSI once and letting ``k`` tell ``j`` would reveal the shared ids to the
coordinator; labelled PSI (returning a payload per match) is not offered by
openmined-psi.

The pairing itself uses an order both parties can compute but the coordinator
cannot: ``j`` and ``k`` agree a pairwise key ``K_jk`` with an ephemeral
Diffie-Hellman exchange relayed by the coordinator (built on openmined-psi's
own commutative cipher, so no further dependency: each party sends
``H(label)^a``, the shared secret is ``H(label)^(ab)``), sort their shared
rows by ``HMAC-SHA256(K_jk, id)`` and send the row numbers, in that order, to
the coordinator. The coordinator pairs the two lists position by position.
Sorting by the raw id instead would reveal to the coordinator the relative
order of the shared ids; the keyed order is pseudorandom to it.

The coordinator then assigns global indices: party 0's rows get
``0 .. n_0 - 1`` in file order; a row of party ``k`` paired with a row of an
earlier party takes that row's global index; the remaining (new) rows of
party ``k`` get fresh indices in file order.

What each party learns
----------------------
* Party ``k`` learns, for every other party ``j``: which of its own rows ``j``
  also holds (the pairwise intersection ``S_jk``, as ids it already had) and
  ``j``'s set size ``n_j``. It learns no id it does not hold, and nothing
  about samples shared by other parties but not by ``k``. See
  :attr:`Alignment.views`.
* The coordinator learns every party's set size and, per pair, which row of
  ``j`` and which row of ``k`` hold the same sample (row numbers only, in a
  pseudorandom order), hence the resulting global indices and holder counts,
  which it needs to aggregate. It never sees a raw id, and the PSI messages it
  relays are ciphertexts it cannot open. See :attr:`Alignment.coordinator_view`.
* The returned :class:`Alignment` is the coordinator's result. A party only
  needs its own rows' slots; note that the global index *values* reveal where
  the earliest holder listed a sample among its new ids, so hand a party its
  ``global_index`` only if that is acceptable.

Threat model: semi-honest (honest-but-curious) parties and coordinator, no
collusion between the coordinator and a party. A malicious party could use
different id sets in the two directions or with different peers; PSI of this
kind does not prevent a client from choosing its set to probe for ids.

Cost: each run costs about ``3 n_client + n_server`` elliptic-curve
operations and ``~35 (2 n_client + n_server)`` bytes with ``exact=True``; a
pair runs twice; ``m`` parties run ``m (m - 1)`` times.

Ids may be ``str`` (compared by their UTF-8 bytes), ``bytes``, or integers
(compared as ``str(i)``, so ``5``, ``"5"`` and ``b"5"`` are the same id).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np
import private_set_intersection.python as _psi
from google.protobuf.message import DecodeError

from hyfl.errors import fail

__all__ = [
    "Alignment",
    "CoordinatorView",
    "PSIClient",
    "PSIResult",
    "PSIServer",
    "PairwiseView",
    "align",
    "intersect",
]

# Public generator label of the pairwise Diffie-Hellman exchange (any fixed string
# works: security rests on the ephemeral keys, not on the label).
_DH_LABEL = b"hyfl.privacy.psi pairwise key agreement v1"
_KEY_CONTEXT = b"hyfl.privacy.psi pairing key v1\x00"


# --------------------------------------------------------------------- input checks


def _check_fpr(fpr: float) -> float:
    fix = "Pass a false-positive rate strictly between 0 and 1, e.g. fpr=1e-9."
    try:
        v = float(fpr)
    except (TypeError, ValueError):
        raise fail("fpr", f"must be a number, got {fpr!r}", fix) from None
    if not math.isfinite(v) or not 0.0 < v < 1.0:
        raise fail("fpr", f"must be in (0, 1), got {fpr!r}", fix)
    return v


def _encode_one(owner: str, row: int, item: object) -> bytes:
    # One canonical byte string per id, so that the same sample matches across
    # parties however each party's file typed it.
    if isinstance(item, str):
        try:
            return item.encode("utf-8")
        except UnicodeEncodeError:
            raise fail(
                f"{owner} id at row {row}",
                f"({item!r}) is not valid Unicode text",
                "Pass ids as valid str, or as bytes.",
            ) from None
    if isinstance(item, bytes | bytearray | memoryview):
        return bytes(item)
    # bool is an Integral but True/False as a sample id is almost surely a bug.
    if isinstance(item, Integral) and not isinstance(item, bool | np.bool_):
        return str(int(item)).encode("ascii")
    raise fail(
        f"{owner} id at row {row}",
        f"has type {type(item).__name__} ({item!r}), which is not an id",
        "Pass ids as str, bytes or int; convert other types explicitly "
        "(e.g. int(x) for whole-number floats read from a CSV).",
    )


def _encode_ids(owner: str, ids: Iterable[object]) -> list[bytes]:
    """Canonical bytes of ``ids``; raise on a bad container, bad id, empty or duplicates."""
    if isinstance(ids, str | bytes | bytearray):
        raise fail(
            owner,
            f"is a single {type(ids).__name__} ({ids!r}), not a sequence of ids",
            "Pass a list of ids, e.g. ['p1', 'p2'], not one string.",
        )
    try:
        items = list(ids)
    except TypeError:
        raise fail(
            owner,
            f"is a {type(ids).__name__}, not a sequence of ids",
            "Pass a list (or array) of str, bytes or int ids.",
        ) from None
    if not items:
        raise fail(
            owner,
            "has no ids",
            "Every party needs at least one sample; leave out parties without rows.",
        )
    encoded = [_encode_one(owner, row, item) for row, item in enumerate(items)]
    first_row: dict[bytes, int] = {}
    for row, key in enumerate(encoded):
        earlier = first_row.setdefault(key, row)
        if earlier != row:
            # 5 and "5" are one id; say so, or the message would look wrong.
            why = ""
            if type(items[earlier]) is not type(items[row]) or items[earlier] != items[row]:
                why = f" ({items[earlier]!r} and {items[row]!r} both mean {key!r})"
            raise fail(
                owner,
                f"has duplicate id {items[row]!r} at rows {earlier} and {row}{why}",
                "Ids must be unique within a party: keep one row per sample.",
            )
    return encoded


def _parse(kind: str, cls: type, data: bytes):
    """Parse a received message; a peer's garbage becomes a clear error."""
    msg = cls()
    try:
        msg.ParseFromString(bytes(data))
    except (DecodeError, TypeError):
        raise fail(
            f"PSI {kind} message",
            "could not be parsed",
            "Pass the exact bytes produced by the peer (check the transport).",
        ) from None
    return msg


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


# --------------------------------------------------------------------- two parties


class PSIClient:
    """The party that learns which of its ids the server holds.

    Parameters
    ----------
    ids : sequence of str, bytes or int
        The client's ids, unique, in file order.

    Notes
    -----
    Holds a fresh secret key; use one instance per run. Communication is
    :meth:`request` (bytes to send) and :meth:`intersection` (bytes received).
    """

    def __init__(self, ids: Sequence[object]) -> None:
        self._ids = _encode_ids("client_ids", ids)
        self._cipher = _psi.client.CreateWithNewKey(reveal_intersection=True)

    @classmethod
    def _from_encoded(cls, ids: list[bytes]) -> PSIClient:
        obj = cls.__new__(cls)
        obj._ids = ids
        obj._cipher = _psi.client.CreateWithNewKey(reveal_intersection=True)
        return obj

    @property
    def size(self) -> int:
        """Number of client ids."""
        return len(self._ids)

    def request(self) -> bytes:
        """Serialized request: the client's ids blinded under its key, in file order."""
        return self._cipher.CreateRequest(self._ids).SerializeToString()

    def intersection(self, setup: bytes, response: bytes) -> np.ndarray:
        """Rows of the client's ids that the server holds.

        Parameters
        ----------
        setup, response : bytes
            The server's two messages, as produced by :meth:`PSIServer.respond`.

        Returns
        -------
        numpy.ndarray
            Sorted int64 indices into the client's ids.
        """
        setup_msg = _parse("setup", _psi.ServerSetup, setup)
        response_msg = _parse("response", _psi.Response, response)
        if len(response_msg.encrypted_elements) != len(self._ids):
            raise fail(
                "PSI response",
                f"has {len(response_msg.encrypted_elements)} entries for a request of "
                f"{len(self._ids)}",
                "Answer the request of this client instance, not another one.",
            )
        try:
            rows = self._cipher.GetIntersection(setup_msg, response_msg)
        except RuntimeError as err:
            raise fail(
                "PSI setup/response messages",
                f"were rejected by openmined-psi ({err})",
                "Pass the messages the server produced for this client's request.",
            ) from None
        return np.sort(np.asarray(rows, dtype=np.int64))


class PSIServer:
    """The party that answers a PSI request and learns only the client's set size.

    Parameters
    ----------
    ids : sequence of str, bytes or int
        The server's ids, unique.
    fpr : float, default 1e-9
        False-positive probability of the whole query; used only if ``exact``
        is False. Must lie in (0, 1).
    exact : bool, default True
        Send the blinded ids as they are (exact, ~33 bytes per id) rather than a
        Golomb compressed set (smaller, false positives at rate ``fpr``).

    Attributes
    ----------
    client_size : int or None
        Set size of the last request answered: all the server learns about the
        client. None before the first request.
    """

    def __init__(self, ids: Sequence[object], *, fpr: float = 1e-9, exact: bool = True) -> None:
        self._fpr = _check_fpr(fpr)
        self._ids = _encode_ids("server_ids", ids)
        self._exact = bool(exact)
        self._cipher = _psi.server.CreateWithNewKey(reveal_intersection=True)
        self.client_size: int | None = None

    @classmethod
    def _from_encoded(cls, ids: list[bytes], fpr: float, exact: bool) -> PSIServer:
        obj = cls.__new__(cls)
        obj._fpr, obj._ids, obj._exact = fpr, ids, exact
        obj._cipher = _psi.server.CreateWithNewKey(reveal_intersection=True)
        obj.client_size = None
        return obj

    @property
    def size(self) -> int:
        """Number of server ids."""
        return len(self._ids)

    def respond(self, request: bytes) -> tuple[bytes, bytes]:
        """Answer a serialized request.

        Parameters
        ----------
        request : bytes
            Bytes from :meth:`PSIClient.request`.

        Returns
        -------
        setup, response : bytes
            The blinded server set and the re-blinded request, serialized.
        """
        request_msg = _parse("request", _psi.Request, request)
        n_client = len(request_msg.encrypted_elements)
        if n_client == 0:
            raise fail("PSI request", "is empty", "The client must send at least one id.")
        ds = _psi.DataStructure.RAW if self._exact else _psi.DataStructure.GCS
        try:
            setup = self._cipher.CreateSetupMessage(self._fpr, n_client, self._ids, ds)
            response = self._cipher.ProcessRequest(request_msg)
        except RuntimeError as err:
            raise fail(
                "PSI request",
                f"was rejected by openmined-psi ({err})",
                "Pass the exact bytes produced by PSIClient.request.",
            ) from None
        self.client_size = n_client
        return setup.SerializeToString(), response.SerializeToString()


@dataclass(frozen=True, eq=False)
class PSIResult:
    """Outcome and transcript of one two-party PSI run.

    Attributes
    ----------
    client_indices : numpy.ndarray
        Sorted int64 indices into ``client_ids`` of the ids the server also
        holds: the client's whole output.
    client_size : int
        The client's set size: the server's whole output.
    server_size : int
        The server's set size, which the setup message reveals to the client.
    exact : bool
        Whether the exact (RAW) structure was used; if False, ``client_indices``
        may contain false positives at rate ``fpr``.
    request, setup, response : bytes
        The serialized messages exchanged (client -> server, then server ->
        client twice).
    """

    client_indices: np.ndarray
    client_size: int
    server_size: int
    exact: bool
    request: bytes = field(repr=False)
    setup: bytes = field(repr=False)
    response: bytes = field(repr=False)

    @property
    def message_sizes(self) -> dict[str, int]:
        """Bytes of each message: ``{"request": ..., "setup": ..., "response": ...}``."""
        return {
            "request": len(self.request),
            "setup": len(self.setup),
            "response": len(self.response),
        }

    @property
    def bytes_exchanged(self) -> int:
        """Total bytes of the three messages."""
        return len(self.request) + len(self.setup) + len(self.response)


def _run(client: PSIClient, server: PSIServer) -> PSIResult:
    # The two objects share nothing: only the three byte strings cross over.
    request = client.request()
    setup, response = server.respond(request)
    rows = client.intersection(setup, response)
    assert server.client_size is not None
    return PSIResult(
        client_indices=_frozen(rows),
        client_size=server.client_size,
        server_size=server.size,
        exact=server._exact,
        request=request,
        setup=setup,
        response=response,
    )


def intersect(
    client_ids: Sequence[object],
    server_ids: Sequence[object],
    *,
    fpr: float = 1e-9,
    exact: bool = True,
) -> PSIResult:
    """Run one ECDH-PSI: the client learns which of its ids the server holds.

    Parameters
    ----------
    client_ids, server_ids : sequence of str, bytes or int
        Each party's ids, unique within the party. Integers are compared as
        ``str(i)``, text by its UTF-8 bytes.
    fpr : float, default 1e-9
        False-positive probability of the whole run when ``exact`` is False;
        must lie in (0, 1).
    exact : bool, default True
        Exact result (openmined-psi ``DataStructure.RAW``) rather than the
        smaller Golomb compressed set with false positives at rate ``fpr``.

    Returns
    -------
    PSIResult
        ``client_indices`` (what the client learns), ``client_size`` (what the
        server learns) and the serialized transcript.

    Raises
    ------
    HyflError
        On an empty id list, duplicate ids, ids of unsupported type, or ``fpr``
        outside (0, 1).

    Examples
    --------
    >>> r = intersect(["ann", "bob", "eve"], ["eve", "ann", "zed"])
    >>> r.client_indices.tolist(), r.client_size
    ([0, 2], 3)
    """
    fpr = _check_fpr(fpr)
    client = PSIClient._from_encoded(_encode_ids("client_ids", client_ids))
    server = PSIServer._from_encoded(_encode_ids("server_ids", server_ids), fpr, bool(exact))
    return _run(client, server)


# --------------------------------------------------------------------- many parties


@dataclass(frozen=True, eq=False)
class PairwiseView:
    """Everything ``party`` learned about ``peer`` during alignment.

    Attributes
    ----------
    party, peer : str
        Who learned, and about whom.
    shared_rows : numpy.ndarray
        Sorted int64 rows of ``party``'s own ids that ``peer`` also holds.
    peer_size : int
        ``peer``'s number of ids.
    """

    party: str
    peer: str
    shared_rows: np.ndarray
    peer_size: int


@dataclass(frozen=True, eq=False)
class CoordinatorView:
    """Everything the coordinator learned during alignment (integers only).

    Attributes
    ----------
    set_sizes : dict[str, int]
        Each party's number of ids.
    matched_rows : dict[tuple[str, str], tuple[numpy.ndarray, numpy.ndarray]]
        For each pair ``(j, k)`` (``j`` before ``k``), the rows of ``j`` and the
        rows of ``k`` holding the same samples, paired by position, in an order
        that is pseudorandom to the coordinator.
    relayed_bytes : int
        Bytes of ciphertext (PSI and key-agreement messages) it relayed.
    """

    set_sizes: dict[str, int]
    matched_rows: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]
    relayed_bytes: int


@dataclass(frozen=True, eq=False)
class Alignment:
    """Global sample indices of a multi-party alignment.

    Attributes
    ----------
    n_samples : int
        Number of distinct samples over all parties.
    global_index : dict[str, numpy.ndarray]
        Per party, the int64 global index of each of its rows in file order.
        The same id gets the same index in every party; different ids get
        different indices.
    holders : numpy.ndarray
        int64 array of length ``n_samples``: how many parties hold each sample.
    bytes_exchanged : int
        All bytes sent: PSI messages (both directions per pair), key-agreement
        messages, and the row lists sent to the coordinator (8 bytes per row).
    views : tuple[PairwiseView, ...]
        What each party learned about each other party.
    coordinator_view : CoordinatorView
        What the coordinator learned.
    """

    n_samples: int
    global_index: dict[str, np.ndarray]
    holders: np.ndarray
    bytes_exchanged: int
    views: tuple[PairwiseView, ...] = field(repr=False)
    coordinator_view: CoordinatorView = field(repr=False)

    @property
    def parties(self) -> tuple[str, ...]:
        """Party names in alignment order."""
        return tuple(self.global_index)

    @property
    def shared_counts(self) -> dict[str, int]:
        """Per party, how many of its ids at least one other party also holds."""
        return {
            party: int(np.count_nonzero(self.holders[np.asarray(rows, dtype=np.int64)] > 1))
            for party, rows in self.global_index.items()
        }

    @property
    def n_common(self) -> int:
        """Number of samples held by two or more parties."""
        return int(np.count_nonzero(self.holders > 1))

    def learned(self, party: str) -> dict[str, PairwiseView]:
        """What ``party`` learned, keyed by peer.

        Parameters
        ----------
        party : str
            A party name.

        Returns
        -------
        dict[str, PairwiseView]
            One view per other party.
        """
        if party not in self.global_index:
            raise fail(
                "party", f"{party!r} is not part of this alignment", f"Use one of {self.parties}."
            )
        return {v.peer: v for v in self.views if v.party == party}


def _dh_start() -> tuple[bytes, bytes]:
    """Ephemeral key pair: (secret key bytes, public message ``H(label)^a``)."""
    cipher = _psi.client.CreateWithNewKey(reveal_intersection=True)
    public = cipher.CreateRequest([_DH_LABEL]).SerializeToString()
    return cipher.GetPrivateKeyBytes(), public


def _dh_finish(secret: bytes, peer_public: bytes) -> bytes:
    """Pairwise key from own secret and the peer's public ``H(label)^b``."""
    # ProcessRequest raises a point to the server key: (H(label)^b)^a.
    cipher = _psi.server.CreateFromKey(secret, reveal_intersection=True)
    point = cipher.ProcessRequest(_parse("key-agreement", _psi.Request, peer_public))
    return hashlib.sha256(_KEY_CONTEXT + point.encrypted_elements[0]).digest()


def _pairing_order(key: bytes, ids: list[bytes], rows: np.ndarray) -> np.ndarray:
    """``rows`` sorted by ``HMAC(key, id)``: an order both holders agree on."""
    tags = [hmac.new(key, ids[r], hashlib.sha256).digest() for r in rows.tolist()]
    order = sorted(range(len(tags)), key=tags.__getitem__)
    return rows[np.asarray(order, dtype=np.int64)]


def align(
    parties: Mapping[str, Sequence[object]],
    *,
    fpr: float = 1e-9,
    exact: bool = True,
) -> Alignment:
    """Give every sample one global index, using pairwise PSI between parties.

    Parameters
    ----------
    parties : mapping of str to sequence of str, bytes or int
        Party name -> its ids in file order, unique within the party. The
        mapping's order fixes the numbering: the first party's rows become
        samples ``0 .. n_0 - 1``.
    fpr : float, default 1e-9
        False-positive probability per PSI run when ``exact`` is False; must
        lie in (0, 1).
    exact : bool, default True
        Exact PSI (see :func:`intersect`). With ``exact=False`` a false
        positive makes the two directions of a pair disagree, which is
        detected and raised in almost all cases.

    Returns
    -------
    Alignment
        Global indices, holder counts, bytes exchanged, and what every party
        and the coordinator learned (see the module docstring).

    Raises
    ------
    HyflError
        On no parties, an empty party, duplicate ids within a party, ids of
        unsupported type, ``fpr`` outside (0, 1), or inconsistent PSI results.

    Examples
    --------
    >>> a = align({"A": ["x", "y"], "B": ["y", "z"]})
    >>> a.n_samples, a.global_index["B"].tolist(), a.holders.tolist()
    (3, [1, 2], [1, 2, 1])
    """
    fpr = _check_fpr(fpr)
    exact = bool(exact)
    if not isinstance(parties, Mapping):
        raise fail(
            "parties",
            f"is a {type(parties).__name__}, not a mapping",
            "Pass a dict from party name to that party's ids, e.g. {'A': ids_a}.",
        )
    if not parties:
        raise fail("parties", "is empty", "Pass at least one party, e.g. {'A': ids_a}.")
    names = list(parties)
    for name in names:
        if not isinstance(name, str) or not name:
            raise fail(
                "parties", f"has a bad party name {name!r}", "Name parties by non-empty str."
            )
    encoded = {name: _encode_ids(f"party {name!r}", parties[name]) for name in names}
    sizes = {name: len(encoded[name]) for name in names}

    views: list[PairwiseView] = []
    matched: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    relayed = 0
    to_coordinator = 0
    for k, name_k in enumerate(names):
        for name_j in names[:k]:
            ids_j, ids_k = encoded[name_j], encoded[name_k]
            # Both directions: each side learns its own rows of the intersection.
            run_k = _run(PSIClient._from_encoded(ids_k), PSIServer._from_encoded(ids_j, fpr, exact))
            run_j = _run(PSIClient._from_encoded(ids_j), PSIServer._from_encoded(ids_k, fpr, exact))
            secret_j, public_j = _dh_start()
            secret_k, public_k = _dh_start()
            key_j = _dh_finish(secret_j, public_k)
            key_k = _dh_finish(secret_k, public_j)
            if key_j != key_k:  # cannot happen with a correct commutative cipher
                raise RuntimeError("pairwise key agreement failed: openmined-psi misbehaved")
            relayed += run_k.bytes_exchanged + run_j.bytes_exchanged
            relayed += len(public_j) + len(public_k)

            rows_k, rows_j = run_k.client_indices, run_j.client_indices
            views.append(PairwiseView(name_k, name_j, rows_k, sizes[name_j]))
            views.append(PairwiseView(name_j, name_k, rows_j, sizes[name_k]))
            sent_j = _frozen(_pairing_order(key_j, ids_j, rows_j))
            sent_k = _frozen(_pairing_order(key_k, ids_k, rows_k))
            to_coordinator += sent_j.nbytes + sent_k.nbytes
            if len(sent_j) != len(sent_k):
                raise fail(
                    f"PSI between {name_j!r} and {name_k!r}",
                    f"gave intersections of different sizes ({len(sent_j)} vs {len(sent_k)}), "
                    "a false positive",
                    "Use exact=True (the default) or a smaller fpr.",
                )
            matched[(name_j, name_k)] = (sent_j, sent_k)

    # Coordinator: integers only from here on.
    global_index: dict[str, np.ndarray] = {}
    n_samples = 0
    for k, name_k in enumerate(names):
        g = np.full(sizes[name_k], -1, dtype=np.int64)
        for name_j in names[:k]:
            rows_j, rows_k = matched[(name_j, name_k)]
            earlier = global_index[name_j][rows_j]
            clash = (g[rows_k] >= 0) & (g[rows_k] != earlier)
            if clash.any():
                raise fail(
                    f"PSI of party {name_k!r}",
                    "matched one row to two different samples of earlier parties, a false positive",
                    "Use exact=True (the default) or a smaller fpr.",
                )
            g[rows_k] = earlier
        new = g < 0
        n_new = int(new.sum())
        g[new] = np.arange(n_samples, n_samples + n_new, dtype=np.int64)
        n_samples += n_new
        global_index[name_k] = _frozen(g)
    holders = np.bincount(np.concatenate(list(global_index.values())), minlength=n_samples)

    return Alignment(
        n_samples=n_samples,
        global_index=global_index,
        holders=_frozen(holders.astype(np.int64)),
        bytes_exchanged=relayed + to_coordinator,
        views=tuple(views),
        coordinator_view=CoordinatorView(
            set_sizes=sizes, matched_rows=matched, relayed_bytes=relayed
        ),
    )
