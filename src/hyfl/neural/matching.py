"""Matched averaging of MLP inference models (HyFEM's "Global Matching Updates").

HyFEM (Algorithm 1) keeps a global inference model ``theta_0`` whose input is the
concatenation of ALL views' embeddings, while client ``m`` trains a local MLP
``w_m`` on the views it holds, so its first-layer rows are a subset of the global
rows. The server relates them by a matching ``w_m ~ Pi_m theta_0`` and solves::

    min_{theta_0, Pi_1..Pi_M}  sum_m ||w_m - Pi_m theta_0||^2

by block coordinate descent, layer by layer: re-match one random client with the
Hungarian algorithm against the global model built from the others, then
recompute ``theta_0`` as the average of the matched neurons.

Conventions. A layer is ``(W, b)`` with ``W`` of shape ``(n_in, n_out)`` and
``b`` of shape ``(n_out,)``, applied as ``y = x @ W + b``. An MLP is a sequence of
``L + 1`` layers: ``L`` hidden layers and the output layer, whose neurons are the
classes and are never permuted. Hidden neuron ``j`` of a layer is column ``j``
of its ``W`` (incoming weights), entry ``j`` of its ``b`` and row ``j`` of the
next layer's ``W`` (outgoing weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from hyfl.errors import check_choice, check_int, fail

Layer = tuple[np.ndarray, np.ndarray]
"""``(W, b)``: ``W`` of shape ``(n_in, n_out)``, ``b`` of shape ``(n_out,)``; ``y = x @ W + b``."""

MATCHINGS = ("hungarian", "identity")


@dataclass(frozen=True)
class MatchResult:
    """The outcome of :func:`matched_average`.

    Attributes
    ----------
    layers : tuple of Layer
        The new global model, same shapes as ``global_layers``.
    assignments : tuple of tuple of numpy.ndarray
        ``assignments[m][l]``: int array of shape ``(n_hidden_l of client m,)``,
        the global neuron index of each of client ``m``'s neurons of hidden layer
        ``l`` (injective). ``select_for_client(layers, input_rows[m],
        assignments[m])`` is client ``m``'s share ``Pi_m theta_0``.
    cost : float
        The final matching objective ``sum_m ||w_m - Pi_m theta_0||^2``: squared
        distances between every client parameter and the global parameter it is
        matched to (on the rows each client has), each parameter counted once.
    """

    layers: tuple[Layer, ...]
    assignments: tuple[tuple[np.ndarray, ...], ...]
    cost: float


def permute_hidden(layers: Sequence[Layer], perms: Sequence[np.ndarray]) -> tuple[Layer, ...]:
    """Reorder the hidden neurons of an MLP without changing the function it computes.

    Parameters
    ----------
    layers : sequence of Layer
        ``L + 1`` layers; ``layers[l][0]`` has shape ``(n_{l-1}, n_l)``.
    perms : sequence of numpy.ndarray
        ``L`` permutations; ``perms[l]`` has shape ``(n_l,)``. New neuron ``j`` of
        hidden layer ``l`` is old neuron ``perms[l][j]``.

    Returns
    -------
    tuple of Layer
        Same shapes as ``layers``: the columns of layer ``l`` and the rows of
        layer ``l + 1`` are permuted by ``perms[l]``.
    """
    layers = [(np.asarray(w, dtype=float), np.asarray(b, dtype=float)) for w, b in layers]
    if len(perms) != len(layers) - 1:
        raise fail(
            "perms",
            f"has {len(perms)} permutations for {len(layers) - 1} hidden layers",
            "Pass one permutation per hidden layer (all layers but the output layer).",
        )
    out = [list(layer) for layer in layers]
    for l, p in enumerate(perms):
        p = np.asarray(p)
        n = layers[l][0].shape[1]
        if p.shape != (n,) or not np.array_equal(np.sort(p), np.arange(n)):
            raise fail(
                f"perms[{l}]",
                f"is not a permutation of range({n}) (hidden layer {l} has {n} neurons)",
                "Pass a reordering of 0..n-1 such as rng.permutation(n).",
            )
        out[l][0] = out[l][0][:, p]
        out[l][1] = out[l][1][p]
        out[l + 1][0] = out[l + 1][0][p, :]
    return tuple((w, b) for w, b in out)


def select_for_client(
    global_layers: Sequence[Layer], input_rows: np.ndarray, assignment: Sequence[np.ndarray]
) -> tuple[Layer, ...]:
    """Client ``m``'s share ``Pi_m theta_0`` of the global model, in the client's order.

    Parameters
    ----------
    global_layers : sequence of Layer
        The global MLP, ``L + 1`` layers.
    input_rows : numpy.ndarray
        Int array, shape ``(n_in of client,)``: the global first-layer row of each
        of the client's first-layer rows.
    assignment : sequence of numpy.ndarray
        ``L`` int arrays; ``assignment[l]`` has shape ``(n_hidden_l of client,)``
        and gives the global neuron of each client neuron (as
        ``MatchResult.assignments[m]``).

    Returns
    -------
    tuple of Layer
        The client-shaped MLP: layer 0 is ``W[input_rows][:, a_0]``, layer ``l`` is
        ``W[a_{l-1}][:, a_l]``, the output layer is ``W[a_{L-1}]`` with all classes.
    """
    if len(assignment) != len(global_layers) - 1:
        raise fail(
            "assignment",
            f"has {len(assignment)} arrays for {len(global_layers) - 1} hidden layers",
            "Pass one assignment array per hidden layer.",
        )
    rows = np.asarray(input_rows)
    out = []
    for l, (w, b) in enumerate(global_layers):
        w, b = np.asarray(w, dtype=float), np.asarray(b, dtype=float)
        cols = np.asarray(assignment[l]) if l < len(assignment) else np.arange(w.shape[1])
        out.append((w[np.ix_(rows, cols)], b[cols]))
        rows = cols
    return tuple(out)


def matched_average(
    clients: Sequence[Sequence[Layer]],
    input_rows: Sequence[np.ndarray],
    global_layers: Sequence[Layer],
    *,
    rounds: int = 5,
    rng: np.random.Generator,
    matching: str = "hungarian",
    client_weights: np.ndarray | None = None,
) -> MatchResult:
    """Match the clients' hidden neurons to the global ones and average them.

    Hidden layers are matched in order ``l = 0 .. L-1``; the output layer (the
    classes) is never permuted. For hidden layer ``l``:

    1. Initial assignment: identity for a client whose layer has as many neurons
       as the global layer; otherwise the Hungarian matching against the global
       layer averaged from the identity-assigned clients (``global_layers``
       where none provides an entry).
    2. ``rounds`` times: pick ``m' = rng.integers(M)``, rebuild the global layer
       from the other clients (leave-one-out; with one client this is
       ``global_layers``), re-match ``m'`` against it with the Hungarian
       algorithm (``scipy.optimize.linear_sum_assignment``).

    Afterwards the whole global model is recomputed with the assignments fixed.
    The identity start assumes equal-size clients received the global model in
    the global order (``select_for_client`` with ``np.arange``); clients whose
    neurons are mutually permuted need more rounds to agree (each round only
    re-matches one client against the average of the others).

    Matching cost between client neuron ``j`` and global neuron ``k``: the
    squared Euclidean distance of their incoming weights on the rows the client
    has (layer 0: ``input_rows[m]``; layer ``l > 0``: the global neurons its
    previous layer was matched to), their biases, and, for the last hidden
    layer only, their outgoing weights (the output columns are un-permuted
    classes, so those rows are comparable; this is what matches clients whose
    input views are disjoint).

    Global update with fixed assignments: ``W[r, k]`` is the weighted mean over
    the clients that have row ``r`` and a neuron matched to ``k``; ``b[k]`` the
    weighted mean over the clients with a neuron matched to ``k``; the output
    layer's ``W[r, c]`` averages the clients having (matched) row ``r`` and its
    bias all clients. An entry no client provides keeps its value from
    ``global_layers``. A client with fewer hidden neurons than the global layer
    is matched injectively: the paper pads it with zero-weight dummy neurons,
    but here a global neuron left unmatched by client ``m`` simply gets no
    contribution from ``m`` (a dummy is absent, not a vote for zero).

    Parameters
    ----------
    clients : sequence of sequence of Layer
        Per client its MLP, ``L + 1`` layers. ``clients[m][0][0]`` has shape
        ``(len(input_rows[m]), h_{m,0})``; hidden layer ``l`` has
        ``h_{m,l} <= n_l`` neurons (the global size); the output layer has the
        global number of classes ``C``.
    input_rows : sequence of numpy.ndarray
        Per client an int array of shape ``(clients[m][0][0].shape[0],)``,
        strictly increasing, in ``[0, global_layers[0][0].shape[0])``: the global
        first-layer row of each of the client's first-layer rows.
    global_layers : sequence of Layer
        The current global model ``theta_0``, ``L + 1`` layers: fixes the global
        sizes and is the fallback for entries no client provides.
    rounds : int, default 5
        ``P``, matching rounds per hidden layer; 0 keeps the initial assignment
        and just averages.
    rng : numpy.random.Generator
        Picks the client re-matched in each round.
    matching : {"hungarian", "identity"}
        ``"identity"`` pairs client neuron ``j`` with global neuron ``j`` (all
        sizes must be equal; ``rounds`` is then unused): plain row-wise
        averaging.
    client_weights : numpy.ndarray, optional
        Shape ``(M,)``, positive finite averaging weights (default equal).

    Returns
    -------
    MatchResult
        The new global layers, the assignments and the final cost.

    Raises
    ------
    HyflError
        On inconsistent shapes or layer counts, bad ``input_rows``, NaN/inf
        weights, an unknown ``matching``, ``"identity"`` with unequal sizes,
        ``rounds < 0``, a client layer larger than the global one or bad weights;
        the message names the client and layer.
    """
    check_choice("matching", matching, MATCHINGS)
    rounds = check_int("rounds", rounds, minimum=0)
    if not isinstance(rng, np.random.Generator):
        raise fail(
            "rng", f"is a {type(rng).__name__}", "Pass a numpy.random.Generator (default_rng)."
        )
    glob = _check_global(global_layers)
    sizes = [w.shape[1] for w, _ in glob]
    models, rows0 = _check_clients(clients, input_rows, glob)
    weights = _check_weights(client_weights, len(models))
    n_hidden = len(glob) - 1
    if matching == "identity":
        for m, model in enumerate(models):
            for l in range(n_hidden):
                if model[l][0].shape[1] != sizes[l]:
                    raise fail(
                        f"clients[{m}] (client {m}, layer {l})",
                        f"has {model[l][0].shape[1]} hidden neurons but the global layer has "
                        f"{sizes[l]}, so identity matching is undefined",
                        'Use matching="hungarian", or give every client the global sizes.',
                    )

    # rows[m]: the global indices of the rows of client m's current layer
    rows = list(rows0)
    assign: list[list[np.ndarray]] = [[] for _ in models]
    for l in range(n_hidden):
        own = [models[m][l][0].shape[1] for m in range(len(models))]
        cols: list[np.ndarray | None] = [
            np.arange(sizes[l]) if own[m] == sizes[l] else None for m in range(len(models))
        ]
        if matching == "hungarian":
            pending = [m for m in range(len(models)) if cols[m] is None]
            if pending:
                # the smaller clients start from the average of the identity-assigned ones,
                # which is closer to the result than the fallback alone
                target = _global_for(models, l, rows, cols, glob, weights, skip=None)
                for m in pending:
                    cols[m] = _hungarian(models[m], l, rows[m], *target)
            for _ in range(rounds):
                m = int(rng.integers(len(models)))
                target = _global_for(models, l, rows, cols, glob, weights, skip=m)
                cols[m] = _hungarian(models[m], l, rows[m], *target)
        for m in range(len(models)):
            assign[m].append(cols[m])
        rows = cols  # the next layer's rows are this layer's matched neurons

    out_layers = _average_all(models, rows0, assign, glob, weights)
    cost = 0.0
    for m, model in enumerate(models):
        share = select_for_client(out_layers, rows0[m], assign[m])
        for (w, b), (gw, gb) in zip(model, share):
            cost += float(np.sum((w - gw) ** 2) + np.sum((b - gb) ** 2))
    return MatchResult(
        layers=out_layers,
        assignments=tuple(tuple(a.copy() for a in per) for per in assign),
        cost=cost,
    )


# --- the global update ------------------------------------------------------------------------


def _average_layer(
    layers: Sequence[Layer],
    rows: Sequence[np.ndarray],
    cols: Sequence[np.ndarray],
    fallback: Layer,
    weights: np.ndarray,
) -> Layer:
    """Weighted mean of the clients' entries scattered to global positions; else fallback.

    ``layers[i]`` has shape ``(len(rows[i]), len(cols[i]))``; rows and cols are
    injective, so a plain fancy-index ``+=`` never drops a duplicate.
    """
    fw, fb = fallback
    num, den = np.zeros_like(fw), np.zeros(fw.shape)
    num_b, den_b = np.zeros_like(fb), np.zeros(fb.shape)
    for (w, b), r, c, wt in zip(layers, rows, cols, weights):
        ix = np.ix_(r, c)
        num[ix] += wt * w
        den[ix] += wt
        num_b[c] += wt * b
        den_b[c] += wt
    # np.divide with where= leaves the fallback in the entries nobody provides
    new_w = np.divide(num, den, out=fw.copy(), where=den > 0)
    new_b = np.divide(num_b, den_b, out=fb.copy(), where=den_b > 0)
    return new_w, new_b


def _global_for(models, l, rows, cols, glob, weights, *, skip):
    """Global hidden layer ``l`` (and the output layer if ``l`` is the last hidden one)
    from the clients other than ``skip`` whose assignment at ``l`` is known."""
    use = [m for m in range(len(models)) if m != skip and cols[m] is not None]
    layer = _average_layer(
        [models[m][l] for m in use],
        [rows[m] for m in use],
        [cols[m] for m in use],
        glob[l],
        weights[use],
    )
    if l != len(glob) - 2:
        return layer, None
    n_cls = glob[-1][0].shape[1]
    out = _average_layer(
        [models[m][-1] for m in use],
        [cols[m] for m in use],
        [np.arange(n_cls)] * len(use),
        glob[-1],
        weights[use],
    )
    return layer, out


def _average_all(models, rows0, assign, glob, weights) -> tuple[Layer, ...]:
    out = []
    n_cls = glob[-1][0].shape[1]
    for l in range(len(glob)):
        rows = [rows0[m] if l == 0 else assign[m][l - 1] for m in range(len(models))]
        cols = [assign[m][l] if l < len(glob) - 1 else np.arange(n_cls) for m in range(len(models))]
        out.append(_average_layer([mod[l] for mod in models], rows, cols, glob[l], weights))
    return tuple(out)


# --- matching -------------------------------------------------------------------------------


def _hungarian(model, l, rows, layer: Layer, out_layer: Layer | None) -> np.ndarray:
    """Injective assignment of the client's neurons of hidden layer ``l`` to global neurons.

    Signatures are rows of ``(h, d)`` matrices: incoming weights on the client's
    rows, bias, and outgoing weights when ``out_layer`` is given (last hidden
    layer). Cost ``||a||^2 + ||g||^2 - 2 a.g``: one matrix product, no loop over
    neurons.
    """
    w, b = model[l]
    gw, gb = layer
    a_parts = [w.T, b[:, None]]
    g_parts = [gw[rows].T, gb[:, None]]
    if out_layer is not None:
        a_parts.append(model[l + 1][0])
        g_parts.append(out_layer[0])
    a = np.concatenate(a_parts, axis=1)
    g = np.concatenate(g_parts, axis=1)
    cost = (a * a).sum(1)[:, None] + (g * g).sum(1)[None, :] - 2.0 * (a @ g.T)
    # rounding can make the expansion slightly negative; distances are >= 0
    np.maximum(cost, 0.0, out=cost)
    row_ind, col_ind = linear_sum_assignment(cost)
    # row_ind is 0..h-1 in order because h <= n_global (every client neuron is assigned)
    return col_ind.astype(np.intp)


# --- validation -----------------------------------------------------------------------------


def _as_layer(layer, where: str) -> Layer:
    try:
        w, b = layer
    except (TypeError, ValueError):
        raise fail(where, "is not a (W, b) pair", "Pass each layer as (W, b).") from None
    try:
        w, b = np.asarray(w, dtype=float), np.asarray(b, dtype=float)
    except (TypeError, ValueError):
        raise fail(where, "has non-numeric weights", "Pass float arrays (W, b).") from None
    if w.ndim != 2 or b.ndim != 1 or b.shape[0] != w.shape[1]:
        raise fail(
            where,
            f"has W of shape {w.shape} and b of shape {b.shape}",
            "Pass W of shape (n_in, n_out) and b of shape (n_out,).",
        )
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(b))):
        raise fail(where, "contains NaN or inf weights", "Pass finite weights.")
    return w, b


def _check_global(global_layers) -> list[Layer]:
    if len(global_layers) < 1:
        raise fail("global_layers", "is empty", "Pass the global MLP's layers (at least one).")
    glob = [
        _as_layer(layer, f"global_layers[{l}] (layer {l})") for l, layer in enumerate(global_layers)
    ]
    for l in range(1, len(glob)):
        if glob[l][0].shape[0] != glob[l - 1][0].shape[1]:
            raise fail(
                f"global_layers[{l}] (layer {l})",
                f"has {glob[l][0].shape[0]} input rows but layer {l - 1} has "
                f"{glob[l - 1][0].shape[1]} neurons",
                "Pass consecutive layers whose sizes chain.",
            )
    return glob


def _check_clients(clients, input_rows, glob):
    if len(clients) < 1:
        raise fail("clients", "is empty", "Pass at least one client model.")
    if len(input_rows) != len(clients):
        raise fail(
            "input_rows",
            f"has {len(input_rows)} entries for {len(clients)} clients",
            "Pass one row-index array per client.",
        )
    n_in = glob[0][0].shape[0]
    models, rows0 = [], []
    for m, model in enumerate(clients):
        if len(model) != len(glob):
            raise fail(
                f"clients[{m}] (client {m})",
                f"has {len(model)} layers but the global model has {len(glob)}",
                "Give every client the global number of layers (hidden + output).",
            )
        layers = [
            _as_layer(layer, f"clients[{m}][{l}] (client {m}, layer {l})")
            for l, layer in enumerate(model)
        ]
        for l, (w, _) in enumerate(layers):
            where = f"clients[{m}][{l}] (client {m}, layer {l})"
            if l > 0 and w.shape[0] != layers[l - 1][0].shape[1]:
                raise fail(
                    where,
                    f"has {w.shape[0]} input rows but the client's layer {l - 1} has "
                    f"{layers[l - 1][0].shape[1]} neurons",
                    "Pass consecutive layers whose sizes chain.",
                )
            n_glob = glob[l][0].shape[1]
            if l == len(glob) - 1 and w.shape[1] != n_glob:
                raise fail(
                    where,
                    f"has {w.shape[1]} outputs but the global output layer has {n_glob}",
                    "Give every client the global number of classes.",
                )
            if w.shape[1] > n_glob:
                raise fail(
                    where,
                    f"has {w.shape[1]} hidden neurons, more than the global layer's {n_glob}",
                    "Make the global layer at least as wide as every client's.",
                )
        r = np.asarray(input_rows[m])
        where = f"input_rows[{m}] (client {m}, layer 0)"
        if r.ndim != 1 or r.dtype == bool or not np.issubdtype(r.dtype, np.integer):
            raise fail(
                where,
                f"is not a 1-d integer array (dtype {r.dtype}, shape {r.shape})",
                "Pass the global row index of each of the client's input rows.",
            )
        if r.shape[0] != layers[0][0].shape[0]:
            raise fail(
                where,
                f"has {r.shape[0]} rows but the client's first layer has {layers[0][0].shape[0]}",
                "Pass one global row index per first-layer row.",
            )
        if r.size and (r.min() < 0 or r.max() >= n_in):
            raise fail(
                where,
                f"has indices outside [0, {n_in}) (min {r.min()}, max {r.max()})",
                f"Use indices of the global first layer's {n_in} rows.",
            )
        if np.any(np.diff(r) <= 0):
            raise fail(
                where,
                "is not strictly increasing (it must be sorted and unique)",
                "Pass each global row once, in increasing order, with W's rows in that order.",
            )
        models.append(layers)
        rows0.append(r.astype(np.intp))
    return models, rows0


def _check_weights(client_weights, n: int) -> np.ndarray:
    if client_weights is None:
        return np.ones(n)
    w = np.asarray(client_weights, dtype=float)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise fail(
            "client_weights",
            f"must be {n} finite positive numbers, got {client_weights!r}",
            "Pass one positive weight per client (leave a client out rather than weight 0).",
        )
    return w
