"""The ``hyfl`` command: outputs, columns and errors."""

import csv
import json

import pytest
from typer.testing import CliRunner

from hyfl.cli import app

runner = CliRunner()
REQUIRED = {"iteration", "primal", "dual", "gap", "relative_loss", "val_accuracy", "round_trips"}
COSTS = {
    "bytes_up", "bytes_down", "encryptions", "decryptions", "additions", "sim_time",
    "time_client", "time_server", "time_latency", "time_encryption",
}


def test_run_writes_metrics_and_run_record(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "run",
            "--algorithm",
            "hyfdca",
            "--data",
            "synthetic",
            "--loss",
            "hinge",
            "--lam",
            "1e-3",
            "--partition",
            "grid:3x3",
            "--participation",
            "0.5",
            "--iic",
            "0.2",
            "--iterations",
            "60",
            "--eval-every",
            "10",
            "--seed",
            "0",
            "--val-fraction",
            "0.2",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert REQUIRED | COSTS <= set(rows[0])
    assert [int(float(r["iteration"])) for r in rows] == [0, 10, 20, 30, 40, 50, 60]
    assert float(rows[-1]["sim_time"]) > 0 and float(rows[-1]["encryptions"]) > 0
    assert float(rows[-1]["relative_loss"]) < float(rows[0]["relative_loss"])
    record = json.loads((out / "run.json").read_text())
    assert record["spec"]["partition"] == "grid:3x3"
    assert record["summary"]["n_clients"] == 9
    assert record["summary"]["local_steps"] == 36  # ceil(0.2 * 1600 / 9)
    assert record["engine"] == "simulation" and record["cipher"]["name"] == "none"
    assert record["spec"]["he_costs"] == "auto" and record["costs"]["latency"] == 0.0
    # cipher none: no HE time unless a cost model is asked for by name
    assert record["costs"]["he_costs"]["source"].startswith("none:")
    assert float(rows[-1]["time_encryption"]) == 0
    assert "sim_time" in result.output  # the cost table
    assert (out / "loss.png").stat().st_size > 1000


def test_local_steps_and_other_partitions(tmp_path):
    """--local-steps 5 updates 5 samples per active client each round, on a horizontal
    and a vertical split with the participation asked for (all 4 clients; one of 3)."""
    for partition, participation, clients, active in [("horizontal:4", "full", 4, 4),
                                                      ("vertical:3", "cyclic:3", 3, 1)]:
        out = tmp_path / partition.replace(":", "")
        result = runner.invoke(
            app,
            [
                "run",
                "--data",
                "synthetic",
                "--loss",
                "logistic",
                "--partition",
                partition,
                "--participation",
                participation,
                "--local-steps",
                "5",
                "--iterations",
                "20",
                "--out",
                str(out),
                "--no-progress",
            ],
        )
        assert result.exit_code == 0, result.output
        record = json.loads((out / "run.json").read_text())
        assert (record["spec"]["partition"], record["spec"]["participation"]) == (
            partition, participation)
        assert record["summary"]["n_clients"] == clients
        assert record["algorithm"]["local_steps"] == record["summary"]["local_steps"] == 5
        rows = list(csv.DictReader(open(out / "metrics.csv")))
        assert [int(float(r["iteration"])) for r in rows] == list(range(21))
        assert {float(r["active_clients"]) for r in rows[1:]} == {active}
        assert {float(r["updated_samples"]) for r in rows[1:]} == {5.0 * active}
        assert float(rows[-1]["relative_loss"]) < float(rows[0]["relative_loss"])
        assert f"wrote{out / 'metrics.csv'}," in "".join(result.output.split())


def test_demo_runs_without_arguments(tmp_path):
    result = runner.invoke(app, ["demo", "--out", str(tmp_path / "demo"), "--iterations", "100"])
    assert result.exit_code == 0, result.output
    assert "centralized" in result.output
    assert (tmp_path / "demo" / "loss.png").exists()


def test_bad_flags_give_clear_errors(tmp_path):
    cases = [
        (["--partition", "grid:3"], "partition"),
        (["--participation", "1.5"], "participation"),
        (["--loss", "huber"], "loss"),
        (["--lam", "-1"], "lam"),
        (["--iic", "0.1", "--local-steps", "3"], "--local-steps"),
        (["--data", "no-such-set"], "no-such-set"),
        (["--step-rule", "fast"], "--step-rule"),  # Click's choice error
    ]
    for flags, culprit in cases:
        result = runner.invoke(
            app, ["run", "--iterations", "5", "--no-progress", "--out", str(tmp_path / "x"), *flags]
        )
        assert result.exit_code == 2, (flags, result.output)
        assert culprit in result.output, (flags, result.output)


def test_errors_show_the_users_text_as_typed_and_tracebacks_no_locals(tmp_path):
    """An error quoting the user's text prints it as typed (Rich would turn ':x:' into an
    emoji), and an unexpected error's traceback never lists local variables (key records,
    party data) in either command-line app."""
    from hyfl.deploy.cli import app as deploy_app

    result = runner.invoke(app, ["run", "--iterations", "1", "--no-progress",
                                 "--out", str(tmp_path / "x"), "--data", ":x: [b]no[/b]"])
    assert result.exit_code == 2
    assert ":x: [b]no[/b]" in " ".join(result.output.split())
    assert app.pretty_exceptions_show_locals is False
    assert deploy_app.pretty_exceptions_show_locals is False


def test_compare_runs_algorithms_on_one_trace(tmp_path):
    out = tmp_path / "cmp"
    result = runner.invoke(app, [
        "compare", "--algorithms", "hyfdca,fedavg,hyfem", "--data", "synthetic",
        "--loss", "logistic", "--partition", "grid:2x2", "--participation", "0.5",
        "--iterations", "40", "--eval-every", "10", "--param", "fedavg.a=0.05",
        "--out", str(out), "--no-progress",
    ])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert [r["algorithm"] for r in rows] == ["hyfdca", "fedavg", "hyfem"]
    assert {"final_relative_loss", "best_val_accuracy", "rounds_to_1e-3"} <= set(rows[0])
    assert {"sim_time", "bytes_up", "time_encryption_per_iter"} <= set(rows[0])
    assert (out / "compare.png").stat().st_size > 1000
    assert (out / "costs.png").stat().st_size > 1000
    record = json.loads((out / "fedavg" / "run.json").read_text())
    assert record["algorithm"]["a"] == 0.05
    # the same participation trace: identical active-client counts per round
    counts = [
        [r["active_clients"] for r in csv.DictReader(open(out / name / "metrics.csv"))][1:]
        for name in ("hyfdca", "fedavg")
    ]
    assert counts[0] == counts[1]


@pytest.mark.parametrize("last", ["fedbcd-p", "fedh-n", "disco"])
def test_compare_refuses_an_inapplicable_algorithm_before_running_any(tmp_path, last):
    # fedbcd needs a vertical split, the second-order methods a horizontal one and a
    # smooth loss: the error comes before hyfdca runs, and nothing is written.
    out = tmp_path / "cmp"
    result = runner.invoke(app, [
        "compare", "--algorithms", f"hyfdca,{last}", "--data", "synthetic",
        "--partition", "grid:2x2", "--iterations", "3", "--out", str(out), "--no-progress",
    ])
    assert result.exit_code == 2, result.output
    assert last.split("-")[0].lower() in result.output.lower()
    assert not (out / "hyfdca").exists()


def test_algorithms_refuse_where_they_do_not_apply(tmp_path):
    result = runner.invoke(app, ["run", "--algorithm", "fedbcd-p", "--data", "synthetic",
                                 "--partition", "grid:2x2", "--iterations", "3",
                                 "--out", str(tmp_path / "x"), "--no-progress"])
    assert result.exit_code == 2
    assert "FedBCD needs a vertical partition" in " ".join(result.output.split())
    result = runner.invoke(app, ["run", "--algorithm", "hyfdca", "--mu", "1.0",
                                 "--iterations", "3", "--out", str(tmp_path / "y"),
                                 "--no-progress"])
    assert result.exit_code == 2
    assert "'mu' does not apply to hyfdca" in " ".join(result.output.split())
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()  # refused first
