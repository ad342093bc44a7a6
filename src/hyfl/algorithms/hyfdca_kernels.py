"""Compiled gathers for HyFDCA's per-sample round (rules safe, theory, paper).

A round with one local step touches a few thousand stacked rows, but each
SciPy or NumPy call on them costs a fixed 5-100 us (SciPy's CSR row indexing
``X[rows]`` and the ``csr_matrix`` constructor cost the most), and about a
hundred such calls gave the round a floor of about 3 ms on full Covtype,
whatever the number of draws. The kernels here walk ``indptr``, ``indices``
and ``data`` of the stacked matrix directly, so their cost is the rows they
touch.

Every kernel adds in the order of the operation it replaces, so the results
are bitwise equal to it:

* :func:`gather_inner_products` -- SciPy's ``csr_matvecs`` (``X[rows] @ W``):
  per row, ``0 + a_0 x_0 + a_1 x_1 + ...`` over the stored entries in order;
  the squared row norm likewise (``np.bincount`` adds in input order);
* :func:`rows_transpose_product` -- ``X[rows].T @ V`` (``csc_matvecs``): the
  rows in order, each row's entries in order, added into the output;
* :func:`holder_rows` and :func:`stale_rows_from_log` only move integers.

The compiled bodies are in :mod:`hyfl.algorithms.hyfdca_compiled` (cached on
disk: only the first use on a machine pays Numba's compile time).
"""

from __future__ import annotations

import weakref

import numpy as np


def _compiled():
    """The compiled kernels (imports Numba on first use; loads them from its disk cache)."""
    from hyfl.algorithms import hyfdca_compiled

    return hyfdca_compiled


def holder_rows(blocks, samples: np.ndarray, active: np.ndarray | None = None):
    """All stacked rows holding the given samples, with each row's sample slot and client.

    Parameters
    ----------
    blocks : hyfl.partition.StackedBlocks
    samples : ndarray of int, shape (n,)
    active : ndarray of bool, shape (K,), optional
        Only the rows of these clients (what masking the result by ``active[clients]``
        gives, without the full arrays and three masked copies).

    Returns
    -------
    rows, slot, clients : ndarray of int32, shape (h,) each
        Sample by sample, the holders' rows in ``sample_rows`` order; ``slot``
        is the position in ``samples``, ``clients`` the client of each row.
    """
    keep = (np.ones(blocks.n_clients, dtype=np.bool_) if active is None
            else np.ascontiguousarray(active, dtype=np.bool_))
    return _compiled().holder_rows(
        np.ascontiguousarray(samples), blocks.sample_rowptr,
        blocks.sample_rows, blocks.client_rowptr, client_table(blocks.client_rowptr), keep,
    )


def sample_inner_products(blocks, samples: np.ndarray, active: np.ndarray,
                          versions: np.ndarray, store: np.ndarray):
    """Each sample's ``x_i^T w`` summed over its holders, each with its own weights.

    What :func:`holder_rows`, :func:`gather_inner_products` and :func:`sum_by_slot`
    give in turn, bitwise, without their arrays over the holders' rows (on Covtype
    12x12 seven million rows: six arrays of 56 MB).

    Parameters
    ----------
    blocks : hyfl.partition.StackedBlocks
    samples : ndarray of int, shape (S,)
    active : ndarray of bool, shape (K,)
    versions : ndarray of int, shape (K,)
        Which weights of ``store`` each client's rows are multiplied with.
    store : ndarray, shape (V, M, C)

    Returns
    -------
    z : ndarray, shape (S, C)
    fresh_sq : ndarray, shape (S,)
        The squared norms of each sample's active holders' rows, summed.
    every_active : bool
        Whether every holder of the samples is active.
    """
    V, M, C = store.shape
    samples = np.ascontiguousarray(samples)
    fixed = (blocks.sample_rowptr, blocks.sample_rows, blocks.client_rowptr,
             client_table(blocks.client_rowptr), np.ascontiguousarray(active, dtype=np.bool_),
             blocks.X.indptr, blocks.X.indices, blocks.X.data,
             np.ascontiguousarray(versions, dtype=np.int64), store.reshape(V * M, C), M)
    # Each sample's sums are its own: runs of samples go to the threads (the kernel
    # releases the GIL) and the results are the same bits for any thread count.
    parts = _on_threads(samples.size, MIN_SAMPLES_PER_THREAD,
                        lambda lo, hi: _compiled().sample_inner_products(samples[lo:hi], *fixed))
    if len(parts) == 1:
        return parts[0]
    return (np.concatenate([z for z, _, _ in parts]),
            np.concatenate([sq for _, sq, _ in parts]), all(every for _, _, every in parts))


#: Below this many samples a kernel over samples runs on one thread (handing a run to
#: another costs tens of microseconds).
MIN_SAMPLES_PER_THREAD = 20_000


def _on_threads(n: int, least: int, work) -> list:
    """``work(lo, hi)`` over ``0..n`` split into runs of at least ``least`` items, one per
    thread of :func:`hyfl._threads.thread_count` (at most), in order."""
    from hyfl._threads import in_parts, thread_count

    parts = max(1, min(thread_count(), n // max(least, 1)))
    return in_parts(work, np.linspace(0, n, parts + 1).astype(np.int64))


def gather_inner_products(X, rows: np.ndarray, versions: np.ndarray, store: np.ndarray):
    """``x_r^T W_{versions[r]}`` and ``||x_r||^2`` for the given rows of a CSR matrix.

    Parameters
    ----------
    X : scipy.sparse.csr_matrix, shape (R, M)
    rows : ndarray of int, shape (n,)
    versions : ndarray of int, shape (n,)
        Which weights each row is multiplied with.
    store : ndarray, shape (V, M, C)

    Returns
    -------
    parts : ndarray, shape (n, C)
    sq_norms : ndarray, shape (n,)
        Bitwise equal to ``X[rows] @ store[v]`` (or the redirected product of
        :meth:`hyfl.algorithms.hyfdca.WeightSnapshots.row_inner_products`) and to
        the row norms of :func:`hyfl.algorithms.hyfdca.row_squared_norms`.
    """
    V, M, C = store.shape
    return _compiled().gather_inner_products(
        X.indptr, X.indices, X.data, np.ascontiguousarray(rows),
        np.ascontiguousarray(versions), store.reshape(V * M, C), M,
    )


def rows_transpose_product(X, rows: np.ndarray, values: np.ndarray,
                           slot: np.ndarray | None = None) -> np.ndarray:
    """``X[rows].T @ values[slot]``, shape (M, C), without building ``X[rows]`` or
    ``values[slot]``.

    ``values`` has shape (n, C), one row per entry of ``rows`` -- or, with ``slot``
    (int, shape (n,)), row ``slot[j]`` for ``rows[j]``.
    """
    return _compiled().rows_transpose_product(
        X.indptr, X.indices, X.data, np.ascontiguousarray(rows),
        np.ascontiguousarray(values, dtype=np.float64),
        None if slot is None else np.ascontiguousarray(slot), X.shape[1],
    )


def add_rows(target: np.ndarray, rows: np.ndarray, values: np.ndarray,
             slot: np.ndarray) -> None:
    """``target[rows] += values[slot]`` in place for distinct ``rows``, without the
    two gathered (n, C) copies NumPy makes. ``target`` C-contiguous float64."""
    _compiled().add_rows(target, np.ascontiguousarray(rows),
                         np.ascontiguousarray(values, dtype=np.float64),
                         np.ascontiguousarray(slot))


def holding_clients(blocks, samples: np.ndarray) -> np.ndarray:
    """Which clients hold any of ``samples``: bool, shape (K,)."""
    return _compiled().holding_clients(
        np.ascontiguousarray(samples, dtype=np.int64), blocks.sample_rowptr,
        blocks.sample_rows, blocks.client_rowptr, client_table(blocks.client_rowptr),
        blocks.n_clients,
    )


def first_active_holders(blocks, samples: np.ndarray, active: np.ndarray):
    """Per sample, its first active holder: the row and the client, int64 shape (n,) each.

    "First" in the order of ``blocks.sample_rows`` (clients ascending); -1 where none
    of the sample's holders is ``active`` (bool, shape (K,)).
    """
    return _compiled().first_active_holders(
        np.ascontiguousarray(samples, dtype=np.int64), blocks.sample_rowptr, blocks.sample_rows,
        blocks.client_rowptr, client_table(blocks.client_rowptr),
        np.ascontiguousarray(active, dtype=np.bool_),
    )


def weighted_slot_sums(ring: np.ndarray, samples: np.ndarray, slots: np.ndarray,
                       weights: np.ndarray) -> np.ndarray:
    """``sum_s ring[samples, s] * weights[s]`` over ``slots`` in order, shape (n, C).

    ``ring`` (N, W, C), ``weights`` (W, C). Bitwise what the NumPy loop over the
    slots gives, in one pass over the samples' ring rows.
    """
    return _compiled().weighted_slot_sums(
        ring, np.ascontiguousarray(samples, dtype=np.int64),
        np.ascontiguousarray(slots, dtype=np.int64), np.ascontiguousarray(weights))


def slot_change_sums(ring: np.ndarray, samples: np.ndarray, columns: np.ndarray,
                     change: np.ndarray) -> np.ndarray:
    """``sum_j ring[samples[j], columns[k]] * change[j]`` per column, shape (len(columns), C).

    ``ring`` (N, P, C), ``change`` (n, C): one pass over the samples' ring rows for all
    the columns, where a NumPy loop over the columns gathers and multiplies per column.
    """
    return _compiled().slot_change_sums(
        ring, np.ascontiguousarray(samples, dtype=np.int64),
        np.ascontiguousarray(columns, dtype=np.int64), np.ascontiguousarray(change, dtype=float))


def stale_rows_from_log(blocks, samples, rounds, updated_at, missed_after) -> np.ndarray:
    """Ascending distinct holder rows of live log entries that their holder missed.

    An entry ``(samples[e], rounds[e])`` is live if ``updated_at`` of its sample
    equals its round; its holder row ``r`` of client ``k`` missed it if
    ``rounds[e] > missed_after[k]``. Returns int64 rows, shape (S,).
    """
    return _compiled().stale_rows_from_log(
        samples, rounds, updated_at, blocks.sample_rowptr,
        blocks.sample_rows, blocks.client_rowptr, client_table(blocks.client_rowptr), missed_after,
    )


def rows_updated_after(blocks, clients: np.ndarray, after: np.ndarray,
                       updated_at: np.ndarray) -> np.ndarray:
    """Ascending rows ``r`` of the given clients whose sample was updated after the round
    given for the client: ``updated_at[row_sample[r]] > after[a]`` for the rows of
    ``clients[a]``, int64 shape (S,).

    The clients' runs of rows are read in place (no array over all their rows: a
    newcomer's every row on Covtype is 48,000, a round's a few million).
    """
    rowptr = blocks.client_rowptr
    clients = np.asarray(clients, dtype=np.int64)
    return _compiled().rows_updated_after(
        rowptr[clients], rowptr[clients + 1], np.asarray(after, dtype=np.int64),
        blocks.row_sample, np.asarray(updated_at, dtype=np.int64))


def client_nonzeros(blocks, rows: np.ndarray) -> np.ndarray:
    """Stored entries of the given rows summed per client, float64 shape (K,)."""
    return _compiled().client_nonzeros(
        blocks.X.indptr, blocks.client_rowptr, client_table(blocks.client_rowptr),
        np.ascontiguousarray(rows), blocks.n_clients,
    )


def distinct(values: np.ndarray) -> np.ndarray:
    """Ascending distinct values of an int array (one compiled call), shape (n',).

    Same values and dtype as ``np.unique``, which in NumPy 2.4 costs about a
    microsecond per value (a hash table, 30x a sort) on large arrays and half a
    dozen calls on the few hundred draws of a one-step round.
    """
    return _compiled().distinct(np.ascontiguousarray(values))


def distinct_in_runs(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                     bound: int) -> np.ndarray:
    """:func:`distinct` of ``values[starts[a]:starts[a] + sizes[a]]`` over every a, joined.

    ``values`` ints in ``0..bound-1`` (sample ids); the runs are read in place, so the
    joined array (a round's rows of every active client: 6 million on Covtype) is never
    built.
    """
    return _compiled().distinct_in_runs(np.ascontiguousarray(values),
                                        np.asarray(starts, dtype=np.int64),
                                        np.asarray(sizes, dtype=np.int64), int(bound))


def positions_in(distinct_values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``np.searchsorted(distinct_values, queries)`` for queries that all occur there.

    ``distinct_values`` ascending and distinct (sample ids). Where the ids are dense
    (a round's samples among N), a lookup table over their range is built and read:
    one gather instead of a binary search per query (33 ms of a cocoa round on
    ijcnn1 12x12, for 300,000 draws).
    """
    distinct_values = np.asarray(distinct_values)
    queries = np.asarray(queries)
    if distinct_values.size == 0 or queries.size == 0:
        return np.searchsorted(distinct_values, queries)
    lo, hi = int(distinct_values[0]), int(distinct_values[-1])
    if hi - lo >= 4 * (distinct_values.size + queries.size):  # sparse: search
        return np.searchsorted(distinct_values, queries)
    # One compiled pass, int32 positions (a full pass on Covtype asks for 6.3 million:
    # the intp gather and its shifted copy of the queries were 76 MB).
    index = np.int32 if distinct_values.size < 2**31 else np.int64
    return _compiled().positions_by_table(np.ascontiguousarray(distinct_values),
                                          np.ascontiguousarray(queries), lo, hi,
                                          np.empty(0, dtype=index))


def group_order(keys: np.ndarray, n_groups: int,
                through: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Indices of ``keys`` by key, ascending within each key (a stable counting sort).

    With ``through`` (int, shape (n',)), the keys are ``keys[through]``, not gathered.

    ``order[bounds[g]:bounds[g + 1]]`` is ``np.flatnonzero(keys == g)`` for every
    ``g`` in ``0..n_groups-1``: one pass instead of one comparison of the whole
    array per group (12 passes over 6 million rows a Covtype round). Negative keys
    (no group) are left out.

    Returns
    -------
    order : ndarray of int32, shape (n',)
    bounds : ndarray of int64, shape (n_groups + 1,)
    """
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    through = (np.arange(keys.size, dtype=np.int32) if through is None
               else np.ascontiguousarray(through, dtype=np.int32))
    return _compiled().group_order(keys, through, int(n_groups))


def sum_by_slot(values: np.ndarray, slot: np.ndarray, n_slots: int) -> np.ndarray:
    """``out[slot[j]] += values[j]`` in order of ``j``, shape (n_slots, C).

    Bitwise equal to ``np.add.at(np.zeros((n_slots, C)), slot, values)``,
    which costs about 100 us for a thousand rows of one column.
    """
    return _compiled().sum_by_slot(
        np.ascontiguousarray(values, dtype=np.float64), np.ascontiguousarray(slot), int(n_slots)
    )


def refresh_copies(rows, row_sample, alpha, alpha_local):
    """Bring the dual copies of ``rows`` to the server's duals, in place.

    Parameters
    ----------
    rows : ndarray of int, shape (S,)
        Ascending distinct stacked rows.
    row_sample : ndarray of int, shape (R,)
    alpha : ndarray, shape (N, C)
    alpha_local : ndarray, shape (R, C)
        Updated in place: ``alpha_local[r] += alpha[row_sample[r]] - alpha_local[r]``
        for the rows whose difference is not all zero.

    Returns
    -------
    moved : ndarray of bool, shape (S,)
        Rows whose difference was not all zero (the updated ones).
    change : ndarray, shape (S, C)
        The difference of each row (before the update).
    inexact : ndarray of bool, shape (S,)
        Updated rows whose copy still differs from the dual (rounding).
    """
    return _compiled().refresh_copies(np.ascontiguousarray(rows), row_sample, alpha, alpha_local)


_TABLES: dict[int, tuple[weakref.ref, np.ndarray]] = {}


def client_table(client_rowptr: np.ndarray) -> np.ndarray:
    """Client of the first row of every bucket of ``2**BUCKET_SHIFT`` stacked rows.

    The kernels find a row's client from its bucket's entry and a step or
    two along ``client_rowptr`` (a binary search per row cost about 40 ns,
    most of the stale-row search). The table (R / 4096 entries) is built once
    per stacked matrix and kept while ``client_rowptr`` lives.
    """
    key = id(client_rowptr)
    hit = _TABLES.get(key)
    if hit is not None and hit[0]() is client_rowptr:
        return hit[1]
    for stale in [k for k, (ref, _) in _TABLES.items() if ref() is None]:
        del _TABLES[stale]
    shift = _compiled().BUCKET_SHIFT
    starts = np.arange(0, int(client_rowptr[-1]) + 1, 1 << shift, dtype=np.int64)
    table = np.searchsorted(client_rowptr, starts, side="right").astype(np.int64) - 1
    _TABLES[key] = (weakref.ref(client_rowptr), table)
    return table
