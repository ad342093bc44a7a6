"""Every algorithm option can be set from ``hyfl run`` and ``hyfl compare``, and each
option name means one thing: ``--step-rule`` is HyFDCA's, FedHybrid's step sizes are
``step_sizes``, and ``compare`` refuses an option none of its algorithms takes."""

import csv
import dataclasses
import json
import typing

import click
import pytest
import typer.main
from typer.testing import CliRunner

from hyfl._names import HYPERPARAMETER_FLAGS, STEP_RULES
from hyfl.algorithms import (
    ALGORITHMS,
    accepted_hyperparameters,
    hyperparameters_by_algorithm,
    is_neural,
    make_algorithm,
)
from hyfl.algorithms.fedhybrid import STEP_SIZES
from hyfl.cli import app
from hyfl.errors import HyflError
from hyfl.experiments.spec import parse_param_value

runner = CliRunner()
SMALL = ["--data", "breast_cancer", "--loss", "logistic", "--partition", "horizontal:2",
         "--participation", "full", "--iterations", "3", "--no-progress"]


class Captured(Exception):
    """Stops a command once it has built what it would run."""


#: Auto options whose smallest value of their type is not valid.
AUTO_SAMPLES = {"history_window": 4}  # HyFDCA: a multiple of history of at least 2


def _sample(entry, f: dataclasses.Field):
    """A valid value of option ``f`` of ``entry``: its default (the preset's, else the
    field's), the other boolean, or for an ``auto`` (None) default one of its type."""
    if f.name in AUTO_SAMPLES:
        return AUTO_SAMPLES[f.name]
    if f.name in entry.preset:
        value = entry.preset[f.name]
    elif f.default is not dataclasses.MISSING:
        value = f.default
    else:
        value = f.default_factory()
    if isinstance(value, bool):
        return not value
    if isinstance(value, tuple):
        return list(value) or [16, 8]
    if value is None:
        kinds = typing.get_args(typing.get_type_hints(entry.cls)[f.name])
        if int in kinds:
            return 1  # 1: FedSGD's only local_steps
        if float in kinds:
            return 0.5
        pytest.fail(f"{entry.cls.__name__}.{f.name}: no sample for an auto option of "
                    f"type {f.type}: teach _sample (and hyfl's --param) its type")
    return value


def _text(value) -> str:
    """``value`` as written on the command line (``--param KEY=TEXT``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return repr(value) if isinstance(value, float) else str(value)


def _same(built, value) -> bool:
    if isinstance(value, list):
        return list(built) == value
    return built == value and type(built) is type(value)


OPTIONS = [
    (name, f) for name, entry in ALGORITHMS.items()
    for f in dataclasses.fields(entry.cls) if f.init and f.name != "name"
]


def test_the_walk_covers_every_option_of_every_algorithm():
    walked = {}
    for name, f in OPTIONS:
        walked.setdefault(name, set()).add(f.name)
    assert walked == {name: accepted_hyperparameters(name) for name in ALGORITHMS}
    assert len(OPTIONS) > 60  # the walk walks


@pytest.mark.parametrize("name, option", [(n, f) for n, f in OPTIONS],
                         ids=[f"{n}.{f.name}" for n, f in OPTIONS])
def test_every_option_of_every_algorithm_can_be_set_from_run_and_compare(
        monkeypatch, name, option):
    """A new option fails here until ``--param`` can write its values."""
    entry = ALGORITHMS[name]
    value = _sample(entry, option)
    param = f"{option.name}={_text(value)}"
    seen = {}

    def capture_run(spec, *args, **kwargs):
        seen["run"] = spec
        raise Captured

    def capture_compare(spec, names, *args, **kwargs):
        seen["compare"] = (spec, names)
        raise Captured

    monkeypatch.setattr("hyfl.experiments.runner.execute", capture_run)
    monkeypatch.setattr("hyfl.experiments.runner.compare", capture_compare)

    result = runner.invoke(app, ["run", "--algorithm", name, "--param", param, "--no-progress"])
    assert isinstance(result.exception, Captured), result.output
    spec = seen["run"]
    assert _same(spec.hyper[option.name], value), (spec.hyper, value)
    built = make_algorithm(name, spec.hyper_for(name))
    assert _same(getattr(built, option.name), value)

    # compare: with an algorithm of the same engine that lacks the option, if there is one
    others = [n for n in ALGORITHMS if is_neural(n) == is_neural(name)
              and option.name not in accepted_hyperparameters(n)]
    names = [name, *others[:1]]
    result = runner.invoke(app, ["compare", "--algorithms", ",".join(names), "--param", param,
                                 "--no-progress"])
    assert isinstance(result.exception, Captured), result.output
    spec, chosen = seen["compare"]
    assert chosen == names
    routed = spec.hyper_by_algorithm(chosen)
    assert _same(routed[name][option.name], value)
    assert all(option.name not in routed[other] for other in others[:1])
    built = make_algorithm(name, routed[name])
    assert _same(getattr(built, option.name), value)


def _command_options(command: str) -> dict[str, click.Option]:
    click_command = typer.main.get_command(app).commands[command]
    return {p.name: p for p in click_command.params if isinstance(p, click.Option)}


@pytest.mark.parametrize("command", ["run", "compare"])
def test_the_own_flags_name_options_and_step_rule_is_hyfdcas(command):
    flags = _command_options(command)
    assert "param" in flags
    for option in HYPERPARAMETER_FLAGS:
        assert option in flags, f"--{option} missing from hyfl {command}"
        assert any(option in accepted_hyperparameters(n) for n in ALGORITHMS), option
    # --step-rule offers HyFDCA's rules, which only HyFDCA takes
    assert list(flags["step_rule"].type.choices) == list(STEP_RULES)
    takers = [n for n in ALGORITHMS if "step_rule" in accepted_hyperparameters(n)]
    assert takers == ["hyfdca"]
    assert "step_sizes=scaled|raw" in flags["step_rule"].help


def test_option_names_of_fedhybrid_and_hyfdca_do_not_clash():
    assert STEP_SIZES == ("scaled", "raw")
    assert not set(STEP_SIZES) & set(STEP_RULES)
    for name in ("fedh-g", "fedh-n", "fedh-k"):
        assert "step_sizes" in accepted_hyperparameters(name)
        assert "step_rule" not in accepted_hyperparameters(name)


def test_compare_with_the_safe_step_rule_runs_hyfdca_with_it_and_fedhybrid_without(tmp_path):
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["compare", "--algorithms", "hyfdca,fedh-g", "--step-rule",
                                 "safe", *SMALL, "--out", str(out)])
    assert result.exit_code in (0, 3), result.output  # 3: a model no better than trivial
    assert "error" not in result.output
    hyfdca = json.loads((out / "hyfdca" / "run.json").read_text())
    fedh = json.loads((out / "fedh-g" / "run.json").read_text())
    assert hyfdca["spec"]["hyper"] == {"step_rule": "safe"}
    assert hyfdca["algorithm"]["step_rule"] == "safe"
    assert fedh["spec"]["hyper"] == {}
    assert "step_rule" not in fedh["algorithm"]
    assert fedh["algorithm"]["step_sizes"] == "scaled"
    rows = {r["algorithm"] for r in csv.DictReader(open(out / "summary.csv"))}
    assert rows == {"hyfdca", "fedh-g"}


def _unwrapped(text: str) -> str:
    """The output as one line (the error console wraps at the terminal's width, which
    COLUMNS does not set everywhere: CI's is 80)."""
    return " ".join(text.split())


def test_compare_refuses_an_option_none_of_its_algorithms_takes(tmp_path):
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["compare", "--algorithms", "hyfdca,fedavg", "--param",
                                 "newton_clients=3", *SMALL, "--out", str(out)],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert ("error: option 'newton_clients' is taken by none of the algorithms chosen "
            "(hyfdca, fedavg). newton_clients is an option of fedh-g, fedh-n, fedh-k. Add one "
            "of them to --algorithms, or leave it out.") in _unwrapped(result.output)
    assert not out.exists()  # refused before anything ran

    result = runner.invoke(app, ["compare", "--algorithms", "hyfdca,fedavg", "--param",
                                 "speed=3", *SMALL, "--out", str(out)], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert ("error: option 'speed' is taken by none of the algorithms chosen (hyfdca, fedavg). "
            "No algorithm takes speed: `hyfl algorithms` lists their options.") in _unwrapped(
        result.output)


def test_compare_routes_an_option_to_the_algorithms_that_take_it_only():
    routed = hyperparameters_by_algorithm(
        ["hyfdca", "fedavg", "fedh-g"],
        {"step_rule": "safe", "a": 0.5, "local_steps": 3, "fedh-g.a": 0.25},
    )
    assert routed == {
        "hyfdca": {"step_rule": "safe", "local_steps": 3},
        "fedavg": {"a": 0.5, "local_steps": 3},
        "fedh-g": {"a": 0.25},
    }
    with pytest.raises(HyflError, match=r"^option 'hyfdca\.iic' is for hyfdca, which is not "
                       r"among the algorithms chosen \(fedavg\)\. Add hyfdca to --algorithms"):
        hyperparameters_by_algorithm(["fedavg"], {"hyfdca.iic": 0.5})
    with pytest.raises(HyflError, match=r"^option fedavg\.mu does not apply to fedavg\. mu is "
                       r"an option of hyfem, .*fedavg accepts: a, b, iic, local_steps\.$"):
        hyperparameters_by_algorithm(["fedavg"], {"fedavg.mu": 0.5})


def test_fedhybrids_old_step_rule_key_is_refused_with_its_new_name():
    with pytest.raises(HyflError) as err:
        make_algorithm("fedh-g", {"step_rule": "raw"})
    assert str(err.value) == (
        "hyperparameter 'step_rule' does not apply to fedh-g. fedh-g's step_rule is now called "
        "step_sizes: write step_sizes=VALUE. step_rule is an option of hyfdca. fedh-g accepts: "
        "a, b, cg_tolerance, mu, newton_clients, newton_solver, step_sizes.")
    with pytest.raises(HyflError, match="fedh-n's step_rule is now called step_sizes"):
        hyperparameters_by_algorithm(["fedh-n"], {"step_rule": "raw"})


def _primal(folder):
    return [float(r["primal"]) for r in csv.DictReader(open(folder / "metrics.csv"))]


def test_fedhybrids_raw_step_sizes_are_reachable_and_change_its_iterates(tmp_path):
    runs = {}
    for label, extra in {"scaled": [], "raw": ["--param", "step_sizes=raw"]}.items():
        out = tmp_path / label
        result = runner.invoke(app, ["run", "--algorithm", "fedh-g", "--a", "0.05", "--b",
                                     "0.05", *extra, *SMALL, "--out", str(out)])
        assert result.exit_code in (0, 3), result.output
        record = json.loads((out / "run.json").read_text())
        assert record["algorithm"]["step_sizes"] == label
        runs[label] = _primal(out)
    assert runs["raw"][0] == runs["scaled"][0]  # the same start
    assert runs["raw"][1:] != pytest.approx(runs["scaled"][1:], rel=1e-6)

    # and in a comparison, for FedHybrid alone
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["compare", "--algorithms", "hyfdca,fedh-g", "--param",
                                 "fedh-g.step_sizes=raw", "--a", "0.05", "--b", "0.05",
                                 *SMALL, "--out", str(out)])
    assert result.exit_code in (0, 3), result.output
    record = json.loads((out / "fedh-g" / "run.json").read_text())
    assert record["algorithm"]["step_sizes"] == "raw"
    assert _primal(out / "fedh-g") == pytest.approx(runs["raw"])


def test_a_list_value_reaches_fedhybrids_per_client_steps(monkeypatch):
    seen = {}

    def capture(spec, *args, **kwargs):
        seen["spec"] = spec
        raise Captured

    monkeypatch.setattr("hyfl.experiments.runner.execute", capture)
    result = runner.invoke(app, ["run", "--algorithm", "fedh-g", "--param", "a=[0.5,0.25]",
                                 "--param", "newton_clients=0,1"])
    assert isinstance(result.exception, Captured), result.output
    built = make_algorithm("fedh-g", seen["spec"].hyper_for("fedh-g"))
    assert built.a == (0.5, 0.25) and built.newton_clients == (0, 1)


@pytest.mark.parametrize("text, value", [
    ("3", 3), ("0.5", 0.5), ("1e-10", 1e-10), ("true", True), ("False", False),
    ("raw", "raw"), ("N_k/N", "N_k/N"), ("[0.5,1]", [0.5, 1]), ("1, 2", [1, 2]), ("[]", []),
    ("[7]", [7]),
])
def test_param_values(text, value):
    parsed = parse_param_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_hyfl_algorithms_lists_fedhybrids_step_sizes():
    result = runner.invoke(app, ["algorithms"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "step_sizes=scaled" in result.output
    assert "a list as [1,2]" in result.output


@pytest.mark.parametrize("param, culprit", [
    ("nosuchalg.history_window=4", "names no algorithm 'nosuchalg'"),
    ("hyfcda.history_window=4", "names no algorithm 'hyfcda'"),  # a typo of hyfdca
    ("fedavg.nosuch=4", "is not an option of fedavg"),
])
def test_run_refuses_an_option_for_no_algorithm_or_no_option(tmp_path, param, culprit):
    """``hyfl run`` used to drop ``ALG.KEY=VALUE`` silently when ALG was not the algorithm
    run, a typo included; another algorithm's real option may still ride along."""
    result = runner.invoke(app, ["run", *SMALL, "--param", param, "--out", str(tmp_path / "r")])
    assert result.exit_code != 0 and culprit in " ".join(result.output.split())
    assert not (tmp_path / "r").exists()
    ok = runner.invoke(app, ["run", *SMALL, "--param", "fedavg.iic=0.25",
                             "--out", str(tmp_path / "ok")])
    assert ok.exit_code == 0, ok.output
