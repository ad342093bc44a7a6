"""Conventions of the ``hyfl`` command: ``--version``, flags over configs, CSV types."""

from typer.testing import CliRunner

import hyfl
from hyfl.cli import TRIVIAL_EXIT_CODE, app

runner = CliRunner()

# A tiny run may end no better than trivial: it still finishes and writes everything, with
# exit code TRIVIAL_EXIT_CODE (tests/test_trivial_cli.py tests that); these tests are about
# other things.
FINISHED = (0, TRIVIAL_EXIT_CODE)


def test_version_prints_the_package_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"hyfl {hyfl.__version__}"


def _config(tmp_path, algorithms=None):
    import tomli_w

    tables = {
        "experiment": {"name": "bc", "seeds": [0], "eval_every": 2, "budget": {"iterations": 8}},
        "data": {"dataset": "breast_cancer", "loss": "hinge", "val_fraction": 0.2},
        "partition": {"spec": "grid:2x2", "participation": "0.5"},
        "algorithms": {"hyfdca": {"iic": 0.2}, "fedavg": {"iic": 0.05, "a": 0.1, "b": 1.0}},
    }
    if algorithms is not None:
        tables["algorithms"] = algorithms
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
    assert "task: binary classification, classes 0, 1; labels 0 -> -1, 1 -> +1" in result.output
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


def test_metrics_csv_writes_counts_as_integers_and_keeps_floats(tmp_path):
    import csv

    import pandas as pd

    out = tmp_path / "run"
    args = ["run", "--data", "synthetic", "--iterations", "4", "--eval-every", "2",
            "--out", str(out), "-q"]
    result = runner.invoke(app, args)
    assert result.exit_code in FINISHED, result.output
    with open(out / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["iteration"] for row in rows] == ["0", "2", "4"]
    assert all("." not in row[k] for row in rows for k in ("bytes_up", "encryptions"))
    assert "." in rows[-1]["primal"] or "e" in rows[-1]["primal"]  # floats stay floats
    table = pd.read_parquet(out / "metrics.parquet")
    assert table["iteration"].dtype == "int64" and table["primal"].dtype == "float64"
    pd.testing.assert_frame_equal(table, pd.read_csv(out / "metrics.csv"))


def test_datasets_says_what_was_found_and_where_it_looked(tmp_path, monkeypatch):
    here, elsewhere = tmp_path / "here", tmp_path / "env"
    here.mkdir()
    (here / "news20.binary.bz2").write_bytes(b"")  # only found, never read
    monkeypatch.setenv("HYFL_DATA", str(elsewhere))
    result = runner.invoke(app, ["datasets", "--data-dir", str(here)])
    assert result.exit_code == 0, result.output
    compact = "".join(result.output.replace("│", " ").split())  # cells may wrap
    assert f"news20binary1e-05foundin{here}" in compact
    assert "breast_cancerbinary0.001bundled" in compact
    searched = result.output.split("looked for in")[1].splitlines()[1:]
    assert searched[0].strip() == str(here)
    assert searched[1].strip() == f"{elsewhere} (does not exist)"

    from hyfl.data.registry import locate_files

    assert locate_files("news20", here) == {"news20.binary.bz2": here / "news20.binary.bz2"}
    assert locate_files("breast_cancer") == {}


def test_run_announces_the_task_classes_and_label_mapping(tmp_path):
    import json

    rng = __import__("numpy").random.default_rng(0)
    lines = [f"{label} 1:{rng.random():.3f} 2:{rng.random():.3f} 3:{rng.random():.3f}"
             for label in [3, 5, 7] * 10]
    path = tmp_path / "three.libsvm"
    path.write_text("\n".join(lines) + "\n")
    args = ["run", "--data", str(path), "--partition", "horizontal:2", "--lam", "0.01",
            "--iterations", "2", "--no-progress"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "multi")])
    assert result.exit_code in FINISHED, result.output
    first = result.output.splitlines()[0]
    assert first == ("task: multiclass, one-vs-rest over 3 classes (3, 5, 7), hinge loss per "
                     "class; labels 3 -> column 0, 5 -> column 1, 7 -> column 2")
    record = json.loads((tmp_path / "multi" / "run.json").read_text())
    assert record["task"]["label_mapping"] == {"3": 0, "5": 1, "7": 2}
    result = runner.invoke(app, ["run", "--data", "synthetic", "--iterations", "2",
                                 "--no-progress", "--out", str(tmp_path / "binary")])
    assert result.exit_code in FINISHED, result.output
    assert result.output.splitlines()[0].startswith("task: binary classification, classes ")
    assert "-> -1" in result.output.splitlines()[0] and "-> +1" in result.output.splitlines()[0]


def test_help_imports_neither_scipy_nor_sklearn_and_the_names_agree():
    import subprocess
    import sys

    code = ("import sys, hyfl.cli; "
            "print(sorted(m for m in ('scipy', 'sklearn', 'pandas', 'matplotlib') "
            "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"

    from hyfl import _names, costs
    from hyfl.algorithms import hyfdca
    from hyfl.privacy.ciphers import CIPHERS

    assert tuple(CIPHERS) == _names.CIPHER_NAMES
    assert hyfdca.STEP_RULES is _names.STEP_RULES and costs.HE_LAYOUTS is _names.HE_LAYOUTS
    assert hyfl.HyFDCA is hyfdca.HyFDCA and "simulate" in dir(hyfl)


def test_summary_csv_writes_counts_as_integers(tmp_path):
    import csv

    out = tmp_path / "results"
    result = runner.invoke(app, ["run", str(_config(tmp_path)), "--out", str(out), "-q",
                                 "--iterations", "2"])
    assert result.exit_code == 0, result.output
    with open(out / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for column in ("bytes_up", "bytes_down", "encryptions"):
            assert row[column].isdigit(), (column, row[column])
        assert "." in row["final_relative_loss"] or "e" in row["final_relative_loss"]


def test_compare_announces_the_task_and_writes_integer_counts(tmp_path):
    import csv

    out = tmp_path / "cmp"
    result = runner.invoke(app, [
        "compare", "--algorithms", "hyfdca,fedavg", "--data", "synthetic", "--iterations", "4",
        "--eval-every", "2", "--out", str(out), "--no-progress",
    ])
    assert result.exit_code in FINISHED, result.output
    assert result.output.startswith("task: binary classification")
    with open(out / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(row["bytes_up"].isdigit() and row["encryptions"].isdigit() for row in rows)


def test_hyperparameter_flags_for_an_algorithm_the_config_does_not_run_are_refused(tmp_path):
    path = _config(tmp_path, algorithms={"fedavg": {"iic": 0.05, "a": 0.1, "b": 1.0}})
    result = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "r"), "-q",
                                 "--iic", "0.3"])
    assert result.exit_code == 2
    assert "would set hyperparameters of hyfdca" in result.output
    assert "--algorithm" in result.output and not (tmp_path / "r").exists()


def test_registry_options_are_click_choices_listed_in_help_and_checked():
    from hyfl import _names
    from hyfl.algorithms import ALGORITHMS
    from hyfl.losses import LOSSES

    assert tuple(LOSSES) == _names.LOSS_NAMES and tuple(ALGORITHMS) == _names.ALGORITHM_NAMES
    from hyfl.deploy.keys import KEY_SCHEMES

    assert tuple(KEY_SCHEMES) == _names.KEY_SCHEME_NAMES
    wide = {"COLUMNS": "200"}
    # (the loss, cipher and step rule show a short metavar and list their names in the
    # help text: hyfl.cli's Loss; the other choices keep Click's "[a|b]")
    for command in (["run"], ["compare"], ["deploy", "local"]):
        help_text = " ".join(runner.invoke(app, [*command, "--help"], env=wide).output.split())
        assert "LOSS" in help_text and "hinge, logistic, squared, smoothed_hinge" in help_text
        assert "CIPHER" in help_text, command
    help_text = " ".join(runner.invoke(app, ["run", "--help"], env=wide).output.split())
    assert "none, paillier, packed, ckks" in help_text
    assert "cocoa, safe, theory, paper" in help_text and "fedbcd-p" in help_text
    assert "[none|paillier|packed|ckks|all]" in runner.invoke(
        app, ["calibrate", "--help"], env=wide).output
    assert "[html|markdown]" in runner.invoke(app, ["report", "--help"], env=wide).output
    assert "[paillier|packed|ckks]" in runner.invoke(
        app, ["deploy", "keys", "--help"], env=wide).output
    for flag, value in [("--loss", "hinj"), ("--step-rule", "fast"), ("--cipher", "rsa")]:
        result = runner.invoke(app, ["run", flag, value], env=wide)
        assert result.exit_code == 2 and f"Invalid value for '{flag}'" in result.output
        assert f"'{value}' is not one of" in result.output  # Click's error, before any work


def test_command_help_paragraphs_are_wrapped_once_by_rich():
    # The docstrings' source line breaks are joined: Rich alone wraps the paragraphs.
    wide = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert ("writes DIR/metrics.csv, metrics.parquet, run.json, model.npz and loss.png, "
            "and prints") in wide
    narrow = runner.invoke(app, ["deploy", "local", "--help"], env={"COLUMNS": "80"}).output
    lines = [line.strip() for line in narrow.splitlines()]
    assert "this" not in lines and "and" not in lines  # no one-word leftovers of a source line


def test_the_shell_completes_choices():
    """``hyfl --install-completion`` exists, and bash completion of ``--loss`` offers the
    losses (Click's completion protocol, as the installed script calls it)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from hyfl._names import LOSS_NAMES

    result = CliRunner().invoke(app, ["--help"])
    assert "--install-completion" in result.output
    hyfl = Path(sys.executable).with_name("hyfl")
    env = {**os.environ, "_HYFL_COMPLETE": "complete_bash", "COMP_WORDS": "hyfl run --loss ",
           "COMP_CWORD": "3"}
    done = subprocess.run([str(hyfl)], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == list(LOSS_NAMES)
