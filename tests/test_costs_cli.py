"""Privacy and cost accounting through the ``hyfl`` command.

* ``--cipher packed`` runs HyFDCA with real encryption (the protocol engine)
  and reaches the same iterates as the plaintext simulation.
* ``--latency`` adds exactly round trips x latency to the simulated time.
* ``hyfl calibrate`` writes the file ``--he-costs measured`` reads; missing or
  bad cost files give clear errors.
* ``hyfl compare`` writes the cost breakdown and the cost summary columns.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from hyfl.cli import TRIVIAL_EXIT_CODE, app
from hyfl.costs import COST_COLUMNS, TIME_COMPONENTS
from hyfl.experiments.plots import plot_cost_breakdown, plot_runs
from hyfl.runtime.simulation import METRIC_COLUMNS, RunResult

runner = CliRunner()

# A tiny run may end no better than trivial: it still finishes and writes everything, with
# exit code TRIVIAL_EXIT_CODE (tests/test_trivial_cli.py tests that); these tests are about
# other things.
FINISHED = (0, TRIVIAL_EXIT_CODE)
KEY_BITS = ["--key-bits", "512"]  # small keys keep the tests fast
COST_METRICS = {*COST_COLUMNS, *TIME_COMPONENTS}
# breast_cancer ships with scikit-learn: 569 x 30, small enough to encrypt quickly
TINY = [
    "--data", "breast_cancer", "--val-fraction", "0.2", "--loss", "hinge",
    "--partition", "grid:2x2", "--participation", "0.5", "--local-steps", "4",
    "--iterations", "6", "--eval-every", "3", "--seed", "1", "--no-progress",
]


def _run(out, *flags):
    result = runner.invoke(app, ["run", *TINY, "--out", str(out), *flags])
    return result


def _rows(path):
    return list(csv.DictReader(open(path)))


def _column(rows, name):
    return np.array([float(r[name]) for r in rows])


def _flat(text: str) -> str:
    """Rich wraps long lines; compare messages with whitespace collapsed."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def packed_and_plain(tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    outs = {}
    for cipher in ("packed", "none"):
        outs[cipher] = root / cipher
        result = _run(outs[cipher], "--cipher", cipher, *KEY_BITS)
        assert result.exit_code == 0, result.output
        outs[f"{cipher}_output"] = result.output
    return outs


def test_packed_cipher_runs_the_encrypted_protocol(packed_and_plain):
    out = packed_and_plain["packed"]
    rows = _rows(out / "metrics.csv")
    assert COST_METRICS <= set(rows[0])
    header = list(rows[0])
    assert header[: len(METRIC_COLUMNS)] == list(METRIC_COLUMNS)  # stable order, both engines
    assert header[len(METRIC_COLUMNS):] == sorted(header[len(METRIC_COLUMNS):])
    final = rows[-1]
    assert float(final["encryptions"]) > 0 and float(final["decryptions"]) > 0
    assert float(final["bytes_up"]) > 0 and float(final["bytes_down"]) > 0
    assert float(final["sim_time"]) > 0
    for name in COST_METRICS:  # cumulative columns never decrease
        assert np.all(np.diff(_column(rows, name)) >= 0), name
    record = json.loads((out / "run.json").read_text())
    assert record["engine"] == "protocol"
    assert record["summary"]["engine"] == "protocol"
    assert record["cipher"]["name"] == "packed" and record["cipher"]["key_bits"] == 512
    assert record["spec"]["cipher"] == "packed" and record["spec"]["key_bits"] == 512
    assert record["costs"]["latency"] == 0.0
    # --he-costs auto: the packed cipher priced with its own costs at its key size
    assert record["costs"]["he_costs"]["source"].startswith("packed (512-bit key): its own")
    assert record["costs"]["he_costs"]["encrypt"] > 0
    assert record["setup"]["encryptions"] > 0  # encrypted zero duals before round 1
    output = _flat(packed_and_plain["packed_output"])
    assert "protocol engine" in output and "sim_time" in output and "encryptions" in output


def test_plain_cipher_simulates_the_same_iterates(packed_and_plain):
    packed = _rows(packed_and_plain["packed"] / "metrics.csv")
    plain = _rows(packed_and_plain["none"] / "metrics.csv")
    assert list(plain[0])[: len(METRIC_COLUMNS)] == list(METRIC_COLUMNS)
    np.testing.assert_allclose(_column(packed, "primal"), _column(plain, "primal"), rtol=1e-6)
    np.testing.assert_array_equal(_column(packed, "round_trips"), _column(plain, "round_trips"))
    # counted, not performed; one value per ciphertext instead of several
    assert float(plain[-1]["encryptions"]) > float(packed[-1]["encryptions"]) > 0
    record = json.loads((packed_and_plain["none"] / "run.json").read_text())
    assert record["engine"] == "simulation"
    assert record["cipher"]["name"] == "none"
    assert "setup" not in record


def test_latency_adds_round_trips_times_latency(tmp_path):
    runs = {}
    for latency in ("0", "0.5"):
        result = _run(tmp_path / latency, "--latency", latency)
        assert result.exit_code == 0, result.output
        runs[latency] = _rows(tmp_path / latency / "metrics.csv")
    trips = _column(runs["0"], "round_trips")
    assert trips[-1] > 0
    np.testing.assert_array_equal(_column(runs["0.5"], "round_trips"), trips)
    np.testing.assert_array_equal(_column(runs["0"], "time_latency"), 0.0)
    np.testing.assert_array_equal(_column(runs["0.5"], "time_latency"), 0.5 * trips)
    # the HE charge depends on the counts only, which the latency does not change
    np.testing.assert_array_equal(
        _column(runs["0.5"], "time_encryption"), _column(runs["0"], "time_encryption")
    )
    for rows in runs.values():  # sim_time is the sum of its components
        parts = sum(_column(rows, name) for name in TIME_COMPONENTS)
        np.testing.assert_allclose(_column(rows, "sim_time"), parts, rtol=1e-12)


def test_calibrate_then_measured_costs(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HYFL_CACHE", str(cache))
    result = _run(tmp_path / "before", "--he-costs", "measured")
    assert result.exit_code == 2, result.output
    assert "hyfl calibrate --cipher none" in _flat(result.output)

    result = runner.invoke(app, ["calibrate", "--cipher", "none", "--n", "20"])
    assert result.exit_code == 0, result.output
    assert "per ciphertext" in result.output and "encrypt" in result.output
    stored = json.loads((cache / "he-costs.json").read_text())
    assert {"encrypt", "decrypt", "add", "encrypt_per_value"} <= set(stored["none"])

    result = _run(tmp_path / "after", "--he-costs", "measured")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "after" / "run.json").read_text())
    assert record["costs"]["he_costs"]["source"] == str(cache / "he-costs.json")
    assert record["costs"]["he_costs"]["encrypt"] == stored["none"]["encrypt"]

    # measured costs exist for none only
    result = _run(tmp_path / "packed", "--he-costs", "measured", "--cipher", "packed")
    assert result.exit_code == 2 and "hyfl calibrate --cipher packed" in _flat(result.output)


def test_calibrate_output_file_and_all_ciphers(tmp_path):
    path = tmp_path / "costs.json"
    result = runner.invoke(
        app, ["calibrate", "--cipher", "all", *KEY_BITS, "--n", "4", "--output", str(path)]
    )
    assert result.exit_code == 0, result.output
    stored = json.loads(path.read_text())
    # by name (what --he-costs measured reads) and by name@key_bits (what auto reads)
    assert {"none", "paillier", "packed", "paillier@512", "packed@512"} <= set(stored)
    assert stored["packed"]["slots"] > 1 and stored["packed"]["key_bits"] == 512
    # a file written by calibrate is a valid --he-costs FILE
    result = _run(tmp_path / "run", "--he-costs", str(path), "--iterations", "2")
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["calibrate", "--cipher", "rsa"])
    assert result.exit_code == 2 and "cipher" in result.output


@pytest.mark.parametrize(
    "content, message",
    [
        ("this is not json", "cannot read"),
        ('{"none": {"encrypt": 1e-3}}', "no encrypt/decrypt/add"),
        ('{"encrypt": -1, "decrypt": 0, "add": 0}', "Use seconds >= 0"),
    ],
)
def test_bad_he_cost_files_give_clear_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    result = _run(tmp_path / "x", "--he-costs", str(path))
    assert result.exit_code == 2, result.output
    assert "--he-costs" in result.output and message in _flat(result.output)


def test_bad_privacy_flags_give_clear_errors(tmp_path):
    cases = [
        (["--cipher", "rsa"], "cipher"),
        (["--cipher", "packed", "--key-bits", "511"], "key_bits"),
        (["--latency", "-1"], "--latency"),
        (["--he-costs", str(tmp_path / "missing.json")], "does not exist"),
    ]
    for flags, culprit in cases:
        result = _run(tmp_path / "x", *flags)
        assert result.exit_code == 2, (flags, result.output)
        assert culprit in _flat(result.output), (flags, result.output)


def test_compare_writes_cost_breakdown_and_summary(tmp_path):
    out = tmp_path / "cmp"
    flags = [f for f in TINY if f not in ("--local-steps", "4")]
    result = runner.invoke(app, [
        "compare", "--algorithms", "hyfdca,fedavg", *flags, "--param", "hyfdca.local_steps=4",
        "--cipher", "packed", *KEY_BITS, "--latency", "0.1", "--out", str(out),
    ])
    assert result.exit_code in FINISHED, result.output
    assert (out / "costs.png").stat().st_size > 1000
    assert (out / "compare.png").stat().st_size > 1000
    rows = {r["algorithm"]: r for r in _rows(out / "summary.csv")}
    columns = {"engine", "sim_time", "bytes_up", "bytes_down", "encryptions", "decryptions"}
    columns |= {f"{name}_per_iter" for name in TIME_COMPONENTS}
    assert columns <= set(rows["hyfdca"])
    assert rows["hyfdca"]["engine"] == "protocol" and rows["fedavg"]["engine"] == "simulation"
    assert float(rows["hyfdca"]["encryptions"]) > 0
    assert float(rows["fedavg"]["encryptions"]) == 0  # baselines do no encryption
    assert float(rows["fedavg"]["time_encryption_per_iter"]) == 0
    for row in rows.values():
        latency_per_iter = 0.1 * float(row["round_trips"]) / 6
        assert float(row["time_latency_per_iter"]) == pytest.approx(latency_per_iter)
    assert "sim_time" in (out / "summary.md").read_text()
    assert json.loads((out / "fedavg" / "run.json").read_text())["engine"] == "simulation"


def _fake_run(seconds_per_iteration: dict[str, float], iterations: int = 4) -> RunResult:
    rows = []
    for t in range(iterations + 1):
        row = {"iteration": float(t), "primal": 1.0, "relative_loss": 1.0 / (t + 1)}
        row.update({name: t * s for name, s in seconds_per_iteration.items()})
        row["sim_time"] = sum(row[name] for name in seconds_per_iteration)
        rows.append(row)
    return RunResult(rows, np.zeros((1, 1)), None, np.zeros(iterations))


def test_cost_plots_linear_log_and_zero_times(tmp_path):
    slow = _fake_run({"time_client": 1e-3, "time_server": 1e-4, "time_latency": 0.2,
                      "time_encryption": 30.0})
    fast = _fake_run({"time_client": 1e-3, "time_server": 1e-4, "time_latency": 0.2,
                      "time_encryption": 0.0})
    idle = _fake_run(dict.fromkeys(TIME_COMPONENTS, 0.0))
    for log in (None, False, True):
        path = plot_cost_breakdown({"slow": slow, "fast": fast, "idle": idle},
                                   tmp_path / f"costs-{log}.png", log=log)
        assert path.stat().st_size > 1000
    assert plot_runs({"slow": slow, "fast": fast}, tmp_path / "runs.png").stat().st_size > 1000
    assert plot_runs({"idle": idle}, tmp_path / "idle.png").stat().st_size > 1000
