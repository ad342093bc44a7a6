"""`hyfl tune CONFIG` and `hyfl report RESULTS` end to end on a tiny problem."""

from __future__ import annotations

import pandas as pd
from typer.testing import CliRunner

from hyfl.cli import TRIVIAL_EXIT_CODE, app
from hyfl.experiments.config import read_toml

runner = CliRunner()

# A tiny run may end no better than trivial: it still finishes and writes everything, with
# exit code TRIVIAL_EXIT_CODE (tests/test_trivial_cli.py tests that); these tests are about
# other things.
FINISHED = (0, TRIVIAL_EXIT_CODE)

CONFIG = """
[experiment]
name = "bc"
eval_every = 5
budget = { iterations = 30 }
[data]
dataset = "breast_cancer"
val_fraction = 0.2
[partition]
spec = "grid:2x2"
participation = 0.5
[algorithms.hyfdca]
[algorithms.fedavg]
a = 0.1
b = 1.0
[tune]
max_trials = 3
[tune.bounds.fedavg]
a = [0.01, 0.5]
"""


def test_tune_then_run_then_report(tmp_path):
    config = tmp_path / "exp.toml"
    config.write_text(CONFIG)
    out = tmp_path / "runs"
    done = runner.invoke(app, ["tune", str(config), "--seconds", "30", "--out", str(out / "t")])
    assert done.exit_code == 0, done.output
    for label in ("hyfdca", "fedavg"):
        trials = pd.read_csv(out / "t" / label / "trials.csv")
        assert len(trials) == 3  # [tune] max_trials
        best = read_toml(out / "t" / label / "best.toml")
        assert label in best["algorithms"]
    fedavg = pd.read_csv(out / "t" / "fedavg" / "trials.csv")
    a_column = [c for c in fedavg.columns if c in ("a", "hyper.a", "param_a")][0]
    assert fedavg[a_column].between(0.01, 0.5).all()  # the config's bounds were used

    done = runner.invoke(app, ["run", str(config), "--out", str(out / "r"), "--quiet"])
    assert done.exit_code in FINISHED, done.output
    done = runner.invoke(app, ["report", str(out / "r"), "--format", "markdown"])
    assert done.exit_code == 0, done.output
    page = (out / "r" / "report.md").read_text()
    assert "HyFDCA" in page and "wins" not in page  # a neutral headline (issue 15)
    assert page.startswith("# bc\n")  # titled by the config's [experiment] name, not "r"



def test_report_on_an_empty_folder_is_a_clear_error(tmp_path):
    done = runner.invoke(app, ["report", str(tmp_path)])
    assert done.exit_code != 0
    assert "holds no runs" in " ".join(done.output.split())


def test_tune_unknown_algorithm_label(tmp_path):
    config = tmp_path / "exp.toml"
    config.write_text(CONFIG)
    done = runner.invoke(app, ["tune", str(config), "--algorithm", "hyfem"])
    assert done.exit_code != 0
    assert "Use one of: hyfdca, fedavg" in " ".join(done.output.split())
