"""Budgets, checkpoints and resume of the stacked engine (and the protocol engine's budget)."""


import io
import json
from pathlib import Path

import numpy as np
import pytest

from hyfl.algorithms import make_algorithm
from hyfl.costs import CostModel, HECosts
from hyfl.errors import HyflError
from hyfl.experiments.runner import RunSpec, prepare
from hyfl.privacy.ciphers import make_cipher
from hyfl.runtime import checkpoint, simulation
from hyfl.runtime.checkpoint import Checkpointing
from hyfl.runtime.protocol import run_protocol
from hyfl.runtime.simulation import WALL_TIME_COLUMNS, simulate

# (algorithm, hyperparameters, loss, partition, participation)
CASES = {
    "hyfdca": ("hyfdca", {"iic": 0.2}, "hinge", "grid:3x3", "0.5"),
    "fedavg": ("fedavg", {"iic": 0.05}, "hinge", "grid:3x3", "0.5"),
    "hyfem": ("hyfem", {"iic": 0.05, "mu": 0.1}, "hinge", "grid:3x3", "0.5"),
    "fedbcd-p": ("fedbcd-p", {}, "logistic", "vertical:3", "0.7"),
    "fedh-g": ("fedh-g", {}, "logistic", "horizontal:4", "0.7"),
}
_SETUPS = {}


def setup_for(case):
    name, hyper, loss, partition, participation = CASES[case]
    key = (loss, partition, participation)
    if key not in _SETUPS:
        spec = RunSpec(
            algorithm=name,
            data="breast_cancer",
            loss=loss,
            partition=partition,
            participation=participation,
            val_fraction=0.2,
        )
        _SETUPS[key] = prepare(spec)
    return _SETUPS[key]


def run(case, iterations, **options):
    name, hyper, *_ = CASES[case]
    s = setup_for(case)
    return simulate(
        make_algorithm(name, hyper),
        s.problem,
        s.partition,
        s.participation,
        iterations,
        seed=3,
        eval_every=3,
        optimum=s.optimum,
        validation=s.validation,
        train_labels=s.train.y,
        **options,
    )


def assert_same_run(a, b):
    """Iterates and every metric column but the wall-time ones, bit for bit."""
    assert np.array_equal(a.weights, b.weights)
    assert (a.duals is None) == (b.duals is None)
    if a.duals is not None:
        assert np.array_equal(a.duals, b.duals)
    assert len(a.metrics) == len(b.metrics)
    for row_a, row_b in zip(a.metrics, b.metrics):
        assert set(row_a) == set(row_b)
        for key, value in row_a.items():
            if key in WALL_TIME_COLUMNS:
                continue
            other = row_b[key]
            assert value == other or (np.isnan(value) and np.isnan(other)), (key, value, other)
    assert len(a.round_times) == len(b.round_times)


@pytest.mark.parametrize("case", list(CASES))
def test_resume_to_a_larger_budget_equals_an_uninterrupted_run(case, tmp_path):
    full = run(case, 20)
    path = tmp_path / "checkpoint.npz"
    first = run(case, 7, checkpointing=Checkpointing(path))
    assert first.config["stopped_by"] == "iterations" and path.exists()
    # The first part evaluated round 7 only because it ended there.
    assert [r["iteration"] for r in first.metrics] == [0, 3, 6, 7]
    resumed = run(case, 20, checkpointing=Checkpointing(path, resume=True))
    assert_same_run(full, resumed)
    assert [r["iteration"] for r in resumed.metrics] == [0, 3, 6, 9, 12, 15, 18, 20]
    assert resumed.config["resumed_from"] == [7] and resumed.config["rounds"] == 20


@pytest.mark.parametrize("case", ["hyfdca", "fedh-g"])
def test_resume_after_a_crash_mid_run(case, tmp_path):
    full = run(case, 15)
    path = tmp_path / "checkpoint.npz"

    def crash(row):
        if row["iteration"] == 9:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(case, 15, checkpointing=Checkpointing(path, every=2), on_evaluate=crash)
    with np.load(path, allow_pickle=False) as f:
        assert json.loads(f["__header__"].tobytes())["round"] == 8  # the last before the crash
    resumed = run(case, 15, checkpointing=Checkpointing(path, resume=True, every=2))
    assert_same_run(full, resumed)
    assert resumed.config["resumed_from"] == [8]


def test_checkpoints_leave_out_the_data(tmp_path):
    path = tmp_path / "checkpoint.npz"
    run("fedavg", 5, checkpointing=Checkpointing(path, seconds=0.0))
    X = setup_for("fedavg").problem.X
    # FedAvg's state holds an index of every non-zero (as large as X.data): a token too.
    assert path.stat().st_size < X.data.nbytes / 4


def test_resume_without_a_checkpoint_starts_afresh_and_a_finished_run_is_kept(tmp_path):
    path = tmp_path / "checkpoint.npz"
    full = run("hyfdca", 6)
    fresh = run("hyfdca", 6, checkpointing=Checkpointing(path, resume=True))
    assert_same_run(full, fresh) and fresh.config["resumed_from"] == []
    # nothing left to run
    again = run("hyfdca", 6, checkpointing=Checkpointing(path, resume=True))
    assert_same_run(full, again)
    with pytest.raises(HyflError, match="past the budget of 4 iterations"):
        run("hyfdca", 4, checkpointing=Checkpointing(path, resume=True))


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    path = tmp_path / "checkpoint.npz"
    run("hyfdca", 4, checkpointing=Checkpointing(path))
    s = setup_for("hyfdca")
    common = dict(seed=3, eval_every=3, checkpointing=Checkpointing(path, resume=True))
    with pytest.raises(HyflError, match=r"different run \(algorithm.iic: checkpoint has 0.2"):
        simulate(
            make_algorithm("hyfdca", {"iic": 0.3}),
            s.problem,
            s.partition,
            s.participation,
            8,
            **common,
        )
    with pytest.raises(HyflError, match=r"seed: checkpoint has 3, this run has 4"):
        simulate(
            make_algorithm("hyfdca", {"iic": 0.2}),
            s.problem,
            s.partition,
            s.participation,
            8,
            **{**common, "seed": 4},
        )
    other = setup_for("fedh-g")  # other partition and loss of the same data
    with pytest.raises(HyflError, match=r"partition: the data differ.*problem.loss"):
        simulate(
            make_algorithm("hyfdca", {"iic": 0.2}),
            other.problem,
            other.partition,
            other.participation,
            8,
            **common,
        )
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(HyflError, match="cannot be read"):
        run("hyfdca", 8, checkpointing=Checkpointing(path, resume=True))


def test_a_checkpoint_of_an_older_state_format_is_refused(tmp_path):
    """A checkpoint written before the saved state changed shape (its format number is
    older) is refused with the way out, not resumed into the wrong state."""
    from hyfl.runtime.checkpoint import CHECKPOINT_FORMAT

    path = tmp_path / "checkpoint.npz"
    run("hyfdca", 4, checkpointing=Checkpointing(path))
    with np.load(path, allow_pickle=False) as f:
        arrays = {name: f[name] for name in f.files}
    header = json.loads(arrays["__header__"].tobytes())
    header["format"] = CHECKPOINT_FORMAT - 1
    arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(HyflError, match="not a hyfl checkpoint of this version"):
        run("hyfdca", 8, checkpointing=Checkpointing(path, resume=True))


def test_sim_time_budget_stops_after_the_round_that_crosses_it():
    # Full participation: FedAvg has one round trip per round, so sim_time after
    # round t is 10 t seconds of latency plus microseconds of compute.
    s = setup_for("fedavg")
    args = (make_algorithm("fedavg", {"iic": 0.05}), s.problem, s.partition)
    from hyfl.participation import Full

    full = Full(s.partition.n_clients)
    model = CostModel(latency=10.0)
    result = simulate(*args, full, 100, eval_every=4, cost_model=model, stop_sim_time=45.0)
    assert result.config["stopped_by"] == "sim_time" and result.config["rounds"] == 5
    assert [r["iteration"] for r in result.metrics] == [0, 4, 5]
    assert 50.0 <= result.final["sim_time"] < 51.0
    capped = simulate(*args, full, 3, cost_model=model, stop_sim_time=45.0)
    assert capped.config["stopped_by"] == "iterations" and capped.config["rounds"] == 3
    assert capped.config["budget"] == {"sim_time": 45.0, "max_iterations": 3}
    with pytest.raises(HyflError, match="sim_time budget must be > 0"):
        simulate(*args, full, 3, stop_sim_time=0.0)


def test_protocol_engine_sim_time_budget():
    s = setup_for("hyfdca")
    result = run_protocol(
        make_algorithm("hyfdca", {"iic": 0.2}),
        s.problem,
        s.partition,
        s.participation,
        50,
        make_cipher("none"),
        eval_every=10,
        cost_model=CostModel(latency=1.0, he=HECosts(0.0, 0.0, 0.0)),
        stop_sim_time=10.0,
        monitor_duals=False,
    )
    assert result.config["stopped_by"] == "sim_time"
    rounds = result.config["rounds"]
    assert 1 < rounds < 50 and result.final["iteration"] == rounds
    assert result.final["sim_time"] >= 10.0
    assert result.final["sim_time"] - result.final["time_latency"] < 1.0


class _RunsCode:
    """A pickle payload that would create a marker file when unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _crafted_checkpoints(tmp_path, path):
    """Files an attacker could leave in a results folder under the checkpoint's name."""
    import pickle

    marker = tmp_path / "pwned"
    yield "a pickle", pickle.dumps({"format": 2, "x": _RunsCode(marker)}), marker
    valid = np.load(path, allow_pickle=False)
    arrays = {name: valid[name] for name in valid.files}
    for label, body in [
        ("os.system", {"o": "os:system", "f": {}}),
        ("builtins.eval", {"o": "builtins:eval", "f": {}}),
        ("subprocess.Popen", {"o": "subprocess:Popen", "f": {}}),
        ("a hyfl function", {"o": "hyfl.cli:main", "f": {}}),
    ]:
        forged = dict(arrays, __body__=np.frombuffer(json.dumps(
            {"d": [[{"v": "state"}, body]]}).encode(), dtype=np.uint8))
        buffer = io.BytesIO()
        np.savez(buffer, **forged)
        yield label, buffer.getvalue(), marker
    buffer = io.BytesIO()
    np.savez(buffer, __header__=arrays["__header__"],
             x=np.array([_RunsCode(marker)], dtype=object))
    yield "an object array", buffer.getvalue(), marker


def test_a_crafted_checkpoint_runs_no_code(tmp_path):
    """Resuming reads the checkpoint without pickle: crafted files are refused, and nothing
    they name is imported, called or unpickled."""
    case = "hyfdca"
    path = tmp_path / "checkpoint.npz"
    run(case, 4, checkpointing=Checkpointing(path, every=2))
    for label, content, marker in list(_crafted_checkpoints(tmp_path, path)):
        crafted = tmp_path / label.replace(" ", "-") / "checkpoint.npz"
        crafted.parent.mkdir()
        crafted.write_bytes(content)
        with pytest.raises(HyflError, match="checkpoint"):
            run(case, 6, checkpointing=Checkpointing(crafted, resume=True, every=2))
        assert not marker.exists(), label


def test_the_checkpoint_code_uses_no_pickle():
    source = "".join(Path(m.__file__).read_text() for m in (checkpoint, simulation))
    assert "import pickle" not in source and "pickle.load" not in source


def test_resume_after_the_cocoa_rings_store_widened(tmp_path):
    # The cocoa rule stores inner products only for the slots clients list, and the store
    # widens when fewer clients take part (SpanHistory.GROWS_ALONG): a checkpoint written
    # after it widened is wider than a fresh set-up's and must still restore. (history=3:
    # at participation 0.3 about 10 slots are live by round 12; the store starts at 3.)
    s = prepare(RunSpec(algorithm="hyfdca", data="breast_cancer", loss="hinge",
                        partition="grid:3x3", participation="0.3", val_fraction=0.2))

    def run_for(iterations, **options):
        return simulate(make_algorithm("hyfdca", {"iic": 0.2, "history": 3}), s.problem,
                        s.partition, s.participation, iterations, seed=3, eval_every=3,
                        optimum=s.optimum, **options)

    full = run_for(20)
    path = tmp_path / "checkpoint.npz"
    run_for(12, checkpointing=Checkpointing(path))
    resumed = run_for(20, checkpointing=Checkpointing(path, resume=True))
    assert np.array_equal(full.weights, resumed.weights)
