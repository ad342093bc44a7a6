"""A new user's three organisations (their own files): regressions for what they tripped on.

Each test is cheap: small files, few iterations, no Flower processes.
"""

from __future__ import annotations

import pytest

from hyfl.errors import HyflError


def test_a_failed_local_deployment_quotes_the_failing_party_s_log(tmp_path, monkeypatch):
    """``hyfl deploy local`` on raw-unit files (no --standardize) fails at a party's
    'setup': the party's reply leaves the reason out, so the error used to say only "the
    reason is in the party's own log" and point at run.log, where it is not. On one
    machine every log is the user's: the error names party-K.log and quotes its reason."""
    from hyfl.deploy import local

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "party-1.log").write_text(
        "INFO: Received successfully\n"
        "hyfl worker: message failed: HyflError: value 149846.76 at position 51 exceeds the "
        "fixed-point bound 65536 (81 of 12288 value(s) do). Data in raw units overflow it: "
        "pass --standardize (hyfl run, hyfl deploy) to divide every feature by its "
        "deviation first\n"
        "INFO: SuperNode terminated gracefully.\n")
    failure = ("the deployed run failed: party 1 failed on 'setup': <class "
               "'hyfl.errors.HyflError'>:<'the party could not handle the server's 'setup' "
               "message; the reason is in the party's own log'>. Details in run.log.")

    def failed(*args, **kwargs):
        raise HyflError(failure)

    monkeypatch.setattr(local, "wait_for_results", failed)
    deployment = object.__new__(local.LocalDeployment)
    deployment.logs = logs
    monkeypatch.setattr(local.LocalDeployment, "submit", lambda self, config: None)
    with pytest.raises(HyflError) as caught:
        deployment.run({"out": str(tmp_path / "out")})
    message = str(caught.value)
    assert message.startswith(failure)
    assert str(logs / "party-1.log") in message
    assert "fixed-point bound 65536" in message and "--standardize" in message

    # A failure that names no party (or a party without a log) is left as it was.
    assert local.with_party_reasons("the deployed run failed: timeout.", logs) == (
        "the deployed run failed: timeout.")
    assert local.with_party_reasons("party 2 failed on 'setup': x.", logs) == (
        "party 2 failed on 'setup': x.")


@pytest.fixture(scope="module")
def organisations(tmp_path_factory):
    """Three organisations' own files, in raw units (the diabetes data made binary):
    string ids that partly overlap, the label ('outcome', text) at two parties, a
    pharmacy without labels, 'bmi' and 'bp' held by two parties each, shuffled rows, one
    Parquet file; and new unlabelled rows of the same layout in ``new/``."""
    import numpy as np
    from sklearn.datasets import load_diabetes

    folder = tmp_path_factory.mktemp("orgs")
    frame = load_diabetes(scaled=False, as_frame=True).frame
    X = frame.drop(columns="target")
    y = np.where(frame["target"] > frame["target"].median(), "high", "low")
    ids = np.array([f"P-{i:05d}" for i in range(len(X))])

    def cut(rows, columns, labelled, seed):
        table = X.iloc[rows][columns].copy()
        table.insert(0, "record_id", ids[rows])
        if labelled:
            table["outcome"] = y[rows]
        return table.sample(frac=1, random_state=seed).reset_index(drop=True)

    layout = {"hospital": (["age", "sex", "bmi", "bp"], True, np.arange(0, 60)),
              "lab": (["s1", "s2", "s3", "bmi"], True, np.arange(20, 90)),
              "pharmacy": (["s4", "s5", "s6", "bp"], False, np.arange(10, 80))}
    (folder / "new").mkdir()
    for seed, (name, (columns, labelled, rows)) in enumerate(layout.items()):
        for table, path in [(cut(rows, columns, labelled, seed), folder / name),
                            (cut(np.arange(90, 110), columns, False, seed),
                             folder / "new" / name)]:
            if name == "lab":
                table.to_parquet(path.with_suffix(".parquet"), index=False)
            else:
                table.to_csv(path.with_suffix(".csv"), index=False)
    return folder


def spec(folder, **files):
    names = {"hospital": "hospital.csv", "lab": "lab.parquet", "pharmacy": "pharmacy.csv",
             **files}
    return ("parties:" + ",".join(f"{k}={folder / v}" for k, v in names.items())
            + ";id=record_id;label=outcome")


def test_hyfl_run_says_it_wrote_the_model(organisations, tmp_path):
    """The README's next step is ``hyfl predict OUT/model.npz``: the line that lists what
    ``hyfl run`` wrote names model.npz too (it left it out)."""
    from typer.testing import CliRunner

    from hyfl.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--data", spec(organisations), "--standardize",
                                      "--iterations", "5", "--out", str(out)],
                                env={"COLUMNS": "250"})
    assert result.exit_code in (0, 3), result.output
    assert (out / "model.npz").exists()
    # the line may wrap at the console's width: read the output as one line
    flat = " ".join(result.output.split())
    assert "run.json, model.npz and loss.png" in flat, result.output


def test_the_options_table_gives_the_party_files_defaults(organisations):
    """docs/usage.md's table of hyfl run's flags said --participation defaults to 0.5 and
    --lam to "the dataset's own"; with party files a run takes every party every round
    and lam = 1/N (as hyfl run --help and the README say)."""
    from pathlib import Path

    from hyfl.experiments.runner import RunSpec, prepare

    usage = (Path(__file__).parents[1] / "docs" / "usage.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in usage.splitlines()
            if line.startswith("| `--")}
    assert "party files: `full`" in rows["`--participation`"]
    assert "party files" in rows["`--lam`"] and "1/N" in rows["`--lam`"]
    run = RunSpec(data=spec(organisations), standardize=True)
    assert run.participation_spec() == "full"
    problem = prepare(run).problem
    assert problem.lam == pytest.approx(1.0 / problem.n_samples)


def test_the_readme_deploys_the_model_hyfl_run_trains():
    """The README's deployment of the organisations' files gave --standardize but not
    --intercept 1, so it trained another model than its hyfl run (which fits an intercept)
    without a word; it now asks for the intercept and says what a deployment's defaults
    are. The flags it names exist, with the defaults it gives (intercept off, 5 rounds)."""
    import re
    from pathlib import Path

    import typer

    from hyfl.cli import app

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    commands = re.sub(r"\\\n\s*", " ", readme)
    deploy = [line for line in commands.splitlines()
              if line.startswith('hyfl deploy local --data "parties:')]
    assert deploy and all("--standardize" in c and "--intercept 1" in c for c in deploy)
    assert "fits an intercept only when given `--intercept 1`" in readme
    local = typer.main.get_command(app).commands["deploy"].commands["local"]
    params = {p.name: p for p in local.params}
    assert params["iterations"].default == 5
    assert params["intercept"].default in (None, "off")
    assert "standardize" in params


def test_a_local_deployment_says_whether_it_fits_an_intercept_and_scales():
    """hyfl run fits an intercept by default and a deployment does not: the deployment's
    start line said neither, so a user comparing the two saw different models unexplained."""
    from hyfl.deploy.local import start_line

    plain = start_line(3, 30, "ckks", "cocoa", None, False)
    assert plain == ("3 parties on loopback; running 30 rounds (cipher ckks, step rule cocoa, "
                     "no intercept, not standardized)")
    assert "intercept 1, standardized)" in start_line(3, 30, "ckks", "cocoa", 1.0, True)


def test_a_folder_s_parties_are_in_name_order_as_the_readme_says(organisations, tmp_path):
    """hyfl deploy predict --data parties:FOLDER gives the scores to party 0, the folder's
    first file by name (the README's clinic, not its hospital): the README says so."""
    import shutil
    from pathlib import Path

    from hyfl.data import parse_party_spec

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "`--asker K` (default 0: the first file, and a folder's files are" in readme
    folder = tmp_path / "orgs"
    folder.mkdir()
    for name in ("lab.parquet", "hospital.csv", "pharmacy.csv"):
        shutil.copy(organisations / name, folder / name)
    files, _ = parse_party_spec(f"parties:{folder};id=record_id")
    names = [Path(f).name for f in (files.values() if hasattr(files, "values") else files)]
    assert names == ["hospital.csv", "lab.parquet", "pharmacy.csv"]
