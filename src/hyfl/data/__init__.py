"""Datasets: the in-memory container, file readers and the named-dataset registry."""

from hyfl.data.dataset import Dataset
from hyfl.data.loaders import load_idx, load_libsvm
from hyfl.data.registry import (
    DATASETS,
    dataset_names,
    default_lambda,
    has_test_split,
    load_data,
    load_dataset,
    train_validation,
)

__all__ = [
    "DATASETS",
    "Dataset",
    "dataset_names",
    "default_lambda",
    "has_test_split",
    "load_data",
    "load_dataset",
    "load_idx",
    "load_libsvm",
    "train_validation",
]
