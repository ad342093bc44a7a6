"""Tests for hyfl.data: LIBSVM/IDX readers, the dataset registry, downloads, splits, cache."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import os
import struct
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file

from hyfl.data import (
    DATASETS,
    FILES,
    DataFile,
    Dataset,
    check_files,
    dataset_files,
    dataset_names,
    default_lambda,
    downloads_allowed,
    fetch,
    has_test_split,
    load_data,
    load_dataset,
    load_idx,
    load_libsvm,
    registry,
    sources,
    train_validation,
)
from hyfl.errors import HyflError

REPO = Path(__file__).resolve().parents[1]
# $HYFL_DATA, else the shared folder beside the repository (CI has ../shared): no
# machine's own absolute path.
SHARED_CANDIDATES = tuple(Path(p) for p in (os.environ.get("HYFL_DATA"),) if p) + (
    REPO.parent / "shared" / "data",)
SHARED = next((p for p in SHARED_CANDIDATES if (p / "README.md").is_file()), None)


# --------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Tests never touch the network: any download attempt fails the test."""

    def refuse(request, timeout=None):
        raise AssertionError(f"a test tried to download {getattr(request, 'full_url', request)}")

    monkeypatch.setattr(fetch, "_urlopen", refuse)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No real data folder is reachable, the cache lives in tmp_path, downloads are off."""
    monkeypatch.delenv("HYFL_DATA", raising=False)
    monkeypatch.delenv("HYFL_NO_CACHE", raising=False)
    monkeypatch.delenv("HYFL_CACHE", raising=False)
    monkeypatch.setenv("HYFL_OFFLINE", "1")
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
    # Offline: it says so, lists the download folder and where to get the file.
    assert "Downloads are off (HYFL_OFFLINE=1)" in message
    assert str(isolated / "cache" / "hyfl" / "data") in message
    assert "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/news20.binary.bz2" in (
        message
    )
    assert "no published sha256" in message and "unset HYFL_OFFLINE" in message
    with pytest.raises(HyflError) as error:
        load_dataset("covtype", data_dir=empty)
    message = str(error.value)
    assert "covtype.csv.gz or covtype.data.gz or covtype.libsvm.binary.scale.bz2" in message
    assert "covtype.data.gz from https://ndownloader.figshare.com/files/5976039" in message


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
        sources._check_compatible(train, validation)


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
    # LIBSVM covtype.binary: Cover_Type 2 (283,301) is label 1 -> -1; the rest -> +1.
    assert int(np.sum(data.y == -1)) == 283301 and int(np.sum(data.y == 1)) == 297711
    assert 1 - data.X.nnz / (581012 * 54) == pytest.approx(0.77878, abs=1e-5)  # Table 1: 77.878%
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


# --------------------------------------------------------------------------- registry files


def test_every_registered_file_is_described():
    hexdigits = set("0123456789abcdef")
    unknown_checksums = set()
    for spec in DATASETS.values():
        for entry in spec.files:
            assert FILES[entry.name] is entry
            if entry.sha256 is None:
                unknown_checksums.add(entry.name)
            else:
                assert len(entry.sha256) == 64 and set(entry.sha256) <= hexdigits
            assert all(url.startswith(("https://", "http://")) for url in entry.urls)
    # Only the LIBSVM site's files lack a published checksum.
    assert unknown_checksums == {"news20.binary.bz2", "covtype.libsvm.binary.scale.bz2"}
    # Every file of a dataset with files can be downloaded, or has a downloadable alternative.
    for spec in DATASETS.values():
        for slot in (*spec.train_files, *spec.test_files):
            assert any(FILES[name].urls for name in spec.names_for(slot)), slot
    assert {"mnist": 1e-3, "news20": 1e-5, "covtype": 5e-5} == {
        name: DATASETS[name].lam for name in ("mnist", "news20", "covtype")
    }


@needs_shared
def test_shared_files_match_registered_checksums():
    for name in ("mnist", "ijcnn1", "reuters", "adult", "covtype"):
        for row in check_files(name, data_dir=SHARED):
            if row["file"] in ("covtype.data.gz", "covtype.libsvm.binary.scale.bz2"):
                continue  # alternatives, not in shared/data
            assert row["status"] == "ok", row


def test_check_files_statuses(isolated):
    folder = isolated / "files"
    folder.mkdir()
    (folder / "adult.trn.bz2").write_bytes(b"not the published file")
    (folder / "adult.tst").write_bytes(b"an uncompressed copy")
    report = {row["file"]: row for row in check_files("adult", data_dir=folder)}
    assert report["adult.trn.bz2"]["status"] == "mismatch"
    assert report["adult.tst.bz2"]["status"] == "unverified"
    assert [row["status"] for row in check_files("news20", data_dir=folder)] == ["missing"]


# --------------------------------------------------------------------------- downloads


class FakeResponse(io.BytesIO):
    status = 200


def fake_server(contents: dict[str, bytes], calls: list[str]):
    """An opener serving ``contents`` by URL; other URLs fail like an unreachable host."""

    def urlopen(request, timeout=None):
        assert timeout is not None and timeout <= 60
        url = request.full_url
        calls.append(url)
        if url not in contents:
            raise urllib.error.URLError("Name or service not known")
        return FakeResponse(contents[url])

    return urlopen


@pytest.fixture
def online(isolated, monkeypatch):
    """Downloads allowed (into tmp_path's cache) from a fake server; returns call log."""
    monkeypatch.delenv("HYFL_OFFLINE")
    calls: list[str] = []

    def serve(contents: dict[str, bytes]) -> list[str]:
        monkeypatch.setattr(fetch, "_urlopen", fake_server(contents, calls))
        return calls

    return serve


def fake_adult(monkeypatch, tmp_path: Path, sha256: str | None = "real"):
    """Register adult's files with fake contents and two addresses each."""
    X, y = small_problem(n=30, d=4)
    contents = {}
    for split, n in (("trn", 30), ("tst", 10)):
        name = f"adult.{split}.bz2"
        content = write_libsvm(tmp_path / f"served-{name}", X[:n], y[:n]).read_bytes()
        digest = hashlib.sha256(content).hexdigest() if sha256 == "real" else sha256
        urls = (f"https://mirror.invalid/{name}", f"https://origin.invalid/{name}")
        monkeypatch.setitem(FILES, name, DataFile(name, digest, urls, len(content)))
        contents[urls[1]] = content
    return contents


def test_missing_file_is_downloaded_verified_into_the_cache(online, monkeypatch, isolated):
    contents = fake_adult(monkeypatch, isolated)
    calls = online(contents)
    assert downloads_allowed()
    train = load_dataset("adult")
    assert train.X.shape == (30, 4)
    cache = isolated / "cache" / "hyfl" / "data"
    assert sorted(p.name for p in cache.iterdir()) == ["adult.trn.bz2"]  # no leftovers
    assert (cache / "adult.trn.bz2").read_bytes() == contents[FILES["adult.trn.bz2"].urls[1]]
    # The unreachable mirror was tried first, then the second address.
    assert calls == list(FILES["adult.trn.bz2"].urls)
    assert check_files("adult")[0]["status"] == "ok"
    # Found in the cache now: no further download.
    monkeypatch.setenv("HYFL_NO_CACHE", "1")
    calls.clear()
    load_dataset("adult")
    assert calls == []
    assert dataset_files("adult", "test")[0] == cache / "adult.tst.bz2"


def test_hyfl_cache_variable_moves_downloads(online, monkeypatch, isolated):
    contents = fake_adult(monkeypatch, isolated)
    online(contents)
    monkeypatch.setenv("HYFL_CACHE", str(isolated / "elsewhere"))
    load_dataset("adult")
    assert (isolated / "elsewhere" / "data" / "adult.trn.bz2").is_file()
    assert list((isolated / "elsewhere" / "parsed").glob("adult-train-*.npz"))


def test_checksum_mismatch_deletes_download_and_explains(online, monkeypatch, isolated):
    contents = fake_adult(monkeypatch, isolated, sha256="0" * 64)
    online(contents)
    with pytest.raises(HyflError) as error:
        load_dataset("adult")
    message = str(error.value)
    assert "adult.trn.bz2" in message and "Downloading failed" in message
    assert f"differs from the published {'0' * 64}" in message and "(deleted)" in message
    assert "https://origin.invalid/adult.trn.bz2" in message
    assert "Put it in" in message
    cache = isolated / "cache" / "hyfl" / "data"
    assert not any(cache.iterdir())


def test_network_failure_names_every_address(online, monkeypatch, isolated):
    fake_adult(monkeypatch, isolated)
    online({})
    with pytest.raises(HyflError) as error:
        load_dataset("adult")
    message = str(error.value)
    assert "https://mirror.invalid/adult.trn.bz2: Name or service not known" in message
    assert "https://origin.invalid/adult.trn.bz2: Name or service not known" in message
    assert "HYFL_OFFLINE=1" in message


def test_offline_never_downloads(isolated, monkeypatch):
    fake_adult(monkeypatch, isolated)
    with pytest.raises(HyflError, match=r"Downloads are off.*Get adult\.trn\.bz2 from"):
        load_dataset("adult")  # the autouse no_network opener would fail the test
    monkeypatch.setenv("HYFL_OFFLINE", "0")
    assert downloads_allowed()
    with pytest.raises(HyflError, match="adult.tst.bz2"):
        dataset_files("adult", "test", download=False)


def test_interrupted_download_leaves_nothing(isolated, monkeypatch):
    class Broken(FakeResponse):
        def read(self, size=-1):
            if self.tell():
                raise TimeoutError("timed out")
            return super().read(4)

    file = DataFile("x.bin", None, ("https://a.invalid/x.bin",))
    fetch_calls = []

    def urlopen(request, timeout=None):
        fetch_calls.append(request.full_url)
        return Broken(b"some bytes that never finish")

    target = isolated / "target"
    monkeypatch.setattr(fetch, "_urlopen", urlopen)
    with pytest.raises(HyflError, match=r"x\.bin failed from every address.*timed out"):
        fetch.download(file, target)
    assert fetch_calls == ["https://a.invalid/x.bin"]
    assert list(target.iterdir()) == []
    with pytest.raises(HyflError, match="has no download address"):
        fetch.download(DataFile("y.bin", None), target)


def test_unverified_download_is_accepted_with_size_check(isolated, caplog, monkeypatch):
    content = b"1 1:1\n-1 2:1\n"
    file = DataFile("n.svm", None, ("https://a.invalid/n.svm",), size=len(content))
    monkeypatch.setattr(fetch, "_urlopen", lambda request, timeout=None: FakeResponse(content))
    with caplog.at_level("WARNING", logger="hyfl.data"):
        path = fetch.download(file, isolated)
    assert path.read_bytes() == content and "no known sha256" in caplog.text
    wrong_size = DataFile("m.svm", None, file.urls, size=3)
    with pytest.raises(HyflError, match=f"{len(content)} bytes received, expected 3"):
        fetch.download(wrong_size, isolated)
    assert not (isolated / "m.svm").exists()


# --------------------------------------------------------------------------- covtype forms


def covtype_rows(n: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    table = np.zeros((n, 55), dtype=np.int64)
    table[:, 0] = rng.integers(1859, 3859, n)
    table[:, 5] = rng.integers(-173, 602, n)
    table[np.arange(n), 10 + rng.integers(0, 4, n)] = 1
    table[np.arange(n), 14 + rng.integers(0, 40, n)] = 1
    table[:, 54] = np.resize([1, 2, 3, 2, 7], n)
    return table


def test_covtype_csv_data_and_libsvm_forms_agree(isolated):
    table = covtype_rows()
    header = ",".join(["Elevation"] + [f"c{i}" for i in range(1, 54)] + ["Cover_Type"])
    lines = "\n".join(",".join(str(v) for v in row) for row in table) + "\n"
    csv_dir, data_dir, libsvm_dir = (isolated / d for d in ("csv", "data", "libsvm"))
    for folder in (csv_dir, data_dir, libsvm_dir):
        folder.mkdir()
    (csv_dir / "covtype.csv.gz").write_bytes(gzip.compress((header + "\n" + lines).encode()))
    (data_dir / "covtype.data.gz").write_bytes(gzip.compress(lines.encode()))
    from_csv = load_dataset("covtype", data_dir=csv_dir)
    from_data = load_dataset("covtype", data_dir=data_dir)
    assert from_csv.X.shape == from_data.X.shape == (12, 54)
    np.testing.assert_array_equal(from_csv.X.toarray(), from_data.X.toarray())
    np.testing.assert_array_equal(from_csv.y, np.where(table[:, 54] == 2, -1.0, 1.0))
    np.testing.assert_array_equal(from_csv.y, from_data.y)
    assert from_csv.X.max() == 1.0 and from_csv.X.min() == 0.0
    # LIBSVM's covtype.binary.scale: label 1 is Cover_Type 2, label 2 the rest.
    labels = np.where(table[:, 54] == 2, 1, 2)
    write_libsvm(libsvm_dir / "covtype.libsvm.binary.scale.bz2", from_csv.X, labels)
    from_libsvm = load_dataset("covtype", data_dir=libsvm_dir)
    np.testing.assert_allclose(from_libsvm.X.toarray(), from_csv.X.toarray(), rtol=1e-12)
    np.testing.assert_array_equal(from_libsvm.y, from_csv.y)


def test_covtype_bad_tables(isolated):
    (isolated / "covtype.csv").write_text("a,b\n1,2\n")
    with pytest.raises(HyflError, match=r"covtype\.csv has 1 rows of 2 columns, expected.*55"):
        load_dataset("covtype", data_dir=isolated)
    table = covtype_rows(3)
    table[1, 54] = 9
    (isolated / "covtype.csv").write_text(
        "\n".join(",".join(str(v) for v in row) for row in table) + "\n"
    )
    with pytest.raises(HyflError, match=r"Cover_Type 9\.0 in data row 2, expected 1\.\.7"):
        load_dataset("covtype", data_dir=isolated)
    (isolated / "covtype.csv").write_text("h\n1,x\n")
    with pytest.raises(HyflError, match=r"covtype\.csv is not a numeric CSV.*55 columns"):
        load_dataset("covtype", data_dir=isolated)


# --------------------------------------------------------------------------- more LIBSVM


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("1 1:2\nabc 1:1\n", r"line 2 \(label 'abc' is not a number\)"),
        ("1 1:2\n-1 3\n", r"line 2 \(token '3' is not index:value\)"),
        ("1 -2:1\n", r"line 1 \(feature index -2 is negative\)"),
        ("1 2:1 2:3\n", r"line 1 \(feature index 2 is not above the previous one\)"),
    ],
)
def test_libsvm_bad_lines_name_line_and_fix(tmp_path, content, match):
    path = tmp_path / "bad.svm"
    path.write_text(content)
    with pytest.raises(HyflError, match=rf"bad\.svm is not valid LIBSVM format at {match}") as e:
        load_libsvm(path)
    assert "fix or remove the bad line" in str(e.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            b"1 1:1 2000000000:1\n",
            r"feature index 2000000000 at line 1, above the limit of 16777216",
        ),
        (b"1 1:1 100000000000000000000:1\n", r"feature index too large to represent at line 1"),
        (b"1 1:1e308\n", r"feature value 1e\+308 in sample 1.*limit \|v\| <= 1e\+150"),
        (b"1e300 1:1\n", r"label 1e\+300 in sample 1"),
        (b"1 1.5:1\n", r"line 1 .*not integer_index:number"),
        (b"1 -3:1\n", r"line 1 \(feature index -3 is negative\)"),
        (b"# only\n# comments\n", r"holds no samples \(it is empty or only has comments\)"),
        (b"", r"holds no samples"),
        ("1 1:1\n".encode("utf-16"), r"not ASCII/UTF-8 text"),
        (b"\x00\x01\x02\xff binary\n", r"not ASCII/UTF-8 text"),
    ],
)
def test_hostile_libsvm_files_are_refused_before_allocating(tmp_path, content, expected):
    path = tmp_path / "bad.svm"
    path.write_bytes(content)
    with pytest.raises(HyflError, match=expected):
        load_libsvm(path)


def test_max_features_keyword_and_environment(tmp_path, monkeypatch):
    path = tmp_path / "wide.svm"
    path.write_text("1 1:1 50:2\n-1 3:1\n")
    with pytest.raises(HyflError, match=r"above the limit of 10 features.*max_features"):
        load_libsvm(path, max_features=10)
    assert load_libsvm(path, max_features=50).X.shape == (2, 50)
    monkeypatch.setenv("HYFL_MAX_FEATURES", "10")
    with pytest.raises(HyflError, match=r"above the limit of 10 features"):
        load_libsvm(path)
    monkeypatch.setenv("HYFL_MAX_FEATURES", "many")
    with pytest.raises(HyflError, match=r"HYFL_MAX_FEATURES is 'many'"):
        load_libsvm(path)


def test_check_values_is_the_one_finiteness_rule():
    from hyfl.data.loaders import MAX_ABS_VALUE, check_values

    check_values(np.array([[MAX_ABS_VALUE, -MAX_ABS_VALUE]]), "x")
    with pytest.raises(HyflError, match=r"x has value 1e\+151 at item 1, beyond"):
        check_values([0.0, 1e151], "x", lambda i: f"at item {i}")
    with pytest.raises(HyflError, match=r"NaN or infinite"):
        check_values([np.nan], "x")
