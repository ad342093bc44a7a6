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
