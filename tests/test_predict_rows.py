"""Scoring new rows: ``hyfl predict`` on party files with or without labels, and
``hyfl deploy predict``, where the parties score them without pooling them.

* Unlabelled party files are scored under their rows' own ids, with the labels'
  own text values; the scores are the model's on the pooled rows.
* A logistic model's probabilities sum to 1 and are the sigmoid of the score.
* Files whose columns are not the model's: the message names only the differing
  columns, with their close matches.
* Deployed (the coordinator and the parties in this process, the real codec and
  messages): each party's share of the margins reaches the asking party masked
  and sealed, and the asker's scores equal ``hyfl predict`` on the pooled rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hyfl.data import load_party_spec
from hyfl.errors import HyflError
from hyfl.model_file import load_model, model_from_problem, save_model
from hyfl.predict import predict_data
from hyfl.problem import make_problem, solve_centralized
from synthetic_data import organisation_files, unlabelled_copies


def _model(tmp_path, files, loss="hinge"):
    """A model trained (centrally) on the organisations' labelled files."""
    spec = f"parties:{','.join(map(str, files))};id=customer;label=income"
    dataset, _ = load_party_spec(spec, psi=False)
    problem = make_problem(dataset, loss, 0.05)
    w = solve_centralized(problem, cache=False).w
    path = tmp_path / f"model-{loss}.npz"
    save_model(path, model_from_problem(problem, w, data_meta=dataset.meta))
    return path


def _unlabelled(tmp_path, files):
    """The same organisations' files without their label column (new rows to score)."""
    return unlabelled_copies(files, tmp_path / "new")


def _pooled_scores(model_path, ids, X):
    """The model's scores of the organisations' pooled rows, by id."""
    model = load_model(model_path)
    return dict(zip(ids, model.decision_function(X)))


def test_unlabelled_party_files_are_scored_under_their_own_ids(tmp_path):
    files, ids, X, y = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files)
    new = _unlabelled(tmp_path, files)
    done = predict_data(model, f"parties:{','.join(map(str, new))};id=customer",
                        tmp_path / "p.csv")
    assert done.accuracy is None and done.n_labelled == 0 and done.n_samples == 90
    written = pd.read_csv(tmp_path / "p.csv")
    assert list(written.columns) == ["id", "prediction", "decision"]
    assert sorted(written["id"]) == sorted(ids)  # the rows' ids, not row numbers
    held = np.zeros_like(X)  # the cells some file holds
    held[0:60, 0:3], held[20:90, 3:6], held[40:90, 6:9] = (X[0:60, 0:3], X[20:90, 3:6],
                                                           X[40:90, 6:9])
    expected = _pooled_scores(model, ids, held)
    np.testing.assert_allclose(written["decision"], [expected[i] for i in written["id"]],
                               rtol=1e-12, atol=1e-12)
    assert set(written["prediction"]) == {"<=50K", ">50K"}  # the labels' own text
    assert all((d >= 0) == (p == ">50K") for d, p in zip(written["decision"],
                                                          written["prediction"]))
    # A folder of the files scores alike (party order: file names), and with the labelled
    # files the metrics are reported as before.
    again = predict_data(model, f"parties:{new[0].parent};id=customer", tmp_path / "q.csv")
    assert again.n_samples == 90
    labelled = predict_data(model, f"parties:{','.join(map(str, files))};id=customer;"
                            "label=income", tmp_path / "r.csv")
    assert labelled.accuracy is not None and labelled.same_data


def test_partly_labelled_files_report_metrics_on_their_labelled_rows(tmp_path):
    files, ids, X, y = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files)
    new = _unlabelled(tmp_path, files)
    spec = f"parties:{files[0]},{new[1]},{new[2]};id=customer;label=income"
    done = predict_data(model, spec, tmp_path / "p.csv")
    assert done.n_samples == 90 and done.n_labelled == 60  # the bank's customers
    written = pd.read_csv(tmp_path / "p.csv").set_index("id")
    truth = dict(zip(ids, y))
    bank = pd.read_csv(files[0])["customer"]
    assert done.accuracy == pytest.approx(np.mean(
        [written.loc[i, "prediction"] == truth[i] for i in bank]))


def test_logistic_probabilities_sum_to_one_and_are_the_sigmoid_of_the_score(tmp_path):
    files, *_ = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files, loss="logistic")
    new = _unlabelled(tmp_path, files)
    predict_data(model, f"parties:{','.join(map(str, new))};id=customer", tmp_path / "p.csv")
    written = pd.read_csv(tmp_path / "p.csv")
    assert list(written.columns) == ["id", "prediction", "decision", "probability_<=50K",
                                     "probability_>50K"]
    np.testing.assert_allclose(written["probability_<=50K"] + written["probability_>50K"], 1.0,
                               rtol=1e-12)
    np.testing.assert_allclose(written["probability_>50K"],
                               1.0 / (1.0 + np.exp(-written["decision"])), rtol=1e-10)


def test_a_column_mismatch_names_only_the_differing_columns(tmp_path):
    files, *_ = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files)
    new = _unlabelled(tmp_path, files)
    telco = pd.read_parquet(new[1]).rename(columns={"x4": "x4_new"})
    telco["extra"] = 1.0
    telco.to_parquet(new[1])
    with pytest.raises(HyflError) as caught:
        predict_data(model, f"parties:{','.join(map(str, new))};id=customer",
                     tmp_path / "p.csv")
    text = " ".join(str(caught.value).split())
    assert "lack the model's feature column 'x4' (close: 'x4_new')" in text
    assert "not trained on: 'x4_new' (close: 'x4'), 'extra'" in text
    for same in ("'x0'", "'x3'", "'x8'"):  # the columns that match are not listed
        assert same not in text


# ----------------------------------------------------------------------------- deployed

def _deployed_scores(tmp_path, files, model_path, asker, **node_extra):
    """``hyfl deploy predict`` in this process: the parties' own files, the real codec and
    messages; returns the asker's predictions and the job's record."""
    from hyfl.deploy.config import DeployConfig, run_config_for
    from hyfl.deploy.keys import server_cipher
    from hyfl.deploy.scoring import score_deployed
    from hyfl.deploy.scoring_local import InProcessTransport

    model = load_model(model_path)
    run = run_config_for(parties=len(files), loss=model.loss, cipher="none")
    nodes = [{"party": k, "cipher": "none", "data": str(path), "id-column": "customer",
              "label-column": "income", "out": str(tmp_path / f"party-{k}"), **node_extra}
             for k, path in enumerate(files)]
    config = DeployConfig.from_run_config(run)
    cipher = server_cipher("none", None, **config.cipher_options())
    transport = InProcessTransport(nodes, run, cipher)
    record = score_deployed(model, config, transport, asker=asker, log=lambda line: None)
    return pd.read_csv(tmp_path / f"party-{asker}" / "predictions.csv"), record, transport


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_deploy_predict_equals_predict_on_the_pooled_rows(tmp_path, loss):
    files, ids, X, y = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files, loss=loss)
    new = _unlabelled(tmp_path, files)
    predict_data(model, f"parties:{','.join(map(str, new))};id=customer", tmp_path / "p.csv")
    pooled = pd.read_csv(tmp_path / "p.csv").set_index("id")
    for asker in (0, 1):  # the bank (CSV) and the telco (Parquet, unlabelled in training)
        written, record, _ = _deployed_scores(tmp_path / f"asker-{asker}", new, model, asker)
        own = (pd.read_parquet(new[asker]) if new[asker].suffix == ".parquet"
               else pd.read_csv(new[asker]))["customer"]
        assert list(written["id"]) == list(own)  # its rows, its ids, in its file's order
        assert record["rows"] == len(own) and record["n_samples"] == 90
        expected = pooled.loc[written["id"]]
        assert list(written.columns) == list(pooled.reset_index().columns)
        np.testing.assert_allclose(written["decision"], expected["decision"], rtol=0,
                                   atol=1e-9)
        assert list(written["prediction"]) == list(expected["prediction"])
        for column in written.columns[3:]:  # the logistic model's probabilities
            np.testing.assert_allclose(written[column], expected[column], rtol=0, atol=1e-9)


def test_deploy_predict_shows_the_server_no_score_and_the_asker_no_peer_part(tmp_path):
    """What the server relays are sealed blobs; the asker's own part is masked: neither a
    peer's part nor the margins appear in the clear in any message or reply."""
    from hyfl.deploy.scoring_local import InProcessTransport

    files, ids, X, y = organisation_files(tmp_path / "train")
    model_path = _model(tmp_path, files)
    new = _unlabelled(tmp_path, files)
    seen = []
    deliver = InProcessTransport._deliver

    def recording(self, k, kind, payload):
        reply = deliver(self, k, kind, payload)
        seen.append((k, kind, payload, reply))
        return reply

    InProcessTransport._deliver = recording
    try:
        written, *_ = _deployed_scores(tmp_path, new, model_path, asker=0)
    finally:
        InProcessTransport._deliver = deliver
    margins = written["decision"].to_numpy()
    model = load_model(model_path)
    # Each peer's part of the bank's margins, as the test computes them in the clear.
    frame = pd.read_csv(new[0]).set_index("customer")
    parts = []
    for path, columns in ((new[1], ["x3", "x4", "x5"]), (new[2], ["x6", "x7", "x8"])):
        peer = (pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path))
        peer = peer.set_index("customer").reindex(frame.index).fillna(0.0)
        rows = [int(c[1]) for c in columns]
        parts.append(peer[columns].to_numpy() @ model.weights[rows, 0])
    secret = np.concatenate([margins, *parts])
    secret = secret[np.abs(secret) > 1e-6]

    def floats(tree):
        if isinstance(tree, dict):
            for value in tree.values():
                yield from floats(value)
        elif isinstance(tree, list | tuple):
            for value in tree:
                yield from floats(value)
        elif isinstance(tree, np.ndarray) and tree.dtype.kind == "f":
            yield tree.ravel()

    for k, kind, payload, reply in seen:
        if kind not in ("score", "scores"):
            continue
        for values in (*floats(payload), *floats(reply)):
            assert not np.isin(np.round(values, 9), np.round(secret, 9)).any(), (k, kind)
    assert {kind for _, kind, _, _ in seen} >= {"align", "labels", "score", "scores"}
    assert "block" not in {kind for _, kind, _, _ in seen}
    # The peers' replies to 'score' hold only their parts sealed for the asker.
    for k, kind, _, reply in seen:
        if kind == "score" and k != 0:
            assert set(reply) <= {"sealed", "timing"} and set(reply["sealed"]) == {"0"}
            assert reply["sealed"]["0"].dtype == np.uint8


def test_hyfl_deploy_predict_writes_the_askers_rows_as_hyfl_predict_does(tmp_path):
    """The command: the parties' files of new rows in, the asker's predictions out (with
    the parties' ckks keys, so that the alignment is authenticated), equal to
    ``hyfl predict`` on the same files."""
    from typer.testing import CliRunner

    from hyfl.cli import app
    from hyfl.deploy.keys import generate_keys

    files, *_ = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files, loss="logistic")
    new = _unlabelled(tmp_path, files)
    spec = f"parties:{','.join(map(str, new))};id=customer"
    generate_keys(tmp_path / "keys", cipher="ckks")
    runner = CliRunner()
    done = runner.invoke(app, ["deploy", "predict", str(model), "--data", spec, "--asker", "2",
                               "--cipher", "ckks", "--keys", str(tmp_path / "keys"),
                               "--out", str(tmp_path / "d")])
    assert done.exit_code == 0, done.output
    assert "party 2 wrote" in done.output and "50 predictions" in done.output
    done = runner.invoke(app, ["predict", str(model), "--data", spec,
                               "--out", str(tmp_path / "p.csv")])
    assert done.exit_code == 0, done.output
    deployed = pd.read_csv(tmp_path / "d" / "party-2" / "predictions.csv")
    pooled = pd.read_csv(tmp_path / "p.csv").set_index("id").loc[deployed["id"]]
    assert list(deployed["prediction"]) == list(pooled["prediction"])
    for column in deployed.columns[2:]:
        np.testing.assert_allclose(deployed[column], pooled[column], rtol=0, atol=1e-9)
    # Without a key folder (the default) the key pair is made in OUT/keys, as hyfl deploy
    # local does: the alignment is authenticated by default.
    done = runner.invoke(app, ["deploy", "predict", str(model), "--data", spec,
                               "--out", str(tmp_path / "e")])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "e" / "keys" / "private-key.json").is_file()
    again = pd.read_csv(tmp_path / "e" / "party-0" / "predictions.csv")
    assert set(again["id"]) <= set(pooled.index) | set(pd.read_csv(tmp_path / "p.csv")["id"])
    # With cipher none it runs, and says that nothing authenticates the alignment.
    done = runner.invoke(app, ["deploy", "predict", str(model), "--data", spec, "--cipher",
                               "none", "--out", str(tmp_path / "f")])
    assert done.exit_code == 0 and "not authenticated" in done.output


def test_a_party_refuses_to_score_rows_the_asker_does_not_hold(tmp_path):
    """The ``score`` message's samples are checked against the alignment: the asker's must
    be its own rows, a peer's rows among them exactly the ones it shares with the asker."""
    from hyfl.deploy import scoring_local as scoring

    files, *_ = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files)
    new = _unlabelled(tmp_path, files)
    deliver = scoring.InProcessTransport._deliver

    held = {}  # the telco's global samples, as the alignment's 'labels' numbers them

    def forging(party, change):
        def _deliver(self, k, kind, payload):
            if kind == "labels" and k == 1:
                held["telco"] = np.asarray(payload["samples"])
            if kind == "score" and k == party:
                payload = {**payload, "samples": change(np.asarray(payload["samples"]))}
            return deliver(self, k, kind, payload)
        return _deliver

    # The bank (asker) holds customers 0-59, the telco 20-89: a telco sample the bank does
    # not hold put in the place of one of the bank's.
    cases = [(0, lambda s: s[::-1], "not this party's own rows"),
             (1, lambda s: np.append(s[1:], np.setdiff1d(held["telco"], s)[0]),
              "other rows than the ones it shares with party 0")]
    for party, change, message in cases:
        scoring.InProcessTransport._deliver = forging(party, change)
        try:
            with pytest.raises(HyflError, match=message):
                _deployed_scores(tmp_path / f"forged-{party}", new, model, asker=0)
        finally:
            scoring.InProcessTransport._deliver = deliver


@pytest.mark.slow
def test_hyfl_deploy_predict_over_flower_equals_predict_on_the_pooled_rows(tmp_path):
    """``--flower``: a SuperLink and one SuperNode process per party on loopback, the
    ServerApp's scoring job (run config ``model``): the asker's rows as in this process and
    as ``hyfl predict`` writes them (about 20 s)."""
    from typer.testing import CliRunner

    from hyfl.cli import app

    files, *_ = organisation_files(tmp_path / "train")
    model = _model(tmp_path, files, loss="logistic")
    new = _unlabelled(tmp_path, files)
    spec = f"parties:{','.join(map(str, new))};id=customer"
    runner = CliRunner()
    done = runner.invoke(app, ["deploy", "predict", str(model), "--data", spec, "--asker", "1",
                               "--flower", "--timeout", "240", "--out", str(tmp_path / "d")])
    assert done.exit_code == 0, done.output
    assert "party 1 wrote" in " ".join(done.output.split())
    import json

    record = json.loads((tmp_path / "d" / "server" / "deploy.json").read_text())
    assert record["status"] == "completed" and record["job"] == "predict"
    assert record["rows"] == 70 and record["n_samples"] == 90
    predict_data(model, spec, tmp_path / "p.csv")
    deployed = pd.read_csv(tmp_path / "d" / "party-1" / "predictions.csv")
    pooled = pd.read_csv(tmp_path / "p.csv").set_index("id").loc[deployed["id"]]
    assert list(deployed["id"]) == list(pd.read_parquet(new[1])["customer"])
    assert list(deployed["prediction"]) == list(pooled["prediction"])
    for column in deployed.columns[2:]:
        np.testing.assert_allclose(deployed[column], pooled[column], rtol=0, atol=1e-9)


def test_deploy_predict_adds_the_intercept_and_reads_columns_by_name(tmp_path):
    """A model with an intercept and its features in another order than the files' columns
    (as ``hyfl run`` writes one for these files): deployed scores are still predict's."""
    import dataclasses

    files, *_ = organisation_files(tmp_path / "train")
    path = _model(tmp_path, files)
    model = load_model(path)
    order = [6, 7, 8, 0, 1, 2, 3, 4, 5]
    names = [model.provenance["feature_names"][m] for m in order]
    save_model(path, dataclasses.replace(
        model, weights=model.weights[order], intercept=np.array([0.25]),
        provenance={**model.provenance, "feature_names": names}))
    new = _unlabelled(tmp_path, files)
    predict_data(path, f"parties:{','.join(map(str, new))};id=customer", tmp_path / "p.csv")
    pooled = pd.read_csv(tmp_path / "p.csv").set_index("id")
    written, *_ = _deployed_scores(tmp_path / "d", new, path, asker=2)
    expected = pooled.loc[written["id"]]
    np.testing.assert_allclose(written["decision"], expected["decision"], rtol=0, atol=1e-9)
    assert list(written["prediction"]) == list(expected["prediction"])
    # (and the intercept is in both: the pooled scores moved by it)
    predict_data(_model(tmp_path / "plain", files), f"parties:{','.join(map(str, new))};"
                 "id=customer", tmp_path / "q.csv")
    plain = pd.read_csv(tmp_path / "q.csv").set_index("id").loc[written["id"]]
    np.testing.assert_allclose(written["decision"].to_numpy() - plain["decision"].to_numpy(), 0.25,
                               atol=1e-9)
