"""Conventions of the ``hyfl`` command: ``--version``, flags over configs, CSV types."""

from typer.testing import CliRunner

import hyfl
from hyfl.cli import app

runner = CliRunner()


def test_version_prints_the_package_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"hyfl {hyfl.__version__}"


def _config(tmp_path):
    import tomli_w

    tables = {
        "experiment": {"name": "bc", "seeds": [0], "eval_every": 2, "budget": {"iterations": 8}},
        "data": {"dataset": "breast_cancer", "loss": "hinge", "val_fraction": 0.2},
        "partition": {"spec": "grid:2x2", "participation": "0.5"},
        "algorithms": {"hyfdca": {"iic": 0.2}, "fedavg": {"iic": 0.05, "a": 0.1, "b": 1.0}},
    }
    path = tmp_path / "exp.toml"
    path.write_text(tomli_w.dumps(tables))
    return path


def test_flags_override_the_config_and_the_run_records_which_won(tmp_path):
    import json

    from hyfl.experiments.config import load_config

    out = tmp_path / "results"
    args = ["run", str(_config(tmp_path)), "--out", str(out), "--no-progress",
            "--iterations", "4", "--algorithm", "hyfdca", "--iic", "0.3", "--seed", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "--iterations overrides the config" in result.output
    assert "ignored" not in result.output
    assert not (out / "fedavg").exists()  # --algorithm names the algorithm to run
    record = json.loads((out / "hyfdca" / "seed-2" / "run.json").read_text())
    assert record["budget"] == {"iterations": 4} and record["rounds"] == 4
    assert record["overrides"]["experiment.budget"] == {
        "value": {"iterations": 4}, "from": "--iterations", "config": {"iterations": 8}
    }
    assert record["overrides"]["experiment.seeds"]["config"] == [0]
    assert record["overrides"]["algorithms"]["value"] == {"hyfdca": {"iic": 0.3}}
    echo = (out / "config.toml").read_text()
    assert "# experiment.budget = {'iterations': 4} from --iterations" in echo
    config = load_config(out / "config.toml")
    assert config.budget.to_dict() == {"iterations": 4} and config.seeds == (2,)
    assert [entry.hyper for entry in config.algorithms] == [{"iic": 0.3}]


def test_hyperparameter_flags_without_algorithm_update_the_configs_entry(tmp_path):
    from hyfl.experiments.config import load_config

    out = tmp_path / "results"
    args = ["run", str(_config(tmp_path)), "--out", str(out), "-q", "--iterations", "2",
            "--iic", "0.3"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    config = load_config(out / "config.toml")
    assert {e.label: e.hyper for e in config.algorithms} == {
        "hyfdca": {"iic": 0.3}, "fedavg": {"iic": 0.05, "a": 0.1, "b": 1.0}
    }
