"""hyfl.neural.views: views from partitions, bounding boxes, bias column, labels."""

import numpy as np
import pytest
import scipy.sparse as sp

pytest.importorskip("jax")

from hyfl.data.dataset import Dataset  # noqa: E402
from hyfl.errors import HyflError  # noqa: E402
from hyfl.neural.views import (  # noqa: E402
    bounding_box,
    class_indices,
    feature_atoms,
    make_view_data,
)
from hyfl.partition import from_blocks, grid, quadrant, vertical  # noqa: E402


def reference_atoms(partition, n_features):
    """Group features by their holder set, the slow way: a dict keyed by frozensets."""
    holders = {m: frozenset(k for k, f in enumerate(partition.features) if m in set(f.tolist()))
               for m in range(n_features)}
    groups: dict[frozenset, list[int]] = {}
    for m in range(n_features):
        groups.setdefault(holders[m], []).append(m)
    atoms = sorted(groups.values(), key=lambda g: g[0])
    membership = np.array([[k in holders[a[0]] for a in atoms]
                           for k in range(partition.n_clients)])
    return atoms, membership


def check_atoms(partition, n_features):
    atoms, membership = feature_atoms(partition, n_features)
    expected, expected_membership = reference_atoms(partition, n_features)
    assert [a.tolist() for a in atoms] == expected
    np.testing.assert_array_equal(membership, expected_membership)
    return atoms, membership


def test_quadrant_atoms_are_the_four_quadrants():
    part = quadrant(40, 8, (28, 28), bias_feature=784)
    atoms, membership = check_atoms(part, 785)
    assert len(atoms) == 4
    pixel = np.arange(784).reshape(28, 28)
    assert atoms[0].tolist() == sorted(pixel[:14, :14].ravel().tolist())
    assert atoms[1].tolist() == sorted(pixel[:14, 14:].ravel().tolist())
    assert atoms[3].tolist() == sorted(pixel[14:, 14:].ravel().tolist()) + [784]  # with the bias
    # clients 2q, 2q+1 hold quadrant q
    np.testing.assert_array_equal(membership, np.repeat(np.eye(4, dtype=bool), 2, axis=0))


def test_grid_and_overlapping_atoms():
    part = grid(30, 17, 3, 4, seed=2)
    atoms, membership = check_atoms(part, 17)
    assert len(atoms) == 4 and membership.sum(axis=0).tolist() == [3, 3, 3, 3]
    assert sorted(np.concatenate(atoms).tolist()) == list(range(17))
    # overlapping feature sets: the atoms are the intersections
    part = from_blocks([(range(5), [0, 1, 2, 3]), (range(5), [2, 3, 4]), (range(5), [4, 5])],
                       5, 6)
    atoms, membership = check_atoms(part, 6)
    assert [a.tolist() for a in atoms] == [[0, 1], [2, 3], [4], [5]]
    # more than 8 clients: holder sets need more than one packed byte
    blocks = [(range(3), [k, 10 + (k % 2)]) for k in range(10)]
    check_atoms(from_blocks(blocks, 3, 12), 12)


def test_bounding_box():
    # a 2x2 square in a 4x4 image: a full box
    shape, pos = bounding_box(np.array([5, 6, 9, 10]), (4, 4))
    assert shape == (2, 2) and pos.tolist() == [0, 1, 2, 3]
    # an L shape: box rows 0-1, cols 0-2, two pixels missing
    shape, pos = bounding_box(np.array([0, 1, 4, 5, 6]), (4, 4))
    assert shape == (2, 3) and pos.tolist() == [0, 1, 3, 4, 5]
    # a column in the middle
    shape, pos = bounding_box(np.array([2, 6, 10]), (4, 4))
    assert shape == (3, 1) and pos.tolist() == [0, 1, 2]
    assert bounding_box(np.array([1, 2]), None) == (None, None)
    assert bounding_box(np.array([15, 16]), (4, 4)) == (None, None)  # the bias is no pixel
    assert bounding_box(np.array([], dtype=np.int64), (4, 4)) == (None, None)


def image_dataset(n=24, labels=(3, 7, 9), seed=0, task="multiclass"):
    """4x4 'images' and a bias column of value 10 at feature 16, as MNIST's loader makes."""
    rng = np.random.default_rng(seed)
    X = np.hstack([rng.random((n, 16)) * (rng.random((n, 16)) < 0.7), np.full((n, 1), 10.0)])
    y = np.asarray(labels)[rng.integers(len(labels), size=n)]
    y[: len(labels)] = labels  # every label present
    return Dataset(X=sp.csr_matrix(X), y=y.astype(float), name="tiny", task=task,
                   meta={"image_shape": (4, 4), "bias_feature": 16})


def test_make_view_data_quadrants_drop_the_bias():
    train, val = image_dataset(), image_dataset(n=10, seed=1)
    part = quadrant(24, 4, (4, 4), bias_feature=16)
    data = make_view_data(train, val, part)
    dense = train.X.toarray()
    assert data.X.dtype == np.float32 and data.X.shape == (24, 16)
    np.testing.assert_array_equal(data.X, dense[:, :16].astype(np.float32))
    np.testing.assert_array_equal(data.X_val, val.X.toarray()[:, :16].astype(np.float32))
    pixel = np.arange(16).reshape(4, 4)
    assert [v.tolist() for v in data.views] == [
        sorted(pixel[:2, :2].ravel().tolist()), sorted(pixel[:2, 2:].ravel().tolist()),
        sorted(pixel[2:, :2].ravel().tolist()), sorted(pixel[2:, 2:].ravel().tolist()),
    ]
    assert data.view_shapes == ((2, 2),) * 4
    assert all(p.tolist() == [0, 1, 2, 3] for p in data.view_positions)
    assert data.client_views == ((0,), (1,), (2,), (3,))
    for k in range(4):
        np.testing.assert_array_equal(data.client_samples[k], part.samples[k])
    np.testing.assert_array_equal(data.classes, [3, 7, 9])
    np.testing.assert_array_equal(data.y, np.searchsorted([3, 7, 9], train.y))
    np.testing.assert_array_equal(data.y_val, np.searchsorted([3, 7, 9], val.y))
    assert data.holders(2).tolist() == [2] and data.n_views == 4 and data.n_classes == 3


def test_make_view_data_bias_inside_and_irregular_views():
    # an L-shaped view and the rest of the image with the bias, which is dropped
    train = image_dataset()
    rest = [2, 3, *range(7, 17)]
    part = from_blocks([(range(24), [0, 1, 4, 5, 6]), (range(24), rest)], 24, 17)
    data = make_view_data(train, None, part)
    assert data.X_val is None and data.y_val is None
    assert [v.tolist() for v in data.views] == [[0, 1, 4, 5, 6], rest[:-1]]
    assert data.view_shapes[0] == (2, 3) and data.view_positions[0].tolist() == [0, 1, 3, 4, 5]
    assert data.view_shapes[1] == (4, 4) and data.view_positions[1].tolist() == rest[:-1]
    assert data.client_views == ((0,), (1,))
    # no image shape: no boxes
    flat = Dataset(X=train.X, y=train.y, name="flat", task="multiclass",
                   meta={"bias_feature": 16})
    data = make_view_data(flat, None, vertical(24, 17, 2))
    assert data.view_shapes == (None, None) and data.view_positions == (None, None)
    assert sum(v.size for v in data.views) == 16


def test_make_view_data_refuses():
    train = image_dataset()
    part = from_blocks([(range(24), list(range(16))), (range(24), [16])], 24, 17)
    with pytest.raises(HyflError, match="^client 1 holds no features besides the bias column"):
        make_view_data(train, None, part)
    reg = Dataset(X=train.X, y=np.linspace(0, 1, 24), name="reg", task="regression",
                  meta=train.meta)
    with pytest.raises(HyflError, match="^data 'reg' is a regression task"):
        make_view_data(reg, None, quadrant(24, 4, (4, 4), bias_feature=16))
    val = image_dataset(n=10, labels=(3, 7, 8), seed=1)
    with pytest.raises(HyflError, match=r"^validation labels include 8\.0, which the training "
                       r"labels never take\. Use validation data with the training classes "
                       r"\[3\.0, 7\.0, 9\.0\]"):
        make_view_data(train, val, quadrant(24, 4, (4, 4), bias_feature=16))


def test_class_indices():
    index, classes = class_indices(np.array([5, -1, 5, 2]))
    assert classes.tolist() == [-1, 2, 5] and index.tolist() == [2, 0, 2, 1]
    assert index.dtype == np.int32
    index, _ = class_indices(np.array([2, 2, -1]), classes)
    assert index.tolist() == [1, 1, 0]
    for bad in ([6], [0], [-2], [9, 99]):  # above, between and below the classes
        with pytest.raises(HyflError, match="^validation labels include"):
            class_indices(np.array(bad), classes)


def test_view_data_from_arrays_runs_hyfem_and_checks_input():
    from hyfl.algorithms import make_algorithm
    from hyfl.neural.engine import run
    from hyfl.neural.views import view_data_from_arrays
    from hyfl.participation import parse_participation

    rng = np.random.default_rng(0)
    views = [rng.normal(size=(40, 3)), rng.normal(size=(40, 5))]
    y = np.where(views[0][:, 0] + views[1][:, 0] > 0, "yes", "no")
    data = view_data_from_arrays(
        views, y, client_samples=[np.arange(0, 25), np.arange(15, 40)],
        client_views=[[0], [0, 1]], val_views=views, val_y=y,
    )
    assert [v.tolist() for v in data.views] == [[0, 1, 2], [3, 4, 5, 6, 7]]
    assert data.classes.tolist() == ["no", "yes"] and data.client_views == ((0,), (0, 1))
    algorithm = make_algorithm("hyfem-nn", {"batch_size": 8, "extractor_hidden": 4,
                                            "embedding": 3, "inference_hidden": 4})
    result = run(algorithm, data, parse_participation("full", 2), 2)
    assert np.isfinite(result.column("val_accuracy")).all()
    with pytest.raises(HyflError, match="view 1 has shape"):
        view_data_from_arrays([views[0], views[1][:30]], y, [np.arange(40)], [[0]])
    with pytest.raises(HyflError, match="sample 39 is held by no client"):
        view_data_from_arrays(views, y, [np.arange(39)], [[0, 1]])
    with pytest.raises(HyflError, match="client 0 names a sample or view"):
        view_data_from_arrays(views, y, [np.arange(40)], [[2]])
    bad = [views[0].copy(), views[1]]
    bad[0][3, 1] = np.nan
    with pytest.raises(HyflError, match="view 0 contains NaN"):
        view_data_from_arrays(bad, y, [np.arange(40)], [[0, 1]])
