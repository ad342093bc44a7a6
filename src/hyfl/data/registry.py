"""Named datasets: where their files are, how to read them, paper settings.

Each entry of :data:`DATASETS` says which files make up its train and test
splits, how they are read and preprocessed (the paper's preprocessing), the
regularization strength the paper used (or the one its stand-in uses) and the
task. Files are looked for, in order, in

1. the ``data_dir`` the caller passes,
2. the directories in the ``HYFL_DATA`` environment variable (``os.pathsep``
   separated),
3. a ``shared/data`` folder in the working directory or in any parent of it or
   of this source file (so ``../shared/data`` beside the repository is found),
4. the user cache ``$XDG_CACHE_HOME/hyfl/data`` (default ``~/.cache/hyfl/data``).

Nothing is downloaded. Parsed arrays are cached as ``.npz`` files in
``<user cache>/parsed`` (set ``HYFL_NO_CACHE=1`` to turn that off), because
parsing Covtype or MNIST text/bytes takes seconds on every run otherwise.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from hyfl.data.dataset import Dataset
from hyfl.data.loaders import clean_csr, load_idx, load_libsvm, map_labels, widen
from hyfl.errors import check_choice, fail

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "cache_dir",
    "dataset_names",
    "default_lambda",
    "has_test_split",
    "load_data",
    "load_dataset",
    "search_dirs",
    "train_validation",
]

# Bump when a reader or preprocessing changes, so old parsed caches are ignored.
_CACHE_VERSION = 1
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

    @property
    def needs_files(self) -> bool:
        return bool(self.train_files)


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


def _append_constant_column(X: sp.csr_matrix, value: float) -> sp.csr_matrix:
    """Add a last column holding ``value`` in every row (a bias feature).

    Parameters
    ----------
    X : scipy.sparse.csr_matrix, shape (n_samples, n_features), sorted indices

    Returns
    -------
    scipy.sparse.csr_matrix, shape (n_samples, n_features + 1)
    """
    row_ends = X.indptr[1:]
    data = np.insert(X.data, row_ends, value)
    indices = np.insert(X.indices, row_ends, X.shape[1])
    indptr = X.indptr + np.arange(X.shape[0] + 1, dtype=X.indptr.dtype)
    return sp.csr_matrix((data, indices, indptr), shape=(X.shape[0], X.shape[1] + 1))


def _load_libsvm_like(path: Path, train: Dataset) -> Dataset:
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
        return _load_libsvm_like(paths[0], train)
    return load_libsvm(paths[0], task="binary")


def _read_mnist(paths: tuple[Path, ...], train: Dataset | None) -> Dataset:
    data = load_idx(paths[0], paths[1])
    X = data.X
    X.data /= 255.0  # load_idx's matrix is ours alone, so scale in place
    n_pixels = X.shape[1]
    X = _append_constant_column(X, 10.0)
    meta = dict(data.meta, bias_feature=n_pixels, bias_value=10.0)
    return replace(data, X=X, meta=meta)


def _read_covtype(paths: tuple[Path, ...], train: Dataset | None) -> Dataset:
    path = paths[0]
    culprit = f"Covtype file {path}"
    try:
        with _open_text(path) as f:
            table = np.loadtxt(f, delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    except (ValueError, OSError, EOFError) as error:
        raise fail(
            culprit,
            f"is not a numeric CSV with one header line: {error}",
            "Use the UCI covtype.csv(.gz): a header, then 55 integer columns per row.",
        ) from error
    if table.shape[0] == 0 or table.shape[1] != 55:
        raise fail(
            culprit,
            f"has {table.shape[0]} rows of {table.shape[1]} columns, expected rows of 55 "
            "(54 features and Cover_Type)",
            "Use the UCI covtype.csv(.gz) with its 55 columns.",
        )
    cover_type = table[:, 54]
    if not np.all(np.isin(cover_type, np.arange(1, 8))):
        bad = np.flatnonzero(~np.isin(cover_type, np.arange(1, 8)))[0]
        raise fail(
            culprit,
            f"has Cover_Type {cover_type[bad]} in data row {bad + 1}, expected 1..7",
            "Check that the last column is Cover_Type.",
        )
    # LIBSVM's covtype.binary: class 2 (Lodgepole Pine) against the rest.
    y = np.where(cover_type == 2, 1.0, -1.0)
    X = _minmax_csr(table[:, :54])
    return Dataset(
        X=X,
        y=y,
        name="covtype",
        task="binary",
        meta={
            "source": str(path),
            "format": "csv",
            "classes": (-1.0, 1.0),
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
            "the last (785th) feature",
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
            preprocessing="class 2 -> +1, other classes -> -1; each of the 54 features "
            "scaled to [0, 1] by its min/max (as LIBSVM covtype.binary.scale)",
            lam=5e-5,
            lam_note="paper (Covtype)",
            description="UCI Forest CoverType, 581012 samples, 54 features, no test split",
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
    registered, _ = _parse_name(str(name))
    return DATASETS[registered].lam if registered is not None else None


def cache_dir() -> Path:
    """hyfl's user cache: ``$XDG_CACHE_HOME/hyfl``, default ``~/.cache/hyfl``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hyfl"


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
        ``<user cache>/data``.
    """
    dirs: list[Path] = []
    if data_dir is not None:
        dirs.append(Path(data_dir).expanduser())
    env = os.environ.get("HYFL_DATA", "")
    dirs += [Path(entry).expanduser() for entry in env.split(os.pathsep) if entry]
    dirs += _shared_data_dirs()
    dirs.append(cache_dir() / "data")
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


def _locate(spec: DatasetSpec, files: tuple[str, ...], data_dir) -> tuple[Path, ...]:
    dirs = search_dirs(data_dir)
    found, missing = [], []
    for file_name in files:
        hits = [d / c for d in dirs for c in _file_candidates(file_name) if (d / c).is_file()]
        if hits:
            found.append(hits[0])
        else:
            missing.append(file_name)
    if missing:
        env = os.environ.get("HYFL_DATA")
        shared = ", ".join(str(d) for d in _shared_data_dirs()) or "none found"
        searched = [f"data_dir={data_dir}"] if data_dir is not None else []
        searched += [
            f"HYFL_DATA={env}" if env else "HYFL_DATA (not set)",
            f"shared/data beside the working directory or hyfl's source ({shared})",
            f"the user cache {cache_dir() / 'data'}",
        ]
        wanted = " and ".join(missing)
        raise fail(
            f"dataset {spec.name!r}",
            f"needs {wanted}, which is not in any searched directory "
            f"(searched: {'; '.join(searched)})",
            f"Put {wanted} in {dirs[0]} or another searched directory, pass "
            "data_dir=<folder holding it>, or set HYFL_DATA=<folder holding it>.",
        )
    return tuple(found)


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
        with np.load(path, allow_pickle=False) as z:
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


def _parse_name(text: str) -> tuple[str | None, str | None]:
    """``"mnist" -> ("mnist", None)``, ``"mnist:test" -> ("mnist", "test")``, else Nones."""
    if text in DATASETS:
        return text, None
    base, sep, split = text.rpartition(":")
    if sep and base in DATASETS and split in _SPLITS:
        return base, split
    return None, None


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
    name, split = _parse_name(str(name_or_path))
    if name is not None:
        return load_dataset(name, split or "train", data_dir)
    return load_libsvm(_existing_file(name_or_path))


def _load_validation(val: str | os.PathLike, train: Dataset, data_dir) -> Dataset:
    name, split = _parse_name(str(val))
    if name is not None:
        # A bare name means that dataset's held-out data when it has some.
        return load_dataset(name, split or ("test" if has_test_split(name) else "train"), data_dir)
    return _load_libsvm_like(_existing_file(val), train)


def _holdout(data: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    if not 0 < fraction < 1:
        raise fail(
            "val_fraction", f"must be in (0, 1), got {fraction!r}", "Pass e.g. val_fraction=0.2."
        )
    n_val = int(round(fraction * data.n_samples))
    if not 0 < n_val < data.n_samples:
        raise fail(
            "val_fraction",
            f"={fraction} of {data.n_samples} samples leaves an empty train or validation part",
            "Use a larger dataset or a fraction that keeps both parts non-empty.",
        )
    order = np.random.default_rng(seed).permutation(data.n_samples)
    # Sorted indices keep the original sample order within each part.
    parts = []
    for label, rows in (("train", np.sort(order[n_val:])), ("val", np.sort(order[:n_val]))):
        meta = dict(data.meta, holdout=label, val_fraction=fraction, seed=seed)
        name = data.name if label == "train" else f"{data.name}-val"
        parts.append(replace(data, X=data.X[rows], y=data.y[rows], name=name, meta=meta))
    return parts[0], parts[1]


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
    name, split = _parse_name(str(name_or_path))
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
