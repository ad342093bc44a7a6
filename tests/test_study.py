"""Tests for hyfl.experiments.study: a folder of configs run and summarized as one study."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hyfl.errors import HyflError
from hyfl.experiments.config import load_config
from hyfl.experiments.study import plan_study, run_study, scaled

CONFIG = """
[experiment]
name = "{name}"
eval_every = 1
budget = {budget}

[data]
dataset = "breast_cancer"
lam = 0.01
val_fraction = 0.2

[partition]
spec = "grid:{clients}"
participation = "{fraction}"

[costs]
latency = 0.2575

[algorithms.hyfdca]
local_steps = 5
sip_scope = "paper"
step_rule = "safe"

[algorithms.fedavg]
local_steps = 5
a = 0.1
b = 1.0
"""


def write_study(root: Path) -> None:
    for budget, table in (
        ("iterations", "{ iterations = 20 }"),
        ("time", "{ sim_time = 30.0, max_iterations = 400 }"),
    ):
        for clients in ("2x2", "3x3"):
            for fraction in ("0.5", "0.9"):
                folder = root / "breast_cancer" / budget
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{clients}-{fraction}.toml").write_text(
                    CONFIG.format(
                        name=f"{budget}-{clients}-{fraction}",
                        budget=table,
                        clients=clients,
                        fraction=fraction,
                    )
                )


def test_scaled_multiplies_every_budget(tmp_path):
    write_study(tmp_path)
    config = load_config(tmp_path / "breast_cancer" / "time" / "2x2-0.5.toml")
    quick = scaled(config, 0.1)
    assert quick.experiment.budget.sim_time == pytest.approx(3.0)
    assert quick.experiment.budget.max_iterations == 40
    assert scaled(config, 1.0) is config
    iterations = load_config(tmp_path / "breast_cancer" / "iterations" / "2x2-0.5.toml")
    assert scaled(iterations, 0.01).experiment.budget.iterations == 1  # at least one round
    for bad in (0, 1.5, float("nan"), "x"):
        with pytest.raises(HyflError, match="--scale"):
            scaled(config, bad)


def test_plan_lists_missing_data_files(tmp_path, monkeypatch):
    write_study(tmp_path)
    missing = tmp_path / "news20" / "iterations"
    missing.mkdir(parents=True)
    text = CONFIG.format(name="n", budget="{ iterations = 2 }", clients="2x2", fraction="0.5")
    (missing / "a.toml").write_text(text.replace('"breast_cancer"', '"news20"'))
    plan = plan_study(tmp_path, tmp_path / "out")
    assert len(plan) == 9
    news = [run for run in plan if "news20" in str(run.config_path)]
    assert news[0].missing and not any(run.missing for run in plan if run not in news)
    assert news[0].out_dir == tmp_path / "out" / "news20" / "iterations" / "a"


def test_study_runs_compares_each_budget_and_resumes(tmp_path):
    write_study(tmp_path / "configs")
    out = tmp_path / "out"
    lines = []
    run_study(tmp_path / "configs", out, jobs=2, log=lines.append)
    assert sum(line.startswith("finished") for line in lines) == 8
    summary = (out / "study.md").read_text()
    # Each group is compared on its own budget only: 4 settings (x 1 opponent) per metric.
    for budget in ("equal outer iterations", "equal simulated time"):
        row = re.search(rf"\| breast_cancer \| {budget} \|(.*)\|", summary).group(1)
        assert row.count(" of 4 ") == 4, row
    assert "of 16** pairs" in summary  # 2 budgets x 2 metrics x 4 settings x 1 opponent
    for name in ("breast_cancer-iterations.png", "breast_cancer-time.png"):
        assert (out / "study_files" / name).stat().st_size > 0
    # Equal-time runs stop once they cross the simulated time: FedAvg runs more rounds.
    text = summary.split("## breast_cancer, equal simulated time")[1]
    rounds = {
        alg: int(n) for alg, n in re.findall(r"\| grid:2x2 \| 0.9 \| (\w+) \| (\d+) \|", text)
    }
    assert rounds["fedavg"] > rounds["hyfdca"] > 0
    # A second call reads every finished run back instead of running it again.
    before = {p: p.stat().st_mtime_ns for p in out.rglob("metrics.csv")}
    run_study(tmp_path / "configs", out, jobs=1)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("metrics.csv")} == before


def test_study_errors(tmp_path):
    with pytest.raises(HyflError, match="does not exist"):
        run_study(tmp_path / "nope", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(HyflError, match="no \\*.toml"):
        run_study(tmp_path / "empty", tmp_path / "out")


def test_study_command(tmp_path):
    from typer.testing import CliRunner

    from hyfl.cli import app

    write_study(tmp_path / "configs")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["study", str(tmp_path / "configs"), "--out", str(out), "--scale", "0.5", "-q"]
    )
    assert result.exit_code == 0, result.output
    assert (out / "study.md").exists()
    budget = (out / "breast_cancer" / "iterations" / "2x2-0.5" / "config.toml").read_text()
    assert "iterations = 10" in budget  # 20 x 0.5
    result = CliRunner().invoke(app, ["study", str(tmp_path / "configs"), "--scale", "2"])
    assert result.exit_code != 0 and "--scale" in result.output


def test_full_budget_replaces_the_budget(tmp_path):
    from hyfl.experiments.study import full_budget

    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(name="c", budget="{ iterations = 20 }", clients="2x2",
                                  fraction="0.5").replace(
        "budget = { iterations = 20 }",
        "budget = { iterations = 20 }\nfull_budget = { iterations = 200 }"))
    config = load_config(path)
    assert config.experiment.full_budget.iterations == 200
    full = full_budget(config)
    assert full.budget.iterations == 200 and full.experiment.eval_every == 10  # 1 x 200 / 20
    assert load_config(path).to_dict()["experiment"]["full_budget"] == {"iterations": 200}
    plain = tmp_path / "plain.toml"
    plain.write_text(CONFIG.format(name="p", budget="{ iterations = 20 }", clients="2x2",
                                   fraction="0.5"))
    assert full_budget(load_config(plain)) == load_config(plain)  # no full_budget: unchanged


def test_study_command_full(tmp_path):
    from typer.testing import CliRunner

    from hyfl.cli import app

    path = tmp_path / "configs" / "c.toml"
    path.parent.mkdir()
    path.write_text(CONFIG.format(name="c", budget="{ iterations = 20 }", clients="2x2",
                                  fraction="0.5").replace(
        "budget = { iterations = 20 }",
        "budget = { iterations = 20 }\nfull_budget = { iterations = 3 }"))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["study", str(path.parent), "--full", "--out", str(out),
                                      "-q", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert "iterations = 3" in (out / "c" / "config.toml").read_text()
    result = CliRunner().invoke(app, ["study", str(path.parent), "--full", "--quick", "-q"])
    assert result.exit_code != 0 and "--full and --quick" in " ".join(result.output.split())


def test_paper_configs_count_and_price_as_the_paper_and_carry_its_budgets():
    root = Path(__file__).resolve().parents[1] / "configs" / "paper"
    found = {}
    for path in sorted(root.rglob("*.toml")):
        config = load_config(path)
        dataset, budget = path.parent.parent.name, path.parent.name
        found.setdefault((dataset, budget), 0)
        found[(dataset, budget)] += 1
        assert config.costs.cipher == "none"
        assert (config.costs.he_costs, config.costs.he_layout) == ("paper", "sample")
        full = config.experiment.full_budget
        if budget == "iterations":  # the paper's section 7.1
            assert full.iterations == {"mnist": 2500, "covtype": 30000, "reuters": 10000}[dataset]
        else:
            assert full.sim_time == 10800.0
    assert set(found) == {(d, b) for d in ("mnist", "covtype", "reuters")
                          for b in ("iterations", "time")}
    assert set(found.values()) == {9}
