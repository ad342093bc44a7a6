"""Views of the data for the neural algorithms, derived from a partition.

A *view* is a group of features held by exactly the same set of clients (the
atoms of the partition's feature sets). For the MNIST quadrant split the views
are the four quadrants; for ``vertical:Q`` the Q feature groups; for party
files, the columns that the same parties hold. Each client holds some samples
and the views inside its feature set. When the data are images
(``meta["image_shape"]``) and a view is a rectangle of pixels, its shape is
recorded so that convolutional networks can use it.

The linear algorithms' bias column (MNIST's constant feature of value 10) is
dropped: networks have their own biases.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hyfl.errors import fail


@dataclass(frozen=True)
class ViewData:
    """Training and validation data cut into views, and who holds which part.

    Attributes
    ----------
    X : ndarray, shape (N, F), float32
        Training features (dense; bias column removed).
    y : ndarray, shape (N,), int32
        Class index ``0..C-1`` of each training sample.
    classes : ndarray, shape (C,)
        The original label of each class index.
    views : tuple of ndarray
        ``views[d]``: the columns of ``X`` in view d (sorted).
    view_shapes : tuple
        ``(rows, cols)`` of view d's bounding box when the data are images, else None.
    view_positions : tuple
        Flat positions of view d's features inside that box (None: not images).
        A convolutional network sees the box, with zeros at the pixels the view
        does not have (``vertical:2`` of MNIST with its bias column cuts one
        pixel off the first half).
    client_samples : tuple of ndarray
        ``client_samples[k]``: the training rows client k holds.
    client_views : tuple of tuple of int
        ``client_views[k]``: the views client k holds, ascending.
    X_val, y_val : ndarray or None
        Validation data (all views), class indices as ``y``.
    input_features : int
        Width of the data the views were cut from (``X`` has ``dropped`` fewer columns).
    dropped : tuple of int
        The source columns no view holds (MNIST's bias column): a model file
        records them so that predictions drop them too.
    """

    X: np.ndarray
    y: np.ndarray
    classes: np.ndarray
    views: tuple[np.ndarray, ...]
    view_shapes: tuple[tuple[int, int] | None, ...]
    view_positions: tuple[np.ndarray | None, ...]
    client_samples: tuple[np.ndarray, ...]
    client_views: tuple[tuple[int, ...], ...]
    X_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    input_features: int = 0
    dropped: tuple[int, ...] = ()

    @property
    def n_classes(self) -> int:
        return int(self.classes.size)

    @property
    def n_clients(self) -> int:
        return len(self.client_samples)

    @property
    def n_views(self) -> int:
        return len(self.views)

    def holders(self, view: int) -> np.ndarray:
        """Clients that hold view ``view``."""
        return np.array([k for k, vs in enumerate(self.client_views) if view in vs], dtype=int)


def class_indices(y: np.ndarray, classes: np.ndarray | None = None):
    """``(index, classes)``: each label's position in the sorted label set."""
    y = np.asarray(y)
    if classes is None:
        classes = np.unique(y)
    index = np.searchsorted(classes, y)
    bad = (index >= classes.size) | (classes[np.minimum(index, classes.size - 1)] != y)
    if bad.any():
        raise fail(
            "validation labels",
            f"include {y[bad][0].item()!r}, which the training labels never take",
            f"Use validation data with the training classes {classes[:10].tolist()}.",
        )
    return index.astype(np.int32), classes


def feature_atoms(partition, n_features: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Group features by the set of clients holding them.

    Returns ``(atoms, membership)``: ``atoms[d]`` the sorted feature ids of
    group d (ordered by their first feature) and ``membership`` the (K, D)
    boolean matrix of which client holds which group.
    """
    K = partition.n_clients
    holds = np.zeros((K, n_features), dtype=bool)
    for k, feats in enumerate(partition.features):
        holds[k, feats] = True
    # one byte string per feature column identifies its holder set
    # (F, ceil(K/8)); contiguous rows, or the void view below fails for more than 8 clients
    packed = np.ascontiguousarray(np.packbits(holds, axis=0).T)
    _, first, inverse = np.unique(
        packed.view(np.dtype((np.void, packed.shape[1]))).ravel(),
        return_index=True, return_inverse=True,
    )
    order = np.argsort(first)  # groups in the order of their first feature
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    group = rank[inverse.ravel()]
    atoms = [np.flatnonzero(group == d) for d in range(order.size)]
    membership = holds[:, [a[0] for a in atoms]]
    return atoms, membership


def bounding_box(features: np.ndarray, image_shape):
    """``((rows, cols), positions)`` of pixel ids ``features`` in their bounding box.

    ``positions[i]`` is feature i's flat (row-major) position inside the
    box; a rectangle of pixels gives ``arange``. ``(None, None)`` when the
    data are not images.
    """
    if image_shape is None:
        return None, None
    rows, cols = (int(v) for v in image_shape)
    if features.size == 0 or features.max() >= rows * cols:
        return None, None
    r, c = np.divmod(features, cols)
    h, w = int(r.max() - r.min() + 1), int(c.max() - c.min() + 1)
    return (h, w), ((r - r.min()) * w + (c - c.min())).astype(np.int64)


def make_view_data(train, val, partition) -> ViewData:
    """Cut ``train`` (and ``val``) into the views of ``partition``.

    Parameters
    ----------
    train, val : hyfl.data.dataset.Dataset (val may be None)
    partition : hyfl.partition.Partition
        Validated against ``train`` here.

    Raises
    ------
    HyflError
        Regression data (the neural algorithms classify), or a client left
        with no view once the bias column is dropped.
    """
    if train.task == "regression":
        raise fail(
            f"data {train.name!r}", "is a regression task, but the neural algorithms classify",
            "Use classification data (e.g. --data mnist), or a linear algorithm with "
            "--loss squared.",
        )
    partition.validate(train.X)
    meta = getattr(train, "meta", {}) or {}
    bias = meta.get("bias_feature")
    n_features = train.X.shape[1]
    atoms, membership = feature_atoms(partition, n_features)
    keep = np.ones(n_features, dtype=bool)
    if bias is not None:
        keep[int(bias)] = False
    # column ids after dropping the bias: position among kept features
    new_id = np.cumsum(keep) - 1
    views, shapes, positions, kept_atoms = [], [], [], []
    for d, atom in enumerate(atoms):
        atom = atom[keep[atom]]
        if atom.size == 0:
            continue  # the bias alone (never a view of its own)
        kept_atoms.append(d)
        views.append(new_id[atom].astype(np.int64))
        shape, position = bounding_box(atom, meta.get("image_shape"))
        shapes.append(shape)
        positions.append(position)
    membership = membership[:, kept_atoms]
    client_views = tuple(tuple(int(d) for d in np.flatnonzero(row)) for row in membership)
    for k, vs in enumerate(client_views):
        if not vs:
            raise fail(
                f"client {k}", "holds no features besides the bias column",
                "Give every client at least one view (feature group) of the data.",
            )
    X = np.asarray(train.X[:, keep].toarray(), dtype=np.float32)
    y, classes = class_indices(train.y)
    X_val = y_val = None
    if val is not None:
        X_val = np.asarray(val.X[:, keep].toarray(), dtype=np.float32)
        y_val, _ = class_indices(val.y, classes)
    return ViewData(
        X=X, y=y, classes=classes, views=tuple(views), view_shapes=tuple(shapes),
        view_positions=tuple(positions),
        client_samples=tuple(np.asarray(s, dtype=np.int64) for s in partition.samples),
        client_views=client_views, X_val=X_val, y_val=y_val,
        input_features=n_features, dropped=tuple(int(c) for c in np.flatnonzero(~keep)),
    )


def view_data_from_arrays(
    views, y, client_samples, client_views, *, val_views=None, val_y=None, image_shapes=None
) -> ViewData:
    """A :class:`ViewData` from your own multi-view arrays: one array per view.

    Parameters
    ----------
    views : sequence of array-like, each shape (N, d_v)
        The training samples' features, view by view (row i is sample i in every view).
    y : array-like, shape (N,)
        Labels (any sortable values; classes are the sorted distinct labels).
    client_samples : sequence of array-like of int
        ``client_samples[k]``: the rows client k holds.
    client_views : sequence of sequence of int
        ``client_views[k]``: the views client k holds.
    val_views, val_y : optional
        Validation data, the same views (all of them) and labels.
    image_shapes : sequence of (rows, cols) or None, optional
        Per view, its image shape when it is an image (for ``extractor=cnn`` /
        ``bottom=cnn``); ``d_v`` must equal ``rows * cols``.

    Raises
    ------
    HyflError
        Views of different lengths, non-finite values, a client with no sample
        or no view, a view or sample id out of range, a sample no client holds.
    """
    arrays = [np.asarray(v, dtype=np.float32) for v in views]
    if not arrays:
        raise fail("views", "is empty", "Pass one (N, d) array per view.")
    n = arrays[0].shape[0]
    for d, a in enumerate(arrays):
        if a.ndim != 2 or a.shape[0] != n:
            raise fail(f"view {d}", f"has shape {a.shape}, expected ({n}, d)",
                       "Give every view one row per sample, in the same order.")
        if not np.isfinite(a).all():
            raise fail(f"view {d}", "contains NaN or inf", "Clean or impute the values first.")
    y_index, classes = class_indices(np.asarray(y))
    if y_index.size != n:
        raise fail("y", f"has {y_index.size} labels for {n} samples", "Give one label per row.")
    samples = tuple(np.asarray(s, dtype=np.int64) for s in client_samples)
    holds = tuple(tuple(sorted(int(d) for d in vs)) for vs in client_views)
    if len(samples) != len(holds):
        raise fail("client_samples and client_views", f"name {len(samples)} and {len(holds)} "
                   "clients", "Give both for every client.")
    covered = np.zeros(n, dtype=bool)
    for k, (rows, vs) in enumerate(zip(samples, holds)):
        if rows.size == 0 or not vs:
            raise fail(f"client {k}", "holds no samples or no views",
                       "Give every client at least one sample and one view.")
        if rows.min() < 0 or rows.max() >= n or min(vs) < 0 or max(vs) >= len(arrays):
            raise fail(f"client {k}", "names a sample or view that does not exist",
                       f"Use sample ids 0..{n - 1} and views 0..{len(arrays) - 1}.")
        covered[rows] = True
    if not covered.all():
        raise fail(f"sample {int(np.flatnonzero(~covered)[0])}", "is held by no client",
                   "Give every sample to at least one client, or drop it.")
    starts = np.cumsum([0] + [a.shape[1] for a in arrays])
    columns = tuple(np.arange(starts[d], starts[d + 1]) for d in range(len(arrays)))
    shapes = tuple(image_shapes) if image_shapes is not None else (None,) * len(arrays)
    positions = tuple(None if s is None else np.arange(arrays[d].shape[1])
                      for d, s in enumerate(shapes))
    for d, s in enumerate(shapes):
        if s is not None and int(s[0]) * int(s[1]) != arrays[d].shape[1]:
            raise fail(f"image_shapes[{d}]", f"is {s}, but view {d} has {arrays[d].shape[1]} "
                       "features", "Give (rows, cols) with rows * cols features, or None.")
    X_val = y_val = None
    if val_views is not None:
        X_val = np.hstack([np.asarray(v, dtype=np.float32) for v in val_views])
        if X_val.shape[1] != starts[-1]:
            raise fail("val_views", f"have {X_val.shape[1]} features, the training views "
                       f"{starts[-1]}", "Pass the same views for validation.")
        y_val, _ = class_indices(np.asarray(val_y), classes)
    return ViewData(
        X=np.hstack(arrays), y=y_index, classes=classes, views=columns, view_shapes=shapes,
        view_positions=positions, client_samples=samples, client_views=holds,
        X_val=X_val, y_val=y_val, input_features=int(starts[-1]),
    )
