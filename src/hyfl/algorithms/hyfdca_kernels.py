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

Compiled with ``cache=True`` (as :mod:`hyfl.algorithms.hyfdca_local`), so
only the first use on a machine pays Numba's compile time.
"""

from __future__ import annotations

import functools
import weakref

import numpy as np

# Rows per bucket of the row -> client table (see :func:`client_table`).
_BUCKET_SHIFT = 12


@functools.cache
def _kernels():
    """Compile (or load from Numba's cache) the kernels of this module."""
    import numba as nb

    njit = functools.partial(nb.njit, cache=True, nogil=True)

    @njit
    def client_of(client_rowptr, table, row):
        # np.searchsorted(client_rowptr, row, side="right") - 1: start at the
        # client of the bucket's first row and step past the ends <= row.
        k = table[row >> _BUCKET_SHIFT]
        while client_rowptr[k + 1] <= row:
            k += 1
        return k

    @njit
    def holder_rows(samples, sample_rowptr, sample_rows, client_rowptr, table):
        # |B_s| is read as sample_rowptr[s + 1] - sample_rowptr[s] (the same cache
        # line; the stacked arrays are far larger than the caches).
        total = 0
        for s in samples:
            total += sample_rowptr[s + 1] - sample_rowptr[s]
        rows = np.empty(total, dtype=np.int64)
        slot = np.empty(total, dtype=np.int64)
        clients = np.empty(total, dtype=np.int64)
        n = 0
        for j in range(samples.size):
            s = samples[j]
            for h in range(sample_rowptr[s], sample_rowptr[s + 1]):
                row = sample_rows[h]
                rows[n] = row
                slot[n] = j
                clients[n] = client_of(client_rowptr, table, row)
                n += 1
        return rows, slot, clients

    @njit
    def gather_inner_products(indptr, indices, data, rows, versions, store, n_features):
        n, C = rows.size, store.shape[1]
        parts = np.zeros((n, C))
        sq = np.zeros(n)
        for j in range(n):
            row = rows[j]
            base = versions[j] * n_features
            norm = 0.0
            for e in range(indptr[row], indptr[row + 1]):
                a = data[e]
                col = base + indices[e]
                for c in range(C):
                    parts[j, c] += a * store[col, c]
                norm += a * a
            sq[j] = norm
        return parts, sq

    @njit
    def rows_transpose_product(indptr, indices, data, rows, values, n_features):
        C = values.shape[1]
        out = np.zeros((n_features, C))
        for j in range(rows.size):
            row = rows[j]
            for e in range(indptr[row], indptr[row + 1]):
                a = data[e]
                col = indices[e]
                for c in range(C):
                    out[col, c] += a * values[j, c]
        return out

    @njit
    def distinct(values):
        # np.unique of an int array: ascending distinct values (no sort when they
        # already are: the draws of a full pass over one client often are).
        ascending = True
        for j in range(1, values.size):
            if values[j] <= values[j - 1]:
                ascending = False
                break
        if ascending:
            return values.copy()
        lo, hi = values.min(), values.max()
        if hi - lo < 4 * values.size + 1024:  # dense (ids of a round's draws): mark, no sort
            seen = np.zeros(hi - lo + 1, dtype=np.bool_)
            for j in range(values.size):
                seen[values[j] - lo] = True
            out = np.empty(values.size, dtype=values.dtype)
            n = 0
            for v in range(seen.size):
                if seen[v]:
                    out[n] = v + lo
                    n += 1
            return out[:n].copy()
        out = np.sort(values)
        n = 0
        for j in range(out.size):
            if n == 0 or out[j] != out[n - 1]:
                out[n] = out[j]
                n += 1
        return out[:n]

    @njit
    def stale_rows_from_log(samples, rounds, updated_at, sample_rowptr, sample_rows,
                            client_rowptr, table, missed_after):
        total = 0
        for e in range(samples.size):
            s = samples[e]
            if updated_at[s] == rounds[e]:
                total += sample_rowptr[s + 1] - sample_rowptr[s]
        out = np.empty(total, dtype=np.int64)
        n = 0
        for e in range(samples.size):
            s, r = samples[e], rounds[e]
            if updated_at[s] != r:  # superseded: a later entry logs the sample's last change
                continue
            for h in range(sample_rowptr[s], sample_rowptr[s + 1]):
                row = sample_rows[h]
                if r > missed_after[client_of(client_rowptr, table, row)]:
                    out[n] = row
                    n += 1
        return distinct(out[:n])

    @njit
    def client_nonzeros(indptr, client_rowptr, table, rows, n_clients):
        work = np.zeros(n_clients)
        for row in rows:
            work[client_of(client_rowptr, table, row)] += indptr[row + 1] - indptr[row]
        return work

    @njit
    def sum_by_slot(values, slot, n_slots):
        # np.add.at(zeros, slot, values): the values in order, added into their slot.
        out = np.zeros((n_slots, values.shape[1]))
        for j in range(slot.size):
            for c in range(values.shape[1]):
                out[slot[j], c] += values[j, c]
        return out

    @njit
    def refresh_copies(rows, row_sample, alpha, alpha_local):
        # For ascending distinct rows: change = alpha[sample] - copy; the rows
        # whose change is not all zero get copy += change; those then still
        # unequal to alpha are reported too (see server_refresh_newcomers).
        C = alpha.shape[1]
        moved = np.zeros(rows.size, dtype=np.bool_)
        inexact = np.zeros(rows.size, dtype=np.bool_)
        change = np.empty((rows.size, C))
        for j in range(rows.size):
            r, i = rows[j], row_sample[rows[j]]
            for c in range(C):
                change[j, c] = alpha[i, c] - alpha_local[r, c]
                if change[j, c] != 0.0:
                    moved[j] = True
            if moved[j]:
                for c in range(C):
                    alpha_local[r, c] += change[j, c]
                    if alpha_local[r, c] != alpha[i, c]:
                        inexact[j] = True
        return moved, change, inexact

    return {
        "distinct": distinct,
        "sum_by_slot": sum_by_slot,
        "refresh_copies": refresh_copies,
        "holder_rows": holder_rows,
        "gather_inner_products": gather_inner_products,
        "rows_transpose_product": rows_transpose_product,
        "stale_rows_from_log": stale_rows_from_log,
        "client_nonzeros": client_nonzeros,
    }


def holder_rows(blocks, samples: np.ndarray):
    """All stacked rows holding the given samples, with each row's sample slot and client.

    Parameters
    ----------
    blocks : hyfl.partition.StackedBlocks
    samples : ndarray of int, shape (n,)

    Returns
    -------
    rows, slot, clients : ndarray of int64, shape (h,) each
        Sample by sample, the holders' rows in ``sample_rows`` order; ``slot``
        is the position in ``samples``, ``clients`` the client of each row.
    """
    return _kernels()["holder_rows"](
        np.ascontiguousarray(samples), blocks.sample_rowptr,
        blocks.sample_rows, blocks.client_rowptr, client_table(blocks.client_rowptr),
    )


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
        the row norms of :func:`hyfl.algorithms.hyfdca._row_squared_norms`.
    """
    V, M, C = store.shape
    return _kernels()["gather_inner_products"](
        X.indptr, X.indices, X.data, np.ascontiguousarray(rows),
        np.ascontiguousarray(versions), store.reshape(V * M, C), M,
    )


def rows_transpose_product(X, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``X[rows].T @ values``, shape (M, C), without building ``X[rows]``.

    ``values`` has shape (n, C), one row per entry of ``rows``.
    """
    return _kernels()["rows_transpose_product"](
        X.indptr, X.indices, X.data, np.ascontiguousarray(rows),
        np.ascontiguousarray(values, dtype=np.float64), X.shape[1],
    )


def stale_rows_from_log(blocks, samples, rounds, updated_at, missed_after) -> np.ndarray:
    """Ascending distinct holder rows of live log entries that their holder missed.

    An entry ``(samples[e], rounds[e])`` is live if ``updated_at`` of its sample
    equals its round; its holder row ``r`` of client ``k`` missed it if
    ``rounds[e] > missed_after[k]``. Returns int64 rows, shape (S,).
    """
    return _kernels()["stale_rows_from_log"](
        samples, rounds, updated_at, blocks.sample_rowptr,
        blocks.sample_rows, blocks.client_rowptr, client_table(blocks.client_rowptr), missed_after,
    )


def client_nonzeros(blocks, rows: np.ndarray) -> np.ndarray:
    """Stored entries of the given rows summed per client, float64 shape (K,)."""
    return _kernels()["client_nonzeros"](
        blocks.X.indptr, blocks.client_rowptr, client_table(blocks.client_rowptr),
        np.ascontiguousarray(rows), blocks.n_clients,
    )


def distinct(values: np.ndarray) -> np.ndarray:
    """Ascending distinct values of an int array (one compiled call), shape (n',).

    Same values and dtype as ``np.unique``, which in NumPy 2.4 costs about a
    microsecond per value (a hash table, 30x a sort) on large arrays and half a
    dozen calls on the few hundred draws of a one-step round.
    """
    return _kernels()["distinct"](np.ascontiguousarray(values))


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
    table = np.empty(hi - lo + 1, dtype=np.intp)
    table[distinct_values - lo] = np.arange(distinct_values.size)
    return table[queries - lo]


def sum_by_slot(values: np.ndarray, slot: np.ndarray, n_slots: int) -> np.ndarray:
    """``out[slot[j]] += values[j]`` in order of ``j``, shape (n_slots, C).

    Bitwise equal to ``np.add.at(np.zeros((n_slots, C)), slot, values)``,
    which costs about 100 us for a thousand rows of one column.
    """
    return _kernels()["sum_by_slot"](
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
    return _kernels()["refresh_copies"](np.ascontiguousarray(rows), row_sample, alpha, alpha_local)


_TABLES: dict[int, tuple[weakref.ref, np.ndarray]] = {}


def client_table(client_rowptr: np.ndarray) -> np.ndarray:
    """Client of the first row of every bucket of ``2**_BUCKET_SHIFT`` stacked rows.

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
    starts = np.arange(0, int(client_rowptr[-1]) + 1, 1 << _BUCKET_SHIFT, dtype=np.int64)
    table = np.searchsorted(client_rowptr, starts, side="right").astype(np.int64) - 1
    _TABLES[key] = (weakref.ref(client_rowptr), table)
    return table
