"""``hyfl report`` marks the runs no better than trivial in its tables and says why."""

import json

from typer.testing import CliRunner

from hyfl.cli import TRIVIAL_EXIT_CODE, app
from hyfl.experiments.report import TRIVIAL_MARK

runner = CliRunner()


def _results(tmp_path, algorithms, seeds):
    import tomli_w

    config = tmp_path / "exp.toml"
    config.write_text(tomli_w.dumps({
        "experiment": {"name": "bc", "seeds": list(seeds), "budget": {"iterations": 5}},
        "data": {"dataset": "breast_cancer"},
        "partition": {"spec": "grid:2x2", "participation": "0.5"},
        "algorithms": algorithms,
    }))
    out = tmp_path / "results"
    return runner.invoke(app, ["run", str(config), "--out", str(out), "-q"]), out


def _report(out):
    result = runner.invoke(app, ["report", str(out), "--format", "markdown"])
    assert result.exit_code == 0, result.output
    return (out / "report.md").read_text()


def _setting_row(text, algorithm):
    """The algorithm's row of the setting's table (the one with its outer iterations, 5)."""
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith(f"| {algorithm}")]
    return next(" | ".join(cells) for cells in rows if len(cells) > 2 and cells[1] == "5")


def test_report_marks_a_trivial_run_in_the_table_with_each_seeds_reason(tmp_path):
    run, out = _results(tmp_path, {"hyfdca": {}, "fedavg": {"a": 1000.0}}, seeds=(0, 1))
    assert run.exit_code == TRIVIAL_EXIT_CODE, run.output
    text = _report(out)
    assert _setting_row(text, "FedAvg").startswith(f"| FedAvg {TRIVIAL_MARK} |")
    assert TRIVIAL_MARK not in _setting_row(text, "HyFDCA")
    assert "no better than trivial" in text
    assert "seed 0: primal" in text and "seed 1: primal" in text and "zero model's 1" in text
    assert text.count("Warning: FedAvg (") == 1  # the summary says it once


def test_report_without_trivial_runs_marks_nothing(tmp_path):
    run, out = _results(tmp_path, {"hyfdca": {}}, seeds=(0,))
    assert run.exit_code == 0, run.output
    text = _report(out)
    assert TRIVIAL_MARK not in text and "no better than trivial" not in text


def test_report_judges_folders_written_before_the_verdict_was_recorded(tmp_path):
    run, out = _results(tmp_path, {"fedavg": {"a": 1000.0}}, seeds=(0,))
    assert run.exit_code == TRIVIAL_EXIT_CODE, run.output
    path = out / "fedavg" / "seed-0" / "run.json"
    record = json.loads(path.read_text())
    del record["summary"]["no_better_than_trivial"]  # as an older hyfl wrote it
    path.write_text(json.dumps(record))
    assert _setting_row(_report(out), "FedAvg").startswith(f"| FedAvg {TRIVIAL_MARK} |")
