"""HyFDCA's default local method: CoCoA+-style subproblems on a learned model of the data.

The per-sample step rules of :mod:`hyfl.algorithms.hyfdca` take every dual
step from the same inner products, so a round is one Jacobi sweep over the
drawn samples. On data whose rows share a few directions (ijcnn1, adult,
covtype) such sweeps must be damped by a factor close to ``N / M`` and
HyFDCA needs thousands of rounds. The rule ``"cocoa"`` here lets each client
solve a *subproblem* instead, sequentially over its drawn samples, as CoCoA+
does in horizontal federated learning:

    max_d  sum_i -l*(-(a_i + d_i)) - z_i d_i  -  sigma / (2 lam N) * d^T G d

where ``G`` models the Gram matrix ``X_D X_D^T`` of the drawn samples. In
hybrid FL no client sees whole samples, so ``G`` cannot be formed locally.
It is learned from what HyFDCA already exchanges: in every round a client
receives the global inner products ``z_i = x_i^T w`` of its samples, so over
its last ``R`` active rounds it knows the projections of its (whole) samples
onto the directions ``w_s - w_s'`` along which the model moved, and the server
knows those directions' Gram matrix. With an orthonormal basis ``Q`` of their
span, ``phi_i = Q^T x_i`` is computable by the client, and

    G ~= Phi Phi^T + R_own R_own^T + diag(rest),

exact inside the span. Outside it, the residual ``r_i = x_i - Q phi_i`` is
known to the client on its own features -- it holds ``x_i`` there and its
block of every ``w`` it received, hence ``Q`` there -- so ``R_own`` couples
its samples exactly on its features; only the other holders' part of the
residual (``rest_i = ||r_i||^2 - ||r_i[own]||^2``) is treated as orthogonal
to the other samples. A client that holds whole samples (one client, or
horizontal FL) therefore solves CoCoA+'s exact subproblem; in hybrid and
vertical splits the span supplies the coupling through the other holders'
features. ``||x_i||^2`` is summed securely once at set-up. (Measured: on a
50,000-row Covtype sample with one client, 60 rounds reach relative loss
3.5e-4 with the own-feature term and 0.2 without; 3x3 at half participation
settles at 1e-3 in 140 rounds, not within 150 without.)

Around the local solves, one outer iteration

1. adds each sample's proposals divided by its number of holders ``|B_i|``, as
   Algorithm 1 aggregates dual steps: a sample with absent holders, whose
   inner product is partly stale, moves less (measured: on ijcnn1 with half
   the clients per round this halves the rounds to settle, see
   ``docs/convergence.md``);
2. adds momentum along the previous step with the coefficient that makes the
   new direction conjugate to it (``mu = -<A p, A m> / ||A m||^2``, as in
   nonlinear conjugate gradients, clipped to ``[0, mu_max]``) and projects
   onto the dual domain;
3. takes the best step ``t`` in ``[0, 1]`` along that direction by an exact
   line search on the dual (closed form when ``l*`` is quadratic on its
   domain, a grid otherwise), which keeps the dual feasible and -- when no
   holder is stale -- non-decreasing;
4. adapts ``sigma`` (the CoCoA+ scaling of the subproblem's quadratic) from
   ``t``: a short step means the subproblems overshoot.

For the non-smooth hinge the last iterate oscillates around the optimum; the
run also keeps an exponential moving average of the iterates (an average of
feasible duals is feasible, and its dual value is at least the average's),
and the model a run reports and returns is, at every evaluation, the one of
the two whose duality gap certifies it best.

Everything here is a pure function of arrays, shared by the stacked engine
(:mod:`hyfl.algorithms.hyfdca`), the message-level parties
(:mod:`hyfl.algorithms.hyfdca_parties`) and the reference in the tests. The
sequential local solver is compiled with Numba: its steps depend on each
other, so NumPy cannot vectorize it, and a Python loop would cost a
microsecond per sample.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import numpy as np

from hyfl._threads import in_parts
from hyfl.losses import Loss

# A short step means the subproblems were too optimistic: raise sigma by 1/t
# (at most 4x a round); a full step means they may have been too cautious:
# lower it by 20%. sigma may go below 1 -- where the model under-counts even a
# single sample's own curvature -- because the aggregation divides each sample's
# proposals by all its holders, absent ones included: with partial participation
# the moves come out short, and the line search guards the long ones (measured:
# breast-cancer 3x3 at half participation 1.6e-2 -> 5.3e-3 after 300 rounds,
# ijcnn1 3x3 no slower, final 4.7e-4 -> 1.6e-4 after 400; reuters 12x12 the same).
SIGMA_FLOOR = 0.1
_SIGMA_SHRINK = 0.8
_SHORT_STEP = 0.5
_FULL_STEP = 0.95
# Directions whose Gram eigenvalue is below this fraction of the largest (about
# ||w||^2) are dropped: see span_transforms.
_EIGEN_CUTOFF = 1e-10
# Line-search grid for losses whose conjugate is not quadratic (logistic).
GRID = np.arange(1, 9) / 8.0
# Exponential moving average of the iterates: weight 2/(t+1) (a plain
# average of the second half) until it reaches this floor (about the last
# ten rounds).
AVERAGE_FLOOR = 0.1


def step_bundle(loss: Loss):
    """The loss's constants for the compiled step; their type chooses the step."""
    from hyfl.algorithms import hyfdca_compiled as compiled

    if loss.name == "smoothed_hinge":
        return compiled.SmoothedHingeStep(float(loss.smoothing))
    if loss.name == "logistic":
        return compiled.LogisticStep(int(loss.newton_iterations), float(loss.newton_tolerance))
    return {"hinge": compiled.HingeStep, "squared": compiled.SquaredStep}[loss.name]()


#: Most passes a client makes over its drawn samples per round by default.
MAX_LOCAL_PASSES = 16
#: Subproblem condition per extra default pass (see :func:`local_passes`).
CONDITION_PER_PASS = 8.0


def local_passes(sq_norms: np.ndarray, segments: np.ndarray, lam_n: float,
                 setting: int | None = None, samples: np.ndarray | None = None) -> np.ndarray:
    """How many passes each active client makes over its drawn samples this round.

    One sequential pass of dual coordinate ascent shrinks a subproblem's
    suboptimality by a factor that depends on its condition
    ``kappa = mean ||x_i||^2 / (lam N)``: near 1 (ijcnn1 1.0, mnist 3.1, covtype
    0.2 at their paper lambdas) one pass leaves little local progress undone,
    while at ``kappa`` of tens (reuters 26 at its paper lambda; features divided
    by their deviation at scikit-learn's ``C = 1``, where ``kappa`` is at least
    the number of features: 70 and 185 on the breast-cancer and wine
    organisations' files) most of a round's possible progress would be left for
    the next round, and rounds are what federated learning pays for. The default is
    therefore ``ceil(kappa / 8)`` passes, between 1 and 16 (docs/convergence.md,
    section 7: breast cancer in three organisations' files settles at 1e-3 in
    86 instead of 185 rounds; the extra passes cost local arithmetic only, no
    message). Each client computes its own count from the squared norms of its
    drawn samples, which it learned at set-up, so no party learns anything new.

    Parameters
    ----------
    sq_norms : ndarray, shape (n,)
        ``||x_i||^2`` of every drawn row, client after client.
    segments : ndarray of int, shape (A + 1,)
        Client ``a``'s rows are ``segments[a]:segments[a + 1]``.
    lam_n : float
        ``lam * N``.
    setting : int or None, default None
        A fixed count (``HyFDCA.local_passes``) or None for the default above.
    samples : ndarray of int, shape (n,), optional
        The drawn rows' samples; then ``sq_norms`` holds every sample's, shape (N,),
        and is read through them (no gathered copy: 50 MB a full pass on Covtype).

    Returns
    -------
    ndarray of int, shape (A,)
    """
    from hyfl.algorithms import hyfdca_compiled as compiled

    segments = np.asarray(segments, dtype=np.int64)
    if setting is not None:
        return np.full(segments.size - 1, int(setting), dtype=np.int64)
    counts = np.diff(segments)
    sq_norms = np.ascontiguousarray(sq_norms, dtype=np.float64)
    index = np.arange(sq_norms.size) if samples is None else np.ascontiguousarray(samples)
    sums = compiled.segment_gather_sums(sq_norms, index, segments)
    kappa = sums / np.maximum(counts, 1) / float(lam_n)
    return np.clip(np.ceil(kappa / CONDITION_PER_PASS), 1, MAX_LOCAL_PASSES).astype(np.int64)


def solve_subproblems(
    loss: Loss,
    *,
    segments: np.ndarray,
    row_sample: np.ndarray,
    alpha: np.ndarray,
    z_ring: np.ndarray,
    pairs: np.ndarray,
    transforms: np.ndarray,
    Y: np.ndarray,
    W: np.ndarray | None = None,
    sq_norms: np.ndarray,
    coef: float,
    X,
    rows: np.ndarray,
    feature_ptr: np.ndarray,
    features: np.ndarray,
    directions: np.ndarray,
    passes: int | np.ndarray = 1,
    offset_weights: np.ndarray | None = None,
    ascending: np.ndarray | None = None,
    threads: int | None = None,
) -> np.ndarray:
    """Every active client's local subproblem, solved by sequential dual coordinate ascent.

    A client's model of the Gram matrix of its samples is exact in the span of
    its history directions (coordinates ``phi``) and, outside that span, on its
    own features: with ``Q`` an orthonormal basis of the span, the residual
    ``r_i = x_i - Q phi_i`` restricted to the client's features is known to it
    (it holds ``x_i`` there and its block of every ``w`` it received), so

        <x_i, x_j> ~ phi_i . phi_j + r_i[own] . r_j[own] + [i = j] ||r_i[others]||^2.

    With a single client or whole samples (horizontal FL) the model is exact
    and the subproblem is CoCoA+'s; on the other holders' features only the
    norm of the rest is known, and it is kept on the diagonal.

    Parameters
    ----------
    loss : Loss
    segments : ndarray of int, shape (A + 1,)
        Client ``a`` processes rows ``segments[a]:segments[a + 1]``, in order.
    row_sample : ndarray of int, shape (n,)
        Sample id of each drawn row (index into ``alpha``, ``z_ring``, ``Y``, ``sq_norms``).
    alpha : ndarray, shape (N, C)
        Current duals (the active clients hold these after the refresh).
    z_ring : ndarray, shape (N, P, C)
        Inner products ``x_i^T w_s`` received in recent rounds (a column per slot
        kept, see :func:`place_slot`).
    pairs : ndarray of int, shape (A, R, 2)
        Per client, its history directions ``w_p - w_b`` as pairs ``(p, b)`` of
        ``z_ring``'s columns (``b = -1``: ``w_p`` itself; ``p = -1``: unused), see
        :func:`direction_pairs` and :func:`column_pairs`; ``pairs[a, 0, 0]`` is the
        current round's.
    transforms : ndarray, shape (A, C, R, R)
        Per client and output, ``phi = T^T (margins on the directions)``; see
        :func:`span_transforms`.
    Y : ndarray, shape (N, C)
    W : ndarray, shape (N, C) or None
        Sample weights (None: all 1).
    sq_norms : ndarray, shape (N,)
        ``||x_i||^2`` of the whole samples.
    coef : float
        ``sigma / (lam N)``.
    X : scipy.sparse.csr_matrix
        Rows holding each client's own part of its samples.
    rows : ndarray of int, shape (n,)
        Row of ``X`` of each drawn row.
    feature_ptr : ndarray of int, shape (A + 1,)
        Client ``a``'s own features are ``features[feature_ptr[a]:feature_ptr[a + 1]]``.
    features : ndarray of int
        Columns of ``X`` (the clients' own features, client after client).
    directions : ndarray, shape (len(features), R, C)
        The history directions ``w_p - w_b`` on each client's own features
        (:meth:`SpanHistory.direction_vectors`, :meth:`ClientMemory.direction_vectors`).
    passes : int or ndarray of int, shape (A,), default 1
        Passes over each client's drawn rows (one for all, or per client; see
        :func:`local_passes`).
    offset_weights : ndarray, shape (A, C, R), optional
        Per client and output, ``h`` with which a drawn row's remembered margin moves
        by ``m . h`` from the composite weights it was taken with to the server's
        ``w``, ``m`` its margins on the client's directions
        (:func:`hyfl.algorithms.hyfdca_groups.offset_weights`; default zero).
    ascending : ndarray of int, shape (n,), optional
        Per client, its draws by ascending sample, as offsets from ``segments[a]``
        (:func:`ascending_draws`): the remembered inner products are then read in
        storage order. The results do not depend on it (default: the draw order).
    threads : int, optional
        Threads the clients are solved on, runs of consecutive clients each
        (default :func:`hyfl._threads.thread_count`: ``hyfl --threads``,
        ``$HYFL_THREADS`` or every core). The results are the same bits for any count.

    Returns
    -------
    ndarray, shape (n, C)
        Each drawn row's proposed dual change.
    """
    from hyfl._threads import check_threads, thread_count
    from hyfl.algorithms import hyfdca_compiled as compiled

    threads = thread_count() if threads is None else check_threads(threads)
    step = step_bundle(loss)
    segments = np.asarray(segments, dtype=np.int64)
    # int32 indices (as the stacked blocks hold them): on Covtype a full pass draws 6.3
    # million rows, and an int64 copy of their samples was 50 MB
    index = np.int32 if X.shape[0] < 2**31 else np.int64
    row_sample = np.ascontiguousarray(row_sample, dtype=index)
    rows = np.ascontiguousarray(rows, dtype=index)
    pairs = np.ascontiguousarray(pairs, dtype=np.int64)
    n, C = row_sample.size, alpha.shape[1]
    out = np.empty((n, C))
    transforms = np.ascontiguousarray(transforms, dtype=np.float64)
    inverse = np.full(X.shape[1], -1, dtype=np.int64)
    feature_ptr = np.asarray(feature_ptr, dtype=np.int64)
    features = np.asarray(features, dtype=np.int64)
    sq_norms = np.ascontiguousarray(sq_norms, dtype=np.float64)
    csr = compiled.Csr(X.indptr, X.indices, X.data)
    if ascending is None:
        ascending = np.arange(n) - np.repeat(segments[:-1], np.diff(segments))
    ascending = np.ascontiguousarray(ascending, dtype=np.int32)
    passes = np.ascontiguousarray(np.broadcast_to(np.asarray(passes, dtype=np.int64),
                                                  (segments.size - 1,)))
    dense_most = pairs.shape[1]  # the residual's form follows the depth (_solve_clients)
    R = directions_in_use(pairs)
    pairs, directions = np.ascontiguousarray(pairs[:, :R]), directions[:, :R]
    # BLAS on one thread: many small products, here and in the kernel's (on the solver's
    # own threads; see single_threaded_blas).
    with single_threaded_blas():
        for c in range(C):
            transform = coordinates_in_use(transforms[:, c, :R])
            basis, basis_grams = _own_bases(directions[:, :, c], transform, feature_ptr)
            draws = _output_draws(compiled, segments, row_sample, rows, alpha, Y, W, c,
                                  sq_norms, ascending)
            span = compiled.Span(z_ring, pairs, transform, feature_ptr, features, basis,
                                 basis_grams,
                                 np.zeros((segments.size - 1, R)) if offset_weights is None
                                 else np.ascontiguousarray(offset_weights[:, c, :R],
                                                           dtype=np.float64),
                                 inverse)
            # The solver writes each row's change in place: into out's column when it
            # is contiguous (C = 1), else into one column buffer.
            column = out[:, 0] if C == 1 else np.empty(n)
            _solve_clients(step, draws, csr, span, c, float(coef), passes, threads,
                           dense_most, column)
            if C > 1:
                out[:, c] = column
    return out


def _output_draws(compiled, segments, row_sample, rows, alpha, Y, W, c, sq_norms, ascending):
    """The drawn rows and their samples' duals, labels and weights on output ``c``."""
    return compiled.Draws(
        segments, row_sample, rows,
        alpha=np.ascontiguousarray(alpha[:, c]),
        y=np.ascontiguousarray(Y[:, c], dtype=np.float64),
        weight=(np.ones(Y.shape[0]) if W is None
                else np.ascontiguousarray(W[:, c], dtype=np.float64)),
        sq_norms=sq_norms,
        ascending=ascending,
    )


def directions_in_use(pairs: np.ndarray) -> int:
    """How many of the clients' directions (pairs (A, R, 2)) the solver reads: up to the
    last one some client has (at least 1).

    A row's work is set by the directions some client has and the span coordinates some
    client keeps (:func:`coordinates_in_use`), not by the history's depth: the unused
    directions (-1 padded at the end of a client's list) have zero margins and Gram rows,
    and in the first rounds a client has a few of its 32.
    """
    live = np.flatnonzero(np.any(np.asarray(pairs)[:, :, 0] >= 0, axis=0))
    return int(live[-1]) + 1 if live.size else 1


def coordinates_in_use(transforms: np.ndarray) -> np.ndarray:
    """The columns of the clients' span transforms (A, R, R) some client keeps: (A, R, K).

    :func:`span_transforms` zeroes the columns of the eigenvalues it drops, which are the
    smallest and so the first: the last K columns (K the most any client keeps, at least
    1) hold every client's coordinates, a client with fewer has zero columns there.
    """
    kept = np.sum(np.any(transforms != 0.0, axis=-2), axis=-1)  # (A,) columns in use
    K = max(int(np.max(kept, initial=0)), 1)
    return np.ascontiguousarray(transforms[..., transforms.shape[-1] - K:])


def _own_bases(directions: np.ndarray, transforms: np.ndarray, feature_ptr: np.ndarray):
    """``Q = D T`` on each client's own features (directions (F, R), transforms (A, R, K))
    and its Gram ``Q^T Q``: shapes (F, K) and (A, K, K)."""
    A, K = transforms.shape[0], transforms.shape[2]
    basis = np.empty((feature_ptr[-1], K))
    grams = np.empty((A, K, K))
    for a in range(A):
        own = slice(feature_ptr[a], feature_ptr[a + 1])
        basis[own] = directions[own] @ transforms[a]
        grams[a] = basis[own].T @ basis[own]
    return basis, grams


#: Below this many drawn rows a round's clients are solved on one thread: handing them
#: to others costs more than it saves (tens of microseconds a client).
MIN_ROWS_PER_THREAD = 2048


def client_chunks(work: np.ndarray, parts: int) -> np.ndarray:
    """Boundaries ``b`` (``b[0] = 0``, ``b[-1] = A``) splitting clients ``0..A-1`` into at
    most ``parts`` runs of consecutive clients with about equal ``work`` (A,) each."""
    total = np.cumsum(work, dtype=np.float64)
    if parts <= 1 or total.size <= 1 or total[-1] <= 0:
        return np.array([0, total.size])
    cuts = np.searchsorted(total, total[-1] * np.arange(1, parts) / parts, side="left") + 1
    return np.unique(np.concatenate(([0], np.minimum(cuts, total.size), [total.size])))


def _solve_clients(step, draws, csr, span, c: int, coef: float, passes: np.ndarray,
                   threads: int, dense_most: int, delta: np.ndarray) -> None:
    """:func:`hyfdca_compiled.solve` over every client, on up to ``threads`` threads,
    writing the drawn rows' changes into ``delta`` (n,), contiguous.

    The clients of a round are independent: each reads shared arrays and writes only
    its own rows' changes (its slice of ``delta``), so runs of consecutive clients go to
    different threads (the kernel releases the GIL), each with its own scratch, and the
    result is the same bits for any thread count.

    A client with at most ``dense_most`` own features (the history's depth) keeps its
    rows' residual there densely, others in the expanded form: the depth, not the
    directions in use, as before those were cut -- the forms are equal but round
    differently (1e-13 a solve), and switching as a history fills moved one run by
    1e-2 once a later discrete choice (a checkpoint's verdict) amplified it.
    """
    from hyfl.algorithms import hyfdca_compiled as compiled

    segments = draws.segments
    counts = np.diff(segments)
    parts = min(threads, int(counts.sum()) // MIN_ROWS_PER_THREAD, counts.size)
    bounds = client_chunks(counts * passes, parts)
    if bounds.size <= 2:
        compiled.solve(step, draws, csr, span, c, coef, passes, dense_most, delta)
        return

    def chunk(lo: int, hi: int) -> None:  # clients lo..hi-1
        first, last = segments[lo], segments[hi]
        part = compiled.Draws(segments[lo:hi + 1] - first, draws.row_sample[first:last],
                              draws.rows[first:last], draws.alpha, draws.y, draws.weight,
                              draws.sq_norms, draws.ascending[first:last])
        # (feature_ptr keeps its absolute offsets into features and basis)
        own = compiled.Span(span.ring, span.pairs[lo:hi], span.transforms[lo:hi],
                            span.feature_ptr[lo:hi + 1], span.features, span.basis,
                            span.basis_grams[lo:hi], span.offset_weights[lo:hi],
                            np.full_like(span.inverse, -1))
        compiled.solve(step, part, csr, own, c, coef, passes[lo:hi], dense_most,
                       delta[first:last])

    in_parts(chunk, bounds)


# ---------------------------------------------------------------------------
# The learned model: history directions and their orthonormal coordinates
# ---------------------------------------------------------------------------


def ascending_draws(positions: np.ndarray, counts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per client, its draws in the order of its stored rows (ascending samples), as
    offsets from the client's first draw; ``solve_subproblems``'s ``ascending``.

    ``positions`` (n,) are the draws' rows among their client's, client after client
    (``counts[a]`` each, of ``sizes[a]`` rows). A client that draws every row (a full
    pass) has its inverse permutation; one that draws fewer keeps the draw order
    (sorting them would cost more than it saves).
    """
    from hyfl.algorithms import hyfdca_compiled as compiled

    return compiled.ascending_draws(np.ascontiguousarray(positions, dtype=np.int64),
                                    np.asarray(counts, dtype=np.int64),
                                    np.asarray(sizes, dtype=np.int64))


def direction_pairs(slots: np.ndarray) -> np.ndarray:
    """History directions of clients from their recent slots (most recent first).

    Parameters
    ----------
    slots : ndarray of int, shape (A, R)
        Per client, the ring slots of its last active rounds, most recent first,
        ``-1`` padded. ``slots[:, 0]`` is the current round.

    Returns
    -------
    ndarray of int, shape (A, R, 2)
        ``(p, b)`` per direction: ``w_{s0}`` itself, then ``w_{s_{j-1}} - w_{s_j}``.
    """
    slots = np.asarray(slots, dtype=np.int64)
    pairs = np.full((*slots.shape, 2), -1, dtype=np.int64)
    pairs[:, 0, 0] = slots[:, 0]
    valid = (slots[:, 1:] >= 0) & (slots[:, :-1] >= 0)
    pairs[:, 1:, 0] = np.where(valid, slots[:, :-1], -1)
    pairs[:, 1:, 1] = np.where(valid, slots[:, 1:], -1)
    return pairs


def place_slot(column: np.ndarray, slot: int, slots: np.ndarray, n_columns: int) -> int:
    """Give ring slot ``slot`` a column of a compact store of ``n_columns`` columns.

    A slot's remembered values are read only while some client's directions name
    it (:func:`direction_pairs`), so the store keeps columns for the slots the
    clients' lists ``slots`` (any shape, ``-1`` padded) name alone: the others'
    columns are released first (``column`` is updated in place, ``-1`` for a slot
    without one), then ``slot`` takes the first free column. Returns it;
    ``n_columns`` means the store is full and must widen.
    """
    listed = np.zeros(column.size, dtype=bool)
    listed[slots[slots >= 0]] = True
    column[~listed] = -1
    column[slot] = -1  # its values are replaced
    taken = np.zeros(n_columns + 1, dtype=bool)
    taken[column[column >= 0]] = True
    free = int(np.argmin(taken))  # the first False; n_columns if every column is taken
    column[slot] = free
    return free


def column_pairs(pairs: np.ndarray, column: np.ndarray) -> np.ndarray:
    """``pairs`` (:func:`direction_pairs`) with each slot replaced by its store column."""
    pairs = np.asarray(pairs, dtype=np.int64)
    return np.where(pairs >= 0, column[np.maximum(pairs, 0)], -1)


@functools.cache
def _blas_controller():
    """The process's BLAS libraries, found once (a search costs ~0.3 ms). SciPy's
    OpenBLAS, which the compiled solver's products use, is loaded first: a library loaded
    after the search would escape the one-thread limit."""
    import scipy.linalg  # noqa: F401  (loads SciPy's BLAS)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


_BLAS_LIMIT = threading.local()  # .inside: this thread is in a single_threaded_blas context


@contextlib.contextmanager
def single_threaded_blas():
    """A context with one BLAS thread: LAPACK on many small matrices is tens of times
    slower when OpenBLAS wakes its threads on a busy machine (measured: 120 ms against
    1.7 ms for five 31 x 31 eigendecompositions).

    Nested contexts cost nothing: the round holds one, and the solver's and the span's
    inside it would each pay threadpoolctl's ~0.1 ms to set and restore the limit (a
    tenth of a tiny round)."""
    if getattr(_BLAS_LIMIT, "inside", False):
        yield
        return
    _BLAS_LIMIT.inside = True
    try:
        with _blas_controller().limit(limits=1, user_api="blas"):
            yield
    finally:
        _BLAS_LIMIT.inside = False


def span_transforms(grams: np.ndarray) -> np.ndarray:
    """``T`` with ``phi = T^T margins`` orthonormal coordinates in the directions' span.

    For directions ``D`` with Gram ``G = D^T D = V L V^T``, ``Q = D V L^{-1/2}``
    is orthonormal and ``Q^T x = L^{-1/2} V^T D^T x``, so ``T = V L^{-1/2}``.
    Eigenvalues below :data:`_EIGEN_CUTOFF` times the largest are dropped (their
    columns are zero): the largest is about ``||w||^2`` and the small ones belong
    to tiny moves of the model, whose inner products -- differences of nearly
    equal numbers, and with absent holders partly stale -- carry more error
    than information.

    Parameters
    ----------
    grams : ndarray, shape (..., R, R)

    Returns
    -------
    ndarray, shape (..., R, R)
    """
    with single_threaded_blas():
        values, vectors = np.linalg.eigh(grams)
    top = np.max(values, axis=-1, keepdims=True)
    keep = values > _EIGEN_CUTOFF * np.maximum(top, 1e-300)
    inv_sqrt = np.where(keep, 1.0 / np.sqrt(np.where(keep, values, 1.0)), 0.0)
    return vectors * inv_sqrt[..., None, :]


# ---------------------------------------------------------------------------
# Aggregation: momentum, line search, sigma, averaging
# ---------------------------------------------------------------------------


def momentum_coefficient(dw_proposal: np.ndarray, dw_previous: np.ndarray, mu_max: float):
    """Per output, ``mu`` making ``A(p + mu m)`` orthogonal to ``A m`` (clipped to [0, mu_max]).

    ``dw_proposal`` and ``dw_previous`` are the primal images ``A p`` of the
    averaged proposal and ``A m`` of the previous step, shape (M, C).
    """
    norm = np.sum(dw_previous * dw_previous, axis=0)
    inner = np.sum(dw_proposal * dw_previous, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = np.where(norm > 0, -inner / np.where(norm > 0, norm, 1.0), 0.0)
    return np.clip(mu, 0.0, mu_max)


DIRECTION_FLOOR = 1e-9
"""Smallest dual move a direction keeps (the encoding's resolution is 2**-32)."""


def momentum_direction(loss: Loss, alpha, proposal, previous, mu, y, weight=None
                       ) -> np.ndarray:
    """``proj(alpha + proposal + mu * previous) - alpha``: the round's feasible direction
    (``weight``: the samples' weights, which scale the dual domain)."""
    lo, hi = loss.dual_bounds(y, weight)
    direction = np.clip(alpha + proposal + mu[None, :] * previous, lo, hi) - alpha
    # Moves below the fixed-point resolution of an encrypted dual are rounding, not
    # steps (a dual at its bound pushed outward): zero them, so that every engine and
    # cipher agrees on which duals changed and need sending.
    direction[np.abs(direction) < DIRECTION_FLOOR] = 0.0
    return direction


def conjugate_gains(loss: Loss, alpha, direction, y, limit: float = 1.0, weight=None
                    ) -> np.ndarray:
    """``sum_i l*(-alpha_i) - l*(-(alpha_i + t d_i))`` at the line search's points.

    The points are ``(1/2, 1)`` when the conjugate is quadratic (enough to know
    the dual along the segment exactly) and :data:`GRID` scaled to ``[0, limit]``
    otherwise.

    Returns
    -------
    ndarray, shape (P, C)
    """
    points = line_search_points(loss, limit)
    base = loss.conjugate(alpha, y, weight)
    return np.stack([np.sum(base - loss.conjugate(alpha + t * direction, y, weight), axis=0)
                     for t in points])


def line_search_points(loss: Loss, limit: float = 1.0) -> np.ndarray:
    return np.array([0.5, 1.0]) if loss.quadratic_conjugate else float(limit) * GRID


def line_search(loss: Loss, gains, margin_term, quadratic, n_samples: int,
                limit: float = 1.0) -> np.ndarray:
    """Best step in ``[0, limit]`` along the round's direction, per output.

    ``limit`` (at most 1) is the certificate's trust in the round's estimate
    (:mod:`hyfl.algorithms.hyfdca_certify`); ``gains`` are taken at
    ``line_search_points(loss, limit)``.

    The dual changes by ``phi(t) = (g(t) - t * margin_term) / N - t^2 * quadratic``
    where ``g`` is given by ``gains`` at :func:`line_search_points`,
    ``margin_term = sum_i z_i d_i`` and ``quadratic = lam/2 ||A d||^2``.

    Returns
    -------
    ndarray, shape (C,)
    """
    gains = np.asarray(gains, dtype=float)
    margin_term = np.asarray(margin_term, dtype=float)
    quadratic = np.asarray(quadratic, dtype=float)
    N = float(n_samples)
    if loss.quadratic_conjugate:
        half, full = gains
        curvature = 2.0 * (full - 2.0 * half)  # g(t) = slope t + curvature t^2
        slope = full - curvature
        a = (slope - margin_term) / N
        b = curvature / N - quadratic  # <= 0: the dual is concave
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(b < 0, -a / (2.0 * np.where(b < 0, b, -1.0)), np.where(a > 0, 1.0, 0.0))
        return np.clip(np.nan_to_num(t, nan=0.0), 0.0, float(limit))
    grid = float(limit) * GRID
    points = grid[:, None]
    values = (gains - points * margin_term[None, :]) / N - points**2 * quadratic[None, :]
    best = np.argmax(values, axis=0)
    t = grid[best]
    return np.where(values[best, np.arange(values.shape[1])] > 0, t, 0.0)


COHERENCE_MEMORY = 0.9
"""Per round factor by which the remembered coherence of the unobserved part decays
(it forgets a large value within about 20 rounds: 0.9**20 = 0.12)."""


def line_search_curvature(dw_sq, full, observed, n_updated: int, reference, lam: float,
                          n_samples: int):
    """``lam/2 ||A d||^2`` of the round's direction as the line search estimates it.

    Only the active holders' part of the direction's primal image is known
    (``dw_sq = ||A_active d||^2 / (lam N)^2``): absent holders add theirs when
    they return. The rest is estimated from the squared norms it involves,
    ``full - observed`` (``sum_i ||x_i||^2 d_i^2`` over all and over the active
    parts), times a *coherence*: how much larger ``||A d||^2`` is than
    ``sum_i ||x_i||^2 d_i^2``, per updated sample. The active part shows this
    round's value; the estimate uses the largest of it and the remembered one
    (decaying by :data:`COHERENCE_MEMORY` a round). Using this round's value
    alone -- what scaling the active part by ``full / observed`` does -- was
    measured to under-estimate the curvature by up to 500x in early rounds at
    partial participation, where one block's sums cancel and the absent
    blocks' do not: the dual then fell. With the memory, ijcnn1 3x3 at half
    participation settles at relative loss 1e-3 in 115 rounds instead of 285
    and reuters 3x3 in 280 instead of 410 (docs/convergence.md). With every
    holder active ``full == observed`` and the value is exact.

    Parameters
    ----------
    dw_sq, full, observed : ndarray, shape (C,)
    n_updated : int
        Samples the direction moves.
    reference : ndarray, shape (C,)
        The remembered coherence (zeros at the start).
    lam : float
    n_samples : int

    Returns
    -------
    quadratic : ndarray, shape (C,)
    reference : ndarray, shape (C,)
        The coherence to remember.
    """
    dw_sq, full, observed = (np.asarray(v, dtype=float) for v in (dw_sq, full, observed))
    scale = (lam * n_samples) ** 2
    per_sample = scale / max(int(n_updated), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        now = np.where(observed > 0, dw_sq * per_sample / np.where(observed > 0, observed, 1.0),
                       0.0)
    reference = np.maximum(now, COHERENCE_MEMORY * np.asarray(reference, dtype=float))
    unobserved = np.maximum(full - observed, 0.0)
    return 0.5 * lam * (dw_sq + reference * unobserved / per_sample), reference


def next_sigma(sigma: float, steps: np.ndarray, ceiling: float) -> float:
    """Adapt the subproblems' scaling from the line search's step(s).

    ``ceiling`` is a value at which every subproblem is safe whatever the data
    (:func:`sigma_ceiling`); at the optimum no step helps (t = 0), and sigma
    must not grow without bound there.
    """
    t = float(np.mean(steps))
    if t < _SHORT_STEP:
        sigma = sigma / max(t, 0.25)
    elif t >= _FULL_STEP:
        sigma = sigma * _SIGMA_SHRINK
    return float(min(max(sigma, SIGMA_FLOOR), ceiling))


def average_weight(t: int) -> float:
    """Weight of round ``t``'s iterate in the running average."""
    return max(2.0 / (t + 1.0), AVERAGE_FLOOR)


def sigma_ceiling(client_features, n_features: int, client_sizes) -> float:
    """A scaling that makes any subproblem a lower bound on the dual's change.

    By Cauchy-Schwarz, ``||sum_{j <= n} v_j||^2 <= n sum ||v_j||^2``: with
    ``n`` the most samples a client updates times the most clients adding on a
    feature, the model's curvature ``sigma ||x_i||^2`` dominates whatever the
    coupling between samples.
    """
    return initial_sigma(client_features, n_features) * float(max(np.max(client_sizes), 1))


def initial_sigma(client_features, n_features: int) -> float:
    """CoCoA+'s safe scaling: the most clients whose updates add up on one feature."""
    counts = np.bincount(np.concatenate([np.asarray(f, dtype=np.int64) for f in client_features]),
                         minlength=n_features)
    return float(max(int(counts.max(initial=1)), 1))


# ---------------------------------------------------------------------------
# State kept between rounds
# ---------------------------------------------------------------------------


class SpanHistory:
    """The recent rounds the clients' models are built from, for all clients at once.

    A client remembers the inner products of its samples from its last ``depth``
    active rounds, and forgets rounds older than ``2 * depth`` server rounds
    (directions that old say little about the current iterates). Every holder
    active in a round receives the same inner products, so one ring of
    ``2 * depth`` slots indexed by (sample, slot) holds every client's history
    exactly; ``slots[k]`` lists client ``k``'s slots, most recent first.

    The inner products are kept only for the slots some client still lists, in the
    columns of ``z`` that :func:`place_slot` gives them (``z_column``): a client
    lists its last ``depth`` active rounds, so at participation ``p`` about
    ``depth / p`` rounds are live, not the whole window (ijcnn1 12x12 at ``p =
    0.9``: 31 columns of the window's 184).

    The server keeps, per slot, the model's move in that round ``u_r = w_r - w_{r-1}``
    and their Gram matrix. A client's directions -- the current ``w`` and the
    moves between its consecutive active rounds, sums of consecutive ``u`` --
    get their Gram matrix from range sums of those, never as differences of
    nearly equal products of whole models (which would lose the small moves'
    digits to cancellation).

    Attributes
    ----------
    z : ndarray, shape (N, P, C)
        Inner products sent to the clients in a slot's round, in the slot's
        column (only the entries of that round's active clients' samples are
        meaningful); a sample's columns are contiguous, which is how the local
        solver reads them. ``P <= W`` widens as more slots are live.
    z_column : ndarray of int, shape (W,)
        The column of ``z`` of each slot (``-1``: none; not read).
    moves : ndarray, shape (W, M, C)
    move_gram : ndarray, shape (C, W, W)
    w : ndarray, shape (M, C)
        The model of the latest round.
    slots : ndarray of int, shape (K, depth)
    slot_round : ndarray of int, shape (W,)
    """

    GROWS_ALONG = {"z": 1}
    """The arrays that grow in a run other than along their first axis (a checkpoint's
    may be wider than a fresh set-up's: :func:`hyfl.runtime.checkpoint` allows it)."""

    def __init__(self, z, z_column, moves, move_gram, w, slots, slot_round):
        self.z, self.z_column = z, z_column
        self.moves, self.move_gram, self.w = moves, move_gram, w
        self.slots, self.slot_round = slots, slot_round
        self._kept_chronology = {}  # (t, oldest) -> _chronology's, until record

    @classmethod
    def empty(cls, n_clients: int, n_samples: int | None, n_features: int, n_outputs: int,
              depth: int, size: int | None = None) -> SpanHistory:
        """An empty history (``n_samples=None``: the server's part, without inner products)
        of ``size`` slots (default ``2 * depth``)."""
        size = 2 * depth if size is None else int(size)
        return cls(
            # at full participation the live slots are the last depth rounds; the store
            # widens when fewer clients take part (record)
            z=None if n_samples is None else np.zeros((n_samples, min(size, depth), n_outputs)),
            z_column=np.full(size, -1, dtype=np.int64),
            moves=np.zeros((size, n_features, n_outputs)),
            move_gram=np.zeros((n_outputs, size, size)),
            w=np.zeros((n_features, n_outputs)),
            slots=np.full((n_clients, depth), -1, dtype=np.int64),
            slot_round=np.full(size, -1, dtype=np.int64),
        )

    @property
    def size(self) -> int:
        return self.moves.shape[0]

    def record(self, t: int, w: np.ndarray, clients: np.ndarray, samples: np.ndarray = None,
               z: np.ndarray = None) -> None:
        """Round ``t``: the flagged clients got ``z`` (rows ``samples``) computed with ``w``."""
        slot = t % self.size
        self._kept_chronology = {}  # slot_round changes
        self.slots[self.slots == slot] = -1  # that slot's round is now too old
        move = w - self.w
        self.moves[slot] = move
        self.w = np.array(w, dtype=float)
        self.slot_round[slot] = t
        row = np.einsum("mc,smc->cs", move, self.moves)
        self.move_gram[:, slot, :] = row
        self.move_gram[:, :, slot] = row
        self.slots[clients, 1:] = self.slots[clients, :-1]
        self.slots[clients, 0] = slot
        if self.z is not None:
            column = place_slot(self.z_column, slot, self.slots, self.z.shape[1])
            if column == self.z.shape[1]:
                self._widen_ring()
            self.z[samples, column] = z

    def _widen_ring(self) -> None:
        """``z`` with an eighth more columns (at least 4, at most the window), the new ones
        zero.

        In place where numpy allows it: the buffer grows by ``realloc`` (a large block's
        pages are remapped, not copied) and each sample's columns move to their wider
        place (:func:`hyfdca_compiled.spread_rows`). A widened copy held the old ring and
        the new one at once: on ten million rows 4.4 + 5 GB, the run's peak. numpy's own
        check refuses the resize while anything else refers to the array (a view, a weak
        reference, a checkpoint being written; per Python version, as numpy counts), so
        the ring is held by this frame alone while it asks, and a refusal takes the copy.
        """
        from hyfl.algorithms import hyfdca_compiled as compiled

        z, self.z = self.z, None
        n, width, C = z.shape
        wider = min(self.size, width + max(4, width // 8))
        try:
            if z.base is not None or not z.flags.c_contiguous:
                raise ValueError("not the owner of a contiguous buffer")
            z.shape = (z.size,)
            z.resize(n * wider * C)  # refcheck: refused while another reference lives
        except ValueError:
            z.shape = (n, width, C)
            self.z = np.zeros((n, wider, C))
            self.z[:, :width] = z
            return
        compiled.spread_rows(z, n, width * C, wider * C)
        z.shape = (n, wider, C)
        self.z = z

    def ring_pairs(self, pairs: np.ndarray) -> np.ndarray:
        """``pairs`` as columns of ``z`` (what the kernels that read ``z`` take)."""
        return column_pairs(pairs, self.z_column)

    def directions(self, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """History directions and their Gram matrices of clients active in the latest round.

        Returns
        -------
        pairs : ndarray of int, shape (A, R, 2)
            See :func:`direction_pairs`.
        grams : ndarray, shape (A, C, R, R)
        """
        pairs = direction_pairs(self.slots[clients])
        t = int(self.slot_round.max())
        return pairs, self.direction_grams(pairs, t)

    def _chronology(self, t: int, oldest: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """The slots of the rounds from ``oldest`` to ``t`` in time order (``order``; by
        default every slot, the unused ones first) and each one's place among them
        (``position``; 0 for the others).

        Kept until the next :meth:`record` (a round asks for it about 15 times, once per
        client and group; only ``record`` changes ``slot_round``). Read-only arrays.
        """
        kept = self._kept_chronology.get((t, oldest))
        if kept is not None:
            return kept
        live = np.flatnonzero(self.slot_round >= oldest)
        order = live[np.argsort(self.slot_round[live], kind="stable")]
        position = np.zeros(self.size, dtype=np.int64)
        position[order] = np.arange(order.size)
        position.flags.writeable = order.flags.writeable = False
        self._kept_chronology[(t, oldest)] = position, order
        return position, order

    def _span_chronology(self, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_chronology` from the oldest slot ``pairs`` names: a direction sums the
        moves of the rounds between two of its client's slots, so no older round is read
        (about R / p slots, not the window's W; on reuters 12x12 the directions' vectors
        over the whole window were half a round)."""
        return self._chronology(int(self.slot_round.max()), self._oldest_named(pairs))

    def _oldest_named(self, pairs: np.ndarray) -> int:
        """The round of the oldest slot ``pairs`` names (after the latest if none)."""
        named = pairs[pairs >= 0]
        return (int(self.slot_round[named].min()) if named.size
                else int(self.slot_round.max()) + 1)

    def direction_vectors(self, pairs: np.ndarray, features: np.ndarray) -> np.ndarray:
        """One client's directions (see :func:`direction_pairs`) on the given features.

        As for the Gram matrices, a move between two rounds is the sum of the
        moves of the rounds in between, not a difference of two whole models.

        Parameters
        ----------
        pairs : ndarray of int, shape (R, 2)
        features : ndarray of int, shape (F,)

        Returns
        -------
        ndarray, shape (F, R, C)
        """
        from hyfl.algorithms import hyfdca_compiled as compiled

        position, chrono = self._span_chronology(pairs)
        return compiled.direction_vectors(
            self.moves, self.w, chrono, position, np.ascontiguousarray(pairs, dtype=np.int64),
            np.ascontiguousarray(features, dtype=np.int64))

    def direction_products(self, v: np.ndarray, pairs: np.ndarray) -> np.ndarray:
        """``<v, u_j>`` per output for the directions ``pairs`` ((..., R, 2), see
        :func:`direction_pairs`): shape (..., C, R).

        What :meth:`direction_vectors` on every feature followed by a product with ``v``
        gives, from ``v``'s products with each slot's move (one pass over the moves
        instead of one per client).
        """
        position, chrono = self._span_chronology(pairs)
        W = chrono.size
        per_slot = np.einsum("mc,smc->sc", v, self.moves[chrono])  # (W, C)
        cumulative = np.zeros((W + 1, v.shape[1]))
        np.cumsum(per_slot, axis=0, out=cumulative[1:])
        p, b = pairs[..., 0], pairs[..., 1]
        hi = np.where(p >= 0, position[np.maximum(p, 0)] + 1, 0)
        lo = np.where(b >= 0, position[np.maximum(b, 0)] + 1, 0)
        out = cumulative[hi] - cumulative[lo]  # (..., R, C)
        first = (p >= 0) & (b < 0)  # w itself
        out[first] = np.sum(v * self.w, axis=0) - (cumulative[W] - cumulative[hi[first]])
        out[p < 0] = 0.0
        return np.swapaxes(out, -1, -2)

    def direction_grams(self, pairs: np.ndarray, t: int) -> np.ndarray:
        """Gram matrices of the directions ``pairs`` ((..., R, 2), see
        :func:`direction_pairs`) at round t: shape (..., C, R, R).

        Direction ``j > 0`` sums the moves of the rounds after its older slot up to its
        newer, so its products with another are sums over a box of the moves' Gram
        matrix (cumulative sums in time order, from the oldest slot ``pairs`` names: the
        window's older rounds add nothing to any box, and summing them was O(W^2) a
        call); direction 0 is the current ``w``.
        """
        from hyfl.algorithms import hyfdca_compiled as compiled

        position, chrono = self._chronology(t, self._oldest_named(pairs))
        with_w = np.ascontiguousarray(np.einsum("mc,smc->cs", self.w, self.moves)[:, chrono])
        norm_w = np.sum(self.w * self.w, axis=0)  # (C,)
        flat = np.ascontiguousarray(pairs, dtype=np.int64).reshape(-1, *pairs.shape[-2:])
        grams = compiled.direction_grams(np.ascontiguousarray(self.move_gram),
                                         np.ascontiguousarray(chrono, dtype=np.int64),
                                         np.ascontiguousarray(position, dtype=np.int64),
                                         with_w, norm_w, flat)
        return grams.reshape(*pairs.shape[:-2], *grams.shape[1:])


class ClientMemory:
    """One client's side of :class:`SpanHistory`: its samples' inner products and its
    block of the weights, by slot.

    The slots follow the same ring as the server's (slot ``t mod W``), so the
    server can name the directions and send their Gram matrix; like the server's,
    a slot is forgotten once its round is ``size`` rounds old (``rounds`` lists the
    slots' rounds), even if the client took no part since. Only the ``depth``
    slots the client lists are kept, in the columns ``column`` gives them
    (:func:`place_slot`).
    """

    STATE = ("z", "w", "slots", "rounds", "column")
    """The arrays that make up the memory's state (what a party saves and restores)."""

    def __init__(self, n_samples: int, n_features: int, n_outputs: int, depth: int,
                 size: int | None = None):
        self.size = 2 * depth if size is None else int(size)
        self.z = np.zeros((n_samples, depth, n_outputs))
        self.w = np.zeros((depth, n_features, n_outputs))
        self.slots = np.full(depth, -1, dtype=np.int64)
        self.rounds = np.full(depth, -1, dtype=np.int64)
        self.column = np.full(self.size, -1, dtype=np.int64)

    def record(self, t: int, z: np.ndarray, w: np.ndarray) -> None:
        slot = t % self.size
        self.slots[self.rounds <= t - self.size] = -1  # the server reused those slots
        self.slots[1:], self.rounds[1:] = self.slots[:-1].copy(), self.rounds[:-1].copy()
        self.slots[0], self.rounds[0] = slot, t
        column = place_slot(self.column, slot, self.slots, self.slots.size)
        self.z[:, column] = z
        self.w[column] = w

    def pairs(self) -> np.ndarray:
        return direction_pairs(self.slots[None, :])

    def problem_with(self, arrays: dict) -> str | None:
        """What is wrong with ``arrays`` (by the names of :attr:`STATE`) as this
        memory's state, naming the array; None if they could be its state (as
        :meth:`record` leaves it).
        """
        for key in self.STATE:
            value, mine = arrays.get(key), getattr(self, key)
            kind = "f" if mine.dtype.kind == "f" else "iu"
            if (not isinstance(value, np.ndarray) or value.dtype.kind not in kind
                    or value.shape != mine.shape):
                return (f"has a cocoa memory whose {key!r} is not "
                        f"{'a float' if kind == 'f' else 'an integer'} array of shape "
                        f"{mine.shape}")
            if kind == "f" and not np.all(np.isfinite(value)):
                return f"has a cocoa memory whose {key!r} holds NaN or infinite values"
        slots, rounds, column = arrays["slots"], arrays["rounds"], arrays["column"]
        n = int(np.count_nonzero(slots >= 0))
        listed, listed_rounds = slots[:n], rounds[:n]
        if (np.any(slots[n:] != -1) or np.any(listed >= self.size)
                or np.any(listed_rounds < 0) or np.any(np.diff(listed_rounds) >= 0)
                or np.any(listed_rounds % self.size != listed)):
            return ("has a cocoa memory whose 'slots' and 'rounds' are not its last "
                    f"active rounds (newest first, slot = round mod {self.size}, -1 after)")
        unlisted = np.ones(self.size, dtype=bool)
        unlisted[listed] = False
        columns = column[listed]
        if (np.any(column[unlisted] != -1) or np.any(columns < 0)
                or np.any(columns >= self.slots.size) or np.unique(columns).size != n):
            return ("has a cocoa memory whose 'column' does not give each listed slot "
                    f"its own column below {self.slots.size} (and -1 to the others)")
        return None

    def ring_pairs(self) -> np.ndarray:
        """:meth:`pairs` as columns of ``z`` and ``w``."""
        return column_pairs(self.pairs(), self.column)

    def direction_vectors(self) -> np.ndarray:
        """The directions on the client's features, shape (F, R, C)."""
        p, b = self.ring_pairs()[0].T
        vectors = (np.where((p >= 0)[:, None, None], self.w[np.maximum(p, 0)], 0.0)
                   - np.where((b >= 0)[:, None, None], self.w[np.maximum(b, 0)], 0.0))
        return np.moveaxis(vectors, 0, 1)


class RunningAverage:
    """Exponential moving average of the rows of an iterate, paid only for rows that change.

    ``avg_t = (1 - rho_t) avg_{t-1} + rho_t x_t`` with ``rho_t`` from
    :func:`average_weight`. A row of ``x`` that has not changed since round
    ``u`` needs no work until it changes or is read: its average follows from
    the product of the ``(1 - rho)`` factors in between, kept as a running sum
    of logarithms (``rho_1 = 1`` forgets the start; its logarithm is stood in
    for by a number whose exponential is 0 in float64, so differences stay
    finite).
    """

    _FORGET = -800.0

    def __init__(self, value: np.ndarray):
        self.avg = np.array(value, dtype=float)
        self.since = np.zeros(self.avg.shape[0], dtype=np.int64)  # round of the last update
        self.log_keep = np.zeros(1)  # log prod_{r <= t} (1 - rho_r), by round t
        self.t = 0

    def advance(self, t: int) -> None:
        """Round ``t`` begins."""
        rho = average_weight(t)
        step = np.log1p(-rho) if rho < 1 else self._FORGET
        self.log_keep = np.append(self.log_keep, self.log_keep[-1] + step)
        self.t = t

    def _keep(self, rows, until: int) -> np.ndarray:
        keep = np.exp(self.log_keep[until] - self.log_keep[self.since[rows]])
        return keep.reshape((-1,) + (1,) * (self.avg.ndim - 1))

    def update(self, rows: np.ndarray, before: np.ndarray, after: np.ndarray) -> None:
        """``rows`` changed in the current round from ``before`` to ``after``."""
        previous = before + self._keep(rows, self.t - 1) * (self.avg[rows] - before)
        rho = average_weight(self.t)
        self.avg[rows] = (1.0 - rho) * previous + rho * after
        self.since[rows] = self.t

    def value(self, current: np.ndarray) -> np.ndarray:
        """The average at the current round for an iterate now equal to ``current``."""
        return current + self._keep(slice(None), self.t) * (self.avg - current)
