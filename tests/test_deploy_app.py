"""``hyfl deploy app``: a Flower App project that ``flwr run`` submits.

* Unit tests (fast): the project's files, its ``pyproject.toml`` (as Flower
  reads and bundles it), importable components, the run config keys and
  defaults, flags applied and validated, an existing folder kept.
* One real run (slow, but run in CI): the generated project submitted with the
  real ``flwr run`` CLI to a loopback SuperLink with two plain Flower
  SuperNodes; the iterates equal ``run_protocol``'s with the same seed.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from hyfl.cli import app
from hyfl.deploy.config import RUN_DEFAULTS, DeployConfig
from hyfl.deploy.flower_app import APP_FILES, FLOWER_VERSION, hyfl_version, write_flower_app
from hyfl.deploy.keys import generate_keys

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

runner = CliRunner()


def _invoke(*args: str):
    result = runner.invoke(app, list(args))
    return result, " ".join(result.output.split())  # the output without rich's line breaks


def _make(out, *flags: str):
    return _invoke("deploy", "app", str(out), *flags)


def _pyproject(out) -> dict:
    with open(out / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_app_project_is_a_flower_app_with_every_run_config_key(tmp_path):
    out = tmp_path / "app"
    result, output = _make(out)
    assert result.exit_code == 0, output
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(
        APP_FILES)
    project = _pyproject(out)
    version = hyfl_version()
    assert project["project"]["name"] == "hyfl-app"
    assert project["project"]["dependencies"] == [f"hyfl[flower]=={version}",
                                                  f"flwr=={FLOWER_VERSION}"]
    flwr = project["tool"]["flwr"]
    assert flwr["app"]["publisher"] == "hyfl"
    assert flwr["app"]["components"] == {"serverapp": "hyfl_app.server_app:app",
                                         "clientapp": "hyfl_app.client_app:app"}
    assert "federations" not in flwr  # Flower 1.41: connections live in $FLWR_HOME
    assert flwr["app"]["config"] == RUN_DEFAULTS  # every key, the defaults, in their order
    assert list(flwr["app"]["config"]) == list(RUN_DEFAULTS)
    readme = (out / "README.md").read_text()
    for needed in ("flwr run . my-superlink --stream --run-config", "[superlink.my-superlink]",
                   "--node-config", "hyfl deploy keys", "flwr supernode register",
                   "--disable-runtime-dependency-installation", "`parties`, `public-key`"):
        assert needed in readme, needed


def test_app_components_are_hyfls_and_flower_accepts_the_project(tmp_path, monkeypatch):
    pytest.importorskip("flwr")
    import zipfile
    from io import BytesIO

    from flwr.cli.build import build_fab_from_disk
    from flwr.cli.config_utils import load_and_validate

    import hyfl.deploy.app as hyfl_app_module

    out = write_flower_app(tmp_path / "app", {"parties": 2, "cipher": "none"})
    monkeypatch.syspath_prepend(str(out))
    try:
        server = importlib.import_module("hyfl_app.server_app")
        client = importlib.import_module("hyfl_app.client_app")
        assert server.app is hyfl_app_module.server_app
        assert client.app is hyfl_app_module.client_app
    finally:
        for name in [m for m in sys.modules if m == "hyfl_app" or m.startswith("hyfl_app.")]:
            del sys.modules[name]
    # What `flwr run` does first: validate the project (components checked in the
    # project folder) and bundle it.
    config, warnings = load_and_validate(out / "pyproject.toml")
    assert warnings == [] and config["tool"]["flwr"]["app"]["config"]["parties"] == 2
    with zipfile.ZipFile(BytesIO(build_fab_from_disk(out))) as fab:
        assert {"pyproject.toml", "README.md", "hyfl_app/server_app.py",
                "hyfl_app/client_app.py"} <= set(fab.namelist())


def test_app_flags_set_the_run_config_defaults(tmp_path, monkeypatch):
    _, public = generate_keys(tmp_path / "keys", 256, insecure_test_keys=True)
    monkeypatch.chdir(tmp_path)  # relative paths are written absolute
    out = tmp_path / "app"
    result, output = _make(out, "--parties", "4", "--iterations", "7", "--participation", "0.5",
                           "--seed", "3", "--loss", "logistic", "--lam", "0.01",
                           "--param", "local_steps=5", "--param", "step_rule=theory",
                           "--cipher", "packed", "--public-key", "keys/public-key.json",
                           "--partition", "grid:2x2",
                           "--results", "results", "--reply-timeout", "30",
                           "--insecure-test-keys")
    assert result.exit_code == 0, output
    assert "insecure test keys" in output
    config = _pyproject(out)["tool"]["flwr"]["app"]["config"]
    expected = {**RUN_DEFAULTS, "parties": 4, "iterations": 7, "participation": "0.5",
                "seed": 3, "loss": "logistic", "lam": 0.01,
                "hyper": "local_steps=5,step_rule=theory", "cipher": "packed",
                "public-key": str(public.resolve()),
                "partition": "grid:2x2", "out": str(tmp_path / "results"),
                "reply-timeout": 30.0, "insecure-test-keys": True}
    assert config == expected
    deploy = DeployConfig.from_run_config(config)  # what the ServerApp will accept
    assert deploy.algorithm.local_steps == 5 and deploy.algorithm.step_rule == "theory"
    # Nothing set at generation: the README asks for what is still missing.
    assert "`parties`, `public-key`, `out`" in (write_flower_app(tmp_path / "bare") / "README.md"
                                                ).read_text()
    assert "defaults are complete" in (out / "README.md").read_text()


@pytest.mark.parametrize("flags, message", [
    (["--cipher", "rot13"], "run config cipher is 'rot13', which is not known"),
    (["--iterations", "0"], "run config iterations must be >= 1"),
    (["--lam", "-1"], "run config lam is -1.0"),
    (["--param", "local_steps"], "--param 'local_steps' is not KEY=VALUE"),
    (["--param", "step_rule=fast"], "run config algorithm='hyfdca' hyper='step_rule=fast'"),
    (["--parties", "2", "--participation", "cyclic:5"], "number of cyclic groups is 5"),
    (["--parties", "2", "--participation", "often"], "participation spec 'often'"),
    (["--reply-timeout", "0"], "run config reply-timeout must be > 0"),
])
def test_app_bad_flags_are_refused_naming_the_key(tmp_path, flags, message):
    out = tmp_path / "app"
    result, output = _make(out, *flags)
    assert result.exit_code == 2 and message in output, output
    assert not out.exists()  # nothing written


def test_app_refuses_a_private_key_as_the_servers_key(tmp_path):
    private, _ = generate_keys(tmp_path / "keys", 256, insecure_test_keys=True)
    result, output = _make(tmp_path / "app", "--public-key", str(private),
                           "--insecure-test-keys")
    assert result.exit_code == 2 and "private" in output, output


def test_app_refuses_a_non_empty_folder_unless_overwrite(tmp_path):
    out = tmp_path / "app"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result, output = _make(out, "--parties", "2")
    assert result.exit_code == 2, output
    # (no path in the check: rich may break a long path at a hyphen)
    assert "app folder" in output and "exists and is not empty (notes.txt)" in output
    assert "pass --overwrite" in output and not (out / "pyproject.toml").exists()
    result, output = _make(out, "--parties", "3", "--overwrite")
    assert result.exit_code == 0, output
    assert (out / "notes.txt").read_text() == "mine"  # other files stay
    assert _pyproject(out)["tool"]["flwr"]["app"]["config"]["parties"] == 3
    file = tmp_path / "file"
    file.write_text("")
    result, output = _make(file)
    assert result.exit_code == 2 and "exists and is not a folder" in output, output


def test_local_deployments_submit_the_same_project(tmp_path):
    """``hyfl deploy local`` and ``run`` write the project of ``hyfl deploy app``."""
    from hyfl.deploy.local import write_app

    ours = write_app(tmp_path / "local", {"parties": 3})
    theirs = write_flower_app(tmp_path / "app", {"parties": 3})
    for name in APP_FILES:
        assert (ours / name).read_text() == (theirs / name).read_text()
    write_app(ours)  # a deployment's working folder is rewritten without asking
    assert _pyproject(ours)["tool"]["flwr"]["app"]["config"]["parties"] == 0


def test_superlink_and_party_pass_supernode_authentication_to_flower(tmp_path, monkeypatch):
    """``--enable-supernode-auth`` (TLS only) and ``--auth-supernode-private-key`` reach
    Flower's commands; what Flower does with them is checked on loopback (docs)."""
    started = []
    monkeypatch.setattr("hyfl.deploy.cli._exec", lambda command, env: started.append(command))
    tls = ["--ssl-ca-certfile", "ca.crt", "--ssl-certfile", "s.pem", "--ssl-keyfile", "s.key"]
    result, output = _invoke("deploy", "superlink", "--insecure", "--enable-supernode-auth")
    assert result.exit_code == 2 and "--enable-supernode-auth needs TLS" in output
    result, output = _invoke("deploy", "superlink", *tls, "--enable-supernode-auth",
                             "--database", str(tmp_path / "state.db"))
    assert result.exit_code == 0, output
    command = started.pop()
    assert command[0].endswith("flower-superlink") and "--enable-supernode-auth" in command
    assert command[command.index("--database") + 1] == str(tmp_path / "state.db")
    party = ["deploy", "party", "--party", "0", "--superlink", "link:8000", "--cipher", "none",
             "--root-certificates", "ca.crt"]
    result, output = _invoke(*party, "--node-key", str(tmp_path / "missing-key"))
    assert result.exit_code == 2, output
    assert "--node-key" in output and "does not exist" in output
    key = tmp_path / "supernode-key"
    key.write_text("")
    # Flower's own name for the option is accepted too
    result, output = _invoke(*party, "--auth-supernode-private-key", str(key))
    assert result.exit_code == 0, output
    command = started.pop()
    assert command[command.index("--auth-supernode-private-key") + 1] == str(key)


# ----------------------------------------------------------------------------- flwr run


@pytest.fixture(scope="module")
def two_parties(tmp_path_factory):
    """breast_cancer split by features between two parties, as block files."""
    from hyfl.data import default_lambda, load_data
    from hyfl.deploy.blocks import write_blocks
    from hyfl.partition import from_blocks
    from hyfl.problem import make_problem

    problem = make_problem(load_data("breast_cancer"), "hinge", default_lambda("breast_cancer"))
    N, M = problem.n_samples, problem.n_features
    partition = from_blocks([(range(N), range(M // 2)), (range(N), range(M // 2, M))], N, M,
                            name="vertical2")
    files = write_blocks(problem, partition, tmp_path_factory.mktemp("blocks"),
                         name="breast_cancer")
    return problem, partition, files


@pytest.mark.slow
def test_flwr_run_of_the_generated_app_reproduces_run_protocol(tmp_path, two_parties):
    """The generated project, submitted by Flower's own CLI (``flwr run OUT CONNECTION
    --stream --run-config ...``) to a SuperLink with two plain ``flower-supernode``s."""
    from hyfl.algorithms import make_algorithm
    from hyfl.deploy.local import (
        LocalDeployment,
        flower_command,
        flower_env,
        read_results,
        write_connection,
    )
    from hyfl.participation import parse_participation
    from hyfl.privacy.ciphers import make_cipher
    from hyfl.runtime.protocol import run_protocol
    from test_deploy import _no_flower_processes_of

    problem, partition, files = two_parties
    project = tmp_path / "hyfl-app"
    # One round keeps it cheap (~3 s per message, Flower's own polls); with seed 1 that
    # round is accepted, so w moves.
    result, output = _make(project, "--parties", "2", "--cipher", "none", "--iterations", "1",
                           "--param", "local_steps=5", "--seed", "1")
    assert result.exit_code == 0, output
    results = tmp_path / "results"
    # Unencrypted parties must say so in their own node config.
    nodes = [{"party": k, "cipher": "none", "data": str(f)} for k, f in enumerate(files)]
    work = tmp_path / "flower"
    started = time.perf_counter()
    with LocalDeployment(nodes, work, node_poll=None) as local:
        # The user's side: their own FLWR_HOME with a named connection to the SuperLink.
        home = work / "user-flwr-home"
        write_connection(home, local.address, name="my-superlink")
        local.write_control_credentials(home)  # the Control API admits its owner only
        env = flower_env(home)
        run = subprocess.run(
            [flower_command("flwr", env), "run", str(project), "my-superlink", "--stream",
             "--run-config", f"out='{results}'"],
            env=env, capture_output=True, text=True, timeout=600)
        seconds = time.perf_counter() - started
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    deployed = read_results(results)
    assert deployed["status"] == "completed", deployed.get("error")
    # The app's defaults reached the ServerApp, with the run's override.
    config = deployed["config"]
    assert (config["parties"], config["iterations"], config["cipher"], config["seed"],
            config["out"]) == (2, 1, "none", 1, str(results))
    assert [r["active"] for r in deployed["rounds"]] == [[0, 1]]
    history = []
    # The reference: the deployment's own algorithm (the app's defaults, the job's hyper).
    run_protocol(make_algorithm(config["algorithm"]["name"], config["hyper"]), problem,
                 partition, parse_participation("full", 2), 1, make_cipher("none"), seed=1,
                 on_round=lambda s, c: history.append(s.w.copy()))
    with np.load(results / "weights.npz") as f:
        np.testing.assert_array_equal(f["w"][1:], np.stack(history))
    assert np.abs(history[-1]).max() > 0
    assert _no_flower_processes_of(work) == []
    print(f"\nflwr run of the generated app: {seconds:.0f} s with start and stop; rounds "
          f"{[round(r['round_seconds'], 1) for r in deployed['rounds']]} s")
