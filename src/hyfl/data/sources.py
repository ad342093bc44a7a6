"""What a ``--data`` value names, loaded: a registered dataset, a LIBSVM file, and the
validation data that go with it.

Named datasets are :mod:`hyfl.data.registry`'s; party files, which bring their own
partition, are :mod:`hyfl.data.parties`' (:func:`load_data` refuses them, naming
the loader to use).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hyfl.data.dataset import Dataset
from hyfl.data.holdout import holdout_rows, split_rows
from hyfl.data.loaders import load_libsvm
from hyfl.data.registry import (
    DATASETS,
    has_test_split,
    load_dataset,
    load_libsvm_like,
    parse_dataset_name,
)
from hyfl.errors import fail

__all__ = ["load_data", "train_validation"]


def _existing_file(name_or_path: str | os.PathLike) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise fail(
            f"data path {path}",
            "is a directory",
            "Pass a LIBSVM file, or a dataset name with data_dir=<directory>.",
        )
    raise fail(
        f"data {str(name_or_path)!r}",
        "is neither a known dataset name nor an existing file",
        f"Use one of: {', '.join(DATASETS)} (optionally 'name:test'), "
        "or the path of a LIBSVM file.",
    )


def load_data(
    name_or_path: str | os.PathLike, data_dir: str | os.PathLike | None = None
) -> Dataset:
    """Load a registered dataset (its train split) or a LIBSVM file.

    Parameters
    ----------
    name_or_path : str or path-like
        A name from :func:`dataset_names`, ``"<name>:<split>"``, or the path of
        a LIBSVM file (any extension; ``.gz``/``.bz2`` are decompressed).
    data_dir : str or path-like, optional
        Directory searched first for a named dataset's files.

    Returns
    -------
    Dataset
    """
    name, split = parse_dataset_name(str(name_or_path))
    if name is not None:
        return load_dataset(name, split or "train", data_dir)
    from hyfl.data.party_spec import is_party_spec

    if is_party_spec(name_or_path):
        raise fail(
            f"data {str(name_or_path)!r}",
            "describes party files, which bring their own partition",
            "Load it with hyfl.data.load_party_spec (or load_parties), which returns the "
            "data set and its partition.",
        )
    return load_libsvm(_existing_file(name_or_path))


def _load_validation(val: str | os.PathLike, train: Dataset, data_dir) -> Dataset:
    name, split = parse_dataset_name(str(val))
    if name is not None:
        # A bare name means that dataset's held-out data when it has some.
        return load_dataset(name, split or ("test" if has_test_split(name) else "train"), data_dir)
    return load_libsvm_like(_existing_file(val), train)


def _holdout(data: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    train_rows, val_rows = holdout_rows(data.n_samples, fraction, seed)
    return split_rows(data, train_rows, val_rows, fraction, seed)


def _check_compatible(train: Dataset, val: Dataset) -> None:
    culprit = f"validation data {val.name!r}"
    if val.n_features != train.n_features:
        raise fail(
            culprit,
            f"has {val.n_features} features but training data {train.name!r} has "
            f"{train.n_features}",
            "Use validation data from the same dataset and preprocessing.",
        )
    if val.task != train.task:
        raise fail(
            culprit,
            f"is a {val.task} task but training data {train.name!r} is {train.task}",
            "Use validation data with the same kind of labels.",
        )
    if train.task != "regression":
        unknown = np.setdiff1d(np.unique(val.y), np.unique(train.y))
        if unknown.size:
            raise fail(
                culprit,
                f"has labels {unknown.tolist()} that training data {train.name!r} lacks",
                "Use validation data whose classes all occur in training, or a different "
                "seed/val_fraction so every class stays in the training part.",
            )


def train_validation(
    name_or_path: str | os.PathLike,
    val: str | os.PathLike | None = None,
    val_fraction: float | None = None,
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
) -> tuple[Dataset, Dataset | None]:
    """Load training data and the validation data that goes with it.

    Parameters
    ----------
    name_or_path : str or path-like
        Training data, as for :func:`load_data`.
    val : str or path-like, optional
        Validation data: a dataset name (its test split if it has one, else
        its train split; ``"name:train"``/``"name:test"`` choose) or a LIBSVM
        file, read with the training data's width and label mapping.
    val_fraction : float in (0, 1), optional
        Hold out this fraction of the training samples instead, chosen by a
        permutation seeded with ``seed``.
    seed : int, default 0
    data_dir : str or path-like, optional
        Directory searched first for named datasets' files.

    Returns
    -------
    train : Dataset, shape (n_train, n_features)
    validation : Dataset, shape (n_val, n_features), or None
        None when neither ``val`` nor ``val_fraction`` is given and the
        dataset has no test split.

    Raises
    ------
    HyflError
        Both ``val`` and ``val_fraction`` given, a bad fraction, or validation
        data whose features or labels do not fit the training data.
    """
    if val is not None and val_fraction is not None:
        raise fail(
            "val and val_fraction",
            "were both given",
            "Pass either a validation dataset (val) or a fraction to hold out (val_fraction).",
        )
    train = load_data(name_or_path, data_dir)
    name, split = parse_dataset_name(str(name_or_path))
    if val is not None:
        validation = _load_validation(val, train, data_dir)
    elif val_fraction is not None:
        train, validation = _holdout(train, val_fraction, seed)
    elif name is not None and split in (None, "train") and has_test_split(name):
        validation = load_dataset(name, "test", data_dir)
    else:
        return train, None
    _check_compatible(train, validation)
    return train, validation
