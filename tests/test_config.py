"""Experiment configs: parsing, validation errors, round trip, and `hyfl run CONFIG`."""

import copy
import json
import re

import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from hyfl.cli import TRIVIAL_EXIT_CODE, app
from hyfl.errors import HyflError
from hyfl.experiments.config import (
    ExperimentConfig,
    load_config,
    parse_config,
)
from hyfl.experiments.outputs import SUMMARY_COLUMNS
from hyfl.experiments.spec import RunSpec
from hyfl.runtime.simulation import WALL_TIME_COLUMNS

runner = CliRunner()

# A tiny run may end no better than trivial: it still finishes and writes everything, with
# exit code TRIVIAL_EXIT_CODE (tests/test_trivial_cli.py tests that); these tests are about
# other things.
FINISHED = (0, TRIVIAL_EXIT_CODE)

BASE = {
    "experiment": {
        "name": "bc",
        "seeds": [0],
        "eval_every": 5,
        "budget": {"iterations": 10},
    },
    "data": {"dataset": "breast_cancer", "loss": "hinge", "val_fraction": 0.2},
    "partition": {"spec": "grid:2x2", "participation": "0.5"},
    "costs": {"cipher": "none", "latency": 0.1, "he_costs": "paper"},
    "algorithms": {
        "hyfdca": {"iic": 0.2},
        "fedavg": {"iic": 0.05, "a": 0.1, "b": 1.0},
    },
}

FULL_EXAMPLE = """
[experiment]
name = "mnist-8-0.1"
description = "paper setting"
seeds = [0, 1]
eval_every = 10
budget = { sim_time = 10800.0, max_iterations = 1000000 }
checkpoint_every = 100

[data]
dataset = "mnist"
loss = "hinge"
val_fraction = 0.2

[partition]
spec = "quadrant:8"
participation = 0.1

[costs]
cipher = "none"
key_bits = 2048
latency = 0.2575
he_costs = "paper"

[algorithms.hyfdca]
iic = 0.001

[algorithms.fedavg]
iic = 0.02
a = 0.1
b = 1.0

[algorithms.fedavg-slow]
algorithm = "fedavg"
a = 0.01

[tune]
seconds = 600
fedavg = { a = [0.001, 1.0] }
"""


def write(tmp_path, tables, name="exp.toml"):
    path = tmp_path / name
    path.write_text(tomli_w.dumps(tables) if isinstance(tables, dict) else tables)
    return path


def test_full_example_parses_into_run_specs(tmp_path):
    config = load_config(write(tmp_path, FULL_EXAMPLE))
    assert isinstance(config, ExperimentConfig)
    assert config.name == "mnist-8-0.1" and config.seeds == (0, 1)
    assert config.budget.sim_time == 10800.0 and config.budget.rounds == 1000000
    assert config.data.lam == 1e-3  # the paper's lambda for MNIST
    assert config.partition.participation == "0.1"
    assert config.tune == {"seconds": 600, "fedavg": {"a": [0.001, 1.0]}}
    specs = config.run_specs()
    assert len(specs) == 6 and all(isinstance(s, RunSpec) for s in specs)
    assert [(s.algorithm, s.seed) for s in specs[:3]] == [
        ("hyfdca", 0),
        ("fedavg", 0),
        ("fedavg", 0),
    ]
    slow = specs[2]
    assert slow.hyper == {"a": 0.01} and slow.iterations == 1000000
    assert slow.sim_time == 10800.0 and slow.latency == 0.2575 and slow.key_bits == 2048
    assert [j.label for j in config.jobs()][:3] == ["hyfdca", "fedavg", "fedavg-slow"]
    assert config.experiment.checkpoint_every == 100


def test_round_trip_through_the_resolved_toml(tmp_path):
    config = load_config(write(tmp_path, FULL_EXAMPLE))
    again = load_config(write(tmp_path, config.to_toml(), "resolved.toml"))
    assert again == config
    minimal = copy.deepcopy(BASE)
    del minimal["costs"]
    config = load_config(write(tmp_path, minimal))
    assert config.costs.cipher == "none" and config.data.lam == 1e-3
    assert load_config(write(tmp_path, config.to_toml(), "resolved.toml")) == config


def test_defaults_and_paths_relative_to_the_config(tmp_path):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "trace.txt").write_text("0 1\n2 3\n")
    tables = copy.deepcopy(BASE)
    del tables["experiment"]["name"], tables["experiment"]["seeds"]
    tables["partition"]["participation"] = "trace:trace.txt"
    config = load_config(write(folder, tables, "my-exp.toml"))
    assert config.name == "my-exp" and config.seeds == (0,)
    assert config.partition.participation == f"trace:{folder / 'trace.txt'}"
    assert str(config.default_out()) == "runs/my-exp"


def mutate(change):
    tables = copy.deepcopy(BASE)
    change(tables)
    return tables


def _set(section, key, value):
    def change(t):
        t[section][key] = value

    return change


def _del(section, key=None):
    def change(t):
        if key is None:
            del t[section]
        else:
            del t[section][key]

    return change


ERRORS = [
    # unknown tables and keys list the known ones
    (lambda t: t.update(extra={"x": 1}), r"\[extra\]: is not a known table .*Known tables: exp"),
    (_set("data", "datset", "x"), r"\[data\] datset: is not a known key.*Known keys of \[data\]"),
    (_set("costs", "cypher", "x"), r"\[costs\] cypher: is not a known key"),
    (_del("data"), r"\[data\]: is missing"),
    (_del("algorithms"), r"\[algorithms\]: is missing"),
    (_set("experiment", "budget", {"iterations": 10, "x": 1}), r"budget.x: is not a known key"),
    # wrong types
    (_set("experiment", "eval_every", "10"), r"\[experiment\] eval_every: must be an integer"),
    (_set("experiment", "eval_every", 0), r"eval_every: must be >= 1, got 0"),
    (_set("experiment", "seeds", 3), r"seeds: must be a non-empty list"),
    (_set("experiment", "seeds", [0, 0]), r"seeds: has repeated seeds"),
    (_set("experiment", "seeds", [-1]), r"seeds: must be >= 0"),
    (_set("data", "lam", "big"), r"\[data\] lam: must be a number, got 'big'"),
    (_set("data", "lam", -1.0), r"\[data\] lam: must be > 0, got -1"),
    (_set("data", "dataset", 3), r"dataset: must be a non-empty string"),
    (_set("costs", "latency", -0.5), r"\[costs\] latency: must be >= 0, got -0.5"),
    (_set("costs", "key_bits", 2047), r"\[costs\] key_bits: is 2047, an odd number"),
    (_set("partition", "participation", True), r"participation: must be a string or a number"),
    (lambda t: t.update(costs=5), r"\[costs\]: must be a table"),
    # bad budgets
    (_del("experiment", "budget"), r"\[experiment\] budget: is missing"),
    (_set("experiment", "budget", 100), r"budget: must be a table"),
    (_set("experiment", "budget", {}), r"budget: must give exactly one of iterations and sim_time"),
    (
        _set("experiment", "budget", {"iterations": 5, "sim_time": 9.0}),
        r"exactly one of iterations and sim_time",
    ),
    (_set("experiment", "budget", {"sim_time": 60.0}), r"max_iterations: is required with sim"),
    (
        _set("experiment", "budget", {"sim_time": -1.0, "max_iterations": 5}),
        r"\[experiment\] budget.sim_time: must be > 0",
    ),
    (_set("experiment", "budget", {"iterations": 0}), r"budget.iterations: must be >= 1"),
    (
        _set("experiment", "budget", {"iterations": 5, "max_iterations": 9}),
        r"max_iterations: applies only with sim_time",
    ),
    # unknown algorithm, hyperparameters the algorithm does not accept, invalid values
    (lambda t: t["algorithms"].update(fedfoo={}), r"\[algorithms.fedfoo\]: 'fedfoo' is not a reg"),
    (
        lambda t: t["algorithms"].update(x={"algorithm": "nope"}),
        r"\[algorithms.x\] algorithm: 'nope' is not a registered",
    ),
    (
        lambda t: t["algorithms"]["fedavg"].update(mu=0.1),
        r"\[algorithms.fedavg\] mu: is not a hyperparameter of fedavg.*accepts: a, b, iic",
    ),
    (
        lambda t: t["algorithms"]["fedavg"].update(a=-1),
        r"^\[algorithms.fedavg\] a: must be > 0, got -1 \(in .*exp.toml\)\. Pass",
    ),
    (
        lambda t: t["algorithms"]["hyfdca"].update(step_rule="fast"),
        r"\[algorithms.hyfdca\] step_rule: is 'fast', which is not known.*safe, theory",
    ),
    (
        lambda t: t["algorithms"]["hyfdca"].update(local_steps=3),
        r"\[algorithms.hyfdca\] iic, local_steps: are both given",
    ),
    (_set("algorithms", "fedavg", 3), r"\[algorithms\] fedavg: must be a table"),
    (lambda t: t.update(algorithms={}), r"must hold at least one \[algorithms.NAME\]"),
    # invalid values elsewhere
    (_set("data", "loss", "hinge2"), r"\[data\] loss: is 'hinge2', which is not known"),
    (_set("data", "dataset", "nosuchdata"), r"dataset: is 'nosuchdata', neither a registered"),
    (_set("data", "val", "x.txt"), r"\[data\] val, val_fraction: are both given"),
    (_set("data", "val_fraction", 1.0), r"val_fraction: must be < 1"),
    (_set("partition", "spec", "grid:3"), r"\[partition\] spec: is 'grid:3', which is not und"),
    (_set("partition", "participation", 1.5), r"\[partition\] participation: .*1.5"),
    (_set("partition", "participation", "cyclic:x"), r"participation: .*cyclic"),
    (_set("partition", "participation", "trace:none.txt"), r"trace file .*does not exist"),
    (_set("costs", "cipher", "rsa"), r"\[costs\] cipher: is 'rsa'.*none, paillier, packed"),
    (_set("costs", "he_costs", "nofile.json"), r"\[costs\] he_costs: "),
]


@pytest.mark.parametrize("change, message", ERRORS)
def test_every_validation_error_names_table_key_and_file(tmp_path, change, message):
    path = write(tmp_path, mutate(change))
    with pytest.raises(HyflError, match=message) as info:
        load_config(path)
    assert f"(in {path})" in str(info.value)


def test_files_that_are_not_toml_or_missing(tmp_path):
    with pytest.raises(HyflError, match="does not exist"):
        load_config(tmp_path / "nothing.toml")
    with pytest.raises(HyflError, match="is not valid TOML"):
        load_config(write(tmp_path, "[experiment\nname = 1"))


def test_a_parsed_table_has_no_source_file():
    config = parse_config(mutate(lambda t: None))
    assert config.source is None


# ---------------------------------------------------------------------------
# hyfl run CONFIG
# ---------------------------------------------------------------------------


def test_run_config_writes_the_results_folder(tmp_path):
    path = write(tmp_path, BASE)
    out = tmp_path / "results"
    result = runner.invoke(app, ["run", str(path), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert load_config(out / "config.toml") == load_config(path)
    env = json.loads((out / "environment.json").read_text())
    assert {"numpy", "scipy", "scikit-learn", "phe"} <= set(env["versions"])
    assert {"python", "cpu", "cores", "platform", "git", "date"} <= set(env)
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns) == list(SUMMARY_COLUMNS)
    assert list(summary["algorithm"]) == ["hyfdca", "fedavg"]
    assert (out / "summary.md").exists() and (out / "compare.png").exists()
    for name in ("hyfdca", "fedavg"):
        run_dir = out / name / "seed-0"
        table = pd.read_parquet(run_dir / "metrics.parquet")
        pd.testing.assert_frame_equal(table, pd.read_csv(run_dir / "metrics.csv"))
        assert list(table["iteration"]) == [0, 5, 10]
        record = json.loads((run_dir / "run.json").read_text())
        assert record["budget"] == {"iterations": 10} and record["stopped_by"] == "iterations"
        assert record["label"] == name and record["seed"] == 0
        assert (run_dir / "checkpoint.npz").exists()
        assert not (run_dir / "started.json").exists()


def test_run_config_several_seeds_sim_time_budget_and_flags(tmp_path):
    tables = copy.deepcopy(BASE)
    tables["experiment"].update(seeds=[0, 1], budget={"sim_time": 0.35, "max_iterations": 50})
    del tables["costs"]  # --latency fills it in; --loss overrides the config's hinge
    del tables["algorithms"]["hyfdca"]
    path = write(tmp_path, tables)
    out = tmp_path / "results"
    args = ["run", str(path), "--out", str(out), "--latency", "0.1", "--loss", "logistic"]
    result = runner.invoke(app, [*args, "--no-progress"])
    assert result.exit_code in FINISHED, result.output
    assert "--loss overrides the config" in result.output
    assert load_config(out / "config.toml").costs.latency == 0.1
    for seed in (0, 1):
        record = json.loads((out / "fedavg" / f"seed-{seed}" / "run.json").read_text())
        assert record["stopped_by"] == "sim_time" and record["spec"]["loss"] == "logistic"
        assert record["overrides"]["data.loss"] == {
            "value": "logistic", "from": "--loss", "config": "hinge"
        }
        assert record["budget"] == {"sim_time": 0.35, "max_iterations": 50}
        # FedAvg: one round trip of 0.1 s per round with an active client
        assert record["summary"]["final"]["sim_time"] >= 0.35
        assert record["rounds"] < 50
    per_seed = pd.read_csv(out / "summary_seeds.csv")
    assert list(per_seed["seed"]) == [0, 1]
    summary = pd.read_csv(out / "summary.csv")
    assert summary.loc[0, "n_seeds"] == 2
    values = per_seed["final_relative_loss"]
    assert summary.loc[0, "final_relative_loss_mean"] == pytest.approx(values.mean())
    assert summary.loc[0, "final_relative_loss_std"] == pytest.approx(values.std(ddof=1))


def test_resume_continues_and_skips_finished_runs(tmp_path):
    out = tmp_path / "results"
    short = mutate(_set("experiment", "budget", {"iterations": 6}))
    path = write(tmp_path, short)
    assert runner.invoke(app, ["run", str(path), "--out", str(out), "-q"]).exit_code in FINISHED
    # Same config again: every run is finished and read back.
    result = runner.invoke(app, ["run", str(path), "--out", str(out), "--resume", "--no-progress"])
    assert result.exit_code in FINISHED and result.output.count("finished earlier") == 2
    # Simulate an interruption of fedavg: its run is incomplete, its checkpoint at round 6.
    (out / "fedavg" / "seed-0" / "run.json").unlink()
    longer = write(tmp_path, BASE)  # 10 iterations
    result = runner.invoke(app, ["run", str(longer), "--out", str(out), "--resume", "-q"])
    assert result.exit_code in FINISHED, result.output
    fresh = tmp_path / "fresh"
    assert runner.invoke(app, ["run", str(longer), "--out", str(fresh), "-q"]).exit_code in FINISHED
    for name in ("hyfdca", "fedavg"):
        a = pd.read_parquet(out / name / "seed-0" / "metrics.parquet")
        b = pd.read_parquet(fresh / name / "seed-0" / "metrics.parquet")
        keep = [c for c in a.columns if c not in WALL_TIME_COLUMNS]
        pd.testing.assert_frame_equal(a[keep], b[keep], check_exact=True)
        record = json.loads((out / name / "seed-0" / "run.json").read_text())
        assert record["resumed_from"] == [6]


def test_resume_refusals(tmp_path):
    result = runner.invoke(app, ["run", "--resume", "--no-progress"])
    assert result.exit_code == 2 and "needs an experiment config" in result.output
    tables = mutate(_set("costs", "cipher", "paillier"))
    tables["costs"]["key_bits"] = 512
    path = write(tmp_path, tables)
    out = tmp_path / "results"
    run_dir = out / "hyfdca" / "seed-0"
    run_dir.mkdir(parents=True)
    (run_dir / "started.json").write_text("{}")  # an interrupted encrypted run
    result = runner.invoke(app, ["run", str(path), "--out", str(out), "--resume", "-q"])
    assert result.exit_code == 2
    assert "cannot be resumed" in result.output and "protocol engine" in result.output
    bad = write(tmp_path, mutate(_set("data", "lam", 0)), "bad.toml")
    result = runner.invoke(app, ["run", str(bad), "-q"])
    assert result.exit_code == 2 and "[data] lam: must be > 0" in result.output


@pytest.mark.parametrize(
    ("algorithm", "key", "value", "expected"),
    [
        ("hyfdca", "local_steps", "five", "must be an integer, got 'five'"),
        ("hyfdca", "local_steps", True, "must be an integer, got True"),
        ("hyfdca", "iic", [0.1], "must be a number, got [0.1]"),
        ("hyfdca", "refresh_inner_products", "yes", "must be true or false, got 'yes'"),
        ("fedavg", "a", True, "must be a number, got True"),
        ("fedh-g", "a", ["x"], "must be a number or a list of numbers, got ['x']"),
        ("fedsgd", "batch_size", 2.5, "must be an integer, got 2.5"),
    ],
)
def test_hyperparameter_of_wrong_type_names_key_type_and_value(algorithm, key, value, expected):
    from hyfl.experiments.config import parse_config

    raw = {
        "experiment": {"name": "x", "budget": {"iterations": 5}},
        "data": {"dataset": "breast_cancer"},
        "partition": {"spec": "grid:2x2"},
        "algorithms": {algorithm: {key: value}},
    }
    with pytest.raises(HyflError) as error:
        parse_config(raw, source="bad.toml")
    message = str(error.value)
    assert f"[algorithms.{algorithm}] {key}:" in message
    assert expected in message and "bad.toml" in message


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("psi", "yes", "parties.psi: must be true or false, got 'yes'"),
        ("min_common", True, "parties.min_common: must be an integer, got True"),
        ("min_common", "1", "parties.min_common: must be an integer, got '1'"),
        ("id_column", 3, "parties.id_column: must be a string, got 3"),
    ],
)
def test_party_options_of_wrong_type(key, value, expected):
    from hyfl.experiments.config import parse_config

    raw = {
        "experiment": {"name": "x", "budget": {"iterations": 5}},
        "data": {"parties": {"files": ["a.csv", "b.csv"], key: value}},
        "algorithms": {"hyfdca": {}},
    }
    with pytest.raises(HyflError, match=re.escape(expected)):
        parse_config(raw, source="bad.toml")
