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

import numpy as np


@functools.cache
def _kernels():
    """Compile (or load from Numba's cache) the kernels of this module."""
    import numba as nb

    njit = functools.partial(nb.njit, cache=True, nogil=True)

    @njit
    def client_of(client_rowptr, row):
        # np.searchsorted(client_rowptr, row, side="right") - 1
        lo, hi = 0, client_rowptr.size
        while lo < hi:
            mid = (lo + hi) // 2
            if client_rowptr[mid] <= row:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    @njit
    def holder_rows(samples, sample_rowptr, n_holders, sample_rows, client_rowptr):
        total = 0
        for s in samples:
            total += n_holders[s]
        rows = np.empty(total, dtype=np.int64)
        slot = np.empty(total, dtype=np.int64)
        clients = np.empty(total, dtype=np.int64)
        n = 0
        for j in range(samples.size):
            s = samples[j]
            start = sample_rowptr[s]
            for h in range(n_holders[s]):
                row = sample_rows[start + h]
                rows[n] = row
                slot[n] = j
                clients[n] = client_of(client_rowptr, row)
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
    def stale_rows_from_log(samples, rounds, updated_at, sample_rowptr, n_holders, sample_rows,
                            client_rowptr, missed_after):
        total = 0
        for e in range(samples.size):
            if updated_at[samples[e]] == rounds[e]:
                total += n_holders[samples[e]]
        out = np.empty(total, dtype=np.int64)
        n = 0
        for e in range(samples.size):
            s, r = samples[e], rounds[e]
            if updated_at[s] != r:  # superseded: a later entry logs the sample's last change
                continue
            start = sample_rowptr[s]
            for h in range(n_holders[s]):
                row = sample_rows[start + h]
                if r > missed_after[client_of(client_rowptr, row)]:
                    out[n] = row
                    n += 1
        out = np.sort(out[:n])
        if n == 0:
            return out
        keep = np.empty(n, dtype=np.bool_)
        keep[0] = True
        for j in range(1, n):
            keep[j] = out[j] != out[j - 1]
        return out[keep]

    @njit
    def client_nonzeros(indptr, client_rowptr, rows, n_clients):
        work = np.zeros(n_clients)
        for row in rows:
            work[client_of(client_rowptr, row)] += indptr[row + 1] - indptr[row]
        return work

    return {
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
        np.ascontiguousarray(samples), blocks.sample_rowptr, blocks.n_holders,
        blocks.sample_rows, blocks.client_rowptr,
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
        :meth:`hyfl.algorithms.hyfdca.WeightSnapshots.inner_products`) and to
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
        samples, rounds, updated_at, blocks.sample_rowptr, blocks.n_holders,
        blocks.sample_rows, blocks.client_rowptr, missed_after,
    )


def client_nonzeros(blocks, rows: np.ndarray) -> np.ndarray:
    """Stored entries of the given rows summed per client, float64 shape (K,)."""
    return _kernels()["client_nonzeros"](
        blocks.X.indptr, blocks.client_rowptr, np.ascontiguousarray(rows), blocks.n_clients
    )
