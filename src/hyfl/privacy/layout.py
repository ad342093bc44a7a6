"""Where each per-sample value sits inside the ciphertexts, and encrypted vectors.

A packed cipher carries ``slots`` values per ciphertext, and the server adds
ciphertexts slot by slot. Ciphertexts from different clients can only be
added if the same sample sits in the same slot in each, so every party packs
by one shared :class:`SlotLayout`:

* samples with the same holder set ``B_n`` form a *holder group*;
* each group occupies whole ciphertexts ("chunks"), its samples in id order,
  ``n_outputs`` consecutive values per sample (one per one-vs-rest output);
* a chunk therefore belongs to one group, and every holder of the group
  can fill all of it.

A message carries only the chunks that hold values it needs to send (the
rest of a chunk is filled with zeros). With one slot per ciphertext this is
exactly "one ciphertext per value that travels", the paper's count.

Values that are summed within one round and never stored (the round's
partial inner products with ``sip_scope="drawn"``, dual steps, the cocoa
rule's proposals) travel in the round's *compact* layout instead
(:meth:`SlotLayout.compact`, a :class:`RoundLayout`): inside each holder
group, the round's samples move to the front of the group's chunks, ordered
by who drew them, then by id (:meth:`SlotLayout.round_layout`). It keeps the
chunk ids, the groups and their holders, so sums stay slot-aligned, and
every party derives it from facts the server announces: a client needs only
its own groups' updated samples and which of their holders drew each.
Ciphertexts the server keeps across rounds (the duals, stored inner
products) stay in the fixed layout: Paillier cannot move a value from one
slot to another.

The layout is public: the server derives it from the sample ids it learned
by private set intersection, and it reveals nothing beyond who holds which
sample. Building it is vectorized; encrypting and decrypting loop over
ciphertexts inside the cipher (unavoidable for big-integer arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hyfl._ragged import concat_ranges
from hyfl.errors import fail
from hyfl.partition import StackedBlocks


class _Packing:
    """What both layouts share; everything follows from :meth:`positions`.

    Subclasses provide ``slots``, ``n_outputs``, ``n_chunks`` and
    ``chunk_holders`` and the positions of their samples.
    """

    slots: int
    n_outputs: int
    n_chunks: int
    chunk_holders: np.ndarray

    def positions(self, samples: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        """Flat positions of the given samples' values, shape (n * n_outputs,)."""
        raise NotImplementedError

    def chunks_of(self, samples: np.ndarray) -> np.ndarray:
        """Sorted distinct chunks holding any value of the given samples (int64).

        Marked in a table over the ``n_chunks`` chunks and read back: what
        ``np.unique`` gives, which in NumPy 2.4 hashes (about a microsecond a value:
        30 ms of a cocoa round on ijcnn1 12x12 and over a second on Covtype or MNIST,
        counting the round's ciphertexts).
        """
        held = np.zeros(self.n_chunks, dtype=bool)
        held[self.positions(samples) // self.slots] = True
        return np.flatnonzero(held)

    def count_chunks(self, clients: np.ndarray, samples: np.ndarray) -> int:
        """Ciphertexts needed when each listed client sends its listed samples.

        ``(clients[j], samples[j])`` pairs must be distinct; a client sends one
        ciphertext per distinct chunk among its samples.
        """
        clients = np.asarray(clients, dtype=np.int64)
        if clients.size == 0:
            return 0
        if self.slots == 1:
            return int(clients.size * self.n_outputs)
        chunks = self.positions(samples) // self.slots
        keys = np.repeat(clients, self.n_outputs) * self.n_chunks + chunks
        return int(np.unique(keys).size)

    def holders_per_chunk(self, chunks: np.ndarray) -> np.ndarray:
        """|B| of each chunk's group."""
        return np.count_nonzero(self.chunk_holders[chunks] >= 0, axis=1)

    # -- packing ---------------------------------------------------------------
    def pack(self, samples: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Chunks covering ``samples`` and their plaintext slots (zeros elsewhere).

        Returns ``(chunks, slots)`` with ``slots`` of shape (len(chunks), self.slots).
        """
        values = np.asarray(values, dtype=float).reshape(len(samples), self.n_outputs)
        pos = self.positions(samples)
        chunks, where = np.unique(pos // self.slots, return_inverse=True)
        dense = np.zeros((chunks.size, self.slots))
        dense[where.ravel(), pos % self.slots] = values.ravel()
        return chunks, dense

    def unpack(self, chunks: np.ndarray, dense: np.ndarray, samples: np.ndarray) -> np.ndarray:
        """Values of ``samples`` (n, n_outputs) from decrypted chunks ``dense``."""
        pos = self.positions(samples)
        if pos.size == 0:
            return np.zeros((0, self.n_outputs))
        where = np.searchsorted(chunks, pos // self.slots)
        if np.any(where >= chunks.size) or np.any(chunks[np.minimum(where, chunks.size - 1)]
                                                   != pos // self.slots):
            raise KeyError("a requested sample is not in the decrypted chunks")
        return dense[where, pos % self.slots].reshape(len(samples), self.n_outputs)

    def fill(self, clients: np.ndarray, samples: np.ndarray) -> float:
        """Share of the slots sent that carry a value when each client sends its samples."""
        n = self.count_chunks(clients, samples)
        return len(samples) * self.n_outputs / (n * self.slots) if n else 1.0


@dataclass(frozen=True)
class SlotLayout(_Packing):
    """Chunk positions of every (sample, output) value for one cipher.

    Attributes
    ----------
    slots : int
        Values per ciphertext.
    n_outputs : int
        Values per sample (C).
    base : ndarray of int64, shape (N,)
        Position of sample n's first value; its values are ``base[n] + j``.
    n_chunks : int
    chunk_holders : ndarray of int64, shape (n_chunks, max_holders)
        Clients holding each chunk's group, padded with -1.
    client_chunks : ndarray of int64, shape (K,)
        Chunks covering all of client k's samples.
    """

    slots: int
    n_outputs: int
    base: np.ndarray
    n_chunks: int
    chunk_holders: np.ndarray
    client_chunks: np.ndarray

    @classmethod
    def build(cls, blocks: StackedBlocks, slots: int, n_outputs: int = 1) -> SlotLayout:
        """Derive the layout from who holds which sample."""
        N = blocks.n_samples
        holders = holder_matrix(blocks)  # (N, max_holders), sorted, -1 padded
        sets, group = _distinct_rows(holders)
        order = np.lexsort((np.arange(N), group))  # by group, then sample id
        sizes = np.bincount(group, minlength=len(sets))
        group_chunks = -(-sizes * n_outputs // slots)  # ceil
        group_start = np.concatenate([[0], np.cumsum(group_chunks)[:-1]]) * slots
        rank = np.empty(N, dtype=np.int64)
        rank[order] = np.arange(N) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        base = group_start[group] + rank * n_outputs
        n_chunks = int(group_chunks.sum())
        chunk_group = np.repeat(np.arange(len(sets)), group_chunks)
        # Chunks held by each client: the chunks of every group it belongs to.
        member_group, member_rank = np.nonzero(sets >= 0)
        member_client = sets[member_group, member_rank]
        client_chunks = np.bincount(
            member_client, weights=group_chunks[member_group], minlength=blocks.n_clients
        ).astype(np.int64)
        return cls(
            slots=int(slots),
            n_outputs=int(n_outputs),
            base=base.astype(np.int64),
            n_chunks=n_chunks,
            chunk_holders=sets[chunk_group].astype(np.int64),
            client_chunks=client_chunks,
        )

    # -- positions -----------------------------------------------------------
    def positions(self, samples: np.ndarray) -> np.ndarray:
        """Flat positions of the given samples' values, shape (n * n_outputs,)."""
        samples = np.asarray(samples, dtype=np.int64)
        return (self.base[samples][:, None] + np.arange(self.n_outputs)).ravel()

    @cached_property
    def group_start(self) -> np.ndarray:
        """First chunk of each chunk's holder group, shape (n_chunks,).

        A group fills consecutive chunks and neighbouring groups have different
        holder sets, so a group starts wherever the holders change.
        """
        h = self.chunk_holders
        if self.n_chunks == 0:
            return np.zeros(0, dtype=np.int64)
        starts = np.ones(self.n_chunks, dtype=bool)
        starts[1:] = np.any(h[1:] != h[:-1], axis=1)
        return np.maximum.accumulate(np.where(starts, np.arange(self.n_chunks), 0))

    def compact(self, samples: np.ndarray, drawn_by: np.ndarray | None = None) -> RoundLayout:
        """The layout of one round's values: ``samples`` packed densely per holder group.

        Inside each group the listed samples take the group's first slots;
        chunk ids, groups and holders are those of this layout, so every holder
        of a group that lists the same samples of the group (with the same
        ``drawn_by``) packs them the same way, whatever it knows about other
        groups.

        Parameters
        ----------
        samples : array of int
            The round's samples (its updated samples), distinct, any order.
        drawn_by : bool array, shape (len(samples), max_holders), optional
            Which of each sample's holders drew it (column ``r``: the group's
            ``r``-th holder in ``chunk_holders``). Samples with the same drawers
            are then kept together (else in id order), so each drawer's own
            values fill whole ciphertexts too.

        Returns
        -------
        RoundLayout
            Positions are defined for the listed samples only.
        """
        samples = np.asarray(samples, dtype=np.int64).ravel()
        given = samples.size
        samples, index = np.unique(samples, return_index=True)
        pos = self.base[samples]
        start = self.group_start[pos // self.slots]
        if drawn_by is None:
            # Groups fill consecutive chunks and keep their samples in id order,
            # so sorting by the fixed position sorts by (group, id).
            order = np.argsort(pos, kind="stable")
        else:
            width = self.chunk_holders.shape[1]
            drawn_by = np.asarray(drawn_by, dtype=bool).reshape(given, width)[index]
            order = np.lexsort((pos, *_gray_rank(drawn_by), start))  # group, drawers, id
        start = start[order]
        rank = np.arange(samples.size)
        new_group = np.ones(samples.size, dtype=bool)
        new_group[1:] = start[1:] != start[:-1]
        rank -= np.maximum.accumulate(np.where(new_group, rank, 0))
        first = np.empty(samples.size, dtype=np.int64)
        first[order] = start * self.slots + rank * self.n_outputs
        return RoundLayout(fixed=self, samples=samples, first=first)

    def drawers(self, clients: np.ndarray, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The drawn samples and which of their holders drew them, from (client, sample) pairs.

        Returns
        -------
        drawn : ndarray of int64
            Distinct drawn samples, sorted.
        drawn_by : ndarray of bool, shape (drawn.size, max_holders)
            Column ``r``: the sample's ``r``-th holder (``chunk_holders``) drew it.
        """
        clients = np.asarray(clients, dtype=np.int64)
        samples = np.asarray(samples, dtype=np.int64)
        drawn, where = np.unique(samples, return_inverse=True)
        holders = self.chunk_holders[self.base[samples] // self.slots]
        pair, rank = np.nonzero(holders == clients[:, None])
        drawn_by = np.zeros((drawn.size, self.chunk_holders.shape[1]), dtype=bool)
        drawn_by[where.ravel()[pair], rank] = True
        return drawn, drawn_by

    def round_layout(self, clients: np.ndarray, samples: np.ndarray) -> RoundLayout:
        """The compact layout of a round whose draws are these (client, sample) pairs."""
        return self.compact(*self.drawers(clients, samples))


def _distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True)`` of a 2-D int array, by a lexsort
    of its columns (np.unique sorts structured rows: 283 ms against 10 ms for ijcnn1
    12x12's 50,000 samples, once per run). Returns the distinct rows in lexicographic
    order and each row's index among them, shape (n,)."""
    if rows.shape[0] == 0:
        return rows[:0], np.zeros(0, dtype=np.int64)
    order = np.lexsort(rows.T[::-1])  # the first column is the primary key
    ordered = rows[order]
    new = np.ones(rows.shape[0], dtype=bool)
    new[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    inverse = np.empty(rows.shape[0], dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], inverse


def _distinct_of_sorted(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of a non-decreasing array, in one comparison pass (no hashing)."""
    values = np.asarray(values)
    keep = np.ones(values.size, dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


@dataclass(frozen=True)
class RoundLayout(_Packing):
    """One round's compact layout (see :meth:`SlotLayout.compact`).

    Attributes
    ----------
    fixed : SlotLayout
        The layout it compacts (chunk ids, groups and holders are its own).
    samples : ndarray of int64
        The round's samples, sorted.
    first : ndarray of int64
        Position of each listed sample's first value.
    """

    fixed: SlotLayout
    samples: np.ndarray
    first: np.ndarray

    @property
    def slots(self) -> int:
        return self.fixed.slots

    @property
    def n_outputs(self) -> int:
        return self.fixed.n_outputs

    @property
    def n_chunks(self) -> int:
        return self.fixed.n_chunks

    @property
    def chunk_holders(self) -> np.ndarray:
        return self.fixed.chunk_holders

    def positions(self, samples: np.ndarray) -> np.ndarray:
        """Flat positions of the given (listed) samples' values; KeyError for others."""
        samples = np.asarray(samples, dtype=np.int64)
        at = np.searchsorted(self.samples, samples)
        if samples.size and (np.any(at >= self.samples.size)
                             or np.any(self.samples[np.minimum(at, self.samples.size - 1)]
                                       != samples)):
            raise KeyError("a sample is not among the round's samples of this compact layout")
        return (self.first[at][:, None] + np.arange(self.n_outputs)).ravel()


@dataclass(frozen=True)
class TaggedLayout(_Packing):
    """A layout whose vectors carry, per holder group, one more chunk: a keyed tag.

    An active server holds the public key, so it can add a value of its choosing
    to any sum it relays; the receiver decrypts the sum and would hand back
    quantities computed from it. A sender therefore adds to its values of each
    holder group one ciphertext holding their tag (:mod:`hyfl.privacy.tags`,
    in the first slot), which the server sums with the values. The receiver
    checks the summed tag against the senders the round entitles it to
    (:func:`decrypt_tagged`) before it uses a single value.

    Data chunks keep the ids of ``inner``; group ``g``'s tag chunk is
    ``inner.n_chunks + g``, groups numbered in chunk order. A sender sends one
    tag chunk per group it has values in, a receiver gets one per group of the
    samples it reads: sums, selections and counts of chunks work unchanged.

    ``per_chunk``: every data chunk is its own group (one tag chunk each), for
    ciphertexts the server stores and sends on one by one (the duals' states).
    """

    inner: SlotLayout | RoundLayout
    per_chunk: bool = False

    @property
    def slots(self) -> int:
        return self.inner.slots

    @property
    def n_outputs(self) -> int:
        return self.inner.n_outputs

    @cached_property
    def _fixed(self) -> SlotLayout:
        return getattr(self.inner, "fixed", self.inner)

    @cached_property
    def group_firsts(self) -> np.ndarray:
        """First data chunk of each holder group (of each chunk with ``per_chunk``)."""
        if self.per_chunk:
            return np.arange(self.inner.n_chunks)
        return _distinct_of_sorted(self._fixed.group_start)

    @property
    def n_chunks(self) -> int:
        return self.inner.n_chunks + int(self.group_firsts.size)

    @cached_property
    def chunk_holders(self) -> np.ndarray:
        holders = self.inner.chunk_holders
        return np.concatenate([holders, holders[self.group_firsts]])

    @cached_property
    def client_chunks(self) -> np.ndarray:
        """Data and tag chunks covering all of each client's samples, shape (K,)."""
        if self.per_chunk:
            return 2 * self._fixed.client_chunks
        holders = self.inner.chunk_holders[self.group_firsts]
        groups = np.bincount(holders[holders >= 0], minlength=self._fixed.client_chunks.size)
        return self._fixed.client_chunks + groups

    def positions(self, samples: np.ndarray) -> np.ndarray:
        return self.inner.positions(samples)

    def groups_of(self, chunks: np.ndarray) -> np.ndarray:
        """The holder group (index) of each data chunk."""
        if self.per_chunk:
            return np.asarray(chunks, dtype=np.int64)
        starts = self._fixed.group_start[np.asarray(chunks, dtype=np.int64)]
        return np.searchsorted(self.group_firsts, starts)

    def sample_groups(self, samples: np.ndarray) -> np.ndarray:
        """The holder group (index) of each sample (holder groups, not ``per_chunk``)."""
        fixed = self._fixed
        return self.groups_of(fixed.base[np.asarray(samples, dtype=np.int64)] // fixed.slots)

    def chunks_of(self, samples: np.ndarray) -> np.ndarray:
        data = self.inner.chunks_of(samples)
        tags = self.inner.n_chunks + _distinct_of_sorted(self.groups_of(data))  # data sorted
        return np.concatenate([data, tags])  # tag ids follow every data id: still sorted

    def count_chunks(self, clients: np.ndarray, samples: np.ndarray) -> int:
        clients = np.asarray(clients, dtype=np.int64)
        if clients.size == 0:
            return 0
        if self.per_chunk:
            return 2 * self.inner.count_chunks(clients, samples)
        groups = self.sample_groups(samples)
        tags = np.unique(clients * self.group_firsts.size + groups).size
        return self.inner.count_chunks(clients, samples) + int(tags)


@dataclass(frozen=True)
class EncryptedVector:
    """Ciphertexts of some chunks of a :class:`SlotLayout` (sorted chunk ids)."""

    chunks: np.ndarray
    ciphertexts: np.ndarray

    def __len__(self) -> int:
        return int(self.chunks.size)


def encrypt_samples(cipher, layout: SlotLayout, samples, values) -> EncryptedVector:
    """A client encrypts its values for ``samples`` (zeros fill the rest of each chunk)."""
    chunks, dense = layout.pack(samples, values)
    return EncryptedVector(chunks, cipher.encrypt(dense))


def decrypt_samples(cipher, layout: SlotLayout, vector: EncryptedVector, samples, *,
                    integers: bool = False) -> np.ndarray:
    """A client decrypts ``vector`` and reads the values of ``samples`` (n, C); with
    ``integers``, their exact fixed-point integers (object array, see
    :meth:`~hyfl.privacy.ciphers.Cipher.decrypt_integers`).

    ``vector`` must hold exactly the chunks of ``samples``, each once, in order:
    a receiver decrypts nothing it was not meant to read (a sender cannot make
    it decrypt, and spend time on, chunks of its choosing).
    """
    samples = np.asarray(samples, dtype=np.int64)
    _check_chunks(layout, vector, samples)
    if integers:
        return layout.unpack(vector.chunks, cipher.decrypt_integers(vector.ciphertexts), samples)
    dense = cipher.decrypt(vector.ciphertexts)
    return layout.unpack(vector.chunks, np.asarray(dense, dtype=float), samples)


def encrypt_tagged(cipher, layout: TaggedLayout, samples, values, key, family: str,
                   context: tuple, sender: int) -> EncryptedVector:
    """A sender encrypts its values for ``samples`` and, per holder group they fall in,
    one tag chunk (see :class:`TaggedLayout`).

    ``key`` is the sender's :class:`~hyfl.privacy.tags.TagKey` (None without a
    private key: the tags are zeros, still sent, so the counts are those of an
    encrypted run); ``context`` names this contribution (kind, round, attempt),
    to which the sender and, per group, the group's first chunk are appended.
    """
    chunks, dense = layout.pack(samples, values)
    groups = layout.groups_of(chunks)
    distinct = np.unique(groups)
    tags = np.zeros((distinct.size, layout.slots))
    if key is not None:
        fixed = cipher.fixed_point
        ints = np.asarray(fixed.encode(dense), dtype=object)
        where = _slot_positions(chunks, layout.slots)
        for j, group in enumerate(distinct.tolist()):
            mine = np.repeat(groups == group, layout.slots)
            tag = key.tag(family, ints[mine], _group_context((*context, int(sender)), layout,
                                                             group), positions=where[mine])
            tags[j, 0] = np.ldexp(float(tag), -fixed.precision_bits)  # tag < 2**40: exact
    chunks = np.concatenate([chunks, layout.inner.n_chunks + distinct])
    return EncryptedVector(chunks, cipher.encrypt(np.vstack([dense, tags])))


def decrypt_tagged(cipher, layout: TaggedLayout, vector: EncryptedVector, samples, key,
                   family: str, expected, what: str) -> np.ndarray:
    """A receiver decrypts ``vector`` and reads the values of ``samples`` (n, C), after it
    checked each group's summed tag against exactly the contributions it expects.

    ``expected`` maps each group (index) of the vector to the contexts of the
    contributions its sum must hold (each as the sender passed it to
    :func:`encrypt_tagged`, sender included; none: the public zeros). Raises a
    HyflError naming ``what`` when a tag does not verify: the sum holds
    something else (a value the server chose, another round's, a contribution
    left out or repeated), and nothing computed from it may leave. Without a key
    (nothing hidden) nothing is checked.
    """
    samples = np.asarray(samples, dtype=np.int64)
    _check_chunks(layout, vector, samples)
    data = layout.inner.n_chunks > vector.chunks
    chunks = vector.chunks[data]
    if key is None:  # the tags are decrypted all the same: the counts of an encrypted run
        dense = np.asarray(cipher.decrypt(vector.ciphertexts), dtype=float)[data]
        return layout.unpack(chunks, dense, samples)
    ints = cipher.decrypt_integers(vector.ciphertexts)
    values, tags = ints[data], ints[~data, 0]
    groups = layout.groups_of(chunks)
    where = _slot_positions(chunks, layout.slots)
    for group, tag in zip(np.unique(groups).tolist(), tags):
        mine = np.repeat(groups == group, layout.slots)
        contexts = [_group_context(c, layout, group) for c in expected[group]]
        if not key.verify(family, values.ravel()[mine], tag, contexts, positions=where[mine],
                          bound=cipher.fixed_point.max_int):
            raise fail(what, "is not the sum of the contributions the protocol entitles it to "
                       f"(group {group}'s tag does not verify): the server changed it",
                       "The server does not follow hyfl's protocol; nothing was sent back.")
    dense = cipher.fixed_point.decode(values.ravel()).reshape(values.shape)
    return layout.unpack(chunks, dense, samples)


def _slot_positions(chunks: np.ndarray, slots: int) -> np.ndarray:
    """Flat positions of every slot of the given chunks (chunk-major)."""
    return (np.asarray(chunks, dtype=np.int64)[:, None] * slots + np.arange(slots)).ravel()


def _group_context(context: tuple, layout: TaggedLayout, group: int) -> tuple:
    return (*context, int(layout.group_firsts[group]))


def _check_chunks(layout, vector: EncryptedVector, samples: np.ndarray) -> None:
    """``vector`` must hold exactly the chunks of ``samples``, each once, in order."""
    needed = layout.chunks_of(samples)
    if not np.array_equal(np.asarray(vector.chunks), needed):
        raise KeyError(f"the encrypted vector holds chunks {_ids(vector.chunks)}, not exactly "
                       f"those of the samples it is read for ({_ids(needed)})")


def _ids(ids) -> str:
    ids = np.asarray(ids).ravel()
    return np.array2string(ids[:8], separator=",") + (" ..." if ids.size > 8 else "")


def holder_matrix(blocks: StackedBlocks) -> np.ndarray:
    """Sorted holder clients of every sample, shape (N, max |B_n|), padded with -1."""
    counts = blocks.n_holders
    width = int(counts.max()) if counts.size else 1
    rows = blocks.sample_rows[concat_ranges(blocks.sample_rowptr[:-1], counts)]
    clients = blocks.clients_of(rows)  # ascending per sample: rows are ordered by client
    out = np.full((blocks.n_samples, width), -1, dtype=np.int64)
    rank = np.arange(rows.size) - np.repeat(blocks.sample_rowptr[:-1], counts)
    out[np.repeat(np.arange(blocks.n_samples), counts), rank] = clients
    return out


def _gray_rank(drawn_by: np.ndarray) -> list[np.ndarray]:
    """Sort keys (least significant first, for ``np.lexsort``) that order drawer sets
    as the reflected binary Gray code does.

    Consecutive sets then differ by one drawer, so most drawers' samples form one
    run (with two holders, both do: {a}, {a, b}, {b}), and a drawer's values fill
    whole ciphertexts. Bits are taken 62 at a time (a holder set can be larger).
    """
    keys = []
    for lo in range(0, drawn_by.shape[1], 62):
        bits = drawn_by[:, lo:lo + 62].astype(np.int64)
        code = (bits << np.arange(bits.shape[1], dtype=np.int64)).sum(axis=1)
        shift = 1
        while shift < 64:  # the inverse Gray code: prefix xor of the higher bits
            code ^= code >> shift
            shift *= 2
        keys.append(code)
    return keys


def compact_steps(layout: SlotLayout, draws: tuple, receivers: tuple) -> bool:
    """Whether a per-sample round sends its dual steps in the compact layout.

    The two plans of a round of the safe, theory and paper rules:

    * *fixed*: the clients encrypt their steps in the fixed layout, the
      server adds them into the stored duals and sends each active holder
      the new duals of its updated samples;
    * *compact*: steps and their sums travel in the round's compact layout
      (the server sums, the clients add the sum to their own copies), and
      one active holder per updated sample then encrypts the change of its
      dual in the fixed layout for the server's stored duals.

    The compact plan is chosen when it needs fewer encryptions and
    decryptions (additions cost about 1/500 of either and are ignored).
    Everything here is public -- the draws and who holds what -- so the
    server, the cost accounting and anyone checking a run make the same
    choice. With one value per ciphertext it is never chosen: the extra
    change ciphertexts would only add to the same counts.

    Parameters
    ----------
    layout : SlotLayout
    draws : (clients, samples)
        Each drawn (client, sample) pair: the dual steps sent.
    receivers : (clients, samples)
        Each active holder of each updated sample: the new duals received.
    """
    if layout.slots == 1:
        return False
    updated = np.unique(np.asarray(draws[1], dtype=np.int64))
    if updated.size == 0:
        return False
    compact = layout.round_layout(*draws)
    fixed_cost = layout.count_chunks(*draws) + layout.count_chunks(*receivers)
    compact_cost = (compact.count_chunks(*draws) + compact.count_chunks(*receivers)
                    + layout.chunks_of(updated).size)
    return bool(compact_cost < fixed_cost)
