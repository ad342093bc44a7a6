"""Datasets: the in-memory container, file readers, the named-dataset registry
(with checksummed downloads into the cache) and party files."""

from hyfl.data.dataset import Dataset
from hyfl.data.fetch import DataFile, downloads_allowed
from hyfl.data.loaders import load_idx, load_libsvm
from hyfl.data.parties import load_parties
from hyfl.data.party_spec import is_party_spec, load_party_data, load_party_spec, parse_party_spec
from hyfl.data.registry import (
    DATASETS,
    FILES,
    check_files,
    dataset_files,
    dataset_names,
    default_lambda,
    fallback_lambda,
    has_test_split,
    lambda_for,
    load_dataset,
)
from hyfl.data.sources import load_data, train_validation

__all__ = [
    "DATASETS",
    "fallback_lambda",
    "FILES",
    "DataFile",
    "Dataset",
    "check_files",
    "dataset_files",
    "dataset_names",
    "default_lambda",
    "downloads_allowed",
    "has_test_split",
    "lambda_for",
    "is_party_spec",
    "load_data",
    "load_dataset",
    "load_idx",
    "load_libsvm",
    "load_parties",
    "load_party_data",
    "load_party_spec",
    "parse_party_spec",
    "train_validation",
]
