"""The cocoa rule's model of the absent holders: sample groups and composite weights.

In a hybrid split with partial participation the server's ``w`` and the inner
products the clients receive disagree. A sample's SecureInnerProduct adds each
holder's part ``x_i[F_k]^T w_k`` with the weights ``w_k`` that holder received in
its last active round: the clients see the margins of a *composite* ``w~``
(current weights on the active holders' features, older ones on the absent
holders'), while the server's history of its own ``w`` -- the directions whose Gram
matrix it sends -- never was the model those margins were taken with. And when
the round moves a sample, only its active holders send the primal image of the
move: ``w`` misses the absent holders' part of it until they return. Measured
(docs/convergence.md, section 6), these two gaps are why the default stalled with
few clients a round and on small dense data.

Where every sample of a client has the same holders (grids, horizontal and
vertical splits, the quadrant split, the paper's nonzero split, party files that
share their ids) the clients fall into *sample groups*: the clients holding one set
of samples. Each group has its own coordinates, one per (member, feature of that
member): member ``k``'s features form one slice of them. Where members hold
disjoint features (grids) these are the group's features; where they share some
(the nonzero split deals each sample's entries to the members, so one column can
be held by several) a shared column has one coordinate per member, and what the
group model computes there is summed back onto the column. A sample's margin is
the sum of its members' parts, each with the weights that member holds, so in
these coordinates the composite below is one vector even where the members'
versions of a shared column differ. For those partitions this module

* records, per group, the history of the composite weights ``w~_g`` (on each
  member's slice, the weights that member last computed inner products with),
  so that the Gram matrices the server sends describe the directions the
  clients' remembered margins were really taken along;
* moves a client's margins from ``w~_g`` to the server's ``w`` inside its model's
  span (:func:`margin_offsets`): the server sends ``g_j = <w - w~_g, u_j>`` for the
  client's directions ``u_j``, ``R`` numbers per output, and the client adds
  ``m_i^T G^+ g`` (``m_i`` its remembered margins of sample ``i`` on the directions,
  ``G`` their Gram matrix) -- ``x_i^T P (w - w~_g)`` with ``P`` the projection on the span;
* estimates the absent holders' image of a round's dual move inside the span
  (:func:`absent_image`): one active member of the group sends
  ``s_j = <X_g^T d, u_j> / (lam N)`` from its margins (``R`` numbers per output); the
  server subtracts the active members' image, which it has, and applies the
  least-norm ``y`` on the absent members' slices with ``U_abs^T y = b``. The
  estimate is exact when the directions span those slices. It is kept per absent
  member and replaced by the exact image when that member returns and re-sends its
  primal part.

Other partitions (party files whose ids partly overlap, any split where a client's
samples have different holders) keep the server's own history, as before. Every
function here is shared by the stacked engine (:mod:`hyfl.algorithms.hyfdca`) and
the message-level parties (:mod:`hyfl.algorithms.hyfdca_parties`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from hyfl.algorithms import hyfdca_kernels
from hyfl.algorithms.hyfdca_local import SpanHistory

RCOND = 1e-9
"""Relative cut-off of the absent features' Gram matrix in the least-norm estimate."""


@dataclass(frozen=True)
class SampleGroups:
    """Clients grouped by the samples they hold (see the module docstring).

    Attributes
    ----------
    of_client : ndarray of int, shape (K,)
        Group of each client.
    of_sample : ndarray of int, shape (N,)
        Group of each sample.
    members : tuple of ndarray of int
        Clients of each group, ascending.
    client_features : tuple of ndarray of int
        Each client's features (global ids).
    columns : tuple of ndarray of int
        Per group, the feature (global id) of each of its coordinates: its members'
        features, member after member, shape (L_g,).
    start : ndarray of int, shape (K,)
        Where client ``k``'s slice starts in its group's coordinates (it has
        ``len(client_features[k])`` of them, in the order of its features).
    disjoint : bool
        No two members of a group share a feature (then a group's coordinates are
        distinct features, and images on them need no summing).
    """

    of_client: np.ndarray
    of_sample: np.ndarray
    members: tuple[np.ndarray, ...]
    client_features: tuple[np.ndarray, ...]
    columns: tuple[np.ndarray, ...]
    start: np.ndarray
    disjoint: bool

    @classmethod
    def build(cls, of_client, of_sample, members, client_features) -> SampleGroups:
        """The groups with their coordinates laid out member after member."""
        start = np.zeros(of_client.size, dtype=np.int64)
        columns, disjoint = [], True
        for group in members:
            offset = 0
            for k in group:
                start[k] = offset
                offset += client_features[k].size
            held = (np.concatenate([client_features[k] for k in group]) if group.size
                    else np.empty(0, dtype=np.int64))
            columns.append(held)
            disjoint = disjoint and np.unique(held).size == held.size
        return cls(of_client, of_sample, members, client_features, tuple(columns), start,
                   bool(disjoint))

    @property
    def n_groups(self) -> int:
        return len(self.members)

    def size(self, g: int) -> int:
        """L_g, the number of group ``g``'s coordinates."""
        return int(self.columns[g].size)

    def coordinates(self, clients) -> np.ndarray:
        """The slices of the given clients (of one group) in its coordinates, concatenated."""
        clients = [int(k) for k in clients]
        if not clients:
            return np.empty(0, dtype=np.int64)
        return np.concatenate([self.start[k] + np.arange(self.client_features[k].size)
                               for k in clients])

    def lift(self, g: int, v: np.ndarray) -> np.ndarray:
        """A vector on the features (M, C) in group ``g``'s coordinates (L_g, C)."""
        return v[self.columns[g]]

    def add_to_features(self, out: np.ndarray, g: int, coordinates: np.ndarray,
                        values: np.ndarray) -> None:
        """Add ``values`` (n, C) on group ``g``'s ``coordinates`` onto their features of
        ``out`` (M, C), summing a feature that several of them share."""
        np.add.at(out, self.columns[g][coordinates], values)

    def place(self, g: int, parts: dict) -> np.ndarray:
        """Members' values ``{k: (|M_k|, C)}`` on their slices of group ``g``'s coordinates,
        zero elsewhere: (L_g, C)."""
        out = None
        for k, values in parts.items():
            if out is None:
                out = np.zeros((self.size(g), values.shape[1]))
            out[self.start[k]:self.start[k] + self.client_features[k].size] = values
        return out

    def split(self, clients, values: np.ndarray) -> dict[int, np.ndarray]:
        """Values on the clients' slices (as :meth:`coordinates` concatenates them), per
        client: ``{k: (|M_k|, C)}``."""
        out, start = {}, 0
        for k in clients:
            size = self.client_features[k].size
            out[int(k)] = values[start:start + size]
            start += size
        return out

    def composite(self, snapshot_of) -> list[np.ndarray]:
        """``w~_g`` of every group, each (L_g, C): on member ``k``'s slice the weights
        ``snapshot_of(k)`` (shape (|M_k|, C))."""
        return [np.concatenate([snapshot_of(int(k)) for k in group]) for group in self.members]


def find_sample_groups(client_samples, client_features, n_samples: int) -> SampleGroups | None:
    """The sample groups of a partition, or None where some client's samples do not all
    have the same holders."""
    K = len(client_samples)
    sizes = np.array([len(s) for s in client_samples])
    if K == 0 or np.any(sizes == 0):
        return None
    incidence = sp.csr_matrix(
        (np.ones(int(sizes.sum())), (np.concatenate(client_samples), np.repeat(np.arange(K),
                                                                              sizes))),
        shape=(n_samples, K))
    incidence.sum_duplicates()
    keys: dict[tuple, int] = {}
    of_client = np.empty(K, dtype=np.int64)
    for k, samples in enumerate(client_samples):
        rows = incidence[np.asarray(samples)]
        first = rows[0]
        if (rows - sp.csr_matrix(np.ones((rows.shape[0], 1))) @ first).count_nonzero():
            return None  # its samples have different holders
        of_client[k] = keys.setdefault(tuple(first.indices.tolist()), len(keys))
    members = tuple(np.array(key, dtype=np.int64) for key in keys)
    of_sample = np.full(n_samples, -1, dtype=np.int64)
    for k, samples in enumerate(client_samples):
        of_sample[np.asarray(samples)] = of_client[k]
    features = tuple(np.asarray(f, dtype=np.int64) for f in client_features)
    return SampleGroups.build(of_client, of_sample, members, features)


class GroupHistory:
    """Per sample group, the composite weights of the recent rounds (server side).

    Each group's :class:`~hyfl.algorithms.hyfdca_local.SpanHistory` (without inner
    products) records ``w~_g`` in every round, in the same ring of slots as the
    clients' remembered margins, so a client's directions -- named by slot pairs --
    are read from its group's history: their Gram matrices, and their values on any
    features.
    """

    def __init__(self, groups: SampleGroups, histories: list[SpanHistory]):
        self.groups, self.histories = groups, histories

    @classmethod
    def empty(cls, groups: SampleGroups, n_outputs: int, depth: int, size: int) -> GroupHistory:
        """Empty histories, each in its group's coordinates (L_g of them)."""
        K = groups.of_client.size
        return cls(groups, [SpanHistory.empty(K, None, groups.size(g), n_outputs, depth, size)
                            for g in range(groups.n_groups)])

    def record(self, t: int, composites: np.ndarray) -> None:
        none = np.empty(0, dtype=np.int64)
        for history, composite in zip(self.histories, composites):
            history.record(t, composite, none)

    def grams(self, clients: np.ndarray, pairs: np.ndarray, t: int) -> np.ndarray:
        """Gram matrices of the clients' directions (pairs (A, R, 2)): (A, C, R, R)."""
        C = self.histories[0].w.shape[1]
        R = pairs.shape[1]
        out = np.zeros((clients.size, C, R, R))
        of = self.groups.of_client[clients]
        for g in np.unique(of):
            sel = np.flatnonzero(of == g)
            out[sel] = self.histories[g].direction_grams(pairs[sel], t)
        return out

    def towards_w(self, clients: np.ndarray, pairs: np.ndarray, w: np.ndarray,
                  composites: list[np.ndarray]) -> np.ndarray:
        """``<w - w~_g, u_j>`` for each client's directions (pairs (A, R, 2)) with its
        group's composite: (A, C, R), one pass over each group's moves."""
        out = np.empty((clients.size, w.shape[1], pairs.shape[1]))
        of = self.groups.of_client[clients]
        for g in np.unique(of):
            sel = np.flatnonzero(of == g)
            out[sel] = self.inner_with_directions(int(clients[sel[0]]), pairs[sel],
                                                  self.groups.lift(g, w) - composites[g])
        return out

    def estimate_absent(self, g: int, sender: int, pairs: np.ndarray, absent: np.ndarray,
                        sums: np.ndarray, active_image: np.ndarray, out: np.ndarray):
        """Group ``g``'s absent members' image of a move (:func:`absent_image`) from the
        sender's span sums (C, R) and the active members' image in the group's coordinates
        (L_g, C); added onto ``out`` (M, C). Returns each absent member's part
        ``{k: (|M_k|, C)}`` and whether it is exact."""
        coordinates = self.groups.coordinates(absent)
        estimate, exact = absent_image(self.vectors(sender, pairs, coordinates), sums,
                                       self.inner_with_directions(sender, pairs, active_image))
        self.groups.add_to_features(out, g, coordinates, estimate)
        return self.groups.split(absent, estimate), exact

    def vectors(self, k: int, pairs: np.ndarray, coordinates: np.ndarray) -> np.ndarray:
        """Client ``k``'s directions (pairs (R, 2)) on its group's ``coordinates``:
        (F, R, C)."""
        return self.histories[self.groups.of_client[k]].direction_vectors(pairs, coordinates)

    def inner_with_directions(self, k: int, pairs: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``<v, u_j>`` for client ``k``'s directions ``u_j`` (pairs (R, 2)) or, with pairs
        (A, R, 2), for several clients of ``k``'s group: (C, R) or (A, C, R). ``v`` is in
        the group's coordinates, shape (L_g, C)."""
        return self.histories[self.groups.of_client[k]].direction_products(v, pairs)


def directions_margins(ring: np.ndarray, samples: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """``x_i^T u_j`` of the samples on one client's directions (pairs (R, 2)), from the
    remembered inner products ``ring`` (N', W, C): shape (n, R, C)."""
    p, b = pairs[:, 0], pairs[:, 1]
    rows = ring[samples]
    newer = np.where((p >= 0)[None, :, None], rows[:, np.maximum(p, 0)], 0.0)
    older = np.where((b >= 0)[None, :, None], rows[:, np.maximum(b, 0)], 0.0)
    return newer - older


def margin_offsets(margins: np.ndarray, transforms: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``x_i^T P (w - w~)`` for one client's samples: ``m_i^T T T^T g``.

    Parameters
    ----------
    margins : ndarray, shape (n, R, C)
        The samples' margins on the client's directions.
    transforms : ndarray, shape (C, R, R)
        The client's span transforms ``T`` (``T T^T = G^+``).
    g : ndarray, shape (C, R)
        ``<w - w~, u_j>`` from the server.

    Returns
    -------
    ndarray, shape (n, C)
    """
    return np.einsum("nrc,cr->nc", margins, offset_weights(transforms, g))


def offset_weights(transforms: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``h = T T^T g`` per output, shape (C, R): a row's margin offset is ``m_i . h``.

    ``transforms`` (C, R, R) and ``g`` (C, R) as in :func:`margin_offsets`.
    """
    return np.einsum("crs,cts,ct->cr", transforms, transforms, g)


def ring_margin_offsets(ring: np.ndarray, samples: np.ndarray, pairs: np.ndarray,
                        transforms: np.ndarray, g: np.ndarray,
                        column: np.ndarray) -> np.ndarray:
    """:func:`margin_offsets` of :func:`directions_margins`, without the (n, R, C) margins.

    A margin on direction ``j`` is the difference of two remembered inner
    products (ring slots ``p_j`` and ``b_j``), so the offset is a weighted sum
    of the samples' ring slots: ``sum_w ring[i, w, c] H[w, c]``. Each slot used
    is read once, instead of gathering every slot of every sample and building
    the margins (two thirds of a cocoa round's CPU on ijcnn1 12x12). ``column``
    (W,) is each slot's column of ``ring`` (``SpanHistory.z_column``,
    ``ClientMemory.column``); the slots are added in ascending order whatever their
    columns.
    """
    h = offset_weights(transforms, g)  # (C, R)
    weights = np.zeros((column.size, h.shape[0]))  # (W, C): per ring slot and output
    p, b = pairs[:, 0], pairs[:, 1]
    np.add.at(weights, p[p >= 0], h.T[p >= 0])
    np.subtract.at(weights, b[b >= 0], h.T[b >= 0])
    used = np.flatnonzero(np.any(weights != 0.0, axis=1))
    by_column = np.zeros((ring.shape[1], h.shape[0]))
    by_column[column[used]] = weights[used]
    return hyfdca_kernels.weighted_slot_sums(ring, samples, column[used], by_column)


def ring_span_sums(ring: np.ndarray, samples: np.ndarray, pairs: np.ndarray,
                   change: np.ndarray, lam_n: float, column: np.ndarray) -> np.ndarray:
    """:func:`span_sums` of :func:`directions_margins`, without the (n, R, C) margins:
    each ring slot a direction uses is weighed with the change once, ``S[w, c] =
    sum_i ring[i, w, c] d[i, c]``, and ``s_j = (S[p_j] - S[b_j]) / (lam N)``
    (``column`` as in :func:`ring_margin_offsets`)."""
    p, b = pairs[:, 0], pairs[:, 1]
    slots = np.unique(np.concatenate([p[p >= 0], b[b >= 0]]))
    weighed = np.zeros((column.size, change.shape[1]))
    weighed[slots] = hyfdca_kernels.slot_change_sums(ring, samples, column[slots], change)
    newer = np.where((p >= 0)[:, None], weighed[np.maximum(p, 0)], 0.0)
    older = np.where((b >= 0)[:, None], weighed[np.maximum(b, 0)], 0.0)
    return (newer - older).T / lam_n


def span_sums(margins: np.ndarray, change: np.ndarray, lam_n: float) -> np.ndarray:
    """``s_j = <X^T d, u_j> / (lam N)`` of a dual change ``d`` (n, C) of the samples whose
    margins on the directions are ``margins`` (n, R, C): shape (C, R)."""
    return np.einsum("nrc,nc->cr", margins, change) / lam_n


def absent_image(U_absent: np.ndarray, sums: np.ndarray, active_sums: np.ndarray):
    """The least-norm image on the absent features consistent with the span sums.

    Parameters
    ----------
    U_absent : ndarray, shape (F, R, C)
        The directions on the absent members' slices of the group's coordinates.
    sums : ndarray, shape (C, R)
        :func:`span_sums` of the move (all features).
    active_sums : ndarray, shape (C, R)
        ``<image on the active members' slices, u_j>``.

    Returns
    -------
    estimate : ndarray, shape (F, C)
    exact : bool
        Whether the directions span the absent slices (then the estimate is the image).
    """
    F, R, C = U_absent.shape
    estimate = np.zeros((F, C))
    exact = F > 0
    b = sums - active_sums
    for c in range(C):
        # U = P S V^T: the least-norm y with U^T y = b is P S^+ V^T b, singular values
        # below sqrt(RCOND) of the largest dropped (RCOND on U^T U's eigenvalues).
        left, singular, right_t = np.linalg.svd(U_absent[:, :, c], full_matrices=False)
        top = singular.max(initial=0.0)
        keep = singular > np.sqrt(RCOND) * top
        estimate[:, c] = left[:, keep] @ ((right_t[keep] @ b[c]) / singular[keep])
        # numpy's matrix_rank tolerance: the directions span all F absent features
        rank = np.count_nonzero(singular > top * max(F, R) * np.finfo(float).eps)
        exact = exact and rank >= F
    return estimate, bool(exact)
