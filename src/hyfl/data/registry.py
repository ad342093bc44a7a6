"""Named datasets: their files, how to read them, the paper's settings.

Each entry of :data:`DATASETS` says which files make up its train and test
splits (with accepted alternatives), how they are read and preprocessed (the
paper's preprocessing), the regularization strength the paper used (or the one
its stand-in uses) and the task. Every file name is described in :data:`FILES`
(sha256, size, download addresses, origin).

Files are looked for, in order, in

1. the ``data_dir`` the caller passes,
2. the directories in the ``HYFL_DATA`` environment variable (``os.pathsep``
   separated),
3. a ``shared/data`` folder in the working directory or in any parent of it or
   of this source file (so ``../shared/data`` beside the repository is found),
4. hyfl's download folder ``<cache>/data``: ``$HYFL_CACHE/data``, else
   ``$XDG_CACHE_HOME/hyfl/data``, else ``~/.cache/hyfl/data``.

A file is found under its registered name or as an uncompressed copy (the name
without ``.gz``/``.bz2``). A file found nowhere is downloaded from its
published addresses into the download folder and verified against its sha256
(:mod:`hyfl.data.fetch`), unless ``HYFL_OFFLINE=1``; then, or when the download
fails, the error names the file, every place searched, where to put it and
where to get it. Files found on disk are not checksummed on every load (an
uncompressed or self-made copy is fine); :func:`check_files` verifies them.

Parsed arrays are cached as ``.npz`` files in ``<cache>/parsed`` (set
``HYFL_NO_CACHE=1`` to turn that off), because parsing Covtype or MNIST
text/bytes takes seconds on every run otherwise.

Paper settings (HyFDCA paper, sections 5.1 and 7.2)
---------------------------------------------------
* ``mnist``: pixels scaled to [0, 1]; a bias feature of value 10 appended as
  feature 784, which the ``quadrant:C`` partition gives to the fourth
  (bottom-right) quadrant (``meta["image_shape"]``, ``meta["bias_feature"]``);
  lambda 1e-3. The paper counts 70,000 samples (train + test); here ``train``
  is the 60,000 and ``test`` the 10,000 (Table 1's 80.858% sparsity is that of
  all 70,000 x 784 raw pixels).
* ``covtype``: the paper's Covtype binary is LIBSVM's ``covtype.binary`` scaled
  to [0, 1] (its 77.878% sparsity is that of the min/max-scaled table; the
  unscaled table has 78.002%). LIBSVM's binary labels are Cover_Type 2
  (Lodgepole Pine, 283,301 samples) as label 1 against the other six types as
  label 2 (297,711); read by :func:`~hyfl.data.loaders.load_libsvm`, label 1
  becomes -1 and label 2 becomes +1, and the UCI table is mapped the same way.
  The sign does not matter for the hinge loss without intercept (w -> -w).
  Lambda 5e-5. No test split.
* ``news20``: LIBSVM's ``news20.binary`` as published (19,996 x 1,355,191, rows
  already of unit length); lambda 1e-5. No test split. Not available offline
  here; ``reuters`` is its sparse-text stand-in.
* ``ijcnn1``, ``reuters``, ``adult``: LIBSVM files from tick-datasets as
  loaded (labels -1/+1); lambdas of the paper sets they stand in for.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from hyfl._io import check_csv_shape, open_bounded, read_npz
from hyfl.data import fetch
from hyfl.data.dataset import Dataset, append_constant_column
from hyfl.data.fetch import DataFile, cache_dir, download_dir, downloads_allowed, sha256_of
from hyfl.data.loaders import clean_csr, load_idx, load_libsvm, map_labels, widen
from hyfl.errors import HyflError, check_choice, fail

__all__ = [
    "DATASETS",
    "FILES",
    "fallback_lambda",
    "DataFile",
    "DatasetSpec",
    "cache_dir",
    "check_files",
    "dataset_files",
    "dataset_names",
    "default_lambda",
    "download_dir",
    "has_test_split",
    "lambda_for",
    "load_dataset",
    "load_libsvm_like",
    "locate_files",
    "parse_dataset_name",
    "search_dirs",
]

# Bump when a reader or preprocessing changes, so old parsed caches are ignored.
# 2: Covtype labels follow LIBSVM covtype.binary as load_libsvm reads it.
_CACHE_VERSION = 2
_SPLITS = ("train", "test")

Reader = Callable[[tuple[Path, ...], Dataset | None], Dataset]


@dataclass(frozen=True)
class DatasetSpec:
    """How to get one named dataset.

    Attributes
    ----------
    name : str
    task : {"binary", "multiclass", "regression"}
    train_files : tuple of str
        File names of the train split (empty: generated, needs no files).
    test_files : tuple of str
        File names of the test split (empty: there is no test split).
    alternatives : dict of str to tuple of str
        Other files accepted in place of a train/test file, in order of
        preference (e.g. the UCI ``covtype.data.gz`` for ``covtype.csv.gz``).
        The reader gets whichever was found and tells them apart by name.
    read : callable
        ``read(paths, train)`` returns the preprocessed split; ``train`` is the
        loaded train split when reading a test split with
        ``test_needs_train``, else None.
    preprocessing : str
        What is done to the raw data (as in the paper).
    lam : float or None
        Regularization strength used by the paper (or by the set it stands in for).
    lam_note : str
        Where ``lam`` comes from.
    description : str
    test_needs_train : bool
        Whether the test split is read to match the train split (LIBSVM
        files: same width, same label mapping).
    """

    name: str
    task: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    read: Reader
    preprocessing: str
    lam: float | None
    lam_note: str
    description: str
    test_needs_train: bool = False
    alternatives: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def needs_files(self) -> bool:
        return bool(self.train_files)

    def names_for(self, file_name: str) -> tuple[str, ...]:
        """``file_name`` and the files accepted in its place, in order of preference."""
        return (file_name, *self.alternatives.get(file_name, ()))

    @property
    def files(self) -> tuple[DataFile, ...]:
        """Every registered file of this dataset (alternatives included)."""
        names = [n for f in (*self.train_files, *self.test_files) for n in self.names_for(f)]
        return tuple(FILES[n] for n in dict.fromkeys(names))


# --------------------------------------------------------------------------- readers


def _open_text(path: Path):
    """Open a text file, gunzipping it if it starts with the gzip magic bytes."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt") if gzipped else open(path)


def _minmax_csr(A: np.ndarray) -> sp.csr_matrix:
    """Scale each column of dense ``A`` to [0, 1] by its min and max, as CSR.

    Parameters
    ----------
    A : ndarray, shape (n_samples, n_features)

    Returns
    -------
    scipy.sparse.csr_matrix, shape (n_samples, n_features), float64
        Constant columns become 0.
    """
    low = A.min(axis=0)
    span = A.max(axis=0) - low
    span[span == 0] = 1.0
    # Blocks of rows keep the dense float64 temporary small for big tables.
    step = 65536
    blocks = [sp.csr_matrix((A[i : i + step] - low) / span) for i in range(0, A.shape[0], step)]
    return clean_csr(sp.vstack(blocks, format="csr"))


def load_libsvm_like(path: Path, train: Dataset) -> Dataset:
    """Load a LIBSVM test/validation file so it matches its training set.

    Same feature width (a narrower file is widened), same index base and the
    same label mapping; a file with more features raises naming both files.
    """
    classes = train.meta.get("classes") if train.task != "regression" else None
    data = load_libsvm(
        path,
        zero_based=train.meta.get("zero_based", "auto"),
        classes=tuple(classes) if classes is not None else None,
        task=train.task,
    )
    if data.n_features > train.n_features:
        raise fail(
            f"LIBSVM file {path}",
            f"uses {data.n_features} features but the training data "
            f"{train.meta.get('source', train.name)} has only {train.n_features}",
            "Use a test/validation file from the same dataset (same feature numbering) "
            "as the training file.",
        )
    return replace(data, X=widen(data.X, train.n_features))


def _read_libsvm(paths: tuple[Path, ...], train: Dataset | None) -> Dataset:
    if train is not None:
        return load_libsvm_like(paths[0], train)
    return load_libsvm(paths[0], task="binary")


def _read_mnist(paths: tuple[Path, ...], train: Dataset | None) -> Dataset:
    data = load_idx(paths[0], paths[1])
    X = data.X
    X.data /= 255.0  # load_idx's matrix is ours alone, so scale in place
    n_pixels = X.shape[1]
    X = append_constant_column(X, 10.0)
    meta = dict(data.meta, bias_feature=n_pixels, bias_value=10.0)
    return replace(data, X=X, meta=meta)


def _covtype_from_libsvm(path: Path) -> Dataset:
    """LIBSVM's covtype.binary(.scale): labels 1 (Cover_Type 2) -> -1, 2 (the rest) -> +1."""
    data = load_libsvm(path, task="binary")
    if data.meta["classes"] != (1.0, 2.0) or data.n_features > 54:
        raise fail(
            f"Covtype file {path}",
            f"has labels {list(data.meta['classes'])} and {data.n_features} features, "
            "expected LIBSVM covtype.binary's labels 1 and 2 and 54 features",
            "Use covtype.libsvm.binary.scale(.bz2) from the LIBSVM site, or the UCI table.",
        )
    if data.X.nnz and (data.X.data.min() < 0 or data.X.data.max() > 1):
        raise fail(
            f"Covtype file {path}",
            "has values outside [0, 1], so it is not the scaled covtype.binary.scale",
            "Use covtype.libsvm.binary.scale(.bz2), or the UCI table (scaled here).",
        )
    return replace(data, X=widen(data.X, 54))


def _read_covtype(paths: tuple[Path, ...], train: Dataset | None) -> Dataset:
    """UCI Covtype (CSV with header, or covtype.data without), or LIBSVM covtype.binary."""
    import pandas as pd

    path = paths[0]
    if "libsvm" in path.name:
        data = _covtype_from_libsvm(path)
        X, y = data.X, data.y
    else:
        culprit = f"Covtype file {path}"
        try:
            with _open_text(path) as f:
                first = f.readline().strip()
            # covtype.csv has a header line; the UCI covtype.data has none.
            header = None if first[:1] and (first[0].isdigit() or first[0] in "+-") else 0
            # Columns x rows against the file's size first, and a gzip bounded while it
            # streams (hyfl._io's rule).
            check_csv_shape(path, culprit, "Use the UCI covtype.data(.gz) or covtype.csv(.gz).")
            with open_bounded(path, culprit, "") as f:
                table = pd.read_csv(f, header=header, dtype=np.float64).to_numpy()
        except HyflError:
            raise
        except (ValueError, OSError, EOFError, pd.errors.ParserError) as error:
            raise fail(
                culprit,
                f"is not a numeric CSV of 55 columns (with or without one header line): {error}",
                "Use the UCI covtype.data(.gz) or covtype.csv(.gz): 54 integer features "
                "and Cover_Type per row.",
            ) from error
        if table.ndim != 2 or table.shape[0] == 0 or table.shape[1] != 55:
            raise fail(
                culprit,
                f"has {table.shape[0]} rows of {table.shape[1] if table.ndim == 2 else 0} "
                "columns, expected rows of 55 (54 features and Cover_Type)",
                "Use the UCI covtype.data(.gz) or covtype.csv(.gz) with its 55 columns.",
            )
        cover_type = table[:, 54]
        if not np.all(np.isin(cover_type, np.arange(1, 8))):
            bad = np.flatnonzero(~np.isin(cover_type, np.arange(1, 8)))[0]
            raise fail(
                culprit,
                f"has Cover_Type {cover_type[bad]} in data row {bad + 1}, expected 1..7",
                "Check that the last column is Cover_Type.",
            )
        # LIBSVM covtype.binary as load_libsvm reads it: its label 1 is Cover_Type 2
        # (-1), its label 2 the other six types (+1).
        y = np.where(cover_type == 2, -1.0, 1.0)
        X = _minmax_csr(table[:, :54])
    return Dataset(
        X=X,
        y=y,
        name="covtype",
        task="binary",
        meta={
            "source": str(path),
            "format": "libsvm" if "libsvm" in path.name else "csv",
            "classes": (-1.0, 1.0),
            "class_names": ("Cover_Type 2 (Lodgepole Pine)", "Cover_Type 1, 3-7"),
            "note": "no test split; hold out a fraction for validation",
        },
    )


def _read_breast_cancer(paths: tuple[Path, ...], train: Dataset | None) -> Dataset:
    from sklearn.datasets import load_breast_cancer  # ships with sklearn, no download

    bunch = load_breast_cancer()
    y, task, classes = map_labels(bunch.target, "breast_cancer", task="binary")
    return Dataset(
        X=_minmax_csr(np.asarray(bunch.data, dtype=np.float64)),
        y=y,
        name="breast_cancer",
        task=task,
        meta={
            "source": "sklearn.datasets.load_breast_cancer",
            "classes": classes,
            "class_names": tuple(str(c) for c in bunch.target_names),
        },
    )


def _read_synthetic(paths: tuple[Path, ...], train: Dataset | None) -> Dataset:
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=2000, n_features=40, n_informative=10, random_state=0)
    y, task, classes = map_labels(y, "synthetic", task="binary")
    return Dataset(
        X=clean_csr(X),
        y=y,
        name="synthetic",
        task=task,
        meta={
            "source": "sklearn.datasets.make_classification(n_samples=2000, "
            "n_features=40, n_informative=10, random_state=0)",
            "classes": classes,
        },
    )


_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",  # torchvision's copy
    "https://storage.googleapis.com/cvdf-datasets/mnist/",  # TensorFlow's copy
    "http://yann.lecun.com/exdb/mnist/",  # the original site; often refuses downloads
)
_MNIST_ORIGIN = (
    "LeCun, Cortes & Burges, http://yann.lecun.com/exdb/mnist/ (md5 as published; "
    "the mirrors hold the same bytes)"
)
_TICK = "https://raw.githubusercontent.com/X-DataInitiative/tick-datasets/master/binary/"
_TICK_ORIGIN = "X-DataInitiative/tick-datasets (sha256 of the files in shared/data)"
_LIBSVM_BINARY = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/"


def _mnist_file(name: str, sha256: str, size: int) -> DataFile:
    return DataFile(name, sha256, tuple(m + name for m in _MNIST_MIRRORS), size, _MNIST_ORIGIN)


def _tick_file(dataset: str, name: str, sha256: str, size: int) -> DataFile:
    return DataFile(name, sha256, (f"{_TICK}{dataset}/{name}",), size, _TICK_ORIGIN)


#: Every registered file: sha256 of its bytes as published, size, download addresses.
FILES: dict[str, DataFile] = {
    f.name: f
    for f in (
        _mnist_file(
            "train-images-idx3-ubyte.gz",
            "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
            9912422,
        ),
        _mnist_file(
            "train-labels-idx1-ubyte.gz",
            "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
            28881,
        ),
        _mnist_file(
            "t10k-images-idx3-ubyte.gz",
            "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
            1648877,
        ),
        _mnist_file(
            "t10k-labels-idx1-ubyte.gz",
            "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
            4542,
        ),
        _tick_file(
            "ijcnn1",
            "ijcnn1.trn.bz2",
            "b38a4198ce142d43e96fb86d17b87211feec1f909ac344fa057455c69de29de3",
            1395175,
        ),
        _tick_file(
            "ijcnn1",
            "ijcnn1.tst.bz2",
            "acd1db430684fdd3f0c768ecc49aa8e749d0004fc117611220c2aa576a7b6a24",
            2597597,
        ),
        _tick_file(
            "reuters",
            "reuters.trn.bz2",
            "e77a3368662c02caebe0d9cbcc97d856019bcfb33a8e9b7c48e0b51ee4cdfb60",
            3107267,
        ),
        _tick_file(
            "reuters",
            "reuters.tst.bz2",
            "3d699b9644a38160bf3228059d18fbfc07474057d8e82d512576a2b82d72e211",
            763856,
        ),
        _tick_file(
            "adult",
            "adult.trn.bz2",
            "73ce74d43bbfc988b08e6ecf738cf5484f19dafa143c31f702f3a8b779d277e5",
            100554,
        ),
        _tick_file(
            "adult",
            "adult.tst.bz2",
            "bdb2ec9642e77947a67269471506b18bc4dcf03413f44814dc24833432ba818d",
            50588,
        ),
        DataFile(
            "covtype.csv.gz",
            "2c248281ab4f08737f16b6ece537ae49604cfacdaf90a188ef0f6474ccacf459",
            (),
            10775000,
            "UCI covtype table with header, from scikit-multiflow 0.1.0's covtype.csv, "
            "gzip -9 -n (shared/data); not published anywhere, so not downloadable",
        ),
        DataFile(
            "covtype.data.gz",
            "614360d0257557dd1792834a85a1cdebfadc3c4f30b011d56afee7ffb5b15771",
            (
                "https://ndownloader.figshare.com/files/5976039",
                "https://archive.ics.uci.edu/ml/machine-learning-databases/covtype/covtype.data.gz",
            ),
            None,
            "UCI Covertype; sha256 and figshare mirror as in scikit-learn's fetch_covtype",
        ),
        DataFile(
            "covtype.libsvm.binary.scale.bz2",
            None,
            (_LIBSVM_BINARY + "covtype.libsvm.binary.scale.bz2",),
            None,
            "LIBSVM binary data sets (no checksum published)",
        ),
        DataFile(
            "news20.binary.bz2",
            None,
            (_LIBSVM_BINARY + "news20.binary.bz2",),
            None,
            "LIBSVM binary data sets (no checksum published; no copy was available to compute one)",
        ),
    )
}

_AS_LOADED = "none: LIBSVM file as loaded (test file read with the train file's n_features)"

DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="mnist",
            task="multiclass",
            train_files=("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
            test_files=("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
            read=_read_mnist,
            preprocessing="pixels / 255 to [0, 1]; bias feature of value 10 appended as "
            "the last (785th) feature, which partition quadrant:C gives to the 4th quadrant",
            lam=1e-3,
            lam_note="paper (MNIST)",
            description="MNIST digits 0..9, 60000 train / 10000 test, 28x28 pixels",
        ),
        DatasetSpec(
            name="ijcnn1",
            task="binary",
            train_files=("ijcnn1.trn.bz2",),
            test_files=("ijcnn1.tst.bz2",),
            read=_read_libsvm,
            preprocessing=_AS_LOADED,
            lam=5e-5,
            lam_note="paper's Covtype value (ijcnn1 is a smaller dense stand-in)",
            description="LIBSVM ijcnn1, 49990 train / 91701 test, 22 features",
            test_needs_train=True,
        ),
        DatasetSpec(
            name="reuters",
            task="binary",
            train_files=("reuters.trn.bz2",),
            test_files=("reuters.tst.bz2",),
            read=_read_libsvm,
            preprocessing=_AS_LOADED,
            lam=1e-5,
            lam_note="paper's News20 value (reuters is the sparse-text stand-in)",
            description="Reuters text (binary), 7770 train / 3299 test, 8315 features",
            test_needs_train=True,
        ),
        DatasetSpec(
            name="adult",
            task="binary",
            train_files=("adult.trn.bz2",),
            test_files=("adult.tst.bz2",),
            read=_read_libsvm,
            preprocessing=_AS_LOADED,
            lam=1e-4,
            lam_note="not in the paper; a common choice for a9a",
            description="LIBSVM adult (a9a), 32561 train / 16281 test, 123 binary features",
            test_needs_train=True,
        ),
        DatasetSpec(
            name="covtype",
            task="binary",
            train_files=("covtype.csv.gz",),
            test_files=(),
            read=_read_covtype,
            preprocessing="binary labels as LIBSVM covtype.binary read by load_libsvm: "
            "Cover_Type 2 -> -1, other types -> +1; each of the 54 features scaled to "
            "[0, 1] by its min/max (as covtype.libsvm.binary.scale, the paper's data)",
            lam=5e-5,
            lam_note="paper (Covtype)",
            description="UCI Forest CoverType, 581012 samples, 54 features, no test split",
            alternatives={"covtype.csv.gz": ("covtype.data.gz", "covtype.libsvm.binary.scale.bz2")},
        ),
        DatasetSpec(
            name="news20",
            task="binary",
            train_files=("news20.binary.bz2",),
            test_files=(),
            read=_read_libsvm,
            preprocessing=_AS_LOADED,
            lam=1e-5,
            lam_note="paper (News20)",
            description="LIBSVM news20.binary, 19996 samples, 1355191 features, no test split",
        ),
        DatasetSpec(
            name="breast_cancer",
            task="binary",
            train_files=(),
            test_files=(),
            read=_read_breast_cancer,
            preprocessing="each feature scaled to [0, 1] by min/max over the whole set; "
            "malignant -> -1, benign -> +1",
            lam=1e-3,
            lam_note="not in the paper; small test set",
            description="Wisconsin breast cancer (ships with scikit-learn), 569 x 30",
        ),
        DatasetSpec(
            name="synthetic",
            task="binary",
            train_files=(),
            test_files=(),
            read=_read_synthetic,
            preprocessing="make_classification(n_samples=2000, n_features=40, "
            "n_informative=10, random_state=0); labels {0, 1} -> {-1, +1}",
            lam=1e-3,
            lam_note="not in the paper; small test set",
            description="Synthetic dense binary problem, 2000 x 40",
        ),
    )
}


# --------------------------------------------------------------------------- lookup


def dataset_names() -> list[str]:
    """Names of the registered datasets, in registry order."""
    return list(DATASETS)


def _spec(name: str) -> DatasetSpec:
    check_choice("dataset", name, DATASETS)
    return DATASETS[name]


def has_test_split(name: str) -> bool:
    """Whether the named dataset comes with a separate test split."""
    return bool(_spec(name).test_files)


def fallback_lambda(n_samples: int) -> float:
    """The regularization of data without a paper value (files, party files, in-memory
    data): ``1 / N``, scikit-learn's convention ``C = 1`` (``C sum_i loss_i + ||w||^2 / 2``
    is ``N C`` times ``sum_i loss_i / N + lam/2 ||w||^2`` with ``lam = 1 / (C N)``).

    A fixed value would make small data sets nearly unregularized (1e-4 on 400 rows is
    ``lam N = 0.04``: a dual method then needs thousands of rounds, docs/convergence.md
    section 7) and large ones over-regularized."""
    n = int(n_samples)
    if n < 1:
        raise fail("the training data", f"has {n} samples", "Give data with at least one sample.")
    return 1.0 / n


def lambda_for(source: str | os.PathLike, n_samples: int) -> float:
    """The regularization a run of ``source`` uses when none is given: the paper's value
    of a registered dataset (:func:`default_lambda`), else :func:`fallback_lambda` of its
    ``n_samples`` training samples."""
    return default_lambda(source) or fallback_lambda(n_samples)


def default_lambda(name: str | os.PathLike) -> float | None:
    """The paper's regularization strength for a dataset.

    Parameters
    ----------
    name : str or path-like
        A registered name (or ``"name:split"``). Anything else, such as the
        path of a LIBSVM file, has no paper value.

    Returns
    -------
    float or None
        None when ``name`` is not registered or its entry has no lambda, so
        callers can write ``default_lambda(data) or fallback``.
    """
    registered, _ = parse_dataset_name(str(name))
    return DATASETS[registered].lam if registered is not None else None


def _search_anchors() -> list[Path]:
    """Where the walk up for ``shared/data`` starts (replaced in tests)."""
    return [Path.cwd(), Path(__file__).resolve().parent]


def _shared_data_dirs() -> list[Path]:
    found = []
    for anchor in _search_anchors():
        for folder in (anchor, *anchor.parents):
            candidate = folder / "shared" / "data"
            if candidate.is_dir() and candidate not in found:
                found.append(candidate)
    return found


def search_dirs(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """Directories searched for dataset files, in order (existing or not).

    Parameters
    ----------
    data_dir : str or path-like, optional
        Searched first.

    Returns
    -------
    list of Path
        ``data_dir``, each ``HYFL_DATA`` entry, every ``shared/data`` found
        walking up from the working directory and from hyfl's source, and
        the download folder ``<cache>/data``.
    """
    dirs: list[Path] = []
    if data_dir is not None:
        dirs.append(Path(data_dir).expanduser())
    env = os.environ.get("HYFL_DATA", "")
    dirs += [Path(entry).expanduser() for entry in env.split(os.pathsep) if entry]
    dirs += _shared_data_dirs()
    dirs.append(download_dir())
    unique: list[Path] = []
    for folder in dirs:
        if folder not in unique:
            unique.append(folder)
    return unique


def _file_candidates(file_name: str) -> tuple[str, ...]:
    # An uncompressed copy works as well: every reader sniffs or uses the suffix.
    for suffix in (".gz", ".bz2"):
        if file_name.endswith(suffix):
            return file_name, file_name[: -len(suffix)]
    return (file_name,)


def _find(names: tuple[str, ...], dirs: list[Path]) -> Path | None:
    """First existing file among ``names`` (and uncompressed copies), folder by folder."""
    for folder in dirs:
        for name in names:
            for candidate in _file_candidates(name):
                if (folder / candidate).is_file():
                    return folder / candidate
    return None


def _missing_error(
    spec: DatasetSpec,
    missing: list[str],
    data_dir,
    allowed: bool,
    problems: list[str],
) -> HyflError:
    env = os.environ.get("HYFL_DATA")
    shared = ", ".join(str(d) for d in _shared_data_dirs()) or "none found"
    searched = [f"data_dir={data_dir}"] if data_dir is not None else []
    searched += [
        f"HYFL_DATA={env}" if env else "HYFL_DATA (not set)",
        f"shared/data beside the working directory or hyfl's source ({shared})",
        f"the download folder {download_dir()}",
    ]
    wanted = " and ".join(" or ".join(spec.names_for(slot)) for slot in missing)
    if not allowed:
        state = "Downloads are off (HYFL_OFFLINE=1)"
    elif problems:
        state = f"Downloading failed: {' | '.join(problems)}"
    else:
        state = "No download address is known for it"
    sources = []
    for slot in missing:
        for name in spec.names_for(slot):
            entry = FILES.get(name)
            if entry is not None and entry.urls:
                checksum = f"sha256 {entry.sha256}" if entry.sha256 else "no published sha256"
                sources.append(f"{name} from {entry.urls[0]} ({checksum})")
                break
    get = f" Get {'; '.join(sources)}." if sources else ""
    again = " Or unset HYFL_OFFLINE to let hyfl download it." if sources and not allowed else ""
    folder = Path(data_dir).expanduser() if data_dir is not None else download_dir()
    return fail(
        f"dataset {spec.name!r}",
        f"needs {wanted}, which is in none of the searched places "
        f"(searched: {'; '.join(searched)}). {state}",
        f"Put it in {folder} or another searched folder (or pass data_dir=<folder "
        f"holding it>, or set HYFL_DATA=<folder holding it>).{get}{again}",
    )


def _locate(
    spec: DatasetSpec, files: tuple[str, ...], data_dir, download: bool | None = None
) -> tuple[Path, ...]:
    """Paths of ``files`` (or their alternatives), downloading missing ones if allowed."""
    dirs = search_dirs(data_dir)
    found = [_find(spec.names_for(slot), dirs) for slot in files]
    if all(path is not None for path in found):
        return tuple(found)
    allowed = downloads_allowed() if download is None else bool(download)
    problems: list[str] = []
    if allowed:
        for position, slot in enumerate(files):
            if found[position] is not None:
                continue
            for name in spec.names_for(slot):
                entry = FILES.get(name)
                if entry is None or not entry.urls:
                    continue
                try:
                    found[position] = fetch.download(entry)
                    break
                except HyflError as error:
                    problems.append(str(error))
    missing = [slot for slot, path in zip(files, found) if path is None]
    if missing:
        raise _missing_error(spec, missing, data_dir, allowed, problems)
    return tuple(found)


def dataset_files(
    name: str,
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
    *,
    download: bool | None = None,
) -> tuple[Path, ...]:
    """Find (and if need be download) the files of one split of a registered dataset.

    Parameters
    ----------
    name : str
        A name with files (:func:`dataset_names`).
    split : {"train", "test"}
    data_dir : path-like, optional
        Searched first.
    download : bool, optional
        Whether missing files may be downloaded; default: unless ``HYFL_OFFLINE=1``.

    Returns
    -------
    tuple of Path
        One path per file of the split (an alternative where that was found).

    Raises
    ------
    HyflError
        Unknown name or split, or a file that is missing and could not be
        downloaded (the message says what to put where and where to get it).
    """
    spec = _spec(name)
    check_choice("split", split, _SPLITS)
    files = spec.test_files if split == "test" else spec.train_files
    return _locate(spec, files, data_dir, download) if files else ()


def locate_files(name: str, data_dir: str | os.PathLike | None = None) -> dict[str, Path | None]:
    """Where each file a dataset needs is, without downloading or reading it.

    Parameters
    ----------
    name : str
        A registered dataset name.
    data_dir : path-like, optional
        Searched first (then the rest of :func:`search_dirs`).

    Returns
    -------
    dict of str to Path or None
        Each train and test file (by its registered name) -> the file found
        for it (an alternative or an uncompressed copy counts), None when
        none of the searched folders has it. Empty for a bundled dataset.
    """
    spec = _spec(name)
    dirs = search_dirs(data_dir)
    slots = dict.fromkeys((*spec.train_files, *spec.test_files))
    return {slot: _find(spec.names_for(slot), dirs) for slot in slots}


def check_files(name: str, data_dir: str | os.PathLike | None = None) -> list[dict]:
    """Report where each file of a dataset is and whether its sha256 is the published one.

    Nothing is downloaded.

    Parameters
    ----------
    name : str
        A registered dataset name.
    data_dir : path-like, optional
        Searched first.

    Returns
    -------
    list of dict
        One per registered file (alternatives included), with keys ``file``,
        ``path`` (None when not found), ``status`` and ``sha256`` (of the file
        found). ``status`` is ``"ok"`` (checksum matches), ``"mismatch"``,
        ``"unverified"`` (no published checksum, or an uncompressed copy) or
        ``"missing"``.
    """
    spec = _spec(name)
    dirs = search_dirs(data_dir)
    report = []
    for entry in spec.files:
        path = _find((entry.name,), dirs)
        row = {"file": entry.name, "path": path, "status": "missing", "sha256": None}
        if path is not None:
            row["sha256"] = sha256_of(path)
            if entry.sha256 is None or path.name != entry.name:
                row["status"] = "unverified"
            else:
                row["status"] = "ok" if row["sha256"] == entry.sha256 else "mismatch"
        report.append(row)
    return report


# --------------------------------------------------------------------------- cache


def _cache_file(name: str, split: str, sources: tuple[Path, ...]) -> Path | None:
    if os.environ.get("HYFL_NO_CACHE", "") not in ("", "0"):
        return None
    digest = hashlib.sha256(f"v{_CACHE_VERSION}|{name}|{split}".encode())
    for source in sources:
        stat = source.stat()
        digest.update(f"|{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return cache_dir() / "parsed" / f"{name}-{split}-{digest.hexdigest()[:16]}.npz"


def _read_cache(path: Path | None) -> Dataset | None:
    if path is None or not path.is_file():
        return None
    try:
        z = read_npz(path, f"cache file {path}", "a parsed data set", "", kinds="biufU")
        X = sp.csr_matrix(
            (z["data"], z["indices"], z["indptr"]), shape=tuple(int(s) for s in z["shape"])
        )
        meta = {
            key: tuple(value) if isinstance(value, list) else value
            for key, value in json.loads(str(z["meta"])).items()
        }
        return Dataset(X=X, y=z["y"], name=str(z["name"]), task=str(z["task"]), meta=meta)
    except Exception:  # a broken or foreign cache file is only a cache miss
        return None


def _write_cache(path: Path | None, data: Dataset) -> None:
    if path is None:
        return
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Old versions of the same split (the source file changed) are now stale.
        for stale in path.parent.glob(path.name.rsplit("-", 1)[0] + "-*.npz"):
            stale.unlink(missing_ok=True)
        # Write to a temporary file and rename, so a reader never sees half a file.
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(handle, "wb") as f:
            np.savez(
                f,
                data=data.X.data,
                indices=data.X.indices,
                indptr=data.X.indptr,
                shape=np.asarray(data.X.shape),
                y=data.y,
                name=np.asarray(data.name),
                task=np.asarray(data.task),
                meta=np.asarray(json.dumps(data.meta)),
            )
        os.replace(temporary, path)
    except (OSError, TypeError, ValueError):
        # A cache that cannot be written (read-only home, odd meta) only costs time.
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


# --------------------------------------------------------------------------- loading


def load_dataset(
    name: str, split: str = "train", data_dir: str | os.PathLike | None = None
) -> Dataset:
    """Load one split of a registered dataset, preprocessed as in the paper.

    Parameters
    ----------
    name : str
        One of :func:`dataset_names`.
    split : {"train", "test"}
    data_dir : str or path-like, optional
        Directory searched first for the dataset's files.

    Returns
    -------
    Dataset
        ``X`` csr float64, shape (n_samples, n_features). ``meta`` records the
        dataset, split, source files, preprocessing and the paper's lambda.

    Raises
    ------
    HyflError
        Unknown name or split, no test split, or files that are missing (the
        message says which file to put where) or unreadable.
    """
    spec = _spec(name)
    check_choice("split", split, _SPLITS)
    if split == "test" and not spec.test_files:
        raise fail(
            f"dataset {name!r}",
            "has no test split",
            "Load split='train' and hold out part of it (val_fraction=0.2).",
        )
    files = spec.test_files if split == "test" else spec.train_files
    paths = _locate(spec, files, data_dir) if files else ()
    train = None
    needs_train = split == "test" and spec.test_needs_train
    sources = paths
    if needs_train:
        sources = _locate(spec, spec.train_files, data_dir) + paths
    cache_file = _cache_file(name, split, sources) if files else None
    cached = _read_cache(cache_file)
    if cached is not None:
        return cached
    if needs_train:
        train = load_dataset(name, "train", data_dir)
    data = spec.read(paths, train)
    data = replace(
        data,
        name=name if split == "train" else f"{name}-{split}",
        meta=dict(
            data.meta,
            dataset=name,
            split=split,
            files=tuple(str(p) for p in paths),
            preprocessing=spec.preprocessing,
            lam=spec.lam,
        ),
    )
    _write_cache(cache_file, data)
    return data


def parse_dataset_name(text: str) -> tuple[str | None, str | None]:
    """``"mnist" -> ("mnist", None)``, ``"mnist:test" -> ("mnist", "test")``, else Nones."""
    if text in DATASETS:
        return text, None
    base, sep, split = text.rpartition(":")
    if sep and base in DATASETS and split in _SPLITS:
        return base, split
    return None, None
