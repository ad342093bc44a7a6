"""Who holds which block of the data.

(Who takes part in each round is :mod:`hyfl.participation`.)

A :class:`Partition` splits the data matrix ``X`` (N samples x M features)
across K clients by samples *and* features: client k holds the samples
``I_k`` and the features ``M_k``. Derived maps (HyFDCA paper, section 3.1):
``B_n`` the clients holding sample n, ``K_m`` the clients holding feature m,
``N_k = |I_k|``.

Ownership of the stored entries of ``X`` is either *rectangular* (entry
(i, m) belongs to the unique client with i in I_k and m in M_k) or given
explicitly per entry (``entry_owner``), as in the paper's non-zero-balanced
split where the clients of a sample group share all samples but deal each
sample's non-zeros among themselves.

:func:`stack` turns a partition into :class:`StackedBlocks`, the simulation
engine's representation: every (client, sample) pair is one row of a single
sparse matrix, so "every client computes x_{k,i}^T w_k" is one mat-vec and
the server's sums over B_n and K_m are scatter-adds.

Builders: :func:`horizontal`, :func:`vertical`, :func:`grid`,
:func:`nonzero_balanced`, :func:`quadrant`, :func:`from_blocks`, and
:func:`parse_partition` for specs such as ``"grid:3x3"`` (registry
:data:`PARTITIONS`).

Participation schedules (:class:`Full`, :class:`RandomFraction`,
:class:`Cyclic`, :class:`Trace`) give the bool mask of active clients of each
outer iteration ``t = 1, 2, ...``; :func:`parse_participation` reads specs
such as ``"0.5"`` or ``"cyclic:4"`` (registry :data:`PARTICIPATIONS`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from hyfl._ragged import concat_ranges
from hyfl.errors import fail

__all__ = [
    "PARTITIONS",
    "Partition",
    "StackedBlocks",
    "client_block",
    "from_blocks",
    "grid",
    "horizontal",
    "nonzero_balanced",
    "parse_partition",
    "quadrant",
    "restrict_samples",
    "stack",
    "validate",
    "vertical",
]

# How many offending ids an error message names before summarising the rest.
_MAX_NAMED = 5


# ---------------------------------------------------------------------------
# Partition
# ---------------------------------------------------------------------------


# eq=False: the generated __eq__ would compare arrays element-wise and fail;
# identity comparison is the meaningful one for these containers.
@dataclass(frozen=True, eq=False)
class Partition:
    """Client blocks of a data matrix: client k holds samples I_k and features M_k.

    Parameters
    ----------
    n_samples : int
        N, number of rows of X.
    n_features : int
        M, number of columns of X.
    samples : tuple of ndarray
        ``samples[k]`` is I_k, sorted unique int64 sample ids in ``0..N-1``.
    features : tuple of ndarray
        ``features[k]`` is M_k, sorted unique int64 feature ids in ``0..M-1``.
    entry_owner : ndarray of int64, shape (nnz,), optional
        For non-rectangular splits: the owning client of every stored entry
        of the CSR matrix X, in CSR order. The owner must hold the entry's
        sample and feature. ``None`` (default) means rectangular ownership:
        entry (i, m) belongs to the unique client k with i in I_k and m in M_k.
    name : str, default ""
        Spec that built the partition, e.g. ``"grid:3x3"``.

    Notes
    -----
    The constructor only stores (and turns lists into tuples); call
    :meth:`validate` or :func:`stack` to check the partition against X.
    """

    n_samples: int
    n_features: int
    samples: tuple[np.ndarray, ...]
    features: tuple[np.ndarray, ...]
    entry_owner: np.ndarray | None = None
    name: str = ""

    def __post_init__(self) -> None:
        # Frozen: lists passed by callers are frozen into tuples here.
        object.__setattr__(self, "samples", tuple(self.samples))
        object.__setattr__(self, "features", tuple(self.features))
        if len(self.samples) != len(self.features):
            raise fail(
                "partition",
                f"has {len(self.samples)} sample sets but {len(self.features)} feature sets",
                "Give one (sample_ids, feature_ids) pair per client.",
            )
        if self.entry_owner is not None and np.ndim(self.entry_owner) != 1:
            raise fail(
                "entry_owner",
                f"must be one-dimensional, got shape {np.shape(self.entry_owner)}",
                "Give one owning client per stored entry of X, in CSR order.",
            )

    @property
    def n_clients(self) -> int:
        """K, the number of clients."""
        return len(self.samples)

    @property
    def is_rectangular(self) -> bool:
        """True when ownership follows from I_k x M_k (no ``entry_owner``)."""
        return self.entry_owner is None

    @property
    def is_horizontal(self) -> bool:
        """True when every client holds all features (horizontal FL)."""
        return all(len(f) == self.n_features for f in self.features)

    @property
    def is_vertical(self) -> bool:
        """True when every client holds all samples (vertical FL)."""
        return all(len(s) == self.n_samples for s in self.samples)

    def client_sizes(self) -> np.ndarray:
        """N_k = |I_k| per client, int64 array of shape (K,)."""
        return np.array([len(s) for s in self.samples], dtype=np.int64)

    def sample_counts(self) -> np.ndarray:
        """|B_n|, the number of clients holding each sample, int64 array of shape (N,)."""
        return _holder_counts(self.samples, self.n_samples)

    def clients_of_samples(self) -> tuple[np.ndarray, np.ndarray]:
        """B_n for every sample as a CSR-style map.

        Returns
        -------
        indptr : ndarray of int64, shape (N + 1,)
        clients : ndarray of int64, shape (sum_k N_k,)
            The clients holding sample n are ``clients[indptr[n]:indptr[n + 1]]``,
            ascending.
        """
        return _invert(self.samples, self.n_samples)

    def clients_of_features(self) -> tuple[np.ndarray, np.ndarray]:
        """K_m for every feature as a CSR-style map.

        Returns
        -------
        indptr : ndarray of int64, shape (M + 1,)
        clients : ndarray of int64, shape (sum_k |M_k|,)
            The clients holding feature m are ``clients[indptr[m]:indptr[m + 1]]``,
            ascending.
        """
        return _invert(self.features, self.n_features)

    def validate(self, X: Any = None) -> None:
        """Check the partition (and, if given, its fit to X); see :func:`validate`."""
        validate(self, X)


def _holder_counts(id_sets: Sequence[np.ndarray], size: int) -> np.ndarray:
    if not id_sets:
        return np.zeros(size, dtype=np.int64)
    return np.bincount(np.concatenate(id_sets).astype(np.int64), minlength=size)


def _invert(id_sets: Sequence[np.ndarray], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Map ids -> holders: the transpose of the client -> ids lists."""
    lengths = np.array([len(ids) for ids in id_sets], dtype=np.int64)
    ids = np.concatenate(id_sets).astype(np.int64) if id_sets else np.empty(0, dtype=np.int64)
    holders = np.repeat(np.arange(len(id_sets), dtype=np.int64), lengths)
    # Stable sort keeps the holders of each id in ascending client order.
    order = np.argsort(ids, kind="stable")
    indptr = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(np.bincount(ids, minlength=size), out=indptr[1:])
    return indptr, holders[order]


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def _name_ids(ids: np.ndarray) -> str:
    """'17' or '3, 5, 8, 13, 21 and 7 more (12 in all)'."""
    ids = np.asarray(ids)
    shown = ", ".join(str(int(i)) for i in ids[:_MAX_NAMED])
    if len(ids) > _MAX_NAMED:
        shown += f" and {len(ids) - _MAX_NAMED} more ({len(ids)} in all)"
    return shown


def _name_entries(rows: np.ndarray, cols: np.ndarray) -> str:
    shown = ", ".join(
        f"X[{int(i)}, {int(m)}]" for i, m in zip(rows[:_MAX_NAMED], cols[:_MAX_NAMED], strict=True)
    )
    if len(rows) > _MAX_NAMED:
        shown += f" and {len(rows) - _MAX_NAMED} more ({len(rows)} in all)"
    return shown


def _as_csr(X: Any) -> sp.csr_matrix:
    """X as CSR in its own stored order (entry_owner follows that order)."""
    if sp.issparse(X):
        return X.tocsr()
    return sp.csr_matrix(np.asarray(X, dtype=np.float64))


def _check_ids(k: int, ids: Any, kind: str, size: int) -> None:
    """One client's sample or feature ids: non-empty sorted unique ints in range."""
    plural = f"{kind}s"
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise fail(
            f"client {k}",
            f"has {kind} ids of shape {ids.shape}",
            f"Give the {plural} of each client as a 1-D array of ids.",
        )
    if ids.size == 0:
        fix = f"Every client needs at least one {kind}; drop the client or use fewer groups."
        if kind == "feature":
            fix = (
                "Every client needs at least one feature; use fewer feature groups "
                "(in a non-zero-balanced split a client gets features only from the "
                "non-zeros dealt to it, so Q must not exceed what its samples have) "
                "or drop the client."
            )
        raise fail(f"client {k}", f"holds no {plural}", fix)
    if ids.dtype.kind not in "iu":
        raise fail(
            f"client {k}",
            f"has {kind} ids of dtype {ids.dtype}",
            f"Give {kind} ids as integers (row/column numbers of X).",
        )
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= size:
        bad = low if low < 0 else high
        raise fail(
            f"client {k}",
            f"lists {kind} id {bad}, outside 0..{size - 1}",
            f"{kind.capitalize()} ids are {'row' if kind == 'sample' else 'column'} "
            f"numbers of X, from 0 to n_{plural} - 1.",
        )
    steps = np.diff(ids)
    if np.any(steps <= 0):
        unique, counts = np.unique(ids, return_counts=True)
        if np.any(counts > 1):
            raise fail(
                f"client {k}",
                f"lists {kind} {int(unique[np.argmax(counts > 1)])} more than once",
                f"List each {kind} once per client (np.unique).",
            )
        raise fail(
            f"client {k}",
            f"has {kind} ids that are not sorted ascending",
            "Sort them (np.unique sorts and deduplicates); from_blocks does this for you.",
        )


def _check_structure(partition: Partition) -> None:
    """Everything that does not need X: ids, empty clients, coverage."""
    if partition.n_clients == 0:
        raise fail("partition", "has no clients", "Give at least one client block.")
    for k in range(partition.n_clients):
        _check_ids(k, partition.samples[k], "sample", partition.n_samples)
        _check_ids(k, partition.features[k], "feature", partition.n_features)
    for kind, id_sets, size in (
        ("sample", partition.samples, partition.n_samples),
        ("feature", partition.features, partition.n_features),
    ):
        missing = np.flatnonzero(_holder_counts(id_sets, size) == 0)
        if missing.size:
            subject = (
                f"{kind} {missing[0]}" if missing.size == 1 else f"{kind}s {_name_ids(missing)}"
            )
            verb = "is" if missing.size == 1 else "are"
            raise fail(
                subject,
                f"{verb} held by no client; every {kind} needs at least one holder",
                f"Add {'it' if missing.size == 1 else 'them'} to some client's block, "
                f"or drop {'it' if missing.size == 1 else 'them'} from the data.",
            )


def _check_shape(partition: Partition, X: sp.csr_matrix) -> None:
    expected = (partition.n_samples, partition.n_features)
    if tuple(X.shape) != expected:
        raise fail(
            "X",
            f"has shape {tuple(X.shape)} but the partition is for {expected[0]} samples "
            f"x {expected[1]} features",
            "Build the partition from the same data matrix (same rows and columns).",
        )


def _entry_rows(X: sp.csr_matrix) -> np.ndarray:
    """Row (sample) id of every stored entry, in CSR order."""
    return np.repeat(np.arange(X.shape[0], dtype=np.int64), np.diff(X.indptr))


_ROW_INDEX = np.int32


def _row_layout(partition: Partition) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stacked-row layout: (client_rowptr, row_client, row_sample)."""
    sizes = partition.client_sizes()
    client_rowptr = np.zeros(partition.n_clients + 1, dtype=np.int64)
    np.cumsum(sizes, out=client_rowptr[1:])
    # int32 per-row indices: with R = sum_k N_k rows (Q copies of every sample
    # on a KxQ grid) these are, with the stacked matrix, the engine's largest arrays.
    row_client = np.repeat(np.arange(partition.n_clients, dtype=_ROW_INDEX), sizes)
    row_sample = np.concatenate(partition.samples).astype(_ROW_INDEX)
    return client_rowptr, row_client, row_sample


def _rectangular_ownership(
    partition: Partition, X: sp.csr_matrix, client_rowptr: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Entries each client owns under rectangular ownership, in stacked order.

    Returns ``(entries, rows)``: CSR positions in X and the stacked row of
    each, with ``rows`` non-decreasing (clients in order, I_k sorted, CSR
    order inside a row), so the stacked matrix needs no sort. Raises when a
    non-zero is covered by no client or by several.
    """
    indptr = X.indptr.astype(np.int64)
    in_block = np.zeros(partition.n_features, dtype=bool)
    entry_parts: list[np.ndarray] = []
    row_parts: list[np.ndarray] = []
    entry_index = np.int32 if X.nnz < 2**31 else np.int64
    # How many clients hold each stored entry, saturating at 2 (uint8 keeps the
    # peak memory of stacking low; only 0, 1 and "more" matter).
    coverage = np.zeros(X.nnz, dtype=np.uint8)
    for k in range(partition.n_clients):
        sample_ids = np.asarray(partition.samples[k], dtype=np.int64)
        feature_ids = np.asarray(partition.features[k], dtype=np.int64)
        starts = indptr[sample_ids]
        lengths = indptr[sample_ids + 1] - starts
        entries = concat_ranges(starts, lengths)
        # Boolean lookup over features: O(entries) instead of a set test.
        in_block[feature_ids] = True
        keep = in_block[X.indices[entries]]
        in_block[feature_ids] = False
        local_row = np.repeat(np.arange(len(sample_ids), dtype=np.int64), lengths)
        owned = entries[keep]
        coverage[owned] = np.minimum(coverage[owned], 1) + 1
        entry_parts.append(owned.astype(entry_index))
        row_parts.append((local_row[keep] + client_rowptr[k]).astype(_ROW_INDEX))
    entries = np.concatenate(entry_parts)
    del entry_parts
    rows = np.concatenate(row_parts)
    del row_parts

    nonzero = X.data != 0
    uncovered = np.flatnonzero((coverage == 0) & nonzero)
    if uncovered.size:
        sample_of = np.searchsorted(indptr, uncovered, side="right") - 1
        verb = "is" if uncovered.size == 1 else "are"
        raise fail(
            f"non-zero{'s' if uncovered.size > 1 else ''} "
            f"{_name_entries(sample_of, X.indices[uncovered])}",
            f"{verb} held by no client (no client holds both the sample and the feature), "
            "so the data would be lost",
            f"Give feature {int(X.indices[uncovered[0]])} to a client holding sample "
            f"{int(sample_of[0])} (and likewise for the others), "
            "or use a split with entry_owner.",
        )
    shared = np.flatnonzero((coverage > 1) & nonzero)
    if shared.size:
        first = shared[0]
        holders = np.searchsorted(client_rowptr, rows[entries == first], side="right") - 1
        i = int(np.searchsorted(indptr, first, side="right") - 1)
        m = int(X.indices[first])
        others = f" ({shared.size} shared non-zeros in all)" if shared.size > 1 else ""
        raise fail(
            f"non-zero X[{i}, {m}]",
            f"is held by clients {', '.join(str(int(c)) for c in holders)}{others}; "
            "it would be counted more than once in x_i^T w",
            "Make the feature sets of clients that share a sample disjoint, "
            "or use a split with entry_owner (e.g. nonzero:KxQ).",
        )
    # Stored zeros held by several clients carry no data: drop them.
    single = coverage[entries] == 1
    if single.all():
        return entries, rows
    return entries[single], rows[single]


def _explicit_ownership(
    partition: Partition,
    X: sp.csr_matrix,
    row_client: np.ndarray,
    row_sample: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Entries in stacked order for a partition with ``entry_owner``."""
    owner = np.asarray(partition.entry_owner)
    if owner.shape[0] != X.nnz:
        raise fail(
            "entry_owner",
            f"has {owner.shape[0]} entries but X stores {X.nnz}",
            "Build the partition from this X (entry_owner follows X's CSR order).",
        )
    if owner.dtype.kind not in "iu":
        raise fail("entry_owner", f"has dtype {owner.dtype}", "Give owning clients as integer ids.")
    owner = owner.astype(np.int64, copy=False)
    K, N, M = partition.n_clients, partition.n_samples, partition.n_features
    out_of_range = np.flatnonzero((owner < 0) | (owner >= K))
    if out_of_range.size:
        raise fail(
            "entry_owner",
            f"names client {int(owner[out_of_range[0]])} for "
            f"{out_of_range.size} entr{'y' if out_of_range.size == 1 else 'ies'}, "
            f"outside 0..{K - 1}",
            "Owners are client indices of the partition.",
        )
    sample = _entry_rows(X)
    feature = X.indices.astype(np.int64)

    # (client, sample) keys of the stacked rows are strictly increasing, so
    # a binary search finds each entry's row and proves the owner holds it.
    row_keys = row_client.astype(np.int64) * N + row_sample
    entry_keys = owner * N + sample
    rows = np.minimum(np.searchsorted(row_keys, entry_keys), len(row_keys) - 1)
    bad = np.flatnonzero(row_keys[rows] != entry_keys)
    if bad.size:
        e = bad[0]
        raise fail(
            f"entry X[{int(sample[e])}, {int(feature[e])}]",
            f"is assigned to client {int(owner[e])}, which does not hold sample "
            f"{int(sample[e])} ({bad.size} such entr{'y' if bad.size == 1 else 'ies'})",
            "An entry's owner must hold its sample; fix entry_owner or the client's samples.",
        )
    feature_lengths = np.array([len(f) for f in partition.features], dtype=np.int64)
    feature_keys = np.repeat(np.arange(K, dtype=np.int64), feature_lengths) * M + np.concatenate(
        partition.features
    ).astype(np.int64)
    entry_keys = owner * M + feature
    position = np.minimum(np.searchsorted(feature_keys, entry_keys), len(feature_keys) - 1)
    bad = np.flatnonzero(feature_keys[position] != entry_keys)
    if bad.size:
        e = bad[0]
        raise fail(
            f"entry X[{int(sample[e])}, {int(feature[e])}]",
            f"is assigned to client {int(owner[e])}, which does not hold feature "
            f"{int(feature[e])} ({bad.size} such entr{'y' if bad.size == 1 else 'ies'})",
            "An entry's owner must hold its feature; fix entry_owner or the client's features.",
        )
    order = np.argsort(rows, kind="stable")
    return order, rows[order]


def _ownership(partition: Partition, X: sp.csr_matrix):
    """Validate fully and return (layout, entries, rows) for :func:`stack`."""
    _check_structure(partition)
    _check_shape(partition, X)
    client_rowptr, row_client, row_sample = _row_layout(partition)
    if partition.entry_owner is None:
        entries, rows = _rectangular_ownership(partition, X, client_rowptr)
    else:
        entries, rows = _explicit_ownership(partition, X, row_client, row_sample)
    return (client_rowptr, row_client, row_sample), entries, rows


def validate(partition: Partition, X: Any = None) -> None:
    """Check a partition, and its fit to the data matrix if X is given.

    Parameters
    ----------
    partition : Partition
    X : sparse or dense matrix, shape (N, M), optional
        Without X only the client blocks are checked.

    Raises
    ------
    HyflError
        When a client holds no samples or no features; an id is out of
        range, duplicated or unsorted inside a client; a sample or feature is
        held by no client; X's shape differs from (N, M); for rectangular
        ownership, a stored non-zero is held by no client or by several; for
        ``entry_owner``, its length differs from ``X.nnz``, an owner is out of
        range, or an owner does not hold its entry's sample and feature.
    """
    if X is None:
        _check_structure(partition)
        return
    _ownership(partition, _as_csr(X))


# ---------------------------------------------------------------------------
# Stacked blocks
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StackedBlocks:
    """All client blocks stacked as rows of one sparse matrix.

    Row r is "client ``row_client[r]``'s part of sample ``row_sample[r]``";
    rows are ordered by client, then by sample id, and every (client k,
    sample i in I_k) pair has a row, even an empty one. R = sum_k N_k.

    Attributes
    ----------
    X : scipy.sparse.csr_matrix, shape (R, M), float64
        Row r holds exactly the entries client ``row_client[r]`` owns of
        sample ``row_sample[r]``, at their GLOBAL feature columns. The rows of
        sample i sum to X[i]; every non-zero of X appears exactly once.
    row_client : ndarray of int, shape (R,)
        Derived from ``client_rowptr`` on access (not stored, to save memory);
        use :meth:`clients_of` for a few rows.
    row_sample : ndarray of int32, shape (R,)
    client_rowptr : ndarray of int64, shape (K + 1,)
        Rows of client k are ``client_rowptr[k]:client_rowptr[k + 1]``.
    sample_rowptr : ndarray of int64, shape (N + 1,)
    sample_rows : ndarray of int32, shape (R,)
        Rows holding sample n are
        ``sample_rows[sample_rowptr[n]:sample_rowptr[n + 1]]``, ascending.
    n_holders : ndarray of int64, shape (N,)
        |B_n|, the number of clients holding sample n.
    n_clients, n_samples, n_features : int
    client_features : tuple of ndarray
        M_k per client (global ids), for :func:`client_block`.
    """

    X: sp.csr_matrix
    row_sample: np.ndarray
    client_rowptr: np.ndarray
    sample_rowptr: np.ndarray
    sample_rows: np.ndarray
    n_holders: np.ndarray
    n_clients: int
    n_samples: int
    n_features: int
    client_features: tuple[np.ndarray, ...] = ()

    @property
    def row_client(self) -> np.ndarray:
        """Client of every stacked row, shape (R,) (computed on each access)."""
        return np.repeat(np.arange(self.n_clients), np.diff(self.client_rowptr))

    def clients_of(self, rows: np.ndarray) -> np.ndarray:
        """Client of each of the given stacked rows (binary search on ``client_rowptr``)."""
        return np.searchsorted(self.client_rowptr, rows, side="right") - 1


def stack(partition: Partition, X: Any) -> StackedBlocks:
    """Validate ``partition`` against X and stack all client blocks as rows.

    Parameters
    ----------
    partition : Partition
    X : sparse or dense matrix, shape (N, M)
        The data matrix (converted to CSR float64; with ``entry_owner`` it
        must be the matrix the partition was built from, same stored order).

    Returns
    -------
    StackedBlocks

    Raises
    ------
    HyflError
        See :func:`validate`.

    Notes
    -----
    Cost: O(sum_k nnz(X[I_k])) for rectangular ownership (one pass per
    client over its rows, no sort), one stable sort of the entries for
    ``entry_owner``.
    """
    X = _as_csr(X)
    (client_rowptr, row_client, row_sample), entries, rows = _ownership(partition, X)
    del row_client  # derived from client_rowptr on demand (saves R ints)
    n_rows = len(row_sample)
    indptr = np.zeros(n_rows + 1, dtype=np.int32 if len(entries) < 2**31 else np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
    del rows
    stacked = sp.csr_matrix(
        (X.data[entries].astype(np.float64, copy=False), X.indices[entries], indptr),
        shape=(n_rows, partition.n_features),
    )
    del entries  # free before the row maps below: keeps the peak memory low
    n_holders = np.bincount(row_sample, minlength=partition.n_samples).astype(np.int64)
    sample_rowptr = np.zeros(partition.n_samples + 1, dtype=np.int64)
    np.cumsum(n_holders, out=sample_rowptr[1:])
    # Stable: the rows of each sample stay ascending.
    sample_rows = np.argsort(row_sample, kind="stable").astype(_ROW_INDEX)
    return StackedBlocks(
        X=stacked,
        row_sample=row_sample,
        client_rowptr=client_rowptr,
        sample_rowptr=sample_rowptr,
        sample_rows=sample_rows,
        n_holders=n_holders,
        n_clients=partition.n_clients,
        n_samples=partition.n_samples,
        n_features=partition.n_features,
        client_features=tuple(np.asarray(f, dtype=np.int64) for f in partition.features),
    )


def client_block(stacked: StackedBlocks, k: int) -> tuple[np.ndarray, np.ndarray, sp.csr_matrix]:
    """The local data of client k in local coordinates.

    Parameters
    ----------
    stacked : StackedBlocks
    k : int
        Client index in ``0..K-1``.

    Returns
    -------
    sample_ids : ndarray of int64, shape (N_k,)
        I_k; local row j is global sample ``sample_ids[j]``.
    feature_ids : ndarray of int64, shape (|M_k|,)
        M_k; local column j is global feature ``feature_ids[j]``.
    block : scipy.sparse.csr_matrix, shape (N_k, |M_k|)
        The entries client k owns (equal to ``X[I_k][:, M_k]`` for
        rectangular ownership).
    """
    if not 0 <= k < stacked.n_clients:
        raise fail(
            f"client {k}",
            "does not exist",
            f"Client indices run from 0 to {stacked.n_clients - 1}.",
        )
    rows = slice(int(stacked.client_rowptr[k]), int(stacked.client_rowptr[k + 1]))
    sample_ids = stacked.row_sample[rows]
    feature_ids = stacked.client_features[k]
    block = stacked.X[rows][:, feature_ids].tocsr()
    return sample_ids, feature_ids, block


# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------


def _check_count(what: str, value: Any, limit: int, limit_name: str) -> int:
    """A group count: an integer in 1..limit."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise fail(
            what, f"must be an integer, got {value!r}", f"Pass an integer from 1 to {limit}."
        )
    value = int(value)
    if value < 1:
        raise fail(what, f"must be >= 1, got {value}", f"Pass an integer from 1 to {limit}.")
    if value > limit:
        raise fail(
            what,
            f"is {value} but the data has only {limit} {limit_name}",
            f"Use at most {limit} so that every client gets at least one.",
        )
    return value


def _sample_groups(n_samples: int, n_groups: int, seed: int, shuffle: bool,
                   split: SampleSplit | None = None) -> list[np.ndarray]:
    """Split samples into n_groups groups: sizes that differ by at most 1, or by ``split``."""
    if split is not None:
        return split.groups(n_samples, n_groups, np.random.default_rng(seed))
    order = np.random.default_rng(seed).permutation(n_samples) if shuffle else np.arange(n_samples)
    return [np.sort(group).astype(np.int64) for group in np.array_split(order, n_groups)]


@dataclass(frozen=True, eq=False)
class SampleSplit:
    """A skewed split of the samples into groups (the ``@...`` suffix of a partition spec).

    ``kind`` is one of :data:`SAMPLE_SPLITS`:

    * ``classes`` (``@classes:k``): label skew; each group holds samples of
      ``k`` classes only (the classes dealt to the groups in turn from a
      shuffled list, each class's samples divided evenly among its groups);
    * ``dirichlet`` (``@dirichlet:alpha``): each class's samples divided
      among the groups in proportions drawn from Dirichlet(alpha, ..., alpha)
      (small alpha: few classes per group; large: close to uniform);
    * ``lognormal`` (``@lognormal:sigma``): group sizes proportional to
      exp(N(0, sigma^2)) draws, the samples assigned at random.

    Every group keeps at least one sample. ``labels`` (shape (N,)) are the
    training labels, needed by ``classes`` and ``dirichlet``.
    """

    kind: str
    value: float
    labels: np.ndarray | None = None

    def groups(self, n_samples: int, n_groups: int, rng: np.random.Generator
               ) -> list[np.ndarray]:
        """The sorted sample ids of each of ``n_groups`` groups."""
        owners, needs_labels, _ = SAMPLE_SPLITS[self.kind]
        if needs_labels:
            if self.labels is None:
                raise fail(f"sample split {_suffix(self)}", "needs the training labels",
                           "Pass labels= to parse_partition (the commands do).")
            labels = np.asarray(self.labels)
            if labels.shape != (n_samples,):
                raise fail(f"sample split {_suffix(self)}", f"needs {n_samples} labels, got "
                           f"shape {labels.shape}", "Pass the training labels.")
            owner = owners(labels, self.value, n_groups, rng)
        else:
            owner = owners(n_samples, self.value, n_groups, rng)
        owner = _with_each_group(owner, n_groups, rng)
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(1, n_groups))
        return [np.sort(group).astype(np.int64) for group in np.split(order, bounds)]


def _owners_by_classes(labels: np.ndarray, k: float, n_groups: int,
                       rng: np.random.Generator) -> np.ndarray:
    """Label skew: the group of each sample when every group holds ``k`` classes."""
    classes, index = np.unique(labels, return_inverse=True)
    k = int(k)
    if not 1 <= k <= classes.size:
        raise fail(f"sample split @classes:{k}", f"asks for {k} classes per group but the "
                   f"labels have {classes.size}",
                   f"Use a number of classes from 1 to {classes.size}.")
    # Group g holds classes dealt[g*k:(g+1)*k] (cyclically): every class is dealt to a
    # group when k * n_groups >= the class count; one that is not goes to all groups.
    dealt = np.resize(rng.permutation(classes.size), n_groups * k).reshape(n_groups, k)
    owner = np.empty(labels.size, dtype=np.int64)
    for c in range(classes.size):  # (a loop over classes, not samples)
        holders = np.flatnonzero(np.any(dealt == c, axis=1))
        holders = holders if holders.size else np.arange(n_groups)
        members = rng.permutation(np.flatnonzero(index == c))
        owner[members] = holders[np.arange(members.size) % holders.size]
    return owner


def _owners_by_dirichlet(labels: np.ndarray, alpha: float, n_groups: int,
                         rng: np.random.Generator) -> np.ndarray:
    """Each class's samples shared among the groups by one Dirichlet(alpha) draw."""
    classes, index = np.unique(labels, return_inverse=True)
    shares = rng.dirichlet(np.full(n_groups, alpha), size=classes.size)
    owner = np.empty(labels.size, dtype=np.int64)
    for c in range(classes.size):
        members = rng.permutation(np.flatnonzero(index == c))
        cuts = np.round(np.cumsum(shares[c])[:-1] * members.size).astype(np.int64)
        counts = np.diff(np.concatenate(([0], cuts, [members.size])))
        owner[members] = np.repeat(np.arange(n_groups), counts)
    return owner


def _owners_by_lognormal(n_samples: int, sigma: float, n_groups: int,
                         rng: np.random.Generator) -> np.ndarray:
    """Samples assigned at random to groups whose expected sizes are log-normal draws."""
    weights = np.exp(rng.normal(0.0, sigma, size=n_groups))
    return rng.choice(n_groups, size=n_samples, p=weights / weights.sum())


#: The kinds of :class:`SampleSplit`: (owners function, whether it needs the labels,
#: what its number means). Drives parsing, the error's list of forms and the splits.
SAMPLE_SPLITS = {
    "classes": (_owners_by_classes, True, "k classes per group"),
    "dirichlet": (_owners_by_dirichlet, True, "Dirichlet(alpha) class shares"),
    "lognormal": (_owners_by_lognormal, False, "log-normal(sigma) group sizes"),
}


def _suffix(split: SampleSplit | None) -> str:
    """The spec suffix of a sample split ("" for none)."""
    return "" if split is None else f"@{split.kind}:{split.value:g}"


def _with_each_group(owner: np.ndarray, n_groups: int, rng: np.random.Generator) -> np.ndarray:
    """``owner`` (the group of each sample) with every group given at least one sample,
    taken from the largest groups (an empty client is refused downstream)."""
    owner = owner.copy()
    counts = np.bincount(owner, minlength=n_groups)
    for g in np.flatnonzero(counts == 0):
        donor = int(np.argmax(counts))
        moved = rng.choice(np.flatnonzero(owner == donor))
        owner[moved] = g
        counts[donor] -= 1
        counts[g] += 1
    return owner


def parse_sample_split(text: str, labels: Any = None) -> SampleSplit:
    """The :class:`SampleSplit` of a spec suffix such as ``"dirichlet:0.5"`` (a clear error
    if it is malformed; ``classes`` and ``dirichlet`` need ``labels`` when they split)."""
    name, _, number = text.partition(":")
    name = name.strip().lower()
    forms = ", ".join(f"@{kind}:{'k' if kind == 'classes' else 'x'} ({meaning})"
                      for kind, (_, _, meaning) in SAMPLE_SPLITS.items())
    try:
        value = float(number)
    except ValueError:
        value = float("nan")
    if name not in SAMPLE_SPLITS or not np.isfinite(value) or value <= 0 or (
            name == "classes" and value != int(value)):
        raise fail(f"sample split @{text}", "is not understood",
                   f"Use one of: {forms}, with a positive number (k a whole one).")
    return SampleSplit(name, value, None if labels is None else np.asarray(labels))


def _feature_groups(n_features: int, n_groups: int) -> list[np.ndarray]:
    """Contiguous feature groups whose sizes differ by at most 1."""
    return [g.astype(np.int64) for g in np.array_split(np.arange(n_features), n_groups)]


def _check_size(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise fail(what, f"must be a positive integer, got {value!r}", "Pass the data's size.")
    return int(value)


def horizontal(
    n_samples: int, n_features: int, n_clients: int, seed: int = 0, shuffle: bool = True,
    split: SampleSplit | None = None,
) -> Partition:
    """Horizontal FL: K clients, each with a sample group and all features.

    Parameters
    ----------
    n_samples, n_features : int
        N and M.
    n_clients : int
        K, in 1..N.
    seed : int, default 0
        Seed of the sample permutation.
    shuffle : bool, default True
        Permute the samples before splitting; otherwise contiguous groups.
    split : SampleSplit, optional
        A skewed split of the samples instead (labels, sizes).

    Returns
    -------
    Partition
        Client k holds sample group k (sizes differ by at most 1) and all features.
    """
    partition = grid(n_samples, n_features, n_clients, 1, seed=seed, shuffle=shuffle,
                     split=split)
    return replace(partition, name=f"horizontal:{n_clients}{_suffix(split)}")


def vertical(n_samples: int, n_features: int, n_clients: int) -> Partition:
    """Vertical FL: Q clients, each with all samples and a contiguous feature group.

    Parameters
    ----------
    n_samples, n_features : int
        N and M.
    n_clients : int
        Q, in 1..M.

    Returns
    -------
    Partition
        Client q holds all samples and feature group q (contiguous ids,
        sizes differ by at most 1).
    """
    partition = grid(n_samples, n_features, 1, n_clients, shuffle=False)
    return replace(partition, name=f"vertical:{n_clients}")


def grid(
    n_samples: int,
    n_features: int,
    n_sample_groups: int,
    n_feature_groups: int,
    seed: int = 0,
    shuffle: bool = True,
    split: SampleSplit | None = None,
) -> Partition:
    """Hybrid grid: K sample groups x Q feature groups, one client per cell.

    Parameters
    ----------
    n_samples, n_features : int
        N and M.
    n_sample_groups : int
        K, in 1..N.
    n_feature_groups : int
        Q, in 1..M.
    seed : int, default 0
        Seed of the sample permutation.
    shuffle : bool, default True
        Permute the samples before splitting; otherwise contiguous groups.
    split : SampleSplit, optional
        A skewed split of the samples instead (:class:`SampleSplit`).

    Returns
    -------
    Partition
        K*Q clients; client ``g * Q + q`` holds sample group g and feature
        group q (contiguous feature ids).
    """
    n_samples = _check_size("n_samples", n_samples)
    n_features = _check_size("n_features", n_features)
    K = _check_count("number of sample groups K", n_sample_groups, n_samples, "samples")
    Q = _check_count("number of feature groups Q", n_feature_groups, n_features, "features")
    sample_groups = _sample_groups(n_samples, K, seed, shuffle, split)
    feature_groups = _feature_groups(n_features, Q)
    return Partition(
        n_samples=n_samples,
        n_features=n_features,
        samples=tuple(sample_groups[g] for g in range(K) for _ in range(Q)),
        features=tuple(feature_groups[q] for _ in range(K) for q in range(Q)),
        name=f"grid:{K}x{Q}{_suffix(split)}",
    )


def nonzero_balanced(
    X: Any,
    n_sample_groups: int,
    n_feature_groups: int,
    seed: int = 0,
    shuffle: bool = True,
) -> Partition:
    """The HyFDCA paper's split for News20 and Covtype (section 7.2).

    Samples are split into K groups; each group has Q clients that all hold
    every sample of the group. Each sample's stored entries, in column
    order, are dealt to the Q clients in contiguous chunks of nearly equal
    size: entry p of a row with n_i entries goes to client
    ``g * Q + floor(p * Q / n_i)``. M_k is the set of columns client k
    received.

    Parameters
    ----------
    X : sparse or dense matrix, shape (N, M)
        The data matrix; the partition's ``entry_owner`` follows its CSR
        order, so pass the same matrix to :func:`stack`.
    n_sample_groups : int
        K, in 1..N.
    n_feature_groups : int
        Q, in 1..M.
    seed : int, default 0
        Seed of the sample permutation.
    shuffle : bool, default True
        Permute the samples before splitting; otherwise contiguous groups.

    Returns
    -------
    Partition
        K*Q clients with ``entry_owner`` set.

    Notes
    -----
    Features with no stored entry at all (e.g. words seen only in a test
    split) are given round-robin to the clients so that every feature has a
    holder; they carry no data, so their weights stay at zero. A client
    whose samples all have too few entries to reach it gets no features, and
    :func:`validate` reports it.
    """
    X = _as_csr(X)
    N, M = X.shape
    N = _check_size("n_samples", N)
    M = _check_size("n_features", M)
    K = _check_count("number of sample groups K", n_sample_groups, N, "samples")
    Q = _check_count("number of feature groups Q", n_feature_groups, M, "features")
    sample_groups = _sample_groups(N, K, seed, shuffle)
    group_of_sample = np.empty(N, dtype=np.int64)
    for g, group in enumerate(sample_groups):
        group_of_sample[group] = g

    indptr = X.indptr.astype(np.int64)
    row_length = np.diff(indptr)
    sample = _entry_rows(X)
    if X.has_sorted_indices:
        position = np.arange(X.nnz, dtype=np.int64) - indptr[sample]
    else:
        # Rank by column inside each row without touching X.
        order = np.lexsort((X.indices, sample))
        position = np.empty(X.nnz, dtype=np.int64)
        position[order] = np.arange(X.nnz, dtype=np.int64) - indptr[sample[order]]
    chunk = position * Q // row_length[sample]
    entry_owner = group_of_sample[sample] * Q + chunk

    n_clients = K * Q
    keys = entry_owner * M + X.indices.astype(np.int64)
    empty_features = np.flatnonzero(np.bincount(X.indices, minlength=M) == 0)
    if empty_features.size:
        spread = np.arange(empty_features.size, dtype=np.int64) % n_clients
        keys = np.concatenate([keys, spread * M + empty_features])
    held = _distinct_sorted(keys, n_clients * M)
    bounds = np.searchsorted(held, np.arange(n_clients + 1, dtype=np.int64) * M)
    features = tuple(held[bounds[k] : bounds[k + 1]] - k * M for k in range(n_clients))
    return Partition(
        n_samples=N,
        n_features=M,
        samples=tuple(sample_groups[g] for g in range(K) for _ in range(Q)),
        features=features,
        entry_owner=entry_owner,
        name=f"nonzero:{K}x{Q}",
    )


def _distinct_sorted(keys: np.ndarray, key_range: int) -> np.ndarray:
    """Sorted distinct values of non-negative int keys below ``key_range``."""
    # A presence mask is several times faster than a sort when the key range
    # is not much larger than the number of keys (e.g. MNIST: 5,000 x 785).
    if key_range <= max(8 * keys.size, 1 << 24):
        present = np.zeros(key_range, dtype=bool)
        present[keys] = True
        return np.flatnonzero(present).astype(np.int64)
    ordered = np.sort(keys)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def quadrant(
    n_samples: int,
    n_clients: int,
    image_shape: tuple[int, int] = (28, 28),
    bias_feature: int | None = None,
    seed: int = 0,
    shuffle: bool = True,
    split: SampleSplit | None = None,
) -> Partition:
    """The HyFDCA paper's MNIST split: image quadrants x sample groups.

    Parameters
    ----------
    n_samples : int
        N.
    n_clients : int
        C, a multiple of 4 with C / 4 <= N.
    image_shape : (int, int), default (28, 28)
        (rows, cols) of the row-major images; pixel (r, c) is feature
        ``r * cols + c``. Odd sizes give the top/left halves the extra line.
    bias_feature : int, optional
        Index of an appended bias feature, which must be ``rows * cols``; it
        joins quadrant 3 (the paper's bias of value 10 on the 4th quadrant).
    seed : int, default 0
        Seed of the sample permutation.
    shuffle : bool, default True
        Permute the samples before splitting; otherwise contiguous groups.
    split : SampleSplit, optional
        A skewed split of the samples instead (:class:`SampleSplit`).

    Returns
    -------
    Partition
        Client ``q * (C / 4) + g`` holds sample group g and quadrant q
        (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right);
        ``n_features = rows * cols`` (+1 with the bias).
    """
    n_samples = _check_size("n_samples", n_samples)
    n_clients = _check_size("number of clients C", n_clients)
    if n_clients % 4:
        raise fail(
            "number of clients C",
            f"is {n_clients}, which is not a multiple of 4",
            "The quadrant split gives each image quadrant to a quarter of the clients; "
            "pass C = 4, 8, 12, ...",
        )
    try:
        rows, cols = (int(v) for v in image_shape)
    except (TypeError, ValueError):
        raise fail(
            "image_shape", f"is {image_shape!r}", "Pass (rows, cols), e.g. (28, 28)."
        ) from None
    if rows < 2 or cols < 2:
        raise fail(
            "image_shape",
            f"is {image_shape!r}, too small to cut into quadrants",
            "Pass (rows, cols) with both at least 2.",
        )
    n_pixels = rows * cols
    if bias_feature is not None and int(bias_feature) != n_pixels:
        raise fail(
            "bias_feature",
            f"is {bias_feature}, but the bias column must follow the {n_pixels} pixels",
            f"Pass bias_feature={n_pixels} (or None for no bias).",
        )
    n_groups = _check_count("number of sample groups C/4", n_clients // 4, n_samples, "samples")
    pixel = np.arange(n_pixels, dtype=np.int64).reshape(rows, cols)
    top, bottom = np.array_split(np.arange(rows), 2)
    left, right = np.array_split(np.arange(cols), 2)
    quadrants = [
        np.sort(pixel[np.ix_(r, c)].ravel())
        for r, c in ((top, left), (top, right), (bottom, left), (bottom, right))
    ]
    if bias_feature is not None:
        quadrants[3] = np.append(quadrants[3], np.int64(n_pixels))
    sample_groups = _sample_groups(n_samples, n_groups, seed, shuffle, split)
    return Partition(
        n_samples=n_samples,
        n_features=n_pixels + (bias_feature is not None),
        samples=tuple(sample_groups[g] for _ in range(4) for g in range(n_groups)),
        features=tuple(quadrants[q] for q in range(4) for _ in range(n_groups)),
        name=f"quadrant:{n_clients}{_suffix(split)}",
    )


def from_blocks(
    blocks: Sequence[tuple[Any, Any]], n_samples: int, n_features: int, name: str = "blocks"
) -> Partition:
    """A partition from explicit client blocks.

    Parameters
    ----------
    blocks : sequence of (sample_ids, feature_ids)
        One pair of integer id sequences per client; they are sorted here
        (duplicates are kept for :func:`validate` to report).
    n_samples, n_features : int
        N and M.
    name : str, default "blocks"

    Returns
    -------
    Partition
        Rectangular ownership; check it with :func:`validate` or :func:`stack`.
    """
    samples, features = [], []
    for k, block in enumerate(blocks):
        try:
            sample_ids, feature_ids = block
        except (TypeError, ValueError):
            raise fail(
                f"block {k}",
                "is not a (sample_ids, feature_ids) pair",
                "Give one pair of id lists per client.",
            ) from None
        samples.append(_as_ids(k, sample_ids, "sample"))
        features.append(_as_ids(k, feature_ids, "feature"))
    return Partition(
        n_samples=int(n_samples),
        n_features=int(n_features),
        samples=tuple(samples),
        features=tuple(features),
        name=name,
    )


def restrict_samples(partition: Partition, X: Any, rows: Any) -> Partition:
    """The partition of ``X[rows]``: every client keeps its features and the kept samples.

    Used to hold validation rows out of data whose partition came with it
    (party files). Kept samples are renumbered ``0 .. len(rows) - 1`` in the
    order of ``rows`` (which must be sorted and unique), and an explicit
    ``entry_owner`` keeps the owners of the kept rows' entries.

    Parameters
    ----------
    partition : Partition
        The partition of ``X``.
    X : sparse matrix, shape (N, M)
        The data it partitions (its CSR entry order defines ``entry_owner``).
    rows : array of int, shape (n_kept,)
        Sorted unique sample ids to keep.

    Returns
    -------
    Partition
        Of ``X[rows]``; clients left with no samples are reported by
        :func:`validate`.
    """
    rows = np.asarray(rows, dtype=np.int64)
    if rows.ndim != 1 or np.any(np.diff(rows) <= 0):
        raise fail("rows", "must be sorted unique sample ids", "Pass np.unique(rows).")
    new_id = np.full(partition.n_samples, -1, dtype=np.int64)
    new_id[rows] = np.arange(rows.size)
    samples = tuple(new_id[s][new_id[s] >= 0] for s in partition.samples)
    owner = None
    if partition.entry_owner is not None:
        csr = _as_csr(X)
        owner = np.asarray(partition.entry_owner)[new_id[_entry_rows(csr)] >= 0]
    return replace(partition, n_samples=int(rows.size), samples=samples, entry_owner=owner)


def with_constant_feature(partition: Partition, X: Any) -> Partition:
    """The partition of ``X`` with a constant last column appended (an intercept).

    Partitions built from a spec simply split the augmented matrix; this is
    for partitions that come with the data (party files). The constant of
    sample ``i`` goes to the first client holding ``i``: as a whole feature to
    those clients when each holds only samples it is the first to hold (a
    grid of parties), else through ``entry_owner``.

    Parameters
    ----------
    partition : Partition
        The partition of ``X`` without its last column.
    X : sparse matrix, shape (N, M + 1)
        The data with the constant column (:func:`hyfl.data.dataset.with_intercept`).
    """
    csr = _as_csr(X)
    column = partition.n_features
    if csr.shape != (partition.n_samples, column + 1):
        raise fail("X", f"has shape {csr.shape}, not the partition's {partition.n_samples} "
                   f"samples by {column} + 1 features", "Pass the data with its constant "
                   "column appended.")
    first = np.full(partition.n_samples, -1, dtype=np.int64)
    for k in reversed(range(partition.n_clients)):
        first[partition.samples[k]] = k
    holders = np.unique(first[first >= 0])
    features = list(partition.features)
    for k in holders:
        features[k] = np.append(features[k], column)
    whole = all(np.all(first[partition.samples[k]] == k) for k in holders)
    if partition.entry_owner is None and whole:
        return replace(partition, n_features=column + 1, features=tuple(features))
    old = sp.csr_matrix((csr.data, csr.indices, csr.indptr), shape=csr.shape)[:, :column]
    old_owner = partition.entry_owner
    if old_owner is None:
        (_, row_client, _), entries, rows = _ownership(partition, old)
        old_owner = np.full(old.nnz, -1, dtype=np.int64)
        old_owner[entries] = row_client[rows]
    owner = np.insert(np.asarray(old_owner, dtype=np.int64), old.indptr[1:],
                      first[np.arange(partition.n_samples)])
    return replace(partition, n_features=column + 1, features=tuple(features),
                   entry_owner=owner)


def _as_ids(k: int, ids: Any, kind: str) -> np.ndarray:
    array = np.asarray(ids)
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise fail(
            f"client {k}",
            f"has {kind} ids of dtype {array.dtype}",
            f"Give {kind} ids as integers (row/column numbers of X).",
        )
    return np.sort(array.astype(np.int64).ravel())


# ---------------------------------------------------------------------------
# Partition specs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionKind:
    """One entry of :data:`PARTITIONS`.

    Attributes
    ----------
    form : str
        Spec form, e.g. ``"grid:KxQ"``.
    help : str
        One line for the CLI.
    n_numbers : int
        How many integers the spec carries.
    build : callable
        ``build(numbers, X, seed, meta, split) -> Partition``; ``split`` is the
        spec's :class:`SampleSplit` or None.
    splits : bool
        Whether the kind takes a skewed sample split (``@...``).
    """

    form: str
    help: str
    n_numbers: int
    build: Callable[..., Partition]
    splits: bool = False


def _build_quadrant(numbers, X, seed, meta, split) -> Partition:
    (C,) = numbers
    if "image_shape" not in meta or meta["image_shape"] is None:
        raise fail(
            f"partition quadrant:{C}",
            "needs image data, but the dataset has no image shape",
            "Use it with an image dataset such as MNIST (meta['image_shape']), "
            "or pick grid:KxQ or nonzero:KxQ.",
        )
    image_shape = tuple(int(v) for v in meta["image_shape"])
    bias = meta.get("bias_feature")
    n_pixels = image_shape[0] * image_shape[1]
    expected = n_pixels + (bias is not None)
    if X.shape[1] != expected:
        raise fail(
            f"partition quadrant:{C}",
            f"expects {expected} features (image {image_shape[0]}x{image_shape[1]}"
            f"{' plus bias' if bias is not None else ''}) but X has {X.shape[1]}",
            "Check meta['image_shape'] and meta['bias_feature'] of the dataset.",
        )
    return quadrant(X.shape[0], C, image_shape, bias, seed=seed, split=split)


PARTITIONS: dict[str, PartitionKind] = {
    "horizontal": PartitionKind(
        "horizontal:K",
        "K clients, each a sample group with all features",
        1,
        lambda n, X, seed, meta, split: horizontal(X.shape[0], X.shape[1], n[0], seed=seed,
                                                   split=split),
        splits=True,
    ),
    "vertical": PartitionKind(
        "vertical:Q",
        "Q clients, each all samples with a contiguous feature group",
        1,
        lambda n, X, seed, meta, split: vertical(X.shape[0], X.shape[1], n[0]),
    ),
    "grid": PartitionKind(
        "grid:KxQ",
        "K sample groups x Q contiguous feature groups, K*Q clients",
        2,
        lambda n, X, seed, meta, split: grid(X.shape[0], X.shape[1], n[0], n[1], seed=seed,
                                             split=split),
        splits=True,
    ),
    "nonzero": PartitionKind(
        "nonzero:KxQ",
        "paper's split: K sample groups, each sample's non-zeros dealt to Q clients",
        2,
        lambda n, X, seed, meta, split: nonzero_balanced(X, n[0], n[1], seed=seed),
    ),
    "quadrant": PartitionKind(
        "quadrant:C",
        "paper's MNIST split: 4 image quadrants x C/4 sample groups, C clients",
        1,
        _build_quadrant,
        splits=True,
    ),
}

SPEC_PATTERN = re.compile(r"^\s*([A-Za-z_]+)\s*:\s*(\d+)\s*(?:[xX,*]\s*(\d+)\s*)?$")


def _accepted_partitions() -> str:
    return ", ".join(kind.form for kind in PARTITIONS.values())


def parse_partition(
    spec: str, X: Any, seed: int = 0, meta: Mapping[str, Any] | None = None,
    labels: Any = None,
) -> Partition:
    """Build a partition from a spec string such as ``"grid:3x3"``.

    Parameters
    ----------
    spec : str
        One of the forms in :data:`PARTITIONS`: ``horizontal:K``,
        ``vertical:Q``, ``grid:KxQ`` (or ``grid:K,Q``), ``nonzero:KxQ``,
        ``quadrant:C``.
    X : sparse or dense matrix, shape (N, M)
        The data matrix (its shape; ``nonzero`` also reads its entries).
    seed : int, default 0
        Seed of the sample permutation.
    meta : mapping, optional
        Dataset metadata; ``quadrant`` reads ``image_shape`` and
        ``bias_feature``.
    labels : array-like of shape (N,), optional
        Training labels, for a label-skewed sample split: ``grid:KxQ``,
        ``horizontal:K`` and ``quadrant:C`` take a suffix ``@classes:k``, ``@dirichlet:alpha`` or
        ``@lognormal:sigma`` (:class:`SampleSplit`), e.g. ``grid:4x2@dirichlet:0.5``.

    Returns
    -------
    Partition
        Not yet validated against X; :func:`stack` does that.

    Raises
    ------
    HyflError
        For an unknown or malformed spec (the message lists the accepted
        forms) or group counts larger than the data.
    """
    meta = {} if meta is None else meta
    split = None
    if isinstance(spec, str) and "@" in spec:
        spec, _, suffix = spec.partition("@")
        split = parse_sample_split(suffix, labels)
    match = SPEC_PATTERN.match(spec) if isinstance(spec, str) else None
    name = match.group(1).lower() if match else None
    if match is None or name not in PARTITIONS:
        raise fail(
            f"partition spec {spec!r}",
            "is not understood",
            f"Use one of: {_accepted_partitions()} (K sample groups, Q feature groups, "
            "C clients), e.g. grid:3x3.",
        )
    kind = PARTITIONS[name]
    numbers = tuple(int(g) for g in match.groups()[1:] if g is not None)
    if len(numbers) != kind.n_numbers:
        raise fail(
            f"partition spec {spec!r}",
            f"gives {len(numbers)} number{'s' if len(numbers) != 1 else ''} "
            f"but {name} takes {kind.n_numbers}",
            f"Write it as {kind.form}; accepted forms: {_accepted_partitions()}.",
        )
    if not hasattr(X, "shape") or len(X.shape) != 2:
        raise fail("X", "is not a matrix", "Pass the (samples x features) data matrix.")
    if split is not None and not kind.splits:
        raise fail(f"partition spec {spec}@...", f"{name} has no skewed sample split",
                   "Skew the samples of grid:KxQ, horizontal:K or quadrant:C (e.g. "
                   "grid:4x2@dirichlet:0.5).")
    return kind.build(numbers, X, seed, meta, split)
