"""Tests for hyfl.data: LIBSVM/IDX readers, the dataset registry, splits, cache."""

from __future__ import annotations

import bz2
import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file

from hyfl.data import (
    DATASETS,
    Dataset,
    dataset_names,
    default_lambda,
    has_test_split,
    load_data,
    load_dataset,
    load_idx,
    load_libsvm,
    registry,
    train_validation,
)
from hyfl.errors import HyflError

REPO = Path(__file__).resolve().parents[1]
SHARED_CANDIDATES = (REPO.parent / "shared" / "data", Path("/work/shared/data"))
SHARED = next((p for p in SHARED_CANDIDATES if (p / "README.md").is_file()), None)


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No real data folder is reachable and the cache lives in tmp_path."""
    monkeypatch.delenv("HYFL_DATA", raising=False)
    monkeypatch.delenv("HYFL_NO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "_search_anchors", lambda: [tmp_path])
    return tmp_path


def write_libsvm(path: Path, X, y, *, zero_based: bool = False) -> Path:
    """Write a LIBSVM file, compressed according to the suffix of ``path``."""
    plain = path.with_name(path.name + ".plain")
    dump_svmlight_file(X, y, str(plain), zero_based=zero_based)
    content = plain.read_bytes()
    plain.unlink()
    if path.suffix == ".gz":
        content = gzip.compress(content)
    elif path.suffix == ".bz2":
        content = bz2.compress(content)
    path.write_bytes(content)
    return path


def write_idx_images(path: Path, images: np.ndarray, *, magic: int = 2051) -> Path:
    n, rows, cols = images.shape
    content = struct.pack(">IIII", magic, n, rows, cols) + images.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(content) if path.suffix == ".gz" else content)
    return path


def write_idx_labels(path: Path, labels: np.ndarray, *, magic: int = 2049) -> Path:
    content = struct.pack(">II", magic, len(labels)) + labels.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(content) if path.suffix == ".gz" else content)
    return path


def small_problem(seed: int = 0, n: int = 30, d: int = 6):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * (rng.random((n, d)) < 0.5)
    y = np.where(rng.random(n) < 0.5, 0.0, 1.0)
    y[:2] = [0.0, 1.0]  # both classes present whatever the seed
    return X, y


def assert_clean_csr(X) -> None:
    assert sp.issparse(X) and X.format == "csr" and X.dtype == np.float64
    assert X.has_sorted_indices
    assert np.all(X.data != 0)


# --------------------------------------------------------------------------- LIBSVM


@pytest.mark.parametrize("suffix", ["", ".gz", ".bz2", ".svm"])
def test_libsvm_round_trip(tmp_path, suffix):
    X, y = small_problem()
    path = write_libsvm(tmp_path / f"toy.libsvm{suffix}", X, y)
    data = load_libsvm(path)
    assert_clean_csr(data.X)
    np.testing.assert_allclose(data.X.toarray(), X)
    np.testing.assert_array_equal(data.y, np.where(y == 1, 1.0, -1.0))
    assert data.task == "binary"
    assert data.name == "toy.libsvm" + (suffix if suffix == ".svm" else "")
    assert data.meta["zero_based"] is False


@pytest.mark.parametrize("raw", [(0, 1), (1, 2), (-1, 1), (3, 7)])
def test_binary_labels_map_smaller_to_minus_one(tmp_path, raw):
    X, y01 = small_problem()
    y = np.where(y01 == 1, raw[1], raw[0]).astype(float)
    data = load_libsvm(write_libsvm(tmp_path / "b.txt", X, y))
    np.testing.assert_array_equal(data.y, np.where(y01 == 1, 1.0, -1.0))
    assert data.meta["classes"] == tuple(float(v) for v in raw)


def test_multiclass_labels_remapped_and_kept(tmp_path):
    X, _ = small_problem()
    y = np.resize([7.0, 3.0, 5.0], X.shape[0])
    data = load_libsvm(write_libsvm(tmp_path / "m.txt", X, y))
    assert data.task == "multiclass"
    assert data.y.dtype == np.int64
    np.testing.assert_array_equal(data.y, np.resize([2, 0, 1], X.shape[0]))
    assert data.meta["classes"] == (3.0, 5.0, 7.0)
    np.testing.assert_array_equal(data.classes, [0, 1, 2])


def test_non_integer_labels_mean_regression(tmp_path):
    X, _ = small_problem()
    y = np.linspace(-1.5, 2.25, X.shape[0])
    data = load_libsvm(write_libsvm(tmp_path / "r.txt", X, y))
    assert data.task == "regression"
    np.testing.assert_allclose(data.y, y)


def test_explicit_zeros_dropped_and_one_based_read(tmp_path):
    path = tmp_path / "z.txt"
    path.write_text("1 1:0 3:2.5\n# comment line\n\n-1 2:1 # trailing comment\n")
    data = load_libsvm(path)
    assert_clean_csr(data.X)
    assert data.X.shape == (2, 3)
    np.testing.assert_array_equal(data.X.toarray(), [[0, 0, 2.5], [0, 1, 0]])


def test_zero_based_file_detected(tmp_path):
    path = tmp_path / "z0.txt"
    path.write_text("1 0:1 2:3\n-1 1:1\n")
    data = load_libsvm(path)
    assert data.meta["zero_based"] is True
    np.testing.assert_array_equal(data.X.toarray(), [[1, 0, 3], [0, 1, 0]])


def test_n_features_widens_and_rejects_too_small(tmp_path):
    path = tmp_path / "w.txt"
    path.write_text("1 1:1 2:2\n-1 3:3\n")
    assert load_libsvm(path, n_features=10).X.shape == (2, 10)
    with pytest.raises(HyflError, match=r"w\.txt.*3 features but n_features=2"):
        load_libsvm(path, n_features=2)


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("1 1:2 3:4\n-1 2:oops\n1 1:1\n")
    with pytest.raises(HyflError, match=r"bad\.txt.*line 2"):
        load_libsvm(path)


def test_unsorted_indices_are_malformed(tmp_path):
    path = tmp_path / "unsorted.txt.gz"
    path.write_bytes(gzip.compress(b"1 1:2\n1 1:2\n-1 5:1 3:1\n"))
    with pytest.raises(HyflError, match=r"unsorted\.txt\.gz.*line 3"):
        load_libsvm(path)


@pytest.mark.parametrize(
    ("content", "match"),
    [("1 1:1\n-1 1:nan\n", "feature value in sample 2"), ("1 1:1\ninf 2:1\n", "label in sample 2")],
)
def test_non_finite_values_rejected(tmp_path, content, match):
    path = tmp_path / "nan.txt"
    path.write_text(content)
    with pytest.raises(HyflError, match=rf"nan\.txt.*{match}"):
        load_libsvm(path)


@pytest.mark.parametrize("content", ["", "# only a comment\n\n"])
def test_empty_file_rejected(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_text(content)
    with pytest.raises(HyflError, match=r"empty\.txt holds no samples"):
        load_libsvm(path)


def test_missing_or_corrupt_file(tmp_path):
    with pytest.raises(HyflError, match="does not exist"):
        load_libsvm(tmp_path / "nowhere.txt")
    broken = tmp_path / "broken.bz2"
    broken.write_bytes(b"not bzip2 at all")
    with pytest.raises(HyflError, match=r"broken\.bz2 could not be read or decompressed"):
        load_libsvm(broken)


# --------------------------------------------------------------------------- IDX


def tiny_idx(tmp_path: Path, suffix: str = ".gz", n: int = 5):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(n, 3, 2)) * (rng.random((n, 3, 2)) < 0.6)
    labels = rng.integers(0, 10, size=n)
    images_path = write_idx_images(tmp_path / f"imgs-idx3-ubyte{suffix}", images)
    labels_path = write_idx_labels(tmp_path / f"lbls-idx1-ubyte{suffix}", labels)
    return images, labels, images_path, labels_path


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path, suffix):
    images, labels, images_path, labels_path = tiny_idx(tmp_path, suffix)
    data = load_idx(images_path, labels_path)
    assert_clean_csr(data.X)
    np.testing.assert_array_equal(data.X.toarray(), images.reshape(len(images), -1))
    np.testing.assert_array_equal(data.y, labels)
    assert data.task == "multiclass"
    assert data.meta["image_shape"] == (3, 2)


def test_idx_bad_magic_names_file(tmp_path):
    images, labels, images_path, labels_path = tiny_idx(tmp_path)
    with pytest.raises(HyflError, match=r"lbls-idx1-ubyte\.gz has magic number 2049"):
        load_idx(labels_path, images_path)
    odd = write_idx_images(tmp_path / "odd.idx", images, magic=1234)
    with pytest.raises(HyflError, match=r"odd\.idx has magic number 1234, expected 2051"):
        load_idx(odd, labels_path)


def test_idx_truncated_or_too_long(tmp_path):
    _, _, images_path, labels_path = tiny_idx(tmp_path, "")
    content = images_path.read_bytes()
    images_path.write_bytes(content[:-3])
    with pytest.raises(HyflError, match=r"imgs-idx3-ubyte is truncated: header says 5 x 3 x 2"):
        load_idx(images_path, labels_path)
    images_path.write_bytes(content + b"\0")
    with pytest.raises(HyflError, match="longer than its header says"):
        load_idx(images_path, labels_path)
    images_path.write_bytes(content[:7])
    with pytest.raises(HyflError, match="shorter than the 16-byte IDX header"):
        load_idx(images_path, labels_path)
    truncated_gzip = tmp_path / "cut.gz"
    truncated_gzip.write_bytes(gzip.compress(content)[:20])
    with pytest.raises(HyflError, match=r"cut\.gz could not be decompressed"):
        load_idx(truncated_gzip, labels_path)


def test_idx_count_mismatch(tmp_path):
    _, _, images_path, _ = tiny_idx(tmp_path)
    other = write_idx_labels(tmp_path / "other-labels", np.arange(4))
    with pytest.raises(HyflError, match="5 images but 4 labels"):
        load_idx(images_path, other)


# --------------------------------------------------------------------------- registry


def test_registry_contents():
    assert dataset_names() == list(DATASETS)
    for name in ("mnist", "ijcnn1", "reuters", "adult", "covtype", "news20"):
        assert name in DATASETS
    assert default_lambda("mnist") == 1e-3
    assert default_lambda("news20") == 1e-5
    assert default_lambda("covtype") == 5e-5
    assert has_test_split("mnist") and not has_test_split("covtype")
    assert default_lambda("mnist:test") == 1e-3
    assert default_lambda("some/file.libsvm") is None
    with pytest.raises(HyflError, match="Choose one of: mnist"):
        has_test_split("cifar")


def test_generated_datasets_need_no_files(isolated):
    cancer = load_dataset("breast_cancer")
    assert cancer.X.shape == (569, 30)
    assert_clean_csr(cancer.X)
    assert cancer.X.max() == 1.0 and cancer.X.min() == 0.0
    assert set(np.unique(cancer.y)) == {-1.0, 1.0}
    synthetic = load_data("synthetic")
    assert synthetic.X.shape == (2000, 40)
    assert set(np.unique(synthetic.y)) == {-1.0, 1.0}
    np.testing.assert_array_equal(synthetic.y, load_dataset("synthetic").y)
    with pytest.raises(HyflError, match="has no test split"):
        load_dataset("synthetic", "test")


def test_missing_named_file_says_what_to_put_where(isolated):
    empty = isolated / "empty"
    empty.mkdir()
    with pytest.raises(HyflError) as error:
        load_dataset("news20", data_dir=empty)
    message = str(error.value)
    assert "news20.binary.bz2" in message
    assert "HYFL_DATA" in message
    assert str(empty) in message


def test_fake_libsvm_dataset_from_data_dir_env_and_cache(isolated, monkeypatch):
    folder = isolated / "files"
    folder.mkdir()
    X, y = small_problem(n=40, d=5)
    write_libsvm(folder / "ijcnn1.trn.bz2", X, 2 * y - 1)
    # The test file never uses the last feature but must get the train width;
    # an uncompressed copy under the base name is found too.
    X_test, y_test = small_problem(seed=1, n=10, d=4)
    write_libsvm(folder / "ijcnn1.tst", X_test, 2 * y_test - 1)

    train = load_dataset("ijcnn1", data_dir=folder)
    test = load_dataset("ijcnn1", "test", data_dir=folder)
    assert train.X.shape == (40, 5) and test.X.shape == (10, 5)
    assert test.meta["split"] == "test"
    assert_clean_csr(test.X)

    monkeypatch.setenv("HYFL_DATA", str(folder))
    again, validation = train_validation("ijcnn1")
    assert validation is not None and validation.n_samples == 10
    np.testing.assert_array_equal(again.X.toarray(), train.X.toarray())

    # Parsed arrays now come from the cache: the reader must not run again.
    assert list((isolated / "cache" / "hyfl" / "parsed").glob("ijcnn1-train-*.npz"))

    def no_parsing(*args, **kwargs):
        raise AssertionError("parsed again despite the cache")

    monkeypatch.setattr(registry, "load_libsvm", no_parsing)
    cached = load_dataset("ijcnn1")
    np.testing.assert_array_equal(cached.X.toarray(), train.X.toarray())
    assert cached.meta == train.meta
    monkeypatch.setenv("HYFL_NO_CACHE", "1")
    with pytest.raises(AssertionError, match="parsed again"):
        load_dataset("ijcnn1")


def test_test_file_with_more_features_names_both_files(isolated):
    X, y = small_problem(n=20, d=3)
    write_libsvm(isolated / "adult.trn.bz2", X, y)
    X_wide, y_wide = small_problem(seed=2, n=8, d=7)
    X_wide[0, 6] = 1.0
    write_libsvm(isolated / "adult.tst.bz2", X_wide, y_wide)
    with pytest.raises(HyflError, match=r"adult\.tst\.bz2 uses 7 features.*adult\.trn\.bz2"):
        load_dataset("adult", "test", data_dir=isolated)


def test_fake_mnist_preprocessing(isolated):
    images, labels, images_path, labels_path = tiny_idx(isolated)
    images_path.rename(isolated / "t10k-images-idx3-ubyte.gz")
    labels_path.rename(isolated / "t10k-labels-idx1-ubyte.gz")
    data = load_dataset("mnist", "test", data_dir=isolated)
    assert data.X.shape == (5, 7)
    assert data.meta["bias_feature"] == 6 and data.meta["image_shape"] == (3, 2)
    dense = data.X.toarray()
    np.testing.assert_allclose(dense[:, :6], images.reshape(5, 6) / 255.0)
    np.testing.assert_array_equal(dense[:, 6], 10.0)
    assert_clean_csr(data.X)


def test_load_data_path_and_unknown_name(isolated):
    X, y = small_problem()
    path = write_libsvm(isolated / "mine.dat", X, y)
    assert load_data(str(path)).X.shape == X.shape
    with pytest.raises(HyflError, match="Use one of: mnist, ijcnn1"):
        load_data("no-such-dataset")
    with pytest.raises(HyflError, match="is a directory"):
        load_data(isolated)


# --------------------------------------------------------------------------- splits


def test_val_fraction_sizes_and_determinism(isolated):
    train, validation = train_validation("synthetic", val_fraction=0.25, seed=3)
    assert (train.n_samples, validation.n_samples) == (1500, 500)
    assert train.n_features == validation.n_features == 40
    again_train, again_val = train_validation("synthetic", val_fraction=0.25, seed=3)
    np.testing.assert_array_equal(again_val.X.toarray(), validation.X.toarray())
    np.testing.assert_array_equal(again_train.y, train.y)
    _, other = train_validation("synthetic", val_fraction=0.25, seed=4)
    assert not np.array_equal(other.X.toarray(), validation.X.toarray())
    # The two parts are a partition of the full set.
    full = load_dataset("synthetic")
    rows = {row.tobytes() for row in full.X.toarray()}
    parts = [row.tobytes() for part in (train, validation) for row in part.X.toarray()]
    assert len(parts) == len(set(parts)) == len(rows) and set(parts) == rows


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5, 1e-9])
def test_bad_val_fraction(isolated, fraction):
    with pytest.raises(HyflError, match="val_fraction"):
        train_validation("breast_cancer", val_fraction=fraction)


def test_no_validation_without_test_split(isolated):
    train, validation = train_validation("breast_cancer")
    assert validation is None and train.n_samples == 569
    with pytest.raises(HyflError, match="both given"):
        train_validation("breast_cancer", val="synthetic", val_fraction=0.1)


def test_validation_file_with_unknown_label(isolated):
    X, _ = small_problem()
    y = np.resize([0.0, 1.0, 2.0], X.shape[0])
    train_path = write_libsvm(isolated / "train.txt", X, y)
    val_path = write_libsvm(isolated / "val.txt", X[:4], np.array([0.0, 1.0, 5.0, 9.0]))
    with pytest.raises(HyflError, match=r"val\.txt has labels \[5\.0, 9\.0\]"):
        train_validation(train_path, val=val_path)


def test_validation_labels_subset_check(isolated):
    # Holding out can leave a class only in the validation part: that must fail.
    X = sp.csr_matrix(np.eye(6))
    train = Dataset(X=X[:4], y=np.array([0, 1, 0, 1]), name="t", task="multiclass")
    validation = Dataset(X=X[4:], y=np.array([1, 2]), name="v", task="multiclass")
    with pytest.raises(HyflError, match=r"'v' has labels \[2\]"):
        registry._check_compatible(train, validation)


def test_validation_feature_mismatch(isolated):
    X, y = small_problem(d=6)
    train_path = write_libsvm(isolated / "six.txt", X, y)
    with pytest.raises(HyflError, match="has 40 features but training data 'six.txt' has 6"):
        train_validation(train_path, val="synthetic")
    narrow = write_libsvm(isolated / "narrow.txt", X[:5, :3], y[:5])
    train, validation = train_validation(train_path, val=narrow)
    assert validation.X.shape == (5, 6)


# --------------------------------------------------------------------------- real data

needs_shared = pytest.mark.skipif(SHARED is None, reason="shared/data folder not available")


@pytest.fixture
def real(monkeypatch):
    # Parse the real files every time: the tests check the readers, not a cache.
    monkeypatch.setenv("HYFL_NO_CACHE", "1")
    return SHARED


@needs_shared
def test_real_ijcnn1(real):
    data = load_dataset("ijcnn1", data_dir=real)
    assert data.X.shape == (49990, 22)
    assert set(np.unique(data.y)) == {-1.0, 1.0}
    assert_clean_csr(data.X)


@needs_shared
def test_real_mnist(real):
    data = load_dataset("mnist", data_dir=real)
    assert data.X.shape == (60000, 785)
    assert data.X[:, :784].max() == 1.0
    np.testing.assert_array_equal(data.X[:, 784].toarray().ravel(), 10.0)
    assert data.meta["image_shape"] == (28, 28) and data.meta["bias_feature"] == 784
    np.testing.assert_array_equal(np.bincount(data.y)[:3], [5923, 6742, 5958])


@needs_shared
def test_real_reuters_test(real):
    data = load_dataset("reuters", "test", data_dir=real)
    assert data.X.shape == (3299, 8315)
    assert set(np.unique(data.y)) == {-1.0, 1.0}


@needs_shared
def test_real_covtype(real):
    data = load_dataset("covtype", data_dir=real)
    assert data.X.shape == (581012, 54)
    assert int(np.sum(data.y == 1)) == 283301
    assert data.X.min() == 0.0 and data.X.max() == 1.0
    assert_clean_csr(data.X)


def test_shared_folder_found_by_walking_up(isolated, monkeypatch):
    shared = isolated / "shared" / "data"
    shared.mkdir(parents=True)
    X, y = small_problem()
    write_libsvm(shared / "reuters.trn.bz2", X, y)
    deep = isolated / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.setattr(registry, "_search_anchors", lambda: [deep])
    assert shared in registry.search_dirs()
    assert load_dataset("reuters").n_samples == X.shape[0]
    assert os.fspath(registry.cache_dir()).startswith(str(isolated))


def test_libsvm_file_trains_with_liblinear(tmp_path):
    # LIBSVM readers give 64-bit indices; liblinear accepts only 32-bit ones.
    from hyfl.problem import make_problem, solve_centralized

    path = tmp_path / "tiny.svm"
    path.write_text("1 1:0.5 3:2\n-1 2:1\n1 1:1 2:0.3\n-1 3:1.5\n1 1:2\n-1 2:2 3:0.1\n")
    data = load_libsvm(path)
    assert data.X.indices.dtype == np.int32
    optimum = solve_centralized(make_problem(data, "hinge", 0.1), cache=False)
    assert np.isfinite(optimum.primal)
