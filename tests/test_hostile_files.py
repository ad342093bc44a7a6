"""Hostile inputs: small messages and files that would take gigabytes, forged fields.

Issue 26, points 6 and 7, performed as an attacker would: a message whose
description references one array a hundred times, messages beyond the cap,
forged ciphertext counts; ``.npz`` files (model files, checkpoints, party
block files) whose members lie about their shape or inflate a thousandfold;
model files and checkpoints whose fields are forged with a recomputed checksum
(unsorted classes, NaN weights, one class for two outputs, wrong types, shapes
that do not fit the problem). Each is refused with a :class:`HyflError` naming
the file or sender and the field, and with little memory (``tracemalloc``).
"""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile

import numpy as np
import pytest

from hyfl._io import MAX_FILE_BYTES_VARIABLE, read_npz
from hyfl.data import load_data
from hyfl.deploy.blocks import read_block, write_blocks
from hyfl.deploy.codec import MAX_MESSAGE_BYTES_VARIABLE, bundle, decode, encode, unbundle
from hyfl.errors import HyflError
from hyfl.model_file import Model, load_model, model_from_problem, model_sha256, save_model
from hyfl.partition import grid
from hyfl.privacy.ciphers import make_cipher
from hyfl.privacy.layout import EncryptedVector
from hyfl.problem import make_problem
from hyfl.runtime.checkpoint import Checkpointing

#: Peak Python/NumPy allocation a refused input may cause (the attacks aim at gigabytes).
PEAK = 50 << 20


def peak_while(call) -> tuple[BaseException | None, int]:
    """``call()``'s exception (None if it returned) and its peak traced allocation."""
    tracemalloc.start()
    try:
        call()
        error = None
    except Exception as err:  # noqa: BLE001 - returned for the test to judge
        error = err
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return error, peak


def refused(call, match: str) -> HyflError:
    """Assert ``call()`` raises a HyflError matching ``match`` with a small peak."""
    error, peak = peak_while(call)
    assert isinstance(error, HyflError), repr(error)
    assert match in str(error), str(error)
    assert peak < PEAK, f"peak {peak / 2**20:.0f} MiB before refusing"
    return error


# ----------------------------------------------------------------------------- messages


def test_a_description_referencing_one_array_a_hundred_times_is_refused():
    """8 MB on the wire became 808 MB: one array, a hundred references to it."""
    arrays = {"0": np.zeros(1_000_000)}
    spec = json.dumps({"l": [{"a": "0"}] * 100})
    error = refused(lambda: decode(arrays, spec, sender="party 1"), "again")
    assert "message from party 1" in str(error) and "field [1]" in str(error)
    # Through the wire format too, and inside an encrypted vector (ids and values).
    buffer, layout = bundle(arrays)
    refused(lambda: decode(unbundle(buffer, layout, sender="the server"), spec,
                           sender="the server"), "referenced once")
    vector = json.dumps({"e": "0", "kind": "float", "ct": "0"})
    refused(lambda: decode({"0": np.zeros(4, np.int64)}, vector), "again")
    # The honest message with the same array in two fields sends it twice, and decodes.
    shared = np.arange(3.0)
    tree = decode(*encode({"x": shared, "y": shared}))
    np.testing.assert_array_equal(tree["x"], tree["y"])


def test_messages_beyond_the_cap_are_refused_naming_the_way_to_raise_it(monkeypatch):
    monkeypatch.setenv(MAX_MESSAGE_BYTES_VARIABLE, str(1 << 20))
    big = encode({"w": np.zeros(200_000)})  # 1.6 MB of arrays
    error = refused(lambda: decode(*big, sender="party 0"), "more than 1048576 bytes")
    assert MAX_MESSAGE_BYTES_VARIABLE in str(error) and "party 0" in str(error)
    buffer, layout = bundle(big[0])
    refused(lambda: unbundle(buffer, layout, sender="party 0"), MAX_MESSAGE_BYTES_VARIABLE)
    # A description that would parse into more objects than the cap allows.
    refused(lambda: decode({}, json.dumps({"l": [{"v": 0}] * 100_000})), "more than")
    # Ciphertexts are charged for their Python objects before any is built.
    many = {"e": "0", "kind": "float", "ct": "1"}
    refused(lambda: decode({"0": np.zeros(10_000, np.int64), "1": np.zeros(10_000)},
                           json.dumps(many), make_cipher("none")), "10000 ciphertexts")
    monkeypatch.setenv(MAX_MESSAGE_BYTES_VARIABLE, "lots")
    with pytest.raises(HyflError, match=f"{MAX_MESSAGE_BYTES_VARIABLE} is 'lots'"):
        decode(*big)


def test_forged_ciphertext_counts_widths_and_sizes_are_refused_before_decoding():
    paillier = make_cipher("paillier", key_bits=256)
    arrays, spec = encode({"v": EncryptedVector(np.arange(3), paillier.encrypt(
        np.ones((3, 1))))})
    vector = json.loads(spec)["d"]["v"]
    # Wider than any ciphertext of the key: 3 ciphertexts of 64 KiB from ... 3 x 64 KiB.
    wide = {**arrays, vector["ct"]: np.zeros(3 << 16, np.uint8)}
    forged = json.dumps({"d": {"v": {**vector, "width": 1 << 16}}})
    refused(lambda: decode(wide, forged, paillier), "wider than any of this key")
    # More ciphertexts claimed than bytes sent.
    short = json.dumps({"d": {"v": {**vector, "width": vector["width"] * 2}}})
    refused(lambda: decode(arrays, short, paillier), "ciphertexts of")
    # Lattice sizes whose int64 sum wraps around (each slice would copy the whole blob).
    lattice = {"e": "0", "kind": "lattice", "ct": "1", "sizes": "2", "addends": "3"}
    sizes = np.array([2**62, 2**62, 2**62, 2**62 + 100], dtype=np.int64)
    assert int(sizes.sum()) == 100  # what an int64 check would have seen
    refused(lambda: decode({"0": np.arange(4), "1": np.zeros(100, np.uint8), "2": sizes,
                            "3": np.ones(4, np.int64)}, json.dumps(lattice)),
            "do not add up")


def test_a_short_ckks_blob_is_refused_before_seal_inflates_it():
    ckks = make_cipher("ckks")
    honest, _ = ckks.serialize(ckks.encrypt(np.zeros((1, ckks.slots))))
    with pytest.raises(HyflError, match="not a CKKS ciphertext of this context"):
        ckks.deserialize([honest[0][:4096]], [1])
    with pytest.raises(HyflError, match="not a CKKS ciphertext of this context"):
        ckks.deserialize([honest[0] * 3], [1])


# ----------------------------------------------------------------------------- .npz files


def npy(shape, dtype="<f8") -> bytes:
    """An ``.npy`` header declaring ``shape`` (no data)."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype, "fortran_order": False,
                                               "shape": tuple(shape)})
    return out.getvalue()


def with_member(path, name: str, content: bytes, *, deflate: bool = False):
    """``path`` with member ``name.npy`` replaced by raw ``content``."""
    with zipfile.ZipFile(path) as old:
        kept = {i.filename: old.read(i) for i in old.infolist() if i.filename != f"{name}.npy"}
    with zipfile.ZipFile(path, "w") as new:
        for filename, data in kept.items():
            new.writestr(filename, data)
        method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
        with new.open(zipfile.ZipInfo(f"{name}.npy"), "w", force_zip64=True) as f:
            f._compress_type = method  # noqa: SLF001 (ZipInfo above fixes it otherwise)
            f.write(content)
    return path


def zip_bomb(path, name: str, gigabytes: float = 1.0):
    """``path`` with member ``name.npy``: a genuine header and ``gigabytes`` of zeros,
    deflated to about a thousandth."""
    n, before = int(gigabytes * (1 << 30)) // 8, path.stat().st_size
    with zipfile.ZipFile(path) as old:
        kept = {i.filename: old.read(i) for i in old.infolist() if i.filename != f"{name}.npy"}
    with zipfile.ZipFile(path, "w") as new:
        for filename, data in kept.items():
            new.writestr(filename, data)
        info = zipfile.ZipInfo(f"{name}.npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        with new.open(info, "w", force_zip64=True) as f:
            f.write(npy((n,)))
            chunk = bytes(8 << 20)
            for _ in range(n * 8 // len(chunk)):
                f.write(chunk)
    assert path.stat().st_size - before < 2 << 20  # a megabyte more on disk
    return path


@pytest.fixture(scope="module")
def breast_cancer():
    data = load_data("breast_cancer")
    return data, make_problem(data, "hinge", 1e-3)


@pytest.fixture
def model_path(tmp_path, breast_cancer):
    data, problem = breast_cancer
    w = np.random.default_rng(0).normal(size=(problem.n_features, 1))
    return save_model(tmp_path / "model.npz", model_from_problem(
        problem, w, data_meta=data.meta, algorithm="hyfdca", data="breast_cancer",
        data_y=data.y))


@pytest.fixture
def block_path(tmp_path, breast_cancer):
    _, problem = breast_cancer
    partition = grid(problem.n_samples, problem.n_features, 2, 2)
    return write_blocks(problem, partition, tmp_path / "blocks")[0]


def test_a_member_whose_header_lies_about_its_shape_is_refused_before_it_is_read(
        model_path, block_path):
    """A header declaring 800 MB over 8 bytes of data: np.load allocated the 800 MB."""
    lie = npy((100_000_000, 1)) + bytes(8)
    with_member(model_path, "weights", lie)
    refused(lambda: load_model(model_path), "declares 800000000 bytes")
    with_member(block_path, "X_data", npy((100_000_000,)) + bytes(8))
    refused(lambda: read_block(block_path), "declares 800000000 bytes")


@pytest.mark.parametrize("target", ["model", "block", "neural"])
def test_a_zip_bomb_member_is_refused_with_little_memory(tmp_path, model_path, block_path,
                                                         target):
    """1 MB on disk, a gigabyte inflated: np.load took 1.1-1.3 GB and accepted it."""
    from hyfl.neural.model_file import is_neural_model, load_neural_model

    path = {"model": model_path, "block": block_path, "neural": model_path}[target]
    zip_bomb(path, "weights" if target != "block" else "X_data")
    load = {"model": load_model, "block": read_block, "neural": load_neural_model}[target]
    error = refused(lambda: load(path), "would decode to")
    assert str(path) in str(error)
    assert not is_neural_model(path)


def test_the_file_cap_is_named_with_the_way_to_raise_it(monkeypatch, model_path):
    monkeypatch.setenv(MAX_FILE_BYTES_VARIABLE, "100")
    error = refused(lambda: load_model(model_path), "the cap")
    assert MAX_FILE_BYTES_VARIABLE in str(error) and "If the file is genuine" in str(error)
    monkeypatch.delenv(MAX_FILE_BYTES_VARIABLE)
    assert load_model(model_path).n_features == 30


def test_npz_members_that_are_not_plain_arrays_are_refused(tmp_path):
    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a.npy", npy((2,)) + bytes(16))
        z.writestr("a.npy", npy((2,)) + bytes(16))  # twice: which one would be read?
    with pytest.raises(HyflError, match="once each"):
        read_npz(path, "file x", "a test file", "Fix it.")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a.npy", npy((2,), "|O") + bytes(16))
    with pytest.raises(HyflError, match="dtype object"):
        read_npz(path, "file x", "a test file", "Fix it.")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a.npy", b"\x93NUMPY\x01\x00" + b"\xff" * 60)
    with pytest.raises(HyflError, match="not a readable .npy array"):
        read_npz(path, "file x", "a test file", "Fix it.")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a.npy", npy((2,)) + bytes(8))
    with pytest.raises(HyflError, match="declares 16 bytes"):
        read_npz(path, "file x", "a test file", "Fix it.")


# ----------------------------------------------------------------------------- model files


def forge(path, header: dict | None = None, **arrays):
    """Rewrite a model file with forged fields and a recomputed checksum (it is no
    signature: anyone can)."""
    with np.load(path, allow_pickle=False) as f:
        content = {name: f[name] for name in f.files}
    head = json.loads(content.pop("__header__").tobytes())
    head.update(header or {})
    content.update(arrays)
    head["content_sha256"] = model_sha256(content, head)
    np.savez(path, __header__=np.frombuffer(json.dumps(head).encode(), np.uint8), **content)
    return path


def multiclass_model(tmp_path, **fields) -> Model:
    values = dict(weights=np.ones((4, 3)), intercept=np.zeros(3), task="multiclass",
                  classes=np.array([0.0, 1, 2]), labels=np.array([3.0, 5, 7]), loss="hinge",
                  lam=0.1, partition="", algorithm="hyfdca", provenance={})
    values.update(fields)
    return save_model(tmp_path / "model.npz", Model(**values))


@pytest.mark.parametrize("forgery, field", [
    ({"classes": [2.0, 0, 1]}, "classes"),  # unsorted: searchsorted maps labels wrongly
    ({"classes": [0.0, 0, 1]}, "classes"),  # one class for two outputs
    ({"labels": [3.0, 3, 7]}, "labels"),  # one label for two classes
    ({"weights": np.full((4, 3), np.nan)}, "weights"),
    ({"weights": np.full((4, 3), np.inf)}, "weights"),
    ({"intercept": np.array([0.0, np.nan, 0.0])}, "intercept"),
    ({"intercept": np.zeros(2)}, "intercept"),  # one bias short of the 3 outputs
    ({"classes": [0.0, 1], "labels": [3.0, 5]}, "n_outputs"),  # 3 outputs, 2 classes
    ({"task": "binary"}, "n_outputs"),
    ({"lam": "0.1"}, "'lam'"),
    ({"lam": float("nan")}, "'lam'"),
    ({"loss": ["hinge"]}, "'loss'"),
    ({"n_features": "4"}, "'n_features'"),
    ({"n_features": 5}, "weights"),
    ({"task": "ranking"}, "'task'"),
    ({"provenance": ["x"]}, "'provenance'"),
    ({"provenance": {"zero_based": "yes"}}, "'provenance'"),
])
def test_forged_model_files_are_refused_naming_the_field(tmp_path, forgery, field):
    path = multiclass_model(tmp_path)
    assert load_model(path).predict(np.eye(4)).tolist() == [3.0] * 4  # the genuine file
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in forgery.items()
              if k in ("weights", "intercept", "classes", "labels")}
    header = {k: v for k, v in forgery.items() if k not in arrays}
    forge(path, header, **arrays)
    with pytest.raises(HyflError, match="has .*" + field) as caught:
        load_model(path)
    assert str(path) in str(caught.value) and "retrain" in str(caught.value)


def test_a_forged_binary_model_is_refused(model_path):
    forge(model_path, classes=np.array([1.0, -1.0]), labels=np.array([0.0, 1.0]))
    with pytest.raises(HyflError, match="classes"):
        load_model(model_path)


def test_a_forged_header_that_is_not_json_or_not_an_object_is_refused(model_path):
    with np.load(model_path) as f:
        content = {n: f[n] for n in f.files}
    for blob, message in [(b"\xff\xfe", "not JSON"), (b"[1, 2]", "a list, not a JSON object"),
                          (b"[" * 100_000, "not JSON")]:
        content["__header__"] = np.frombuffer(blob, np.uint8)
        np.savez(model_path, **content)
        with pytest.raises(HyflError, match=message):
            load_model(model_path)


# ----------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from test_resume import run

    path = tmp_path_factory.mktemp("checkpoint") / "checkpoint.npz"
    run("hyfdca", 4, checkpointing=Checkpointing(path))
    with np.load(path, allow_pickle=False) as f:
        return {name: f[name] for name in f.files}


def resume_from(tmp_path, arrays: dict, **more_members):
    from test_resume import run

    path = tmp_path / "checkpoint.npz"
    np.savez(path, **{**arrays, **more_members})
    return lambda: run("hyfdca", 8, checkpointing=Checkpointing(path, resume=True))


def state_fields(arrays: dict) -> tuple[dict, dict]:
    """The checkpoint's body and the description of the algorithm state's fields."""
    body = json.loads(arrays["__body__"].tobytes())
    state = next(v for k, v in body["d"] if k == {"v": "state"})
    return body, state["f"]


def with_body(arrays: dict, body: dict) -> dict:
    return {**arrays, "__body__": np.frombuffer(json.dumps(body).encode(), np.uint8)}


def test_a_checkpoint_of_nan_duals_is_refused_naming_the_field(tmp_path, checkpoint):
    _, fields = state_fields(checkpoint)
    alpha = fields["alpha"]["a"]
    forged = {**checkpoint, alpha: np.full_like(checkpoint[alpha], np.nan)}
    with pytest.raises(HyflError, match=r"cannot be restored \(state.alpha holds NaN"):
        resume_from(tmp_path, forged)()


@pytest.mark.parametrize("change, message", [
    (lambda a: a[:-5], "state.alpha is of dtype float64 and shape"),  # fewer samples
    (lambda a: a[:, None], "state.alpha is of dtype"),  # another number of dimensions
    (lambda a: a > 0, "state.alpha is of dtype bool"),
])
def test_a_checkpoint_whose_arrays_do_not_fit_the_problem_is_refused(tmp_path, checkpoint,
                                                                     change, message):
    _, fields = state_fields(checkpoint)
    alpha = fields["alpha"]["a"]
    forged = {**checkpoint, alpha: change(checkpoint[alpha])}
    with pytest.raises(HyflError, match=message) as caught:
        resume_from(tmp_path, forged)()
    assert "Delete it (or run without --resume) to start over" in str(caught.value)


def test_a_checkpoint_of_another_shape_or_type_is_refused(tmp_path, checkpoint):
    body, fields = state_fields(checkpoint)
    fields["beta"] = {"v": "one"}  # a number expected
    with pytest.raises(HyflError, match="state.beta is a str, not a number"):
        resume_from(tmp_path, with_body(checkpoint, body))()
    body, fields = state_fields(checkpoint)
    fields["snapshots"] = {"l": []}  # a hyfl object expected
    with pytest.raises(HyflError, match="state.snapshots is a list, not a WeightSnapshots"):
        resume_from(tmp_path, with_body(checkpoint, body))()


def test_a_checkpoint_referencing_one_array_many_times_is_refused(tmp_path, checkpoint):
    body, fields = state_fields(checkpoint)
    fields["copies"] = {"l": [fields["alpha"]] * 100}
    error, peak = peak_while(resume_from(tmp_path, with_body(checkpoint, body)))
    assert isinstance(error, HyflError) and "referenced twice" in str(error)


def test_a_checkpoint_member_no_field_refers_to_is_refused(tmp_path, checkpoint):
    with pytest.raises(HyflError, match="holds member 'extra', which no field"):
        resume_from(tmp_path, checkpoint, extra=np.zeros(3))()


def test_a_checkpoint_bomb_or_lying_header_is_refused_with_little_memory(tmp_path,
                                                                         checkpoint):
    resume = resume_from(tmp_path, checkpoint)
    zip_bomb(tmp_path / "checkpoint.npz", "a2")
    refused(resume, "would decode to")
    resume = resume_from(tmp_path, checkpoint)
    with_member(tmp_path / "checkpoint.npz", "a2", npy((100_000_000,)) + bytes(8))
    refused(resume, "declares 800000000 bytes")


# ----------------------------------------------------------------------------- party blocks


@pytest.mark.parametrize("member, value, message", [
    ("features", np.array([3, 1, 2]), "features that are not ascending"),
    ("samples", np.array([0, 10**6]), "samples that are not ascending ids below"),
    ("X_shape", np.array([10**9, 10**9]), "X_shape"),
    ("X_indices", None, "do not fit its shape"),
    ("Y", np.zeros(3), "do not fit its shape"),
    ("format", np.array("other"), "is not a hyfl-party-block file"),
    ("party", np.array(1.5), "dtype float64"),
])
def test_forged_block_files_are_refused(block_path, member, value, message):
    with np.load(block_path) as f:
        content = {n: f[n] for n in f.files}
    if value is None:  # a column beyond the block's features
        value = content["X_indices"].copy()
        value[0] = 10**6
    content[member] = value
    np.savez(block_path, **content)
    with pytest.raises(HyflError, match=message) as caught:
        read_block(block_path)
    assert str(block_path) in str(caught.value)


# ----------------------------------------------------------------------------- neural models


@pytest.fixture(scope="module")
def neural_model(tmp_path_factory):
    """A tiny hyfem-nn run's model file (sklearn's digits as MNIST, see test_neural_runner)."""
    pytest.importorskip("jax")
    from sklearn.datasets import load_digits

    from hyfl.experiments.runner import RunSpec, execute
    from test_neural_runner import HYPER, write_idx

    digits = load_digits()
    folder = tmp_path_factory.mktemp("digits")
    images = np.clip(digits.images * 16, 0, 255)
    write_idx(folder, "train", images[:160], digits.target[:160])
    write_idx(folder, "t10k", images[160:220], digits.target[160:220])
    out = tmp_path_factory.mktemp("neural")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HYFL_OFFLINE", "1")
        execute(RunSpec(algorithm="hyfem-nn", data="mnist", data_dir=str(folder),
                        partition="quadrant:4", participation="full", iterations=1,
                        hyper=dict(HYPER)), out_dir=out)
    with np.load(out / "model.npz", allow_pickle=False) as f:
        return {name: f[name] for name in f.files}


@pytest.mark.parametrize("forgery, field", [
    ({"param:inference/1/b": lambda a: np.full_like(a, np.nan)}, "parameter 'inference/1/b'"),
    ({"classes": lambda a: a[::-1].copy()}, "classes"),  # unsorted
    ({"classes": lambda a: np.append(a, 10.0)}, "classes"),  # 11 classes, 10 outputs
    ({"param:inference/1/b": lambda a: a[:-1]}, "parameters and header fields"),
    ({"view:0": lambda a: a + 1000}, "view:0"),
    ({"input_features": "65"}, "'input_features'"),
    ({"dropped": [0, 0]}, "'dropped'"),
    ({"n_features": 63}, "'n_features'"),
    ({"client_views": [[7]]}, "'client_views'"),
    ({"config": []}, "'config'"),
])
def test_forged_neural_model_files_are_refused_naming_the_field(tmp_path, neural_model,
                                                                forgery, field):
    from hyfl.neural.model_file import load_neural_model, neural_model_sha256

    arrays = dict(neural_model)
    header = json.loads(arrays.pop("__header__").tobytes())
    for key, change in forgery.items():
        if callable(change):
            arrays[key] = change(arrays[key])
        else:
            header[key] = change
    header["content_sha256"] = neural_model_sha256(arrays, header)
    path = tmp_path / "model.npz"
    np.savez(path, __header__=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
    with pytest.raises(HyflError, match="has .*" + field) as caught:
        load_neural_model(path)
    assert str(path) in str(caught.value)
