"""The tables ``hyfl`` prints stay readable at 80 columns: nothing cut, numbers whole."""

import re
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from hyfl import cli, cli_tables
from hyfl.experiments.outputs import CONVERGENCE_COLUMNS, COST_SUMMARY_COLUMNS

runner = CliRunner()


@pytest.fixture
def narrow(monkeypatch):
    """``cli.console`` and ``cli_tables.console`` as an 80-column terminal read back."""
    console = Console(width=80, record=True, color_system=None, highlight=False)
    monkeypatch.setattr(cli, "console", console)  # the commands' lines
    monkeypatch.setattr(cli_tables, "console", console)  # their tables
    return console


def _readable(text: str) -> list[str]:
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    assert "…" not in text and "..." not in text, text
    return lines


def _row(name: str, scale: float) -> dict:
    row = {column: 123_456 * scale for column in CONVERGENCE_COLUMNS + COST_SUMMARY_COLUMNS}
    row.update(algorithm=name, engine="protocol", final_relative_loss=1.234567e-05 * scale,
               best_val_accuracy=0.987654, median_round_ms=12.3456, sim_time=12_345.678,
               bytes_up=1.23e9, bytes_down=4.56e8, encryptions=12_345_678,
               decryptions=9_876_543, time_client_per_iter=1.234e-3,
               time_server_per_iter=5.6e-6, time_latency_per_iter=0.2575,
               time_encryption_per_iter=18.882)
    return row


def test_comparison_tables_fit_80_columns_and_keep_numbers_whole(narrow):
    rows = [_row("hyfem-avg", 1.0), _row("fedbcd-p", 3.0), _row("hyfdca", 7.0)]
    cli_tables.print_comparison(rows, "breast_cancer, grid:3x3, participation 0.5",
                          "simulated cost; seconds per outer iteration")
    text = narrow.export_text()
    lines = _readable(text)
    for whole in ("hyfem-avg", "fedbcd-p", "1.235e-05", "12,345,678", "1.23 GB", "12,346 s",
                  "rel. loss", "algorithm", "sim_time"):
        assert whole in text, whole
    # Every cell of a row is on the row's line: no number split over two lines.
    assert [line for line in lines if line.strip().startswith("hyfdca")][0].count("8.642e-05") == 1
    assert "left out at this terminal width" in text  # and the reader is told what is missing


def test_comparison_tables_keep_every_column_when_the_terminal_is_wide(monkeypatch):
    wide = Console(width=300, record=True, color_system=None)  # 275 since the accuracy levels
    monkeypatch.setattr(cli_tables, "console", wide)
    cli_tables.print_comparison([_row("hyfdca", 1.0)], "title", "cost")
    text = wide.export_text()
    assert "left out" not in text and "settled 1e-3" in text and "dec." in text


def test_experiment_table_over_seeds_fits_80_columns(narrow):
    row = {"algorithm": "fedbcd-p", "n_seeds": 3}
    for column, mean, std in [("final_relative_loss", 1.2345e-4, 6.789e-5),
                              ("best_val_accuracy", 0.98765, 0.0123),
                              ("settled_1e-2", 1234.0, 56.0), ("round_trips", 2500.0, 0.0),
                              ("sim_time", 10_800.5, 123.4)]:
        row[f"{column}_mean"], row[f"{column}_std"] = mean, std
    config = SimpleNamespace(name="paper-rcv1", seeds=(0, 1, 2),
                             data=SimpleNamespace(dataset="rcv1"),
                             partition=SimpleNamespace(spec="grid:3x3", participation="0.5"))
    cli_tables.print_experiment(SimpleNamespace(config=config, rows=[row]))
    text = narrow.export_text()
    _readable(text)
    assert "fedbcd-p" in text and "0.0001234 ± 6.789e-05" in text
    assert re.search(r"10,800 s ± 123 s", text)


def test_run_summary_and_costs_fit_80_columns(narrow, tmp_path):
    args = ["run", "--algorithm", "hyfem-avg", "--iterations", "3", "--no-progress",
            "--intercept", "off", "--out", str(tmp_path / "r")]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    text = narrow.export_text()
    _readable(text)
    assert "centralized" in text and "per iteration" in text and "sim_time" in text
    assert "latency 0 s)" in text  # the title is not wrapped between a number and its unit


def test_algorithms_and_datasets_fit_80_columns(narrow, tmp_path):
    from hyfl.algorithms import ALGORITHMS

    assert runner.invoke(cli.app, ["algorithms"]).exit_code == 0
    assert runner.invoke(cli.app, ["datasets", "--data-dir", str(tmp_path)]).exit_code == 0
    text = narrow.export_text()
    lines = _readable(text)
    names = {line.split()[1] for line in lines if line.startswith("│") and len(line.split()) > 1}
    assert set(ALGORITHMS) <= names  # every name whole on its line, never `algorit…`
    assert "breast_cancer" in names


@pytest.mark.parametrize("command", [["run"], ["compare"], ["deploy", "local"], ["deploy", "party"],
                                     ["predict"]])
def test_help_reads_at_80_columns(command):
    """Option help at 80 columns: nothing cut, and a description column of at least 26
    characters (choices as "[a|b|c]" metavars once squeezed it to 20 and cut flag names)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80", "PYTHONWARNINGS": "ignore", "NO_COLOR": "1"}
    shown = subprocess.run([sys.executable, "-m", "hyfl.cli", *command, "--help"],
                           capture_output=True, text=True, env=env, check=True).stdout
    lines = _readable(shown)
    # An option's description is the last of the first line's cells (two spaces apart).
    widths = []
    for line in lines:
        if re.match(r"│ {1,4}--[a-z]", line):  # (not a description that starts with --)
            description = re.split(r"  +", line.strip("│ "))[-1]
            widths.append(79 - line.rfind(description))
    assert widths and min(widths) >= 26, shown
