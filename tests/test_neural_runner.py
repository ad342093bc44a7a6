"""hyfl run / compare with hyfem-nn: results folder, model file, CLI, errors, determinism.

The data are a tiny stand-in for MNIST: sklearn's 8x8 digits written as IDX
files into a temporary data folder, read by the registry's ``mnist`` loader
(so the image shape and the bias column come from the real code path).
"""

import csv
import json
import struct

import numpy as np
import pytest

pytest.importorskip("jax")

from typer.testing import CliRunner  # noqa: E402

from hyfl.errors import HyflError  # noqa: E402
from hyfl.experiments.runner import RunSpec, compare, execute  # noqa: E402
from hyfl.neural.model_file import load_neural_model  # noqa: E402
from hyfl.neural.runner import check_spec  # noqa: E402

HYPER = {"extractor_hidden": 8, "embedding": 4, "inference_hidden": 8, "batch_size": 16,
         "local_steps": 3, "learning_rate": 0.1}


def write_idx(folder, prefix, images, labels):
    n, rows, cols = images.shape
    (folder / f"{prefix}-images-idx3-ubyte").write_bytes(
        struct.pack(">iiii", 2051, n, rows, cols) + images.astype(np.uint8).tobytes())
    (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(
        struct.pack(">ii", 2049, n) + labels.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.clip(digits.images * 16, 0, 255)  # 0..16 -> 0..255
    folder = tmp_path_factory.mktemp("digits")
    write_idx(folder, "train", images[:160], digits.target[:160])
    write_idx(folder, "t10k", images[160:220], digits.target[160:220])
    return folder


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HYFL_OFFLINE", "1")


def spec(digits_dir, **kw):
    base = dict(algorithm="hyfem-nn", data="mnist", data_dir=str(digits_dir),
                partition="quadrant:4", participation="full", iterations=2, hyper=dict(HYPER))
    return RunSpec(**{**base, **kw})


def rows_of(path):
    return list(csv.DictReader(open(path)))


def test_run_writes_results_folder_and_model(digits_dir, tmp_path):
    out = tmp_path / "r"
    outcome = execute(spec(digits_dir), out_dir=out)
    for name in ("metrics.csv", "run.json", "participation.csv", "model.npz", "accuracy.png"):
        assert (out / name).is_file(), name
    rows = rows_of(out / "metrics.csv")
    assert {"iteration", "loss", "val_accuracy", "val_auc", "local_val_accuracy", "train_accuracy",
            "bytes_up", "bytes_down", "round_trips", "sim_time", "active_clients"} <= set(rows[0])
    assert [float(r["iteration"]) for r in rows] == [0.0, 1.0, 2.0]
    assert [float(r["round_trips"]) for r in rows] == [0.0, 1.0, 2.0]  # cumulative
    assert 0 < float(rows[1]["bytes_up"]) < float(rows[2]["bytes_up"])
    assert all(0 <= float(r["val_accuracy"]) <= 1 for r in rows)
    record = json.loads((out / "run.json").read_text())
    assert record["spec"]["algorithm"] == "hyfem-nn"
    assert record["task"]["views"] == [16, 16, 16, 16]  # 4x4 quadrants of 8x8, bias dropped
    assert record["task"]["client_views"] == [[0], [1], [2], [3]]
    part = list(csv.reader(open(out / "participation.csv")))
    assert part[0] == ["iteration", "client_0", "client_1", "client_2", "client_3"]
    assert part[1:] == [["1", "1", "1", "1", "1"], ["2", "1", "1", "1", "1"]]

    model = load_neural_model(out / "model.npz")
    exported = outcome.result.weights
    assert set(model.params) == set(exported) and any(k.startswith("extractor/") for k in exported)
    for key, value in exported.items():
        np.testing.assert_array_equal(model.params[key], value)
    assert len(model.views) == 4 and model.classes.tolist() == list(range(10))
    assert model.header["algorithm"] == "hyfem-nn" and model.header["n_features"] == 64
    assert model.header["config"]["embedding"] == 4

    # an edited parameter (one byte flipped) is refused; the header is kept as written
    with np.load(out / "model.npz", allow_pickle=False) as f:
        arrays = {name: f[name] for name in f.files}
    key = "param:inference/0/W"
    raw = bytearray(arrays[key].tobytes())
    raw[5] ^= 0x01
    arrays[key] = np.frombuffer(bytes(raw), dtype=np.float32).reshape(arrays[key].shape)
    edited = tmp_path / "edited.npz"
    np.savez(edited, **arrays)
    with pytest.raises(HyflError, match="does not match its checksum"):
        load_neural_model(edited)
    with pytest.raises(HyflError, match="does not exist"):
        load_neural_model(tmp_path / "missing.npz")


def test_linear_model_file_is_refused(tmp_path):
    out = tmp_path / "lin"
    execute(RunSpec(algorithm="fedavg", data="synthetic", partition="grid:2x2",
                    participation="full", iterations=2), out_dir=out)
    with pytest.raises(HyflError, match="is not a neural hyfl model"):
        load_neural_model(out / "model.npz")


def test_compare_shares_the_participation_trace(digits_dir, tmp_path):
    out = tmp_path / "c"
    outcomes = compare(spec(digits_dir, participation="0.5"),
                       ["hyfem-nn", "hyfem-nn-avg"], out)
    assert [o.spec.algorithm for o in outcomes] == ["hyfem-nn", "hyfem-nn-avg"]
    for name in ("summary.csv", "summary.md", "compare.png"):
        assert (out / name).is_file(), name
    summary = rows_of(out / "summary.csv")
    assert [r["algorithm"] for r in summary] == ["hyfem-nn", "hyfem-nn-avg"]
    prox, avg = ((out / n / "participation.csv").read_text() for n in ("hyfem-nn", "hyfem-nn-avg"))
    assert prox == avg
    trace = np.array([r[1:] for r in csv.reader(prox.splitlines())][1:], dtype=int)
    assert trace.shape == (2, 4) and trace.sum(axis=1).tolist() == [2, 2]
    algorithm = json.loads((out / "hyfem-nn-avg" / "run.json").read_text())["algorithm"]
    assert algorithm["variant"] == "avg" and algorithm["mu"] == 0.0


def test_same_seed_same_metrics(digits_dir):
    a = execute(spec(digits_dir, participation="0.5", seed=3))
    b = execute(spec(digits_dir, participation="0.5", seed=3))
    for column in ("val_accuracy", "local_val_accuracy", "loss", "bytes_up"):
        np.testing.assert_array_equal(a.result.column(column), b.result.column(column))
    assert a.result.config["participation"] == b.result.config["participation"]


def test_neural_runs_refuse_what_does_not_apply(digits_dir, tmp_path):
    with pytest.raises(HyflError, match="^--cipher paillier does not apply to hyfem-nn"):
        check_spec(spec(digits_dir, cipher="paillier"))
    with pytest.raises(HyflError, match="^--sim-time does not apply to hyfem-nn"):
        check_spec(spec(digits_dir, sim_time=10.0))
    with pytest.raises(HyflError, match="^--sim-time does not apply"):
        execute(spec(digits_dir, sim_time=10.0))
    with pytest.raises(HyflError, match="^--algorithms mixes neural and linear"):
        compare(spec(digits_dir), ["hyfem-nn", "hyfdca"], tmp_path / "mix")
    assert not (tmp_path / "mix").exists()
    with pytest.raises(HyflError, match="^extractor cnn needs image views"):
        execute(RunSpec(algorithm="hyfem-nn", data="synthetic", partition="vertical:2",
                        participation="full", iterations=1,
                        hyper={**HYPER, "extractor": "cnn"}))


def test_cli_run(digits_dir, tmp_path):
    from hyfl.cli import app

    out = tmp_path / "cli"
    args = ["run", "--algorithm", "hyfem-nn", "--data", "mnist", "--data-dir", str(digits_dir),
            "--partition", "quadrant:4", "--participation", "full", "--iterations", "1",
            "--seed", "1", "--no-progress"]
    for k, v in HYPER.items():
        args += ["--param", f"{k}={v}"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(rows_of(out / "metrics.csv")) == 2 and (out / "model.npz").is_file()
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "x"),
                                      "--cipher", "paillier"])
    assert result.exit_code != 0
    assert "--cipher paillier does not apply to hyfem-nn" in result.output


def test_neural_runs_default_to_20_iterations_unless_given(monkeypatch):
    """`hyfl run --algorithm hyfem-nn` without --iterations runs 20 (a pass each), not
    the linear default of 2000; a given --iterations is kept."""
    from typer.testing import CliRunner

    import hyfl.experiments.runner as runner
    from hyfl.cli import NEURAL_ITERATIONS, app

    seen = []

    def fake_execute(spec, *args, **kwargs):
        seen.append(spec.iterations)
        raise SystemExit(0)

    monkeypatch.setattr(runner, "execute", fake_execute)
    CliRunner().invoke(app, ["run", "--algorithm", "hyfem-nn", "--out", "x"])
    CliRunner().invoke(app, ["run", "--algorithm", "hyfem-nn", "--iterations", "3", "--out", "x"])
    CliRunner().invoke(app, ["run", "--algorithm", "hyfdca", "--out", "x"])
    assert seen == [NEURAL_ITERATIONS, 3, 2000]


@pytest.mark.parametrize(
    "algorithm, partition, hyper",
    [
        ("hyfem-nn", "quadrant:4", HYPER),
        ("fedbcd-nn", "vertical:2", {"bottom_hidden": 8, "embedding": 4, "batch_size": 16}),
        ("fedbcd-nn-cnn", "vertical:2", {"embedding": 4, "channels": 2, "batch_size": 16,
                                         "exchanges": 2}),
    ],
)
def test_predict_with_a_neural_model_reproduces_its_validation_accuracy(
    digits_dir, tmp_path, algorithm, partition, hyper
):
    """`hyfl predict` rebuilds the model from model.npz alone (architecture from the
    recorded hyperparameters, views and image boxes from the file) and scores the test
    split exactly as the run's last evaluation did."""
    from hyfl.model_file import load_model
    from hyfl.predict import predict_neural_data

    out = tmp_path / "r"
    outcome = execute(spec(digits_dir, algorithm=algorithm, partition=partition,
                           hyper=dict(hyper)), out_dir=out)
    done = predict_neural_data(out / "model.npz", "mnist:test", tmp_path / "p.csv",
                               data_dir=str(digits_dir))
    assert done.n_samples == 60
    assert done.accuracy == pytest.approx(outcome.result.final["val_accuracy"], abs=1e-12)
    rows = rows_of(tmp_path / "p.csv")
    assert list(rows[0])[:3] == ["index", "prediction", "score_0"] and len(rows) == 60
    with pytest.raises(HyflError, match="holds a neural model"):
        load_model(out / "model.npz")  # the linear reader names what it found


def test_predict_refuses_data_of_another_width(digits_dir, tmp_path):
    from hyfl.predict import predict_neural_data

    execute(spec(digits_dir), out_dir=tmp_path / "r")
    with pytest.raises(HyflError, match="has 30 features, the model was trained on 65"):
        predict_neural_data(tmp_path / "r" / "model.npz", "breast_cancer", tmp_path / "p.csv")


def test_simulated_time_charges_the_slowest_client_the_server_and_latency(digits_dir, tmp_path):
    """HyFEM's clients would train side by side: a round's simulated compute is the slowest
    client plus the server, not the sum of the clients that ran here one after another."""
    outcome = execute(spec(digits_dir, latency=0.5), out_dir=tmp_path / "r")
    rows = outcome.result.metrics
    last = rows[-1]
    assert last["time_latency"] == pytest.approx(0.5 * last["round_trips"]) == 1.0
    for row in rows:
        assert row["sim_time"] == pytest.approx(
            row["time_client"] + row["time_server"] + row["time_latency"])
        assert row["time_client"] + row["time_server"] <= row["round_seconds"] + 1e-9
    assert last["time_client"] > 0 and last["time_server"] > 0
