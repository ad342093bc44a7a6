"""HyFDCA's compiled kernels (Numba), cached on disk across processes.

The Python wrappers that validate and prepare their arguments are
:mod:`hyfl.algorithms.hyfdca_kernels` (gathers over the stacked rows) and
:func:`hyfl.algorithms.hyfdca_local.solve_subproblems` (the cocoa rule's local
solver); they import this module on first use, so importing hyfl does not import
Numba.

Every kernel is a module-level function compiled with ``cache=True``: a kernel
defined in a closure, or one that takes another compiled function as an argument,
gets a new cache key in every process (Numba keys a closure by its pickled cells,
and a dispatcher pickles with a per-process id), and was compiled again by every
process: 3-4 s at the start of every run. The loss's step is chosen by the *type*
of a small bundle of its constants (:class:`HingeStep`, ...; :func:`dual_step`),
which the cache keys by the bundle's class.
"""

from __future__ import annotations

from typing import NamedTuple

import numba as nb
import numpy as np
from numba.extending import overload

njit = nb.njit(cache=True, nogil=True)

# Rows per bucket of the row -> client table (see hyfdca_kernels.client_table).
BUCKET_SHIFT = 12


# ---------------------------------------------------------------------------
# The losses' scalar dual steps: the maximizer of -l*(-(a+d)) - m d - q d^2 / 2
# (the same formulas as hyfl.losses, one sample at a time)
# ---------------------------------------------------------------------------


class HingeStep(NamedTuple):
    pass


class SmoothedHingeStep(NamedTuple):
    smoothing: float


class SquaredStep(NamedTuple):
    pass


class LogisticStep(NamedTuple):
    iterations: int
    tolerance: float


@njit
def hinge_step(a, m, q, y):
    s = y * a + (1.0 - y * m) / q
    s = min(max(s, 0.0), 1.0)
    return y * s - a


@njit
def smoothed_hinge_step(a, m, q, y, smoothing):
    s = (1.0 - y * m + q * y * a) / (smoothing + q)
    s = min(max(s, 0.0), 1.0)
    return y * s - a


@njit
def squared_step(a, m, q, y):
    return (y - m - a) / (1.0 + q)


@njit
def logistic_step(a, m, q, y, iterations, tolerance):
    # Same bracketed Newton method as hyfl.losses.Logistic.dual_step on
    # t = logit(s): g(t) = t + y m + q (sigmoid(t) - s0) = 0.
    s0 = y * a
    ym = y * m
    lo = -ym - q * (1.0 - s0)
    hi = -ym + q * s0
    if s0 <= 0.0:
        t_stay = lo
    elif s0 >= 1.0:
        t_stay = hi
    else:
        t_stay = min(max(np.log(s0) - np.log1p(-s0), lo), hi)
    t_free = min(max(-ym, lo), hi)
    g_stay = t_stay + ym + q * (1.0 / (1.0 + np.exp(-t_stay)) - s0)
    g_free = t_free + ym + q * (1.0 / (1.0 + np.exp(-t_free)) - s0)
    t = t_stay if abs(g_stay) < abs(g_free) else t_free
    for _ in range(iterations):
        s = 1.0 / (1.0 + np.exp(-t))
        g = t + ym + q * (s - s0)
        if g < 0:
            lo = t
        if g > 0:
            hi = t
        t_new = t - g / (1.0 + q * s * (1.0 - s))
        if t_new <= lo or t_new >= hi:
            t_new = 0.5 * (lo + hi)
        done = abs(t_new - t) <= tolerance * (1.0 + abs(t))
        t = t_new
        if done:
            break
    return y / (1.0 + np.exp(-t)) - a


def dual_step(loss, a, m, q, y):
    """The dual step of the loss whose constants ``loss`` bundles (compiled code only)."""
    raise NotImplementedError("dual_step is called from compiled kernels")


@overload(dual_step, jit_options={"cache": True})
def _dual_step(loss, a, m, q, y):
    kind = getattr(loss, "instance_class", None)
    if kind is HingeStep:
        return lambda loss, a, m, q, y: hinge_step(a, m, q, y)
    if kind is SmoothedHingeStep:
        return lambda loss, a, m, q, y: smoothed_hinge_step(a, m, q, y, loss.smoothing)
    if kind is SquaredStep:
        return lambda loss, a, m, q, y: squared_step(a, m, q, y)
    if kind is LogisticStep:
        return lambda loss, a, m, q, y: logistic_step(a, m, q, y, loss.iterations,
                                                      loss.tolerance)
    return None


# ---------------------------------------------------------------------------
# The cocoa rule's local solver (see hyfl.algorithms.hyfdca_local.solve_subproblems)
# ---------------------------------------------------------------------------


class Draws(NamedTuple):
    """The drawn rows, client after client, and their samples' values."""

    segments: np.ndarray  # (A + 1,) client a's rows are segments[a]:segments[a + 1]
    row_sample: np.ndarray  # (n,) sample of each drawn row
    rows: np.ndarray  # (n,) its row of the CSR matrix
    alpha: np.ndarray  # (N,) duals of output c
    y: np.ndarray  # (N,) labels of output c
    weight: np.ndarray  # (N,) sample weights (hyfl.losses: c * step(a / c, m, c q))
    sq_norms: np.ndarray  # (N,) ||x_i||^2
    # (n,) per client, its draws in the order their coordinates are computed (offsets
    # from segments[a]): with ascending samples the ring is read forward, which on a
    # full pass in a random order halves the gather's time; any order gives the same.
    ascending: np.ndarray


class Csr(NamedTuple):
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray


class Span(NamedTuple):
    """Each client's model of its data: directions, their coordinates and basis."""

    ring: np.ndarray  # (N, W, C) remembered inner products
    pairs: np.ndarray  # (A, R, 2) each client's directions as slot pairs
    transforms: np.ndarray  # (A, R, K) T of output c (its columns some client keeps)
    feature_ptr: np.ndarray  # (A + 1,) client a's own features
    features: np.ndarray  # its columns of the CSR matrix
    basis: np.ndarray  # (len(features), K) orthonormal basis Q on them
    basis_grams: np.ndarray  # (A, K, K) Q^T Q per client
    offset_weights: np.ndarray  # (A, R) h of output c: a row's margin offset is m . h
    inverse: np.ndarray  # (M,) scratch, -1 filled


@nb.njit(cache=True, nogil=True, fastmath=True)
def direction_products(ring, pairs, row_sample, c, m, margins):
    # m[j, r]: the inner product of row j's sample with the client's direction r, a
    # difference of two remembered inner products (pairs[r] = (slot, earlier slot), -1
    # where absent); the rows' coordinates in the span are then m T (one product).
    # margins[j]: its remembered margin x_i^T w of this round (slot pairs[0, 0]).
    R = pairs.shape[0]
    now = pairs[0, 0]
    for j in range(row_sample.size):
        i = row_sample[j]
        margins[j] = ring[i, now, c]
        for r in range(R):
            p, b = pairs[r, 0], pairs[r, 1]
            if p < 0:
                m[j, r] = 0.0
            elif b < 0:
                m[j, r] = ring[i, p, c]
            else:
                m[j, r] = ring[i, p, c] - ring[i, b, c]


# The columns of solve's per-row record: what a row's steps read, side by side (one
# cache line a row instead of one per array when the pass visits rows out of order).
BASE, ALPHA, LABEL, WEIGHT, REST, CURVATURE = 0, 1, 2, 3, 4, 5
# Rows of a client whose span coordinates are computed at a time (their m, 256 x R
# numbers, stay in the core's cache between the gather and the products).
BLOCK_ROWS = 256


@njit
def client_passes(step, delta, passes, coef, phi, residual, E, U, record, position,
                  rows, csr, inverse, f_own, dense):
    # One client's sequential dual steps over its rows in the draw order, ``passes``
    # times, adding each step to delta (draw order). The per-row arrays -- the model
    # (residual with dense own features, else E, U and the data rows) and the record --
    # are in ascending sample order; the draw's row j is at position[j] there.
    indptr, indices, data = csr
    R = phi.shape[1]
    S = np.zeros(R)  # sum d phi
    V = np.zeros(R)  # sum d u, u = Q_own^T x_own (the expanded form)
    Sx = np.zeros(f_own)  # sum d r (dense), or sum d x_own
    for _ in range(passes):
        for j in range(delta.size):
            t = position[j]
            ps = 0.0
            for col in range(R):
                ps += phi[t, col] * S[col]
            own = 0.0
            if dense:
                for f in range(f_own):
                    own += residual[t, f] * Sx[f]
            else:
                row = rows[t]
                for k in range(indptr[row], indptr[row + 1]):
                    own += data[k] * Sx[inverse[indices[k]]]
                for col in range(R):
                    own += E[t, col] * S[col] - phi[t, col] * V[col]
            margin = record[t, BASE] + coef * (ps + own + record[t, REST] * delta[j])
            c_i = record[t, WEIGHT]
            d = c_i * dual_step(step, (record[t, ALPHA] + delta[j]) / c_i, margin,
                                record[t, CURVATURE] * c_i, record[t, LABEL])
            if d != 0.0:
                delta[j] += d
                for col in range(R):
                    S[col] += d * phi[t, col]
                if dense:
                    for f in range(f_own):
                        Sx[f] += d * residual[t, f]
                else:
                    for col in range(R):
                        V[col] += d * U[t, col]
                    row = rows[t]
                    for k in range(indptr[row], indptr[row + 1]):
                        Sx[inverse[indices[k]]] += d * data[k]


@njit
def solve(step, draws, csr, span, c, coef, passes, dense_most, delta):
    # Per client a: rows seg[a]:seg[a + 1] (sample row_sample[j], data row rows[j] of
    # the CSR arrays); its directions pairs[a] into the ring of inner products (the
    # current round's slot first) and transforms[a] = T give the rows' coordinates
    # phi in the span, computed client by client (an (n, R) array for all draws
    # would be 20x the data on Covtype); basis[feature_ptr[a]:feature_ptr[a + 1]] is
    # the span's orthonormal basis Q on the client's own features and
    # basis_grams[a] = Q^T Q there. inverse (M,) is scratch, -1 filled. offset moves a
    # row's remembered margin to the server's w (hyfl.algorithms.hyfdca_groups).
    seg, row_sample, rows, alpha, Y, W, sq_norms, ascending = draws
    indptr, indices, data = csr
    ring, pairs, transforms, feature_ptr, features, basis, basis_grams, h, inverse = span
    # The model: <x_i, x_j> ~ phi_i.phi_j + r_i.r_j (own features) + diagonal rest.
    # R directions (the margins m a row gathers), K coordinates of the span (phi = m T;
    # K <= R: the directions' Gram drops its negligible eigenvalues, hyfl's
    # solve_subproblems passes only the columns of T some client keeps).
    R, K = pairs.shape[1], transforms.shape[2]
    # delta (one per drawn row): the rows' dual changes, written in place (the caller's
    # column of the proposals: a full pass on Covtype draws 6.3 million rows, 50 MB a copy).
    delta[:] = 0.0
    # Scratch for the largest client, reused by every client: arrays of a client's rows
    # allocated afresh cost a page fault per 4 KB (a million a solve on Covtype, a third
    # of its time).
    most_rows, dense_features, sparse = 0, 0, False
    for a in range(seg.size - 1):
        most_rows = max(most_rows, seg[a + 1] - seg[a])
        f_own = feature_ptr[a + 1] - feature_ptr[a]
        if f_own <= dense_most:
            dense_features = max(dense_features, f_own)
        else:
            sparse = True
    m_s = np.empty((min(most_rows, BLOCK_ROWS), R))
    phi_s = np.empty((most_rows, K))
    residual_s = np.empty(most_rows * dense_features)  # flat: (n_a, f_own) views
    wide = most_rows if sparse else 0
    psi_s = np.empty((wide, K))
    U_s = np.empty((wide, K))
    E_s = np.empty((wide, K))
    rows_s = np.empty((2, most_rows))  # margins, offsets
    record_s = np.empty((most_rows, 6))  # see BASE ... CURVATURE
    position_s = np.empty(most_rows, dtype=np.int64)
    QT = np.empty(K * dense_features)
    for a in range(seg.size - 1):
        lo, hi = seg[a], seg[a + 1]
        f0, f1 = feature_ptr[a], feature_ptr[a + 1]
        for f in range(f0, f1):
            inverse[features[f]] = f - f0
        Q = basis[f0:f1]
        G = basis_grams[a]
        order = ascending[lo:hi]
        n_a = hi - lo
        f_own = f1 - f0
        # Everything a row's steps need is computed in ascending sample order -- the
        # ring and the arrays over N then read forward (~2x faster on Covtype than in
        # the draw order) and no (n, R) array is moved into another order (a scatter
        # that took 40% of a Covtype solve); only the pass visits the rows in the
        # draw order, through position.
        # phi = m T: the rows' coordinates in the span; base: a row's margin at the
        # round's start moved to the server's w by m . h
        # (hyfl.algorithms.hyfdca_groups.offset_weights; h = 0 without sample groups).
        samples_up = row_sample[lo:hi][order]
        rows_up = rows[lo:hi][order]
        position = position_s[:n_a]
        for t in range(n_a):
            position[order[t]] = t
        # In blocks of rows, so that m is still in the cache when the products read it
        # (one (n, R) pass through memory fewer: 0.4 s a solve on Covtype).
        margins = rows_s[0, :n_a]
        offsets = rows_s[1, :n_a]
        phi = phi_s[:n_a]
        for b0 in range(0, n_a, BLOCK_ROWS):
            b1 = min(b0 + BLOCK_ROWS, n_a)
            m = m_s[:b1 - b0]
            direction_products(ring, pairs[a], samples_up[b0:b1], c, m, margins[b0:b1])
            np.dot(m, transforms[a], phi[b0:b1])
            np.dot(m, h[a], offsets[b0:b1])
        # The own features' part of a row's inner product with the round's move so far
        # is r_j . sum_k d_k r_k, with r = x_own - Q phi the row's residual there. With
        # at most dense_most own features (the history's depth; the grids' usual case,
        # see hyfl.algorithms.hyfdca_local._solve_clients) r is kept densely
        # (f_own numbers a row, from one product Q phi); with more (sparse rows over
        # many features) it is expanded as x.Sx + (G phi - u).S - phi.V with u = Q^T
        # x_own, V = sum d u and Sx = sum d x_own, K numbers a row.
        dense = f_own <= dense_most
        width = f_own if dense else 0
        residual = residual_s[:n_a * width].reshape((n_a, width))
        if dense:
            qt = QT[:K * f_own].reshape((K, f_own))
            qt[:] = Q.T
            np.dot(phi, qt, residual)  # Q phi, then x_own - Q phi
            for t in range(n_a):
                for f in range(f_own):
                    residual[t, f] = -residual[t, f]
                row = rows_up[t]
                for k in range(indptr[row], indptr[row + 1]):
                    residual[t, inverse[indices[k]]] += data[k]
        # What a row's steps need and no step changes, once per round rather than per
        # pass: its margin, dual, label and weight, its model's part on the own
        # features, the diagonal rest of the model and the step's curvature q.
        record = record_s[:n_a]
        tall = 0 if dense else n_a
        psi = psi_s[:tall]
        U = U_s[:tall]
        E = E_s[:tall]
        if not dense:
            np.dot(phi, G, psi)
            U[:] = 0.0
        for t in range(n_a):
            i = samples_up[t]
            record[t, BASE] = margins[t] + offsets[t]
            record[t, ALPHA] = alpha[i]
            record[t, LABEL] = Y[i]
            record[t, WEIGHT] = W[i]
            pn = 0.0
            for col in range(K):
                pn += phi[t, col] * phi[t, col]
            own_sq = 0.0
            if dense:
                for f in range(f_own):
                    own_sq += residual[t, f] * residual[t, f]
            else:
                row = rows_up[t]
                for k in range(indptr[row], indptr[row + 1]):
                    f = inverse[indices[k]]
                    v = data[k]
                    own_sq += v * v
                    for col in range(K):
                        U[t, col] += v * Q[f, col]
                for col in range(K):
                    p = phi[t, col]
                    own_sq += p * psi[t, col] - 2.0 * U[t, col] * p
                    E[t, col] = psi[t, col] - U[t, col]
            resid = max(sq_norms[i] - pn, 0.0)
            record[t, REST] = resid - min(max(own_sq, 0.0), resid)
            record[t, CURVATURE] = max(coef * (pn + resid), 1e-300)
        client_passes(step, delta[lo:hi], passes[a], coef, phi, residual, E, U, record,
                      position, rows_up, csr, inverse, f_own, dense)
        for f in range(f0, f1):
            inverse[features[f]] = -1
    return delta


# ---------------------------------------------------------------------------
# Gathers over the stacked rows (see hyfl.algorithms.hyfdca_kernels)
# ---------------------------------------------------------------------------


@njit
def client_of(client_rowptr, table, row):
    # np.searchsorted(client_rowptr, row, side="right") - 1: start at the
    # client of the bucket's first row and step past the ends <= row.
    k = table[row >> BUCKET_SHIFT]
    while client_rowptr[k + 1] <= row:
        k += 1
    return k


@njit
def holder_rows(samples, sample_rowptr, sample_rows, client_rowptr, table, keep):
    # |B_s| is read as sample_rowptr[s + 1] - sample_rowptr[s] (the same cache
    # line; the stacked arrays are far larger than the caches). Rows of clients
    # with keep False are left out.
    every = True
    for k in range(keep.size):
        every = every and keep[k]
    total = 0
    for s in samples:
        total += sample_rowptr[s + 1] - sample_rowptr[s]
    # int32, as the blocks' row indices (hyfl.partition): the updated samples' holders
    # are six million rows a Covtype round
    rows = np.empty(total, dtype=np.int32)
    slot = np.empty(total, dtype=np.int32)
    clients = np.empty(total, dtype=np.int32)
    n = 0
    for j in range(samples.size):
        s = samples[j]
        for h in range(sample_rowptr[s], sample_rowptr[s + 1]):
            row = sample_rows[h]
            k = client_of(client_rowptr, table, row)
            if every or keep[k]:
                rows[n] = row
                slot[n] = j
                clients[n] = k
                n += 1
    if n < total:  # copies, so that the unused tails are freed
        return rows[:n].copy(), slot[:n].copy(), clients[:n].copy()
    return rows, slot, clients


@njit
def sample_inner_products(samples, sample_rowptr, sample_rows, client_rowptr, table, active,
                          indptr, indices, data, versions, store, n_features):
    # Per sample j: z[j] = the sum over its holders (in sample_rows order) of the row's
    # inner product with its client's weights store[versions[k]] -- the additions of
    # gather_inner_products then sum_by_slot, without their per-row arrays -- and
    # fresh_sq[j] the squared norms of its active holders' rows (np.bincount's order).
    C = store.shape[1]
    z = np.zeros((samples.size, C))
    fresh_sq = np.zeros(samples.size)
    part = np.empty(C)
    every = True
    for j in range(samples.size):
        s = samples[j]
        for h in range(sample_rowptr[s], sample_rowptr[s + 1]):
            row = sample_rows[h]
            k = client_of(client_rowptr, table, row)
            base = versions[k] * n_features
            part[:] = 0.0
            norm = 0.0
            for e in range(indptr[row], indptr[row + 1]):
                a = data[e]
                col = base + indices[e]
                for c in range(C):
                    part[c] += a * store[col, c]
                norm += a * a
            for c in range(C):
                z[j, c] += part[c]
            if active[k]:
                fresh_sq[j] += norm
            else:
                every = False
    return z, fresh_sq, every


@njit
def first_active_holders(samples, sample_rowptr, sample_rows, client_rowptr, table, active):
    # Per sample, its first holder row (in sample_rows' order) whose client is active,
    # and that client; -1 where no holder is active.
    rows = np.full(samples.size, -1, dtype=np.int64)
    clients = np.full(samples.size, -1, dtype=np.int64)
    for j in range(samples.size):
        s = samples[j]
        for h in range(sample_rowptr[s], sample_rowptr[s + 1]):
            row = sample_rows[h]
            k = client_of(client_rowptr, table, row)
            if active[k]:
                rows[j] = row
                clients[j] = k
                break
    return rows, clients


@njit
def weighted_slot_sums(ring, samples, slots, weights):
    # out[j, c] = sum over slots s (in the order given) of ring[samples[j], s, c] * weights[s, c],
    # added in that order from 0 (as NumPy's out += ring[samples, s] * weights[s]).
    C = weights.shape[1]
    out = np.zeros((samples.size, C))
    for j in range(samples.size):
        i = samples[j]
        for s in slots:
            for c in range(C):
                out[j, c] += ring[i, s, c] * weights[s, c]
    return out


@njit
def _block_sum(a, start, n):
    # NumPy's pairwise_sum on a run of at most 128: eight running sums, then the rest.
    if n < 8:
        total = -0.0
        for i in range(start, start + n):
            total += a[i]
        return total
    r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
    r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
    end = start + n - n % 8
    for i in range(start + 8, end, 8):
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(end, start + n):
        total += a[i]
    return total


@njit
def pairwise_sum(a, start, n):
    # np.sum of a contiguous run, added as NumPy adds it (pairwise_sum: runs of more than
    # 128 split in two, the first half a multiple of 8), so that a compiled sum is
    # bitwise np.sum's. The halving is walked with an explicit stack: Numba's disk cache
    # does not load recursive functions safely.
    if n <= 128:
        return _block_sum(a, start, n)
    starts = np.empty(64, dtype=np.int64)
    sizes = np.empty(64, dtype=np.int64)
    stage = np.zeros(64, dtype=np.int64)
    left = np.empty(64)
    starts[0], sizes[0], depth, value = start, n, 1, 0.0
    while depth > 0:
        top = depth - 1
        size = sizes[top]
        if size <= 128:
            value = _block_sum(a, starts[top], size)
            depth -= 1
            continue
        half = size // 2
        half -= half % 8
        if stage[top] == 0:  # sum the first half
            stage[top] = 1
            starts[depth], sizes[depth], stage[depth] = starts[top], half, 0
            depth += 1
        elif stage[top] == 1:  # keep it, sum the second half
            left[top] = value
            stage[top] = 2
            starts[depth], sizes[depth], stage[depth] = starts[top] + half, size - half, 0
            depth += 1
        else:
            value = left[top] + value
            depth -= 1
    return value


@njit
def slot_change_sums(ring, samples, columns, change):
    # out[k, c] = sum over j of ring[samples[j], columns[k], c] * change[j, c], added as
    # np.sum(ring[samples, column] * change, axis=0) adds: row after row for several
    # outputs, pairwise (the products of a column laid out first) for one.
    n, K, C = samples.size, columns.size, change.shape[1]
    out = np.zeros((K, C))
    if C == 1:
        products = np.empty((K, n))
        for j in range(n):
            i = samples[j]
            d = change[j, 0]
            for k in range(K):
                products[k, j] = ring[i, columns[k], 0] * d
        for k in range(K):
            out[k, 0] = pairwise_sum(products[k], 0, n)
        return out
    for j in range(n):
        i = samples[j]
        for k in range(K):
            col = columns[k]
            for c in range(C):
                out[k, c] += ring[i, col, c] * change[j, c]
    return out


@njit
def direction_vectors(moves, w, chrono, position, pairs, features):
    # The directions of one client (pairs (R, 2) of slots) on ``features``, (F, R, C): a
    # direction sums the moves of the rounds after its older slot up to its newer one,
    # read off running sums in time order (as np.cumsum adds); direction 0 (an older
    # slot of -1) is w less the moves after its slot.
    W, F, R, C = chrono.size, features.size, pairs.shape[0], w.shape[1]
    out = np.zeros((F, R, C))
    cumulative = np.zeros(W + 1)
    for f in range(F):
        m = features[f]
        for c in range(C):
            total = 0.0
            for s in range(W):
                total += moves[chrono[s], m, c]
                cumulative[s + 1] = total
            for r in range(R):
                p, b = pairs[r, 0], pairs[r, 1]
                if p < 0:
                    continue
                hi = position[p] + 1
                if b < 0:
                    out[f, r, c] = w[m, c] - (cumulative[W] - cumulative[hi])
                else:
                    out[f, r, c] = cumulative[hi] - cumulative[position[b] + 1]
    return out


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
def rows_transpose_product(indptr, indices, data, rows, values, slot, n_features):
    # Row j's values are values[slot[j]] (values[j] where slot is None: compiled apart).
    C = values.shape[1]
    out = np.zeros((n_features, C))
    for j in range(rows.size):
        row = rows[j]
        v = j if slot is None else slot[j]
        for e in range(indptr[row], indptr[row + 1]):
            a = data[e]
            col = indices[e]
            for c in range(C):
                out[col, c] += a * values[v, c]
    return out


@njit
def add_rows(target, rows, values, slot):
    # target[rows[j]] += values[slot[j]] for distinct rows, in place.
    for j in range(rows.size):
        for c in range(target.shape[1]):
            target[rows[j], c] += values[slot[j], c]


@njit
def holding_clients(samples, sample_rowptr, sample_rows, client_rowptr, table, n_clients):
    # Which clients hold any of the samples (bool, shape (K,)).
    held = np.zeros(n_clients, dtype=np.bool_)
    for s in samples:
        for h in range(sample_rowptr[s], sample_rowptr[s + 1]):
            held[client_of(client_rowptr, table, sample_rows[h])] = True
    return held


@njit
def ascending_draws(positions, counts, sizes):
    # See hyfl.algorithms.hyfdca_local.ascending_draws (int32: positions in a client).
    order = np.empty(positions.size, dtype=np.int32)
    start = 0
    for a in range(counts.size):
        if counts[a] == sizes[a]:  # a full pass: the inverse permutation
            for d in range(counts[a]):
                order[start + positions[start + d]] = d
        else:
            for d in range(counts[a]):
                order[start + d] = d
        start += counts[a]
    return order


@njit
def segment_gather_sums(values, index, segments):
    # sums[a] = sum of values[index[j]] over j in segments[a]:segments[a + 1], added in
    # order from 0.0 (np.bincount's order, so the same bits) without the gathered copy.
    sums = np.zeros(segments.size - 1)
    for a in range(segments.size - 1):
        total = 0.0
        for j in range(segments[a], segments[a + 1]):
            total += values[index[j]]
        sums[a] = total
    return sums


@njit
def distinct_in_runs(values, starts, sizes, bound):
    # See hyfl.algorithms.hyfdca_kernels.distinct_in_runs: mark, then read in order.
    seen = np.zeros(bound, dtype=np.bool_)
    for a in range(starts.size):
        for j in range(starts[a], starts[a] + sizes[a]):
            if values[j] < 0 or values[j] >= bound:  # (unchecked, it would write astray)
                raise IndexError("distinct_in_runs: a value outside 0..bound-1")
            seen[values[j]] = True
    out = np.empty(np.count_nonzero(seen), dtype=values.dtype)
    n = 0
    for v in range(bound):
        if seen[v]:
            out[n] = v
            n += 1
    return out


@njit
def positions_by_table(distinct_values, queries, lo, hi, like):
    # See hyfl.algorithms.hyfdca_kernels.positions_in (dense ids: a table over lo..hi;
    # the positions in like's dtype).
    table = np.empty(hi - lo + 1, dtype=like.dtype)
    for j in range(distinct_values.size):
        table[distinct_values[j] - lo] = j
    out = np.empty(queries.size, dtype=like.dtype)
    for j in range(queries.size):
        if queries[j] < lo or queries[j] > hi:  # (unchecked, it would read astray)
            raise IndexError("positions_in: a query outside the values' range")
        out[j] = table[queries[j] - lo]
    return out


@njit
def rows_updated_after(starts, stops, after, row_sample, updated_at):
    # See hyfl.algorithms.hyfdca_kernels.rows_updated_after: count, then fill.
    n = 0
    for a in range(starts.size):
        for r in range(starts[a], stops[a]):
            if updated_at[row_sample[r]] > after[a]:
                n += 1
    out = np.empty(n, dtype=np.int64)
    n = 0
    for a in range(starts.size):
        for r in range(starts[a], stops[a]):
            if updated_at[row_sample[r]] > after[a]:
                out[n] = r
                n += 1
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
def group_order(keys, through, n_groups):
    # A stable counting sort of keys[through]: bounds from the counts, then each index
    # into its key's run.
    bounds = np.zeros(n_groups + 1, dtype=np.int64)
    for j in range(through.size):
        k = keys[through[j]]
        if k >= 0:
            bounds[k + 1] += 1
    for g in range(n_groups):
        bounds[g + 1] += bounds[g]
    fill = bounds[:-1].copy()
    order = np.empty(bounds[n_groups], dtype=np.int32)
    for j in range(through.size):
        k = keys[through[j]]
        if k >= 0:
            order[fill[k]] = j
            fill[k] += 1
    return order, bounds


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


# ---------------------------------------------------------------------------
# The directions' Gram matrices (hyfl.algorithms.hyfdca_local.SpanHistory.direction_grams)
# ---------------------------------------------------------------------------


@njit
def direction_grams(move_gram, chrono, position, with_w, norm_w, pairs):
    # move_gram (C, S, S) the moves' products by slot; chrono (W,) the slots summed, oldest
    # first; position (S,) each slot's place in it; with_w (C, W) <w, move> in chrono order;
    # norm_w (C,) ||w||^2; pairs (A, R, 2). Returns (A, C, R, R). The same additions in
    # the same order as the NumPy it replaces (cumsums, then the four corners of a box),
    # so the same bits: 40 small array calls became one.
    C, W = move_gram.shape[0], chrono.size  # (the slots summed: from the oldest named)
    A, R = pairs.shape[0], pairs.shape[1]
    hi = np.zeros((A, R), dtype=np.int64)
    lo = np.zeros((A, R), dtype=np.int64)
    need = np.zeros(W + 1, dtype=np.bool_)  # the box rows the corners read
    for a in range(A):
        for r in range(R):
            p, b = pairs[a, r, 0], pairs[a, r, 1]
            hi[a, r] = position[p] + 1 if p >= 0 else 0
            lo[a, r] = position[b] + 1 if b >= 0 else 0
            need[hi[a, r]] = True
            need[lo[a, r]] = True
    # box[c, a, b] = sum of gram[c, :a, :b], written only in the rows read below.
    box = np.empty((C, W + 1, W + 1))
    box[:, 0, :] = 0.0
    line = np.zeros((C, W + 1))
    column = np.empty(W)
    for c in range(C):
        column[:] = 0.0
        for i in range(W):
            for j in range(W):
                column[j] += move_gram[c, chrono[i], chrono[j]]
            # Only the rows read below are summed along (a serial chain of W additions
            # each, the kernel's cost when every row was); their bits are unchanged.
            if need[i + 1]:
                box[c, i + 1, 0] = 0.0
                run = 0.0
                for j in range(W):
                    run += column[j]
                    box[c, i + 1, j + 1] = run
        total = 0.0
        for k in range(W):
            total += with_w[c, k]
            line[c, k + 1] = total
    grams = np.zeros((A, C, R, R))
    for a in range(A):
        for c in range(C):
            for i in range(R):
                if pairs[a, i, 1] < 0:
                    continue
                for j in range(R):
                    if pairs[a, j, 1] >= 0:
                        grams[a, c, i, j] = (box[c, hi[a, i], hi[a, j]] - box[c, lo[a, i], hi[a, j]]
                                             - box[c, hi[a, i], lo[a, j]]
                                             + box[c, lo[a, i], lo[a, j]])
            # Row and column 0: the current w with each direction (a move: b >= 0).
            for j in range(R):
                value = line[c, hi[a, j]] - line[c, lo[a, j]] if pairs[a, j, 1] >= 0 else 0.0
                grams[a, c, 0, j] = value
                grams[a, c, j, 0] = value
            first = pairs[a, 0, 0] >= 0 and pairs[a, 0, 1] < 0  # w itself
            grams[a, c, 0, 0] = norm_w[c] if first else 0.0
    return grams


# ---------------------------------------------------------------------------
# The ring widened in place (hyfl.algorithms.hyfdca_local.SpanHistory._widen_ring)
# ---------------------------------------------------------------------------


@njit
def spread_rows(flat, n, old, new):
    # flat holds n rows of `old` numbers at its start (and room for n rows of `new` >=
    # old); each row moves to its place in rows of `new`, its new tail zero. Last row
    # first, each from its end: a row's destination never covers a row not yet moved.
    if new < old or flat.size < n * new:
        raise IndexError("spread_rows: the buffer is too small for the wider rows")
    for i in range(n - 1, -1, -1):
        source, target = i * old, i * new
        for j in range(old - 1, -1, -1):
            flat[target + j] = flat[source + j]
        for j in range(old, new):
            flat[target + j] = 0.0
