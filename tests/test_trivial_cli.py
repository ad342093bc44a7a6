"""``hyfl run``, ``compare``, ``demo`` and config runs warn about, record and exit with
TRIVIAL_EXIT_CODE for a model no better than trivial, after writing every output.

The cheap, deterministic trigger: FedAvg with a huge learning rate (``a = 1000``) for five
rounds on breast_cancer ends with a primal far above the zero model's (about 15 against 1).
"""

import csv
import dataclasses
import json

from typer.testing import CliRunner

from hyfl.cli import TRIVIAL_EXIT_CODE, app

runner = CliRunner()
QUICK = ["--data", "breast_cancer", "--partition", "grid:2x2", "--iterations", "5",
         "--no-progress"]


def _record(folder):
    return json.loads((folder / "run.json").read_text())["summary"]["no_better_than_trivial"]


def test_run_warns_records_and_exits_with_the_trivial_code(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--algorithm", "fedavg", "--a", "1000", *QUICK,
                                 "--out", str(out)])
    assert result.exit_code == TRIVIAL_EXIT_CODE, result.output
    assert "warning:" in result.output and "no better than trivial" in result.output
    assert "zero model's 1" in result.output
    assert "another learning rate (--a, --b)" in result.output
    record = _record(out)
    assert record["checks"][0]["metric"] == "primal" and record["checks"][0]["value"] > 1
    for name in ("metrics.csv", "metrics.parquet", "model.npz", "loss.png"):
        assert (out / name).exists()  # written before the exit
    quiet = runner.invoke(app, ["run", "--algorithm", "fedavg", "--a", "1000", *QUICK, "-q",
                                "--out", str(tmp_path / "quiet")])
    assert quiet.exit_code == TRIVIAL_EXIT_CODE and "no better than trivial" in quiet.output


def test_run_of_a_model_that_learned_exits_0_and_records_null(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", *QUICK, "--val-fraction", "0.2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "no better than trivial" not in result.output
    assert _record(out) is None


def test_compare_warns_about_the_trivial_algorithm_only(tmp_path):
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["compare", "--algorithms", "hyfdca,fedavg", *QUICK,
                                 "--param", "fedavg.a=1000", "--out", str(out)])
    assert result.exit_code == TRIVIAL_EXIT_CODE, result.output
    assert "fedavg's model is no better than trivial" in result.output
    assert "hyfdca's model" not in result.output
    assert _record(out / "fedavg") is not None and _record(out / "hyfdca") is None
    for name in ("summary.csv", "summary.md", "compare.png", "costs.png"):
        assert (out / name).exists()


def test_compare_without_trivial_runs_exits_0(tmp_path):
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["compare", "--algorithms", "hyfdca,fedavg", *QUICK,
                                 "--intercept", "off", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "no better than trivial" not in result.output
    assert _record(out / "hyfdca") is None and _record(out / "fedavg") is None
    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert [row["algorithm"] for row in rows] == ["hyfdca", "fedavg"]
    assert (out / "compare.png").exists() and (out / "summary.md").exists()


def test_demo_exits_with_the_trivial_code_when_its_model_is_trivial(tmp_path, monkeypatch):
    import hyfl.experiments.demo as demo

    ok = runner.invoke(app, ["demo", "--out", str(tmp_path / "ok"), "--iterations", "100"])
    assert ok.exit_code == 0, ok.output
    assert "no better than trivial" not in ok.output and _record(tmp_path / "ok") is None
    # the demo's own spec with the trigger (HyFDCA's early rounds depend on its step rule)
    bad = dataclasses.replace(demo.DEMO_SPEC, algorithm="fedavg", hyper={"a": 1000.0})
    monkeypatch.setattr(demo, "DEMO_SPEC", bad)
    result = runner.invoke(app, ["demo", "--out", str(tmp_path / "bad"), "--iterations", "5"])
    assert result.exit_code == TRIVIAL_EXIT_CODE, result.output
    assert "fedavg's model is no better than trivial" in result.output
    assert _record(tmp_path / "bad") is not None
    assert (tmp_path / "bad" / "loss.png").exists()


def _config(tmp_path, algorithms, seeds=(0,)):
    import tomli_w

    path = tmp_path / "exp.toml"
    path.write_text(tomli_w.dumps({
        "experiment": {"name": "bc", "seeds": list(seeds), "budget": {"iterations": 5}},
        "data": {"dataset": "breast_cancer", "val_fraction": 0.2},
        "partition": {"spec": "grid:2x2", "participation": "0.5"},
        "algorithms": algorithms,
    }))
    return path


def test_config_run_names_the_trivial_run_and_seed(tmp_path):
    config = _config(tmp_path, {"hyfdca": {}, "fedavg": {"a": 1000.0}}, seeds=(0, 1))
    out = tmp_path / "results"
    result = runner.invoke(app, ["run", str(config), "--out", str(out), "--no-progress"])
    assert result.exit_code == TRIVIAL_EXIT_CODE, result.output
    assert "fedavg (seed 0)'s model is no better than trivial" in result.output
    assert "fedavg (seed 1)'s model" in result.output and "hyfdca (seed" not in result.output
    assert _record(out / "fedavg" / "seed-1") is not None
    assert (out / "summary.csv").exists()
    # read back by --resume, the finished runs still count
    again = runner.invoke(app, ["run", str(config), "--out", str(out), "--no-progress",
                                "--resume", "-q"])
    assert again.exit_code == TRIVIAL_EXIT_CODE, again.output


def test_config_run_without_trivial_runs_exits_0(tmp_path):
    config = _config(tmp_path, {"hyfdca": {}})
    result = runner.invoke(app, ["run", str(config), "--out", str(tmp_path / "r"), "-q"])
    assert result.exit_code == 0, result.output
    assert _record(tmp_path / "r" / "hyfdca" / "seed-0") is None


def test_help_documents_the_exit_code():
    for command in ("run", "compare", "demo"):
        result = runner.invoke(app, [command, "--help"], terminal_width=200)
        assert f"{TRIVIAL_EXIT_CODE} done" in result.output
