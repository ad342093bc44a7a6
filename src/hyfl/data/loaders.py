"""Readers for the on-disk formats hyfl uses: LIBSVM/SVMlight text and IDX.

Every reader returns a :class:`~hyfl.data.dataset.Dataset` whose ``X`` is CSR
float64 with sorted indices and no stored zeros, and raises
:class:`~hyfl.errors.HyflError` naming the file (and the line, where it can be
found) for anything it cannot read.
"""

from __future__ import annotations

import bz2
import gzip
import math
import os
import struct
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from hyfl._io import check_decoded, decoded_cap, open_bounded
from hyfl.data.dataset import Dataset
from hyfl.errors import HyflError, check_int, fail

__all__ = [
    "load_libsvm",
    "load_idx",
    "clean_csr",
    "widen",
    "map_labels",
    "check_values",
    "MAX_FEATURES",
    "MAX_ABS_VALUE",
]

_COMPRESSED_SUFFIXES = (".gz", ".bz2")

#: Default upper bound on the number of features (largest feature index) a
#: file may use: 2**24 = 16,777,216. Every client keeps dense float64 vectors
#: of this width, so a stray index of 2e9 would need ~16 GB per vector.
#: Override with ``load_libsvm(..., max_features=...)``, or for every load
#: (the CLI included) with the environment variable ``HYFL_MAX_FEATURES``.
MAX_FEATURES = 2**24
MAX_FEATURES_ENV = "HYFL_MAX_FEATURES"

#: Largest accepted absolute feature value or label. Squares and sums of up
#: to 2**24 squares of values below 1e150 stay finite in float64 (max ~1.8e308);
#: larger values make row norms and losses overflow to inf.
MAX_ABS_VALUE = 1e150


def check_values(values, source: str, where=None, what: str = "value") -> None:
    """Refuse NaN, infinite and too large (``|v| > MAX_ABS_VALUE``) values.

    The one validation every loader (LIBSVM, CSV, Parquet, in-memory arrays)
    uses for feature values and numeric labels.

    Parameters
    ----------
    values : array_like
        Numbers to check (any shape).
    source : str
        What to name in the error (the file).
    where : callable, optional
        Maps the flat position of the first bad value to a location text
        such as ``"at line 7"``.
    what : str
        What the values are ("feature value", "label", ...).

    Raises
    ------
    HyflError
        Naming the source, the location and the value.
    """
    values = np.asarray(values, dtype=np.float64)
    bad = ~(np.abs(values) <= MAX_ABS_VALUE)  # NaN compares False
    if not bad.any():
        return
    position = int(np.flatnonzero(bad.ravel())[0])
    value = float(values.ravel()[position])
    at = f" {where(position)}" if where is not None else ""
    if np.isfinite(value):
        problem = f"has {what} {value!r}{at}, beyond the limit |v| <= {MAX_ABS_VALUE:g}"
        fix = "Rescale the data (its squares would overflow float64), or remove the value."
    else:
        problem = f"has a NaN or infinite {what}{at} ({value!r})"
        fix = "Remove or impute non-finite values before loading."
    raise fail(source, problem, fix)


# --------------------------------------------------------------------------- helpers


def clean_csr(X) -> sp.csr_matrix:
    """Return ``X`` as CSR float64 with sorted indices and no stored zeros.

    A CSR float64 input is cleaned in place (its buffers are reused), so only
    pass matrices this module owns.

    Parameters
    ----------
    X : array_like or sparse matrix, shape (n_samples, n_features)

    Returns
    -------
    scipy.sparse.csr_matrix, shape (n_samples, n_features), float64
    """
    X = sp.csr_matrix(X, dtype=np.float64)
    X.sum_duplicates()  # also sorts indices
    X.eliminate_zeros()
    X.sort_indices()
    # liblinear (LinearSVC) accepts only 32-bit indices; LIBSVM readers give int64.
    if X.indices.dtype != np.int32 and max(X.nnz, *X.shape) < 2**31:
        X.indices = X.indices.astype(np.int32)
        X.indptr = X.indptr.astype(np.int32)
    return X


def widen(X: sp.csr_matrix, n_features: int) -> sp.csr_matrix:
    """Give ``X`` more (all-zero) trailing feature columns without copying data.

    A LIBSVM file only reveals as many features as its largest stored index,
    so a test file can look narrower than its training file.

    Parameters
    ----------
    X : scipy.sparse.csr_matrix, shape (n_samples, k)
    n_features : int, >= k

    Returns
    -------
    scipy.sparse.csr_matrix, shape (n_samples, n_features)
    """
    if n_features == X.shape[1]:
        return X
    return sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], n_features))


def _display_name(path: Path) -> str:
    """File name without a compression suffix: ``ijcnn1.trn.bz2 -> ijcnn1.trn``."""
    name = path.name
    for suffix in _COMPRESSED_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _open_by_suffix(path: Path):
    """Open ``path`` for binary reading, decompressing like sklearn does (by suffix)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    if path.suffix == ".bz2":
        return bz2.open(path, "rb")
    return open(path, "rb")


def _check_file(path: Path, what: str) -> None:
    if not path.exists():
        raise fail(f"{what} {path}", "does not exist", "Check the path or pass another file.")
    if path.is_dir():
        raise fail(f"{what} {path}", "is a directory, not a file", "Pass the path of a file.")


def map_labels(
    y: np.ndarray,
    source: str,
    *,
    classes: tuple | None = None,
    task: str | None = None,
) -> tuple[np.ndarray, str, tuple]:
    """Map raw labels to hyfl's conventions and infer the task.

    Parameters
    ----------
    y : ndarray, shape (n_samples,)
        Raw finite labels as read from a file.
    source : str
        What to name in errors (usually the file).
    classes : tuple, optional
        Original class values of a training set, so a test or validation file
        is mapped exactly like its training file (a test file may miss a class).
    task : {"binary", "multiclass", "regression"}, optional
        Force the task instead of inferring it.

    Returns
    -------
    y : ndarray, shape (n_samples,)
        Binary: float64 in {-1, +1} (smaller original value -> -1).
        Multiclass: int64 in ``0..C-1``. Regression: float64 unchanged.
    task : str
    classes : tuple
        Sorted original class values (empty for regression).
    """
    y = np.asarray(y, dtype=np.float64)
    if task == "regression":
        return y, "regression", ()
    if classes is None:
        if not np.all(y == np.round(y)):
            if task is not None:
                raise fail(
                    source,
                    f"has non-integer labels (e.g. {float(y[y != np.round(y)][0])}) "
                    f"but task={task!r}",
                    "Use integer class labels, or load it as a regression task.",
                )
            return y, "regression", ()
        found = np.unique(y)
        task = task or ("binary" if len(found) <= 2 else "multiclass")
        if len(found) == 1 and task == "binary":
            # One class alone does not say which side it is on; guess the usual
            # conventions ({0, 1}, {1, 2}, {-1, +1}): positive -> +1, else -1.
            value = float(found[0])
            classes = (value - 1, value) if value > 0 else (value, value + 1)
        else:
            classes = tuple(float(c) for c in found)
    else:
        task = task or ("binary" if len(classes) == 2 else "multiclass")
    class_array = np.asarray(classes, dtype=np.float64)
    if task == "binary" and len(class_array) != 2:
        raise fail(
            source,
            f"has {len(class_array)} distinct labels but binary classification needs 2",
            "Pick a file with two classes, or treat it as multiclass.",
        )
    position = np.searchsorted(class_array, y)
    position_clipped = np.minimum(position, len(class_array) - 1)
    unknown = class_array[position_clipped] != y
    if np.any(unknown):
        bad = np.unique(y[unknown])[:10]
        raise fail(
            source,
            f"has labels {bad.tolist()} that the training data does not have "
            f"(training classes: {class_array.tolist()})",
            "Use validation/test data whose labels all occur in the training data.",
        )
    if task == "binary":
        return np.where(position_clipped == 1, 1.0, -1.0), "binary", tuple(classes)
    return position_clipped.astype(np.int64), "multiclass", tuple(classes)


def _first_bad_line(path: Path, max_features: int = MAX_FEATURES) -> tuple[int, str] | None:
    """Find the first line sklearn would choke on and say why (error path only).

    sklearn's parser reports *what* is wrong but not *where*; scanning again
    in Python is slow but only happens when the file is already known bad.
    """
    try:
        with _open_by_suffix(path) as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.split(b"#", 1)[0].strip()
                if not line:
                    continue
                tokens = line.split()
                try:
                    float(tokens[0])
                except ValueError:
                    return lineno, f"label {tokens[0].decode(errors='replace')!r} is not a number"
                previous = -1
                for token in tokens[1:]:
                    text = token.decode(errors="replace")
                    key, sep, value = token.partition(b":")
                    if not sep:
                        return lineno, f"token {text!r} is not index:value"
                    if key == b"qid":
                        continue
                    try:
                        index = int(key)
                        float(value)
                    except ValueError:
                        return lineno, f"token {text!r} is not integer_index:number"
                    if index < 0:
                        return lineno, f"feature index {index} is negative"
                    if index > max_features:
                        return lineno, f"feature index {index} is above {max_features}"
                    if index <= previous:
                        return lineno, f"feature index {index} is not above the previous one"
                    previous = index
    except (OSError, EOFError):
        return None
    return None


# --------------------------------------------------------------------------- LIBSVM


#: Bytes of arrays one character of LIBSVM text may become: ``1 1:1`` and its line break
#: (6 characters) is a value, an index, a label and a row pointer (28 bytes), and the
#: parser's arrays grow by doubling.
_LIBSVM_COST = 8


def _max_features(max_features: int | None) -> int:
    """The largest feature index :func:`load_libsvm` accepts: ``max_features``, else
    ``$HYFL_MAX_FEATURES``, else :data:`MAX_FEATURES`."""
    if max_features is None:
        max_features = os.environ.get(MAX_FEATURES_ENV, MAX_FEATURES)
        try:
            max_features = int(max_features)
        except ValueError:
            raise fail(
                f"environment variable {MAX_FEATURES_ENV}",
                f"is {max_features!r}, not an integer",
                "Set it to a whole number of features, e.g. 50000000, or unset it.",
            ) from None
    check_int("max_features", max_features)
    return max_features


def _parse_libsvm(path: Path, source: str, max_features: int) -> tuple[sp.csr_matrix, np.ndarray]:
    """sklearn's parse of a LIBSVM file with raw indices (zero-based; the base is decided
    by :func:`_apply_index_base`), its errors said with the bad line, and a file with no
    samples or a feature index beyond ``max_features`` refused."""
    try:
        # Always parse raw indices (zero_based=True) and decide the base here, so
        # the decision can be recorded and reused for the matching test file.
        from sklearn.datasets import load_svmlight_file  # deferred: slow to import

        # Through a stream bounded by the file's size (hyfl._io's rule): a .gz or .bz2
        # of a few hundred kB could otherwise inflate to gigabytes of samples.
        with open_bounded(path, source, "Pass the file its data set publishes.",
                          cost=_LIBSVM_COST) as f:
            X_raw, y = load_svmlight_file(f, dtype=np.float64, zero_based=True)
    except HyflError:
        raise
    except ValueError as error:
        where = _first_bad_line(path, max_features)
        at = f" at line {where[0]} ({where[1]})" if where else ""
        try:
            with _open_by_suffix(path) as f:
                head = f.read(4)
        except (OSError, EOFError):
            head = b""
        if head[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in head:
            raise fail(
                source,
                "is not ASCII/UTF-8 text (it looks UTF-16 encoded or binary)",
                "Save it as plain ASCII or UTF-8 text, one '<label> <index>:<value> ...' "
                "line per sample.",
            ) from error
        raise fail(
            source,
            f"is not valid LIBSVM format{at}: {error}",
            "Each line must read '<label> <index>:<value> ...' with increasing integer "
            "indices; fix or remove the bad line.",
        ) from error
    except OverflowError as error:
        where = _first_bad_line(path, max_features)
        at = f" at line {where[0]} ({where[1]})" if where else ""
        raise fail(
            source,
            f"has a feature index too large to represent{at}",
            f"Feature indices must be integers from 1 to {max_features}; fix the bad line.",
        ) from error
    except (OSError, EOFError) as error:
        raise fail(
            source,
            f"could not be read or decompressed: {error}",
            "Check that the file is complete and that its suffix (.gz, .bz2 or none) "
            "matches its compression.",
        ) from error
    if X_raw.shape[0] == 0:
        raise fail(
            source,
            "holds no samples (it is empty or only has comments)",
            "Pass a file with at least one data line.",
        )
    if X_raw.shape[1] > max_features + 1:  # +1: a 1-based file's largest index is width
        where = _first_bad_line(path, max_features)
        at = f" at line {where[0]}" if where else ""
        gib = 8 * X_raw.shape[1] / 2**30
        raise fail(
            source,
            f"uses feature index {X_raw.shape[1] - 1}{at}, above the limit of {max_features} "
            f"features (each dense weight vector would need {gib:.1f} GiB)",
            "Fix the index if it is a typo; for genuinely wider data pass a larger "
            "max_features (or set the environment variable HYFL_MAX_FEATURES).",
        )
    return X_raw, y


def _apply_index_base(X_raw: sp.csr_matrix, zero_based: bool | str,
                      source: str) -> tuple[sp.csr_matrix, bool]:
    """Raw indices to column numbers: ``zero_based="auto"`` reads a file that never uses
    index 0 as 1-based (standard LIBSVM, sklearn's rule); a 1-based file is shifted by
    one. Returns the matrix and the base decided."""
    has_index_zero = X_raw.nnz > 0 and int(X_raw.indices.min()) == 0
    if zero_based == "auto":
        zero_based = has_index_zero or X_raw.nnz == 0
    if not zero_based:
        if has_index_zero:
            raise fail(
                source,
                "uses feature index 0 but is read as 1-based",
                "Load it with zero_based=True (or like its training file).",
            )
        X_raw = sp.csr_matrix(
            (X_raw.data, X_raw.indices - 1, X_raw.indptr),
            shape=(X_raw.shape[0], max(X_raw.shape[1] - 1, 0)),
        )
    return X_raw, zero_based


def load_libsvm(
    path: str | os.PathLike,
    n_features: int | None = None,
    name: str | None = None,
    *,
    zero_based: bool | str = "auto",
    classes: tuple | None = None,
    task: str | None = None,
    max_features: int | None = None,
) -> Dataset:
    """Load a LIBSVM/SVMlight file (plain, ``.gz`` or ``.bz2``).

    Parameters
    ----------
    path : str or path-like
        The file. Compression is chosen by suffix, as in sklearn.
    n_features : int, optional
        Width of ``X``. Files only reveal their largest feature index, so pass
        the training width when loading a test file. A file using more
        features raises.
    name : str, optional
        Dataset name; defaults to the file name without compression suffix.
    zero_based : bool or "auto", default "auto"
        Whether feature indices start at 0. ``"auto"`` follows sklearn: a file
        that never uses index 0 is 1-based (standard LIBSVM). Pass the
        training file's ``meta["zero_based"]`` for its test file.
    classes : tuple, optional
        Original labels of the training file (its ``meta["classes"]``), so
        this file's labels are mapped the same way.
    task : {"binary", "multiclass", "regression"}, optional
        Force the task instead of inferring it from the labels.
    max_features : int, optional
        Largest feature index accepted; a larger one is refused before any
        wide array is allocated. Default: ``$HYFL_MAX_FEATURES`` if set, else
        ``MAX_FEATURES`` (2**24).

    Returns
    -------
    Dataset
        ``X`` csr float64, shape (n_samples, n_features). Labels: two distinct
        values -> binary {-1, +1} (smaller -> -1); more than two integers ->
        multiclass ``0..C-1``; non-integers -> regression.
        ``meta["classes"]`` keeps the original class values.

    Raises
    ------
    HyflError
        Missing, malformed, undecodable, empty or non-finite files, values
        beyond ``MAX_ABS_VALUE``, or feature indices beyond ``max_features``.
    """
    max_features = _max_features(max_features)
    path = Path(path)
    source = f"LIBSVM file {path}"
    _check_file(path, "LIBSVM file")
    X_raw, y = _parse_libsvm(path, source, max_features)
    X_raw, zero_based = _apply_index_base(X_raw, zero_based, source)
    file_features = int(X_raw.indices.max()) + 1 if X_raw.nnz else 0

    check_values(y, source, lambda r: f"in sample {r + 1} (1-based, counting data lines)", "label")
    check_values(
        X_raw.data,
        source,
        lambda e: "in sample "
        f"{int(np.searchsorted(X_raw.indptr, e, side='right'))} (1-based, counting data lines)",
        "feature value",
    )

    if n_features is None:
        n_features = file_features
    elif file_features > n_features:
        raise fail(
            source,
            f"uses {file_features} features but n_features={n_features}",
            "Load it with n_features at least as large as its largest feature index, "
            "or check that it belongs to the same dataset as the training file.",
        )
    X = clean_csr(widen(X_raw, n_features))
    y, task, classes = map_labels(y, source, classes=classes, task=task)
    return Dataset(
        X=X,
        y=y,
        name=name or _display_name(path),
        task=task,
        meta={
            "source": str(path),
            "format": "libsvm",
            "zero_based": bool(zero_based),
            "classes": classes,
            "n_features_in_file": file_features,
        },
    )


# --------------------------------------------------------------------------- IDX

_IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
_IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension


def _read_maybe_gzip(path: Path, what: str) -> bytes:
    """Whole file content, gunzipped if it starts with the gzip magic bytes."""
    _check_file(path, what)
    with open(path, "rb") as f:
        head = f.read(2)
    try:
        if head == b"\x1f\x8b":
            # Read at most one byte past the file's bound (hyfl._io's rule): no gzip bomb.
            cap = decoded_cap(path.stat().st_size)
            with gzip.open(path, "rb") as f:
                content = f.read(cap + 1)
            check_decoded(f"{what} {path}", len(content), path.stat().st_size,
                          "Get a fresh copy of the file.", "gunzipped, counted while reading")
            return content
        return path.read_bytes()
    except (OSError, EOFError) as error:
        raise fail(
            f"{what} {path}",
            f"could not be decompressed: {error}",
            "The file is probably truncated or corrupt; get a fresh copy.",
        ) from error


def _parse_idx(path: Path, what: str, magic: int, ndim: int) -> np.ndarray:
    """Check an IDX file's header and size and return its uint8 array."""
    content = _read_maybe_gzip(path, what)
    culprit = f"{what} {path}"
    # Magic first (it needs only 4 bytes): a swapped file should say so, not "short".
    if len(content) >= 4:
        (found,) = struct.unpack(">I", content[:4])
        if found != magic:
            swapped = {
                _IDX_IMAGES_MAGIC: " (that is an IDX images file)",
                _IDX_LABELS_MAGIC: " (that is an IDX labels file)",
            }.get(found, "")
            raise fail(
                culprit,
                f"has magic number {found}{swapped}, expected {magic}",
                "Pass the right IDX file (images: magic 2051, labels: magic 2049); "
                "check that images and labels are not swapped.",
            )
    header_size = 4 + 4 * ndim
    if len(content) < header_size:
        raise fail(
            culprit,
            f"is {len(content)} bytes long, shorter than the {header_size}-byte IDX header",
            "The file is truncated or not IDX; get a fresh copy.",
        )
    dims = struct.unpack(f">{ndim}I", content[4:header_size])
    # Python integers: an int64 product wraps (2**31 x 2**31 x 4 "is" 0 bytes).
    expected = math.prod(dims)
    if math.prod(dims[1:]) > MAX_FEATURES:
        raise fail(
            culprit,
            f"declares {' x '.join(str(d) for d in dims)}: {math.prod(dims[1:])} values per "
            f"sample, more than the {MAX_FEATURES} features hyfl reads",
            "The header is damaged or forged; get a fresh copy of the file.",
        )
    found_bytes = len(content) - header_size
    if found_bytes != expected:
        shape = " x ".join(str(d) for d in dims)
        state = "truncated" if found_bytes < expected else "longer than its header says"
        raise fail(
            culprit,
            f"is {state}: header says {shape} = {expected} data bytes, file has {found_bytes}",
            "Get a complete, unmodified copy of the file.",
        )
    return np.frombuffer(content, dtype=np.uint8, offset=header_size).reshape(dims)


def load_idx(
    images_path: str | os.PathLike,
    labels_path: str | os.PathLike,
    name: str | None = None,
) -> Dataset:
    """Load an MNIST-style pair of IDX files (gzip or plain).

    Parameters
    ----------
    images_path : str or path-like
        IDX images: magic 2051, then n, rows, cols, then n*rows*cols uint8.
    labels_path : str or path-like
        IDX labels: magic 2049, then n, then n uint8.
    name : str, optional
        Dataset name; defaults to the images file name.

    Returns
    -------
    Dataset
        ``X`` csr float64, shape (n, rows*cols), raw pixel values 0..255 (not
        scaled); ``y`` int64, shape (n,); task ``"multiclass"``;
        ``meta["image_shape"] = (rows, cols)``.

    Raises
    ------
    HyflError
        Wrong magic number, a size that does not match the header, or image
        and label counts that differ.
    """
    images_path, labels_path = Path(images_path), Path(labels_path)
    images = _parse_idx(images_path, "IDX images file", _IDX_IMAGES_MAGIC, 3)
    labels = _parse_idx(labels_path, "IDX labels file", _IDX_LABELS_MAGIC, 1)
    n, rows, cols = images.shape
    if labels.shape[0] != n:
        raise fail(
            f"IDX files {images_path} and {labels_path}",
            f"disagree: {n} images but {labels.shape[0]} labels",
            "Pass the labels file that belongs to the images file (train with train, "
            "test with test).",
        )
    # Convert while still uint8: the dense float64 copy would be 8x larger.
    X = sp.csr_matrix(images.reshape(n, rows * cols)).astype(np.float64)
    X.sort_indices()
    return Dataset(
        X=X,
        y=labels.astype(np.int64),
        name=name or _display_name(images_path),
        task="multiclass",
        meta={
            "source": str(images_path),
            "labels_source": str(labels_path),
            "format": "idx",
            "image_shape": (int(rows), int(cols)),
            "classes": tuple(int(c) for c in np.unique(labels)),
        },
    )
