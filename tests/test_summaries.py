"""Summaries and tables a researcher and an organisation can read (issue 43).

Every round line says which model it reports and why an earlier one; the
summaries give the rounds to the central model's accuracy beside the relative
loss levels; ``hyfl algorithms`` lists each algorithm's options with their
defaults; a study of one config shows its runs' progress.
"""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from hyfl import cli
from hyfl.deploy.report import RoundDisplay, round_line, summarize, summary_table

runner = CliRunner()


def _record(t, **more):
    return {"iteration": t, "active": [0, 1], "absent": [], "accepted": True, "attempts": 1,
            "round_seconds": 1.0, "payload_bytes_up": 1000.0, "payload_bytes_down": 2000.0,
            **more}


def _plain(width=200) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)


# ----------------------------------------------------------------------------- deployed rounds


def test_a_deployed_round_line_says_which_model_is_reported_and_why_an_earlier_one():
    # The reported case: every round accepted, the round's own w climbing, the model
    # reported the best w of round 1 -- the line must not read as progress.
    this = round_line(_record(1, reported={"round": 1, "relative_loss": 3.81}), total=3,
                      relative_loss=3.81, show_loss=True)
    assert "accepted  rel. loss 3.81 (this round's w, reported)" in this
    later = round_line(_record(3, reported={"round": 1, "relative_loss": 3.81}), total=3,
                       relative_loss=52.0, show_loss=True)
    assert ("rel. loss 52 (this round's w; reported: round 1's, 3.81, no better w since)"
            in later)
    start = round_line(_record(2, reported={"round": 0, "relative_loss": 13.3}), total=3,
                       relative_loss=20.0, show_loss=True)
    assert "reported: the start's (w = 0), 13.3, no better w since" in start
    # Without a reported entry (older callers) the line is as before.
    assert "rel. loss 3.81  1 s" in round_line(_record(1), relative_loss=3.81, show_loss=True)


def test_the_certificate_is_labelled_as_the_round_starts():
    """The parties' secure sums certify the w a round starts from, not its result."""
    line = round_line(_record(2, certificate={"gap": 0.12, "accuracy": 0.9123}))
    assert "round start: gap 0.12, acc. 0.912" in line
    assert "round start: gap 0.5  " in round_line(_record(2, certificate={"gap": 0.5}))


def test_the_round_display_passes_the_reported_model_on():
    console = _plain()
    with RoundDisplay(console, total=2, show_loss=True) as display:
        display.show(_record(1, reported={"round": 1, "relative_loss": 0.3}), 0.3)
        display.show(_record(2, reported={"round": 1, "relative_loss": 0.3}), 0.9)
    lines = console.file.getvalue().splitlines()
    assert "(this round's w, reported)" in lines[0]
    assert "reported: round 1's, 0.3, no better w since" in lines[1]


def test_the_deployed_summary_names_the_reported_model_and_the_last_rounds():
    results = {"rounds": [_record(t) for t in (1, 2, 3)], "parties": {"0": {}, "1": {}},
               "cipher": {"name": "ckks"}, "config": {"algorithm": {"step_rule": "cocoa"}}}
    summary = summarize(results, [13.3, 3.81, 2.48, 2.48], round_relative_loss=[13.3, 3.81,
                                                                               2.48, 52.0],
                        model_round=2)
    assert summary["model_round"] == 2 and summary["relative_loss_last_round"] == 52.0
    console = _plain(width=80)
    console.print(summary_table(summary))
    text = console.file.getvalue()
    assert "relative loss (best w: round 2's)" in text and "13.3 -> 2.48" in text
    assert "relative loss, last round's w" in text and "52" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    # The last round's w is the reported one: no second row.
    same = summarize(results, [13.3, 3.81, 2.48, 2.0], round_relative_loss=[13.3, 3.81, 2.48,
                                                                            2.0], model_round=3)
    console = _plain(width=80)
    console.print(summary_table(same))
    assert "last round's w" not in console.file.getvalue()


# ----------------------------------------------------------------------------- hyfl algorithms


def test_algorithms_lists_every_option_with_its_default_from_the_declaration():
    from hyfl.algorithms import ALGORITHMS
    from hyfl.cli_tables import _option_value, algorithm_options

    for name, entry in ALGORITHMS.items():
        options = dict(algorithm_options(entry))
        declared = {f.name for f in dataclasses.fields(entry.cls) if f.name != "name"}
        assert set(options) == declared, name
        for key, value in entry.preset.items():  # the named variant's preset wins
            assert options[key] == _option_value(value), (name, key)
    hyfdca = dict(algorithm_options(ALGORITHMS["hyfdca"]))
    assert hyfdca["step_rule"] == "cocoa" and hyfdca["local_steps"] == "auto"
    assert hyfdca["certify"] == "true"
    assert dict(algorithm_options(ALGORITHMS["fedpbcd"]))["mu"] == "0.1"


def test_hyfl_algorithms_shows_the_options_at_80_columns(monkeypatch):
    console = Console(file=io.StringIO(), width=80, color_system=None)
    monkeypatch.setattr(cli, "console", console)
    result = runner.invoke(cli.app, ["algorithms"])
    assert result.exit_code == 0, result.output
    text = console.file.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    flat = " ".join(text.replace("│", " ").split())
    assert "step_rule=cocoa" in flat and "sip_scope=all" in flat
    assert "variant=sequential" in flat  # fedbcd-s's preset
    assert "--param NAME=VALUE" in flat


# ----------------------------------------------------------------------------- one-config study


STUDY_CONFIG = """
[experiment]
name = "one"
eval_every = 5
budget = {{ iterations = {iterations} }}

[data]
dataset = "breast_cancer"
lam = 0.01

[partition]
spec = "grid:2x2"
participation = "full"

[algorithms.hyfdca]
local_steps = 5
"""


def test_a_study_of_one_config_runs_in_process_with_its_runs_progress(tmp_path, monkeypatch):
    from hyfl.experiments import runner as runner_module
    from hyfl.experiments.study import run_study

    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "one.toml").write_text(STUDY_CONFIG.format(iterations=10))
    seen = {}
    original = runner_module.run_experiment

    def spy(config, out_dir=None, **kwargs):
        seen.update(kwargs)
        return original(config, out_dir, **kwargs)

    monkeypatch.setattr(runner_module, "run_experiment", spy)
    lines: list[str] = []
    runs = run_study(folder, tmp_path / "out", log=lines.append, progress=True)
    assert len(runs) == 1 and seen["progress"] is True  # the runs' own bars (over rounds)
    assert any("[1/1] hyfdca, seed 0" in line for line in lines)  # a line per run
    assert any(line.startswith("finished") for line in lines)
    assert (tmp_path / "out" / "one" / "summary.csv").exists()
    assert (tmp_path / "out" / "study.md").exists()


@pytest.mark.parametrize("quiet", [False, True])
def test_hyfl_study_of_one_config_file(tmp_path, quiet):
    path = tmp_path / "one.toml"
    path.write_text(STUDY_CONFIG.format(iterations=5))
    result = runner.invoke(cli.app, ["study", str(path), "--out", str(tmp_path / "out"),
                                     *(["-q"] if quiet else [])])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "study.md").exists()


# ----------------------------------------------------------------------------- hyfl run progress


def test_the_run_progress_says_which_model_the_loss_is_of():
    from hyfl.runtime.progress import reported_model

    assert reported_model({"iteration": 5.0, "model": 0.0, "model_round": 5.0}) == "last iterate"
    assert reported_model({"iteration": 5.0, "model": 1.0, "model_round": 5.0}) == "average"
    assert (reported_model({"iteration": 9.0, "model": 2.0, "model_round": 3.0})
            == "round 3's certified (no better pair since)")
    assert reported_model({"iteration": 9.0, "model": 0.0, "model_round": 0.0}).startswith(
        "the start's w = 0")
    assert reported_model({"iteration": 9.0, "model": 0.0}) == "last iterate"  # no duals


def test_the_run_progress_bar_shows_the_model_words(monkeypatch):
    import rich.progress

    from hyfl.runtime.progress import ProgressBar

    console = Console(file=io.StringIO(), width=200, force_terminal=True, color_system=None)
    made = rich.progress.Progress

    def on_console(*columns, **kwargs):
        return made(*columns, **{**kwargs, "console": console})

    monkeypatch.setattr(rich.progress, "Progress", on_console)
    with ProgressBar(True, 10, "hyfdca") as advance:
        advance(4, {"iteration": 4.0, "relative_loss": 0.0123, "model": 2.0,
                    "model_round": 2.0, "primal": 1.0})
    text = console.file.getvalue()
    assert "rel. loss 1.23e-02, round 2's certified (no better pair since)" in text


# ----------------------------------------------------------------------------- accuracy levels


def _column(path, name):
    import csv

    return [float(row[name]) for row in csv.DictReader(open(path))]


def test_summaries_give_the_rounds_to_the_central_models_accuracy(tmp_path):
    import csv
    import json

    from hyfl.experiments.outputs import ACCURACY_MARGINS

    out = tmp_path / "cmp"
    result = runner.invoke(cli.app, ["compare", "--algorithms", "hyfdca,fedavg", "--data",
                                     "breast_cancer", "--iterations", "20", "--out", str(out),
                                     "--no-progress"])
    assert result.exit_code in (0, cli.TRIVIAL_EXIT_CODE), result.output
    rows = {row["algorithm"]: row for row in csv.DictReader(open(out / "summary.csv"))}
    for name in ("hyfdca", "fedavg"):
        central = json.loads((out / name / "run.json").read_text())["summary"]["optimum"][
            "train_accuracy"]
        iterations = _column(out / name / "metrics.csv", "iteration")
        accuracy = _column(out / name / "metrics.csv", "train_accuracy")
        for m in ACCURACY_MARGINS:
            there = [a >= central - m - 1e-12 for a in accuracy]
            first = next((it for it, ok in zip(iterations, there) if ok), None)
            below = [i for i, ok in enumerate(there) if not ok]
            start = below[-1] + 1 if below else 0
            settled = iterations[start] if start < len(iterations) else None
            cell = rows[name][f"rounds_to_acc_{m:g}"]
            assert (float(cell) if cell else None) == first, (name, m)
            cell = rows[name][f"settled_acc_{m:g}"]
            assert (float(cell) if cell else None) == settled, (name, m)
    assert rows["hyfdca"]["rounds_to_acc_0.01"] != ""  # HyFDCA gets within a point in 20
    assert "rounds_to_acc_0.01" in (out / "summary.md").read_text()


def test_the_run_summary_shows_the_rounds_to_each_level_at_80_columns(tmp_path, monkeypatch):
    from hyfl import cli_tables

    console = Console(file=io.StringIO(), width=80, color_system=None)
    monkeypatch.setattr(cli, "console", console)
    monkeypatch.setattr(cli_tables, "console", console)
    result = runner.invoke(cli.app, ["run", "--data", "breast_cancer", "--iterations", "20",
                                     "--no-progress", "--out", str(tmp_path / "r")])
    assert result.exit_code in (0, cli.TRIVIAL_EXIT_CODE), result.output
    text = console.file.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    for label in ("rounds to 1e-2", "rounds to 1e-3", "rounds to acc-1pt", "rounds to acc-.1pt"):
        assert label in text, label
    flat = " ".join(text.split())
    assert "(settled " in text and "acc-1pt, acc-.1pt: the central model's" in flat
    assert "model reported: " in flat  # which model the table's numbers are of


def test_the_compare_table_explains_its_levels(tmp_path, monkeypatch):
    from hyfl import cli_tables

    console = Console(file=io.StringIO(), width=300, color_system=None)
    monkeypatch.setattr(cli_tables, "console", console)
    result = runner.invoke(cli.app, ["compare", "--algorithms", "hyfdca", "--data",
                                     "breast_cancer", "--iterations", "10", "--out",
                                     str(tmp_path / "c"), "--no-progress"])
    assert result.exit_code in (0, cli.TRIVIAL_EXIT_CODE), result.output
    text = console.file.getvalue()
    for header in ("first acc-1pt", "settled acc-1pt", "first acc-.1pt", "settled acc-.1pt",
                   "first AUC 0.7"):
        assert header in text, header
    assert "training accuracy >= the central model's minus 0.01, 0.001" in text


def test_a_config_runs_summary_md_has_the_accuracy_levels(tmp_path):
    from hyfl.experiments.config import load_config
    from hyfl.experiments.runner import run_experiment

    path = tmp_path / "one.toml"
    path.write_text(STUDY_CONFIG.format(iterations=10))
    run_experiment(load_config(path), tmp_path / "out")
    header = (tmp_path / "out" / "summary.md").read_text().splitlines()[0]
    for column in ("rounds_to_acc_0.01", "settled_acc_0.01", "rounds_to_acc_0.001",
                   "settled_acc_0.001"):
        assert column in header


def test_deploy_local_round_lines_name_the_model_the_metrics_report(tmp_path, monkeypatch):
    """In-process ``hyfl deploy local`` (cipher none): each round line's reported model is
    the one metrics.csv reports for that round (``model_round``), and the summary names it."""
    import csv

    import hyfl.deploy.local as local_module
    from test_deploy_progress import InProcessDeployment

    monkeypatch.setattr(local_module, "LocalDeployment", InProcessDeployment)
    out = tmp_path / "out"
    result = runner.invoke(cli.app, ["deploy", "local", "--cipher", "none", "--partition",
                                     "grid:2x2", "--iterations", "5", "--out", str(out)])
    assert result.exit_code in (0, 3), result.output
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    lines = [line for line in result.output.splitlines() if line.startswith("round ")]
    assert len(lines) == 5
    for t, line in enumerate(lines, 1):
        kept = int(float(rows[t]["model_round"]))
        if kept == t:
            assert "(this round's w, reported)" in line, line
        else:
            whose = "the start's (w = 0)" if kept == 0 else f"round {kept}'s"
            assert (f"reported: {whose}, {float(rows[t]['relative_loss']):.3g}, no better w "
                    "since") in line, line
        assert f"rel. loss {float(rows[t]['round_relative_loss']):.3g} (" in line
    text = " ".join(result.output.split())
    kept = int(float(rows[-1]["model_round"]))
    assert f"best w: {'the start' if kept == 0 else f'round {kept}'}'s" in text


def test_report_setting_rows_give_the_accuracy_levels():
    import pandas as pd

    from hyfl.experiments.report import setting_rows
    from hyfl.experiments.results import LoadedRun

    metrics = pd.DataFrame({"iteration": [0.0, 5.0, 10.0, 15.0, 20.0],
                            "relative_loss": [1.0, 0.5, 0.05, 0.02, 0.005],
                            "train_accuracy": [0.6, 0.965, 0.95, 0.972, 0.98]})
    run = LoadedRun("hyfdca", metrics, {"summary": {"optimum": {"train_accuracy": 0.975}}})
    row = setting_rows({"hyfdca": run})[0]
    # 1 point below 0.975: 0.965 first reached at 5, stays from 15 (10 dips below)
    assert row["rounds_to_acc_0.01"] == 5.0 and row["settled_acc_0.01"] == 15.0
    assert row["rounds_to_acc_0.001"] == 20.0 and row["settled_acc_0.001"] == 20.0
    unknown = setting_rows({"x": LoadedRun("x", metrics, {})})[0]  # no central accuracy
    assert unknown["rounds_to_acc_0.01"] is None
